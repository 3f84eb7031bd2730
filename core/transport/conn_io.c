/* conn_io.c: a connection's input and output callbacks: reading into its
 * buffer through its mechanism (lei_conn_io_read for the protected one),
 * the frames handed over (conn_frames, conn_frame: to liveness, channels,
 * auth, the peer's ACKs, the events and ctrl hooks; before UP to the
 * handshake through c->kops.hs_frame), BINDs (conn_bind), and the write
 * callback (a dial's connect, the peer's queue, a connection's last
 * records).  The top of the connection files: it calls down into conn.c,
 * accept.c, auth.c, chan.c, live.c, local.c, peer.c, sync.c and rbuf.c;
 * conn.c's lei_conn_new sets its two callbacks on a connection's watchers
 * (c->kops.read_cb, write_cb, which ctx.c registers).
 *
 * Leans on frame.c for the wire layout.  No Lua here.
 */
#define _GNU_SOURCE
#include "ctx_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* A drained read buffer larger than this (a large frame's) is freed; the
 * next read starts again from LEI_RBUF_SMALL.  Smaller ones stay: no allocation
 * per read for a stream of ordinary events. */
#define RBUF_KEEP (1024 * 1024)


/* ---- reading ----------------------------------------------------------- */

/* The remote's index as one of our channels: 0, -1 never bound, 1 refused. */
static int map_idx(lei_conn *k, uint64_t idx, uint32_t *chid) {
    uint32_t v;
    if (idx < k->ninmap && k->inmap[idx] && k->inmap[idx] != LEI_REFUSED) { /* the hot path */
        *chid = k->inmap[idx] - 1;
        return 0;
    }
    if (lei_inmap_get(k, idx, &v)) return -1;
    if (v == LEI_REFUSED) return 1;
    *chid = v - 1;
    return 0;
}

#define REFUSED_BINDS_MAX 256
/* The bytes of the refused indexes' reason texts (their channel names) one
 * connection may make us keep: 256 names of up to LEI_BIND_NAME_MAX bytes
 * would be half a megabyte per connection. */
#define REFUSED_NAMES_MAX (64 * 1024)

/* A BIND: the remote's index idx names a channel.  It must be open here
 * (a BIND never opens one: a peer could make us keep any number of
 * channels), and in keyed mode the BIND carry a valid ticket
 * (lei_auth_bind_check); else the index maps to LEI_REFUSED.  NULL, or an
 * error (bad input). */
