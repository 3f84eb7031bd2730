/*
 * bench/baseline_peers.c -- NATS and Redis baselines for the lecho benchmark
 * suite: small clients of our own speaking the NATS text protocol (INFO,
 * CONNECT, PUB, SUB, MSG, PING, PONG; TLS through OpenSSL) and RESP (Redis
 * PUBLISH / SUBSCRIBE), against a server the caller started on a loopback
 * port (bench/run.lua starts nats-server and redis-server on ports it picks
 * and stops them at the end).  Same JSON output as bench/baseline_tcp.c,
 * with "impl":"nats", "nats_tls" or "redis".
 *
 * usage: baseline_peers nats|redis PORT [--tls CAFILE] [--subs S]
 *                       [--warmup K] WORKLOAD SIZE N
 *
 * What it measures
 *   Publishers and subscribers are processes of this program: the parent
 *   publishes (or requests), a forked peer process subscribes (or answers);
 *   for --subs S > 1 the peer forks S-1 more subscribers, each with its own
 *   connection.  Every process connects to 127.0.0.1:PORT with TCP_NODELAY.
 *   Messages carry the low 8 bits of their sequence number in their first
 *   byte; every receiver checks that byte and the length, so a run that
 *   loses or reorders a message fails instead of reporting.  Each receiver
 *   has a control pipe of its own to the parent (one byte per phase: R
 *   subscribed, W warmup received, D all received): a receiver that dies
 *   is seen as the end of its pipe.
 *
 * Writing and reading
 *   Both sides buffer as the usual clients do: a publisher appends its
 *   commands to a 64 KiB buffer and writes it when full (the Go NATS client
 *   has a 32 KiB writer flushed by a goroutine; hiredis appends pipelined
 *   commands to one buffer); a receiver reads 256 KiB at a time and parses
 *   in place.  Neither server pushes back on a publisher: NATS disconnects a
 *   subscriber whose pending data passes its limit (a "slow consumer") and
 *   Redis one whose pub/sub output buffer passes 32 MB.  So the publisher
 *   keeps at most WINDOW bytes (4 MiB of payload and framing) ahead of the
 *   slowest subscriber, which tells its count through shared memory every
 *   256 messages; the window is far above what a run needs to keep the
 *   pipe full and bounds memory the way ZeroMQ's high-water mark or a full
 *   TCP socket buffer does for the other baselines.  The Redis publisher
 *   reads the replies to its PUBLISHes as they come (without blocking) and
 *   checks each one counts S receivers.
 *
 * Workloads
 *   stream SIZE N     publish -> subscribe, one subject/channel "bench.s",
 *                     S subscribers (--subs, default 1, at most 64).  K
 *                     warmup messages, every subscriber says W, the clock
 *                     starts, N messages, the clock stops when every
 *                     subscriber said D: time per event at the slowest
 *                     subscriber (us_per_op), ops_per_s, mb_per_s.
 *   pingpong SIZE N   request/reply, one at a time, each timed (p50/p99).
 *                     NATS: the requester subscribes "_INBOX.<pid>.*" once
 *                     and publishes each request on "bench.req" with the
 *                     reply subject "_INBOX.<pid>.<i>" (the request style
 *                     of the NATS clients); the responder answers each with
 *                     an empty message to that subject.  Redis: two
 *                     channels, "bench.ping" and "bench.pong"; each side
 *                     subscribes on one connection and publishes on another
 *                     (a subscribed RESP2 connection may not publish) and
 *                     reads the reply to its PUBLISH (":1").
 *
 * TLS (nats only, --tls CAFILE): nats-server 2.9 sends INFO in the clear,
 * then the client makes the TLS handshake (TLS 1.2 or newer, the server's
 * certificate checked against CAFILE and for the address 127.0.0.1) and
 * speaks the protocol over it; "impl" is "nats_tls".
 *
 * Warmup: default stream 10000, pingpong 1000, each capped at N/10.
 * Failure handling: every process calls alarm(60); subscribers die with
 * their peer process and it with the parent (PR_SET_PDEATHSIG); the parent
 * reaps its peer, which reaps its subscribers and fails if one failed.
 *
 * Build (make bench): gcc -O2 -g -Wall -Wextra -Werror -std=gnu99
 *   -o bench/baseline_peers bench/baseline_peers.c -lssl -lcrypto
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#define PROG "baseline_peers"
#define ALARM_SECONDS 60
#define OUT_CAP (64 * 1024)       /* a connection's write buffer */
#define IN_CAP (256 * 1024)       /* a connection's read buffer */
#define MAX_SIZE (128 * 1024)     /* largest SIZE (fits the read buffer) */
#define MAX_SUBS 64
#define WINDOW (4u << 20)         /* bytes a publisher may be ahead */
#define ACK_EVERY 256             /* a subscriber's count, every so many */

