/* spec/support/capi_relay.c: a C peer through core/lecho.h only, for
 * spec/capi_interop_spec.lua.
 *
 *   capi_relay NAMESERVER
 *
 * Consumes channel "a" with a C handler and sends each event on to channel
 * "b" as { v = the value, channel =, producer =, seq = } (its meta) with
 * lecho_submit from inside the handler (policy drop_newest: a handler may
 * not wait).  The value "fail-me" makes the handler fail ("asked to fail")
 * and is not sent on; "end" is sent on, then the relay closes and exits 0.
 * Prints "ready" once its consumer is joined.
 *
 * Build: cc -Icore -o capi_relay spec/support/capi_relay.c -Lbuild -llecho
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lecho.h"

struct relay {
    lecho_ctx *ctx;
    lecho_producer *p;
    int done;
    int failed; /* a submit failed: the exit code says so */
};

static const char *on_a(const lecho_value *ev, const lecho_meta *meta, void *ud) {
    struct relay *r = ud;
    size_t len;
    const char *s = lecho_type(ev, NULL) == LECHO_TSTRING ? lecho_get_string(ev, NULL, &len) : NULL;
    if (s && len == 7 && memcmp(s, "fail-me", 7) == 0) return "asked to fail";
    lecho_value *out = lecho_value_new(r->ctx);
    if (!out || lecho_set_value(out, "v", ev) || lecho_set_string(out, "channel", meta->channel, strlen(meta->channel)) ||
        lecho_set_string(out, "producer", meta->producer, strlen(meta->producer)) ||
        lecho_set_number(out, "seq", meta->seq)) {
        fprintf(stderr, "capi_relay: building the value: %s\n", lecho_errmsg(r->ctx));
        r->failed = 1;
    } else {
        int rc = lecho_submit(r->p, out);
        if (rc) {
            fprintf(stderr, "capi_relay: lecho_submit: %s: %s\n", lecho_strerror(rc), lecho_errmsg(r->ctx));
            r->failed = 1;
        }
    }
    lecho_value_free(out);
    if (s && len == 3 && memcmp(s, "end", 3) == 0) {
        r->done = 1;
        lecho_stop(r->ctx);
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: capi_relay NAMESERVER\n");
        return 2;
    }
    const char *opts[] = { "nameserver", argv[1], NULL };
    struct relay r = { 0 };
    char err[256];
    if (lecho_open(opts, &r.ctx, err, sizeof err)) {
        fprintf(stderr, "capi_relay: lecho_open: %s\n", err);
        return 1;
    }
    lecho_consumer *c;
    if (lecho_producer_open(lecho_channel_get(r.ctx, "b"), "drop_newest", &r.p) ||
        lecho_consumer_open(lecho_channel_get(r.ctx, "a"), on_a, &r, &c)) {
        fprintf(stderr, "capi_relay: %s\n", lecho_errmsg(r.ctx));
        return 1;
    }
    printf("ready\n");
    fflush(stdout);
    while (!r.done)
        if (lecho_run(r.ctx)) {
            fprintf(stderr, "capi_relay: lecho_run: %s\n", lecho_errmsg(r.ctx));
            return 1;
        }
    lecho_flush(r.p);
    lecho_consumer_close(c);
    lecho_producer_close(r.p);
    if (lecho_close_err(r.ctx, 5, err, sizeof err)) {
        fprintf(stderr, "capi_relay: lecho_close: %s\n", err);
        return 1;
    }
    return r.failed;
}
