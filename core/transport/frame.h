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

#define LEI_PROTO_VERSION 3
#define LEI_MAGIC "LECH"
#define LEI_FRAME_HDR 5          /* u32 length + u8 type */
#define LEI_EVENT_HDR_MAX (LEI_FRAME_HDR + 4 * 10)
#define LEI_ADDR_MAX 128 /* = LEI_ADDR_TEXT_MAX of addr.h: "unix:" + a 107-byte path */
/* The longest channel name a BIND may carry: "NS-address//name@key", the
 * name server's names at most 1024 bytes by default (registry.lua
 * max_name), with room to spare; a longer one is malformed. */
#define LEI_BIND_NAME_MAX 2048
#define LEI_STR_(x) #x
#define LEI_STR(x) LEI_STR_(x)
#define LEI_NAME_MAX 64  /* principal names: 1..64 bytes of [A-Za-z0-9._-] */
#define LEI_SIG_BYTES 64
/* A certificate in a HELLO (has_cert 2, doc/security.md "Certificates"):
 * u64 not_before, u64 not_after (big-endian, Unix seconds), u8 naddrs,
 * naddrs x (u8 len, address), then the authority's 64-byte signature. */
#define LEI_CERT_ADDRS_MAX 8
#define LEI_CERT_MIN (8 + 8 + 1 + LEI_SIG_BYTES)
#define LEI_CERT_MAX (LEI_CERT_MIN + LEI_CERT_ADDRS_MAX * LEI_ADDR_MAX)
/* A producer ticket (BIND has_ticket 2): u64 expiry (big-endian, Unix
 * seconds), then the manager's signature. */
#define LEI_TICKET_BYTES (8 + LEI_SIG_BYTES)
/* v1 fields, the mode byte, the keyed fields (a certificate: has_cert,
 * varint len, body), the acceptor's signature */
#define LEI_HELLO_MAX (LEI_FRAME_HDR + 4 + 2 + 10 + 10 + LEI_ADDR_MAX + 1 + 32 + 32 + 10 + \
                       LEI_NAME_MAX + 1 + 10 + LEI_CERT_MAX + 1 + LEI_SUITES_MAX + LEI_SIG_BYTES)
#define LEI_BIND_MAX_EXTRA (1 + LEI_TICKET_BYTES) /* BIND v2: has_ticket [+ ticket] */

/* Mode 2 is mode 1 with a list of record ciphers after the certificate:
 * the dialler's offer in its HELLO, the acceptor's choice (one) in its
 * HELLO_OK (doc/protocol.md section 3, "Record ciphers"). */
enum lei_mode { LEI_MODE_PROTECTED = 0, LEI_MODE_KEYED = 1, LEI_MODE_KEYED_OFFER = 2 };
/* Record ciphers by their number in an offer (secure.c has them). */
enum lei_suite { LEI_SUITE_CHACHA20_POLY1305 = 1, LEI_SUITE_AES256_GCM = 2 };
#define LEI_SUITES_MAX 8 /* ciphers in one offer */

