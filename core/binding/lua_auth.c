/* lua_auth.c: keys, signatures, identity and trust from Lua (binding).
 *
 * Module functions: core.keypair() -> pk, sk; core.sign(sk, msg) -> sig;
 * core.verify(pk, msg, sig) -> bool; core.hex(s); core.unhex(h).
 * Context methods: set_identity, trust_key, trust_authority, keyed, sign,
 * set_revoked, expect, peer_identity, chan_manager_key, chan_ticket (ctx.h,
 * auth.c).
 * Keys are raw bytes (pk 32, sk 64, signatures 64); a string of another
 * length is misuse and raises.
 */
#define _GNU_SOURCE
#include "lua_int.h"

#include <sodium.h>
#include <string.h>

/* Argument i: a string of exactly n bytes (raises otherwise). */
static const uint8_t *check_bytes(lua_State *L, int i, size_t n, const char *what) {
    size_t len;
    const char *s = luaL_checklstring(L, i, &len);
    if (len != n) {
        lua_pushfstring(L, "%s must be %d bytes, not %d", what, (int)n, (int)len);
        luaL_argerror(L, i, lua_tostring(L, -1));
    }
    return (const uint8_t *)s;
}

/* core.keypair() -> pk (32 bytes), sk (64 bytes) */
static int l_keypair(lua_State *L) {
    uint8_t pk[32], sk[64];
    if (sodium_init() < 0) return luaL_error(L, "lecho: libsodium cannot start");
    crypto_sign_keypair(pk, sk);
    lua_pushlstring(L, (const char *)pk, 32);
    lua_pushlstring(L, (const char *)sk, 64);
    sodium_memzero(sk, sizeof sk);
    return 2;
}

/* core.sign(sk, msg) -> sig (64 bytes) */
static int l_sign(lua_State *L) {
    const uint8_t *sk = check_bytes(L, 1, 64, "secret key");
    size_t n;
    const char *m = luaL_checklstring(L, 2, &n);
    uint8_t sig[64];
    if (sodium_init() < 0) return luaL_error(L, "lecho: libsodium cannot start");
    crypto_sign_detached(sig, NULL, (const uint8_t *)m, n, sk);
    lua_pushlstring(L, (const char *)sig, 64);
    return 1;
}

/* core.verify(pk, msg, sig) -> bool (a key or signature of the wrong length: false) */
static int l_verify(lua_State *L) {
    size_t pl, n, sl;
    const char *pk = luaL_checklstring(L, 1, &pl);
    const char *m = luaL_checklstring(L, 2, &n);
    const char *sig = luaL_checklstring(L, 3, &sl);
    if (sodium_init() < 0) return luaL_error(L, "lecho: libsodium cannot start");
    lua_pushboolean(L, pl == 32 && sl == 64 &&
                           crypto_sign_verify_detached((const uint8_t *)sig, (const uint8_t *)m, n,
                                                       (const uint8_t *)pk) == 0);
    return 1;
}

/* core.hex(s) -> lowercase hex (libsodium's, as the core's messages) */
static int l_hex(lua_State *L) {
    size_t n;
    const uint8_t *s = (const uint8_t *)luaL_checklstring(L, 1, &n);
    luaL_Buffer B;
    luaL_buffinit(L, &B);
    char out[2 * 64 + 1];
    for (size_t i = 0; i < n; i += 64) {
        size_t m = n - i < 64 ? n - i : 64;
        sodium_bin2hex(out, sizeof out, s + i, m);
        luaL_addlstring(&B, out, 2 * m);
    }
    luaL_pushresult(&B);
    return 1;
}

/* core.unhex(h) -> bytes, or nil, err, "invalid" */
static int l_unhex(lua_State *L) {
    size_t n, len;
    const char *h = luaL_checklstring(L, 1, &n), *end;
    if (n % 2) return lb_push_err(L, "hex text of odd length", LEI_E_INVALID);
    uint8_t *b = lua_newuserdata(L, n / 2 + 1); /* owned by the Lua GC */
    if (sodium_hex2bin(b, n / 2 + 1, h, n, NULL, &len, &end) != 0 || end != h + n)
        return lb_push_err(L, "not a hex digit", LEI_E_INVALID);
    lua_pushlstring(L, (const char *)b, len);
    return 1;
}

/* ctx:set_identity(sk, name[, cert]) -> true | nil, err, "invalid"
 * (cert: 64 bytes, an old v1 one, or a v2 certificate: doc/security.md) */
static int l_set_identity(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    const uint8_t *sk = check_bytes(L, 2, 64, "secret key");
    const char *name = luaL_checkstring(L, 3);
    size_t cl = 0;
    const uint8_t *cert =
        lua_isnoneornil(L, 4) ? NULL : (const uint8_t *)luaL_checklstring(L, 4, &cl);
    char err[160];
    int rc = lei_auth_set_identity(b->c, sk, name, cert, cl, err);
    return lb_ok_or_err(L, rc ? err : NULL, -rc);
}