static const char *conn_bind(lei_conn *k, const lei_frame *f) {
    lei_ctx *c = k->ctx;
    uint64_t idx;
    const uint8_t *name, *ticket;
    size_t nl;
    const char *err = NULL;
    if (lei_parse_bind(f->body, f->len, &idx, &name, &nl, &ticket, &err)) return err;
    /* The map's memory follows the number of indexes bound (inmap.c):
     * at most max_peer_channels of them. */
    uint32_t old;
    if (idx > UINT32_MAX ||
        (lei_inmap_get(k, idx, &old) && k->nbound >= c->o.max_peer_channels)) {
        char why[128];
        snprintf(why, sizeof why, "channel index out of range (%zu bound, limit %zu)", k->nbound,
                 c->o.max_peer_channels);
        lei_accept_refuse(k, LEI_RL_BIND_INDEX, why); /* conn_frame sees k closed */
        return NULL;
    }
    /* All connections together: 4 x max_peer_channels (12 connections of
     * 262,144 BINDs of one open channel held 4.3 MiB each, 4.4 GiB at
     * max_connections). */
    if (lei_inmap_get(k, idx, &old) == -1 && c->nbound_all >= 4 * c->o.max_peer_channels) {
        char why[160];
        snprintf(why, sizeof why, "channel bindings of all connections over %zu (4 x max_peer_channels)",
                 4 * c->o.max_peer_channels);
        lei_accept_refuse(k, LEI_RL_BIND_INDEX, why);
        return NULL;
    }
    lei_inmap_drop_rname(k, idx);
    /* Only a channel open here is bound (protected mode too: a BIND must not
     * make us open channels); keyed, the BIND also needs a valid ticket. */
    lei_chan *ch = c->id.keyed ? lei_auth_bind_check(c, k->peer, (const char *)name, nl, ticket)
                               : lei_chan_find(c, (const char *)name, nl);
    /* keyed: the binding lasts while its ticket does (auth.c) */
    if (c->id.keyed && lei_ticket_bound(k, idx, ch ? ticket : NULL)) return "out of memory";
    if (ch) {
        /* bound to ch on this connection already: the producer took us back
         * as a destination (lei_live_bind) */
        int again = lei_inmap_get(k, idx, &old) == 0 && old == ch->id + 1;
        if (lei_inmap_set(k, idx, ch->id + 1)) return "out of memory";
        if (k->peer) lei_live_bind(k->peer, ch, again);
        lei_live_offer(k->peer); /* it sends us events: read confirmation offered, once */
        return NULL;
    }
    /* A producer we refused stops at a few: many refusals are an attack
     * on our memory (each keeps its name for the ACKs' error text). */
    if (++k->nrefused > REFUSED_BINDS_MAX) { /* an attack: told, logged once per 10 s */
        lei_accept_refuse(k, LEI_RL_REFUSED_BINDS, "too many refused channel bindings (limit 256)");
        return NULL; /* conn_frame sees k closed */
    }
    /* Resolved once here, not per EVENT: the channel (keyed: open, but no
     * valid ticket) and the reason text the sync EVENTs' ACKs carry. */
    lei_chan *here = c->id.keyed ? lei_chan_find(c, (const char *)name, nl) : NULL;
    char rwhy[LEI_BIND_NAME_MAX + 64];
    if (c->id.keyed)
        snprintf(rwhy, sizeof rwhy, "not an authorized producer of %.*s", (int)nl, (const char *)name);
    else
        snprintf(rwhy, sizeof rwhy, "no channel %.*s open here", (int)nl, (const char *)name);
    if (k->rname_bytes + strlen(rwhy) > REFUSED_NAMES_MAX) {
        lei_accept_refuse(k, LEI_RL_REFUSED_BINDS,
                        "refused channel bindings' names over 65536 bytes");
        return NULL; /* conn_frame sees k closed */
    }
    if (lei_inmap_set_rname(k, idx, here ? here->id : UINT32_MAX, rwhy) ||
        lei_inmap_set(k, idx, LEI_REFUSED))
        return "out of memory";
    lei_refused_log(c, k->peer, (const char *)name, nl);
    return NULL;
}

/* An EVENT on a refused index: dropped and counted; a sync one is answered
 * with 0 handlers run and the reason in the error list, code "refused". */
static void refused_event(lei_conn *k, const lei_event_hdr *e) {
    lei_ctx *c = k->ctx;
    lei_peer *p = k->peer;
    const struct lei_rname *r = lei_inmap_rname(k, e->idx);
    lei_chan *ch = r && r->chid != UINT32_MAX ? lei_chan_get(c, r->chid) : NULL;
    p->refused++;
    if (ch) ch->refused++;
    if (!e->sync) return;
    const char *why = r ? r->why : "refused channel";
    lei_wbuf b = {0};
    const char *code = lei_err_name(LEI_E_REFUSED);
    int bad = lei_enc_table_header(&b, 1, 0) || lei_enc_table_header(&b, 0, 3) ||
              lei_enc_string(&b, "consumer", 8) || lei_enc_string(&b, c->addr, strlen(c->addr)) ||
              lei_enc_string(&b, "err", 3) || lei_enc_string(&b, why, strlen(why)) ||
              lei_enc_string(&b, "code", 4) || lei_enc_string(&b, code, strlen(code));
    lei_ack(c, p, e->sync, 0, bad ? NULL : (const uint8_t *)b.data, bad ? 0 : b.len);
    lei_wbuf_free(&b);
}

