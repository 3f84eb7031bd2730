/* array.c: the in-memory array (array.h): layout, gather, and the MOE's
 * operations (statistics, box selection, block reduction).  libc only.
 * Elements are read with memcpy: an array received in place may sit at any
 * byte offset of its read buffer.
 */
#include "array.h"

#include <math.h>
#include <string.h>

int lei_array_init(lei_array *a, int dtype, int ndim, const int64_t *shape) {
    uint64_t count, bytes;
    unsigned isz = lei_dtype_size(dtype);
    int d;
    if (!isz || ndim < 0 || ndim > LEI_ARRAY_MAXDIM ||
        lei_shape_bytes(shape, ndim, isz, &count, &bytes))
        return -1;
    a->dtype = dtype;
    a->ndim = ndim;
    a->itemsize = (int32_t)isz;
    a->count = (int64_t)count;
    a->flags = 0;
    a->reserved = 0;
    for (d = LEI_ARRAY_MAXDIM - 1; d >= 0; d--) {
        if (d >= ndim) {
            a->shape[d] = 1;
            a->strides[d] = 0;
            continue;
        }
        a->shape[d] = shape[d];
        /* no elements: the dims after a zero may multiply past 2^63 */
        a->strides[d] = d == ndim - 1 || count == 0 ? (int64_t)isz : a->strides[d + 1] * shape[d + 1];
    }
    return 0;
}

int lei_array_contiguous(const lei_array *a) {
    int64_t want = a->itemsize;
    int d;
    if (a->count == 0) return 1;
    for (d = a->ndim - 1; d >= 0; d--) {
        if (a->shape[d] != 1 && a->strides[d] != want) return 0;
        want *= a->shape[d];
    }
    return 1;
}

/* Calls fn(ud, p, n, stride) for every innermost row of a, in row-major
 * order, cut in pieces of at most LEI_ARRAY_CHUNK elements: n elements at
 * p, stride bytes apart.  0, or -1 when *stop (may be NULL) was set. */
typedef void (*row_fn)(void *ud, const uint8_t *p, int64_t n, int64_t stride);

static int each_row(const lei_array *a, row_fn fn, void *ud, volatile sig_atomic_t *stop) {
    int64_t idx[LEI_ARRAY_MAXDIM] = {0};
    int nd = a->ndim, d;
    if (a->count == 0 || !a->data) return 0;
    if (nd == 0) {
        fn(ud, a->data, 1, a->itemsize);
        return 0;
    }
    for (;;) {
        const uint8_t *p = a->data;
        int64_t n = a->shape[nd - 1], st = a->strides[nd - 1], j;
        for (d = 0; d < nd - 1; d++) p += idx[d] * a->strides[d];
        for (j = 0; j < n; j += LEI_ARRAY_CHUNK) {
            if (stop && *stop) return -1;
            fn(ud, p + j * st, n - j < LEI_ARRAY_CHUNK ? n - j : LEI_ARRAY_CHUNK, st);
        }
        for (d = nd - 2; d >= 0; d--) {
            if (++idx[d] < a->shape[d]) break;
            idx[d] = 0;
        }
        if (d < 0) return 0;
    }
}

struct gather_st {
    uint8_t *out;
    int isz;
};

static void gather_row(void *ud, const uint8_t *p, int64_t n, int64_t stride) {
    struct gather_st *g = ud;
    int64_t i;
    if (stride == g->isz) {
        memcpy(g->out, p, (size_t)(n * g->isz));
        g->out += n * g->isz;
        return;
    }
    for (i = 0; i < n; i++, p += stride, g->out += g->isz) memcpy(g->out, p, (size_t)g->isz);
}

int lei_array_gather(const lei_array *a, uint8_t *out, volatile sig_atomic_t *stop) {
    struct gather_st g = {out, a->itemsize};
    if (lei_array_contiguous(a)) {
        if (a->count && a->data) memcpy(out, a->data, (size_t)(a->count * a->itemsize));
        return 0;
    }
    return each_row(a, gather_row, &g, stop);
}

