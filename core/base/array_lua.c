/* array_lua.c: the array operations for Lua (array.h, lei_array_lua_ops):
 * in the main state through lecho.core (lua/lecho/array.lua), in a
 * modulator's state as `array` and as the arrays' methods, where each looks
 * at the MOE's stop flag (its CPU-budget timer) between chunks of
 * LEI_ARRAY_CHUNK elements, and whatever it makes is allocated in that
 * state (its memory cap).  Costs per element: doc/modulators.md.
 */
#include "array.h"
#include "array_zip.h"

#include <lauxlib.h>
#include <lua.h>

#include <string.h>

#define STOP(L) ((volatile sig_atomic_t *)lua_touserdata(L, lua_upvalueindex(1)))

static lei_array *arg_array(lua_State *L, int i) {
    lei_array *a = lei_codec_lua_array_check(L, i);
    if (!a) luaL_typerror(L, i, "lecho.array");
    if (a->flags & LEI_AF_ENDED)
        luaL_error(L, "lecho.array: this array was a view into a received event whose handler has returned: "
                      "its bytes are gone (call a:keep() or a:copy() inside the handler to hold it longer)");
    return a;
}

static void stopped(lua_State *L) { luaL_error(L, "CPU budget exceeded"); }

/* Per dimension: t[d+1] of a table at i, or the number at i for all dims,
 * or def when absent. */
static void per_dim(lua_State *L, int i, int nd, int64_t def, int64_t *out, const char *what) {
    int d;
    for (d = 0; d < nd; d++) {
        double x;
        if (lua_isnoneornil(L, i)) {
            out[d] = def;
            continue;
        }
        if (lua_type(L, i) == LUA_TNUMBER) {
            x = lua_tonumber(L, i);
        } else {
            luaL_checktype(L, i, LUA_TTABLE);
            lua_rawgeti(L, i, d + 1);
            if (lua_isnil(L, -1)) {
                lua_pop(L, 1);
                out[d] = def;
                continue;
            }
            x = lua_tonumber(L, -1);
            lua_pop(L, 1);
        }
        if (!(x >= -4e18 && x <= 4e18) || x != (double)(int64_t)x)
            luaL_error(L, "lecho.array: %s must be integers (dimension %d)", what, d + 1);
        out[d] = (int64_t)x;
    }
}

static int op_dtype(lua_State *L) {
    lua_pushstring(L, lei_dtype_name(arg_array(L, 1)->dtype));
    return 1;
}

static int op_shape(lua_State *L) {
    lei_array *a = arg_array(L, 1);
    int d;
    lua_createtable(L, a->ndim, 0);
    for (d = 0; d < a->ndim; d++) {
        lua_pushnumber(L, (lua_Number)a->shape[d]);
        lua_rawseti(L, -2, d + 1);
    }
    return 1;
}

static int op_ndim(lua_State *L) {
    lua_pushinteger(L, arg_array(L, 1)->ndim);
    return 1;
}

static int op_count(lua_State *L) {
    lua_pushnumber(L, (lua_Number)arg_array(L, 1)->count);
    return 1;
}

/* get(a, i, j, ...): the element (indices from 0) as a number */
static int op_get(lua_State *L) {
    lei_array *a = arg_array(L, 1);
    int64_t off = 0;
    int d;
    if (lua_gettop(L) - 1 != a->ndim)
        luaL_error(L, "lecho.array: %d indices for %d dimensions", lua_gettop(L) - 1, a->ndim);
    for (d = 0; d < a->ndim; d++) {
        double x = luaL_checknumber(L, d + 2);
        if (!(x >= 0 && x < (double)a->shape[d]) || x != (double)(int64_t)x)
            luaL_error(L, "lecho.array: index out of range in dimension %d", d + 1);
        off += (int64_t)x * a->strides[d];
    }
    lua_pushnumber(L, lei_array_load(a->dtype, a->data + off));
    return 1;
}

/* stats(a) -> min, max, sum, mean (as doubles; NaN skipped by min, max) */
static int op_stats(lua_State *L) {
    lei_array_stats st;
    if (lei_array_stats_of(arg_array(L, 1), &st, STOP(L))) stopped(L);
    lua_pushnumber(L, st.min);
    lua_pushnumber(L, st.max);
    lua_pushnumber(L, st.sum);
    lua_pushnumber(L, st.mean);
    return 4;
}

