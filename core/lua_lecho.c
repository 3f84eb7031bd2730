/* lua_lecho.c: the Lua binding of the core, `require "lecho.core"`.
 *
 * The only core file, with codec_lua.c, that knows Lua.  It wraps a context
 * (ctx.h) in a userdata, turns Lua values into messages with the codec and
 * back, and calls the Lua hooks (event, ctrl, peer, log) through one
 * protected call with a traceback that never lets an error escape into C.
 * Expected failures return nil, message; misuse raises (luaL_argerror).
 *
 * Ownership: the userdata owns the context; each timer userdata owns its
 * ev_timer and, while active, pins itself and its function in the registry.
 * Strings pinned by the codec are released through the unpin hook.
 */
#define _GNU_SOURCE
#include <lauxlib.h>
#include <lua.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "ctx.h"
#include "moe.h"

#define CTX_MT "lecho.ctx"
#define TIMER_MT "lecho.timer"
#define MOE_MT "lecho.moe"

typedef struct lb_timer lb_timer;
typedef struct lb_moe lb_moe;

typedef struct lb_ctx {
    lei_ctx *c;            /* owned; NULL once closed */
    lua_State *L;          /* the thread every callback runs on (owned via ref_thread) */
    int ref_event, ref_ctrl, ref_peer, ref_log, ref_tb, ref_moe_error, ref_turn;
    int ref_thread;        /* pins L */
    int ref_calls;         /* { hook_call, log_call }: made once, no allocation per call */
    int want_turn;         /* call the turn hook before each loop turn's writes */
    int close_pending;     /* close() came from inside a callback: done on return */
    lei_codec_limits lim;
    size_t pin_threshold;
    int stopping;
    lb_timer *timers;      /* live timers, stopped when the context closes */
    lb_moe *moes;          /* live modulators, freed when the context closes */
} lb_ctx;

/* A modulator userdata: owns its lei_moe until close, gc or context close. */
struct lb_moe {
    lei_moe *m;            /* owned; NULL once closed */
    lb_ctx *b;
    lb_moe *next;
    int id;                /* given by the caller, passed to the moe_error hook */
};

/* A timer or, for ctx:io, a read watcher: one userdata type, one stop. */
struct lb_timer {
    union {
        ev_timer w;
        ev_io io;
    };
    int is_io;
    lb_ctx *b;
    lb_timer *next;
    int ref_fn, ref_self;
    int active;
};

/* An expected failure as Lua sees it: nil, message, code name (errors.h).
 * Returns the number of values pushed. */
static int push_err(lua_State *L, const char *msg, int code) {
    lua_pushnil(L);
    lua_pushstring(L, msg ? msg : lei_err_text(code));
    lua_pushstring(L, lei_err_name(code));
    return 3;
}

/* The usual result of a call that can fail: true, or nil, err, code. */
static int ok_or_err(lua_State *L, const char *err, int code) {
    if (err) return push_err(L, err, code);
    lua_pushboolean(L, 1);
    return 1;
}

/* The code of an encoder's message (codec_lua.c says what, not which). */
static int enc_code(const char *msg) {
    if (strstr(msg, "out of memory")) return LEI_E_NOMEM;
    if (strstr(msg, "limit")) return LEI_E_LIMIT;
    return LEI_E_INVALID;
}

static lb_ctx *check_ctx(lua_State *L) {
    lb_ctx *b = luaL_checkudata(L, 1, CTX_MT);
    if (!b->c) luaL_error(L, "lecho: context is closed");
    return b;
}

/* Calls the function below nargs arguments through the traceback handler.
 * Errors are logged, never raised.  Returns 0 or -1. */
static int pcall_tb(lb_ctx *b, int nargs, int nres) {
    lua_State *L = b->L;
    int base = lua_gettop(L) - nargs;
    lua_rawgeti(L, LUA_REGISTRYINDEX, b->ref_tb);
    lua_insert(L, base);
    int rc = lua_pcall(L, nargs, nres, base);
    lua_remove(L, base);
    if (rc) {
        const char *m = lua_tostring(L, -1);
        lei_logf(b->c, "error in callback: %s", m ? m : "(non-string error)");
        lua_pop(L, 1);
        return -1;
    }
    return 0;
}

static void hook_unpin(void *ud, int ref) {
    lb_ctx *b = ud;
    luaL_unref(b->L, LUA_REGISTRYINDEX, ref);
}

/* Calls the log function (upvalue-free: both come as arguments) with the
 * message; the string is made inside the protected call, where running out
 * of memory is an error like any other. */
static int log_call(lua_State *L) {
    const char *msg = lua_touserdata(L, 2);
    lua_settop(L, 1);
    lua_pushstring(L, msg);
    lua_call(L, 1, 0);
    return 0;
}

static void hook_log(void *ud, const char *msg) {
    lb_ctx *b = ud;
    lua_State *L = b->L;
    if (b->ref_log == LUA_NOREF || !L || !lua_checkstack(L, 4)) {
        fprintf(stderr, "lecho: %s\n", msg);
        return;
    }
    lua_rawgeti(L, LUA_REGISTRYINDEX, b->ref_calls);
    lua_rawgeti(L, -1, 2);
    lua_remove(L, -2);
    lua_rawgeti(L, LUA_REGISTRYINDEX, b->ref_log);
    lua_pushlightuserdata(L, (void *)msg);
    if (lua_pcall(L, 2, 0, 0)) {
        fprintf(stderr, "lecho: %s (log hook failed: %s)\n", msg, lua_tostring(L, -1));
        lua_pop(L, 1);
    }
}

/* What a hook hands to the protected call below. */
typedef struct hook_args {
    lb_ctx *b;
    lei_peer *from;
    int ref;                 /* the Lua function */
    int is_event;
    uint32_t chid;
    uint64_t producer, seq, sync;
    const uint8_t *p;
    size_t n;
    int bad;                 /* the payload did not decode */
    int held;                /* the event function returned true */
    char err[256];
} hook_args;

/* Decodes the payload and calls the hook's Lua function, all inside one
 * lua_pcall: running out of memory while decoding (a value that decodes to
 * many times its size) costs that connection, never the process. */
static int hook_call(lua_State *L) {
    hook_args *a = lua_touserdata(L, 1);
    lua_settop(L, 0);
    luaL_checkstack(L, 12, "hook");
    lua_rawgeti(L, LUA_REGISTRYINDEX, a->ref);
    if (a->is_event)
        lua_pushnumber(L, a->chid);
    else
        lua_pushstring(L, lei_peer_addr(a->from));
    a->bad = 1; /* until the value is there */
    if (lei_decode_lua(L, a->p, a->n, &a->b->lim, a->err, sizeof a->err)) return 0;
    a->bad = 0;
    if (!a->is_event) {
        lua_call(L, 2, 0);
        return 0;
    }
    lua_pushinteger(L, a->from ? lei_peer_idx(a->from) : 0);
    lua_pushnumber(L, (lua_Number)a->producer);
    lua_pushnumber(L, (lua_Number)a->seq);
    lua_pushnumber(L, (lua_Number)a->sync);
    lua_call(L, 6, 1);
    a->held = lua_toboolean(L, -1);
    return 0;
}

