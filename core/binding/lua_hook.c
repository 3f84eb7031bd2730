/* lua_hook.c: every call from the loop into Lua (event, ctrl, peer, log,
 * turn hooks) runs on the context's own Lua thread (lb_ctx.L, made once in
 * core.new) through one protected call with a traceback, which never lets
 * an error escape into C.
 */
#define _GNU_SOURCE
#include "lua_int.h"
#include "array.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Calls the function below nargs arguments through the traceback handler.
 * Errors are logged, never raised.  Returns 0 or -1. */
int lb_pcall(lb_ctx *b, int nargs, int nres) {
    lua_State *L = b->L;
    int base = lua_gettop(L) - nargs;
    lua_rawgeti(L, LUA_REGISTRYINDEX, b->ref_tb);
    lua_insert(L, base);
    int rc = lua_pcall(L, nargs, nres, base);
    lua_remove(L, base);
    if (rc) {
        size_t n = 0;
        const char *m = lua_tolstring(L, -1, &n);
        if (m && n >= 12 && strstr(m, "interrupted!") && b->c) {
            /* A SIGINT's hook (LuaJIT's, or lecho's in ctx:run): not this
             * callback's error but the program's; caught here, it was lost
             * (the program ran on).  The loop stops and its caller raises
             * it again on the main line (lua_loop.c, context.lua). */
            b->sig_in_cb = 1;
            ev_break(lei_ctx_loop(b->c), EVBREAK_ALL);
            lua_pop(L, 1);
            return -1;
        }
        lei_logf(b->c, "error in callback: %s", m ? m : "(non-string error)");
        lua_pop(L, 1);
        return -1;
    }
    return 0;
}