/* An incomplete EVENT whose index we refused (a channel not open here;
 * keyed: a BIND without a valid ticket) is dropped as soon as its header is
 * in, not buffered whole first: the event is counted and answered like a
 * complete one, and the rest of its bytes are skipped as they come
 * (k->skip).  One on an index never bound closes k at its header.  1 when
 * dropped (or k closed). */
static int refused_large(lei_conn *k) {
    size_t avail = k->rlen - k->rpos;
    const uint8_t *h = k->rb + k->rpos;
    if (k->state != LEI_CONN_UP || avail <= LEI_FRAME_HDR || h[4] != LEI_F_EVENT) return 0;
    size_t fsize = (size_t)lei_get_u32le(h) + 4;
    lei_event_hdr e;
    const char *err = NULL;
    uint32_t chid;
    if (lei_parse_event(h + LEI_FRAME_HDR, avail - LEI_FRAME_HDR, &e, &err)) return 0;
    int m = map_idx(k, e.idx, &chid);
    if (m == 0) return 0; /* bound: buffered whole, handed over */
    if (m < 0) { /* never bound: malformed, refused before its body is in */
        lei_conn_close(k, "event on a channel that was never bound", 1);
        return 1;
    }
    refused_event(k, &e);
    k->skip = fsize - avail;
    k->rpos = k->rlen;
    return 1;
}

/* Async EVENTs gathered from one read (conn_frames), handed to the events
 * hook together: one call into the binding per read, not one per event.
 * Their bytes are in k's read buffer, consumed (rpos is past them). */
typedef struct ev_batch {
    int n;
    lei_event_in ev[LEI_BATCH_MAX];
} ev_batch;

/* Hands the gathered events over, in order, before anything else of k is
 * handled (any other frame, a sync or large EVENT, an ACK we send: it says
 * every earlier EVENT was handled).  While they run, k's peer counts as
 * held: a loop turn run inside a handler reads nothing more of this peer
 * before the batch is through.  0, or -1 after closing k (a bad value). */
static int batch_flush(lei_conn *k, ev_batch *bt) {
    if (!bt || bt->n == 0) return 0;
    lei_ctx *c = k->ctx;
    lei_peer *p = k->peer;
    int n = bt->n, held = 0;
    bt->n = 0;
    p->held = 1;
    lei_ctx_hook_enter(c);
    c->refusal[0] = '\0';
    int took = c->h.events(c->h.ud, p, bt->ev, n, &held);
    lei_ctx_hook_leave(c);
    if (held) {
        /* A handler waits: hold what comes next from this peer (the hook
         * ends the hold, lei_resume, once the rest of its batch ran). */
        ev_io_stop(c->loop, &k->rio);
    } else if (p->conn && p->conn != k) {
        lei_resume(c, p, 0); /* a new connection came up meanwhile: its reads were held too */
    } else {
        p->held = 0;
        if (k->state == LEI_CONN_UP) ev_io_start(c->loop, &k->rio); /* (a nested read may have stopped it) */
    }
    if (took < n && k->state != LEI_CONN_CLOSED && k->state != LEI_CONN_RETIRED) {
        char why[256];
        snprintf(why, sizeof why, "malformed event value%s%s", c->refusal[0] ? ": " : "", c->refusal);
        lei_conn_close(k, why, 1);
        return -1;
    }
    return 0;
}

/* Handles one frame; bt (NULL: none) gathers async EVENTs for the events
 * hook.  Returns 0, or -1 after closing the connection. */
