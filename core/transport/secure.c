/* secure.c: the keyed mechanism (lei_mech, ctx_int.h): a keyed
 * connection's handshake steps and its crypto: our keyed HELLO and
 * HELLO_OK, the checks of the remote's, the trust and pins of its key, the
 * ephemeral key exchange, the handshake transcript and its signatures,
 * AUTH and AUTH_OK, the record cipher's offer and choice and their key
 * schedule, and records (doc/protocol.md sections 3 and 4).  Its state,
 * struct lei_sec (k->sec), is defined here and read nowhere else:
 * handshake.c drives the steps through k->mech, auth.c and handshake.c
 * ask for the remote's identity through `remote`.
 *
 * A record is u32 LE clen (17 .. LEI_REC_PLAIN_MAX + 16), then clen bytes
 * of the connection's record cipher over up to LEI_REC_PLAIN_MAX plaintext
 * bytes, the 4 length bytes as additional data, nonce 4 zero bytes || u64
 * LE counter of that direction.  The cipher is ChaCha20-Poly1305 (IETF)
 * unless both sides offered AES-256-GCM in mode 2 (the acceptor chooses).
 * Records are sealed from the queue's iovecs: a large piece (an event's
 * value) is encrypted straight from where it lies into the output, small
 * ones are gathered there and encrypted in place: no plaintext scratch copy.
 * libsodium for the handshake; the record ciphers' bulk work by OpenSSL's
 * libcrypto when built with it (LECHO_OPENSSL: the Makefile finds it with
 * pkg-config; its AES-GCM and ChaCha20-Poly1305 run 2.5x and 3.7x
 * libsodium 1.0.18's on an AVX-512 CPU), else by libsodium: the same
 * bytes on the wire either way.  No sockets but the write of pending
 * records and the read of ciphertext, no Lua.  The trust tables are
 * auth.c's; the states, the peers and the tie-break handshake.c's.
 */
#define _GNU_SOURCE
#include "ctx_int.h"

#include <errno.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>
#ifdef LECHO_OPENSSL
#include <openssl/evp.h>
#endif

#define TAG 16 /* both ciphers' tags */

/* A record cipher: an AEAD with a 16-byte tag and 96-bit nonces (4 zero
 * bytes || the u64 LE record counter of the direction). */
typedef struct lei_cipher {
    const char *name;      /* "aes-256-gcm", "chacha20-poly1305" */
    uint8_t suite;         /* enum lei_suite: its number in an offer */
    size_t tag;            /* bytes a record adds past its plaintext (and 4 of length) */
    int (*available)(void);              /* this CPU runs it (AES-NI for AES-GCM) */
    int (*keys)(lei_sec *s);             /* the key schedule of s->tx, s->rx: 0 or -1 */
    /* n bytes at m sealed to c (c may be m): n bytes of ciphertext, then the
     * tag; 0, or -1 (out of memory in OpenSSL) */
    int (*seal)(lei_sec *s, uint8_t *c, const uint8_t *m, size_t n, const uint8_t ad[4],
                uint64_t ctr);
    /* the reverse into m: 0, or -1 (forged, or not this key's) */
    int (*open)(lei_sec *s, uint8_t *m, const uint8_t *c, size_t n, const uint8_t ad[4],
                uint64_t ctr);
} lei_cipher;

/* The keyed mechanism's state of one connection (k->sec, owned by k from
 * keyed_start to keyed_end). */
struct lei_sec {
    crypto_aead_aes256gcm_state aes_tx, aes_rx; /* libsodium's AES-256-GCM: the expanded
                                                 * keys (16-aligned) */
    void *evp_tx, *evp_rx;       /* owned, LECHO_OPENSSL: the ciphers' EVP_CIPHER_CTX */
    crypto_generichash_state th; /* transcript: HELLO body, HELLO_OK body sans signature */
    uint8_t T[32];               /* its hash, once both are in */
    uint8_t eph_pk[32], eph_sk[32]; /* our ephemeral X25519 keys (sk wiped once used) */
    uint8_t rx[32], tx[32];      /* session keys (AES-GCM: the current ones, rekeyed) */
    const lei_cipher *cs;        /* the record cipher: ChaCha20-Poly1305 unless the
                                  * handshake (mode 2) chose another */
    int offered;                 /* dialler: our HELLO was mode 2 (an offer) */
    int fallback;                /* dialler: mode 1 after an acceptor refused the offer */
    int legacy;                  /* acceptor: the dialler's HELLO was mode 1 (no offer) */
    uint64_t rn, tn;             /* record counters, per direction */
    int rec_in, rec_out;         /* the stream is records, per direction */
    lei_hello remote;            /* the remote's HELLO or HELLO_OK (keyed fields) */
    uint8_t *crb;                /* owned: ciphertext read, not yet decrypted */
    size_t clen, cpos, ccap;
    uint8_t *wrec;               /* owned: sealed records not yet written */
    size_t wlen, woff, wcap;
};

/* The marker a dialler sends first on a connection it made in mode 1 after
 * an acceptor refused its offer (doc/protocol.md "Record ciphers"): a CTRL
 * frame, header included, of at most this size (fallback_frame). */
#define FALLBACK_MAX 96

/* A piece of the queue at least this long starts a record of its own and
 * is encrypted from where it lies; shorter ones are copied together. */