double lei_array_load(int dtype, const uint8_t *p) {
    switch (dtype) {
    case LEI_DT_U1: return *p;
    case LEI_DT_I1: return (int8_t)*p;
#define LD(T)                                                                                   \
    {                                                                                           \
        T v;                                                                                    \
        memcpy(&v, p, sizeof v);                                                                \
        return (double)v;                                                                       \
    }
    case LEI_DT_U2: LD(uint16_t)
    case LEI_DT_I2: LD(int16_t)
    case LEI_DT_U4: LD(uint32_t)
    case LEI_DT_I4: LD(int32_t)
    case LEI_DT_U8: LD(uint64_t)
    case LEI_DT_I8: LD(int64_t)
    case LEI_DT_F4: LD(float)
    case LEI_DT_F8: LD(double)
#undef LD
    default: return 0;
    }
}

/* ---- statistics ------------------------------------------------------ */

struct stats_st {
    int dtype;
    double min, max, sum;
};

/* One loop per dtype: the load is a plain (unaligned-safe) move. */
#define STATS_LOOP(T)                                                                           \
    for (i = 0; i < n; i++, p += stride) {                                                      \
        T v;                                                                                    \
        memcpy(&v, p, sizeof v);                                                                \
        double x = (double)v;                                                                   \
        sum += x;                                                                               \
        if (x < mn) mn = x;                                                                     \
        if (x > mx) mx = x;                                                                     \
    }

static void stats_row(void *ud, const uint8_t *p, int64_t n, int64_t stride) {
    struct stats_st *s = ud;
    double mn = s->min, mx = s->max, sum = s->sum;
    int64_t i;
    switch (s->dtype) {
    case LEI_DT_U1: STATS_LOOP(uint8_t) break;
    case LEI_DT_I1: STATS_LOOP(int8_t) break;
    case LEI_DT_U2: STATS_LOOP(uint16_t) break;
    case LEI_DT_I2: STATS_LOOP(int16_t) break;
    case LEI_DT_U4: STATS_LOOP(uint32_t) break;
    case LEI_DT_I4: STATS_LOOP(int32_t) break;
    case LEI_DT_U8: STATS_LOOP(uint64_t) break;
    case LEI_DT_I8: STATS_LOOP(int64_t) break;
    case LEI_DT_F4: STATS_LOOP(float) break;
    default: STATS_LOOP(double) break;
    }
    s->min = mn;
    s->max = mx;
    s->sum = sum;
}

int lei_array_stats_of(const lei_array *a, lei_array_stats *st, volatile sig_atomic_t *stop) {
    struct stats_st s = {a->dtype, INFINITY, -INFINITY, 0};
    if (each_row(a, stats_row, &s, stop)) return -1;
    st->min = s.min;
    st->max = s.max;
    st->sum = s.sum;
    st->count = a->data ? a->count : 0;
    st->mean = st->count ? s.sum / (double)st->count : 0;
    return 0;
}

/* ---- box ------------------------------------------------------------- */

int lei_array_box(const lei_array *a, const int64_t *start, const int64_t *count,
                  const int64_t *step, lei_array *out) {
    lei_array b = *a;
    int64_t total = 1;
    int d;
    for (d = 0; d < a->ndim; d++) {
        if (start[d] < 0 || count[d] < 0 || step[d] < 1 || start[d] > a->shape[d]) return -1;
        /* the last element taken is start + (count-1)*step < shape */
        if (count[d] > 0 && (count[d] - 1 > (a->shape[d] - 1 - start[d]) / step[d])) return -1;
        b.shape[d] = count[d];
        if (__builtin_mul_overflow(a->strides[d], step[d], &b.strides[d])) return -1;
    }
    /* at most a's elements (any zero count makes it 0 first) */
    for (d = 0; d < a->ndim; d++)
        if (count[d] == 0) total = 0;
    for (d = 0; d < a->ndim && total; d++) total *= count[d];
    b.count = total;
    if (total == 0)
        b.data = a->data;
    else
        for (d = 0; d < a->ndim; d++) b.data += start[d] * a->strides[d];
    *out = b;
    return 0;
}

/* ---- block reduce ---------------------------------------------------- */

