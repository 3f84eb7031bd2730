/* fuzz_zip.c: a libFuzzer harness (make fuzz) for the compressed-array
 * decoder (array_zip.c), what a demodulator's array.unzip does with bytes
 * a modulator sent: lei_zip_parse, then lei_zstd_unpack or lei_zfp_unpack
 * into an output of the size the header says (at most 16 MiB here: the
 * state's memory cap stands for the rest), with working memory of the
 * size the decoder asks for.  Nothing may be read or written outside those
 * buffers (ASan), and a stream that is accepted must have produced exactly
 * the declared bytes (zstd); what compresses round-trips (zstd exact, ZFP
 * within its tolerance).  Seeds: core/fuzz/zip/ (a zstd and a ZFP stream).
 */
#include "array_zip.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void check(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "fuzz_zip: %s\n", what);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    lei_zip_hdr h;
    char err[200];
    size_t wn = 0, hlen;
    uint8_t *work, *out, *p;
    int rc;
    if (lei_zip_parse(data, size, &h, err, sizeof err)) return 0;
    if (h.bytes > (16u << 20)) return 0;
    if (h.kind == LEI_ZIP_ZSTD) {
        wn = lei_zstd_dwork();
    } else {
        check(lei_zfp_plan(h.dtype, h.ndim, h.shape, h.tol, &wn, &hlen) == 0, "plan of a parsed header");
        if (wn > (64u << 20)) return 0;
    }
    /* copies of exactly their sizes: ASan sees any access past them */
    p = malloc(size ? size : 1);
    memcpy(p, data, size);
    work = malloc(wn ? wn : 1);
    out = malloc(h.bytes ? (size_t)h.bytes : 1);
    check(p && work && out, "out of memory");
    rc = h.kind == LEI_ZIP_ZSTD ? lei_zstd_unpack(p, size, &h, work, wn, out, NULL, err, sizeof err)
                                : lei_zfp_unpack(p, size, &h, work, wn, out, NULL, err, sizeof err);
    check(rc == LEI_ZIP_OK || rc == LEI_ZIP_ERR, "unpack result");
    if (rc == LEI_ZIP_OK && h.kind == LEI_ZIP_ZSTD && h.bytes) {
        /* what decoded compresses and comes back the same */
        lei_array a;
        size_t cap, len = 0, cw;
        uint8_t *z, *cwork, *back;
        lei_zip_hdr h2;
        check(lei_array_init(&a, h.dtype, h.ndim, h.shape) == 0, "array of a parsed shape");
        a.data = out;
        cap = lei_zstd_bound(&a);
        cw = lei_zstd_cwork(1, (size_t)h.bytes);
        z = malloc(cap);
        cwork = malloc(cw);
        back = malloc((size_t)h.bytes);
        check(z && cwork && back, "out of memory");
        check(lei_zstd_pack(&a, 1, cwork, cw, z, cap, &len, NULL, err, sizeof err) == 0, err);
        check(lei_zip_parse(z, len, &h2, err, sizeof err) == 0, err);
        check(lei_zstd_unpack(z, len, &h2, work, wn, back, NULL, err, sizeof err) == 0, err);
        check(memcmp(back, out, (size_t)h.bytes) == 0, "zstd round trip differs");
        free(z);
        free(cwork);
        free(back);
    }
    free(p);
    free(work);
    free(out);
    return 0;
}
