/* test_auth.c: identities and trust through the context API (ctx.h) alone:
 * set_identity checks its key and name, signing, trust tables, pins,
 * channel keys and tickets.
 * Prints "N passed, N failed" (read by .ci/run).
 *
 * Leans on the core's C files and libsodium, no Lua.
 */
#include "ctx.h"

#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"

static void nolog(void *ud, const char *msg) {
    (void)ud;
    (void)msg;
}

static lei_ctx *new_ctx(void) {
    lei_hooks h;
    memset(&h, 0, sizeof h);
    h.log = nolog;
    return lei_ctx_new(NULL, &h);
}

static void test_identity(void) {
    lei_ctx *c = new_ctx();
    uint8_t pk[32], sk[64], pk2[32], sk2[64], sig[64], bad[64];
    char err[160];
    CHECK(c != NULL);
    crypto_sign_keypair(pk, sk);
    crypto_sign_keypair(pk2, sk2);
    CHECK(!lei_ctx_keyed(c));
    CHECK(lei_ctx_sign(c, "m", 1, sig) == -LEI_E_INVALID);
    /* names: 1..64 of [A-Za-z0-9._-] */
    CHECK(lei_ctx_set_identity(c, sk, "", NULL, err) == -LEI_E_INVALID);
    CHECK(strstr(err, "bad principal name") != NULL);
    CHECK(lei_ctx_set_identity(c, sk, "a b", NULL, err) == -LEI_E_INVALID);
    CHECK(lei_ctx_set_identity(c, sk, "x/y", NULL, err) == -LEI_E_INVALID);
    char longname[66];
    memset(longname, 'a', 65);
    longname[65] = '\0';
    CHECK(lei_ctx_set_identity(c, sk, longname, NULL, err) == -LEI_E_INVALID);
    longname[64] = '\0';
    /* the embedded pk must be the seed's */
    memcpy(bad, sk, 32);
    memcpy(bad + 32, pk2, 32);
    CHECK(lei_ctx_set_identity(c, bad, "alice", NULL, err) == -LEI_E_INVALID);
    CHECK(strstr(err, "does not match") != NULL);
    CHECK(!lei_ctx_keyed(c));
    CHECK(lei_ctx_set_identity(c, sk, longname, NULL, err) == 0);
    CHECK(lei_ctx_set_identity(c, sk, "Alice-1.x_y", NULL, err) == 0);
    CHECK(lei_ctx_keyed(c));
    CHECK(lei_ctx_sign(c, "hello", 5, sig) == 0);
    CHECK(crypto_sign_verify_detached(sig, (const uint8_t *)"hello", 5, pk) == 0);
    CHECK(crypto_sign_verify_detached(sig, (const uint8_t *)"hellp", 5, pk) != 0);
    lei_ctx_free(c);
}

static void test_tables(void) {
    lei_ctx *c = new_ctx();
    uint8_t pk[32], sk[64], t[64];
    crypto_sign_keypair(pk, sk);
    CHECK(lei_ctx_trust_key(c, pk, "bad name") == -LEI_E_INVALID);
    for (int i = 0; i < 40; i++) { /* grows */
        uint8_t k[32];
        randombytes_buf(k, sizeof k);
        CHECK(lei_ctx_trust_key(c, k, "many") == 0);
        CHECK(lei_ctx_trust_authority(c, k) == 0);
        char addr[32];
        snprintf(addr, sizeof addr, "127.0.0.1:%d", 1000 + i);
        CHECK(lei_peer_expect(c, addr, k) == 0);
    }
    CHECK(lei_ctx_trust_key(c, pk, "bob") == 0);
    CHECK(lei_ctx_trust_key(c, pk, "bob2") == 0); /* renames */
    CHECK(lei_ctx_trust_authority(c, pk) == 0);
    char longaddr[200];
    memset(longaddr, 'x', sizeof longaddr - 1);
    longaddr[sizeof longaddr - 1] = '\0';
    CHECK(lei_peer_expect(c, longaddr, pk) == -LEI_E_INVALID);
    CHECK(lei_peer_expect(c, "127.0.0.1:1000", pk) == 0); /* replaces */
    /* no connection authenticated yet: no peer key */
    lei_peer *p = lei_peer_get(c, "127.0.0.1:1", 0);
    CHECK(p == NULL);
    /* channel keys */
    uint32_t ch = lei_chan_open(c, "ns/x", 4);
    memset(t, 7, sizeof t);
    CHECK(lei_chan_set_manager_key(c, ch, pk) == 0);
    CHECK(lei_chan_set_ticket(c, ch, t) == 0);
    CHECK(lei_chan_set_manager_key(c, ch + 1, pk) == -LEI_E_NOTFOUND);
    CHECK(lei_chan_set_ticket(c, ch + 1, t) == -LEI_E_NOTFOUND);
    lei_stats_chan st;
    CHECK(lei_chan_stats(c, ch, &st) == 0 && st.refused == 0);
    lei_ctx_free(c);
}

int main(void) {
    test_identity();
    test_tables();
    return TEST_SUMMARY();
}
