/* auth.c: identities and trust: our Ed25519 identity, the trusted keys
 * and authorities, address pins, the keys of peers and channels.
 *
 * libsodium is the only crypto.  No Lua, no sockets here: conn.c runs the
 * handshake and asks this file what to trust.
 */
#define _GNU_SOURCE
#include "ctx_int.h"

#include <sodium.h>
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

int lei_ctx_trust_key(lei_ctx *c, const uint8_t pk[32], const char *name) {
    lei_ident *id = &c->id;
    size_t n = strlen(name);
    if (!lei_name_ok(name, n)) return -LEI_E_INVALID;
    for (int i = 0; i < id->nkeys; i++)
        if (memcmp(id->keys[i].pk, pk, 32) == 0) {
            memcpy(id->keys[i].name, name, n + 1);
            return 0;
        }
    if (id->nkeys == id->ckeys) {
        int nc = id->ckeys ? id->ckeys * 2 : 8;
        lei_tkey *k = realloc(id->keys, (size_t)nc * sizeof *k);
        if (!k) return -LEI_E_NOMEM;
        id->keys = k;
        id->ckeys = nc;
    }
    lei_tkey *k = &id->keys[id->nkeys++];
    memcpy(k->pk, pk, 32);
    memcpy(k->name, name, n + 1);
    return 0;
}

int lei_ctx_trust_authority(lei_ctx *c, const uint8_t pk[32]) {
    lei_ident *id = &c->id;
    for (int i = 0; i < id->nauths; i++)
        if (memcmp(id->auths[i], pk, 32) == 0) return 0;
    if (id->nauths == id->cauths) {
        int nc = id->cauths ? id->cauths * 2 : 4;
        uint8_t(*a)[32] = realloc(id->auths, (size_t)nc * sizeof *a);
        if (!a) return -LEI_E_NOMEM;
        id->auths = a;
        id->cauths = nc;
    }
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

int lei_peer_expect(lei_ctx *c, const char *addr, const uint8_t pk[32]) {
    lei_ident *id = &c->id;
    if (strlen(addr) >= LEI_ADDR_MAX) return -LEI_E_INVALID;
    lei_pin *p = (lei_pin *)lei_pin_find(c, addr);
    if (!p) {
        if (id->npins == id->cpins) {
            int nc = id->cpins ? id->cpins * 2 : 8;
            lei_pin *np = realloc(id->pins, (size_t)nc * sizeof *np);
            if (!np) return -LEI_E_NOMEM;
            id->pins = np;
            id->cpins = nc;
        }
        p = &id->pins[id->npins++];
        snprintf(p->addr, sizeof p->addr, "%s", addr);
    }
    memcpy(p->pk, pk, 32);
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

void lei_ident_free(lei_ctx *c) {
    lei_ident *id = &c->id;
    free(id->keys);
    free(id->auths);
    free(id->pins);
    sodium_memzero(id, sizeof *id);
}
