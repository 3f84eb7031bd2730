/*
 * bench/baseline_zmq.c -- ZeroMQ (libzmq) baseline for the lecho benchmark
 * suite.  Same argv interface and JSON output as bench/baseline_tcp.c, with
 * "impl":"zmq".
 *
 * What it measures
 *   libzmq used the idiomatic way for each pattern, over tcp://127.0.0.1.
 *   The process forks first (no ZeroMQ context exists before the fork; a
 *   context must never cross a fork) and each side then creates its own
 *   context (1 I/O thread, the default).  The parent binds
 *   "tcp://127.0.0.1:*", reads the OS-chosen port back with
 *   ZMQ_LAST_ENDPOINT and passes the endpoint string to the child through
 *   a pipe; the child connects.  A second pipe (child -> parent) carries
 *   one-byte control signals (ready / warmup done / all received).  libzmq
 *   sets TCP_NODELAY on its TCP sockets itself; kernel socket buffers are
 *   left at the OS defaults, as in the TCP baseline.  ZMQ_LINGER is 5 s;
 *   at the end only the child's REP keeps it (its last reply must go out),
 *   every other socket closes with linger 0: all data has been
 *   acknowledged by then, and a SUB/PULL would otherwise sit out the whole
 *   linger re-sending its subscription to the parent's closed listener.
 *
 * Framing / batching
 *   ZeroMQ does its own framing (ZMTP: 2- or 9-byte frame header) and its
 *   own batching: zmq_send() only queues a message to the I/O thread, which
 *   packs queued messages into an 8 KiB encoder buffer per write (large
 *   messages are written from the message itself).  Every message carries
 *   the low 8 bits of its sequence number in its first byte and the
 *   receiver checks it and the length, as in the TCP baseline.
 *
 * Workloads (argv: [--curve] [--warmup K] [--hwm H] WORKLOAD SIZE N)
 *   pingpong SIZE N   REQ (parent, bind) / REP (child, connect).  The parent
 *                     zmq_send()s SIZE bytes, the child replies with an
 *                     empty message; each round trip is timed, reports the
 *                     mean (us_per_op) and p50/p99 of the sorted samples.
 *   stream SIZE N     Publish/subscribe: XPUB (parent, bind) / SUB (child,
 *                     connect, subscribed to "").  Nothing may be dropped,
 *                     so the publisher is an XPUB with ZMQ_XPUB_NODROP=1
 *                     and ZMQ_SNDHWM = ZMQ_RCVHWM = H (default 1000,
 *                     libzmq's default): at the HWM zmq_send blocks instead
 *                     of dropping -- the same back-pressure a full TCP
 *                     socket buffer gives the TCP baseline.  (A plain PUB
 *                     can only be made lossless with HWM 0 = unlimited
 *                     queue; measured here that lets the publisher queue
 *                     hundreds of MB and was 1.3-1.7x slower and much
 *                     noisier; --hwm 0 reproduces that configuration, as
 *                     XPUB with an unlimited HWM behaves like PUB.  XPUB
 *                     is wire-identical to PUB; the SUB side is plain.)
 *                     Slow-joiner handshake: the parent publishes
 *                     "hello" messages of SIZE+1 bytes
 *                     every 1 ms until the child reports on the pipe that
 *                     it has received one; hellos still in flight are
 *                     recognised by their length and discarded.  Then K
 *                     warmup messages, the child signals on the pipe, the
 *                     clock starts, N messages, the child signals receipt
 *                     of all N, the clock stops.  The receiver uses
 *                     zmq_msg_recv (no copy out of the message).
 *   dealer SIZE N     Requests and responses with F outstanding (--inflight
 *                     F, default 1): DEALER (parent, bind) / ROUTER (child,
 *                     connect).  The parent sends F messages of SIZE bytes,
 *                     then one more per reply until N (+ warmup); the child
 *                     answers each [identity][request] with [identity][""].
 *                     Reports calls per second (ops_per_s) and the mean
 *                     time per call, timed from the warmup's last reply.
 *   bulk CHUNK N      PUSH (parent, bind) / PULL (child, connect): N
 *                     messages of CHUNK bytes, each zmq_send() from one
 *                     buffer (libzmq copies it into the message), received
 *                     with zmq_msg_recv.  SNDHWM = RCVHWM = H messages
 *                     (default 2) to bound memory; PUSH blocks at the HWM,
 *                     never drops.  (Measured: HWM 1-2 about 10-20% faster
 *                     than 4, and 1000 -- queueing every 10 MiB chunk --
 *                     clearly slower.)  Same warmup / end handshake.
 *
 * CURVE (--curve, first argument): every socket pair is encrypted and
 *   authenticated with ZeroMQ's CURVE (CurveZMQ: Curve25519 keys,
 *   XSalsa20-Poly1305 per message): the parent's socket is the CURVE
 *   server, the child's the client; both keypairs are made with
 *   zmq_curve_keypair before the fork.  "impl" is then "zmq_curve": what
 *   make bench sets against lecho's keyed mode.
 *
 * Warmup: default pingpong 1000, stream 10000, bulk 2, each capped at N/10;
 * --warmup K overrides.
 *
 * Output: ONE line of JSON on stdout, fields as in baseline_tcp.c:
 *   seconds = timed part only; us_per_op = seconds*1e6/n; ops_per_s =
 *   n/seconds; mb_per_s = n*SIZE payload bytes / 1e6 / seconds;
 *   p50_us/p99_us for pingpong only; "hwm" for stream and bulk.
 *
 * Failure handling
 *   Both processes call alarm(60).  If the child fails (exit status != 0
 *   or signal) the parent prints a message and exits 1; the child is always
 *   reaped (SIGCHLD handler, or kill + waitpid on the parent's error paths);
 *   the child dies with the parent (PR_SET_PDEATHSIG).
 *
 * Build:
 *   gcc -O2 -g -Wall -Wextra -Werror -std=gnu99 -o bench/baseline_zmq \
 *       bench/baseline_zmq.c -lzmq
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#define PROG "baseline_zmq"
#define ALARM_SECONDS 60
#define LINGER_MS 5000
#define STREAM_HWM 1000   /* default --hwm for stream (libzmq's default) */
#define BULK_HWM 2        /* default --hwm for bulk */
#define MAX_SIZE (1u << 30)

