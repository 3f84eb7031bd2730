/* test_frame.c: unit tests for frame.c without sockets or Lua: lei_frame_next
 * on partial, empty, oversized and back-to-back input, build/parse roundtrips
 * of HELLO, EVENT, ACK and BIND with every rejection, and a deterministic
 * random-mutation loop over all parsers.  Prints "N passed, N failed" and
 * exits nonzero on failure.
 *
 *   make ctest                       (builds build/test_frame and runs it)
 *   make ctest SAN="-fsanitize=address,undefined" LDFLAGS="-fsanitize=address,undefined"
 */
#include "codec.h"
#include "frame.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"

#define STREQ(a, b) ((a) != NULL && strcmp((a), (b)) == 0)

/* A heap copy of exactly n bytes, so that ASan sees any read past the end
 * (a stack buffer would hide it behind the bytes that follow). */
static uint8_t *dup_exact(const uint8_t *p, size_t n) {
    uint8_t *d = malloc(n ? n : 1);
    if (!d) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    if (n) memcpy(d, p, n);
    return d;
}

static uint32_t rd_u32le(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Frame header for type with a body of blen bytes, then the body. */
static size_t mkframe(uint8_t *out, uint8_t type, const void *body, size_t blen) {
    lei_frame_hdr(out, type, blen);
    if (blen) memcpy(out + LEI_FRAME_HDR, body, blen);
    return LEI_FRAME_HDR + blen;
}

/* ---- lei_frame_next ----------------------------------------------------- */

static void test_frame_next(void) {
    uint8_t buf[256];
    lei_frame f;
    const char *err;
    size_t n;

    /* header layout */
    CHECK(lei_frame_hdr(buf, LEI_F_CTRL, 7) == LEI_FRAME_HDR);
    CHECK(rd_u32le(buf) == 8 && buf[4] == LEI_F_CTRL);

    /* a complete frame is found; every truncation of it needs more */
    n = mkframe(buf, LEI_F_CTRL, "hello", 5);
    CHECK(n == 10);
    for (size_t k = 0; k < n; k++) {
        uint8_t *d = dup_exact(buf, k);
        err = NULL;
        CHECK(lei_frame_next(d, k, 1024, &f, &err) == 0);
        CHECK(err == NULL);
        free(d);
    }
    {
        uint8_t *d = dup_exact(buf, n);
        err = NULL;
        CHECK(lei_frame_next(d, n, 1024, &f, &err) == 1);
        CHECK(f.type == LEI_F_CTRL && f.len == 5 && f.size == 10);
        CHECK(f.body == d + LEI_FRAME_HDR && memcmp(f.body, "hello", 5) == 0);
        free(d);
    }

    /* a frame with only a type byte (length 1) is complete with an empty body */
    n = mkframe(buf, 9, NULL, 0);
    CHECK(n == LEI_FRAME_HDR && rd_u32le(buf) == 1);
    CHECK(lei_frame_next(buf, 4, 1024, &f, &err) == 0);
    CHECK(lei_frame_next(buf, 5, 1024, &f, &err) == 1 && f.type == 9 && f.len == 0 &&
          f.size == 5);

    /* length 0 is an error as soon as the four length bytes are in */
    memset(buf, 0, 8);
    for (size_t k = 0; k < 4; k++) CHECK(lei_frame_next(buf, k, 1024, &f, &err) == 0);
    err = NULL;
    CHECK(lei_frame_next(buf, 4, 1024, &f, &err) == -LEI_E_PROTOCOL &&
          STREQ(err, "frame of length 0"));
    err = NULL;
    CHECK(lei_frame_next(buf, 8, 1024, &f, &err) == -LEI_E_PROTOCOL &&
          STREQ(err, "frame of length 0"));

    /* over the limit: an error before the body arrives (no waiting for 2 GiB) */
    buf[0] = 0xff, buf[1] = 0xff, buf[2] = 0xff, buf[3] = 0x7f, buf[4] = LEI_F_EVENT;
    for (size_t k = 0; k < 4; k++) CHECK(lei_frame_next(buf, k, 1024, &f, &err) == 0);
    err = NULL;
    CHECK(lei_frame_next(buf, 4, 1024, &f, &err) == -LEI_E_PROTOCOL &&
          STREQ(err, "frame length exceeds limit"));
    err = NULL;
    CHECK(lei_frame_next(buf, 5, (size_t)1 << 30, &f, &err) == -LEI_E_PROTOCOL &&
          STREQ(err, "frame length exceeds limit"));
    buf[0] = buf[1] = buf[2] = buf[3] = 0xff; /* 4 GiB - 1 */
    err = NULL;
    CHECK(lei_frame_next(buf, 5, (size_t)1 << 30, &f, &err) == -LEI_E_PROTOCOL &&
          STREQ(err, "frame length exceeds limit"));

    /* exactly at the limit is fine, one above is not */
    n = mkframe(buf, LEI_F_CTRL, "abcdefghi", 9); /* length field 10 */
    CHECK(lei_frame_next(buf, n, 10, &f, &err) == 1 && f.len == 9);
    err = NULL;
    CHECK(lei_frame_next(buf, n, 9, &f, &err) == -LEI_E_PROTOCOL &&
          STREQ(err, "frame length exceeds limit"));

    /* exact frames back to back, walked the way the reader walks them */
    {
        static const char *bodies[] = {"", "a", "bc", "defgh", "", "0123456789abcdef"};
        const size_t nb = sizeof bodies / sizeof bodies[0];
        size_t total = 0, off = 0, got = 0;
        for (size_t i = 0; i < nb; i++)
            total += mkframe(buf + total, (uint8_t)(i + 1), bodies[i], strlen(bodies[i]));
        uint8_t *d = dup_exact(buf, total);
        for (;;) {
            int r = lei_frame_next(d + off, total - off, 1024, &f, &err);
            if (r != 1) {
                CHECK(r == 0);
                break;
            }
            CHECK(got < nb);
            if (got >= nb) break;
            CHECK(f.type == got + 1);
            CHECK(f.len == strlen(bodies[got]) && memcmp(f.body, bodies[got], f.len) == 0);
            CHECK(f.size == f.len + LEI_FRAME_HDR);
            off += f.size;
            got++;
        }
        CHECK(got == nb && off == total);
        free(d);
        /* the same stream cut in the middle of the fourth frame: three, then need-more */
        size_t cut = 0;
        for (size_t i = 0; i < 3; i++) cut += LEI_FRAME_HDR + strlen(bodies[i]);
        d = dup_exact(buf, cut + 6);
        off = got = 0;
        while (lei_frame_next(d + off, cut + 6 - off, 1024, &f, &err) == 1) {
            off += f.size;
            got++;
        }
        CHECK(got == 3 && off == cut);
        free(d);
    }
}

/* ---- HELLO ---------------------------------------------------------------- */

/* Builds the body of a HELLO by hand: magic, u16 big-endian version,
 * varint incarnation, varint alen, then addr bytes (alen may lie), then
 * the mode byte (protected). */
static size_t hello_body(uint8_t *out, const char *magic, unsigned version, uint64_t inc,
                         uint64_t alen, const char *addr, size_t addr_bytes) {
    size_t pos = 0;
    memcpy(out, magic, 4);
    pos = 4;
    out[pos++] = (uint8_t)(version >> 8);
    out[pos++] = (uint8_t)version;
    pos += lei_varint_encode(out + pos, inc);
    pos += lei_varint_encode(out + pos, alen);
    memcpy(out + pos, addr, addr_bytes);
    out[pos + addr_bytes] = LEI_MODE_PROTECTED; /* v2: the mode byte */
    return pos + addr_bytes + 1;
}

static int parse_hello_exact(const uint8_t *b, size_t n, lei_hello *h, const char **err) {
    uint8_t *d = dup_exact(b, n);
    int r = lei_parse_hello(d, n, h, err);
    free(d);
    return r;
}

static void test_hello(void) {
    uint8_t buf[LEI_HELLO_MAX], body[LEI_HELLO_MAX];
    lei_hello h;
    lei_frame f;
    const char *err;
    size_t n;

    /* roundtrip, both frame types, small and huge incarnations */
    static const uint64_t incs[] = {0, 1, 127, 128, 0x123456789abcdefull, UINT64_MAX};
    for (size_t i = 0; i < sizeof incs / sizeof incs[0]; i++) {
        uint8_t type = i & 1 ? LEI_F_HELLO_OK : LEI_F_HELLO;
        n = lei_frame_hello(buf, type, LEI_PROTO_VERSION, incs[i], "127.0.0.1:7700", NULL);
        CHECK(n <= LEI_HELLO_MAX);
        CHECK(lei_frame_next(buf, n, 1024, &f, &err) == 1 && f.size == n && f.type == type);
        memset(&h, 0xa5, sizeof h);
        err = NULL;
        CHECK(parse_hello_exact(f.body, f.len, &h, &err) == 0 && err == NULL);
        CHECK(h.version == LEI_PROTO_VERSION && h.incarnation == incs[i]);
        CHECK(strcmp(h.addr, "127.0.0.1:7700") == 0);
    }
    /* wire layout: magic then big-endian version */
    n = lei_frame_hello(buf, LEI_F_HELLO, 0x0102, 5, "a:1", NULL);
    CHECK(memcmp(buf + LEI_FRAME_HDR, "LECH", 4) == 0);
    CHECK(buf[LEI_FRAME_HDR + 4] == 0x01 && buf[LEI_FRAME_HDR + 5] == 0x02);
    CHECK(buf[LEI_FRAME_HDR + 6] == 5 && buf[LEI_FRAME_HDR + 7] == 3);
    CHECK(n == LEI_FRAME_HDR + 8 + 3 + 1 && buf[n - 1] == LEI_MODE_PROTECTED);

    /* the longest address that fits (LEI_ADDR_MAX - 1 bytes) roundtrips; a longer one is cut to it */
    {
        char addr[LEI_ADDR_MAX + 40];
        memset(addr, 'x', sizeof addr);
        addr[LEI_ADDR_MAX - 1] = '\0';
        n = lei_frame_hello(buf, LEI_F_HELLO, LEI_PROTO_VERSION, UINT64_MAX, addr, NULL);
        CHECK(n <= LEI_HELLO_MAX);
        CHECK(lei_frame_next(buf, n, 1024, &f, &err) == 1);
        CHECK(parse_hello_exact(f.body, f.len, &h, &err) == 0 && strcmp(h.addr, addr) == 0);
        memset(addr, 'y', sizeof addr);
        addr[sizeof addr - 1] = '\0';
        n = lei_frame_hello(buf, LEI_F_HELLO, LEI_PROTO_VERSION, UINT64_MAX, addr, NULL);
        CHECK(n <= LEI_HELLO_MAX);
        CHECK(lei_frame_next(buf, n, 1024, &f, &err) == 1);
        CHECK(parse_hello_exact(f.body, f.len, &h, &err) == 0 &&
              strlen(h.addr) == LEI_ADDR_MAX - 1);
    }

    /* bad magic, including bodies shorter than the magic */
    n = hello_body(body, "LECX", 1, 1, 3, "a:1", 3);
    err = NULL;
    CHECK(parse_hello_exact(body, n, &h, &err) == -LEI_E_PROTOCOL &&
          STREQ(err, "bad magic in handshake (not a lecho peer)"));
    n = hello_body(body, "GET ", 1, 1, 3, "a:1", 3);
    err = NULL;
    CHECK(parse_hello_exact(body, n, &h, &err) == -LEI_E_PROTOCOL && err &&
          strstr(err, "bad magic"));
    for (size_t k = 0; k < 4; k++) {
        err = NULL;
        CHECK(parse_hello_exact((const uint8_t *)"LECH", k, &h, &err) == -LEI_E_PROTOCOL && err &&
              strstr(err, "bad magic"));
    }

    /* other versions: reported through h->version, nothing else parsed */
    {
        static const unsigned vers[] = {0, 1, 2, 4, 0x0100, 0xffff};
        for (size_t i = 0; i < sizeof vers / sizeof vers[0]; i++) {
            n = hello_body(body, "LECH", vers[i], 7, 3, "a:1", 3);
            memset(&h, 0, sizeof h);
            h.incarnation = 42;
            strcpy(h.addr, "untouched");
            err = NULL;
            CHECK(parse_hello_exact(body, n, &h, &err) == 0 && err == NULL);
            CHECK(h.version == vers[i]);
            CHECK(h.incarnation == 42 && strcmp(h.addr, "untouched") == 0);
        }
        /* ... even when what follows the version would not parse as version 2 */
        memcpy(body, "LECH\x00\x01\xff\xff\xff", 9);
        h.version = 0;
        CHECK(parse_hello_exact(body, 6, &h, &err) == 0 && h.version == 1);
        CHECK(parse_hello_exact(body, 9, &h, &err) == 0 && h.version == 1);
        /* a version-4 HELLO frame built by the library parses the same way */
        n = lei_frame_hello(buf, LEI_F_HELLO, 4, 9, "127.0.0.1:1", NULL);
        CHECK(lei_frame_next(buf, n, 1024, &f, &err) == 1);
        CHECK(parse_hello_exact(f.body, f.len, &h, &err) == 0 && h.version == 4);
    }

    /* truncated: magic but no (or half a) version, and version 2 cut short */
    err = NULL;
    CHECK(parse_hello_exact((const uint8_t *)"LECH", 4, &h, &err) == -LEI_E_PROTOCOL &&
          STREQ(err, "truncated frame"));
    err = NULL;
    CHECK(parse_hello_exact((const uint8_t *)"LECH\x00", 5, &h, &err) == -LEI_E_PROTOCOL &&
          STREQ(err, "truncated frame"));
    n = hello_body(body, "LECH", LEI_PROTO_VERSION, UINT64_MAX, 9, "127.0.0.1", 9);
    for (size_t k = 6; k < n; k++) {
        err = NULL;
        int r = parse_hello_exact(body, k, &h, &err);
        CHECK(r == -LEI_E_PROTOCOL && err != NULL);
        /* cut inside a varint: truncated; after both varints: a bad address */
        if (k < 6 + 10 + 1)
            CHECK(STREQ(err, "truncated frame"));
        else
            CHECK(STREQ(err, "bad address in handshake"));
    }
    CHECK(parse_hello_exact(body, n, &h, &err) == 0 && strcmp(h.addr, "127.0.0.1") == 0);

    /* a varint that is not one (10th byte > 1) */
    memcpy(body, "LECH\x00\x03", 6);
    memset(body + 6, 0xff, 9);
    body[15] = 0x02;
    err = NULL;
    CHECK(parse_hello_exact(body, 16, &h, &err) == -LEI_E_PROTOCOL &&
          STREQ(err, "invalid varint in frame"));

    /* bad address lengths: zero, too long for the buffer, more or fewer bytes than said */
    n = hello_body(body, "LECH", LEI_PROTO_VERSION, 1, 0, "", 0);
    err = NULL;
    CHECK(parse_hello_exact(body, n, &h, &err) == -LEI_E_PROTOCOL &&
          STREQ(err, "bad address in handshake"));
    {
        char big[LEI_ADDR_MAX + 16];
        memset(big, 'z', sizeof big);
        n = hello_body(body, "LECH", LEI_PROTO_VERSION, 1, LEI_ADDR_MAX, big, LEI_ADDR_MAX);
        err = NULL;
        CHECK(parse_hello_exact(body, n, &h, &err) == -LEI_E_PROTOCOL &&
              STREQ(err, "bad address in handshake"));
        n = hello_body(body, "LECH", LEI_PROTO_VERSION, 1, LEI_ADDR_MAX - 1, big, LEI_ADDR_MAX - 1);
        CHECK(parse_hello_exact(body, n, &h, &err) == 0 && strlen(h.addr) == LEI_ADDR_MAX - 1);
        n = hello_body(body, "LECH", LEI_PROTO_VERSION, 1, UINT64_MAX, big, 10);
        err = NULL;
        CHECK(parse_hello_exact(body, n, &h, &err) == -LEI_E_PROTOCOL &&
              STREQ(err, "bad address in handshake"));
    }
    n = hello_body(body, "LECH", LEI_PROTO_VERSION, 1, 5, "a:1", 3); /* says 5, has 3 */
    err = NULL;
    CHECK(parse_hello_exact(body, n, &h, &err) == -LEI_E_PROTOCOL &&
          STREQ(err, "bad address in handshake"));
    n = hello_body(body, "LECH", LEI_PROTO_VERSION, 1, 3, "a:1zz", 5); /* says 3, has 5 */
    err = NULL;
    CHECK(parse_hello_exact(body, n, &h, &err) == -LEI_E_PROTOCOL &&
          STREQ(err, "bad mode in handshake")); /* 'z' where the mode byte goes */
}

/* ---- EVENT ---------------------------------------------------------------- */

static int parse_event_exact(const uint8_t *b, size_t n, lei_event_hdr *e, const char **err,
                             uint8_t **keep) {
    uint8_t *d = dup_exact(b, n);
    int r = lei_parse_event(d, n, e, err);
    *keep = d; /* e->payload points into it: the caller frees */
    return r;
}

static void test_event(void) {
    uint8_t buf[LEI_EVENT_HDR_MAX + 64];
    lei_event_hdr e;
    lei_frame f;
    const char *err;
    uint8_t *d;

    static const uint64_t vals[][4] = {
        {0, 0, 0, 0},
        {1, 2, 3, 4},
        {127, 128, 16383, 16384},
        {UINT32_MAX, (uint64_t)1 << 32, (uint64_t)1 << 53, (uint64_t)1 << 63},
        {UINT64_MAX, UINT64_MAX, UINT64_MAX, UINT64_MAX},
    };
    static const uint8_t payload[] = {LEI_T_STRING, 3, 'a', 'b', 'c'};
    for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) {
        size_t hl = lei_frame_event_hdr(buf, vals[i][0], vals[i][1], vals[i][2], vals[i][3],
                                        sizeof payload);
        CHECK(hl <= LEI_EVENT_HDR_MAX && hl >= LEI_FRAME_HDR + 4);
        CHECK(buf[4] == LEI_F_EVENT);
        CHECK(rd_u32le(buf) == hl - 4 + sizeof payload);
        memcpy(buf + hl, payload, sizeof payload);
        size_t n = hl + sizeof payload;
        CHECK(lei_frame_next(buf, n, 1024, &f, &err) == 1 && f.size == n);
        for (size_t k = 0; k < n; k++) CHECK(lei_frame_next(buf, k, 1024, &f, &err) == 0);
        lei_frame_next(buf, n, 1024, &f, &err);
        memset(&e, 0, sizeof e);
        err = NULL;
        CHECK(parse_event_exact(f.body, f.len, &e, &err, &d) == 0 && err == NULL);
        CHECK(e.idx == vals[i][0] && e.producer == vals[i][1] && e.seq == vals[i][2] &&
              e.sync == vals[i][3]);
        CHECK(e.plen == sizeof payload && e.payload == d + (hl - LEI_FRAME_HDR));
        CHECK(memcmp(e.payload, payload, sizeof payload) == 0);
        free(d);
    }
    /* the largest header is exactly LEI_EVENT_HDR_MAX */
    CHECK(lei_frame_event_hdr(buf, UINT64_MAX, UINT64_MAX, UINT64_MAX, UINT64_MAX, 0) ==
          LEI_EVENT_HDR_MAX);

    /* event without a value: the four varints and nothing after */
    {
        size_t hl = lei_frame_event_hdr(buf, 1, 2, 3, 0, 0);
        CHECK(lei_frame_next(buf, hl, 1024, &f, &err) == 1 && f.len == 4);
        err = NULL;
        CHECK(parse_event_exact(f.body, f.len, &e, &err, &d) == -LEI_E_PROTOCOL &&
              STREQ(err, "event without a value"));
        free(d);
    }
    /* every truncation inside the varints is "truncated frame" */
    {
        size_t hl = lei_frame_event_hdr(buf, UINT64_MAX, 300, UINT64_MAX, 1, 1);
        const uint8_t *b = buf + LEI_FRAME_HDR;
        size_t bl = hl - LEI_FRAME_HDR;
        for (size_t k = 0; k < bl; k++) {
            err = NULL;
            CHECK(parse_event_exact(b, k, &e, &err, &d) == -LEI_E_PROTOCOL &&
                  STREQ(err, "truncated frame"));
            free(d);
        }
        err = NULL;
        CHECK(parse_event_exact(b, bl, &e, &err, &d) == -LEI_E_PROTOCOL &&
              STREQ(err, "event without a value"));
        free(d);
    }
    /* the same with one-byte fields (read without lei_varint_decode) */
    {
        size_t hl = lei_frame_event_hdr(buf, 5, 127, 6, 0, 1);
        const uint8_t *b = buf + LEI_FRAME_HDR;
        size_t bl = hl - LEI_FRAME_HDR;
        CHECK(bl == 4 && b[0] == 5 && b[1] == 127 && b[2] == 6 && b[3] == 0);
        for (size_t k = 0; k < bl; k++) {
            err = NULL;
            CHECK(parse_event_exact(b, k, &e, &err, &d) == -LEI_E_PROTOCOL &&
                  STREQ(err, "truncated frame"));
            free(d);
        }
        /* a continuation byte in a field's first byte goes the long way */
        uint8_t c[8] = {5, 0x80, 1, 6, 0, LEI_T_TRUE};
        err = NULL;
        CHECK(parse_event_exact(c, 6, &e, &err, &d) == 0 && e.idx == 5 && e.producer == 128 &&
              e.seq == 6 && e.sync == 0 && e.plen == 1);
        free(d);
    }
    /* an invalid varint */
    {
        uint8_t b[16];
        memset(b, 0xff, 9);
        b[9] = 0x7f;
        b[10] = 0;
        err = NULL;
        CHECK(parse_event_exact(b, 11, &e, &err, &d) == -LEI_E_PROTOCOL &&
              STREQ(err, "invalid varint in frame"));
        free(d);
    }
}

