/* peer.c: peers (one per remote context), their outgoing queues,
 * batching of small events, the queue policies and writing (writev),
 * dials (lei_peer_dial) and a channel's destinations (lei_peer_set_dests).
 * Layer 5 of core/transport/README.md's "Order": it calls conn.c,
 * accept.c, auth.c and the tables by name; liveness's redial backoff
 * through c->kops.may_dial.
 *
 * The ACKs of sync events go out from here (lei_ack: queued to the peer
 * the event came from; sync.c only records the answers).
 *
 * Leans on codec.h (messages shared by reference count) and frame.c for
 * frame headers; conn.c owns the sockets the queues are written to.
 */
#define _GNU_SOURCE
#include "ctx_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

static void lei_peer_flush_deferred(lei_ctx *c, lei_peer *p);

/* ---- items leaving a peer's queue (the items themselves: item.c) ------- */

static void sb_put(lei_ctx *c, lei_msg *m);

/* An item leaves peer p's queue (written or dropped).  A batch's buffer that
 * nothing else holds is kept as the peer's spare for its next batch, the
 * larger of it and the spare the peer had (a peer whose batches are written
 * before they fill grew a fresh one from 64 bytes by doubling each time: 9
 * reallocs and fresh pages per batch, one realloc per 90 events of a 64 B
 * stream); the other goes to the context's pool when it is a whole
 * BATCH_MAX buffer, else is freed (sb_put). */
static void item_free(lei_ctx *c, lei_peer *p, lei_qitem *it) {
    if (it->shared) {
        lei_msg *m = it->msg;
        it->msg = NULL;
        p->nshared--;
        lei_peer_shared_unref(c, lei_chan_get(c, it->chid), m);
    }
    lei_item_free(c, it);
}

static void item_done(lei_peer *p, lei_qitem *it) {
    if (it->ack) p->ack_bytes -= it->size;
    if (it->ctrl) p->ctrl_bytes -= it->size;
    if (it->shared) {
        item_free(p->ctx, p, it);
        return;
    }
    if (it->batch && it->msg->refcnt == 1) {
        lei_msg *m = it->msg;
        it->msg = NULL;
        if (p->spare && p->spare->own.cap < m->own.cap) { /* the larger one stays */
            lei_msg *s = p->spare;
            p->spare = m;
            m = s;
        } else if (!p->spare) {
            p->spare = m;
            m = NULL;
        }
        p->spare->own.len = 0;
        p->spare->total = 0;
        if (m) sb_put(p->ctx, m); /* pooled when whole, else freed */
    }
    lei_item_free(p->ctx, it);
}

/* ---- peers ------------------------------------------------------------- */

/* Records a change of p for the peer hook, told from the next loop turn
 * (prepare_cb): never from inside a submit, a write or a read of another
 * connection, where the hook could free what the caller still uses. */
void lei_peer_note(lei_peer *p, int up, const char *reason) {
    lei_ctx *c = p->ctx;
    if (!c->h.peer) return;
    if (c->peer_s.nnotes == c->peer_s.cnotes) {
        int n = c->peer_s.cnotes ? c->peer_s.cnotes * 2 : 8;
        struct lei_note *nn = realloc(c->peer_s.notes, (size_t)n * sizeof *nn);
        if (!nn) {
            lei_logf(c, "out of memory: peer %s %s not told", p->addr, up ? "up" : "down");
            return;
        }
        c->peer_s.notes = nn;
        c->peer_s.cnotes = n;
    }
    struct lei_note *n = &c->peer_s.notes[c->peer_s.nnotes++];
    n->idx = p->idx;
    n->up = up;
    n->code = up ? 0 : p->reason_code ? p->reason_code : LEI_E_CLOSED;
    snprintf(n->reason, sizeof n->reason, "%s", reason ? reason : "");
    ev_idle_start(c->loop, &c->peer_s.kick); /* told from the next loop turn, without waiting */
}

/* Tells the hook what changed, in order.  The hook may add notes. */
void lei_tell_notes(lei_ctx *c) {
    for (int i = 0; i < c->peer_s.nnotes; i++) {
        struct lei_note n = c->peer_s.notes[i];
        lei_peer *p = lei_peers_by_idx(c, n.idx);
        if (!p) continue;
        lei_ctx_hook_enter(c);
        c->h.peer(c->h.ud, p, n.up, n.up ? NULL : n.reason, n.code);
        lei_ctx_hook_leave(c);
    }
    c->peer_s.nnotes = 0;
}



void lei_kick_cb(struct ev_loop *loop, ev_idle *w, int revents) {
    (void)revents;
    ev_idle_stop(loop, w);
}

/* The expiry timer (armed by peers.c's lei_expiry_at): retired
 * connections the remote did not close in time are closed; peers whose
 * remote never dialled back after winning the tie-break are lost after all
 * (queue dropped and counted, syncs fail); keyed, the connections whose
 * peer's certificate ended are closed (auth.c); unused peers are freed
 * (peers.c). */

void lei_expiry_cb(struct ev_loop *loop, ev_timer *w, int revents) {
    (void)loop;
    (void)revents;
    lei_ctx *c = w->data;
    ev_tstamp now = ev_now(c->loop), next = 0;
    for (lei_conn *k = c->conns, *nk; k; k = nk) {
        nk = k->next;
        if (k->state != LEI_CONN_RETIRED) continue;
        if (k->retired + RETIRE_SECONDS <= now)
            lei_conn_close(k, "retired connection not closed by the remote in time", 0);
        else if (!next || k->retired + RETIRE_SECONDS < next)
            next = k->retired + RETIRE_SECONDS;
    }
    for (int i = 0; i < c->peers_s.npeers; i++) {
        lei_peer *p = c->peers_s.peers[i];
        if (p->await_in <= 0 || p->conn) continue;
        if (p->await_in <= now) {
            p->await_in = 0;
            lei_peer_lost(p, "the remote context did not connect back after simultaneous dials");
        } else if (!next || p->await_in < next) {
            next = p->await_in;
        }
    }
    ev_tstamp cert_end = c->id.keyed ? lei_certs_expire(c, now) : 0;
    if (cert_end && (!next || cert_end < next)) next = cert_end;
    if (next) lei_expiry_at(c, next);
    lei_peers_sweep(c);
}

