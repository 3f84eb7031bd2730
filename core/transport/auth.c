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
#include <limits.h>
#include <time.h>

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

int lei_auth_set_identity(lei_ctx *c, const uint8_t sk[64], const char *name, const uint8_t *cert,
                         size_t cert_len, char *err) {
    uint8_t pk[32], sk2[64];
    size_t n = strlen(name);
    for (const lei_conn *k = c->conns; k; k = k->next)
        if (k->state != LEI_CONN_CLOSED) {
            snprintf(err, 160, "the identity must be set before the first connection");
            return -LEI_E_INVALID;
        }
    if (cert && cert_len != LEI_SIG_BYTES && (cert_len < LEI_CERT_MIN || cert_len > LEI_CERT_MAX)) {
        snprintf(err, 160, "a certificate is 64 bytes (v1) or %d to %d bytes, not %zu", LEI_CERT_MIN,
                 LEI_CERT_MAX, cert_len);
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
    id->has_cert = !cert ? 0 : cert_len == LEI_SIG_BYTES ? 1 : 2;
    id->cert_len = cert ? cert_len : 0;
    if (cert) memcpy(id->cert, cert, cert_len);
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

int lei_auth_trust_key(lei_ctx *c, const uint8_t pk[32], const char *name) {
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

int lei_auth_trust_authority(lei_ctx *c, const uint8_t pk[32], uint64_t not_before,
                            uint64_t not_after) {
    lei_ident *id = &c->id;
    lei_auth *a = NULL;
    for (int i = 0; i < id->nauths; i++)
        if (memcmp(id->auths[i].pk, pk, 32) == 0) a = &id->auths[i];
    if (!a) {
        void *grown = room(id->auths, &id->cauths, id->nauths, sizeof *id->auths);
        if (!grown) return -LEI_E_NOMEM;
        id->auths = grown;
        a = &id->auths[id->nauths++];
        memcpy(a->pk, pk, 32);
    }
    int changed = a->not_before != not_before || a->not_after != not_after;
    a->not_before = not_before;
    a->not_after = not_after;
    /* A new validity (a reload): the ends of the live connections it
     * certified are computed again; one already over closes them at the
     * expiry timer's next turn. */
    for (lei_conn *k = c->conns; changed && k; k = k->next)
        if (k->state == LEI_CONN_UP && k->mech->remote(k)) lei_cert_watch(k);
    return 0;
}

static int is_revoked(const lei_ident *id, const uint8_t pk[32]) {
    for (int i = 0; i < id->nrevoked; i++)
        if (memcmp(id->revoked[i], pk, 32) == 0) return 1;
    return 0;
}

int lei_auth_set_revoked(lei_ctx *c, const uint8_t *pks, size_t n) {
    lei_ident *id = &c->id;
    if (n > (size_t)INT_MAX / 32) return -LEI_E_INVALID;
    uint8_t(*r)[32] = NULL;
    if (n) {
        r = malloc(n * 32); /* owned by the context's lei_ident, freed at the next set or free */
        if (!r) return -LEI_E_NOMEM;
        memcpy(r, pks, n * 32);
    }
    free(id->revoked);
    id->revoked = r;
    id->nrevoked = (int)n;
    /* Live connections of a revoked key end now, each with one log line. */
    int closed = 0;
    for (lei_conn *k = c->conns, *nk; k; k = nk) {
        nk = k->next;
        if (k->state == LEI_CONN_CLOSED) continue;
        const lei_hello *r = k->mech->remote(k); /* keyed: the key it showed */
        if (!r || !r->name[0] || !is_revoked(id, r->idpk)) continue;
        char why[LEI_NAME_MAX + 120], hex[65];
        sodium_bin2hex(hex, sizeof hex, r->idpk, 32);
        snprintf(why, sizeof why, "key revoked: %s %s", r->name, hex);
        lei_logf(c, "closing connection with %s: %s", k->peer ? k->peer->addr : r->addr, why);
        /* Told in the stream the remote reads: plain before AUTH, a record
         * after (a keyed connection's records are on from AUTH, before UP). */
        lei_conn_send_error(k, why);
        lei_conn_close(k, why, 0);
        closed++;
    }
    return closed;
}

/* A v2 certificate body's layout (frame.h): 0 with its validity and where
 * its address list starts, or -1 when malformed. */
static int cert_parse(const uint8_t *b, size_t n, uint64_t *nb, uint64_t *na, size_t *addrs,
                      int *naddrs) {
    if (n < LEI_CERT_MIN || n > LEI_CERT_MAX) return -1;
    *nb = *na = 0;
    for (int i = 0; i < 8; i++) {
        *nb = *nb << 8 | b[i];
        *na = *na << 8 | b[8 + i];
    }
    *naddrs = b[16];
    *addrs = 17;
    if (*naddrs > LEI_CERT_ADDRS_MAX) return -1;
    size_t pos = 17, end = n - LEI_SIG_BYTES;
    for (int i = 0; i < *naddrs; i++) {
        if (pos >= end) return -1;
        size_t l = b[pos++];
        if (l == 0 || l >= LEI_ADDR_MAX || l > end - pos) return -1;
        pos += l;
    }
    return pos == end ? 0 : -1;
}

/* Whether addr is in a parsed certificate's address list. */
static int cert_lists(const uint8_t *b, size_t addrs, int naddrs, const char *addr) {
    size_t al = strlen(addr), pos = addrs;
    for (int i = 0; i < naddrs; i++) {
        size_t l = b[pos++];
        if (l == al && memcmp(b + pos, addr, l) == 0) return 1;
        pos += l;
    }
    return 0;
}

/* "2026-12-04T21:00:00Z" of Unix time t into out[24]. */
static const char *utc(uint64_t t, char out[24]) {
    time_t tt = t > (uint64_t)INT32_MAX * 64 ? (time_t)INT32_MAX * 64 : (time_t)t;
    struct tm tm;
    if (!gmtime_r(&tt, &tm) || !strftime(out, 24, "%Y-%m-%dT%H:%M:%SZ", &tm))
        snprintf(out, 24, "%llu", (unsigned long long)t);
    return out;
}

int lei_auth_keyed(const lei_ctx *c) { return c->id.keyed; }

int lei_auth_sign(const lei_ctx *c, const void *m, size_t n, uint8_t sig[64]) {
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

int lei_auth_expect(lei_ctx *c, const char *addr, const uint8_t pk[32]) {
    if (strlen(addr) >= LEI_ADDR_MAX) return -LEI_E_INVALID;
    lei_pin *p = pin_get(c, addr);
    if (!p) return -LEI_E_NOMEM;
    memcpy(p->pk, pk, 32);
    p->has_pk = 1;
    /* A connection up with another key ends now. */
    lei_peer *peer = lei_peers_find(c, addr);
    if (peer && lei_peer_is_up(peer) && peer->has_key && memcmp(peer->key, pk, 32) != 0) {
        char why[LEI_ADDR_MAX + 200], got[65], want[65];
        sodium_bin2hex(got, sizeof got, peer->key, 32);
        sodium_bin2hex(want, sizeof want, pk, 32);
        snprintf(why, sizeof why, "%s presented key %s, expected %s", addr, got, want);
        lei_logf(c, "closing connection with %s", why);
        lei_conn_close(peer->conn, why, 0); /* up: it has one */
    }
    return 0;
}

int lei_auth_expect_principal(lei_ctx *c, const char *addr, const char *name) {
    if (strlen(addr) >= LEI_ADDR_MAX || strlen(name) > LEI_NAME_MAX) return -LEI_E_INVALID;
    lei_pin *p = pin_get(c, addr);
    if (!p) return -LEI_E_NOMEM;
    snprintf(p->principal, sizeof p->principal, "%s", name);
    /* A connection up as another principal ends now. */
    lei_peer *peer = lei_peers_find(c, addr);
    if (peer && lei_peer_is_up(peer) && peer->has_key && strcmp(peer->principal, name) != 0) {
        char why[LEI_ADDR_MAX + 2 * LEI_NAME_MAX + 60];
        snprintf(why, sizeof why, "%s is principal %s, expected %s", addr, peer->principal, name);
        lei_logf(c, "closing connection with %s", why);
        lei_conn_close(peer->conn, why, 0); /* up: it has one */
    }
    return 0;
}

const uint8_t *lei_auth_peer_key(const lei_peer *p) { return p->has_key ? p->key : NULL; }

int lei_auth_peer_binds(const lei_peer *p, uint32_t chid) {
    return p && p->conn && lei_inmap_binds(p->conn, chid);
}

const char *lei_auth_peer_principal(const lei_peer *p) { return p->has_key ? p->principal : NULL; }

int lei_auth_set_manager_key(lei_ctx *c, uint32_t chid, const uint8_t pk[32]) {
    lei_chan *ch = lei_chan_get(c, chid);
    if (!ch) return -LEI_E_NOTFOUND;
    memcpy(ch->mkey, pk, 32);
    ch->has_mkey = 1;
    return 0;
}

int lei_auth_set_ticket(lei_ctx *c, uint32_t chid, const uint8_t t[LEI_TICKET_BYTES]) {
    lei_chan *ch = lei_chan_get(c, chid);
    if (!ch) return -LEI_E_NOTFOUND;
    int changed = !ch->has_ticket || memcmp(ch->ticket, t, LEI_TICKET_BYTES) != 0;
    memcpy(ch->ticket, t, LEI_TICKET_BYTES);
    /* A renewed ticket: the channel is bound again, with it, before its
     * next event to each peer (a consumer checks tickets at BIND). */
    for (int i = 0; changed && i < c->peers_s.npeers; i++) {
        lei_peer *p = c->peers_s.peers[i];
        if (ch->id < p->nbound) p->bound[ch->id] = 0;
    }
    ch->has_ticket = 1;
    return 0;
}

/* A v2 certificate in h that one of our authorities signed: 0 with the
 * validity of both (the certificate's within its authority's) and its
 * address list, or -1.  *by_auth: CERT_START_AUTH when nb is the
 * authority's start (later than the certificate's), CERT_END_AUTH when na
 * is the authority's end (earlier); apk: that authority's key (32 bytes,
 * copied; may be NULL).  The signed message (doc/security.md):
 * "lecho-cert-v2" 0 name 0 pk32 || the certificate without its signature. */
#define CERT_START_AUTH 1
#define CERT_END_AUTH 2
static int cert_verified(const lei_ctx *c, const lei_hello *h, uint64_t *nb, uint64_t *na,
                         size_t *addrs, int *naddrs, int *by_auth, uint8_t *apk) {
    const lei_ident *id = &c->id;
    if (h->has_cert != 2 || !id->nauths ||
        cert_parse(h->cert, h->cert_len, nb, na, addrs, naddrs))
        return -1;
    static const char P[] = "lecho-cert-v2";
    uint8_t m[sizeof P + LEI_NAME_MAX + 1 + 32 + LEI_CERT_MAX];
    size_t nl = strnlen(h->name, LEI_NAME_MAX), pos = 0, body = h->cert_len - LEI_SIG_BYTES;
    memcpy(m, P, sizeof P); /* with its NUL */
    pos += sizeof P;
    memcpy(m + pos, h->name, nl);
    pos += nl;
    m[pos++] = 0;
    memcpy(m + pos, h->idpk, 32);
    pos += 32;
    memcpy(m + pos, h->cert, body);
    pos += body;
    for (int i = 0; i < id->nauths; i++) {
        const lei_auth *a = &id->auths[i];
        if (crypto_sign_verify_detached(h->cert + body, m, pos, a->pk) != 0) continue;
        *by_auth = 0;
        if (a->not_before > *nb) {
            *nb = a->not_before;
            *by_auth |= CERT_START_AUTH;
        }
        if (a->not_after && (!*na || a->not_after < *na)) {
            *na = a->not_after;
            *by_auth |= CERT_END_AUTH;
        }
        if (apk) memcpy(apk, a->pk, 32);
        return 0;
    }
    return -1;
}

/* The trust decision on a remote's identity (design: its key is trusted
 * under the name it claims, or an authority we trust certified the pair,
 * for a validity period that includes now and, when the certificate lists
 * addresses, for addr: the one a HELLO advertises, or the one we dialled
 * for a HELLO_OK; and the key is not revoked). */
int lei_trusted(const lei_ctx *c, const lei_hello *h, const char *addr, char *why, size_t n) {
    const lei_ident *id = &c->id;
    char pk[65], t1[24];
    sodium_bin2hex(pk, sizeof pk, h->idpk, 32);
    if (is_revoked(id, h->idpk)) {
        snprintf(why, n, "key revoked: %s %s", h->name, pk);
        return -1;
    }
    for (int i = 0; i < id->nkeys; i++)
        if (memcmp(id->keys[i].pk, h->idpk, 32) == 0 && strcmp(id->keys[i].name, h->name) == 0)
            return 0;
    if (h->has_cert == 1 && id->nauths) {
        snprintf(why, n, "not trusted: %s %s: an old certificate without validity (lecho-cert-v1): "
                 "certify the key again with lecho-keygen", h->name, pk);
        return -1;
    }
    uint64_t nb, na;
    size_t addrs;
    int naddrs, by_auth;
    uint8_t apk[32];
    char ahex[65];
    if (cert_verified(c, h, &nb, &na, &addrs, &naddrs, &by_auth, apk) == 0) {
        double now = ev_now(c->loop);
        sodium_bin2hex(ahex, sizeof ahex, apk, 32);
        if (nb && now < (double)nb && (by_auth & CERT_START_AUTH))
            snprintf(why, n, "certificate of %s: its authority %s is not valid before %s", h->name, ahex,
                     utc(nb, t1));
        else if (nb && now < (double)nb)
            snprintf(why, n, "certificate of %s not yet valid (from %s)", h->name, utc(nb, t1));
        else if (na && now >= (double)na && (by_auth & CERT_END_AUTH))
            snprintf(why, n, "certificate of %s: its authority %s ended at %s", h->name, ahex, utc(na, t1));
        else if (na && now >= (double)na)
            snprintf(why, n, "certificate of %s expired at %s", h->name, utc(na, t1));
        else if (naddrs && !cert_lists(h->cert, addrs, naddrs, addr))
            snprintf(why, n, "certificate of %s does not list address %.*s", h->name, 160, addr);
        else
            return 0;
        return -1;
    }
    snprintf(why, n, "not trusted: %s %s", h->name, pk);
    return -1;
}

int lei_ticket_bound(lei_conn *k, uint64_t idx, const uint8_t *ticket) {
    size_t i = 0;
    while (i < k->ntexp && k->texp[i].idx != idx) i++;
    if (!ticket) {
        if (i < k->ntexp) k->texp[i] = k->texp[--k->ntexp];
        return 0;
    }
    uint64_t exp = 0;
    for (int b = 0; b < 8; b++) exp = exp << 8 | ticket[b];
    if (i == k->ntexp) {
        if (k->ntexp == k->ctexp) {
            size_t nc = k->ctexp ? 2 * k->ctexp : 8;
            void *g = realloc(k->texp, nc * sizeof *k->texp); /* owned by k, freed with it */
            if (!g) return -1;
            k->texp = g;
            k->ctexp = nc;
        }
        k->ntexp++;
    }
    k->texp[i].idx = idx;
    k->texp[i].exp = exp;
    lei_expiry_at(k->ctx, (double)exp);
    return 0;
}

/* The indexes of k whose ticket expired by now are refused (one log line
 * per refusal, rate-limited as refused BINDs); returns the next expiry. */
static ev_tstamp tickets_expire(lei_conn *k, ev_tstamp now) {
    ev_tstamp next = 0;
    for (size_t i = 0; i < k->ntexp;) {
        struct lei_texp *t = &k->texp[i];
        if ((double)t->exp > now) {
            if (!next || (double)t->exp < next) next = (double)t->exp;
            i++;
            continue;
        }
        uint32_t v;
        uint64_t idx = t->idx;
        *t = k->texp[--k->ntexp];
        if (lei_inmap_get(k, idx, &v) || v == LEI_REFUSED) continue;
        lei_chan *ch = lei_chan_get(k->ctx, v - 1);
        char why[LEI_BIND_NAME_MAX + 64];
        snprintf(why, sizeof why, "not an authorized producer of %.*s (ticket expired)",
                 ch ? (int)ch->namelen : 1, ch ? ch->name : "?");
        if (lei_inmap_set_rname(k, idx, ch ? ch->id : UINT32_MAX, why) == 0)
            lei_inmap_set(k, idx, LEI_REFUSED);
        if (ch && k->peer) lei_refused_log(k->ctx, k->peer, ch->name, ch->namelen);
    }
    return next;
}

void lei_cert_watch(lei_conn *k) {
    uint64_t nb, na;
    size_t addrs;
    int naddrs, by_auth;
    k->cert_end = 0;
    const lei_hello *r = k->mech->remote(k);
    if (r && cert_verified(k->ctx, r, &nb, &na, &addrs, &naddrs, &by_auth, k->cert_apk) == 0 && na) {
        k->cert_end = na; /* verified once here: the expiry timer reads it */
        k->cert_end_auth = (by_auth & CERT_END_AUTH) != 0;
        lei_expiry_at(k->ctx, (double)na);
    }
}

/* A live connection whose peer's certificate expired is closed when it
 * does, with one log line, and the bindings whose ticket expired are
 * refused; returns the next expiry (0: none). */
ev_tstamp lei_certs_expire(lei_ctx *c, ev_tstamp now) {
    ev_tstamp next = 0;
    for (lei_conn *k = c->conns, *nk; k; k = nk) {
        nk = k->next;
        const lei_hello *r = k->mech->remote(k);
        if (k->state != LEI_CONN_UP || !r) continue;
        if (k->ntexp) {
            ev_tstamp t = tickets_expire(k, now);
            if (t && (!next || t < next)) next = t;
        }
        if (!k->cert_end) continue;
        uint64_t na = k->cert_end;
        if ((double)na <= now) {
            char why[LEI_NAME_MAX + 160], t1[24], ahex[65];
            if (k->cert_end_auth) {
                sodium_bin2hex(ahex, sizeof ahex, k->cert_apk, 32);
                snprintf(why, sizeof why, "certificate of %s: its authority %s ended at %s",
                         r->name, ahex, utc(na, t1));
            } else {
                snprintf(why, sizeof why, "certificate of %s expired at %s", r->name, utc(na, t1));
            }
            lei_logf(c, "closing connection with %s: %s", k->peer ? k->peer->addr : "?", why);
            lei_conn_send_error(k, why);
            lei_conn_close(k, why, 0);
        } else if (!next || (double)na < next) {
            next = (double)na;
        }
    }
    return next;
}

/* The length of name's base: up to the first '@' after the last '/'. */
static size_t base_len(const char *name, size_t len) {
    size_t slash = 0;
    for (size_t i = 0; i < len; i++)
        if (name[i] == '/') slash = i + 1;
    const char *at = memchr(name + slash, '@', len - slash);
    return at ? (size_t)(at - name) : len;
}

const uint8_t *lei_auth_ticket_for(lei_ctx *c, const lei_chan *ch) {
    size_t bl = base_len(ch->name, ch->namelen);
    const lei_chan *base = bl == ch->namelen ? ch : lei_chan_find(c, ch->name, bl);
    return base && base->has_ticket ? base->ticket : NULL;
}

/* Consumer side of a BIND in keyed mode: the channel is open here, has a
 * manager key (its own or its base channel's), and the ticket (u64be
 * expiry, then 64 bytes) is not expired and is the manager's signature of
 * "lecho-producer-v2" 0 base 0 pk || u64be expiry for the peer's
 * authenticated key.  Returns the channel, or NULL (refused). */
lei_chan *lei_auth_bind_check(lei_ctx *c, const lei_peer *p, const char *name, size_t nl,
                         const uint8_t *ticket) {
    lei_chan *ch = lei_chan_find(c, name, nl);
    if (!ch || !ticket || !p->has_key) return NULL;
    size_t bl = base_len(name, nl);
    const lei_chan *base = bl == nl ? ch : lei_chan_find(c, name, bl);
    const uint8_t *mkey = ch->has_mkey ? ch->mkey : base && base->has_mkey ? base->mkey : NULL;
    if (!mkey) return NULL;
    uint64_t exp = 0;
    for (int i = 0; i < 8; i++) exp = exp << 8 | ticket[i];
    if ((double)exp <= ev_now(c->loop)) return NULL; /* expired */
    static const char P[] = "lecho-producer-v2";
    uint8_t *m = malloc(sizeof P + bl + 1 + 32 + 8); /* freed below */
    if (!m) return NULL;
    size_t pos = 0;
    memcpy(m, P, sizeof P); /* with its NUL */
    pos += sizeof P;
    memcpy(m + pos, name, bl);
    pos += bl;
    m[pos++] = 0;
    memcpy(m + pos, p->key, 32);
    pos += 32;
    memcpy(m + pos, ticket, 8);
    pos += 8;
    int ok = crypto_sign_verify_detached(ticket + 8, m, pos, mkey) == 0;
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
    free(id->revoked);
    sodium_memzero(id, sizeof *id);
}