/* Runs hook_call; 0, 1 (event: a handler is suspended) or -1 (bad value:
 * the caller closes the connection it came on). */
static int run_hook(lb_ctx *b, hook_args *a) {
    lua_State *L = b->L;
    if (!L || a->ref == LUA_NOREF || !lua_checkstack(L, 4)) return -1;
    lua_rawgeti(L, LUA_REGISTRYINDEX, b->ref_tb);
    lua_rawgeti(L, LUA_REGISTRYINDEX, b->ref_calls); /* no allocation before the pcall */
    lua_rawgeti(L, -1, 1);
    lua_remove(L, -2);
    lua_pushlightuserdata(L, a);
    int rc = lua_pcall(L, 1, 0, -3);
    if (rc == LUA_ERRMEM || (rc && a->bad)) {
        /* The partly decoded value is garbage now: collect it before the
         * next allocation (LuaJIT does not collect when one fails). */
        lua_pop(L, 1);
        lua_gc(L, LUA_GCCOLLECT, 0);
        lua_pushstring(L, rc == LUA_ERRMEM ? "not enough memory" : "error");
    }
    const char *from = a->from ? lei_peer_addr(a->from) : "local";
    const char *what = a->is_event ? "event value" : "control message";
    if (rc) {
        const char *m = lua_tostring(L, -1);
        if (a->bad)
            lei_logf(b->c, "bad %s from %s: %s", what, from,
                     rc == LUA_ERRMEM ? "out of memory decoding it" : (m ? m : "error"));
        else
            lei_logf(b->c, "error in callback: %s", m ? m : "(non-string error)");
        lua_pop(L, 2);
        return a->bad ? -1 : 0;
    }
    lua_pop(L, 1);
    if (a->bad) {
        lei_logf(b->c, "bad %s from %s: %s", what, from, a->err);
        return -1;
    }
    return a->held ? 1 : 0;
}

static int hook_event(void *ud, lei_peer *from, uint32_t chid, uint64_t producer, uint64_t seq,
                      uint64_t sync, const uint8_t *p, size_t n) {
    lb_ctx *b = ud;
    hook_args a;
    memset(&a, 0, sizeof a);
    a.b = b;
    a.from = from;
    a.ref = b->ref_event;
    a.is_event = 1;
    a.chid = chid;
    a.producer = producer;
    a.seq = seq;
    a.sync = sync;
    a.p = p;
    a.n = n;
    return run_hook(b, &a);
}

static int hook_ctrl(void *ud, lei_peer *from, const uint8_t *p, size_t n) {
    lb_ctx *b = ud;
    hook_args a;
    memset(&a, 0, sizeof a);
    a.b = b;
    a.from = from;
    a.ref = b->ref_ctrl;
    a.p = p;
    a.n = n;
    return run_hook(b, &a) < 0 ? -1 : 0;
}

static void hook_peer(void *ud, lei_peer *p, int up, const char *reason) {
    lb_ctx *b = ud;
    lua_State *L = b->L;
    if (!L || b->ref_peer == LUA_NOREF || !lua_checkstack(L, 6)) return;
    lua_rawgeti(L, LUA_REGISTRYINDEX, b->ref_peer);
    lua_pushinteger(L, lei_peer_idx(p));
    lua_pushstring(L, lei_peer_addr(p));
    lua_pushboolean(L, up);
    if (reason)
        lua_pushstring(L, reason);
    else
        lua_pushnil(L);
    pcall_tb(b, 4, 0);
}

/* Runs the modulators' dequeue, then the turn hook (the Lua scheduler
 * resumes waiters that can go on), before the queues are written. */
static void hook_prepare(void *ud) {
    lb_ctx *b = ud;
    for (lb_moe *x = b->moes; x; x = x->next)
        if (x->m && lei_moe_has_pending(x->m)) lei_moe_pump(x->m);
    if (b->want_turn && b->ref_turn != LUA_NOREF && b->L && lua_checkstack(b->L, 4)) {
        lua_rawgeti(b->L, LUA_REGISTRYINDEX, b->ref_turn);
        lei_ctx_enter(b->c);
        pcall_tb(b, 0, 0);
        if (b->c) lei_ctx_leave(b->c);
    }
}

/* A modulator failed: tells Lua, which must not close it from the hook. */
static void moe_failed(void *ud, lei_moe *m, const char *why) {
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
    pcall_tb(b, 2, 0);
}

static size_t opt_size(lua_State *L, int t, const char *k, size_t def) {
    lua_getfield(L, t, k);
    size_t v = lua_isnil(L, -1) ? def : (size_t)luaL_checknumber(L, -1);
    lua_pop(L, 1);
    return v;
}

static const char *const policy_names[] = {"block", "drop_oldest", "drop_newest", "disconnect",
                                           NULL};

/* heartbeat= (s, 0: off), heartbeat_misses= (> 1), retry_max= (s) of the
 * options table at index 1. */
static void opt_liveness(lua_State *L, lei_opts *o) {
    static const char *const names[] = {"heartbeat", "heartbeat_misses", "retry_max"};
    double *dst[] = {&o->heartbeat, &o->heartbeat_misses, &o->retry_max};
    for (int i = 0; i < 3; i++) {
        lua_getfield(L, 1, names[i]);
        if (!lua_isnil(L, -1)) {
            double v = luaL_checknumber(L, -1);
            if (!(v >= 0) || (i == 1 && !(v > 1)))
                luaL_error(L, "lecho: %s must be %s", names[i], i == 1 ? "above 1" : "0 or more");
            *dst[i] = v;
        }
        lua_pop(L, 1);
    }
}

/* core.new{ queue_limit=, policy=, batch_bytes=, max_frame=, max_string=,
 *           max_depth=, pin_threshold=, retry_interval=, heartbeat=,
 *           heartbeat_misses=, retry_max= } */
