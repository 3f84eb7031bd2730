/*
 * bench/lecho_c.c -- lecho's C API (core/transport/ctx.h, core/base/codec.h) driven
 * directly, without Lua, for the benchmark suite.  Same argv interface and
 * JSON output as bench/baseline_tcp.c, with "impl":"lecho_c".
 *
 * The process forks first; each side makes its own lei_ctx on 127.0.0.1
 * (port chosen by the OS).  The child (consumer) opens channel "bench",
 * marks it as having local consumers and sends its listen address to the
 * parent through a pipe; the parent (producer) opens the same channel and
 * sets the child's address as its only destination (what the manager would
 * tell it).  There is no name server: membership is set by hand.
 *
 * --keyed (first argument): both contexts get an identity and trust each
 * other, the consumer knows the channel manager's key and the producer has
 * its ticket: the connection is authenticated and every byte encrypted
 * (records), the cost `make bench` reports as keyed/plain ratios.
 *
 * Workloads (argv: [--keyed] [--warmup K] WORKLOAD SIZE N)
 *   pingpong SIZE N   lei_submit(sync) of one value (SIZE 0: nil, else a
 *                     string of SIZE bytes), then the loop runs until the
 *                     consumer's ACK comes back; each round trip timed.
 *   stream SIZE N     lei_submit(async) of strings of SIZE bytes (each a new
 *                     message, encoded like the Lua binding does); the child
 *                     reports on a pipe when warmup and all N arrived.
 * Output: one JSON line, fields as in baseline_tcp.c.
 *
 * Build: make bench/lecho_c (the core's files, libev, libsodium)
 */
#define _GNU_SOURCE
#include <errno.h>
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

#include <sodium.h>

#include "codec.h"
#include "ctx_int.h"

#define PROG "lecho_c"
#define ALARM_SECONDS 60

#include "harness.h"

#include "lecho_bench.h"

static volatile int child_done;    /* child: the producer went away */
static char *payload;
static int keyed;                  /* --keyed: authenticated, encrypted */

/* --keyed: fixed identities (seeds 1 producer, 2 consumer, 3 manager),
 * trusted both ways; the consumer knows the manager key of "bench", the
 * producer holds its ticket. */
static void set_keys(lei_ctx *c, int consumer, uint32_t chid)
{
    uint8_t seed[32], pk[2][32], sk[2][64], mpk[32], msk[64], t[72], m[18 + 6 + 32 + 8];
    char err[160];
    for (int i = 0; i < 3; i++) {
        memset(seed, i + 1, sizeof seed);
        crypto_sign_seed_keypair(i < 2 ? pk[i] : mpk, i < 2 ? sk[i] : msk, seed);
    }
    if (lei_auth_set_identity(c, sk[consumer], consumer ? "consumer" : "producer", NULL, 0, err))
        die("set_identity: %s", err);
    lei_auth_trust_key(c, pk[!consumer], consumer ? "producer" : "consumer");
    if (consumer) {
        lei_auth_set_manager_key(c, chid, mpk);
        return;
    }
    /* the ticket (doc/security.md "Tickets"): u64be expiry (2^40 s, far
     * past any run), then the signature over the name, key and expiry */
    static const uint8_t exp[8] = {0, 0, 1, 0, 0, 0, 0, 0};
    memcpy(m, "lecho-producer-v2\0bench", 24);
    memcpy(m + 24, pk[0], 32);
    memcpy(m + 56, exp, 8);
    memcpy(t, exp, 8);
    crypto_sign_detached(t + 8, NULL, m, sizeof m, msk);
    lei_auth_set_ticket(c, chid, t);
}

/* Child: the consumer's event hook.  Acknowledges sync events like the Lua
 * binding does (one handler ran, no errors). */
static int on_event(void *ud, lei_peer *from, uint32_t chid, uint64_t producer, uint64_t seq,
                    uint64_t sync, const uint8_t *p, size_t n)
{
    lei_ctx *c = ud;
    (void)chid;
    (void)producer;
    (void)seq;
    if (lei_codec_validate(p, n, NULL, NULL))
        return -1;
    received++;
    if (sync)
        lei_ack(c, from, sync, 1, NULL, 0);
    if (wl == W_STREAM) {
        if (received == warmup && warmup > 0)
            ctl_signal('W');
        if (received == warmup + nops)
            ctl_signal('D');
    }
    return 0;
}

static int on_ctrl(void *ud, lei_peer *from, const uint8_t *p, size_t n)
{
    (void)ud;
    (void)from;
    (void)p;
    (void)n;
    return 0;
}

static void on_peer(void *ud, lei_peer *p, int up, const char *reason, int code)
{
    (void)code;
    lei_ctx *c = ud;
    (void)p;
    (void)reason;
    if (!up) {
        child_done = 1;
        ev_break(c->loop, EVBREAK_ALL);
    }
}

