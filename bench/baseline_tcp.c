/*
 * bench/baseline_tcp.c -- raw TCP baseline for the lecho benchmark suite.
 *
 * What it measures
 *   The "physical limit" of loopback TCP on this machine, done the way a
 *   careful hand-written middleware would do it, so that lecho and ZeroMQ
 *   (bench/baseline_zmq.c) can be compared against it.  One process forks
 *   its peer: the parent binds a listening socket on 127.0.0.1 port 0 (the
 *   OS picks the port), forks, the child accepts (server role) and the
 *   parent connects (client / sender role).  Both sockets use TCP_NODELAY;
 *   kernel socket buffer sizes are left at the OS defaults (autotuning).
 *
 * Framing
 *   Every message is a frame: 4-byte big-endian length, then that many
 *   payload bytes.  The first payload byte carries the low 8 bits of the
 *   frame's sequence number and the receiver checks it (and the length),
 *   so a benchmark that loses or reorders data fails instead of reporting.
 *
 * Workloads (argv: [--warmup K] WORKLOAD SIZE N)
 *   pingpong SIZE N   Client writes one frame of SIZE payload bytes (header
 *                     and payload in one write), server reads it through a
 *                     buffered frame reader and replies with an empty frame
 *                     (4-byte length 0); client reads the 4 bytes.  Each
 *                     round trip is timed individually; reports the mean
 *                     (us_per_op) and p50/p99 of the sorted samples.
 *   stream SIZE N     One-way frames.  The sender copies frames into a
 *                     64 KiB user buffer and write()s it when the next frame
 *                     would not fit (frames larger than the buffer are
 *                     written with one writev of header + payload after a
 *                     flush).  The receiver read()s into a >=256 KiB buffer
 *                     and parses frames in place (no payload copy).  After
 *                     the last frame the receiver writes one byte back; the
 *                     sender stops the clock when that byte arrives, so the
 *                     time covers full delivery.  Reports frames/s and MB/s.
 *   reqrep SIZE N     Requests and responses with F requests outstanding
 *                     (--inflight F, default 1): the client writes F
 *                     frames of SIZE bytes, then one more per reply until
 *                     N (+ warmup) were sent; the server answers each with
 *                     an empty frame.  Both sides batch as a careful
 *                     server would: the frames for what one read() brought
 *                     go out in one write().  Reports calls per second
 *                     (ops_per_s) and the mean time per call (us_per_op),
 *                     timed from the warmup's last reply to the last one.
 *   bulk CHUNK N      N chunks of CHUNK bytes, each as one writev of the
 *                     4-byte header + the chunk straight from the buffer (no
 *                     copy, kernel takes it in large pieces).  The receiver
 *                     reads the header, then read()s the chunk straight into
 *                     a CHUNK-byte buffer.  Same one-byte end handshake.
 *
 * Warmup
 *   K untimed operations run first (default: pingpong 1000, stream 10000,
 *   bulk 2, each capped at N/10; --warmup K overrides).  For stream/bulk
 *   the receiver acknowledges the end of the warmup with one byte, and the
 *   timed run starts only after that byte arrives, so the warmup never
 *   overlaps the measurement.
 *
 * Output: ONE line of JSON on stdout, e.g.
 *   {"impl":"tcp","workload":"pingpong","size":400,"n":20000,"warmup":1000,
 *    "seconds":..,"us_per_op":..,"ops_per_s":..,"mb_per_s":..,
 *    "p50_us":..,"p99_us":..}
 *   seconds = timed part only; us_per_op = seconds*1e6/n; ops_per_s =
 *   n/seconds; mb_per_s = n*SIZE payload bytes (one direction, headers not
 *   counted) / 1e6 / seconds.  p50_us/p99_us appear for pingpong only.
 *
 * Failure handling
 *   Both processes call alarm(60).  If the child fails (exit status != 0
 *   or signal) the parent prints a message and exits 1; the child is always
 *   reaped (SIGCHLD handler, or kill + waitpid on the parent's error paths);
 *   the child dies with the parent (PR_SET_PDEATHSIG).
 *
 * Build:
 *   gcc -O2 -g -Wall -Wextra -Werror -std=gnu99 -o bench/baseline_tcp \
 *       bench/baseline_tcp.c
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PROG "baseline_tcp"
#define ALARM_SECONDS 60
#define BATCH_CAP (64 * 1024)     /* stream sender's user buffer */
#ifndef RX_MIN_CAP
#define RX_MIN_CAP (256 * 1024)   /* frame reader's minimum buffer */
#endif
#define MAX_SIZE (1u << 30)       /* largest accepted SIZE/CHUNK */