void lb_hook_unpin(void *ud, int ref) {
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

static void lb_hook_log(void *ud, const char *msg) {
    lb_ctx *b = ud;
    lua_State *L = b->L;
    if (b->ref_log == LUA_NOREF || !L || !lua_checkstack(L, 4)) {
        fprintf(stderr, "lecho: %s\n", msg);
        return;
    }
    lua_rawgeti(L, LUA_REGISTRYINDEX, b->ref_calls);
    lua_rawgeti(L, -1, LB_CALL_LOG);
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

/* An event whose value is one string of at least LB_VIEW_MIN bytes, in a
 * context where a consumer takes string values as buffers (ctx:views):
 * the string's first byte, where the payload holds it; else NULL (decoded
 * as usual).  The Lua side gets (pointer, length) instead of a string and
 * makes the consumers' buffers point at it (context.lua): the bytes stay
 * where they were read until the dispatch returns or waits (the read
 * buffer is neither moved nor freed below a busy connection; a local
 * event's message is held by local_deliver), and the Lua side copies them
 * before it returns WAIT or runs the loop nested. */
static const uint8_t *view_of(const hook_args *a) {
    if (!a->b->views || a->n < LB_VIEW_MIN) return NULL;
    lei_reader r;
    lei_item it;
    lei_reader_init(&r, a->p, a->n, &a->b->lim);
    if (lei_codec_read_item(&r, &it) || it.tag != LEI_T_STRING || lei_reader_finish(&r)) return NULL;
    return it.str;
}

/* Decodes the payload and calls the hook's Lua function, all inside one
 * lua_pcall: running out of memory while decoding (a value that decodes to
 * many times its size) costs that connection, never the process. */
static int hook_call(lua_State *L) {
    hook_args *a = lua_touserdata(L, 1);
    lua_settop(L, 0);
    luaL_checkstack(L, 14, "hook");
    lua_rawgeti(L, LUA_REGISTRYINDEX, a->ref);
    if (a->is_event)
        lua_pushnumber(L, a->chid);
    else
        lua_pushstring(L, lei_peer_addr(a->from));
    a->bad = 1; /* until the value is there */
    size_t vlen = 0;
    int avs = 0; /* stack index of the value's array views (a table or nil) */
    const uint8_t *view = a->is_event ? view_of(a) : NULL;
    if (view) {
        lua_pushlightuserdata(L, (void *)view);
        vlen = a->n - (size_t)(view - a->p);
    } else if (!a->is_event) {
        if (lei_decode_lua(L, a->p, a->n, &a->b->lim, a->err, sizeof a->err)) return 0;
    } else if (lb_raw_is(a->b, a->chid)) {
        /* a recorder's channel: the bytes as they came (lua_raw.c) */
        if (lb_raw_push(L, a->b, a->p, a->n, a->err, sizeof a->err)) return 0;
    } else {
        /* arrays of LB_ARRAY_VIEW_MIN bytes or more point into the payload,
         * valid while the dispatch runs (context.lua keeps or ends them) */
        if (lei_decode_lua_views(L, a->p, a->n, &a->b->lim, LB_ARRAY_VIEW_MIN, a->err,
                                 sizeof a->err))
            return 0;
        avs = lua_gettop(L);
    }
    a->bad = 0;
    if (!a->is_event) {
        /* the connection's generation: a reply is taken only from the
         * connection its request went out on (lecho.control) */
        lua_pushnumber(L, (lua_Number)lei_peer_gen(a->from));
        lua_call(L, 3, 0);
        return 0;
    }
    lua_pushinteger(L, a->from ? lei_peer_idx(a->from) : 0);
    lua_pushnumber(L, (lua_Number)a->producer);
    lua_pushnumber(L, (lua_Number)a->seq);
    lua_pushnumber(L, (lua_Number)a->sync);
    /* the connection's generation: a waiting handler's ack goes to it only */
    lua_pushnumber(L, (lua_Number)lei_peer_gen(a->from));
    lua_pushnumber(L, (lua_Number)a->n); /* the value's encoded bytes */
    if (view)
        lua_pushnumber(L, (lua_Number)vlen);
    else
        lua_pushnil(L);
    if (avs) {
        lua_pushvalue(L, avs);
        lua_remove(L, avs);
    } else
        lua_pushnil(L);
    /* -> held, nran, errors.  A sync event dispatched to its end is
     * acknowledged here, with what the dispatch returned: no call back
     * into C from Lua for it.  One whose handler waits is acknowledged by
     * the dispatch when it ends (ctx:ack); nran not a number: no ack (the
     * dispatch failed, or its context closed). */
    lua_call(L, 10, 3);
    a->held = lua_toboolean(L, -3);
    lb_ctx *b = a->b;
    if (a->sync && !a->held && lua_isnumber(L, -2) && b->c && !b->close_pending)
        lb_ack(b, a->from, NULL, a->sync, (uint64_t)lua_tonumber(L, -2), L, lua_gettop(L));
    return 0;
}

/* Runs hook_call; 0, 1 (event: a handler is suspended) or -1 (bad value:
 * the caller closes the connection it came on). */
static int run_hook(lb_ctx *b, hook_args *a) {
    lua_State *L = b->L;
    if (!L || a->ref == LUA_NOREF || !lua_checkstack(L, 4)) return -1;
    int rc = lb_calls_pcall(L, b, LB_CALL_HOOK, a);
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
        if (a->bad) {
            lei_logf(b->c, "bad %s from %s: %s", what, from,
                     rc == LUA_ERRMEM ? "out of memory decoding it" : (m ? m : "error"));
            if (b->c)
                lei_ctx_refusal(b->c, rc == LUA_ERRMEM ? "out of memory decoding it" : (m ? m : "error"));
        }
        else
            lei_logf(b->c, "error in callback: %s", m ? m : "(non-string error)");
        lua_pop(L, 2);
        return a->bad ? -1 : 0;
    }
    lua_pop(L, 1);
    if (a->bad) {
        lei_logf(b->c, "bad %s from %s: %s", what, from, a->err);
        if (b->c) lei_ctx_refusal(b->c, a->err);
        return -1;
    }
    return a->held ? 1 : 0;
}

static int lb_hook_event(void *ud, lei_peer *from, uint32_t chid, uint64_t producer, uint64_t seq,
                  uint64_t sync, const uint8_t *p, size_t n) {
    lb_ctx *b = ud;
    if (b->rsink) {
        /* a recorder writing from C: its channels never enter Lua */
        char err[256];
        int r = lb_rsink_event(b, from, chid, producer, seq, sync, p, n, err, sizeof err);
        if (r < 0) {
            lei_logf(b->c, "bad event value from %s: %s", from ? lei_peer_addr(from) : "local", err);
            lei_ctx_refusal(b->c, err);
            return -1;
        }
        if (r > 0) {
            if (sync && b->c) lei_ack(b->c, from, sync, 1, NULL, 0);
            return 0;
        }
    }
    /* (after an interrupt: to the Lua dispatch, which runs no handler) */
    int sunk = b->intr_raised ? LB_NO_SINK : lb_sink_event(b, from, chid, producer, seq, sync, p, n); /* a C consumer */
    if (sunk != LB_NO_SINK) return sunk;
    /* field by field: an initializer would zero err[] (256 bytes) per event */
    hook_args a;
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
    a.bad = a.held = 0;
    a.err[0] = '\0';
    return run_hook(b, &a);
}

/* What lb_hook_events hands to batch_call. */
typedef struct batch_args {
    lb_ctx *b;
    lei_peer *from;
    const lei_event_in *ev;
    int n;
    int ndec;                /* values decoded (the first bad one: ndec < n) */
    int held;                /* the events function returned true */
    char err[256];
} batch_args;

/* Decodes every value of the batch into one table t (t[4i+1 .. 4i+4] =
 * chid, value, producer, seq) and calls the events function once
 * with (t, count, peer), inside one lua_pcall: the one crossing into
 * Lua for a read's async events.  A value that does not decode ends the
 * batch there: those before it are dispatched, a->ndec says where. */
static int batch_call(lua_State *L) {
    batch_args *a = lua_touserdata(L, 1);
    lb_ctx *b = a->b;
    lua_settop(L, 0);
    luaL_checkstack(L, 8, "hook");
    lua_rawgeti(L, LUA_REGISTRYINDEX, b->ref_events);
    lua_createtable(L, a->n * 4, 0);
    int k = 0;
    for (int i = 0; i < a->n; i++, k += 4) {
        const lei_event_in *e = &a->ev[i];
        /* a raw channel (lua_raw.c, a recorder's) gets the checked bytes */
        if (lb_raw_is(b, e->chid) ? lb_raw_push(L, b, e->p, e->n, a->err, sizeof a->err)
                                  : lei_decode_lua(L, e->p, e->n, &b->lim, a->err, sizeof a->err))
            break;
        lua_rawseti(L, 2, k + 2);
        lua_pushnumber(L, e->chid);
        lua_rawseti(L, 2, k + 1);
        lua_pushnumber(L, (lua_Number)e->producer);
        lua_rawseti(L, 2, k + 3);
        lua_pushnumber(L, (lua_Number)e->seq);
        lua_rawseti(L, 2, k + 4);
        a->ndec++;
    }
    if (a->ndec == 0) return 0;
    lua_pushinteger(L, a->ndec);
    lua_pushinteger(L, lei_peer_idx(a->from));
    lua_call(L, 3, 1);
    a->held = lua_toboolean(L, -1);
    return 0;
}

/* The events hook (ctx.h): one protected call for the batch.  An error in
 * Lua outside the handlers (which run under their own pcall) is logged;
 * running out of memory while decoding costs the connection, as for one
 * event (run_hook), with the batch's values. */
static int batch_lua(lb_ctx *b, lei_peer *from, const lei_event_in *ev, int n, int *held) {
    lua_State *L = b->L;
    *held = 0;
    if (!L || b->ref_events == LUA_NOREF || !lua_checkstack(L, 4)) return 0;
    batch_args a;
    a.b = b;
    a.from = from;
    a.ev = ev;
    a.n = n;
    a.ndec = a.held = 0;
    a.err[0] = '\0';
    int rc = lb_calls_pcall(L, b, LB_CALL_BATCH, &a);
    *held = a.held;
    if (rc) {
        const char *m = lua_tostring(L, -1);
        if (rc == LUA_ERRMEM) {
            lua_pop(L, 1);
            lua_gc(L, LUA_GCCOLLECT, 0);
            lei_logf(b->c, "bad event value from %s: out of memory decoding it", lei_peer_addr(from));
            if (b->c) lei_ctx_refusal(b->c, "out of memory decoding it");
            lua_pop(L, 1);
            return a.ndec < n ? a.ndec : 0;
        }
        lei_logf(b->c, "error in callback: %s", m ? m : "(non-string error)");
        lua_pop(L, 2);
        return n;
    }
    lua_pop(L, 1);
    if (a.ndec < n) {
        lei_logf(b->c, "bad event value from %s: %s", lei_peer_addr(from), a.err);
        if (b->c) lei_ctx_refusal(b->c, a.err);
        return a.ndec;
    }
    return n;
}

/* The events hook: the leading events whose channel a recorder writes from
 * C (lua_rsink.c) or has a C consumer (lua_sink.c) go there one by one,
 * without Lua; from the first one that
 * has none, the rest of the read goes to Lua as one batch (Lua dispatches a
 * C consumer's channel too), so the order of the read is kept and a
 * handler that waits holds what follows it.  Returns the events taken (n,
 * or the index of a value that did not decode). */
static int lb_hook_events(void *ud, lei_peer *from, const lei_event_in *ev, int n, int *held) {
    lb_ctx *b = ud;
    int i = 0;
    *held = 0;
    if (b->nsinks || b->rsink) {
        for (; i < n; i++) {
            const lei_event_in *e = &ev[i];
            if (b->rsink) { /* a recorder writing from C */
                char err[256];
                int r = lb_rsink_event(b, from, e->chid, e->producer, e->seq, 0, e->p, e->n, err, sizeof err);
                if (r < 0) {
                    lei_logf(b->c, "bad event value from %s: %s", from ? lei_peer_addr(from) : "local", err);
                    lei_ctx_refusal(b->c, err);
                    return i;
                }
                if (r > 0) continue;
            }
            /* after an interrupt: to the Lua dispatch, which runs no handler */
            if (b->intr_raised) break;
            int r = b->nsinks ? lb_sink_event(b, from, e->chid, e->producer, e->seq, 0, e->p, e->n) : LB_NO_SINK;
            if (r == LB_NO_SINK) break;
            if (r < 0) return i;
        }
        if (i == n) return n;
    }
    return i + batch_lua(b, from, ev + i, n - i, held);
}

static int lb_hook_ctrl(void *ud, lei_peer *from, const uint8_t *p, size_t n) {
    lb_ctx *b = ud;
    hook_args a = {.b = b, .from = from, .ref = b->ref_ctrl, .p = p, .n = n};
    return run_hook(b, &a) < 0 ? -1 : 0;
}

static void lb_hook_peer(void *ud, lei_peer *p, int up, const char *reason, int code) {
    lb_ctx *b = ud;
    lua_State *L = b->L;
    if (!L || b->ref_peer == LUA_NOREF || !lua_checkstack(L, 8)) return;
    lua_rawgeti(L, LUA_REGISTRYINDEX, b->ref_peer);
    lua_pushinteger(L, lei_peer_idx(p));
    lua_pushstring(L, lei_peer_addr(p));
    lua_pushboolean(L, up);
    if (reason)
        lua_pushstring(L, reason);
    else
        lua_pushnil(L);
    lua_pushnumber(L, (lua_Number)lei_peer_gen(p)); /* up: the new connection's generation */
    if (up) {
        lua_pushnil(L);
        lua_pushnil(L);
    } else {
        lua_pushstring(L, lei_err_name(code)); /* down: why, as a code set where it happened */
        /* and whether it was a dial that did not connect, a flag set where
         * it failed (the reason's words decide nothing) */
        lua_pushboolean(L, lei_peer_loss(p)->unreached);
    }
    lb_pcall(b, 7, 0);
}

/* Runs the modulators' dequeue, then the turn hook (the Lua scheduler
 * resumes waiters that can go on), before the queues are written. */
static void lb_hook_prepare(void *ud) {
    lb_ctx *b = ud;
    for (lb_moe *x = b->moes; x; x = x->next)
        if (x->m && lei_moe_has_pending(x->m)) lei_moe_pump(x->m);
    if (b->want_turn && b->ref_turn != LUA_NOREF && b->L && lua_checkstack(b->L, 4)) {
        lua_rawgeti(b->L, LUA_REGISTRYINDEX, b->ref_turn);
        lei_ctx_enter(b->c);
        lb_pcall(b, 0, 0);
        if (b->c) lei_ctx_leave(b->c);
    }
}

/* Makes b's callback thread and fills in the core's hooks.  One thread of
 * its own runs every callback: never a coroutine of the caller's, which may
 * be suspended when the loop next calls back, and never a swap of b->L. */
void lb_hooks_init(lua_State *L, lb_ctx *b, lei_hooks *h) {
    b->L = lua_newthread(L);
    b->ref_thread = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_createtable(L, 4, 0);
    lua_pushcfunction(L, hook_call);
    lua_rawseti(L, -2, LB_CALL_HOOK);
    lua_pushcfunction(L, log_call);
    lua_rawseti(L, -2, LB_CALL_LOG);
    lua_pushcfunction(L, batch_call);
    lua_rawseti(L, -2, LB_CALL_BATCH);
    lb_sink_push_call(L);
    lua_rawseti(L, -2, LB_CALL_SINK);
    b->ref_calls = luaL_ref(L, LUA_REGISTRYINDEX);
    lei_hooks hk = {b, lb_hook_event, lb_hook_ctrl, lb_hook_peer, lb_hook_unpin, lb_hook_log,
                    lb_hook_prepare, lb_hook_events};
    *h = hk;
}
