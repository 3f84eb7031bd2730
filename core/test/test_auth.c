/* test_auth.c: identities and trust through the context API (ctx.h) alone:
 * set_identity checks its key and name, signing, trust tables, pins,
 * channel keys and tickets.
 * Prints "N passed, N failed" (read by .ci/run).
 *
 * Leans on the core's C files and libsodium, no Lua.
 */
#define _GNU_SOURCE /* memmem */
#include "ctx.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "test.h"

static void nolog(void *ud, const char *msg) {
    (void)ud;
    if (getenv("LECHO_TEST_LOG")) fprintf(stderr, "log: %s\n", msg);
}

static lei_ctx *new_ctx(void) {
    lei_hooks h;
    memset(&h, 0, sizeof h);
    h.log = nolog;
    return lei_ctx_new(NULL, &h);
}

static void test_identity(void) {
    lei_ctx *c = new_ctx();
    uint8_t pk[32], sk[64], pk2[32], sk2[64], sig[64], bad[64];
    char err[160];
    CHECK(c != NULL);
    crypto_sign_keypair(pk, sk);
    crypto_sign_keypair(pk2, sk2);
    CHECK(!lei_auth_keyed(c));
    CHECK(lei_auth_sign(c, "m", 1, sig) == -LEI_E_INVALID);
    /* names: 1..64 of [A-Za-z0-9._-] */
    CHECK(lei_auth_set_identity(c, sk, "", NULL, 0, err) == -LEI_E_INVALID);
    CHECK(strstr(err, "bad principal name") != NULL);
    CHECK(lei_auth_set_identity(c, sk, "a b", NULL, 0, err) == -LEI_E_INVALID);
    CHECK(lei_auth_set_identity(c, sk, "x/y", NULL, 0, err) == -LEI_E_INVALID);
    char longname[66];
    memset(longname, 'a', 65);
    longname[65] = '\0';
    CHECK(lei_auth_set_identity(c, sk, longname, NULL, 0, err) == -LEI_E_INVALID);
    longname[64] = '\0';
    /* the embedded pk must be the seed's */
    memcpy(bad, sk, 32);
    memcpy(bad + 32, pk2, 32);
    CHECK(lei_auth_set_identity(c, bad, "alice", NULL, 0, err) == -LEI_E_INVALID);
    CHECK(strstr(err, "does not match") != NULL);
    CHECK(!lei_auth_keyed(c));
    CHECK(lei_auth_set_identity(c, sk, longname, NULL, 0, err) == 0);
    CHECK(lei_auth_set_identity(c, sk, "Alice-1.x_y", NULL, 0, err) == 0);
    CHECK(lei_auth_keyed(c));
    CHECK(lei_auth_sign(c, "hello", 5, sig) == 0);
    CHECK(crypto_sign_verify_detached(sig, (const uint8_t *)"hello", 5, pk) == 0);
    CHECK(crypto_sign_verify_detached(sig, (const uint8_t *)"hellp", 5, pk) != 0);
    lei_ctx_free(c);
    /* not once a connection exists */
    c = new_ctx();
    CHECK(lei_accept_listen(c, "127.0.0.1:0", NULL, NULL, err) == 0);
    CHECK(lei_peer_get(c, lei_ctx_addr(c), 1) != NULL); /* dials itself */
    CHECK(lei_auth_set_identity(c, sk, "alice", NULL, 0, err) == -LEI_E_INVALID);
    CHECK(strstr(err, "before the first connection") != NULL);
    lei_ctx_free(c);
}

static void test_tables(void) {
    lei_ctx *c = new_ctx();
    uint8_t pk[32], sk[64], t[LEI_TICKET_BYTES];
    crypto_sign_keypair(pk, sk);
    CHECK(lei_auth_trust_key(c, pk, "bad name") == -LEI_E_INVALID);
    for (int i = 0; i < 40; i++) { /* grows */
        uint8_t k[32];
        randombytes_buf(k, sizeof k);
        CHECK(lei_auth_trust_key(c, k, "many") == 0);
        CHECK(lei_auth_trust_authority(c, k, 0, 0) == 0);
        char addr[32];
        snprintf(addr, sizeof addr, "127.0.0.1:%d", 1000 + i);
        CHECK(lei_auth_expect(c, addr, k) == 0);
    }
    CHECK(lei_auth_trust_key(c, pk, "bob") == 0);
    CHECK(lei_auth_trust_key(c, pk, "bob2") == 0); /* renames */
    CHECK(lei_auth_trust_authority(c, pk, 0, 0) == 0);
    char longaddr[200];
    memset(longaddr, 'x', sizeof longaddr - 1);
    longaddr[sizeof longaddr - 1] = '\0';
    CHECK(lei_auth_expect(c, longaddr, pk) == -LEI_E_INVALID);
    CHECK(lei_auth_expect_principal(c, longaddr, "nameserver") == -LEI_E_INVALID);
    CHECK(lei_auth_expect_principal(c, "127.0.0.1:1000", "nameserver") == 0); /* same pin, both */
    CHECK(lei_auth_expect(c, "127.0.0.1:1000", pk) == 0); /* replaces */
    /* no connection authenticated yet: no peer key */
    lei_peer *p = lei_peer_get(c, "127.0.0.1:1", 0);
    CHECK(p == NULL);
    /* channel keys */
    uint32_t ch = lei_chan_open(c, "ns/x", 4);
    memset(t, 7, sizeof t);
    CHECK(lei_auth_set_manager_key(c, ch, pk) == 0);
    CHECK(lei_auth_set_ticket(c, ch, t) == 0);
    CHECK(lei_auth_set_manager_key(c, ch + 1, pk) == -LEI_E_NOTFOUND);
    CHECK(lei_auth_set_ticket(c, ch + 1, t) == -LEI_E_NOTFOUND);
    lei_stats_chan st;
    CHECK(lei_chan_stats(c, ch, &st) == 0 && st.refused == 0);
    lei_ctx_free(c);
}

/* ---- frames of protocol 2 ---------------------------------------------- */

