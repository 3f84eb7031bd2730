/* test_args.c: every function of lecho.h given NULL in each of its pointer
 * arguments (the others valid), and NaN as each timeout or linger: a
 * defined result (the one doc/c-api.md "Bad arguments" lists), never a
 * crash or a hang.  Each case runs in a child forked from one set-up
 * process (a crash is that case's failure only; a hang ends at alarm());
 * the parent counts.  (s7 outside attack, items 9, 10, 12:
 * lecho_address(NULL), lecho_channel_name(NULL), lecho_producer_open(ch,
 * NULL, NULL), lecho_set_numbers(v, k, NULL, 10), lecho_get_numbers(v, k,
 * NULL, SIZE_MAX) crashed; lecho_consumer_wait(c, NAN) never returned;
 * lecho_close(ctx, NAN) refused and freed the context all the same.) */
#include "lecho.h"
#include "test.h"

#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static lecho_ctx *ctx;
static lecho_channel *ch;
static lecho_value *v, *ev;
static lecho_producer *p;
static lecho_consumer *cq;
static char path[256];

static int target, seen, namefd = -1;

/* In the child: runs case number `target` only; exits 0 when `cond` held. */
#define CASE(name, cond)                                                       \
    do {                                                                       \
        if (seen++ == target) {                                                \
            if (write(namefd, name "\n", strlen(name "\n")) < 0) _exit(3);     \
            int ok_ = (cond) ? 1 : 0;                                          \
            _exit(ok_ ? 0 : 1);                                                \
        }                                                                      \
    } while (0)

static const char *handler(const lecho_value *e, const lecho_meta *m, void *ud) {
    (void)e, (void)m, (void)ud;
    return NULL;
}
static const char *svc(const lecho_value *a, const lecho_value *m, lecho_value *r, void *ud) {
    (void)a, (void)m, (void)r, (void)ud;
    return NULL;
}
static void on_err(const char *msg, void *ud) { (void)msg, (void)ud; }
static int each_fn(const char *k, const lecho_value *x, void *ud) { (void)k, (void)x, (void)ud; return 0; }
static int pairs_fn(const lecho_value *k, const lecho_value *x, void *ud) { (void)k, (void)x, (void)ud; return 0; }
static int intr(void *ud) { (void)ud; return 0; }

