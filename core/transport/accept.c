/* accept.c: a context's listening side and the limits on its connections:
 * listening (lei_accept_listen), accepting, max_connections, accept() backing
 * off when out of file descriptors (with a reserved descriptor to refuse
 * through), the handshake deadline (handshake_timeout) and refusals told to
 * the peer (lei_accept_refuse, logged through lei_ratelog).
 *
 * Connections themselves (reading, writing, closing) are conn.c's.  Leans
 * on libev; no Lua here.
 */
#define _GNU_SOURCE
#include "ctx_int.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static void hs_timer_cb(struct ev_loop *loop, ev_timer *w, int revents);
static void acc_timer_cb(struct ev_loop *loop, ev_timer *w, int revents);
static void lei_accept_hs_arm(lei_ctx *c);

void lei_accept_init(lei_ctx *c) {
    c->accept_s.lfd = -1;
    c->accept_s.reserve_fd = -1;
    c->accept_s.acc_backoff = 0.1;
    ev_init(&c->accept_s.hs_w, hs_timer_cb);
    c->accept_s.hs_w.data = c;
    ev_init(&c->accept_s.acc_w, acc_timer_cb);
    c->accept_s.acc_w.data = c;
}

void lei_accept_stop(lei_ctx *c) {
    if (ev_is_active(&c->accept_s.hs_w)) {
        ev_ref(c->loop); /* hs_arm unref'd it */
        ev_timer_stop(c->loop, &c->accept_s.hs_w);
    }
    ev_timer_stop(c->loop, &c->accept_s.acc_w);
    if (c->accept_s.reserve_fd >= 0) close(c->accept_s.reserve_fd);
    c->accept_s.reserve_fd = -1;
}

/* The listener closed (lei_ctx_stop_listening, and lei_ctx_free): no
 * more accepts; a no-op when there is none. */
void lei_accept_close(lei_ctx *c) {
    if (c->accept_s.lfd < 0) return;
    ev_io_stop(c->loop, &c->accept_s.lio);
    ev_timer_stop(c->loop, &c->accept_s.acc_w);
    if (c->accept_s.reserve_fd >= 0) close(c->accept_s.reserve_fd);
    c->accept_s.reserve_fd = -1;
    lei_addr_close(c->accept_s.lfd, &c->laddr); /* removes our unix socket file */
    c->accept_s.lfd = -1;
}

/* A connection was made (accepted here, or dialled: peer.c's
 * lei_peer_dial, each after lei_conn_new, which counts it): it is not UP
 * yet, so the handshake deadline is armed. */
void lei_accept_conn_added(lei_ctx *c) {
    lei_accept_hs_arm(c);
}

/* The handshake deadline: checked a few times per handshake_timeout while
 * a connection is not UP. */
static void lei_accept_hs_arm(lei_ctx *c) {
    double t = c->o.handshake_timeout;
    if (t <= 0 || ev_is_active(&c->accept_s.hs_w)) return;
    t /= 8;
    c->accept_s.hs_w.repeat = t < 0.01 ? 0.01 : t > 1.0 ? 1.0 : t;
    ev_timer_again(c->loop, &c->accept_s.hs_w);
    ev_unref(c->loop); /* the deadline alone does not keep the loop alive */
}

/* Refuses k: the peer is told why (ERROR), the process logs one line per
 * kind per window (lei_ratelog), k is closed. */
void lei_accept_refuse(lei_conn *k, int kind, const char *reason) {
    lei_ctx *c = k->ctx;
    lei_conn_send_error(k, reason);
    lei_ratelog(c, kind, "closing connection %s %s: %s", k->peer ? "with" : "from",
                k->peer ? k->peer->addr : "an unidentified peer", reason);
    /* Up: retired, not closed at once, so that the ERROR arrives: closing
     * with the peer's bytes unread would reset the connection and drop it.
     * What still comes is read and ignored until the peer closes (at most
     * RETIRE_SECONDS).  Before UP nothing large can be pending. */
    if (k->state == LEI_CONN_UP)
        lei_conn_retire(k, reason);
    else
        lei_conn_close(k, reason, 0);
}

/* The deadline passed for k, but what k waits for may be in the socket
 * unread: the program did not run the loop meanwhile (a script's sleep or
 * computation, a stopped process), and on the first turn after, libev runs
 * this timer before the read (pending watchers run last in, first out).
 * The kernel is asked (a connect's answer: writable; a peer's frame:
 * readable): if so, the peer is alive and k's deadline starts again, once,
 * from now: that turn reads the answer, and the steps left (a keyed dial's
 * HELLO_OK and AUTH_OK round trips after its connect) get handshake_timeout
 * of a running loop.  A peer that never answers is still cut at the
 * deadline; one whose byte waits at the deadline, at twice it at most. */
static int hs_put_off(lei_conn *k, ev_tstamp now, double t) {
    if (k->hs_grace) return now - k->hs_grace < t;
    struct pollfd pf = {.fd = k->fd, .events = k->state == LEI_CONN_DIALING ? POLLOUT : POLLIN};
    if (poll(&pf, 1, 0) <= 0) return 0;
    k->hs_grace = now;
    return 1;
}

