/* spec/support/capi_sink.c: the C data plane's edges, for
 * spec/capi_sink_spec.lua, through core/lecho.h only.
 *
 *   capi_sink selfclose ROUNDS
 *     One context, channel "sc", a producer and, ROUNDS times, a C
 *     consumer whose handler closes its own consumer on its event, then
 *     makes ~8 MiB of Lua garbage (lecho_set_numbers: the context's Lua
 *     state collects meanwhile) and returns an error.  The sink (a Lua
 *     userdata the core calls) must outlive the call it is in
 *     (core/binding/lua_sink.c: pinned while a call runs, no registry
 *     lookups per event): a sink collected under its own call reads freed
 *     memory after it.  Prints "handled N" (N == ROUNDS: one event per
 *     consumer, none after its close) and exits 0.
 *
 *   capi_sink limits
 *     Values built in C (lecho_value_new + setters) go to the core with
 *     bounds known by construction (lb_bounds: the limits checked in
 *     O(1)); where a bound is past a limit the bytes are read as before.
 *     A context with max_string 64, max_depth 1, max_value_bytes 4096
 *     submits each case and prints "NAME rc" per line (rc: lecho_strerror
 *     or "ok"); a context with the default limits submits them all ("ok").
 *
 * Build: cc -Icore -o capi_sink spec/support/capi_sink.c -Lbuild -llecho
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lecho.h"

static lecho_ctx *open_ctx(const char *const *more) {
    const char *opts[16] = { "quiet", "true" };
    int n = 2;
    for (int i = 0; more && more[i]; i++) opts[n++] = more[i];
    opts[n] = NULL;
    lecho_ctx *c;
    char err[256];
    if (lecho_open(opts, &c, err, sizeof err)) {
        fprintf(stderr, "capi_sink: lecho_open: %s\n", err);
        exit(1);
    }
    return c;
}

struct sc {
    lecho_ctx *ctx;
    lecho_consumer *c;
    int handled;
    int ran; /* this round's handler ran */
};

static const char *on_sc(const lecho_value *ev, const lecho_meta *meta, void *ud) {
    struct sc *s = ud;
    (void)ev;
    (void)meta;
    s->handled++;
    s->ran = 1;
    lecho_consumer_close(s->c); /* its own consumer: the sink let go while it runs */
    s->c = NULL;
    static double nums[1024];
    for (int i = 0; i < 1024; i++) nums[i] = i;
    for (int i = 0; i < 512; i++) { /* 512 tables of 1024 numbers: collections run */
        lecho_value *v = lecho_value_new(s->ctx);
        if (!v || lecho_set_numbers(v, NULL, nums, 1024)) {
            fprintf(stderr, "capi_sink: garbage: %s\n", lecho_errmsg(s->ctx));
            exit(1);
        }
        lecho_value_free(v);
    }
    return "failed after closing its consumer"; /* read after the call: the sink must be whole */
}

static int selfclose(int rounds) {
    struct sc s = { open_ctx(NULL), NULL, 0, 0 };
    lecho_channel *ch = lecho_channel_get(s.ctx, "sc");
    lecho_producer *p;
    if (lecho_producer_open(ch, NULL, &p)) {
        fprintf(stderr, "capi_sink: producer: %s\n", lecho_errmsg(s.ctx));
        return 1;
    }
    lecho_value *v = lecho_value_new(s.ctx);
    if (!v || lecho_set_string(v, NULL, "event", 5)) return 1;
    for (int r = 0; r < rounds; r++) {
        if (lecho_consumer_open(ch, on_sc, &s, &s.c)) {
            fprintf(stderr, "capi_sink: consumer: %s\n", lecho_errmsg(s.ctx));
            return 1;
        }
        s.ran = 0;
        int rc = lecho_submit(p, v);
        if (rc) {
            fprintf(stderr, "capi_sink: submit: %s\n", lecho_strerror(rc));
            return 1;
        }
        for (int t = 0; t < 20000 && !s.ran; t++) lecho_run_once(s.ctx, 0.001);
        if (!s.ran) {
            fprintf(stderr, "capi_sink: round %d: no event\n", r);
            return 1;
        }
        /* one more event: nobody consumes it (the consumer closed) */
        if (lecho_submit(p, v)) return 1;
        for (int t = 0; t < 20; t++) lecho_run_once(s.ctx, 0.001);
    }
    printf("handled %d\n", s.handled);
    lecho_value_free(v);
    lecho_close(s.ctx, 1);
    return 0;
}

/* Submits each case through a producer of ctx, one "NAME rc" line each. */
static void cases(lecho_ctx *ctx, const char *tag) {
    lecho_producer *p;
    if (lecho_producer_open(lecho_channel_get(ctx, "lim"), NULL, &p)) {
        fprintf(stderr, "capi_sink: producer: %s\n", lecho_errmsg(ctx));
        exit(1);
    }
    char s65[65], key[16], longkey[66]; /* longkey: 65 bytes */
    memset(s65, 's', sizeof s65);
    memset(longkey, 'k', 65);
    longkey[65] = '\0';
    for (int k = 0; k < 7; k++) {
        lecho_value *v = lecho_value_new(ctx);
        const char *name = "";
        int e = !v;
        switch (k) {
        case 0: name = "string64"; e = e || lecho_set_string(v, NULL, s65, 64); break;
        case 1: name = "string65"; e = e || lecho_set_string(v, NULL, s65, 65); break;
        case 2: name = "key65"; e = e || lecho_set_number(v, longkey, 1); break;
        case 3: name = "flat"; e = e || lecho_set_number(v, "a", 1) || lecho_set_bool(v, "b", 1); break;
        case 4: name = "nested"; e = e || lecho_set_number(v, "a", 1) || lecho_set_table(v, "t"); break;
        case 5: /* 50 fields: 64 + 50 * (32 + 24 + 4) = 3,064 decoded bytes */
        case 6: /* 100 fields: 6,064 */
            name = k == 5 ? "fields50" : "fields100";
            for (int i = 0; !e && i < (k == 5 ? 50 : 100); i++) {
                snprintf(key, sizeof key, "k%03d", i);
                e = lecho_set_number(v, key, i);
            }
            break;
        }
        if (e) {
            fprintf(stderr, "capi_sink: building %s: %s\n", name, lecho_errmsg(ctx));
            exit(1);
        }
        int rc = lecho_submit(p, v);
        printf("%s %s %s\n", tag, name, rc ? lecho_strerror(rc) : "ok");
        lecho_value_free(v);
    }
}

static int limits(void) {
    const char *small[] = { "max_string", "64", "max_depth", "1", "max_value_bytes", "4096", NULL };
    lecho_ctx *a = open_ctx(small);
    cases(a, "small");
    lecho_close(a, 0);
    lecho_ctx *b = open_ctx(NULL);
    cases(b, "default");
    lecho_close(b, 0);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "selfclose") == 0) return selfclose(atoi(argv[2]));
    if (argc == 2 && strcmp(argv[1], "limits") == 0) return limits();
    fprintf(stderr, "usage: capi_sink selfclose ROUNDS | capi_sink limits\n");
    return 2;
}
