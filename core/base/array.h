/* array.h: the in-memory form of an array value (codec.h, LEI_T_ARRAY):
 * a header that points at its elements, shared by the Lua binding (a
 * userdata holding this header; lua/lecho/array.lua reads it through the
 * FFI with the same layout), the public C API and the MOE operations.
 * Lua-free: array.c builds and is tested without a Lua state.
 */
#ifndef LECHO_ARRAY_H
#define LECHO_ARRAY_H

#include "codec.h"

#include <signal.h>
#include <stdint.h>

/* Elements between two looks at an operation's stop flag (the MOE's
 * CPU-budget timer sets it): a stopped operation returns -1 within a few
 * tens of microseconds. */
#define LEI_ARRAY_CHUNK 65536

/* flags */
#define LEI_AF_VIEW 1  /* points into a read buffer: valid while its dispatch runs */
#define LEI_AF_ENDED 2 /* a view whose dispatch ended: data NULL, no elements */
#define LEI_AF_READONLY 4 /* points into memory that must not change (a Lua string) */
#define LEI_AF_BORROWED 8 /* memory lent by C until a submit returns: encoded by copy */

/* Keep in step with the ffi.cdef in lua/lecho/array.lua. */
typedef struct lei_array {
    uint8_t *data;                       /* first element, any alignment; NULL when empty/ended */
    int64_t shape[LEI_ARRAY_MAXDIM];     /* elements along each dim */
    int64_t strides[LEI_ARRAY_MAXDIM];   /* bytes from one element to the next along each dim */
    int32_t dtype, ndim, flags, itemsize;
    int64_t count;                       /* elements: the product of shape */
    int64_t reserved;
} lei_array;

/* Fill shape, row-major strides, count and itemsize; data stays. 0, or -1
 * for a bad dtype, ndim or an overflowing shape. */
int lei_array_init(lei_array *a, int dtype, int ndim, const int64_t *shape);
/* Row-major without gaps: its bytes are data[0 .. count*itemsize). */
int lei_array_contiguous(const lei_array *a);
/* Copy the elements in row-major order to out (count*itemsize bytes).
 * 0, or -1 when *stop (may be NULL) was set meanwhile. */
int lei_array_gather(const lei_array *a, uint8_t *out, volatile sig_atomic_t *stop);
/* Stores y, converted to dtype (a C cast), as one element at p. */
void lei_array_store(int dtype, uint8_t *p, double y);

/* ---- operations (the MOE's, doc/modulators.md) ----------------------- */
/* Statistics over every element, as doubles; NaNs are skipped by min/max.
 * An empty array: 0, with min = +inf, max = -inf. */
typedef struct lei_array_stats {
    double min, max, sum, mean;
    int64_t count;
} lei_array_stats;
/* 0, or -1 when *stop was set meanwhile (stop may be NULL). */
int lei_array_stats_of(const lei_array *a, lei_array_stats *st, volatile sig_atomic_t *stop);

/* A box of a, without copying: out gets a's data, dtype and, along each dim
 * d, count[d] elements from start[d], every step[d]-th (step >= 1).  0, or
 * -1 when the box does not fit inside a (out unchanged). */
int lei_array_box(const lei_array *a, const int64_t *start, const int64_t *count,
                  const int64_t *step, lei_array *out);

enum { LEI_RED_MEAN, LEI_RED_MIN, LEI_RED_MAX, LEI_RED_SUM };
/* Shape of the block reduction of a by k[d] per dim (a trailing partial
 * block counts): out gets dtype f8 and that shape, data untouched. -1 on a
 * k below 1. */
int lei_array_reduce_shape(const lei_array *a, const int64_t *k, lei_array *out);
/* Block reduce a into out (made by lei_array_reduce_shape, its data
 * pointing at out->count doubles, aligned).  0, or -1 when *stop was set
 * meanwhile (out then partly written). */
int lei_array_reduce(const lei_array *a, const int64_t *k, int op, lei_array *out,
                     volatile sig_atomic_t *stop);

/* Element-wise conversion of a into out (same shape; out's data holds
 * out->count elements of out->dtype, row-major).  LEI_CONV_QUANTIZE:
 * y = (x - offset) / scale; LEI_CONV_RESTORE: y = x * scale + offset; to an
 * integer dtype y is rounded (half up) and clamped to its range, NaN -> 0.
 * 0, or -1 when *stop was set. */
enum { LEI_CONV_QUANTIZE, LEI_CONV_RESTORE };
int lei_array_convert(const lei_array *a, lei_array *out, int mode, double scale, double offset,
                      volatile sig_atomic_t *stop);