#include "harness.h"

/* ---------------------------------------------------------------------- */
/* Control pipe helpers                                                   */
/* ---------------------------------------------------------------------- */

/* Write one control byte c to pipe fd; dies on error. */
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

/* Block until control byte `want` arrives on pipe fd; dies on EOF (peer
 * gone), error, or any other byte. */
static void pipe_wait(int fd, char want)
{
    char c;
    for (;;) {
        ssize_t r = read(fd, &c, 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            die("control pipe read: %s", strerror(errno));
        if (r == 0)
            die("peer closed the control pipe unexpectedly");
        break;
    }
    if (c != want)
        die("control pipe: got '%c', expected '%c'", c, want);
}

/* ---------------------------------------------------------------------- */
/* libzmq helpers                                                         */
/* ---------------------------------------------------------------------- */

static void set_int(void *sock, int opt, int v, const char *name)
{
    if (zmq_setsockopt(sock, opt, &v, sizeof v) != 0)
        die("zmq_setsockopt(%s): %s", name, zmq_strerror(zmq_errno()));
}

/* Create a socket of type type with linger LINGER_MS and, if hwm >= 0,
 * send and receive high-water marks hwm (0 = unlimited). */
static void *make_socket(void *ctx, int type, int hwm)
{
    void *s = zmq_socket(ctx, type);
    if (!s)
        die("zmq_socket: %s", zmq_strerror(zmq_errno()));
    set_int(s, ZMQ_LINGER, LINGER_MS, "ZMQ_LINGER");
    if (hwm >= 0) {
        set_int(s, ZMQ_SNDHWM, hwm, "ZMQ_SNDHWM");
        set_int(s, ZMQ_RCVHWM, hwm, "ZMQ_RCVHWM");
    }
    return s;
}

/* Close socket s after setting its linger to linger_ms. */
static void close_socket(void *s, int linger_ms)
{
    set_int(s, ZMQ_LINGER, linger_ms, "ZMQ_LINGER");
    zmq_close(s);
}

/* zmq_send all len bytes of buf as one message, retrying on EINTR. */
static void zsend(void *s, const void *buf, size_t len)
{
    while (zmq_send(s, buf, len, 0) < 0) {
        if (zmq_errno() == EINTR)
            continue;
        die("zmq_send: %s", zmq_strerror(zmq_errno()));
    }
}

/* Receive one message into msg (already initialised), retrying on EINTR.
 * Returns its size. */
static size_t zrecv(void *s, zmq_msg_t *msg)
{
    int r;
    while ((r = zmq_msg_recv(msg, s, 0)) < 0) {
        if (zmq_errno() == EINTR)
            continue;
        die("zmq_msg_recv: %s", zmq_strerror(zmq_errno()));
    }
    return (size_t)r;
}

/* Receive one message and check it has length size and sequence byte seq. */
static void zrecv_expect(void *s, zmq_msg_t *msg, size_t size, uint64_t seq)
{
    size_t len = zrecv(s, msg);
    if (len != size)
        die("message %llu: length %zu, expected %zu",
            (unsigned long long)seq, len, size);
    if (size > 0 && ((const uint8_t *)zmq_msg_data(msg))[0] != (uint8_t)seq)
        die("message %llu: bad sequence byte", (unsigned long long)seq);
}

/* ---------------------------------------------------------------------- */
/* Workloads                                                              */
/* ---------------------------------------------------------------------- */

enum workload { W_PINGPONG, W_STREAM, W_BULK, W_DEALER };

struct result {
    double seconds;
    double *samples;   /* pingpong: per-round-trip seconds, else NULL */
};

struct run {
    enum workload w;
    size_t size;
    uint64_t warmup, n;
    int hwm;              /* SNDHWM/RCVHWM, -1 = libzmq default */
    uint64_t inflight;    /* dealer: requests outstanding at once */
    int ctl_in, ctl_out;  /* pipe ends: parent reads ctl_in, child writes */
    int curve;            /* --curve: CURVE keys, server (parent) and client (child) */
    char server_pub[41], server_sec[41], client_pub[41], client_sec[41];
};

/* --curve: a CURVE option (a Z85 key, 40 characters) on socket s. */
static void set_key(void *s, int opt, const char *key, const char *name)
{
    if (zmq_setsockopt(s, opt, key, 40) != 0)
        die("zmq_setsockopt(%s): %s", name, zmq_strerror(zmq_errno()));
}

/* Socket types for workload w: parent's type, child's type.  Stream uses
 * XPUB (a PUB that can refuse to drop, see the header comment). */
static void pattern(enum workload w, int *ptype, int *ctype)
{
    *ptype = *ctype = -1;
    switch (w) {
    case W_PINGPONG: *ptype = ZMQ_REQ; *ctype = ZMQ_REP; break;
    case W_STREAM: *ptype = ZMQ_XPUB; *ctype = ZMQ_SUB; break;
    case W_BULK: *ptype = ZMQ_PUSH; *ctype = ZMQ_PULL; break;
    case W_DEALER: *ptype = ZMQ_DEALER; *ctype = ZMQ_ROUTER; break;
    }
}

/* Parent side of pingpong (REQ): warmup untimed round trips, then n timed
 * ones, each recorded in res->samples. */
static void pingpong_parent(void *s, const struct run *r, struct result *res)
{
    uint8_t *buf = xmalloc(r->size);
    char reply[8];
    res->samples = xmalloc(r->n * sizeof(double));
    double t0 = 0;
    for (uint64_t i = 0; i < r->warmup + r->n; i++) {
        if (i == r->warmup)
            t0 = now_s();
        double a = now_s();
        if (r->size > 0)
            buf[0] = (uint8_t)i;
        zsend(s, buf, r->size);
        int got;
        while ((got = zmq_recv(s, reply, sizeof reply, 0)) < 0) {
            if (zmq_errno() == EINTR)
                continue;
            die("zmq_recv: %s", zmq_strerror(zmq_errno()));
        }
        if (got != 0)
            die("bad pingpong reply (%d bytes)", got);
        if (i >= r->warmup)
            res->samples[i - r->warmup] = now_s() - a;
    }
    res->seconds = now_s() - t0;
    free(buf);
}

/* Child side of pingpong (REP): answer warmup+n requests with empty
 * messages. */
static void pingpong_child(void *s, const struct run *r)
{
    zmq_msg_t msg;
    zmq_msg_init(&msg);
    for (uint64_t i = 0; i < r->warmup + r->n; i++) {
        zrecv_expect(s, &msg, r->size, i);
        zsend(s, "", 0);
    }
    zmq_msg_close(&msg);
}

/* Parent side of dealer (DEALER): r->inflight requests outstanding,
 * warmup + n in all; the clock runs from the warmup's last reply. */
static void dealer_parent(void *s, const struct run *r, struct result *res)
{
    uint8_t *buf = xmalloc(r->size ? r->size : 1);
    char reply[8];
    uint64_t total = r->warmup + r->n, sent = 0, got = 0;
    double t0 = now_s();
    while (sent < total && sent - got < r->inflight) {
        if (r->size > 0)
            buf[0] = (uint8_t)sent;
        zsend(s, buf, r->size);
        sent++;
    }
    while (got < total) {
        int n;
        while ((n = zmq_recv(s, reply, sizeof reply, 0)) < 0) {
            if (zmq_errno() == EINTR)
                continue;
            die("zmq_recv: %s", zmq_strerror(zmq_errno()));
        }
        if (n != 0)
            die("bad dealer reply (%d bytes)", n);
        got++;
        if (got == r->warmup)
            t0 = now_s();
        if (sent < total) {
            if (r->size > 0)
                buf[0] = (uint8_t)sent;
            zsend(s, buf, r->size);
            sent++;
        }
    }
    res->seconds = now_s() - t0;
    free(buf);
}

/* Child side of dealer (ROUTER): answers warmup + n requests, each
 * [identity][request], with [identity][""]. */
static void dealer_child(void *s, const struct run *r)
{
    zmq_msg_t id, msg;
    zmq_msg_init(&id);
    zmq_msg_init(&msg);
    for (uint64_t i = 0; i < r->warmup + r->n; i++) {
        zrecv(s, &id);
        if (!zmq_msg_more(&id))
            die("request %llu without a body", (unsigned long long)i);
        zrecv_expect(s, &msg, r->size, i);
        while (zmq_msg_send(&id, s, ZMQ_SNDMORE) < 0) {
            if (zmq_errno() == EINTR)
                continue;
            die("zmq_msg_send: %s", zmq_strerror(zmq_errno()));
        }
        zsend(s, "", 0);
    }
    zmq_msg_close(&id);
    zmq_msg_close(&msg);
}

/* Send messages seq0..seq0+count-1 of size bytes from buf. */
static void send_seq(void *s, uint8_t *buf, size_t size, uint64_t seq0,
                     uint64_t count)
{
    for (uint64_t q = seq0; q < seq0 + count; q++) {
        if (size > 0)
            buf[0] = (uint8_t)q;
        zsend(s, buf, size);
    }
}

/* The parent's warmup, then the timed run: the clock stops when the child
 * reports (on the control pipe) that it received all n messages. */
static void send_phases(void *s, uint8_t *buf, const struct run *r, struct result *res)
{
    if (r->warmup > 0) {
        send_seq(s, buf, r->size, 0, r->warmup);
        pipe_wait(r->ctl_in, 'W');
    }
    double t0 = now_s();
    send_seq(s, buf, r->size, r->warmup, r->n);
    pipe_wait(r->ctl_in, 'D');
    res->seconds = now_s() - t0;
}

/* Parent side of stream (PUB): slow-joiner handshake, warmup, timed run.
 * The clock stops when the child reports receipt of all n messages. */
static void stream_parent(void *s, const struct run *r, struct result *res)
{
    uint8_t *buf = xmalloc(r->size + 1);
    /* Publish hellos (size+1 bytes) every 1 ms until the child says 'R'. */
    for (;;) {
        zsend(s, buf, r->size + 1);
        struct pollfd p = { .fd = r->ctl_in, .events = POLLIN };
        int k = poll(&p, 1, 1);
        if (k < 0 && errno != EINTR)
            die("poll: %s", strerror(errno));
        if (k > 0)
            break;
    }
    pipe_wait(r->ctl_in, 'R');
    send_phases(s, buf, r, res);
    free(buf);
}

/* Child side of stream (SUB): report the first hello, discard hellos,
 * then count warmup and timed messages, signalling after each phase. */
static void stream_child(void *s, const struct run *r)
{
    zmq_msg_t msg;
    zmq_msg_init(&msg);
    zrecv(s, &msg);
    pipe_signal(r->ctl_out, 'R');
    uint64_t total = r->warmup + r->n;
    for (uint64_t i = 0; i < total;) {
        size_t len = zrecv(s, &msg);
        if (i == 0 && len == r->size + 1)
            continue;   /* leftover hello */
        if (len != r->size)
            die("message %llu: length %zu, expected %zu",
                (unsigned long long)i, len, r->size);
        if (r->size > 0 &&
            ((const uint8_t *)zmq_msg_data(&msg))[0] != (uint8_t)i)
            die("message %llu: bad sequence byte", (unsigned long long)i);
        i++;
        if (i == r->warmup)
            pipe_signal(r->ctl_out, 'W');
    }
    pipe_signal(r->ctl_out, 'D');
    zmq_msg_close(&msg);
}

/* Parent side of bulk (PUSH): warmup chunks, then n timed chunks; the
 * clock stops when the child reports receipt of all n. */
static void bulk_parent(void *s, const struct run *r, struct result *res)
{
    uint8_t *buf = xmalloc(r->size);
    send_phases(s, buf, r, res);
    free(buf);
}

/* Child side of bulk (PULL). */
static void bulk_child(void *s, const struct run *r)
{
    zmq_msg_t msg;
    zmq_msg_init(&msg);
    for (uint64_t i = 0; i < r->warmup; i++)
        zrecv_expect(s, &msg, r->size, i);
    if (r->warmup > 0)
        pipe_signal(r->ctl_out, 'W');
    for (uint64_t i = r->warmup; i < r->warmup + r->n; i++)
        zrecv_expect(s, &msg, r->size, i);
    pipe_signal(r->ctl_out, 'D');
    zmq_msg_close(&msg);
}

/* Child process: read the endpoint from ep_fd, connect, run its side of
 * the workload, close cleanly (linger flushes a final REP reply), exit. */
static void child_main(const struct run *r, int ep_fd)
{
    char ep[256];
    size_t got = 0;
    for (;;) {
        if (got == sizeof ep)
            die("endpoint too long");
        ssize_t k = read(ep_fd, ep + got, 1);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            die("endpoint pipe read: %s", strerror(errno));
        if (k == 0)
            die("parent closed the endpoint pipe before sending it");
        if (ep[got] == '\n') {
            ep[got] = '\0';
            break;
        }
        got++;
    }
    close(ep_fd);

    int ptype, ctype;
    pattern(r->w, &ptype, &ctype);
    void *ctx = zmq_ctx_new();
    if (!ctx)
        die("zmq_ctx_new: %s", zmq_strerror(zmq_errno()));
    void *s = make_socket(ctx, ctype, r->hwm);
    if (r->curve) {
        set_key(s, ZMQ_CURVE_SERVERKEY, r->server_pub, "ZMQ_CURVE_SERVERKEY");
        set_key(s, ZMQ_CURVE_PUBLICKEY, r->client_pub, "ZMQ_CURVE_PUBLICKEY");
        set_key(s, ZMQ_CURVE_SECRETKEY, r->client_sec, "ZMQ_CURVE_SECRETKEY");
    }
    if (ctype == ZMQ_SUB && zmq_setsockopt(s, ZMQ_SUBSCRIBE, "", 0) != 0)
        die("zmq_setsockopt(ZMQ_SUBSCRIBE): %s", zmq_strerror(zmq_errno()));
    if (zmq_connect(s, ep) != 0)
        die("zmq_connect(%s): %s", ep, zmq_strerror(zmq_errno()));
    switch (r->w) {
    case W_PINGPONG: pingpong_child(s, r); break;
    case W_STREAM: stream_child(s, r); break;
    case W_BULK: bulk_child(s, r); break;
    case W_DEALER: dealer_child(s, r); break;
    }
    /* Only REP has something left to deliver (its last reply); a SUB or
     * PULL socket would otherwise hold termination for the full linger
     * re-sending its subscription to the parent's closed listener. */
    close_socket(s, ctype == ZMQ_REP || ctype == ZMQ_ROUTER ? LINGER_MS : 0);
    while (zmq_ctx_term(ctx) != 0 && zmq_errno() == EINTR)
        ;
    _exit(0);
}

/* ---------------------------------------------------------------------- */
/* Main                                                                   */
/* ---------------------------------------------------------------------- */

static void usage(void)
{
    fprintf(stderr,
            "usage: " PROG " [--curve] [--warmup K] [--hwm H] [--inflight F]"
            " pingpong|stream|bulk|dealer SIZE N\n");
    exit(2);
}

int main(int argc, char **argv)
{
    static const char *const names[] = {"pingpong", "stream", "bulk", "dealer", NULL};
    static const uint64_t def_warmup[] = {1000, 10000, 2, 1000};
    struct bench_args a;
    struct run r;
    memset(&r, 0, sizeof r);
    if (argc > 1 && strcmp(argv[1], "--curve") == 0) {
        r.curve = 1;
        argv[1] = argv[0];
        argv++;
        argc--;
        if (!zmq_has("curve"))
            die("this libzmq has no CURVE");
        if (zmq_curve_keypair(r.server_pub, r.server_sec) != 0 ||
            zmq_curve_keypair(r.client_pub, r.client_sec) != 0)
            die("zmq_curve_keypair: %s", zmq_strerror(zmq_errno()));
    }
    parse_args(argc, argv, names, def_warmup, 1, MAX_SIZE, &a);
    r.w = (enum workload)a.workload;
    const char *wname = names[a.workload];
    r.n = a.n;
    r.size = (size_t)a.size;
    r.warmup = a.warmup;
    r.inflight = a.inflight;
    r.hwm = r.w == W_STREAM ? STREAM_HWM : r.w == W_BULK ? BULK_HWM : -1;
    if (a.hwm >= 0)
        r.hwm = (int)a.hwm;

    setup_signals();

    int ep_pipe[2], ctl_pipe[2];
    if (pipe(ep_pipe) < 0 || pipe(ctl_pipe) < 0)
        die("pipe: %s", strerror(errno));

    pid_t pid = fork_peer();
    if (pid == 0) {
        close(ep_pipe[1]);
        close(ctl_pipe[0]);
        r.ctl_in = -1;
        r.ctl_out = ctl_pipe[1];
        child_main(&r, ep_pipe[0]);   /* does not return */
    }
    child_pid = pid;
    close(ep_pipe[0]);
    close(ctl_pipe[1]);
    r.ctl_in = ctl_pipe[0];
    r.ctl_out = -1;

    int ptype, ctype;
    pattern(r.w, &ptype, &ctype);
    void *ctx = zmq_ctx_new();
    if (!ctx)
        die("zmq_ctx_new: %s", zmq_strerror(zmq_errno()));
    void *s = make_socket(ctx, ptype, r.hwm);
    if (ptype == ZMQ_XPUB)
        set_int(s, ZMQ_XPUB_NODROP, 1, "ZMQ_XPUB_NODROP");
    if (r.curve) {
        set_int(s, ZMQ_CURVE_SERVER, 1, "ZMQ_CURVE_SERVER");
        set_key(s, ZMQ_CURVE_SECRETKEY, r.server_sec, "ZMQ_CURVE_SECRETKEY");
    }
    if (zmq_bind(s, "tcp://127.0.0.1:*") != 0)
        die("zmq_bind: %s", zmq_strerror(zmq_errno()));
    char ep[256];
    size_t eplen = sizeof ep - 1;
    if (zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, ep, &eplen) != 0)
        die("zmq_getsockopt(ZMQ_LAST_ENDPOINT): %s",
            zmq_strerror(zmq_errno()));
    ep[eplen] = '\0';
    size_t l = strlen(ep);
    ep[l] = '\n';
    if (write(ep_pipe[1], ep, l + 1) != (ssize_t)(l + 1))
        die("endpoint pipe write: %s", strerror(errno));
    close(ep_pipe[1]);

    struct result res = { 0, NULL };
    switch (r.w) {
    case W_PINGPONG: pingpong_parent(s, &r, &res); break;
    case W_STREAM: stream_parent(s, &r, &res); break;
    case W_BULK: bulk_parent(s, &r, &res); break;
    case W_DEALER: dealer_parent(s, &r, &res); break;
    }
    /* Everything sent has been acknowledged by the child by now. */
    close_socket(s, 0);
    while (zmq_ctx_term(ctx) != 0 && zmq_errno() == EINTR)
        ;

    if (reap_child())
        return 1;

    print_result(r.curve ? "zmq_curve" : "zmq", wname, r.size, r.n, r.warmup, res.seconds);
    if (r.hwm >= 0)
        printf(",\"hwm\":%d", r.hwm);
    if (r.w == W_DEALER)
        printf(",\"inflight\":%llu", (unsigned long long)r.inflight);
    return print_result_end(res.samples, r.n);
}