static void hs_timer_cb(struct ev_loop *loop, ev_timer *w, int revents) {
    (void)revents;
    lei_ctx *c = w->data;
    ev_tstamp now = ev_now(loop), t = c->o.handshake_timeout;
    int waiting = 0;
    char why[256];
    snprintf(why, sizeof why, "handshake timeout (%g s)", t);
    for (lei_conn *k = c->conns, *nk; k; k = nk) {
        nk = k->next; /* lei_conn_close may free k */
        if (k->state >= LEI_CONN_UP) continue;
        if (now - k->born < t || hs_put_off(k, now, t)) {
            waiting = 1;
            continue;
        }
        if (k->state == LEI_CONN_DIALING) /* nothing to tell: not connected */
            lei_conn_close(k, why, 0);
        else
            lei_accept_refuse(k, LEI_RL_HANDSHAKE_TIMEOUT, why);
    }
    if (!waiting) {
        ev_ref(loop);
        ev_timer_stop(loop, w);
    }
}

/* Room for one more connection: 0, or -1 with the reason in why[n]. */
int lei_accept_room(lei_ctx *c, char *why, size_t n) {
    if (c->nconns < c->o.max_connections) return 0;
    snprintf(why, n, "too many connections (limit %zu)", c->o.max_connections);
    return -1;
}

/* Refuses an accepted socket that has no connection record: the ERROR
 * (in the clear: no handshake was made) and close. */
static void refuse_fd(lei_ctx *c, int fd, const char *reason) {
    uint8_t b[LEI_FRAME_HDR + 128];
    size_t n = strnlen(reason, 127);
    lei_frame_hdr(b, LEI_F_ERROR, n);
    memcpy(b + LEI_FRAME_HDR, reason, n);
    (void)!send(fd, b, LEI_FRAME_HDR + n, MSG_NOSIGNAL | MSG_DONTWAIT);
    close(fd);
    lei_ratelog(c, LEI_RL_CONNECTIONS, "refusing a connection: %s", reason);
}

/* Out of file descriptors: the pending connections are refused through
 * the reserved descriptor (told why, not left hanging), and accepting
 * pauses, 0.1 s doubling to 2 s, instead of spinning on a listening socket
 * that stays readable. */
static void accept_out_of_fds(lei_ctx *c, int err) {
    lei_ratelog(c, LEI_RL_ACCEPT, "accept: %s: not accepting for %g s", strerror(err),
                c->accept_s.acc_backoff);
    if (c->accept_s.reserve_fd >= 0) {
        close(c->accept_s.reserve_fd);
        c->accept_s.reserve_fd = -1;
        for (int i = 0; i < 64; i++) {
            int fd = accept4(c->accept_s.lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
            if (fd < 0) break;
            refuse_fd(c, fd, "too many connections (out of file descriptors)");
        }
        c->accept_s.reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC); /* may fail: tried again later */
    }
    ev_io_stop(c->loop, &c->accept_s.lio);
    ev_timer_set(&c->accept_s.acc_w, c->accept_s.acc_backoff, 0.);
    ev_timer_start(c->loop, &c->accept_s.acc_w);
    c->accept_s.acc_backoff = c->accept_s.acc_backoff * 2 > 2.0 ? 2.0 : c->accept_s.acc_backoff * 2;
}

static void acc_timer_cb(struct ev_loop *loop, ev_timer *w, int revents) {
    (void)revents;
    lei_ctx *c = w->data;
    if (c->accept_s.lfd < 0) return;
    if (c->accept_s.reserve_fd < 0) c->accept_s.reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    ev_io_start(loop, &c->accept_s.lio);
}

static void accept_cb(struct ev_loop *loop, ev_io *w, int revents) {
    (void)loop;
    (void)revents;
    lei_ctx *c = w->data;
    for (int i = 0; i < 64; i++) {
        int fd = accept4(c->accept_s.lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
                accept_out_of_fds(c, errno);
            else if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
                lei_ratelog(c, LEI_RL_ACCEPT, "accept: %s", strerror(errno));
            return;
        }
        c->accept_s.acc_backoff = 0.1;
        char why[128];
        if (lei_accept_room(c, why, sizeof why)) {
            refuse_fd(c, fd, why);
            continue;
        }
        lei_conn *k = lei_conn_new(c, fd, LEI_CONN_HELLO_WAIT);
        if (!k) {
            close(fd);
            continue;
        }
        lei_accept_conn_added(c);
        ev_io_start(c->loop, &k->rio);
    }
}


int lei_accept_listen(lei_ctx *c, const char *addr, const char *advertise, const char *toward,
                   char *err) {
    const char *why;
    if (lei_addr_parse(addr, LEI_ADDR_LISTEN, &c->laddr, &why)) {
        snprintf(err, LEI_ADDR_ERR_MAX, "%s", why);
        return -LEI_E_INVALID;
    }
    /* Protected mode (no identity): loopback and unix sockets only. */
    if (!c->id.keyed && !lei_addr_is_local(&c->laddr)) {
        snprintf(err, LEI_ADDR_ERR_MAX,
                 "refusing to listen on %s without keys (protected mode): set key= and trust=, "
                 "or listen on 127.0.0.1", addr);
        return -LEI_E_INVALID;
    }
    int fd = lei_addr_listen(&c->laddr, 512, c->bound, err, LEI_ADDR_ERR_MAX); /* c->accept_s.lfd owns */
    if (fd < 0) return -LEI_E_IO;
    if (lei_addr_advertise(c->bound, advertise, toward, c->addr, err, LEI_ADDR_ERR_MAX)) {
        lei_addr_close(fd, &c->laddr);
        c->addr[0] = '\0';
        return -LEI_E_INVALID;
    }
    c->accept_s.lfd = fd;
    c->accept_s.reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC); /* owned: see accept_out_of_fds */
    ev_io_init(&c->accept_s.lio, accept_cb, fd, EV_READ);
    c->accept_s.lio.data = c;
    ev_io_start(c->loop, &c->accept_s.lio);
    return 0;
}
