/* codec.h: the lecho value format (version 1): varints, a growable write
 * buffer, a bounded reader/validator and the message object that carries an
 * encoded value with pinned zero-copy slices.
 *
 * Lua-free on purpose: this header and codec.c build and are unit-tested
 * without a Lua state (core/test/test_codec.c). The Lua side lives in codec_lua.c.
 * The format itself is specified in doc/wire-format.md, section "Values".
 */
#ifndef LECHO_CODEC_H
#define LECHO_CODEC_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/uio.h>

/* ---- value tags (one byte in front of every value) ------------------- */
enum {
    LEI_T_NIL = 0x00,
    LEI_T_FALSE = 0x01,
    LEI_T_TRUE = 0x02,
    LEI_T_INT = 0x03,    /* zigzag varint */
    LEI_T_DOUBLE = 0x04, /* 8 bytes IEEE-754 little-endian */
    LEI_T_STRING = 0x05, /* varint length, bytes */
    LEI_T_TABLE = 0x06,  /* varint narr, varint nhash, narr values, nhash pairs */
    LEI_T_ARRAY = 0x07   /* varint dtype length, dtype ("<f8"), varint ndim, ndim
                          * varint dims, varint byte length, the bytes */
};

/* ---- arrays: element types, named as NumPy's dtype.str ----------------- */
enum {
    LEI_DT_U1, LEI_DT_I1, LEI_DT_U2, LEI_DT_I2, LEI_DT_U4, LEI_DT_I4,
    LEI_DT_U8, LEI_DT_I8, LEI_DT_F4, LEI_DT_F8, LEI_DT_COUNT
};
#define LEI_ARRAY_MAXDIM 8
/* "<u1" ... "<f8" for a valid dtype, else NULL. */
const char *lei_dtype_name(int dt);
/* Bytes per element (1, 2, 4, 8), 0 for an invalid dtype. */
unsigned lei_dtype_size(int dt);
/* The dtype of a name ("<f8"; "|u1" and "|i1", NumPy's own spelling of the
 * one-byte types, are accepted too), or -1. */
int lei_dtype_parse(const char *s, size_t n);
/* Element count of a shape, and its bytes at itemsize: 0, or -1 when the
 * product overflows 2^62 bytes (a negative dim counts as overflow). */
int lei_shape_bytes(const int64_t *shape, int ndim, unsigned itemsize, uint64_t *count,
                    uint64_t *bytes);

/* ---- error codes: 0 is success, these are all positive --------------- */
enum {
    LEI_ETRUNC = 1, /* "truncated input" */
    LEI_EBADVARINT, /* "invalid varint" */
    LEI_ETAG,       /* "unknown tag" */
    LEI_ESTRLEN,    /* "string too long" */
    LEI_EDEPTH,     /* "nesting too deep" */
    LEI_ECOUNT,     /* "table count exceeds input" */
    LEI_EKEY,       /* "nil or NaN table key" */
    LEI_ETRAIL,     /* "trailing garbage after value" */
    LEI_ENOMEM,     /* "out of memory" */
    LEI_ESIZE,      /* "value decodes to more than max_value_bytes" */
    LEI_EDTYPE,     /* "unknown array dtype" */
    LEI_ENDIM,      /* "array has too many dimensions" */
    LEI_ESHAPE      /* "array shape does not match its bytes" (overflow included) */
};

/* Static message for an error code; never NULL. */
const char *lei_codec_strerror(int code);

/* Largest integer magnitude the encoder writes with the integer tag (2^53). */
#define LEI_INT_EXACT 9007199254740992.0

/* ---- growable write buffer ------------------------------------------- */
/* A zeroed lei_wbuf ({0}) is a valid empty buffer. The buffer owns data
 * (malloc'd); lei_wbuf_free releases it and leaves the buffer empty and
 * reusable. Whoever embeds the lei_wbuf is responsible for calling it. */
typedef struct lei_wbuf {
    char *data; /* rw: owned bytes, valid for len */
    size_t len; /* rw: bytes written */
    size_t cap; /* ro: bytes allocated */
} lei_wbuf;

/* Make room for extra more bytes after len. 0, or -1 on ENOMEM / size
 * overflow (the buffer is then unchanged). */
