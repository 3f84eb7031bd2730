/* array_zip.c: zstd and ZFP on arrays (array_zip.h).  No allocation here
 * but ZFP's own small descriptors (zfp_stream, zfp_field, bitstream: a few
 * hundred bytes, malloc'd and freed within each call, owned by the call);
 * zstd's contexts live in the caller's working memory (static contexts).
 */
#define ZSTD_STATIC_LINKING_ONLY
#include "array_zip.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <zfp.h>
#include <zstd.h>
#include <zstd_errors.h>

#define MAGIC0 0x89
#define MAGIC1 'L'
#define MAGIC2 'Z'
/* Elements per ZFP slab (about: whole rows of the first dimension, a
 * multiple of 4), input bytes per zstd step, compressed input bytes per
 * zstd decoding step (an RLE block of 3 bytes makes 128 KiB: 4 KiB of
 * input make at most ~170 MiB, some tens of ms, between two looks at
 * stop). */
#define ZFP_SLAB 65536
#define ZSTD_STEP (256 * 1024)
#define ZSTD_DSTEP 4096

static void put64(uint8_t *p, uint64_t v) {
    int i;
    for (i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint64_t get64(const uint8_t *p) {
    uint64_t v = 0;
    int i;
    for (i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static size_t base_hlen(int ndim) { return 8 + 8 * (size_t)ndim; }

static void put_base(uint8_t *p, int kind, const lei_array *a) {
    int d;
    p[0] = MAGIC0, p[1] = MAGIC1, p[2] = MAGIC2, p[3] = (uint8_t)kind;
    p[4] = (uint8_t)a->dtype, p[5] = (uint8_t)a->ndim, p[6] = p[7] = 0;
    for (d = 0; d < a->ndim; d++) put64(p + 8 + 8 * d, (uint64_t)a->shape[d]);
}

#define FAIL(...) ((void)snprintf(err, errlen, __VA_ARGS__), LEI_ZIP_ERR)

/* ---- ZFP's view of an array: R rows of the first dimension (the dims past
 * the last two folded in), each of inner[0] x inner[1] elements (ninner of
 * them used: 0, 1 or 2), cut in slabs of srows rows. */
typedef struct zplan {
    uint64_t rows, srows, nslabs;
    int ninner;
    uint64_t inner[2];
} zplan;

static int zfp_view(int ndim, const int64_t *shape, zplan *z) {
    uint64_t per = 1, count = 1;
    int d;
    memset(z, 0, sizeof *z);
    z->ninner = ndim < 1 ? 0 : ndim - 1 > 2 ? 2 : ndim - 1;
    for (d = 0; d < z->ninner; d++) {
        z->inner[d] = (uint64_t)shape[ndim - z->ninner + d];
        per *= z->inner[d];
    }
    z->rows = 1;
    for (d = 0; d < ndim - z->ninner; d++) z->rows *= (uint64_t)shape[d];
    count = z->rows * per;
    if (count == 0) return 0; /* nothing to code */
    z->srows = ZFP_SLAB / per;
    z->srows &= ~(uint64_t)3;
    if (z->srows < 4) z->srows = 4;
    if (z->srows > z->rows) z->srows = z->rows;
    z->nslabs = (z->rows + z->srows - 1) / z->srows;
    return 0;
}

/* The field of slab rows starting at p (type t). */
static zfp_field *slab_field(const zplan *z, zfp_type t, void *p, uint64_t rows) {
    switch (z->ninner) {
    case 0: return zfp_field_1d(p, t, (size_t)rows);
    case 1: return zfp_field_2d(p, t, (size_t)z->inner[0], (size_t)rows);
    default: return zfp_field_3d(p, t, (size_t)z->inner[1], (size_t)z->inner[0], (size_t)rows);
    }
}

static size_t slab_max(const zplan *z, zfp_type t, double tol) {
    zfp_stream *zs = zfp_stream_open(NULL);
    zfp_field *f = slab_field(z, t, NULL, z->srows);
    size_t n = 0;
    if (zs && f) {
        zfp_stream_set_accuracy(zs, tol);
        n = zfp_stream_maximum_size(zs, f);
        n = (n + 7) / 8 * 8 + 16; /* ZFP reads words: a word of slack */
    }
    if (f) zfp_field_free(f);
    if (zs) zfp_stream_close(zs);
    return n;
}

int lei_zfp_plan(int dtype, int ndim, const int64_t *shape, double tol, size_t *scratch, size_t *hlen) {
    zplan z;
    if (dtype != LEI_DT_F4 && dtype != LEI_DT_F8) return -1;
    if (!(tol > 0) || !isfinite(tol)) return -1;
    zfp_view(ndim, shape, &z);
    *hlen = base_hlen(ndim) + 8 + 8 * (size_t)z.nslabs;
    *scratch = z.nslabs ? slab_max(&z, dtype == LEI_DT_F4 ? zfp_type_float : zfp_type_double, tol) : 0;
    return z.nslabs && !*scratch ? -1 : 0;
}

int lei_zip_parse(const uint8_t *p, size_t n, lei_zip_hdr *h, char *err, size_t errlen) {
    int d;
    memset(h, 0, sizeof *h);
    if (n < 8 || p[0] != MAGIC0 || p[1] != MAGIC1 || p[2] != MAGIC2 ||
        (p[3] != LEI_ZIP_ZSTD && p[3] != LEI_ZIP_ZFP))
        return FAIL("not a compressed array (no lecho zstd/zfp header)");
    h->kind = p[3], h->dtype = p[4], h->ndim = p[5];
    if (h->dtype >= LEI_DT_COUNT || h->ndim > LEI_ARRAY_MAXDIM || p[6] || p[7])
        return FAIL("compressed array: bad dtype %d or ndim %d", h->dtype, h->ndim);
    h->hlen = base_hlen(h->ndim);
    if (n < h->hlen) return FAIL("compressed array: truncated header (%zu bytes)", n);
    for (d = 0; d < h->ndim; d++) {
        uint64_t v = get64(p + 8 + 8 * d);
        if (v > (uint64_t)1 << 62) return FAIL("compressed array: dimension %d of %llu", d + 1, (unsigned long long)v);
        h->shape[d] = (int64_t)v;
    }
    if (lei_shape_bytes(h->shape, h->ndim, lei_dtype_size(h->dtype), &h->count, &h->bytes) ||
        h->bytes > LEI_ARRAY_UD_MAX)
        return FAIL("compressed array: its shape makes more than %zu bytes", (size_t)LEI_ARRAY_UD_MAX);
    if (h->kind == LEI_ZIP_ZFP) {
        size_t scratch, hlen;
        zplan z;
        if (n < h->hlen + 8) return FAIL("compressed array: truncated header (%zu bytes)", n);
        memcpy(&h->tol, p + h->hlen, 8);
        if (lei_zfp_plan(h->dtype, h->ndim, h->shape, h->tol, &scratch, &hlen))
            return FAIL("compressed array: ZFP needs <f4 or <f8 and a tolerance > 0 (got %s, %g)",
                        lei_dtype_name(h->dtype), h->tol);
        zfp_view(h->ndim, h->shape, &z);
        if (n < hlen) return FAIL("compressed array: truncated slab table (%zu bytes, %zu needed)", n, hlen);
        uint64_t sum = 0;
        for (d = 0; (uint64_t)d < z.nslabs; d++) {
            uint64_t l = get64(p + h->hlen + 8 + 8 * (size_t)d);
            if (l > scratch) return FAIL("compressed array: slab %d says %llu bytes, ZFP writes at most %zu",
                                         d + 1, (unsigned long long)l, scratch);
            sum += l;
        }
        if (sum != n - hlen)
            return FAIL("compressed array: the slabs say %llu bytes, %zu are there", (unsigned long long)sum,
                        n - hlen);
        /* ZFP writes at least one bit for every block of 4^d values (an
         * all-zero block too: fixed accuracy's minimum): a stream shorter
         * than that for its shape did not come from ZFP, and would have the
         * receiver make a large array out of a few bytes. */
        uint64_t blocks = (z.rows + 3) / 4;
        for (d = 0; d < z.ninner; d++) blocks *= (z.inner[d] + 3) / 4;
        if (h->count && sum * 8 < blocks)
            return FAIL("compressed array: %llu bytes of ZFP cannot hold the %llu blocks of its shape",
                        (unsigned long long)sum, (unsigned long long)blocks);
        h->hlen = hlen;
    }
    return 0;
}

/* ---- zstd -------------------------------------------------------------- */

size_t lei_zstd_cwork(int level, size_t n) {
    return ZSTD_estimateCStreamSize_usingCParams(ZSTD_getCParams(level, n, 0));
}

size_t lei_zstd_bound(const lei_array *a) {
    return base_hlen(a->ndim) + ZSTD_compressBound((size_t)a->count * (size_t)a->itemsize);
}

int lei_zstd_pack(const lei_array *a, int level, void *work, size_t wn, uint8_t *out, size_t cap,
                  size_t *len, volatile sig_atomic_t *stop, char *err, size_t errlen) {
    size_t n = (size_t)a->count * (size_t)a->itemsize, r;
    ZSTD_CCtx *c = ZSTD_initStaticCCtx(work, wn);
    ZSTD_inBuffer in = {a->data, n, 0};
    ZSTD_outBuffer o;
    if (!c) return FAIL("zstd: working memory too small");
    if (cap < lei_zstd_bound(a)) return FAIL("zstd: output too small");
    put_base(out, LEI_ZIP_ZSTD, a);
    o.dst = out, o.size = cap, o.pos = base_hlen(a->ndim);
    if (ZSTD_isError(r = ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, level)) ||
        ZSTD_isError(r = ZSTD_CCtx_setParameter(c, ZSTD_c_contentSizeFlag, 1)) ||
        ZSTD_isError(r = ZSTD_CCtx_setPledgedSrcSize(c, n)))
        return FAIL("zstd: %s", ZSTD_getErrorName(r));
    for (;;) {
        size_t end = in.pos + ZSTD_STEP < n ? in.pos + ZSTD_STEP : n;
        ZSTD_inBuffer step = {a->data, end, in.pos};
        if (stop && *stop) return LEI_ZIP_STOPPED;
        r = ZSTD_compressStream2(c, &o, &step, end == n ? ZSTD_e_end : ZSTD_e_continue);
        if (ZSTD_isError(r)) return FAIL("zstd: %s", ZSTD_getErrorName(r));
        in.pos = step.pos;
        if (end == n && r == 0) break;
    }
    *len = o.pos;
    return LEI_ZIP_OK;
}

size_t lei_zstd_dwork(void) { return ZSTD_estimateDStreamSize(ZSTD_BLOCKSIZE_MAX); }

int lei_zstd_unpack(const uint8_t *p, size_t n, const lei_zip_hdr *h, void *work, size_t wn,
                    uint8_t *out, volatile sig_atomic_t *stop, char *err, size_t errlen) {
    ZSTD_DCtx *c = ZSTD_initStaticDCtx(work, wn);
    ZSTD_outBuffer o = {out, (size_t)h->bytes, 0};
    size_t pos = h->hlen, r = 1;
    unsigned long long want;
    if (!c) return FAIL("zstd: working memory too small");
    /* the frame's own content size, when it has one, must be the shape's */
    want = ZSTD_getFrameContentSize(p + pos, n - pos);
    if (want == ZSTD_CONTENTSIZE_ERROR) return FAIL("zstd: not a zstd frame after the header");
    if (want != ZSTD_CONTENTSIZE_UNKNOWN && want != h->bytes)
        return FAIL("zstd: the frame says %llu bytes, the shape %llu", want, (unsigned long long)h->bytes);
    /* the output is the window: no window buffer; a frame producing more
     * than the shape's bytes fails when it reaches the end of out */
    if (ZSTD_isError(r = ZSTD_DCtx_setParameter(c, ZSTD_d_stableOutBuffer, 1)))
        return FAIL("zstd: %s", ZSTD_getErrorName(r));
    while (pos < n) {
        ZSTD_inBuffer in = {p, pos + ZSTD_DSTEP < n ? pos + ZSTD_DSTEP : n, pos};
        size_t opos = o.pos;
        if (stop && *stop) return LEI_ZIP_STOPPED;
        r = ZSTD_decompressStream(c, &o, &in);
        if (ZSTD_isError(r))
            return FAIL("zstd: %s (decoded %zu of %llu bytes)",
                        ZSTD_getErrorCode(r) == ZSTD_error_dstSize_tooSmall ? "it decompresses to more than its shape"
                                                                           : ZSTD_getErrorName(r),
                        o.pos, (unsigned long long)h->bytes);
        if (r == 0) {
            if (in.pos != n) return FAIL("zstd: bytes after the frame");
            break;
        }
        if (in.pos == pos && o.pos == opos) return FAIL("zstd: the frame does not decode past byte %zu", pos);
        pos = in.pos;
    }
    if (r != 0) return FAIL("zstd: truncated (decoded %zu of %llu bytes)", o.pos, (unsigned long long)h->bytes);
    if (o.pos != h->bytes)
        return FAIL("zstd: %zu bytes decoded, the shape says %llu", o.pos, (unsigned long long)h->bytes);
    return LEI_ZIP_OK;
}

/* ---- ZFP ------------------------------------------------------------- */

/* Code (or decode) one slab of rows rows at data with the stream over buf
 * (bn bytes).  Returns the stream's bytes, 0 on failure. */
static size_t zfp_slab(const zplan *z, zfp_type t, double tol, void *data, uint64_t rows, void *buf,
                       size_t bn, int decode) {
    bitstream *bs = stream_open(buf, bn);
    zfp_stream *zs = zfp_stream_open(bs);
    zfp_field *f = slab_field(z, t, data, rows);
    size_t r = 0;
    if (bs && zs && f) {
        zfp_stream_set_accuracy(zs, tol);
        zfp_stream_rewind(zs);
        r = decode ? zfp_decompress(zs, f) : zfp_compress(zs, f);
    }
    if (f) zfp_field_free(f);
    if (zs) zfp_stream_close(zs);
    if (bs) stream_close(bs);
    return r;
}

int lei_zfp_pack(const lei_array *a, double tol, uint8_t *scratch, size_t sn, uint8_t *out, size_t cap,
                 size_t *len, volatile sig_atomic_t *stop, char *err, size_t errlen) {
    size_t need, hlen, pos, row;
    zfp_type t = a->dtype == LEI_DT_F4 ? zfp_type_float : zfp_type_double;
    zplan z;
    uint64_t s;
    if (lei_zfp_plan(a->dtype, a->ndim, a->shape, tol, &need, &hlen))
        return FAIL("zfp: <f4 or <f8 arrays and a tolerance > 0 only (got %s, %g)", lei_dtype_name(a->dtype), tol);
    if (sn < need) return FAIL("zfp: scratch too small");
    if (cap < hlen) return FAIL("zfp: output too small");
    zfp_view(a->ndim, a->shape, &z);
    put_base(out, LEI_ZIP_ZFP, a);
    memcpy(out + base_hlen(a->ndim), &tol, 8);
    pos = hlen;
    row = z.nslabs ? (size_t)((uint64_t)a->count / z.rows) * (size_t)a->itemsize : 0;
    for (s = 0; s < z.nslabs; s++) {
        uint64_t r0 = s * z.srows, rows = z.rows - r0 < z.srows ? z.rows - r0 : z.srows, i;
        uint8_t *data = a->data + r0 * row;
        size_t k;
        if (stop && *stop) return LEI_ZIP_STOPPED;
        /* ZFP's transform is not defined on NaN or infinity */
        for (i = 0; i < rows * row / (uint64_t)a->itemsize; i++)
            if (t == zfp_type_double ? !isfinite(((double *)data)[i]) : !isfinite(((float *)data)[i]))
                return FAIL("zfp: element %llu is not finite (NaN or infinity)",
                            (unsigned long long)(r0 * row / (uint64_t)a->itemsize + i));
        if (!(k = zfp_slab(&z, t, tol, data, rows, scratch, sn, 0))) return FAIL("zfp: compression failed");
        if (k > cap - pos)
            return FAIL("zfp: at tolerance %g this array does not get smaller than its %llu bytes (use zstd)",
                        tol, (unsigned long long)a->count * (unsigned long long)a->itemsize);
        memcpy(out + pos, scratch, k);
        put64(out + base_hlen(a->ndim) + 8 + 8 * s, k);
        pos += k;
    }
    *len = pos;
    return LEI_ZIP_OK;
}

int lei_zfp_unpack(const uint8_t *p, size_t n, const lei_zip_hdr *h, uint8_t *scratch, size_t sn,
                   uint8_t *out, volatile sig_atomic_t *stop, char *err, size_t errlen) {
    zfp_type t = h->dtype == LEI_DT_F4 ? zfp_type_float : zfp_type_double;
    size_t need, hlen, pos = h->hlen, dirty = sn, row;
    zplan z;
    uint64_t s;
    (void)n;
    if (lei_zfp_plan(h->dtype, h->ndim, h->shape, h->tol, &need, &hlen) || sn < need || hlen != h->hlen)
        return FAIL("zfp: scratch too small");
    zfp_view(h->ndim, h->shape, &z);
    row = z.nslabs ? (size_t)(h->count / z.rows) * lei_dtype_size(h->dtype) : 0;
    for (s = 0; s < z.nslabs; s++) {
        uint64_t r0 = s * z.srows, rows = z.rows - r0 < z.srows ? z.rows - r0 : z.srows;
        size_t k = (size_t)get64(p + base_hlen(h->ndim) + 8 + 8 * s); /* checked by lei_zip_parse */
        if (stop && *stop) return LEI_ZIP_STOPPED;
        /* whatever ZFP reads past the slab's bytes is zero, within scratch */
        memcpy(scratch, p + pos, k);
        if (dirty > k) memset(scratch + k, 0, dirty - k);
        dirty = k;
        if (!zfp_slab(&z, t, h->tol, out + r0 * row, rows, scratch, sn, 1))
            return FAIL("zfp: slab %llu does not decode", (unsigned long long)s + 1);
        pos += k;
    }
    return LEI_ZIP_OK;
}