static int l_new(lua_State *L) {
    lei_opts o;
    lei_opts_default(&o);
    lei_codec_limits lim;
    lei_codec_limits_default(&lim);
    size_t pin = 64 * 1024;
    if (lua_istable(L, 1)) {
        o.queue_limit = opt_size(L, 1, "queue_limit", o.queue_limit);
        o.batch_bytes = opt_size(L, 1, "batch_bytes", o.batch_bytes);
        lim.max_string = opt_size(L, 1, "max_string", lim.max_string);
        lim.max_depth = (unsigned)opt_size(L, 1, "max_depth", lim.max_depth);
        o.max_frame = opt_size(L, 1, "max_frame", lim.max_string + 64 * 1024 > o.max_frame
                                                       ? lim.max_string + 64 * 1024
                                                       : o.max_frame);
        /* A frame's length is a u32 on the wire: nothing bigger can be sent. */
        if (lim.max_string > 0xFFFFFFFFu - 64 * 1024 || o.max_frame > 0xFFFFFFFFu)
            return luaL_error(L, "lecho: max_string and max_frame must stay under 4 GiB "
                                 "(a frame's length is 32 bits on the wire)");
        pin = opt_size(L, 1, "pin_threshold", pin);
        lua_getfield(L, 1, "retry_interval");
        if (!lua_isnil(L, -1)) o.retry_interval = luaL_checknumber(L, -1);
        lua_pop(L, 1);
        opt_liveness(L, &o);
        lua_getfield(L, 1, "policy");
        if (!lua_isnil(L, -1)) o.policy = luaL_checkoption(L, -1, NULL, policy_names);
        lua_pop(L, 1);
    }
    lb_ctx *b = lua_newuserdata(L, sizeof *b);
    memset(b, 0, sizeof *b);
    b->ref_event = b->ref_ctrl = b->ref_peer = b->ref_log = b->ref_moe_error = LUA_NOREF;
    b->ref_turn = LUA_NOREF;
    b->lim = lim;
    b->pin_threshold = pin;
    /* One thread of its own runs every callback: never a coroutine of the
     * caller's, which may be suspended when the loop next calls back. */
    b->L = lua_newthread(L);
    b->ref_thread = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_createtable(L, 2, 0);
    lua_pushcfunction(L, hook_call);
    lua_rawseti(L, -2, 1);
    lua_pushcfunction(L, log_call);
    lua_rawseti(L, -2, 2);
    b->ref_calls = luaL_ref(L, LUA_REGISTRYINDEX);
    lei_hooks h = {b, hook_event, hook_ctrl, hook_peer, hook_unpin, hook_log, hook_prepare};
    b->c = lei_ctx_new(&o, &h);
    if (!b->c) return luaL_error(L, "lecho: cannot create a context (libev loop)");
    lua_getglobal(L, "debug");
    lua_getfield(L, -1, "traceback");
    b->ref_tb = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_pop(L, 1);
    luaL_getmetatable(L, CTX_MT);
    lua_setmetatable(L, -2);
    return 1;
}

static void ctx_close(lb_ctx *b, lua_State *L) {
    if (!b->c) return;
    while (b->moes) {
        lb_moe *x = b->moes;
        b->moes = x->next;
        lei_moe_free(x->m);
        x->m = NULL;
        x->b = NULL;
    }
    while (b->timers) {
        lb_timer *t = b->timers;
        b->timers = t->next;
        if (t->is_io)
            ev_io_stop(lei_ctx_loop(b->c), &t->io);
        else
            ev_timer_stop(lei_ctx_loop(b->c), &t->w);
        if (t->active) {
            luaL_unref(L, LUA_REGISTRYINDEX, t->ref_self);
            t->active = 0;
        }
        t->b = NULL;
    }
    lei_ctx_free(b->c);
    b->c = NULL;
    luaL_unref(L, LUA_REGISTRYINDEX, b->ref_event);
    luaL_unref(L, LUA_REGISTRYINDEX, b->ref_ctrl);
    luaL_unref(L, LUA_REGISTRYINDEX, b->ref_peer);
    luaL_unref(L, LUA_REGISTRYINDEX, b->ref_log);
    luaL_unref(L, LUA_REGISTRYINDEX, b->ref_moe_error);
    luaL_unref(L, LUA_REGISTRYINDEX, b->ref_turn);
    luaL_unref(L, LUA_REGISTRYINDEX, b->ref_tb);
    luaL_unref(L, LUA_REGISTRYINDEX, b->ref_thread);
    luaL_unref(L, LUA_REGISTRYINDEX, b->ref_calls);
    b->L = NULL;
    b->ref_event = b->ref_ctrl = b->ref_peer = b->ref_log = b->ref_moe_error = LUA_NOREF;
    b->ref_turn = LUA_NOREF;
}

/* ctx:close(): frees the context now, or, from inside one of its own
 * callbacks (the loop is running below), stops it listening now and frees
 * it when the outermost run or run_once returns. */
static int l_close(lua_State *L) {
    lb_ctx *b = luaL_checkudata(L, 1, CTX_MT);
    if (b->c && lei_ctx_depth(b->c) > 0) {
        if (!b->close_pending) {
            b->close_pending = 1;
            lei_ctx_stop_listening(b->c);
            ev_break(lei_ctx_loop(b->c), EVBREAK_ALL);
        }
        return 0;
    }
    ctx_close(b, L);
    return 0;
}

/* After a run or run_once returned: a close asked for from inside. */
static void close_if_pending(lb_ctx *b, lua_State *L) {
    if (b->close_pending && b->c && lei_ctx_depth(b->c) == 0) ctx_close(b, L);
}

static int l_gc(lua_State *L) {
    lb_ctx *b = luaL_checkudata(L, 1, CTX_MT);
    ctx_close(b, L);
    return 0;
}

static int l_listen(lua_State *L) {
    lb_ctx *b = check_ctx(L);
    const char *host = luaL_checkstring(L, 2);
    int port = (int)luaL_optinteger(L, 3, 0);
    const char *err;
    int rc = lei_ctx_listen(b->c, host, port, &err);
    if (rc) {
        lua_pushnil(L);
        lua_pushfstring(L, "cannot listen on %s:%d: %s", host, port, err);
        lua_pushstring(L, lei_err_name(rc));
        return 3;
    }
    lua_pushstring(L, lei_ctx_addr(b->c));
    return 1;
}

static int l_addr(lua_State *L) {
    lb_ctx *b = check_ctx(L);
    lua_pushstring(L, lei_ctx_addr(b->c));
    return 1;
}

static void set_ref(lua_State *L, int t, const char *k, int *ref) {
    lua_getfield(L, t, k);
    if (lua_isnil(L, -1)) {
        lua_pop(L, 1);
        return;
    }
    luaL_checktype(L, -1, LUA_TFUNCTION);
    luaL_unref(L, LUA_REGISTRYINDEX, *ref);
    *ref = luaL_ref(L, LUA_REGISTRYINDEX);
}

/* ctx:hooks{ event = fn(chid, value, peer, producer, seq, sync),
 *            ctrl = fn(from_addr, msg), peer = fn(idx, addr, up, reason),
 *            log = fn(message) } */
static int l_hooks(lua_State *L) {
    lb_ctx *b = check_ctx(L);
    luaL_checktype(L, 2, LUA_TTABLE);
    set_ref(L, 2, "event", &b->ref_event);
    set_ref(L, 2, "ctrl", &b->ref_ctrl);
    set_ref(L, 2, "peer", &b->ref_peer);
    set_ref(L, 2, "log", &b->ref_log);
    set_ref(L, 2, "moe_error", &b->ref_moe_error);
    set_ref(L, 2, "turn", &b->ref_turn);
    return 0;
}

static int l_channel(lua_State *L) {
    lb_ctx *b = check_ctx(L);
    size_t n;
    const char *name = luaL_checklstring(L, 2, &n);
    uint32_t id = lei_chan_open(b->c, name, n);
    if (id == UINT32_MAX) return luaL_error(L, "lecho: out of memory");
    lua_pushnumber(L, id);
    return 1;
}

/* The channel id at index i, raising when there is no such channel. */
static uint32_t check_chan(lua_State *L, lb_ctx *b, int i) {
    uint32_t id = (uint32_t)luaL_checknumber(L, i);
    if (!lei_chan_get(b->c, id)) luaL_argerror(L, i, "no such channel");
    return id;
}

