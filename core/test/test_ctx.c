/* test_ctx.c: two lecho contexts over loopback, driven through the public
 * header (lecho.h) only.  The main thread's context runs the name server and
 * produces; a second thread's context consumes (one context per thread, as
 * lecho.h allows).  Checks: values built and read in C, async events arrive
 * in order and whole, a sync submit succeeds, a consumer's error comes back
 * in the sync result, a silent consumer gives a timeout, misuse gives codes
 * (the Lua layer's, never guessed from a message's words), borrowed handles
 * and lecho_each callbacks cannot free what they do not own, and what
 * bindings use: values as nodes, modulated and queued consumers, services.
 * Prints "N passed, N failed" (read by .ci/run).
 *
 * Leans on build/liblecho.so, which finds the Lua layer of this checkout.
 */
#include "lecho.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <stdint.h>
#include <unistd.h>

#include "test.h"

#define NASYNC 200

static char ns_addr[64];
static int ready, stopped;        /* __atomic: main <-> consumer thread */
static int nseen, in_order = 1;   /* written by the consumer thread only */
static double sum_u;              /* idem */
static char last_payload[16];     /* idem */
static int nested_ok;             /* idem */
static lecho_producer *blocking, *dropping; /* the consumer thread's, on "fwd" */
static int borrowed_ok;           /* written by the consumer thread only */
static int arrays_ok = -1;        /* idem: the last "arr" event read right (1) or not (0) */
static int narrays;               /* idem */
static int freed;                 /* the main thread's free callback ran (count) */

/* lecho_set_array's free function (main thread). */
static void free_arr(void *data, void *ud) {
    CHECK(ud == (void *)&freed);
    free(data);
    freed++;
}

static const char *handler(const lecho_value *ev, const lecho_meta *meta, void *ud) {
    double k, sleep_s;
    if (lecho_type(ev, "nested") == LECHO_TBOOLEAN) {
        /* What waits is refused inside a handler, with a message. */
        lecho_producer *p;
        lecho_consumer *c;
        lecho_channel *ch = lecho_channel_get(ud, "other");
        int ok = lecho_producer_open(ch, NULL, &p) == LECHO_EINVAL && p == NULL &&
                 strstr(lecho_errmsg(ud), "not from a consumer handler") != NULL &&
                 lecho_consumer_open(ch, handler, ud, &c) == LECHO_EINVAL &&
                 lecho_run_once(ud, 0) == LECHO_EINVAL && lecho_close(ud, 0) == LECHO_EINVAL;
        /* Forwarding: a blocking producer is refused, a dropping one works. */
        ok = ok && lecho_submit(blocking, ev) == LECHO_EINVAL && lecho_submit(dropping, ev) == 0;
        __atomic_store_n(&nested_ok, ok, __ATOMIC_RELEASE);
        return NULL;
    }
    if (lecho_get_number(ev, "sleep", &sleep_s) == 0) {
        usleep((useconds_t)(sleep_s * 1e6)); /* holds this context's loop: no answer */
        if (lecho_type(ev, "quit") == LECHO_TBOOLEAN) lecho_stop(ud);
        return NULL;
    }
    if (lecho_type(ev, "quit") == LECHO_TBOOLEAN) {
        lecho_stop(ud); /* lecho_run returns after this turn */
        return NULL;
    }
    if (lecho_type(ev, "arr") == LECHO_TARRAY) {
        /* { arr = n x 3 doubles (i*3+j + base), base = } and, maybe, small = <i2 [2] */
        lecho_array_info ai;
        double base = 0;
        int ok = lecho_get_array(ev, "arr", &ai) == 0 && lecho_get_number(ev, "base", &base) == 0 &&
                 strcmp(ai.dtype, "<f8") == 0 && ai.ndim == 2 && ai.shape[1] == 3 &&
                 ai.count == ai.shape[0] * 3 && ai.itemsize == 8 &&
                 (uintptr_t)ai.data % 8 == 0;
        for (size_t i = 0; ok && i < ai.count; i++) ok = ((const double *)ai.data)[i] == (double)i + base;
        if (lecho_type(ev, "small") == LECHO_TARRAY) {
            ok = ok && lecho_get_array(ev, "small", &ai) == 0 && strcmp(ai.dtype, "<i2") == 0 &&
                 ai.count == 2 && ((const short *)ai.data)[1] == -7;
        }
        ok = ok && lecho_get_array(ev, "base", &ai) == LECHO_EINVAL &&
             lecho_get_array(ev, "nope", &ai) == LECHO_ENOTFOUND;
        __atomic_store_n(&arrays_ok, ok, __ATOMIC_RELEASE);
        __atomic_store_n(&narrays, __atomic_load_n(&narrays, __ATOMIC_RELAXED) + 1, __ATOMIC_RELEASE);
        return ok ? NULL : "bad array";
    }
    if (lecho_type(ev, "fail") == LECHO_TBOOLEAN) return "boom: the handler failed";
    /* A message with the word "timeout" in it is still a failed handler. */
    if (lecho_type(ev, "fail_timeout") == LECHO_TBOOLEAN) return "timeout while reading the sensor";
    if (lecho_type(ev, "free_ev") == LECHO_TBOOLEAN) {
        /* The event is borrowed: freeing it is a no-op, it stays readable. */
        lecho_value_free((lecho_value *)ev);
        __atomic_store_n(&borrowed_ok, lecho_type(ev, "free_ev") == LECHO_TBOOLEAN, __ATOMIC_RELEASE);
        return NULL;
    }
    if (lecho_get_number(ev, "k", &k) == 0) {
        int n = __atomic_load_n(&nseen, __ATOMIC_RELAXED);
        if (k != n + 1 || meta->seq != n + 1 || strcmp(meta->channel, "t") != 0)
            in_order = 0;
        double u[4];
        if (lecho_get_numbers(ev, "u", u, 4) == 3) sum_u += u[0] + u[1] + u[2];
        size_t len;
        const char *s = lecho_get_string(ev, "bytes", &len);
        if (s && len < sizeof last_payload) memcpy(last_payload, s, len);
        __atomic_store_n(&nseen, n + 1, __ATOMIC_RELEASE);
    }
    return NULL;
}

