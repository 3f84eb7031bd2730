/* fuzz_codec.c: a libFuzzer harness (make fuzz) for the value codec: the
 * input is a value's bytes.  The C walker (lei_codec_validate) and the Lua
 * decoder (lei_decode_lua into a LuaJIT state) must agree on whether it is
 * well formed; what decodes is encoded again (lei_encode_lua), and that
 * encoding must decode to an equal value and encode to as many bytes (a
 * table's order of keys may differ, never its content).
 *
 * Byte 0 of the input sets the limits (bits 0-1: max_depth 0, 3, 100, 1000;
 * bits 2-3: max_value_bytes 0, 256, 64 KiB, 1 MiB; bit 4: max_string 16),
 * the rest is the value.  Leans on core/codec.c, core/codec_lua.c, LuaJIT.
 * Arrays (tag 0x07) compare by dtype, shape and bytes.
 * Seeds: core/fuzz/codec/ (scripts/lecho-fuzz-seeds writes them).
 */
#include "codec.h"
#include "array.h"

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static lua_State *L; /* the harness's own state, for the process's life */
static unsigned long runs;

static void check(int ok, const char *what, const char *detail) {
    if (!ok) {
        fprintf(stderr, "fuzz_codec: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
        abort();
    }
}

static int num_same(double a, double b) {
    if (a != a) return b != b; /* NaN: LuaJIT may give another NaN */
    return memcmp(&a, &b, sizeof a) == 0; /* 0.0 and -0.0 differ */
}

/* Deep equality of the values at a and b (absolute indexes), raw. */
static int same(lua_State *S, int a, int b, int depth) {
    int t = lua_type(S, a);
    if (t != lua_type(S, b)) return 0;
    switch (t) {
    case LUA_TNIL: return 1;
    case LUA_TBOOLEAN: return lua_toboolean(S, a) == lua_toboolean(S, b);
    case LUA_TNUMBER: return num_same(lua_tonumber(S, a), lua_tonumber(S, b));
    case LUA_TSTRING: {
        size_t la, lb;
        const char *x = lua_tolstring(S, a, &la), *y = lua_tolstring(S, b, &lb);
        return la == lb && memcmp(x, y, la) == 0;
    }
    case LUA_TTABLE: break;
    case LUA_TUSERDATA: { /* arrays: dtype, shape and the bytes */
        const lei_array *x = lei_codec_lua_array_check(S, a), *y = lei_codec_lua_array_check(S, b);
        if (!x || !y || x->dtype != y->dtype || x->ndim != y->ndim || x->count != y->count)
            return 0;
        for (int d = 0; d < x->ndim; d++)
            if (x->shape[d] != y->shape[d]) return 0;
        return x->count == 0 || memcmp(x->data, y->data, (size_t)(x->count * x->itemsize)) == 0;
    }
    default: return 0;
    }
    if (depth > 1100 || !lua_checkstack(S, 6)) return 0;
    size_t na = 0, nb = 0;
    lua_pushnil(S);
    while (lua_next(S, a)) {
        int top = lua_gettop(S);
        na++;
        lua_pushvalue(S, top - 1);
        lua_rawget(S, b); /* b[k]: keys are strings, numbers, booleans or tables */
        int ok;
        if (lua_type(S, top - 1) == LUA_TTABLE || lua_type(S, top - 1) == LUA_TUSERDATA) {
            ok = 1; /* a table or array key: equal ones are different keys; counted only */
        } else {
            ok = same(S, top, top + 1, depth + 1);
        }
        lua_settop(S, top - 1);
        if (!ok) {
            lua_pop(S, 1);
            return 0;
        }
    }
    lua_pushnil(S);
    while (lua_next(S, b)) {
        nb++;
        lua_pop(S, 1);
    }
    return na == nb;
}

static void encode(int idx, lei_msg *m, const lei_codec_limits *lim, char *err, size_t elen) {
    int rc = lei_encode_lua(L, idx, m, lim, 0, err, elen);
    check(rc == 0, "what decoded does not encode", err);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const unsigned depths[4] = {0, 3, 100, 1000};
    static const size_t values[4] = {0, 256, 64 * 1024, 1024 * 1024};
    lei_codec_limits lim;
    char err[256], err2[256];
    const char *verr = NULL;

    if (size < 1) return 0;
    lei_codec_limits_default(&lim);
    lim.max_depth = depths[data[0] & 3];
    lim.max_value_bytes = values[(data[0] >> 2) & 3];
    if (data[0] & 16) lim.max_string = 16;
    const uint8_t *p = data + 1;
    size_t n = size - 1;

    lua_settop(L, 0);
    int valid = lei_codec_validate(p, n, &lim, &verr) == 0;
    int top = lua_gettop(L);
    int dec = lei_decode_lua(L, p, n, &lim, err, sizeof err);
    check(lua_gettop(L) == top + (dec == 0), "decode left the stack wrong", NULL);
    if (dec && strcmp(err, "Lua stack overflow") == 0) return 0; /* deep and not our walk */
    check(valid == (dec == 0), valid ? "validate accepts what decode refuses" :
                                       "decode accepts what validate refuses",
          valid ? err : verr);
    if (dec == 0) {
        /* re-encode with the same limits but no cap on decoded size (the
         * encoder does not estimate it), then decode and encode again */
        lei_codec_limits enc = lim;
        enc.max_value_bytes = SIZE_MAX; /* holes may move slots from array to hash */
        lei_msg *m1 = lei_msg_new(), *m2 = lei_msg_new();
        check(m1 && m2, "out of memory", NULL);
        encode(1, m1, &enc, err2, sizeof err2);
        check(lei_codec_validate((const uint8_t *)m1->own.data, m1->own.len, &enc, &verr) == 0,
              "the encoding of a valid value is not valid", verr);
        check(lei_decode_lua(L, (const uint8_t *)m1->own.data, m1->own.len, &enc, err2,
                             sizeof err2) == 0,
              "the encoding of a valid value does not decode", err2);
        check(same(L, 1, 2, 0), "decode(encode(v)) differs from v", NULL);
        encode(2, m2, &enc, err2, sizeof err2);
        check(m1->own.len == m2->own.len, "a second round trip changed the size", NULL);
        lei_msg_release(m1, NULL, NULL);
        lei_msg_release(m2, NULL, NULL);
    }
    lua_settop(L, 0);
    if (++runs % 4096 == 0) lua_gc(L, LUA_GCCOLLECT, 0);
    return 0;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    L = luaL_newstate();
    if (!L) abort();
    return 0;
}