static int l_set_local(lua_State *L) {
    lb_ctx *b = check_ctx(L);
    lei_chan_set_local(b->c, check_chan(L, b, 2), lua_toboolean(L, 3));
    return 0;
}

static int l_set_dests(lua_State *L) {
    lb_ctx *b = check_ctx(L);
    uint32_t chid = check_chan(L, b, 2);
    luaL_checktype(L, 3, LUA_TTABLE);
    int n = (int)lua_objlen(L, 3);
    const char **a = n ? calloc((size_t)n, sizeof *a) : NULL;
    if (n && !a) return luaL_error(L, "lecho: out of memory");
    for (int i = 0; i < n; i++) {
        lua_rawgeti(L, 3, i + 1);
        a[i] = lua_tostring(L, -1);
        lua_pop(L, 1); /* strings stay alive in the table */
        if (!a[i]) {
            free(a);
            return luaL_argerror(L, 3, "addresses must be strings");
        }
    }
    lei_chan_set_dests(b->c, chid, a, n);
    free(a);
    return 0;
}

/* Encodes the value at idx into a new message; NULL with nil, err, code
 * pushed. */
static lei_msg *encode_at(lua_State *L, lb_ctx *b, int idx) {
    char err[256];
    lei_msg *m = lei_msg_new();
    if (!m) {
        push_err(L, NULL, LEI_E_NOMEM);
        return NULL;
    }
    if (lei_encode_lua(L, idx, m, &b->lim, b->pin_threshold, err, sizeof err)) {
        lei_msg_release(m, hook_unpin, b);
        push_err(L, err, enc_code(err));
        return NULL;
    }
    lei_ctx_count_encode(b->c);
    return m;
}

/* A message holding the string at idx, which already is an encoded value
 * (lecho.fastenc's output): copied, never re-encoded. */
static lei_msg *encoded_at(lua_State *L, lb_ctx *b, int idx) {
    size_t n;
    const char *s = luaL_checklstring(L, idx, &n);
    lei_msg *m = lei_msg_new();
    if (!m || lei_wbuf_put(&m->own, s, n)) {
        lei_msg_release(m, NULL, NULL);
        push_err(L, NULL, LEI_E_NOMEM);
        return NULL;
    }
    lei_msg_sync(m);
    lei_ctx_count_encode(b->c);
    return m;
}

/* Flat bytes of m: its own buffer, or a copy in *tmp (pinned slices). */
static const uint8_t *msg_bytes(lei_msg *m, uint8_t **tmp) {
    *tmp = NULL;
    if (m->next == 0) return (const uint8_t *)m->own.data;
    *tmp = malloc(m->total ? m->total : 1);
    if (!*tmp) return NULL;
    lei_msg_flatten(m, (char *)*tmp);
    return *tmp;
}

/* A value handed to a modulator: encoded from the application's state and
 * flat.  p/n are valid until flat_done. */
typedef struct lb_flat {
    lei_msg *m;      /* owned */
    uint8_t *tmp;    /* owned: the flat copy when m has pinned slices */
    const uint8_t *p;
    size_t n;
} lb_flat;

/* Encodes the value at idx: 0, or -1 with nil, err, code pushed (3 results). */
static int flat_encode(lua_State *L, lb_ctx *b, int idx, lb_flat *f) {
    f->m = encode_at(L, b, idx);
    if (!f->m) return -1;
    f->p = msg_bytes(f->m, &f->tmp);
    f->n = f->m->total;
    if (!f->p) {
        lei_msg_release(f->m, hook_unpin, b);
        push_err(L, NULL, LEI_E_NOMEM);
        return -1;
    }
    return 0;
}

static void flat_done(lb_ctx *b, lb_flat *f) {
    free(f->tmp);
    lei_msg_release(f->m, hook_unpin, b);
}

/* The modulator sent nothing for a sync event: a marker (producer 0, seq
 * 0, value nil) goes on its stream instead, acknowledged by the consuming
 * context once everything before it was handled.  0 with its sync id. */
static int sync_marker(lb_ctx *b, uint32_t chid, uint64_t *sid) {
    lei_msg *m = lei_msg_new();
    const uint8_t nil = LEI_T_NIL;
    const char *err = NULL;
    if (!m || lei_wbuf_put(&m->own, &nil, 1)) {
        lei_msg_release(m, NULL, NULL);
        return -1;
    }
    lei_msg_sync(m);
    int rc = lei_submit(b->c, chid, 0, 0, m, 1, LEI_BLOCK, sid, &err);
    lei_msg_release(m, NULL, NULL);
    return rc;
}

/* 1 when channel chid (if plain) and the derived channel of every live
 * modulator in the array at index `moes` have room for a blocking submit. */
static int room_for(lb_ctx *b, uint32_t chid, int plain, lua_State *L, int moes, int nmoes) {
    if (plain && !lei_chan_room(b->c, chid)) return 0;
    for (int i = 1; i <= nmoes; i++) {
        lua_rawgeti(L, moes, i);
        lb_moe *x = luaL_checkudata(L, -1, MOE_MT);
        lua_pop(L, 1);
        if (x->m && !lei_moe_error(x->m) && !lei_chan_room(b->c, lei_moe_chid(x->m))) return 0;
    }
    return 1;
}

/* ctx:room(chid, moes, plain) -> true when a blocking submit would not wait. */
static int l_room(lua_State *L) {
    lb_ctx *b = check_ctx(L);
    uint32_t chid = check_chan(L, b, 2);
    int nmoes = lua_istable(L, 3) ? (int)lua_objlen(L, 3) : 0;
    int plain = nmoes == 0 || lua_isnoneornil(L, 4) || lua_toboolean(L, 4);
    lua_pushboolean(L, room_for(b, chid, plain, L, 3, nmoes));
    return 1;
}

/* ctx:resume(peer_idx, chid): a suspended dispatch from that peer (0: a
 * local one, of channel chid) is over; what it held back comes next. */
static int l_resume(lua_State *L) {
    lb_ctx *b = check_ctx(L);
    int idx = (int)luaL_checkinteger(L, 2);
    if (idx == 0)
        lei_resume(b->c, NULL, (uint32_t)luaL_checknumber(L, 3));
    else if (lei_peer_by_idx(b->c, idx))
        lei_resume(b->c, lei_peer_by_idx(b->c, idx), 0);
    return 0;
}

/* ctx:want_turn(on): call the turn hook before each loop turn's writes. */
static int l_want_turn(lua_State *L) {
    lb_ctx *b = check_ctx(L);
    b->want_turn = lua_toboolean(L, 2);
    return 0;
}

/* ctx:depth(): > 0 inside one of the context's callbacks. */
static int l_depth(lua_State *L) {
    lua_pushinteger(L, lei_ctx_depth(check_ctx(L)->c));
    return 1;
}

/* ctx:shutdown(): the graceful close begins (ctx.h lei_ctx_shutdown). */
static int l_shutdown(lua_State *L) {
    lb_ctx *b = check_ctx(L);
    lei_ctx_shutdown(b->c);
    return 0;
}