#include "harness.h"

/* ---------------------------------------------------------------------- */
/* Blocking I/O helpers                                                   */
/* ---------------------------------------------------------------------- */

/* Write all len bytes of p to fd; dies on error. */
static void write_all(int fd, const void *p, size_t len)
{
    const char *c = p;
    while (len > 0) {
        ssize_t r = write(fd, c, len);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            die("write: %s", strerror(errno));
        }
        c += r;
        len -= (size_t)r;
    }
}

/* writev all bytes described by iov[0..cnt) (iov is modified); dies on
 * error. */
static void writev_all(int fd, struct iovec *iov, int cnt)
{
    while (cnt > 0) {
        ssize_t r = writev(fd, iov, cnt);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            die("writev: %s", strerror(errno));
        }
        size_t done = (size_t)r;
        while (cnt > 0 && done >= iov->iov_len) {
            done -= iov->iov_len;
            iov++;
            cnt--;
        }
        if (cnt > 0) {
            iov->iov_base = (char *)iov->iov_base + done;
            iov->iov_len -= done;
        }
    }
}

/* Read exactly len bytes from fd into p; dies on error or EOF (peer gone). */
static void read_exact(int fd, void *p, size_t len)
{
    char *c = p;
    while (len > 0) {
        ssize_t r = read(fd, c, len);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            die("read: %s", strerror(errno));
        }
        if (r == 0)
            die("peer closed the connection unexpectedly");
        c += r;
        len -= (size_t)r;
    }
}

static void put_be32(uint8_t *p, uint32_t v)
{
    v = htonl(v);
    memcpy(p, &v, 4);
}

static uint32_t get_be32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return ntohl(v);
}

/* ---------------------------------------------------------------------- */
/* Buffered frame reader (receiver side of pingpong and stream)           */
/* ---------------------------------------------------------------------- */

struct rx {
    int fd;
    uint8_t *buf;
    size_t cap, rd, wr;   /* unparsed bytes are buf[rd..wr) */
};

/* Prepare a reader on fd able to hold frames of up to max_payload bytes. */
static void rx_init(struct rx *rx, int fd, size_t max_payload)
{
    rx->fd = fd;
    rx->cap = max_payload + 4 > RX_MIN_CAP ? max_payload + 4 : RX_MIN_CAP;
    rx->buf = xmalloc(rx->cap);
    rx->rd = rx->wr = 0;
}

/* Return the next complete frame: *payload points into the reader's buffer
 * (valid until the next call), *len is its length.  read()s as much as the
 * buffer can take whenever no complete frame is buffered, compacting the
 * partial frame to the front when the tail is too short.  Dies on EOF,
 * read error, or a frame that cannot fit the buffer. */
static void rx_frame(struct rx *rx, const uint8_t **payload, uint32_t *len)
{
    for (;;) {
        size_t avail = rx->wr - rx->rd;
        size_t need = 4;
        if (avail >= 4) {
            uint32_t l = get_be32(rx->buf + rx->rd);
            if ((size_t)l + 4 > rx->cap)
                die("frame of %u bytes exceeds reader buffer", l);
            need = (size_t)l + 4;
            if (avail >= need) {
                *payload = rx->buf + rx->rd + 4;
                *len = l;
                rx->rd += need;
                return;
            }
        }
        if (avail == 0) {
            rx->rd = rx->wr = 0;
        } else if (rx->cap - rx->rd < need) {
            memmove(rx->buf, rx->buf + rx->rd, avail);
            rx->rd = 0;
            rx->wr = avail;
        }
        ssize_t r = read(rx->fd, rx->buf + rx->wr, rx->cap - rx->wr);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            die("read: %s", strerror(errno));
        }
        if (r == 0)
            die("peer closed the connection unexpectedly");
        rx->wr += (size_t)r;
    }
}

/* Get the next frame and check it has length size and sequence byte seq. */
static void rx_expect(struct rx *rx, uint32_t size, uint64_t seq)
{
    const uint8_t *p;
    uint32_t len;
    rx_frame(rx, &p, &len);
    if (len != size)
        die("frame %llu: length %u, expected %u", (unsigned long long)seq,
            len, size);
    if (size > 0 && p[0] != (uint8_t)seq)
        die("frame %llu: bad sequence byte", (unsigned long long)seq);
}