static void test_frames(void) {
    uint8_t buf[LEI_HELLO_MAX], t[LEI_TICKET_BYTES];
    lei_hello key, h;
    lei_frame f;
    const char *err = NULL;
    memset(&key, 0, sizeof key);
    randombytes_buf(key.eph, 32);
    randombytes_buf(key.idpk, 32);
    strcpy(key.name, "alice");
    for (int type = LEI_F_HELLO; type <= LEI_F_HELLO_OK; type++)
        for (int cert = 0; cert < 3; cert++) {
            key.has_cert = (uint8_t)cert;
            key.cert_len = cert == 2 ? 100 : cert ? 64 : 0;
            memset(key.cert, 9, sizeof key.cert);
            size_t n = lei_frame_hello(buf, (uint8_t)type, LEI_PROTO_VERSION, 77, "127.0.0.1:9", &key);
            CHECK(n <= LEI_HELLO_MAX && lei_frame_next(buf, n, 4096, &f, &err) == 1);
            CHECK(lei_parse_hello(f.body, f.len, &h, &err) == 0);
            CHECK(h.mode == LEI_MODE_KEYED && h.incarnation == 77 && strcmp(h.name, "alice") == 0);
            CHECK(memcmp(h.eph, key.eph, 32) == 0 && memcmp(h.idpk, key.idpk, 32) == 0);
            CHECK(h.has_cert == cert && h.cert_len == key.cert_len &&
                  memcmp(h.cert, key.cert, key.cert_len) == 0);
            CHECK(h.has_sig == (type == LEI_F_HELLO_OK));
            /* every cut is refused, never read past */
            for (size_t k = 6; k < f.len; k++) {
                uint8_t *d = malloc(k);
                memcpy(d, f.body, k);
                int r = lei_parse_hello(d, k, &h, &err);
                /* cutting exactly a trailing signature leaves a valid HELLO */
                CHECK(r == -LEI_E_PROTOCOL || (type == LEI_F_HELLO_OK && k == f.len - 64));
                free(d);
            }
        }
    /* the longest name fits LEI_HELLO_MAX */
    memset(key.name, 'n', LEI_NAME_MAX);
    key.name[LEI_NAME_MAX] = '\0';
    key.has_cert = 2;
    key.cert_len = LEI_CERT_MAX;
    char addr[LEI_ADDR_MAX];
    memset(addr, 'a', sizeof addr - 1);
    addr[sizeof addr - 1] = '\0';
    size_t n = lei_frame_hello(buf, LEI_F_HELLO_OK, LEI_PROTO_VERSION, UINT64_MAX, addr, &key);
    CHECK(n <= LEI_HELLO_MAX);
    /* BIND v2 with a ticket */
    uint8_t b[LEI_FRAME_HDR + 20 + 8 + LEI_BIND_MAX_EXTRA];
    const uint8_t *name, *tk;
    uint64_t idx;
    size_t nl;
    memset(t, 3, sizeof t);
    n = lei_frame_bind(b, 5, "ns/c@k", 6, t);
    CHECK(lei_frame_next(b, n, 4096, &f, &err) == 1);
    CHECK(lei_parse_bind(f.body, f.len, &idx, &name, &nl, &tk, &err) == 0 && idx == 5 &&
          nl == 6 && tk && memcmp(tk, t, 64) == 0);
    CHECK(lei_parse_bind(f.body, f.len - 1, &idx, &name, &nl, &tk, &err) == -LEI_E_PROTOCOL);
}

/* ---- two contexts in one process ----------------------------------------- */

typedef struct side {
    lei_ctx *c;
    int events, ctrls, ups, downs;
    size_t last_len;
    int bad_payloads; /* events whose string is not pattern() of its length */
    char reason[256];
} side;

/* The bytes of a test string of n bytes: its length mixed with the offset. */
static uint8_t pattern(size_t n, size_t i) { return (uint8_t)(i * 7 + n * 13 + (i >> 9)); }

static int on_event(void *ud, lei_peer *from, uint32_t chid, uint64_t producer, uint64_t seq,
                    uint64_t sync, const uint8_t *p, size_t n) {
    side *s = ud;
    if (!from) return 0; /* a local delivery: not what these tests count */
    (void)from, (void)chid, (void)producer, (void)seq, (void)p;
    s->events++;
    s->last_len = n;
    /* a string (tag 5, varint length, bytes): its bytes checked when patterned */
    uint64_t len;
    size_t used;
    if (n > 1 && p[0] == 5 && lei_varint_decode(p + 1, n - 1, &len, &used) == 0 &&
        1 + used + len == n && len > 0 && p[1 + used] != 'v') {
        for (size_t i = 0; i < len; i++)
            if (p[1 + used + i] != pattern((size_t)len, i)) {
                s->bad_payloads++;
                break;
            }
    }
    if (sync) lei_ack(s->c, from, sync, 1, NULL, 0);
    return 0;
}

static int on_ctrl(void *ud, lei_peer *from, const uint8_t *p, size_t n) {
    (void)from, (void)p, (void)n;
    ((side *)ud)->ctrls++;
    return 0;
}

static void on_peer(void *ud, lei_peer *p, int up, const char *reason, int code) {
    (void)code;
    side *s = ud;
    (void)p;
    if (up)
        s->ups++;
    else
        s->downs++;
    if (!up && reason) snprintf(s->reason, sizeof s->reason, "%s", reason);
}

/* side_init's contexts: 1 never offer nor choose AES-256-GCM. */
static int side_no_aes;

static void side_init(side *s, const char *name, const uint8_t *sk) {
    memset(s, 0, sizeof *s);
    lei_hooks h;
    memset(&h, 0, sizeof h);
    h.ud = s;
    h.event = on_event;
    h.peer = on_peer;
    h.ctrl = on_ctrl;
    h.log = nolog;
    lei_opts o;
    lei_opts_default(&o);
    o.retry_interval = 30; /* one dial per test */
    o.retry_max = 30;
    o.no_aes = side_no_aes;
    s->c = lei_ctx_new(&o, &h);
    char err[160];
    if (sk) CHECK(lei_auth_set_identity(s->c, sk, name, NULL, 0, err) == 0);
    CHECK(lei_accept_listen(s->c, "127.0.0.1:0", NULL, NULL, err) == 0);
}

/* A tampering proxy between two contexts (tamper: flip a byte of what the
 * dialler sends once told to). */
typedef struct proxy {
    int lfd, a, b; /* listener; to the acceptor; from the dialler */
    int tamper;    /* 1: flip a byte of the next chunk (then 2); 3: of the AUTH;
                    * 5: AES-256-GCM out of the HELLO's offer (then 6);
                    * 7: AES-256-GCM out of the HELLO_OK's choice (then 8);
                    * 9: the first HELLO answered with a forged "bad mode in
                    * handshake" ERROR in the acceptor's name (then 10) */
    int forged;    /* connections answered so (tamper 9) */
    int chunks;    /* read from the dialler */
    char addr[64];
} proxy;

static void pump(side *x, side *y, proxy *px, int (*done)(side *, side *), double secs);

