/* spec/recorder_spec.lua: a C producer records what it submits
 * (lecho_producer_record): 500 events { i = k }, recording stopped, 10
 * more not recorded, recording into a second file refused (it exists). */
#include <stdio.h>
#include <stdlib.h>
#include "lecho.h"

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    const char *opts[] = {"quiet", "true", NULL};
    lecho_ctx *ctx;
    char err[256];
    if (lecho_open(opts, &ctx, err, sizeof err) != 0) {
        fprintf(stderr, "open: %s\n", err);
        return 1;
    }
    lecho_producer *p;
    if (lecho_producer_open(lecho_channel_get(ctx, "rt.c"), NULL, &p) != 0) return 1;
    if (lecho_producer_record(p, argv[1]) != 0) {
        fprintf(stderr, "record: %s\n", lecho_errmsg(ctx));
        return 1;
    }
    lecho_value *ev = lecho_value_new(ctx);
    for (int k = 1; k <= 510; k++) {
        if (k == 501 && lecho_producer_record(p, NULL) != 0) return 1;
        lecho_set_number(ev, "i", k);
        if (lecho_submit(p, ev) != 0) return 1;
    }
    int again = lecho_producer_record(p, argv[1]);
    printf("again %d: %s\n", again, again ? lecho_errmsg(ctx) : "");
    lecho_value_free(ev);
    lecho_close(ctx, 1.0);
    return 0;
}
