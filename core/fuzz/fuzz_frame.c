/* fuzz_frame.c: a libFuzzer harness (make fuzz) for the frame layer: the
 * input is split into frames by lei_frame_next, as a connection does, and
 * each body goes through the parser of its type (HELLO/HELLO_OK, EVENT,
 * ACK, BIND); the rest of the input is also fed whole to every parser.
 * What parses is built again with the matching writer and parsed again:
 * the fields must come back the same (the writers and parsers agree).
 *
 * Leans on core/transport/frame.c and core/base/codec.c only: no context, no sockets.
 * Seeds: core/fuzz/frame/ (scripts/lecho-fuzz-seeds writes them).
 */
#include "codec.h"
#include "frame.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_FRAME (1u << 20)

static void check(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "fuzz_frame: %s\n", what);
        abort();
    }
}

static void hello(const uint8_t *b, size_t n) {
    lei_hello h, h2;
    const char *err = NULL;
    static uint8_t out[LEI_HELLO_MAX + 64];
    memset(&h, 0, sizeof h);
    if (lei_parse_hello(b, n, &h, &err)) {
        check(err != NULL, "hello: an error without a message");
        return;
    }
    if (h.version != LEI_PROTO_VERSION) return;
    check(memchr(h.addr, 0, sizeof h.addr) != NULL, "hello: address not terminated");
    /* The parser copies the address's bytes as they are: one with a NUL
     * inside reads shorter as a C string.  The handshake refuses such
     * addresses (handshake.c validates them); no round trip for them. */
    {
        uint64_t inc, alen = 0;
        size_t u1, u2;
        if (lei_varint_decode(b + 6, n - 6, &inc, &u1) ||
            lei_varint_decode(b + 6 + u1, n - 6 - u1, &alen, &u2))
            check(0, "hello: parsed, though its varints do not");
        if (strlen(h.addr) != alen) return;
        if (h.mode) { /* the same for the principal name */
            size_t at = 6 + u1 + u2 + (size_t)alen + 1 + 64;
            uint64_t nlen;
            if (lei_varint_decode(b + at, n - at, &nlen, &u1)) check(0, "hello: bad name length");
            if (strlen(h.name) != nlen) return;
        }
    }
    /* build the same HELLO again (without a signature: a HELLO never has one) */
    size_t len = lei_frame_hello(out, LEI_F_HELLO, h.version, h.incarnation, h.addr,
                                 h.mode ? &h : NULL);
    check(len <= sizeof out, "hello: built past LEI_HELLO_MAX");
    memset(&h2, 0, sizeof h2);
    check(lei_parse_hello(out + LEI_FRAME_HDR, len - LEI_FRAME_HDR, &h2, &err) == 0,
          "hello: what the writer built does not parse");
    check(h2.incarnation == h.incarnation && strcmp(h2.addr, h.addr) == 0 && h2.mode == h.mode,
          "hello: fields differ after a round trip");
    if (h.mode) {
        check(memcmp(h2.eph, h.eph, 32) == 0 && memcmp(h2.idpk, h.idpk, 32) == 0 &&
                  strcmp(h2.name, h.name) == 0 && h2.has_cert == h.has_cert &&
                  h2.cert_len == h.cert_len && memcmp(h2.cert, h.cert, h.cert_len) == 0,
              "hello: keyed fields differ after a round trip");
    }
}

static void event(const uint8_t *b, size_t n) {
    lei_event_hdr e, e2;
    const char *err = NULL;
    uint8_t out[LEI_EVENT_HDR_MAX];
    if (lei_parse_event(b, n, &e, &err)) {
        check(err != NULL, "event: an error without a message");
        return;
    }
    check(e.payload >= b && e.payload + e.plen == b + n, "event: payload outside the body");
    size_t h = lei_frame_event_hdr(out, e.idx, e.producer, e.seq, e.sync, e.plen);
    check(h <= sizeof out && lei_get_u32le(out) == h - LEI_FRAME_HDR + e.plen + 1, /* + type */
          "event: header length wrong");
    /* the header's fields, followed by the same payload */
    uint8_t *body = malloc(h - LEI_FRAME_HDR + e.plen + 1);
    check(body != NULL, "out of memory");
    memcpy(body, out + LEI_FRAME_HDR, h - LEI_FRAME_HDR);
    if (e.plen) memcpy(body + h - LEI_FRAME_HDR, e.payload, e.plen);
    check(lei_parse_event(body, h - LEI_FRAME_HDR + e.plen, &e2, &err) == 0,
          "event: what the writer built does not parse");
    check(e2.idx == e.idx && e2.producer == e.producer && e2.seq == e.seq && e2.sync == e.sync &&
              e2.plen == e.plen && (!e.plen || memcmp(e2.payload, e.payload, e.plen) == 0),
          "event: fields differ after a round trip");
    free(body);
}

