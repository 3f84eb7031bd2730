/* rbuf.c: the read buffers' budget (max_buffered): a connection's read
 * buffer grows as its bytes come, charged to the context's total; when a
 * connection finds no room, the one holding the most bytes of an
 * unfinished frame is cut for it (or it is refused).  Reading: conn.c.
 */
#include "ctx_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The bytes of spare buffers a context keeps, together (lei_rbuf_return). */
#define LEI_SPARE_MAX ((size_t)64 * 1024 * 1024)

/* A large frame's buffer grows at most this far past the bytes it needs. */
#define RBUF_STEP ((size_t)16 * 1024 * 1024)

/* The room a large frame of end bytes gets once its buffer reaches its
 * end: end and 1/64 more, rounded up to LEI_RBUF_MIN, so that the buffer,
 * once a spare (lei_rbuf_return), also holds the next frames when they are
 * a few bytes larger (a longer sequence number, a longer name or step
 * field: an 8 MiB frame one byte larger than the spare was read into a
 * fresh buffer grown from 512 KiB by copies, 2048 page faults). */
/* Only frames larger than this get it: a smaller frame's buffer stays the
 * connection's (conn_io.c keeps a drained buffer up to 1 MiB, RBUF_KEEP), and
 * room past its end only made reads take the next frame's first bytes,
 * moved to the front afterwards (64 KiB frames: a 64 KiB memmove every
 * two frames). */
#define RBUF_ROOM_MIN ((size_t)1024 * 1024)
static size_t rbuf_room(size_t end) {
    size_t r = end + (end >> 6);
    return (r + LEI_RBUF_MIN - 1) / LEI_RBUF_MIN * LEI_RBUF_MIN;
}

/* k's read buffer is now (b, ncap): the context's total follows. */
void lei_rbuf_set(lei_conn *k, uint8_t *b, size_t ncap) {
    k->ctx->rbuf = k->ctx->rbuf - k->rcap + ncap;
    k->rb = b;
    k->rcap = ncap;
}

/* Room for need bytes in k's read buffer, for a mechanism that opens
 * records into it (secure.c's keyed_open): grown by doubling from 4 KiB
 * when short, the budget charged with the growth.  Not checked against
 * max_buffered: conn_io.c made room within it first (lei_rbuf_grow, for
 * the plaintext of what was read).  0, or -1 out of memory (k unchanged). */
int lei_rbuf_reserve(lei_conn *k, size_t need) {
    if (k->rcap >= need) return 0;
    size_t n = k->rcap ? k->rcap : 4096;
    while (n < need) n *= 2;
    uint8_t *nb = realloc(k->rb, n); /* owned by k (k->rb) */
    if (!nb) return -1;
    lei_rbuf_set(k, nb, n);
    return 0;
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
    if (end > RBUF_ROOM_MIN && ncap >= end && rbuf_room(end) > ncap) ncap = rbuf_room(end);
    if (ncap > left) ncap = left;
    /* A large frame whose end is known: the smallest spare buffer (a
     * drained or adopted one given back) that holds the frame, its pages
     * already in; not more than twice the room wanted, nor past the budget. */
    struct lei_rbuf_state *rs = &c->rbuf_s;
    int best = -1;
    if (end > LEI_RBUF_MIN) {
        for (int i = 0; i < rs->nspare; i++) {
            size_t sc = rs->spare_cap[i];
            if (sc >= end && sc >= need && sc <= 2 * end && sc <= left &&
                (best < 0 || sc < rs->spare_cap[best]))
                best = i;
        }
    }
    if (best >= 0) {
        uint8_t *sp = rs->spare[best];
        size_t sc = rs->spare_cap[best];
        rs->nspare--;
        rs->spare[best] = rs->spare[rs->nspare];
        rs->spare_cap[best] = rs->spare_cap[rs->nspare];
        rs->spare[rs->nspare] = NULL;
        rs->spare_bytes -= sc;
        if (k->rlen) memcpy(sp, k->rb, k->rlen);
        free(k->rb);
        lei_rbuf_set(k, sp, sc);
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
        c->rbuf_s.out_n++;
        c->rbuf_s.out_bytes += *cap;
        c->rbuf_s.last_cap = *cap;
        return base;
    }
    return NULL;
}