/* ---- ACK ------------------------------------------------------------------ */

static void test_ack(void) {
    uint8_t buf[LEI_FRAME_HDR + 20 + 32];
    lei_frame f;
    const char *err;
    uint64_t sync, nran;
    const uint8_t *errs;
    size_t elen;
    uint8_t *d;

    static const uint64_t vals[][2] = {{0, 0}, {1, 0}, {128, 3}, {UINT64_MAX, UINT64_MAX}};
    static const uint8_t encerrs[] = {LEI_T_TABLE, 0, 0};
    for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) {
        for (int with = 0; with < 2; with++) {
            size_t el = with ? sizeof encerrs : 0;
            size_t hl = lei_frame_ack_hdr(buf, vals[i][0], vals[i][1], el);
            CHECK(hl <= LEI_FRAME_HDR + 20 && buf[4] == LEI_F_ACK);
            memcpy(buf + hl, encerrs, el);
            CHECK(lei_frame_next(buf, hl + el, 1024, &f, &err) == 1 && f.size == hl + el);
            d = dup_exact(f.body, f.len);
            err = NULL;
            CHECK(lei_parse_ack(d, f.len, &sync, &nran, &errs, &elen, &err) == 0 && err == NULL);
            CHECK(sync == vals[i][0] && nran == vals[i][1] && elen == el);
            CHECK(errs == d + (hl - LEI_FRAME_HDR));
            if (with) CHECK(memcmp(errs, encerrs, el) == 0);
            free(d);
        }
    }
    /* rejections: empty, one varint only, truncated and invalid varints */
    {
        size_t hl = lei_frame_ack_hdr(buf, UINT64_MAX, 300, 0);
        const uint8_t *b = buf + LEI_FRAME_HDR;
        for (size_t k = 0; k < hl - LEI_FRAME_HDR; k++) {
            d = dup_exact(b, k);
            err = NULL;
            CHECK(lei_parse_ack(d, k, &sync, &nran, &errs, &elen, &err) == -LEI_E_PROTOCOL &&
                  STREQ(err, "truncated frame"));
            free(d);
        }
        uint8_t bad[12];
        memset(bad, 0xff, 10);
        bad[10] = 0;
        d = dup_exact(bad, 11);
        err = NULL;
        CHECK(lei_parse_ack(d, 11, &sync, &nran, &errs, &elen, &err) == -LEI_E_PROTOCOL &&
              STREQ(err, "invalid varint in frame"));
        free(d);
    }
}

