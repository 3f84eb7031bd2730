/* peers.c: the peer table of a context: peers by idx and by address (a
 * hash table), their creation, and their freeing once nothing uses them
 * (after peer_free_after, default LEI_PEER_FREE_AFTER, or at once past max_peers);
 * the context's expiry timer (lei_expiry_at), which that freeing and the
 * other timed clean-ups share.  A table: it calls no other transport file
 * but log.c (core/transport/README.md "Order").
 *
 * peer.c has what a peer does (queues, dials, writing).
 */
#define _GNU_SOURCE
#include "ctx_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Arms the expiry timer to fire at `when` at the latest: one deadline for
 * the context's timed clean-ups (unused peers here; peer.c's lei_expiry_cb
 * runs them all: retired connections, awaited peers, certificates). */
void lei_expiry_at(lei_ctx *c, ev_tstamp when) {
    ev_timer *w = &c->peers_s.expiry_w;
    ev_tstamp now = ev_now(c->loop);
    if (ev_is_active(w) && now + ev_timer_remaining(c->loop, w) <= when) return;
    ev_timer_stop(c->loop, w);
    ev_timer_set(w, when - now + 0.01, 0.);
    ev_timer_start(c->loop, w);
}

lei_peer *lei_peers_by_idx(lei_ctx *c, int idx) {
    return idx >= 1 && idx <= c->peers_s.nbyidx ? c->peers_s.byidx[idx - 1] : NULL;
}

lei_peer *lei_peers_at(lei_ctx *c, int i) { return i >= 0 && i < c->peers_s.npeers ? c->peers_s.peers[i] : NULL; }

/* Peers by address: a hash table (a member list of 4096 addresses, each
 * looked up per event and per dial, made a linear search the hot spot). */
static uint32_t addr_hash(const char *s) {
    uint32_t h = 2166136261u;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 16777619u;
    return h;
}

lei_peer *lei_peers_find(lei_ctx *c, const char *addr) {
    if (!c->peers_s.phcap) return NULL;
    uint32_t m = (uint32_t)c->peers_s.phcap - 1;
    for (uint32_t j = addr_hash(addr) & m; c->peers_s.phash[j]; j = (j + 1) & m)
        if (strcmp(c->peers_s.phash[j]->addr, addr) == 0) return c->peers_s.phash[j];
    return NULL;
}

static void phash_put(lei_ctx *c, lei_peer *p) {
    uint32_t m = (uint32_t)c->peers_s.phcap - 1, j = addr_hash(p->addr) & m;
    while (c->peers_s.phash[j]) j = (j + 1) & m;
    c->peers_s.phash[j] = p;
}

/* Room in the table for one more peer (half full at most). */
static int phash_room(lei_ctx *c) {
    if (2 * (c->peers_s.npeers + 1) <= c->peers_s.phcap) return 0;
    int ncap = c->peers_s.phcap ? c->peers_s.phcap * 2 : 64;
    lei_peer **nh = calloc((size_t)ncap, sizeof *nh);
    if (!nh) return -1;
    free(c->peers_s.phash);
    c->peers_s.phash = nh;
    c->peers_s.phcap = ncap;
    for (int i = 0; i < c->peers_s.npeers; i++) phash_put(c, c->peers_s.peers[i]);
    return 0;
}

/* Takes p out of the table (linear probing: the run after it shifts back). */
static void phash_del(lei_ctx *c, lei_peer *p) {
    uint32_t m = (uint32_t)c->peers_s.phcap - 1, j = addr_hash(p->addr) & m;
    while (c->peers_s.phash[j] != p) j = (j + 1) & m;
    c->peers_s.phash[j] = NULL;
    for (uint32_t k = (j + 1) & m; c->peers_s.phash[k]; k = (k + 1) & m) {
        lei_peer *q = c->peers_s.phash[k];
        uint32_t h = addr_hash(q->addr) & m;
        /* q stays unless its home h lies cyclically outside (j, k] */
        if ((j < k) ? (h <= j || h > k) : (h <= j && h > k)) {
            c->peers_s.phash[j] = q;
            c->peers_s.phash[k] = NULL;
            j = k;
        }
    }
}