static int conn_frame(lei_conn *k, const lei_frame *f, ev_batch *bt) {
    lei_ctx *c = k->ctx;
    const char *err = NULL;
    char why[256];
    if (k->state < LEI_CONN_UP) return c->kops.hs_frame(k, f);
    lei_peer *p = k->peer;
    if (f->type != LEI_F_EVENT && batch_flush(k, bt)) return -1;
    if (f->type == LEI_F_HEARTBEAT || f->type == LEI_F_PING) return lei_live_frame(k, f);
    if (f->type == LEI_F_CONFIRM_ASK || f->type == LEI_F_CONFIRM) return lei_live_confirm_frame(k, f);
    switch (f->type) {
    case LEI_F_EVENT: {
        lei_event_hdr e;
        uint32_t chid;
        if (lei_parse_event(f->body, f->len, &e, &err)) {
            if (batch_flush(k, bt)) return -1;
            break;
        }
        int m = map_idx(k, e.idx, &chid);
        if (m && batch_flush(k, bt)) return -1;
        if (m == 1) {
            refused_event(k, &e);
            break;
        }
        if (m) {
            err = "event on a channel that was never bound";
            break;
        }
        lei_chan *ch = lei_chan_get(c, chid);
        p->st.ev_in++;
        ch->ev_in++;
        ch->bytes_in += e.plen;
        if (!ch->local || lei_live_seq(c, p, ch, e.producer, e.seq)) {
            if (e.sync) {
                if (batch_flush(k, bt)) return -1;
                /* no consumer left here (it closed before the producer
                 * knew): said, code noconsumer; a duplicate, a sync marker,
                 * which its modulator handled, or a call whose service is
                 * gone (the caller reads noservice): 0 handlers */
                if (!ch->local && !ch->calls && (e.producer || e.seq))
                    lei_ack_noconsumer(c, p, e.sync, ch->name);
                else
                    lei_ack(c, p, e.sync, 0, NULL, 0);
            }
            return 0;
        }
        if (bt && !e.sync && e.plen < LEI_BATCH_VALUE_MAX) {
            lei_event_in *x = &bt->ev[bt->n++];
            x->chid = chid;
            x->producer = e.producer;
            x->seq = e.seq;
            x->p = e.payload;
            x->n = e.plen;
            return bt->n == LEI_BATCH_MAX ? batch_flush(k, bt) : 0;
        }
        if (batch_flush(k, bt)) return -1;
        lei_ctx_hook_enter(c);
        c->refusal[0] = '\0';
        int rc = c->h.event(c->h.ud, p, chid, e.producer, e.seq, e.sync, e.payload, e.plen);
        lei_ctx_hook_leave(c);
        if (rc == 1) {
            /* A handler waits: hold what comes next from this peer. */
            p->held = 1;
            ev_io_stop(c->loop, &k->rio);
        } else if (rc) {
            err = "malformed event value";
            if (c->refusal[0]) {
                snprintf(why, sizeof why, "%s: %s", err, c->refusal);
                err = why;
            }
        }
        break;
    }
    case LEI_F_CTRL:
        if (k->mech->ctrl_in(k, f)) return -1;
        p->st.ctrl_in++;
        if (lei_live_offer_in(k, f)) break; /* read confirmation offered (live.c) */
        lei_ctx_hook_enter(c);
        c->refusal[0] = '\0';
        if (c->h.ctrl(c->h.ud, p, f->body, f->len)) {
            err = "malformed control message";
            if (c->refusal[0]) {
                snprintf(why, sizeof why, "%s: %s", err, c->refusal);
                err = why;
            }
        }
        lei_ctx_hook_leave(c);
        break;
    case LEI_F_BIND:
        err = conn_bind(k, f);
        break;
    case LEI_F_ACK: {
        uint64_t sync, nran;
        const uint8_t *errs;
        size_t elen;
        if (lei_parse_ack(f->body, f->len, &sync, &nran, &errs, &elen, &err)) break;
        if (sync && sync == p->last_sync) p->acked_ev = p->last_sync_ev; /* (lei_ctx_unsure) */
        lei_sync_answered(c, p, sync, nran, errs, elen);
        break;
    }
    case LEI_F_ERROR:
        snprintf(why, sizeof why, "peer reported: %.*s", (int)(f->len > 200 ? 200 : f->len),
                 (const char *)f->body);
        lei_logf(c, "connection with %s closed, %s", p ? p->addr : "?", why);
        lei_conn_close(k, why, 0);
        return -1;
    default:
        /* (a second handshake on an up connection: bad input, said as such;
         * here, not as cases of their own, so that the switch the events
         * take is the one it was) */
        if (f->type == LEI_F_HELLO || f->type == LEI_F_HELLO_OK || f->type == LEI_F_AUTH ||
            f->type == LEI_F_AUTH_OK)
            snprintf(why, sizeof why, "handshake frame (type %u) after the handshake", f->type);
        else
            snprintf(why, sizeof why, "unknown frame type %u", f->type);
        lei_conn_close(k, why, 1);
        return -1;
    }
    if (k->state == LEI_CONN_CLOSED || k->state == LEI_CONN_RETIRED) return -1;
    if (err) {
        lei_conn_close(k, err, 1);
        return -1;
    }
    return 0;
}