/* ---- BIND ----------------------------------------------------------------- */

/* A BIND body of index 3, declared name length namelen, then "abc":
 * true when the parser refuses it with the bind error. */
static int bind_body_refused(uint64_t namelen) {
    uint8_t body[32], *d;
    const uint8_t *name;
    const char *err = NULL;
    uint64_t idx;
    size_t nl, n = 0;
    n += lei_varint_encode(body + n, 3);
    n += lei_varint_encode(body + n, namelen);
    memcpy(body + n, "abc", 3);
    n += 3;
    d = dup_exact(body, n);
    const uint8_t *ticket;
    int refused = lei_parse_bind(d, n, &idx, &name, &nl, &ticket, &err) == -LEI_E_PROTOCOL &&
                  (STREQ(err, "bad channel name in bind") || STREQ(err, "bad ticket in bind"));
    free(d);
    return refused;
}

static void test_bind(void) {
    uint8_t buf[LEI_FRAME_HDR + 20 + 300 + LEI_BIND_MAX_EXTRA], body[64];
    lei_frame f;
    const char *err;
    uint64_t idx;
    const uint8_t *name, *ticket;
    size_t nl, n;
    uint8_t *d;

    static const uint64_t idxs[] = {0, 1, 127, 128, (uint64_t)16 << 20, UINT64_MAX};
    char longname[300];
    memset(longname, 'n', sizeof longname);
    for (size_t i = 0; i < sizeof idxs / sizeof idxs[0]; i++) {
        const char *nm = i & 1 ? "127.0.0.1:7700/ozone" : longname;
        size_t len = i & 1 ? strlen(nm) : sizeof longname;
        n = lei_frame_bind(buf, idxs[i], nm, len, NULL);
        CHECK(n <= LEI_FRAME_HDR + 20 + len + 1 && buf[4] == LEI_F_BIND);
        CHECK(lei_frame_next(buf, n, 1024, &f, &err) == 1 && f.size == n);
        d = dup_exact(f.body, f.len);
        err = NULL;
        CHECK(lei_parse_bind(d, f.len, &idx, &name, &nl, &ticket, &err) == 0 && err == NULL);
        CHECK(idx == idxs[i] && nl == len && memcmp(name, nm, len) == 0 && ticket == NULL);
        CHECK(name == d + f.len - len - 1);
        free(d);
    }

    /* namelen says more, or fewer, bytes than follow; near 2^64 it must
     * not wrap anything */
    CHECK(bind_body_refused(6));
    CHECK(bind_body_refused(2));
    CHECK(bind_body_refused(UINT64_MAX));

    /* an empty name, as built by the library and by hand */
    n = lei_frame_bind(buf, 4, "", 0, NULL);
    CHECK(lei_frame_next(buf, n, 1024, &f, &err) == 1);
    d = dup_exact(f.body, f.len);
    err = NULL;
    CHECK(lei_parse_bind(d, f.len, &idx, &name, &nl, &ticket, &err) == -LEI_E_PROTOCOL &&
          STREQ(err, "bad channel name in bind"));
    free(d);
    memcpy(body, "\x04\x00zz", 4); /* says 0, has 2 */
    d = dup_exact(body, 4);
    err = NULL;
    CHECK(lei_parse_bind(d, 4, &idx, &name, &nl, &ticket, &err) == -LEI_E_PROTOCOL &&
          STREQ(err, "bad channel name in bind"));
    free(d);

    /* truncated varints */
    n = lei_frame_bind(buf, UINT64_MAX, "abc", 3, NULL);
    for (size_t k = 0; k < 11; k++) { /* inside the idx, or before the length */
        d = dup_exact(buf + LEI_FRAME_HDR, k);
        err = NULL;
        CHECK(lei_parse_bind(d, k, &idx, &name, &nl, &ticket, &err) == -LEI_E_PROTOCOL &&
              STREQ(err, "truncated frame"));
        free(d);
    }
}