#define DIRECT_MIN 2048
/* Plaintext sealed per turn of the flush loop before a write: four
 * records, one send for 256 KiB. */
#define SEAL_BATCH (4 * LEI_REC_PLAIN_MAX)
/* AES-256-GCM: the key of a direction is replaced every 2^20 records
 * (64 GiB at most, 2^32 blocks: far below GCM's bounds for one key). */
#define REKEY_RECORDS ((uint64_t)1 << 20)

/* ---- record ciphers --------------------------------------------------- */

static void nonce(uint8_t n[12], uint64_t ctr) {
    memset(n, 0, 4);
    for (int i = 0; i < 8; i++) n[4 + i] = (uint8_t)(ctr >> (8 * i));
}

static int chacha_available(void) { return 1; }
/* AES-256-GCM only where the CPU has AES-NI and PCLMUL (libsodium's test):
 * elsewhere it would be slow and, in software, not constant-time. */
static int aes_available(void) { return crypto_aead_aes256gcm_is_available(); }

/* The next key of a direction: BLAKE2b-256 keyed with the current one over
 * "lecho-v3 rekey"; the old one wiped. */
static void next_key(uint8_t key[32]) {
    static const char R[] = "lecho-v3 rekey";
    uint8_t next[32];
    crypto_generichash(next, 32, (const uint8_t *)R, sizeof R - 1, key, 32);
    memcpy(key, next, 32);
    sodium_memzero(next, sizeof next);
}

#ifdef LECHO_OPENSSL
/* One EVP context per direction, keyed once (the key schedule); per
 * record only the nonce is set.  In place (c == m) is allowed. */
static int evp_keys(lei_sec *s, const EVP_CIPHER *cipher) {
    EVP_CIPHER_CTX *tx = EVP_CIPHER_CTX_new(), *rx = EVP_CIPHER_CTX_new(); /* owned by s: keyed_end */
    s->evp_tx = tx;
    s->evp_rx = rx;
    if (!tx || !rx || EVP_EncryptInit_ex(tx, cipher, NULL, s->tx, NULL) != 1 ||
        EVP_DecryptInit_ex(rx, cipher, NULL, s->rx, NULL) != 1)
        return -1;
    return 0;
}
static int chacha_keys(lei_sec *s) { return evp_keys(s, EVP_chacha20_poly1305()); }
static int aes_keys(lei_sec *s) { return evp_keys(s, EVP_aes_256_gcm()); }

static int evp_seal(EVP_CIPHER_CTX *x, uint8_t *c, const uint8_t *m, size_t n, const uint8_t ad[4],
                    const uint8_t nb[12]) {
    int ol = 0, fl = 0;
    if (EVP_EncryptInit_ex(x, NULL, NULL, NULL, nb) != 1 || EVP_EncryptUpdate(x, NULL, &ol, ad, 4) != 1 ||
        EVP_EncryptUpdate(x, c, &ol, m, (int)n) != 1 || EVP_EncryptFinal_ex(x, c + ol, &fl) != 1 ||
        EVP_CIPHER_CTX_ctrl(x, EVP_CTRL_AEAD_GET_TAG, TAG, c + n) != 1)
        return -1;
    return 0;
}
static int evp_open(EVP_CIPHER_CTX *x, uint8_t *m, const uint8_t *c, size_t n, const uint8_t ad[4],
                    const uint8_t nb[12]) {
    int ol = 0, fl = 0;
    uint8_t tag[TAG];
    memcpy(tag, c + n, TAG); /* (the ctrl takes a non-const pointer) */
    if (EVP_DecryptInit_ex(x, NULL, NULL, NULL, nb) != 1 || EVP_DecryptUpdate(x, NULL, &ol, ad, 4) != 1 ||
        EVP_DecryptUpdate(x, m, &ol, c, (int)n) != 1 ||
        EVP_CIPHER_CTX_ctrl(x, EVP_CTRL_AEAD_SET_TAG, TAG, tag) != 1 ||
        EVP_DecryptFinal_ex(x, m + ol, &fl) != 1)
        return -1;
    return 0;
}
static int chacha_seal(lei_sec *s, uint8_t *c, const uint8_t *m, size_t n, const uint8_t ad[4],
                       uint64_t ctr) {
    uint8_t nb[12];
    nonce(nb, ctr);
    return evp_seal(s->evp_tx, c, m, n, ad, nb);
}
static int chacha_open(lei_sec *s, uint8_t *m, const uint8_t *c, size_t n, const uint8_t ad[4],
                       uint64_t ctr) {
    uint8_t nb[12];
    nonce(nb, ctr);
    return evp_open(s->evp_rx, m, c, n, ad, nb);
}
static int aes_seal(lei_sec *s, uint8_t *c, const uint8_t *m, size_t n, const uint8_t ad[4],
                    uint64_t ctr) {
    uint8_t nb[12];
    if (ctr && ctr % REKEY_RECORDS == 0) {
        next_key(s->tx);
        if (EVP_EncryptInit_ex(s->evp_tx, NULL, NULL, s->tx, NULL) != 1) return -1;
    }
    nonce(nb, ctr);
    return evp_seal(s->evp_tx, c, m, n, ad, nb);
}
static int aes_open(lei_sec *s, uint8_t *m, const uint8_t *c, size_t n, const uint8_t ad[4],
                    uint64_t ctr) {
    uint8_t nb[12];
    if (ctr && ctr % REKEY_RECORDS == 0) {
        next_key(s->rx);
        if (EVP_DecryptInit_ex(s->evp_rx, NULL, NULL, s->rx, NULL) != 1) return -1;
    }
    nonce(nb, ctr);
    return evp_open(s->evp_rx, m, c, n, ad, nb);
}
#else /* libsodium */
static int chacha_keys(lei_sec *s) {
    (void)s;
    return 0;
}
static int chacha_seal(lei_sec *s, uint8_t *c, const uint8_t *m, size_t n, const uint8_t ad[4],
                       uint64_t ctr) {
    uint8_t nb[12];
    nonce(nb, ctr);
    return crypto_aead_chacha20poly1305_ietf_encrypt_detached(c, c + n, NULL, m, n, ad, 4, NULL, nb,
                                                              s->tx);
}
static int chacha_open(lei_sec *s, uint8_t *m, const uint8_t *c, size_t n, const uint8_t ad[4],
                       uint64_t ctr) {
    uint8_t nb[12];
    nonce(nb, ctr);
    return crypto_aead_chacha20poly1305_ietf_decrypt_detached(m, NULL, c, n, c + n, ad, 4, nb, s->rx);
}
/* The key schedule: the session keys expanded once (not per record). */
static int aes_keys(lei_sec *s) {
    crypto_aead_aes256gcm_beforenm(&s->aes_tx, s->tx);
    crypto_aead_aes256gcm_beforenm(&s->aes_rx, s->rx);
    return 0;
}
static int aes_seal(lei_sec *s, uint8_t *c, const uint8_t *m, size_t n, const uint8_t ad[4],
                    uint64_t ctr) {
    uint8_t nb[12];
    if (ctr && ctr % REKEY_RECORDS == 0) {
        next_key(s->tx);
        crypto_aead_aes256gcm_beforenm(&s->aes_tx, s->tx);
    }
    nonce(nb, ctr);
    return crypto_aead_aes256gcm_encrypt_detached_afternm(c, c + n, NULL, m, n, ad, 4, NULL, nb,
                                                          &s->aes_tx);
}
static int aes_open(lei_sec *s, uint8_t *m, const uint8_t *c, size_t n, const uint8_t ad[4],
                    uint64_t ctr) {
    uint8_t nb[12];
    if (ctr && ctr % REKEY_RECORDS == 0) {
        next_key(s->rx);
        crypto_aead_aes256gcm_beforenm(&s->aes_rx, s->rx);
    }
    nonce(nb, ctr);
    return crypto_aead_aes256gcm_decrypt_detached_afternm(m, NULL, c, n, c + n, ad, 4, nb, &s->aes_rx);
}
#endif