#include "harness.h"

/* ---------------------------------------------------------------------- */
/* A buffered connection, plain or TLS                                    */
/* ---------------------------------------------------------------------- */

struct conn {
    int fd;
    SSL *ssl;            /* owned; NULL: plain TCP */
    uint8_t *in;         /* owned, IN_CAP: in[off..len) not yet parsed */
    size_t off, len;
    uint8_t *out;        /* owned, OUT_CAP: out[0..olen) not yet written */
    size_t olen;
};

static void tls_die(const char *what)
{
    unsigned long e = ERR_get_error();
    die("%s: %s", what, e ? ERR_error_string(e, NULL) : "failed");
}

/* Connects to 127.0.0.1:port.  The connection owns its buffers. */
static void conn_open(struct conn *c, int port)
{
    memset(c, 0, sizeof *c);
    c->fd = socket(AF_INET, SOCK_STREAM, 0);
    if (c->fd < 0)
        die("socket: %s", strerror(errno));
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    while (connect(c->fd, (struct sockaddr *)&a, sizeof a) < 0) {
        if (errno == EINTR)
            continue;
        die("connect 127.0.0.1:%d: %s", port, strerror(errno));
    }
    c->in = xmalloc(IN_CAP);
    c->out = xmalloc(OUT_CAP);
}

/* The TLS handshake on c's socket (nothing may be buffered unread):
 * the server's certificate must chain to ctx's CA file and be for
 * 127.0.0.1. */
static void conn_tls(struct conn *c, SSL_CTX *ctx)
{
    if (c->off != c->len)
        die("bytes before the TLS handshake");
    c->ssl = SSL_new(ctx);
    if (!c->ssl || SSL_set_fd(c->ssl, c->fd) != 1)
        tls_die("SSL_new");
    X509_VERIFY_PARAM *p = SSL_get0_param(c->ssl);
    if (X509_VERIFY_PARAM_set1_ip_asc(p, "127.0.0.1") != 1)
        tls_die("X509_VERIFY_PARAM_set1_ip_asc");
    if (SSL_connect(c->ssl) != 1)
        tls_die("TLS handshake");
}

static void conn_close(struct conn *c)
{
    if (c->ssl) {
        SSL_free(c->ssl);
        c->ssl = NULL;
    }
    close(c->fd);
    free(c->in);
    free(c->out);
}

/* Writes all of out[0..olen). */
static void conn_flush(struct conn *c)
{
    size_t done = 0;
    while (done < c->olen) {
        if (c->ssl) {
            int r = SSL_write(c->ssl, c->out + done, (int)(c->olen - done));
            if (r <= 0)
                tls_die("SSL_write");
            done += (size_t)r;
        } else {
            ssize_t r = write(c->fd, c->out + done, c->olen - done);
            if (r < 0) {
                if (errno == EINTR)
                    continue;
                die("write: %s", strerror(errno));
            }
            done += (size_t)r;
        }
    }
    c->olen = 0;
}

/* Appends len bytes (len <= OUT_CAP), writing the buffer first if they do
 * not fit. */
static void conn_put(struct conn *c, const void *p, size_t len)
{
    if (c->olen + len > OUT_CAP)
        conn_flush(c);
    memcpy(c->out + c->olen, p, len);
    c->olen += len;
}

static void conn_puts(struct conn *c, const char *s) { conn_put(c, s, strlen(s)); }

/* Reads once more into the buffer (moving what is unparsed to its start
 * first); dies at the end of the stream. */
