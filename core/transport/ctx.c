/* ctx.c: the context's life cycle (options, new, shutdown, free), the
 * submit entry and its room (lei_submit_room), the operations the lower
 * layers reach upward through (c->kops, registered in lei_ctx_new) and the
 * loop's per-turn hook (contracts in ctx.h).  The top of the transport's
 * layers (core/transport/README.md "Order"): none of its files calls it.
 *
 * The context's other concepts live in files of their own: conn.c
 * (connection records), conn_io.c (reading, handing frames over), peer.c
 * (peers, queues, batching, policies, dials), chan.c (channels), local.c
 * (local delivery), sync.c (sync records), live.c (heartbeats, sequence
 * tracking).
 * Private structs: ctx_int.h.  Leans on libev; no Lua here.
 */
#define _GNU_SOURCE
#include "ctx_int.h"

#include <limits.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

void lei_opts_default(lei_opts *o) {
    o->queue_limit = 64u << 20;
    o->policy = LEI_BLOCK;
    o->batch_bytes = 256u << 10;
    o->max_frame = (256u << 20) + 4096;
    o->retry_interval = 0.5;
    o->heartbeat = 5.0;
    o->heartbeat_misses = 2.0;
    o->retry_max = 2.0;
    o->handshake_timeout = 10.0;
    o->max_connections = 1024;
    o->max_buffered = (size_t)512 << 20;
    o->max_peer_channels = 262144; /* = max_channels: 65,536 channels over one connection (issue 13) fit with room */
    o->max_channels = 262144;
    o->max_peers = 4096;
    o->peer_free_after = LEI_PEER_FREE_AFTER;
    o->log_window = LEI_RATELOG_WINDOW;
    o->no_aes = 0;
}

struct ev_loop *lei_ctx_loop(const lei_ctx *c) { return c->loop; }

const lei_opts *lei_ctx_opts(const lei_ctx *c) { return &c->o; }

void lei_ctx_batch(lei_ctx *c, int on) { c->batch = on && c->h.events; }

void lei_ctx_refusal(lei_ctx *c, const char *why) {
    snprintf(c->refusal, sizeof c->refusal, "%s", why ? why : "");
}

/* Whether a submit on chid has room: its destinations' queues (written
 * to as far as the sockets take) and the local queue (ctx.h). */
int lei_submit_room(lei_ctx *c, uint32_t chid) {
    lei_chan *ch = lei_chan_get(c, chid);
    if (!ch) return 1;
    lei_peer *p;
    while ((p = lei_chan_full_dest(c, ch)) != NULL) {
        size_t before = p->q.bytes;
        /* What the socket takes now may be enough; if not, lei_peer_flush armed
         * the write watcher (or the connection is still being made), so the
         * loop wakes when there may be room: never a sleep with data queued. */
        lei_peer_flush(p);
        if (p->q.bytes >= before || p->q.bytes >= c->o.queue_limit) return 0;
    }
    if (ch->local && lei_local_full(c, ch)) {
        lei_local_kick(c);
        return 0;
    }
    return 1;
}

