/* fuzz_handshake.c: a libFuzzer harness (make fuzz) for the handshake with
 * authentication and what follows it: arbitrary bytes play the remote side
 * of a keyed connection, accepted (the input dials our context) or dialled
 * (our context dials the harness, which answers with the input).
 *
 * Input: byte 0 chooses the side (bit 0) and where the rest is cut in two
 * writes (bits 1..7); the rest is what the remote sends.
 *
 * Randomness is made deterministic (a libsodium randombytes implementation
 * over ChaCha20, reset for each input) and the incarnation fixed, so that a
 * recorded handshake replays: with LECHO_FUZZ_SEEDS=DIR set, the harness
 * first runs real keyed handshakes between two contexts and writes what the
 * remote sent, with valid signatures, tickets and records, as seeds to DIR.
 *
 * Leans on the core's C files (ctx_int.h for the incarnation), libev,
 * libsodium; unix sockets under LECHO_FUZZ_DIR (a compile-time path, the
 * same for seeding and replay: addresses are part of the transcript).
 */
#define _GNU_SOURCE
#include "ctx_int.h"
#include "fuzz_sock.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#ifndef LECHO_FUZZ_DIR
#define LECHO_FUZZ_DIR "/tmp/lecho-fuzz"
#endif
#define A_PATH LECHO_FUZZ_DIR "/a.sock"   /* our context */
#define B_PATH LECHO_FUZZ_DIR "/b.sock"   /* the seeding remote context */
#define R_PATH LECHO_FUZZ_DIR "/r.sock"   /* the harness: relay, or remote */

/* ---- deterministic randomness: two streams (our context, the seeding
 * remote), the current one chosen by the harness ------------------------- */
static struct {
    uint8_t key[32];
    uint64_t ctr;
} rng[2];
static int rng_cur;

static void det_buf(void *const buf, const size_t size) {
    uint8_t nonce[8];
    for (int i = 0; i < 8; i++) nonce[i] = (uint8_t)(rng[rng_cur].ctr >> (8 * i));
    rng[rng_cur].ctr++;
    crypto_stream_chacha20(buf, size, nonce, rng[rng_cur].key);
}
static uint32_t det_random(void) {
    uint32_t r;
    det_buf(&r, sizeof r);
    return r;
}
static const char *det_name(void) { return "lecho-fuzz-deterministic"; }
static randombytes_implementation det_impl = {
    .implementation_name = det_name, .random = det_random, .buf = det_buf};

static void rng_reset(void) {
    for (int i = 0; i < 2; i++) {
        memset(rng[i].key, 0x11 * (i + 1), 32);
        rng[i].ctr = 0;
    }
    rng_cur = 0;
}

/* ---- the contexts ---------------------------------------------------------- */

static uint8_t a_pk[32], a_sk[64], b_pk[32], b_sk[64], m_pk[32], m_sk[64];

static int on_event(void *ud, lei_peer *from, uint32_t chid, uint64_t producer, uint64_t seq,
                    uint64_t sync, const uint8_t *p, size_t n) {
    (void)chid, (void)producer, (void)p, (void)n;
    if (getenv("LECHO_FUZZ_LOG")) fprintf(stderr, "fuzz: event seq %llu\n", (unsigned long long)seq);
    if (sync) lei_ack(ud, from, sync, 1, NULL, 0);
    return 0;
}
static int on_ctrl(void *ud, lei_peer *from, const uint8_t *p, size_t n) {
    (void)ud, (void)from, (void)p, (void)n;
    return 0;
}
static void on_peer(void *ud, lei_peer *p, int up, const char *reason, int code) {
    (void)code;
    (void)ud;
    if (getenv("LECHO_FUZZ_LOG"))
        fprintf(stderr, "fuzz: peer %s %s %s\n", lei_peer_addr(p), up ? "up" : "down",
                reason ? reason : "");
}
static void on_log(void *ud, const char *msg) {
    (void)ud;
    if (getenv("LECHO_FUZZ_LOG")) fprintf(stderr, "lecho: %s\n", msg);
}

/* A keyed context named name that trusts the other one, consumes "ns/x"
 * (the manager key known) and, for the remote, holds its ticket for it. */
