/* live.c: liveness (heartbeats, PINGs, dead peers, redial backoff) and
 * sequence tracking (gaps, duplicates) per peer incarnation.
 */
#define _GNU_SOURCE
#include "ctx_int.h"

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- liveness ------------------------------------------------------------
 *
 * One timer per context watches every connection.  A HEARTBEAT goes out on
 * a connection on which we have written nothing for `heartbeat` seconds, so
 * a live process is heard whatever it reads (its peer's frames may wait
 * behind a backlog it has not read yet).  A PING goes out on one from which
 * nothing has arrived for (1 + heartbeat_misses) / 2 heartbeats: a live peer
 * answers HEARTBEAT at once, whatever its own settings, before we give up on
 * it.  Either only when nothing else is queued.  A connection from
 * which nothing at all (no byte) has arrived for heartbeat * heartbeat_misses
 * seconds is closed as dead ("no heartbeat from ADDR for N s"), which fails
 * its syncs and tells the binding (peer down) like any lost connection.  A
 * connection that has not finished its handshake within that time is closed
 * too.  The hot path pays one ev_now() store per read callback and per
 * writev, nothing per event.
 *
 * Before declaring a peer dead the timer asks the kernel whether the socket
 * is ready (bytes or a connect's answer waiting): if our own process was
 * stalled (stopped, swapped, a long handler, code that does not run the
 * loop), the timer may run before the I/O callbacks of the same loop turn,
 * and what waits proves the peer alive. */

static int live_fd_ready(int fd, short events) {
    struct pollfd pf = {.fd = fd, .events = events, .revents = 0};
    return poll(&pf, 1, 0) > 0;
}

static double live_dead_after(const lei_ctx *c) {
    return c->o.heartbeat * c->o.heartbeat_misses;
}

static void live_arm(lei_ctx *c, double after) {
    if (c->o.heartbeat <= 0) return;
    double floor = c->o.heartbeat / 32;
    c->hb.repeat = after > floor ? after : floor;
    ev_timer_again(c->loop, &c->hb);
}

void lei_live_conn_new(lei_conn *k) {
    lei_ctx *c = k->ctx;
    /* ev_time, not ev_now: the loop time is stale when the program has not
     * run the loop for a while (a dial from code that computed for seconds). */
    k->born = k->last_in = k->last_out = k->last_ping = ev_time();
    /* The timer's next expiry is never later than heartbeat from now while
     * some connection exists (see lei_live_timer_cb): only start it here. */
    if (!ev_is_active(&c->hb)) live_arm(c, c->o.heartbeat);
}

/* Queues an empty PING or PONG frame behind whatever is queued. */
static void live_send(lei_peer *p, uint8_t type) {
    uint8_t hdr[LEI_FRAME_HDR];
    lei_frame_hdr(hdr, type, 0);
    lei_qitem *it = lei_item_bytes(hdr, sizeof hdr, NULL, 0);
    if (!it) return;
    lei_q_push(&p->q, it);
    p->lv.hb_out++;
    lei_peer_flush(p);
}

int lei_live_frame(lei_conn *k, const lei_frame *f) {
    lei_peer *p = k->peer;
    if (f->len) {
        lei_conn_close(k, "HEARTBEAT or PING frame with a body", 1);
        return -1;
    }
    p->lv.hb_in++;
    if (f->type == LEI_F_PING) live_send(p, LEI_F_HEARTBEAT);
    return k->state == LEI_CONN_CLOSED ? -1 : 0;
}

/* ---- read confirmation ---------------------------------------------------
 *
 * What the kernel took is not what the consumer read: a consumer process
 * stopped (or dead) after its connection came up leaves our events in its
 * socket, and a connection that then ends (the deadline, a reset) took them
 * with it.  So a consuming context that speaks it offers read confirmation
 * to the peer that sends it events: once per connection, after the first
 * BIND it accepts, a CTRL `{ op = "reply", rid = 0, confirm = 1 }`, a reply to
 * nothing that a context of before drops without a word (as the keyed
 * fallback marker, secure.c).  To a peer that offered, and only to it (an
 * unknown frame type closes a connection of before), we send now and then a
 * CONFIRM_ASK carrying a token, queued behind what we sent; the remote
 * answers CONFIRM with the token when its read callback reaches the ask, so
 * every EVENT before the ask was read (taken off the connection and handed
 * to its dispatch).  peer.c records, when the ask is written, how many of
 * our async events (and bytes) went out before it; the answer makes them
 * confirmed.  Asked by the liveness timer when events were written since
 * the last ask (at most once per its run, so about once per heartbeat, never
 * per event) and by lei_ctx_shutdown before our FIN.  What a connection
 * that ends abnormally leaves unconfirmed is counted by lei_peer_lost. */

/* The offer: { op = "reply", rid = 0, confirm = 1 } as a CTRL frame into b
 * (LIVE_OFFER_MAX bytes); its length, or 0. */
#define LIVE_OFFER_MAX 64
static size_t live_offer_frame(uint8_t *b) {
    lei_wbuf w = {0};
    size_t n = 0;
    if (lei_enc_table_header(&w, 0, 3) == 0 && lei_enc_string(&w, "op", 2) == 0 &&
        lei_enc_string(&w, "reply", 5) == 0 && lei_enc_string(&w, "rid", 3) == 0 &&
        lei_enc_number(&w, 0) == 0 && lei_enc_string(&w, "confirm", 7) == 0 &&
        lei_enc_number(&w, 1) == 0 && w.len + LEI_FRAME_HDR <= LIVE_OFFER_MAX) {
        lei_frame_hdr(b, LEI_F_CTRL, w.len);
        memcpy(b + LEI_FRAME_HDR, w.data, w.len);
        n = LEI_FRAME_HDR + w.len;
    }
    lei_wbuf_free(&w);
    return n;
}

/* Queues a small control frame (an offer, an ask, an answer) behind what
 * is queued; counted with the ACKs (ack_bytes: a peer that never reads them
 * is cut at queue_limit, lei_ack) when ack is set.  0, or -1. */
static int live_queue(lei_peer *p, const uint8_t *b, size_t n, int ack) {
    lei_ctx *c = p->ctx;
    lei_qitem *it = lei_item_bytes(b, n, NULL, 0);
    if (!it) return -1;
    if (ack) {
        if (p->ack_bytes && p->ack_bytes + it->size > c->o.queue_limit && p->conn) {
            char why[160];
            snprintf(why, sizeof why, "not reading read confirmations: %zu bytes of them queued "
                                      "(queue_limit %zu)", p->ack_bytes, c->o.queue_limit);
            lei_item_free(c, it);
            lei_accept_refuse(p->conn, LEI_RL_SLOW_ACKS, why);
            return -1;
        }
        it->ack = 1;
        p->ack_bytes += it->size;
    }
    lei_q_push(&p->q, it);
    return 0;
}

/* We accepted a BIND of p's connection (a channel open here; keyed: its
 * ticket valid): our offer, once per connection (a producer we refuse is
 * offered nothing). */
void lei_live_offer(lei_peer *p) {
    if (p->cf.offered || !lei_peer_is_up(p)) return;
    p->cf.offered = 1;
    uint8_t b[LIVE_OFFER_MAX];
    size_t n = live_offer_frame(b);
    if (n && live_queue(p, b, n, 0) == 0) {
        p->st.ctrl_out++;
        lei_peer_flush(p);
    }
}

/* Is this CTRL the remote's offer?  1 (taken: not handed to the control
 * hook), 0 (any other). */
int lei_live_offer_in(lei_conn *k, const lei_frame *f) {
    uint8_t b[LIVE_OFFER_MAX];
    size_t n = live_offer_frame(b);
    if (!n || f->len != n - LEI_FRAME_HDR || memcmp(f->body, b + LEI_FRAME_HDR, f->len) != 0) return 0;
    k->peer->cf.on = 1;
    return 1;
}

/* Asks p (which offered) to confirm what is queued before this ask: a
 * CONFIRM_ASK with a fresh token, unless LEI_CF_ASKS are outstanding. */
void lei_live_ask(lei_peer *p) {
    if (!p->cf.on || !lei_peer_is_up(p) || p->cf.nasks >= LEI_CF_ASKS) return;
    uint8_t b[LEI_FRAME_HDR + 10];
    size_t n = lei_varint_encode(b + LEI_FRAME_HDR, ++p->cf.tok);
    lei_frame_hdr(b, LEI_F_CONFIRM_ASK, n);
    if (live_queue(p, b, LEI_FRAME_HDR + n, 0)) return;
    struct lei_cf_ask *a = &p->cf.asks[p->cf.nasks++];
    a->tok = p->cf.tok;
    a->ev = a->bytes = 0; /* set when it is written (peer.c) */
    p->cf.mark = p->cf.wr;
    lei_peer_flush(p);
}

/* A CONFIRM_ASK (answered at once: every frame before it was handed over)
 * or a CONFIRM (an answer to an ask of ours written on this connection; any
 * other token changes nothing).  0, or -1 after closing k. */
int lei_live_confirm_frame(lei_conn *k, const lei_frame *f) {
    lei_peer *p = k->peer;
    uint64_t tok;
    size_t used = 0;
    if (lei_varint_decode(f->body, f->len, &tok, &used) || used != f->len) {
        lei_conn_close(k, f->type == LEI_F_CONFIRM ? "malformed CONFIRM frame" : "malformed CONFIRM_ASK frame", 1);
        return -1;
    }
    if (f->type == LEI_F_CONFIRM_ASK) {
        uint8_t b[LEI_FRAME_HDR + 10];
        size_t n = lei_varint_encode(b + LEI_FRAME_HDR, tok);
        lei_frame_hdr(b, LEI_F_CONFIRM, n);
        if (live_queue(p, b, LEI_FRAME_HDR + n, 1) == 0) lei_peer_flush(p);
        return k->state == LEI_CONN_CLOSED || k->state == LEI_CONN_RETIRED ? -1 : 0;
    }
    for (int i = 0; i < p->cf.nwritten; i++) {
        if (p->cf.asks[i].tok != tok) continue;
        if (p->cf.asks[i].ev > p->cf.ok) {
            p->cf.confirmed += p->cf.asks[i].ev - p->cf.ok;
            p->cf.ok = p->cf.asks[i].ev;
            p->cf.ok_bytes = p->cf.asks[i].bytes;
        }
        /* it and the older ones answered: gone */
        int rest = p->cf.nasks - (i + 1);
        memmove(p->cf.asks, p->cf.asks + i + 1, (size_t)rest * sizeof *p->cf.asks);
        p->cf.nasks = (uint8_t)rest;
        p->cf.nwritten = (uint8_t)(p->cf.nwritten - (i + 1));
        break;
    }
    return 0;
}

/* When k's next PING (*ping) or HEARTBEAT, whichever is first, is due. */
static ev_tstamp live_due(const lei_ctx *c, const lei_conn *k, ev_tstamp *ping) {
    double hb = c->o.heartbeat;
    *ping = k->last_in + hb * (1 + c->o.heartbeat_misses) / 2;
    if (*ping < k->last_ping + hb) *ping = k->last_ping + hb; /* one per hb at most */
    return k->last_out + hb < *ping ? k->last_out + hb : *ping;
}

void lei_live_timer_cb(struct ev_loop *loop, ev_timer *w, int revents) {
    (void)revents;
    lei_ctx *c = w->data;
    ev_tstamp now = ev_now(loop), hb = c->o.heartbeat, dead = live_dead_after(c);
    ev_tstamp next = now + hb;
    int any = 0;
    lei_conn *k = c->conns;
    while (k) {
        lei_conn *nk = k->next; /* lei_conn_close may free k */
        if (k->state == LEI_CONN_CLOSED) {
            k = nk;
            continue;
        }
        const char *who = k->peer ? k->peer->addr : "an unidentified peer";
        char why[200];
        if (k->state < LEI_CONN_UP) {
            if (now - k->born >= dead &&
                !live_fd_ready(k->fd, k->state == LEI_CONN_DIALING ? POLLOUT : POLLIN)) {
                snprintf(why, sizeof why, "%s %s: no handshake within %.1f s",
                         k->state == LEI_CONN_DIALING ? "connecting to" : "handshake with", who,
                         now - k->born);
                if (k->state == LEI_CONN_DIALING) { /* not connected: nobody to tell */
                    lei_ratelog(c, LEI_RL_LIVENESS, "closing connection: %s", why);
                    lei_conn_close(k, why, 0);
                } else { /* told why (ERROR), one log line per window */
                    lei_accept_refuse(k, LEI_RL_LIVENESS, why);
                }
            } else {
                any = 1;
                ev_tstamp t = k->born + dead > now ? k->born + dead : now + hb / 4;
                if (t < next) next = t;
            }
            k = nk;
            continue;
        }
        if (now - k->last_in >= dead) {
            if (live_fd_ready(k->fd, POLLIN)) {
                k->last_in = now; /* we were the slow one */
            } else if (k->peer && k->peer->conn == k && !k->peer->q.head && now - k->last_out > 2 * hb) {
                /* We were away ourselves (our own heartbeats did not go out,
                 * with nothing queued): a remote with a longer heartbeat than
                 * ours may have had nothing to say.  PING it, and give it one
                 * heartbeat to answer before it is judged. */
                k->last_in = now - dead + hb;
                k->last_ping = k->last_out = now;
                k->busy++; /* a failed write closes k: it must outlive this call */
                live_send(k->peer, LEI_F_PING);
                k->busy--;
                if (k->state == LEI_CONN_CLOSED) {
                    lei_conn_free(k);
                    k = nk;
                    continue;
                }
            } else {
                snprintf(why, sizeof why, "no heartbeat from %s for %.1f s", who, now - k->last_in);
                lei_ratelog(c, LEI_RL_LIVENESS, "closing connection: %s (heartbeat %g s, misses %g)",
                            why, hb, c->o.heartbeat_misses);
                if (k->peer) k->peer->lv.timeouts++;
                lei_conn_close(k, why, 0);
                k = nk;
                continue;
            }
        }
        /* A quiet connection's drained read buffer goes back to small. */
        lei_rbuf_idle(k, now - k->last_in >= hb);
        /* Read confirmation: events went out since the last ask */
        if (k->peer && k->peer->conn == k && k->peer->cf.on && k->peer->cf.wr > k->peer->cf.mark) {
            k->busy++; /* a failed write closes k: it must outlive this call */
            lei_live_ask(k->peer);
            k->busy--;
            if (k->state == LEI_CONN_CLOSED) {
                lei_conn_free(k);
                k = nk;
                continue;
            }
        }
        /* A PING when input is silent, else a HEARTBEAT when output is
         * idle (the PING is output too). */
        ev_tstamp ping, due = live_due(c, k, &ping);
        if (due <= now && k->peer && k->peer->conn == k && !k->peer->q.head) {
            if (ping <= now) k->last_ping = now;
            k->busy++; /* a failed write closes k: it must outlive this call */
            live_send(k->peer, ping <= now ? LEI_F_PING : LEI_F_HEARTBEAT);
            k->busy--;
            if (k->state == LEI_CONN_CLOSED) {
                lei_conn_free(k);
                k = nk;
                continue;
            }
            k->last_out = now; /* even if the kernel did not take it all yet */
            due = live_due(c, k, &ping);
        }
        if (k->state != LEI_CONN_CLOSED) {
            any = 1;
            if (due <= now) due = now + hb / 4; /* a PING waits behind queued frames */
            if (due > k->last_in + dead) due = k->last_in + dead;
            if (due < next) next = due;
        }
        k = nk;
    }
    if (any)
        live_arm(c, next - now);
    else
        ev_timer_stop(loop, w);
}

/* A process that did not run its loop for longer than heartbeat * misses
 * (a Python script between two calls, a long computation) has been
 * declared dead by its peers, which closed their connections to it; until
 * a loop turn reads those closes, the connections look up here, and a
 * request written to one fails with EPIPE (or is lost to a RST) though the
 * peer is alive and would answer on a new connection.  Before such a
 * request the binding calls this: each connection up whose input has been
 * silent for more than a heartbeat (a live remote writes at least that
 * often; 1 s without heartbeats), and not found open by such a poll within
 * that time either, and whose remote's close is waiting
 * (POLLRDHUP: its FIN is in, maybe behind frames) is read to that close by
 * its read callback, which dispatches what came before it as a loop turn
 * would.  Nothing is resent: the request has not been queued yet,
 * and what was queued before is lost and counted with the connection as
 * always.  A connection that was up failed no dial: its peer is dialled
 * again at once (the backoff is for dials that fail).  Our own dial still in
 * its handshake (connecting, or our HELLO or AUTH out) whose remote closed
 * is closed here and its peer dialled again at once, its queue kept whole:
 * nothing of it was written before UP.  Returns how many were caught. */
int lei_live_catch_up(lei_ctx *c) {
    enum { MAXN = 16 };
    lei_conn *ks[MAXN]; /* compared, never read once a callback ran: it may be freed */
    lei_peer *ps[MAXN]; /* peers outlive their connections (lei_peers_sweep, later) */
    int n = 0;
    ev_tstamp now = ev_time(), quiet = c->o.heartbeat > 0 ? c->o.heartbeat : 1.0;
    int redialed = 0;
    for (lei_conn *k = c->conns, *nk; k && n < MAXN; k = nk) {
        nk = k->next; /* a dial in its handshake is closed here */
        int hs = k->state == LEI_CONN_DIALING || k->state == LEI_CONN_HELLO_SENT ||
                 k->state == LEI_CONN_AUTH_SENT;
        /* (a poll that found it open counts as hearing from it: with
         * heartbeats off an idle connection is never heard, and each of
         * 60 was polled before every request, 86 us of CPU a sync submit) */
        ev_tstamp heard = k->open_at > k->last_in ? k->open_at : k->last_in;
        if ((k->state != LEI_CONN_UP && !hs) || !k->peer || k->peer->conn != k ||
            now - heard <= quiet)
            continue;
        struct pollfd pf = {.fd = k->fd, .events = POLLIN | POLLRDHUP, .revents = 0};
        if (poll(&pf, 1, 0) <= 0 || !(pf.revents & (POLLRDHUP | POLLHUP | POLLERR))) {
            k->open_at = now;
            continue;
        }
        if (hs) {
            /* Our dial, still in its handshake, closed by its remote (its
             * own deadline cut us while we were away).  Nothing of the
             * peer's queue was written on it (nothing is before UP): the
             * queue, BINDs and syncs included, is kept whole for a new
             * dial, made now (no dial failed: no backoff), as for a lost
             * tie-break (handshake.c). */
            lei_peer *p = k->peer;
            p->conn = NULL;
            k->peer = NULL;
            lei_conn_close(k, "closed by its remote during the handshake", 0);
            p->lv.fails = 0;
            p->lv.caught = 1;
            lei_peer_get(c, p->addr, 1);
            if (!lei_peer_live(p)) /* the dial failed at once (p->reason): as dials_run */
                lei_peer_lost(p, p->reason[0] ? p->reason : "dial failed");
            redialed++;
            continue;
        }
        k->peer->lv.caught = 1;
        ps[n] = k->peer;
        ks[n++] = k;
    }
    if (!n) return redialed;
    /* Their read callbacks, as a turn would run them, but before anything
     * else of a turn (a timer's write there would fail on the dead socket
     * and take its reason for the loss): what came is dispatched, then the
     * close is read.  A call reads at most a buffer: a few, until closed. */
    for (int i = 0; i < n; i++) {
        lei_peer *p = ps[i];
        for (int r = 0; r < 64 && p->conn == ks[i] && ks[i]->state == LEI_CONN_UP && !p->held; r++)
            ev_invoke(c->loop, &ks[i]->rio, EV_READ);
        if (p->conn == ks[i]) p->lv.caught = 0; /* open after all: the usual backoff */
    }
    /* The binding hears of the losses now, not at the next turn: the
     * request that follows must not be failed by the old connection's. */
    if (c->peer_s.nnotes) lei_tell_notes(c);
    return n + redialed;
}

/* Redial backoff: retry_interval after a loss, doubling with every dial that
 * did not reach a handshake, at most retry_max. */
int lei_live_may_dial(lei_peer *p) {
    lei_ctx *c = p->ctx;
    double wait = c->o.retry_interval;
    for (int i = 0; i < p->lv.fails && wait < c->o.retry_max; i++) wait *= 2;
    if (wait > c->o.retry_max && c->o.retry_max > 0) wait = c->o.retry_max;
    /* (a connection that was up, closed by its remote while this process
     * was away from its loop: no dial failed, no backoff; lei_live_catch_up) */
    if (p->lv.caught) { /* once: the next loss backs off again */
        p->lv.caught = 0;
        if (p->lv.fails == 0) {
            p->lv.fails++;
            return 1;
        }
    }
    if (ev_now(c->loop) - p->last_fail < wait) return 0;
    if (p->lv.fails < 64) p->lv.fails++;
    return 1;
}

/* A handshake completed.  Sequence numbers belong to one incarnation of the
 * peer: a new process at the same address starts again at 1. */
void lei_live_peer_up(lei_peer *p, uint64_t incarnation) {
    p->lv.fails = 0;
    /* read confirmation starts over with each connection (the token, the
     * totals go on) */
    lei_confirm *cf = &p->cf;
    cf->on = cf->offered = cf->nasks = cf->nwritten = 0;
    cf->wr = cf->wr_bytes = cf->ok = cf->ok_bytes = cf->mark = 0;
    if (p->lv.incarnation == incarnation) return;
    p->lv.incarnation = incarnation;
    if (p->lv.seqs) memset(p->lv.seqs, 0, (size_t)p->lv.seqcap * sizeof *p->lv.seqs);
    p->lv.seqn = 0;
    p->lv.seqhit = 0;
    if (p->lv.bych) memset(p->lv.bych, 0, (size_t)p->lv.nbych * sizeof *p->lv.bych);
    p->lv.nbych_used = 0;
    if (p->lv.bind) memset(p->lv.bind, 0, (size_t)p->lv.nbind * sizeof *p->lv.bind);
    p->lv.nbind_used = 0;
}

/* A BIND of our channel ch from p.  A producer BINDs a channel to a
 * destination on each connection before its first event there, and again
 * when it takes back a destination it had dropped (lei_peer_set_dests), in
 * the stream, before the first event it sends there since.  A BIND again on
 * one connection after our local consumers of ch went away (closed: a leave)
 * and came back (ch->epoch moved since the last BIND) marks where the events
 * owed to them start: what the producer submitted between its drop and the
 * BIND went to no one here and is no gap.  Its producers' sequences there
 * start again (the next event of each is a baseline: lei_live_seq compares
 * the entries' epoch with ch->epoch + restarts).  With the epoch unmoved
 * (consumers here all along: the producer dropped us, say the manager lost
 * us, while we wanted its events) the sequence goes on and what we missed is
 * a gap, counted and logged; so too across a new connection (its first
 * BIND).  O(1), no scan: a peer that BINDs in a loop costs us nothing more.
 * Tracked for channel ids below 4 per channel bound + 64 (as bych); a
 * channel above, or without memory, is not: its sequence goes on. */
void lei_live_bind(lei_peer *p, lei_chan *ch, int again) {
    lei_live *lv = &p->lv;
    uint32_t chid = ch->id;
    if (chid >= lv->nbind) {
        if ((uint64_t)chid + 1 > 4 * ((uint64_t)lv->nbind_used + 16)) return;
        uint32_t n = lv->nbind ? lv->nbind : 64;
        while (n <= chid) n *= 2;
        struct lei_bindst *b = realloc(lv->bind, (size_t)n * sizeof *b); /* owned by lv (bind) */
        if (!b) return;
        memset(b + lv->nbind, 0, (size_t)(n - lv->nbind) * sizeof *b);
        lv->bind = b;
        lv->nbind = n;
    }
    struct lei_bindst *st = &lv->bind[chid];
    /* epoch + 1: 0 is never bound (ch->epoch starts at 0) */
    int first = !st->epoch || !again;
    if (first) {
        /* The first BIND on a connection.  Our consumers' reappearances of
         * the last few seconds (not the first appearance: no leave before
         * it) may have their BIND again still to come: the producer sent
         * this one before it handled their leave and join.  The ones before
         * are behind us: the sequence goes on (across a new connection too,
         * a real gap is counted).  Never back before what an earlier BIND
         * took. */
        uint32_t base = lei_chan_epoch_recent(ch, ev_now(p->ctx->loop));
        if (!base) base = 1;
        if (base > ch->epoch) base = ch->epoch; /* (epoch 0: none yet) */
        if (!st->epoch) lv->nbind_used++;
        else if ((int32_t)(st->epoch - (base + 1)) > 0) base = st->epoch - 1;
        st->epoch = base + 1;
    } else {
        /* returns older than a few seconds had their BIND again, or never
         * get one (the producer handled their leave and join together):
         * they excuse nothing now */
        uint32_t base = lei_chan_epoch_recent(ch, ev_now(p->ctx->loop));
        if ((int32_t)(base + 1 - st->epoch) > 0) st->epoch = base + 1;
    }
    if (!first && st->epoch != ch->epoch + 1) {
        /* One restart per appearance of our consumers (epoch step), not one
         * for all the steps since the last BIND: with fast cycles a cycle's
         * BIND again can come after the next cycle's close and reopen (its
         * leave and join still on their way to the producer); had it taken
         * the epoch to the current one, the next cycle's BIND again would
         * find it unmoved and the events submitted while the producer had
         * dropped us would be counted lost (spec/reopen_gap_spec.lua, 20 ms
         * cycles). */
        st->restarts++;
        st->epoch++;
        if (!st->epoch) st->epoch = 1;
    }
}


static uint32_t seq_hash(uint32_t chid, uint64_t producer) {
    uint64_t h = (producer ^ ((uint64_t)chid << 32)) * 0x9E3779B97F4A7C15ull;
    return (uint32_t)(h >> 32);
}

/* The hash's entry of (chid, producer), or NULL. */
static lei_seqent *hash_find(const lei_live *lv, uint32_t chid, uint64_t producer) {
    if (!lv->seqs) return NULL;
    uint32_t m = lv->seqcap - 1, j = seq_hash(chid, producer) & m;
    for (; lv->seqs[j].last; j = (j + 1) & m)
        if (lv->seqs[j].chid == chid && lv->seqs[j].producer == producer) return &lv->seqs[j];
    return NULL;
}

/* The array entry of channel chid for producer: its own, or a free one it
 * now takes (its hash entry's state moved in, if it had one); NULL when
 * another producer holds it or the array may not cover chid.  The array
 * grows to cover chid only while it stays within 4 entries per used one
 * (+ 64): a peer that sends on one channel of a high id does not cost an
 * entry per id below it. */
static lei_seqent *array_slot(lei_live *lv, uint32_t chid, uint64_t producer) {
    if (chid >= lv->nbych) {
        if ((uint64_t)chid + 1 > 4 * ((uint64_t)lv->nbych_used + 16)) return NULL;
        uint32_t n = lv->nbych ? lv->nbych : 64;
        while (n <= chid) n *= 2;
        lei_seqent *b = realloc(lv->bych, (size_t)n * sizeof *b); /* owned by lv (bych) */
        if (!b) return NULL;
        memset(b + lv->nbych, 0, (size_t)(n - lv->nbych) * sizeof *b);
        lv->bych = b;
        lv->nbych = n;
    }
    lei_seqent *e = &lv->bych[chid];
    if (e->last) return e->producer == producer ? e : NULL;
    lei_seqent *h = hash_find(lv, chid, producer);
    if (h) {
        *e = *h; /* the stale hash entry is never looked at again: the array comes first */
    } else {
        e->chid = chid;
        e->producer = producer;
        e->epoch = UINT32_MAX; /* not seen yet in any epoch */
    }
    lv->nbych_used++;
    return e;
}

/* The entry of (chid, producer), created when missing; NULL without memory. */
static lei_seqent *seq_slot(lei_live *lv, uint32_t chid, uint64_t producer) {
    if (chid < lv->nbych) { /* the common case: one load, in channel order */
        lei_seqent *a = &lv->bych[chid];
        if (a->last && a->producer == producer) return a;
    }
    lei_seqent *a = array_slot(lv, chid, producer);
    if (a) return a;
    lei_seqent *e = lv->seqs ? &lv->seqs[lv->seqhit] : NULL;
    if (e && e->last && e->chid == chid && e->producer == producer) return e;
    if ((lv->seqn + 1) * 2 > lv->seqcap) {
        /* Grow; past 64 Ki producers start over (first sightings are never gaps). */
        uint32_t ncap = lv->seqcap ? lv->seqcap * 2 : 16;
        lei_seqent *old = lv->seqs, *ns;
        uint32_t ocap = lv->seqcap;
        if (ncap > (1u << 17)) {
            memset(old, 0, (size_t)ocap * sizeof *old);
            lv->seqn = 0;
        } else {
            if (!(ns = calloc(ncap, sizeof *ns))) return NULL;
            for (uint32_t i = 0; i < ocap; i++) {
                if (!old[i].last) continue;
                uint32_t j = seq_hash(old[i].chid, old[i].producer) & (ncap - 1);
                while (ns[j].last) j = (j + 1) & (ncap - 1);
                ns[j] = old[i];
            }
            free(old);
            lv->seqs = ns;
            lv->seqcap = ncap;
        }
    }
    uint32_t m = lv->seqcap - 1, j = seq_hash(chid, producer) & m;
    while (lv->seqs[j].last && !(lv->seqs[j].chid == chid && lv->seqs[j].producer == producer))
        j = (j + 1) & m;
    e = &lv->seqs[j];
    if (!e->last) {
        e->chid = chid;
        e->producer = producer;
        e->epoch = UINT32_MAX; /* not seen yet in any epoch */
        lv->seqn++;
    }
    lv->seqhit = j;
    return e;
}

/* Checks an event's sequence number against the last one from its producer
 * on a plain channel.  Returns 1 for a duplicate (or a step back), which is
 * dropped and counted; 0 to deliver.  A jump is a gap: counted (peer and
 * channel: gaps, lost) and logged, at most 5 lines per peer and second. */
int lei_live_seq(lei_ctx *c, lei_peer *p, lei_chan *ch, uint64_t producer, uint64_t seq) {
    if (ch->derived || ch->calls || !p) return 0;
    lei_seqent *e = seq_slot(&p->lv, ch->id, producer);
    if (!e) return 0;
    uint64_t last = e->last;
    /* the channel's epoch, moved on by each restart a BIND marked */
    uint32_t epoch = ch->epoch + (ch->id < p->lv.nbind ? p->lv.bind[ch->id].restarts : 0);
    if (e->epoch != epoch) { /* first event since local consumers appeared, or a restart */
        e->epoch = epoch;
        e->last = seq ? seq : 1;
        return 0;
    }
    if (seq == last + 1) {
        e->last = seq;
        return 0;
    }
    if (seq <= last) {
        p->lv.dups++;
        ch->dups++;
        lei_logf(c, "duplicate from %s#%llu on %s: seq %llu after %llu, dropped", p->addr,
                 (unsigned long long)producer, ch->name, (unsigned long long)seq,
                 (unsigned long long)last);
        return 1;
    }
    uint64_t n = seq - last - 1;
    e->last = seq;
    p->lv.gaps++;
    p->lv.lost += n;
    ch->gaps++;
    ch->lost += n;
    ev_tstamp now = ev_now(c->loop);
    if (now - p->lv.log_t >= 1.0) {
        p->lv.log_t = now;
        p->lv.log_n = 0;
    }
    if (p->lv.log_n >= 5) {
        p->lv.log_skipped++;
        return 0;
    }
    p->lv.log_n++;
    char more[96] = "";
    if (p->lv.log_skipped)
        snprintf(more, sizeof more, " (and %llu earlier gaps not logged)",
                 (unsigned long long)p->lv.log_skipped);
    p->lv.log_skipped = 0;
    lei_logf(c, "gap from %s#%llu on %s: %llu event%s lost (seq %llu..%llu)%s", p->addr,
             (unsigned long long)producer, ch->name, (unsigned long long)n, n == 1 ? "" : "s",
             (unsigned long long)(last + 1), (unsigned long long)(seq - 1), more);
    return 0;
}