/* ---------------------------------------------------------------------- */
/* Workloads                                                              */
/* ---------------------------------------------------------------------- */

struct result {
    double seconds;
    double *samples;   /* pingpong: per-round-trip seconds, else NULL */
};

/* pingpong server (child): answer warmup+n frames with empty frames. */
static void pingpong_server(int fd, uint32_t size, uint64_t total)
{
    struct rx rx;
    uint8_t reply[4];
    rx_init(&rx, fd, size);
    put_be32(reply, 0);
    for (uint64_t i = 0; i < total; i++) {
        rx_expect(&rx, size, i);
        write_all(fd, reply, 4);
    }
}

/* pingpong client (parent): warmup untimed round trips, then n timed
 * ones, recording each round trip's duration in res->samples. */
static void pingpong_client(int fd, uint32_t size, uint64_t warmup,
                            uint64_t n, struct result *res)
{
    uint8_t *frame = xmalloc((size_t)size + 4);
    uint8_t reply[4];
    put_be32(frame, size);
    res->samples = xmalloc(n * sizeof(double));
    double t0 = 0;
    for (uint64_t i = 0; i < warmup + n; i++) {
        if (i == warmup)
            t0 = now_s();
        double a = now_s();
        if (size > 0)
            frame[4] = (uint8_t)i;
        write_all(fd, frame, (size_t)size + 4);
        read_exact(fd, reply, 4);
        if (get_be32(reply) != 0)
            die("bad pingpong reply");
        if (i >= warmup)
            res->samples[i - warmup] = now_s() - a;
    }
    res->seconds = now_s() - t0;
    free(frame);
}

/* Stream sender state: the 64 KiB batch buffer. */
struct batch {
    uint8_t buf[BATCH_CAP];
    size_t used;
};

static void batch_flush(int fd, struct batch *b)
{
    if (b->used > 0)
        write_all(fd, b->buf, b->used);
    b->used = 0;
}

/* Queue frames seq0..seq0+count-1 (payload from src, sequence byte
 * patched in) into the batch buffer, writing it out whenever the next
 * frame would not fit; frames larger than the buffer go out with writev.
 * Flushes at the end. */
static void stream_send_frames(int fd, struct batch *b, uint8_t *src,
                               uint32_t size, uint64_t seq0, uint64_t count)
{
    size_t flen = (size_t)size + 4;
    for (uint64_t s = seq0; s < seq0 + count; s++) {
        if (size > 0)
            src[0] = (uint8_t)s;
        if (flen > BATCH_CAP) {
            uint8_t hdr[4];
            struct iovec iov[2];
            batch_flush(fd, b);
            put_be32(hdr, size);
            iov[0].iov_base = hdr;
            iov[0].iov_len = 4;
            iov[1].iov_base = src;
            iov[1].iov_len = size;
            writev_all(fd, iov, 2);
            continue;
        }
        if (b->used + flen > BATCH_CAP)
            batch_flush(fd, b);
        put_be32(b->buf + b->used, size);
        memcpy(b->buf + b->used + 4, src, size);
        b->used += flen;
    }
    batch_flush(fd, b);
}

/* Wait for the receiver's one-byte acknowledgement. */
static void wait_ack(int fd)
{
    char c;
    read_exact(fd, &c, 1);
    if (c != 'A')
        die("bad acknowledgement byte");
}

static void send_ack(int fd)
{
    write_all(fd, "A", 1);
}

/* stream sender (parent). */
static void stream_sender(int fd, uint32_t size, uint64_t warmup, uint64_t n,
                          struct result *res)
{
    struct batch *b = xmalloc(sizeof *b);
    uint8_t *src = xmalloc(size);
    b->used = 0;
    if (warmup > 0) {
        stream_send_frames(fd, b, src, size, 0, warmup);
        wait_ack(fd);
    }
    double t0 = now_s();
    stream_send_frames(fd, b, src, size, warmup, n);
    wait_ack(fd);
    res->seconds = now_s() - t0;
    free(src);
    free(b);
}