/* ctx:pending() -> open connections, events queued, bytes queued */
static int l_pending(lua_State *L) {
    lb_ctx *b = check_ctx(L);
    uint64_t ev, by;
    int open = lei_ctx_pending(b->c, &ev, &by);
    lua_pushinteger(L, open);
    lua_pushnumber(L, (lua_Number)ev);
    lua_pushnumber(L, (lua_Number)by);
    return 3;
}

/* ctx:submit(chid, producer, seq, value, sync, policy[, moes, plain, encoded])
 *   -> true | sync id | nil, err
 * moes: an array of modulators each event also goes through (encoded once
 * for all); plain (default true): also send it unmodulated on chid.  For a
 * sync submit with moes, returns a list of the sync ids to wait for.
 * encoded: value is a string holding the encoded value already. */
static int l_submit(lua_State *L) {
    lb_ctx *b = check_ctx(L);
    uint32_t chid = check_chan(L, b, 2);
    uint64_t producer = (uint64_t)luaL_checknumber(L, 3);
    uint64_t seq = (uint64_t)luaL_checknumber(L, 4);
    luaL_checkany(L, 5);
    int sync = lua_toboolean(L, 6);
    int policy = lua_isnoneornil(L, 7) ? lei_ctx_opts(b->c)->policy : luaL_checkoption(L, 7, NULL, policy_names);
    int nmoes = lua_istable(L, 8) ? (int)lua_objlen(L, 8) : 0;
    int plain = nmoes == 0 || lua_isnoneornil(L, 9) || lua_toboolean(L, 9);
    if ((policy == LEI_BLOCK || sync) && !room_for(b, chid, plain, L, 8, nmoes)) {
        /* Nothing done: the caller waits for room (ctx:room) and retries. */
        lua_pushnil(L);
        lua_pushliteral(L, "queue full");
        lua_pushliteral(L, "wouldblock");
        return 3;
    }
    lei_msg *m = lua_toboolean(L, 10) ? encoded_at(L, b, 5) : encode_at(L, b, 5);
    if (!m) return 3;
    lei_chan_count_encode(b->c, chid);
    const char *err = NULL;
    uint64_t sid = 0;
    int rc = plain ? lei_submit(b->c, chid, producer, seq, m, sync, policy, &sid, &err) : 0;
    if (rc || nmoes == 0) {
        lei_msg_release(m, hook_unpin, b);
        if (rc) return push_err(L, err, rc);
        if (sync)
            lua_pushnumber(L, (lua_Number)sid);
        else
            lua_pushboolean(L, 1);
        return 1;
    }
    /* Through each modulator; a failing one is reported by its hook and
     * does not stop the others. */
    int nids = 0;
    if (sync) {
        lua_newtable(L);
        if (plain) {
            lua_pushnumber(L, (lua_Number)sid);
            lua_rawseti(L, -2, ++nids);
        }
    }
    int ids = lua_gettop(L);
    uint8_t *tmp;
    const uint8_t *bytes = msg_bytes(m, &tmp);
    for (int i = 1; bytes && i <= nmoes; i++) {
        lua_rawgeti(L, 8, i);
        lb_moe *x = luaL_checkudata(L, -1, MOE_MT);
        lua_pop(L, 1); /* the array keeps it */
        if (!x->m || lei_moe_error(x->m)) continue;
        if (lei_moe_enqueue(x->m, producer, seq, bytes, m->total, sync, policy) || !sync) continue;
        const uint64_t *sids;
        size_t n = lei_moe_syncs(x->m, &sids);
        uint64_t marker;
        if (n == 0 && sync_marker(b, lei_moe_chid(x->m), &marker) == 0) {
            sids = &marker;
            n = 1;
        }
        for (size_t k = 0; k < n; k++) {
            lua_pushnumber(L, (lua_Number)sids[k]);
            lua_rawseti(L, ids, ++nids);
        }
    }
    free(tmp);
    lei_msg_release(m, hook_unpin, b);
    if (!bytes) return push_err(L, NULL, LEI_E_NOMEM);
    if (!sync) lua_pushboolean(L, 1);
    return 1;
}

/* ---- modulators ---------------------------------------------------------- */

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

/* ctx:moe(id, chid, name, source, params, opts) -> moe | nil, err
 * opts: budget (s), memory (bytes), period (s), clock, log (granted),
 * max_pending.  The modulator's outputs go to channel chid. */
static int l_moe(lua_State *L) {
    lb_ctx *b = check_ctx(L);
    int id = (int)luaL_checkinteger(L, 2);
    uint32_t chid = check_chan(L, b, 3);
    const char *name = luaL_checkstring(L, 4);
    size_t slen;
    const char *src = luaL_checklstring(L, 5, &slen);
    luaL_checkany(L, 6);
    luaL_checktype(L, 7, LUA_TTABLE);
    lei_moe_opts o;
    lei_moe_opts_default(&o);
    o.budget = opt_num(L, 7, "budget", o.budget);
    o.mem_limit = opt_size(L, 7, "memory", o.mem_limit);
    o.period = opt_num(L, 7, "period", 0);
    o.max_pending = opt_size(L, 7, "max_pending", o.max_pending);
    o.grant_clock = opt_bool(L, 7, "clock");
    o.grant_log = opt_bool(L, 7, "log");
    lua_getfield(L, 7, "prelude"); /* stays on the stack while the moe is made */
    o.prelude = lua_tolstring(L, -1, &o.prelude_len);
    o.lim = b->lim;
    o.on_fail = moe_failed;
    if (o.budget <= 0 || o.mem_limit < 256 * 1024 || o.period < 0)
        return luaL_argerror(L, 7, "budget and period must be positive, memory >= 256 KiB");
    lb_moe *x = lua_newuserdata(L, sizeof *x);
    memset(x, 0, sizeof *x);
    x->b = b;
    x->id = id;
    o.ud = x;
    luaL_getmetatable(L, MOE_MT);
    lua_setmetatable(L, -2);
    lb_flat f;
    if (flat_encode(L, b, 6, &f)) return 3;
    char err[256];
    x->m = lei_moe_new(b->c, chid, name, src, slen, f.p, f.n, &o, err, sizeof err);
    flat_done(b, &f);
    if (!x->m) return push_err(L, err, LEI_E_INVALID);
    x->next = b->moes;
    b->moes = x;
    return 1;
}

/* true, or nil, why the modulator failed, "failed". */
static int moe_result(lua_State *L, lb_moe *x, int rc) {
    return ok_or_err(L, rc ? lei_moe_error(x->m) : NULL, LEI_E_FAILED);
}

/* moe:params(value) -> true | nil, err (the modulator failed or the value
 * cannot be encoded) */
static int l_moe_params(lua_State *L) {
    lb_moe *x = check_moe(L);
    lb_ctx *b = x->b;
    luaL_checkany(L, 2);
    if (lei_moe_error(x->m)) return push_err(L, lei_moe_error(x->m), LEI_E_FAILED);
    lb_flat f;
    if (flat_encode(L, b, 2, &f)) return 3;
    int rc = lei_moe_set_params(x->m, f.p, f.n);
    flat_done(b, &f);
    return moe_result(L, x, rc);
}

