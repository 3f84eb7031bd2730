/* lua_ctx.c: the Lua binding of the core, `require "lecho.core"`: the
 * module, the context userdata (options, life cycle, listening, hooks,
 * stats) and the error convention.
 *
 * Lua is known to the binding's files (lua_*.c, see lua_int.h), to
 * codec_lua.c (values to and from Lua) and to moe.c (the modulators' own
 * LuaJIT states); the concentrator (ctx.h and its files), frame.c and
 * codec.c build without it.  Expected failures return nil, message, code
 * (errors.h); misuse raises (luaL_argerror).
 */
#define _GNU_SOURCE
#include "lua_int.h"
#include "array.h"
#include "lpat.h"

#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* An expected failure as Lua sees it: nil, message, code name (errors.h).
 * Returns the number of values pushed. */
int lb_push_err(lua_State *L, const char *msg, int code) {
    lua_pushnil(L);
    lua_pushstring(L, msg ? msg : lei_err_text(code));
    lua_pushstring(L, lei_err_name(code));
    return 3;
}

/* The usual result of a call that can fail: true, or nil, err, code. */
int lb_ok_or_err(lua_State *L, const char *err, int code) {
    if (err) return lb_push_err(L, err, code);
    lua_pushboolean(L, 1);
    return 1;
}

lb_ctx *lb_check_ctx(lua_State *L) {
    lb_ctx *b = luaL_checkudata(L, 1, CTX_MT);
    if (!b->c) luaL_error(L, "lecho: context is closed");
    return b;
}

/* Field k of the table at index t into *v: 0 when nil (*v untouched), 1
 * when a number; raises for any other type. */
static int opt_number(lua_State *L, int t, const char *k, double *v) {
    lua_getfield(L, t, k);
    int has = !lua_isnil(L, -1);
    if (has && lua_type(L, -1) != LUA_TNUMBER) luaL_error(L, "lecho: %s must be a number", k);
    if (has) *v = lua_tonumber(L, -1);
    lua_pop(L, 1);
    return has;
}

/* Field k of the table at index t as a size: def when nil; raises unless
 * it is an integer from 0 to 2^53 (a double beyond size_t's range must never
 * reach the conversion: that is undefined behaviour). */
size_t lb_opt_size(lua_State *L, int t, const char *k, size_t def) {
    double d;
    if (!opt_number(L, t, k, &d)) return def;
    if (!(d >= 0 && d <= 9007199254740992.0 && d <= (double)SIZE_MAX) || d != floor(d))
        luaL_error(L, "lecho: %s must be an integer from 0 to 2^53", k);
    return (size_t)d;
}

/* Field k of the table at index t as a time in seconds: def when nil;
 * raises unless it is a finite number >= 0 (NaN and inf included). */
static double opt_time(lua_State *L, int t, const char *k, double def) {
    double v;
    if (!opt_number(L, t, k, &v)) return def;
    if (!(v >= 0) || !isfinite(v)) luaL_error(L, "lecho: %s must be a finite number >= 0", k);
    return v;
}

/* heartbeat= (s, 0: off), heartbeat_misses= (> 1), retry_max= (s) of the
 * options table at index 1. */
static void opt_liveness(lua_State *L, lei_opts *o) {
    o->heartbeat = opt_time(L, 1, "heartbeat", o->heartbeat);
    o->retry_max = opt_time(L, 1, "retry_max", o->retry_max);
    o->heartbeat_misses = opt_time(L, 1, "heartbeat_misses", o->heartbeat_misses);
    if (!(o->heartbeat_misses > 1)) luaL_error(L, "lecho: heartbeat_misses must be above 1");
}

/* handshake_timeout= (s, 0: never), max_connections= (>= 1),
 * max_buffered= (bytes), max_peer_channels= (>= 1, <= 2^24), max_peers=, peer_free_after=, log_window= (s) of the options
 * table at index 1 (doc/limits.md). */
static void opt_containment(lua_State *L, lei_opts *o) {
    o->handshake_timeout = opt_time(L, 1, "handshake_timeout", o->handshake_timeout);
    o->max_connections = lb_opt_size(L, 1, "max_connections", o->max_connections);
    o->max_buffered = lb_opt_size(L, 1, "max_buffered", o->max_buffered);
    o->max_peer_channels = lb_opt_size(L, 1, "max_peer_channels", o->max_peer_channels);
    o->max_peers = lb_opt_size(L, 1, "max_peers", o->max_peers);
    o->peer_free_after = opt_time(L, 1, "peer_free_after", o->peer_free_after);
    o->log_window = opt_time(L, 1, "log_window", o->log_window);
    if (o->max_connections < 1) luaL_error(L, "lecho: max_connections must be at least 1");
    if (o->max_peer_channels < 1 || o->max_peer_channels > (1u << 24))
        luaL_error(L, "lecho: max_peer_channels must be from 1 to 2^24");
}

