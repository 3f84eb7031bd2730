/* array_zip.h: the MOE's compression operators on arrays (array_zip.c):
 * lossless zstd (libzstd) and lossy ZFP at an absolute error bound
 * (libzfp, fixed-accuracy mode), each with its inverse.  Lua-free: every
 * buffer, the codecs' working memory included, is the caller's (the Lua
 * binding allocates them in the calling state, so a modulator's memory cap
 * counts them), and every loop looks at *stop between pieces.
 *
 * A compressed array is one self-describing byte string (a "<u1" array on
 * the wire), little-endian:
 *   0  4 bytes  magic "\x89LZ" then 'S' (zstd) or 'F' (ZFP)
 *   4  u8 dtype (codec.h LEI_DT_*), u8 ndim, u16 0
 *   8  ndim x u64: the shape
 *   zstd: one zstd frame (its content size is the shape's bytes)
 *   ZFP:  f64 tolerance, then one u64 byte length per slab, then the slabs
 *         (each an independent ZFP stream of SLAB rows of the first
 *         dimension, lei_zfp_plan), back to back.
 * The decoder believes nothing it cannot check: the shape's bytes are the
 * output's size (allocated before decoding, so a cap refuses a huge one),
 * zstd must produce exactly that (more: refused mid-way, a bomb stops
 * there; less: truncated), slab lengths must add up to what is there and
 * each is at most the largest stream ZFP can write for its slab (ZFP reads
 * without bounds checks: each slab is decoded from a scratch of that
 * maximum size, zero after its bytes).
 */
#ifndef LECHO_ARRAY_ZIP_H
#define LECHO_ARRAY_ZIP_H

#include "array.h"

#include <stddef.h>
#include <stdint.h>

enum { LEI_ZIP_ZSTD = 'S', LEI_ZIP_ZFP = 'F' };
/* results of the pack/unpack functions */
enum { LEI_ZIP_OK = 0, LEI_ZIP_ERR = -1, LEI_ZIP_STOPPED = -2 };

typedef struct lei_zip_hdr {
    int kind, dtype, ndim;
    int64_t shape[LEI_ARRAY_MAXDIM];
    uint64_t count, bytes; /* elements and bytes of the decoded array */
    double tol;            /* ZFP: the error bound */
    size_t hlen;           /* header bytes (ZFP: with the slab lengths) */
} lei_zip_hdr;

/* Parse and check a compressed array's header (p, n): dtype, ndim, a shape
 * whose bytes fit LEI_ARRAY_UD_MAX, ZFP's tolerance and slab table.  0, or
 * -1 with a reason in err. */
int lei_zip_parse(const uint8_t *p, size_t n, lei_zip_hdr *h, char *err, size_t errlen);

/* zstd.  Working memory for compressing n bytes at level (1..9): the
 * static context's size.  Output capacity: lei_zstd_bound. */
size_t lei_zstd_cwork(int level, size_t n);
size_t lei_zstd_bound(const lei_array *a);
/* a contiguous; out holds cap >= lei_zstd_bound(a) bytes; *len gets the
 * compressed size. */
int lei_zstd_pack(const lei_array *a, int level, void *work, size_t wn, uint8_t *out, size_t cap,
                  size_t *len, volatile sig_atomic_t *stop, char *err, size_t errlen);
/* Working memory for decompressing (fixed: the output is the window). */
size_t lei_zstd_dwork(void);
/* p, n (parsed into h) into out (h->bytes bytes, allocated by the caller). */
int lei_zstd_unpack(const uint8_t *p, size_t n, const lei_zip_hdr *h, void *work, size_t wn,
                    uint8_t *out, volatile sig_atomic_t *stop, char *err, size_t errlen);

/* ZFP ("<f4" and "<f8" only, any ndim: dims past the last two are folded
 * into the first).  Scratch needed to encode or decode one slab of an array
 * of this dtype/ndim/shape at tol (the largest stream ZFP can write for a
 * slab), and the header's size; 0 scratch: nothing to code (no elements). */
int lei_zfp_plan(int dtype, int ndim, const int64_t *shape, double tol, size_t *scratch, size_t *hlen);
/* a contiguous with aligned elements; out: cap bytes (the slabs beyond it:
 * an error, the tolerance too small for the data to shrink). */
int lei_zfp_pack(const lei_array *a, double tol, uint8_t *scratch, size_t sn, uint8_t *out, size_t cap,
                 size_t *len, volatile sig_atomic_t *stop, char *err, size_t errlen);
int lei_zfp_unpack(const uint8_t *p, size_t n, const lei_zip_hdr *h, uint8_t *scratch, size_t sn,
                   uint8_t *out, volatile sig_atomic_t *stop, char *err, size_t errlen);

#endif
