/* auth.c: identities and trust: our Ed25519 identity, the trusted keys
 * and authorities, address pins, the keys of peers and channels.
 *
 * libsodium is the only crypto.  No Lua, no sockets here: conn.c runs the
 * handshake and asks this file what to trust.
 */
#define _GNU_SOURCE
#include "ctx_int.h"

#include <sodium.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* 1..64 bytes of [A-Za-z0-9._-]. */
int lei_name_ok(const char *name, size_t n) {
    if (n < 1 || n > LEI_NAME_MAX) return 0;
    for (size_t i = 0; i < n; i++) {
        char ch = name[i];
        if (!((ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') ||
              ch == '.' || ch == '_' || ch == '-'))
            return 0;
    }
    return 1;
}

int lei_ctx_set_identity(lei_ctx *c, const uint8_t sk[64], const char *name, const uint8_t *cert,
                         char *err) {
    uint8_t pk[32], sk2[64];
    size_t n = strlen(name);
    for (const lei_conn *k = c->conns; k; k = k->next)
        if (k->state != LEI_CONN_CLOSED) {
            snprintf(err, 160, "the identity must be set before the first connection");
            return -LEI_E_INVALID;
        }
    if (!lei_name_ok(name, n)) {
        snprintf(err, 160, "bad principal name '%.64s': 1 to %d characters of A-Z a-z 0-9 . _ -",
                 name, LEI_NAME_MAX);
        return -LEI_E_INVALID;
    }
    /* sk is seed || pk: the pk must be the one the seed gives. */
    crypto_sign_seed_keypair(pk, sk2, sk);
    int same = sodium_memcmp(sk2, sk, 64) == 0;
    sodium_memzero(sk2, sizeof sk2);
    if (!same) {
        snprintf(err, 160, "secret key does not match its public key");
        return -LEI_E_INVALID;
    }
    lei_ident *id = &c->id;
    memcpy(id->sk, sk, 64);
    memcpy(id->pk, pk, 32);
    memcpy(id->name, name, n + 1);
    id->has_cert = cert != NULL;
    if (cert) memcpy(id->cert, cert, 64);
    id->keyed = 1;
    return 0;
}

/* Makes room for one more element in arr, of n used and *cap allocated
 * elements of size bytes (doubling, from 8).  Returns the array to store
 * back (owned, as before, by the context's lei_ident), or NULL when out of
 * memory (arr and *cap untouched). */
static void *room(void *arr, int *cap, int n, size_t size) {
    if (n < *cap) return arr;
    int nc = *cap ? *cap * 2 : 8;
    void *a = realloc(arr, (size_t)nc * size);
    if (a) *cap = nc;
    return a;
}

int lei_ctx_trust_key(lei_ctx *c, const uint8_t pk[32], const char *name) {
    lei_ident *id = &c->id;
    size_t n = strlen(name);
    if (!lei_name_ok(name, n)) return -LEI_E_INVALID;
    for (int i = 0; i < id->nkeys; i++)
        if (memcmp(id->keys[i].pk, pk, 32) == 0) {
            memcpy(id->keys[i].name, name, n + 1);
            return 0;
        }
    void *grown = room(id->keys, &id->ckeys, id->nkeys, sizeof *id->keys);
    if (!grown) return -LEI_E_NOMEM;
    id->keys = grown;
    lei_tkey *k = &id->keys[id->nkeys++];
    memcpy(k->pk, pk, 32);
    memcpy(k->name, name, n + 1);
    return 0;
}

int lei_ctx_trust_authority(lei_ctx *c, const uint8_t pk[32]) {
    lei_ident *id = &c->id;
    for (int i = 0; i < id->nauths; i++)
        if (memcmp(id->auths[i], pk, 32) == 0) return 0;
    void *grown = room(id->auths, &id->cauths, id->nauths, sizeof *id->auths);
    if (!grown) return -LEI_E_NOMEM;
    id->auths = grown;
    memcpy(id->auths[id->nauths++], pk, 32);
    return 0;
}

int lei_ctx_keyed(const lei_ctx *c) { return c->id.keyed; }

int lei_ctx_sign(const lei_ctx *c, const void *m, size_t n, uint8_t sig[64]) {
    if (!c->id.keyed) return -LEI_E_INVALID;
    crypto_sign_detached(sig, NULL, m, n, c->id.sk);
    return 0;
}

const lei_pin *lei_pin_find(const lei_ctx *c, const char *addr) {
    for (int i = 0; i < c->id.npins; i++)
        if (strcmp(c->id.pins[i].addr, addr) == 0) return &c->id.pins[i];
    return NULL;
}

/* The pin of addr, made (empty) if there is none; NULL when out of memory.
 * The pin lives in c->id.pins (owned by the context, freed with it). */
static lei_pin *pin_get(lei_ctx *c, const char *addr) {
    lei_ident *id = &c->id;
    lei_pin *p = (lei_pin *)lei_pin_find(c, addr);
    if (p) return p;
    void *grown = room(id->pins, &id->cpins, id->npins, sizeof *id->pins);
    if (!grown) return NULL;
    id->pins = grown;
    p = &id->pins[id->npins++];
    memset(p, 0, sizeof *p);
    snprintf(p->addr, sizeof p->addr, "%s", addr);
    return p;
}

int lei_peer_expect(lei_ctx *c, const char *addr, const uint8_t pk[32]) {
    if (strlen(addr) >= LEI_ADDR_MAX) return -LEI_E_INVALID;
    lei_pin *p = pin_get(c, addr);
    if (!p) return -LEI_E_NOMEM;
    memcpy(p->pk, pk, 32);
    p->has_pk = 1;
    /* A connection up with another key ends now. */
    lei_peer *peer = lei_peer_find(c, addr);
    if (peer && lei_peer_is_up(peer) && peer->has_key && memcmp(peer->key, pk, 32) != 0) {
        char why[LEI_ADDR_MAX + 200], got[65], want[65];
        sodium_bin2hex(got, sizeof got, peer->key, 32);
        sodium_bin2hex(want, sizeof want, pk, 32);
        snprintf(why, sizeof why, "%s presented key %s, expected %s", addr, got, want);
        lei_logf(c, "closing connection with %s", why);
        lei_peer_close(peer, why);
    }
    return 0;
}

int lei_peer_expect_principal(lei_ctx *c, const char *addr, const char *name) {
    if (strlen(addr) >= LEI_ADDR_MAX || strlen(name) > LEI_NAME_MAX) return -LEI_E_INVALID;
    lei_pin *p = pin_get(c, addr);
    if (!p) return -LEI_E_NOMEM;
    snprintf(p->principal, sizeof p->principal, "%s", name);
    /* A connection up as another principal ends now. */
    lei_peer *peer = lei_peer_find(c, addr);
    if (peer && lei_peer_is_up(peer) && peer->has_key && strcmp(peer->principal, name) != 0) {
        char why[LEI_ADDR_MAX + 2 * LEI_NAME_MAX + 60];
        snprintf(why, sizeof why, "%s is principal %s, expected %s", addr, peer->principal, name);
        lei_logf(c, "closing connection with %s", why);
        lei_peer_close(peer, why);
    }
    return 0;
}

const uint8_t *lei_peer_key(const lei_peer *p) { return p->has_key ? p->key : NULL; }

const char *lei_peer_principal(const lei_peer *p) { return p->has_key ? p->principal : NULL; }

int lei_chan_set_manager_key(lei_ctx *c, uint32_t chid, const uint8_t pk[32]) {
    lei_chan *ch = lei_chan_get(c, chid);
    if (!ch) return -LEI_E_NOTFOUND;
    memcpy(ch->mkey, pk, 32);
    ch->has_mkey = 1;
    return 0;
}

int lei_chan_set_ticket(lei_ctx *c, uint32_t chid, const uint8_t t[64]) {
    lei_chan *ch = lei_chan_get(c, chid);
    if (!ch) return -LEI_E_NOTFOUND;
    memcpy(ch->ticket, t, 64);
    ch->has_ticket = 1;
    return 0;
}

/* The trust decision on a remote's identity (design: its key is trusted
 * under the name it claims, or an authority we trust certified the pair). */
int lei_trusted(const lei_ctx *c, const lei_hello *h, char *why, size_t n) {
    const lei_ident *id = &c->id;
    for (int i = 0; i < id->nkeys; i++)
        if (memcmp(id->keys[i].pk, h->idpk, 32) == 0 && strcmp(id->keys[i].name, h->name) == 0)
            return 0;
    if (h->has_cert && id->nauths) {
        static const char P[] = "lecho-cert-v1";
        uint8_t m[sizeof P + LEI_NAME_MAX + 1 + 32];
        size_t nl = strlen(h->name), pos = 0;
        memcpy(m, P, sizeof P); /* with its NUL */
        pos += sizeof P;
        memcpy(m + pos, h->name, nl);
        pos += nl;
        m[pos++] = 0;
        memcpy(m + pos, h->idpk, 32);
        pos += 32;
        for (int i = 0; i < id->nauths; i++)
            if (crypto_sign_verify_detached(h->cert, m, pos, id->auths[i]) == 0) return 0;
    }
    char pk[65];
    sodium_bin2hex(pk, sizeof pk, h->idpk, 32);
    snprintf(why, n, "not trusted: %s %s", h->name, pk);
    return -1;
}

size_t lei_base_len(const char *name, size_t len) {
    size_t slash = 0;
    for (size_t i = 0; i < len; i++)
        if (name[i] == '/') slash = i + 1;
    const char *at = memchr(name + slash, '@', len - slash);
    return at ? (size_t)(at - name) : len;
}

const uint8_t *lei_chan_ticket_for(lei_ctx *c, const lei_chan *ch) {
    size_t bl = lei_base_len(ch->name, ch->namelen);
    const lei_chan *base = bl == ch->namelen ? ch : lei_chan_find(c, ch->name, bl);
    return base && base->has_ticket ? base->ticket : NULL;
}

/* Consumer side of a BIND in keyed mode: the channel is open here, has a
 * manager key (its own or its base channel's), and the ticket is the
 * manager's signature of "lecho-producer-v1" 0 base 0 pk for the peer's
 * authenticated key.  Returns the channel, or NULL (refused). */
lei_chan *lei_bind_check(lei_ctx *c, const lei_peer *p, const char *name, size_t nl,
                         const uint8_t *ticket) {
    lei_chan *ch = lei_chan_find(c, name, nl);
    if (!ch || !ticket || !p->has_key) return NULL;
    size_t bl = lei_base_len(name, nl);
    const lei_chan *base = bl == nl ? ch : lei_chan_find(c, name, bl);
    const uint8_t *mkey = ch->has_mkey ? ch->mkey : base && base->has_mkey ? base->mkey : NULL;
    if (!mkey) return NULL;
    static const char P[] = "lecho-producer-v1";
    uint8_t *m = malloc(sizeof P + bl + 1 + 32); /* freed below */
    if (!m) return NULL;
    size_t pos = 0;
    memcpy(m, P, sizeof P); /* with its NUL */
    pos += sizeof P;
    memcpy(m + pos, name, bl);
    pos += bl;
    m[pos++] = 0;
    memcpy(m + pos, p->key, 32);
    pos += 32;
    int ok = crypto_sign_verify_detached(ticket, m, pos, mkey) == 0;
    free(m);
    return ok ? ch : NULL;
}

/* One log line per refused BIND, at most 5 per 10 s (then a count). */
void lei_refused_log(lei_ctx *c, const lei_peer *p, const char *name, size_t nl) {
    lei_ident *id = &c->id;
    ev_tstamp now = ev_now(c->loop);
    if (now - id->rlog_t >= 10.0) {
        if (id->rlog_skipped)
            lei_logf(c, "%llu more refused BINDs not logged",
                     (unsigned long long)id->rlog_skipped);
        id->rlog_t = now;
        id->rlog_n = 0;
        id->rlog_skipped = 0;
    }
    if (id->rlog_n++ >= 5) {
        id->rlog_skipped++;
        return;
    }
    if (!c->id.keyed)
        lei_logf(c, "dropping events of %.*s from %s: no such channel open here",
                 (int)(nl > 200 ? 200 : nl), name, p->addr);
    else
        lei_logf(c, "refusing events of %.*s from %s (%s): not an authorized producer (no valid ticket)",
                 (int)(nl > 200 ? 200 : nl), name, p->addr, p->has_key ? p->principal : "?");
}

void lei_ident_free(lei_ctx *c) {
    lei_ident *id = &c->id;
    free(id->keys);
    free(id->auths);
    free(id->pins);
    sodium_memzero(id, sizeof *id);
}