/* One or more async events dropped from p's queue: counted in drops, and,
 * unless a queue policy the user chose dropped them (lost: the connection
 * ended, or there was none), as undelivered too, per peer, per channel and
 * for the context (what ctx:close() reports: lei_ctx_stats, lei_ctx_undelivered_why). */
static void count_dropped(lei_ctx *c, lei_peer *p, lei_chan *ch, uint64_t n, size_t bytes, int lost) {
    p->st.drops += n;
    if (ch) ch->drops += n;
    if (!lost) return;
    p->st.undelivered += n;
    if (ch) ch->undelivered += n;
    c->peer_s.und_events += n;
    c->peer_s.und_bytes += bytes;
}

/* Counts a dropped queue item: one event, or each event of a batch (by
 * channel, read back from the frames when the batch is mixed).  lost: see
 * count_dropped. */
static void count_drop(lei_ctx *c, lei_peer *p, lei_qitem *it, size_t sent, int lost) {
    if (!it->droppable) return;
    /* sent: bytes of it already written.  A batch's frames written whole
     * were delivered (the connection ends with a FIN after them): not
     * counted; a frame cut short is. */
    if (!it->batch || (!it->mixed && sent == 0)) {
        count_dropped(c, p, lei_chan_get(c, it->chid), it->batch ? it->nev : 1, it->size, lost);
        return;
    }
    /* a batch's frames: its buffer's (own.len == size), or its part of a
     * shared one */
    const uint8_t *b = (const uint8_t *)it->msg->own.data + it->moff;
    size_t off = 0, len = it->size;
    lei_frame f;
    lei_event_hdr e;
    const char *err;
    while (off < len && lei_frame_next(b + off, len - off, len, &f, &err) == 1) {
        if (off + f.size > sent && f.type == LEI_F_EVENT &&
            lei_parse_event(f.body, f.len, &e, &err) == 0) {
            count_dropped(c, p, lei_chan_get(c, (uint32_t)e.idx), 1, f.size, lost);
        } else if (off + f.size <= sent && f.type == LEI_F_EVENT) {
            p->cf.wr++; /* written whole: what read confirmation counts (cf_written) */
            p->cf.wr_bytes += f.size;
        }
        off += f.size;
    }
}

void lei_peer_q_clear(lei_ctx *c, lei_peer *p, int count_drops) {
    lei_qitem *it;
    size_t sent = p->woff; /* of the head item only */
    while ((it = lei_q_pop(&p->q))) {
        if (count_drops) count_drop(c, p, it, sent, !p->policy_cut);
        sent = 0;
        item_done(p, it);
    }
    p->woff = 0;
}

/* Appends a small async event frame to the batch at the tail of p's queue,
 * starting a new batch when there is none or it is full (in the peer's
 * spare buffer when it has one, or after a full batch in one of the
 * context's pool: a busy peer's batches cost no malloc, no realloc, no
 * page faults, no heap trim; a quiet peer's batch stays small).  The tail batch may be partly
 * written already: only its end grows.  Returns the batch, or NULL
 * (ENOMEM: the event is not queued, the queue is as it was; never an empty
 * batch, which a write could not get past).  This runs once per event and
 * destination: the frame is copied in with one reserve and two memcpys. */
static lei_qitem *batch_event(lei_peer *p, uint32_t chid, const uint8_t *hdr, size_t hlen,
                              const void *body, size_t blen) {
    lei_qitem *t = p->q.tail;
    size_t n = hlen + blen;
    if (!t || !t->batch || t->shared || t->msg->own.len + n > BATCH_MAX) {
        lei_msg *m = p->spare;
        p->spare = NULL;
        lei_ctx *c = p->ctx;
        /* its last batch is full: a busy peer, a whole buffer from the pool,
         * or a new one of BATCH_MAX at once (grown from 64 bytes it cost 8
         * reallocs, each a copy, on a peer whose queue outgrew the pool) */
        int busy = t && t->batch && !t->shared;
        if (!m && busy && c->peer_s.nsb_pool) m = c->peer_s.sb_pool[--c->peer_s.nsb_pool];
        if (!m && (!(m = lei_msg_new()) || lei_wbuf_reserve(&m->own, busy ? BATCH_MAX : n))) {
            lei_msg_release(m, NULL, NULL);
            return NULL;
        }
        if (!(t = lei_item_new(NULL))) {
            lei_msg_release(m, NULL, NULL);
            return NULL;
        }
        t->msg = m;
        t->batch = 1;
        t->droppable = 1;
        t->chid = chid;
        lei_q_push(&p->q, t);
    }
    lei_wbuf *b = &t->msg->own;
    /* Iovecs are rebuilt from the item at every write: growing is safe. */
    if (n > b->cap - b->len && lei_wbuf_reserve(b, n)) return NULL;
    memcpy(b->data + b->len, hdr, hlen);
    memcpy(b->data + b->len + hlen, body, blen);
    b->len += n;
    t->msg->total = b->len;
    t->size += n;
    t->nev++;
    if (t->chid != chid) t->mixed = 1;
    p->q.bytes += n;
    return t;
}

