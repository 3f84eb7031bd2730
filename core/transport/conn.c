/* conn.c: a connection record: its socket, made (lei_conn_new) and freed,
 * writing straight out (the handshake's frames, the parting ERROR), closing
 * and retiring, our side's end (FIN), the count of connections.  Below the
 * files that use connections (core/transport/README.md "Order"): what a
 * connection's end means for its peer goes up through the context's
 * operations (c->kops: peer_lost, dial_done), what a new one needs from
 * liveness too (live_new), and its watchers call conn_io.c's callbacks
 * (read_cb, write_cb), which read and hand the frames over.  Dialling is
 * peer.c's (lei_peer_dial); listening, accepting and the limits on
 * connections accept.c's; the read buffers' budget rbuf.c's; the
 * handshake handshake.c's.
 *
 * Leans on libev (watchers embedded in lei_conn).  No Lua here.
 */
#define _GNU_SOURCE
#include "ctx_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* ---- life cycle: new, free, writing straight out, close, retire -------- */

lei_conn *lei_conn_new(lei_ctx *c, int fd, enum lei_conn_state state) {
    lei_conn *k = calloc(1, sizeof *k);
    if (!k) return NULL;
    k->mech = c->id.keyed ? c->kops.mech_keyed : c->kops.mech_protected;
    if (k->mech->start(k)) {
        free(k);
        return NULL;
    }
    k->ctx = c;
    k->fd = fd;
    k->state = state;
    ev_io_init(&k->rio, c->kops.read_cb, fd, EV_READ);   /* conn_io.c's */
    ev_io_init(&k->wio, c->kops.write_cb, fd, EV_WRITE);
    k->rio.data = k->wio.data = k;
    k->next = c->conns;
    c->conns = k;
    c->nconns++;
    lei_addr_nodelay(fd);
    c->kops.live_new(k); /* lei_live_conn_new; the caller arms the handshake deadline */
    return k;
}

void lei_conn_free(lei_conn *k) {
    lei_ctx *c = k->ctx;
    for (lei_conn **pp = &c->conns; *pp; pp = &(*pp)->next)
        if (*pp == k) {
            *pp = k->next;
            break;
        }
    free(k->rb); /* kept by lei_conn_close while busy */
    free(k);
}

/* Writes a small frame now: only for the handshake and for the parting
 * ERROR, when nothing else is queued on the connection (the mechanism
 * seals it as a record once records are on). */
void lei_conn_write_now(lei_conn *k, const uint8_t *b, size_t n) { k->mech->write_now(k, b, n); }

void lei_conn_send_error(lei_conn *k, const char *msg) {
    uint8_t b[LEI_FRAME_HDR + 256];
    size_t n = strnlen(msg, 255);
    lei_frame_hdr(b, LEI_F_ERROR, n);
    memcpy(b + LEI_FRAME_HDR, msg, n);
    lei_conn_write_now(k, b, LEI_FRAME_HDR + n);
}

/* Closes a connection: bad is set when the remote sent malformed input. */
void lei_conn_close(lei_conn *k, const char *reason, int bad) {
    lei_ctx *c = k->ctx;
    if (k->state == LEI_CONN_CLOSED) return;
    int up = k->state >= LEI_CONN_UP;
    k->state = LEI_CONN_CLOSED;
    ev_io_stop(c->loop, &k->rio);
    ev_io_stop(c->loop, &k->wio);
    if (bad) {
        c->bad_frames++;
        lei_conn_send_error(k, reason);
        /* Before UP anybody can cause this, once per connection: one line
         * per window (garbage, untrusted keys, bad HELLOs). */
        if (up)
            lei_logf(c, "closing connection from %s: %s",
                     k->peer ? k->peer->addr : "unidentified peer", reason);
        else
            lei_ratelog(c, LEI_RL_HANDSHAKE, "closing connection from %s: %s",
                        k->peer ? k->peer->addr : "unidentified peer", reason);
    }
    close(k->fd);
    k->fd = -1;
    c->nconns--;
    lei_rbuf_close(k);
    lei_inmap_free(k);
    free(k->texp);
    k->texp = NULL;
    k->ntexp = k->ctexp = 0;
    k->mech->end(k);
    lei_peer *p = k->peer;
    k->peer = NULL;
    if (p && p->conn == k) c->kops.peer_lost(p, reason);
    if (k->was && k->was->retiring == k) k->was->retiring = NULL;
    c->kops.dial_done(k);
    if (!k->busy) lei_conn_free(k);
}

/* Ends k after what it has written: the peer is detached (its queue
 * dropped and counted, its syncs failed, told as lost), our FIN goes out
 * behind the bytes already in the socket, and k reads (and ignores) until
 * the remote closes, so that what the kernel holds is still delivered and
 * every event is either received or counted as dropped. */
void lei_conn_retire(lei_conn *k, const char *reason) {
    if (!k || k->state == LEI_CONN_CLOSED) return;
    lei_ctx *c = k->ctx;
    lei_peer *p = k->peer;
    if (k->state != LEI_CONN_UP && k->state != LEI_CONN_CLOSING) {
        lei_conn_close(k, reason, 0);
        return;
    }
    if (k->mech->out_pending(k)) {
        k->fin_pending = 1; /* after the sealed records: conn_io.c's write callback */
        ev_io_start(c->loop, &k->wio);
    } else {
        ev_io_stop(c->loop, &k->wio);
        shutdown(k->fd, SHUT_WR);
    }
    k->state = LEI_CONN_RETIRED;
    k->retired = ev_now(c->loop);
    k->peer = NULL;
    if (p && p->conn == k) {
        c->kops.peer_lost(p, reason);
        /* No new connection to p until this one is closed: the remote would
         * read the two side by side, newer events before older ones. */
        p->retiring = k;
        k->was = p;
    }
    ev_io_start(c->loop, &k->rio);
    lei_expiry_at(c, k->retired + RETIRE_SECONDS);
}

/* The code of a failed connect(): ECONNREFUSED refused, ENOENT (a unix
 * socket's path) notfound, any other io (peer.c's dial, conn_io.c's write
 * callback). */
int lei_conn_connect_code(int e) {
    return e == ECONNREFUSED ? LEI_E_REFUSED : e == ENOENT ? LEI_E_NOTFOUND : LEI_E_IO;
}


/* ---- our side's end (FIN) ---------------------------------------------- */

/* Closing: once k's queue is written, our side ends with a FIN; reading
 * goes on until the remote closes (it has then read all we sent). */
void lei_conn_fin(lei_conn *k) {
    if (k->state != LEI_CONN_UP) return;
    lei_peer *p = k->peer;
    if ((p && (p->conn != k || p->q.head)) || k->mech->out_pending(k)) return;
    k->state = LEI_CONN_CLOSING;
    shutdown(k->fd, SHUT_WR);
}
