/* spec/support/capi_exit.c (spec/exit_close_spec.lua): a C producer of
 * argv[2] that waits (20 s at most) until the channel has a consumer
 * listed, submits argv[3] events of 200 bytes and returns from main
 * without lecho_close.  (Without the wait, a member list arriving late on
 * a loaded host left the events with no destination: none lost, exit 0,
 * where the spec meant a consumer that never read them.) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "lecho.h"
int main(int argc, char **argv) {
    if (argc < 4) return 2;
    const char *opts[] = { "nameserver", argv[1], "quiet", "true", NULL };
    char err[256];
    lecho_ctx *ctx;
    if (lecho_open(opts, &ctx, err, sizeof err) != 0) { fprintf(stderr, "%s\n", err); return 1; }
    lecho_producer *p;
    if (lecho_producer_open(lecho_channel_get(ctx, argv[2]), NULL, &p) != 0) { fprintf(stderr, "producer: %s\n", lecho_errmsg(ctx)); return 1; }
    for (int t = 0; t < 1000 && lecho_stat(ctx, argv[2], "destinations") < 1; t++)
        lecho_run_once(ctx, 0.02);
    if (lecho_stat(ctx, argv[2], "destinations") < 1) { fprintf(stderr, "no consumer listed\n"); return 1; }
    int n = atoi(argv[3]);
    char pad[201];
    memset(pad, 'x', 200); pad[200] = 0;
    lecho_value *ev = lecho_value_new(ctx);
    for (int i = 0; i < n; i++) {
        lecho_set_number(ev, "i", i);
        lecho_set_string(ev, "pad", pad, 200);
        if (lecho_submit(p, ev) != 0) { fprintf(stderr, "submit: %s\n", lecho_errmsg(ctx)); return 1; }
    }
    lecho_value_free(ev);
    printf("submitted\n");
    fflush(stdout);
    return 0;     /* no lecho_close */
}