/* The peer's connection is gone: queued frames are dropped (counted), the
 * channel announcements are forgotten, waiting syncs fail. */
void lei_peer_lost(lei_peer *p, const char *reason) {
    lei_ctx *c = p->ctx;
    lei_conn *k = p->conn; /* the connection that ended, or NULL */
    p->conn = NULL;
    if (p->dial_pending) {
        p->dial_pending = 0;
        c->peer_s.ndial_pending--;
    }
    p->last_fail = ev_now(c->loop);
    snprintf(p->reason, sizeof p->reason, "%s", reason);
    p->reason_code = p->next_code ? p->next_code : LEI_E_CLOSED;
    p->next_code = 0;
    p->loss = p->next_loss;
    memset(&p->next_loss, 0, sizeof p->next_loss);
    uint64_t und = c->peer_s.und_events;
    lei_peer_q_clear(c, p, 1);
    /* Read confirmation: what this connection wrote that the remote (which
     * offered confirmations) did not confirm read, when it ended abnormally
     * (a deadline, a reset, an error; not the remote's orderly close, nor
     * one we retired: the remote reads on until it closes). */
    if (k && p->cf.on && !k->eof && k->state != LEI_CONN_RETIRED && p->cf.wr > p->cf.ok) {
        uint64_t n = p->cf.wr - p->cf.ok, b = p->cf.wr_bytes - p->cf.ok_bytes;
        p->cf.unconfirmed += n;
        p->cf.unconfirmed_bytes += b;
        c->peer_s.unc_events += n;
        c->peer_s.unc_bytes += b;
        snprintf(c->peer_s.unc_why, sizeof c->peer_s.unc_why, "%s: %s", p->addr, reason);
        lei_logf(c, "%llu event%s (%llu bytes) written to %s not confirmed read: its connection "
                    "ended (%s)", (unsigned long long)n, n == 1 ? "" : "s", (unsigned long long)b,
                 p->addr, reason);
    }
    p->cf.wr = 0; /* counted once (a second loss without a connection) */
    p->cf.wr_bytes = p->cf.ok = p->cf.ok_bytes = 0;
    p->cf.on = 0;
    if (c->peer_s.und_events > und) {
        /* async events nobody will be told of otherwise: said here, and
         * reported by ctx:close() (and the program's end) */
        snprintf(c->peer_s.und_why, sizeof c->peer_s.und_why, "%s: %s", p->addr, reason);
        lei_logf(c, "%llu event%s queued for %s not delivered: its connection ended (%s)",
                 (unsigned long long)(c->peer_s.und_events - und),
                 c->peer_s.und_events - und == 1 ? "" : "s", p->addr, reason);
    }
    if (p->nbound) memset(p->bound, 0, p->nbound); /* bound is NULL until a channel is sent */
    lei_syncs_peer_lost(c, p, reason);
    lei_peer_note(p, 0, reason);
    /* nothing may use it any more: looked at (lei_peers_sweep) in a while */
    p->unused_at = p->last_fail;
    lei_expiry_at(c, p->unused_at + c->o.peer_free_after);
}

void lei_peer_close(lei_peer *p, const char *reason) {
    if (p->conn) lei_conn_close(p->conn, reason, 0);
}


/* A dial that failed before it started (p->reason says why): its code and
 * flags, for the caller now and for the loss that may follow. */
static void dial_failed(lei_peer *p, int code, int unreached) {
    p->reason_code = p->next_code = code;
    p->next_loss.unreached = unreached;
    p->loss = p->next_loss;
    p->last_fail = ev_now(p->ctx->loop);
}

/* Dials the peer: a connection (conn.c) in DIALING, holding one of the
 * LEI_DIALS_MAX slots until UP or closed (lei_dial_done).  Frames queue up
 * until the handshake is answered.  A failure says why in p->reason,
 * p->reason_code and p->loss. */
int lei_peer_dial(lei_peer *p) {
    lei_ctx *c = p->ctx;
    lei_addr a;
    const char *why;
    char err[LEI_ADDR_ERR_MAX];
    /* What the next loss takes is this dial's from here: a dial that failed
     * at once (no loss follows it: the sender is told) leaves nothing for a
     * later connection's loss. */
    p->next_code = 0;
    memset(&p->next_loss, 0, sizeof p->next_loss);
    p->policy_cut = 0; /* what this dial's connection loses is undelivered */
    if (lei_addr_parse(p->addr, 0, &a, &why)) {
        snprintf(p->reason, sizeof p->reason, "bad address '%s': %s", p->addr, why);
        dial_failed(p, LEI_E_INVALID, 0);
        return -1;
    }
    if (lei_accept_room(c, p->reason, sizeof p->reason)) {
        dial_failed(p, LEI_E_LIMIT, 0);
        lei_ratelog(c, LEI_RL_CONNECTIONS, "not dialling %s: %s", p->addr, p->reason);
        return -1;
    }
    /* Unix: connects or fails at once (EAGAIN: the listener's backlog is
     * full), and the retry/backoff redials as for a refused TCP dial. */
    p->st.dials++;
    int fd = lei_addr_connect(&a, err, sizeof err); /* owned by the conn below */
    if (fd < 0) {
        snprintf(p->reason, sizeof p->reason, "%s", err);
        dial_failed(p, lei_conn_connect_code(errno), fd == -2); /* -2: the address's failure */
        return -1;
    }
    lei_conn *k = lei_conn_new(c, fd, LEI_CONN_DIALING);
    if (!k) {
        close(fd);
        return -1;
    }
    lei_accept_conn_added(c); /* the handshake deadline */
    k->peer = p;
    p->conn = k;
    k->dial_slot = 1; /* until UP or closed (lei_dial_done) */
    c->peer_s.ndialing++;
    ev_io_start(c->loop, &k->wio);
    return 0;
}