static void proxy_io(proxy *px, const char *to) {
    if (px->b < 0) {
        int fd = accept(px->lfd, NULL, NULL);
        if (fd < 0) return;
        struct sockaddr_in sa;
        memset(&sa, 0, sizeof sa);
        sa.sin_family = AF_INET;
        sa.sin_port = htons((uint16_t)atoi(strchr(to, ':') + 1));
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (px->tamper == 9) { /* the old acceptor's refusal, forged */
            uint8_t hb[4096];
            ssize_t got = 0;
            for (int i = 0; i < 200 && got <= 0; i++) {
                got = read(fd, hb, sizeof hb); /* (blocking: the HELLO comes next) */
                if (got <= 0) usleep(1000);
            }
            static const char E[] = "bad mode in handshake";
            uint8_t e[LEI_FRAME_HDR + sizeof E];
            lei_frame_hdr(e, LEI_F_ERROR, sizeof E - 1);
            memcpy(e + LEI_FRAME_HDR, E, sizeof E - 1);
            CHECK(got > 5 && hb[4] == LEI_F_HELLO);
            CHECK(write(fd, e, LEI_FRAME_HDR + sizeof E - 1) == (ssize_t)(LEI_FRAME_HDR + sizeof E - 1));
            close(fd);
            px->forged++;
            px->tamper = 10;
            return;
        }
        px->a = socket(AF_INET, SOCK_STREAM, 0);
        CHECK(connect(px->a, (struct sockaddr *)&sa, sizeof sa) == 0);
        fcntl(fd, F_SETFL, O_NONBLOCK);
        fcntl(px->a, F_SETFL, O_NONBLOCK);
        px->b = fd;
    }
    uint8_t buf[65536];
    ssize_t n;
    while ((n = read(px->b, buf, sizeof buf)) > 0) {
        if (px->tamper == 3 && ++px->chunks == 2 && n == 5 + 64) { /* HELLO, then AUTH */
            buf[20] ^= 0x01;
            px->tamper = 4;
        }
        if (px->tamper == 5 && n > 8 && buf[4] == LEI_F_HELLO) {
            /* mode 2, the offer last: n-of-suites, AES, ChaCha -> ChaCha twice */
            CHECK(buf[n - 3] == 2 && buf[n - 2] == LEI_SUITE_AES256_GCM &&
                  buf[n - 1] == LEI_SUITE_CHACHA20_POLY1305);
            buf[n - 2] = LEI_SUITE_CHACHA20_POLY1305;
            px->tamper = 6;
        }
        if (px->tamper == 1 && n > 8) {
            buf[8] ^= 0x40; /* inside a record's ciphertext */
            px->tamper = 2;
        }
        CHECK(write(px->a, buf, (size_t)n) == n);
    }
    while ((n = read(px->a, buf, sizeof buf)) > 0) {
        if (px->tamper == 7 && n > 70 && buf[4] == LEI_F_HELLO_OK) {
            /* mode 2: one suite, AES, then the signature -> ChaCha */
            CHECK(buf[n - 66] == 1 && buf[n - 65] == LEI_SUITE_AES256_GCM);
            buf[n - 65] = LEI_SUITE_CHACHA20_POLY1305;
            px->tamper = 8;
        }
        CHECK(write(px->b, buf, (size_t)n) == n);
    }
}

static void pump(side *x, side *y, proxy *px, int (*done)(side *, side *), double secs) {
    double end = ev_time() + secs;
    while (ev_time() < end && !done(x, y)) {
        ev_run(lei_ctx_loop(x->c), EVRUN_NOWAIT);
        ev_run(lei_ctx_loop(y->c), EVRUN_NOWAIT);
        if (px) proxy_io(px, lei_ctx_addr(x->c));
        usleep(200);
    }
}

static int got3(side *a, side *b) { (void)b; return a->events >= 3; }
static int dialler_down(side *a, side *b) { (void)a; return b->downs > 0; }
static int acceptor_bad(side *a, side *b) {
    lei_stats_ctx st;
    lei_ctx_stats(a->c, &st);
    return st.bad_frames > 0 && b->downs > 0;
}

static lei_msg *msg_of(size_t n) {
    lei_msg *m = lei_msg_new();
    char *s = malloc(n);
    memset(s, 'v', n);
    lei_enc_string(&m->own, s, n);
    free(s);
    lei_msg_sync(m);
    return m;
}

/* b sends events to a on "ns/x" (through the proxy's address if given). */
/* The id of the last sync submit of send_events (ids start at random). */
static uint64_t last_sid;

static void send_events(side *a, side *b, const char *to, int sync) {
    uint32_t ca = lei_chan_open(a->c, "ns/x", 4), cb = lei_chan_open(b->c, "ns/x", 4);
    lei_chan_set_local(a->c, ca, 1);
    const char *dest = to ? to : lei_ctx_addr(a->c);
    lei_peer_set_dests(b->c, cb, &dest, 1);
    static const size_t sizes[] = {10, 300000, 20};
    for (int i = 0; i < 3; i++) {
        lei_msg *m = msg_of(sizes[i]);
        const char *err;
        uint64_t sid = 0;
        CHECK(lei_submit(b->c, cb, 1, (uint64_t)i + 1, m, sync && i == 2, LEI_BLOCK, &sid, &err) == 0);
        if (sync && i == 2) last_sid = sid;
        lei_msg_release(m, NULL, NULL);
    }
}

/* A ticket (u64be expiry, signature) expiring at exp (Unix seconds). */
static void ticket_exp(const uint8_t msk[64], const char *base, const uint8_t ppk[32], uint64_t exp,
                       uint8_t t[LEI_TICKET_BYTES]) {
    uint8_t m[200];
    size_t n = 0, bl = strlen(base);
    for (int i = 0; i < 8; i++) t[i] = (uint8_t)(exp >> (56 - 8 * i));
    memcpy(m, "lecho-producer-v2", 18);
    n = 18;
    memcpy(m + n, base, bl + 1);
    n += bl + 1;
    memcpy(m + n, ppk, 32);
    n += 32;
    memcpy(m + n, t, 8);
    n += 8;
    crypto_sign_detached(t + 8, NULL, m, n, msk);
}
static void ticket_for(const uint8_t msk[64], const char *base, const uint8_t ppk[32],
                       uint8_t t[LEI_TICKET_BYTES]) {
    ticket_exp(msk, base, ppk, (uint64_t)time(NULL) + 3600, t);
}

typedef struct keys {
    uint8_t apk[32], ask[64], bpk[32], bsk[64];
} keys;

static void make_keys(keys *k) {
    crypto_sign_keypair(k->apk, k->ask);
    crypto_sign_keypair(k->bpk, k->bsk);
}

/* Sides a and b with k's identities, each trusting the other. */
static void keyed_sides(const keys *k, side *a, side *b) {
    side_init(a, "a", k->ask);
    side_init(b, "b", k->bsk);
    CHECK(lei_auth_trust_key(a->c, k->bpk, "b") == 0);
    CHECK(lei_auth_trust_key(b->c, k->apk, "a") == 0);
}

/* b may produce on "ns/x" for a: a knows the manager's key, b has its ticket. */
static void authorize(side *a, side *b, const keys *k) {
    uint8_t mpk[32], msk[64], t[LEI_TICKET_BYTES];
    crypto_sign_keypair(mpk, msk);
    ticket_for(msk, "ns/x", k->bpk, t);
    lei_auth_set_manager_key(a->c, lei_chan_open(a->c, "ns/x", 4), mpk);
    lei_auth_set_ticket(b->c, lei_chan_open(b->c, "ns/x", 4), t);
}