int lei_wbuf_reserve(lei_wbuf *b, size_t extra);
void lei_wbuf_free(lei_wbuf *b);
/* Append; 0 or -1 (ENOMEM), unchanged on failure. */
int lei_wbuf_put(lei_wbuf *b, const void *p, size_t n);
int lei_wbuf_put_u8(lei_wbuf *b, uint8_t v);
int lei_wbuf_put_varint(lei_wbuf *b, uint64_t v);

/* ---- varints (unsigned LEB128, at most 10 bytes) and zigzag ---------- */
#define LEI_VARINT_MAX 10
/* Writes the minimal encoding of v to out, returns its length (1..10). */
size_t lei_varint_encode(uint8_t out[LEI_VARINT_MAX], uint64_t v);
/* Reads one varint from p[0..n). 0 with *out and *used set, LEI_ETRUNC if
 * the input ends first, LEI_EBADVARINT if a 10th byte is > 1. Non-minimal
 * encodings of at most 10 bytes are accepted. */
int lei_varint_decode(const uint8_t *p, size_t n, uint64_t *out, size_t *used);

static inline uint64_t lei_zigzag_encode(int64_t v) {
    return ((uint64_t)v << 1) ^ (0 - ((uint64_t)v >> 63));
}
static inline int64_t lei_zigzag_decode(uint64_t u) { return (int64_t)((u >> 1) ^ (0 - (u & 1))); }

/* ---- limits ---------------------------------------------------------- */
typedef struct lei_codec_limits {
    size_t max_string;  /* rw: longest string in bytes, inclusive */
    unsigned max_depth; /* rw: most nested tables; 0 forbids tables */
    /* rw: most bytes one value may take once decoded, inclusive, by the
     * estimate LEI_DEC_* below: what a sender can make a decoder allocate */
    size_t max_value_bytes;
} lei_codec_limits;

#define LEI_MAX_STRING_DEFAULT ((size_t)256 << 20) /* 256 MiB */
#define LEI_MAX_VALUE_DEFAULT ((size_t)64 << 20)   /* 64 MiB */
/* The decoded size of a value (an estimate close to LuaJIT's own costs,
 * charged as the reader meets each header, before anything is allocated):
 * a table costs LEI_DEC_TABLE plus LEI_DEC_SLOT per array slot and twice
 * that per hash pair, as announced (a decoder presizes them); a string
 * LEI_DEC_STRING plus its length; a number, boolean or nil nothing beyond
 * the slot it sits in. */
#define LEI_DEC_TABLE 64u
#define LEI_DEC_SLOT 16u
#define LEI_DEC_STRING 24u
/* an array: its header (a userdata, lei_array) plus its bytes */
#define LEI_DEC_ARRAY 192u
#define LEI_MAX_DEPTH_DEFAULT 100u
/* Hard ceiling on max_depth: encoder and decoders recurse on the C stack, so
 * larger settings are treated as this value. */
#define LEI_MAX_DEPTH_CEIL 1000u

void lei_codec_limits_default(lei_codec_limits *lim);

/* ---- C writers: append one value (or a table header) to b ------------ */
/* Return 0 or -1 (ENOMEM). A table is written as lei_enc_table_header then
 * exactly narr values then nhash key/value pairs. */
int lei_enc_nil(lei_wbuf *b);
int lei_enc_bool(lei_wbuf *b, int v);
/* Integer form when x is integral, |x| <= 2^53 and not -0.0; else double. */
int lei_enc_number(lei_wbuf *b, double x);
int lei_enc_string(lei_wbuf *b, const char *s, size_t len);
int lei_enc_table_header(lei_wbuf *b, uint64_t narr, uint64_t nhash);
/* An array's tag, dtype, shape and byte length; its bytes (product(shape)
 * * itemsize, row-major, little-endian) must follow, copied or pinned
 * (lei_msg_add_ext). -1: ENOMEM, bad dtype, ndim or an overflowing shape. */
int lei_enc_array_header(lei_wbuf *b, int dtype, int ndim, const int64_t *shape);

