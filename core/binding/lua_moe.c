/* lua_moe.c: modulator userdata (moe.h): creating one in a MOE state,
 * parameters, receivers, retargeting, errors and stats; and sandboxes
 * (ctx:sandbox: a state like a modulator's, called with values).
 */
#define _GNU_SOURCE
#include "lua_int.h"

#include <math.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A modulator failed: tells Lua, which must not close it from the hook. */
static void lb_moe_failed(void *ud, lei_moe *m, const char *why) {
    (void)m;
    lb_moe *x = ud;
    lb_ctx *b = x->b;
    lua_State *L = b->L;
    if (!L || b->ref_moe_error == LUA_NOREF || !lua_checkstack(L, 4)) {
        lei_logf(b->c, "modulator %d failed: %s", x->id, why);
        return;
    }
    lua_rawgeti(L, LUA_REGISTRYINDEX, b->ref_moe_error);
    lua_pushinteger(L, x->id);
    lua_pushstring(L, why);
    lb_pcall(b, 2, 0);
}

void lb_moe_not_busy(lua_State *L, const lb_ctx *b, const char *what) {
    if (b->moeg && lei_moe_group_busy(b->moeg))
        luaL_error(L, "lecho: %s from inside a modulator's call (its log hook): refused, "
                      "the modulator's state is in use up the stack", what);
}

void lb_moe_flush_all(lb_ctx *b) {
    /* from the start after each one: a failure's hook (Lua) may change the list */
again:
    for (lb_moe *x = b->moes; x; x = x->next)
        if (x->m && lei_moe_staged(x->m)) {
            lei_moe_flush(x->m);
            goto again;
        }
}

static lb_moe *check_moe(lua_State *L) {
    lb_moe *x = luaL_checkudata(L, 1, MOE_MT);
    if (!x->m) luaL_error(L, "lecho: modulator is closed");
    return x;
}

static double opt_num(lua_State *L, int t, const char *k, double def) {
    lua_getfield(L, t, k);
    double v = lua_isnil(L, -1) ? def : luaL_checknumber(L, -1);
    lua_pop(L, 1);
    return v;
}

static int opt_bool(lua_State *L, int t, const char *k) {
    lua_getfield(L, t, k);
    int v = lua_toboolean(L, -1);
    lua_pop(L, 1);
    return v;
}

/* The options of a modulator or a sandbox in the table at t (see l_moe);
 * makes the context's group with the first call's caps. */
static void read_opts(lua_State *L, lb_ctx *b, int t, lei_moe_opts *o) {
    lei_moe_opts_default(o);
    o->budget = opt_num(L, t, "budget", o->budget);
    o->mem_limit = lb_opt_size(L, t, "memory", o->mem_limit);
    o->period = opt_num(L, t, "period", 0);
    o->max_pending = lb_opt_size(L, t, "max_pending", o->max_pending);
    o->grant_clock = opt_bool(L, t, "clock");
    o->grant_log = opt_bool(L, t, "log");
    lua_getfield(L, t, "principal"); /* the opts table keeps the string alive */
    o->principal = lua_isstring(L, -1) ? lua_tostring(L, -1) : NULL;
    lua_pop(L, 1);
    o->lim = b->lim;
    o->on_fail = lb_moe_failed;
    /* The group is made with the first modulator's caps: the context's
     * options, the same for every call (lecho.context passes them). */
    if (!b->moeg) {
        size_t pool = lb_opt_size(L, t, "pool_memory", 0);
        double share = opt_num(L, t, "cpu_share", 0);
        if (!(share >= 0) || !isfinite(share)) luaL_argerror(L, t, "cpu_share must be a number >= 0");
        b->moeg = lei_moe_group_new(b->c, pool, share);
        if (!b->moeg) luaL_error(L, "out of memory");
    }
    o->group = b->moeg;
    if (!(o->budget > 0) || !isfinite(o->budget) || o->mem_limit < 256 * 1024 || !(o->period >= 0) ||
        !isfinite(o->period))
        luaL_argerror(L, t, "budget and period must be positive, memory >= 256 KiB");
}

/* ctx:moe(id, chid, name, source, params, opts) -> moe | nil, err
 * opts: budget (s), memory (bytes), period (s), clock, log (granted),
 * max_pending, principal (who installed it: charged for its CPU); pool_memory (bytes, 0: none) and cpu_share (of one core over
 * 1 s, 0: none): the caps all modulators of the context share, taken from
 * the first call.  The modulator's outputs go to channel chid. */