/* A large read buffer done with (a drained connection's, or an adopted
 * one its owner let go of) comes back: kept as one of the context's spares
 * while there are fewer than LEI_SPARES and their bytes stay within
 * LEI_SPARE_MAX (else in place of the smallest spare when it is larger
 * and that fits; else freed), for lei_rbuf_grow to give the next large
 * frames instead of growing fresh buffers.  Not charged to max_buffered:
 * idle memory of the context, bounded as said. */
void lei_rbuf_return(lei_ctx *c, uint8_t *b, size_t cap) {
    if (!c || cap > LEI_SPARE_MAX) {
        free(b);
        return;
    }
    struct lei_rbuf_state *rs = &c->rbuf_s;
    if (rs->nspare < LEI_SPARES && rs->spare_bytes + cap <= LEI_SPARE_MAX) {
        rs->spare[rs->nspare] = b;
        rs->spare_cap[rs->nspare] = cap;
        rs->nspare++;
        rs->spare_bytes += cap;
        return;
    }
    int small = 0;
    for (int i = 1; i < rs->nspare; i++)
        if (rs->spare_cap[i] < rs->spare_cap[small]) small = i;
    if (rs->nspare && rs->spare_cap[small] < cap && rs->spare_bytes - rs->spare_cap[small] + cap <= LEI_SPARE_MAX) {
        free(rs->spare[small]);
        rs->spare_bytes = rs->spare_bytes - rs->spare_cap[small] + cap;
        rs->spare[small] = b;
        rs->spare_cap[small] = cap;
        return;
    }
    free(b);
}

/* An adopted buffer (lei_rbuf_adopt) given back by its owner, who let go
 * of it: no longer counted as out, then kept or freed as lei_rbuf_return
 * says. */
void lei_rbuf_give(lei_ctx *c, uint8_t *b, size_t cap) {
    if (c) {
        struct lei_rbuf_state *rs = &c->rbuf_s;
        if (rs->out_n) rs->out_n--;
        rs->out_bytes = rs->out_bytes > cap ? rs->out_bytes - cap : 0;
    }
    lei_rbuf_return(c, b, cap);
}

/* 1 when the binding should collect what its program let go of now: no
 * spare is one lei_rbuf_grow would give the next frame of cap bytes (at
 * least cap, at most twice: it would be read into a fresh buffer), and at
 * least min_out adopted buffers, or LEI_SPARE_MAX bytes of them, are out.
 * cap 0: the size of the last buffer adopted.  A collection costs the
 * whole Lua heap's traversal whatever it finds; done when the program is
 * about to wait for the next event, having let go of the one before (min_out
 * 1, ctx:reclaim from lecho.capi's wait), it gives that event's buffer back
 * before the next frame comes, which is then read into the same memory,
 * still in the CPU's cache as a plain consumer's drained buffer is (with
 * two or four buffers taking turns a Python consumer of 8 MiB arrays went
 * at 0.8x or 0.5x raw TCP under SCHED_FIFO).  At an adoption (min_out 2)
 * it finds the buffers of the ones before, for a program that keeps
 * arrays without such a wait (a handler that waits). */
int lei_rbuf_collect_due(const lei_ctx *c, size_t cap, size_t min_out) {
    if (!c) return 0;
    const struct lei_rbuf_state *rs = &c->rbuf_s;
    if (!cap) cap = rs->last_cap;
    if (!cap || !rs->out_n) return 0;
    for (int i = 0; i < rs->nspare; i++)
        if (rs->spare_cap[i] >= cap && rs->spare_cap[i] <= 2 * cap) return 0;
    return rs->out_n >= min_out || rs->out_bytes >= LEI_SPARE_MAX;
}