static void ack(const uint8_t *b, size_t n) {
    uint64_t sync, nran, s2, n2;
    const uint8_t *errs, *e2;
    size_t elen, el2;
    const char *err = NULL;
    uint8_t out[LEI_FRAME_HDR + 20];
    if (lei_parse_ack(b, n, &sync, &nran, &errs, &elen, &err)) {
        check(err != NULL, "ack: an error without a message");
        return;
    }
    check(elen == 0 || (errs >= b && errs + elen == b + n), "ack: errors outside the body");
    size_t h = lei_frame_ack_hdr(out, sync, nran, elen);
    check(h <= sizeof out, "ack: header too long");
    uint8_t *body = malloc(h - LEI_FRAME_HDR + elen + 1);
    check(body != NULL, "out of memory");
    memcpy(body, out + LEI_FRAME_HDR, h - LEI_FRAME_HDR);
    if (elen) memcpy(body + h - LEI_FRAME_HDR, errs, elen);
    check(lei_parse_ack(body, h - LEI_FRAME_HDR + elen, &s2, &n2, &e2, &el2, &err) == 0,
          "ack: what the writer built does not parse");
    check(s2 == sync && n2 == nran && el2 == elen, "ack: fields differ after a round trip");
    free(body);
}

static void bind(const uint8_t *b, size_t n) {
    uint64_t idx, i2;
    const uint8_t *name, *ticket, *nm2, *t2;
    size_t nlen, nl2;
    const char *err = NULL;
    if (lei_parse_bind(b, n, &idx, &name, &nlen, &ticket, &err)) {
        check(err != NULL, "bind: an error without a message");
        return;
    }
    check(name >= b && name + nlen <= b + n, "bind: name outside the body");
    uint8_t *out = malloc(LEI_FRAME_HDR + 20 + nlen + LEI_BIND_MAX_EXTRA);
    check(out != NULL, "out of memory");
    size_t len = lei_frame_bind(out, idx, (const char *)name, nlen, ticket);
    check(lei_parse_bind(out + LEI_FRAME_HDR, len - LEI_FRAME_HDR, &i2, &nm2, &nl2, &t2, &err) == 0,
          "bind: what the writer built does not parse");
    check(i2 == idx && nl2 == nlen && memcmp(nm2, name, nlen) == 0 && !t2 == !ticket &&
              (!ticket || memcmp(t2, ticket, LEI_SIG_BYTES) == 0),
          "bind: fields differ after a round trip");
    free(out);
}

static void body(uint8_t type, const uint8_t *b, size_t n) {
    switch (type) {
    case LEI_F_HELLO:
    case LEI_F_HELLO_OK: hello(b, n); break;
    case LEI_F_EVENT: event(b, n); break;
    case LEI_F_ACK: ack(b, n); break;
    case LEI_F_BIND: bind(b, n); break;
    default: break;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* every parser on the whole input, in a copy of its exact size (ASan
     * sees a read one past the end) */
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy) return 0;
    if (size) memcpy(copy, data, size);
    hello(copy, size);
    event(copy, size);
    ack(copy, size);
    bind(copy, size);
    free(copy);
    /* the input as a stream of frames, each body in a copy of its size */
    size_t pos = 0;
    for (;;) {
        lei_frame f;
        const char *err = NULL;
        int rc = lei_frame_next(data + pos, size - pos, MAX_FRAME, &f, &err);
        if (rc <= 0) {
            check(rc == 0 || err != NULL, "frame: an error without a message");
            break;
        }
        check(f.size == LEI_FRAME_HDR + f.len && f.size <= size - pos &&
                  f.body == data + pos + LEI_FRAME_HDR,
              "frame: sizes disagree");
        uint8_t *b = malloc(f.len ? f.len : 1);
        if (!b) break;
        if (f.len) memcpy(b, f.body, f.len);
        body(f.type, b, f.len);
        free(b);
        pos += f.size;
    }
    return 0;
}