static int l_moe(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    int id = (int)luaL_checkinteger(L, 2);
    uint32_t chid = lb_check_chan(L, b, 3);
    const char *name = luaL_checkstring(L, 4);
    size_t slen;
    const char *src = luaL_checklstring(L, 5, &slen);
    luaL_checkany(L, 6);
    luaL_checktype(L, 7, LUA_TTABLE);
    lei_moe_opts o;
    read_opts(L, b, 7, &o);
    lb_moe *x = lua_newuserdata(L, sizeof *x);
    memset(x, 0, sizeof *x);
    x->b = b;
    x->id = id;
    o.ud = x;
    luaL_getmetatable(L, MOE_MT);
    lua_setmetatable(L, -2);
    lb_flat f;
    if (lb_flat_encode(L, b, 6, &f)) return 3;
    char err[256];
    x->m = lei_moe_new(b->c, chid, name, src, slen, f.p, f.n, &o, err, sizeof err);
    lb_flat_done(b, &f);
    if (!x->m) return lb_push_err(L, err, LEI_E_INVALID);
    x->next = b->moes;
    b->moes = x;
    return 1;
}

/* true, or nil, why the modulator failed, "failed". */
static int lb_moe_result(lua_State *L, lb_moe *x, int rc) {
    return lb_ok_or_err(L, rc ? lei_moe_error(x->m) : NULL, LEI_E_FAILED);
}

/* moe:params(value) -> true | nil, err (the modulator failed or the value
 * cannot be encoded) */
static int l_moe_params(lua_State *L) {
    lb_moe *x = check_moe(L);
    lb_ctx *b = x->b;
    luaL_checkany(L, 2);
    if (lei_moe_error(x->m)) return lb_push_err(L, lei_moe_error(x->m), LEI_E_FAILED);
    lb_flat f;
    if (lb_flat_encode(L, b, 2, &f)) return 3;
    int rc = lei_moe_set_params(x->m, f.p, f.n);
    lb_flat_done(b, &f);
    return lb_moe_result(L, x, rc);
}

/* moe:receivers(n) -> true | nil, err: a receiving context was added. */
static int l_moe_receivers(lua_State *L) {
    lb_moe *x = check_moe(L);
    int n = (int)luaL_checkinteger(L, 2);
    int rc = lei_moe_receivers(x->m, n);
    return lb_moe_result(L, x, rc);
}

/* moe:retarget(chid) -> true | nil, err */
static int l_moe_retarget(lua_State *L) {
    lb_moe *x = check_moe(L);
    lb_ctx *b = x->b;
    uint32_t chid = lb_check_chan(L, b, 2);
    int rc = lei_moe_retarget(x->m, chid);
    return lb_moe_result(L, x, rc);
}

/* moe:keyframes() -> { { pid =, seq =, data = } ... } | nil: the outputs
 * since the last key frame the modulator marked (the key frame first), or
 * nil when there is none (lei_moe_keyframes). */
static int l_moe_keyframes(lua_State *L) {
    lb_moe *x = check_moe(L);
    const lei_moe_kf *kf;
    lei_moe_flush(x->m); /* what was submitted before the joiner counts */
    long n = x->m ? lei_moe_keyframes(x->m, &kf) : -1;
    if (n < 0) return 0;
    lua_createtable(L, (int)n, 0);
    for (long i = 0; i < n; i++) {
        lua_createtable(L, 0, 3);
        lb_setn(L, "pid", (double)kf[i].producer);
        lb_setn(L, "seq", (double)kf[i].seq);
        lua_pushlstring(L, (const char *)kf[i].data, kf[i].len);
        lua_setfield(L, -2, "data");
        lua_rawseti(L, -2, (int)i + 1);
    }
    return 1;
}

static int l_moe_error(lua_State *L) {
    lb_moe *x = check_moe(L);
    const char *e = lei_moe_error(x->m);
    if (!e) return 0;
    lua_pushstring(L, e);
    return 1;
}