/* In order of preference: what this side offers (the available ones) and
 * what an acceptor picks first among those offered. */
static const lei_cipher CIPHERS[] = {
    {"aes-256-gcm", LEI_SUITE_AES256_GCM, TAG, aes_available, aes_keys, aes_seal, aes_open},
    {"chacha20-poly1305", LEI_SUITE_CHACHA20_POLY1305, TAG, chacha_available, chacha_keys,
     chacha_seal, chacha_open},
};
#define NCIPHERS (sizeof CIPHERS / sizeof CIPHERS[0])

/* The available cipher of that number, or NULL. */
static const lei_cipher *cipher_get(uint8_t suite) {
    for (size_t i = 0; i < NCIPHERS; i++)
        if (CIPHERS[i].suite == suite && CIPHERS[i].available()) return &CIPHERS[i];
    return NULL;
}

/* What this context offers, in its order of preference: how many. */
static int cipher_offer(const lei_ctx *c, uint8_t suites[LEI_SUITES_MAX]) {
    int n = 0;
    for (size_t i = 0; i < NCIPHERS; i++)
        if (CIPHERS[i].available() && !(CIPHERS[i].suite == LEI_SUITE_AES256_GCM && c->o.no_aes))
            suites[n++] = CIPHERS[i].suite;
    return n;
}

/* The acceptor's choice among a dialler's offer: its own first preference
 * that the offer holds, or NULL (nothing in common). */
static const lei_cipher *cipher_choose(const lei_ctx *c, const uint8_t *offer, int n) {
    uint8_t mine[LEI_SUITES_MAX];
    int m = cipher_offer(c, mine);
    for (int i = 0; i < m; i++)
        if (memchr(offer, mine[i], (size_t)n)) return cipher_get(mine[i]);
    return NULL;
}

/* ---- the handshake's crypto ------------------------------------------- */

static void sec_hash(lei_sec *s, const uint8_t *b, size_t n) { crypto_generichash_update(&s->th, b, n); }

static void sec_final(lei_sec *s) { crypto_generichash_final(&s->th, s->T, 32); }

/* "lecho-v2 acceptor" 0x00 || T (or dialler) */
static size_t role_msg(const lei_sec *s, int acceptor, uint8_t *m) {
    static const char A[] = "lecho-v2 acceptor", D[] = "lecho-v2 dialler";
    const char *r = acceptor ? A : D;
    size_t n = strlen(r) + 1; /* with its NUL */
    memcpy(m, r, n);
    memcpy(m + n, s->T, 32);
    return n + 32;
}