/* ---- reader: one item (tag plus header/scalar body) at a time -------- */
/* Shared by lei_codec_validate and the Lua decoder so that every check lives
 * in one place. It enforces tags, varints, max_string and "table count
 * exceeds input" globally: every announced table slot reserves one byte of the
 * remaining input, so the counts of all open tables together never exceed the
 * input size and a decoder may preallocate them. Depth and key rules are the
 * caller's (it knows where it is); it reports them with LEI_EDEPTH/LEI_EKEY. */
typedef struct lei_item {
    int tag;              /* one of LEI_T_* */
    double num;           /* LEI_T_INT, LEI_T_DOUBLE */
    const uint8_t *str;   /* LEI_T_STRING: points into the input */
    size_t len;           /* LEI_T_STRING */
    uint64_t narr, nhash; /* LEI_T_TABLE: header only, children follow */
    /* LEI_T_ARRAY: str/len are its bytes (any alignment), dtype, ndim and
     * shape the rest; len == product(shape) * lei_dtype_size(dtype) */
    int dtype, ndim;
    int64_t shape[LEI_ARRAY_MAXDIM];
} lei_item;

typedef struct lei_reader {
    const uint8_t *p;   /* ro: input, borrowed, must outlive the reader */
    size_t n;           /* ro: input size */
    size_t pos;         /* ro: next byte to read */
    size_t owed;        /* private: slots announced by open tables, unread */
    size_t max_string;  /* ro: from the limits */
    unsigned max_depth; /* ro: from the limits, clamped to the ceiling */
    size_t max_value;   /* ro: max_value_bytes from the limits */
    size_t size;        /* ro: decoded size charged so far (LEI_DEC_*) */
    size_t err_at;      /* ro: byte offset of the item that failed */
    uint64_t err_val;   /* ro: the offending tag or string length */
} lei_reader;

/* lim may be NULL for the defaults. */
void lei_reader_init(lei_reader *r, const uint8_t *p, size_t n, const lei_codec_limits *lim);
/* Read the next item. 0 or an LEI_E* code (err_at/err_val filled). */
int lei_codec_read_item(lei_reader *r, lei_item *it);
/* After the top value: 0, or LEI_ETRAIL when bytes are left over. */
int lei_reader_finish(lei_reader *r);
/* Detailed message for the reader's last error, e.g. "unknown tag 0x07 at
 * byte 12", "trailing garbage after value (3 bytes)", "nesting too deep
 * (limit 100)", "string too long (N bytes, limit M)", "value decodes to more
 * than N bytes". Returns buf. */
char *lei_reader_strerror(const lei_reader *r, int code, char *buf, size_t len);
/* A nil or NaN key cannot be stored in a Lua table: decoders reject it. */
static inline int lei_codec_bad_key(const lei_item *it) {
    return it->tag == LEI_T_NIL || (it->tag == LEI_T_DOUBLE && it->num != it->num);
}

/* Walk exactly one value in p[0..n) and check every tag, length, count,
 * key and depth, and that it ends exactly at n. 0, or -1 with a static
 * message in *err (err may be NULL). lim may be NULL for the defaults. */
int lei_codec_validate(const uint8_t *p, size_t n, const lei_codec_limits *lim, const char **err);

/* ---- message: an encoded value with pinned zero-copy slices ---------- */

/* A pinned external slice: len bytes at ptr are logically inserted at offset
 * `at` of own[]. ptr is borrowed; ref is the owner's handle that keeps it alive
 * (a Lua registry reference), given back through lei_unpin_fn on release. */
typedef struct lei_ext {
    size_t at;
    const char *ptr;
    size_t len;
    int ref;
} lei_ext;

typedef struct lei_msg {
    int refcnt;   /* rw: owners; freed by lei_msg_release when it drops to 0 */
    lei_wbuf own; /* owned encoded bytes */
    lei_ext *ext; /* owned array of pinned external slices, increasing `at` */
    int next;     /* ro: number of used entries in ext */
    int ext_cap;  /* ro: allocated entries in ext */
    size_t total; /* ro: own.len + sum of ext[i].len: the encoded size */
    /* NULL; or own's bytes are lent by another owner (lua_rec.c: a
     * recorder's chunk, the event's record written around them), and
     * lei_msg_release calls lent(lent_ud, m) when the last reference goes,
     * in place of freeing own.data.  Such a message is complete: nobody
     * appends to it (own.cap == own.len). */
    void (*lent)(void *ud, struct lei_msg *m);
    void *lent_ud;
} lei_msg;

