/* lua_sink.c: C sinks (binding): a channel whose only plain consumer is C
 * code (liblecho) has its async events handed to that code from the event
 * hook, decoded onto the callback thread, without the Lua dispatch
 * (lua_prod.h, lb_sink).  ctx:set_sink(chid, sink|nil) is called by
 * Channel:_hot_update whenever the channel's consumer list changes.
 *
 * Ownership: b->sinks (an array by channel id) is owned by the context and
 * freed when it closes; each sink userdata is pinned in the table
 * b->ref_sinks (chid -> sink) while set, and owned by its Lua consumer.
 * A sink let go while a bytes call runs (its handler closed its consumer)
 * stays pinned in the list b->ref_sinks_held until the outermost call
 * returns: a count (b->sink_calls) instead of pinning the running sink
 * through the registry per event (two lookups and a settop, ~140
 * instructions of a 64-byte event's ~1,200 at a C consumer).
 */
#define _GNU_SOURCE
#include "lua_int.h"
#include "lua_prod.h"
#include "array.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ctx:set_sink(chid, sink|nil) */
static int l_set_sink(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    uint32_t chid = lb_check_chan(L, b, 2);
    lb_sink *s = lua_isnoneornil(L, 3) ? NULL : luaL_checkudata(L, 3, LB_SINK_MT);
    if (s && chid >= b->nsinks) {
        uint64_t n = b->nsinks ? b->nsinks : 16;
        while (n <= chid) n *= 2;
        lb_sink **a = realloc(b->sinks, (size_t)n * sizeof *a);
        if (!a) return luaL_error(L, "lecho: out of memory");
        memset(a + b->nsinks, 0, (n - b->nsinks) * sizeof *a);
        b->sinks = a;
        b->nsinks = (uint32_t)(n > UINT32_MAX ? UINT32_MAX : n);
    }
    if (b->ref_sinks == LUA_NOREF) {
        lua_newtable(L);
        b->ref_sinks = luaL_ref(L, LUA_REGISTRYINDEX);
    }
    lua_rawgeti(L, LUA_REGISTRYINDEX, b->ref_sinks);
    if (b->sink_calls > 0) { /* a sink may be running: the one let go stays pinned */
        lua_rawgeti(L, -1, (int)chid);
        if (!lua_isnil(L, -1)) {
            if (b->ref_sinks_held == LUA_NOREF) {
                lua_newtable(L);
                b->ref_sinks_held = luaL_ref(L, LUA_REGISTRYINDEX);
            }
            lua_rawgeti(L, LUA_REGISTRYINDEX, b->ref_sinks_held);
            lua_pushvalue(L, -2);
            lua_rawseti(L, -2, (int)lua_objlen(L, -2) + 1);
            lua_pop(L, 1);
        }
        lua_pop(L, 1);
    }
    lua_pushvalue(L, 3);
    lua_rawseti(L, -2, (int)chid);
    lua_pop(L, 1);
    if (chid < b->nsinks) b->sinks[chid] = s;
    return 0;
}

const luaL_Reg lb_sink_ctx_methods[] = {{"set_sink", l_set_sink}, {NULL, NULL}};

void lb_sinks_free(lb_ctx *b, lua_State *L) {
    free(b->sinks);
    b->sinks = NULL;
    b->nsinks = 0;
    luaL_unref(L, LUA_REGISTRYINDEX, b->ref_sinks);
    b->ref_sinks = LUA_NOREF;
    luaL_unref(L, LUA_REGISTRYINDEX, b->ref_sinks_held);
    b->ref_sinks_held = LUA_NOREF;
}

/* What lb_sink_event hands to the protected call. */
typedef struct sink_args {
    lb_ctx *b;
    lb_sink *s;
    uint32_t chid;
    const uint8_t *p;
    lb_event ev;
    int bad; /* the payload did not decode */
    int vref; /* a bytes sink's decoded views: registry ref of their list (LUA_NOREF: none) */
    char err[256];
} sink_args;