/* The transcript signature of our role (acceptor or dialler), and the check
 * of the remote's: 0 or -1. */
static void sec_sign(const lei_ctx *c, const lei_sec *s, int acceptor, uint8_t sig[64]) {
    uint8_t m[64];
    size_t n = role_msg(s, acceptor, m);
    crypto_sign_detached(sig, NULL, m, n, c->id.sk);
}

static int sec_verify(const lei_sec *s, int acceptor, const uint8_t pk[32], const uint8_t sig[64]) {
    uint8_t m[64];
    size_t n = role_msg(s, acceptor, m);
    return crypto_sign_verify_detached(sig, m, n, pk) == 0 ? 0 : -1;
}

/* The key schedule: session keys from our ephemeral keys and the remote's,
 * expanded for s->cs (chosen before): 0 or -1. */
static int sec_keys(lei_sec *s, int dialler, const uint8_t remote_eph[32]) {
    int rc = dialler ? crypto_kx_client_session_keys(s->rx, s->tx, s->eph_pk, s->eph_sk, remote_eph)
                     : crypto_kx_server_session_keys(s->rx, s->tx, s->eph_pk, s->eph_sk, remote_eph);
    sodium_memzero(s->eph_sk, sizeof s->eph_sk);
    if (rc) return -1;
    return s->cs->keys(s);
}

/* { op = "reply", rid = 0, fallback = "cipher offer refused" }: a reply to
 * nothing (rids are drawn from 1), dropped without a word by a context of
 * before the offer; an acceptor that offers reads it as a downgrade. */
static size_t fallback_frame(uint8_t *b) {
    static const char F[] = "cipher offer refused";
    lei_wbuf w = {0};
    size_t n = 0;
    if (lei_enc_table_header(&w, 0, 3) == 0 && lei_enc_string(&w, "op", 2) == 0 &&
        lei_enc_string(&w, "reply", 5) == 0 && lei_enc_string(&w, "rid", 3) == 0 &&
        lei_enc_number(&w, 0) == 0 && lei_enc_string(&w, "fallback", 8) == 0 &&
        lei_enc_string(&w, F, sizeof F - 1) == 0 && w.len + LEI_FRAME_HDR <= FALLBACK_MAX) {
        lei_frame_hdr(b, LEI_F_CTRL, w.len);
        memcpy(b + LEI_FRAME_HDR, w.data, w.len);
        n = LEI_FRAME_HDR + w.len;
    }
    lei_wbuf_free(&w);
    return n;
}

/* ---- records out -------------------------------------------------------- */

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

/* The record at r (its plaintext, n bytes, at r + 4 or at m) sealed into
 * place: the pending output grows by its size.  0, or -1 (the cipher
 * failed: OpenSSL out of memory). */
static int seal_at(lei_sec *s, uint8_t *r, const uint8_t *m, size_t n) {
    lei_put_u32le(r, (uint32_t)(n + TAG));
    if (s->cs->seal(s, r + 4, m, n, r, s->tn++)) return -1;
    s->wlen += 4 + n + TAG;
    return 0;
}

/* Seals up to about `budget` plaintext bytes of the iovecs (which hold
 * `total` bytes) as records behind the pending ones: a piece of DIRECT_MIN
 * bytes or more is encrypted from where it lies (a record of its own), the
 * smaller ones are copied together and encrypted in place.  Returns the
 * plaintext bytes sealed (0: out of memory, or nothing given). */
static size_t seal_iov(lei_sec *s, const struct iovec *iov, int n, size_t budget) {
    size_t done = 0, fill = 0;
    uint8_t *r = NULL; /* the record being gathered (fill bytes at r + 4) */
    if (s->woff && s->woff == s->wlen) s->woff = s->wlen = 0;
    for (int i = 0; i < n && done < budget; i++) {
        const uint8_t *b = iov[i].iov_base;
        size_t len = iov[i].iov_len;
        while (len && done < budget) {
            if (len >= DIRECT_MIN && fill) { /* the gathered record ends here */
                if (seal_at(s, r, r + 4, fill)) return 0;
                fill = 0;
            }
            if (!fill && grow(&s->wrec, &s->wcap, s->wlen + 4 + LEI_REC_PLAIN_MAX + TAG)) return done;
            r = s->wrec + s->wlen;
            if (len >= DIRECT_MIN) {
                size_t m = len < LEI_REC_PLAIN_MAX ? len : LEI_REC_PLAIN_MAX;
                if (seal_at(s, r, b, m)) return 0;
                b += m, len -= m, done += m;
                continue;
            }
            size_t m = LEI_REC_PLAIN_MAX - fill < len ? LEI_REC_PLAIN_MAX - fill : len;
            memcpy(r + 4 + fill, b, m);
            b += m, len -= m, done += m, fill += m;
            if (fill == LEI_REC_PLAIN_MAX) {
                if (seal_at(s, r, r + 4, fill)) return 0;
                fill = 0;
            }
        }
    }
    if (fill && seal_at(s, r, r + 4, fill)) return 0;
    return done;
}

