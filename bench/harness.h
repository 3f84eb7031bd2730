/* bench/harness.h: what the two C baselines share: error exits, the
 * SIGCHLD/SIGALRM handling that always reaps the forked peer, a monotonic
 * clock, allocation, percentiles and argument parsing.  Static functions in
 * a header: each baseline is one translation unit.  Define PROG and
 * ALARM_SECONDS, and include the system headers, before including it. */
#ifndef LECHO_BENCH_HARNESS_H
#define LECHO_BENCH_HARNESS_H

static void usage(void); /* each baseline's own: prints its usage, exits 2 */

static const char *role = "parent";      /* for messages */
static volatile pid_t child_pid = -1;    /* >0 in parent while unreaped */

/* Async-signal-safe: write string s to stderr. */
static void sig_puts(const char *s)
{
    ssize_t r = write(STDERR_FILENO, s, strlen(s));
    (void)r;
}

/* Async-signal-safe: write non-negative integer v to stderr. */
static void sig_putint(int v)
{
    char b[16];
    int i = sizeof b;
    b[--i] = '\0';
    do {
        b[--i] = (char)('0' + v % 10);
        v /= 10;
    } while (v > 0 && i > 0);
    sig_puts(&b[i]);
}

/* Async-signal-safe: describe a waitpid status on stderr. */
static void sig_put_status(int st)
{
    if (WIFEXITED(st)) {
        sig_puts("exit status ");
        sig_putint(WEXITSTATUS(st));
    } else if (WIFSIGNALED(st)) {
        sig_puts("killed by signal ");
        sig_putint(WTERMSIG(st));
    } else {
        sig_puts("unknown status");
    }
}

/* Parent's SIGCHLD handler: reap the child.  A failed child makes the
 * parent exit 1 immediately; a successful one (it finished its side of the
 * protocol) just records that it is gone. */
static volatile int child_status = 0;
static void on_sigchld(int sig)
{
    (void)sig;
    int saved = errno, st;
    pid_t p = child_pid;
    if (p > 0 && waitpid(p, &st, WNOHANG) == p) {
        child_pid = -1;
        child_status = st;
        if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
            sig_puts(PROG ": peer process failed (");
            sig_put_status(st);
            sig_puts(")\n");
            _exit(1);
        }
    }
    errno = saved;
}

/* Either process's SIGALRM handler: the run exceeded ALARM_SECONDS.  The
 * parent kills and reaps the child before exiting. */
static void on_sigalrm(int sig)
{
    (void)sig;
    sig_puts(PROG ": ");
    sig_puts(role);
    sig_puts(": timed out after 60 s\n");
    pid_t p = child_pid;
    if (p > 0) {
        kill(p, SIGKILL);
        waitpid(p, NULL, 0);
    }
    _exit(1);
}

/* Kill (if still running) and reap the child; used on parent error paths.
 * SIGCHLD is blocked first so the handler cannot race us. */
/* The parent's signals: no SIGPIPE, the SIGALRM bound of the whole run,
 * SIGCHLD to notice a peer that died. */
static void setup_signals(void)
{
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigalrm;
    sigaction(SIGALRM, &sa, NULL);
    sa.sa_handler = on_sigchld;
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    sigaction(SIGCHLD, &sa, NULL);
    alarm(ALARM_SECONDS);
}

static void kill_and_reap_child(void)
{
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGCHLD);
    sigprocmask(SIG_BLOCK, &s, NULL);
    pid_t p = child_pid;
    if (p > 0) {
        kill(p, SIGKILL);
        waitpid(p, NULL, 0);
        child_pid = -1;
    }
}

/* Print "PROG: ROLE: message" and exit 1 without running atexit handlers
 * (nor touching libzmq again; the parent reaps the child first). */
static void die(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, PROG ": %s: ", role);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    if (strcmp(role, "parent") == 0)
        kill_and_reap_child();
    _exit(1);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        die("out of memory (%zu bytes)", n);
    memset(p, 0x5a, n);   /* touch the pages before timing */
    return p;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Nearest-rank percentile (p in (0,1]) of sorted v[0..n). */
static double percentile(const double *v, uint64_t n, double p)
{
    uint64_t k = (uint64_t)(p * (double)n + 0.999999);
    if (k < 1)
        k = 1;
    if (k > n)
        k = n;
    return v[k - 1];
}

static uint64_t parse_u64(const char *s)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-')
        usage();
    return v;
}
/* The command line every driver takes: [--warmup K] [--hwm H] [--inflight F]
 * WORKLOAD SIZE N.  names: the workloads (NULL-terminated), def_warmup[i]:
 * the warm-up of names[i] when --warmup is not given (capped at N/10).
 * --hwm only when allow_hwm (hwm is -1 otherwise).  --inflight: requests
 * outstanding at once in the request/response workloads (1 to 65536,
 * default 1).  Anything else: usage(). */