/* ctx:trust_key(pk, name) -> true | nil, err, code */
static int l_trust_key(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    const uint8_t *pk = check_bytes(L, 2, 32, "public key");
    const char *name = luaL_checkstring(L, 3);
    int rc = lei_auth_trust_key(b->c, pk, name);
    if (rc == -LEI_E_INVALID) return lb_push_err(L, "bad principal name", LEI_E_INVALID);
    return lb_ok_or_err(L, rc ? lei_err_text(-rc) : NULL, -rc);
}

/* ctx:trust_authority(pk[, not_before, not_after]) -> true | nil, err, code
 * (Unix seconds; nil or 0: unbounded) */
static int l_trust_authority(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    const uint8_t *pk = check_bytes(L, 2, 32, "public key");
    lua_Number nb = luaL_optnumber(L, 3, 0), na = luaL_optnumber(L, 4, 0);
    if (!(nb >= 0 && nb < 1e15 && na >= 0 && na < 1e15))
        return luaL_argerror(L, 3, "validity: Unix seconds in [0, 1e15)");
    int rc = lei_auth_trust_authority(b->c, pk, (uint64_t)nb, (uint64_t)na);
    return lb_ok_or_err(L, rc ? lei_err_text(-rc) : NULL, -rc);
}

/* ctx:set_revoked(keys) -> closed | nil, err, code: keys is the revoked
 * public keys, 32 bytes each, concatenated ("" for none) */
static int l_set_revoked(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    size_t n;
    const char *ks = luaL_checklstring(L, 2, &n);
    if (n % 32) return luaL_argerror(L, 2, "revoked keys: a multiple of 32 bytes");
    int rc = lei_auth_set_revoked(b->c, (const uint8_t *)ks, n / 32);
    if (rc < 0) return lb_ok_or_err(L, lei_err_text(-rc), -rc);
    lua_pushinteger(L, rc);
    return 1;
}

/* ctx:keyed() -> bool */
static int l_keyed(lua_State *L) {
    lua_pushboolean(L, lei_auth_keyed(lb_check_ctx(L)->c));
    return 1;
}

/* ctx:sign(msg) -> sig (64), or nil, err, "invalid" without an identity */
static int l_ctx_sign(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    size_t n;
    const char *m = luaL_checklstring(L, 2, &n);
    uint8_t sig[64];
    if (lei_auth_sign(b->c, m, n, sig))
        return lb_push_err(L, "this context has no identity (key=)", LEI_E_INVALID);
    lua_pushlstring(L, (const char *)sig, 64);
    return 1;
}

/* ctx:expect(addr, pk) -> true | nil, err, code: pins addr to pk */
static int l_expect(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    const char *addr = luaL_checkstring(L, 2);
    int rc = lei_auth_expect(b->c, addr, check_bytes(L, 3, 32, "public key"));
    if (rc == -LEI_E_INVALID) return lb_push_err(L, "address too long", LEI_E_INVALID);
    return lb_ok_or_err(L, rc ? lei_err_text(-rc) : NULL, -rc);
}

/* ctx:expect_principal(addr, name) -> true | nil, err, code: pins addr to a
 * principal (a name server's address: nameserver_principal), checked in
 * the handshake before anything queued for addr is written */
static int l_expect_principal(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    const char *addr = luaL_checkstring(L, 2);
    int rc = lei_auth_expect_principal(b->c, addr, luaL_checkstring(L, 3));
    if (rc == -LEI_E_INVALID) return lb_push_err(L, "address or principal name too long", LEI_E_INVALID);
    return lb_ok_or_err(L, rc ? lei_err_text(-rc) : NULL, -rc);
}

/* ctx:peer_gen(addr) -> the generation of addr's connection while it is up
 * (unique in the context: a reply must come on the connection its request
 * went out on, lecho.control), 0 when there is none up now */
static int l_peer_gen(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    lei_peer *p = lei_peer_get(b->c, luaL_checkstring(L, 2), 0);
    lua_pushnumber(L, (lua_Number)(p && lei_peer_up(p) ? lei_peer_gen(p) : 0));
    return 1;
}

/* core.random_id() -> an integer in [1, 2^53), from libsodium's randombytes:
 * request ids no other process can guess (lecho.control) */
static int l_random_id(lua_State *L) {
    uint64_t v;
    do {
        randombytes_buf(&v, sizeof v);
        v &= (UINT64_C(1) << 53) - 1;
    } while (v == 0);
    lua_pushnumber(L, (lua_Number)v);
    return 1;
}