/* core.new{ queue_limit=, policy=, batch_bytes=, max_frame=, max_string=,
 *           max_depth=, max_value_bytes=, pin_threshold=, retry_interval=, heartbeat=,
 *           heartbeat_misses=, retry_max=, handshake_timeout=, max_connections=,
 *           max_buffered=, max_peer_channels=, max_peers= } */
static int l_new(lua_State *L) {
    lei_opts o;
    lei_opts_default(&o);
    lei_codec_limits lim;
    lei_codec_limits_default(&lim);
    size_t pin = 64 * 1024;
    if (lua_istable(L, 1)) {
        o.queue_limit = lb_opt_size(L, 1, "queue_limit", o.queue_limit);
        o.batch_bytes = lb_opt_size(L, 1, "batch_bytes", o.batch_bytes);
        lim.max_string = lb_opt_size(L, 1, "max_string", lim.max_string);
        size_t depth = lb_opt_size(L, 1, "max_depth", lim.max_depth);
        lim.max_depth = depth > UINT_MAX ? UINT_MAX : (unsigned)depth; /* the codec caps it */
        lim.max_value_bytes = lb_opt_size(L, 1, "max_value_bytes", lim.max_value_bytes);
        o.max_frame = lb_opt_size(L, 1, "max_frame", lim.max_string + 64 * 1024 > o.max_frame
                                                       ? lim.max_string + 64 * 1024
                                                       : o.max_frame);
        /* A frame's length is a u32 on the wire: nothing bigger can be sent. */
        if (lim.max_string > 0xFFFFFFFFu - 64 * 1024 || o.max_frame > 0xFFFFFFFFu)
            return luaL_error(L, "lecho: max_string and max_frame must stay under 4 GiB "
                                 "(a frame's length is 32 bits on the wire)");
        pin = lb_opt_size(L, 1, "pin_threshold", pin);
        o.retry_interval = opt_time(L, 1, "retry_interval", o.retry_interval);
        size_t maxch = lb_opt_size(L, 1, "max_channels", o.max_channels);
        o.max_channels = maxch > UINT32_MAX - 1 ? UINT32_MAX - 1 : (uint32_t)maxch;
        opt_liveness(L, &o);
        opt_containment(L, &o);
        lua_getfield(L, 1, "policy");
        if (!lua_isnil(L, -1)) o.policy = luaL_checkoption(L, -1, NULL, lb_policy_names);
        lua_pop(L, 1);
    }
    lb_ctx *b = lua_newuserdata(L, sizeof *b);
    memset(b, 0, sizeof *b);
    b->ref_event = b->ref_ctrl = b->ref_peer = b->ref_log = b->ref_moe_error = LUA_NOREF;
    b->ref_turn = b->ref_events = b->ref_sinks = b->ref_sinks_held = LUA_NOREF;
    b->lim = lim;
    b->pin_threshold = pin;
    lei_hooks h;
    lb_hooks_init(L, b, &h);
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
    lei_moe_group_free(b->moeg);
    b->moeg = NULL;
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
    lb_rsink_free(b);             /* written out before the context goes */
    lb_rec_close_all(b);          /* the in-process recorders: flushed, their threads joined */
    lei_ctx_free(b->c);
    b->c = NULL;
    lb_sinks_free(b, L);
    lb_raw_free(b);
    luaL_unref(L, LUA_REGISTRYINDEX, b->ref_event);
    luaL_unref(L, LUA_REGISTRYINDEX, b->ref_ctrl);
    luaL_unref(L, LUA_REGISTRYINDEX, b->ref_peer);
    luaL_unref(L, LUA_REGISTRYINDEX, b->ref_log);
    luaL_unref(L, LUA_REGISTRYINDEX, b->ref_moe_error);
    luaL_unref(L, LUA_REGISTRYINDEX, b->ref_turn);
    luaL_unref(L, LUA_REGISTRYINDEX, b->ref_events);
    luaL_unref(L, LUA_REGISTRYINDEX, b->ref_tb);
    luaL_unref(L, LUA_REGISTRYINDEX, b->ref_thread);
    luaL_unref(L, LUA_REGISTRYINDEX, b->ref_calls);
    b->L = NULL;
    b->ref_event = b->ref_ctrl = b->ref_peer = b->ref_log = b->ref_moe_error = LUA_NOREF;
    b->ref_turn = b->ref_events = b->ref_sinks = b->ref_sinks_held = LUA_NOREF;
}