/* Dials p when it may be (not connected, not awaited, backoff over): at
 * once while fewer than LEI_DIALS_MAX of our dials are in progress, else it
 * waits its turn (dial_pending: live, its queue kept; lei_peer_turn). */
static void peer_want(lei_peer *p) {
    lei_ctx *c = p->ctx;
    /* the backoff is liveness's (lei_live_may_dial, a layer above) */
    if (p->conn || p->dial_pending || p->await_in > 0 || p->retiring || !c->kops.may_dial(p))
        return;
    if (c->peer_s.ndialing < LEI_DIALS_MAX) {
        lei_peer_dial(p);
        return;
    }
    p->dial_pending = 1;
    c->peer_s.ndial_pending++;
}

lei_peer *lei_peer_get(lei_ctx *c, const char *addr, int create) {
    lei_peer *p = lei_peers_find(c, addr);
    if (!p && create) p = lei_peers_new(c, addr);
    if (p && create) peer_want(p);
    return p;
}

/* Channel id's destinations are the peers of addrs (created and dialled
 * as needed), kept in the channel's record (ch->d, ch->ndests). */
void lei_peer_set_dests(lei_ctx *c, uint32_t id, const char **addrs, int n) {
    lei_chan *ch = lei_chan_get(c, id);
    if (!ch) return;
    /* owned by ch (freed here when replaced, or in lei_ctx_free) when it
     * keeps more than one: one destination is kept in ch->d.one */
    lei_peer *one = NULL, **d = n > 1 ? calloc((size_t)n, sizeof *d) : n ? &one : NULL;
    int nd = 0;
    for (int i = 0; i < n; i++) {
        if (strcmp(addrs[i], c->addr) == 0) continue;
        lei_peer *p = lei_peer_get(c, addrs[i], 1);
        if (p && d) d[nd++] = p;
    }
    /* A peer dropped here gets the channel's BIND again before the next
     * event we send it (queue_bind), behind what is queued for it already:
     * there, a receiver whose consumers left and came back meanwhile starts
     * our sequence again (live.c lei_live_bind): the events we submitted
     * while it was no destination are no gap. */
    if (ch->ndests) {
        for (int i = 0; i < nd; i++) d[i]->in_dests = 1;
        lei_peer **od = ch->ndests > 1 ? ch->d.many : &ch->d.one;
        for (int i = 0; i < ch->ndests; i++) {
            lei_peer *q = od[i];
            if (!q->in_dests && ch->id < q->nbound) q->bound[ch->id] = 0;
        }
        for (int i = 0; i < nd; i++) d[i]->in_dests = 0;
    }
    /* the peers dropped here may now be unused: lei_peers_sweep looks */
    if (ch->ndests) lei_expiry_at(c, ev_now(c->loop) + c->o.peer_free_after);
    if (ch->ndests > 1) free(ch->d.many);
    if (nd <= 1) {
        /* none or one: no array, the destination in the struct's first line */
        ch->d.one = nd ? d[0] : NULL;
        if (d != &one) free(d);
    } else {
        ch->d.many = d;
    }
    ch->ndests = nd;
}

void lei_dial_done(lei_conn *k) {
    if (!k->dial_slot) return;
    k->dial_slot = 0;
    k->ctx->peer_s.ndialing--;
    if (k->ctx->peer_s.ndial_pending) ev_idle_start(k->ctx->loop, &k->ctx->peer_s.kick); /* lei_peer_turn dials */
}

/* Dials the peers waiting for a slot, while there are slots.  A dial that
 * fails at once loses the peer (its queue dropped and counted). */
static void dials_run(lei_ctx *c) {
    for (int i = 0; i < c->peers_s.npeers && c->peer_s.ndial_pending && c->peer_s.ndialing < LEI_DIALS_MAX; i++) {
        lei_peer *p = c->peers_s.peers[i];
        if (!p->dial_pending) continue;
        p->dial_pending = 0;
        c->peer_s.ndial_pending--;
        if (lei_peer_dial(p)) lei_peer_lost(p, p->reason[0] ? p->reason : "dial failed");
    }
}

static void ensure_bound(lei_peer *p, uint32_t chid) {
    if (chid < p->nbound) return;
    size_t n = p->nbound ? p->nbound : 64;
    while (n <= chid) n *= 2;
    uint8_t *b = realloc(p->bound, n);
    if (!b) return;
    memset(b + p->nbound, 0, n - p->nbound);
    p->bound = b;
    p->nbound = n;
}

/* iovecs of p's queue from its written offset (woff), at most max - 2. */
int lei_peer_queue_iov(lei_peer *p, struct iovec *iov, int max) {
    int n = 0;
    size_t off = p->woff;
    for (lei_qitem *it = p->q.head; it && n < max - 2; it = it->next) {
        if (off < it->hlen) {
            iov[n].iov_base = it->hdr + off;
            iov[n].iov_len = it->hlen - off;
            n++;
            off = 0;
        } else {
            off -= it->hlen;
        }
        if (it->shared) { /* its bytes of the channel's shared batch */
            iov[n].iov_base = it->msg->own.data + it->moff + off;
            iov[n].iov_len = it->size - off;
            n++;
        } else if (it->msg) {
            size_t covered = 0;
            int m = lei_msg_iov(it->msg, off, iov + n, max - n, &covered);
            n += m;
            if (covered < it->msg->total - off) break;
        }
        off = 0;
    }
    return n;
}

/* An item written whole (read confirmation, live.c): its async events
 * count as written on this connection; a CONFIRM_ASK written records what
 * was written before it, which its answer confirms.  Per item, not per
 * event (a batch counts its nev at once). */