static int one_stat(lua_State *L, int which) {
    lei_array_stats st;
    if (lei_array_stats_of(arg_array(L, 1), &st, STOP(L))) stopped(L);
    lua_pushnumber(L, which == 0 ? st.min : which == 1 ? st.max : which == 2 ? st.sum : st.mean);
    return 1;
}
static int op_min(lua_State *L) { return one_stat(L, 0); }
static int op_max(lua_State *L) { return one_stat(L, 1); }
static int op_sum(lua_State *L) { return one_stat(L, 2); }
static int op_mean(lua_State *L) { return one_stat(L, 3); }

/* box(a, start, count, step) -> a view (no copy): per dim count[d]
 * elements from start[d] (from 0), every step[d]-th.  A number stands for
 * every dim; count defaults to all that fit, start to 0, step to 1. */
static int op_box(lua_State *L) {
    lei_array *a = arg_array(L, 1), b;
    int64_t start[LEI_ARRAY_MAXDIM], count[LEI_ARRAY_MAXDIM], step[LEI_ARRAY_MAXDIM];
    int d;
    per_dim(L, 2, a->ndim, 0, start, "start");
    per_dim(L, 4, a->ndim, 1, step, "step");
    per_dim(L, 3, a->ndim, -1, count, "count");
    for (d = 0; d < a->ndim; d++)
        if (count[d] == -1 && step[d] >= 1 && start[d] >= 0 && start[d] <= a->shape[d])
            count[d] = (a->shape[d] - start[d] + step[d] - 1) / step[d];
    if (lei_array_box(a, start, count, step, &b))
        luaL_error(L, "lecho.array.box: the box does not fit inside the array");
    lei_codec_lua_array_view(L, 1, &b); /* a view of the array at 1 */
    return 1;
}

/* reduce(a, k, op) -> a new <f8 array: op ("mean" default, "min", "max",
 * "sum") over blocks of k[d] elements per dim (a number: every dim; a
 * trailing partial block counts) */
static int op_reduce(lua_State *L) {
    static const char *const ops[] = {"mean", "min", "max", "sum", NULL};
    lei_array *a = arg_array(L, 1), hdr, *out;
    int64_t k[LEI_ARRAY_MAXDIM];
    int op = luaL_checkoption(L, 3, "mean", ops);
    per_dim(L, 2, a->ndim, 1, k, "block sizes");
    hdr.data = NULL;
    if (lei_array_reduce_shape(a, k, &hdr)) luaL_error(L, "lecho.array.reduce: block sizes must be >= 1");
    /* allocated in this state: a modulator's memory cap refuses a huge one */
    out = lei_codec_lua_array_push(L, LEI_DT_F8, hdr.ndim, hdr.shape, (size_t)hdr.count * 8, 0);
    if (lei_array_reduce(a, k, op, out, STOP(L))) stopped(L);
    return 1;
}

/* copy(a) -> a new contiguous array with a's elements */
static int op_copy(lua_State *L) {
    lei_array *a = arg_array(L, 1), *c;
    c = lei_codec_lua_array_push(L, a->dtype, a->ndim, a->shape, (size_t)a->count * (size_t)a->itemsize, 0);
    if (lei_array_gather(a, c->data, STOP(L))) stopped(L);
    return 1;
}

/* new(dtype, shape) -> a zeroed array, allocated in this state (a
 * modulator's memory cap refuses a huge one) */
static int op_new(lua_State *L) {
    size_t n;
    const char *s = luaL_checklstring(L, 1, &n);
    int dt = lei_dtype_parse(s, n), nd, d;
    int64_t shape[LEI_ARRAY_MAXDIM];
    uint64_t count, bytes;
    if (dt < 0) luaL_argerror(L, 1, "unknown dtype");
    luaL_checktype(L, 2, LUA_TTABLE);
    nd = (int)lua_objlen(L, 2);
    if (nd > LEI_ARRAY_MAXDIM) luaL_argerror(L, 2, "more than 8 dimensions");
    per_dim(L, 2, nd, 0, shape, "dims");
    for (d = 0; d < nd; d++)
        if (shape[d] < 0) luaL_argerror(L, 2, "dims must be >= 0");
    if (lei_shape_bytes(shape, nd, lei_dtype_size(dt), &count, &bytes) || bytes > LEI_ARRAY_UD_MAX)
        luaL_argerror(L, 2, "shape too large");
    lei_codec_lua_array_push(L, dt, nd, shape, (size_t)bytes, 1);
    return 1;
}

