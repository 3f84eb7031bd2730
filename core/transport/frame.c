/* frame.c: building and parsing lecho frames (layout in frame.h).
 * Pure C, no sockets, no Lua; unit-tested by core/test/test_frame.c. */
#include "frame.h"
#include "codec.h"

#include <string.h>

int lei_frame_next(const uint8_t *p, size_t n, size_t max, lei_frame *f, const char **err) {
    if (n < 4) return 0;
    uint32_t len = lei_get_u32le(p);
    if (len == 0) {
        *err = "frame of length 0";
        return -LEI_E_PROTOCOL;
    }
    if ((size_t)len > max) {
        *err = "frame length exceeds limit";
        return -LEI_E_PROTOCOL;
    }
    if (n - 4 < (size_t)len) return 0;
    f->type = p[4];
    f->body = p + LEI_FRAME_HDR;
    f->len = (size_t)len - 1;
    f->size = (size_t)len + 4;
    return 1;
}

size_t lei_frame_hdr(uint8_t *out, uint8_t type, size_t body_len) {
    lei_put_u32le(out, (uint32_t)(body_len + 1));
    out[4] = type;
    return LEI_FRAME_HDR;
}

/* Reads one varint from b[*pos..n) and advances *pos (getv's long way). */
static int getv_long(const uint8_t *b, size_t n, size_t *pos, uint64_t *v, const char **err) {
    size_t used = 0;
    int rc = lei_varint_decode(b + *pos, n - *pos, v, &used);
    if (rc != 0) {
        *err = rc == LEI_ETRUNC ? "truncated frame" : "invalid varint in frame";
        return -LEI_E_PROTOCOL;
    }
    *pos += used;
    return 0;
}

/* Reads one varint from b[*pos..n) and advances *pos.  A one-byte varint
 * (an event's channel index, producer id and sync id, mostly) is read here,
 * inline: lei_varint_decode is another file's, so each field was a call and
 * a loop, 110 of a consumer's ~960 instructions per null event (callgrind). */
static inline int getv(const uint8_t *b, size_t n, size_t *pos, uint64_t *v, const char **err) {
    if (*pos < n && b[*pos] < 0x80) {
        *v = b[*pos];
        *pos += 1;
        return 0;
    }
    return getv_long(b, n, pos, v, err);
}

size_t lei_frame_hello(uint8_t *out, uint8_t type, unsigned version, uint64_t incarnation,
                       const char *addr, const lei_hello *key) {
    size_t alen = strnlen(addr, LEI_ADDR_MAX - 1);
    size_t pos = LEI_FRAME_HDR;
    memcpy(out + pos, LEI_MAGIC, 4);
    pos += 4;
    out[pos++] = (uint8_t)(version >> 8);
    out[pos++] = (uint8_t)version;
    pos += lei_varint_encode(out + pos, incarnation);
    pos += lei_varint_encode(out + pos, alen);
    memcpy(out + pos, addr, alen);
    pos += alen;
    int offer = key && key->mode == LEI_MODE_KEYED_OFFER && key->nsuites >= 1 &&
                key->nsuites <= LEI_SUITES_MAX;
    out[pos++] = !key ? LEI_MODE_PROTECTED : offer ? LEI_MODE_KEYED_OFFER : LEI_MODE_KEYED;
    if (key) {
        size_t nl = strnlen(key->name, LEI_NAME_MAX);
        memcpy(out + pos, key->eph, 32);
        pos += 32;
        memcpy(out + pos, key->idpk, 32);
        pos += 32;
        pos += lei_varint_encode(out + pos, nl);
        memcpy(out + pos, key->name, nl);
        pos += nl;
        out[pos++] = key->has_cert;
        if (key->has_cert == 1) {
            memcpy(out + pos, key->cert, LEI_SIG_BYTES);
            pos += LEI_SIG_BYTES;
        } else if (key->has_cert == 2) {
            pos += lei_varint_encode(out + pos, key->cert_len);
            memcpy(out + pos, key->cert, key->cert_len);
            pos += key->cert_len;
        }
        if (offer) {
            out[pos++] = key->nsuites;
            memcpy(out + pos, key->suites, key->nsuites);
            pos += key->nsuites;
        }
        if (type == LEI_F_HELLO_OK) {
            memset(out + pos, 0, LEI_SIG_BYTES);
            pos += LEI_SIG_BYTES;
        }
    }
    lei_frame_hdr(out, type, pos - LEI_FRAME_HDR);
    return pos;
}