static void test_keyed_ok(void) {
    keys k;
    side a, b;
    make_keys(&k);
    keyed_sides(&k, &a, &b);
    authorize(&a, &b, &k);
    /* a principal pin that a meets: nothing refused */
    CHECK(lei_auth_expect_principal(b.c, lei_ctx_addr(a.c), "a") == 0);
    send_events(&a, &b, NULL, 1);
    pump(&a, &b, NULL, got3, 5);
    CHECK(a.events == 3 && a.last_len > 0 && a.downs == 0 && b.downs == 0);
    /* the identities are known both ways, the addresses pinned */
    lei_peer *pa = lei_peer_get(b.c, lei_ctx_addr(a.c), 0);
    CHECK(pa && lei_peer_up(pa) && lei_auth_peer_key(pa) && memcmp(lei_auth_peer_key(pa), k.apk, 32) == 0);
    CHECK(pa && strcmp(lei_auth_peer_principal(pa), "a") == 0);
    lei_peer *pb = lei_peer_get(a.c, lei_ctx_addr(b.c), 0);
    CHECK(pb && lei_auth_peer_key(pb) && memcmp(lei_auth_peer_key(pb), k.bpk, 32) == 0);
    /* pinning the address to another key now ends the connection */
    CHECK(lei_auth_expect(b.c, lei_ctx_addr(a.c), k.bpk) == 0);
    CHECK(pa && !lei_peer_up(pa) && strstr(lei_peer_reason(pa), "presented key") != NULL);
    /* the sync answer came back through records */
    lei_sync *s = lei_sync_find(b.c, last_sid);
    CHECK(s && lei_sync_pending(s) == 0 && lei_sync_nran(s) == 1);
    lei_ctx_free(a.c);
    lei_ctx_free(b.c);
}

/* One refusal: a set up by seta, b by setb; b's peer ends with `want`. */
static void refusal(const char *what, void (*setup)(side *, side *, keys *), const char *want,
                    int b_keyed) {
    keys k;
    side a, b;
    make_keys(&k);
    side_init(&a, "a", k.ask);
    side_init(&b, "b", b_keyed ? k.bsk : NULL);
    lei_auth_trust_key(a.c, k.bpk, "b");
    if (b_keyed) lei_auth_trust_key(b.c, k.apk, "a");
    setup(&a, &b, &k);
    send_events(&a, &b, NULL, 0);
    pump(&a, &b, NULL, dialler_down, 5);
    int ok = a.events == 0 && b.downs > 0 && strstr(b.reason, want) != NULL;
    if (!ok) fprintf(stderr, "%s: got '%s', want '%s'\n", what, b.reason, want);
    CHECK(ok);
    lei_ctx_free(a.c);
    lei_ctx_free(b.c);
}

static void set_none(side *a, side *b, keys *k) { (void)a, (void)b, (void)k; }
static void set_untrusted(side *a, side *b, keys *k) {
    (void)b;
    lei_auth_trust_key(a->c, k->bpk, "someone-else");
}
static void set_pin_dialler(side *a, side *b, keys *k) {
    (void)k;
    uint8_t other[32];
    randombytes_buf(other, 32);
    lei_auth_expect(b->c, lei_ctx_addr(a->c), other);
}
static void set_pin_acceptor(side *a, side *b, keys *k) {
    (void)k;
    uint8_t other[32];
    randombytes_buf(other, 32);
    lei_auth_expect(a->c, lei_ctx_addr(b->c), other);
}
/* Principal pins (a name server's address: nameserver_principal): checked
 * in the handshake, so nothing b queued for a is written (a.events == 0). */
static void set_principal_dialler(side *a, side *b, keys *k) {
    (void)k;
    CHECK(lei_auth_expect_principal(b->c, lei_ctx_addr(a->c), "nameserver") == 0);
}
static void set_principal_acceptor(side *a, side *b, keys *k) {
    (void)k;
    CHECK(lei_auth_expect_principal(a->c, lei_ctx_addr(b->c), "someone-else") == 0);
}

/* An authority's v2 certificate for principal `name` with key pk, valid
 * [nb, na), listing the address addr if not NULL: its length. */
static size_t cert_v2(const uint8_t ask[64], const char *name, const uint8_t pk[32], uint64_t nb,
                      uint64_t na, const char *addr, uint8_t cert[LEI_CERT_MAX]) {
    uint8_t m[400];
    size_t n = 0, nl = strlen(name), c = 0;
    for (int i = 0; i < 8; i++) {
        cert[c + i] = (uint8_t)(nb >> (56 - 8 * i));
        cert[c + 8 + i] = (uint8_t)(na >> (56 - 8 * i));
    }
    c = 16;
    cert[c++] = addr ? 1 : 0;
    if (addr) {
        cert[c++] = (uint8_t)strlen(addr);
        memcpy(cert + c, addr, strlen(addr));
        c += strlen(addr);
    }
    memcpy(m, "lecho-cert-v2", 14);
    n = 14;
    memcpy(m + n, name, nl + 1);
    n += nl + 1;
    memcpy(m + n, pk, 32);
    n += 32;
    memcpy(m + n, cert, c);
    n += c;
    crypto_sign_detached(cert + c, NULL, m, n, ask);
    return c + 64;
}
static size_t cert_len;
/* An authority's certificate for principal "b" with key pk, valid an hour. */
static void cert_for(const uint8_t ask[64], const uint8_t pk[32], uint8_t cert[LEI_CERT_MAX]) {
    uint64_t now = (uint64_t)time(NULL);
    cert_len = cert_v2(ask, "b", pk, now - 60, now + 3600, NULL, cert);
}

static void set_cert_wrong(side *a, side *b, keys *k) {
    uint8_t apk[32], ask[64], cert[LEI_CERT_MAX];
    char err[160];
    crypto_sign_keypair(apk, ask);
    lei_auth_trust_authority(a->c, apk, 0, 0);
    cert_for(ask, k->bpk, cert); /* certifies "b", while b claims "b2" */
    CHECK(lei_auth_set_identity(b->c, k->bsk, "b2", cert, cert_len, err) == 0);
}

/* b (the dialler) certified by an authority a trusts, [nb, na) from now,
 * listing addr; b not in a's trust list. */
static uint8_t cert_apk[32];
static void cert_b(side *a, side *b, keys *k, int64_t nb, int64_t na, const char *addr) {
    uint8_t ask[64], cert[LEI_CERT_MAX];
    char err[160];
    uint64_t now = (uint64_t)time(NULL);
    crypto_sign_keypair(cert_apk, ask);
    lei_ctx_free(a->c); /* b's key is trusted only by its certificate */
    side_init(a, "a", k->ask);
    lei_auth_trust_authority(a->c, cert_apk, 0, 0);
    size_t cl = cert_v2(ask, "b", k->bpk, now + nb, now + na, addr, cert);
    CHECK(lei_auth_set_identity(b->c, k->bsk, "b", cert, cl, err) == 0);
}
static void set_cert_expired(side *a, side *b, keys *k) { cert_b(a, b, k, -60, -1, NULL); }
static void set_cert_early(side *a, side *b, keys *k) { cert_b(a, b, k, 60, 3600, NULL); }
static void set_cert_addr(side *a, side *b, keys *k) { cert_b(a, b, k, -60, 3600, "127.0.0.9:1"); }
static void set_cert_v1(side *a, side *b, keys *k) {
    uint8_t apk[32], ask[64], cert[64];
    char err[160];
    crypto_sign_keypair(apk, ask);
    lei_ctx_free(a->c);
    side_init(a, "a", k->ask);
    lei_auth_trust_authority(a->c, apk, 0, 0);
    memset(cert, 1, sizeof cert);
    CHECK(lei_auth_set_identity(b->c, k->bsk, "b", cert, 64, err) == 0);
}
static void set_cert_authority_expired(side *a, side *b, keys *k) {
    uint64_t now = (uint64_t)time(NULL);
    cert_b(a, b, k, -60, 3600, NULL);
    /* the same authority, now given a validity that ended */
    lei_auth_trust_authority(a->c, cert_apk, now - 100, now - 10);
}
/* a (the acceptor) certified by an authority b trusts, [nb, na) from now,
 * listing addr; a not in b's trust list. */