static inline void cf_written(lei_peer *p, const lei_qitem *it) {
    if (it->droppable) {
        p->cf.wr += it->batch ? it->nev : 1;
        p->cf.wr_bytes += it->size;
    } else if (it->hlen > 4 && it->hdr[4] == LEI_F_CONFIRM_ASK && p->cf.nwritten < p->cf.nasks) {
        struct lei_cf_ask *a = &p->cf.asks[p->cf.nwritten++];
        a->ev = p->cf.wr;
        a->bytes = p->cf.wr_bytes;
    }
}

/* w bytes of p's queue went out (or into a record): items done are freed. */
void lei_peer_queue_took(lei_peer *p, size_t w) {
    while (w) {
        lei_qitem *it = p->q.head;
        size_t rem = it->size - p->woff;
        if (w >= rem) {
            w -= rem;
            p->woff = 0;
            cf_written(p, it);
            item_done(p, lei_q_pop(&p->q));
        } else {
            p->woff += w;
            w = 0;
        }
    }
}

/* Writes as much of the peer's queue as the socket takes, through the
 * connection's mechanism (plain.c: sendmsg of the iovecs; secure.c:
 * records sealed from them); arms the write watcher when the socket is full. */
void lei_peer_flush(lei_peer *p) {
    if (!lei_peer_is_up(p)) return;
    /* CLOSING: our FIN is out (lei_conn_fin: sent once the queue was
     * written), so what was queued since (a reply, a CONFIRM, a HEARTBEAT
     * the remote's frames called for while we read on to its close) can
     * never go: a write would fail with EPIPE, of our own making, and end
     * the connection as broken before the remote's CONFIRM and orderly
     * close are read, counting what it read as unconfirmed.  It stays
     * queued, dropped (and any event in it counted) when the remote closes. */
    if (p->conn->state == LEI_CONN_CLOSING) return;
    p->conn->mech->flush(p);
}

/* Queues a BIND of ch for p unless p has it bound already (v2: with our
 * ticket for the channel when we have one).  -1: out of memory. */
static int queue_bind(lei_ctx *c, lei_peer *p, lei_chan *ch) {
    if (ch->id >= p->nbound) ensure_bound(p, ch->id);
    if (ch->id < p->nbound && !p->bound[ch->id]) {
        uint8_t *b = malloc(LEI_FRAME_HDR + 20 + ch->namelen + LEI_BIND_MAX_EXTRA); /* freed below */
        if (!b) return -1;
        size_t n = lei_frame_bind(b, ch->id, ch->name, ch->namelen,
                                  c->id.keyed ? lei_auth_ticket_for(c, ch) : NULL);
        lei_qitem *bi = lei_item_bytes(b, LEI_FRAME_HDR, b + LEI_FRAME_HDR, n - LEI_FRAME_HDR);
        free(b);
        if (!bi) return -1;
        lei_q_push(&p->q, bi);
        p->bound[ch->id] = 1;
    }
    return 0;
}

int lei_peer_bind(lei_ctx *c, const char *addr, uint32_t chid) {
    lei_chan *ch = lei_chan_get(c, chid);
    lei_peer *p = ch ? lei_peer_get(c, addr, 1) : NULL; /* (peers own p, as for a CTRL) */
    if (!p || (!lei_peer_live(p) && (peer_want(p), !lei_peer_live(p)))) return -1;
    if (c->id.keyed && !lei_auth_ticket_for(c, ch)) return -1; /* refused there: keep the first event's */
    if (queue_bind(c, p, ch)) return -1;
    lei_peer_flush_deferred(c, p);
    return 0;
}

/* Whether an event of `total` bytes may be queued to p under `policy`
 * (lei_peer_enqueue): 0 yes; else it was dropped or the peer disconnected,
 * and counted. */
static inline int admit(lei_ctx *c, lei_peer *p, lei_chan *ch, size_t total, uint64_t sync,
                        int policy) {
    if (!lei_peer_live(p) && (peer_want(p), !lei_peer_live(p))) {
        /* Unreachable since a failed attempt, not yet dialled again:
         * counted; an async one as undelivered too (said at close), unless
         * the disconnect policy cut the peer (a sync one's submit fails) */
        int lost = !p->policy_cut && !sync;
        count_dropped(c, p, ch, 1, LEI_EVENT_HDR_MAX + total, lost);
        if (lost)
            snprintf(c->peer_s.und_why, sizeof c->peer_s.und_why, "%s: %s", p->addr,
                     p->reason[0] ? p->reason : "not connected");
        return -1;
    }
    size_t esize = LEI_EVENT_HDR_MAX + total;
    if (!sync && p->q.count && p->q.bytes + esize > c->o.queue_limit) {
        if (policy == LEI_DROP_NEWEST) {
            count_dropped(c, p, ch, 1, 0, 0);
            return -1;
        }
        if (policy == LEI_DISCONNECT) {
            char why[128];
            snprintf(why, sizeof why, "outgoing queue over its limit of %zu bytes (policy disconnect)",
                     c->o.queue_limit);
            lei_logf(c, "disconnecting slow peer %s: %s", p->addr, why);
            p->policy_cut = 1; /* its queue is the policy's drop */
            if (p->conn) {
                lei_conn_retire(p->conn, why);
            } else { /* awaiting the remote's connection: nothing written yet */
                p->await_in = 0;
                lei_peer_lost(p, why);
            }
            count_dropped(c, p, ch, 1, 0, 0);
            return -1;
        }
    }
    return queue_bind(c, p, ch);
}

/* The event is in p's queue, in item it (the tail): counted, the oldest
 * dropped under drop_oldest, and written when enough is queued. */