/* n bytes at b[*pos] into out, advancing *pos. */
static int getb(const uint8_t *b, size_t n, size_t *pos, void *out, size_t len, const char **err) {
    if (n - *pos < len) {
        *err = "truncated frame";
        return -LEI_E_PROTOCOL;
    }
    memcpy(out, b + *pos, len);
    *pos += len;
    return 0;
}

int lei_parse_hello(const uint8_t *b, size_t n, lei_hello *h, const char **err) {
    size_t pos = 6;
    uint64_t alen, nlen;
    if (n < 4 || memcmp(b, LEI_MAGIC, 4) != 0) {
        *err = "bad magic in handshake (not a lecho peer)";
        return -LEI_E_PROTOCOL;
    }
    if (n < 6) {
        *err = "truncated frame";
        return -LEI_E_PROTOCOL;
    }
    h->version = (unsigned)b[4] << 8 | b[5];
    /* A peer of another version may lay out the rest differently: the caller
     * checks the version before trusting anything else. */
    if (h->version != LEI_PROTO_VERSION) return 0;
    if (getv(b, n, &pos, &h->incarnation, err) || getv(b, n, &pos, &alen, err))
        return -LEI_E_PROTOCOL;
    if (alen == 0 || alen >= LEI_ADDR_MAX || alen >= n - pos) { /* the mode byte follows */
        *err = "bad address in handshake";
        return -LEI_E_PROTOCOL;
    }
    if (memchr(b + pos, 0, (size_t)alen)) { /* "127.0.0.1:5\0junk" would read as an address */
        *err = "bad address in handshake: a NUL byte";
        return -LEI_E_PROTOCOL;
    }
    memcpy(h->addr, b + pos, (size_t)alen);
    h->addr[alen] = '\0';
    pos += alen;
    h->mode = b[pos++];
    h->has_cert = h->has_sig = 0;
    h->cert_len = 0;
    h->name[0] = '\0';
    if (h->mode == LEI_MODE_PROTECTED) {
        if (pos != n) {
            *err = "trailing bytes in handshake";
            return -LEI_E_PROTOCOL;
        }
        return 0;
    }
    h->nsuites = 0;
    if (h->mode != LEI_MODE_KEYED && h->mode != LEI_MODE_KEYED_OFFER) {
        *err = "bad mode in handshake";
        return -LEI_E_PROTOCOL;
    }
    if (getb(b, n, &pos, h->eph, 32, err) || getb(b, n, &pos, h->idpk, 32, err) ||
        getv(b, n, &pos, &nlen, err))
        return -LEI_E_PROTOCOL;
    if (nlen == 0 || nlen > LEI_NAME_MAX || nlen > n - pos) {
        *err = "bad principal name in handshake";
        return -LEI_E_PROTOCOL;
    }
    if (getb(b, n, &pos, h->name, (size_t)nlen, err) || getb(b, n, &pos, &h->has_cert, 1, err))
        return -LEI_E_PROTOCOL;
    h->name[nlen] = '\0';
    if (h->has_cert > 2) {
        *err = "bad certificate flag in handshake";
        return -LEI_E_PROTOCOL;
    }
    /* 1: a v1 certificate (64 bytes, no validity: read, refused by the
     * trust decision with its reason); 2: varint len, the certificate. */
    if (h->has_cert == 1) {
        if (getb(b, n, &pos, h->cert, LEI_SIG_BYTES, err)) return -LEI_E_PROTOCOL;
        h->cert_len = LEI_SIG_BYTES;
    } else if (h->has_cert == 2) {
        uint64_t clen;
        if (getv(b, n, &pos, &clen, err)) return -LEI_E_PROTOCOL;
        if (clen < LEI_CERT_MIN || clen > LEI_CERT_MAX) {
            *err = "bad certificate length in handshake";
            return -LEI_E_PROTOCOL;
        }
        if (getb(b, n, &pos, h->cert, (size_t)clen, err)) return -LEI_E_PROTOCOL;
        h->cert_len = (uint16_t)clen;
    }
    if (h->mode == LEI_MODE_KEYED_OFFER) {
        if (getb(b, n, &pos, &h->nsuites, 1, err)) return -LEI_E_PROTOCOL;
        if (h->nsuites == 0 || h->nsuites > LEI_SUITES_MAX) {
            *err = "bad record cipher list in handshake";
            return -LEI_E_PROTOCOL;
        }
        if (getb(b, n, &pos, h->suites, h->nsuites, err)) return -LEI_E_PROTOCOL;
    }
    if (n - pos == LEI_SIG_BYTES) {
        memcpy(h->sig, b + pos, LEI_SIG_BYTES);
        h->has_sig = 1;
        pos += LEI_SIG_BYTES;
    }
    if (pos != n) {
        *err = "trailing bytes in handshake";
        return -LEI_E_PROTOCOL;
    }
    return 0;
}