/* moe:receivers(n) -> true | nil, err: a receiving context was added. */
static int l_moe_receivers(lua_State *L) {
    lb_moe *x = check_moe(L);
    int n = (int)luaL_checkinteger(L, 2);
    int rc = lei_moe_receivers(x->m, n);
    return moe_result(L, x, rc);
}

/* moe:retarget(chid) -> true | nil, err */
static int l_moe_retarget(lua_State *L) {
    lb_moe *x = check_moe(L);
    lb_ctx *b = x->b;
    uint32_t chid = check_chan(L, b, 2);
    int rc = lei_moe_retarget(x->m, chid);
    return moe_result(L, x, rc);
}

/* ctx:chan_stats(chid) -> events_in, bytes_in, events_local */
static int l_chan_stats(lua_State *L) {
    lb_ctx *b = check_ctx(L);
    uint32_t chid = check_chan(L, b, 2);
    lei_stats_chan st;
    lei_chan_stats(b->c, chid, &st);
    lua_pushnumber(L, (lua_Number)st.ev_in);
    lua_pushnumber(L, (lua_Number)st.bytes_in);
    lua_pushnumber(L, (lua_Number)st.ev_local);
    return 3;
}

/* core.hash(s) -> 16 hex digits (FNV-1a, 64 bits): names, not security. */
static int l_hash(lua_State *L) {
    size_t n;
    const unsigned char *p = (const unsigned char *)luaL_checklstring(L, 1, &n);
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 1099511628211ull;
    }
    char out[17];
    snprintf(out, sizeof out, "%016llx", (unsigned long long)h);
    lua_pushstring(L, out);
    return 1;
}

static int l_moe_error(lua_State *L) {
    lb_moe *x = check_moe(L);
    const char *e = lei_moe_error(x->m);
    if (!e) return 0;
    lua_pushstring(L, e);
    return 1;
}

static void setn(lua_State *L, const char *k, double v);

static int l_moe_stats(lua_State *L) {
    lb_moe *x = check_moe(L);
    lei_moe_stats st;
    lei_moe_get_stats(x->m, &st);
    lua_newtable(L);
    setn(L, "calls", (double)st.calls);
    setn(L, "events_in", (double)st.events_in);
    setn(L, "events_out", (double)st.events_out);
    setn(L, "dropped", (double)st.dropped);
    setn(L, "pending", (double)st.pending);
    setn(L, "pending_drops", (double)st.pending_drops);
    setn(L, "time", (double)st.time_ns * 1e-9);
    setn(L, "memory", (double)st.mem);
    return 1;
}

static void moe_unlink(lb_moe *x) {
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
        moe_unlink(x);
        lei_moe_free(x->m);
        x->m = NULL;
    }
    return 0;
}

static int l_sync_done(lua_State *L) {
    lb_ctx *b = check_ctx(L);
    lei_sync *s = lei_sync_find(b->c, (uint64_t)luaL_checknumber(L, 2));
    lua_pushboolean(L, !s || lei_sync_pending(s) == 0);
    return 1;
}

/* ctx:sync_take(id, timeout) -> handlers run, nil | { {context=, consumer=, err=}, ... }
 * Frees the record; waits still open become errors "no answer within
 * <timeout>s".  No table is made when every consumer answered without error
 * (the common case of a sync round trip). */
static int l_sync_take(lua_State *L) {
    lb_ctx *b = check_ctx(L);
    lei_sync *s = lei_sync_find(b->c, (uint64_t)luaL_checknumber(L, 2));
    char err[256];
    if (!s) {
        lua_pushnumber(L, 0);
        return 1;
    }
    lua_pushnumber(L, (lua_Number)lei_sync_nran(s));
    int any = 0, nw = lei_sync_nreplies(s);
    lei_sync_answer w;
    for (int i = 0; i < nw && !any; i++) {
        lei_sync_reply(s, i, &w);
        any = !w.done || w.err || w.elen;
    }
    if (!any) {
        lei_sync_free(b->c, s);
        return 1;
    }
    lua_newtable(L);
    int n = 0;
    for (int i = 0; i < nw; i++) {
        lei_sync_reply(s, i, &w);
        const char *ctxname = w.addr ? w.addr : "local";
        if (!w.done || w.err) {
            lua_createtable(L, 0, 2);
            lua_pushstring(L, ctxname);
            lua_setfield(L, -2, "context");
            if (w.err)
                lua_pushstring(L, w.err);
            else
                lua_pushfstring(L, "consumer context %s: no answer within %s s", ctxname,
                                lua_tostring(L, 3) ? lua_tostring(L, 3) : "the timeout");
            lua_setfield(L, -2, "err");
            lua_rawseti(L, -2, ++n);
        }
        if (w.elen && lei_decode_lua(L, w.errs, w.elen, &b->lim, err, sizeof err) == 0) {
            /* a list of { consumer =, err = } from the acknowledging side */
            if (lua_istable(L, -1)) {
                int m = (int)lua_objlen(L, -1);
                for (int j = 1; j <= m; j++) {
                    lua_rawgeti(L, -1, j);
                    if (lua_istable(L, -1)) {
                        lua_pushstring(L, ctxname);
                        lua_setfield(L, -2, "context");
                        lua_rawseti(L, -3, ++n);
                    } else {
                        lua_pop(L, 1);
                    }
                }
            }
            lua_pop(L, 1);
        }
    }
    lei_sync_free(b->c, s);
    return 2;
}

/* ctx:ack(peer_idx, sync, nran, errors | nil) */
static int l_ack(lua_State *L) {
    lb_ctx *b = check_ctx(L);
    int idx = (int)luaL_checkinteger(L, 2);
    uint64_t sync = (uint64_t)luaL_checknumber(L, 3);
    uint64_t nran = (uint64_t)luaL_checknumber(L, 4);
    lei_peer *p = idx ? lei_peer_by_idx(b->c, idx) : NULL;
    if (idx && !p) return 0;
    lei_msg *m = NULL;
    char *flat = NULL;
    if (!lua_isnoneornil(L, 5)) {
        if (!(m = encode_at(L, b, 5))) {
            lua_pop(L, 3);
            lua_pushnil(L); /* errors not encodable: acknowledge without them */
            lua_replace(L, 5);
        } else if ((flat = malloc(m->total ? m->total : 1))) {
            lei_msg_flatten(m, flat);
        }
    }
    lei_ack(b->c, p, sync, nran, (const uint8_t *)flat, flat ? m->total : 0);
    free(flat);
    if (m) lei_msg_release(m, hook_unpin, b);
    return 0;
}

static int l_send_ctrl(lua_State *L) {
    lb_ctx *b = check_ctx(L);
    const char *addr = luaL_checkstring(L, 2);
    luaL_checkany(L, 3);
    lei_msg *m = encode_at(L, b, 3);
    if (!m) return 3;
    const char *err;
    int rc = lei_send_ctrl(b->c, addr, m, &err);
    lei_msg_release(m, hook_unpin, b);
    return ok_or_err(L, rc ? err : NULL, rc);
}

