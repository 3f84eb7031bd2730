/* inmap.c: a connection's map of the remote's channel indexes (from its
 * BINDs) to our channels, and the names of the indexes we refused.
 *
 * A sender numbers its channels context-wide (chan.c's ids), so the indexes
 * one connection binds are neither dense nor small: a producer with 70,000
 * channels may bind only its last to us.  Indexes below INMAP_ARRAY live in
 * an array (the common case: one load per EVENT), the others in an open-
 * addressing table; either way the memory follows the number of BINDs, at
 * most max_peer_channels of them (conn_io.c refuses past it), not the largest
 * index: a BIND of index 2^24 costs 8 bytes, not 128 MiB.  No Lua here.
 */
#include "ctx_int.h"

#include <stdlib.h>
#include <string.h>

#define INMAP_ARRAY 65536u /* indexes below this: the array (at most 256 KiB) */

static size_t hslot(uint32_t idx, size_t cap) { return (idx * 2654435761u) & (cap - 1); }

int lei_inmap_get(const lei_conn *k, uint64_t idx, uint32_t *val) {
    if (idx < k->ninmap) {
        *val = k->inmap[idx];
        return *val ? 0 : -1;
    }
    if (idx < INMAP_ARRAY || idx > UINT32_MAX || !k->hcap) return -1;
    for (size_t i = hslot((uint32_t)idx, k->hcap);; i = (i + 1) & (k->hcap - 1)) {
        if (!k->hmap[i].idx) return -1;
        if (k->hmap[i].idx == idx) {
            *val = k->hmap[i].val;
            return 0;
        }
    }
}

static int hash_put(lei_conn *k, uint32_t idx, uint32_t val) {
    if ((k->hn + 1) * 2 > k->hcap) { /* at most half full */
        size_t ncap = k->hcap ? k->hcap * 2 : 64;
        struct lei_inent *n = calloc(ncap, sizeof *n); /* owned by k (hmap) */
        if (!n) return -1;
        for (size_t j = 0; j < k->hcap; j++) {
            if (!k->hmap[j].idx) continue;
            size_t i = hslot(k->hmap[j].idx, ncap);
            while (n[i].idx) i = (i + 1) & (ncap - 1);
            n[i] = k->hmap[j];
        }
        free(k->hmap);
        k->hmap = n;
        k->hcap = ncap;
    }
    size_t i = hslot(idx, k->hcap);
    while (k->hmap[i].idx && k->hmap[i].idx != idx) i = (i + 1) & (k->hcap - 1);
    if (!k->hmap[i].idx) {
        k->hmap[i].idx = idx;
        k->hn++;
        k->nbound++;
        if (k->ctx) k->ctx->nbound_all++;
    }
    k->hmap[i].val = val;
    return 0;
}

int lei_inmap_set(lei_conn *k, uint64_t idx, uint32_t val) {
    if (idx > UINT32_MAX) return -1;
    if (idx >= INMAP_ARRAY) return hash_put(k, (uint32_t)idx, val);
    if (idx >= k->ninmap) {
        size_t n = k->ninmap ? k->ninmap : 64;
        while (n <= idx) n *= 2;
        uint32_t *m = realloc(k->inmap, n * sizeof *m); /* owned by k (inmap) */
        if (!m) return -1;
        memset(m + k->ninmap, 0, (n - k->ninmap) * sizeof *m);
        k->inmap = m;
        k->ninmap = n;
    }
    if (!k->inmap[idx]) {
        k->nbound++;
        if (k->ctx) k->ctx->nbound_all++;
    }
    k->inmap[idx] = val;
    return 0;
}

const struct lei_rname *lei_inmap_rname(const lei_conn *k, uint64_t idx) {
    for (size_t i = 0; i < k->nrnames; i++)
        if (k->rnames[i].idx == idx) return &k->rnames[i];
    return NULL;
}

void lei_inmap_drop_rname(lei_conn *k, uint64_t idx) {
    for (size_t i = 0; i < k->nrnames; i++)
        if (k->rnames[i].idx == idx) {
            k->rname_bytes -= strlen(k->rnames[i].why);
            free(k->rnames[i].why);
            k->rnames[i] = k->rnames[--k->nrnames];
            return;
        }
}

int lei_inmap_set_rname(lei_conn *k, uint64_t idx, uint32_t chid, const char *why) {
    lei_inmap_drop_rname(k, idx);
    if (k->nrnames == k->crnames) {
        size_t n = k->crnames ? k->crnames * 2 : 8;
        struct lei_rname *r = realloc(k->rnames, n * sizeof *r); /* owned by k (rnames) */
        if (!r) return -1;
        k->rnames = r;
        k->crnames = n;
    }
    char *s = strdup(why); /* owned by k->rnames[i] */
    if (!s) return -1;
    k->rnames[k->nrnames].idx = idx;
    k->rname_bytes += strlen(s);
    k->rnames[k->nrnames].chid = chid;
    k->rnames[k->nrnames++].why = s;
    return 0;
}

int lei_inmap_binds(const lei_conn *k, uint32_t chid) {
    uint32_t want = chid + 1;
    for (size_t i = 0; i < k->ninmap; i++)
        if (k->inmap[i] == want) return 1;
    for (size_t i = 0; i < k->hcap; i++)
        if (k->hmap[i].idx && k->hmap[i].val == want) return 1;
    return 0;
}

void lei_inmap_free(lei_conn *k) {
    if (k->ctx) k->ctx->nbound_all -= k->nbound;
    k->nbound = 0;
    free(k->inmap);
    k->inmap = NULL;
    k->ninmap = 0;
    free(k->hmap);
    k->hmap = NULL;
    k->hcap = k->hn = 0;
    for (size_t i = 0; i < k->nrnames; i++) free(k->rnames[i].why);
    free(k->rnames);
    k->rnames = NULL;
    k->nrnames = k->crnames = 0;
    k->rname_bytes = 0;
}
