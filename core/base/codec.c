/* codec.c: the lecho value format without Lua: write buffer, varints,
 * C writers, the bounded reader, the validator and the message object.
 * Leans on libc only. Format: doc/wire-format.md, "Values".
 */
#include "codec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *lei_codec_strerror(int code) {
    switch (code) {
    case 0: return "ok";
    case LEI_ETRUNC: return "truncated input";
    case LEI_EBADVARINT: return "invalid varint";
    case LEI_ETAG: return "unknown tag";
    case LEI_ESTRLEN: return "string too long";
    case LEI_EDEPTH: return "nesting too deep";
    case LEI_ECOUNT: return "table count exceeds input";
    case LEI_EKEY: return "nil or NaN table key";
    case LEI_ETRAIL: return "trailing garbage after value";
    case LEI_ENOMEM: return "out of memory";
    case LEI_ESIZE: return "value decodes to more than max_value_bytes";
    case LEI_EDTYPE: return "unknown array dtype";
    case LEI_ENDIM: return "array has too many dimensions";
    case LEI_ESHAPE: return "array shape does not match its bytes";
    default: return "unknown codec error";
    }
}

/* ---- array element types ------------------------------------------- */

static const char dt_names[LEI_DT_COUNT][4] = {"<u1", "<i1", "<u2", "<i2", "<u4",
                                                "<i4", "<u8", "<i8", "<f4", "<f8"};
static const unsigned char dt_sizes[LEI_DT_COUNT] = {1, 1, 2, 2, 4, 4, 8, 8, 4, 8};

const char *lei_dtype_name(int dt) { return dt >= 0 && dt < LEI_DT_COUNT ? dt_names[dt] : NULL; }

unsigned lei_dtype_size(int dt) { return dt >= 0 && dt < LEI_DT_COUNT ? dt_sizes[dt] : 0; }

int lei_dtype_parse(const char *s, size_t n) {
    int i;
    if (n != 3) return -1;
    if (s[0] == '|' && s[2] == '1') { /* NumPy writes the one-byte types so */
        if (s[1] == 'u') return LEI_DT_U1;
        if (s[1] == 'i') return LEI_DT_I1;
        return -1;
    }
    for (i = 0; i < LEI_DT_COUNT; i++)
        if (memcmp(s, dt_names[i], 3) == 0) return i;
    return -1;
}

#define SHAPE_MAX_BYTES ((uint64_t)1 << 62)

int lei_shape_bytes(const int64_t *shape, int ndim, unsigned itemsize, uint64_t *count,
                    uint64_t *bytes) {
    uint64_t c = 1;
    int i;
    for (i = 0; i < ndim; i++) {
        if (shape[i] < 0) return -1;
        if (shape[i] == 0) c = 0;
        else if (c && (uint64_t)shape[i] > SHAPE_MAX_BYTES / c) return -1;
        else c *= (uint64_t)shape[i];
    }
    if (c > SHAPE_MAX_BYTES / (itemsize ? itemsize : 1)) return -1;
    /* a zero dim after a huge one: the product is 0, still refuse dims
     * that alone pass the bound (no reader could walk them) */
    for (i = 0; i < ndim; i++)
        if ((uint64_t)shape[i] > SHAPE_MAX_BYTES) return -1;
    *count = c;
    *bytes = c * itemsize;
    return 0;
}

/* ---- write buffer ---------------------------------------------------- */

int lei_wbuf_reserve(lei_wbuf *b, size_t extra) {
    size_t need, ncap;
    char *nd;

    if (extra <= b->cap - b->len) return 0;
    if (extra > SIZE_MAX - b->len) return -1;
    need = b->len + extra;
    ncap = b->cap ? b->cap : 64;
    while (ncap < need) ncap = ncap > SIZE_MAX / 2 ? need : ncap * 2;
    nd = realloc(b->data, ncap);
    if (!nd) return -1;
    b->data = nd;
    b->cap = ncap;
    return 0;
}