int lei_array_reduce_shape(const lei_array *a, const int64_t *k, lei_array *out) {
    int64_t shape[LEI_ARRAY_MAXDIM];
    int d;
    for (d = 0; d < a->ndim; d++) {
        if (k[d] < 1) return -1;
        shape[d] = (a->shape[d] + k[d] - 1) / k[d];
    }
    uint8_t *keep = out->data;
    if (lei_array_init(out, LEI_DT_F8, a->ndim, shape)) return -1;
    out->data = keep;
    return 0;
}


int lei_array_reduce(const lei_array *a, const int64_t *k, int op, lei_array *out,
                     volatile sig_atomic_t *stop) {
    double *o = (double *)(void *)out->data;
    int64_t n = out->count, i, idx[LEI_ARRAY_MAXDIM] = {0}, since = 0;
    int nd = a->ndim, d;
    double init = op == LEI_RED_MIN ? INFINITY : op == LEI_RED_MAX ? -INFINITY : 0;
    for (i = 0; i < n; i++) o[i] = init;
    if (a->count == 0 || !a->data) return 0;
    if (nd == 0) {
        o[0] = lei_array_load(a->dtype, a->data);
        return 0;
    }
    int64_t ostr[LEI_ARRAY_MAXDIM];
    for (d = nd - 1; d >= 0; d--) ostr[d] = d == nd - 1 ? 1 : ostr[d + 1] * out->shape[d + 1];
    int64_t kl = k[nd - 1], len = a->shape[nd - 1], st = a->strides[nd - 1];
    for (;;) {
        const uint8_t *p = a->data;
        int64_t base = 0, j;
        for (d = 0; d < nd - 1; d++) {
            p += idx[d] * a->strides[d];
            base += (idx[d] / k[d]) * ostr[d];
        }
        double *ob = o + base;
        /* the innermost row, a block of kl at a time */
        for (j = 0; j < len; j += kl) {
            int64_t e = j + kl < len ? j + kl : len, t;
            if ((since += e - j + 1) > LEI_ARRAY_CHUNK) {
                if (stop && *stop) return -1;
                since = 0;
            }
            double acc = *ob;
            for (t = j; t < e; t++, p += st) {
                double x = lei_array_load(a->dtype, p);
                if (op == LEI_RED_MIN) {
                    if (x < acc) acc = x;
                } else if (op == LEI_RED_MAX) {
                    if (x > acc) acc = x;
                } else
                    acc += x;
            }
            *ob++ = acc;
        }
        for (d = nd - 2; d >= 0; d--) {
            if (++idx[d] < a->shape[d]) break;
            idx[d] = 0;
        }
        if (d < 0) break;
    }
    if (op != LEI_RED_MEAN) return 0;
    /* divide each block by its element count (a trailing block is smaller) */
    for (d = 0; d < nd; d++) idx[d] = 0;
    for (i = 0; i < n; i++) {
        double c = 1;
        for (d = 0; d < nd; d++) {
            int64_t rem = a->shape[d] - idx[d] * k[d];
            c *= (double)(rem < k[d] ? rem : k[d]);
        }
        o[i] /= c;
        for (d = nd - 1; d >= 0; d--) {
            if (++idx[d] < out->shape[d]) break;
            idx[d] = 0;
        }
        if ((++since & 0xffff) == 0 && stop && *stop) return -1;
    }
    return 0;
}

/* ---- conversion, quantization ----------------------------------------- */

void lei_array_store(int dtype, uint8_t *p, double y) {
    switch (dtype) {
#define ST(T)                                                                                   \
    {                                                                                           \
        T v = (T)y;                                                                             \
        memcpy(p, &v, sizeof v);                                                                \
        return;                                                                                 \
    }
    case LEI_DT_U1: ST(uint8_t)
    case LEI_DT_I1: ST(int8_t)
    case LEI_DT_U2: ST(uint16_t)
    case LEI_DT_I2: ST(int16_t)
    case LEI_DT_U4: ST(uint32_t)
    case LEI_DT_I4: ST(int32_t)
    case LEI_DT_U8: ST(uint64_t)
    case LEI_DT_I8: ST(int64_t)
    case LEI_DT_F4: ST(float)
    default: ST(double)
#undef ST
    }
}