int lei_submit(lei_ctx *c, uint32_t chid, uint64_t producer, uint64_t seq, lei_msg *msg,
               int sync, int policy, uint64_t *sync_id, const char **err) {
    lei_chan *ch = lei_chan_get(c, chid);
    if (!ch) {
        *err = "no such channel";
        return -LEI_E_NOTFOUND;
    }
    if (msg->total + LEI_EVENT_HDR_MAX > c->o.max_frame) {
        *err = "event larger than the frame limit (max_frame)";
        return -LEI_E_LIMIT;
    }
    /* Everything that can fail is allocated before anything is queued or
     * counted: a failed submit leaves no trace.  The destinations are
     * copied: a policy closing a peer, or a write failing, must not change
     * the list this event is sent to. */
    int nd = ch->ndests;
    int local_drop = ch->local && !sync && policy != LEI_BLOCK && lei_local_full(c, ch);
    lei_peer *one[8], **dests = nd <= 8 ? one : malloc((size_t)nd * sizeof *dests);
    lei_qitem *lit = NULL;
    lei_sync *s = NULL;
    if (!dests || (ch->local && !local_drop && !(lit = lei_item_new(msg))) ||
        (sync && (!(s = calloc(1, sizeof *s)) ||
                  !(s->w = calloc((size_t)nd + 1, sizeof *s->w))))) {
        if (dests != one) free(dests);
        if (lit) lei_item_free(c, lit);
        free(s);
        *err = "out of memory";
        return -LEI_E_NOMEM;
    }
    if (nd) memcpy(dests, lei_chan_dests(ch), (size_t)nd * sizeof *dests);
    if (local_drop) ch->drops++; /* the local queue is full: dropped, counted */
    if (s) {
        lei_sync_link(c, s);
        *sync_id = s->id;
        /* a sync marker (producer 0, seq 0) is answered with 0 handlers */
        s->want_ran = producer || seq;
    }
    /* The same frame header for every destination: built once. */
    uint8_t hdr[LEI_EVENT_HDR_MAX];
    size_t hlen = lei_frame_event_hdr(hdr, ch->id, producer, seq, s ? s->id : 0, msg->total);
    /* events_out and bytes_out count per destination, where the event is
     * queued (lei_peer_enqueue); an event with no destination at all is
     * counted here, and as nothing else (doc/semantics.md "Statistics"). */
    if (!nd && !ch->local) ch->ev_nodest++;
    /* A small async event of several destinations: written once, into
     * the channel's shared batch, and queued to each by reference (peer.c
     * "shared batches"; out of memory there: a copy per destination). */
    size_t soff = 0;
    lei_msg *sb = nd > 1 && !sync && msg->total <= SMALL_EVENT && msg->next == 0
                      ? lei_peer_shared_append(c, ch, hdr, hlen, msg, &soff)
                      : NULL;
    if (sb) {
        for (int i = 0; i < nd; i++)
            lei_peer_enqueue_shared(c, dests[i], ch, sb, soff, hlen + msg->total, msg->total, policy);
        lei_peer_shared_unref(c, ch, sb);
        nd = 0;
    }
    for (int i = 0; i < nd; i++) {
        lei_peer *p = dests[i];
        if (s) {
            lei_sync_wait *w = &s->w[s->nw++];
            w->peer = p;
            s->nwait++;
        }
        lei_peer_enqueue(c, p, ch, hdr, hlen, msg, s ? s->id : 0, policy);
        if (s && !lei_peer_live(p)) {
            char why[LEI_ADDR_MAX + 256]; /* an address and a peer reason */
            snprintf(why, sizeof why, "consumer context %s: unreachable (%s)", p->addr,
                     p->reason[0] ? p->reason : "not connected");
            lei_sync_fail(&s->w[s->nw - 1], s, why, p->reason_code ? p->reason_code : LEI_E_CLOSED);
        }
    }
    if (dests != one) free(dests);
    if (lit) {
        lit->chid = chid;
        lit->producer = producer;
        lit->seq = seq;
        lit->size = msg->total;
        if (s) {
            s->w[s->nw++].peer = NULL;
            s->nwait++;
            lit->sync = s->id;
        }
        /* Local consumers run from the loop, after what was queued before. */
        lei_q_push(&c->local_s.lq, lit);
        ev_idle_start(c->loop, &c->local_s.idle);
    }
    return 0;
}