/* Delta of cur against ref (both contiguous, same count; any dtypes): the
 * elements whose values differ by more than threshold (NaN against a
 * number counts).  delta_count: how many (-1: stopped).  delta: their flat
 * indices into idx (an integer array of that count) and cur's elements into
 * vals (cur's dtype, that count), and writes them into ref, which then
 * holds what the receiver rebuilds.  patch: the inverse, vals into ref at
 * idx; -1 (ref untouched) on an index out of range, counts that differ or
 * a dtype other than ref's. */
int64_t lei_array_delta_count(const lei_array *cur, const lei_array *ref, double threshold,
                              volatile sig_atomic_t *stop);
int lei_array_delta(const lei_array *cur, lei_array *ref, double threshold, lei_array *idx,
                    lei_array *vals, volatile sig_atomic_t *stop);
int lei_array_patch(lei_array *ref, const lei_array *idx, const lei_array *vals);

/* An element as a double (any alignment). */
double lei_array_load(int dtype, const uint8_t *p);

#endif

/* ---- Lua bridge (codec_lua.c; declared without lua.h) ----------------- */
/* An array in a Lua state is a userdata holding a lei_array (its elements
 * after the header, or elsewhere, kept alive by its environment table:
 * [1] = the owner, .kids = views made from a view), with the metatable
 * registered as LEI_ARRAY_MT. */
#define LEI_ARRAY_MT "lecho.array"
/* The most bytes one array userdata holds (LuaJIT's userdata limit, below
 * 2 GiB; its sizes are 32-bit). */
#define LEI_ARRAY_UD_MAX ((size_t)0x7fff0000)
struct lua_State;
/* The array at idx, or NULL when it is something else. */
lei_array *lei_codec_lua_array_check(struct lua_State *L, int idx);
/* Pushes a new array of that dtype and shape with extra bytes after the
 * header (data points at them; zeroed if zero). Raises on a bad shape or
 * out of memory. */
lei_array *lei_codec_lua_array_push(struct lua_State *L, int dtype, int ndim, const int64_t *shape,
                          size_t extra, int zero);
/* Pushes a view: a new array with header *h sharing the elements of the
 * array at idx, whose environment keeps that array; a view of a received
 * view is listed in its parent's kids (kept or ended with it).  Raises on
 * out of memory. */
lei_array *lei_codec_lua_array_view(struct lua_State *L, int idx, const lei_array *h);
/* A received view at idx (an array) and the views made from it lose their
 * elements (its dispatch ended and nobody kept it); anything else is left
 * alone.  Allocates nothing. */
void lei_codec_lua_array_end(struct lua_State *L, int idx);
/* A received view at idx kept: without a copy when adopt(ud, data, n,
 * &cap) hands over the (malloc'd, cap bytes) buffer its n bytes are in,
 * owned by the array from then on and given back through give (with the
 * object at ctx_idx, kept alive meanwhile, on the stack top) when it is
 * collected; else copied (as lecho.core's array_keep does).  Arrays under
 * LEI_ARRAY_ADOPT_MIN bytes are copied without asking.  Returns cap (0:
 * not adopted): the caller steps the collector for it when needed. */
#define LEI_ARRAY_ADOPT_MIN ((size_t)256 * 1024)
typedef uint8_t *(*lei_adopt_fn)(void *ud, const void *p, size_t n, size_t *cap);
size_t lei_codec_lua_array_adopt(struct lua_State *L, int idx, int ctx_idx, lei_adopt_fn adopt,
                         void (*give)(struct lua_State *L, uint8_t *base, size_t cap), void *ud);
/* Pushes a table of the array operations (array_lua.c: dtype, shape,
 * ndim, count, get, stats, min, max, sum, mean, box, reduce, copy), each
 * looking at *stop (NULL: never stopped) between chunks and raising "CPU
 * budget exceeded" when set. */
void lei_array_lua_ops(struct lua_State *L, volatile sig_atomic_t *stop);
/* A modulator's state: env.array = those operations, and the arrays'
 * methods (a:box(...)), stopped by *stop. */
void lei_array_lua_moe(struct lua_State *L, int env, volatile sig_atomic_t *stop);
/* lei_decode_lua, and view_min > 0: arrays of at least view_min bytes point
 * into p (flag LEI_AF_VIEW) and, on success, a table listing them (or nil)
 * is pushed after the value. */
int lei_decode_lua_views(struct lua_State *L, const uint8_t *p, size_t n,
                         const lei_codec_limits *lim, size_t view_min, char *err, size_t errlen);