static void conn_fill(struct conn *c)
{
    if (c->off > 0) {
        memmove(c->in, c->in + c->off, c->len - c->off);
        c->len -= c->off;
        c->off = 0;
    }
    if (c->len == IN_CAP)
        die("line or message longer than the read buffer");
    for (;;) {
        ssize_t r;
        if (c->ssl) {
            int k = SSL_read(c->ssl, c->in + c->len, (int)(IN_CAP - c->len));
            if (k <= 0)
                tls_die("SSL_read (server gone?)");
            r = k;
        } else {
            r = read(c->fd, c->in + c->len, IN_CAP - c->len);
            if (r < 0 && errno == EINTR)
                continue;
            if (r < 0)
                die("read: %s", strerror(errno));
            if (r == 0)
                die("the server closed the connection");
        }
        c->len += (size_t)r;
        return;
    }
}

/* Plain connections: reads what is there without blocking; 1 if it read. */
static int conn_fill_nowait(struct conn *c)
{
    struct pollfd p = { .fd = c->fd, .events = POLLIN };
    if (poll(&p, 1, 0) <= 0)
        return 0;
    conn_fill(c);
    return 1;
}

/* The next line, its \r\n replaced by \0 (valid until the next read);
 * NULL if wait is 0 and no whole line is buffered. */
static char *conn_line_wait(struct conn *c, int wait)
{
    for (;;) {
        uint8_t *s = c->in + c->off;
        size_t n = c->len - c->off;
        uint8_t *nl = n > 1 ? memchr(s + 1, '\n', n - 1) : NULL;
        if (nl) {
            if (nl[-1] != '\r')
                die("a line without \\r\\n");
            nl[-1] = '\0';
            c->off += (size_t)(nl - s) + 1;
            return (char *)s;
        }
        if (!wait)
            return NULL;
        conn_fill(c);
    }
}

static char *conn_line(struct conn *c) { return conn_line_wait(c, 1); }

/* The next n bytes and the \r\n after them; a pointer to the n bytes,
 * valid until the next read. */
static const uint8_t *conn_bytes(struct conn *c, size_t n)
{
    while (c->len - c->off < n + 2)
        conn_fill(c);
    const uint8_t *p = c->in + c->off;
    if (p[n] != '\r' || p[n + 1] != '\n')
        die("a payload without \\r\\n after it");
    c->off += n + 2;
    return p;
}

static uint64_t parse_len(const char *s, const char *what)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end)
        die("bad %s: \"%s\"", what, s);
    return v;
}

/* ---------------------------------------------------------------------- */
/* NATS                                                                   */
/* ---------------------------------------------------------------------- */

/* Connects, reads INFO, makes the TLS handshake if ctx, sends CONNECT
 * (echo off, not verbose) and waits for the PONG of a PING. */
static void nats_open(struct conn *c, int port, SSL_CTX *ctx)
{
    conn_open(c, port);
    char *info = conn_line(c);
    if (strncmp(info, "INFO ", 5) != 0)
        die("expected INFO from nats-server, got \"%.80s\"", info);
    if (ctx)
        conn_tls(c, ctx);
    conn_puts(c, "CONNECT {\"verbose\":false,\"pedantic\":false,\"tls_required\":");
    conn_puts(c, ctx ? "true" : "false");
    conn_puts(c, ",\"name\":\"lecho-bench\",\"lang\":\"c\",\"version\":\"0\",\"protocol\":1,"
                 "\"echo\":false}\r\n");
    conn_puts(c, "PING\r\n");
    conn_flush(c);
    for (;;) {
        char *l = conn_line(c);
        if (strcmp(l, "PONG") == 0)
            return;
        if (strncmp(l, "-ERR", 4) == 0)
            die("nats-server: %s", l);
        if (strcmp(l, "PING") == 0) {
            conn_puts(c, "PONG\r\n");
            conn_flush(c);
        }
        /* +OK, INFO: nothing to do */
    }
}

/* SUB subject sid, then a PING whose PONG says the server has it. */
static void nats_sub(struct conn *c, const char *subject)
{
    conn_puts(c, "SUB ");
    conn_puts(c, subject);
    conn_puts(c, " 1\r\nPING\r\n");
    conn_flush(c);
    for (;;) {
        char *l = conn_line(c);
        if (strcmp(l, "PONG") == 0)
            return;
        if (strncmp(l, "-ERR", 4) == 0)
            die("nats-server: %s", l);
        if (strcmp(l, "PING") == 0) {
            conn_puts(c, "PONG\r\n");
            conn_flush(c);
        }
    }
}

