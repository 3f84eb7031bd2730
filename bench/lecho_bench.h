/*
 * bench/lecho_bench.h -- what bench/lecho_c.c (the core's lei_ctx, no Lua)
 * and bench/lecho_h.c (the public lecho.h) share, so that the two measure
 * the same thing: the argv of the two workloads, the fork with an address
 * pipe and a control pipe, and the timed loops.  Each program keeps what
 * depends on its API: child_main (the consumer) and the parent's submit,
 * wait for the child and flush (struct bench_parent).
 *
 * Include after harness.h, once, from the program's single .c file.
 */
#ifndef LECHO_BENCH_LECHO_H
#define LECHO_BENCH_LECHO_H

enum workload { W_PINGPONG, W_STREAM };

static enum workload wl;
static uint64_t warmup, nops;
static size_t size;
static int ctl_fd = -1;   /* child: write end of the control pipe */
static uint64_t received; /* child: events handled */

static void usage(void)
{
    fprintf(stderr, "usage: " PROG " [--warmup K] pingpong|stream SIZE N\n");
    exit(2);
}

/* Reads argv into the globals above; returns the workload's name. */
static const char *lecho_bench_args(int argc, char **argv)
{
    static const char *const names[] = {"pingpong", "stream", NULL};
    static const uint64_t def_warmup[] = {1000, 10000};
    struct bench_args a;
    parse_args(argc, argv, names, def_warmup, 0, 1u << 30, &a);
    wl = a.workload == 0 ? W_PINGPONG : W_STREAM;
    size = (size_t)a.size;
    nops = a.n;
    warmup = a.warmup;
    return names[a.workload];
}

/* Child: tells the parent how far it got ('R' ready, 'W' warmup received,
 * 'D' all received). */
static void ctl_signal(char c)
{
    while (write(ctl_fd, &c, 1) != 1)
        if (errno != EINTR)
            die("control pipe write: %s", strerror(errno));
}

/* Sends a context's address, with its NUL, on the address pipe and closes
 * it. */
static void send_addr(int fd, const char *addr)
{
    size_t l = strlen(addr) + 1;
    if (write(fd, addr, l) != (ssize_t)l)
        die("address pipe write: %s", strerror(errno));
    close(fd);
}

/* Reads the address the other side sends (up to its NUL) into addr (max
 * bytes) and closes the pipe; `who` names the sender in the error. */
static void read_addr(int fd, char *addr, size_t max, const char *who)
{
    size_t got = 0;
    for (;;) {
        ssize_t r = read(fd, addr + got, 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            die("%s did not send its address", who);
        if (addr[got] == '\0')
            break;
        if (++got == max)
            die("address too long");
    }
    close(fd);
}

static void child_main(int addr_fd); /* each program's consumer; never returns */

/* Parent: forks the consumer with an address pipe and a control pipe.  The
 * child gets ctl_fd and runs child_main on its end of the address pipe (the
 * write end when child_sends_addr, else the read end).  The parent gets its
 * end of the address pipe in *addr_fd and the control pipe's read end in
 * *ctl_rfd. */
static void fork_consumer(int child_sends_addr, int *addr_fd, int *ctl_rfd)
{
    int addr_pipe[2], ctl_pipe[2];
    if (pipe(addr_pipe) < 0 || pipe(ctl_pipe) < 0)
        die("pipe: %s", strerror(errno));
    int mine = child_sends_addr ? 0 : 1; /* the parent's end of addr_pipe */
    pid_t pid = fork_peer();
    if (pid == 0) {
        close(addr_pipe[mine]);
        close(ctl_pipe[0]);
        ctl_fd = ctl_pipe[1];
        child_main(addr_pipe[1 - mine]);
    }
    child_pid = pid;
    close(addr_pipe[1 - mine]);
    close(ctl_pipe[1]);
    *addr_fd = addr_pipe[mine];
    *ctl_rfd = ctl_pipe[0];
}

/* The parent's side of a workload, through one API. */
struct bench_parent {
    void *ud;
    void (*submit)(void *ud, int sync); /* the payload, sync or async */
    void (*wait_ctl)(void *ud, char want); /* serves the loop until the child says want */
    void (*flush)(void *ud);               /* writes what is queued */
};

/* Parent: the timed part of the workload.  pingpong: warmup + nops sync
 * submits, each round trip timed into *samples (xmalloc'd, nops of them).
 * stream: the warmup (the first event sync, so that the connection is up),
 * then nops async submits until the child says it has them all; *samples
 * NULL.  Returns the seconds of the nops timed operations. */
static double run_workload(const struct bench_parent *bp, double **samples)
{
    double t0 = 0;
    *samples = NULL;
    if (wl == W_PINGPONG) {
        double *s = xmalloc(nops * sizeof(double));
        for (uint64_t i = 0; i < warmup + nops; i++) {
            if (i == warmup)
                t0 = now_s();
            double a = now_s();
            bp->submit(bp->ud, 1);
            if (i >= warmup)
                s[i - warmup] = now_s() - a;
        }
        *samples = s;
        return now_s() - t0;
    }
    for (uint64_t i = 0; i < warmup; i++)
        bp->submit(bp->ud, i == 0);
    if (warmup > 0)
        bp->wait_ctl(bp->ud, 'W');
    t0 = now_s();
    for (uint64_t i = 0; i < nops; i++)
        bp->submit(bp->ud, warmup == 0 && i == 0);
    bp->flush(bp->ud);
    bp->wait_ctl(bp->ud, 'D');
    return now_s() - t0;
}

#endif