/* set(a, i, j, ..., x): stores x (converted to the dtype) at the indices */
static int op_set(lua_State *L) {
    lei_array *a = arg_array(L, 1);
    int64_t off = 0;
    int d, n = lua_gettop(L) - 2;
    double x = luaL_checknumber(L, lua_gettop(L));
    if (n != a->ndim) luaL_error(L, "lecho.array: %d indices for %d dimensions", n, a->ndim);
    if (a->flags & LEI_AF_READONLY) luaL_error(L, "lecho.array: read-only");
    for (d = 0; d < a->ndim; d++) {
        double i = luaL_checknumber(L, d + 2);
        if (!(i >= 0 && i < (double)a->shape[d]) || i != (double)(int64_t)i)
            luaL_error(L, "lecho.array: index out of range in dimension %d", d + 1);
        off += (int64_t)i * a->strides[d];
    }
    lei_array_store(a->dtype, a->data + off, x);
    return 0;
}

static int check_dt(lua_State *L, int i, const char *def) {
    size_t n;
    const char *s = luaL_optlstring(L, i, def, &n);
    int dt = lei_dtype_parse(s, n);
    if (dt < 0) luaL_argerror(L, i, "unknown dtype");
    return dt;
}

static int convert(lua_State *L, lei_array *a, int dt, int mode, double scale, double offset) {
    lei_array *out;
    if (!(scale == scale) || scale == 0 || !(offset == offset))
        luaL_error(L, "lecho.array: scale must be a number other than 0, offset a number");
    out = lei_codec_lua_array_push(L, dt, a->ndim, a->shape, (size_t)a->count * lei_dtype_size(dt), 0);
    if (lei_array_convert(a, out, mode, scale, offset, STOP(L))) stopped(L);
    return 1;
}

/* quantize(a, dtype [, scale, offset]) -> round((x - offset) / scale) as
 * dtype (an integer dtype: clamped to its range, NaN -> 0); "<f4" with
 * neither: f64 -> f32 */
static int op_quantize(lua_State *L) {
    lei_array *a = arg_array(L, 1);
    int dt = check_dt(L, 2, NULL);
    return convert(L, a, dt, LEI_CONV_QUANTIZE, luaL_optnumber(L, 3, 1), luaL_optnumber(L, 4, 0));
}

/* dequantize(q, scale, offset [, dtype]) -> q * scale + offset as dtype
 * ("<f8" by default): quantize's inverse, within scale / 2 */
static int op_dequantize(lua_State *L) {
    lei_array *a = arg_array(L, 1);
    double scale = luaL_checknumber(L, 2), offset = luaL_checknumber(L, 3);
    return convert(L, a, check_dt(L, 4, "<f8"), LEI_CONV_RESTORE, scale, offset);
}

static lei_array *arg_flat(lua_State *L, int i, int writable) {
    lei_array *a = arg_array(L, i);
    if (!lei_array_contiguous(a)) luaL_argerror(L, i, "a box or stride view (copy it first)");
    if (writable && (a->flags & LEI_AF_READONLY)) luaL_argerror(L, i, "read-only");
    return a;
}

/* delta(cur, ref, threshold) -> idx, vals: the flat indices (<u4, or <u8
 * past 2^32 elements) and the values (cur's dtype) of the elements that
 * moved by more than threshold from ref; ref takes them (it is then what
 * the receiver rebuilds with patch) */
static int op_delta(lua_State *L) {
    lei_array *cur = arg_flat(L, 1, 0), *ref = arg_flat(L, 2, 1), *idx, *vals;
    double th = luaL_checknumber(L, 3);
    int64_t n;
    if (cur->count != ref->count) luaL_error(L, "lecho.array.delta: %lld elements against %lld",
                                             (long long)cur->count, (long long)ref->count);
    if ((n = lei_array_delta_count(cur, ref, th, STOP(L))) < 0) stopped(L);
    int idt = cur->count > 4294967295LL ? LEI_DT_U8 : LEI_DT_U4;
    idx = lei_codec_lua_array_push(L, idt, 1, &n, (size_t)n * lei_dtype_size(idt), 0);
    vals = lei_codec_lua_array_push(L, cur->dtype, 1, &n, (size_t)n * (size_t)cur->itemsize, 0);
    if (lei_array_delta(cur, ref, th, idx, vals, STOP(L))) stopped(L);
    return 2;
}

/* patch(ref, idx, vals) -> ref: vals written at the flat indices idx
 * (delta's inverse); an index out of range, counts that differ or a dtype
 * other than ref's raise, ref untouched */
