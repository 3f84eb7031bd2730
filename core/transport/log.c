/* log.c: the transport's log lines, the bottom of its layers (called from
 * every file above it, calling none).  A line goes to the log hook the
 * layer above registered through lei_ctx_new (lei_hooks' log and ud, the
 * binding's lb_hook_log), or to stderr without one; lei_ratelog keeps one
 * line per kind per window (opts log_window) and counts the others. */
#include "ctx_int.h"

#include <stdarg.h>
#include <stdio.h>

void lei_logf(lei_ctx *c, const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (c->h.log)
        c->h.log(c->h.ud, buf);
    else
        fprintf(stderr, "lecho: %s\n", buf);
}

void lei_ratelog(lei_ctx *c, int kind, const char *fmt, ...) {
    if (kind < 0 || kind >= LEI_RL_NKINDS) kind = LEI_RL_NKINDS - 1;
    ev_tstamp now = ev_now(c->loop);
    if (c->rlog[kind].used && now - c->rlog[kind].t < c->o.log_window) {
        c->rlog[kind].skipped++;
        return;
    }
    uint64_t skipped = c->rlog[kind].skipped;
    c->rlog[kind].used = 1;
    c->rlog[kind].t = now;
    c->rlog[kind].skipped = 0;
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (skipped)
        lei_logf(c, "%s (%llu more in the last %g s)", buf, (unsigned long long)skipped,
                 c->o.log_window);
    else
        lei_logf(c, "%s", buf);
}