/* One event's sink_args, on the caller's stack: nothing decoded yet, no
 * views, no error (ev.decode NULL: a bytes sink sets sink_decode). */
static void sink_args_init(sink_args *a, lb_ctx *b, lb_sink *s, uint32_t chid, lei_peer *from,
                           uint64_t producer, uint64_t seq, const uint8_t *p, size_t n) {
    a->b = b;
    a->s = s;
    a->chid = chid;
    a->p = p;
    a->ev.from = from ? lei_peer_addr(from) : NULL;
    a->ev.producer = producer;
    a->ev.seq = seq;
    a->ev.n = n;
    a->ev.decode = NULL;
    a->bad = 0;
    a->vref = LUA_NOREF;
    a->err[0] = '\0';
}

/* lb_event.decode for a bytes sink: the value and its views (or nil) on L;
 * the list is also pinned in a->vref so that lb_sink_event ends them once
 * the sink returned or raised. */
static void sink_decode(const lb_event *e, lua_State *L) {
    sink_args *a = (sink_args *)((char *)e - offsetof(sink_args, ev));
    char err[256];
    luaL_checkstack(L, 4, "lecho: decode");
    if (lei_decode_lua_views(L, a->p, e->n, &a->b->lim, LB_ARRAY_VIEW_MIN, err, sizeof err))
        luaL_error(L, "lecho: %s", err); /* checked before the call: memory only */
    if (lua_istable(L, -1) && a->vref == LUA_NOREF) {
        lua_pushvalue(L, -1);
        a->vref = luaL_ref(L, LUA_REGISTRYINDEX);
    }
}

/* The sink's call when the value has views (sink_call): a at 1, the
 * value at 2, its views at 3, the sink's userdata at 4 (pinned). */
static int sink_fn_call(lua_State *L) {
    sink_args *a = lua_touserdata(L, 1);
    a->s->fn(a->s, L, 2, &a->ev);
    return 0;
}

/* Decodes the value and calls the sink, inside one lua_pcall (running out
 * of memory decoding costs the connection, never the process). */
static int sink_call(lua_State *L) {
    sink_args *a = lua_touserdata(L, 1);
    lua_settop(L, 0);
    a->bad = 1;
    /* arrays of LB_ARRAY_VIEW_MIN bytes or more point into the payload (no
     * copy: an 8 MiB array copied per event ran at 0.08x of a view), listed
     * at 2 (or nil), as the Lua dispatch gets them (lua_hook.c) */
    if (lei_decode_lua_views(L, a->p, a->ev.n, &a->b->lim, LB_ARRAY_VIEW_MIN, a->err,
                             sizeof a->err))
        return 0;
    a->bad = 0;
    /* the sink's userdata stays on the stack while it runs: a handler that
     * closes its consumer unpins it */
    lua_rawgeti(L, LUA_REGISTRYINDEX, a->b->ref_sinks);
    lua_rawgeti(L, -1, (int)a->chid);
    if (!lua_istable(L, 2)) {
        a->s->fn(a->s, L, 1, &a->ev);
        return 0;
    }
    /* views: the sink runs in a protected call of its own, so that they
     * end even when it raises */
    int top = lua_gettop(L);
    lua_pushcfunction(L, sink_fn_call);
    lua_pushlightuserdata(L, a);
    lua_pushvalue(L, 1);
    lua_pushvalue(L, 2);
    lua_pushvalue(L, top);
    int rc = lua_pcall(L, 4, 0, 0);
    /* the dispatch is over: the views not kept (lei_codec_lua_array_keep
     * made those their own copies) lose their elements, so a value stored
     * past it reads none, never the read buffer reused */
    int nv = (int)lua_objlen(L, 2);
    for (int i = 1; i <= nv; i++) {
        lua_rawgeti(L, 2, i);
        lei_codec_lua_array_end(L, -1);
        lua_pop(L, 1);
    }
    if (rc) lua_error(L);
    return 0;
}