static int op_patch(lua_State *L) {
    lei_array *ref = arg_flat(L, 1, 1), *idx = arg_flat(L, 2, 0), *vals = arg_flat(L, 3, 0);
    if (idx->dtype >= LEI_DT_F4) luaL_argerror(L, 2, "integer indices expected");
    if (lei_array_patch(ref, idx, vals))
        luaL_error(L, "lecho.array.patch: an index out of range, counts that differ or another dtype");
    lua_settop(L, 1);
    return 1;
}


/* cat(list, dim) -> a new array: the arrays of list (same dtype and ndim,
 * the same dims but dim, from 1) one after another along dim.  Each piece
 * that is a box or stride view is copied first (in this state). */
static int op_cat(lua_State *L) {
    int n, i, d, dim, nd;
    lei_array *first, *out, *pc[64];
    int64_t shape[LEI_ARRAY_MAXDIM], outer = 1, isz;
    uint8_t *dst;
    luaL_checktype(L, 1, LUA_TTABLE);
    n = (int)lua_objlen(L, 1);
    if (n < 1 || n > 64) luaL_argerror(L, 1, "a list of 1 to 64 arrays");
    lua_settop(L, 2);
    for (i = 1; i <= n; i++) lua_rawgeti(L, 1, i); /* pieces at 3 .. n+2 */
    first = arg_array(L, 3);
    nd = first->ndim;
    dim = (int)luaL_optinteger(L, 2, 1);
    if (dim < 1 || dim > nd) luaL_argerror(L, 2, "a dimension of the arrays (from 1)");
    dim--;
    for (d = 0; d < nd; d++) shape[d] = d == dim ? 0 : first->shape[d];
    for (i = 0; i < n; i++) {
        lei_array *a = arg_array(L, 3 + i);
        if (a->dtype != first->dtype || a->ndim != nd)
            luaL_error(L, "lecho.array.cat: piece %d is %s with %d dims, piece 1 %s with %d", i + 1,
                       lei_dtype_name(a->dtype), a->ndim, lei_dtype_name(first->dtype), nd);
        for (d = 0; d < nd; d++)
            if (d != dim && a->shape[d] != first->shape[d])
                luaL_error(L, "lecho.array.cat: piece %d differs from piece 1 in dimension %d", i + 1, d + 1);
        if (__builtin_add_overflow(shape[dim], a->shape[dim], &shape[dim]))
            luaL_error(L, "lecho.array.cat: too many elements");
        if (!lei_array_contiguous(a)) { /* a copy, in place of the view */
            lei_array *c = lei_codec_lua_array_push(L, a->dtype, nd, a->shape, (size_t)a->count * (size_t)a->itemsize, 0);
            if (lei_array_gather(a, c->data, STOP(L))) stopped(L);
            lua_replace(L, 3 + i);
            a = c;
        }
        pc[i] = a;
    }
    for (d = 0; d < dim; d++) outer *= shape[d];
    isz = first->itemsize;
    {
        uint64_t count, bytes;
        if (lei_shape_bytes(shape, nd, (unsigned)isz, &count, &bytes) || bytes > LEI_ARRAY_UD_MAX)
            luaL_error(L, "lecho.array.cat: too many elements");
        out = lei_codec_lua_array_push(L, first->dtype, nd, shape, (size_t)bytes, 0);
    }
    dst = out->data;
    if (!out->count) return 1;
    /* piece i's o-th block (its dims from dim on) is contiguous */
    for (int64_t o = 0; o < outer; o++) {
        if (STOP(L) && *STOP(L)) stopped(L);
        for (i = 0; i < n; i++) {
            int64_t blk = pc[i]->count / outer * isz;
            if (blk) memcpy(dst, pc[i]->data + o * blk, (size_t)blk);
            dst += blk;
        }
    }
    return 1;
}

/* ---- compression (array_zip.c): every buffer, the codecs' working memory
 * included, is a userdata of this state (a modulator's memory cap counts
 * it; a huge one is refused before any work), freed by the collector. ---- */

static uint8_t *scratch(lua_State *L, size_t n) {
    if (n > LEI_ARRAY_UD_MAX) luaL_error(L, "lecho.array: %zu bytes of working memory: too many", n);
    return lua_newuserdata(L, n ? n : 1);
}

/* a's elements, contiguous and aligned to their size: a itself, or a copy
 * (allocated here) pushed on the stack */
