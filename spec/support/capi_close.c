/* spec/support/capi_close.c (spec/consumer_close_spec.lua): a C consumer
 * of argv[2] that closes (argv[3] "main": on the main line, at once;
 * "handler": in its handler, at its first event, which also stops the
 * loop lecho_run serves) and then sleeps 30 s without running its loop.
 * Prints its address, "running" before lecho_run, "closed" after the
 * close. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "lecho.h"

static lecho_consumer *con;
static lecho_ctx *ctx;

static const char *handler(const lecho_value *ev, const lecho_meta *meta, void *ud) {
    (void)ev, (void)meta, (void)ud;
    if (con) {
        lecho_consumer_close(con);
        con = NULL;
        lecho_stop(ctx);
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 4) return 2;
    const char *opts[] = { "nameserver", argv[1], "quiet", "true", NULL };
    char err[256];
    if (lecho_open(opts, &ctx, err, sizeof err) != 0) { fprintf(stderr, "%s\n", err); return 1; }
    if (lecho_consumer_open(lecho_channel_get(ctx, argv[2]), handler, NULL, &con) != 0) {
        fprintf(stderr, "consumer: %s\n", lecho_errmsg(ctx));
        return 1;
    }
    printf("%s\n", lecho_address(ctx));
    fflush(stdout);
    if (strcmp(argv[3], "main") == 0) {
        lecho_consumer_close(con);
        con = NULL;
    } else {
        printf("running\n");
        fflush(stdout);
        lecho_run(ctx);
    }
    printf("closed\n");
    fflush(stdout);
    sleep(30);      /* no loop */
    return 0;
}