/* stream receiver (child): parse warmup frames, ack, n frames, ack. */
static void stream_receiver(int fd, uint32_t size, uint64_t warmup,
                            uint64_t n)
{
    struct rx rx;
    rx_init(&rx, fd, size);
    for (uint64_t i = 0; i < warmup; i++)
        rx_expect(&rx, size, i);
    if (warmup > 0)
        send_ack(fd);
    for (uint64_t i = warmup; i < warmup + n; i++)
        rx_expect(&rx, size, i);
    if (rx.wr != rx.rd)
        die("unexpected trailing bytes after the last frame");
    send_ack(fd);
}

/* Send chunks seq0..seq0+count-1, each one writev(header, chunk). */
static void bulk_send_chunks(int fd, uint8_t *chunk, uint32_t size,
                             uint64_t seq0, uint64_t count)
{
    uint8_t hdr[4];
    put_be32(hdr, size);
    for (uint64_t s = seq0; s < seq0 + count; s++) {
        struct iovec iov[2];
        if (size > 0)
            chunk[0] = (uint8_t)s;
        iov[0].iov_base = hdr;
        iov[0].iov_len = 4;
        iov[1].iov_base = chunk;
        iov[1].iov_len = size;
        writev_all(fd, iov, 2);
    }
}

/* Receive count chunks straight into buf, checking length and sequence. */
static void bulk_recv_chunks(int fd, uint8_t *buf, uint32_t size,
                             uint64_t seq0, uint64_t count)
{
    for (uint64_t s = seq0; s < seq0 + count; s++) {
        uint8_t hdr[4];
        read_exact(fd, hdr, 4);
        if (get_be32(hdr) != size)
            die("chunk %llu: bad length", (unsigned long long)s);
        read_exact(fd, buf, size);
        if (size > 0 && buf[0] != (uint8_t)s)
            die("chunk %llu: bad sequence byte", (unsigned long long)s);
    }
}

static void bulk_sender(int fd, uint32_t size, uint64_t warmup, uint64_t n,
                        struct result *res)
{
    uint8_t *chunk = xmalloc(size);
    if (warmup > 0) {
        bulk_send_chunks(fd, chunk, size, 0, warmup);
        wait_ack(fd);
    }
    double t0 = now_s();
    bulk_send_chunks(fd, chunk, size, warmup, n);
    wait_ack(fd);
    res->seconds = now_s() - t0;
    free(chunk);
}

static void bulk_receiver(int fd, uint32_t size, uint64_t warmup, uint64_t n)
{
    uint8_t *buf = xmalloc(size);
    bulk_recv_chunks(fd, buf, size, 0, warmup);
    if (warmup > 0)
        send_ack(fd);
    bulk_recv_chunks(fd, buf, size, warmup, n);
    send_ack(fd);
    free(buf);
}

/* True when rx holds a whole frame (rx_frame would not read). */
static int rx_ready(const struct rx *rx)
{
    size_t avail = rx->wr - rx->rd;
    return avail >= 4 && avail >= (size_t)get_be32(rx->buf + rx->rd) + 4;
}

/* Appends len bytes to b (written first when they do not fit; written
 * at once when larger than the buffer). */
static void batch_put(int fd, struct batch *b, const void *p, size_t len)
{
    if (b->used + len > BATCH_CAP)
        batch_flush(fd, b);
    if (len > BATCH_CAP) {
        write_all(fd, p, len);
        return;
    }
    memcpy(b->buf + b->used, p, len);
    b->used += len;
}

/* reqrep server (child): answers total requests with empty frames, the
 * replies to what one read brought in one write. */
static void reqrep_server(int fd, uint32_t size, uint64_t total)
{
    struct rx rx;
    struct batch *out = xmalloc(sizeof *out);
    uint8_t reply[4];
    out->used = 0;
    put_be32(reply, 0);
    rx_init(&rx, fd, size);
    for (uint64_t i = 0; i < total; i++) {
        rx_expect(&rx, size, i);
        batch_put(fd, out, reply, 4);
        if (!rx_ready(&rx))
            batch_flush(fd, out);
    }
    batch_flush(fd, out);
    free(out);
    free(rx.buf);
}

/* reqrep client (parent): inflight requests outstanding, warmup + n in
 * all; the clock runs from the warmup's last reply to the last reply. */
