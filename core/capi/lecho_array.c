/* lecho_array.c: lecho.h's arrays.  An array in the context's private state
 * is lecho.core's (a userdata holding a lei_array, core/base/array.h): made by
 * core.array_wrap, pointed here at the caller's memory, kept alive by its
 * environment ([1] = an owner userdata whose __gc calls the free function,
 * or nothing when lent). */
#include "lecho_int.h"
#include "array.h"

#include <stdint.h>
#include <string.h>

static const char *const DTYPES[] = {"<u1", "<i1", "<u2", "<i2", "<u4",
                                     "<i4", "<u8", "<i8", "<f4", "<f8"};
static const size_t SIZES[] = {1, 1, 2, 2, 4, 4, 8, 8, 4, 8};
#define OWNER_MT "lecho.capi.array_owner"

/* What a free function needs; the __gc of its userdata calls it once. */
typedef struct owner {
    lecho_free_fn fn; /* NULL until the array is made (a failure leaves data the caller's) */
    void *data, *ud;
} owner;

static int owner_gc(lua_State *L) {
    owner *o = lua_touserdata(L, 1);
    lecho_free_fn fn = o->fn;
    o->fn = NULL;
    if (fn) fn(o->data, o->ud);
    return 0;
}

struct arr_op {
    struct op o; /* first: lei_lecho_protect hands this back */
    int dt, ndim;
    const size_t *shape;
    const void *data;
    lecho_free_fn fn;
    void *ud;
    lecho_array_info *info;
};

/* Pushes lecho.core's function `name`. */
static void core_fn(lua_State *L, const char *name) {
    lua_getglobal(L, "require");
    lua_pushliteral(L, "lecho.core");
    lua_call(L, 1, 1);
    lua_getfield(L, -1, name);
    lua_remove(L, -2);
}

/* The array at idx, or NULL. */
static lei_array *to_array(lua_State *L, int idx) {
    lei_array *a = lua_touserdata(L, idx);
    int same;
    if (!a || lua_islightuserdata(L, idx) || !lua_getmetatable(L, idx)) return NULL;
    luaL_getmetatable(L, LEI_ARRAY_MT);
    same = lua_rawequal(L, -1, -2);
    lua_pop(L, 2);
    return same ? a : NULL;
}

/* Row-major without gaps (array.c's lei_array_contiguous; liblecho does
 * not link the core). */
static int contiguous(const lei_array *a) {
    int64_t want = a->itemsize;
    if (a->count == 0) return 1;
    for (int d = a->ndim - 1; d >= 0; d--) {
        if (a->shape[d] != 1 && a->strides[d] != want) return 0;
        want *= a->shape[d];
    }
    return 1;
}

static int op_set_array(lua_State *L) {
    struct arr_op *a = lua_touserdata(L, 1);
    struct op *o = &a->o;
    owner *ow = NULL;
    int d;

    int box = lei_lecho_value_target(L, o, "lecho_set_array: the value is not a table");
    if (!box) return 0;
    core_fn(L, "array_wrap");
    if (a->fn) { /* the owner: its __gc frees data once nothing holds the array */
        ow = lua_newuserdata(L, sizeof *ow);
        ow->fn = NULL;
        ow->data = (void *)a->data;
        ow->ud = a->ud;
        if (luaL_newmetatable(L, OWNER_MT)) {
            lua_pushcfunction(L, owner_gc);
            lua_setfield(L, -2, "__gc");
        }
        lua_setmetatable(L, -2);
    } else
        lua_pushboolean(L, 0);
    lua_pushstring(L, DTYPES[a->dt]);
    lua_createtable(L, a->ndim, 0);
    for (d = 0; d < a->ndim; d++) {
        lua_pushnumber(L, (lua_Number)a->shape[d]);
        lua_rawseti(L, -2, d + 1);
    }
    lua_call(L, 3, 1);
    lei_array *arr = lua_touserdata(L, -1);
    arr->data = (uint8_t *)a->data;
    if (!a->fn) arr->flags |= LEI_AF_BORROWED;
    if (o->key)
        lua_rawset(L, -3);
    else
        lua_rawseti(L, box, 1);
    if (ow) ow->fn = a->fn; /* made and stored: from now on the array owns data */
    return 0;
}