static lei_ctx *make_ctx(void)
{
    static lei_hooks h;
    h.event = on_event;
    h.ctrl = on_ctrl;
    h.peer = on_peer;
    lei_ctx *c = lei_ctx_new(NULL, &h);
    if (!c)
        die("lei_ctx_new failed");
    c->h.ud = c;
    char err[LEI_ADDR_ERR_MAX];
    if (lei_accept_listen(c, "127.0.0.1:0", NULL, NULL, err))
        die("listen: %s", err);
    return c;
}

static void child_main(int addr_fd)
{
    lei_ctx *c = make_ctx();
    uint32_t id = lei_chan_open(c, "bench", 5);
    lei_chan_get(c, id)->local = 1;
    if (keyed)
        set_keys(c, 1, id);
    send_addr(addr_fd, c->addr);
    while (!child_done)
        ev_run(c->loop, EVRUN_ONCE);
    lei_ctx_free(c);
    _exit(received >= warmup + nops ? 0 : 1);
}

/* A new message holding the benchmark's value, as the Lua binding makes
 * one per submit. */
static lei_msg *make_msg(void)
{
    lei_msg *m = lei_msg_new();
    if (!m)
        die("out of memory");
    int rc = size ? lei_enc_string(&m->own, payload, size) : lei_enc_nil(&m->own);
    if (rc)
        die("out of memory");
    lei_msg_sync(m);
    return m;
}

/* Parent: what a run needs (struct bench_parent's ud). */
struct parent {
    lei_ctx *c;
    uint32_t chid;
    uint64_t seq;
    ev_io ctl; /* the control pipe's read end */
};

static void submit(void *ud, int sync)
{
    struct parent *pa = ud;
    lei_ctx *c = pa->c;
    uint32_t chid = pa->chid;
    uint64_t seq = ++pa->seq;
    lei_msg *m = make_msg();
    const char *err = NULL;
    uint64_t sid = 0;
    if (lei_submit(c, chid, 1, seq, m, sync, LEI_BLOCK, &sid, &err))
        die("lei_submit: %s", err);
    lei_msg_release(m, NULL, NULL);
    if (!sync)
        return;
    lei_sync *s;
    while ((s = lei_sync_find(c, sid)) && s->nwait > 0)
        ev_run(c->loop, EVRUN_ONCE);
    if (!s)
        die("sync record vanished");
    for (int i = 0; i < s->nw; i++)
        if (s->w[i].err)
            die("sync failed: %s", s->w[i].err);
    lei_sync_free(c, s);
}

/* Parent: the control pipe is read through a libev watcher so the loop
 * keeps writing queued events while we wait. */
static char ctl_got;
static void ctl_cb(struct ev_loop *loop, ev_io *w, int revents)
{
    (void)revents;
    char ch;
    ssize_t r = read(w->fd, &ch, 1);
    if (r == 1)
        ctl_got = ch;
    else if (r == 0)
        die("child closed the control pipe");
    ev_break(loop, EVBREAK_ONE);
}

static void wait_ctl(void *ud, char want)
{
    struct parent *pa = ud;
    lei_ctx *c = pa->c;
    ev_io *w = &pa->ctl;
    ctl_got = 0;
    ev_io_start(c->loop, w);
    while (ctl_got == 0)
        ev_run(c->loop, EVRUN_ONCE);
    ev_io_stop(c->loop, w);
    if (ctl_got != want)
        die("control pipe: got '%c', expected '%c'", ctl_got, want);
}

static void flush(void *ud)
{
    lei_peer_flush_all(((struct parent *)ud)->c);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--keyed") == 0) {
        keyed = 1;
        argv[1] = argv[0];
        argv++;
        argc--;
    }
    const char *wname = lecho_bench_args(argc, argv);
    payload = xmalloc(size);

    setup_signals();

    int addr_fd, ctl_rfd;
    fork_consumer(1, &addr_fd, &ctl_rfd);
    char addr[LEI_ADDR_MAX];
    read_addr(addr_fd, addr, sizeof addr, "child");

    struct parent pa = { .c = make_ctx() };
    lei_ctx *c = pa.c;
    pa.chid = lei_chan_open(c, "bench", 5);
    if (keyed)
        set_keys(c, 0, pa.chid);
    const char *dests[1] = { addr };
    lei_peer_set_dests(c, pa.chid, dests, 1);
    ev_io_init(&pa.ctl, ctl_cb, ctl_rfd, EV_READ);

    const struct bench_parent bp = { &pa, submit, wait_ctl, flush };
    double *samples;
    double secs = run_workload(&bp, &samples);
    lei_ctx_free(c);
    if (reap_child())
        return 1;
    print_result(keyed ? "lecho_c_keyed" : "lecho_c", wname, size, nops, warmup, secs);
    return print_result_end(samples, nops);
}