size_t lei_frame_event_hdr(uint8_t *out, uint64_t idx, uint64_t producer, uint64_t seq,
                           uint64_t sync, size_t plen) {
    size_t pos = LEI_FRAME_HDR;
    pos += lei_varint_encode(out + pos, idx);
    pos += lei_varint_encode(out + pos, producer);
    pos += lei_varint_encode(out + pos, seq);
    pos += lei_varint_encode(out + pos, sync);
    lei_frame_hdr(out, LEI_F_EVENT, pos - LEI_FRAME_HDR + plen);
    return pos;
}

int lei_parse_event(const uint8_t *b, size_t n, lei_event_hdr *e, const char **err) {
    size_t pos = 0;
    if (getv(b, n, &pos, &e->idx, err) || getv(b, n, &pos, &e->producer, err) ||
        getv(b, n, &pos, &e->seq, err) || getv(b, n, &pos, &e->sync, err))
        return -LEI_E_PROTOCOL;
    if (pos == n) {
        *err = "event without a value";
        return -LEI_E_PROTOCOL;
    }
    e->payload = b + pos;
    e->plen = n - pos;
    return 0;
}

size_t lei_frame_ack_hdr(uint8_t *out, uint64_t sync, uint64_t nran, size_t elen) {
    size_t pos = LEI_FRAME_HDR;
    pos += lei_varint_encode(out + pos, sync);
    pos += lei_varint_encode(out + pos, nran);
    lei_frame_hdr(out, LEI_F_ACK, pos - LEI_FRAME_HDR + elen);
    return pos;
}

int lei_parse_ack(const uint8_t *b, size_t n, uint64_t *sync, uint64_t *nran,
                  const uint8_t **errs, size_t *elen, const char **err) {
    size_t pos = 0;
    if (getv(b, n, &pos, sync, err) || getv(b, n, &pos, nran, err)) return -LEI_E_PROTOCOL;
    *errs = b + pos;
    *elen = n - pos;
    return 0;
}

size_t lei_frame_bind(uint8_t *out, uint64_t idx, const char *name, size_t namelen,
                      const uint8_t *ticket) {
    size_t pos = LEI_FRAME_HDR;
    pos += lei_varint_encode(out + pos, idx);
    pos += lei_varint_encode(out + pos, namelen);
    memcpy(out + pos, name, namelen);
    pos += namelen;
    out[pos++] = ticket ? 2 : 0;
    if (ticket) {
        memcpy(out + pos, ticket, LEI_TICKET_BYTES);
        pos += LEI_TICKET_BYTES;
    }
    lei_frame_hdr(out, LEI_F_BIND, pos - LEI_FRAME_HDR);
    return pos;
}

int lei_parse_bind(const uint8_t *b, size_t n, uint64_t *idx, const uint8_t **name,
                   size_t *namelen, const uint8_t **ticket, const char **err) {
    size_t pos = 0;
    uint64_t len;
    if (getv(b, n, &pos, idx, err) || getv(b, n, &pos, &len, err)) return -LEI_E_PROTOCOL;
    if (len == 0 || len >= n - pos) {
        *err = "bad channel name in bind";
        return -LEI_E_PROTOCOL;
    }
    if (len > LEI_BIND_NAME_MAX) { /* no channel has such a name: kept, it would cost memory */
        *err = "channel name in bind longer than " LEI_STR(LEI_BIND_NAME_MAX) " bytes";
        return -LEI_E_PROTOCOL;
    }
    *name = b + pos;
    *namelen = (size_t)len;
    pos += (size_t)len;
    /* 0: none; 2: a ticket with its expiry (LEI_TICKET_BYTES); 1, a v1
     * ticket without expiry (64 bytes), is read as none: refused. */
    uint8_t has = b[pos++];
    if (has > 2 || n - pos != (has == 2 ? LEI_TICKET_BYTES : has ? LEI_SIG_BYTES : 0)) {
        *err = "bad ticket in bind";
        return -LEI_E_PROTOCOL;
    }
    *ticket = has == 2 ? b + pos : NULL;
    return 0;
}
