/* sync.c: sync records: one per sync submit, one wait per consumer
 * context (NULL: the local consumers), answered by ACK frames or failed
 * when a connection is lost.  This file records answers and sends
 * nothing: the ACKs go out from peer.c (lei_ack), which owns the queues.
 */
#define _GNU_SOURCE
#include "ctx_int.h"

#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- sync records ------------------------------------------------------ */

/* Records are found by id in c->sync_s.shash (ids are consecutive: id & mask
 * spreads them evenly); with thousands in flight a list walk per lookup made
 * every loop turn quadratic.  The hash only grows; a failed growth keeps
 * the old one (longer chains, nothing lost). */
static void shash_grow(lei_ctx *c) {
    uint32_t cap = c->sync_s.shcap ? c->sync_s.shcap * 2 : 64;
    lei_sync **h = calloc(cap, sizeof *h);
    if (!h) return;
    for (lei_sync *s = c->sync_s.syncs; s; s = s->next) {
        lei_sync **b = &h[s->id & (cap - 1)];
        s->hnext = *b;
        *b = s;
    }
    free(c->sync_s.shash);
    c->sync_s.shash = h;
    c->sync_s.shcap = cap;
}

/* Gives s its id and puts it on c->sync_s.syncs and in c->sync_s.shash (c owns it from
 * now on, freed by lei_sync_free). */
/* Sync ids start anywhere below 2^52 (room for 2^52 more below 2^53,
 * where Lua numbers stop being exact): a process that took over a dead
 * one's address must not have ids the dead one's late answers match.
 * lei_ctx_new calls it. */
void lei_sync_init(lei_ctx *c) {
    randombytes_buf(&c->sync_s.next_sync, sizeof c->sync_s.next_sync);
    c->sync_s.next_sync &= ((uint64_t)1 << 52) - 1;
}

void lei_sync_link(lei_ctx *c, lei_sync *s) {
    s->id = ++c->sync_s.next_sync;
    s->prev = NULL;
    s->next = c->sync_s.syncs;
    if (c->sync_s.syncs) c->sync_s.syncs->prev = s;
    c->sync_s.syncs = s;
    c->sync_s.nsyncs++;
    if (c->sync_s.nsyncs > c->sync_s.shcap) {
        uint32_t was = c->sync_s.shcap;
        shash_grow(c);
        if (c->sync_s.shcap != was) return; /* rehashed s with the others */
        if (!c->sync_s.shcap) return;       /* no hash at all: lei_sync_find walks the list */
    }
    lei_sync **b = &c->sync_s.shash[s->id & (c->sync_s.shcap - 1)];
    s->hnext = *b;
    *b = s;
}

lei_sync *lei_sync_find(lei_ctx *c, uint64_t id) {
    if (!c->sync_s.shcap) {
        for (lei_sync *s = c->sync_s.syncs; s; s = s->next)
            if (s->id == id) return s;
        return NULL;
    }
    for (lei_sync *s = c->sync_s.shash[id & (c->sync_s.shcap - 1)]; s; s = s->hnext)
        if (s->id == id) return s;
    return NULL;
}

/* A watched record settled (no wait pending any more): its id is told. */
static void sync_settled(lei_ctx *c, lei_sync *s) {
    if (!s->watch || s->nwait) return;
    s->watch = 0;
    if (c->sync_s.nsdone == c->sync_s.csdone) {
        uint32_t n = c->sync_s.csdone ? c->sync_s.csdone * 2 : 64;
        uint64_t *d = realloc(c->sync_s.sdone, n * sizeof *d);
        if (!d) {
            c->sync_s.sdone_lost = 1;
            return;
        }
        c->sync_s.sdone = d;
        c->sync_s.csdone = n;
    }
    c->sync_s.sdone[c->sync_s.nsdone++] = s->id;
}

/* Asks for s's id on the settled list once it settles (at once when it
 * has). */
void lei_sync_watch(lei_ctx *c, lei_sync *s) {
    s->watch = 1;
    sync_settled(c, s);
}