/* Appends PUB subject [reply] len payload. */
static void nats_pub(struct conn *c, const char *subject, const char *reply, const uint8_t *p,
                     size_t len)
{
    char head[256];
    int h = reply ? snprintf(head, sizeof head, "PUB %s %s %zu\r\n", subject, reply, len)
                  : snprintf(head, sizeof head, "PUB %s %zu\r\n", subject, len);
    if (c->olen + (size_t)h + len + 2 > OUT_CAP)
        conn_flush(c);
    conn_put(c, head, (size_t)h);
    conn_put(c, p, len);
    conn_put(c, "\r\n", 2);
}

/* The next MSG: its subject and reply subject (copied into subj/reply,
 * reply "" if none) and payload (*len bytes, valid until the next read).
 * Answers the server's PINGs; dies on -ERR. */
static const uint8_t *nats_msg(struct conn *c, char *subj, char *reply, size_t cap, size_t *len)
{
    for (;;) {
        char *l = conn_line(c);
        if (strncmp(l, "MSG ", 4) == 0) {
            char *tok[5];
            int nt = 0;
            for (char *s = strtok(l + 4, " "); s && nt < 5; s = strtok(NULL, " "))
                tok[nt++] = s;
            if (nt != 3 && nt != 4)
                die("bad MSG line");
            if (strlen(tok[0]) >= cap || (nt == 4 && strlen(tok[2]) >= cap))
                die("subject too long");
            strcpy(subj, tok[0]);
            strcpy(reply, nt == 4 ? tok[2] : "");
            *len = parse_len(tok[nt - 1], "MSG size");
            if (*len > MAX_SIZE + 1)
                die("MSG of %zu bytes", *len);
            return conn_bytes(c, *len);
        }
        if (strcmp(l, "PING") == 0) {
            conn_puts(c, "PONG\r\n");
            conn_flush(c);
        } else if (strncmp(l, "-ERR", 4) == 0) {
            die("nats-server: %s", l);
        }
    }
}

/* ---------------------------------------------------------------------- */
/* Redis (RESP)                                                           */
/* ---------------------------------------------------------------------- */

/* Appends a command of argc bulk strings. */
static void resp_cmd(struct conn *c, int argc, const void *const *argv, const size_t *lens)
{
    char head[64];
    size_t total = 16;
    for (int i = 0; i < argc; i++)
        total += lens[i] + 24;
    if (c->olen + total > OUT_CAP)
        conn_flush(c);
    conn_put(c, head, (size_t)snprintf(head, sizeof head, "*%d\r\n", argc));
    for (int i = 0; i < argc; i++) {
        conn_put(c, head, (size_t)snprintf(head, sizeof head, "$%zu\r\n", lens[i]));
        conn_put(c, argv[i], lens[i]);
        conn_put(c, "\r\n", 2);
    }
}

static void redis_publish(struct conn *c, const char *chan, const uint8_t *p, size_t len)
{
    const void *argv[] = { "PUBLISH", chan, p };
    size_t lens[] = { 7, strlen(chan), len };
    resp_cmd(c, 3, argv, lens);
}

/* The integer reply of a PUBLISH (a line ":n"); dies on anything else. */
static long long redis_int(const char *l)
{
    if (l[0] == '-')
        die("redis-server: %s", l);
    if (l[0] != ':')
        die("expected an integer reply, got \"%.80s\"", l);
    return (long long)parse_len(l + 1, "integer reply");
}

/* A bulk string's header line "$n": n. */
static size_t redis_bulk_len(struct conn *c)
{
    char *l = conn_line(c);
    if (l[0] == '-')
        die("redis-server: %s", l);
    if (l[0] != '$')
        die("expected a bulk string, got \"%.80s\"", l);
    return (size_t)parse_len(l + 1, "bulk length");
}