static lei_ctx *make_ctx(int remote, const char *listen) {
    lei_hooks h = {0};
    h.event = on_event;
    h.ctrl = on_ctrl;
    h.peer = on_peer;
    h.log = on_log;
    lei_ctx *c = lei_ctx_new(NULL, &h);
    if (!c) abort();
    c->h.ud = c;
    c->incarnation = remote ? 2222 : 1111;
    char err[160];
    if (lei_auth_set_identity(c, remote ? b_sk : a_sk, remote ? "fuzzpeer" : "fuzzed", NULL, 0, err))
        abort();
    lei_auth_trust_key(c, remote ? a_pk : b_pk, remote ? "fuzzed" : "fuzzpeer");
    uint32_t ch = lei_chan_open(c, "ns/x", 4);
    if (remote) {
        /* a ticket that does not expire while the harness runs (u64be
         * 2^40 s: in 36812), then the manager's signature */
        uint8_t m[18 + 5 + 32 + 8], t[LEI_TICKET_BYTES] = {0, 0, 1, 0, 0, 0, 0, 0};
        memcpy(m, "lecho-producer-v2\0ns/x", 23);
        m[22] = 0;
        memcpy(m + 23, b_pk, 32);
        memcpy(m + 55, t, 8);
        crypto_sign_detached(t + 8, NULL, m, sizeof m, m_sk);
        lei_auth_set_ticket(c, ch, t);
    } else {
        lei_chan_set_local(c, ch, 1);
        lei_auth_set_manager_key(c, ch, m_pk);
    }
    unlink(listen + 5);
    if (lei_accept_listen(c, listen, NULL, NULL, err)) {
        fprintf(stderr, "fuzz: listen %s: %s\n", listen, err);
        abort();
    }
    return c;
}

static int unix_listen(const char *path) {
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    unlink(path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) || listen(fd, 8)) abort();
    return fd;
}

static void run(lei_ctx *c, int stream, int turns) {
    rng_cur = stream;
    for (int i = 0; i < turns; i++) ev_run(lei_ctx_loop(c), EVRUN_NOWAIT);
}

/* Sends what remains of p to fd, running c meanwhile. */
static void feed(lei_ctx *c, int fd, const uint8_t *p, size_t n) {
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno != EAGAIN && errno != EINTR) return; /* c closed it */
        if (w > 0) {
            p += w;
            n -= (size_t)w;
        }
        run(c, 0, 4);
        drain(fd);
    }
}

/* ---- one input ------------------------------------------------------------- */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int dialled = data[0] & 1;
    size_t rest = size - 1, cut = rest * (data[0] >> 1) / 128;
    const uint8_t *in = data + 1;
    rng_reset();
    lei_ctx *a = make_ctx(0, "unix:" A_PATH);
    int lfd = -1, fd;
    if (dialled) {
        lfd = unix_listen(R_PATH);
        lei_msg *m = msg_of("hello");
        const char *err;
        lei_send_ctrl(a, "unix:" R_PATH, m, &err); /* dials */
        lei_msg_release(m, NULL, NULL);
        run(a, 0, 2);
        fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    } else {
        fd = unix_connect(A_PATH);
    }
    run(a, 0, 2);
    if (fd >= 0) {
        drain(fd);
        feed(a, fd, in, cut);
        feed(a, fd, in + cut, rest - cut);
        run(a, 0, 4);
        close(fd);
        run(a, 0, 4);
    }
    if (lfd >= 0) close(lfd);
    lei_ctx_free(a);
    return 0;
}

/* ---- seeds: real keyed handshakes, the remote's bytes recorded ------------- */

/* Relays between two sockets for a while, recording what `from_b` sent. */
static void relay(lei_ctx *a, lei_ctx *b, int x, int from_b, uint8_t *rec, size_t *nrec,
                  size_t cap, double secs) {
    double end = ev_time() + secs;
    uint8_t buf[65536];
    while (ev_time() < end) {
        run(a, 0, 1);
        run(b, 1, 1);
        ssize_t n;
        while ((n = read(from_b, buf, sizeof buf)) > 0) {
            if (*nrec + (size_t)n <= cap) {
                memcpy(rec + *nrec, buf, (size_t)n);
                *nrec += (size_t)n;
            }
            if (write(x, buf, (size_t)n) != n) break;
        }
        while ((n = read(x, buf, sizeof buf)) > 0)
            if (write(from_b, buf, (size_t)n) != n) break;
        usleep(500);
    }
}