/* ---- random mutation -------------------------------------------------------- */

/* xorshift64*: deterministic across platforms and runs. */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ull;
}
static uint64_t rnd_varval(void) {
    switch (rnd() % 4) {
    case 0: return rnd() % 4;
    case 1: return rnd() % 300;
    case 2: return rnd() & 0xffffffffu;
    default: return rnd();
    }
}

/* One valid frame of a random kind into out; returns its size. */
static size_t seed_frame(uint8_t *out) {
    static const uint8_t val[] = {LEI_T_TABLE, 1, 1, LEI_T_INT, 4, LEI_T_STRING, 1, 'k',
                                  LEI_T_TRUE};
    char name[40];
    size_t hl, nl;
    switch (rnd() % 5) {
    case 0:
        return lei_frame_hello(out, rnd() & 1 ? LEI_F_HELLO : LEI_F_HELLO_OK,
                               rnd() % 8 ? LEI_PROTO_VERSION : (unsigned)(rnd() & 0xffff),
                               rnd_varval(), "127.0.0.1:40001", NULL);
    case 1: {
        size_t pl = rnd() % (sizeof val + 1);
        hl = lei_frame_event_hdr(out, rnd_varval(), rnd_varval(), rnd_varval(), rnd_varval(), pl);
        memcpy(out + hl, val, pl);
        return hl + pl;
    }
    case 2: {
        size_t el = rnd() % 2 ? sizeof val : 0;
        hl = lei_frame_ack_hdr(out, rnd_varval(), rnd_varval(), el);
        memcpy(out + hl, val, el);
        return hl + el;
    }
    case 3:
        nl = 1 + rnd() % (sizeof name - 1);
        memset(name, 'c', nl);
        return lei_frame_bind(out, rnd_varval(), name, nl, NULL);
    default:
        hl = (size_t)rnd() % 24;
        for (size_t i = 0; i < hl; i++) out[LEI_FRAME_HDR + i] = (uint8_t)rnd();
        return mkframe(out, (uint8_t)rnd(), out + LEI_FRAME_HDR, hl);
    }
}