/* Before the handshake is done only HELLO, HELLO_OK and ERROR frames may
 * come, all small: an unidentified peer (an HTTP client, say) must not make
 * the context allocate, or wait for, a frame of up to max_frame bytes. */
#define HANDSHAKE_FRAME_MAX 4096

static size_t conn_max_frame(const lei_conn *k) {
    size_t max = k->ctx->o.max_frame;
    return k->state >= LEI_CONN_UP || max < HANDSHAKE_FRAME_MAX ? max : HANDSHAKE_FRAME_MAX;
}

/* After the handshake only an EVENT or an ACK (a call's reply: replies obey
 * the limits arguments do) may be as large as max_frame: a control message
 * fits CTRL_FRAME_MAX, the other
 * frames SMALL_FRAME_MAX.  Checked on the 5-byte header, before the body
 * is buffered: a peer announcing a 1 GiB CTRL no longer makes us hold it. */
#define CTRL_FRAME_MAX (16u * 1024 * 1024)
#define SMALL_FRAME_MAX (64u * 1024)

/* The limit for the frame whose first avail bytes are at h. */
static size_t frame_limit(const lei_conn *k, const uint8_t *h, size_t avail) {
    size_t max = conn_max_frame(k);
    if (k->state < LEI_CONN_UP || avail < LEI_FRAME_HDR || h[4] == LEI_F_EVENT || h[4] == LEI_F_ACK)
        return max;
    size_t cap = h[4] == LEI_F_CTRL ? CTRL_FRAME_MAX : SMALL_FRAME_MAX;
    return cap < max ? cap : max;
}

/* The end in k's buffer of the frame at rpos and its size, when its header
 * is in and its size within the limit; else 0. */
static size_t frame_end(const lei_conn *k, size_t *fsize) {
    if (k->rlen - k->rpos < 4 || k->skip) return 0;
    const uint8_t *h = k->rb + k->rpos;
    size_t flen = lei_get_u32le(h);
    if (flen > frame_limit(k, h, k->rlen - k->rpos)) return 0;
    *fsize = flen + 4;
    return k->rpos + flen + 4;
}

/* Hands over the complete frames in k's buffer, until one suspends or
 * closes.  Returns 0, or -1 once k is dead (the caller frees it). */
static int conn_frames(lei_conn *k) {
    if (k->state == LEI_CONN_RETIRED) { /* detached: what still comes is not read */
        k->rpos = k->rlen;
        return 0;
    }
    if (k->skip) { /* the rest of a dropped EVENT (refused_large) */
        size_t n = k->rlen - k->rpos < k->skip ? k->rlen - k->rpos : k->skip;
        k->rpos += n;
        k->skip -= n;
        if (k->skip) return 0;
    }
    /* on this C stack frame: a nested conn_frames (a loop turn inside a
     * handler) gathers its own */
    ev_batch batch, *bt = k->ctx->batch && k->state >= LEI_CONN_UP ? &batch : NULL;
    if (bt) bt->n = 0;
    while (k->state != LEI_CONN_CLOSED && !(k->peer && k->peer->held && k->state >= LEI_CONN_UP)) {
        lei_frame f;
        const char *err = NULL;
        /* per frame: the handshake may end at any frame */
        size_t max = frame_limit(k, k->rb + k->rpos, k->rlen - k->rpos);
        int r = lei_frame_next(k->rb + k->rpos, k->rlen - k->rpos, max, &f, &err);
        if (r == 0) {
            refused_large(k); /* the rest of the frame comes with the next reads */
            break;
        }
        if (r < 0) {
            char why[160];
            const uint8_t *h = k->rb + k->rpos;
            snprintf(why, sizeof why, "%s (%u bytes, limit %zu)", err,
                     (unsigned)lei_get_u32le(h),
                     max);
            lei_conn_close(k, why, 1);
            break;
        }
        k->rpos += f.size; /* consumed before the hooks run: they may re-enter */
        /* retired (refused, or the disconnect policy from a hook): what
         * follows is not read, k->peer is gone */
        if (conn_frame(k, &f, bt && k->state >= LEI_CONN_UP ? bt : NULL) || k->state == LEI_CONN_CLOSED ||
            k->state == LEI_CONN_RETIRED)
            break;
    }
    /* what was gathered goes now: nothing of this read is left for later
     * (closed or retired meanwhile: a frame after them failed, they are
     * handed over all the same, as one by one they were before) */
    if (bt && bt->n && k->peer && k->state != LEI_CONN_CLOSED) batch_flush(k, bt);
    return k->state == LEI_CONN_CLOSED ? -1 : 0;
}

