/* rbuf.c: the read buffers' budget (max_buffered): a connection's read
 * buffer grows as its bytes come, charged to the context's total; when a
 * connection finds no room, the one holding the most bytes of an
 * unfinished frame is cut for it (or it is refused).  Reading: conn.c.
 */
#include "ctx_int.h"

#include <stdio.h>
#include <stdlib.h>

/* A large frame's buffer grows at most this far past the bytes it needs. */
#define RBUF_STEP ((size_t)16 * 1024 * 1024)

/* k's read buffer is now (b, ncap): the context's total follows. */
void lei_rbuf_set(lei_conn *k, uint8_t *b, size_t ncap) {
    k->ctx->rbuf = k->ctx->rbuf - k->rcap + ncap;
    k->rb = b;
    k->rcap = ncap;
}

/* Bytes of an unfinished frame that k holds: what came and is not handed
 * over yet (plaintext, and ciphertext not opened yet). */
static size_t rbuf_held(const lei_conn *k) {
    size_t n = k->rlen - k->rpos;
    if (k->sec && k->sec->rec_in) n += k->sec->clen - k->sec->cpos;
    return n;
}

/* The connection other than k holding the most bytes of an unfinished
 * frame, if it holds more than k; NULL else.  One in a dispatch (busy), or
 * whose peer is suspended (its frames are complete, waiting), is not one. */
static lei_conn *rbuf_hog(lei_conn *k) {
    lei_conn *hog = NULL;
    size_t most = rbuf_held(k);
    for (lei_conn *o = k->ctx->conns; o; o = o->next) {
        if (o == k || o->busy || o->state == LEI_CONN_CLOSED || o->state == LEI_CONN_RETIRED ||
            (o->peer && o->peer->held))
            continue;
        size_t n = rbuf_held(o);
        if (n > most) {
            most = n;
            hog = o;
        }
    }
    return hog;
}

/* Cuts hog for the budget (ERROR and one log line per window) and gives its
 * read buffer back: retired, it reads what still comes into a small one. */
static void rbuf_cut(lei_conn *hog) {
    char why[160];
    snprintf(why, sizeof why,
             "read buffer budget: this connection holds the most (%zu bytes of an unfinished frame)",
             rbuf_held(hog));
    lei_accept_refuse(hog, LEI_RL_FRAME, why);
    if (hog->state == LEI_CONN_CLOSED) return; /* its buffer is gone with it */
    free(hog->rb);
    lei_rbuf_set(hog, NULL, 0);
    hog->rlen = hog->rpos = 0;
    hog->skip = 0;
}

/* Grows k's read buffer to at least need bytes (need > rcap) for what has
 * come or is being read.  max_buffered, the budget of all connections' read
 * buffers, is charged by the bytes a buffer holds room for, never by the
 * size a header announces: a large frame's buffer grows toward the frame's
 * end (end, when the header at rpos is in: rpos + its size, else 0) as its
 * bytes arrive, doubling but at most RBUF_STEP past need, so a peer
 * trickling a huge frame holds little more than it sent.  The growth is
 * trimmed to what the budget has left.  When even need does not fit, the
 * connection holding the most bytes of an unfinished frame, if more than
 * k, is cut (rbuf_hog) until it fits; else k is refused (ERROR to the
 * peer, one log line per window) for the frame of fsize bytes.  0, or -1
 * after closing k. */
int lei_rbuf_grow(lei_conn *k, size_t need, size_t end, size_t fsize) {
    lei_ctx *c = k->ctx;
    size_t others, left;
    for (;;) {
        others = c->rbuf - k->rcap;
        left = c->o.max_buffered > others ? c->o.max_buffered - others : 0;
        if (need <= left) break;
        lei_conn *hog = rbuf_hog(k);
        if (!hog) {
            char why[160];
            snprintf(why, sizeof why, "frame of %zu bytes exceeds the read buffer budget (limit %zu)",
                     fsize, c->o.max_buffered);
            lei_accept_refuse(k, LEI_RL_FRAME, why);
            return -1;
        }
        rbuf_cut(hog);
    }
    size_t ncap = need;
    if (end > need && k->rcap * 2 > need) {
        ncap = k->rcap * 2 < end ? k->rcap * 2 : end;
        if (ncap > need + RBUF_STEP) ncap = need + RBUF_STEP;
    }
    if (ncap > left) ncap = left;
    uint8_t *nb = realloc(k->rb, ncap);
    if (!nb) {
        lei_conn_close(k, "out of memory for the read buffer", 0);
        return -1;
    }
    lei_rbuf_set(k, nb, ncap);
    return 0;
}

void lei_rbuf_idle(lei_conn *k, int idle) {
    if (k->busy || k->rpos != k->rlen || k->rcap <= LEI_RBUF_SMALL || (k->rfull && !idle)) return;
    free(k->rb);
    lei_rbuf_set(k, NULL, 0);
    k->rlen = k->rpos = 0;
    k->rfull = 0;
}