static void cases(void) {
    const char *opts[] = { "quiet", "true", NULL };
    lecho_ctx *x2;
    lecho_producer *po;
    lecho_consumer *co;
    lecho_recorder *ro;
    lecho_service *so;
    lecho_value *res;
    lecho_array_info ai;
    const lecho_node *nodes;
    size_t n, len, shape[1] = { 3 };
    const char *bytes;
    double d, arr[3] = { 1, 2, 3 };
    int b;
    lecho_errors *errs;
    char err[64];

    /* ---- contexts ---- */
    CASE("lecho_errmsg(NULL)", strcmp(lecho_errmsg(NULL), "") == 0);
    CASE("lecho_open(opts, NULL, ...)", lecho_open(opts, NULL, err, sizeof err) == LECHO_EINVAL);
    CASE("lecho_open(opts, &x, NULL, 0)", lecho_open(opts, &x2, NULL, 0) == 0 && lecho_close(x2, 0) == 0);
    CASE("lecho_close(NULL, 0)", lecho_close(NULL, 0) == 0);
    CASE("lecho_close_err(NULL, 0, err, n)", lecho_close_err(NULL, 0, err, sizeof err) == 0 && err[0] == 0);
    CASE("lecho_close_err(ctx, 0, NULL, 9)", lecho_close_err(ctx, 0, NULL, 9) == 0);
    CASE("lecho_close_keep(NULL, 0, NULL, 0)", lecho_close_keep(NULL, 0, NULL, 0) == 0);
    CASE("lecho_close_free(NULL)", (lecho_close_free(NULL), 1));
    CASE("lecho_address(NULL)", lecho_address(NULL) == NULL);
    CASE("lecho_nameserver(NULL)", lecho_nameserver(NULL) == NULL);
    CASE("lecho_run(NULL)", lecho_run(NULL) == LECHO_EINVAL);
    CASE("lecho_run_once(NULL, 0)", lecho_run_once(NULL, 0) == LECHO_EINVAL);
    CASE("lecho_stop(NULL)", lecho_stop(NULL) == LECHO_EINVAL);
    CASE("lecho_set_interrupt(NULL, fn, NULL)", lecho_set_interrupt(NULL, intr, NULL) == LECHO_EINVAL);
    CASE("lecho_set_interrupt(ctx, NULL, NULL)", lecho_set_interrupt(ctx, NULL, NULL) == 0);
    CASE("lecho_stats(NULL)", lecho_stats(NULL) == NULL);
    CASE("lecho_stat(NULL, ch, c)", lecho_stat(NULL, "t", "events_out") == -1);
    CASE("lecho_stat(ctx, NULL, c)", lecho_stat(ctx, NULL, "events_out") == -1);
    CASE("lecho_stat(ctx, ch, NULL)", lecho_stat(ctx, "t", NULL) == -1);

    /* ---- values ---- */
    CASE("lecho_value_new(NULL)", lecho_value_new(NULL) == NULL);
    CASE("lecho_value_free(NULL)", (lecho_value_free(NULL), 1));
    CASE("lecho_set_nil(NULL, k)", lecho_set_nil(NULL, "k") == LECHO_EINVAL);
    CASE("lecho_set_bool(NULL, k, 1)", lecho_set_bool(NULL, "k", 1) == LECHO_EINVAL);
    CASE("lecho_set_number(NULL, k, 1)", lecho_set_number(NULL, "k", 1) == LECHO_EINVAL);
    CASE("lecho_set_string(NULL, k, s, 1)", lecho_set_string(NULL, "k", "s", 1) == LECHO_EINVAL);
    CASE("lecho_set_string(v, k, NULL, 5)", lecho_set_string(v, "k", NULL, 5) == LECHO_EINVAL);
    CASE("lecho_set_numbers(NULL, k, x, 3)", lecho_set_numbers(NULL, "k", arr, 3) == LECHO_EINVAL);
    CASE("lecho_set_numbers(v, k, NULL, 10)", lecho_set_numbers(v, "n", NULL, 10) == LECHO_EINVAL &&
                                                   strstr(lecho_errmsg(ctx), "NULL") != NULL);
    CASE("lecho_set_numbers(v, k, NULL, 0)", lecho_set_numbers(v, "k", NULL, 0) == 0 && lecho_len(v, "k") == 0);
    CASE("lecho_set_table(NULL, k)", lecho_set_table(NULL, "k") == LECHO_EINVAL);
    CASE("lecho_set_value(NULL, k, v)", lecho_set_value(NULL, "k", v) == LECHO_EINVAL);
    CASE("lecho_set_value(v, k, NULL)", lecho_set_value(v, "k", NULL) == LECHO_EINVAL);
    CASE("lecho_type(NULL, k)", lecho_type(NULL, "n") == LECHO_TNIL);
    CASE("lecho_get_number(NULL, k, &d)", lecho_get_number(NULL, "n", &d) == LECHO_EINVAL);
    CASE("lecho_get_number(v, k, NULL)", lecho_get_number(v, "x", NULL) == LECHO_EINVAL);
    CASE("lecho_get_bool(NULL, k, &b)", lecho_get_bool(NULL, "b", &b) == LECHO_EINVAL);
    CASE("lecho_get_bool(v, k, NULL)", lecho_get_bool(v, "b", NULL) == LECHO_EINVAL);
    CASE("lecho_get_string(NULL, k, &len)", lecho_get_string(NULL, "s", &len) == NULL);
    CASE("lecho_get_string(v, k, NULL)", lecho_get_string(v, "s", NULL) != NULL);
    CASE("lecho_len(NULL, k)", lecho_len(NULL, "n") == 0);
    CASE("lecho_get_numbers(NULL, k, out, 3)", lecho_get_numbers(NULL, "n", arr, 3) == 0);
    CASE("lecho_get_numbers(v, k, NULL, SIZE_MAX)", lecho_get_numbers(v, "n", NULL, SIZE_MAX) == 3);
    CASE("lecho_field(NULL, k, 0)", lecho_field(NULL, "n", 0) == NULL);
    CASE("lecho_each(NULL, fn, NULL)", lecho_each(NULL, each_fn, NULL) == LECHO_EINVAL);
    CASE("lecho_each(v, NULL, NULL)", lecho_each(v, NULL, NULL) == LECHO_EINVAL);
    CASE("lecho_pairs(NULL, fn, NULL)", lecho_pairs(NULL, pairs_fn, NULL) == LECHO_EINVAL);
    CASE("lecho_pairs(v, NULL, NULL)", lecho_pairs(v, NULL, NULL) == LECHO_EINVAL);
    CASE("lecho_set_array(NULL, ...)", lecho_set_array(NULL, "a", "f8", 1, shape, arr, NULL, NULL) == LECHO_EINVAL);
    CASE("lecho_set_array(v, k, NULL dtype, ...)", lecho_set_array(v, "a", NULL, 1, shape, arr, NULL, NULL) == LECHO_EINVAL);
    CASE("lecho_set_array(v, k, dt, 1, NULL shape, ...)", lecho_set_array(v, "a", "f8", 1, NULL, arr, NULL, NULL) == LECHO_EINVAL);
    CASE("lecho_set_array(v, k, dt, 1, shape, NULL data, ...)", lecho_set_array(v, "a", "f8", 1, shape, NULL, NULL, NULL) == LECHO_EINVAL);
    CASE("lecho_get_array(NULL, k, &ai)", lecho_get_array(NULL, "n", &ai) == LECHO_EINVAL);
    CASE("lecho_get_array(v, k, NULL)", lecho_get_array(v, "arr", NULL) == LECHO_EINVAL);
    CASE("lecho_nodes(NULL, ...)", lecho_nodes(NULL, NULL, &nodes, &n) == LECHO_EINVAL);
    CASE("lecho_nodes(v, NULL, NULL, &n)", lecho_nodes(v, NULL, NULL, &n) == LECHO_EINVAL);
    CASE("lecho_nodes(v, NULL, &nodes, NULL)", lecho_nodes(v, NULL, &nodes, NULL) == LECHO_EINVAL);
    CASE("lecho_nodes_packed(NULL, ...)", lecho_nodes_packed(NULL, NULL, &nodes, &n, &bytes, &len) == LECHO_EINVAL);
    CASE("lecho_nodes_packed(v, k, NULL, ...)", lecho_nodes_packed(v, NULL, NULL, &n, &bytes, &len) == LECHO_EINVAL);
    CASE("lecho_nodes_packed(v, k, &nodes, NULL, ...)", lecho_nodes_packed(v, NULL, &nodes, NULL, &bytes, &len) == LECHO_EINVAL);
    CASE("lecho_nodes_packed(v, k, &nodes, &n, NULL, &len)", lecho_nodes_packed(v, NULL, &nodes, &n, NULL, &len) == LECHO_EINVAL);
    CASE("lecho_nodes_packed(v, k, &nodes, &n, &bytes, NULL)", lecho_nodes_packed(v, NULL, &nodes, &n, &bytes, NULL) == LECHO_EINVAL);
    CASE("lecho_set_nodes(NULL, k, nodes, 1)", lecho_nodes(v, NULL, &nodes, &n) == 0 &&
                                                  lecho_set_nodes(NULL, "k", nodes, n) == LECHO_EINVAL);
    CASE("lecho_set_nodes(v, k, NULL, 1)", lecho_set_nodes(v, "k", NULL, 1) == LECHO_EINVAL);
    CASE("lecho_to_string(NULL)", strcmp(lecho_to_string(NULL), "(no value)") == 0);

    /* ---- channels and producers ---- */
    CASE("lecho_channel_get(NULL, name)", lecho_channel_get(NULL, "t") == NULL);
    CASE("lecho_channel_get(ctx, NULL)", lecho_channel_get(ctx, NULL) == NULL);
    CASE("lecho_channel_name(NULL)", lecho_channel_name(NULL) == NULL);
    CASE("lecho_producer_open(NULL, NULL, &p)", lecho_producer_open(NULL, NULL, &po) == LECHO_EINVAL && po == NULL);
    CASE("lecho_producer_open(ch, NULL, NULL)", lecho_producer_open(ch, NULL, NULL) == LECHO_EINVAL);
    CASE("lecho_submit(NULL, ev)", lecho_submit(NULL, ev) == LECHO_EINVAL);
    CASE("lecho_submit(p, NULL)", lecho_submit(p, NULL) == LECHO_EINVAL);
    CASE("lecho_submit_sync(NULL, ev, 1, &errs)", lecho_submit_sync(NULL, ev, 1, &errs) == LECHO_EINVAL && errs == NULL);
    CASE("lecho_submit_sync(p, NULL, 1, &errs)", lecho_submit_sync(p, NULL, 1, &errs) == LECHO_EINVAL && errs == NULL);
    CASE("lecho_submit_sync(p, ev, 1, NULL)", (lecho_submit_sync(p, ev, 1, NULL), 1));
    CASE("lecho_submit_sync_start(NULL, ev, 1, &res)", lecho_submit_sync_start(NULL, ev, 1, &res) == LECHO_EINVAL);
    CASE("lecho_submit_sync_start(p, NULL, 1, &res)", lecho_submit_sync_start(p, NULL, 1, &res) == LECHO_EINVAL);
    CASE("lecho_submit_sync_start(p, ev, 1, NULL)", lecho_submit_sync_start(p, ev, 1, NULL) == LECHO_EINVAL);
    CASE("lecho_flush(NULL)", lecho_flush(NULL) == LECHO_EINVAL);
    CASE("lecho_producer_record(NULL, path)", lecho_producer_record(NULL, path) == LECHO_EINVAL);
    CASE("lecho_producer_record(p, NULL)", lecho_producer_record(p, NULL) == 0);
    CASE("lecho_recorder_open(NULL, path, NULL, &r)", lecho_recorder_open(NULL, path, NULL, &ro) == LECHO_EINVAL);
    CASE("lecho_recorder_open(ctx, NULL, NULL, &r)", lecho_recorder_open(ctx, NULL, NULL, &ro) == LECHO_EINVAL);
    CASE("lecho_recorder_open(ctx, path, NULL, NULL)", lecho_recorder_open(ctx, path, NULL, NULL) == LECHO_EINVAL);
    CASE("lecho_producer_record_to(NULL, NULL)", lecho_producer_record_to(NULL, NULL) == LECHO_EINVAL);
    CASE("lecho_producer_record_to(p, NULL)", (lecho_producer_record_to(p, NULL), 1));
    CASE("lecho_recorder_flush(NULL, 0)", lecho_recorder_flush(NULL, 0) == LECHO_EINVAL);
    CASE("lecho_recorder_stats(NULL)", lecho_recorder_stats(NULL) == NULL);
    CASE("lecho_recorder_close(NULL)", lecho_recorder_close(NULL) == NULL);
    CASE("lecho_producer_close(NULL)", (lecho_producer_close(NULL), 1));
    CASE("lecho_errors_count(NULL)", lecho_errors_count(NULL) == 0);
    CASE("lecho_errors_context(NULL, 0)", lecho_errors_context(NULL, 0) == NULL);
    CASE("lecho_errors_consumer(NULL, 0)", lecho_errors_consumer(NULL, 0) == NULL);
    CASE("lecho_errors_message(NULL, 0)", lecho_errors_message(NULL, 0) == NULL);
    CASE("lecho_errors_code(NULL, 0)", lecho_errors_code(NULL, 0) == 0);
    CASE("lecho_errors_text(NULL)", lecho_errors_text(NULL) == NULL);
    CASE("lecho_errors_free(NULL)", (lecho_errors_free(NULL), 1));

    /* ---- consumers, services, calls ---- */
    CASE("lecho_consumer_open(NULL, fn, NULL, &c)", lecho_consumer_open(NULL, handler, NULL, &co) == LECHO_EINVAL);
    CASE("lecho_consumer_open(ch, NULL, NULL, &c)", lecho_consumer_open(ch, NULL, NULL, &co) == LECHO_EINVAL);
    CASE("lecho_consumer_open(ch, fn, NULL, NULL)", lecho_consumer_open(ch, handler, NULL, NULL) == LECHO_EINVAL);
    CASE("lecho_consumer_open_opts(ch, fn, NULL, NULL, NULL)", lecho_consumer_open_opts(ch, handler, NULL, NULL, NULL) == LECHO_EINVAL);
    CASE("lecho_consumer_open_opts(ch, fn, NULL, NULL opts, &c)", lecho_consumer_open_opts(ch, handler, NULL, NULL, &co) == 0);
    CASE("lecho_consumer_on_error(NULL, fn, NULL)", lecho_consumer_on_error(NULL, on_err, NULL) == LECHO_EINVAL);
    CASE("lecho_consumer_on_error(c, NULL, NULL)", (lecho_consumer_on_error(cq, NULL, NULL), 1));
    CASE("lecho_consumer_open_queued(NULL, NULL, 8, &c)", lecho_consumer_open_queued(NULL, NULL, 8, &co) == LECHO_EINVAL);
    CASE("lecho_consumer_open_queued(ch, NULL, 8, NULL)", lecho_consumer_open_queued(ch, NULL, 8, NULL) == LECHO_EINVAL);
    CASE("lecho_consumer_take(NULL, v, ...)", lecho_consumer_take(NULL, v, 1, 0, &n, &len) == LECHO_EINVAL);
    CASE("lecho_consumer_take(c, NULL, ...)", lecho_consumer_take(cq, NULL, 1, 0, &n, &len) == LECHO_EINVAL);
    CASE("lecho_consumer_take(c, v, 1, 0, NULL, NULL)", lecho_consumer_take(cq, lecho_value_new(ctx), 1, 0, NULL, NULL) == 0);
    CASE("lecho_consumer_wait(NULL, 0)", lecho_consumer_wait(NULL, 0) == LECHO_EINVAL);
    CASE("lecho_consumer_settle(NULL, 0, NULL)", lecho_consumer_settle(NULL, 0, NULL) == LECHO_EINVAL);
    CASE("lecho_consumer_set_params(NULL, v)", lecho_consumer_set_params(NULL, v) == LECHO_EINVAL);
    CASE("lecho_consumer_close(NULL)", (lecho_consumer_close(NULL), 1));
    CASE("lecho_service_open(NULL, name, fn, ...)", lecho_service_open(NULL, "s", svc, NULL, NULL, &so) == LECHO_EINVAL);
    CASE("lecho_service_open(ctx, NULL, fn, ...)", lecho_service_open(ctx, NULL, svc, NULL, NULL, &so) == LECHO_EINVAL);
    CASE("lecho_service_open(ctx, name, NULL, ...)", lecho_service_open(ctx, "s", NULL, NULL, NULL, &so) == LECHO_EINVAL);
    CASE("lecho_service_open(ctx, name, fn, NULL, NULL, NULL)", lecho_service_open(ctx, "s", svc, NULL, NULL, NULL) == LECHO_EINVAL);
    CASE("lecho_service_close(NULL)", (lecho_service_close(NULL), 1));
    CASE("lecho_call(NULL, name, ...)", lecho_call(NULL, "s", NULL, NULL, &res) == LECHO_EINVAL);
    CASE("lecho_call(ctx, NULL, ...)", lecho_call(ctx, NULL, NULL, NULL, &res) == LECHO_EINVAL);
    CASE("lecho_call(ctx, name, NULL, NULL, NULL)", (lecho_call(ctx, "s", NULL, NULL, NULL), 1));   /* results: optional */
    CASE("lecho_call_start(NULL, name, ...)", lecho_call_start(NULL, "s", NULL, NULL, &res) == LECHO_EINVAL);
    CASE("lecho_call_start(ctx, NULL, ...)", lecho_call_start(ctx, NULL, NULL, NULL, &res) == LECHO_EINVAL);
    CASE("lecho_call_start(ctx, name, NULL, NULL, NULL)", lecho_call_start(ctx, "s", NULL, NULL, NULL) == LECHO_EINVAL);

    /* ---- NaN as a timeout or a linger: LECHO_EINVAL, nothing done ---- */
    CASE("lecho_run_once(ctx, NAN)", lecho_run_once(ctx, NAN) == LECHO_EINVAL);
    CASE("lecho_submit_sync(p, ev, NAN, &errs)", lecho_submit_sync(p, ev, NAN, &errs) == LECHO_EINVAL && errs == NULL);
    CASE("lecho_submit_sync_start(p, ev, NAN, &res)", lecho_submit_sync_start(p, ev, NAN, &res) == LECHO_EINVAL);
    CASE("lecho_consumer_wait(c, NAN)", lecho_consumer_wait(cq, NAN) == LECHO_EINVAL &&
                                            strstr(lecho_errmsg(ctx), "NaN") != NULL);
    /* a refused close frees nothing: the context is open and usable */
    CASE("lecho_close(ctx, NAN)", lecho_close(ctx, NAN) == LECHO_EINVAL && lecho_run_once(ctx, 0) == 0 &&
                                      lecho_submit(p, ev) == 0 && lecho_close(ctx, 0) == 0);
    CASE("lecho_close_err(ctx, NAN, err, n)", lecho_close_err(ctx, NAN, err, sizeof err) == LECHO_EINVAL &&
                                                  strstr(err, "NaN") != NULL && lecho_run_once(ctx, 0) == 0 &&
                                                  lecho_close(ctx, 0) == 0);
    CASE("lecho_close_keep(ctx, NAN, NULL, 0)", lecho_close_keep(ctx, NAN, NULL, 0) == LECHO_EINVAL &&
                                                    lecho_run_once(ctx, 0) == 0);
}