static int l_moe_stats(lua_State *L) {
    lb_moe *x = check_moe(L);
    lei_moe_stats st;
    lei_moe_get_stats(x->m, &st);
    lua_newtable(L);
    lb_setn(L, "calls", (double)st.calls);
    lb_setn(L, "events_in", (double)st.events_in);
    lb_setn(L, "events_out", (double)st.events_out);
    lb_setn(L, "dropped", (double)st.dropped);
    lb_setn(L, "pending", (double)st.pending);
    lb_setn(L, "pending_drops", (double)st.pending_drops);
    lb_setn(L, "period_skips", (double)st.period_skips);
    lb_setn(L, "passed", (double)st.passed);
    lb_setn(L, "staged", (double)st.staged);
    lb_setn(L, "time", (double)st.time_ns * 1e-9);
    lb_setn(L, "memory", (double)st.mem);
    return 1;
}

static void lb_moe_unlink(lb_moe *x) {
    if (!x->b) return;
    for (lb_moe **pp = &x->b->moes; *pp; pp = &(*pp)->next)
        if (*pp == x) {
            *pp = x->next;
            break;
        }
}

static int l_moe_close(lua_State *L) {
    lb_moe *x = luaL_checkudata(L, 1, MOE_MT);
    if (x->m) {
        lb_moe_unlink(x);
        lei_moe_free(x->m);
        x->m = NULL;
    }
    return 0;
}

/* ---- sandboxes (moe.h "sandboxes"): one userdata, the same list -------- */

#define SBX_MT "lecho.sandbox"
#define SBX_MAX 250 /* values of one call's arguments or results */

static lb_moe *check_sbx(lua_State *L) {
    lb_moe *x = luaL_checkudata(L, 1, SBX_MT);
    if (!x->m) luaL_error(L, "lecho: sandbox is closed");
    return x;
}

/* ctx:sandbox(src, name [, opts]) -> sandbox | nil, err, code.  opts as
 * ctx:moe's (budget, memory, principal, clock, log, pool_memory, cpu_share);
 * the chunk returns a function or a table of functions. */
static int l_sandbox(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    size_t slen;
    const char *src = luaL_checklstring(L, 2, &slen);
    const char *name = luaL_checkstring(L, 3);
    if (lua_isnoneornil(L, 4)) {
        lua_settop(L, 3);
        lua_newtable(L);
    }
    luaL_checktype(L, 4, LUA_TTABLE);
    lei_moe_opts o;
    read_opts(L, b, 4, &o);
    o.on_fail = NULL;
    lb_moe *x = lua_newuserdata(L, sizeof *x);
    memset(x, 0, sizeof *x);
    x->b = b;
    luaL_getmetatable(L, SBX_MT);
    lua_setmetatable(L, -2);
    char err[256];
    x->m = lei_moe_svc_new(b->c, name, src, slen, &o, err, sizeof err);
    if (!x->m) return lb_push_err(L, err, LEI_E_INVALID);
    x->next = b->moes;
    b->moes = x;
    return 1;
}

/* A message a sandbox handed over, owned by a userdata until released:
 * decoding it in the caller's state may raise (out of memory), and the
 * message must not leak then (the userdata's __gc releases it). */
#define GUARD_MT "lecho.sandbox.msg"
typedef struct msg_guard {
    lei_msg *m; /* owned; NULL once released */
} msg_guard;

static int guard_gc(lua_State *L) {
    msg_guard *g = lua_touserdata(L, 1);
    if (g && g->m) {
        lei_msg_release(g->m, NULL, NULL);
        g->m = NULL;
    }
    return 0;
}

static msg_guard *guard_new(lua_State *L) {
    msg_guard *g = lua_newuserdata(L, sizeof *g);
    g->m = NULL;
    luaL_getmetatable(L, GUARD_MT);
    lua_setmetatable(L, -2);
    return g;
}

/* Decodes the guarded message onto the stack and releases it: 0, or -1
 * with nil, err, code pushed. */
static int guard_decode(lua_State *L, lb_ctx *b, msg_guard *g) {
    char err[256];
    int bad = lei_decode_lua(L, (const uint8_t *)g->m->own.data, g->m->own.len, &b->lim, err, sizeof err);
    lei_msg_release(g->m, NULL, NULL);
    g->m = NULL;
    if (bad) return lb_push_err(L, err, LEI_E_INVALID), -1;
    return 0;
}

/* Replaces the table { n = N, ... } on top by its values: their count. */
static int unpack_top(lua_State *L) {
    int t = lua_gettop(L);
    lua_getfield(L, t, "n");
    int n = (int)lua_tointeger(L, -1);
    lua_pop(L, 1);
    if (n < 0 || n > SBX_MAX) n = 0;
    luaL_checkstack(L, n + 2, "too many results");
    for (int i = 1; i <= n; i++) lua_rawgeti(L, t, i);
    lua_remove(L, t);
    return n;
}