/* Room for one more peer in ctx->peers_s.peers and one more idx. */
static int peers_room(lei_ctx *c) {
    if (c->peers_s.npeers == c->peers_s.cpeers) {
        int n = c->peers_s.cpeers ? c->peers_s.cpeers * 2 : 8;
        lei_peer **np = realloc(c->peers_s.peers, (size_t)n * sizeof *np);
        if (!np) return -1;
        c->peers_s.peers = np;
        c->peers_s.cpeers = n;
    }
    if (!c->peers_s.nfreeidx && c->peers_s.nbyidx == c->peers_s.cbyidx) {
        int n = c->peers_s.cbyidx ? c->peers_s.cbyidx * 2 : 8;
        lei_peer **nb = realloc(c->peers_s.byidx, (size_t)n * sizeof *nb);
        if (!nb) return -1;
        c->peers_s.byidx = nb;
        int *nf = realloc(c->peers_s.freeidx, (size_t)n * sizeof *nf);
        if (!nf) return -1;
        c->peers_s.freeidx = nf;
        c->peers_s.cbyidx = n;
    }
    return 0;
}

lei_peer *lei_peers_new(lei_ctx *c, const char *addr) {
    if (peers_room(c) || phash_room(c)) return NULL;
    lei_peer *p = calloc(1, sizeof *p); /* owned by ctx->peers_s.peers until lei_peers_sweep */
    if (!p) return NULL;
    p->ctx = c;
    snprintf(p->addr, sizeof p->addr, "%s", addr);
    p->last_fail = -1e9;
    p->pos = c->peers_s.npeers;
    c->peers_s.peers[c->peers_s.npeers++] = p;
    p->idx = c->peers_s.nfreeidx ? c->peers_s.freeidx[--c->peers_s.nfreeidx] : ++c->peers_s.nbyidx;
    c->peers_s.byidx[p->idx - 1] = p;
    phash_put(c, p);
    if ((size_t)c->peers_s.npeers > c->o.max_peers) c->peers_s.peers_over = 1; /* lei_peer_turn evicts */
    /* unused until a channel, a sync or a connection takes it: swept if none does */
    p->unused_at = ev_now(c->loop);
    lei_expiry_at(c, p->unused_at + c->o.peer_free_after);
    return p;
}

/* Frees p and what its record owns: its spare batch buffer, its channel
 * flags (bound) and its sequence tracking's tables (p->lv's seqs, bych and bind,
 * which live.c allocates).  Its queue is empty: a peer is freed unused
 * (peer_unused), or at the context's end after ctx.c cleared every queue
 * (lei_peer_q_clear: the queue is peer.c's, a layer above this table). */
static void peers_free(lei_peer *p) {
    lei_msg_release(p->spare, NULL, NULL);
    free(p->lv.seqs);
    free(p->lv.bych);
    free(p->lv.bind);
    free(p->bound);
    free(p);
}

/* Marks the peers something refers to: channels' destinations, sync waits,
 * connections (a closed one not yet freed too), notes not yet told. */
static void peers_mark(lei_ctx *c) {
    for (int i = 0; i < c->peers_s.npeers; i++) c->peers_s.peers[i]->mark = 0;
    for (uint32_t i = 0; i < c->chan_s.nchans; i++)
        for (int j = 0; j < c->chan_s.chans[i]->ndests; j++) lei_chan_dests(c->chan_s.chans[i])[j]->mark = 1;
    for (lei_sync *s = c->sync_s.syncs; s; s = s->next)
        for (int i = 0; i < s->nw; i++)
            if (s->w[i].peer) s->w[i].peer->mark = 1;
    for (lei_conn *k = c->conns; k; k = k->next) {
        if (k->peer) k->peer->mark = 1;
        if (k->was) k->was->mark = 1;
    }
    for (int i = 0; i < c->peer_s.nnotes; i++) {
        lei_peer *p = lei_peers_by_idx(c, c->peer_s.notes[i].idx);
        if (p) p->mark = 1;
    }
}