static void write_seed(const char *dir, const char *name, int dialled, const uint8_t *rec,
                       size_t n) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) return;
    uint8_t b0 = (uint8_t)(dialled | (64 << 1)); /* cut in the middle */
    fwrite(&b0, 1, 1, f);
    fwrite(rec, 1, n, f);
    fclose(f);
    fprintf(stderr, "fuzz: seed %s (%zu bytes)\n", path, n + 1);
}

/* b produces three events on "ns/x" for a, the last one sync. */
static void produce(lei_ctx *b, const char *to) {
    uint32_t ch = lei_chan_open(b, "ns/x", 4);
    lei_peer_set_dests(b, ch, &to, 1);
    for (int i = 0; i < 3; i++) {
        lei_msg *m = msg_of(i == 1 ? "a longer value, for the record" : "v");
        const char *err;
        uint64_t sid;
        lei_submit(b, ch, 1, (uint64_t)i + 1, m, i == 2, LEI_BLOCK, &sid, &err);
        lei_msg_release(m, NULL, NULL);
    }
}

static void make_seeds(const char *dir) {
    static uint8_t rec[1 << 16];
    size_t n;
    mkdir(dir, 0755);
    /* accepted: b dials the relay, which dials a */
    rng_reset();
    lei_ctx *a = make_ctx(0, "unix:" A_PATH);
    rng_cur = 1;
    lei_ctx *b = make_ctx(1, "unix:" B_PATH);
    int lfd = unix_listen(R_PATH);
    rng_cur = 1;
    produce(b, "unix:" R_PATH);
    run(b, 1, 2);
    int from_b = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    int x = unix_connect(A_PATH);
    n = 0;
    if (from_b >= 0) relay(a, b, x, from_b, rec, &n, sizeof rec, 0.5);
    write_seed(dir, "seed-accepted", 0, rec, n);
    if (from_b >= 0) close(from_b);
    close(x);
    close(lfd);
    lei_ctx_free(a);
    lei_ctx_free(b);
    /* dialled: a dials the relay, which dials b */
    rng_reset();
    a = make_ctx(0, "unix:" A_PATH);
    rng_cur = 1;
    b = make_ctx(1, "unix:" B_PATH);
    lfd = unix_listen(R_PATH);
    lei_msg *m = msg_of("hello");
    const char *err;
    rng_cur = 0;
    lei_send_ctrl(a, "unix:" R_PATH, m, &err);
    lei_msg_release(m, NULL, NULL);
    run(a, 0, 2);
    from_b = -1;
    int to_a = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    x = unix_connect(B_PATH);
    n = 0;
    /* here the relay records what b sends back through x; b produces on
     * the connection a dialled once it is up */
    if (to_a >= 0) relay(a, b, to_a, x, rec, &n, sizeof rec, 0.3);
    rng_cur = 1;
    produce(b, "unix:" A_PATH);
    if (to_a >= 0) relay(a, b, to_a, x, rec, &n, sizeof rec, 0.5);
    write_seed(dir, "seed-dialled", 1, rec, n);
    if (to_a >= 0) close(to_a);
    close(x);
    close(lfd);
    lei_ctx_free(a);
    lei_ctx_free(b);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    signal(SIGPIPE, SIG_IGN); /* the harness writes to sockets the context closed */
    randombytes_set_implementation(&det_impl);
    if (sodium_init() < 0) abort();
    uint8_t seed[32];
    memset(seed, 1, 32);
    crypto_sign_seed_keypair(a_pk, a_sk, seed);
    memset(seed, 2, 32);
    crypto_sign_seed_keypair(b_pk, b_sk, seed);
    memset(seed, 3, 32);
    crypto_sign_seed_keypair(m_pk, m_sk, seed);
    mkdir(LECHO_FUZZ_DIR, 0755);
    const char *dir = getenv("LECHO_FUZZ_SEEDS");
    if (dir) make_seeds(dir);
    return 0;
}