/* The range of an integer dtype (as doubles the conversion stays inside). */
static void int_range(int dt, double *lo, double *hi) {
    static const double los[] = {0, -128, 0, -32768, 0, -2147483648.0, 0, -9223372036854775808.0};
    static const double his[] = {255, 127, 65535, 32767, 4294967295.0, 2147483647.0,
                                 18446744073709549568.0, 9223372036854774784.0};
    *lo = los[dt];
    *hi = his[dt];
}

int lei_array_convert(const lei_array *a, lei_array *out, int mode, double scale, double offset,
                      volatile sig_atomic_t *stop) {
    int isint = out->dtype < LEI_DT_F4;
    double lo = 0, hi = 0;
    int64_t i = 0, idx[LEI_ARRAY_MAXDIM] = {0};
    int nd = a->ndim, d;
    if (isint) int_range(out->dtype, &lo, &hi);
    for (i = 0; i < a->count; i++) {
        const uint8_t *p = a->data;
        for (d = 0; d < nd; d++) p += idx[d] * a->strides[d];
        double x = lei_array_load(a->dtype, p), y;
        y = mode == LEI_CONV_QUANTIZE ? (x - offset) / scale : x * scale + offset;
        if (isint) {
            if (y != y) y = 0;
            y = floor(y + 0.5);
            if (y < lo) y = lo;
            if (y > hi) y = hi;
        }
        lei_array_store(out->dtype, out->data + i * out->itemsize, y);
        for (d = nd - 1; d >= 0; d--) {
            if (++idx[d] < a->shape[d]) break;
            idx[d] = 0;
        }
        if ((i & 0xffff) == 0xffff && stop && *stop) return -1;
    }
    return 0;
}

/* ---- delta and patch --------------------------------------------------- */

int64_t lei_array_delta_count(const lei_array *cur, const lei_array *ref, double threshold,
                              volatile sig_atomic_t *stop) {
    int64_t i, n = 0;
    for (i = 0; i < cur->count; i++) {
        double x = lei_array_load(cur->dtype, cur->data + i * cur->itemsize);
        double r = lei_array_load(ref->dtype, ref->data + i * ref->itemsize);
        if (!(fabs(x - r) <= threshold) && !(x != x && r != r)) n++;
        if ((i & 0xffff) == 0xffff && stop && *stop) return -1;
    }
    return n;
}

int lei_array_delta(const lei_array *cur, lei_array *ref, double threshold, lei_array *idx,
                    lei_array *vals, volatile sig_atomic_t *stop) {
    int64_t i, n = 0;
    size_t isz = (size_t)cur->itemsize;
    for (i = 0; i < cur->count && n < vals->count; i++) {
        const uint8_t *c = cur->data + i * cur->itemsize;
        uint8_t *r = ref->data + i * ref->itemsize;
        double x = lei_array_load(cur->dtype, c), y = lei_array_load(ref->dtype, r);
        if (!(fabs(x - y) <= threshold) && !(x != x && y != y)) {
            lei_array_store(idx->dtype, idx->data + n * idx->itemsize, (double)i);
            memcpy(vals->data + n * isz, c, isz);
            memcpy(r, c, isz); /* what the receiver has now */
            n++;
        }
        if ((i & 0xffff) == 0xffff && stop && *stop) return -1;
    }
    return 0;
}

int lei_array_patch(lei_array *ref, const lei_array *idx, const lei_array *vals) {
    int64_t k;
    size_t isz = (size_t)ref->itemsize;
    if (idx->count != vals->count || vals->dtype != ref->dtype) return -1;
    for (k = 0; k < idx->count; k++) { /* check every index before writing any */
        double i = lei_array_load(idx->dtype, idx->data + k * idx->itemsize);
        if (!(i >= 0 && i < (double)ref->count)) return -1;
    }
    for (k = 0; k < idx->count; k++) {
        int64_t i = (int64_t)lei_array_load(idx->dtype, idx->data + k * idx->itemsize);
        memcpy(ref->data + i * (int64_t)isz, vals->data + k * (int64_t)isz, isz);
    }
    return 0;
}