static lei_array *flat_aligned(lua_State *L, lei_array *a) {
    lei_array *c;
    if (lei_array_contiguous(a) && ((uintptr_t)a->data % (uintptr_t)a->itemsize) == 0) return a;
    c = lei_codec_lua_array_push(L, a->dtype, a->ndim, a->shape, (size_t)a->count * (size_t)a->itemsize, 0);
    if (lei_array_gather(a, c->data, STOP(L))) stopped(L);
    return c;
}

/* The result: a <u1 array of len bytes at out (allocated with cap bytes);
 * copied to one of its size when it would waste more than half. */
static void zip_result(lua_State *L, lei_array *out, size_t len, size_t cap) {
    if (len < cap / 2) {
        int64_t n = (int64_t)len;
        lei_array *r = lei_codec_lua_array_push(L, LEI_DT_U1, 1, &n, len, 0);
        if (len) memcpy(r->data, out->data, len);
        return;
    }
    out->shape[0] = out->count = (int64_t)len;
}

static void zip_fail(lua_State *L, int rc, const char *err) {
    if (rc == LEI_ZIP_STOPPED) stopped(L);
    luaL_error(L, "lecho.array.%s", err);
}

/* zstd(a [, level 3]) -> a <u1 array: a compressed without loss (header:
 * array_zip.h); its inverse is unzstd */
static int op_zstd(lua_State *L) {
    lei_array *a = arg_array(L, 1), *out;
    int level = (int)luaL_optinteger(L, 2, 3), rc;
    size_t n = (size_t)a->count * (size_t)a->itemsize, wn, cap, len = 0;
    char err[160];
    void *work;
    /* above 9 a 128 KiB block takes zstd tens of ms (70 at 19): the stop
     * flag would wait that long */
    if (level < 1 || level > 9) luaL_argerror(L, 2, "a zstd level from 1 to 9");
    if (!lei_array_contiguous(a)) a = flat_aligned(L, a); /* zstd reads bytes: any alignment */
    wn = lei_zstd_cwork(level, n);
    work = scratch(L, wn);
    cap = lei_zstd_bound(a);
    if (cap > LEI_ARRAY_UD_MAX) luaL_error(L, "lecho.array.zstd: %zu bytes: too many", n);
    int64_t c64 = (int64_t)cap;
    out = lei_codec_lua_array_push(L, LEI_DT_U1, 1, &c64, cap, 0);
    if ((rc = lei_zstd_pack(a, level, work, wn, out->data, cap, &len, STOP(L), err, sizeof err))) zip_fail(L, rc, err);
    zip_result(L, out, len, cap);
    return 1;
}

/* zfp(a, tolerance) -> a <u1 array: a (<f4 or <f8) compressed by ZFP in
 * fixed-accuracy mode, every element within tolerance of a's; unzfp */
static int op_zfp(lua_State *L) {
    lei_array *a = arg_array(L, 1), *out;
    double tol = luaL_checknumber(L, 2);
    size_t sn, hlen, cap, len = 0;
    char err[200];
    uint8_t *sc;
    int rc;
    if (lei_zfp_plan(a->dtype, a->ndim, a->shape, tol, &sn, &hlen))
        luaL_error(L, "lecho.array.zfp: <f4 or <f8 arrays and a tolerance > 0 only (got %s, %f)",
                   lei_dtype_name(a->dtype), tol);
    a = flat_aligned(L, a);
    sc = scratch(L, sn);
    /* its bytes, and a few blocks more for a tiny array */
    cap = hlen + (size_t)a->count * (size_t)a->itemsize + 1024;
    if (cap > LEI_ARRAY_UD_MAX) luaL_error(L, "lecho.array.zfp: too many bytes");
    int64_t c64 = (int64_t)cap;
    out = lei_codec_lua_array_push(L, LEI_DT_U1, 1, &c64, cap, 0);
    if ((rc = lei_zfp_pack(a, tol, sc, sn, out->data, cap, &len, STOP(L), err, sizeof err))) zip_fail(L, rc, err);
    zip_result(L, out, len, cap);
    return 1;
}

/* The compressed bytes at i: a string or a contiguous <u1 / <i1 array */
static const uint8_t *arg_bytes(lua_State *L, int i, size_t *n) {
    lei_array *a;
    if (lua_type(L, i) == LUA_TSTRING) return (const uint8_t *)lua_tolstring(L, i, n);
    a = arg_array(L, i);
    if (a->itemsize != 1 || !lei_array_contiguous(a)) luaL_argerror(L, i, "a <u1 array or a string expected");
    *n = (size_t)a->count;
    return a->data;
}

