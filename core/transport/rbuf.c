/* rbuf.c: the read buffers' budget (max_buffered): a connection's read
 * buffer grows as its bytes come, charged to the context's total; when a
 * connection finds no room, the one holding the most bytes of an
 * unfinished frame is cut for it (or it is refused).  Reading: conn.c.
 */
#include "ctx_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The largest spare buffer a context keeps (lei_rbuf_return). */
#define LEI_SPARE_MAX ((size_t)64 * 1024 * 1024)

/* A large frame's buffer grows at most this far past the bytes it needs. */
#define RBUF_STEP ((size_t)16 * 1024 * 1024)

/* k's read buffer is now (b, ncap): the context's total follows. */
void lei_rbuf_set(lei_conn *k, uint8_t *b, size_t ncap) {
    k->ctx->rbuf = k->ctx->rbuf - k->rcap + ncap;
    k->rb = b;
    k->rcap = ncap;
}

/* k is closed: its read buffer leaves the budget and k holds no bytes.  A
 * frame below us (k->busy) may still be read: a handler's zero-copy buffer
 * points into it (lua_hook.c), so it is freed then by lei_conn_free. */
void lei_rbuf_close(lei_conn *k) {
    k->ctx->rbuf -= k->rcap;
    if (!k->busy) {
        free(k->rb);
        k->rb = NULL;
    }
    k->rcap = k->rlen = k->rpos = 0;
}

/* Bytes of an unfinished frame that k holds: what came and is not handed
 * over yet (plaintext, and ciphertext not opened yet). */
static size_t rbuf_held(const lei_conn *k) {
    size_t n = k->rlen - k->rpos;
    n += k->mech->in_pending(k);
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
    hog->ctx->kops.refuse(hog, LEI_RL_FRAME, why);
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
            c->kops.refuse(k, LEI_RL_FRAME, why);
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
    /* A large frame whose end is known: the spare buffer (an adopted one
     * given back) when it holds the frame, its pages already in; not more
     * than twice the room wanted, nor past the budget. */
    if (end > LEI_RBUF_MIN && c->rbuf_s.spare && c->rbuf_s.spare_cap >= end && c->rbuf_s.spare_cap >= need &&
        c->rbuf_s.spare_cap <= 2 * end && c->rbuf_s.spare_cap <= left) {
        uint8_t *sp = c->rbuf_s.spare;
        c->rbuf_s.spare = NULL;
        if (k->rlen) memcpy(sp, k->rb, k->rlen);
        free(k->rb);
        lei_rbuf_set(k, sp, c->rbuf_s.spare_cap);
        c->rbuf_s.spare_cap = 0;
        return 0;
    }
    uint8_t *nb = realloc(k->rb, ncap);
    if (!nb) {
        c->kops.close(k, "out of memory for the read buffer", 0);
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

/* Hands over the read buffer that holds [p, p + n) (a received array's
 * bytes, while its event is dispatched) instead of a copy of them being
 * made: when a connection at its first dispatch level (busy == 1: no frame
 * further down the stack points into its buffer) holds those bytes, and
 * they are at least half its buffer, the buffer leaves
 * the connection (its room uncharged from max_buffered; bytes read behind
 * the frame being handled move to a new buffer of their own) and its
 * address is returned: the caller owns it from then on (free()), and p is
 * valid as long as it does.  The connection reads on into a new buffer, as
 * it does after every large frame anyway (conn_input frees one once
 * drained).  NULL when not (the caller copies); also when the new buffer
 * for the bytes behind cannot be had. */
uint8_t *lei_rbuf_adopt(lei_ctx *c, const void *p, size_t n, size_t *cap) {
    const uint8_t *q = p;
    if (!c || !q || !n) return NULL;
    for (lei_conn *k = c->conns; k; k = k->next) {
        if (!k->rb || q < k->rb || q + n > k->rb + k->rlen) continue;
        if (k->busy != 1 || n < k->rcap / 2 || k->state == LEI_CONN_CLOSED) return NULL;
        size_t behind = k->rlen - k->rpos;
        uint8_t *nb = NULL;
        if (behind) {
            nb = malloc(behind > LEI_RBUF_SMALL ? behind : LEI_RBUF_SMALL);
            if (!nb) return NULL;
            memcpy(nb, k->rb + k->rpos, behind);
        }
        uint8_t *base = k->rb;
        *cap = k->rcap;
        k->ctx->rbuf -= k->rcap; /* lei_rbuf_set without freeing */
        k->rb = NULL;
        k->rcap = 0;
        if (nb) lei_rbuf_set(k, nb, behind > LEI_RBUF_SMALL ? behind : LEI_RBUF_SMALL);
        k->rlen = behind;
        k->rpos = 0;
        c->rbuf_s.adopted++;
        return base;
    }
    return NULL;
}

/* A large read buffer done with (a drained connection's, or an adopted
 * one its owner let go of) comes back: kept as the context's spare (the
 * larger of the two, at most LEI_SPARE_MAX; the other freed), which
 * lei_rbuf_grow gives the next large frame instead of growing a fresh
 * buffer.  Not charged to max_buffered: one buffer per context, idle. */
void lei_rbuf_return(lei_ctx *c, uint8_t *b, size_t cap) {
    if (!c || cap > LEI_SPARE_MAX) {
        free(b);
        return;
    }
    if (c->rbuf_s.spare && c->rbuf_s.spare_cap >= cap) {
        free(b);
        return;
    }
    free(c->rbuf_s.spare);
    c->rbuf_s.spare = b;
    c->rbuf_s.spare_cap = cap;
}