enum lei_frame_type {
    LEI_F_HELLO = 1,    /* magic, u16 version, varint incarnation, varint len, listen addr,
                         * u8 mode [keyed: eph pk, identity pk, varint len, name,
                         * u8 has_cert [1: 64-byte v1 cert (refused); 2: varint len,
                         * cert (LEI_CERT_MAX)]] */
    LEI_F_HELLO_OK = 2, /* same body as HELLO: the acceptor's identity; keyed: + signature */
    LEI_F_ERROR = 3,    /* utf-8 reason; the sender closes right after */
    LEI_F_CTRL = 4,     /* one encoded value: a control-plane message */
    LEI_F_BIND = 5,     /* varint idx, varint len, channel name */
    LEI_F_EVENT = 6,    /* varint idx, varint producer, varint seq, varint sync, value */
    LEI_F_ACK = 7,      /* varint sync, varint handlers run, optional encoded errors */
    LEI_F_HEARTBEAT = 8, /* empty: I am here (sent when idle, and to answer a PING) */
    LEI_F_PING = 9,      /* empty: nothing came from you for a while: answer HEARTBEAT */
    LEI_F_AUTH = 10,     /* keyed: the dialler's signature of the transcript (in the clear) */
    LEI_F_AUTH_OK = 11,  /* keyed: empty, the acceptor's first record: the dialler is up */
    LEI_F_CONFIRM_ASK = 12, /* varint token: answer CONFIRM once you have read up to here
                             * (only to a peer that offered confirmations: live.c) */
    LEI_F_CONFIRM = 13   /* varint token: every EVENT before that CONFIRM_ASK was read */
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
    uint8_t mode;                /* enum lei_mode; the fields below: keyed only */
    uint8_t eph[32];             /* ephemeral X25519 public key (crypto_kx) */
    uint8_t idpk[32];            /* Ed25519 identity public key */
    char name[LEI_NAME_MAX + 1]; /* principal name */
    uint8_t has_cert, has_sig;   /* has_cert: 0 none, 1 an old (v1) one, 2 cert_len bytes */
    uint16_t cert_len;
    uint8_t cert[LEI_CERT_MAX];  /* an authority's certificate of (name, idpk) */
    uint8_t nsuites;             /* mode 2: 1..LEI_SUITES_MAX record ciphers (enum lei_suite, */
    uint8_t suites[LEI_SUITES_MAX]; /* any byte: unknown ones are skipped), in preference order */
    uint8_t sig[LEI_SIG_BYTES];  /* HELLO_OK: the acceptor's transcript signature */
} lei_hello;

typedef struct lei_event_hdr {
    uint64_t idx, producer, seq, sync;
    const uint8_t *payload; /* points into the frame body */
    size_t plen;
} lei_event_hdr;

/* The frame and record length fields: u32, little-endian. */
static inline void lei_put_u32le(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

static inline uint32_t lei_get_u32le(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Looks for one complete frame at p[0..n).  Returns 1 and fills *f when one
 * is there, 0 when more bytes are needed, -LEI_E_PROTOCOL with *err on a
 * length of zero or one above max.  The lei_parse_* functions below return
 * 0, or -LEI_E_PROTOCOL with *err. */
int lei_frame_next(const uint8_t *p, size_t n, size_t max, lei_frame *f, const char **err);

/* Writes the 5-byte frame header for a frame of the given type whose body is
 * body_len bytes.  Returns LEI_FRAME_HDR. */
size_t lei_frame_hdr(uint8_t *out, uint8_t type, size_t body_len);

/* Builds a whole HELLO or HELLO_OK frame into out (at least LEI_HELLO_MAX
 * bytes).  key NULL: mode protected; else keyed with key's eph, idpk, name,
 * has_cert and cert, and a keyed HELLO_OK ends with LEI_SIG_BYTES zero
 * bytes for the caller's signature (the frame's last bytes). */
size_t lei_frame_hello(uint8_t *out, uint8_t type, unsigned version, uint64_t incarnation,
                       const char *addr, const lei_hello *key);
/* Parses a HELLO or HELLO_OK body.  A version other than ours: only
 * h->version is set (0 returned).  A keyed body may end with a signature
 * (has_sig): which frame must carry one is the caller's rule. */
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

/* A BIND frame into out (LEI_FRAME_HDR + 20 + namelen + LEI_BIND_MAX_EXTRA
 * bytes); ticket: LEI_TICKET_BYTES or NULL (has_ticket 0). */
size_t lei_frame_bind(uint8_t *out, uint64_t idx, const char *name, size_t namelen,
                      const uint8_t *ticket);
/* *ticket (LEI_TICKET_BYTES): NULL when has_ticket is 0 or 1 (v1, no expiry). */
int lei_parse_bind(const uint8_t *b, size_t n, uint64_t *idx, const uint8_t **name,
                   size_t *namelen, const uint8_t **ticket, const char **err);

#endif