/* A bytes sink's decoded views (the list at registry ref vref; LUA_NOREF:
 * none), kept or not: over with the call.  Allocates nothing, never raises. */
static void views_end(lua_State *L, int vref) {
    if (vref == LUA_NOREF) return;
    lua_rawgeti(L, LUA_REGISTRYINDEX, vref);
    int nv = (int)lua_objlen(L, -1);
    for (int i = 1; i <= nv; i++) {
        lua_rawgeti(L, -1, i);
        lei_codec_lua_array_end(L, -1);
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    luaL_unref(L, LUA_REGISTRYINDEX, vref);
}

/* lb_sink_event for a bytes sink: it reads the bytes itself and never
 * raises, so no protected call; they are checked first as a decode would
 * check them.  The sink stays pinned while it runs (b->sink_calls: a
 * handler may close its consumer). */
static int sink_bytes_event(lb_ctx *b, lb_sink *s, lua_State *L, lei_peer *from, uint32_t chid,
                            uint64_t producer, uint64_t seq, const uint8_t *p, size_t n) {
    const char *why;
    if (lei_codec_validate(p, n, &b->lim, &why)) {
        lei_logf(b->c, "bad event value from %s: %s", from ? lei_peer_addr(from) : "local", why);
        if (b->c) lei_ctx_refusal(b->c, why);
        return -1;
    }
    sink_args a;
    sink_args_init(&a, b, s, chid, from, producer, seq, p, n);
    a.ev.decode = sink_decode;
    int top = lua_gettop(L);
    b->sink_calls++;
    s->bytes(s, L, p, &a.ev);
    if (lua_gettop(L) != top) lua_settop(L, top);
    views_end(L, a.vref); /* decoded: its views end with the call (room: lb_sink_event) */
    if (--b->sink_calls == 0 && b->ref_sinks_held != LUA_NOREF) {
        luaL_unref(L, LUA_REGISTRYINDEX, b->ref_sinks_held);
        b->ref_sinks_held = LUA_NOREF;
    }
    return 0;
}

int lb_sink_event(lb_ctx *b, lei_peer *from, uint32_t chid, uint64_t producer, uint64_t seq,
                  uint64_t sync, const uint8_t *p, size_t n) {
    lb_sink *s = chid < b->nsinks ? b->sinks[chid] : NULL;
    lua_State *L = b->L;
    if (!s || sync || !L || !lua_checkstack(L, 6)) return LB_NO_SINK;
    if (s->bytes) return sink_bytes_event(b, s, L, from, chid, producer, seq, p, n);
    sink_args a;
    sink_args_init(&a, b, s, chid, from, producer, seq, p, n);
    const char *src = from ? lei_peer_addr(from) : "local";
    int rc = lb_calls_pcall(L, b, LB_CALL_SINK, &a);

    if (rc == LUA_ERRMEM || (rc && a.bad)) {
        lua_pop(L, 1);
        lua_gc(L, LUA_GCCOLLECT, 0);
        lua_pushstring(L, rc == LUA_ERRMEM ? "not enough memory" : "error");
    }
    if (rc) {
        const char *m = lua_tostring(L, -1);
        if (a.bad) {
            const char *why = rc == LUA_ERRMEM ? "out of memory decoding it" : (m ? m : "error");
            lei_logf(b->c, "bad event value from %s: %s", src, why);
            if (b->c) lei_ctx_refusal(b->c, why);
        } else {
            lei_logf(b->c, "error in callback: %s", m ? m : "(non-string error)");
        }
        lua_pop(L, 2);
        return a.bad ? -1 : 0;
    }
    lua_pop(L, 1);
    if (a.bad) {
        lei_logf(b->c, "bad event value from %s: %s", src, a.err);
        if (b->c) lei_ctx_refusal(b->c, a.err);
        return -1;
    }
    return 0;
}

void lb_sink_push_call(lua_State *L) {
    lua_pushcfunction(L, sink_call);
}