/* ctx:close(): frees the context now, or, from inside one of its own
 * callbacks (the loop is running below), stops it listening now and frees
 * it when the outermost run or run_once returns. */
static int l_close(lua_State *L) {
    lb_ctx *b = luaL_checkudata(L, 1, CTX_MT);
    lb_moe_not_busy(L, b, "closing the context");
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

static uint8_t *adopt_rbuf(void *ud, const void *p, size_t n, size_t *cap) {
    return lei_rbuf_adopt(ud, p, n, cap);
}

/* An adopted buffer let go of: back to its context (the lb_ctx on the
 * stack top) while it is open, for the next large frame; else freed. */
static void give_rbuf(lua_State *L, uint8_t *base, size_t cap) {
    lb_ctx *b = lua_touserdata(L, -1);
    if (b && b->c)
        lei_rbuf_give(b->c, base, cap);
    else
        free(base);
}

/* ctx:keep_array(a): a received array view (context.lua keep_view) kept
 * past its dispatch: the read buffer its bytes are in handed over to it
 * when they are most of one (lei_rbuf_adopt: no copy; given back to
 * this context when the array is collected), else copied.  The collector
 * is told of an adopted buffer (a step as for an allocation of its size,
 * which on a small heap ends the cycle: a whole collection) when no spare
 * fits the next frame of that size and another adopted buffer is out
 * (lei_rbuf_collect_due with min_out 2): the ones before that were let go
 * of come back before that frame.  With only this one out, nothing is to
 * be found: a program that lets each array go before it waits for the next
 * collects then (ctx:reclaim), and the next frame reuses this buffer.
 * Returns the size of the buffer adopted (0: copied, or nothing to do). */
static int l_keep_array(lua_State *L) {
    lb_ctx *b = luaL_checkudata(L, 1, CTX_MT);
    lei_array *a = lei_codec_lua_array_check(L, 2);
    if (!a) return luaL_argerror(L, 2, "an array expected");
    size_t cap = lei_codec_lua_array_adopt(L, 2, 1, b->c ? adopt_rbuf : NULL, give_rbuf, b->c);
    if (cap && lei_rbuf_collect_due(b->c, cap, 2)) {
        b->array_collections++;
        lua_gc(L, LUA_GCSTEP, (int)(cap >> 10));
    }
    lua_pushnumber(L, (lua_Number)cap);
    return 1;
}

/* ctx:reclaim(): a program about to wait for its next event, having let
 * go of the ones before (lecho.capi's wait: a Python or C consumer's
 * iterator), collects when an adopted buffer is out and no spare fits the
 * next frame of its size (lei_rbuf_collect_due with min_out 1): the buffer
 * of the event let go of comes back, and the next frame is read into it,
 * its memory still in the CPU's cache.  Nothing when there is nothing to
 * find; one collection per event for such a consumer otherwise. */
static int l_reclaim(lua_State *L) {
    lb_ctx *b = luaL_checkudata(L, 1, CTX_MT);
    /* a step as for an allocation of 1 GiB: to the end of the cycle */
    if (b->c && lei_rbuf_collect_due(b->c, 0, 1)) {
        b->array_collections++;
        lua_gc(L, LUA_GCSTEP, 1 << 20);
    }
    return 0;
}

/* After a run or run_once returned: a close asked for from inside. */
void lb_close_if_pending(lb_ctx *b, lua_State *L) {
    if (b->close_pending && b->c && lei_ctx_depth(b->c) == 0) ctx_close(b, L);
}

/* A context collected, or left at the program's end, while still open:
 * lecho.context closes its own contexts first (context.lua Context:_at_end,
 * delivering within linger), so this is one made with core.new alone, or
 * the copy of a forked child.  Freed at once, and what its queues still held
 * is said on stderr (no Lua called: the state is being finalized), never
 * dropped silently. */
static int l_gc(lua_State *L) {
    lb_ctx *b = luaL_checkudata(L, 1, CTX_MT);
    if (b->c) {
        uint64_t ev = 0, by = 0;
        lei_ctx_pending(b->c, &ev, &by);
        if (ev > 0)
            fprintf(stderr, "lecho: a context freed without close: %llu events (%llu bytes) queued "
                            "were not delivered\n", (unsigned long long)ev, (unsigned long long)by);
    }
    ctx_close(b, L);
    return 0;
}

/* exit() without lua_close (LuaJIT's os.exit(code), a C program that
 * returns from main with a liblecho context open): the function given to
 * core.on_exit runs, in the thread and process that registered it, before
 * the process ends (lecho.context closes the contexts still open with it).
 * One registration per Lua state, with glibc's on_exit (it takes an
 * argument: no list of states of ours).  Its record is owned by the
 * process's exit list and lives until exit (one per Lua state ever made
 * that opened a lecho context: a few dozen bytes); the state's registry
 * holds a userdata whose __gc clears `L` when the state closes, after which
 * the record only keeps `lost`.
 *
 * The exit status: a close the program did not call (its end, os.exit, the
 * return from main: Context:_at_end) that left events undelivered marks
 * the record (core.exit_lost).  Then, once the function ran, an exit with
 * status 0 becomes status 1 (LB_EXIT_LOST): stdio is flushed and the
 * process ends with _exit, so the exit handlers registered before this one
 * (before the first lecho context of the state) do not run.  A non-zero
 * status is kept. */
typedef struct {
    lua_State *L;  /* a thread of the state, kept in the registry; NULL once it closed */
    pid_t pid;     /* a forked child does not close its parent's contexts */
    pthread_t th;  /* nor another thread than the one that registered */
    int lost;      /* events were lost by a close at the program's end */
} lb_exit;

#define LB_EXIT_LOST 1

#define EXIT_KEY "lecho.core.on_exit"

static void exit_cb(int status, void *arg) {
    lb_exit *x = arg;
    if (x->pid != getpid() || !pthread_equal(x->th, pthread_self())) return;
    lua_State *L = x->L;
    x->L = NULL; /* once */
    if (L && lua_checkstack(L, 4)) {
        lua_getfield(L, LUA_REGISTRYINDEX, EXIT_KEY ".fn");
        if (lua_isfunction(L, -1)) {
            if (lua_pcall(L, 0, 0, 0)) {
                fprintf(stderr, "lecho: closing the contexts at exit failed: %s\n", lua_tostring(L, -1));
                lua_pop(L, 1);
            }
        } else {
            lua_pop(L, 1);
        }
    }
    /* a signal ended the closes' linger: the process ends by it */
    lb_loop_end_exit();
    if (x->lost && status == 0) {
        fflush(NULL);
        _exit(LB_EXIT_LOST);
    }
}

/* core.exit_lost(): a close at the program's end lost events: the exit
 * status becomes LB_EXIT_LOST if it would be 0 (see lb_exit).  Nothing when
 * core.on_exit was not called in this state. */
static int l_exit_lost(lua_State *L) {
    lua_getfield(L, LUA_REGISTRYINDEX, EXIT_KEY);
    lb_exit **m = lua_touserdata(L, -1);
    if (m && *m) (*m)->lost = 1;
    lua_pop(L, 1);
    return 0;
}

static int exit_mark_gc(lua_State *L) {
    lb_exit **m = lua_touserdata(L, 1);
    if (m && *m) (*m)->L = NULL;
    return 0;
}

/* core.on_exit(fn): fn() runs at exit() when the state was not closed
 * before (see lb_exit); the latest fn given counts. */
static int l_on_exit(lua_State *L) {
    luaL_checktype(L, 1, LUA_TFUNCTION);
    lua_pushvalue(L, 1);
    lua_setfield(L, LUA_REGISTRYINDEX, EXIT_KEY ".fn");
    lua_getfield(L, LUA_REGISTRYINDEX, EXIT_KEY);
    int done = !lua_isnil(L, -1);
    lua_pop(L, 1);
    if (done) return 0;
    lb_exit *x = malloc(sizeof *x);
    if (!x) return luaL_error(L, "lecho: out of memory");
    lb_exit **m = lua_newuserdata(L, sizeof *m); /* the marker: registry[EXIT_KEY] */
    *m = NULL;
    lua_newtable(L);
    lua_pushcfunction(L, exit_mark_gc);
    lua_setfield(L, -2, "__gc");
    lua_setmetatable(L, -2);
    lua_setfield(L, LUA_REGISTRYINDEX, EXIT_KEY);
    x->L = lua_newthread(L);
    lua_setfield(L, LUA_REGISTRYINDEX, EXIT_KEY ".thread");
    x->pid = getpid();
    x->th = pthread_self();
    x->lost = 0;
    if (on_exit(exit_cb, x) != 0) {
        free(x);
        return luaL_error(L, "lecho: on_exit failed");
    }
    *m = x;
    return 0;
}

static int l_listen(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    const char *addr = luaL_checkstring(L, 2);
    const char *advertise = luaL_optstring(L, 3, NULL), *toward = luaL_optstring(L, 4, NULL);
    char err[LEI_ADDR_ERR_MAX];
    int rc = lei_accept_listen(b->c, addr, advertise, toward, err);
    if (rc) {
        lua_pushnil(L);
        lua_pushfstring(L, "cannot listen on %s: %s", addr, err);
        lua_pushstring(L, lei_err_name(rc));
        return 3;
    }
    lua_pushstring(L, lei_ctx_addr(b->c));
    lua_pushstring(L, lei_ctx_bound(b->c));
    return 2;
}

static int l_addr(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
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

/* ctx:hooks{ ... }: the Lua functions the loop calls (lua_hook.c), each
 * optional; a key left out keeps what was set before.
 *   event = fn(chid, value, peer_idx, producer, seq, sync, gen, bytes, vlen)
 *           -> held: true when a handler waits (ctx:resume ends the hold);
 *           peer_idx 0 is a local event; vlen not nil: value is a view
 *           (ctx:views), a lightuserdata to vlen bytes valid during the call
 *   ctrl = fn(from_addr, msg, gen)
 *   peer = fn(idx, addr, up, reason, gen, code, unreached): up, gen the new
 *           connection's; down, the loss's reason, its code (lecho.errors)
 *           and unreached (true: a dial of ours did not connect; ctx.h
 *           lei_loss), both set where it happened
 *   log = fn(message)                  moe_error = fn(moe_id, why)
 *   turn = fn(), before each loop turn's writes while ctx:want_turn(true)
 *   events = fn(t, n, peer_idx) -> held: the async events of one read
 *           from one peer (values under 4 KiB), in order: t[4i+1 .. 4i+4] =
 *           chid, value, producer, seq of event i (0-based), n of them;
 *           without it every event comes through event */
static int l_hooks(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    luaL_checktype(L, 2, LUA_TTABLE);
    set_ref(L, 2, "event", &b->ref_event);
    set_ref(L, 2, "ctrl", &b->ref_ctrl);
    set_ref(L, 2, "peer", &b->ref_peer);
    set_ref(L, 2, "log", &b->ref_log);
    set_ref(L, 2, "moe_error", &b->ref_moe_error);
    set_ref(L, 2, "turn", &b->ref_turn);
    set_ref(L, 2, "events", &b->ref_events);
    lei_ctx_batch(b->c, b->ref_events != LUA_NOREF);
    return 0;
}

/* ctx:views(on): string values of LB_VIEW_MIN bytes or more reach the
 * event hook as (lightuserdata, length) instead of a string (lua_hook.c). */
static int l_views(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    b->views = lua_toboolean(L, 2);
    return 0;
}

/* ctx:depth(): > 0 inside one of the context's callbacks. */
static int l_depth(lua_State *L) {
    lua_pushinteger(L, lei_ctx_depth(lb_check_ctx(L)->c));
    return 1;
}

/* ctx:shutdown(): the graceful close begins (ctx.h lei_ctx_shutdown). */
static int l_shutdown(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    lb_moe_flush_all(b);
    lei_ctx_shutdown(b->c);
    return 0;
}

/* ctx:pending() -> open connections, events queued, bytes queued, and
 * since the start: async events lost with a connection (not a queue
 * policy), their bytes, the last such loss ("ADDR: reason"); async events
 * written to a peer that confirms reads on connections that ended
 * abnormally before it confirmed them, their bytes, the last such end */
static int l_pending(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    uint64_t ev, by;
    lei_stats_ctx cs;
    lb_moe_flush_all(b); /* staged events are not queued yet */
    int open = lei_ctx_pending(b->c, &ev, &by);
    lei_ctx_stats(b->c, &cs);
    lua_pushinteger(L, open);
    lua_pushnumber(L, (lua_Number)ev);
    lua_pushnumber(L, (lua_Number)by);
    lua_pushnumber(L, (lua_Number)cs.undelivered);
    lua_pushnumber(L, (lua_Number)cs.undelivered_bytes);
    lua_pushstring(L, lei_ctx_undelivered_why(b->c));
    lua_pushnumber(L, (lua_Number)cs.unconfirmed);
    lua_pushnumber(L, (lua_Number)cs.unconfirmed_bytes);
    lua_pushstring(L, lei_ctx_unconfirmed_why(b->c));
    return 9;
}

/* ctx:local_queued() -> the events queued for this context's own
 * consumers (local delivery, core/transport/local.c) and their bytes; then
 * those of them held behind a handler that waits (a suspended handler
 * holds its channel).  close runs them within its linger, before its
 * consumers go, and reports those left (lecho.context, Context:close). */
static int l_local_queued(lua_State *L) {
    lei_stats_ctx cs;
    lei_ctx_stats(lb_check_ctx(L)->c, &cs);
    lua_pushnumber(L, (lua_Number)(cs.local_events + cs.deferred_events));
    lua_pushnumber(L, (lua_Number)(cs.local_bytes + cs.deferred_bytes));
    lua_pushnumber(L, (lua_Number)cs.deferred_events);
    return 3;
}

/* ctx:local_batch(n): at most n local handlers per loop turn (0: the
 * default); close's local delivery sets 1 to see its deadline and a
 * signal between two handlers (lei_local_batch). */
static int l_local_batch(lua_State *L) {
    lei_local_batch(lb_check_ctx(L)->c, (int)luaL_checkinteger(L, 2));
    return 0;
}

/* ctx:unsure() -> of the connections still open, those where an event of
 * ours may be unread; the async events written on them to peers that
 * confirm reads not confirmed yet, their bytes (lei_ctx_unsure, one walk):
 * close's report after the linger. */
static int l_unsure(lua_State *L) {
    uint64_t ev, by;
    lua_pushinteger(L, lei_ctx_unsure(lb_check_ctx(L)->c, &ev, &by));
    lua_pushnumber(L, (lua_Number)ev);
    lua_pushnumber(L, (lua_Number)by);
    return 3;
}

/* core.hash(s) -> 64 hex digits: BLAKE2b-256 of s (crypto_generichash, no
 * key).  It names modulator code and params (lecho.subs: a modulator's base,
 * key and stream), names that peers compare and believe (one key is one
 * modulator, whoever else uses it), so two texts must not be made to give
 * one name: the FNV-1a 64 it was collided in minutes (doc/modulators.md
 * "Keys"). */
static int l_hash(lua_State *L) {
    size_t n;
    const unsigned char *p = (const unsigned char *)luaL_checklstring(L, 1, &n);
    char out[LB_KEY_HEX + 1];
    lb_moe_key_hex(p, n, out);
    lua_pushlstring(L, out, LB_KEY_HEX);
    return 1;
}

void lb_setn(lua_State *L, const char *k, double v) {
    lua_pushnumber(L, v);
    lua_setfield(L, -2, k);
}

void lb_metatable(lua_State *L, const char *name, const luaL_Reg *methods, lua_CFunction gc) {
    if (luaL_newmetatable(L, name)) {
        if (methods) {
            lua_newtable(L);
            luaL_register(L, NULL, methods);
            lua_setfield(L, -2, "__index");
        }
        if (gc) {
            lua_pushcfunction(L, gc);
            lua_setfield(L, -2, "__gc");
        }
    }
    lua_pop(L, 1);
}

/* ctx:stats() -> { encodes, bad_frames, local_queue, peers = {[addr] = {...}},
 *                  channels = {[name] = {...}} } */
static int l_stats(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    lei_ctx *c = b->c;
    lei_stats_ctx cs;
    lei_ctx_stats(c, &cs);
    lua_newtable(L);
    lb_setn(L, "encodes", (double)cs.encodes);
    lb_setn(L, "bad_frames", (double)cs.bad_frames);
    lb_setn(L, "local_queue_bytes", (double)cs.local_bytes);
    lb_setn(L, "local_queue_events", (double)cs.local_events);
    lb_setn(L, "local_deferred_events", (double)cs.deferred_events);
    lb_setn(L, "local_deferred_bytes", (double)cs.deferred_bytes);
    lb_setn(L, "connections", (double)cs.connections);
    lb_setn(L, "read_buffer_bytes", (double)cs.read_buffer_bytes);
    lb_setn(L, "stale_acks", (double)cs.stale_acks);
    lb_setn(L, "arrays_adopted", (double)cs.rbuf_adopted);
    lb_setn(L, "array_collections", (double)b->array_collections);
    lb_setn(L, "undelivered", (double)cs.undelivered);
    lb_setn(L, "undelivered_bytes", (double)cs.undelivered_bytes);
    lb_setn(L, "unconfirmed", (double)cs.unconfirmed);
    lb_setn(L, "unconfirmed_bytes", (double)cs.unconfirmed_bytes);
    lua_newtable(L);
    for (int i = 0; i < lei_peer_total(c); i++) {
        lei_peer *p = lei_peers_at(c, i);
        lei_stats_peer ps;
        lei_peer_stats(p, &ps);
        lua_newtable(L);
        lb_setn(L, "events_in", (double)ps.st.ev_in);
        lb_setn(L, "events_out", (double)ps.st.ev_out);
        lb_setn(L, "bytes_in", (double)ps.st.bytes_in);
        lb_setn(L, "bytes_out", (double)ps.st.bytes_out);
        lb_setn(L, "batches", (double)ps.st.batches);
        lb_setn(L, "drops", (double)ps.st.drops);
        lb_setn(L, "undelivered", (double)ps.st.undelivered);
        lb_setn(L, "confirmed", (double)ps.confirmed);
        lb_setn(L, "unconfirmed", (double)ps.unconfirmed);
        lb_setn(L, "unconfirmed_bytes", (double)ps.unconfirmed_bytes);
        lua_pushboolean(L, ps.confirms);
        lua_setfield(L, -2, "confirms");
        lb_setn(L, "ctrl_in", (double)ps.st.ctrl_in);
        lb_setn(L, "ctrl_out", (double)ps.st.ctrl_out);
        lb_setn(L, "dials", (double)ps.st.dials);
        lb_setn(L, "queue_bytes", (double)ps.queue_bytes);
        lb_setn(L, "queue_events", (double)ps.queue_events);
        lb_setn(L, "heartbeats_in", (double)ps.hb_in);
        lb_setn(L, "heartbeats_out", (double)ps.hb_out);
        lb_setn(L, "heartbeat_timeouts", (double)ps.timeouts);
        lb_setn(L, "gaps", (double)ps.gaps);
        lb_setn(L, "lost", (double)ps.lost);
        lb_setn(L, "duplicates", (double)ps.dups);
        lb_setn(L, "refused", (double)ps.refused);
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
    for (uint32_t i = 0; i < lei_chan_total(c); i++) {
        lei_stats_chan st;
        lei_chan_stats(c, i, &st);
        lua_newtable(L);
        lb_setn(L, "events_in", (double)st.ev_in);
        lb_setn(L, "events_out", (double)st.ev_out);
        lb_setn(L, "bytes_in", (double)st.bytes_in);
        lb_setn(L, "bytes_out", (double)st.bytes_out);
        lb_setn(L, "events_local", (double)st.ev_local);
        lb_setn(L, "events_no_dest", (double)st.ev_nodest);
        lb_setn(L, "encodes", (double)st.encodes);
        lb_setn(L, "drops", (double)st.drops);
        lb_setn(L, "undelivered", (double)st.undelivered);
        lb_setn(L, "destinations", st.ndests);
        lb_setn(L, "gaps", (double)st.gaps);
        lb_setn(L, "lost", (double)st.lost);
        lb_setn(L, "duplicates", (double)st.dups);
        lb_setn(L, "refused", (double)st.refused);
        lua_setfield(L, -2, lei_chan_name(c, i));
    }
    lua_setfield(L, -2, "channels");
    return 1;
}

static int l_peer_addr(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    lei_peer *p = lei_peers_by_idx(b->c, (int)luaL_checkinteger(L, 2));
    if (!p) return 0;
    lua_pushstring(L, lei_peer_addr(p));
    return 1;
}

/* ctx:peer_unread(addr) -> the bytes from addr waiting in the kernel, not
 * read yet (lei_peer_unread); 0 when addr is no peer. */
static int l_peer_unread(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    lei_peer *p = lei_peer_get(b->c, luaL_checkstring(L, 2), 0);
    lua_pushnumber(L, p ? (lua_Number)lei_peer_unread(p) : 0);
    return 1;
}

/* ctx:close_peer(addr, reason): drops the connection to addr. */
static int l_close_peer(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    lei_peer *p = lei_peer_get(b->c, luaL_checkstring(L, 2), 0);
    const char *why = luaL_optstring(L, 3, "closed by the application");
    if (p) lei_peer_close(p, why);
    return 0;
}

/* ctx:ratelog(kind, msg): logs msg through lei_ratelog, at most one line
 * per kind per 10 s (issue 11: refusals decided in Lua, e.g. member lists).
 * The names follow enum lei_ratelog_kind (ctx.h), in its order. */
static int l_ratelog(lua_State *L) {
    static const char *const kinds[] = {"handshake_timeout", "connections", "accept", "frame",
                                        "bind_index", "hello_addr", "channels", "peers",
                                        "members", "value", "modulator", "refused_binds",
                                        "handshake", "liveness", "takeover", "slow_acks", "slow_ctrl", "dial", NULL};
    _Static_assert(sizeof kinds / sizeof *kinds == LEI_RL_NKINDS + 1,
                   "one name per enum lei_ratelog_kind");
    lb_ctx *b = lb_check_ctx(L);
    int kind = luaL_checkoption(L, 2, NULL, kinds);
    lei_ratelog(b->c, kind, "%s", luaL_checkstring(L, 3));
    return 0;
}

static const luaL_Reg ctx_methods[] = {
    {"ratelog", l_ratelog},
    {"listen", l_listen},         {"addr", l_addr},
    {"hooks", l_hooks},           {"stats", l_stats},           {"views", l_views},
    {"peer_addr", l_peer_addr},   {"close_peer", l_close_peer}, {"peer_unread", l_peer_unread},
    {"close", l_close},           {"depth", l_depth},           {"keep_array", l_keep_array},
    {"reclaim", l_reclaim},
    {"shutdown", l_shutdown},     {"pending", l_pending},
    {"unsure", l_unsure},         {"local_queued", l_local_queued},
    {"local_batch", l_local_batch},
    {NULL, NULL}};

__attribute__((visibility("default"))) int luaopen_lecho_core(lua_State *L) {
    if (luaL_newmetatable(L, CTX_MT)) {
        lua_newtable(L);
        luaL_register(L, NULL, ctx_methods);
        luaL_register(L, NULL, lb_chan_methods);
        luaL_register(L, NULL, lb_loop_methods);
        luaL_register(L, NULL, lb_raw_methods);
        luaL_register(L, NULL, lb_rsink_methods);
        luaL_register(L, NULL, lb_rec_ctx_methods);
        luaL_register(L, NULL, lb_moe_ctx_methods);
        luaL_register(L, NULL, lb_auth_methods);
        luaL_register(L, NULL, lb_prod_ctx_methods);
        luaL_register(L, NULL, lb_sink_ctx_methods);
        lua_setfield(L, -2, "__index");
        lua_pushcfunction(L, l_gc);
        lua_setfield(L, -2, "__gc");
    }
    lua_pop(L, 1);
    lb_loop_open(L);
    lb_moe_open(L);
    lb_rec_open(L);
    lua_newtable(L);
    lei_codec_lua_setfuncs(L); /* encode, decode, validate */
    lei_array_lua_ops(L, NULL); /* the array operations, never stopped here */
    lua_setfield(L, -2, "array_ops");
    lua_pushcfunction(L, l_new);
    lua_setfield(L, -2, "new");
    lb_prod_open(L); /* core.dataplane, core.dataplane_cdef */
    lua_pushcfunction(L, l_hash);
    lua_setfield(L, -2, "hash");
    lua_pushcfunction(L, lb_moe_stream_key);
    lua_setfield(L, -2, "stream_key");
    lua_pushcfunction(L, l_on_exit);
    lua_setfield(L, -2, "on_exit");
    lua_pushcfunction(L, l_exit_lost);
    lua_setfield(L, -2, "exit_lost");
    lua_pushcfunction(L, lei_lpat_new); /* core.lpat(): the modulators' pattern functions */
    lua_setfield(L, -2, "lpat");
    luaL_register(L, NULL, lb_loop_end_funcs);  /* end_signals, end_signal */
    luaL_register(L, NULL, lb_auth_funcs); /* keypair, sign, verify, hex, unhex, random_id */
    lua_pushinteger(L, LEI_PROTO_VERSION);
    lua_setfield(L, -2, "protocol_version");
    return 1;
}