static int l_flush(lua_State *L) {
    lb_ctx *b = check_ctx(L);
    lei_flush(b->c);
    return 0;
}

static int l_drain_local(lua_State *L) {
    lb_ctx *b = check_ctx(L);
    lei_drain_local(b->c);
    return 0;
}

static void wake_cb(struct ev_loop *loop, ev_timer *w, int revents) {
    (void)loop;
    (void)w;
    (void)revents;
}

/* ctx:run_once([timeout]): one turn of the loop; blocks at most timeout
 * seconds (nil: until something happens, 0: not at all). */
static int l_run_once(lua_State *L) {
    lb_ctx *b = check_ctx(L);
    if (lua_isnoneornil(L, 2)) {
        ev_run(lei_ctx_loop(b->c), EVRUN_ONCE);
    } else {
        double t = luaL_checknumber(L, 2);
        if (t <= 0) {
            ev_run(lei_ctx_loop(b->c), EVRUN_NOWAIT);
        } else {
            /* On this C stack frame: nested run_once calls each get their own. */
            ev_timer wake;
            struct ev_loop *loop = lei_ctx_loop(b->c);
            ev_timer_init(&wake, wake_cb, t, 0.);
            ev_timer_start(loop, &wake);
            ev_run(loop, EVRUN_ONCE);
            ev_timer_stop(loop, &wake);
        }
    }
    close_if_pending(b, L);
    return 0;
}

/* ctx:run(): serves the loop until ctx:stop(). */
static int l_run(lua_State *L) {
    lb_ctx *b = check_ctx(L);
    b->stopping = 0;
    while (!b->stopping && b->c && !b->close_pending) ev_run(lei_ctx_loop(b->c), EVRUN_ONCE);
    b->stopping = 0;
    close_if_pending(b, L);
    return 0;
}

static int l_stop(lua_State *L) {
    lb_ctx *b = check_ctx(L);
    b->stopping = 1;
    ev_break(lei_ctx_loop(b->c), EVBREAK_ALL);
    return 0;
}

static int l_now(lua_State *L) {
    lb_ctx *b = check_ctx(L);
    ev_now_update(lei_ctx_loop(b->c));
    lua_pushnumber(L, ev_now(lei_ctx_loop(b->c)));
    return 1;
}

/* ---- timers ------------------------------------------------------------ */

static void timer_cb(struct ev_loop *loop, ev_timer *w, int revents) {
    (void)loop;
    (void)revents;
    lb_timer *t = (lb_timer *)w;
    lb_ctx *b = t->b;
    lua_State *L = b->L;
    int self = t->ref_self;
    lua_rawgeti(L, LUA_REGISTRYINDEX, self); /* keeps t alive during the call */
    if (!t->is_io && !w->repeat && t->active) {
        t->active = 0;
        t->ref_self = LUA_NOREF;
        luaL_unref(L, LUA_REGISTRYINDEX, self);
    }
    lua_rawgeti(L, LUA_REGISTRYINDEX, t->ref_fn);
    lua_pushvalue(L, -2);
    lei_ctx_enter(b->c);
    pcall_tb(b, 1, 0);
    if (b->c) lei_ctx_leave(b->c);
    lua_pop(L, 1);
}

/* A new watcher userdata on the stack, calling the function at index fn;
 * the caller initialises and starts the libev watcher, then registers it. */
static lb_timer *watcher_new(lua_State *L, lb_ctx *b, int fn, int is_io) {
    lb_timer *t = lua_newuserdata(L, sizeof *t);
    memset(t, 0, sizeof *t);
    t->b = b;
    t->is_io = is_io;
    lua_pushvalue(L, fn);
    t->ref_fn = luaL_ref(L, LUA_REGISTRYINDEX);
    return t;
}

/* The started watcher on top of the stack pins itself until stopped. */
static int watcher_register(lua_State *L, lb_ctx *b, lb_timer *t) {
    lua_pushvalue(L, -1);
    t->ref_self = luaL_ref(L, LUA_REGISTRYINDEX);
    t->active = 1;
    t->next = b->timers;
    b->timers = t;
    luaL_getmetatable(L, TIMER_MT);
    lua_setmetatable(L, -2);
    return 1;
}

/* ctx:timer(after, repeat, fn) -> timer; fn(timer) runs on the loop. */
static int l_timer(lua_State *L) {
    lb_ctx *b = check_ctx(L);
    double after = luaL_checknumber(L, 2);
    double rep = luaL_optnumber(L, 3, 0);
    luaL_checktype(L, 4, LUA_TFUNCTION);
    if (after < 0 || rep < 0) return luaL_argerror(L, 2, "negative time");
    lb_timer *t = watcher_new(L, b, 4, 0);
    ev_timer_init(&t->w, timer_cb, after, rep);
    ev_timer_start(lei_ctx_loop(b->c), &t->w);
    return watcher_register(L, b, t);
}

static void io_cb(struct ev_loop *loop, ev_io *w, int revents) {
    timer_cb(loop, (ev_timer *)(void *)w, revents);
}

/* ctx:io(fd, fn) -> watcher; fn(watcher) runs on the loop whenever fd is
 * readable, until watcher:stop().  For a REPL reading stdin, say. */
static int l_io(lua_State *L) {
    lb_ctx *b = check_ctx(L);
    int fd = (int)luaL_checkinteger(L, 2);
    luaL_checktype(L, 3, LUA_TFUNCTION);
    if (fd < 0) return luaL_argerror(L, 2, "negative descriptor");
    lb_timer *t = watcher_new(L, b, 3, 1);
    ev_io_init(&t->io, io_cb, fd, EV_READ);
    ev_io_start(lei_ctx_loop(b->c), &t->io);
    return watcher_register(L, b, t);
}

static void watcher_stop(lb_timer *t) {
    if (!t->b || !t->b->c) return;
    if (t->is_io)
        ev_io_stop(lei_ctx_loop(t->b->c), &t->io);
    else
        ev_timer_stop(lei_ctx_loop(t->b->c), &t->w);
}

static void timer_unlink(lb_timer *t) {
    if (!t->b) return;
    for (lb_timer **pp = &t->b->timers; *pp; pp = &(*pp)->next)
        if (*pp == t) {
            *pp = t->next;
            break;
        }
}

static int l_timer_stop(lua_State *L) {
    lb_timer *t = luaL_checkudata(L, 1, TIMER_MT);
    watcher_stop(t);
    if (t->active) {
        luaL_unref(L, LUA_REGISTRYINDEX, t->ref_self);
        t->active = 0;
    }
    return 0;
}

static int l_timer_gc(lua_State *L) {
    lb_timer *t = luaL_checkudata(L, 1, TIMER_MT);
    watcher_stop(t);
    timer_unlink(t);
    luaL_unref(L, LUA_REGISTRYINDEX, t->ref_fn);
    t->b = NULL;
    return 0;
}

/* ---- stats ------------------------------------------------------------- */