/* Opens what the mechanism holds (keyed: decrypts the complete records),
 * hands over the frames until one suspends or closes; again when the
 * handshake just switched the input to records behind a frame.  Frees k
 * once closed and not busy; returns -1 then (or when closed), else 0. */
static int conn_input(lei_conn *k) {
    k->busy++;
    for (;;) {
        size_t sealed = k->mech->in_pending(k);
        if (sealed) {
            if (k->rpos && k->busy == 1) { /* compact: nobody below holds a frame */
                memmove(k->rb, k->rb + k->rpos, k->rlen - k->rpos);
                k->rlen -= k->rpos;
                k->rpos = 0;
            }
            /* Room for the plaintext of what was read (at least). */
            size_t need = k->rlen + sealed, fsize = 0;
            size_t end = frame_end(k, &fsize);
            if (need > k->rcap && lei_rbuf_grow(k, need, end, fsize ? fsize : need)) break;
            if (k->mech->open(k)) break; /* closed: a bad record */
        }
        conn_frames(k);
        if (k->state == LEI_CONN_CLOSED || (k->peer && k->peer->held && k->state >= LEI_CONN_UP))
            break;
        /* records switched on behind a frame: their first bytes are opened now */
        if (sealed || !k->mech->in_pending(k)) break;
    }
    k->busy--;
    if (k->state != LEI_CONN_CLOSED) {
        /* A large frame's buffer goes once drained: the next read starts
         * again from LEI_RBUF_SMALL (nobody holds a frame: busy is 0). */
        if (!k->busy && k->rpos == k->rlen && k->rcap > RBUF_KEEP) {
            uint8_t *rb = k->rb;
            size_t cap = k->rcap;
            lei_rbuf_set(k, NULL, 0);
            lei_rbuf_return(k->ctx, rb, cap); /* the spare, for the next large frame */
            k->rlen = k->rpos = 0;
        }
        return 0;
    }
    if (!k->busy) lei_conn_free(k);
    return -1;
}

/* Reads frames as they come into k's buffer (the protected mechanism's
 * read, and the keyed one's before records): > 0 bytes read, 0 the remote
 * closed, < 0 with errno (or k closed: its state says). */
ssize_t lei_conn_io_read(lei_conn *k) {
    size_t fsize = 0, big_end = frame_end(k, &fsize); /* a large frame: read to its end */
    if (big_end && fsize <= LEI_RBUF_MIN) big_end = 0;
    /* 64 KiB of room while reads fill what they get, else 4 KiB */
    size_t want = k->rfull ? LEI_RBUF_MIN : LEI_RBUF_SMALL;
    size_t need = k->rlen + want;
    if (big_end && big_end < need) need = big_end;
    if (k->rcap - k->rlen < want && need > k->rcap &&
        lei_rbuf_grow(k, need, big_end, big_end ? fsize : want)) {
        errno = ENOMEM;
        return -1;
    }
    /* Reading past the end of a large frame would put the next frame's
     * first bytes behind it, to be moved to the front afterwards: a copy of
     * up to a whole frame.  Stop at its end instead. */
    size_t room = k->rcap - k->rlen;
    if (big_end > k->rlen && big_end - k->rlen < room) room = big_end - k->rlen;
    ssize_t n = read(k->fd, k->rb + k->rlen, room);
    if (n > 0) k->rlen += (size_t)n;
    k->rfull = n > 0 && (size_t)n == room;
    return n;
}

