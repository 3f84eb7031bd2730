/* lecho_recorder.c: recordings from C (lecho.h, doc/c-api.md): a
 * producer's own recording to a file (lecho_producer_record), and a
 * recorder several producers share (lecho_recorder_open,
 * lecho_producer_record_to, lecho_recorder_flush, lecho_recorder_stats,
 * lecho_recorder_close).  Each is one protected call into lecho.capi
 * (producer_record, recorder_*), which calls lecho.recorder; the writer
 * thread and the file format are the Lua layer's (doc/recording.md).  A
 * recorder handle (struct lecho_recorder, lecho_int.h) is owned by its
 * context, as every handle is, until lecho_recorder_close or lecho_close.
 */
#include "lecho_int.h"

static int op_record(lua_State *L) {
    struct op *o = lua_touserdata(L, 1);
    lei_lecho_push_ref(L, ((const struct lei_h *)o->a)->ref);
    if (o->key)
        lua_pushstring(L, o->key);
    else
        lua_pushnil(L);
    o->rc = lei_lecho_glue_call(L, o->x, "producer_record", 2, NULL);
    return 0;
}

int lecho_producer_record(lecho_producer *p, const char *path) {
    if (!p) return LECHO_EINVAL;
    struct op o = { .a = p, .key = path };
    return lei_lecho_protect(p->h.ctx, op_record, &o);
}

/* ---- recorders (lecho.recorder) ---- */

static int op_recorder_open(lua_State *L) {
    struct op *o = lua_touserdata(L, 1);
    lei_lecho_push_ref(L, o->x->self);
    lua_pushstring(L, o->s);
    lei_lecho_value_push_opt(L, o->b);
    int b;
    if ((o->rc = lei_lecho_glue_call(L, o->x, "recorder_open", 3, &b)) != 0) return 0;
    lua_pushvalue(L, b);
    o->i = luaL_ref(L, LUA_REGISTRYINDEX);
    return 0;
}

int lecho_recorder_open(lecho_ctx *x, const char *path, const lecho_value *opts, lecho_recorder **out) {
    if (out) *out = NULL;
    if (!x || !out) return LECHO_EINVAL;
    if (!path) return lei_lecho_fail(x, LECHO_EINVAL, "lecho_recorder_open: no path");
    if (x->in_handler) return lei_lecho_fail(x, LECHO_EINVAL, "lecho_recorder_open: not from a consumer handler");
    lecho_recorder *r = lei_lecho_h_new(x, sizeof *r, H_RECORDER);
    if (!r) return lei_lecho_fail(x, LECHO_ENOMEM, "out of memory");
    struct op o = { .s = path, .b = opts };
    int rc = lei_lecho_protect(x, op_recorder_open, &o);
    if (rc != 0) {
        lei_lecho_h_free(&r->h);
        return rc;
    }
    r->h.ref = o.i;
    *out = r;
    return 0;
}

static int op_record_to(lua_State *L) {
    struct op *o = lua_touserdata(L, 1);
    lei_lecho_push_ref(L, ((const struct lei_h *)o->a)->ref);
    if (o->b)
        lei_lecho_push_ref(L, ((const struct lei_h *)o->b)->ref);
    else
        lua_pushnil(L);
    o->rc = lei_lecho_glue_call(L, o->x, "producer_record", 2, NULL);
    return 0;
}

int lecho_producer_record_to(lecho_producer *p, lecho_recorder *r) {
    if (!p || (r && r->h.ctx != p->h.ctx)) return p ? lei_lecho_fail(p->h.ctx, LECHO_EINVAL,
        "lecho_producer_record_to: a recorder of another context") : LECHO_EINVAL;
    struct op o = { .a = p, .b = r };
    return lei_lecho_protect(p->h.ctx, op_record_to, &o);
}

/* o->s: the glue's function, on the recorder o->a and the number o->d
 * (flush's fsync); a table result is kept as a value (o->i), as for stats. */
static int op_recorder(lua_State *L) {
    struct op *o = lua_touserdata(L, 1);
    lei_lecho_push_ref(L, ((const struct lei_h *)o->a)->ref);
    lua_pushboolean(L, o->d != 0);
    int b;
    if ((o->rc = lei_lecho_glue_call(L, o->x, o->s, 2, &b)) != 0) return 0;
    lua_createtable(L, 1, 0);
    lua_pushvalue(L, b);
    lua_rawseti(L, -2, 1);
    o->i = luaL_ref(L, LUA_REGISTRYINDEX);
    return 0;
}

int lecho_recorder_flush(lecho_recorder *r, int fsync) {
    if (!r) return LECHO_EINVAL;
    struct op o = { .a = r, .s = "recorder_flush", .d = fsync };
    int rc = lei_lecho_protect(r->h.ctx, op_recorder, &o);
    if (rc == 0) luaL_unref(r->h.ctx->L, LUA_REGISTRYINDEX, o.i);
    return rc;
}

lecho_value *lecho_recorder_stats(lecho_recorder *r) {
    if (!r) return NULL;
    struct op o = { .a = r, .s = "recorder_stats" };
    return lei_lecho_value_from(r->h.ctx, op_recorder, &o);
}

lecho_value *lecho_recorder_close(lecho_recorder *r) {
    if (!r) return NULL;
    struct op o = { .a = r, .s = "recorder_close" };
    lecho_value *st = lei_lecho_value_from(r->h.ctx, op_recorder, &o);
    lei_lecho_h_free(&r->h);
    return st;
}
