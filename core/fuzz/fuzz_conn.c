/* fuzz_conn.c: a libFuzzer harness (make fuzz) for a connection's read
 * path: a protected-mode context accepts the harness on a unix socket, the
 * harness sends a valid HELLO, then the input's bytes as the peer's frames
 * (BIND, EVENT, CTRL, ACK, ...).  The context's hooks act from inside, as
 * the binding's may, steered by the input: close the connection, submit on
 * the channel (written back on the same connection), re-target the channel,
 * stop consuming it, suspend the dispatch (resumed a loop turn later),
 * acknowledge a sync event, send a control message, or call the value bad.
 *
 * Input: bytes 0..3 are the actions the hooks take in turn (one per call,
 * cycling), byte 4 where the rest is cut in two writes (and, its low bit,
 * whether a read's async events come as one batch, the events hook, as the
 * Lua binding has them, or one by one), the rest the stream.  Leans on the core's C files, libev, libsodium; sockets under
 * LECHO_FUZZ_DIR (compile-time).  Seeds: core/fuzz/conn/.
 */
#define _GNU_SOURCE
#include "ctx_int.h"
#include "fuzz_sock.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
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
#define C_PATH LECHO_FUZZ_DIR "/conn-c.sock" /* the context */
#define D_ADDR "unix:" LECHO_FUZZ_DIR "/conn-d.sock" /* the harness's claimed address */
#define E_ADDR "unix:" LECHO_FUZZ_DIR "/conn-e.sock" /* nobody listens there */

/* The state of one input (the harness is single-threaded). */
static struct {
    const uint8_t *acts; /* 4 action bytes */
    unsigned next;       /* calls so far */
    lei_ctx *c;
    int held;            /* a dispatch was suspended: resume next turn */
    uint64_t seq;
} S;

static int verbose;

/* What a hook does this time: 0 nothing, 1 close, 2 submit, 3 re-target,
 * 4 stop consuming, 5 suspend (events), 6 ack, 7 send ctrl, 8 say bad. */
static unsigned action(void) { return S.acts[S.next++ % 4] % 9; }

static int act(lei_peer *from, uint32_t chid, uint64_t sync, int is_event) {
    lei_ctx *c = S.c;
    const char *err;
    unsigned a = action();
    if (verbose) fprintf(stderr, "fuzz: hook action %u on %s\n", a, is_event ? "event" : "ctrl");
    switch (a) {
    case 1:
        if (from) lei_peer_close(from, "closed by the hook");
        return 0;
    case 2: {
        if (!is_event || !lei_chan_get(c, chid)) return 0;
        const char *to = from ? lei_peer_addr(from) : D_ADDR;
        lei_peer_set_dests(c, chid, &to, 1);
        lei_msg *m = msg_of("from inside a hook");
        uint64_t sid = 0;
        lei_submit(c, chid, 7, ++S.seq, m, (S.seq & 1) != 0, LEI_DROP_OLDEST, &sid, &err);
        lei_msg_release(m, NULL, NULL);
        if (sid) {
            lei_sync *s = lei_sync_find(c, sid);
            if (s) lei_sync_free(c, s);
        }
        return 0;
    }
    case 3: {
        if (!is_event || !lei_chan_get(c, chid)) return 0;
        const char *to[2] = {E_ADDR, D_ADDR};
        lei_peer_set_dests(c, chid, to, (int)(S.next & 1) + 1);
        return 0;
    }
    case 4:
        if (is_event && lei_chan_get(c, chid)) lei_chan_set_local(c, chid, 0);
        return 0;
    case 5:
        if (!is_event || !from) return 0;
        S.held = 1;
        return 1;
    case 6:
        if (sync) lei_ack(c, from, sync, 1, (const uint8_t *)"\x05\x03" "err", 5);
        return 0;
    case 7:
        if (from) {
            lei_msg *m = msg_of("ctrl from inside a hook");
            lei_send_ctrl(c, lei_peer_addr(from), m, &err);
            lei_msg_release(m, NULL, NULL);
        }
        return 0;
    case 8:
        lei_ctx_refusal(c, "refused by the fuzzer's hook");
        return -1;
    default: return 0;
    }
}