/* core.random_ids(n) -> { n such ids } (1 <= n <= 256): one read of the
 * system's randomness for n requests (a getrandom per id was ~1.5 us of a
 * params change's ~30 us at the consumer); the caller keeps them per
 * context (lecho.control's _pend). */
static int l_random_ids(lua_State *L) {
    lua_Integer n = luaL_checkinteger(L, 1);
    luaL_argcheck(L, n >= 1 && n <= 256, 1, "1 to 256 ids");
    uint64_t v[256];
    randombytes_buf(v, (size_t)n * sizeof v[0]);
    lua_createtable(L, (int)n, 0);
    for (lua_Integer i = 0; i < n; i++) {
        uint64_t x = v[i] & ((UINT64_C(1) << 53) - 1);
        while (x == 0) { /* (1 in 2^53) */
            randombytes_buf(&x, sizeof x);
            x &= (UINT64_C(1) << 53) - 1;
        }
        lua_pushnumber(L, (lua_Number)x);
        lua_rawseti(L, -2, (int)i + 1);
    }
    sodium_memzero(v, sizeof v); /* ids still unused stay unknown to a later read of the stack */
    return 1;
}

/* ctx:peer_loss(addr) -> unreached, principal, pk | nil (unknown peer):
 * the flags of addr's last loss (ctx.h lei_loss), none while it is up:
 * unreached (boolean) when a dial of ours did not connect; keyed, the
 * principal and key (32 bytes) the remote showed when its address's
 * principal pin refused it (nil, nil else: not proven, only what it said). */
static int l_peer_loss(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    lei_peer *p = lei_peer_get(b->c, luaL_checkstring(L, 2), 0);
    if (!p) {
        lua_pushnil(L);
        return 1;
    }
    const lei_loss *l = lei_peer_loss(p);
    lua_pushboolean(L, l->unreached);
    if (!l->principal[0]) return 1;
    lua_pushstring(L, l->principal);
    lua_pushlstring(L, (const char *)l->key, 32);
    return 3;
}

/* ctx:peer_identity(addr) -> principal, pk | nil (unknown peer, protected
 * mode, or no authenticated connection yet) */
static int l_peer_identity(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    lei_peer *p = lei_peer_get(b->c, luaL_checkstring(L, 2), 0);
    const uint8_t *pk = p ? lei_auth_peer_key(p) : NULL;
    if (!pk) {
        lua_pushnil(L);
        return 1;
    }
    lua_pushstring(L, lei_auth_peer_principal(p));
    lua_pushlstring(L, (const char *)pk, 32);
    return 2;
}

/* ctx:peer_binds(addr, chid) -> bool: the peer's connection has chid
 * bound here (lei_auth_peer_binds) */
static int l_peer_binds(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    lei_peer *p = lei_peer_get(b->c, luaL_checkstring(L, 2), 0);
    lua_pushboolean(L, lei_auth_peer_binds(p, (uint32_t)luaL_checkinteger(L, 3)));
    return 1;
}

/* ctx:bind_at(chid, addr) -> bool: a BIND of chid queued for addr now
 * (lei_peer_bind) */
static int l_bind_at(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    uint32_t chid = lb_check_chan(L, b, 2);
    lua_pushboolean(L, lei_peer_bind(b->c, luaL_checkstring(L, 3), chid) == 0);
    return 1;
}

/* ctx:chan_manager_key(chid, pk) */
static int l_chan_manager_key(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    uint32_t chid = lb_check_chan(L, b, 2);
    lei_auth_set_manager_key(b->c, chid, check_bytes(L, 3, 32, "public key"));
    return 0;
}

/* ctx:chan_ticket(chid, ticket) */
static int l_chan_ticket(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    uint32_t chid = lb_check_chan(L, b, 2);
    lei_auth_set_ticket(b->c, chid, check_bytes(L, 3, LEI_TICKET_BYTES, "ticket"));
    return 0;
}

const luaL_Reg lb_auth_methods[] = {
    {"set_identity", l_set_identity},
    {"peer_binds", l_peer_binds},
    {"bind_at", l_bind_at},
    {"trust_key", l_trust_key},
    {"trust_authority", l_trust_authority},
    {"set_revoked", l_set_revoked},
    {"keyed", l_keyed},
    {"sign", l_ctx_sign},
    {"expect", l_expect},
    {"expect_principal", l_expect_principal},
    {"peer_gen", l_peer_gen},
    {"peer_identity", l_peer_identity},
    {"peer_loss", l_peer_loss},
    {"chan_manager_key", l_chan_manager_key},
    {"chan_ticket", l_chan_ticket},
    {NULL, NULL}};

const luaL_Reg lb_auth_funcs[] = {
    {"keypair", l_keypair}, {"sign", l_sign},   {"verify", l_verify},
    {"hex", l_hex},         {"unhex", l_unhex}, {"random_id", l_random_id},
    {"random_ids", l_random_ids}, {NULL, NULL}};