/* SUBSCRIBE chan and its confirmation. */
static void redis_subscribe(struct conn *c, const char *chan)
{
    const void *argv[] = { "SUBSCRIBE", chan };
    size_t lens[] = { 9, strlen(chan) };
    resp_cmd(c, 2, argv, lens);
    conn_flush(c);
    char *l = conn_line(c);
    if (strcmp(l, "*3") != 0)
        die("SUBSCRIBE: expected *3, got \"%.80s\"", l);
    size_t n = redis_bulk_len(c);
    if (n != 9 || memcmp(conn_bytes(c, n), "subscribe", 9) != 0)
        die("SUBSCRIBE: not a subscribe reply");
    n = redis_bulk_len(c);
    conn_bytes(c, n);
    redis_int(conn_line(c));
}

/* The next pub/sub message ["message", channel, payload]: its payload
 * (*len bytes, valid until the next read). */
static const uint8_t *redis_message(struct conn *c, size_t *len)
{
    char *l = conn_line(c);
    if (strcmp(l, "*3") != 0)
        die("expected a message (*3), got \"%.80s\"", l);
    size_t n = redis_bulk_len(c);
    if (n != 7 || memcmp(conn_bytes(c, n), "message", 7) != 0)
        die("not a message");
    n = redis_bulk_len(c);
    conn_bytes(c, n);
    *len = redis_bulk_len(c);
    if (*len > MAX_SIZE + 1)
        die("message of %zu bytes", *len);
    return conn_bytes(c, *len);
}

/* ---------------------------------------------------------------------- */
/* The run                                                                */
/* ---------------------------------------------------------------------- */

enum proto { P_NATS, P_REDIS };
enum workload { W_STREAM, W_PINGPONG };

/* Shared between the parent and its subscribers (MAP_SHARED, made before
 * the fork; owned by the parent, unmapped at exit). */
struct shared {
    volatile uint64_t got[MAX_SUBS];   /* messages received, per subscriber */
};

struct run {
    enum proto proto;
    enum workload w;
    int port;
    const char *ca;        /* --tls: the CA file (nats only) */
    int subs;
    size_t size;
    uint64_t warmup, n;
    int ctl[MAX_SUBS][2];  /* per receiver: it writes [1], the parent reads [0] */
    struct shared *sh;
};

static void pipe_signal(int fd, char c)
{
    for (;;) {
        ssize_t r = write(fd, &c, 1);
        if (r == 1)
            return;
        if (r < 0 && errno == EINTR)
            continue;
        die("control pipe write: %s", strerror(errno));
    }
}

/* One byte `want` from every receiver's pipe; a pipe's end (its receiver
 * died) or another byte fails the run. */
static void wait_all(const struct run *r, int count, char want)
{
    for (int i = 0; i < count; i++) {
        char c;
        ssize_t k;
        while ((k = read(r->ctl[i][0], &c, 1)) < 0 && errno == EINTR)
            ;
        if (k < 0)
            die("control pipe read: %s", strerror(errno));
        if (k == 0)
            die("receiver %d is gone (see its message above)", i);
        if (c != want)
            die("receiver %d: got '%c', expected '%c'", i, c, want);
    }
}

static SSL_CTX *tls_ctx(const char *ca)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (!ctx)
        tls_die("SSL_CTX_new");
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    if (SSL_CTX_load_verify_locations(ctx, ca, NULL) != 1)
        tls_die(ca);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    return ctx;
}

/* Opens a connection of r's protocol (its TLS context made here: one per
 * process, owned by the caller, NULL without --tls). */
static void peer_open(const struct run *r, struct conn *c, SSL_CTX **ctx)
{
    *ctx = NULL;
    if (r->proto == P_NATS) {
        if (r->ca)
            *ctx = tls_ctx(r->ca);
        nats_open(c, r->port, *ctx);
    } else {
        conn_open(c, r->port);
    }
}

static void check_msg(const uint8_t *p, size_t len, size_t size, uint64_t seq)
{
    if (len != size)
        die("message %llu: %zu bytes, expected %zu", (unsigned long long)seq, len, size);
    if (size > 0 && p[0] != (uint8_t)seq)
        die("message %llu: bad sequence byte (lost or reordered)", (unsigned long long)seq);
}

/* A subscriber of stream (index k): subscribes, says R; receives the
 * warmup, says W; receives the rest, says D; its count in shared memory
 * every ACK_EVERY messages. */