/* The ids settled since the last call: *ids (valid until the next push),
 * the count returned; -1: some were not recorded (no memory), every
 * watched record must be looked at.  The list is emptied. */
int lei_sync_done_take(lei_ctx *c, const uint64_t **ids) {
    int n = c->sync_s.sdone_lost ? -1 : (int)c->sync_s.nsdone;
    *ids = c->sync_s.sdone;
    c->sync_s.nsdone = 0;
    c->sync_s.sdone_lost = 0;
    return n;
}

void lei_sync_free(lei_ctx *c, lei_sync *s) {
    if (s->prev)
        s->prev->next = s->next;
    else
        c->sync_s.syncs = s->next;
    if (s->next) s->next->prev = s->prev;
    c->sync_s.nsyncs--;
    if (c->sync_s.shcap)
        for (lei_sync **pp = &c->sync_s.shash[s->id & (c->sync_s.shcap - 1)]; *pp; pp = &(*pp)->hnext)
            if (*pp == s) {
                *pp = s->hnext;
                break;
            }
    for (int i = 0; i < s->nw; i++) {
        free(s->w[i].err);
        free(s->w[i].errs);
    }
    free(s->w);
    free(s);
}

void lei_sync_fail(lei_sync_wait *w, lei_sync *s, const char *why, int code) {
    if (w->done) return;
    w->done = 1;
    w->err = strdup(why);
    w->code = code;
    s->nwait--;
}

/* A peer's connection ended: every sync still waiting on it fails, with
 * the code of why (p->reason_code: closed, or refused, limit, ... when
 * the dial failed). */
void lei_syncs_peer_lost(lei_ctx *c, lei_peer *p, const char *reason) {
    char why[256];
    snprintf(why, sizeof why, "consumer context %s: %s", p->addr, reason);
    for (lei_sync *s = c->sync_s.syncs; s; s = s->next) {
        for (int i = 0; i < s->nw; i++)
            if (s->w[i].peer == p) lei_sync_fail(&s->w[i], s, why, p->reason_code ? p->reason_code : LEI_E_CLOSED);
        sync_settled(c, s);
    }
}

/* Records the answer of peer p (NULL: the local consumers) to sync `sync`. */
void lei_sync_answered(lei_ctx *c, lei_peer *p, uint64_t sync, uint64_t nran,
                       const uint8_t *errs, size_t elen) {
    lei_sync *s = lei_sync_find(c, sync);
    if (!s) return; /* timed out already: the late answer is dropped */
    for (int i = 0; i < s->nw; i++) {
        lei_sync_wait *w = &s->w[i];
        if (w->peer != p || w->done) continue;
        if (!nran && !elen && s->want_ran) {
            /* 0 handlers and nothing said: a peer of before this rule whose
             * consumer closed before the event came (one of now says it,
             * lei_ack_noconsumer).  Nothing handled it: never true. */
            char why[LEI_ADDR_MAX + 128];
            snprintf(why, sizeof why,
                     "consumer context %s: no handler ran (no consumer of the channel there any more)",
                     p ? p->addr : c->addr);
            lei_sync_fail(w, s, why, LEI_E_NOCONSUMER);
            sync_settled(c, s);
            return;
        }
        w->done = 1;
        s->nwait--;
        s->nran += nran;
        if (elen && (w->errs = malloc(elen))) {
            memcpy(w->errs, errs, elen);
            w->elen = elen;
        }
        sync_settled(c, s);
        return;
    }
}

void lei_sync_stale_ack(lei_ctx *c) { c->sync_s.stale_acks++; }

int lei_sync_pending(const lei_sync *s) { return s->nwait; }

uint64_t lei_sync_nran(const lei_sync *s) { return s->nran; }

int lei_sync_nreplies(const lei_sync *s) { return s->nw; }

void lei_sync_reply(const lei_sync *s, int i, lei_sync_answer *out) {
    const lei_sync_wait *w = &s->w[i];
    out->addr = w->peer ? w->peer->addr : NULL;
    out->done = w->done;
    out->err = w->err;
    out->code = w->code;
    out->errs = w->errs;
    out->elen = w->elen;
}
