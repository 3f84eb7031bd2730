/* frame.h: the lecho wire framing between two contexts (see doc/wire-format.md).
 *
 * Every frame is  u32 length (little-endian, bytes after this field, >= 1)
 *                 u8  type
 *                 body (length - 1 bytes)
 * This file only builds and parses frames; it knows nothing of sockets or Lua,
 * and leans on codec.h for varints.  Parsers distrust their input: every
 * function here returns an error with a static message rather than reading
 * past the end of what it was given: -LEI_E_PROTOCOL (errors.h), the code of
 * malformed input from a peer.
 */
#ifndef LECHO_FRAME_H
#define LECHO_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include "errors.h"

#define LEI_PROTO_VERSION 1
#define LEI_MAGIC "LECH"
#define LEI_FRAME_HDR 5          /* u32 length + u8 type */
#define LEI_EVENT_HDR_MAX (LEI_FRAME_HDR + 4 * 10)
#define LEI_HELLO_MAX (LEI_FRAME_HDR + 4 + 2 + 10 + 10 + LEI_ADDR_MAX)
#define LEI_ADDR_MAX 128 /* = LEI_ADDR_TEXT_MAX of addr.h: "unix:" + a 107-byte path */

enum lei_frame_type {
    LEI_F_HELLO = 1,    /* magic, u16 version, varint incarnation, varint len, listen addr */
    LEI_F_HELLO_OK = 2, /* same body as HELLO: the acceptor's identity */
    LEI_F_ERROR = 3,    /* utf-8 reason; the sender closes right after */
    LEI_F_CTRL = 4,     /* one encoded value: a control-plane message */
    LEI_F_BIND = 5,     /* varint idx, varint len, channel name */
    LEI_F_EVENT = 6,    /* varint idx, varint producer, varint seq, varint sync, value */
    LEI_F_ACK = 7,      /* varint sync, varint handlers run, optional encoded errors */
    LEI_F_HEARTBEAT = 8, /* empty: I am here (sent when idle, and to answer a PING) */
    LEI_F_PING = 9       /* empty: nothing came from you for a while: answer HEARTBEAT */
};

typedef struct lei_frame {
    uint8_t type;        /* ro */
    const uint8_t *body; /* ro: points into the caller's buffer */
    size_t len;          /* ro: body length */
    size_t size;         /* ro: whole frame size, header included */
} lei_frame;

typedef struct lei_hello {
    unsigned version;
    uint64_t incarnation;
    char addr[LEI_ADDR_MAX];
} lei_hello;

typedef struct lei_event_hdr {
    uint64_t idx, producer, seq, sync;
    const uint8_t *payload; /* points into the frame body */
    size_t plen;
} lei_event_hdr;

/* Looks for one complete frame at p[0..n).  Returns 1 and fills *f when one
 * is there, 0 when more bytes are needed, -LEI_E_PROTOCOL with *err on a
 * length of zero or one above max.  The lei_parse_* functions below return
 * 0, or -LEI_E_PROTOCOL with *err. */
int lei_frame_next(const uint8_t *p, size_t n, size_t max, lei_frame *f, const char **err);

/* Writes the 5-byte frame header for a frame of the given type whose body is
 * body_len bytes.  Returns LEI_FRAME_HDR. */
size_t lei_frame_hdr(uint8_t *out, uint8_t type, size_t body_len);

/* Builds a whole HELLO or HELLO_OK frame into out (at least LEI_HELLO_MAX
 * bytes). */
size_t lei_frame_hello(uint8_t *out, uint8_t type, unsigned version, uint64_t incarnation,
                       const char *addr);
int lei_parse_hello(const uint8_t *b, size_t n, lei_hello *h, const char **err);

/* Header of an EVENT frame whose value payload is plen bytes; the payload
 * follows it on the wire.  out must hold LEI_EVENT_HDR_MAX bytes. */
size_t lei_frame_event_hdr(uint8_t *out, uint64_t idx, uint64_t producer, uint64_t seq,
                           uint64_t sync, size_t plen);
int lei_parse_event(const uint8_t *b, size_t n, lei_event_hdr *e, const char **err);

/* Header of an ACK frame followed by elen bytes of encoded errors (0: none). */
size_t lei_frame_ack_hdr(uint8_t *out, uint64_t sync, uint64_t nran, size_t elen);
int lei_parse_ack(const uint8_t *b, size_t n, uint64_t *sync, uint64_t *nran,
                  const uint8_t **errs, size_t *elen, const char **err);

/* A BIND frame into out (LEI_FRAME_HDR + 20 + namelen bytes). */
size_t lei_frame_bind(uint8_t *out, uint64_t idx, const char *name, size_t namelen);
int lei_parse_bind(const uint8_t *b, size_t n, uint64_t *idx, const uint8_t **name,
                   size_t *namelen, const char **err);

#endif
