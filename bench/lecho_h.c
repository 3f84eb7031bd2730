/*
 * bench/lecho_h.c -- lecho's public C API (core/lecho.h, liblecho) for the
 * benchmark suite: what a C program embedding lecho gets, the Lua layer
 * included.  Same argv interface and JSON output as bench/lecho_c.c (which
 * drives the core's internal lei_ctx, without Lua), with "impl":"lecho_h".
 *
 * The process forks first; the parent opens a context that runs the name
 * server and sends its address to the child through a pipe; the child opens
 * a context on that name server, a consumer of channel "bench", and says
 * 'R' on the control pipe; the parent opens a producer (membership comes
 * from the manager, as for any lecho program).
 *
 * Workloads (argv: [--warmup K] WORKLOAD SIZE N)
 *   pingpong SIZE N   lecho_submit_sync of one value (SIZE 0: nil, else a
 *                     string of SIZE bytes); each round trip timed.
 *   stream SIZE N     lecho_submit of strings of SIZE bytes; the child says
 *                     'W' when the warmup and 'D' when all N arrived.
 * The parent ends with the value `true`, on which the child exits.
 * Output: one JSON line, fields as in baseline_tcp.c.
 *
 * Build: make bench/lecho_h (links build/liblecho.so)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
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

#include "lecho.h"

#define PROG "lecho_h"
#define ALARM_SECONDS 60

#include "harness.h"

enum workload { W_PINGPONG, W_STREAM };

static enum workload wl;
static uint64_t warmup, nops;
static size_t size;
static int ctl_fd = -1;  /* child: write end of the control pipe */
static uint64_t received; /* child: events handled */
static int child_done;    /* child: the parent's `true` arrived */

static void usage(void)
{
    fprintf(stderr, "usage: " PROG " [--warmup K] pingpong|stream SIZE N\n");
    exit(2);
}

static void ctl_signal(char c)
{
    while (write(ctl_fd, &c, 1) != 1)
        if (errno != EINTR)
            die("control pipe write: %s", strerror(errno));
}

/* Child: the consumer's handler. */
static const char *on_event(const lecho_value *ev, const lecho_meta *meta, void *ud)
{
    (void)meta;
    if (lecho_type(ev, NULL) == LECHO_TBOOLEAN) {
        child_done = 1;
        lecho_stop(ud);
        return NULL;
    }
    received++;
    if (wl == W_STREAM) {
        if (received == warmup && warmup > 0)
            ctl_signal('W');
        if (received == warmup + nops)
            ctl_signal('D');
    }
    return NULL;
}

static lecho_ctx *open_ctx(const char *ns)
{
    const char *opts[] = { "quiet", "true", "nameserver", ns, NULL };
    if (!ns)
        opts[2] = NULL;
    lecho_ctx *c;
    char err[256];
    if (lecho_open(opts, &c, err, sizeof err))
        die("lecho_open: %s", err);
    return c;
}

static void child_main(int addr_fd)
{
    char addr[128];
    size_t got = 0;
    for (;;) {
        ssize_t r = read(addr_fd, addr + got, 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            die("parent did not send its address");
        if (addr[got] == '\0')
            break;
        if (++got == sizeof addr)
            die("address too long");
    }
    close(addr_fd);
    lecho_ctx *c = open_ctx(addr);
    lecho_consumer *con;
    if (lecho_consumer_open(lecho_channel_get(c, "bench"), on_event, c, &con))
        die("consumer: %s", lecho_errmsg(c));
    ctl_signal('R');
    while (!child_done)
        lecho_run(c);
    lecho_close(c, 0);
    _exit(received >= warmup + nops ? 0 : 1);
}

/* Parent: serves its loop until the child says want on the control pipe. */
static void wait_ctl(lecho_ctx *c, int fd, char want)
{
    for (;;) {
        char ch;
        ssize_t r = read(fd, &ch, 1);
        if (r == 1) {
            if (ch != want)
                die("control pipe: got '%c', expected '%c'", ch, want);
            return;
        }
        if (r == 0)
            die("child closed the control pipe");
        if (errno != EAGAIN && errno != EINTR)
            die("control pipe read: %s", strerror(errno));
        lecho_run_once(c, 0.0005);
    }
}

static void submit(lecho_producer *p, const lecho_value *v, int sync)
{
    int rc;
    lecho_errors *errs = NULL;
    if (sync)
        rc = lecho_submit_sync(p, v, 10, &errs);
    else
        rc = lecho_submit(p, v);
    if (rc)
        die("submit: %s: %s", lecho_strerror(rc), errs ? lecho_errors_text(errs) : "");
}

int main(int argc, char **argv)
{
    static const char *const names[] = {"pingpong", "stream", NULL};
    static const uint64_t def_warmup[] = {1000, 10000};
    struct bench_args a;
    parse_args(argc, argv, names, def_warmup, 0, 1u << 30, &a);
    wl = a.workload == 0 ? W_PINGPONG : W_STREAM;
    const char *wname = names[a.workload];
    size = (size_t)a.size;
    nops = a.n;
    warmup = a.warmup;
    char *payload = xmalloc(size ? size : 1);
    memset(payload, 'x', size);

    setup_signals();

    int addr_pipe[2], ctl_pipe[2];
    if (pipe(addr_pipe) < 0 || pipe(ctl_pipe) < 0)
        die("pipe: %s", strerror(errno));
    pid_t pid = fork_peer();
    if (pid == 0) {
        close(addr_pipe[1]);
        close(ctl_pipe[0]);
        ctl_fd = ctl_pipe[1];
        child_main(addr_pipe[0]);
    }
    child_pid = pid;
    close(addr_pipe[0]);
    close(ctl_pipe[1]);
    fcntl(ctl_pipe[0], F_SETFL, O_NONBLOCK);

    lecho_ctx *c = open_ctx(NULL);
    const char *addr = lecho_address(c);
    if (write(addr_pipe[1], addr, strlen(addr) + 1) != (ssize_t)(strlen(addr) + 1))
        die("address pipe write: %s", strerror(errno));
    close(addr_pipe[1]);
    wait_ctl(c, ctl_pipe[0], 'R');
    lecho_producer *p;
    if (lecho_producer_open(lecho_channel_get(c, "bench"), NULL, &p))
        die("producer: %s", lecho_errmsg(c));
    lecho_value *v = lecho_value_new(c);
    if (!v || (size && lecho_set_string(v, NULL, payload, size)))
        die("out of memory");

    double *samples = NULL;
    double t0 = 0, secs;
    if (wl == W_PINGPONG) {
        samples = xmalloc(nops * sizeof(double));
        for (uint64_t i = 0; i < warmup + nops; i++) {
            if (i == warmup)
                t0 = now_s();
            double s = now_s();
            submit(p, v, 1);
            if (i >= warmup)
                samples[i - warmup] = now_s() - s;
        }
        secs = now_s() - t0;
    } else {
        for (uint64_t i = 0; i < warmup; i++)
            submit(p, v, i == 0);
        if (warmup > 0)
            wait_ctl(c, ctl_pipe[0], 'W');
        t0 = now_s();
        for (uint64_t i = 0; i < nops; i++)
            submit(p, v, warmup == 0 && i == 0);
        lecho_flush(p);
        wait_ctl(c, ctl_pipe[0], 'D');
        secs = now_s() - t0;
    }
    lecho_set_bool(v, NULL, 1);
    submit(p, v, 0);
    lecho_close(c, 2);
    if (reap_child())
        return 1;
    print_result("lecho_h", wname, size, nops, warmup, secs);
    return print_result_end(samples, nops);
}