/* Runs every parser over a body and checks that what they return stays in it. */
static int parse_all(const uint8_t *b, size_t n) {
    int ok = 1, r;
    const char *err;
    lei_hello h;
    err = NULL;
    r = lei_parse_hello(b, n, &h, &err);
    if (r == 0 && h.version == LEI_PROTO_VERSION)
        ok &= strlen(h.addr) < LEI_ADDR_MAX; /* may be cut short by a NUL in the address */
    ok &= r == 0 || (r == -LEI_E_PROTOCOL && err != NULL);
    lei_event_hdr e;
    err = NULL;
    r = lei_parse_event(b, n, &e, &err);
    if (r == 0) ok &= e.plen > 0 && e.payload >= b && e.payload + e.plen == b + n;
    ok &= r == 0 || (r == -LEI_E_PROTOCOL && err != NULL);
    uint64_t s, nr, idx;
    const uint8_t *p;
    size_t l;
    err = NULL;
    r = lei_parse_ack(b, n, &s, &nr, &p, &l, &err);
    if (r == 0) ok &= p >= b && p + l == b + n;
    ok &= r == 0 || (r == -LEI_E_PROTOCOL && err != NULL);
    err = NULL;
    const uint8_t *t;
    r = lei_parse_bind(b, n, &idx, &p, &l, &t, &err);
    if (r == 0) ok &= l > 0 && p > b && p + l < b + n && (!t || t + LEI_TICKET_BYTES == b + n);
    ok &= r == 0 || (r == -LEI_E_PROTOCOL && err != NULL);
    return ok;
}

