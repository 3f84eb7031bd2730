/* heat.c: a 1-D heat diffusion simulation in C that publishes each step
 * through lecho.h and is steered by Lua viewers (examples/c/viewer.lua).
 *
 * A rod of --cells cells; the left end is held at `source` degrees, the
 * right end at 0; each step is an explicit diffusion step with coefficient
 * `alpha`.  Every step goes out on channel "heat.field" as
 *   { step =, alpha =, source =, mean =, max =, u = <f8 array [cells] }
 * (u: the field as a typed array, lecho_set_array: lent, copied into the
 * message by the submit with one memcpy, no element-wise work)
 * and events on "heat.steer" change the run: { alpha = 0.4 } (0 < alpha <=
 * 0.5), { source = 80 }, { run = true } (start, with --wait).  A steering
 * event with an unknown key, a key that is not a string ({ 0.4 }) or a bad
 * value is refused whole: the steerer's submit_sync gets the message.  The last step is submitted synchronously,
 * so every viewer has every step when the simulation exits.
 *
 *   heat [--nameserver HOST:PORT] [--steps N] [--cells N] [--interval S] [--wait]
 *
 * Without --nameserver the simulation runs the name server itself and
 * prints "nameserver HOST:PORT" first.  Build against an installed lecho:
 *   cc heat.c $(pkg-config --cflags --libs lecho) -o heat
 */
#include <lecho.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct sim {
    double alpha, source;
    int running;
    long step;
    char err[160]; /* the message of a refused steering event */
};

struct steer_check {
    struct sim *s;
    double alpha, source;
    int run;
};

/* Checks one field of a steering event into chk; nonzero when refused.
 * lecho_pairs gives every key, so { 0.4 } or { [true] = 1 } is seen. */
static int check_field(const lecho_value *k, const lecho_value *v, void *ud) {
    struct steer_check *chk = ud;
    static const char *const tnames[] = { "nil", "boolean", "number", "string", "table", "other" };
    double x;
    int b, kt = lecho_type(k, NULL);
    if (kt != LECHO_TSTRING) {
        snprintf(chk->s->err, sizeof chk->s->err, "a steering key must be a string, not a %s "
                 "(known: alpha, source, run)", tnames[kt >= 0 && kt <= LECHO_TOTHER ? kt : LECHO_TOTHER]);
        return 1;
    }
    const char *key = lecho_get_string(k, NULL, NULL);
    if (strcmp(key, "alpha") == 0) {
        if (lecho_get_number(v, NULL, &x) != 0 || !(x > 0 && x <= 0.5)) {
            snprintf(chk->s->err, sizeof chk->s->err, "alpha must be a number in (0, 0.5]");
            return 1;
        }
        chk->alpha = x;
    } else if (strcmp(key, "source") == 0) {
        if (lecho_get_number(v, NULL, &x) != 0 || !isfinite(x)) {
            snprintf(chk->s->err, sizeof chk->s->err, "source must be a finite number");
            return 1;
        }
        chk->source = x;
    } else if (strcmp(key, "run") == 0) {
        if (lecho_get_bool(v, NULL, &b) != 0) {
            snprintf(chk->s->err, sizeof chk->s->err, "run must be a boolean");
            return 1;
        }
        chk->run = b;
    } else {
        snprintf(chk->s->err, sizeof chk->s->err, "unknown key '%.40s' (known: alpha, source, run)", key);
        return 1;
    }
    return 0;
}

/* The "heat.steer" handler: applies the whole event or nothing. */
static const char *steer(const lecho_value *ev, const lecho_meta *meta, void *ud) {
    struct sim *s = ud;
    struct steer_check chk = { s, s->alpha, s->source, s->running };
    (void)meta;
    if (lecho_type(ev, NULL) != LECHO_TTABLE) return "a steering event is a table";
    if (lecho_pairs(ev, check_field, &chk) != 0) return s->err;
    if (chk.alpha != s->alpha)
        printf("steered at step %ld: alpha %g -> %g\n", s->step, s->alpha, chk.alpha);
    if (chk.source != s->source)
        printf("steered at step %ld: source %g -> %g\n", s->step, s->source, chk.source);
    s->alpha = chk.alpha;
    s->source = chk.source;
    s->running = chk.run || s->running;
    fflush(stdout);
    return NULL;
}

static void usage(void) {
    fprintf(stderr, "usage: heat [--nameserver HOST:PORT] [--steps N] [--cells N] "
                    "[--interval S] [--wait]\n");
}