/* unzip(z [, kind]) -> the array z holds (zstd or zfp, by its header) */
static int unzip(lua_State *L, int kind) {
    size_t n, sn = 0;
    const uint8_t *p = arg_bytes(L, 1, &n);
    lei_zip_hdr h;
    lei_array *out;
    char err[200];
    int rc;
    void *work;
    if (lei_zip_parse(p, n, &h, err, sizeof err)) luaL_error(L, "lecho.array.unzip: %s", err);
    if (kind && h.kind != kind)
        luaL_error(L, "lecho.array.un%s: this holds a %s-compressed array", kind == LEI_ZIP_ZSTD ? "zstd" : "zfp",
                   h.kind == LEI_ZIP_ZSTD ? "zstd" : "zfp");
    if (h.kind == LEI_ZIP_ZSTD) {
        sn = lei_zstd_dwork();
    } else {
        size_t hlen;
        lei_zfp_plan(h.dtype, h.ndim, h.shape, h.tol, &sn, &hlen);
    }
    work = scratch(L, sn);
    /* the declared size, allocated first: a cap refuses it before any work */
    out = lei_codec_lua_array_push(L, h.dtype, h.ndim, h.shape, (size_t)h.bytes, 0);
    rc = h.kind == LEI_ZIP_ZSTD ? lei_zstd_unpack(p, n, &h, work, sn, out->data, STOP(L), err, sizeof err)
                                : lei_zfp_unpack(p, n, &h, work, sn, out->data, STOP(L), err, sizeof err);
    if (rc == LEI_ZIP_STOPPED) stopped(L);
    if (rc) luaL_error(L, "lecho.array.unzip: %s", err);
    return 1;
}
static int op_unzstd(lua_State *L) { return unzip(L, LEI_ZIP_ZSTD); }
static int op_unzfp(lua_State *L) { return unzip(L, LEI_ZIP_ZFP); }
static int op_unzip(lua_State *L) { return unzip(L, 0); }

static int op_len(lua_State *L) { return op_count(L); }

static int op_tostring(lua_State *L) {
    lei_array *a = arg_array(L, 1);
    char buf[200];
    int n = snprintf(buf, sizeof buf, "lecho.array %s [", lei_dtype_name(a->dtype)), d;
    for (d = 0; d < a->ndim && n < 150; d++)
        n += snprintf(buf + n, sizeof buf - (size_t)n, "%s%lld", d ? "," : "", (long long)a->shape[d]);
    snprintf(buf + n, sizeof buf - (size_t)n, "]");
    lua_pushstring(L, buf);
    return 1;
}

static const luaL_Reg OPS[] = {{"dtype", op_dtype}, {"shape", op_shape}, {"ndim", op_ndim},
                               {"count", op_count}, {"get", op_get},     {"stats", op_stats},
                               {"min", op_min},     {"max", op_max},     {"sum", op_sum},
                               {"mean", op_mean},   {"box", op_box},     {"reduce", op_reduce},
                               {"copy", op_copy},   {"new", op_new},     {"set", op_set},
                               {"quantize", op_quantize}, {"dequantize", op_dequantize},
                               {"delta", op_delta}, {"patch", op_patch}, {"cat", op_cat},
                               {"zstd", op_zstd}, {"unzstd", op_unzstd}, {"zfp", op_zfp},
                               {"unzfp", op_unzfp}, {"unzip", op_unzip}, {NULL, NULL}};

void lei_array_lua_ops(lua_State *L, volatile sig_atomic_t *stop) {
    const luaL_Reg *f;
    lua_newtable(L);
    for (f = OPS; f->name; f++) {
        lua_pushlightuserdata(L, (void *)stop);
        lua_pushcclosure(L, f->func, 1);
        lua_setfield(L, -2, f->name);
    }
}

void lei_array_lua_moe(lua_State *L, int env, volatile sig_atomic_t *stop) {
    lei_array_lua_ops(L, stop);
    lua_pushvalue(L, -1);
    lua_setfield(L, env, "array");
    luaL_newmetatable(L, LEI_ARRAY_MT);
    lua_pushvalue(L, -2);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, op_len);
    lua_setfield(L, -2, "__len");
    lua_pushlightuserdata(L, (void *)stop);
    lua_pushcclosure(L, op_tostring, 1);
    lua_setfield(L, -2, "__tostring");
    lua_pushliteral(L, "lecho.array");
    lua_setfield(L, -2, "__metatable");
    lua_pop(L, 2);
}