static void cert_a(side *a, side *b, keys *k, int64_t nb, int64_t na, const char *addr) {
    uint8_t apk[32], ask[64], cert[LEI_CERT_MAX];
    char err[160];
    uint64_t now = (uint64_t)time(NULL);
    crypto_sign_keypair(apk, ask);
    lei_ctx_free(b->c);
    side_init(b, "b", k->bsk);
    lei_auth_trust_authority(b->c, apk, 0, 0);
    lei_ctx_free(a->c);
    side_init(a, "a", NULL);
    size_t cl = cert_v2(ask, "a", k->apk, now + nb, now + na, addr, cert);
    CHECK(lei_auth_set_identity(a->c, k->ask, "a", cert, cl, err) == 0);
    lei_auth_trust_key(a->c, k->bpk, "b");
}
/* a (the acceptor) certified with an expired certificate: b refuses it. */
static void set_cert_acceptor_expired(side *a, side *b, keys *k) { cert_a(a, b, k, -60, -1, NULL); }
/* a (the acceptor) certified for another address than the one b dials. */
static void set_cert_acceptor_addr(side *a, side *b, keys *k) { cert_a(a, b, k, -60, 3600, "127.0.0.9:1"); }
static void set_revoked(side *a, side *b, keys *k) {
    (void)b;
    CHECK(lei_auth_set_revoked(a->c, k->bpk, 1) == 0);
}

static void test_refusals(void) {
    refusal("mode", set_none, "mode mismatch: this side is keyed", 0);
    refusal("untrusted", set_untrusted, "not trusted: b ", 1);
    refusal("pin (dialler)", set_pin_dialler, "presented key", 1);
    refusal("pin (acceptor)", set_pin_acceptor, "belongs to another identity", 1);
    refusal("principal pin (dialler)", set_principal_dialler, "is principal a (key ", 1);
    refusal("principal pin (acceptor)", set_principal_acceptor, "belongs to another identity", 1);
    refusal("cert", set_cert_wrong, "not trusted: b2 ", 1);
    refusal("cert expired", set_cert_expired, "certificate of b expired at ", 1);
    refusal("cert not yet valid", set_cert_early, "certificate of b not yet valid (from ", 1);
    refusal("cert address", set_cert_addr, "certificate of b does not list address 127.0.0.1:", 1);
    refusal("cert v1", set_cert_v1, "an old certificate without validity (lecho-cert-v1)", 1);
    refusal("authority expired", set_cert_authority_expired, "certificate of b: its authority ", 1);
    refusal("cert expired (acceptor)", set_cert_acceptor_expired, "certificate of a expired at ", 1);
    refusal("revoked", set_revoked, "key revoked: b ", 1);
    refusal("cert address (acceptor)", set_cert_acceptor_addr, "certificate of a does not list address 127.0.0.1:", 1);
}

/* Sides a (keyed) and b, whose key cert (cl bytes) of the authority apk,
 * which a trusts, vouches for; b sends a three events and the pump waits
 * for them (test_cert, test_cert_live). */
static void cert_sides(keys *k, side *a, side *b, const uint8_t *cert, size_t cl, const uint8_t *apk) {
    char err[160];
    side_init(a, "a", k->ask);
    side_init(b, "b", NULL);
    CHECK(lei_auth_set_identity(b->c, k->bsk, "b", cert, cl, err) == 0);
    lei_auth_trust_authority(a->c, apk, 0, 0);
    lei_auth_trust_key(b->c, k->apk, "a");
    authorize(a, b, k);
    send_events(a, b, NULL, 0);
    pump(a, b, NULL, got3, 5);
}

/* An authority's certificate stands for a trusted key. */
static void test_cert(void) {
    keys k;
    side a, b;
    uint8_t apk[32], ask[64], cert[LEI_CERT_MAX];
    make_keys(&k);
    crypto_sign_keypair(apk, ask);
    cert_for(ask, k.bpk, cert);
    cert_sides(&k, &a, &b, cert, cert_len, apk);
    CHECK(a.events == 3 && b.downs == 0);
    lei_ctx_free(a.c);
    lei_ctx_free(b.c);
}

static int b_up(side *a, side *b) { (void)a; return b->ups > 0; }

/* A live connection ends when its peer's certificate does (acceptor a
 * closes it, with the reason to b), and when its key is revoked. */
static void test_cert_live(void) {
    keys k;
    side a, b;
    uint8_t ask[64], cert[LEI_CERT_MAX];
    make_keys(&k);
    crypto_sign_keypair(cert_apk, ask);
    uint64_t now = (uint64_t)time(NULL);
    size_t cl = cert_v2(ask, "b", k.bpk, now - 60, now + 2, NULL, cert);
    cert_sides(&k, &a, &b, cert, cl, cert_apk);
    CHECK(a.events == 3 && b.downs == 0);
    pump(&a, &b, NULL, dialler_down, 5);
    double t = (double)time(NULL);
    CHECK(b.downs > 0 && strstr(b.reason, "certificate of b expired at ") != NULL);
    CHECK(t >= (double)(now + 2) && t <= (double)(now + 4));
    lei_ctx_free(a.c);
    lei_ctx_free(b.c);
    /* its authority's validity cut short by a reload: closed at once */
    make_keys(&k);
    cl = cert_v2(ask, "b", k.bpk, now - 60, now + 3600, NULL, cert);
    cert_sides(&k, &a, &b, cert, cl, cert_apk);
    CHECK(a.events == 3 && b.downs == 0);
    lei_auth_trust_authority(a.c, cert_apk, 0, now - 1);
    pump(&a, &b, NULL, dialler_down, 5);
    CHECK(b.downs > 0 && strstr(b.reason, "certificate of b: its authority ") != NULL &&
          strstr(b.reason, " ended at ") != NULL);
    lei_ctx_free(a.c);
    lei_ctx_free(b.c);
    /* revoked while up: closed now, both sides told */
    make_keys(&k);
    keyed_sides(&k, &a, &b);
    authorize(&a, &b, &k);
    send_events(&a, &b, NULL, 0);
    pump(&a, &b, NULL, got3, 5);
    CHECK(a.events == 3);
    CHECK(lei_auth_set_revoked(a.c, k.bpk, 1) == 1);
    pump(&a, &b, NULL, dialler_down, 5);
    CHECK(b.downs > 0 && strstr(b.reason, "key revoked: b ") != NULL);
    CHECK(lei_auth_set_revoked(a.c, NULL, 0) == 0); /* emptied: nothing closed */
    lei_ctx_free(a.c);
    lei_ctx_free(b.c);
}