int lei_call(lei_ctx *c, uint32_t chid, const char *dest, lei_msg *msg, int policy,
             uint64_t *sync_id, const char **err) {
    lei_chan *ch = lei_chan_get(c, chid);
    if (!ch) {
        *err = "no such channel";
        return -LEI_E_NOTFOUND;
    }
    if (msg->total + LEI_EVENT_HDR_MAX > c->o.max_frame) {
        *err = "call larger than the frame limit (max_frame)";
        return -LEI_E_LIMIT;
    }
    lei_peer *p = NULL;
    if (dest) {
        lei_peer **ds = lei_chan_dests(ch);
        for (int i = 0; i < ch->ndests && !p; i++)
            if (strcmp(ds[i]->addr, dest) == 0) p = ds[i];
    }
    if (dest ? !p : !ch->local) {
        *err = "no such destination";
        return -LEI_E_NOTFOUND;
    }
    /* Owners: s (and s->w) go on c->sync_s.syncs, freed by lei_sync_free; lit goes
     * on the local queue, freed once delivered. */
    lei_sync *s = calloc(1, sizeof *s);
    lei_qitem *lit = NULL;
    if (!s || !(s->w = calloc(1, sizeof *s->w)) || (!p && !(lit = lei_item_new(msg)))) {
        if (s) free(s->w);
        free(s);
        *err = "out of memory";
        return -LEI_E_NOMEM;
    }
    lei_sync_link(c, s);
    *sync_id = s->id;
    s->w[0].peer = p;
    s->nw = s->nwait = 1;
    /* Counted where it goes: events_out (lei_peer_enqueue) or events_local. */
    if (p) {
        uint8_t hdr[LEI_EVENT_HDR_MAX];
        size_t hlen = lei_frame_event_hdr(hdr, ch->id, 1, 1, s->id, msg->total);
        lei_peer_enqueue(c, p, ch, hdr, hlen, msg, s->id, policy);
        if (!lei_peer_live(p)) {
            char why[LEI_ADDR_MAX + 256];
            snprintf(why, sizeof why, "service context %s: unreachable (%s)", p->addr,
                     p->reason[0] ? p->reason : "not connected");
            lei_sync_fail(&s->w[0], s, why, p->reason_code ? p->reason_code : LEI_E_CLOSED);
        }
        return 0;
    }
    lit->chid = chid;
    lit->producer = 1;
    lit->seq = 1;
    lit->size = msg->total;
    lit->sync = s->id;
    lei_q_push(&c->local_s.lq, lit);
    ev_idle_start(c->loop, &c->local_s.idle);
    return 0;
}

static void prepare_cb(struct ev_loop *loop, ev_prepare *w, int revents) {
    (void)loop;
    (void)revents;
    lei_ctx *c = w->data;
    if (c->peer_s.nnotes) lei_tell_notes(c);
    if (c->h.prepare) c->h.prepare(c->h.ud);
    lei_peer_turn(c);
    c->unflushed = 0;
    lei_peer_flush_all(c);
}

/* Sync events and ACKs queued inside a callback (a call sent or answered
 * from Lua) are written once that turn's callbacks are over, in one write
 * per peer, not one write each: at lowest priority, this check watcher runs
 * after every other callback of the turn (and the prepare watcher writes
 * what the next turn's scheduler queued). */
static void check_cb(struct ev_loop *loop, ev_check *w, int revents) {
    (void)loop;
    (void)revents;
    lei_ctx *c = w->data;
    if (!c->unflushed) return;
    c->unflushed = 0;
    lei_peer_flush_all(c);
}

void lei_ctx_shutdown(lei_ctx *c) {
    c->closing = 1;
    /* Closing from a handler that holds its connection: read on, so that
     * the remote's FIN is seen (what comes is for closed consumers now). */
    for (int i = 0; i < c->peers_s.npeers; i++)
        if (c->peers_s.peers[i]->held) lei_resume(c, c->peers_s.peers[i], 0);
    for (lei_conn *k = c->conns, *nk; k; k = nk) {
        nk = k->next; /* a failed write frees k */
        if (k->state == LEI_CONN_CLOSED) continue;
        if ((k->state == LEI_CONN_UP || k->state == LEI_CONN_CLOSING) && k->peer &&
            k->peer->conn == k) {
            lei_peer *p = k->peer;
            /* read confirmation of what we wrote and queued: asked behind
             * it, answered before the remote's FIN (live.c) */
            if (k->state == LEI_CONN_UP && p->cf.on && (p->cf.wr > p->cf.ok || p->q.head)) {
                k->busy++; /* a failed write closes k: it must outlive this call */
                lei_live_ask(p);
                k->busy--;
                if (k->state == LEI_CONN_CLOSED) {
                    lei_conn_free(k);
                    continue;
                }
            }
            lei_peer_flush(k->peer); /* FIN once written */
        }
        else
            lei_conn_fin(k); /* UP without its peer; no-op in any other state */
    }
}

void lei_ctx_stop_listening(lei_ctx *c) { lei_accept_close(c); }

