/* spec/support/capi_sigloop.c: a C program whose consumer handler never
 * returns, under lecho_run (spec/signals_spec.lua): no Lua runs, so the
 * first SIGINT cannot interrupt it; the second must end the process. */
#include <lecho.h>
#include <stdio.h>

static volatile unsigned long spins;

static const char *spin(const lecho_value *ev, const lecho_meta *m, void *ud) {
    (void)ev;
    (void)m;
    (void)ud;
    fprintf(stderr, "handler start\n");
    for (;;) spins++;
    return NULL;
}

int main(void) {
    const char *opts[] = {"quiet", "true", NULL};
    lecho_ctx *ctx;
    lecho_consumer *c;
    lecho_producer *p;
    char err[256];
    if (lecho_open(opts, &ctx, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 9;
    }
    lecho_channel *ch = lecho_channel_get(ctx, "x");
    lecho_value *v = lecho_value_new(ctx);  /* owned by ctx */
    lecho_set_number(v, "x", 1);
    if (lecho_consumer_open(ch, spin, NULL, &c) || lecho_producer_open(ch, NULL, &p) || lecho_submit(p, v)) {
        fprintf(stderr, "setup failed\n");
        return 9;
    }
    int r = lecho_run(ctx);
    fprintf(stderr, "lecho_run returned %d\n", r);
    return 0;
}