int main(void) {
    const char *opts[] = { "quiet", "true", NULL };
    char err[256];
    if (lecho_open(opts, &ctx, err, sizeof err) != 0) {
        fprintf(stderr, "test_args: lecho_open: %s\n", err);
        return 1;
    }
    snprintf(path, sizeof path, "/tmp/lecho-test-args-%d.lecho", (int)getpid());
    double d3[3] = { 1, 2, 3 };
    ch = lecho_channel_get(ctx, "t");
    v = lecho_value_new(ctx);
    ev = lecho_value_new(ctx);
    if (!ch || !v || !ev || lecho_set_numbers(v, "n", d3, 3) != 0 || lecho_set_string(v, "s", "str", 3) != 0 ||
        lecho_set_bool(v, "b", 1) != 0 || lecho_set_number(ev, NULL, 1) != 0 ||
        lecho_producer_open(ch, NULL, &p) != 0 ||
        lecho_consumer_open_queued(lecho_channel_get(ctx, "q"), NULL, 16, &cq) != 0) {
        fprintf(stderr, "test_args: set-up: %s\n", lecho_errmsg(ctx));
        return 1;
    }
    int ncases = 0;
    for (target = 0;; target++) {
        int fds[2];
        if (pipe(fds) != 0) return 1;
        fflush(stdout);
        fflush(stderr);
        pid_t pid = fork();
        if (pid < 0) return 1;
        if (pid == 0) {
            close(fds[0]);
            namefd = fds[1];
            alarm(20); /* a hang is a failure (SIGALRM), not the test's end */
            seen = 0;
            cases();
            _exit(77); /* past the last case */
        }
        close(fds[1]);
        int st = 0;
        while (waitpid(pid, &st, 0) < 0) {}
        char name[160] = "";
        ssize_t got = read(fds[0], name, sizeof name - 1);
        close(fds[0]);
        name[got > 0 ? got : 0] = 0;
        char *nl = strchr(name, '\n');
        if (nl) *nl = 0;
        if (WIFEXITED(st) && WEXITSTATUS(st) == 77) break;
        ncases++;
        if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
            passed++;
        } else {
            failed++;
            if (WIFSIGNALED(st))
                fprintf(stderr, "test_args: %s: killed by signal %d%s\n", name, WTERMSIG(st),
                        WTERMSIG(st) == SIGALRM ? " (it hung)" : "");
            else
                fprintf(stderr, "test_args: %s: not the documented result\n", name);
        }
    }
    unlink(path);
    CHECK(ncases > 100);
    lecho_close(ctx, 0);
    printf("test_args: %d cases\n", ncases);
    return TEST_SUMMARY();
}