static inline void queued(lei_ctx *c, lei_peer *p, lei_chan *ch, lei_qitem *it, size_t total,
                          uint64_t sync, int policy) {
    p->st.ev_out++;
    ch->ev_out++; /* per destination: what was queued toward a consuming context */
    if (sync) p->last_sync = sync, p->last_sync_ev = p->st.ev_out; /* (lei_ctx_unsure) */
    ch->bytes_out += total;
    if (policy == LEI_DROP_OLDEST) {
        /* Drop whole, unstarted async events from the front until under the limit. */
        lei_qitem **pp = &p->q.head, *prev = NULL;
        while (p->q.bytes > c->o.queue_limit && *pp && *pp != it) {
            lei_qitem *x = *pp;
            if (x->droppable && !(x == p->q.head && p->woff)) {
                *pp = x->next;
                if (p->q.tail == x) p->q.tail = prev;
                p->q.bytes -= x->size;
                p->q.count--;
                count_drop(c, p, x, 0, 0);
                item_free(c, p, x);
            } else {
                prev = x;
                pp = &x->next;
            }
        }
    }
    /* Past batch_bytes it writes now; but while the socket was full at the
     * last try (the write watcher waits for it) only once more per
     * batch_bytes queued since: a producer faster than its consumer would
     * otherwise make one failing sendmsg per event. */
    if (p->q.bytes >= c->o.batch_bytes &&
        (!p->conn || !ev_is_active(&p->conn->wio) || p->q.bytes >= p->wfull + c->o.batch_bytes))
        lei_peer_flush(p);
    else if (sync)
        lei_peer_flush_deferred(c, p);
}

void lei_peer_enqueue(lei_ctx *c, lei_peer *p, lei_chan *ch, const uint8_t *hdr, size_t hlen,
                      lei_msg *msg, uint64_t sync, int policy) {
    if (admit(c, p, ch, msg->total, sync, policy)) return;
    lei_qitem *it;
    if (!sync && msg->total <= SMALL_EVENT && msg->next == 0) {
        it = batch_event(p, ch->id, hdr, hlen, msg->own.data, msg->own.len); /* msg->next == 0: own is all of it */
        if (!it) return;
    } else {
        it = lei_item_new(msg);
        if (!it) return;
        memcpy(it->hdr, hdr, hlen);
        it->hlen = (uint8_t)hlen;
        it->size = it->hlen + msg->total;
        it->chid = ch->id;
        it->droppable = !sync;
        lei_q_push(&p->q, it);
    }
    queued(c, p, ch, it, msg->total, sync, policy);
}

/* ---- shared batches: one copy of an event for all its destinations ------
 *
 * A small async event of a channel with two or more destinations is
 * written once, into the channel's open shared batch (ch->sb, a lei_msg's
 * own buffer), and each destination's queue refers to its bytes: the
 * peer's tail item grows over them when it ends where they start (the
 * usual case: a run of the channel's events), else a new item refers to
 * them.  The peers write from the shared buffer (lei_peer_queue_iov); the
 * policies count per destination as for a batch of the peer's own
 * (count_drop reads the item's frames from its part of the buffer).
 *
 * Memory: a shared batch is a lei_msg with one reference per owner, the
 * channel while it is open (ch->sb) and every queue item referring to it
 * (it->msg, it->shared).  The channel drops its reference when the batch
 * is full (the next event starts another) or when the last item referring
 * to it leaves its queue (written, dropped, or its peer lost or freed:
 * item_free -> lei_peer_shared_unref), so a channel holds no buffer while
 * nothing of it is queued; lei_ctx_free releases what is left.  The last
 * reference frees the buffer, or keeps it in the context's pool (SB_POOL
 * buffers of BATCH_MAX, c->peer_s.sb_pool, which busy peers' own batches
 * use too) when it reached BATCH_MAX; a
 * channel takes a pooled buffer only when its last batch was dropped full
 * (sb_busy), so a quiet channel's batch starts small and grows as a peer's
 * own batch does (at most twice its bytes).  A peer whose runs are broken
 * (drops between them: a slow peer under drop_newest while the others
 * keep up) would keep a whole buffer alive per item: past (nshared + 1) *
 * BATCH_MAX > 2 * its queued bytes + batch_bytes it gets copies in its own
 * batches instead, so what a queue keeps alive stays within that bound.
 * Events of several such channels interleaved toward one peer cannot form
 * runs: behind a batch of its own or another channel's shared run, an
 * event is copied into the peer's own batch (as with one destination)
 * until its queue empties. */

static void sb_put(lei_ctx *c, lei_msg *m) {
    if (--m->refcnt > 0) return;
    if (m->own.cap == BATCH_MAX && !m->next && c->peer_s.nsb_pool < SB_POOL) {
        m->refcnt = 1;
        m->own.len = 0;
        m->total = 0;
        c->peer_s.sb_pool[c->peer_s.nsb_pool++] = m;
        return;
    }
    m->refcnt = 1;
    lei_msg_release(m, NULL, NULL);
}

void lei_peer_shared_unref(lei_ctx *c, lei_chan *ch, lei_msg *sb) {
    if (ch && ch->sb == sb && sb->refcnt == 2) { /* the channel and this one: nothing queued */
        ch->sb = NULL;
        ch->sb_busy = 0;
        sb->refcnt--;
    }
    sb_put(c, sb);
}

void lei_peer_pool_free(lei_ctx *c) {
    while (c->peer_s.nsb_pool) lei_msg_release(c->peer_s.sb_pool[--c->peer_s.nsb_pool], NULL, NULL);
}