int lecho_set_array(lecho_value *v, const char *key, const char *dtype, int ndim,
                    const size_t *shape, const void *data, lecho_free_fn free_fn, void *ud) {
    struct arr_op a;
    int dt = -1, d;
    uint64_t count = 1;
    if (!v) return LECHO_EINVAL;
    memset(&a, 0, sizeof a);
    for (d = 0; dtype && d < (int)(sizeof DTYPES / sizeof DTYPES[0]); d++)
        if (strcmp(dtype, DTYPES[d]) == 0) dt = d;
    if (dt < 0) return lei_lecho_fail(v->h.ctx, LECHO_EINVAL, "lecho_set_array: unknown dtype");
    if (ndim < 0 || ndim > LECHO_ARRAY_MAXDIM || (ndim > 0 && !shape))
        return lei_lecho_fail(v->h.ctx, LECHO_EINVAL, "lecho_set_array: ndim must be 0..8, with a shape");
    for (d = 0; d < ndim; d++) {
        if (shape[d] > ((uint64_t)1 << 50) || (count && shape[d] && count > (((uint64_t)1 << 50) / shape[d])))
            return lei_lecho_fail(v->h.ctx, LECHO_EINVAL, "lecho_set_array: shape too large");
        count *= shape[d];
    }
    if (count && !data) return lei_lecho_fail(v->h.ctx, LECHO_EINVAL, "lecho_set_array: data is NULL");
    a.dt = dt;
    a.ndim = ndim;
    a.shape = shape;
    a.data = data;
    a.fn = free_fn;
    a.ud = ud;
    a.o.a = v;
    a.o.key = key;
    return lei_lecho_protect(v->h.ctx, op_set_array, &a.o);
}

/* What lecho.h tells of a contiguous array: *out filled from arr (data
 * NULL when it has no elements; shape past ndim zeroed). */
static void info_of(const lei_array *arr, lecho_array_info *out) {
    out->data = arr->count ? arr->data : NULL;
    out->dtype = DTYPES[arr->dtype];
    out->ndim = arr->ndim;
    for (int d = 0; d < LECHO_ARRAY_MAXDIM; d++) out->shape[d] = d < arr->ndim ? (size_t)arr->shape[d] : 0;
    out->count = (size_t)arr->count;
    out->itemsize = SIZES[arr->dtype];
}

static int op_get_array(lua_State *L) {
    struct arr_op *a = lua_touserdata(L, 1);
    struct op *o = &a->o;
    lei_lecho_value_push_slot(L, o->a);
    if (o->key) {
        if (lua_istable(L, -1)) {
            lua_pushstring(L, o->key);
            lua_rawget(L, -2);
        } else
            lua_pushnil(L);
    }
    if (lua_isnil(L, -1)) {
        o->rc = LECHO_ENOTFOUND;
        return 0;
    }
    lei_array *arr = to_array(L, -1);
    if (!arr) {
        o->rc = LECHO_EINVAL;
        return 0;
    }
    if (!contiguous(arr)) { /* a box or stride view made in Lua */
        o->rc = lei_lecho_fail(o->x, LECHO_EINVAL, "lecho_get_array: a strided view (copy it in Lua first)");
        return 0;
    }
    /* received in place at an odd offset: moved once into its own memory */
    if (arr->data && (uintptr_t)arr->data % (uintptr_t)arr->itemsize && (arr->flags & LEI_AF_VIEW)) {
        int idx = lua_gettop(L);
        core_fn(L, "array_keep");
        lua_pushvalue(L, idx);
        lua_call(L, 1, 0);
    }
    info_of(arr, a->info);
    return 0;
}

int lecho_get_array(const lecho_value *v, const char *key, lecho_array_info *out) {
    struct arr_op a;
    if (!v || !out) return LECHO_EINVAL;
    if (v->bp || v->cb) { /* a sink's event in its bytes, or a value built in C: read in place */
        int rc = lei_lecho_value_bytes_array(v, key, out);
        if (rc >= 0) return rc;
    }
    memset(&a, 0, sizeof a);
    a.info = out;
    a.o.a = v;
    a.o.key = key;
    return lei_lecho_protect(v->h.ctx, op_get_array, &a.o);
}

/* For lecho_nodes: when the value at idx is an array, fills *out and
 * returns 1 (0: not an array; -1: a strided view, with lecho_errmsg).  A
 * received view (into the read buffer, valid while its dispatch runs) gets
 * its own copy first (core.array_keep, once), so the data stays valid as
 * long as the array is held, whoever holds it. */
int lei_lecho_array_node(lecho_ctx *x, lua_State *L, int idx, lecho_array_info *out) {
    lei_array *arr = to_array(L, idx);
    if (!arr) return 0;
    if (!contiguous(arr)) {
        lei_lecho_fail(x, LECHO_EINVAL, "lecho_nodes: a strided array view (copy it in Lua first)");
        return -1;
    }
    if (arr->data && (arr->flags & LEI_AF_VIEW)) {
        core_fn(L, "array_keep");
        lua_pushvalue(L, idx);
        lua_call(L, 1, 0);
    }
    info_of(arr, out);
    return 1;
}