static void stream_sub(const struct run *r, int k)
{
    struct conn c;
    SSL_CTX *ctx;
    char subj[128], reply[128];
    peer_open(r, &c, &ctx);
    if (r->proto == P_NATS)
        nats_sub(&c, "bench.s");
    else
        redis_subscribe(&c, "bench.s");
    int fd = r->ctl[k][1];
    pipe_signal(fd, 'R');
    uint64_t total = r->warmup + r->n;
    for (uint64_t i = 0; i < total; i++) {
        size_t len;
        const uint8_t *p = r->proto == P_NATS ? nats_msg(&c, subj, reply, sizeof subj, &len)
                                              : redis_message(&c, &len);
        check_msg(p, len, r->size, i);
        if ((i + 1) % ACK_EVERY == 0)
            __atomic_store_n(&r->sh->got[k], i + 1, __ATOMIC_RELEASE);
        if (i + 1 == r->warmup)
            pipe_signal(fd, 'W');
    }
    __atomic_store_n(&r->sh->got[k], total, __ATOMIC_RELEASE);
    pipe_signal(fd, 'D');
    conn_close(&c);
    if (ctx)
        SSL_CTX_free(ctx);
}

/* The fewest messages any subscriber received. */
static uint64_t slowest(const struct run *r)
{
    uint64_t m = UINT64_MAX;
    for (int k = 0; k < r->subs; k++) {
        uint64_t g = __atomic_load_n(&r->sh->got[k], __ATOMIC_ACQUIRE);
        if (g < m)
            m = g;
    }
    return m;
}

/* Redis publisher: reads the PUBLISH replies there are (wait: until every
 * one of `sent` came), each must count every subscriber. */
static void redis_replies(const struct run *r, struct conn *c, uint64_t *replies, uint64_t sent,
                          int wait)
{
    while (*replies < sent) {
        char *l = conn_line_wait(c, 0);
        if (!l) {
            if (wait)
                conn_fill(c);
            else if (!conn_fill_nowait(c))
                return;
            continue;
        }
        long long v = redis_int(l);
        if (v != r->subs)
            die("PUBLISH %llu reached %lld subscribers, not %d", (unsigned long long)*replies, v,
                r->subs);
        (*replies)++;
    }
}

/* The publisher of stream: messages from..to-1, at most `window` ahead
 * of the slowest subscriber. */
static void stream_publish(const struct run *r, struct conn *c, uint8_t *buf, uint64_t from,
                           uint64_t to, uint64_t window, uint64_t *replies)
{
    for (uint64_t i = from; i < to; i++) {
        if (i % ACK_EVERY == 0) {
            while (i - slowest(r) > window) {
                conn_flush(c);
                if (r->proto == P_REDIS)
                    redis_replies(r, c, replies, i, 0);
                struct timespec ts = { 0, 20000 };
                nanosleep(&ts, NULL);
            }
        }
        if (r->size > 0)
            buf[0] = (uint8_t)i;
        if (r->proto == P_NATS) {
            nats_pub(c, "bench.s", NULL, buf, r->size);
        } else {
            size_t before = c->olen;
            redis_publish(c, "bench.s", buf, r->size);
            if (c->olen < before)   /* the buffer went out: read replies */
                redis_replies(r, c, replies, i, 0);
        }
    }
    conn_flush(c);
}

static double stream_parent(const struct run *r)
{
    struct conn c;
    SSL_CTX *ctx;
    uint8_t *buf = xmalloc(r->size + 1);
    uint64_t replies = 0;
    uint64_t per = r->size + (r->proto == P_NATS ? 40 : 60);
    uint64_t window = WINDOW / per;
    if (window < 2 * ACK_EVERY)
        window = 2 * ACK_EVERY;
    peer_open(r, &c, &ctx);
    wait_all(r, r->subs, 'R');
    if (r->warmup > 0) {
        stream_publish(r, &c, buf, 0, r->warmup, window, &replies);
        wait_all(r, r->subs, 'W');
    }
    double t0 = now_s();
    stream_publish(r, &c, buf, r->warmup, r->warmup + r->n, window, &replies);
    wait_all(r, r->subs, 'D');
    double secs = now_s() - t0;
    if (r->proto == P_REDIS)
        redis_replies(r, &c, &replies, r->warmup + r->n, 1);
    conn_close(&c);
    if (ctx)
        SSL_CTX_free(ctx);
    free(buf);
    return secs;
}

