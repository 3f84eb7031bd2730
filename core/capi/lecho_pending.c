/* lecho_pending.c: a submit_sync or a call started without waiting for it
 * (lecho_submit_sync_start, lecho_call_start), for callers whose own event
 * loop must not block: an asyncio loop (Python's binding), a GUI's.  The
 * event leaves (or the call's request is queued) at once; the wait is a
 * coroutine of the Lua context (lecho.capi submit_sync_start/call_start)
 * that the loop calls (lecho_run_once) carry; the caller reads the value
 * handle it got, a table whose "done" turns true with the outcome. */
#include "lecho_int.h"
#include <math.h>

/* Leaves in o->i the ref of a value box holding the glue's table. */
static int op_start(lua_State *L) {
    struct op *o = lua_touserdata(L, 1);
    int b, nargs;
    if (o->kind == 0) { /* submit_sync */
        lei_lecho_push_ref(L, ((const lecho_producer *)o->a)->h.ref);
        lei_lecho_value_push_slot(L, o->b);
        lua_pushnumber(L, o->d);
        nargs = 3;
    } else { /* call */
        lei_lecho_push_call(L, o);
        nargs = 4;
    }
    if ((o->rc = lei_lecho_glue_call(L, o->x, o->kind == 0 ? "submit_sync_start" : "call_start", nargs,
                                   &b)) != 0)
        return 0;
    lua_createtable(L, 1, 0);
    lua_pushvalue(L, b); /* the glue's table */
    lua_rawseti(L, -2, 1);
    o->i = luaL_ref(L, LUA_REGISTRYINDEX);
    return 0;
}

/* A new value handle from op_start, or the code (with lecho_errmsg). */
static int start(lecho_ctx *x, struct op *o, lecho_value **pending) {
    lecho_value *v = lei_lecho_h_new(x, sizeof *v, H_VALUE);
    if (!v) return lei_lecho_fail(x, LECHO_ENOMEM, "out of memory");
    o->i = LUA_NOREF;
    int rc = lei_lecho_protect(x, op_start, o);
    if (rc != 0 || o->i == LUA_NOREF) {
        if (o->i != LUA_NOREF) luaL_unref(x->L, LUA_REGISTRYINDEX, o->i);
        lei_lecho_h_free(&v->h);
        return rc ? rc : lei_lecho_fail(x, LECHO_EFAILED, "lecho: start failed");
    }
    v->h.ref = o->i;
    *pending = v;
    return 0;
}

int lecho_submit_sync_start(lecho_producer *p, const lecho_value *ev, double timeout,
                            lecho_value **pending) {
    if (pending) *pending = NULL;
    if (!p || !ev || !pending || ev->h.ctx != p->h.ctx) return LECHO_EINVAL;
    lecho_ctx *x = p->h.ctx;
    if (x->in_handler)
        return lei_lecho_fail(x, LECHO_EINVAL, "lecho_submit_sync_start: not from a consumer handler");
    if (isnan(timeout)) return lei_lecho_fail(x, LECHO_EINVAL, "lecho_submit_sync_start: timeout is NaN (a number of seconds, or < 0)");
    struct op o = { .x = x, .a = p, .b = ev, .kind = 0, .d = timeout };
    return start(x, &o, pending);
}

int lecho_call_start(lecho_ctx *x, const char *name, const lecho_value *args,
                     const lecho_value *opts, lecho_value **pending) {
    if (pending) *pending = NULL;
    if (!x || !name || !pending || (args && args->h.ctx != x) || (opts && opts->h.ctx != x))
        return LECHO_EINVAL;
    if (x->in_handler) return lei_lecho_fail(x, LECHO_EINVAL, "lecho_call_start: not from a handler");
    struct op o = { .x = x, .s = name, .a = args, .b = opts, .kind = 1 };
    return start(x, &o, pending);
}
