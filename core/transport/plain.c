/* plain.c: the protected mechanism (lei_mech, ctx_int.h): no keys, no
 * records; its handshake is a HELLO and a HELLO_OK of the address and
 * incarnation, nothing signed (who holds an address is the name server's
 * to vouch for), and a mode 1 or 2 HELLO is refused; frames go to the
 * socket as they are, a peer's queue by sendmsg of its iovecs, many frames
 * per call, and come into the frame buffer as read (conn_io.c's
 * lei_conn_io_read).  The keyed mechanism (secure.c) uses write_now
 * and read too, before its records are on.
 *
 * Leans on peer.c for the queue's iovecs, conn.c for the sockets.  No Lua.
 */
#define _GNU_SOURCE
#include "ctx_int.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

static int plain_start(lei_conn *k) {
    (void)k; /* no state: k->sec stays NULL */
    return 0;
}

static void plain_end(lei_conn *k) { (void)k; }

/* Straight to the socket (a handshake frame, a parting ERROR: nothing else
 * is queued then); what it does not take is lost with the connection. */
static void plain_write_now(lei_conn *k, const uint8_t *b, size_t n) {
    while (n) {
        ssize_t w = send(k->fd, b, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return;
        b += w;
        n -= (size_t)w;
    }
}

/* Writes as much of the peer's queue as the socket takes, many frames per
 * sendmsg; arms the write watcher when the socket is full. */
static void plain_flush(lei_peer *p) {
    lei_ctx *c = p->ctx;
    lei_conn *k = p->conn;
    while (p->q.head) {
        struct iovec iov[LEI_IOVN];
        int n = lei_peer_queue_iov(p, iov, LEI_IOVN);
        /* sendmsg rather than writev: MSG_NOSIGNAL turns a write to a peer
         * that went away into EPIPE instead of killing the process. */
        struct msghdr mh;
        memset(&mh, 0, sizeof mh);
        mh.msg_iov = iov;
        mh.msg_iovlen = (size_t)n;
        ssize_t w = sendmsg(k->fd, &mh, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                ev_io_start(c->loop, &k->wio);
                p->wfull = p->q.bytes; /* lei_peer_enqueue writes again past batch_bytes more */
                return;
            }
            char why[160];
            snprintf(why, sizeof why, "write: %s", strerror(errno));
            lei_conn_close(k, why, 0);
            return;
        }
        p->st.batches++;
        p->st.bytes_out += (uint64_t)w;
        k->last_out = ev_now(c->loop);
        lei_peer_queue_took(p, (size_t)w);
    }
    ev_io_stop(c->loop, &k->wio);
    if (c->closing) lei_conn_fin(k);
}

static int plain_out_pending(const lei_conn *k) {
    (void)k;
    return 0;
}

static int plain_write_pending(lei_conn *k) {
    (void)k;
    return 1;
}

static size_t plain_in_pending(const lei_conn *k) {
    (void)k;
    return 0;
}

static int plain_open(lei_conn *k) {
    (void)k;
    return 0;
}

static int plain_ctrl_in(lei_conn *k, const lei_frame *f) {
    (void)k;
    (void)f;
    return 0;
}

static const char *plain_cipher(const lei_conn *k) {
    (void)k;
    return NULL; /* none: loopback and Unix sockets only */
}

/* ---- the handshake: HELLO, HELLO_OK, nothing more ---------------------- */

static size_t plain_hello(lei_conn *k, uint8_t type, uint8_t *b) {
    return lei_frame_hello(b, type, LEI_PROTO_VERSION, k->ctx->incarnation, k->ctx->addr, NULL);
}

static const char *plain_hello_check(const lei_conn *k, const lei_hello *h, uint8_t want) {
    (void)k;
    (void)want;
    if (h->mode != LEI_MODE_PROTECTED)
        return "mode mismatch: this side has no keys (protected mode) and refuses a keyed peer";
    return NULL;
}

/* Nothing to prove: the remote is the address it claims (dialled: the one
 * we dialled) and handshake.c brings it up. */
static int plain_hello_in(lei_conn *k, const lei_frame *f, const lei_hello *h) {
    (void)k;
    (void)f;
    (void)h;
    return 1;
}

/* Never reached (plain_hello_in never asks for an AUTH step): refused as
 * bad input if it were. */
static int plain_auth_in(lei_conn *k, const lei_frame *f) {
    (void)f;
    lei_conn_close(k, "no AUTH in protected mode", 1);
    return -1;
}

static int plain_refused(lei_conn *k, const lei_frame *f) {
    (void)k;
    (void)f;
    return 0;
}

static const lei_hello *plain_remote(const lei_conn *k) {
    (void)k;
    return NULL; /* no key: the peer is its address */
}

const lei_mech lei_mech_protected = {
    .name = "protected",
    .start = plain_start,
    .end = plain_end,
    .write_now = plain_write_now,
    .flush = plain_flush,
    .out_pending = plain_out_pending,
    .write_pending = plain_write_pending,
    .read = lei_conn_io_read,
    .in_pending = plain_in_pending,
    .open = plain_open,
    .ctrl_in = plain_ctrl_in,
    .cipher = plain_cipher,
    .hello = plain_hello,
    .hello_check = plain_hello_check,
    .hello_in = plain_hello_in,
    .auth_in = plain_auth_in,
    .refused = plain_refused,
    .remote = plain_remote,
};