lei_msg *lei_peer_shared_append(lei_ctx *c, lei_chan *ch, const uint8_t *hdr, size_t hlen,
                                const lei_msg *msg, size_t *off) {
    size_t n = hlen + msg->own.len; /* msg->next == 0: own is all of it */
    lei_msg *m = ch->sb;
    if (m && m->own.len + n > BATCH_MAX) { /* full: the queues referring to it keep it */
        ch->sb = NULL;
        ch->sb_busy = 1;
        sb_put(c, m);
        m = NULL;
    }
    if (!m) {
        if (ch->sb_busy && c->peer_s.nsb_pool) {
            m = c->peer_s.sb_pool[--c->peer_s.nsb_pool];
        } else if (!(m = lei_msg_new())) {
            return NULL;
        }
        ch->sb = m;
    }
    lei_wbuf *b = &m->own;
    /* Items hold offsets, iovecs are made at each write: growing is safe. */
    if (n > b->cap - b->len && lei_wbuf_reserve(b, n)) return NULL;
    *off = b->len;
    memcpy(b->data + b->len, hdr, hlen);
    memcpy(b->data + b->len + hlen, msg->own.data, msg->own.len);
    b->len += n;
    m->total = b->len;
    m->refcnt++; /* the caller's, for its loop over the destinations */
    return m;
}

void lei_peer_enqueue_shared(lei_ctx *c, lei_peer *p, lei_chan *ch, lei_msg *sb, size_t off,
                             size_t n, size_t total, int policy) {
    if (admit(c, p, ch, total, 0, policy)) return;
    lei_qitem *t = p->q.tail;
    if (t && t->shared && t->msg == sb && t->moff + t->size == off) {
        t->size += n; /* the run of this channel's events it refers to grows */
        t->nev++;
        p->q.bytes += n;
    } else if ((t && t->batch && !(t->shared && t->chid == ch->id)) ||
               (size_t)(p->nshared + 1) * BATCH_MAX > 2 * p->q.bytes + c->o.batch_bytes) {
        /* A copy in its own batch, as for one destination: behind a batch
         * of its own or another channel's run (channels interleaved toward
         * this peer would make an item per event; so until its queue
         * empties), or when its runs are broken (drops between them) so
         * often that each new item would keep a whole shared buffer alive
         * for a few of its bytes: what its queue keeps alive of shared
         * buffers stays within twice its bytes plus batch_bytes. */
        const uint8_t *f = (const uint8_t *)sb->own.data + off;
        if (!(t = batch_event(p, ch->id, f, n, f + n, 0))) return;
    } else {
        if (!(t = lei_item_new(sb))) return;
        p->nshared++;
        t->shared = 1;
        t->batch = 1;
        t->droppable = 1;
        t->chid = ch->id;
        t->moff = (uint32_t)off; /* off < BATCH_MAX */
        t->size = n;
        t->nev = 1;
        lei_q_push(&p->q, t);
    }
    queued(c, p, ch, t, total, 0, policy);
}

/* Runs the local consumers of one queued item.  Returns 1 when a handler
 * suspended the dispatch (its channel is then held). */

int lei_send_ctrl(lei_ctx *c, const char *addr, lei_msg *msg, const char **err) {
    lei_peer *p = lei_peer_get(c, addr, 1);
    if (!p) {
        *err = "out of memory";
        return -LEI_E_NOMEM;
    }
    if (!lei_peer_live(p)) {
        *err = p->reason[0] ? p->reason : "peer unreachable";
        return -(p->reason_code ? p->reason_code : LEI_E_CLOSED); /* the code of that reason */
    }
    uint8_t hdr[LEI_FRAME_HDR];
    lei_frame_hdr(hdr, LEI_F_CTRL, msg->total);
    lei_qitem *it = lei_item_new(msg);
    if (!it) {
        *err = "out of memory";
        return -LEI_E_NOMEM;
    }
    memcpy(it->hdr, hdr, LEI_FRAME_HDR);
    it->hlen = LEI_FRAME_HDR;
    it->size = LEI_FRAME_HDR + msg->total;
    if (p->ctrl_bytes && p->ctrl_bytes + it->size > c->o.queue_limit) {
        /* Requests it sends while never reading our replies (100,000
         * glist of a 4 MiB group: 2.8 GB) would grow this queue without
         * bound: cut, as for ACKs (lei_ack), what comes after is ignored. */
        snprintf(p->ctrl_why, sizeof p->ctrl_why,
                 "not reading control replies: %zu bytes of them queued (queue_limit %zu)", p->ctrl_bytes,
                 c->o.queue_limit);
        lei_item_free(c, it);
        if (p->conn) lei_accept_refuse(p->conn, LEI_RL_SLOW_CTRL, p->ctrl_why);
        *err = p->ctrl_why;
        return -LEI_E_CLOSED;
    }
    it->ctrl = 1;
    p->ctrl_bytes += it->size;
    lei_q_push(&p->q, it);
    p->st.ctrl_out++;
    /* Inside a callback, written at the end of the turn with whatever else
     * it queued for p (a producer applying a member list answers the
     * manager and ends streams at the same peer: one write, not two). */
    lei_peer_flush_deferred(c, p);
    return 0;
}

/* Once per loop turn, before the queues are written (prepare_cb): the
 * dials waiting for a slot, and the peers past max_peers. */
void lei_peer_turn(lei_ctx *c) {
    if (c->closing) return;
    if (c->peer_s.ndial_pending && c->peer_s.ndialing < LEI_DIALS_MAX) dials_run(c);
    if (c->peers_s.peers_over) lei_peers_evict(c);
}

void lei_peer_flush_all(lei_ctx *c) {
    for (int i = 0; i < c->peers_s.npeers; i++)
        if (c->peers_s.peers[i]->q.head) lei_peer_flush(c->peers_s.peers[i]);
}


/* ---- read access for the embedder (ctx.h) ------------------------------ */

int lei_peer_total(const lei_ctx *c) { return c->peers_s.npeers; }