typedef void (*lei_unpin_fn)(void *ud, int ref);

/* New empty message with refcnt 1, or NULL (ENOMEM). */
lei_msg *lei_msg_new(void);
/* Drop one reference. When the count reaches 0, calls unpin(ud, ref) for each
 * ext (if unpin is not NULL), gives own's bytes back (m->lent, or free) and
 * frees the message. NULL is a no-op. */
void lei_msg_release(lei_msg *m, lei_unpin_fn unpin, void *ud);
/* Append a pinned slice at the current end of own; takes over ref on success
 * (0). -1 on ENOMEM: the caller still owns ref. Call lei_msg_sync after. */
int lei_msg_add_ext(lei_msg *m, const char *ptr, size_t len, int ref);
/* Recompute total after writing to m->own directly (e.g. with lei_enc_*). */
void lei_msg_sync(lei_msg *m);
/* Fill at most max iovecs describing the message bytes from offset skip on
 * (to resume after a partial write). Returns the count; *covered (may be NULL)
 * gets the number of bytes they describe. 0 when skip >= total. The iovecs
 * point into m and its pinned slices: valid while m is alive and unchanged. */
int lei_msg_iov(const lei_msg *m, size_t skip, struct iovec *iov, int max, size_t *covered);
/* Copy all total bytes to out (which must hold m->total). Returns 0. */
int lei_msg_flatten(const lei_msg *m, char *out);
/* m's total bytes in one piece: its own buffer when it has no pinned
 * slices (*tmp NULL), else a copy in *tmp (malloc'd, owned by the caller,
 * who frees it); NULL when that copy cannot be made.  Inline: a
 * modulated producer's submit calls it per event. */
static inline const uint8_t *lei_msg_bytes(const lei_msg *m, uint8_t **tmp) {
    *tmp = NULL;
    if (m->next == 0) return (const uint8_t *)m->own.data;
    *tmp = malloc(m->total ? m->total : 1);
    if (!*tmp) return NULL;
    lei_msg_flatten(m, (char *)*tmp);
    return *tmp;
}

/* ---- Lua bridge (codec_lua.c; declared here without lua.h) ------------ */
/* lei_encode_lua: encode the value at idx, appending to m; strings of at least
 *   pin_threshold bytes (0 = never) are pinned as lei_ext with a registry
 *   reference (release m with an unpin fn that calls luaL_unref). 0, or
 *   -LEI_E_NOMEM, -LEI_E_LIMIT or -LEI_E_INVALID (errors.h; set where the
 *   encoding failed) with err filled, m restored to its state on entry and nothing new pinned.
 * lei_decode_lua: push exactly one value decoded from p[0..n): 0; or push
 *   nothing and return -LEI_E_INVALID, -LEI_E_LIMIT or -LEI_E_NOMEM
 *   (errors.h; set where the decoding failed) with err filled.
 * lei_codec_lua_setfuncs: set encode/decode/validate in the table on top.
 * lim may be NULL for the defaults. None of them raise except on Lua memory
 * errors. */
struct lua_State;
int lei_encode_lua(struct lua_State *L, int idx, lei_msg *m, const lei_codec_limits *lim,
                   size_t pin_threshold, char *err, size_t errlen);
/* lei_encode_lua, and on a failure *why (why may be NULL) is LEI_ESIZE when
 * max_value_bytes stopped it (set where the limit was met), else 0. */
int lei_codec_lua_encode(struct lua_State *L, int idx, lei_msg *m, const lei_codec_limits *lim,
                         size_t pin_threshold, char *err, size_t errlen, int *why);
int lei_decode_lua(struct lua_State *L, const uint8_t *p, size_t n, const lei_codec_limits *lim,
                   char *err, size_t errlen);
void lei_codec_lua_setfuncs(struct lua_State *L);
int luaopen_lecho_codec(struct lua_State *L);

#endif