int lei_ctx_pending(lei_ctx *c, uint64_t *events, uint64_t *bytes) {
    int open = 0;
    *events = *bytes = 0;
    for (lei_conn *k = c->conns; k; k = k->next)
        if (k->state != LEI_CONN_CLOSED) open++;
    for (int i = 0; i < c->peers_s.npeers; i++) {
        lei_peer *p = c->peers_s.peers[i];
        for (lei_qitem *it = p->q.head; it; it = it->next)
            if (it->batch)
                *events += it->nev;
            else if (it->hlen > 4 && it->hdr[4] == LEI_F_EVENT)
                (*events)++;
        *bytes += p->q.bytes - p->woff;
        if (p->q.head && !p->conn && p->await_in > 0) open++;
    }
    return open;
}

int lei_ctx_unsure(const lei_ctx *c, uint64_t *events, uint64_t *bytes) {
    int n = 0;
    *events = *bytes = 0;
    /* One walk of the connections (a peer's current connection is open and
     * listed here: its close clears p->conn, lei_peer_lost). */
    for (const lei_conn *k = c->conns; k; k = k->next) {
        if (k->state == LEI_CONN_CLOSED) continue;
        const lei_peer *p = k->peer;
        /* (a connection not its peer's current one, or of no peer: unknown;
         * a peer that confirms reads, confirmed every async event written
         * there (cf counts those) and answered the last sync one, nothing
         * left queued: sure, as after an answered sync) */
        if (!p || p->conn != k) {
            n++;
            continue;
        }
        /* written there, not confirmed yet (a peer that confirms reads) */
        if (p->cf.on && p->cf.wr > p->cf.ok) {
            *events += p->cf.wr - p->cf.ok;
            *bytes += p->cf.wr_bytes - p->cf.ok_bytes;
        }
        if (p->acked_ev == p->st.ev_out) continue;
        if (p->cf.on && p->cf.wr <= p->cf.ok && !p->q.head && p->last_sync_ev == p->acked_ev) continue;
        n++;
    }
    return n;
}

lei_ctx *lei_ctx_new(const lei_opts *o, const lei_hooks *h) {
    if (sodium_init() < 0) return NULL; /* idempotent, thread-safe */
    lei_ctx *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    if (o)
        c->o = *o;
    else
        lei_opts_default(&c->o);
    /* An empty queue always takes one event: a limit of 0 would take none
     * and block every submit for ever (the Lua layer refuses 0 already). */
    if (c->o.queue_limit == 0) c->o.queue_limit = 1;
    c->h = *h;
    c->kops.refuse = lei_accept_refuse;
    c->kops.close = lei_conn_close;
    c->kops.read_cb = lei_conn_io_read_cb;
    c->kops.write_cb = lei_conn_io_write_cb;
    c->kops.live_new = lei_live_conn_new;
    c->kops.peer_lost = lei_peer_lost;
    c->kops.dial_done = lei_dial_done;
    c->kops.may_dial = lei_live_may_dial;
    c->kops.mech_protected = &lei_mech_protected;
    c->kops.mech_keyed = &lei_mech_keyed;
    c->kops.hs_frame = lei_handshake_frame;
    c->kops.hs_hello = lei_handshake_hello;
    c->loop = ev_loop_new(EVFLAG_AUTO);
    if (!c->loop) {
        free(c);
        return NULL;
    }
    lei_accept_init(c); /* no listener yet */
    if (getrandom(&c->incarnation, sizeof c->incarnation, 0) != sizeof c->incarnation)
        c->incarnation = (uint64_t)getpid() << 32 ^ (uint64_t)ev_time();
    lei_sync_init(c); /* the first sync id, random below 2^52 */
    ev_prepare_init(&c->prep, prepare_cb);
    c->prep.data = c;
    ev_prepare_start(c->loop, &c->prep);
    ev_unref(c->loop); /* the flusher alone does not keep the loop alive */
    ev_check_init(&c->chk, check_cb);
    ev_set_priority(&c->chk, EV_MINPRI);
    c->chk.data = c;
    ev_check_start(c->loop, &c->chk);
    ev_unref(c->loop);
    ev_idle_init(&c->local_s.idle, lei_local_idle_cb);
    c->local_s.idle.data = c;
    ev_idle_init(&c->peer_s.kick, lei_kick_cb);
    c->peer_s.kick.data = c;
    ev_timer_init(&c->peers_s.expiry_w, lei_expiry_cb, AWAIT_IN_SECONDS, 0.);
    c->peers_s.expiry_w.data = c;
    ev_init(&c->hb, lei_live_timer_cb);
    c->hb.data = c;
    return c;
}