/* A proxy between b (dialling) and a (listening): its address. */
static void proxy_open(proxy *px) {
    struct sockaddr_in sa;
    socklen_t sl = sizeof sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    px->lfd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(bind(px->lfd, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(px->lfd, 4) == 0);
    getsockname(px->lfd, (struct sockaddr *)&sa, &sl);
    fcntl(px->lfd, F_SETFL, O_NONBLOCK);
    snprintf(px->addr, sizeof px->addr, "127.0.0.1:%u", ntohs(sa.sin_port));
}

static void proxy_close(proxy *px) {
    close(px->lfd);
    if (px->a >= 0) close(px->a);
    if (px->b >= 0) close(px->b);
}

/* Keyed sides a and b with the proxy px between them, and a control
 * message from b to a through it, which makes b dial (test_tamper,
 * test_bad_auth). */
static void proxied_sides(keys *k, side *a, side *b, proxy *px) {
    make_keys(k);
    keyed_sides(k, a, b);
    proxy_open(px);
    lei_msg *m = msg_of(5);
    const char *err;
    CHECK(lei_send_ctrl(b->c, px->addr, m, &err) == 0);
    lei_msg_release(m, NULL, NULL);
}

/* The end of a test through the proxy: both contexts freed, the proxy closed. */
static void proxied_free(side *a, side *b, proxy *px) {
    lei_ctx_free(a->c);
    lei_ctx_free(b->c);
    proxy_close(px);
}

/* A record changed on the way closes the connection ("bad record"). */
static void test_tamper(void) {
    keys k;
    side a, b;
    proxy px = {.lfd = -1, .a = -1, .b = -1};
    proxied_sides(&k, &a, &b, &px); /* the connection comes up, through the proxy */
    pump(&a, &b, &px, b_up, 5);
    CHECK(b.ups == 1);
    px.tamper = 1;
    send_events(&a, &b, px.addr, 0);
    pump(&a, &b, &px, acceptor_bad, 5);
    CHECK(px.tamper == 2 && a.events == 0 && b.downs == 1 && strstr(b.reason, "bad record"));
    if (!strstr(b.reason, "bad record")) fprintf(stderr, "tamper: '%s'\n", b.reason);
    proxied_free(&a, &b, &px);
}

/* A changed AUTH is refused, and the dialler reads why (in a record). */
static void test_bad_auth(void) {
    keys k;
    side a, b;
    proxy px = {.lfd = -1, .a = -1, .b = -1, .tamper = 3};
    proxied_sides(&k, &a, &b, &px);
    pump(&a, &b, &px, acceptor_bad, 5);
    CHECK(px.tamper == 4 && b.ups == 0 && a.ctrls == 0);
    CHECK(strstr(b.reason, "refused by peer: bad handshake signature (AUTH)") != NULL);
    if (!strstr(b.reason, "bad handshake signature")) fprintf(stderr, "bad auth: '%s'\n", b.reason);
    proxied_free(&a, &b, &px);
}

/* Simultaneous dials, keyed: one connection survives and nothing is lost. */
static int both3(side *a, side *b) { return a->events >= 3 && b->events >= 3; }

static void test_crossing(void) {
    keys k;
    side a, b;
    uint8_t mpk[32], msk[64], t[LEI_TICKET_BYTES];
    make_keys(&k);
    crypto_sign_keypair(mpk, msk);
    keyed_sides(&k, &a, &b);
    side *s[2] = {&a, &b};
    const uint8_t *pks[2] = {k.apk, k.bpk};
    for (int i = 0; i < 2; i++) {
        uint32_t ch = lei_chan_open(s[i]->c, "ns/x", 4);
        lei_chan_set_local(s[i]->c, ch, 1);
        lei_auth_set_manager_key(s[i]->c, ch, mpk);
        ticket_for(msk, "ns/x", pks[i], t);
        lei_auth_set_ticket(s[i]->c, ch, t);
    }
    for (int i = 0; i < 2; i++) {
        uint32_t ch = lei_chan_open(s[i]->c, "ns/x", 4);
        const char *dest = lei_ctx_addr(s[1 - i]->c);
        lei_peer_set_dests(s[i]->c, ch, &dest, 1); /* both dial now */
        for (int j = 0; j < 3; j++) {
            lei_msg *m = msg_of(100);
            const char *err;
            uint64_t sid;
            CHECK(lei_submit(s[i]->c, ch, 1, (uint64_t)j + 1, m, 0, LEI_BLOCK, &sid, &err) == 0);
            lei_msg_release(m, NULL, NULL);
        }
    }
    pump(&a, &b, NULL, both3, 8);
    if (a.events != 3 || b.events != 3)
        fprintf(stderr, "crossing: %d %d '%s' '%s'\n", a.events, b.events, a.reason, b.reason);
    CHECK(a.events == 3 && b.events == 3);
    lei_ctx_free(a.c);
    lei_ctx_free(b.c);
}

/* ---- BIND tickets ---------------------------------------------------------- */

static int got3_or_down(side *a, side *b) {
    lei_stats_chan st;
    (void)b;
    uint32_t n = lei_chan_total(a->c);
    uint64_t refused = 0;
    for (uint32_t i = 0; i < n; i++)
        if (lei_chan_stats(a->c, i, &st) == 0) refused += st.refused;
    return a->events + (int)refused >= 3;
}

/* b produces on `name` for a (a opens `open` first unless NULL); tickets:
 * mode 0 none, 1 valid (manager key on a's channel `mkey_on`), 2 for another
 * producer key.  Returns what a received; *refused, *errs_ok filled in. */
static int ticket_case(const char *name, const char *open, const char *mkey_on, int mode,
                       uint64_t *refused, int *errs_ok) {
    keys k;
    side a, b;
    uint8_t mpk[32], msk[64], t[LEI_TICKET_BYTES], other[32], osk[64];
    make_keys(&k);
    crypto_sign_keypair(mpk, msk);
    crypto_sign_keypair(other, osk);
    keyed_sides(&k, &a, &b);
    uint32_t nbefore = 0;
    if (open) {
        uint32_t ca = lei_chan_open(a.c, open, strlen(open));
        lei_chan_set_local(a.c, ca, 1);
    }
    if (mkey_on) lei_auth_set_manager_key(a.c, lei_chan_open(a.c, mkey_on, strlen(mkey_on)), mpk);
    nbefore = lei_chan_total(a.c);
    size_t bl = strcspn(name, "@");
    uint32_t cbase = lei_chan_open(b.c, name, bl), cb = lei_chan_open(b.c, name, strlen(name));
    if (mode) {
        char base[64];
        memcpy(base, name, bl);
        base[bl] = '\0';
        if (mode == 3) /* expired a second ago */
            ticket_exp(msk, base, k.bpk, (uint64_t)time(NULL) - 1, t);
        else
            ticket_for(msk, base, mode == 1 ? k.bpk : other, t);
        lei_auth_set_ticket(b.c, cbase, t);
    }
    const char *dest = lei_ctx_addr(a.c);
    lei_peer_set_dests(b.c, cb, &dest, 1);
    uint64_t sid = 0;
    for (int i = 0; i < 3; i++) {
        lei_msg *m = msg_of(10);
        const char *err;
        CHECK(lei_submit(b.c, cb, 1, (uint64_t)i + 1, m, i == 2, LEI_BLOCK, &sid, &err) == 0);
        lei_msg_release(m, NULL, NULL);
    }
    pump(&a, &b, NULL, got3_or_down, 5);
    lei_sync *s = lei_sync_find(b.c, sid);
    for (int i = 0; i < 200 && s && lei_sync_pending(s); i++) pump(&a, &b, NULL, got3_or_down, 0.01);
    *errs_ok = 0;
    if (s && lei_sync_pending(s) == 0 && lei_sync_nreplies(s) == 1) {
        lei_sync_answer ans;
        lei_sync_reply(s, 0, &ans);
        char want[128];
        snprintf(want, sizeof want, "not an authorized producer of %s", name);
        *errs_ok = ans.elen == 0 ? 1 : (memmem(ans.errs, ans.elen, want, strlen(want)) != NULL &&
                                         memmem(ans.errs, ans.elen, lei_ctx_addr(a.c),
                                                strlen(lei_ctx_addr(a.c))) != NULL) + 1;
    }
    lei_peer *pb = lei_peer_get(a.c, lei_ctx_addr(b.c), 0);
    lei_stats_peer ps;
    if (pb) lei_peer_stats(pb, &ps);
    *refused = pb ? ps.refused : 0;
    /* a BIND never opens a channel in keyed mode */
    CHECK(lei_chan_total(a.c) == nbefore);
    int got = a.events;
    lei_ctx_free(a.c);
    lei_ctx_free(b.c);
    return got;
}

/* A binding lasts while its ticket does: the events after its expiry are
 * refused, and a renewed ticket (a new BIND) is taken. */
static int never(side *a, side *b) { (void)a, (void)b; return 0; }
/* Three small events from b on ns/x, seqs from seq0 + 1. */
static void send3(side *b, uint64_t seq0) {
    uint32_t cb = lei_chan_open(b->c, "ns/x", 4);
    for (int i = 0; i < 3; i++) {
        lei_msg *m = msg_of(10);
        const char *err;
        uint64_t sid = 0;
        CHECK(lei_submit(b->c, cb, 1, seq0 + (uint64_t)i + 1, m, 0, LEI_BLOCK, &sid, &err) == 0);
        lei_msg_release(m, NULL, NULL);
    }
}
static void test_ticket_live(void) {
    keys k;
    side a, b;
    uint8_t mpk[32], msk[64], t[LEI_TICKET_BYTES];
    make_keys(&k);
    keyed_sides(&k, &a, &b);
    crypto_sign_keypair(mpk, msk);
    ticket_exp(msk, "ns/x", k.bpk, (uint64_t)time(NULL) + 2, t);
    lei_auth_set_manager_key(a.c, lei_chan_open(a.c, "ns/x", 4), mpk);
    uint32_t cb = lei_chan_open(b.c, "ns/x", 4);
    lei_auth_set_ticket(b.c, cb, t);
    send_events(&a, &b, NULL, 0);
    pump(&a, &b, NULL, got3, 5);
    CHECK(a.events == 3);
    pump(&a, &b, NULL, never, 3.2); /* past the expiry */
    send3(&b, 3);
    pump(&a, &b, NULL, never, 1);
    lei_peer *pb = lei_peer_get(a.c, lei_ctx_addr(b.c), 0);
    lei_stats_peer ps;
    if (pb) lei_peer_stats(pb, &ps);
    CHECK(pb && ps.refused == 3 && a.events == 3);
    /* renewed: bound again before the next event, taken */
    ticket_exp(msk, "ns/x", k.bpk, (uint64_t)time(NULL) + 600, t);
    lei_auth_set_ticket(b.c, cb, t);
    send3(&b, 6);
    pump(&a, &b, NULL, never, 1);
    CHECK(a.events == 6);
    lei_ctx_free(a.c);
    lei_ctx_free(b.c);
}

static void test_tickets(void) {
    uint64_t refused;
    int errs;
    /* no ticket: dropped, counted, the sync answered with the reason */
    CHECK(ticket_case("ns/x", "ns/x", "ns/x", 0, &refused, &errs) == 0 && refused == 3 && errs == 2);
    /* a valid ticket, but no manager key here */
    CHECK(ticket_case("ns/x", "ns/x", NULL, 1, &refused, &errs) == 0 && refused == 3 && errs == 2);
    /* a ticket of another producer's key */
    CHECK(ticket_case("ns/x", "ns/x", "ns/x", 2, &refused, &errs) == 0 && refused == 3 && errs == 2);
    /* an expired ticket */
    CHECK(ticket_case("ns/x", "ns/x", "ns/x", 3, &refused, &errs) == 0 && refused == 3 && errs == 2);
    /* a valid ticket: delivered, the sync answered without errors */
    CHECK(ticket_case("ns/x", "ns/x", "ns/x", 1, &refused, &errs) == 3 && refused == 0 && errs == 1);
    /* a derived stream: the base channel's ticket and manager key */
    CHECK(ticket_case("ns/x@k1", "ns/x@k1", "ns/x", 1, &refused, &errs) == 3 && refused == 0);
    /* a channel not open here is refused and not created */
    CHECK(ticket_case("ns/y", NULL, NULL, 1, &refused, &errs) == 0 && refused == 3 && errs == 2);
}

/* Protected mode listens on loopback and unix sockets only. */
static void test_protected_listen(void) {
    char err[160];
    uint8_t pk[32], sk[64];
    lei_ctx *c = new_ctx();
    CHECK(lei_accept_listen(c, "0.0.0.0:0", NULL, NULL, err) == -LEI_E_INVALID);
    CHECK(strstr(err, "refusing to listen on 0.0.0.0:0 without keys (protected mode)") != NULL);
    lei_ctx_free(c);
    c = new_ctx();
    crypto_sign_keypair(pk, sk);
    CHECK(lei_auth_set_identity(c, sk, "k", NULL, 0, err) == 0);
    CHECK(lei_accept_listen(c, "0.0.0.0:0", NULL, NULL, err) == 0);
    lei_ctx_free(c);
    c = new_ctx();
    CHECK(lei_accept_listen(c, "127.0.0.2:0", NULL, NULL, err) == 0);
    lei_ctx_free(c);
}

/* ---- record ciphers (doc/protocol.md section 3, "Record ciphers") -------- */

static int aes_here(void) { return crypto_aead_aes256gcm_is_available(); }

/* The cipher both sides agree on: AES-256-GCM when both offer it, else
 * ChaCha20-Poly1305; events of every size pass (records sealed from the
 * queue's pieces, gathered or straight from the value). */
static void cipher_case(int a_no_aes, int b_no_aes, const char *want) {
    keys k;
    side a, b;
    make_keys(&k);
    side_no_aes = a_no_aes;
    side_init(&a, "a", k.ask);
    side_no_aes = b_no_aes;
    side_init(&b, "b", k.bsk);
    side_no_aes = 0;
    CHECK(lei_auth_trust_key(a.c, k.bpk, "b") == 0);
    CHECK(lei_auth_trust_key(b.c, k.apk, "a") == 0);
    authorize(&a, &b, &k);
    uint32_t ca = lei_chan_open(a.c, "ns/x", 4), cb = lei_chan_open(b.c, "ns/x", 4);
    lei_chan_set_local(a.c, ca, 1);
    const char *dest = lei_ctx_addr(a.c);
    lei_peer_set_dests(b.c, cb, &dest, 1);
    static const size_t sizes[] = {1,     100,   2040,  2047,  2048,   2049,   5000, 65535,
                                   65536, 65537, 131072, 200001, 3,     1000000, 700, 64000};
    int nsz = (int)(sizeof sizes / sizeof sizes[0]), total = 3 * nsz;
    for (int r = 0; r < 3; r++)
        for (int i = 0; i < nsz; i++) {
            size_t n = sizes[(i + r * 5) % nsz];
            uint8_t *v = malloc(n);
            for (size_t j = 0; j < n; j++) v[j] = pattern(n, j);
            if (v[0] == 'v') v[0] = pattern(n, 0); /* (never 'v': see on_event) */
            lei_msg *m = lei_msg_new();
            lei_enc_string(&m->own, (const char *)v, n);
            lei_msg_sync(m);
            free(v);
            const char *err;
            uint64_t sid = 0;
            CHECK(lei_submit(b.c, cb, 1, (uint64_t)(r * nsz + i + 1), m, 0, LEI_BLOCK, &sid, &err) == 0);
            lei_msg_release(m, NULL, NULL);
        }
    double end = ev_time() + 10;
    while (ev_time() < end && a.events < total) {
        ev_run(lei_ctx_loop(a.c), EVRUN_NOWAIT);
        ev_run(lei_ctx_loop(b.c), EVRUN_NOWAIT);
    }
    CHECK(a.events == total && a.bad_payloads == 0 && a.downs == 0 && b.downs == 0);
    lei_peer *pa = lei_peer_get(b.c, lei_ctx_addr(a.c), 0);
    lei_peer *pb = lei_peer_get(a.c, lei_ctx_addr(b.c), 0);
    const char *ga = pa ? lei_peer_cipher(pa) : NULL, *gb = pb ? lei_peer_cipher(pb) : NULL;
    CHECK(ga && gb && strcmp(ga, want) == 0 && strcmp(gb, want) == 0);
    if (!ga || strcmp(ga, want)) fprintf(stderr, "cipher: '%s', wanted '%s'\n", ga ? ga : "-", want);
    lei_ctx_free(a.c);
    lei_ctx_free(b.c);
}

static void test_ciphers(void) {
    const char *best = aes_here() ? "aes-256-gcm" : "chacha20-poly1305";
    cipher_case(0, 0, best);
    cipher_case(1, 0, "chacha20-poly1305"); /* the acceptor without AES */
    cipher_case(0, 1, "chacha20-poly1305"); /* the dialler without AES */
    cipher_case(1, 1, "chacha20-poly1305");
}

/* An active attacker between two peers that both have AES-256-GCM: editing
 * the offer (HELLO) or the choice (HELLO_OK) towards ChaCha20-Poly1305
 * fails the transcript signatures, and a forged "old acceptor" refusal
 * makes the dialler fall back in mode 1, whose marker the acceptor reads
 * as the forgery it is: every time the connection fails, nothing goes
 * over the weaker cipher. */
static void downgrade_case(int tamper, const char *want_b) {
    keys k;
    side a, b;
    proxy px = {.lfd = -1, .a = -1, .b = -1, .tamper = tamper};
    make_keys(&k);
    keyed_sides(&k, &a, &b);
    authorize(&a, &b, &k);
    proxy_open(&px);
    send_events(&a, &b, px.addr, 1); /* the third one sync */
    pump(&a, &b, &px, acceptor_bad, 5);
    /* (tamper 9: the dialler was up on its fallback connection, the
     * acceptor closed it at the marker, the first thing it read there) */
    CHECK(px.tamper == tamper + 1 && a.events == 0 && (tamper == 9 || (a.ups == 0 && b.ups == 0)) &&
          b.downs > 0);
    CHECK(strstr(b.reason, want_b) != NULL);
    if (!strstr(b.reason, want_b)) fprintf(stderr, "downgrade %d: '%s'\n", tamper, b.reason);
    lei_stats_ctx st;
    lei_ctx_stats(a.c, &st);
    CHECK(st.bad_frames > 0);
    if (tamper == 9) CHECK(px.forged == 1);
    /* Nothing is lost silently: the sync submit queued behind the
     * marker (or behind the failed handshake) is failed with its code
     * where the connection ended, never left pending or reported as run. */
    lei_sync *s = lei_sync_find(b.c, last_sid);
    CHECK(s && lei_sync_pending(s) == 0 && lei_sync_nran(s) == 0 && lei_sync_nreplies(s) == 1);
    if (s && lei_sync_nreplies(s) == 1) {
        lei_sync_answer an;
        lei_sync_reply(s, 0, &an);
        CHECK(an.done && an.err != NULL && an.code != 0);
        if (!an.done || !an.err || !an.code)
            fprintf(stderr, "downgrade %d: sync answer done=%d err='%s' code=%d\n", tamper, an.done,
                    an.err ? an.err : "-", an.code);
    }
    proxied_free(&a, &b, &px);
}

static void test_downgrade(void) {
    if (!aes_here()) {
        fprintf(stderr, "test_downgrade: no AES-NI here, nothing to downgrade from\n");
        return;
    }
    downgrade_case(5, "bad handshake signature or key (HELLO_OK)");
    downgrade_case(7, "bad handshake signature or key (HELLO_OK)");
    downgrade_case(9, "peer reported: record cipher downgrade");
}

int main(void) {
    test_identity();
    test_tables();
    test_frames();
    test_protected_listen();
    test_keyed_ok();
    test_refusals();
    test_cert();
    test_cert_live();
    test_tamper();
    test_bad_auth();
    test_tickets();
    test_ticket_live();
    test_crossing();
    test_ciphers();
    test_downgrade();
    return TEST_SUMMARY();
}
