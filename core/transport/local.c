/* local.c: local delivery: events whose producer and consumer share this
 * process never touch a socket; they run from the loop, in order, and a
 * suspended handler holds back its own channel only.
 */
#define _GNU_SOURCE
#include "ctx_int.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

static int local_deliver(lei_ctx *c, lei_qitem *it) {
    lei_msg *m = it->msg;
    const uint8_t *p = (const uint8_t *)m->own.data;
    char *flat = NULL;
    if (m->next) {
        flat = malloc(m->total ? m->total : 1);
        if (!flat) {
            lei_logf(c, "out of memory: a local event was not delivered");
            return 0;
        }
        lei_msg_flatten(m, flat);
        p = (const uint8_t *)flat;
    }
    lei_chan *ch = lei_chan_get(c, it->chid);
    int rc = 0;
    if (ch && ch->local) {
        ch->ev_local++;
        lei_ctx_hook_enter(c);
        rc = c->h.event(c->h.ud, NULL, it->chid, it->producer, it->seq, it->sync, p, m->total);
        lei_ctx_hook_leave(c);
    } else if (it->sync) {
        /* no local consumer any more (it closed after the submit): said,
         * code noconsumer; a sync marker was handled by its modulator, a
         * call whose service is gone is told by the bare ACK (noservice) */
        if ((it->producer || it->seq) && !(ch && ch->calls))
            lei_ack_noconsumer(c, NULL, it->sync, ch ? ch->name : NULL);
        else
            lei_ack(c, NULL, it->sync, 0, NULL, 0);
    }
    free(flat);
    if (rc == 1 && ch) ch->held = 1;
    return rc == 1;
}

/* Runs up to max local items; those of a held channel wait in ldef. */
static void run_local(lei_ctx *c, int max) {
    for (int i = 0; i < max; i++) {
        lei_qitem *it = lei_q_pop(&c->local_s.lq);
        if (!it) break;
        lei_chan *ch = lei_chan_get(c, it->chid);
        if (ch && ch->held) {
            lei_q_push(&c->local_s.ldef, it); /* after its channel's suspended event */
            continue;
        }
        local_deliver(c, it);
        lei_item_free(c, it);
    }
    if (!c->local_s.lq.head) ev_idle_stop(c->loop, &c->local_s.idle);
}

void lei_drain_local(lei_ctx *c) { run_local(c, INT_MAX); }

/* Runs the local queue at the next loop turn if it holds anything (a
 * local channel that was full has room again: lei_submit_room). */
void lei_local_kick(lei_ctx *c) {
    if (c->local_s.lq.head) ev_idle_start(c->loop, &c->local_s.idle);
}

void lei_local_idle_cb(struct ev_loop *loop, ev_idle *w, int revents) {
    (void)loop;
    (void)revents;
    /* A bounded batch per turn so that sockets are served too. */
    lei_ctx *c = w->data;
    run_local(c, c->local_s.batch > 0 ? c->local_s.batch : 4096);
}

void lei_local_batch(lei_ctx *c, int n) { c->local_s.batch = n > 0 ? n : 0; }

void lei_resume(lei_ctx *c, lei_peer *from, uint32_t chid) {
    if (!from) {
        lei_chan *ch = lei_chan_get(c, chid);
        if (!ch || !ch->held) return;
        ch->held = 0;
        /* Its deferred events go back to the front of the local queue, in
         * order: every event of it still in the queue came later. */
        lei_queue keep = {0}, mine = {0};
        lei_qitem *it;
        while ((it = lei_q_pop(&c->local_s.ldef))) lei_q_push(it->chid == chid ? &mine : &keep, it);
        c->local_s.ldef = keep;
        if (mine.head) {
            mine.tail->next = c->local_s.lq.head;
            if (!c->local_s.lq.head) c->local_s.lq.tail = mine.tail;
            c->local_s.lq.head = mine.head;
            c->local_s.lq.bytes += mine.bytes;
            c->local_s.lq.count += mine.count;
        }
        if (c->local_s.lq.head) ev_idle_start(c->loop, &c->local_s.idle);
        return;
    }
    from->held = 0;
    lei_conn *k = from->conn;
    if (k && k->state != LEI_CONN_CLOSED && k->state != LEI_CONN_DIALING) {
        ev_io_start(c->loop, &k->rio);
        ev_feed_event(c->loop, &k->rio, EV_READ); /* frames already buffered */
    }
}