void lei_ctx_free(lei_ctx *c) {
    if (!c) return;
    lei_peer_flush_all(c);
    while (c->conns) {
        lei_conn *k = c->conns;
        k->busy = 0;
        if (k->state == LEI_CONN_CLOSED) {
            lei_conn_free(k);
            continue;
        }
        if (k->peer) k->peer->conn = NULL;
        k->peer = NULL;
        lei_conn_close(k, "context closed", 0);
    }
    lei_qitem *it;
    while ((it = lei_q_pop(&c->local_s.lq))) lei_item_free(c, it);
    while ((it = lei_q_pop(&c->local_s.ldef))) lei_item_free(c, it);
    /* the peers' queues (peer.c's), then the peer table frees the records */
    for (int i = 0; i < c->peers_s.npeers; i++) lei_peer_q_clear(c, c->peers_s.peers[i], 0);
    lei_peers_free(c);
    for (uint32_t i = 0; i < c->chan_s.nchans; i++) {
        if (c->chan_s.chans[i]->sb) lei_peer_shared_unref(c, NULL, c->chan_s.chans[i]->sb);
        free(c->chan_s.chans[i]->name);
        if (c->chan_s.chans[i]->ndests > 1) free(c->chan_s.chans[i]->d.many);
        free(c->chan_s.chans[i]);
    }
    free(c->chan_s.chans);
    free(c->chan_s.hash);
    while (c->sync_s.syncs) lei_sync_free(c, c->sync_s.syncs);
    free(c->sync_s.shash);
    free(c->sync_s.sdone);
    lei_ctx_stop_listening(c);
    ev_ref(c->loop);
    ev_prepare_stop(c->loop, &c->prep);
    ev_ref(c->loop);
    ev_check_stop(c->loop, &c->chk);
    ev_idle_stop(c->loop, &c->local_s.idle);
    ev_idle_stop(c->loop, &c->peer_s.kick);
    ev_timer_stop(c->loop, &c->peers_s.expiry_w);
    ev_timer_stop(c->loop, &c->hb);
    lei_accept_stop(c);
    free(c->peer_s.notes);
    for (int i = 0; i < c->rbuf_s.nspare; i++) free(c->rbuf_s.spare[i]);
    lei_peer_pool_free(c); /* after the peers' queues and the channels gave theirs back */
    lei_ident_free(c);
    ev_loop_destroy(c->loop);
    free(c);
}

/* ---- read access for the embedder (ctx.h) ------------------------------ */

const char *lei_ctx_addr(const lei_ctx *c) { return c->addr; }

const char *lei_ctx_bound(const lei_ctx *c) { return c->bound; }

void lei_ctx_enter(lei_ctx *c) { lei_ctx_hook_enter(c); }

void lei_ctx_leave(lei_ctx *c) { lei_ctx_hook_leave(c); }

int lei_ctx_depth(const lei_ctx *c) { return c->depth; }

void lei_ctx_count_encode(lei_ctx *c) { c->encodes++; }

void lei_ctx_stats(const lei_ctx *c, lei_stats_ctx *out) {
    out->encodes = c->encodes;
    out->bad_frames = c->bad_frames;
    out->local_bytes = c->local_s.lq.bytes;
    out->local_events = c->local_s.lq.count;
    out->deferred_bytes = c->local_s.ldef.bytes;
    out->deferred_events = c->local_s.ldef.count;
    out->connections = c->nconns;
    out->read_buffer_bytes = c->rbuf;
    out->stale_acks = c->sync_s.stale_acks;
    out->rbuf_adopted = c->rbuf_s.adopted;
    out->undelivered = c->peer_s.und_events;
    out->undelivered_bytes = c->peer_s.und_bytes;
    out->unconfirmed = c->peer_s.unc_events;
    out->unconfirmed_bytes = c->peer_s.unc_bytes;
}

const char *lei_ctx_undelivered_why(const lei_ctx *c) { return c->peer_s.und_why; }
const char *lei_ctx_unconfirmed_why(const lei_ctx *c) { return c->peer_s.unc_why; }