int main(int argc, char **argv) {
    const char *ns = NULL;
    long steps = 100;
    int cells = 64, wait = 0;
    double interval = 0.01;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--nameserver") == 0 && i + 1 < argc)
            ns = argv[++i];
        else if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc)
            steps = atol(argv[++i]);
        else if (strcmp(argv[i], "--cells") == 0 && i + 1 < argc)
            cells = atoi(argv[++i]);
        else if (strcmp(argv[i], "--interval") == 0 && i + 1 < argc)
            interval = atof(argv[++i]);
        else if (strcmp(argv[i], "--wait") == 0)
            wait = 1;
        else {
            usage();
            return strcmp(argv[i], "--help") == 0 ? 0 : 2;
        }
    }
    if (steps < 1 || cells < 3) {
        usage();
        return 2;
    }

    const char *opts[] = { "nameserver", ns, NULL };
    lecho_ctx *ctx;
    char err[256];
    if (lecho_open(ns ? opts : NULL, &ctx, err, sizeof err) != 0) {
        fprintf(stderr, "heat: %s\n", err);
        return 1;
    }
    printf("nameserver %s\n", lecho_nameserver(ctx));
    fflush(stdout);

    struct sim s = { .alpha = 0.1, .source = 100, .running = !wait };
    lecho_producer *p;
    lecho_consumer *c;
    if (lecho_producer_open(lecho_channel_get(ctx, "heat.field"), NULL, &p) != 0 ||
        lecho_consumer_open(lecho_channel_get(ctx, "heat.steer"), steer, &s, &c) != 0) {
        fprintf(stderr, "heat: %s\n", lecho_errmsg(ctx));
        lecho_close(ctx, 0);
        return 1;
    }
    /* --wait: serve the loop until a viewer says { run = true }. */
    for (int i = 0; !s.running && i < 300; i++) lecho_run_once(ctx, 0.1);
    if (!s.running) {
        fprintf(stderr, "heat: nobody said { run = true } within 30 s\n");
        lecho_close(ctx, 0);
        return 1;
    }

    double *u = calloc((size_t)cells, sizeof *u), *v = calloc((size_t)cells, sizeof *v);
    lecho_value *ev = lecho_value_new(ctx); /* reused: submit encodes it at once */
    int rc = 0;
    for (s.step = 1; s.step <= steps && u && v && ev; s.step++) {
        u[0] = s.source;
        for (int i = 1; i < cells - 1; i++) v[i] = u[i] + s.alpha * (u[i - 1] - 2 * u[i] + u[i + 1]);
        v[0] = s.source;
        v[cells - 1] = 0;
        double *t = u, sum = 0, max = 0;
        u = v;
        v = t;
        for (int i = 0; i < cells; i++) {
            sum += u[i];
            if (u[i] > max) max = u[i];
        }
        lecho_set_number(ev, "step", (double)s.step);
        lecho_set_number(ev, "alpha", s.alpha);
        lecho_set_number(ev, "source", s.source);
        lecho_set_number(ev, "mean", sum / cells);
        lecho_set_number(ev, "max", max);
        size_t shape[1] = { (size_t)cells };
        /* lent: u is swapped and rewritten next step, the submit copies it */
        lecho_set_array(ev, "u", "<f8", 1, shape, u, NULL, NULL);
        if (s.step < steps) {
            rc = lecho_submit(p, ev);
        } else {
            lecho_errors *errs = NULL;
            rc = lecho_submit_sync(p, ev, 5, &errs);
            if (errs) fprintf(stderr, "heat: last step: %s\n", lecho_errors_text(errs));
            lecho_errors_free(errs);
        }
        /* (LECHO_ENOCONSUMER: the last step with no viewer at all) */
        if (rc != 0 && rc != LECHO_EFAILED && rc != LECHO_ETIMEOUT && rc != LECHO_ENOCONSUMER) {
            fprintf(stderr, "heat: submit: %s: %s\n", lecho_strerror(rc), lecho_errmsg(ctx));
            break;
        }
        lecho_run_once(ctx, interval); /* sends, runs steering; paces the steps */
    }
    printf("done %ld steps, alpha %g, source %g, middle cell %.4f\n", s.step - 1, s.alpha, s.source,
           u ? u[cells / 2] : 0.0);
    free(u);
    free(v);
    lecho_value_free(ev);
    /* lecho_close frees ctx: lecho_close_err hands back why it failed. */
    if (lecho_close_err(ctx, 2, err, sizeof err) != 0) {
        fprintf(stderr, "heat: close: %s\n", err);
        rc = 1;
    }
    return rc != 0;
}