int lei_peer_idx(const lei_peer *p) { return p->idx; }

const char *lei_peer_addr(const lei_peer *p) { return p->addr; }

int lei_peer_up(const lei_peer *p) { return lei_peer_is_up(p); }

uint64_t lei_peer_gen(const lei_peer *p) { return p && p->conn ? p->gen : 0; }

size_t lei_peer_ack_bytes(const lei_peer *p) { return p ? p->ack_bytes : 0; }

const char *lei_peer_reason(const lei_peer *p) { return p->reason; }

const lei_loss *lei_peer_loss(const lei_peer *p) { return &p->loss; }

const char *lei_peer_cipher(const lei_peer *p) {
    return lei_peer_is_up(p) ? p->conn->mech->cipher(p->conn) : NULL;
}

size_t lei_peer_unread(const lei_peer *p) {
    int n = 0;
    if (!p->conn || p->conn->fd < 0 || ioctl(p->conn->fd, FIONREAD, &n) != 0 || n < 0) return 0;
    return (size_t)n;
}

void lei_peer_stats(const lei_peer *p, lei_stats_peer *out) {
    out->st = p->st;
    out->queue_bytes = p->q.bytes;
    out->queue_events = p->q.count;
    out->hb_in = p->lv.hb_in;
    out->hb_out = p->lv.hb_out;
    out->timeouts = p->lv.timeouts;
    out->gaps = p->lv.gaps;
    out->lost = p->lv.lost;
    out->dups = p->lv.dups;
    out->refused = p->refused;
    out->confirmed = p->cf.confirmed;
    out->unconfirmed = p->cf.unconfirmed;
    out->unconfirmed_bytes = p->cf.unconfirmed_bytes;
    out->confirms = p->cf.on && lei_peer_is_up(p);
}

/* A sync write to p: at once outside any callback (the main line), else at
 * the end of the loop turn (check_cb, prepare_cb). */
static void lei_peer_flush_deferred(lei_ctx *c, lei_peer *p) {
    if (c->depth > 0 && ev_depth(c->loop) > 0)
        c->unflushed = 1;
    else
        lei_peer_flush(p);
}

/* Sends the answer to sync `sync` to the peer it came from (its ACK, queued
 * behind what p's queue holds: sync.c only records answers), or, from
 * NULL (the local consumers), records it at once (lei_sync_answered). */
void lei_ack(lei_ctx *c, lei_peer *from, uint64_t sync, uint64_t nran, const uint8_t *errs,
             size_t elen) {
    if (from) {
        uint8_t hdr[LEI_FRAME_HDR + 20];
        size_t hl = lei_frame_ack_hdr(hdr, sync, nran, elen);
        lei_qitem *it = lei_item_bytes(hdr, hl, errs, elen);
        if (!it || !lei_peer_is_up(from)) {
            if (it) lei_item_free(c, it);
            return;
        }
        if (from->ack_bytes && from->ack_bytes + it->size > c->o.queue_limit && from->conn) {
            /* Sync events it sends while never reading our answers would
             * grow this queue without bound (20,000 ACKs of 2 KB: 75 MB).
             * An empty ACK queue takes one of any size (a call's reply of
             * up to max_frame, as an event). */
            char why[160];
            snprintf(why, sizeof why, "not reading acknowledgements: %zu bytes of them queued (queue_limit %zu)",
                     from->ack_bytes, c->o.queue_limit);
            lei_item_free(c, it);
            lei_accept_refuse(from->conn, LEI_RL_SLOW_ACKS, why);
            return;
        }
        it->ack = 1;
        from->ack_bytes += it->size;
        lei_q_push(&from->q, it);
        lei_peer_flush_deferred(c, from);
        return;
    }
    lei_sync_answered(c, NULL, sync, nran, errs, elen);
}

/* A sync event that no handler of this context ran (no consumer of its
 * channel here any more: it closed before the event came, and the producer
 * was not told yet): answered with 0 handlers and one entry, code
 * noconsumer, never a bare 0 the producer could take for success.  Not for a
 * sync marker (producer 0, seq 0), which its modulator handled. */
void lei_ack_noconsumer(lei_ctx *c, lei_peer *from, uint64_t sync, const char *chname) {
    char why[LEI_ADDR_MAX + 320];
    int wl = snprintf(why, sizeof why, "no consumer of %.256s at %s any more: not handled",
                      chname ? chname : "the channel", c->addr);
    if (wl < 0) wl = 0;
    if ((size_t)wl >= sizeof why) wl = (int)sizeof why - 1;
    const char *code = lei_err_name(LEI_E_NOCONSUMER);
    lei_wbuf b = {0};
    int bad = lei_enc_table_header(&b, 1, 0) || lei_enc_table_header(&b, 0, 3) ||
              lei_enc_string(&b, "consumer", 8) || lei_enc_string(&b, c->addr, strlen(c->addr)) ||
              lei_enc_string(&b, "err", 3) || lei_enc_string(&b, why, (size_t)wl) ||
              lei_enc_string(&b, "code", 4) || lei_enc_string(&b, code, strlen(code));
    /* out of memory: the bare ACK, which the producer reads as no handler
     * run all the same (lei_sync_answered) */
    lei_ack(c, from, sync, 0, bad ? NULL : (const uint8_t *)b.data, bad ? 0 : b.len);
    lei_wbuf_free(&b);
}

void lei_ack_gen(lei_ctx *c, lei_peer *from, uint64_t gen, uint64_t sync, uint64_t nran,
                 const uint8_t *errs, size_t elen) {
    if (from && (!from->conn || from->gen != gen)) {
        lei_sync_stale_ack(c);
        return;
    }
    lei_ack(c, from, sync, nran, errs, elen);
}