/* sbx:call(...) / sbx:invoke(fname, ...) -> true, results... | nil, err,
 * code [, traceback]: when the function raised, err is its error value (a
 * table stays a table) and code "failed"; a budget or memory stop is
 * "limit", bad arguments or results that cannot be encoded "invalid", an
 * ended sandbox "closed". */
static int sbx_call(lua_State *L, const char *fn, int first) {
    lb_moe *x = check_sbx(L);
    lb_ctx *b = x->b;
    int n = lua_gettop(L) - first + 1;
    if (n > SBX_MAX) return lb_push_err(L, "too many arguments", LEI_E_INVALID);
    lua_createtable(L, n, 1);
    for (int i = 1; i <= n; i++) {
        lua_pushvalue(L, first + i - 1);
        lua_rawseti(L, -2, i);
    }
    lua_pushinteger(L, n);
    lua_setfield(L, -2, "n");
    int args = lua_gettop(L);
    msg_guard *g = guard_new(L);
    lb_flat f;
    if (lb_flat_encode(L, b, args, &f)) return 3;
    char err[384];
    int rc = lei_moe_svc_call(x->m, fn, f.p, f.n, &g->m, err, sizeof err);
    lb_flat_done(b, &f);
    if (rc == 0) {
        lua_pushboolean(L, 1);
        if (guard_decode(L, b, g)) return 3;
        return unpack_top(L) + 1;
    }
    if (rc == -LEI_E_FAILED && g->m) {
        if (guard_decode(L, b, g)) return 3;
        int t = lua_gettop(L);
        lua_pushnil(L);
        lua_getfield(L, t, "e");
        lua_pushstring(L, lei_err_name(LEI_E_FAILED));
        lua_getfield(L, t, "tb");
        return 4;
    }
    if (g->m) {
        lei_msg_release(g->m, NULL, NULL);
        g->m = NULL;
    }
    return lb_push_err(L, err, -rc);
}

static int l_sbx_call(lua_State *L) { return sbx_call(L, NULL, 2); }

static int l_sbx_invoke(lua_State *L) {
    luaL_checkstring(L, 2);
    /* the name stays on the stack (argument 2) for the call */
    return sbx_call(L, lua_tostring(L, 2), 3);
}

/* sbx:names() -> { names of the table's functions } | false (one function) */
static int l_sbx_names(lua_State *L) {
    lb_moe *x = check_sbx(L);
    msg_guard *g = guard_new(L);
    int rc = lei_moe_svc_names(x->m, &g->m);
    if (rc) return lb_push_err(L, lei_moe_error(x->m), -rc);
    if (!g->m) {
        lua_pushboolean(L, 0);
        return 1;
    }
    if (guard_decode(L, x->b, g)) return 3;
    return 1;
}

static int l_sbx_error(lua_State *L) {
    lb_moe *x = check_sbx(L);
    const char *e = lei_moe_error(x->m);
    if (!e) return 0;
    lua_pushstring(L, e);
    return 1;
}

static int l_sbx_stats(lua_State *L) {
    lb_moe *x = check_sbx(L);
    lei_moe_stats st;
    lei_moe_get_stats(x->m, &st);
    lua_newtable(L);
    lb_setn(L, "calls", (double)st.events_in);
    lb_setn(L, "time", (double)st.time_ns * 1e-9);
    lb_setn(L, "memory", (double)st.mem);
    return 1;
}

static int l_sbx_close(lua_State *L) {
    lb_moe *x = luaL_checkudata(L, 1, SBX_MT);
    if (x->m && lei_moe_svc_in_call(x->m))
        return luaL_error(L, "lecho: a sandbox cannot be closed from inside its own call");
    if (x->m) {
        lb_moe_unlink(x);
        lei_moe_free(x->m);
        x->m = NULL;
    }
    return 0;
}

/* ctx:moe_busy() -> true while a modulator or sandbox of the context is in
 * a call, a batch or the submit of its outputs (lb_moe_not_busy). */
static int l_moe_busy(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    lua_pushboolean(L, b->moeg && lei_moe_group_busy(b->moeg));
    return 1;
}

const luaL_Reg lb_moe_ctx_methods[] = {
    {"moe", l_moe}, {"sandbox", l_sandbox}, {"moe_busy", l_moe_busy}, {NULL, NULL}};

