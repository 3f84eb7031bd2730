/* secure.c: the crypto of a keyed connection: the ephemeral key exchange,
 * the handshake transcript and its signatures, session keys, and records
 * (doc/wire-format.md, "Keyed connections").
 *
 * A record is u32 LE clen (17 .. LEI_REC_PLAIN_MAX + 16), then clen bytes of
 * ChaCha20-Poly1305 (IETF) over up to LEI_REC_PLAIN_MAX plaintext bytes, the
 * 4 length bytes as additional data, nonce 4 zero bytes || u64 LE counter of
 * that direction.  libsodium only; no sockets but the write of pending
 * records, no Lua.
 */
#define _GNU_SOURCE
#include "ctx_int.h"

#include <errno.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define TAG crypto_aead_chacha20poly1305_IETF_ABYTES

lei_sec *lei_sec_new(void) {
    lei_sec *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    crypto_kx_keypair(s->eph_pk, s->eph_sk);
    crypto_generichash_init(&s->th, NULL, 0, 32);
    return s;
}

void lei_sec_free(lei_sec *s) {
    if (!s) return;
    free(s->crb);
    free(s->wrec);
    free(s->pt);
    sodium_memzero(s, sizeof *s);
    free(s);
}

void lei_sec_hash(lei_sec *s, const uint8_t *b, size_t n) { crypto_generichash_update(&s->th, b, n); }

void lei_sec_final(lei_sec *s) { crypto_generichash_final(&s->th, s->T, 32); }

/* "lecho-v2 acceptor" 0x00 || T (or dialler) */
static size_t role_msg(const lei_sec *s, int acceptor, uint8_t *m) {
    static const char A[] = "lecho-v2 acceptor", D[] = "lecho-v2 dialler";
    const char *r = acceptor ? A : D;
    size_t n = strlen(r) + 1; /* with its NUL */
    memcpy(m, r, n);
    memcpy(m + n, s->T, 32);
    return n + 32;
}

void lei_sec_sign(const lei_ctx *c, const lei_sec *s, int acceptor, uint8_t sig[64]) {
    uint8_t m[64];
    size_t n = role_msg(s, acceptor, m);
    crypto_sign_detached(sig, NULL, m, n, c->id.sk);
}

int lei_sec_verify(const lei_sec *s, int acceptor, const uint8_t pk[32], const uint8_t sig[64]) {
    uint8_t m[64];
    size_t n = role_msg(s, acceptor, m);
    return crypto_sign_verify_detached(sig, m, n, pk) == 0 ? 0 : -1;
}

int lei_sec_keys(lei_sec *s, int dialler, const uint8_t remote_eph[32]) {
    int rc = dialler ? crypto_kx_client_session_keys(s->rx, s->tx, s->eph_pk, s->eph_sk, remote_eph)
                     : crypto_kx_server_session_keys(s->rx, s->tx, s->eph_pk, s->eph_sk, remote_eph);
    sodium_memzero(s->eph_sk, sizeof s->eph_sk);
    return rc == 0 ? 0 : -1;
}

static void nonce(uint8_t n[12], uint64_t ctr) {
    memset(n, 0, 4);
    for (int i = 0; i < 8; i++) n[4 + i] = (uint8_t)(ctr >> (8 * i));
}

static int grow(uint8_t **b, size_t *cap, size_t need) {
    if (*cap >= need) return 0;
    size_t n = *cap ? *cap : 4096;
    while (n < need) n *= 2;
    uint8_t *nb = realloc(*b, n);
    if (!nb) return -1;
    *b = nb;
    *cap = n;
    return 0;
}

int lei_sec_seal(lei_sec *s, const uint8_t *pt, size_t n) {
    if (n == 0 || n > LEI_REC_PLAIN_MAX) return -1;
    if (s->woff && s->woff == s->wlen) s->woff = s->wlen = 0;
    if (grow(&s->wrec, &s->wcap, s->wlen + 4 + n + TAG)) return -1;
    uint8_t *r = s->wrec + s->wlen, nb[12];
    unsigned long long clen;
    lei_put_u32le(r, (uint32_t)(n + TAG));
    nonce(nb, s->tn++);
    crypto_aead_chacha20poly1305_ietf_encrypt(r + 4, &clen, pt, n, r, 4, NULL, nb, s->tx);
    s->wlen += 4 + (size_t)clen;
    return 0;
}

uint8_t *lei_sec_scratch(lei_sec *s) {
    if (!s->pt) s->pt = malloc(LEI_REC_PLAIN_MAX);
    return s->pt;
}

int lei_sec_write(lei_sec *s, int fd, size_t *wrote) {
    *wrote = 0;
    while (s->woff < s->wlen) {
        ssize_t w = send(fd, s->wrec + s->woff, s->wlen - s->woff, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        if (w <= 0) return -1;
        s->woff += (size_t)w;
        *wrote += (size_t)w;
    }
    s->woff = s->wlen = 0;
    return 1;
}

int lei_sec_pending(const lei_sec *s) { return s && s->wlen > s->woff; }

int lei_sec_in_room(lei_sec *s, uint8_t **at, size_t *room) {
    if (s->cpos) { /* compact */
        memmove(s->crb, s->crb + s->cpos, s->clen - s->cpos);
        s->clen -= s->cpos;
        s->cpos = 0;
    }
    if (grow(&s->crb, &s->ccap, 2 * (4 + LEI_REC_PLAIN_MAX + TAG))) return -1;
    *at = s->crb + s->clen;
    *room = s->ccap - s->clen;
    return 0;
}

int lei_sec_in_take(lei_sec *s, const uint8_t *b, size_t n) {
    uint8_t *at;
    size_t room;
    if (lei_sec_in_room(s, &at, &room) || grow(&s->crb, &s->ccap, s->clen + n)) return -1;
    memcpy(s->crb + s->clen, b, n);
    s->clen += n;
    return 0;
}

int lei_sec_open(lei_sec *s, uint8_t **rb, size_t *rlen, size_t *rcap, const char **err) {
    while (s->clen - s->cpos >= 4) {
        const uint8_t *r = s->crb + s->cpos;
        uint32_t clen = lei_get_u32le(r);
        if (clen <= TAG || clen > LEI_REC_PLAIN_MAX + TAG) {
            *err = "bad record (length)";
            return -1;
        }
        if (s->clen - s->cpos - 4 < clen) break;
        if (grow(rb, rcap, *rlen + clen - TAG)) {
            *err = "out of memory for the read buffer";
            return -1;
        }
        uint8_t nb[12];
        unsigned long long plen;
        nonce(nb, s->rn);
        if (crypto_aead_chacha20poly1305_ietf_decrypt(*rb + *rlen, &plen, NULL, r + 4, clen, r, 4,
                                                      nb, s->rx)) {
            *err = "bad record";
            return -1;
        }
        s->rn++;
        *rlen += (size_t)plen;
        s->cpos += 4 + clen;
    }
    return 0;
}

int lei_sec_in_pending(const lei_sec *s) { return s->clen > s->cpos; }
