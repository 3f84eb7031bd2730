/* chan.c: channels: the name table (open addressing), their flags (local
 * consumers, calls), counters and destinations as peer.c sets them
 * (lei_peer_set_dests), and whether one of those is full.  A table: it
 * calls no other transport file (core/transport/README.md "Order"); the
 * room a submit waits for is ctx.c's (lei_submit_room).
 */
#define _GNU_SOURCE
#include "ctx_int.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* ---- channels ---------------------------------------------------------- */

static uint32_t hash_name(const char *s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 16777619u;
    return h;
}

static int hash_grow(lei_ctx *c) {
    uint32_t ncap = c->chan_s.hcap ? c->chan_s.hcap * 2 : 256;
    uint32_t *nh = calloc(ncap, sizeof *nh);
    if (!nh) return -1;
    for (uint32_t i = 0; i < c->chan_s.nchans; i++) {
        uint32_t j = hash_name(c->chan_s.chans[i]->name, c->chan_s.chans[i]->namelen) & (ncap - 1);
        while (nh[j]) j = (j + 1) & (ncap - 1);
        nh[j] = i + 1;
    }
    free(c->chan_s.hash);
    c->chan_s.hash = nh;
    c->chan_s.hcap = ncap;
    return 0;
}

/* struct lei_chan's per-event fields are its first cache line (ctx_int.h) */
_Static_assert(offsetof(lei_chan, drops) == 64, "lei_chan: the hot fields are the first 64 bytes");

lei_chan *lei_chan_get(lei_ctx *c, uint32_t id) {
    return id < c->chan_s.nchans ? c->chan_s.chans[id] : NULL;
}

lei_chan *lei_chan_find(lei_ctx *c, const char *name, size_t len) {
    if (!c->chan_s.hcap) return NULL;
    uint32_t j = hash_name(name, len) & (c->chan_s.hcap - 1);
    while (c->chan_s.hash[j]) {
        lei_chan *ch = c->chan_s.chans[c->chan_s.hash[j] - 1];
        if (ch->namelen == len && memcmp(ch->name, name, len) == 0) return ch;
        j = (j + 1) & (c->chan_s.hcap - 1);
    }
    return NULL;
}

/* The id of channel `name`, opened now unless it is open already;
 * UINT32_MAX when out of memory or when max_channels are open
 * (lei_chan_at_limit tells which). */
uint32_t lei_chan_open(lei_ctx *c, const char *name, size_t len) {
    lei_chan *found = lei_chan_find(c, name, len);
    if (found) return found->id;
    if (lei_chan_at_limit(c)) return UINT32_MAX;
    if ((c->chan_s.nchans + 1) * 2 > c->chan_s.hcap && hash_grow(c)) return UINT32_MAX;
    if (c->chan_s.nchans == c->chan_s.cchans) {
        uint32_t n = c->chan_s.cchans ? c->chan_s.cchans * 2 : 64;
        lei_chan **nc = realloc(c->chan_s.chans, n * sizeof *nc);
        if (!nc) return UINT32_MAX;
        c->chan_s.chans = nc;
        c->chan_s.cchans = n;
    }
    /* owned by c->chan_s.chans (freed in lei_ctx_free); 64-byte aligned: the hot
     * first line of struct lei_chan is one cache line */
    lei_chan *ch = aligned_alloc(64, (sizeof *ch + 63) & ~(size_t)63);
    if (ch) memset(ch, 0, sizeof *ch);
    if (!ch || !(ch->name = malloc(len + 1))) {
        free(ch);
        return UINT32_MAX;
    }
    memcpy(ch->name, name, len);
    ch->name[len] = '\0';
    ch->namelen = len;
    ch->derived = memchr(name, '@', len) != NULL;
    ch->id = c->chan_s.nchans;
    c->chan_s.chans[c->chan_s.nchans++] = ch;
    uint32_t j = hash_name(name, len) & (c->chan_s.hcap - 1);
    while (c->chan_s.hash[j]) j = (j + 1) & (c->chan_s.hcap - 1);
    c->chan_s.hash[j] = ch->id + 1;
    return ch->id;
}

int lei_chan_full(lei_ctx *c, uint32_t chid) {
    lei_chan *ch = lei_chan_get(c, chid);
    return ch && lei_chan_full_dest(c, ch) != NULL;
}

int lei_chan_has_dest(lei_ctx *c, uint32_t chid) {
    lei_chan *ch = lei_chan_get(c, chid);
    return ch && (ch->ndests > 0 || ch->local);
}

void lei_chan_set_local(lei_ctx *c, uint32_t id, int on) {
    lei_chan *ch = lei_chan_get(c, id);
    if (!ch) return;
    if (on && !ch->local) {
        lei_chan_epoch_recent(ch, ev_now(c->loop));
        ch->epoch++;
    }
    ch->local = on;
}

/* O(1): moved on lazily, at each appearance and each look */
uint32_t lei_chan_epoch_recent(lei_chan *ch, ev_tstamp now) {
    if (now - ch->ep_t >= LEI_EPOCH_RECENT) {
        ch->ep_old = now - ch->ep_t >= 2 * LEI_EPOCH_RECENT ? ch->epoch : ch->ep_cur;
        ch->ep_cur = ch->epoch;
        ch->ep_t = now;
    }
    return ch->ep_old;
}

void lei_chan_set_calls(lei_ctx *c, uint32_t id, int on) {
    lei_chan *ch = lei_chan_get(c, id);
    if (ch) ch->calls = on != 0;
}


uint32_t lei_chan_total(const lei_ctx *c) { return c->chan_s.nchans; }

int lei_chan_at_limit(const lei_ctx *c) { return c->chan_s.nchans >= c->o.max_channels; }

const char *lei_chan_name(const lei_ctx *c, uint32_t id) {
    return id < c->chan_s.nchans ? c->chan_s.chans[id]->name : NULL;
}

void lei_chan_count_encode(lei_ctx *c, uint32_t chid) {
    if (chid < c->chan_s.nchans) c->chan_s.chans[chid]->encodes++;
}

int lei_chan_stats(const lei_ctx *c, uint32_t id, lei_stats_chan *out) {
    if (id >= c->chan_s.nchans) return -1;
    const lei_chan *ch = c->chan_s.chans[id];
    out->ev_out = ch->ev_out;
    out->bytes_out = ch->bytes_out;
    out->ev_in = ch->ev_in;
    out->bytes_in = ch->bytes_in;
    out->drops = ch->drops;
    out->ev_local = ch->ev_local;
    out->encodes = ch->encodes;
    out->gaps = ch->gaps;
    out->lost = ch->lost;
    out->dups = ch->dups;
    out->refused = ch->refused;
    out->ev_nodest = ch->ev_nodest;
    out->undelivered = ch->undelivered;
    out->ndests = ch->ndests;
    return 0;
}