struct bench_args {
    int workload; /* index into names */
    uint64_t size, n, warmup;
    int64_t hwm;
    uint64_t inflight;
};

static void parse_args(int argc, char **argv, const char *const *names,
                       const uint64_t *def_warmup, int allow_hwm, uint64_t max_size,
                       struct bench_args *a)
{
    int ai = 1;
    int64_t warmup_opt = -1;
    a->hwm = -1;
    a->inflight = 1;
    while (ai + 1 < argc && strncmp(argv[ai], "--", 2) == 0) {
        if (strcmp(argv[ai], "--warmup") == 0)
            warmup_opt = (int64_t)parse_u64(argv[ai + 1]);
        else if (strcmp(argv[ai], "--inflight") == 0)
            a->inflight = parse_u64(argv[ai + 1]);
        else if (allow_hwm && strcmp(argv[ai], "--hwm") == 0)
            a->hwm = (int64_t)parse_u64(argv[ai + 1]);
        else
            usage();
        ai += 2;
    }
    if (a->hwm > INT32_MAX || a->inflight < 1 || a->inflight > 65536 || argc - ai != 3)
        usage();
    a->workload = -1;
    for (int i = 0; names[i]; i++)
        if (strcmp(argv[ai], names[i]) == 0)
            a->workload = i;
    if (a->workload < 0)
        usage();
    a->size = parse_u64(argv[ai + 1]);
    a->n = parse_u64(argv[ai + 2]);
    if (a->size > max_size || a->n < 1)
        usage();
    a->warmup = warmup_opt >= 0 ? (uint64_t)warmup_opt : def_warmup[a->workload];
    if (warmup_opt < 0 && a->warmup > a->n / 10)
        a->warmup = a->n / 10;
}

/* Forks the peer process.  Returns its pid in the parent and 0 in the
 * child, which is then set up: role "child", default SIGCHLD, its own alarm,
 * and killed if the parent dies. */
static pid_t fork_peer(void)
{
    fflush(NULL);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0)
        die("fork: %s", strerror(errno));
    if (pid == 0) {
        role = "child";
        signal(SIGCHLD, SIG_DFL);
        alarm(ALARM_SECONDS);
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent)
            die("parent gone or prctl failed");
    }
    return pid;
}

/* Parent, at the end of a run: reaps the child (unless the SIGCHLD handler
 * already did) and returns 0 if it succeeded, 1 after saying how it failed. */
static int reap_child(void)
{
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGCHLD);
    sigprocmask(SIG_BLOCK, &s, NULL);
    int st = child_status;
    if (child_pid > 0) {
        if (waitpid(child_pid, &st, 0) != child_pid)
            die("waitpid: %s", strerror(errno));
        child_pid = -1;
    }
    if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
        fprintf(stderr, PROG ": peer process failed (");
        sig_put_status(st);
        fprintf(stderr, ")\n");
        return 1;
    }
    return 0;
}

/* Parent, at the end of a run: the result line every benchmark program
 * prints on stdout (bench/run.lua reads it), in two halves so that a
 * program can put fields of its own between them.  print_result opens it
 * with the common figures; print_result_end adds the latency percentiles of
 * samples (n per-operation times in seconds, from xmalloc: sorted and
 * freed here; NULL: none), closes it and returns the exit code (1 when
 * stdout failed). */
static void print_result(const char *impl, const char *workload, size_t size, uint64_t n,
                         uint64_t warmup, double secs)
{
    printf("{\"impl\":\"%s\",\"workload\":\"%s\",\"size\":%zu,\"n\":%llu,"
           "\"warmup\":%llu,\"seconds\":%.6f,\"us_per_op\":%.3f,"
           "\"ops_per_s\":%.1f,\"mb_per_s\":%.2f",
           impl, workload, size, (unsigned long long)n, (unsigned long long)warmup, secs,
           secs * 1e6 / (double)n, (double)n / secs, (double)n * (double)size / 1e6 / secs);
}

static int print_result_end(double *samples, uint64_t n)
{
    if (samples) {
        qsort(samples, n, sizeof(double), cmp_double);
        printf(",\"p50_us\":%.3f,\"p99_us\":%.3f", percentile(samples, n, 0.50) * 1e6,
               percentile(samples, n, 0.99) * 1e6);
        free(samples);
    }
    printf("}\n");
    return fflush(stdout) == 0 ? 0 : 1;
}

#endif