/* Writes pending records: 1 all written, 0 the socket is full, -1 error (errno). */
static int sec_write(lei_sec *s, int fd) {
    while (s->woff < s->wlen) {
        ssize_t w = send(fd, s->wrec + s->woff, s->wlen - s->woff, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        if (w <= 0) return -1;
        s->woff += (size_t)w;
    }
    s->woff = s->wlen = 0;
    return 1;
}

static int keyed_out_pending(const lei_conn *k) { return k->sec && k->sec->wlen > k->sec->woff; }

/* Writes what is sealed: sec_write's answer; the connection's last write
 * time follows when bytes went. */
static int write_sealed(lei_conn *k) {
    lei_sec *s = k->sec;
    size_t pend = s->wlen - s->woff;
    int r = sec_write(s, k->fd);
    if (s->wlen - s->woff < pend) k->last_out = ev_now(k->ctx->loop);
    return r;
}

static int keyed_write_pending(lei_conn *k) { return write_sealed(k); }

/* Before records are on (the handshake) a frame goes as it is; after, it
 * is sealed as one record, behind any pending one; what the socket does
 * not take now waits for the write watcher. */
static void keyed_write_now(lei_conn *k, const uint8_t *b, size_t n) {
    lei_sec *s = k->sec;
    if (!s->rec_out) {
        lei_mech_protected.write_now(k, b, n);
        return;
    }
    struct iovec v = {(void *)b, n};
    if (seal_iov(s, &v, 1, n) == n && sec_write(s, k->fd) == 0 && k->state != LEI_CONN_CLOSED)
        ev_io_start(k->ctx->loop, &k->wio);
}

/* The queue goes out as records, sealed from its iovecs SEAL_BATCH bytes
 * at a time, each batch written before the next is sealed; what the socket
 * does not take waits (pending) and goes first next time. */
static void keyed_flush(lei_peer *p) {
    lei_ctx *c = p->ctx;
    lei_conn *k = p->conn;
    lei_sec *s = k->sec;
    for (;;) {
        int r = write_sealed(k);
        if (r < 0) {
            char why[160];
            snprintf(why, sizeof why, "write: %s", strerror(errno));
            lei_conn_close(k, why, 0);
            return;
        }
        if (r == 0) {
            ev_io_start(c->loop, &k->wio);
            p->wfull = p->q.bytes; /* lei_peer_enqueue writes again past batch_bytes more */
            return;
        }
        if (!p->q.head) break;
        struct iovec iov[LEI_IOVN];
        int n = lei_peer_queue_iov(p, iov, LEI_IOVN);
        size_t len = seal_iov(s, iov, n, SEAL_BATCH);
        if (!len) {
            lei_conn_close(k, "out of memory for a record", 0);
            return;
        }
        p->st.batches++;
        p->st.bytes_out += len;
        lei_peer_queue_took(p, len);
    }
    ev_io_stop(c->loop, &k->wio);
    if (c->closing) lei_conn_fin(k);
}

/* ---- records in --------------------------------------------------------- */

/* Where the next read of ciphertext goes (0, or -1 ENOMEM). */
static int in_room(lei_sec *s, uint8_t **at, size_t *room) {
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

/* Bytes after the frame being handled are records from now on: what was
 * read behind it goes to the ciphertext buffer.  0, or -1 after closing k. */
static int records_in(lei_conn *k) {
    lei_sec *s = k->sec;
    if (s->rec_in) return 0;
    s->rec_in = 1;
    if (k->rlen > k->rpos) {
        size_t n = k->rlen - k->rpos;
        uint8_t *at;
        size_t room;
        if (in_room(s, &at, &room) || grow(&s->crb, &s->ccap, s->clen + n)) {
            lei_conn_close(k, "out of memory for the read buffer", 0);
            return -1;
        }
        memcpy(s->crb + s->clen, k->rb + k->rpos, n);
        s->clen += n;
        k->rlen = k->rpos;
    }
    return 0;
}

/* Ciphertext (records on) into the ciphertext buffer; before, frames into
 * the frame buffer as the protected mechanism reads them. */
static ssize_t keyed_read(lei_conn *k) {
    lei_sec *s = k->sec;
    if (!s->rec_in) return lei_mech_protected.read(k);
    uint8_t *at;
    size_t room;
    if (in_room(s, &at, &room)) {
        lei_conn_close(k, "out of memory for the read buffer", 0);
        errno = ENOMEM;
        return -1;
    }
    ssize_t n = read(k->fd, at, room);
    if (n > 0) s->clen += (size_t)n;
    return n;
}

static size_t keyed_in_pending(const lei_conn *k) {
    const lei_sec *s = k->sec;
    return s && s->rec_in ? s->clen - s->cpos : 0;
}

/* Decrypts the complete records read into k's frame buffer, growing it
 * (charged to the read budget): 0, or -1 after closing k (a bad record). */
static int keyed_open(lei_conn *k) {
    lei_sec *s = k->sec;
    const char *err = NULL;
    while (s->clen - s->cpos >= 4) {
        const uint8_t *r = s->crb + s->cpos;
        uint32_t clen = lei_get_u32le(r);
        if (clen <= TAG || clen > LEI_REC_PLAIN_MAX + TAG) {
            err = "bad record (length)";
            break;
        }
        if (s->clen - s->cpos - 4 < clen) break;
        if (lei_rbuf_reserve(k, k->rlen + clen - TAG)) { /* charged to the read budget */
            err = "out of memory for the read buffer";
            break;
        }
        if (s->cs->open(s, k->rb + k->rlen, r + 4, clen - TAG, r, s->rn)) {
            err = "bad record";
            break;
        }
        s->rn++;
        k->rlen += clen - TAG;
        s->cpos += 4 + clen;
    }
    if (!err) return 0;
    lei_conn_close(k, err, 1);
    return -1;
}

/* ---- the keyed handshake (handshake.c drives it: the mechanism's steps) --
 *
 * dialler: keyed_hello (HELLO, our offer) ... keyed_hello_in (HELLO_OK:
 * trust, the cipher chosen, the acceptor's signature; AUTH out, records
 * on) ... keyed_auth_in (AUTH_OK: trust again, the fallback marker).
 * acceptor: keyed_hello_in (HELLO: trust, the cipher chosen; our signed
 * HELLO_OK out) ... keyed_auth_in (AUTH: the dialler's signature, records
 * on, trust again).  handshake.c moves the states and ties the
 * connection to its peer. */

/* What a v3 acceptor of before the record cipher offer answers a mode 2
 * HELLO (frame.c's parser): the dialler tries again in mode 1. */
static const char OLD_ACCEPTOR[] = "bad mode in handshake";

/* Our keyed HELLO (dialled) or HELLO_OK (accepted) into b[LEI_HELLO_MAX]:
 * into the transcript; a HELLO_OK ends with our signature. */
static size_t keyed_hello(lei_conn *k, uint8_t type, uint8_t *b) {
    lei_ctx *c = k->ctx;
    lei_sec *s = k->sec;
    lei_hello key;
    memcpy(key.eph, s->eph_pk, 32);
    memcpy(key.idpk, c->id.pk, 32);
    memcpy(key.name, c->id.name, sizeof key.name);
    key.has_cert = (uint8_t)c->id.has_cert;
    key.cert_len = (uint16_t)c->id.cert_len;
    memcpy(key.cert, c->id.cert, c->id.cert_len);
    /* The record ciphers: a dialler offers those it has (mode 2), unless
     * its peer refused an offer just now (a v3 acceptor of before: mode 1,
     * this once); an acceptor answers an offer with its choice, a mode 1
     * HELLO in mode 1 (ChaCha20-Poly1305). */
    key.mode = LEI_MODE_KEYED;
    key.nsuites = 0;
    if (type == LEI_F_HELLO && k->peer && k->peer->no_offer) {
        k->peer->no_offer = 0;
        s->fallback = 1;
    } else if (type == LEI_F_HELLO) {
        key.nsuites = (uint8_t)cipher_offer(c, key.suites);
        key.mode = LEI_MODE_KEYED_OFFER;
        s->offered = 1;
    } else if (!s->legacy) {
        key.nsuites = 1;
        key.suites[0] = s->cs->suite;
        key.mode = LEI_MODE_KEYED_OFFER;
    }
    size_t n = lei_frame_hello(b, type, LEI_PROTO_VERSION, c->incarnation, c->addr, &key);
    if (type == LEI_F_HELLO) {
        sec_hash(s, b + LEI_FRAME_HDR, n - LEI_FRAME_HDR);
    } else {
        sec_hash(s, b + LEI_FRAME_HDR, n - LEI_FRAME_HDR - LEI_SIG_BYTES);
        sec_final(s);
        sec_sign(c, s, 1, b + n - LEI_SIG_BYTES);
    }
    return n;
}

/* The remote's HELLO or HELLO_OK is a keyed one, signed when it is a
 * HELLO_OK, of a principal name we accept: NULL, or why not. */
static const char *keyed_hello_check(const lei_conn *k, const lei_hello *h, uint8_t want) {
    (void)k;
    if (h->mode == LEI_MODE_PROTECTED)
        return "mode mismatch: this side is keyed and refuses a peer without keys "
               "(protected mode)";
    if (h->has_sig != (want == LEI_F_HELLO_OK))
        return want == LEI_F_HELLO_OK ? "handshake answer without its signature"
                                      : "trailing bytes in handshake";
    if (!lei_name_ok(h->name, strlen(h->name))) return "bad principal name in handshake";
    return NULL;
}

/* The remote's identity: trusted, and the key pinned to its address if
 * any (addr: the address we dialled, or the one the remote claims).
 * Returns 0, or -1 after closing k with an ERROR saying why. */
static int identity_check(lei_conn *k, const lei_hello *h, const char *addr, int dialled) {
    char why[LEI_ADDR_MAX + 2 * LEI_NAME_MAX + 200];
    int shown = 0; /* a principal pin refused the principal h shows */
    if (lei_trusted(k->ctx, h, addr, why, sizeof why) == 0) {
        const lei_pin *pin = lei_pin_find(k->ctx, addr);
        int key_ok = !pin || !pin->has_pk || memcmp(pin->pk, h->idpk, 32) == 0;
        int name_ok = !pin || !pin->principal[0] || strcmp(pin->principal, h->name) == 0;
        if (key_ok && name_ok) return 0;
        char got[65], want[65];
        sodium_bin2hex(got, sizeof got, h->idpk, 32);
        sodium_bin2hex(want, sizeof want, pin->pk, 32);
        if (!dialled)
            snprintf(why, sizeof why, "address %s belongs to another identity", addr);
        else if (!key_ok)
            snprintf(why, sizeof why, "%s presented key %s, expected %s", addr, got, want);
        else { /* a principal pin (a name server's address): refused before UP, nothing written */
            snprintf(why, sizeof why, "%s is principal %s (key %s), expected %s", addr, h->name, got,
                     pin->principal);
            shown = 1;
        }
    }
    if (dialled && k->peer && k->peer->conn == k) {
        k->peer->next_code = LEI_E_REFUSED; /* the loss's code */
        if (shown) { /* and what the principal pin refused (lei_peer_loss) */
            lei_loss *l = &k->peer->next_loss;
            snprintf(l->principal, sizeof l->principal, "%s", h->name);
            memcpy(l->key, h->idpk, 32);
        }
    }
    lei_conn_close(k, why, 1);
    return -1;
}

/* The acceptor's choice of record cipher (keyed HELLO_OK): one of those
 * we offered, or none when we offered none (mode 1: ChaCha20-Poly1305).
 * Both HELLOs are in the transcript both signatures cover: an offer or a
 * choice changed on the way fails the signatures, it cannot downgrade.
 * 0, or -1 after closing k. */
static int cipher_answer(lei_conn *k, const lei_hello *h) {
    lei_sec *s = k->sec;
    const char *err = NULL;
    if (!s->offered) {
        if (h->mode != LEI_MODE_KEYED) err = "record cipher chosen, none offered (HELLO_OK)";
    } else if (h->mode != LEI_MODE_KEYED_OFFER || h->nsuites != 1) {
        err = "no record cipher chosen (HELLO_OK)";
    } else {
        uint8_t mine[LEI_SUITES_MAX];
        int n = cipher_offer(k->ctx, mine);
        const lei_cipher *cs = cipher_get(h->suites[0]);
        if (!cs || !memchr(mine, h->suites[0], (size_t)n))
            err = "record cipher chosen that was not offered (HELLO_OK)";
        else
            s->cs = cs;
    }
    if (!err) return 0;
    lei_conn_close(k, err, 1);
    return -1;
}

/* Dialler, HELLO_SENT: the acceptor's HELLO_OK.  Trusted, its cipher one
 * we offered, its signature over the transcript good: our AUTH goes out
 * and both directions are records from the byte after it.  0 (AUTH_SENT
 * next), or -1 after closing k. */
static int hello_ok_in(lei_conn *k, const lei_frame *f, const lei_hello *h) {
    lei_sec *s = k->sec;
    if (identity_check(k, h, k->peer->addr, 1)) return -1;
    if (cipher_answer(k, h)) return -1;
    sec_hash(s, f->body, f->len - LEI_SIG_BYTES);
    sec_final(s);
    if (sec_verify(s, 1, h->idpk, h->sig) || sec_keys(s, 1, h->eph)) {
        lei_conn_close(k, "bad handshake signature or key (HELLO_OK)", 1);
        return -1;
    }
    s->remote = *h;
    uint8_t b[LEI_FRAME_HDR + LEI_SIG_BYTES];
    lei_frame_hdr(b, LEI_F_AUTH, LEI_SIG_BYTES);
    sec_sign(k->ctx, s, 0, b + LEI_FRAME_HDR);
    lei_conn_write_now(k, b, sizeof b);
    /* From the byte after AUTH both directions are records. */
    s->rec_out = 1;
    if (records_in(k)) return -1;
    return 0;
}

/* Acceptor, HELLO_WAIT: the dialler's HELLO.  Refused at once if
 * untrusted or pinned to another key; the cipher chosen among its offer;
 * our signed HELLO_OK goes out.  Bound to its peer only once AUTH proved
 * the key is the remote's.  0 (AUTH_WAIT next), or -1 after closing k. */
static int hello_in(lei_conn *k, const lei_frame *f, const lei_hello *h) {
    lei_sec *s = k->sec;
    if (identity_check(k, h, h->addr, 0)) return -1;
    if (h->mode == LEI_MODE_KEYED_OFFER) {
        const lei_cipher *cs = cipher_choose(k->ctx, h->suites, h->nsuites);
        if (!cs) {
            lei_conn_close(k, "no record cipher in common (this side has chacha20-poly1305 and, "
                              "with AES-NI, aes-256-gcm)", 1);
            return -1;
        }
        s->cs = cs;
    } else {
        s->legacy = 1; /* a v3 dialler of before the offer, or one falling back */
    }
    s->remote = *h;
    sec_hash(s, f->body, f->len);
    uint8_t b[LEI_HELLO_MAX];
    lei_conn_write_now(k, b, keyed_hello(k, LEI_F_HELLO_OK, b));
    return 0;
}

static int keyed_hello_in(lei_conn *k, const lei_frame *f, const lei_hello *h) {
    return f->type == LEI_F_HELLO_OK ? hello_ok_in(k, f, h) : hello_in(k, f, h);
}

/* Dialler, AUTH_SENT: the acceptor's AUTH_OK (its first record).  Trust
 * and pins may have changed since HELLO_OK (the acceptor held AUTH_OK past
 * its certificate's end, a reload revoked its key, a pin was made):
 * checked again before anything queued goes out.  0, or -1 after closing k. */
static int auth_ok_in(lei_conn *k) {
    lei_sec *s = k->sec;
    if (identity_check(k, &s->remote, k->peer->addr, 1)) return -1;
    if (s->fallback) { /* before anything queued: the acceptor reads it first */
        uint8_t b[FALLBACK_MAX];
        lei_conn_write_now(k, b, fallback_frame(b));
    }
    return 0;
}

/* Acceptor, AUTH_WAIT: the dialler's AUTH proves it holds its identity's
 * key.  0, or -1 after closing k. */
static int auth_in(lei_conn *k, const lei_frame *f) {
    lei_sec *s = k->sec;
    if (sec_keys(s, 0, s->remote.eph)) {
        lei_conn_close(k, "bad ephemeral key in handshake", 1);
        return -1;
    }
    /* The dialler reads records from now on: a refusal goes in one. */
    s->rec_out = 1;
    if (records_in(k)) return -1;
    if (sec_verify(s, 0, s->remote.idpk, f->body)) {
        lei_conn_close(k, "bad handshake signature (AUTH)", 1);
        return -1;
    }
    /* Pins may have changed since the HELLO. */
    return identity_check(k, &s->remote, s->remote.addr, 0);
}

static int keyed_auth_in(lei_conn *k, const lei_frame *f) {
    return f->type == LEI_F_AUTH_OK ? auth_ok_in(k) : auth_in(k, f);
}

/* An ERROR before UP on a connection we dialled: a v3 acceptor of before
 * the record cipher offer refused ours?  Then it is dialled again at once
 * in mode 1 (ChaCha20-Poly1305), the queue kept.  The new connection says
 * so in its first record (fallback_frame): an acceptor that reads offers
 * takes this refusal for a forgery and closes, so it cannot downgrade two
 * peers that have AES.  1 (k closed), or 0: not this refusal. */
static int keyed_refused(lei_conn *k, const lei_frame *f) {
    lei_ctx *c = k->ctx;
    lei_peer *p = k->peer;
    if (!(p && p->conn == k && k->sec && k->sec->offered && f->len == sizeof OLD_ACCEPTOR - 1 &&
          memcmp(f->body, OLD_ACCEPTOR, f->len) == 0))
        return 0;
    p->conn = NULL;
    k->peer = NULL;
    lei_conn_close(k, "refused the record cipher offer (a peer of before it)", 0);
    lei_ratelog(c, LEI_RL_HANDSHAKE,
                "%s does not read record cipher offers (lecho of before them): dialling it "
                "again in mode 1, chacha20-poly1305", p->addr);
    p->no_offer = 1;
    if (lei_peer_dial(p)) lei_peer_lost(p, p->reason[0] ? p->reason : "dial failed");
    return 1;
}

static const lei_hello *keyed_remote(const lei_conn *k) { return k->sec ? &k->sec->remote : NULL; }

/* ---- the mechanism ------------------------------------------------------ */

static int keyed_start(lei_conn *k) {
    lei_sec *s = calloc(1, sizeof *s); /* owned by k (k->sec) until keyed_end */
    if (!s) return -1;
    crypto_kx_keypair(s->eph_pk, s->eph_sk);
    crypto_generichash_init(&s->th, NULL, 0, 32);
    s->cs = cipher_get(LEI_SUITE_CHACHA20_POLY1305); /* unless mode 2 chooses */
    k->sec = s;
    return 0;
}

static void keyed_end(lei_conn *k) {
    lei_sec *s = k->sec;
    if (!s) return;
    free(s->crb);
    free(s->wrec);
#ifdef LECHO_OPENSSL
    EVP_CIPHER_CTX_free(s->evp_tx); /* (wipes its key schedule) */
    EVP_CIPHER_CTX_free(s->evp_rx);
#endif
    sodium_memzero(s, sizeof *s);
    free(s);
    k->sec = NULL;
}

/* An acceptor that read a mode 1 HELLO: is this CTRL the marker of a
 * dialler falling back after a refused offer?  Then an active attacker
 * forged the refusal (this side reads offers): closed, nothing downgraded.
 * 0, or -1 after closing k. */
static int keyed_ctrl_in(lei_conn *k, const lei_frame *f) {
    if (!k->sec || !k->sec->legacy) return 0;
    uint8_t b[FALLBACK_MAX];
    size_t n = fallback_frame(b);
    if (f->len != n - LEI_FRAME_HDR || memcmp(f->body, b + LEI_FRAME_HDR, f->len) != 0) return 0;
    lei_conn_close(k, "record cipher downgrade: the dialler's offer was refused in its name "
                      "(a forged ERROR on the way): closing", 1);
    return -1;
}

static const char *keyed_cipher(const lei_conn *k) { return k->sec && k->sec->cs ? k->sec->cs->name : NULL; }

const lei_mech lei_mech_keyed = {
    .name = "keyed",
    .start = keyed_start,
    .end = keyed_end,
    .write_now = keyed_write_now,
    .flush = keyed_flush,
    .out_pending = keyed_out_pending,
    .write_pending = keyed_write_pending,
    .read = keyed_read,
    .in_pending = keyed_in_pending,
    .open = keyed_open,
    .ctrl_in = keyed_ctrl_in,
    .cipher = keyed_cipher,
    .hello = keyed_hello,
    .hello_check = keyed_hello_check,
    .hello_in = keyed_hello_in,
    .auth_in = keyed_auth_in,
    .refused = keyed_refused,
    .remote = keyed_remote,
};