void lei_wbuf_free(lei_wbuf *b) {
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

int lei_wbuf_put(lei_wbuf *b, const void *p, size_t n) {
    if (lei_wbuf_reserve(b, n)) return -1;
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
    return 0;
}

int lei_wbuf_put_u8(lei_wbuf *b, uint8_t v) {
    if (lei_wbuf_reserve(b, 1)) return -1;
    b->data[b->len++] = (char)v;
    return 0;
}

int lei_wbuf_put_varint(lei_wbuf *b, uint64_t v) {
    if (lei_wbuf_reserve(b, LEI_VARINT_MAX)) return -1;
    b->len += lei_varint_encode((uint8_t *)b->data + b->len, v);
    return 0;
}

/* ---- varints --------------------------------------------------------- */

size_t lei_varint_encode(uint8_t out[LEI_VARINT_MAX], uint64_t v) {
    size_t i = 0;
    while (v >= 0x80) {
        out[i++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    out[i++] = (uint8_t)v;
    return i;
}

int lei_varint_decode(const uint8_t *p, size_t n, uint64_t *out, size_t *used) {
    uint64_t v = 0;
    size_t i;

    for (i = 0; i < LEI_VARINT_MAX; i++) {
        uint8_t c;
        if (i >= n) return LEI_ETRUNC;
        c = p[i];
        if (i == LEI_VARINT_MAX - 1 && c > 1) return LEI_EBADVARINT;
        v |= (uint64_t)(c & 0x7f) << (7 * i);
        if (!(c & 0x80)) {
            *out = v;
            *used = i + 1;
            return 0;
        }
    }
    return LEI_EBADVARINT; /* not reached: the 10th byte is 0 or 1 */
}

void lei_codec_limits_default(lei_codec_limits *lim) {
    lim->max_string = LEI_MAX_STRING_DEFAULT;
    lim->max_depth = LEI_MAX_DEPTH_DEFAULT;
    lim->max_value_bytes = LEI_MAX_VALUE_DEFAULT;
}

/* ---- C writers ------------------------------------------------------- */

int lei_enc_nil(lei_wbuf *b) { return lei_wbuf_put_u8(b, LEI_T_NIL); }

int lei_enc_bool(lei_wbuf *b, int v) { return lei_wbuf_put_u8(b, v ? LEI_T_TRUE : LEI_T_FALSE); }

int lei_enc_number(lei_wbuf *b, double x) {
    uint8_t *o;
    uint64_t u;
    int i;

    if (lei_wbuf_reserve(b, 1 + LEI_VARINT_MAX)) return -1;
    o = (uint8_t *)b->data + b->len;
    /* NaN fails both comparisons; the range check keeps the cast defined */
    if (x >= -LEI_INT_EXACT && x <= LEI_INT_EXACT && (double)(int64_t)x == x &&
        !(x == 0 && 1 / x < 0)) {
        o[0] = LEI_T_INT;
        b->len += 1 + lei_varint_encode(o + 1, lei_zigzag_encode((int64_t)x));
        return 0;
    }
    o[0] = LEI_T_DOUBLE;
    memcpy(&u, &x, 8);
    for (i = 0; i < 8; i++) o[1 + i] = (uint8_t)(u >> (8 * i));
    b->len += 9;
    return 0;
}

int lei_enc_string(lei_wbuf *b, const char *s, size_t len) {
    if (len > SIZE_MAX - 1 - LEI_VARINT_MAX || lei_wbuf_reserve(b, 1 + LEI_VARINT_MAX + len))
        return -1;
    b->data[b->len++] = LEI_T_STRING;
    b->len += lei_varint_encode((uint8_t *)b->data + b->len, len);
    if (len) memcpy(b->data + b->len, s, len);
    b->len += len;
    return 0;
}

int lei_enc_table_header(lei_wbuf *b, uint64_t narr, uint64_t nhash) {
    if (lei_wbuf_reserve(b, 1 + 2 * LEI_VARINT_MAX)) return -1;
    b->data[b->len++] = LEI_T_TABLE;
    b->len += lei_varint_encode((uint8_t *)b->data + b->len, narr);
    b->len += lei_varint_encode((uint8_t *)b->data + b->len, nhash);
    return 0;
}

int lei_enc_array_header(lei_wbuf *b, int dtype, int ndim, const int64_t *shape) {
    uint64_t count, bytes;
    int i;
    if (!lei_dtype_size(dtype) || ndim < 0 || ndim > LEI_ARRAY_MAXDIM ||
        lei_shape_bytes(shape, ndim, lei_dtype_size(dtype), &count, &bytes))
        return -1;
    if (lei_wbuf_reserve(b, 5 + (size_t)(ndim + 2) * LEI_VARINT_MAX)) return -1;
    b->data[b->len++] = LEI_T_ARRAY;
    b->data[b->len++] = 3;
    memcpy(b->data + b->len, dt_names[dtype], 3);
    b->len += 3;
    b->len += lei_varint_encode((uint8_t *)b->data + b->len, (uint64_t)ndim);
    for (i = 0; i < ndim; i++)
        b->len += lei_varint_encode((uint8_t *)b->data + b->len, (uint64_t)shape[i]);
    b->len += lei_varint_encode((uint8_t *)b->data + b->len, bytes);
    return 0;
}

/* ---- reader ---------------------------------------------------------- */

void lei_reader_init(lei_reader *r, const uint8_t *p, size_t n, const lei_codec_limits *lim) {
    lei_codec_limits d;
    if (!lim) {
        lei_codec_limits_default(&d);
        lim = &d;
    }
    r->p = p;
    r->n = n;
    r->pos = 0;
    r->owed = 0;
    r->max_string = lim->max_string;
    r->max_depth = lim->max_depth > LEI_MAX_DEPTH_CEIL ? LEI_MAX_DEPTH_CEIL : lim->max_depth;
    r->max_value = lim->max_value_bytes;
    r->size = 0;
    r->err_at = 0;
    r->err_val = 0;
}

static int rd_varint(lei_reader *r, uint64_t *v) {
    size_t used;
    int rc;
    if (r->pos < r->n && r->p[r->pos] < 0x80) { /* one byte: most counts and lengths */
        *v = r->p[r->pos++];
        return 0;
    }
    rc = lei_varint_decode(r->p + r->pos, r->n - r->pos, v, &used);
    if (rc == 0) r->pos += used;
    return rc;
}

/* Charges cost to the decoded size: 0, or LEI_ESIZE past max_value. */
static int charge(lei_reader *r, size_t cost) {
    if (cost > r->max_value - r->size) return LEI_ESIZE;
    r->size += cost;
    return 0;
}

/* Contract: every call after the first reads one slot announced by an open
 * table (that is how callers walk), so it pays back one owed byte.  The
 * decoded size is charged here, a table's announced slots with its header,
 * so a decoder that presizes never allocates past max_value_bytes. */
int lei_codec_read_item(lei_reader *r, lei_item *it) {
    size_t start = r->pos, avail;
    uint64_t a, h, u;
    int rc, i;

    if (r->owed) r->owed--;
    r->err_at = start;
    if (r->pos >= r->n) return LEI_ETRUNC;
    it->tag = r->p[r->pos++];
    switch (it->tag) {
    case LEI_T_NIL:
    case LEI_T_FALSE:
    case LEI_T_TRUE: return 0;
    case LEI_T_INT:
        if ((rc = rd_varint(r, &u))) return rc;
        it->num = (double)lei_zigzag_decode(u);
        return 0;
    case LEI_T_DOUBLE:
        if (r->n - r->pos < 8) return LEI_ETRUNC;
        for (u = 0, i = 0; i < 8; i++) u |= (uint64_t)r->p[r->pos + i] << (8 * i);
        memcpy(&it->num, &u, 8);
        r->pos += 8;
        return 0;
    case LEI_T_STRING:
        if ((rc = rd_varint(r, &u))) return rc;
        if (u > r->max_string) {
            r->err_val = u;
            return LEI_ESTRLEN;
        }
        if (u > r->n - r->pos) return LEI_ETRUNC;
        if ((rc = charge(r, LEI_DEC_STRING + (size_t)u))) return rc;
        it->str = r->p + r->pos;
        it->len = (size_t)u;
        r->pos += (size_t)u;
        return 0;
    case LEI_T_TABLE:
        if ((rc = rd_varint(r, &a)) || (rc = rd_varint(r, &h))) return rc;
        /* owed <= n - pos holds: each owed slot still needs a byte */
        avail = r->n - r->pos - r->owed;
        if (a > avail || h > (avail - a) / 2) return LEI_ECOUNT;
        /* a + 2h <= n: no overflow below for any input that fits in memory */
        if ((rc = charge(r, LEI_DEC_TABLE + LEI_DEC_SLOT * (size_t)(a + 2 * h)))) return rc;
        it->narr = a;
        it->nhash = h;
        r->owed += (size_t)(a + 2 * h);
        return 0;
    case LEI_T_ARRAY: {
        uint64_t count, bytes;
        int d;
        if ((rc = rd_varint(r, &u))) return rc;
        if (u > r->n - r->pos) return LEI_ETRUNC;
        if ((it->dtype = lei_dtype_parse((const char *)r->p + r->pos, (size_t)u)) < 0)
            return LEI_EDTYPE;
        r->pos += (size_t)u;
        if ((rc = rd_varint(r, &u))) return rc;
        if (u > LEI_ARRAY_MAXDIM) {
            r->err_val = u;
            return LEI_ENDIM;
        }
        it->ndim = (int)u;
        for (d = 0; d < it->ndim; d++) {
            if ((rc = rd_varint(r, &u))) return rc;
            if (u > SHAPE_MAX_BYTES) return LEI_ESHAPE;
            it->shape[d] = (int64_t)u;
        }
        if ((rc = rd_varint(r, &u))) return rc;
        if (lei_shape_bytes(it->shape, it->ndim, lei_dtype_size(it->dtype), &count, &bytes) ||
            bytes != u)
            return LEI_ESHAPE;
        /* within the input, and the open tables' slots still have a byte
         * each after these (the table count check's invariant) */
        if (u > r->n - r->pos || r->owed > r->n - r->pos - u) return LEI_ETRUNC;
        if ((rc = charge(r, LEI_DEC_ARRAY + (size_t)u))) return rc;
        it->str = r->p + r->pos;
        it->len = (size_t)u;
        r->pos += (size_t)u;
        return 0;
    }
    default:
        r->err_val = (uint64_t)it->tag;
        r->pos = start;
        return LEI_ETAG;
    }
}

int lei_reader_finish(lei_reader *r) {
    if (r->pos != r->n) {
        r->err_at = r->pos;
        return LEI_ETRAIL;
    }
    return 0;
}

char *lei_reader_strerror(const lei_reader *r, int code, char *buf, size_t len) {
    switch (code) {
    case LEI_ETAG:
        snprintf(buf, len, "unknown tag 0x%02x at byte %zu", (unsigned)r->err_val, r->err_at);
        break;
    case LEI_ETRAIL:
        snprintf(buf, len, "trailing garbage after value (%zu bytes)", r->n - r->pos);
        break;
    case LEI_EDEPTH: snprintf(buf, len, "nesting too deep (limit %u)", r->max_depth); break;
    case LEI_ESIZE: snprintf(buf, len, "value decodes to more than %zu bytes", r->max_value); break;
    case LEI_EDTYPE:
    case LEI_ESHAPE:
        snprintf(buf, len, "%s at byte %zu", lei_codec_strerror(code), r->err_at);
        break;
    case LEI_ENDIM:
        snprintf(buf, len, "array has too many dimensions (%llu, limit %d) at byte %zu",
                 (unsigned long long)r->err_val, LEI_ARRAY_MAXDIM, r->err_at);
        break;
    case LEI_ESTRLEN:
        snprintf(buf, len, "string too long (%llu bytes, limit %zu)",
                 (unsigned long long)r->err_val, r->max_string);
        break;
    default: snprintf(buf, len, "%s", lei_codec_strerror(code)); break;
    }
    return buf;
}

/* depth = number of tables enclosing this value */
static int validate_value(lei_reader *r, unsigned depth, int is_key) {
    lei_item it;
    uint64_t i;
    int rc;

    if ((rc = lei_codec_read_item(r, &it))) return rc;
    if (is_key && lei_codec_bad_key(&it)) return LEI_EKEY;
    if (it.tag != LEI_T_TABLE) return 0;
    if (depth >= r->max_depth) return LEI_EDEPTH;
    for (i = 0; i < it.narr; i++)
        if ((rc = validate_value(r, depth + 1, 0))) return rc;
    for (i = 0; i < it.nhash; i++)
        if ((rc = validate_value(r, depth + 1, 1)) || (rc = validate_value(r, depth + 1, 0)))
            return rc;
    return 0;
}

int lei_codec_validate(const uint8_t *p, size_t n, const lei_codec_limits *lim, const char **err) {
    lei_reader r;
    int rc;

    lei_reader_init(&r, p, n, lim);
    rc = validate_value(&r, 0, 0);
    if (!rc) rc = lei_reader_finish(&r);
    if (err) *err = rc ? lei_codec_strerror(rc) : NULL;
    return rc ? -1 : 0;
}

/* ---- message --------------------------------------------------------- */

lei_msg *lei_msg_new(void) {
    lei_msg *m = calloc(1, sizeof *m);
    if (m) m->refcnt = 1;
    return m;
}

void lei_msg_release(lei_msg *m, lei_unpin_fn unpin, void *ud) {
    int i;

    if (!m || --m->refcnt > 0) return;
    if (unpin)
        for (i = 0; i < m->next; i++) unpin(ud, m->ext[i].ref);
    if (m->lent)
        m->lent(m->lent_ud, m); /* own's bytes are its lender's */
    else
        lei_wbuf_free(&m->own);
    free(m->ext);
    free(m);
}

int lei_msg_add_ext(lei_msg *m, const char *ptr, size_t len, int ref) {
    if (m->next == m->ext_cap) {
        int ncap = m->ext_cap ? m->ext_cap * 2 : 4;
        lei_ext *ne;
        if (m->ext_cap > (1 << 28) || !(ne = realloc(m->ext, (size_t)ncap * sizeof *ne))) return -1;
        m->ext = ne;
        m->ext_cap = ncap;
    }
    m->ext[m->next].at = m->own.len;
    m->ext[m->next].ptr = ptr;
    m->ext[m->next].len = len;
    m->ext[m->next].ref = ref;
    m->next++;
    return 0;
}

void lei_msg_sync(lei_msg *m) {
    size_t t = m->own.len;
    int i;
    for (i = 0; i < m->next; i++) t += m->ext[i].len;
    m->total = t;
}

int lei_msg_iov(const lei_msg *m, size_t skip, struct iovec *iov, int max, size_t *covered) {
    size_t cov = 0, pos = 0; /* pos: own bytes already visited */
    int cnt = 0, i;

    /* segment 2*i is own[pos .. ext[i].at), segment 2*i+1 is ext[i];
	 * the last own segment runs to own.len */
    for (i = 0; i <= m->next && cnt < max; i++) {
        int k;
        for (k = 0; k < 2 && cnt < max; k++) {
            const char *p;
            size_t len;
            if (k == 0) {
                size_t end = i < m->next ? m->ext[i].at : m->own.len;
                len = end - pos;
                p = len ? m->own.data + pos : NULL;
                pos = end;
            } else {
                if (i == m->next) break;
                p = m->ext[i].ptr;
                len = m->ext[i].len;
            }
            if (len <= skip) {
                skip -= len;
                continue;
            }
            p += skip;
            len -= skip;
            skip = 0;
            iov[cnt].iov_base = (void *)p;
            iov[cnt].iov_len = len;
            cnt++;
            cov += len;
        }
    }
    if (covered) *covered = cov;
    return cnt;
}

int lei_msg_flatten(const lei_msg *m, char *out) {
    size_t pos = 0;
    int i;

    for (i = 0; i < m->next; i++) {
        size_t n = m->ext[i].at - pos;
        if (n) memcpy(out, m->own.data + pos, n);
        out += n;
        pos = m->ext[i].at;
        if (m->ext[i].len) memcpy(out, m->ext[i].ptr, m->ext[i].len);
        out += m->ext[i].len;
    }
    if (m->own.len > pos) memcpy(out, m->own.data + pos, m->own.len - pos);
    return 0;
}
