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

#define CTX_MT "lecho.ctx"
#define TIMER_MT "lecho.timer"

typedef struct lb_timer lb_timer;

typedef struct lb_ctx {
    lei_ctx *c;            /* owned; NULL once closed */
    lua_State *L;          /* the Lua thread running the loop right now */
    int ref_event, ref_ctrl, ref_peer, ref_log, ref_tb;
    lei_codec_limits lim;
    size_t pin_threshold;
    int stopping;
    lb_timer *timers;      /* live timers, stopped when the context closes */
} lb_ctx;

struct lb_timer {
    ev_timer w;
    lb_ctx *b;
    lb_timer *next;
    int ref_fn, ref_self;
    int active;
};

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

static void hook_log(void *ud, const char *msg) {
    lb_ctx *b = ud;
    if (b->ref_log == LUA_NOREF || !b->L) {
        fprintf(stderr, "lecho: %s\n", msg);
        return;
    }
    lua_rawgeti(b->L, LUA_REGISTRYINDEX, b->ref_log);
    lua_pushstring(b->L, msg);
    if (lua_pcall(b->L, 1, 0, 0)) {
        fprintf(stderr, "lecho: %s (log hook failed: %s)\n", msg, lua_tostring(b->L, -1));
        lua_pop(b->L, 1);
    }
}

static int hook_event(void *ud, lei_peer *from, uint32_t chid, uint64_t producer, uint64_t seq,
                      uint64_t sync, const uint8_t *p, size_t n) {
    lb_ctx *b = ud;
    lua_State *L = b->L;
    char err[256];
    if (!lua_checkstack(L, 10)) return -1;
    lua_rawgeti(L, LUA_REGISTRYINDEX, b->ref_event);
    lua_pushnumber(L, chid);
    if (lei_decode_lua(L, p, n, &b->lim, err, sizeof err)) {
        lua_pop(L, 2);
        lei_logf(b->c, "bad event value from %s: %s", from ? from->addr : "local", err);
        return -1;
    }
    lua_pushinteger(L, from ? from->idx : 0);
    lua_pushnumber(L, (lua_Number)producer);
    lua_pushnumber(L, (lua_Number)seq);
    lua_pushnumber(L, (lua_Number)sync);
    pcall_tb(b, 6, 0);
    return 0;
}

static int hook_ctrl(void *ud, lei_peer *from, const uint8_t *p, size_t n) {
    lb_ctx *b = ud;
    lua_State *L = b->L;
    char err[256];
    if (!lua_checkstack(L, 6)) return -1;
    lua_rawgeti(L, LUA_REGISTRYINDEX, b->ref_ctrl);
    lua_pushstring(L, from->addr);
    if (lei_decode_lua(L, p, n, &b->lim, err, sizeof err)) {
        lua_pop(L, 2);
        lei_logf(b->c, "bad control message from %s: %s", from->addr, err);
        return -1;
    }
    pcall_tb(b, 2, 0);
    return 0;
}

static void hook_peer(void *ud, lei_peer *p, int up, const char *reason) {
    lb_ctx *b = ud;
    lua_State *L = b->L;
    if (!L || b->ref_peer == LUA_NOREF || !lua_checkstack(L, 6)) return;
    lua_rawgeti(L, LUA_REGISTRYINDEX, b->ref_peer);
    lua_pushinteger(L, p->idx);
    lua_pushstring(L, p->addr);
    lua_pushboolean(L, up);
    if (reason)
        lua_pushstring(L, reason);
    else
        lua_pushnil(L);
    pcall_tb(b, 4, 0);
}

static size_t opt_size(lua_State *L, int t, const char *k, size_t def) {
    lua_getfield(L, t, k);
    size_t v = lua_isnil(L, -1) ? def : (size_t)luaL_checknumber(L, -1);
    lua_pop(L, 1);
    return v;
}

static const char *const policy_names[] = {"block", "drop_oldest", "drop_newest", "disconnect",
                                           NULL};

/* core.new{ queue_limit=, policy=, batch_bytes=, max_frame=, max_string=,
 *           max_depth=, pin_threshold=, retry_interval= } */
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
        pin = opt_size(L, 1, "pin_threshold", pin);
        lua_getfield(L, 1, "retry_interval");
        if (!lua_isnil(L, -1)) o.retry_interval = luaL_checknumber(L, -1);
        lua_pop(L, 1);
        lua_getfield(L, 1, "policy");
        if (!lua_isnil(L, -1)) o.policy = luaL_checkoption(L, -1, NULL, policy_names);
        lua_pop(L, 1);
    }
    lb_ctx *b = lua_newuserdata(L, sizeof *b);
    memset(b, 0, sizeof *b);
    b->ref_event = b->ref_ctrl = b->ref_peer = b->ref_log = LUA_NOREF;
    b->lim = lim;
    b->pin_threshold = pin;
    b->L = L;
    lei_hooks h = {b, hook_event, hook_ctrl, hook_peer, hook_unpin, hook_log};
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
    b->L = L;
    while (b->timers) {
        lb_timer *t = b->timers;
        b->timers = t->next;
        ev_timer_stop(b->c->loop, &t->w);
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
    luaL_unref(L, LUA_REGISTRYINDEX, b->ref_tb);
    b->ref_event = b->ref_ctrl = b->ref_peer = b->ref_log = LUA_NOREF;
}