void lei_conn_io_read_cb(struct ev_loop *loop, ev_io *w, int revents) {
    (void)loop;
    (void)revents;
    lei_conn *k = w->data;
    lei_ctx *c = k->ctx;
    if (k->peer && k->peer->held && k->state >= LEI_CONN_UP) {
        ev_io_stop(c->loop, &k->rio); /* lei_resume starts it again */
        return;
    }
    /* What a suspended dispatch left in the buffers goes first. */
    if (k->rpos < k->rlen || k->mech->in_pending(k)) {
        if (conn_input(k)) return;
        if (k->peer && k->peer->held) return;
    }
    /* Compact, then make room: a frame larger than the buffer grows it as
     * its bytes come (lei_rbuf_grow), never past its size. */
    if (k->rpos && k->busy == 0) {
        memmove(k->rb, k->rb + k->rpos, k->rlen - k->rpos);
        k->rlen -= k->rpos;
        k->rpos = 0;
    }
    ssize_t n = k->mech->read(k);
    if (k->state == LEI_CONN_CLOSED) return;
    if (n < 0) {
        if (errno == EAGAIN || errno == EINTR || errno == ENOMEM) return; /* ENOMEM: told by rbuf.c */
        char why[128];
        snprintf(why, sizeof why, "read: %s", strerror(errno));
        lei_conn_close(k, why, 0);
        return;
    }
    if (n == 0) {
        k->eof = 1; /* an orderly end (lei_peer_lost: not an abnormal one) */
        lei_conn_close(k, "connection closed by peer", 0);
        return;
    }
    k->last_in = ev_now(loop);
    if (k->peer && k->state >= LEI_CONN_UP) k->peer->st.bytes_in += (uint64_t)n;
    conn_input(k);
}

void lei_conn_io_write_cb(struct ev_loop *loop, ev_io *w, int revents) {
    (void)loop;
    (void)revents;
    lei_conn *k = w->data;
    if (k->state == LEI_CONN_DIALING) {
        int e = 0;
        socklen_t l = sizeof e;
        getsockopt(k->fd, SOL_SOCKET, SO_ERROR, &e, &l);
        if (e) {
            char why[128];
            snprintf(why, sizeof why, "connect: %s", strerror(e));
            if (k->peer) {
                lei_ratelog(k->ctx, LEI_RL_DIAL, "cannot reach %s: %s", k->peer->addr, why);
                k->peer->next_code = lei_conn_connect_code(e);
                k->peer->next_loss.unreached = 1; /* the address cannot be reached (lei_peer_loss) */
            }
            lei_conn_close(k, why, 0);
            return;
        }
        ev_io_stop(k->ctx->loop, &k->wio);
        k->state = LEI_CONN_HELLO_SENT;
        k->ctx->kops.hs_hello(k);
        ev_io_start(k->ctx->loop, &k->rio);
        return;
    }
    if (k->peer && k->peer->conn == k && lei_peer_is_up(k->peer)) {
        lei_peer_flush(k->peer);
        return;
    }
    /* Sealed records of a connection without its queue (the handshake's
     * last records, a retired connection's): written, then the FIN if due. */
    int r = k->mech->write_pending(k);
    if (r == 0) return;
    ev_io_stop(k->ctx->loop, &k->wio);
    if (r < 0) {
        lei_conn_close(k, "write failed", 0);
        return;
    }
    if (k->fin_pending) {
        k->fin_pending = 0;
        shutdown(k->fd, SHUT_WR);
    }
}