static void test_mutation(void) {
    enum { ROUNDS = 200000, CAP = 256 };
    uint8_t stream[CAP];
    int bad = 0, frames = 0, errors = 0;
    for (int round = 0; round < ROUNDS; round++) {
        /* one to three valid frames back to back, then damage them */
        size_t n = 0;
        int nf = 1 + (int)(rnd() % 3);
        for (int i = 0; i < nf && n + 128 < CAP; i++) n += seed_frame(stream + n);
        int muts = (int)(rnd() % 4);
        for (int m = 0; m < muts && n; m++) {
            switch (rnd() % 5) {
            case 0: stream[rnd() % n] = (uint8_t)rnd(); break;         /* byte */
            case 1: stream[rnd() % n] ^= (uint8_t)(1u << (rnd() % 8)); break; /* bit */
            case 2: n = (size_t)(rnd() % (n + 1)); break;              /* cut */
            case 3:                                                    /* length field */
                if (n >= 4) {
                    uint32_t v = (uint32_t)rnd_varval();
                    stream[0] = (uint8_t)v, stream[1] = (uint8_t)(v >> 8);
                    stream[2] = (uint8_t)(v >> 16), stream[3] = (uint8_t)(v >> 24);
                }
                break;
            default:                                                   /* append junk */
                while (n < CAP && rnd() % 4) stream[n++] = (uint8_t)rnd();
                break;
            }
        }
        uint8_t *d = dup_exact(stream, n);
        /* walk the frames as the reader does, parsing each body with every parser */
        size_t off = 0;
        for (;;) {
            lei_frame f;
            const char *err = NULL;
            int r = lei_frame_next(d + off, n - off, 4096, &f, &err);
            if (r == 0) break;
            if (r < 0) {
                if (!err) bad++;
                errors++;
                break;
            }
            if (f.size != f.len + LEI_FRAME_HDR || off + f.size > n ||
                f.body != d + off + LEI_FRAME_HDR)
                bad++;
            frames++;
            /* an exact copy of the body: a parser reading past it trips ASan */
            uint8_t *body = dup_exact(f.body, f.len);
            if (!parse_all(body, f.len)) bad++;
            free(body);
            off += f.size;
        }
        /* and the raw bytes themselves, at every offset of a few */
        if (round % 16 == 0)
            for (size_t k = 0; k <= n; k++)
                if (!parse_all(d + k, n - k)) bad++;
        free(d);
    }
    CHECK(bad == 0);
    CHECK(frames > ROUNDS / 2 && errors > 0); /* the loop exercised both paths */
}

int main(void) {
    test_frame_next();
    test_hello();
    test_event();
    test_ack();
    test_bind();
    test_mutation();
    return TEST_SUMMARY();
}
