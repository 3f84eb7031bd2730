/* spec/support/capi_getters.c: a C consumer (lecho.h) that prints what the
 * getters say about each event of channel "g", one line per event, for
 * spec/capi_getters_spec.lua: an async event is read from its encoded bytes
 * in place (core/capi/lecho_value.c), a sync one from the Lua value (the Lua
 * dispatch), and the spec sends every value both ways and compares the
 * lines.  The string "end" stops it.  argv[1]: the name server's address. */
#include <lecho.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static FILE *out;

static void describe(const lecho_value *v, const char *key) {
    int t = lecho_type(v, key);
    fprintf(out, " [%s t%d", key ? key : "-", t);
    double d;
    int b, rc = lecho_get_number(v, key, &d);
    fprintf(out, " n%d", rc);
    if (rc == 0) fprintf(out, "=%.17g", d);
    rc = lecho_get_bool(v, key, &b);
    fprintf(out, " b%d", rc);
    if (rc == 0) fprintf(out, "=%d", b);
    size_t len = 0;
    const char *s = lecho_get_string(v, key, &len);
    if (s) {
        fprintf(out, " s%zu:", len);
        for (size_t i = 0; i < len && i < 40; i++) fprintf(out, "%02x", (unsigned char)s[i]);
        if (s[len] != '\0') fprintf(out, " NOT-NUL-TERMINATED");
    }
    double nums[8];
    size_t n = lecho_get_numbers(v, key, nums, 8);
    fprintf(out, " len%zu #%zu", lecho_len(v, key), n);
    for (size_t i = 0; i < n && i < 8; i++) fprintf(out, ",%.17g", nums[i]);
    lecho_array_info ai;
    rc = lecho_get_array(v, key, &ai);
    fprintf(out, " a%d", rc);
    if (rc == 0) {
        double sum = 0;
        const unsigned char *p = ai.data;
        for (size_t i = 0; i < ai.count * ai.itemsize; i++) sum += p[i] * (double)(i % 7 + 1);
        fprintf(out, "=%s/%d/%zu/%zu/%zu/%.17g/%s", ai.dtype, ai.ndim, ai.shape[0], ai.count, ai.itemsize, sum,
                ai.data && (uintptr_t)ai.data % ai.itemsize ? "misaligned" : "ok");
    }
    fprintf(out, "]");
}

static int count_each(const char *k, const lecho_value *val, void *ud) {
    (void)k;
    (void)val;
    ++*(int *)ud;
    return 0;
}

static lecho_value *kept;
static int nkept;

static const char *handler(const lecho_value *ev, const lecho_meta *meta, void *ud) {
    (void)meta;
    size_t len;
    const char *s = lecho_get_string(ev, NULL, &len);
    if (s && len == 3 && memcmp(s, "end", 3) == 0) {
        lecho_stop(ud);
        return NULL;
    }
    static const char *keys[] = { NULL, "s", "n", "d", "b", "f", "t", "h", "m", "arr", "small", "missing", "nest" };
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) describe(ev, keys[i]);
    /* what needs the Lua value: a field's handle, lecho_each */
    lecho_value *f = lecho_field(ev, "nest", 0);
    if (f) {
        describe(f, "x");
        lecho_value_free(f);
    }
    int ne = 0;
    lecho_each(ev, count_each, &ne);
    fprintf(out, " each%d", ne);
    /* and a getter after that (the value decoded by now) */
    describe(ev, "s");
    /* the value kept past the handler: read again at the end */
    if (lecho_type(ev, "keep") == LECHO_TBOOLEAN) {
        lecho_set_value(kept, NULL, ev);
        nkept++;
    }
    fprintf(out, "\n");
    fflush(out);
    return NULL;
}

int main(int argc, char **argv) {
    const char *opts[] = { "nameserver", argc > 1 ? argv[1] : "", "quiet", "true", NULL };
    lecho_ctx *ctx;
    lecho_consumer *c;
    char err[256];
    out = stdout;
    if (lecho_open(opts, &ctx, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    kept = lecho_value_new(ctx);
    if (lecho_consumer_open(lecho_channel_get(ctx, "g"), handler, ctx, &c) != 0) {
        fprintf(stderr, "%s\n", lecho_errmsg(ctx));
        return 1;
    }
    /* values built in C (their encoding, lecho_value.c cb): what the
     * getters say before and after lecho_field makes the Lua value, and
     * the value sent to "built" for the Lua side to check */
    lecho_producer *bp;
    if (lecho_producer_open(lecho_channel_get(ctx, "built"), NULL, &bp) != 0) {
        fprintf(stderr, "%s\n", lecho_errmsg(ctx));
        return 1;
    }
    lecho_value *v = lecho_value_new(ctx), *w = lecho_value_new(ctx);
    int rcs[8];
    rcs[0] = lecho_set_number(v, "n", 42);
    rcs[1] = lecho_set_string(v, "s", "a\0b", 3);
    rcs[2] = lecho_set_bool(v, "b", 1);
    rcs[3] = lecho_set_string(v, "s", "replaced", 8); /* the same key again */
    rcs[4] = lecho_set_nil(v, "b");                   /* removed */
    rcs[5] = lecho_set_table(v, "t");
    rcs[6] = lecho_set_number(v, "n", 1.5);
    lecho_set_string(w, NULL, "scalar", 6);
    rcs[7] = lecho_set_number(w, "k", 1); /* not a table: invalid */
    printf("built rcs %d %d %d %d %d %d %d %d\n", rcs[0], rcs[1], rcs[2], rcs[3], rcs[4], rcs[5], rcs[6], rcs[7]);
    static const char *bkeys[] = { NULL, "n", "s", "b", "t", "missing" };
    for (int pass = 0; pass < 2; pass++) {
        printf("built%d", pass);
        for (size_t i = 0; i < sizeof bkeys / sizeof *bkeys; i++) describe(v, bkeys[i]);
        describe(w, NULL);
        printf("\n");
        lecho_value *t = lecho_field(v, "t", 0); /* needs the Lua value */
        lecho_value_free(t);
        lecho_set_value(w, NULL, w);
    }
    printf("addr %s\n", lecho_address(ctx));
    printf("ready\n");
    fflush(stdout);
    lecho_value *v2 = lecho_value_new(ctx);
    lecho_set_number(v2, "step", 1);
    lecho_set_string(v2, "name", "c-built", 7);
    lecho_set_nil(v2, "nothing");
    lecho_set_bool(v2, "ok", 0);
    if (lecho_submit(bp, v2) != 0 || lecho_submit(bp, v) != 0) {
        fprintf(stderr, "submit: %s\n", lecho_errmsg(ctx));
        return 1;
    }
    lecho_value_free(v2);
    lecho_value_free(v);
    lecho_value_free(w);
    lecho_run(ctx);
    printf("kept %d:", nkept);
    describe(kept, "arr");
    describe(kept, "s");
    printf("\n");
    lecho_close(ctx, 5);
    return 0;
}