static void setn(lua_State *L, const char *k, double v) {
    lua_pushnumber(L, v);
    lua_setfield(L, -2, k);
}

/* ctx:stats() -> { encodes, bad_frames, local_queue, peers = {[addr] = {...}},
 *                  channels = {[name] = {...}} } */
static int l_stats(lua_State *L) {
    lb_ctx *b = check_ctx(L);
    lei_ctx *c = b->c;
    lei_stats_ctx cs;
    lei_ctx_stats(c, &cs);
    lua_newtable(L);
    setn(L, "encodes", (double)cs.encodes);
    setn(L, "bad_frames", (double)cs.bad_frames);
    setn(L, "local_queue_bytes", (double)cs.local_bytes);
    setn(L, "local_queue_events", (double)cs.local_events);
    setn(L, "local_deferred_events", (double)cs.deferred_events);
    setn(L, "local_deferred_bytes", (double)cs.deferred_bytes);
    lua_newtable(L);
    for (int i = 1; i <= lei_ctx_npeers(c); i++) {
        lei_peer *p = lei_peer_by_idx(c, i);
        lei_stats_peer ps;
        lei_peer_stats(p, &ps);
        lua_newtable(L);
        setn(L, "events_in", (double)ps.st.ev_in);
        setn(L, "events_out", (double)ps.st.ev_out);
        setn(L, "bytes_in", (double)ps.st.bytes_in);
        setn(L, "bytes_out", (double)ps.st.bytes_out);
        setn(L, "batches", (double)ps.st.batches);
        setn(L, "drops", (double)ps.st.drops);
        setn(L, "ctrl_in", (double)ps.st.ctrl_in);
        setn(L, "ctrl_out", (double)ps.st.ctrl_out);
        setn(L, "queue_bytes", (double)ps.queue_bytes);
        setn(L, "queue_events", (double)ps.queue_events);
        setn(L, "heartbeats_in", (double)ps.hb_in);
        setn(L, "heartbeats_out", (double)ps.hb_out);
        setn(L, "heartbeat_timeouts", (double)ps.timeouts);
        setn(L, "gaps", (double)ps.gaps);
        setn(L, "lost", (double)ps.lost);
        setn(L, "duplicates", (double)ps.dups);
        lua_pushboolean(L, lei_peer_up(p));
        lua_setfield(L, -2, "connected");
        if (lei_peer_reason(p)[0]) {
            lua_pushstring(L, lei_peer_reason(p));
            lua_setfield(L, -2, "last_error");
        }
        lua_setfield(L, -2, lei_peer_addr(p));
    }
    lua_setfield(L, -2, "peers");
    lua_newtable(L);
    for (uint32_t i = 0; i < lei_ctx_nchans(c); i++) {
        lei_stats_chan st;
        lei_chan_stats(c, i, &st);
        lua_newtable(L);
        setn(L, "events_in", (double)st.ev_in);
        setn(L, "events_out", (double)st.ev_out);
        setn(L, "bytes_in", (double)st.bytes_in);
        setn(L, "bytes_out", (double)st.bytes_out);
        setn(L, "events_local", (double)st.ev_local);
        setn(L, "encodes", (double)st.encodes);
        setn(L, "drops", (double)st.drops);
        setn(L, "destinations", st.ndests);
        setn(L, "gaps", (double)st.gaps);
        setn(L, "lost", (double)st.lost);
        setn(L, "duplicates", (double)st.dups);
        lua_setfield(L, -2, lei_chan_name(c, i));
    }
    lua_setfield(L, -2, "channels");
    return 1;
}

static int l_peer_addr(lua_State *L) {
    lb_ctx *b = check_ctx(L);
    lei_peer *p = lei_peer_by_idx(b->c, (int)luaL_checkinteger(L, 2));
    if (!p) return 0;
    lua_pushstring(L, lei_peer_addr(p));
    return 1;
}

/* ctx:close_peer(addr, reason): drops the connection to addr. */
static int l_close_peer(lua_State *L) {
    lb_ctx *b = check_ctx(L);
    lei_peer *p = lei_peer_get(b->c, luaL_checkstring(L, 2), 0);
    const char *why = luaL_optstring(L, 3, "closed by the application");
    if (p) lei_peer_close(p, why);
    return 0;
}

static const luaL_Reg ctx_methods[] = {
    {"listen", l_listen},       {"addr", l_addr},
    {"hooks", l_hooks},         {"channel", l_channel},
    {"set_local", l_set_local}, {"set_dests", l_set_dests},
    {"submit", l_submit},       {"sync_done", l_sync_done},
    {"sync_take", l_sync_take}, {"ack", l_ack},
    {"send_ctrl", l_send_ctrl}, {"flush", l_flush},
    {"drain_local", l_drain_local}, {"run_once", l_run_once},
    {"run", l_run},             {"stop", l_stop},
    {"now", l_now},             {"timer", l_timer},
    {"io", l_io},               {"moe", l_moe},
    {"chan_stats", l_chan_stats},
    {"stats", l_stats},         {"peer_addr", l_peer_addr},
    {"close_peer", l_close_peer}, {"close", l_close},
    {"room", l_room},           {"resume", l_resume},
    {"want_turn", l_want_turn},
    {"depth", l_depth},         {"shutdown", l_shutdown},
    {"pending", l_pending},
    {NULL, NULL}};

__attribute__((visibility("default"))) int luaopen_lecho_core(lua_State *L) {
    if (luaL_newmetatable(L, CTX_MT)) {
        lua_newtable(L);
        luaL_register(L, NULL, ctx_methods);
        lua_setfield(L, -2, "__index");
        lua_pushcfunction(L, l_gc);
        lua_setfield(L, -2, "__gc");
    }
    lua_pop(L, 1);
    if (luaL_newmetatable(L, TIMER_MT)) {
        lua_newtable(L);
        lua_pushcfunction(L, l_timer_stop);
        lua_setfield(L, -2, "stop");
        lua_setfield(L, -2, "__index");
        lua_pushcfunction(L, l_timer_gc);
        lua_setfield(L, -2, "__gc");
    }
    lua_pop(L, 1);
    if (luaL_newmetatable(L, MOE_MT)) {
        static const luaL_Reg moe_methods[] = {{"params", l_moe_params}, {"error", l_moe_error},
                                               {"retarget", l_moe_retarget},
                                               {"receivers", l_moe_receivers},
                                               {"stats", l_moe_stats},   {"close", l_moe_close},
                                               {NULL, NULL}};
        lua_newtable(L);
        luaL_register(L, NULL, moe_methods);
        lua_setfield(L, -2, "__index");
        lua_pushcfunction(L, l_moe_close);
        lua_setfield(L, -2, "__gc");
    }
    lua_pop(L, 1);
    lua_newtable(L);
    lei_codec_lua_setfuncs(L); /* encode, decode, validate */
    lua_pushcfunction(L, l_new);
    lua_setfield(L, -2, "new");
    lua_pushcfunction(L, l_hash);
    lua_setfield(L, -2, "hash");
    lua_pushinteger(L, LEI_PROTO_VERSION);
    lua_setfield(L, -2, "protocol_version");
    return 1;
}