static void *consumer_thread(void *arg) {
    (void)arg;
    const char *opts[] = { "nameserver", ns_addr, "quiet", "true", NULL };
    lecho_ctx *ctx;
    char err[256];
    if (lecho_open(opts, &ctx, err, sizeof err) != 0) {
        fprintf(stderr, "consumer: %s\n", err);
        __atomic_store_n(&ready, -1, __ATOMIC_RELEASE);
        return NULL;
    }
    lecho_consumer *c;
    if (lecho_consumer_open(lecho_channel_get(ctx, "t"), handler, ctx, &c) != 0) {
        fprintf(stderr, "consumer: %s\n", lecho_errmsg(ctx));
        __atomic_store_n(&ready, -1, __ATOMIC_RELEASE);
    } else if (lecho_producer_open(lecho_channel_get(ctx, "fwd"), NULL, &blocking) != 0 ||
               lecho_producer_open(lecho_channel_get(ctx, "fwd"), "drop_newest", &dropping) != 0) {
        fprintf(stderr, "consumer: %s\n", lecho_errmsg(ctx));
        __atomic_store_n(&ready, -1, __ATOMIC_RELEASE);
    } else {
        __atomic_store_n(&ready, 1, __ATOMIC_RELEASE);
    }
    /* Until the producer says { quit = true } (or ready failed). */
    if (__atomic_load_n(&ready, __ATOMIC_ACQUIRE) == 1) lecho_run(ctx);
    lecho_close(ctx, 0);
    __atomic_store_n(&stopped, 1, __ATOMIC_RELEASE);
    return NULL;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* A sync submit on p of { [flag] = true }, which tells the consumer
 * thread's handler what to do; the value freed, the code returned (errs as
 * lecho_submit_sync's). */
static int submit_flag(lecho_ctx *ctx, lecho_producer *p, const char *flag, lecho_errors **errs) {
    lecho_value *v = lecho_value_new(ctx);
    lecho_set_bool(v, flag, 1);
    int rc = lecho_submit_sync(p, v, 5, errs);
    lecho_value_free(v);
    return rc;
}

static int count_field(const char *key, const lecho_value *v, void *ud) {
    (void)v;
    if (strcmp(key, "a") == 0 || strcmp(key, "s") == 0) ++*(int *)ud;
    return 0;
}

/* lecho_each's callback: what waits or frees the context is refused. */
static lecho_ctx *each_ctx;
static int each_rc[4];
static int close_in_each(const char *key, const lecho_value *v, void *ud) {
    (void)ud;
    each_rc[0] = lecho_close(each_ctx, 0);
    each_rc[1] = strstr(lecho_errmsg(each_ctx), "lecho_each") != NULL;
    each_rc[2] = lecho_run_once(each_ctx, 0);
    lecho_value_free((lecho_value *)v); /* borrowed: a no-op */
    each_rc[3] = lecho_type(v, NULL) != LECHO_TNIL && key[0] != 0;
    return 7; /* stops the walk: lecho_each returns it */
}

/* lecho_pairs: counts the keys by type (ud: int[LECHO_TOTHER + 1]). */
static int count_keys(const lecho_value *key, const lecho_value *v, void *ud) {
    (void)v;
    ((int *)ud)[lecho_type(key, NULL)]++;
    return 0;
}

/* The value API without a peer. */
/* A service handler: result = args.x * 2, or a message when x is missing. */
static const char *doubler(const lecho_value *args, const lecho_value *meta, lecho_value *result, void *ud) {
    double x;
    (void)ud;
    if (lecho_type(meta, "service") != LECHO_TSTRING) return "no meta.service";
    if (lecho_get_number(args, "x", &x) != 0) return "x must be a number";
    lecho_set_number(result, NULL, 2 * x);
    return NULL;
}

static int nmod, nodd; /* events the modulated consumer got; odd ones among them */
static const char *count_mod(const lecho_value *ev, const lecho_meta *meta, void *ud) {
    double k;
    (void)meta;
    (void)ud;
    nmod++;
    if (lecho_get_number(ev, "k", &k) != 0 || ((int)k % 2) != 0) nodd++;
    return NULL;
}

/* What bindings use (python/lecho): whole values as nodes, modulated and
 * queued consumers, services and calls; all in the one context. */
static void test_bindings(lecho_ctx *ctx) {
    /* nodes: { 1.5, "ab", t = true, sub = { 7 } } */
    lecho_node in[] = {
        { LECHO_TTABLE, 4, 2, 0, NULL, NULL },
        { LECHO_TNUMBER, 0, 0, 1.5, NULL, NULL },
        { LECHO_TSTRING, 2, 0, 0, "ab", NULL },
        { LECHO_TSTRING, 1, 0, 0, "t", NULL }, { LECHO_TBOOLEAN, 0, 0, 1, NULL, NULL },
        { LECHO_TSTRING, 3, 0, 0, "sub", NULL }, { LECHO_TTABLE, 1, 1, 0, NULL, NULL }, { LECHO_TNUMBER, 0, 0, 7, NULL, NULL },
    };
    lecho_value *v = lecho_value_new(ctx);
    CHECK(lecho_set_nodes(v, NULL, in, 8) == 0);
    CHECK(lecho_len(v, NULL) == 2 && lecho_type(v, "t") == LECHO_TBOOLEAN);
    const lecho_node *out;
    size_t n = 0;
    CHECK(lecho_nodes(v, NULL, &out, &n) == 0 && n == 8);
    CHECK(out[0].type == LECHO_TTABLE && out[0].n == 4 && out[0].len == 2);
    CHECK(out[1].type == LECHO_TNUMBER && out[1].num == 1.5);
    CHECK(out[2].type == LECHO_TSTRING && out[2].n == 2 && memcmp(out[2].str, "ab", 2) == 0);
    const char *bytes;
    size_t nbytes = 0;
    CHECK(lecho_nodes_packed(v, NULL, &out, &n, &bytes, &nbytes) == 0 && n == 8);
    CHECK(nbytes == 3 + 2 + 4 && out[2].str == bytes && strcmp(bytes, "ab") == 0);
    /* malformed nodes: refused with a code, nothing set */
    lecho_node nilkey[] = { { LECHO_TTABLE, 1, 0, 0, NULL, NULL }, { LECHO_TNIL, 0, 0, 0, NULL, NULL },
                            { LECHO_TNUMBER, 0, 0, 1, NULL, NULL } };
    CHECK(lecho_set_nodes(v, "bad", nilkey, 3) == LECHO_EINVAL && strstr(lecho_errmsg(ctx), "nil or NaN key"));
    CHECK(lecho_set_nodes(v, "bad", nilkey, 1) == LECHO_EINVAL); /* ends inside the table */
    CHECK(lecho_set_nodes(v, "bad", in + 1, 2) == LECHO_EINVAL); /* left over */
    CHECK(lecho_type(v, "bad") == LECHO_TNIL);
    /* an array is one node over its own memory, with its dtype and shape */
    static const short elems[6] = { 1, 2, 3, 4, 5, 6 };
    size_t shape[2] = { 2, 3 };
    /* a field of a value that is not a table: refused, said, nothing set
     * (lecho_set and lecho_set_array on the Lua path share where to set) */
    lecho_value *num = lecho_value_new(ctx);
    CHECK(lecho_set_nodes(num, NULL, in + 1, 1) == 0 && lecho_type(num, NULL) == LECHO_TNUMBER);
    CHECK(lecho_set_number(num, "k", 2) == LECHO_EINVAL &&
          strcmp(lecho_errmsg(ctx), "lecho_set: the value is not a table") == 0);
    CHECK(lecho_set_array(num, "a", "<i2", 2, shape, elems, NULL, NULL) == LECHO_EINVAL &&
          strcmp(lecho_errmsg(ctx), "lecho_set_array: the value is not a table") == 0);
    CHECK(lecho_type(num, NULL) == LECHO_TNUMBER);
    lecho_value_free(num);
    CHECK(lecho_set_array(v, "arr", "<i2", 2, shape, elems, NULL, NULL) == 0);
    lecho_value *arr = lecho_field(v, "arr", 0);
    CHECK(arr && lecho_nodes(arr, NULL, &out, &n) == 0 && n == 1 && out[0].type == LECHO_TARRAY);
    CHECK(out[0].n == 12 && out[0].array && out[0].array->ndim == 2 && out[0].array->shape[1] == 3);
    CHECK(strcmp(out[0].array->dtype, "<i2") == 0 && memcmp(out[0].str, elems, 12) == 0);
    lecho_node anode = { LECHO_TARRAY, 12, 0, 0, (const char *)elems, NULL };
    CHECK(lecho_set_nodes(v, "bad", &anode, 1) == LECHO_EINVAL); /* arrays: lecho_set_array */
    lecho_value_free(arr);

    /* a modulator at the producer (here: the same context) */
    lecho_channel *ch = lecho_channel_get(ctx, "bind.mod");
    lecho_value *opts = lecho_value_new(ctx);
    const char *even = "function enqueue(ev) if ev.k % 2 == 0 then return ev end end";
    lecho_set_string(opts, "modulator", even, strlen(even));
    lecho_consumer *mc = NULL, *qc = NULL;
    CHECK(lecho_consumer_open_opts(ch, count_mod, NULL, opts, &mc) == 0);
    lecho_set_string(opts, "modulator", "not lua", 7);
    lecho_consumer *bad = NULL;
    CHECK(lecho_consumer_open_opts(ch, count_mod, NULL, opts, &bad) == LECHO_EINVAL && bad == NULL);
    /* a queued consumer of 3 events at most */
    CHECK(lecho_consumer_open_queued(ch, NULL, 3, &qc) == 0);
    lecho_producer *p = NULL;
    CHECK(lecho_producer_open(ch, NULL, &p) == 0);
    for (int k = 1; k <= 5; k++) {
        lecho_set_nil(v, NULL);
        lecho_set_number(v, "k", k);
        CHECK(lecho_submit(p, v) == 0);
    }
    for (int i = 0; i < 20 && nmod < 2; i++) lecho_run_once(ctx, 0.05);
    lecho_run_once(ctx, 0.05);
    CHECK(nmod == 2 && nodd == 0); /* the modulator kept k = 2, 4 */
    size_t taken = 9, dropped = 9;
    lecho_value *batch = lecho_value_new(ctx);
    CHECK(lecho_consumer_take(qc, batch, 2, 1, &taken, &dropped) == 0 && taken == 2 && dropped == 2);
    lecho_value *first = lecho_field(batch, NULL, 0);
    lecho_value *ev1 = first ? lecho_field(first, NULL, 0) : NULL;
    double k = 0;
    CHECK(ev1 && lecho_get_number(ev1, "k", &k) == 0 && k == 1);
    CHECK(lecho_consumer_take(qc, batch, 10, 0, &taken, &dropped) == 0 && taken == 1 && lecho_len(batch, NULL) == 1);
    CHECK(lecho_consumer_take(qc, batch, 10, 0, &taken, NULL) == 0 && taken == 0);
    CHECK(lecho_consumer_take(mc, batch, 10, 0, &taken, NULL) == LECHO_EINVAL); /* not queued */
    /* the queue full: a sync submit is told */
    for (int i = 0; i < 3; i++) lecho_submit(p, v);
    lecho_errors *errs = NULL;
    CHECK(lecho_submit_sync(p, v, 2, &errs) == LECHO_EFAILED);
    CHECK(lecho_errors_count(errs) == 1 && strcmp(lecho_errors_message(errs, 0), "queue full") == 0);
    lecho_errors_free(errs);
    /* a sync event queued is not handled yet: its ack waits for
     * lecho_consumer_settle (here it never comes in time) */
    CHECK(lecho_consumer_take(qc, batch, 10, 0, &taken, NULL) == 0 && taken == 3);
    CHECK(lecho_consumer_settle(qc, 3, NULL) == 0);
    CHECK(lecho_submit_sync(p, v, 0.3, NULL) == LECHO_ETIMEOUT);
    CHECK(lecho_consumer_take(qc, batch, 10, 0, &taken, NULL) == 0 && taken == 1);
    CHECK(lecho_consumer_settle(qc, 5, "late") == 0); /* at most what was taken */
    CHECK(lecho_consumer_settle(mc, 1, NULL) == LECHO_EINVAL); /* not queued */
    lecho_run_once(ctx, 0.05); /* the late ack, dropped by the producer */
    lecho_consumer_close(qc);
    lecho_consumer_close(mc);
    lecho_producer_close(p);

    /* a service and calls */
    lecho_service *s = NULL;
    CHECK(lecho_service_open(ctx, "bind.double", doubler, NULL, NULL, &s) == 0);
    lecho_value *args = lecho_value_new(ctx), *res = NULL;
    lecho_set_number(args, "x", 21);
    CHECK(lecho_call(ctx, "bind.double", args, NULL, &res) == 0);
    double r = 0;
    CHECK(res && lecho_get_number(res, "n", &r) == 0 && r == 1);
    CHECK(res && lecho_get_numbers(res, NULL, &r, 1) == 1 && r == 42);
    lecho_value_free(res);
    lecho_set_nil(args, NULL);
    CHECK(lecho_call(ctx, "bind.double", args, NULL, &res) == LECHO_EFAILED);
    CHECK(strstr(lecho_errmsg(ctx), "x must be a number") != NULL);
    CHECK(res && lecho_type(res, NULL) == LECHO_TSTRING);
    lecho_value_free(res);
    lecho_value *copts = lecho_value_new(ctx);
    lecho_set_number(copts, "timeout", 2);
    CHECK(lecho_call(ctx, "bind.nobody", args, copts, NULL) == LECHO_ENOSERVICE);
    lecho_service_close(s);
    CHECK(lecho_call(ctx, "bind.double", args, copts, NULL) == LECHO_ENOSERVICE);
    lecho_value_free(copts);
    lecho_value_free(args);
    lecho_value_free(ev1);
    lecho_value_free(first);
    lecho_value_free(batch);
    lecho_value_free(opts);
    lecho_value_free(v);
}

static void test_values(lecho_ctx *ctx) {
    lecho_value *v = lecho_value_new(ctx);
    double x = 0, arr[5];
    int b = 0;
    size_t len = 0;
    CHECK(lecho_type(v, NULL) == LECHO_TNIL);
    CHECK(lecho_set_number(v, NULL, 2.5) == 0 && lecho_get_number(v, NULL, &x) == 0 && x == 2.5);
    CHECK(lecho_set_number(v, "a", 1) == LECHO_EINVAL); /* the slot holds a number */
    CHECK(lecho_set_nil(v, NULL) == 0 && lecho_set_number(v, "a", 1) == 0);
    CHECK(lecho_type(v, NULL) == LECHO_TTABLE && lecho_type(v, "a") == LECHO_TNUMBER);
    CHECK(lecho_set_string(v, "s", "x\0y", 3) == 0);
    const char *s = lecho_get_string(v, "s", &len);
    CHECK(s && len == 3 && memcmp(s, "x\0y", 3) == 0);
    CHECK(lecho_get_number(v, "s", &x) == LECHO_EINVAL);
    CHECK(lecho_get_number(v, "missing", &x) == LECHO_ENOTFOUND);
    CHECK(lecho_set_bool(v, "ok", 1) == 0 && lecho_get_bool(v, "ok", &b) == 0 && b == 1);
    double u[3] = { 1.5, -2, 1e300 };
    CHECK(lecho_set_numbers(v, "u", u, 3) == 0 && lecho_len(v, "u") == 3);
    CHECK(lecho_get_numbers(v, "u", arr, 2) == 3 && arr[0] == 1.5 && arr[1] == -2);
    CHECK(lecho_set_table(v, "sub") == 0);
    lecho_value *sub = lecho_field(v, "sub", 0);
    CHECK(sub && lecho_set_number(sub, "depth", 2) == 0); /* shared: shows in v.sub */
    lecho_value *u1 = lecho_field(v, "u", 0), *u2 = lecho_field(u1, NULL, 1);
    CHECK(u1 && u2 && lecho_get_number(u2, NULL, &x) == 0 && x == -2);
    lecho_value *sub2 = lecho_field(v, "sub", 0);
    CHECK(sub2 && lecho_get_number(sub2, "depth", &x) == 0 && x == 2);
    int n = 0;
    CHECK(lecho_each(v, count_field, &n) == 0 && n == 2);
    /* lecho_pairs sees what lecho_each skips: a number and a boolean key. */
    lecho_value *keyed = lecho_value_new(ctx), *one = lecho_value_new(ctx);
    int nkeys[LECHO_TOTHER + 1] = { 0 };
    double ones[1] = { 0.4 };
    CHECK(lecho_set_numbers(keyed, NULL, ones, 1) == 0 && lecho_set_number(keyed, "alpha", 0.3) == 0);
    CHECK(lecho_set_bool(one, NULL, 1) == 0);
    lecho_value *t = lecho_field(keyed, NULL, 0); /* keyed[1]: the number key */
    CHECK(t && lecho_type(t, NULL) == LECHO_TNUMBER);
    lecho_value_free(t);
    CHECK(lecho_pairs(keyed, count_keys, nkeys) == 0);
    CHECK(nkeys[LECHO_TSTRING] == 1 && nkeys[LECHO_TNUMBER] == 1);
    lecho_value_free(one);
    lecho_value_free(keyed);
    /* Closing the context from a lecho_each callback is refused, not a crash. */
    each_ctx = ctx;
    CHECK(lecho_each(v, close_in_each, NULL) == 7);
    CHECK(each_rc[0] == LECHO_EINVAL && each_rc[1] == 1 && each_rc[2] == LECHO_EINVAL && each_rc[3] == 1);
    const char *text = lecho_to_string(v);
    CHECK(strstr(text, "a = 1") != NULL && strstr(text, "depth = 2") != NULL);
    lecho_value *w = lecho_value_new(ctx);
    CHECK(lecho_set_value(w, "inner", sub) == 0 && lecho_set_number(sub, "depth", 3) == 0);
    CHECK(lecho_get_number(sub2, "depth", &x) == 0 && x == 3);
    lecho_value_free(w);
    lecho_value_free(sub);
    lecho_value_free(sub2);
    lecho_value_free(u1);
    lecho_value_free(u2);
    lecho_value_free(v);
    CHECK(strcmp(lecho_strerror(LECHO_ETIMEOUT), "timeout") == 0);
    CHECK(strcmp(lecho_strerror(LECHO_EFAILED), "failed") == 0);
    CHECK(strcmp(lecho_strerror(99), "unknown") == 0);
    /* No handle: a code, never a crash. */
    CHECK(lecho_run_once(NULL, 0) == LECHO_EINVAL && lecho_channel_get(NULL, "t") == NULL);
    CHECK(lecho_get_number(NULL, "a", &x) == LECHO_EINVAL && lecho_type(NULL, NULL) == LECHO_TNIL);
    CHECK(lecho_value_new(NULL) == NULL && lecho_stat(NULL, "t", "events_out") == -1);
    CHECK(lecho_open(NULL, NULL, NULL, 0) == LECHO_EINVAL);
    lecho_value *w2 = lecho_value_new(ctx);
    CHECK(lecho_set_string(w2, NULL, NULL, 5) == LECHO_EINVAL && lecho_type(w2, NULL) == LECHO_TNIL);
    CHECK(lecho_set_string(w2, NULL, NULL, 0) == 0 && lecho_get_string(w2, NULL, &len) && len == 0);
    lecho_value_free(w2);
    /* A refused channel name keeps its reason. */
    CHECK(lecho_channel_get(ctx, "") == NULL && strstr(lecho_errmsg(ctx), "out of memory") == NULL &&
          strstr(lecho_errmsg(ctx), "channel name") != NULL);
    /* Asking for a counter creates no channel. */
    CHECK(lecho_stat(ctx, "nochan", "events_out") == -1);
    lecho_value *st = lecho_stats(ctx), *chans = st ? lecho_field(st, "channels", 0) : NULL;
    char full[96];
    snprintf(full, sizeof full, "%s/nochan", lecho_nameserver(ctx));
    CHECK(chans && lecho_type(chans, full) == LECHO_TNIL);
    lecho_value_free(chans);
    lecho_value_free(st);
}

/* Misuse of lecho_open: LECHO_EINVAL and the message without Lua's
 * "file.lua:N:" places. */
static void test_open_misuse(void) {
    lecho_ctx *x = NULL;
    char err[256] = "";
    const char *typo[] = { "namserver", "127.0.0.1:1", "quiet", "true", NULL };
    CHECK(lecho_open(typo, &x, err, sizeof err) == LECHO_EINVAL && x == NULL);
    CHECK(strstr(err, "namserver") != NULL && strstr(err, ".lua:") == NULL);
    const char *pol[] = { "policy", "blok", "quiet", "true", NULL };
    CHECK(lecho_open(pol, &x, err, sizeof err) == LECHO_EINVAL && x == NULL);
    CHECK(strstr(err, "blok") != NULL && strstr(err, ".lua:") == NULL);
}

int main(void) {
    lecho_ctx *ctx = NULL, *bad = NULL;
    char err[256] = "";
    const char *badopts[] = { "nameserver", "no-port-here", "quiet", "true", NULL };
    CHECK(lecho_open(badopts, &bad, err, sizeof err) != 0 && bad == NULL && err[0] != 0);
    test_open_misuse();

    const char *opts[] = { "quiet", "true", NULL };
    CHECK(lecho_open(opts, &ctx, err, sizeof err) == 0);
    if (!ctx) {
        fprintf(stderr, "open: %s\n", err);
        return TEST_SUMMARY();
    }
    CHECK(strncmp(lecho_address(ctx), "127.0.0.1:", 10) == 0);
    CHECK(strcmp(lecho_address(ctx), lecho_nameserver(ctx)) == 0);
    snprintf(ns_addr, sizeof ns_addr, "%s", lecho_nameserver(ctx));
    test_values(ctx);
    test_bindings(ctx);

    pthread_t th;
    CHECK(pthread_create(&th, NULL, consumer_thread, NULL) == 0);
    double t0 = now();
    while (!__atomic_load_n(&ready, __ATOMIC_ACQUIRE) && now() - t0 < 10) lecho_run_once(ctx, 0.02);
    CHECK(__atomic_load_n(&ready, __ATOMIC_ACQUIRE) == 1);

    lecho_channel *ch = lecho_channel_get(ctx, "t");
    CHECK(ch != NULL && lecho_channel_get(ctx, "t") == ch);
    CHECK(strstr(lecho_channel_name(ch), "/t") != NULL);
    lecho_producer *p = NULL;
    CHECK(lecho_producer_open(ch, NULL, &p) == 0);

    /* Async: in order and whole. */
    lecho_value *ev = lecho_value_new(ctx);
    double u[3] = { 1, 2, 3 };
    for (int k = 1; k <= NASYNC; k++) {
        lecho_set_number(ev, "k", k);
        lecho_set_numbers(ev, "u", u, 3);
        lecho_set_string(ev, "bytes", "a\0b", 3);
        CHECK(lecho_submit(p, ev) == 0);
    }
    lecho_value_free(ev);
    /* A sync submit returns once those were handled too (order). */
    lecho_value *sync = lecho_value_new(ctx);
    lecho_set_number(sync, "ping", 1);
    lecho_errors *errs = NULL;
    CHECK(lecho_submit_sync(p, sync, 5, &errs) == 0 && errs == NULL);
    CHECK(__atomic_load_n(&nseen, __ATOMIC_ACQUIRE) == NASYNC);
    CHECK(in_order == 1);
    CHECK(sum_u == 6.0 * NASYNC);
    CHECK(memcmp(last_payload, "a\0b", 3) == 0);
    /* Its one consumer is another context (the thread's): every event,
     * the sync one too, sent to it once; none here, none to nobody. */
    CHECK(lecho_stat(ctx, "t", "events_out") == NASYNC + 1);
    CHECK(lecho_stat(ctx, "t", "events_local") == 0);
    CHECK(lecho_stat(ctx, "t", "events_no_dest") == 0);
    CHECK(lecho_stat(ctx, "t", "no_such_counter") == -1);
    lecho_value *st = lecho_stats(ctx);
    CHECK(st && lecho_type(st, "channels") == LECHO_TTABLE);
    lecho_value_free(st);

    /* Arrays: lent (copied into the message during the submit: the
     * buffer is changed right after and the consumer sees the old values)
     * and owned (sent from its memory, freed by the callback once written
     * and no longer held), 1 and 2 MB, beside a small one. */
    {
        size_t rows = 40000, shape[2] = { rows, 3 }, sshape[1] = { 2 };
        double *lent = malloc(rows * 3 * sizeof *lent);
        short small[2] = { 3, -7 };
        for (size_t i = 0; i < rows * 3; i++) lent[i] = (double)i;
        lecho_value *av = lecho_value_new(ctx);
        CHECK(lecho_set_array(av, "arr", "<f8", 2, shape, lent, NULL, NULL) == 0);
        CHECK(lecho_set_array(av, "small", "<i2", 1, sshape, small, NULL, NULL) == 0);
        CHECK(lecho_set_number(av, "base", 0) == 0);
        CHECK(lecho_type(av, "arr") == LECHO_TARRAY);
        lecho_array_info ai;
        CHECK(lecho_get_array(av, "arr", &ai) == 0 && ai.data == lent && ai.count == rows * 3);
        CHECK(lecho_submit(p, av) == 0);
        for (size_t i = 0; i < rows * 3; i++) lent[i] = -1; /* after the submit: not sent */
        free(lent);
        lecho_value_free(av);
        double *owned = malloc(2 * rows * 3 * sizeof *owned);
        shape[0] = 2 * rows;
        for (size_t i = 0; i < 2 * rows * 3; i++) owned[i] = (double)i + 5;
        av = lecho_value_new(ctx);
        CHECK(lecho_set_array(av, "arr", "<f8", 2, shape, owned, free_arr, &freed) == 0);
        CHECK(lecho_set_number(av, "base", 5) == 0);
        CHECK(lecho_submit_sync(p, av, 10, &errs) == 0 && errs == NULL);
        lecho_errors_free(errs);
        errs = NULL;
        CHECK(__atomic_load_n(&narrays, __ATOMIC_ACQUIRE) == 2);
        CHECK(__atomic_load_n(&arrays_ok, __ATOMIC_ACQUIRE) == 1);
        CHECK(freed == 0); /* still held by av */
        lecho_value_free(av);
        for (int i = 0; i < 50 && freed == 0; i++) lecho_run_once(ctx, 0.01);
        /* misuse */
        av = lecho_value_new(ctx);
        CHECK(lecho_set_array(av, "x", "<f16", 1, sshape, small, NULL, NULL) == LECHO_EINVAL);
        CHECK(lecho_set_array(av, "x", "<i2", 9, sshape, small, NULL, NULL) == LECHO_EINVAL);
        CHECK(lecho_set_array(av, "x", "<i2", 1, sshape, NULL, NULL, NULL) == LECHO_EINVAL);
        lecho_value_free(av);
    }

    /* A handler's error comes back in the sync result. */
    lecho_value *bad_ev = lecho_value_new(ctx);
    lecho_set_bool(bad_ev, "fail", 1);
    CHECK(lecho_submit_sync(p, bad_ev, 5, &errs) == LECHO_EFAILED);
    CHECK(lecho_errors_count(errs) == 1);
    CHECK(lecho_errors_message(errs, 0) && strstr(lecho_errors_message(errs, 0), "boom: the handler failed"));
    CHECK(lecho_errors_context(errs, 0) && strncmp(lecho_errors_context(errs, 0), "127.0.0.1:", 10) == 0);
    CHECK(lecho_errors_message(errs, 1) == NULL);
    CHECK(lecho_errors_text(errs) && strstr(lecho_errors_text(errs), "boom"));
    CHECK(lecho_errors_code(errs, 0) == LECHO_EFAILED && lecho_errors_code(errs, 1) == LECHO_OK);
    lecho_errors_free(errs);
    /* The code is the Lua layer's, not a word of the handler's message. */
    lecho_set_nil(bad_ev, NULL);
    lecho_set_bool(bad_ev, "fail_timeout", 1);
    CHECK(lecho_submit_sync(p, bad_ev, 5, &errs) == LECHO_EFAILED);
    CHECK(lecho_errors_count(errs) == 1 && lecho_errors_code(errs, 0) == LECHO_EFAILED);
    lecho_errors_free(errs);
    lecho_value_free(bad_ev);

    /* A consumer of this context is "local" in the list (lecho.h). */
    lecho_consumer *lc = NULL;
    lecho_producer *lp = NULL;
    lecho_channel *lch = lecho_channel_get(ctx, "loc");
    CHECK(lecho_consumer_open(lch, handler, ctx, &lc) == 0 && lecho_producer_open(lch, NULL, &lp) == 0);
    CHECK(submit_flag(ctx, lp, "fail", &errs) == LECHO_EFAILED);
    CHECK(lecho_errors_context(errs, 0) && strcmp(lecho_errors_context(errs, 0), "local") == 0);
    lecho_errors_free(errs);
    lecho_producer_close(lp);
    lecho_consumer_close(lc);

    /* A handler freeing its borrowed event. */
    CHECK(submit_flag(ctx, p, "free_ev", NULL) == 0);
    CHECK(__atomic_load_n(&borrowed_ok, __ATOMIC_ACQUIRE) == 1);

    /* A consumer that does not answer in time. */
    lecho_value *slow = lecho_value_new(ctx);
    lecho_set_number(slow, "sleep", 1.0);
    t0 = now();
    CHECK(lecho_submit_sync(p, slow, 0.3, &errs) == LECHO_ETIMEOUT);
    CHECK(now() - t0 < 0.9);
    CHECK(lecho_errors_count(errs) == 1 && strstr(lecho_errors_message(errs, 0), "no answer"));
    lecho_errors_free(errs);
    lecho_value_free(slow);

    /* Calls that wait, from a handler. */
    CHECK(submit_flag(ctx, p, "nested", NULL) == 0);
    CHECK(__atomic_load_n(&nested_ok, __ATOMIC_ACQUIRE) == 1);

    /* Misuse: no value. */
    CHECK(lecho_submit(p, NULL) == LECHO_EINVAL);

    /* Closing with what cannot be delivered in time: the consumer holds
     * its loop (then stops it); a dropping producer fills the queue. */
    lecho_producer *flood = NULL;
    CHECK(lecho_producer_open(ch, "drop_newest", &flood) == 0);
    lecho_value *hold = lecho_value_new(ctx);
    lecho_set_number(hold, "sleep", 1.5);
    lecho_set_bool(hold, "quit", 1);
    CHECK(lecho_submit(p, hold) == 0);
    lecho_value_free(hold);
    lecho_value *big = lecho_value_new(ctx);
    size_t nbig = 1 << 20;
    char *bytes = calloc(1, nbig);
    CHECK(bytes && lecho_set_string(big, "big", bytes, nbig) == 0);
    for (int i = 0; i < 32; i++) {
        lecho_submit(flood, big);
        lecho_run_once(ctx, 0);
    }
    free(bytes);
    lecho_value_free(big);
    char cerr[256] = "x";
    CHECK(lecho_close_err(ctx, 0.3, cerr, sizeof cerr) == LECHO_ETIMEOUT);
    CHECK(freed == 1); /* the owned array's free function ran, once, by lecho_close at the latest */
    CHECK(strstr(cerr, "not delivered") != NULL);
    t0 = now();
    while (!__atomic_load_n(&stopped, __ATOMIC_ACQUIRE) && now() - t0 < 10) usleep(20000);
    CHECK(__atomic_load_n(&stopped, __ATOMIC_ACQUIRE) == 1);
    if (!__atomic_load_n(&stopped, __ATOMIC_ACQUIRE)) return TEST_SUMMARY(); /* exit ends it */
    pthread_join(th, NULL);
    CHECK(lecho_close_err(NULL, 0, cerr, sizeof cerr) == 0 && cerr[0] == 0);
    return TEST_SUMMARY();
}