static int on_event(void *ud, lei_peer *from, uint32_t chid, uint64_t producer, uint64_t seq,
                    uint64_t sync, const uint8_t *p, size_t n) {
    (void)ud, (void)producer, (void)seq;
    if (n) { /* the hook may read the payload: all of it must be there */
        volatile uint8_t x = p[0] ^ p[n - 1];
        (void)x;
    }
    return act(from, chid, sync, 1);
}

/* The batch: each event acts in turn, as the binding's loop runs them; a
 * suspend holds the peer (the rest count as kept by the hook, as the
 * binding keeps them in its coroutine); a bad value ends the batch. */
static int on_events(void *ud, lei_peer *from, const lei_event_in *ev, int n, int *held) {
    (void)ud;
    *held = 0;
    for (int i = 0; i < n; i++) {
        if (ev[i].n) {
            volatile uint8_t x = ev[i].p[0] ^ ev[i].p[ev[i].n - 1];
            (void)x;
        }
        int rc = act(from, ev[i].chid, 0, 1);
        if (rc < 0) return i;
        if (rc == 1) *held = 1;
    }
    return n;
}

static int on_ctrl(void *ud, lei_peer *from, const uint8_t *p, size_t n) {
    (void)ud;
    if (n) {
        volatile uint8_t x = p[0] ^ p[n - 1];
        (void)x;
    }
    return act(from, 0, 0, 0) < 0 ? -1 : 0;
}

static void on_peer(void *ud, lei_peer *p, int up, const char *reason, int code) {
    (void)code;
    (void)ud;
    if (verbose)
        fprintf(stderr, "fuzz: peer %s %s %s\n", lei_peer_addr(p), up ? "up" : "down",
                reason ? reason : "");
}

static void on_log(void *ud, const char *msg) {
    (void)ud;
    if (verbose) fprintf(stderr, "lecho: %s\n", msg);
}

/* Runs the loop a few turns; a suspended dispatch is resumed after one. */
static void run(int turns) {
    for (int i = 0; i < turns; i++) {
        ev_run(lei_ctx_loop(S.c), EVRUN_NOWAIT);
        if (S.held) {
            S.held = 0;
            lei_peer *p = lei_peer_get(S.c, D_ADDR, 0);
            if (p) lei_resume(S.c, p, 0);
        }
    }
}

static void feed(int fd, const uint8_t *p, size_t n) {
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno != EAGAIN && errno != EINTR) return; /* the context closed it */
        if (w > 0) {
            p += w;
            n -= (size_t)w;
        }
        run(3);
        drain(fd);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 5) return 0;
    lei_hooks h = {0};
    h.event = on_event;
    h.events = on_events;
    h.ctrl = on_ctrl;
    h.peer = on_peer;
    h.log = on_log;
    lei_opts o;
    lei_opts_default(&o);
    o.max_frame = 1 << 20;
    o.queue_limit = 1 << 20;
    memset(&S, 0, sizeof S);
    S.acts = data;
    S.c = lei_ctx_new(&o, &h);
    if (!S.c) abort();
    lei_ctx_batch(S.c, data[4] & 1);
    char err[160];
    /* two channels consumed here: "ns/x" and "ns/y" */
    lei_chan_set_local(S.c, lei_chan_open(S.c, "ns/x", 4), 1);
    lei_chan_set_local(S.c, lei_chan_open(S.c, "ns/y", 4), 1);
    unlink(C_PATH);
    if (lei_accept_listen(S.c, "unix:" C_PATH, NULL, NULL, err)) {
        fprintf(stderr, "fuzz: listen: %s\n", err);
        abort();
    }
    int fd = unix_connect(C_PATH);
    uint8_t hello[LEI_HELLO_MAX];
    size_t hn = lei_frame_hello(hello, LEI_F_HELLO, LEI_PROTO_VERSION, 4242, D_ADDR, NULL);
    feed(fd, hello, hn);
    run(2);
    drain(fd);
    size_t rest = size - 5, cut = rest * data[4] / 256;
    feed(fd, data + 5, cut);
    feed(fd, data + 5 + cut, rest - cut);
    run(4);
    drain(fd);
    close(fd);
    run(4);
    lei_ctx_free(S.c);
    S.c = NULL;
    return 0;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    signal(SIGPIPE, SIG_IGN);
    verbose = getenv("LECHO_FUZZ_LOG") != NULL;
    mkdir(LECHO_FUZZ_DIR, 0755);
    return 0;
}