static int l_close(lua_State *L) {
    lb_ctx *b = luaL_checkudata(L, 1, CTX_MT);
    if (b->c && b->c->depth > 0)
        return luaL_error(L, "lecho: cannot close a context from inside one of its callbacks");
    ctx_close(b, L);
    return 0;
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
    if (lei_ctx_listen(b->c, host, port, &err)) {
        lua_pushnil(L);
        lua_pushfstring(L, "cannot listen on %s:%d: %s", host, port, err);
        return 2;
    }
    lua_pushstring(L, b->c->addr);
    return 1;
}

static int l_addr(lua_State *L) {
    lb_ctx *b = check_ctx(L);
    lua_pushstring(L, b->c->addr);
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

static lei_chan *check_chan(lua_State *L, lb_ctx *b, int i) {
    lei_chan *ch = lei_chan_get(b->c, (uint32_t)luaL_checknumber(L, i));
    if (!ch) luaL_argerror(L, i, "no such channel");
    return ch;
}

static int l_set_local(lua_State *L) {
    lb_ctx *b = check_ctx(L);
    check_chan(L, b, 2)->local = lua_toboolean(L, 3);
    return 0;
}

static int l_set_dests(lua_State *L) {
    lb_ctx *b = check_ctx(L);
    lei_chan *ch = check_chan(L, b, 2);
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
    b->L = L;
    lei_chan_set_dests(b->c, ch->id, a, n);
    free(a);
    return 0;
}

/* Encodes the value at idx into a new message; NULL with the error pushed. */
static lei_msg *encode_at(lua_State *L, lb_ctx *b, int idx) {
    char err[256];
    lei_msg *m = lei_msg_new();
    if (!m) {
        lua_pushnil(L);
        lua_pushliteral(L, "out of memory");
        return NULL;
    }
    if (lei_encode_lua(L, idx, m, &b->lim, b->pin_threshold, err, sizeof err)) {
        lei_msg_release(m, hook_unpin, b);
        lua_pushnil(L);
        lua_pushstring(L, err);
        return NULL;
    }
    b->c->encodes++;
    return m;
}

/* ctx:submit(chid, producer, seq, value, sync, policy) -> true | sync id | nil, err */
static int l_submit(lua_State *L) {
    lb_ctx *b = check_ctx(L);
    lei_chan *ch = check_chan(L, b, 2);
    uint64_t producer = (uint64_t)luaL_checknumber(L, 3);
    uint64_t seq = (uint64_t)luaL_checknumber(L, 4);
    luaL_checkany(L, 5);
    int sync = lua_toboolean(L, 6);
    int policy = lua_isnoneornil(L, 7) ? b->c->o.policy : luaL_checkoption(L, 7, NULL, policy_names);
    lua_State *saved = b->L;
    b->L = L;
    lei_msg *m = encode_at(L, b, 5);
    if (!m) {
        b->L = saved;
        return 2;
    }
    ch->encodes++;
    const char *err = NULL;
    uint64_t sid = 0;
    int rc = lei_submit(b->c, ch->id, producer, seq, m, sync, policy, &sid, &err);
    lei_msg_release(m, hook_unpin, b);
    b->L = saved;
    if (rc) {
        lua_pushnil(L);
        lua_pushstring(L, err);
        return 2;
    }
    if (sync)
        lua_pushnumber(L, (lua_Number)sid);
    else
        lua_pushboolean(L, 1);
    return 1;
}

static int l_sync_done(lua_State *L) {
    lb_ctx *b = check_ctx(L);
    lei_sync *s = lei_sync_find(b->c, (uint64_t)luaL_checknumber(L, 2));
    lua_pushboolean(L, !s || s->nwait == 0);
    return 1;
}

/* ctx:sync_take(id, why_pending) -> handlers run, { {context=, consumer=, err=}, ... }
 * Frees the record; waits still open become errors with why_pending. */
static int l_sync_take(lua_State *L) {
    lb_ctx *b = check_ctx(L);
    lei_sync *s = lei_sync_find(b->c, (uint64_t)luaL_checknumber(L, 2));
    const char *why = luaL_optstring(L, 3, "no answer");
    char err[256];
    if (!s) {
        lua_pushnumber(L, 0);
        lua_newtable(L);
        return 2;
    }
    lua_pushnumber(L, (lua_Number)s->nran);
    lua_newtable(L);
    int n = 0;
    for (int i = 0; i < s->nw; i++) {
        lei_sync_wait *w = &s->w[i];
        const char *ctxname = w->peer ? w->peer->addr : "local";
        if (!w->done || w->err) {
            lua_createtable(L, 0, 2);
            lua_pushstring(L, ctxname);
            lua_setfield(L, -2, "context");
            if (w->err)
                lua_pushstring(L, w->err);
            else
                lua_pushfstring(L, "consumer context %s: %s", ctxname, why);
            lua_setfield(L, -2, "err");
            lua_rawseti(L, -2, ++n);
        }
        if (w->elen && lei_decode_lua(L, w->errs, w->elen, &b->lim, err, sizeof err) == 0) {
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
    lua_State *saved = b->L;
    b->L = L;
    lei_msg *m = NULL;
    char *flat = NULL;
    if (!lua_isnoneornil(L, 5)) {
        if (!(m = encode_at(L, b, 5))) {
            lua_pop(L, 2);
            lua_pushnil(L); /* errors not encodable: acknowledge without them */
            lua_replace(L, 5);
        } else if ((flat = malloc(m->total ? m->total : 1))) {
            lei_msg_flatten(m, flat);
        }
    }
    lei_ack(b->c, p, sync, nran, (const uint8_t *)flat, flat ? m->total : 0);
    free(flat);
    if (m) lei_msg_release(m, hook_unpin, b);
    b->L = saved;
    return 0;
}

static int l_send_ctrl(lua_State *L) {
    lb_ctx *b = check_ctx(L);
    const char *addr = luaL_checkstring(L, 2);
    luaL_checkany(L, 3);
    lua_State *saved = b->L;
    b->L = L;
    lei_msg *m = encode_at(L, b, 3);
    if (!m) {
        b->L = saved;
        return 2;
    }
    const char *err;
    int rc = lei_send_ctrl(b->c, addr, m, &err);
    lei_msg_release(m, hook_unpin, b);
    b->L = saved;
    if (rc) {
        lua_pushnil(L);
        lua_pushstring(L, err);
        return 2;
    }
    lua_pushboolean(L, 1);
    return 1;
}

static int l_flush(lua_State *L) {
    lb_ctx *b = check_ctx(L);
    lua_State *saved = b->L;
    b->L = L;
    lei_flush(b->c);
    b->L = saved;
    return 0;
}

static int l_drain_local(lua_State *L) {
    lb_ctx *b = check_ctx(L);
    lua_State *saved = b->L;
    b->L = L;
    lei_drain_local(b->c);
    b->L = saved;
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
    lua_State *saved = b->L;
    b->L = L;
    if (lua_isnoneornil(L, 2)) {
        ev_run(b->c->loop, EVRUN_ONCE);
    } else {
        double t = luaL_checknumber(L, 2);
        if (t <= 0) {
            ev_run(b->c->loop, EVRUN_NOWAIT);
        } else {
            /* On this C stack frame: nested run_once calls each get their own. */
            ev_timer wake;
            struct ev_loop *loop = b->c->loop;
            ev_timer_init(&wake, wake_cb, t, 0.);
            ev_timer_start(loop, &wake);
            ev_run(loop, EVRUN_ONCE);
            ev_timer_stop(loop, &wake);
        }
    }
    b->L = saved;
    return 0;
}

/* ctx:run(): serves the loop until ctx:stop(). */
static int l_run(lua_State *L) {
    lb_ctx *b = check_ctx(L);
    lua_State *saved = b->L;
    b->L = L;
    b->stopping = 0;
    while (!b->stopping && b->c) ev_run(b->c->loop, EVRUN_ONCE);
    b->stopping = 0;
    b->L = saved;
    return 0;
}

static int l_stop(lua_State *L) {
    lb_ctx *b = check_ctx(L);
    b->stopping = 1;
    ev_break(b->c->loop, EVBREAK_ALL);
    return 0;
}

static int l_now(lua_State *L) {
    lb_ctx *b = check_ctx(L);
    ev_now_update(b->c->loop);
    lua_pushnumber(L, ev_now(b->c->loop));
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
    if (!w->repeat && t->active) {
        t->active = 0;
        t->ref_self = LUA_NOREF;
        luaL_unref(L, LUA_REGISTRYINDEX, self);
    }
    lua_rawgeti(L, LUA_REGISTRYINDEX, t->ref_fn);
    lua_pushvalue(L, -2);
    b->c->depth++;
    pcall_tb(b, 1, 0);
    if (b->c) b->c->depth--;
    lua_pop(L, 1);
}

/* ctx:timer(after, repeat, fn) -> timer; fn(timer) runs on the loop. */
static int l_timer(lua_State *L) {
    lb_ctx *b = check_ctx(L);
    double after = luaL_checknumber(L, 2);
    double rep = luaL_optnumber(L, 3, 0);
    luaL_checktype(L, 4, LUA_TFUNCTION);
    if (after < 0 || rep < 0) return luaL_argerror(L, 2, "negative time");
    lb_timer *t = lua_newuserdata(L, sizeof *t);
    memset(t, 0, sizeof *t);
    t->b = b;
    lua_pushvalue(L, 4);
    t->ref_fn = luaL_ref(L, LUA_REGISTRYINDEX);
    ev_timer_init(&t->w, timer_cb, after, rep);
    ev_timer_start(b->c->loop, &t->w);
    lua_pushvalue(L, -1);
    t->ref_self = luaL_ref(L, LUA_REGISTRYINDEX);
    t->active = 1;
    t->next = b->timers;
    b->timers = t;
    luaL_getmetatable(L, TIMER_MT);
    lua_setmetatable(L, -2);
    return 1;
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
    if (t->b && t->b->c) ev_timer_stop(t->b->c->loop, &t->w);
    if (t->active) {
        luaL_unref(L, LUA_REGISTRYINDEX, t->ref_self);
        t->active = 0;
    }
    return 0;
}

static int l_timer_gc(lua_State *L) {
    lb_timer *t = luaL_checkudata(L, 1, TIMER_MT);
    if (t->b && t->b->c) ev_timer_stop(t->b->c->loop, &t->w);
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
    lua_newtable(L);
    setn(L, "encodes", (double)c->encodes);
    setn(L, "bad_frames", (double)c->bad_frames);
    setn(L, "local_queue_bytes", (double)c->lq.bytes);
    setn(L, "local_queue_events", (double)c->lq.count);
    lua_newtable(L);
    for (int i = 0; i < c->npeers; i++) {
        lei_peer *p = c->peers[i];
        lua_newtable(L);
        setn(L, "events_in", (double)p->st.ev_in);
        setn(L, "events_out", (double)p->st.ev_out);
        setn(L, "bytes_in", (double)p->st.bytes_in);
        setn(L, "bytes_out", (double)p->st.bytes_out);
        setn(L, "batches", (double)p->st.batches);
        setn(L, "drops", (double)p->st.drops);
        setn(L, "ctrl_in", (double)p->st.ctrl_in);
        setn(L, "ctrl_out", (double)p->st.ctrl_out);
        setn(L, "queue_bytes", (double)p->q.bytes);
        setn(L, "queue_events", (double)p->q.count);
        lua_pushboolean(L, p->up);
        lua_setfield(L, -2, "connected");
        if (p->reason[0]) {
            lua_pushstring(L, p->reason);
            lua_setfield(L, -2, "last_error");
        }
        lua_setfield(L, -2, p->addr);
    }
    lua_setfield(L, -2, "peers");
    lua_newtable(L);
    for (uint32_t i = 0; i < c->nchans; i++) {
        lei_chan *ch = c->chans[i];
        lua_newtable(L);
        setn(L, "events_in", (double)ch->ev_in);
        setn(L, "events_out", (double)ch->ev_out);
        setn(L, "bytes_in", (double)ch->bytes_in);
        setn(L, "bytes_out", (double)ch->bytes_out);
        setn(L, "events_local", (double)ch->ev_local);
        setn(L, "encodes", (double)ch->encodes);
        setn(L, "drops", (double)ch->drops);
        setn(L, "destinations", ch->ndests);
        lua_setfield(L, -2, ch->name);
    }
    lua_setfield(L, -2, "channels");
    return 1;
}

static int l_peer_addr(lua_State *L) {
    lb_ctx *b = check_ctx(L);
    lei_peer *p = lei_peer_by_idx(b->c, (int)luaL_checkinteger(L, 2));
    if (!p) return 0;
    lua_pushstring(L, p->addr);
    return 1;
}

/* ctx:close_peer(addr, reason): drops the connection to addr. */
static int l_close_peer(lua_State *L) {
    lb_ctx *b = check_ctx(L);
    lei_peer *p = lei_peer_get(b->c, luaL_checkstring(L, 2), 0);
    const char *why = luaL_optstring(L, 3, "closed by the application");
    lua_State *saved = b->L;
    b->L = L;
    if (p) lei_peer_close(p, why);
    b->L = saved;
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
    {"stats", l_stats},         {"peer_addr", l_peer_addr},
    {"close_peer", l_close_peer}, {"close", l_close},
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
    lua_newtable(L);
    lei_codec_lua_setfuncs(L); /* encode, decode, validate */
    lua_pushcfunction(L, l_new);
    lua_setfield(L, -2, "new");
    lua_pushinteger(L, LEI_PROTO_VERSION);
    lua_setfield(L, -2, "protocol_version");
    return 1;
}