/* ---- core.stream_key: a modulator's key in C (lecho.modulator) ----
 * lecho.modulator names an instance by core.hash(base .. canon(params) ..
 * ("|" .. stream)) (BLAKE2b-256, lb_moe_key_hex), canon a text of the params with sorted keys, written
 * in Lua and run interpreted (a pairs loop: LuaJIT issue 829): ~1.2-2.4 us
 * per params change at the consumer and again at the producer's check.
 * Here the same text for the values whose text is certain to be the same:
 * strings of printable ASCII without '"' or '\\' (what %q leaves as it is,
 * between quotes), integers of at most 2^53 in magnitude other than -0
 * (what %.17g writes as their digits), booleans, and tables of those
 * (keys ordered by type name, then false < true, numbers and strings by
 * <) at most 16 deep.  Anything else: nil, and lecho.modulator's canon
 * makes the text (so both ends, running this same code, agree). */

typedef struct ck_key {
    int rank;        /* 0 boolean, 1 number, 2 string: type names in order */
    double num;      /* boolean (0/1) or number */
    const char *s;   /* string (anchored by the table while canon runs) */
    size_t len;
} ck_key;

static int ck_cmp(const void *pa, const void *pb) {
    const ck_key *a = pa, *b = pb;
    if (a->rank != b->rank) return a->rank < b->rank ? -1 : 1;
    if (a->rank < 2) return a->num < b->num ? -1 : a->num > b->num;
    size_t n = a->len < b->len ? a->len : b->len;
    int c = memcmp(a->s, b->s, n);
    if (c) return c;
    return a->len < b->len ? -1 : a->len > b->len;
}

static int ck_str_ok(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c > 0x7e || c == '"' || c == '\\') return 0;
    }
    return 1;
}

/* An integer of at most 2^53 in magnitude, not -0: its decimal digits. */
static int ck_num_ok(double x) {
    return x >= -9007199254740992.0 && x <= 9007199254740992.0 && x == floor(x) &&
           !(x == 0 && signbit(x));
}

static int ck_put_num(lei_wbuf *b, double x) {
    char t[32];
    int n = snprintf(t, sizeof t, "%.0f", x);
    return lei_wbuf_put(b, t, (size_t)n);
}

/* Appends the canon of the value at idx (absolute) to b: 0, 1 not one of
 * ours (the Lua canon makes it), -1 out of memory. */
static int ck_value(lua_State *L, int idx, lei_wbuf *b, int depth) {
    switch (lua_type(L, idx)) {
    case LUA_TBOOLEAN: return lei_wbuf_put(b, lua_toboolean(L, idx) ? "true" : "false",
                                           lua_toboolean(L, idx) ? 4 : 5) ? -1 : 0;
    case LUA_TNUMBER: {
        double x = lua_tonumber(L, idx);
        if (!ck_num_ok(x)) return 1;
        return ck_put_num(b, x) ? -1 : 0;
    }
    case LUA_TSTRING: {
        size_t n;
        const char *s = lua_tolstring(L, idx, &n);
        if (!ck_str_ok(s, n)) return 1;
        return lei_wbuf_put_u8(b, '"') || lei_wbuf_put(b, s, n) || lei_wbuf_put_u8(b, '"') ? -1 : 0;
    }
    case LUA_TTABLE: break;
    default: return 1;
    }
    if (depth >= 16 || !lua_checkstack(L, 4)) return 1;
    size_t nk = 0, cap = 8;
    ck_key *keys = malloc(cap * sizeof *keys); /* owned here, freed below */
    if (!keys) return -1;
    int rc = 0;
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        ck_key k = {0, 0, NULL, 0};
        int t = lua_type(L, -2);
        if (t == LUA_TBOOLEAN) {
            k.rank = 0;
            k.num = lua_toboolean(L, -2);
        } else if (t == LUA_TNUMBER) {
            k.rank = 1;
            k.num = lua_tonumber(L, -2);
            if (!ck_num_ok(k.num)) rc = 1;
        } else if (t == LUA_TSTRING) {
            k.rank = 2;
            k.s = lua_tolstring(L, -2, &k.len); /* a string key: no conversion in place */
            if (!ck_str_ok(k.s, k.len)) rc = 1;
        } else
            rc = 1;
        lua_pop(L, 1);
        if (rc) {
            lua_pop(L, 1);
            break;
        }
        if (nk == cap) {
            ck_key *nkeys = realloc(keys, 2 * cap * sizeof *keys);
            if (!nkeys) {
                lua_pop(L, 1);
                rc = -1;
                break;
            }
            keys = nkeys;
            cap *= 2;
        }
        keys[nk++] = k;
    }
    if (!rc) {
        qsort(keys, nk, sizeof *keys, ck_cmp);
        rc = lei_wbuf_put_u8(b, '{') ? -1 : 0;
        for (size_t i = 0; !rc && i < nk; i++) {
            const ck_key *k = &keys[i];
            if (k->rank == 0)
                lua_pushboolean(L, k->num != 0);
            else if (k->rank == 1)
                lua_pushnumber(L, k->num);
            else
                lua_pushlstring(L, k->s, k->len);
            rc = ck_value(L, lua_gettop(L), b, depth + 1); /* the key, as canon writes it */
            if (!rc) rc = lei_wbuf_put_u8(b, '=') ? -1 : 0;
            lua_rawget(L, idx);
            if (!rc) rc = ck_value(L, lua_gettop(L), b, depth + 1);
            lua_pop(L, 1);
            if (!rc) rc = lei_wbuf_put_u8(b, ';') ? -1 : 0;
        }
        if (!rc) rc = lei_wbuf_put_u8(b, '}') ? -1 : 0;
    }
    free(keys);
    return rc;
}

