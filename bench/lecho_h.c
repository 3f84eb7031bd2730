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
 * --array first: the value is { field = a "<f8" array of SIZE/8 elements }
 * (lecho_set_array with a free function: sent from its memory, as the Lua
 * API sends an array of 64 KiB or more) instead of a string.
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

#include "lecho_bench.h"

static int child_done; /* child: the parent's `true` arrived */

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
    read_addr(addr_fd, addr, sizeof addr, "parent");
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
/* Parent: what a run needs (struct bench_parent's ud). */
struct parent {
    lecho_ctx *c;
    lecho_producer *p;
    lecho_value *v;
    int ctl_fd; /* the control pipe's read end, non-blocking */
};

static void wait_ctl(void *ud, char want)
{
    struct parent *pa = ud;
    lecho_ctx *c = pa->c;
    int fd = pa->ctl_fd;
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

static void submit(void *ud, int sync)
{
    struct parent *pa = ud;
    lecho_producer *p = pa->p;
    const lecho_value *v = pa->v;
    int rc;
    lecho_errors *errs = NULL;
    if (sync)
        rc = lecho_submit_sync(p, v, 10, &errs);
    else
        rc = lecho_submit(p, v);
    if (rc)
        die("submit: %s: %s", lecho_strerror(rc), errs ? lecho_errors_text(errs) : "");
}

static void flush(void *ud)
{
    lecho_flush(((struct parent *)ud)->p);
}

static void free_payload(void *data, void *ud)
{
    (void)ud;
    free(data);
}

int main(int argc, char **argv)
{
    int as_array = argc > 1 && strcmp(argv[1], "--array") == 0;
    if (as_array) {
        argv[1] = argv[0];
        argv++;
        argc--;
    }
    const char *wname = lecho_bench_args(argc, argv);
    char *payload = xmalloc(size ? size : 1);
    memset(payload, 'x', size);

    setup_signals();

    int addr_fd;
    struct parent pa;
    fork_consumer(0, &addr_fd, &pa.ctl_fd);
    fcntl(pa.ctl_fd, F_SETFL, O_NONBLOCK);

    lecho_ctx *c = pa.c = open_ctx(NULL);
    send_addr(addr_fd, lecho_address(c));
    wait_ctl(&pa, 'R');
    if (lecho_producer_open(lecho_channel_get(c, "bench"), NULL, &pa.p))
        die("producer: %s", lecho_errmsg(c));
    lecho_value *v = pa.v = lecho_value_new(c);
    if (as_array) {
        /* the array owns payload (freed with v's last holder) */
        size_t shape[1] = { size / 8 };
        for (size_t i = 0; i < size / 8; i++)
            ((double *)payload)[i] = (double)i;
        if (!v || lecho_set_array(v, "field", "<f8", 1, shape, payload, free_payload, NULL))
            die("lecho_set_array failed");
    } else {
        if (!v || (size && lecho_set_string(v, NULL, payload, size)))
            die("out of memory");
        free(payload); /* the value holds a copy of its bytes */
    }

    const struct bench_parent bp = { &pa, submit, wait_ctl, flush };
    double *samples;
    double secs = run_workload(&bp, &samples);
    lecho_set_bool(v, NULL, 1);
    submit(&pa, 0);
    lecho_close(c, 2);
    if (reap_child())
        return 1;
    print_result(as_array ? "lecho_h_array" : "lecho_h", wname, size, nops, warmup, secs);
    return print_result_end(samples, nops);
}