/* The responder of pingpong: answers warmup + n requests with empty
 * messages. */
static void pingpong_child(const struct run *r)
{
    struct conn c, pub;
    SSL_CTX *ctx, *ctx2 = NULL;
    char subj[128], reply[128];
    peer_open(r, &c, &ctx);
    if (r->proto == P_NATS) {
        nats_sub(&c, "bench.req");
    } else {
        redis_subscribe(&c, "bench.ping");
        peer_open(r, &pub, &ctx2);
    }
    pipe_signal(r->ctl[0][1], 'R');
    for (uint64_t i = 0; i < r->warmup + r->n; i++) {
        size_t len;
        if (r->proto == P_NATS) {
            const uint8_t *p = nats_msg(&c, subj, reply, sizeof subj, &len);
            check_msg(p, len, r->size, i);
            if (!reply[0])
                die("request %llu without a reply subject", (unsigned long long)i);
            nats_pub(&c, reply, NULL, (const uint8_t *)"", 0);
            conn_flush(&c);
        } else {
            const uint8_t *p = redis_message(&c, &len);
            check_msg(p, len, r->size, i);
            redis_publish(&pub, "bench.pong", (const uint8_t *)"", 0);
            conn_flush(&pub);
            if (redis_int(conn_line(&pub)) != 1)
                die("pong %llu reached no subscriber", (unsigned long long)i);
        }
    }
    if (r->proto == P_REDIS)
        conn_close(&pub);
    conn_close(&c);
    if (ctx)
        SSL_CTX_free(ctx);
    if (ctx2)
        SSL_CTX_free(ctx2);
}

/* The requester of pingpong: warmup untimed round trips, then n timed
 * ones, each in samples (from xmalloc, the caller's). */
static double pingpong_parent(const struct run *r, double **samples)
{
    struct conn c, sub;
    SSL_CTX *ctx, *ctx2 = NULL;
    char subj[128], reply[128], inbox[96], want[128];
    uint8_t *buf = xmalloc(r->size + 1);
    *samples = xmalloc(r->n * sizeof(double));
    peer_open(r, &c, &ctx);
    snprintf(inbox, sizeof inbox, "_INBOX.%ld", (long)getpid());
    if (r->proto == P_NATS) {
        snprintf(want, sizeof want, "%s.*", inbox);
        nats_sub(&c, want);
    } else {
        peer_open(r, &sub, &ctx2);
        redis_subscribe(&sub, "bench.pong");
    }
    wait_all(r, 1, 'R');
    double t0 = 0;
    for (uint64_t i = 0; i < r->warmup + r->n; i++) {
        if (i == r->warmup)
            t0 = now_s();
        double a = now_s();
        if (r->size > 0)
            buf[0] = (uint8_t)i;
        size_t len;
        if (r->proto == P_NATS) {
            snprintf(want, sizeof want, "%s.%llu", inbox, (unsigned long long)i);
            nats_pub(&c, "bench.req", want, buf, r->size);
            conn_flush(&c);
            nats_msg(&c, subj, reply, sizeof subj, &len);
            if (strcmp(subj, want) != 0 || len != 0)
                die("reply %llu: subject %s, %zu bytes", (unsigned long long)i, subj, len);
        } else {
            redis_publish(&c, "bench.ping", buf, r->size);
            conn_flush(&c);
            redis_message(&sub, &len);
            if (len != 0)
                die("pong %llu: %zu bytes", (unsigned long long)i, len);
            if (redis_int(conn_line(&c)) != 1)
                die("ping %llu reached no subscriber", (unsigned long long)i);
        }
        if (i >= r->warmup)
            (*samples)[i - r->warmup] = now_s() - a;
    }
    double secs = now_s() - t0;
    if (r->proto == P_REDIS)
        conn_close(&sub);
    conn_close(&c);
    if (ctx)
        SSL_CTX_free(ctx);
    if (ctx2)
        SSL_CTX_free(ctx2);
    free(buf);
    return secs;
}

/* The peer process: stream subscribers 1..subs-1 forked (each dies with
 * this process), subscriber 0 here, then every one reaped; exits 1 if one
 * failed.  pingpong: the responder. */