static void reqrep_client(int fd, uint32_t size, uint64_t warmup, uint64_t n,
                          uint64_t inflight, struct result *res)
{
    uint64_t total = warmup + n, sent = 0, got = 0;
    struct batch *out = xmalloc(sizeof *out);
    uint8_t *frame = xmalloc((size_t)size + 4);
    struct rx rx;
    out->used = 0;
    put_be32(frame, size);
    rx_init(&rx, fd, 0);
    double t0 = now_s();
    while (sent < total && sent - got < inflight) {
        if (size > 0)
            frame[4] = (uint8_t)sent;
        batch_put(fd, out, frame, (size_t)size + 4);
        sent++;
    }
    batch_flush(fd, out);
    while (got < total) {
        const uint8_t *p;
        uint32_t len;
        rx_frame(&rx, &p, &len);
        if (len != 0)
            die("bad reqrep reply (%u bytes)", len);
        got++;
        if (got == warmup)
            t0 = now_s();
        if (sent < total) {
            if (size > 0)
                frame[4] = (uint8_t)sent;
            batch_put(fd, out, frame, (size_t)size + 4);
            sent++;
        }
        if (!rx_ready(&rx))
            batch_flush(fd, out);
    }
    res->seconds = now_s() - t0;
    free(frame);
    free(out);
    free(rx.buf);
}

/* ---------------------------------------------------------------------- */
/* Main                                                                   */
/* ---------------------------------------------------------------------- */

enum workload { W_PINGPONG, W_STREAM, W_BULK, W_REQREP };

static void usage(void)
{
    fprintf(stderr,
            "usage: " PROG " [--warmup K] [--inflight F] pingpong|stream|bulk|reqrep SIZE N\n");
    exit(2);
}

static void set_nodelay(int fd)
{
    int one = 1;
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0)
        die("setsockopt(TCP_NODELAY): %s", strerror(errno));
}

int main(int argc, char **argv)
{
    static const char *const names[] = {"pingpong", "stream", "bulk", "reqrep", NULL};
    static const uint64_t def_warmup[] = {1000, 10000, 2, 1000};
    struct bench_args a;
    parse_args(argc, argv, names, def_warmup, 0, MAX_SIZE, &a);
    enum workload w = (enum workload)a.workload;
    const char *wname = names[a.workload];
    uint32_t size = (uint32_t)a.size;
    uint64_t n = a.n;
    uint64_t warmup = a.warmup;

    setup_signals();

    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    if (lfd < 0)
        die("socket: %s", strerror(errno));
    struct sockaddr_in addr;
    socklen_t alen = sizeof addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    if (bind(lfd, (struct sockaddr *)&addr, sizeof addr) < 0)
        die("bind: %s", strerror(errno));
    if (listen(lfd, 1) < 0)
        die("listen: %s", strerror(errno));
    if (getsockname(lfd, (struct sockaddr *)&addr, &alen) < 0)
        die("getsockname: %s", strerror(errno));

    pid_t pid = fork_peer();
    if (pid == 0) {
        /* Child: server / receiver. */
        int fd = accept(lfd, NULL, NULL);
        if (fd < 0)
            die("accept: %s", strerror(errno));
        close(lfd);
        set_nodelay(fd);
        switch (w) {
        case W_PINGPONG: pingpong_server(fd, size, warmup + n); break;
        case W_STREAM: stream_receiver(fd, size, warmup, n); break;
        case W_BULK: bulk_receiver(fd, size, warmup, n); break;
        case W_REQREP: reqrep_server(fd, size, warmup + n); break;
        }
        /* Wait for the parent to close so our last bytes are not reset. */
        char c;
        while (read(fd, &c, 1) > 0)
            ;
        close(fd);
        _exit(0);
    }
    child_pid = pid;
    close(lfd);

    /* Parent: client / sender. */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        die("socket: %s", strerror(errno));
    set_nodelay(fd);
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) < 0)
        die("connect: %s", strerror(errno));

    struct result res = { 0, NULL };
    switch (w) {
    case W_PINGPONG: pingpong_client(fd, size, warmup, n, &res); break;
    case W_STREAM: stream_sender(fd, size, warmup, n, &res); break;
    case W_BULK: bulk_sender(fd, size, warmup, n, &res); break;
    case W_REQREP: reqrep_client(fd, size, warmup, n, a.inflight, &res); break;
    }
    close(fd);

    if (reap_child())
        return 1;

    print_result("tcp", wname, size, n, warmup, res.seconds);
    if (w == W_REQREP)
        printf(",\"inflight\":%llu", (unsigned long long)a.inflight);
    return print_result_end(res.samples, n);
}