/* After peers_mark: nothing uses p (it may be freed). */
static int peer_unused(const lei_peer *p) {
    return !(p->mark || p->conn || p->retiring || p->q.head || p->held || p->await_in > 0 ||
             p->dial_pending);
}

/* Frees c->peers_s.peers[i] (the last peer takes its place). */
static void peers_drop(lei_ctx *c, int i) {
    lei_peer *p = c->peers_s.peers[i];
    phash_del(c, p);
    c->peers_s.byidx[p->idx - 1] = NULL;
    c->peers_s.freeidx[c->peers_s.nfreeidx++] = p->idx;
    c->peers_s.peers[i] = c->peers_s.peers[--c->peers_s.npeers];
    c->peers_s.peers[i]->pos = i;
    peers_free(p);
}

/* Frees the peers nothing has used for peer_free_after seconds, and
 * arms the expiry timer for the next that may be. */
void lei_peers_sweep(lei_ctx *c) {
    ev_tstamp now = ev_now(c->loop), next = 0;
    peers_mark(c);
    for (int i = 0; i < c->peers_s.npeers; i++) {
        lei_peer *p = c->peers_s.peers[i];
        if (!peer_unused(p)) {
            p->unused_at = 0;
            /* without a connection to say when it ends, looked at again
             * later (a destination dropped, a sync record freed) */
            if (!p->conn && (!next || now + c->o.peer_free_after < next))
                next = now + c->o.peer_free_after;
            continue;
        }
        if (!p->unused_at) p->unused_at = now;
        ev_tstamp due = p->unused_at + c->o.peer_free_after;
        if (due > now) {
            if (!next || due < next) next = due;
            continue;
        }
        peers_drop(c, i);
        i--;
    }
    if (next) lei_expiry_at(c, next);
}

static int by_unused_at(const void *a, const void *b) {
    ev_tstamp x = (*(lei_peer *const *)a)->unused_at, y = (*(lei_peer *const *)b)->unused_at;
    return x < y ? -1 : x > y;
}

/* More than max_peers peers (run from the loop, never while a caller holds
 * a peer): the peers nothing uses are freed at once, oldest unused first,
 * down to 15/16 of max_peers (so that a stream of new addresses pays for
 * this once per max_peers / 16 of them).  Peers in use stay: those are
 * bounded by the member lists (max_peers) and connections (max_connections). */
void lei_peers_evict(lei_ctx *c) {
    c->peers_s.peers_over = 0;
    ev_tstamp now = ev_now(c->loop);
    size_t keep = c->o.max_peers - c->o.max_peers / 16;
    peers_mark(c);
    lei_peer **v = malloc((size_t)c->peers_s.npeers * sizeof *v); /* freed below */
    if (!v) return;
    int n = 0;
    for (int i = 0; i < c->peers_s.npeers; i++) {
        lei_peer *p = c->peers_s.peers[i];
        if (!peer_unused(p)) continue;
        if (!p->unused_at) p->unused_at = now;
        v[n++] = p;
    }
    qsort(v, (size_t)n, sizeof *v, by_unused_at);
    int freed = 0;
    for (int j = 0; j < n && (size_t)c->peers_s.npeers > keep; j++, freed++) peers_drop(c, v[j]->pos);
    free(v);
    if (freed)
        lei_ratelog(c, LEI_RL_PEERS, "more than %zu peer records: %d unused ones freed at once",
                    c->o.max_peers, freed);
}

/* At the context's end: every peer (ctx.c cleared their queues first). */
void lei_peers_free(lei_ctx *c) {
    for (int i = 0; i < c->peers_s.npeers; i++) peers_free(c->peers_s.peers[i]);
    free(c->peers_s.peers);
    free(c->peers_s.phash);
    free(c->peers_s.byidx);
    free(c->peers_s.freeidx);
}