/* The key of n bytes at p: BLAKE2b-256 (crypto_generichash, 32 bytes, no
 * key) in lowercase hex.  Keys name modulator code and params between peers
 * (a producer joins a consumer to the instance of its key): a 64-bit FNV-1a
 * was used until a pair of sources of one key was found in minutes
 * (spec/modulator_keys_spec.lua); a collision of this one costs ~2^128. */
void lb_moe_key_hex(const void *p, size_t n, char out[LB_KEY_HEX + 1]) {
    unsigned char h[LB_KEY_HEX / 2];
    crypto_generichash(h, sizeof h, (const unsigned char *)p, (unsigned long long)n, NULL, 0);
    sodium_bin2hex(out, LB_KEY_HEX + 1, h, sizeof h);
}

/* core.stream_key(base, params, stream|nil) -> the key (64 hex digits, as
 * core.hash of base .. canon(params) .. "|" .. stream), or nil when params
 * hold what only lecho.modulator's canon writes. */
int lb_moe_stream_key(lua_State *L) {
    size_t bl, sl = 0;
    const char *base = luaL_checklstring(L, 1, &bl);
    const char *stream = lua_isnoneornil(L, 3) ? NULL : luaL_checklstring(L, 3, &sl);
    luaL_checkany(L, 2);
    lei_wbuf b = {0}; /* owned here, freed below */
    int rc = lei_wbuf_put(&b, base, bl) ? -1 : ck_value(L, 2, &b, 0);
    if (!rc && stream) rc = lei_wbuf_put_u8(&b, '|') || lei_wbuf_put(&b, stream, sl) ? -1 : 0;
    if (rc) {
        lei_wbuf_free(&b);
        if (rc < 0) return luaL_error(L, "lecho: out of memory");
        lua_pushnil(L);
        return 1;
    }
    char out[LB_KEY_HEX + 1];
    lb_moe_key_hex(b.data, b.len, out);
    lei_wbuf_free(&b);
    lua_pushlstring(L, out, LB_KEY_HEX);
    return 1;
}

/* The metatables of modulators, their guards and sandboxes. */
void lb_moe_open(lua_State *L) {
    static const luaL_Reg moe_methods[] = {{"params", l_moe_params}, {"error", l_moe_error},
                                           {"retarget", l_moe_retarget},
                                           {"receivers", l_moe_receivers}, {"keyframes", l_moe_keyframes},
                                           {"stats", l_moe_stats},   {"close", l_moe_close},
                                           {NULL, NULL}};
    static const luaL_Reg sbx_methods[] = {{"call", l_sbx_call},   {"invoke", l_sbx_invoke},
                                           {"names", l_sbx_names}, {"error", l_sbx_error},
                                           {"stats", l_sbx_stats}, {"close", l_sbx_close},
                                           {NULL, NULL}};
    lb_metatable(L, MOE_MT, moe_methods, l_moe_close);
    lb_metatable(L, GUARD_MT, NULL, guard_gc);
    lb_metatable(L, SBX_MT, sbx_methods, l_sbx_close);
}