static void peer_main(struct run *r)
{
    if (r->w == W_PINGPONG) {
        pingpong_child(r);
        _exit(0);
    }
    pid_t pids[MAX_SUBS];
    pid_t me = getpid();
    for (int k = 1; k < r->subs; k++) {
        fflush(NULL);
        pids[k] = fork();
        if (pids[k] < 0)
            die("fork: %s", strerror(errno));
        if (pids[k] == 0) {
            if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != me)
                die("peer gone or prctl failed");
            for (int j = 0; j < r->subs; j++)
                if (j != k)
                    close(r->ctl[j][1]);
            stream_sub(r, k);
            _exit(0);
        }
        close(r->ctl[k][1]);
    }
    stream_sub(r, 0);
    int failed = 0;
    for (int k = 1; k < r->subs; k++) {
        int st;
        if (waitpid(pids[k], &st, 0) != pids[k] || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
            failed = 1;
    }
    _exit(failed);
}

static void usage(void)
{
    fprintf(stderr, "usage: " PROG " nats|redis PORT [--tls CAFILE] [--subs S] [--warmup K]"
                    " stream|pingpong SIZE N\n");
    exit(2);
}

int main(int argc, char **argv)
{
    struct run r;
    memset(&r, 0, sizeof r);
    r.subs = 1;
    if (argc < 3)
        usage();
    if (strcmp(argv[1], "nats") == 0)
        r.proto = P_NATS;
    else if (strcmp(argv[1], "redis") == 0)
        r.proto = P_REDIS;
    else
        usage();
    uint64_t port = parse_u64(argv[2]);
    if (port < 1 || port > 65535)
        usage();
    r.port = (int)port;
    /* our options, then the harness's ([--warmup K] WORKLOAD SIZE N) */
    int ai = 3;
    while (ai + 1 < argc && (strcmp(argv[ai], "--tls") == 0 || strcmp(argv[ai], "--subs") == 0)) {
        if (strcmp(argv[ai], "--tls") == 0)
            r.ca = argv[ai + 1];
        else
            r.subs = (int)parse_u64(argv[ai + 1]);
        ai += 2;
    }
    if (r.subs < 1 || r.subs > MAX_SUBS || (r.ca && r.proto != P_NATS))
        usage();
    static const char *const names[] = { "stream", "pingpong", NULL };
    static const uint64_t def_warmup[] = { 10000, 1000 };
    struct bench_args a;
    argv[ai - 1] = argv[0];
    parse_args(argc - (ai - 1), argv + (ai - 1), names, def_warmup, 0, MAX_SIZE, &a);
    r.w = (enum workload)a.workload;
    if (r.w == W_PINGPONG && r.subs != 1)
        usage();
    r.size = (size_t)a.size;
    r.n = a.n;
    r.warmup = a.warmup;
    if (r.w == W_STREAM && r.size < 1)
        usage();   /* the sequence byte */

    setup_signals();
    r.sh = mmap(NULL, sizeof *r.sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (r.sh == MAP_FAILED)
        die("mmap: %s", strerror(errno));
    memset((void *)r.sh, 0, sizeof *r.sh);
    int nctl = r.w == W_STREAM ? r.subs : 1;
    for (int k = 0; k < nctl; k++)
        if (pipe(r.ctl[k]) < 0)
            die("pipe: %s", strerror(errno));

    pid_t pid = fork_peer();
    if (pid == 0) {
        for (int k = 0; k < nctl; k++)
            close(r.ctl[k][0]);
        peer_main(&r);   /* does not return */
    }
    child_pid = pid;
    for (int k = 0; k < nctl; k++)
        close(r.ctl[k][1]);

    double secs, *samples = NULL;
    if (r.w == W_STREAM)
        secs = stream_parent(&r);
    else
        secs = pingpong_parent(&r, &samples);
    if (reap_child())
        return 1;
    const char *impl = r.proto == P_REDIS ? "redis" : r.ca ? "nats_tls" : "nats";
    print_result(impl, names[a.workload], r.size, r.n, r.warmup, secs);
    printf(",\"subs\":%d", r.subs);
    return print_result_end(samples, r.n);
}
