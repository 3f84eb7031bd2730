/* ctx.c: the concentrator: sockets, handshake, batching, queues, policies,
 * local delivery and sync acknowledgements (contracts in ctx.h).
 *
 * Leans on libev (one loop per context, watchers embedded in their owners),
 * frame.c for the wire layout and codec.h for messages.  No Lua here.
 */
#define _GNU_SOURCE
#include "ctx.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <poll.h>
#include <sys/uio.h>
#include <unistd.h>

#define RBUF_MIN (64 * 1024)
#define IOVN 512
/* Async events this small are copied, header and value, into one buffer per
 * run of them in a peer's queue (a batch item): no allocation and two iovecs
 * fewer per event and destination.  Bigger ones are queued by reference. */
#define SMALL_EVENT 512
/* A connection ended by the disconnect policy is closed this long after
 * its FIN at the latest, if the remote does not close first. */
#define RETIRE_SECONDS 5.0
#define BATCH_MAX (16 * 1024)

/* One TCP connection.  Owned by the context (ctx->conns list); tied to at
 * most one peer.  Freed once closed and no read callback is running on it. */
struct lei_conn {
    lei_conn *next;
    lei_ctx *ctx;
    lei_peer *peer;     /* NULL until the handshake names the remote */
    int fd;
    int outbound;
    int state;          /* C_CONNECTING, C_HELLO, C_UP */
    int dead;           /* closed; free when busy reaches 0 */
    int busy;           /* read callbacks in progress on this connection */
    int fin;            /* closing: our FIN was sent, reading until the remote's */
    lei_peer *was;      /* retired: the peer it served (p->retiring == this) */
    ev_tstamp retired;  /* > 0: detached from its peer, FIN sent; what the
                         * socket holds is still delivered; closed when the
                         * remote closes or RETIRE_SECONDS after this time */
    ev_io rio, wio;
    uint8_t *rb;        /* owned read buffer */
    size_t rlen, rpos, rcap;
    uint32_t *inmap;    /* owned: remote channel idx -> local chid + 1 */
    size_t ninmap;
    ev_tstamp born, last_in, last_out, last_ping; /* liveness: created, last read, write, PING */
};

enum { C_CONNECTING = 1, C_HELLO, C_UP };

static void conn_close(lei_conn *k, const char *reason, int bad);
static void peer_flush(lei_peer *p);
static void conn_read_cb(struct ev_loop *loop, ev_io *w, int revents);
static void conn_fin(lei_conn *k);
static void conn_write_cb(struct ev_loop *loop, ev_io *w, int revents);
/* Liveness and sequence tracking (the live section, below). */
static void live_conn_new(lei_conn *k);
static int live_may_dial(lei_peer *p);
static void live_peer_up(lei_peer *p, uint64_t incarnation);
static int live_frame(lei_conn *k, const lei_frame *f);
static int live_seq(lei_ctx *c, lei_peer *p, lei_chan *ch, uint64_t producer, uint64_t seq);
static void live_free(lei_peer *p);

void lei_opts_default(lei_opts *o) {
    o->queue_limit = 64u << 20;
    o->policy = LEI_BLOCK;
    o->batch_bytes = 256u << 10;
    o->max_frame = (1u << 30) + 4096;
    o->retry_interval = 0.5;
    o->heartbeat = 5.0;
    o->heartbeat_misses = 2.0;
    o->retry_max = 2.0;
}

void lei_logf(lei_ctx *c, const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (c->h.log)
        c->h.log(c->h.ud, buf);
    else
        fprintf(stderr, "lecho: %s\n", buf);
}

/* ---- messages and queue items ---------------------------------------- */

static void msg_release(lei_ctx *c, lei_msg *m) {
    if (m) lei_msg_release(m, c->h.unpin, c->h.ud);
}

static lei_qitem *item_new(lei_msg *m) {
    lei_qitem *it = calloc(1, sizeof *it);
    if (!it) return NULL;
    if (m) {
        m->refcnt++;
        it->msg = m;
    }
    return it;
}

static void item_free(lei_ctx *c, lei_qitem *it) {
    msg_release(c, it->msg);
    free(it);
}

static void q_push(lei_queue *q, lei_qitem *it) {
    it->next = NULL;
    if (q->tail)
        q->tail->next = it;
    else
        q->head = it;
    q->tail = it;
    q->bytes += it->size;
    q->count++;
}

static lei_qitem *q_pop(lei_queue *q) {
    lei_qitem *it = q->head;
    if (!it) return NULL;
    q->head = it->next;
    if (!q->head) q->tail = NULL;
    q->bytes -= it->size;
    q->count--;
    return it;
}

/* A frame made of raw bytes (handshake, bind, ack, ctrl): copied into a
 * message of its own so that the queue treats every frame alike. */
static lei_qitem *item_bytes(const uint8_t *hdr, size_t hlen, const void *body, size_t blen) {
    lei_msg *m = NULL;
    lei_qitem *it;
    if (blen || hlen > sizeof it->hdr) {
        m = lei_msg_new();
        if (!m) return NULL;
        if ((hlen > sizeof it->hdr && lei_wbuf_put(&m->own, hdr, hlen)) ||
            (blen && lei_wbuf_put(&m->own, body, blen))) {
            lei_msg_release(m, NULL, NULL);
            return NULL;
        }
        m->total = m->own.len;
    }
    it = item_new(m);
    if (m) m->refcnt--; /* item_new took the only reference */
    if (!it) {
        if (m) lei_msg_release(m, NULL, NULL);
        return NULL;
    }
    if (hlen <= sizeof it->hdr) {
        memcpy(it->hdr, hdr, hlen);
        it->hlen = (uint8_t)hlen;
    }
    it->size = it->hlen + (m ? m->total : 0);
    return it;
}

/* ---- sync records ------------------------------------------------------ */

lei_sync *lei_sync_find(lei_ctx *c, uint64_t id) {
    for (lei_sync *s = c->syncs; s; s = s->next)
        if (s->id == id) return s;
    return NULL;
}

void lei_sync_free(lei_ctx *c, lei_sync *s) {
    for (lei_sync **pp = &c->syncs; *pp; pp = &(*pp)->next)
        if (*pp == s) {
            *pp = s->next;
            break;
        }
    for (int i = 0; i < s->nw; i++) {
        free(s->w[i].err);
        free(s->w[i].errs);
    }
    free(s->w);
    free(s);
}

static void sync_fail(lei_sync_wait *w, lei_sync *s, const char *why) {
    if (w->done) return;
    w->done = 1;
    w->err = strdup(why);
    s->nwait--;
}

/* A peer's connection ended: every sync still waiting on it fails. */
static void syncs_peer_lost(lei_ctx *c, lei_peer *p, const char *reason) {
    char why[256];
    snprintf(why, sizeof why, "consumer context %s: %s", p->addr, reason);
    for (lei_sync *s = c->syncs; s; s = s->next)
        for (int i = 0; i < s->nw; i++)
            if (s->w[i].peer == p) sync_fail(&s->w[i], s, why);
}

/* Records the answer of peer p (NULL: the local consumers) to sync `sync`. */
static void ack_from_peer(lei_ctx *c, lei_peer *p, uint64_t sync, uint64_t nran,
                          const uint8_t *errs, size_t elen) {
    lei_sync *s = lei_sync_find(c, sync);
    if (!s) return; /* timed out already: the late answer is dropped */
    for (int i = 0; i < s->nw; i++) {
        lei_sync_wait *w = &s->w[i];
        if (w->peer != p || w->done) continue;
        w->done = 1;
        s->nwait--;
        s->nran += nran;
        if (elen && (w->errs = malloc(elen))) {
            memcpy(w->errs, errs, elen);
            w->elen = elen;
        }
        return;
    }
}

void lei_ack(lei_ctx *c, lei_peer *from, uint64_t sync, uint64_t nran, const uint8_t *errs,
             size_t elen) {
    if (from) {
        uint8_t hdr[LEI_FRAME_HDR + 20];
        size_t hl = lei_frame_ack_hdr(hdr, sync, nran, elen);
        lei_qitem *it = item_bytes(hdr, hl, errs, elen);
        if (!it || !from->conn || !from->up) {
            if (it) item_free(c, it);
            return;
        }
        q_push(&from->q, it);
        peer_flush(from);
        return;
    }
    ack_from_peer(c, NULL, sync, nran, errs, elen);
}

/* ---- peers ------------------------------------------------------------- */

/* Records a change of p for the peer hook, told from the next loop turn
 * (prepare_cb): never from inside a submit, a write or a read of another
 * connection, where the hook could free what the caller still uses. */
static void note_peer(lei_peer *p, int up, const char *reason) {
    lei_ctx *c = p->ctx;
    if (!c->h.peer) return;
    if (c->nnotes == c->cnotes) {
        int n = c->cnotes ? c->cnotes * 2 : 8;
        struct lei_note *nn = realloc(c->notes, (size_t)n * sizeof *nn);
        if (!nn) {
            lei_logf(c, "out of memory: peer %s %s not told", p->addr, up ? "up" : "down");
            return;
        }
        c->notes = nn;
        c->cnotes = n;
    }
    struct lei_note *n = &c->notes[c->nnotes++];
    n->idx = p->idx;
    n->up = up;
    snprintf(n->reason, sizeof n->reason, "%s", reason ? reason : "");
    ev_idle_start(c->loop, &c->kick); /* told from the next loop turn, without waiting */
}

/* Tells the hook what changed, in order.  The hook may add notes. */
static void tell_notes(lei_ctx *c) {
    for (int i = 0; i < c->nnotes; i++) {
        struct lei_note n = c->notes[i];
        lei_peer *p = lei_peer_by_idx(c, n.idx);
        if (!p) continue;
        c->depth++;
        c->h.peer(c->h.ud, p, n.up, n.up ? NULL : n.reason);
        c->depth--;
    }
    c->nnotes = 0;
}



static void kick_cb(struct ev_loop *loop, ev_idle *w, int revents) {
    (void)revents;
    ev_idle_stop(loop, w);
}

/* Arms the expiry timer to fire at `when` at the latest (it serves both
 * deadlines below). */
static void expiry_at(lei_ctx *c, ev_tstamp when) {
    ev_timer *w = &c->expiry_w;
    ev_tstamp now = ev_now(c->loop);
    if (ev_is_active(w) && now + ev_timer_remaining(c->loop, w) <= when) return;
    ev_timer_stop(c->loop, w);
    ev_timer_set(w, when - now + 0.01, 0.);
    ev_timer_start(c->loop, w);
}

/* Deadlines: retired connections the remote did not close in time are
 * closed; peers whose remote never dialled back after winning the tie-break
 * are lost after all (queue dropped and counted, syncs fail). */
static void peer_lost(lei_peer *p, const char *reason);
static void expiry_cb(struct ev_loop *loop, ev_timer *w, int revents) {
    (void)loop;
    (void)revents;
    lei_ctx *c = w->data;
    ev_tstamp now = ev_now(c->loop), next = 0;
    for (lei_conn *k = c->conns, *nk; k; k = nk) {
        nk = k->next;
        if (k->dead || k->retired <= 0) continue;
        if (k->retired + RETIRE_SECONDS <= now)
            conn_close(k, "retired connection not closed by the remote in time", 0);
        else if (!next || k->retired + RETIRE_SECONDS < next)
            next = k->retired + RETIRE_SECONDS;
    }
    for (int i = 0; i < c->npeers; i++) {
        lei_peer *p = c->peers[i];
        if (p->await_in <= 0 || p->conn) continue;
        if (p->await_in <= now) {
            p->await_in = 0;
            peer_lost(p, "the remote context did not connect back after simultaneous dials");
        } else if (!next || p->await_in < next) {
            next = p->await_in;
        }
    }
    if (next) expiry_at(c, next);
}

lei_peer *lei_peer_by_idx(lei_ctx *c, int idx) {
    return idx >= 1 && idx <= c->npeers ? c->peers[idx - 1] : NULL;
}

static lei_peer *peer_find(lei_ctx *c, const char *addr) {
    for (int i = 0; i < c->npeers; i++)
        if (strcmp(c->peers[i]->addr, addr) == 0) return c->peers[i];
    return NULL;
}

static lei_peer *peer_new(lei_ctx *c, const char *addr) {
    if (c->npeers == c->cpeers) {
        int n = c->cpeers ? c->cpeers * 2 : 8;
        lei_peer **np = realloc(c->peers, (size_t)n * sizeof *np);
        if (!np) return NULL;
        c->peers = np;
        c->cpeers = n;
    }
    lei_peer *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->ctx = c;
    snprintf(p->addr, sizeof p->addr, "%s", addr);
    p->last_fail = -1e9;
    c->peers[c->npeers++] = p;
    p->idx = c->npeers;
    return p;
}

/* Counts a dropped queue item: one event, or each event of a batch (by
 * channel, read back from the frames when the batch is mixed). */
static void count_drop(lei_ctx *c, lei_peer *p, lei_qitem *it, size_t sent) {
    if (!it->droppable) return;
    /* sent: bytes of it already written.  A batch's frames written whole
     * were delivered (the connection ends with a FIN after them): not
     * counted; a frame cut short is. */
    if (!it->batch || (!it->mixed && sent == 0)) {
        uint32_t n = it->batch ? it->nev : 1;
        p->st.drops += n;
        lei_chan *ch = lei_chan_get(c, it->chid);
        if (ch) ch->drops += n;
        return;
    }
    const uint8_t *b = (const uint8_t *)it->msg->own.data;
    size_t off = 0, len = it->msg->own.len;
    lei_frame f;
    lei_event_hdr e;
    const char *err;
    while (off < len && lei_frame_next(b + off, len - off, len, &f, &err) == 1) {
        if (off + f.size > sent && f.type == LEI_F_EVENT &&
            lei_parse_event(f.body, f.len, &e, &err) == 0) {
            p->st.drops++;
            lei_chan *ch = lei_chan_get(c, (uint32_t)e.idx);
            if (ch) ch->drops++;
        }
        off += f.size;
    }
}

static void q_clear(lei_ctx *c, lei_peer *p, int count_drops) {
    lei_qitem *it;
    size_t sent = p->woff; /* of the head item only */
    while ((it = q_pop(&p->q))) {
        if (count_drops) count_drop(c, p, it, sent);
        sent = 0;
        item_free(c, it);
    }
    p->woff = 0;
}

/* Appends a small async event frame to the batch at the tail of p's queue,
 * starting a new batch when there is none or it is full.  The tail batch
 * may be partly written already: only its end grows.  Returns the batch, or
 * NULL (ENOMEM: the event is not queued, the queue is as it was; never an
 * empty batch, which a write could not get past). */
static lei_qitem *batch_event(lei_peer *p, uint32_t chid, const uint8_t *hdr, size_t hlen,
                              const lei_msg *msg) {
    lei_qitem *t = p->q.tail;
    size_t n = hlen + msg->total;
    if (!t || !t->batch || t->msg->own.len + n > BATCH_MAX) {
        lei_msg *m = lei_msg_new();
        if (!m || lei_wbuf_reserve(&m->own, n) || !(t = item_new(NULL))) {
            lei_msg_release(m, NULL, NULL);
            return NULL;
        }
        t->msg = m;
        t->batch = 1;
        t->droppable = 1;
        t->chid = chid;
        q_push(&p->q, t);
    }
    /* Growing it is safe: iovecs are rebuilt from the item at every write. */
    if (lei_wbuf_reserve(&t->msg->own, n)) return NULL;
    lei_wbuf_put(&t->msg->own, hdr, hlen);
    lei_wbuf_put(&t->msg->own, msg->own.data, msg->own.len);
    lei_msg_sync(t->msg);
    t->size += n;
    t->nev++;
    if (t->chid != chid) t->mixed = 1;
    p->q.bytes += n;
    return t;
}

/* The peer's connection is gone: queued frames are dropped (counted), the
 * channel announcements are forgotten, waiting syncs fail. */
static void peer_lost(lei_peer *p, const char *reason) {
    lei_ctx *c = p->ctx;
    p->conn = NULL;
    p->up = 0;
    p->last_fail = ev_now(c->loop);
    snprintf(p->reason, sizeof p->reason, "%s", reason);
    q_clear(c, p, 1);
    if (p->nbound) memset(p->bound, 0, p->nbound); /* bound is NULL until a channel is sent */
    syncs_peer_lost(c, p, reason);
    note_peer(p, 0, reason);
}

void lei_peer_close(lei_peer *p, const char *reason) {
    if (p->conn) conn_close(p->conn, reason, 0);
}

static int set_nonblock(int fd) {
    int fl = fcntl(fd, F_GETFL);
    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

static int parse_addr(const char *addr, struct sockaddr_in *sa) {
    char host[LEI_ADDR_MAX];
    const char *colon = strrchr(addr, ':');
    if (!colon || (size_t)(colon - addr) >= sizeof host) return -1;
    memcpy(host, addr, (size_t)(colon - addr));
    host[colon - addr] = '\0';
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (*end || port <= 0 || port > 65535) return -1;
    memset(sa, 0, sizeof *sa);
    sa->sin_family = AF_INET;
    sa->sin_port = htons((uint16_t)port);
    return inet_pton(AF_INET, host, &sa->sin_addr) == 1 ? 0 : -1;
}

static lei_conn *conn_new(lei_ctx *c, int fd, int outbound) {
    lei_conn *k = calloc(1, sizeof *k);
    if (!k) return NULL;
    k->ctx = c;
    k->fd = fd;
    k->outbound = outbound;
    ev_io_init(&k->rio, conn_read_cb, fd, EV_READ);
    ev_io_init(&k->wio, conn_write_cb, fd, EV_WRITE);
    k->rio.data = k->wio.data = k;
    k->next = c->conns;
    c->conns = k;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    live_conn_new(k);
    return k;
}

static void conn_unlink_free(lei_conn *k) {
    lei_ctx *c = k->ctx;
    for (lei_conn **pp = &c->conns; *pp; pp = &(*pp)->next)
        if (*pp == k) {
            *pp = k->next;
            break;
        }
    free(k);
}

/* Writes a small frame straight to the socket: only for the handshake and
 * for the parting ERROR, when nothing else is queued on the connection. */
static void conn_write_now(lei_conn *k, const uint8_t *b, size_t n) {
    while (n) {
        ssize_t w = send(k->fd, b, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return;
        b += w;
        n -= (size_t)w;
    }
}

static void conn_send_error(lei_conn *k, const char *msg) {
    uint8_t b[LEI_FRAME_HDR + 256];
    size_t n = strnlen(msg, 255);
    lei_frame_hdr(b, LEI_F_ERROR, n);
    memcpy(b + LEI_FRAME_HDR, msg, n);
    conn_write_now(k, b, LEI_FRAME_HDR + n);
}

/* Closes a connection: bad is set when the remote sent malformed input. */
static void conn_close(lei_conn *k, const char *reason, int bad) {
    lei_ctx *c = k->ctx;
    if (k->dead) return;
    k->dead = 1;
    ev_io_stop(c->loop, &k->rio);
    ev_io_stop(c->loop, &k->wio);
    if (bad) {
        c->bad_frames++;
        conn_send_error(k, reason);
        lei_logf(c, "closing connection from %s: %s", k->peer ? k->peer->addr : "unidentified peer",
                 reason);
    }
    close(k->fd);
    k->fd = -1;
    free(k->rb);
    k->rb = NULL;
    free(k->inmap);
    k->inmap = NULL;
    lei_peer *p = k->peer;
    k->peer = NULL;
    if (p && p->conn == k) peer_lost(p, reason);
    if (k->was && k->was->retiring == k) k->was->retiring = NULL;
    if (!k->busy) conn_unlink_free(k);
}

/* Ends k after what it has written: the peer is detached (its queue
 * dropped and counted, its syncs failed, told as lost), our FIN goes out
 * behind the bytes already in the socket, and k reads (and ignores) until
 * the remote closes, so that what the kernel holds is still delivered and
 * every event is either received or counted as dropped. */
static void conn_retire(lei_conn *k, const char *reason) {
    if (!k || k->dead) return;
    lei_ctx *c = k->ctx;
    lei_peer *p = k->peer;
    if (k->state != C_UP) {
        conn_close(k, reason, 0);
        return;
    }
    ev_io_stop(c->loop, &k->wio);
    shutdown(k->fd, SHUT_WR);
    k->fin = 1;
    k->retired = ev_now(c->loop);
    k->peer = NULL;
    if (p && p->conn == k) {
        peer_lost(p, reason);
        /* No new connection to p until this one is closed: the remote would
         * read the two side by side, newer events before older ones. */
        p->retiring = k;
        k->was = p;
    }
    ev_io_start(c->loop, &k->rio);
    expiry_at(c, k->retired + RETIRE_SECONDS);
}

/* Dials the peer.  Frames queue up until the handshake is answered. */
static int peer_dial(lei_peer *p) {
    lei_ctx *c = p->ctx;
    struct sockaddr_in sa;
    if (parse_addr(p->addr, &sa)) {
        snprintf(p->reason, sizeof p->reason, "bad address '%s' (want IPv4:port)", p->addr);
        p->last_fail = ev_now(c->loop);
        return -1;
    }
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || set_nonblock(fd)) {
        if (fd >= 0) close(fd);
        snprintf(p->reason, sizeof p->reason, "socket: %s", strerror(errno));
        p->last_fail = ev_now(c->loop);
        return -1;
    }
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0 && errno != EINPROGRESS) {
        snprintf(p->reason, sizeof p->reason, "connect: %s", strerror(errno));
        close(fd);
        p->last_fail = ev_now(c->loop);
        return -1;
    }
    lei_conn *k = conn_new(c, fd, 1);
    if (!k) {
        close(fd);
        return -1;
    }
    k->peer = p;
    k->state = C_CONNECTING;
    p->conn = k;
    p->up = 0;
    ev_io_start(c->loop, &k->wio);
    return 0;
}

lei_peer *lei_peer_get(lei_ctx *c, const char *addr, int create) {
    lei_peer *p = peer_find(c, addr);
    if (!p && create) p = peer_new(c, addr);
    if (p && create && !p->conn && p->await_in <= 0 && !p->retiring && live_may_dial(p))
        peer_dial(p);
    return p;
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

/* Writes as much of the peer's queue as the socket takes, many frames per
 * writev; arms the write watcher when the socket is full. */
static void peer_flush(lei_peer *p) {
    lei_ctx *c = p->ctx;
    lei_conn *k = p->conn;
    if (!k || !p->up || k->dead) return;
    while (p->q.head) {
        struct iovec iov[IOVN];
        int n = 0;
        size_t off = p->woff;
        for (lei_qitem *it = p->q.head; it && n < IOVN - 2; it = it->next) {
            if (off < it->hlen) {
                iov[n].iov_base = it->hdr + off;
                iov[n].iov_len = it->hlen - off;
                n++;
                off = 0;
            } else {
                off -= it->hlen;
            }
            if (it->msg) {
                size_t covered = 0;
                int m = lei_msg_iov(it->msg, off, iov + n, IOVN - n, &covered);
                n += m;
                if (covered < it->msg->total - off) break;
            }
            off = 0;
        }
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
                return;
            }
            char why[160];
            snprintf(why, sizeof why, "write: %s", strerror(errno));
            conn_close(k, why, 0);
            return;
        }
        p->st.batches++;
        p->st.bytes_out += (uint64_t)w;
        k->last_out = ev_now(c->loop);
        size_t left = (size_t)w;
        while (left) {
            lei_qitem *it = p->q.head;
            size_t rem = it->size - p->woff;
            if (left >= rem) {
                left -= rem;
                p->woff = 0;
                item_free(c, q_pop(&p->q));
            } else {
                p->woff += left;
                left = 0;
            }
        }
    }
    ev_io_stop(c->loop, &k->wio);
    if (c->closing) conn_fin(k);
}

/* ---- channels ---------------------------------------------------------- */

static uint32_t hash_name(const char *s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 16777619u;
    return h;
}

static int hash_grow(lei_ctx *c) {
    uint32_t ncap = c->hcap ? c->hcap * 2 : 256;
    uint32_t *nh = calloc(ncap, sizeof *nh);
    if (!nh) return -1;
    for (uint32_t i = 0; i < c->nchans; i++) {
        uint32_t j = hash_name(c->chans[i]->name, c->chans[i]->namelen) & (ncap - 1);
        while (nh[j]) j = (j + 1) & (ncap - 1);
        nh[j] = i + 1;
    }
    free(c->hash);
    c->hash = nh;
    c->hcap = ncap;
    return 0;
}

lei_chan *lei_chan_get(lei_ctx *c, uint32_t id) {
    return id < c->nchans ? c->chans[id] : NULL;
}

uint32_t lei_chan_open(lei_ctx *c, const char *name, size_t len) {
    if (c->hcap) {
        uint32_t j = hash_name(name, len) & (c->hcap - 1);
        while (c->hash[j]) {
            lei_chan *ch = c->chans[c->hash[j] - 1];
            if (ch->namelen == len && memcmp(ch->name, name, len) == 0) return ch->id;
            j = (j + 1) & (c->hcap - 1);
        }
    }
    if ((c->nchans + 1) * 2 > c->hcap && hash_grow(c)) return UINT32_MAX;
    if (c->nchans == c->cchans) {
        uint32_t n = c->cchans ? c->cchans * 2 : 64;
        lei_chan **nc = realloc(c->chans, n * sizeof *nc);
        if (!nc) return UINT32_MAX;
        c->chans = nc;
        c->cchans = n;
    }
    lei_chan *ch = calloc(1, sizeof *ch);
    if (!ch || !(ch->name = malloc(len + 1))) {
        free(ch);
        return UINT32_MAX;
    }
    memcpy(ch->name, name, len);
    ch->name[len] = '\0';
    ch->namelen = len;
    ch->derived = memchr(name, '@', len) != NULL;
    ch->id = c->nchans;
    c->chans[c->nchans++] = ch;
    uint32_t j = hash_name(name, len) & (c->hcap - 1);
    while (c->hash[j]) j = (j + 1) & (c->hcap - 1);
    c->hash[j] = ch->id + 1;
    return ch->id;
}

void lei_chan_set_dests(lei_ctx *c, uint32_t id, const char **addrs, int n) {
    lei_chan *ch = lei_chan_get(c, id);
    if (!ch) return;
    lei_peer **d = n ? calloc((size_t)n, sizeof *d) : NULL;
    int nd = 0;
    for (int i = 0; i < n; i++) {
        if (strcmp(addrs[i], c->addr) == 0) continue;
        lei_peer *p = lei_peer_get(c, addrs[i], 1);
        if (p && d) d[nd++] = p;
    }
    free(ch->dests);
    ch->dests = d;
    ch->ndests = nd;
}

/* ---- submitting -------------------------------------------------------- */

/* Live: connected, connecting, or awaiting the remote's own connection
 * after losing the tie-break of simultaneous dials (queue kept). */
static int peer_live(lei_peer *p) {
    return (p->conn && !p->conn->dead) || p->await_in > 0;
}

static lei_peer *full_dest(lei_ctx *c, lei_chan *ch) {
    for (int i = 0; i < ch->ndests; i++) {
        lei_peer *p = ch->dests[i];
        if (peer_live(p) && p->q.bytes >= c->o.queue_limit) return p;
    }
    return NULL;
}

int lei_chan_full(lei_ctx *c, uint32_t chid) {
    lei_chan *ch = lei_chan_get(c, chid);
    return ch && full_dest(c, ch) != NULL;
}

int lei_chan_room(lei_ctx *c, uint32_t chid) {
    lei_chan *ch = lei_chan_get(c, chid);
    if (!ch) return 1;
    lei_peer *p;
    while ((p = full_dest(c, ch)) != NULL) {
        size_t before = p->q.bytes;
        /* What the socket takes now may be enough; if not, peer_flush armed
         * the write watcher (or the connection is still being made), so the
         * loop wakes when there may be room: never a sleep with data queued. */
        peer_flush(p);
        if (p->q.bytes >= before || p->q.bytes >= c->o.queue_limit) return 0;
    }
    /* Local: the queue, and for a channel whose handler waits, what waits
     * behind it (other channels' events go on). */
    if (ch->local && (c->lq.bytes >= c->o.queue_limit ||
                      (ch->held && c->ldef.bytes >= c->o.queue_limit))) {
        if (c->lq.head) ev_idle_start(c->loop, &c->idle);
        return 0;
    }
    return 1;
}

/* Queues one event frame, header hdr (the same for every destination) then
 * msg, and the channel's BIND first if this connection has not seen it.
 * Applies the queue policy. */
static void enqueue_event(lei_ctx *c, lei_peer *p, lei_chan *ch, const uint8_t *hdr, size_t hlen,
                          lei_msg *msg, uint64_t sync, int policy) {
    if (!peer_live(p) && !(lei_peer_get(c, p->addr, 1) && peer_live(p))) {
        /* Unreachable since a failed attempt, not yet dialled again: counted. */
        p->st.drops++;
        ch->drops++;
        return;
    }
    size_t esize = LEI_EVENT_HDR_MAX + msg->total;
    if (!sync && p->q.count && p->q.bytes + esize > c->o.queue_limit) {
        if (policy == LEI_DROP_NEWEST) {
            p->st.drops++;
            ch->drops++;
            return;
        }
        if (policy == LEI_DISCONNECT) {
            char why[128];
            snprintf(why, sizeof why, "outgoing queue over its limit of %zu bytes (policy disconnect)",
                     c->o.queue_limit);
            lei_logf(c, "disconnecting slow peer %s: %s", p->addr, why);
            if (p->conn) {
                conn_retire(p->conn, why);
            } else { /* awaiting the remote's connection: nothing written yet */
                p->await_in = 0;
                peer_lost(p, why);
            }
            p->st.drops++;
            ch->drops++;
            return;
        }
    }
    ensure_bound(p, ch->id);
    if (ch->id < p->nbound && !p->bound[ch->id]) {
        /* BIND header here, the name itself goes in as the item's body. */
        uint8_t hdr[LEI_FRAME_HDR + 20];
        size_t pos = LEI_FRAME_HDR;
        pos += lei_varint_encode(hdr + pos, ch->id);
        pos += lei_varint_encode(hdr + pos, ch->namelen);
        lei_frame_hdr(hdr, LEI_F_BIND, pos - LEI_FRAME_HDR + ch->namelen);
        lei_qitem *bi = item_bytes(hdr, pos, ch->name, ch->namelen);
        if (!bi) return;
        q_push(&p->q, bi);
        p->bound[ch->id] = 1;
    }
    lei_qitem *it;
    if (!sync && msg->total <= SMALL_EVENT && msg->next == 0) {
        it = batch_event(p, ch->id, hdr, hlen, msg);
        if (!it) return;
    } else {
        it = item_new(msg);
        if (!it) return;
        memcpy(it->hdr, hdr, hlen);
        it->hlen = (uint8_t)hlen;
        it->size = it->hlen + msg->total;
        it->chid = ch->id;
        it->droppable = !sync;
        q_push(&p->q, it);
    }
    p->st.ev_out++;
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
                count_drop(c, p, x, 0);
                item_free(c, x);
            } else {
                prev = x;
                pp = &x->next;
            }
        }
    }
    if (p->q.bytes >= c->o.batch_bytes || sync) peer_flush(p);
}

/* Runs the local consumers of one queued item.  Returns 1 when a handler
 * suspended the dispatch (its channel is then held). */
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
        c->depth++;
        rc = c->h.event(c->h.ud, NULL, it->chid, it->producer, it->seq, it->sync, p, m->total);
        c->depth--;
    } else if (it->sync) {
        lei_ack(c, NULL, it->sync, 0, NULL, 0);
    }
    free(flat);
    if (rc == 1 && ch) ch->held = 1;
    return rc == 1;
}

/* Runs up to max local items; those of a held channel wait in ldef. */
static void run_local(lei_ctx *c, int max) {
    for (int i = 0; i < max; i++) {
        lei_qitem *it = q_pop(&c->lq);
        if (!it) break;
        lei_chan *ch = lei_chan_get(c, it->chid);
        if (ch && ch->held) {
            q_push(&c->ldef, it); /* after its channel's suspended event */
            continue;
        }
        local_deliver(c, it);
        item_free(c, it);
    }
    if (!c->lq.head) ev_idle_stop(c->loop, &c->idle);
}

void lei_drain_local(lei_ctx *c) { run_local(c, INT_MAX); }

static void idle_cb(struct ev_loop *loop, ev_idle *w, int revents) {
    (void)loop;
    (void)revents;
    /* A bounded batch per turn so that sockets are served too. */
    run_local(w->data, 4096);
}

void lei_resume(lei_ctx *c, lei_peer *from, uint32_t chid) {
    if (!from) {
        lei_chan *ch = lei_chan_get(c, chid);
        if (!ch || !ch->held) return;
        ch->held = 0;
        /* Its deferred events go back to the front of the local queue, in
         * order: every event of it still in the queue came later. */
        lei_queue keep = {0}, mine = {0};
        lei_qitem *it;
        while ((it = q_pop(&c->ldef))) q_push(it->chid == chid ? &mine : &keep, it);
        c->ldef = keep;
        if (mine.head) {
            mine.tail->next = c->lq.head;
            if (!c->lq.head) c->lq.tail = mine.tail;
            c->lq.head = mine.head;
            c->lq.bytes += mine.bytes;
            c->lq.count += mine.count;
        }
        if (c->lq.head) ev_idle_start(c->loop, &c->idle);
        return;
    }
    from->held = 0;
    lei_conn *k = from->conn;
    if (k && !k->dead && k->state != C_CONNECTING) {
        ev_io_start(c->loop, &k->rio);
        ev_feed_event(c->loop, &k->rio, EV_READ); /* frames already buffered */
    }
}

int lei_submit(lei_ctx *c, uint32_t chid, uint64_t producer, uint64_t seq, lei_msg *msg,
               int sync, int policy, uint64_t *sync_id, const char **err) {
    lei_chan *ch = lei_chan_get(c, chid);
    if (!ch) {
        *err = "no such channel";
        return -1;
    }
    if (msg->total + LEI_EVENT_HDR_MAX > c->o.max_frame) {
        *err = "event larger than the frame limit (max_frame)";
        return -1;
    }
    /* Everything that can fail is allocated before anything is queued or
     * counted: a failed submit leaves no trace.  The destinations are
     * copied: a policy closing a peer, or a write failing, must not change
     * the list this event is sent to. */
    int nd = ch->ndests;
    int local_drop = ch->local && !sync && policy != LEI_BLOCK &&
                     (c->lq.bytes >= c->o.queue_limit ||
                      (ch->held && c->ldef.bytes >= c->o.queue_limit));
    lei_peer *one[8], **dests = nd <= 8 ? one : malloc((size_t)nd * sizeof *dests);
    lei_qitem *lit = NULL;
    lei_sync *s = NULL;
    if (!dests || (ch->local && !local_drop && !(lit = item_new(msg))) ||
        (sync && (!(s = calloc(1, sizeof *s)) ||
                  !(s->w = calloc((size_t)nd + 1, sizeof *s->w))))) {
        if (dests != one) free(dests);
        if (lit) item_free(c, lit);
        free(s);
        *err = "out of memory";
        return -1;
    }
    if (nd) memcpy(dests, ch->dests, (size_t)nd * sizeof *dests);
    if (local_drop) ch->drops++; /* the local queue is full: dropped, counted */
    if (s) {
        s->id = ++c->next_sync;
        s->next = c->syncs;
        c->syncs = s;
        *sync_id = s->id;
    }
    /* The same frame header for every destination: built once. */
    uint8_t hdr[LEI_EVENT_HDR_MAX];
    size_t hlen = lei_frame_event_hdr(hdr, ch->id, producer, seq, s ? s->id : 0, msg->total);
    ch->ev_out++;
    ch->bytes_out += msg->total;
    for (int i = 0; i < nd; i++) {
        lei_peer *p = dests[i];
        if (s) {
            lei_sync_wait *w = &s->w[s->nw++];
            w->peer = p;
            s->nwait++;
        }
        enqueue_event(c, p, ch, hdr, hlen, msg, s ? s->id : 0, policy);
        if (s && !peer_live(p)) {
            char why[256];
            snprintf(why, sizeof why, "consumer context %s: unreachable (%s)", p->addr,
                     p->reason[0] ? p->reason : "not connected");
            sync_fail(&s->w[s->nw - 1], s, why);
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
        q_push(&c->lq, lit);
        ev_idle_start(c->loop, &c->idle);
    }
    return 0;
}

int lei_send_ctrl(lei_ctx *c, const char *addr, lei_msg *msg, const char **err) {
    lei_peer *p = lei_peer_get(c, addr, 1);
    if (!p) {
        *err = "out of memory";
        return -1;
    }
    if (!peer_live(p)) {
        *err = p->reason[0] ? p->reason : "peer unreachable";
        return -1;
    }
    uint8_t hdr[LEI_FRAME_HDR];
    lei_frame_hdr(hdr, LEI_F_CTRL, msg->total);
    lei_qitem *it = item_new(msg);
    if (!it) {
        *err = "out of memory";
        return -1;
    }
    memcpy(it->hdr, hdr, LEI_FRAME_HDR);
    it->hlen = LEI_FRAME_HDR;
    it->size = LEI_FRAME_HDR + msg->total;
    q_push(&p->q, it);
    p->st.ctrl_out++;
    peer_flush(p);
    return 0;
}

void lei_flush(lei_ctx *c) {
    for (int i = 0; i < c->npeers; i++)
        if (c->peers[i]->q.head) peer_flush(c->peers[i]);
}

static void prepare_cb(struct ev_loop *loop, ev_prepare *w, int revents) {
    (void)loop;
    (void)revents;
    lei_ctx *c = w->data;
    if (c->nnotes) tell_notes(c);
    if (c->h.prepare) c->h.prepare(c->h.ud);
    lei_flush(c);
}

/* ---- reading ----------------------------------------------------------- */

static void send_hello(lei_conn *k, uint8_t type) {
    uint8_t b[128];
    size_t n = lei_frame_hello(b, type, LEI_PROTO_VERSION, k->ctx->incarnation, k->ctx->addr);
    conn_write_now(k, b, n);
}

/* The reason sent to the loser of simultaneous dials: it keeps its queue
 * and waits for the connection the winner dialled. */
static const char DUP_REASON[] = "duplicate connection: the one dialled by the smaller address wins";
#define AWAIT_IN_SECONDS 5.0

/* An inbound connection introduced itself: tie it to the peer of that
 * address.  With two connections between the same pair of contexts the one
 * dialled by the smaller address wins, so both sides agree on one. */
static int on_hello(lei_conn *k, const lei_hello *h) {
    lei_ctx *c = k->ctx;
    lei_peer *p = peer_find(c, h->addr);
    if (p && p->conn && !p->conn->dead && p->conn != k) {
        lei_conn *old = p->conn;
        if (old->outbound && !p->up) {
            if (strcmp(c->addr, h->addr) < 0) {
                conn_send_error(k, DUP_REASON);
                return -1;
            }
            /* Ours loses: adopt the inbound one, keep the queue. */
            p->conn = NULL;
            old->peer = NULL;
            conn_close(old, "superseded", 0);
        } else if (p->up && p->lv.incarnation == h->incarnation &&
                   ev_now(c->loop) - old->last_in < (c->o.heartbeat > 1.0 ? c->o.heartbeat : 1.0)) {
            /* The same process, and its connection here is up and alive: a
             * HELLO of a crossing dial that arrives late (its sender already
             * took ours).  Replacing ours would drop its queue. */
            conn_send_error(k, DUP_REASON);
            return -1;
        } else {
            conn_close(old, "replaced by a new connection from the same context", 0);
        }
    }
    if (!p && !(p = peer_new(c, h->addr))) return -1;
    k->peer = p;
    p->conn = k;
    p->up = 1;
    p->await_in = 0;
    p->reason[0] = '\0';
    live_peer_up(p, h->incarnation);
    k->state = C_UP;
    send_hello(k, LEI_F_HELLO_OK);
    note_peer(p, 1, NULL);
    if (p->held) ev_io_stop(c->loop, &k->rio);
    peer_flush(p);
    return 0;
}

static int map_idx(lei_conn *k, uint64_t idx, uint32_t *chid) {
    if (idx >= k->ninmap || !k->inmap[idx]) return -1;
    *chid = k->inmap[idx] - 1;
    return 0;
}

/* Handles one frame.  Returns 0, or -1 after closing the connection. */
static int conn_frame(lei_conn *k, const lei_frame *f) {
    lei_ctx *c = k->ctx;
    const char *err = NULL;
    char why[256];
    if (k->state == C_HELLO && !k->outbound) {
        lei_hello h;
        if (f->type != LEI_F_HELLO) {
            conn_close(k, "expected a handshake (HELLO) first", 1);
            return -1;
        }
        if (lei_parse_hello(f->body, f->len, &h, &err)) {
            conn_close(k, err, 1);
            return -1;
        }
        if (h.version != LEI_PROTO_VERSION) {
            snprintf(why, sizeof why,
                     "protocol version mismatch: peer speaks %u, this side speaks %u", h.version,
                     LEI_PROTO_VERSION);
            conn_close(k, why, 1);
            return -1;
        }
        if (on_hello(k, &h)) {
            conn_close(k, "handshake refused", 0);
            return -1;
        }
        return 0;
    }
    if (k->state == C_HELLO) { /* outbound: waiting for HELLO_OK */
        lei_hello h;
        if (f->type == LEI_F_ERROR && k->peer && k->peer->conn == k &&
            f->len == sizeof DUP_REASON - 1 && memcmp(f->body, DUP_REASON, f->len) == 0) {
            /* We lost the tie-break: the remote's own connection comes.
             * Nothing was written on this one (the handshake was not done):
             * the queue, BINDs included, goes whole on the next one. */
            lei_peer *p = k->peer;
            p->conn = NULL;
            p->up = 0;
            p->await_in = ev_now(c->loop) + AWAIT_IN_SECONDS;
            expiry_at(c, p->await_in);
            k->peer = NULL;
            conn_close(k, "lost the tie-break of simultaneous dials", 0);
            return -1;
        }
        if (f->type == LEI_F_ERROR) {
            snprintf(why, sizeof why, "refused by peer: %.*s", (int)(f->len > 200 ? 200 : f->len),
                     (const char *)f->body);
            lei_logf(c, "connection to %s %s", k->peer ? k->peer->addr : "?", why);
            conn_close(k, why, 0);
            return -1;
        }
        if (f->type != LEI_F_HELLO_OK || lei_parse_hello(f->body, f->len, &h, &err)) {
            conn_close(k, err ? err : "expected a handshake answer (HELLO_OK)", 1);
            return -1;
        }
        if (h.version != LEI_PROTO_VERSION) {
            snprintf(why, sizeof why,
                     "protocol version mismatch: peer speaks %u, this side speaks %u", h.version,
                     LEI_PROTO_VERSION);
            conn_close(k, why, 1);
            return -1;
        }
        k->state = C_UP;
        lei_peer *p = k->peer;
        if (p && p->conn != k) {
            /* Another connection took over this peer meanwhile. */
            k->peer = NULL;
            conn_close(k, "superseded by another connection to the same context", 0);
            return -1;
        }
        if (p) {
            p->up = 1;
            p->await_in = 0;
            p->reason[0] = '\0';
            live_peer_up(p, h.incarnation);
            note_peer(p, 1, NULL);
            if (p->held) ev_io_stop(c->loop, &k->rio);
            if (p->conn == k) peer_flush(p);
        }
        return 0;
    }
    lei_peer *p = k->peer;
    if (f->type == LEI_F_HEARTBEAT || f->type == LEI_F_PING) return live_frame(k, f);
    switch (f->type) {
    case LEI_F_EVENT: {
        lei_event_hdr e;
        uint32_t chid;
        if (lei_parse_event(f->body, f->len, &e, &err)) break;
        if (map_idx(k, e.idx, &chid)) {
            err = "event on a channel that was never bound";
            break;
        }
        lei_chan *ch = lei_chan_get(c, chid);
        p->st.ev_in++;
        ch->ev_in++;
        ch->bytes_in += e.plen;
        if (!ch->local || live_seq(c, p, ch, e.producer, e.seq)) {
            if (e.sync) lei_ack(c, p, e.sync, 0, NULL, 0);
            return 0;
        }
        c->depth++;
        int rc = c->h.event(c->h.ud, p, chid, e.producer, e.seq, e.sync, e.payload, e.plen);
        c->depth--;
        if (rc == 1) {
            /* A handler waits: hold what comes next from this peer. */
            p->held = 1;
            ev_io_stop(c->loop, &k->rio);
        } else if (rc) {
            err = "malformed event value";
        }
        break;
    }
    case LEI_F_CTRL:
        p->st.ctrl_in++;
        c->depth++;
        if (c->h.ctrl(c->h.ud, p, f->body, f->len)) err = "malformed control message";
        c->depth--;
        break;
    case LEI_F_BIND: {
        uint64_t idx;
        const uint8_t *name;
        size_t nl;
        if (lei_parse_bind(f->body, f->len, &idx, &name, &nl, &err)) break;
        if (idx > 16u * 1024 * 1024) {
            err = "channel index out of range";
            break;
        }
        if (idx >= k->ninmap) {
            size_t n = k->ninmap ? k->ninmap : 64;
            while (n <= idx) n *= 2;
            uint32_t *m = realloc(k->inmap, n * sizeof *m);
            if (!m) {
                err = "out of memory";
                break;
            }
            memset(m + k->ninmap, 0, (n - k->ninmap) * sizeof *m);
            k->inmap = m;
            k->ninmap = n;
        }
        uint32_t id = lei_chan_open(c, (const char *)name, nl);
        if (id == UINT32_MAX) {
            err = "out of memory";
            break;
        }
        k->inmap[idx] = id + 1;
        break;
    }
    case LEI_F_ACK: {
        uint64_t sync, nran;
        const uint8_t *errs;
        size_t elen;
        if (lei_parse_ack(f->body, f->len, &sync, &nran, &errs, &elen, &err)) break;
        ack_from_peer(c, p, sync, nran, errs, elen);
        break;
    }
    case LEI_F_ERROR:
        snprintf(why, sizeof why, "peer reported: %.*s", (int)(f->len > 200 ? 200 : f->len),
                 (const char *)f->body);
        lei_logf(c, "connection with %s closed, %s", p ? p->addr : "?", why);
        conn_close(k, why, 0);
        return -1;
    default:
        snprintf(why, sizeof why, "unknown frame type %u", f->type);
        conn_close(k, why, 1);
        return -1;
    }
    if (k->dead) return -1;
    if (err) {
        conn_close(k, err, 1);
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
    return k->state == C_UP || max < HANDSHAKE_FRAME_MAX ? max : HANDSHAKE_FRAME_MAX;
}

/* Hands over the complete frames in k's buffer, until one suspends or
 * closes.  Returns 0, or -1 once k is dead (the caller frees it). */
static int conn_frames(lei_conn *k) {
    if (k->retired > 0) { /* detached: what still comes is not read */
        k->rpos = k->rlen;
        return 0;
    }
    while (!k->dead && !(k->peer && k->peer->held && k->state == C_UP)) {
        lei_frame f;
        const char *err = NULL;
        size_t max = conn_max_frame(k); /* the handshake may end at any frame */
        int r = lei_frame_next(k->rb + k->rpos, k->rlen - k->rpos, max, &f, &err);
        if (r == 0) break;
        if (r < 0) {
            char why[160];
            const uint8_t *h = k->rb + k->rpos;
            snprintf(why, sizeof why, "%s (%u bytes, limit %zu)", err,
                     (unsigned)(h[0] | h[1] << 8 | h[2] << 16 | (uint32_t)h[3] << 24),
                     max);
            conn_close(k, why, 1);
            break;
        }
        k->rpos += f.size; /* consumed before the hooks run: they may re-enter */
        if (conn_frame(k, &f) || k->dead) break;
    }
    return k->dead ? -1 : 0;
}

static void conn_read_cb(struct ev_loop *loop, ev_io *w, int revents) {
    (void)loop;
    (void)revents;
    lei_conn *k = w->data;
    lei_ctx *c = k->ctx;
    if (k->peer && k->peer->held && k->state == C_UP) {
        ev_io_stop(c->loop, &k->rio); /* lei_resume starts it again */
        return;
    }
    /* What a suspended dispatch left in the buffer goes first. */
    if (k->rpos < k->rlen) {
        k->busy++;
        conn_frames(k);
        k->busy--;
        if (k->dead) {
            if (!k->busy) conn_unlink_free(k);
            return;
        }
        if (k->peer && k->peer->held) return;
    }
    /* Compact, then make room: a frame larger than the buffer grows it to
     * exactly its size, never past max_frame. */
    if (k->rpos && k->busy == 0) {
        memmove(k->rb, k->rb + k->rpos, k->rlen - k->rpos);
        k->rlen -= k->rpos;
        k->rpos = 0;
    }
    size_t want = RBUF_MIN, room;
    size_t big_end = 0; /* a large frame: read up to its end only */
    if (k->rlen - k->rpos >= 4) {
        const uint8_t *h = k->rb + k->rpos;
        size_t flen = (size_t)h[0] | (size_t)h[1] << 8 | (size_t)h[2] << 16 | (size_t)h[3] << 24;
        if (flen <= conn_max_frame(k) && flen + 4 > want) {
            want = flen + 4;
            big_end = k->rpos + want;
        }
    }
    if (k->rcap - k->rlen < RBUF_MIN && k->rcap < k->rlen + want) {
        size_t ncap = k->rlen + want;
        if (ncap < k->rcap * 2 && k->rcap * 2 <= c->o.max_frame + 4) ncap = k->rcap * 2;
        uint8_t *nb = realloc(k->rb, ncap);
        if (!nb) {
            conn_close(k, "out of memory for the read buffer", 0);
            return;
        }
        k->rb = nb;
        k->rcap = ncap;
    }
    /* Reading past the end of a large frame would put the next frame's
     * first bytes behind it, to be moved to the front afterwards: a copy of
     * up to a whole frame.  Stop at its end instead. */
    room = k->rcap - k->rlen;
    if (big_end > k->rlen && big_end - k->rlen < room) room = big_end - k->rlen;
    ssize_t n = read(k->fd, k->rb + k->rlen, room);
    if (n < 0) {
        if (errno == EAGAIN || errno == EINTR) return;
        char why[128];
        snprintf(why, sizeof why, "read: %s", strerror(errno));
        conn_close(k, why, 0);
        return;
    }
    if (n == 0) {
        conn_close(k, "connection closed by peer", 0);
        return;
    }
    k->rlen += (size_t)n;
    k->last_in = ev_now(loop);
    if (k->peer && k->state == C_UP) k->peer->st.bytes_in += (uint64_t)n;
    k->busy++;
    conn_frames(k);
    k->busy--;
    if (k->dead && !k->busy) conn_unlink_free(k);
}

static void conn_write_cb(struct ev_loop *loop, ev_io *w, int revents) {
    (void)loop;
    (void)revents;
    lei_conn *k = w->data;
    if (k->state == C_CONNECTING) {
        int e = 0;
        socklen_t l = sizeof e;
        getsockopt(k->fd, SOL_SOCKET, SO_ERROR, &e, &l);
        if (e) {
            char why[128];
            snprintf(why, sizeof why, "connect: %s", strerror(e));
            if (k->peer) lei_logf(k->ctx, "cannot reach %s: %s", k->peer->addr, why);
            conn_close(k, why, 0);
            return;
        }
        ev_io_stop(k->ctx->loop, &k->wio);
        k->state = C_HELLO;
        send_hello(k, LEI_F_HELLO);
        ev_io_start(k->ctx->loop, &k->rio);
        return;
    }
    if (k->peer && k->peer->conn == k)
        peer_flush(k->peer);
    else
        ev_io_stop(k->ctx->loop, &k->wio);
}

static void accept_cb(struct ev_loop *loop, ev_io *w, int revents) {
    (void)loop;
    (void)revents;
    lei_ctx *c = w->data;
    for (int i = 0; i < 64; i++) {
        int fd = accept4(c->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
                lei_logf(c, "accept: %s", strerror(errno));
            return;
        }
        lei_conn *k = conn_new(c, fd, 0);
        if (!k) {
            close(fd);
            continue;
        }
        k->state = C_HELLO;
        ev_io_start(c->loop, &k->rio);
    }
}

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

static void live_conn_new(lei_conn *k) {
    lei_ctx *c = k->ctx;
    /* ev_time, not ev_now: the loop time is stale when the program has not
     * run the loop for a while (a dial from code that computed for seconds). */
    k->born = k->last_in = k->last_out = k->last_ping = ev_time();
    /* The timer's next expiry is never later than heartbeat from now while
     * some connection exists (see live_timer_cb): only start it here. */
    if (!ev_is_active(&c->hb)) live_arm(c, c->o.heartbeat);
}

/* Queues an empty PING or PONG frame behind whatever is queued. */
static void live_send(lei_peer *p, uint8_t type) {
    uint8_t hdr[LEI_FRAME_HDR];
    lei_frame_hdr(hdr, type, 0);
    lei_qitem *it = item_bytes(hdr, sizeof hdr, NULL, 0);
    if (!it) return;
    q_push(&p->q, it);
    p->lv.hb_out++;
    peer_flush(p);
}

static int live_frame(lei_conn *k, const lei_frame *f) {
    lei_peer *p = k->peer;
    if (f->len) {
        conn_close(k, "HEARTBEAT or PING frame with a body", 1);
        return -1;
    }
    p->lv.hb_in++;
    if (f->type == LEI_F_PING) live_send(p, LEI_F_HEARTBEAT);
    return k->dead ? -1 : 0;
}

/* When k's next PING (*ping) or HEARTBEAT, whichever is first, is due. */
static ev_tstamp live_due(const lei_ctx *c, const lei_conn *k, ev_tstamp *ping) {
    double hb = c->o.heartbeat;
    *ping = k->last_in + hb * (1 + c->o.heartbeat_misses) / 2;
    if (*ping < k->last_ping + hb) *ping = k->last_ping + hb; /* one per hb at most */
    return k->last_out + hb < *ping ? k->last_out + hb : *ping;
}

static void live_timer_cb(struct ev_loop *loop, ev_timer *w, int revents) {
    (void)revents;
    lei_ctx *c = w->data;
    ev_tstamp now = ev_now(loop), hb = c->o.heartbeat, dead = live_dead_after(c);
    ev_tstamp next = now + hb;
    int any = 0;
    lei_conn *k = c->conns;
    while (k) {
        lei_conn *nk = k->next; /* conn_close may free k */
        if (k->dead) {
            k = nk;
            continue;
        }
        const char *who = k->peer ? k->peer->addr : "an unidentified peer";
        char why[200];
        if (k->state != C_UP) {
            if (now - k->born >= dead &&
                !live_fd_ready(k->fd, k->state == C_CONNECTING ? POLLOUT : POLLIN)) {
                snprintf(why, sizeof why, "%s %s: no handshake within %.1f s",
                         k->state == C_CONNECTING ? "connecting to" : "handshake with", who,
                         now - k->born);
                lei_logf(c, "closing connection: %s", why);
                conn_close(k, why, 0);
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
            } else {
                snprintf(why, sizeof why, "no heartbeat from %s for %.1f s", who, now - k->last_in);
                lei_logf(c, "closing connection: %s (heartbeat %g s, misses %g)", why, hb,
                         c->o.heartbeat_misses);
                if (k->peer) k->peer->lv.timeouts++;
                conn_close(k, why, 0);
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
            if (k->dead) {
                conn_unlink_free(k);
                k = nk;
                continue;
            }
            k->last_out = now; /* even if the kernel did not take it all yet */
            due = live_due(c, k, &ping);
        }
        if (!k->dead) {
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

/* Redial backoff: retry_interval after a loss, doubling with every dial that
 * did not reach a handshake, at most retry_max. */
static int live_may_dial(lei_peer *p) {
    lei_ctx *c = p->ctx;
    double wait = c->o.retry_interval;
    for (int i = 0; i < p->lv.fails && wait < c->o.retry_max; i++) wait *= 2;
    if (wait > c->o.retry_max && c->o.retry_max > 0) wait = c->o.retry_max;
    if (ev_now(c->loop) - p->last_fail < wait) return 0;
    if (p->lv.fails < 64) p->lv.fails++;
    return 1;
}

/* A handshake completed.  Sequence numbers belong to one incarnation of the
 * peer: a new process at the same address starts again at 1. */
static void live_peer_up(lei_peer *p, uint64_t incarnation) {
    p->lv.fails = 0;
    if (p->lv.incarnation == incarnation) return;
    p->lv.incarnation = incarnation;
    if (p->lv.seqs) memset(p->lv.seqs, 0, (size_t)p->lv.seqcap * sizeof *p->lv.seqs);
    p->lv.seqn = 0;
    p->lv.seqhit = 0;
}

static void live_free(lei_peer *p) {
    free(p->lv.seqs);
    p->lv.seqs = NULL;
}

void lei_chan_set_local(lei_ctx *c, uint32_t id, int on) {
    lei_chan *ch = lei_chan_get(c, id);
    if (!ch) return;
    if (on && !ch->local) ch->epoch++;
    ch->local = on;
}

static uint32_t seq_hash(uint32_t chid, uint64_t producer) {
    uint64_t h = (producer ^ ((uint64_t)chid << 32)) * 0x9E3779B97F4A7C15ull;
    return (uint32_t)(h >> 32);
}

/* The entry of (chid, producer), created when missing; NULL without memory. */
static lei_seqent *seq_slot(lei_live *lv, uint32_t chid, uint64_t producer) {
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
static int live_seq(lei_ctx *c, lei_peer *p, lei_chan *ch, uint64_t producer, uint64_t seq) {
    if (ch->derived || !p) return 0;
    lei_seqent *e = seq_slot(&p->lv, ch->id, producer);
    if (!e) return 0;
    uint64_t last = e->last;
    if (e->epoch != ch->epoch) { /* first event since local consumers appeared */
        e->epoch = ch->epoch;
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

/* ---- life cycle -------------------------------------------------------- */

/* Closing: once k's queue is written, our side ends with a FIN; reading
 * goes on until the remote closes (it has then read all we sent). */
static void conn_fin(lei_conn *k) {
    if (k->fin || k->dead || k->state != C_UP) return;
    lei_peer *p = k->peer;
    if (p && (p->conn != k || p->q.head)) return;
    k->fin = 1;
    shutdown(k->fd, SHUT_WR);
}

void lei_ctx_shutdown(lei_ctx *c) {
    c->closing = 1;
    /* Closing from a handler that holds its connection: read on, so that
     * the remote's FIN is seen (what comes is for closed consumers now). */
    for (int i = 0; i < c->npeers; i++)
        if (c->peers[i]->held) lei_resume(c, c->peers[i], 0);
    for (lei_conn *k = c->conns, *nk; k; k = nk) {
        nk = k->next; /* a failed write frees k */
        if (k->dead) continue;
        if (k->state == C_UP && k->peer && k->peer->conn == k)
            peer_flush(k->peer); /* FIN once written */
        else if (k->state == C_UP || (!k->outbound && !k->peer))
            conn_fin(k);
    }
}

void lei_ctx_stop_listening(lei_ctx *c) {
    if (c->lfd < 0) return;
    ev_io_stop(c->loop, &c->lio);
    close(c->lfd);
    c->lfd = -1;
}

int lei_ctx_pending(lei_ctx *c, uint64_t *events, uint64_t *bytes) {
    int open = 0;
    *events = *bytes = 0;
    for (lei_conn *k = c->conns; k; k = k->next)
        if (!k->dead) open++;
    for (int i = 0; i < c->npeers; i++) {
        lei_peer *p = c->peers[i];
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

lei_ctx *lei_ctx_new(const lei_opts *o, const lei_hooks *h) {
    lei_ctx *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    if (o)
        c->o = *o;
    else
        lei_opts_default(&c->o);
    c->h = *h;
    c->loop = ev_loop_new(EVFLAG_AUTO);
    if (!c->loop) {
        free(c);
        return NULL;
    }
    c->lfd = -1;
    if (getrandom(&c->incarnation, sizeof c->incarnation, 0) != sizeof c->incarnation)
        c->incarnation = (uint64_t)getpid() << 32 ^ (uint64_t)ev_time();
    ev_prepare_init(&c->prep, prepare_cb);
    c->prep.data = c;
    ev_prepare_start(c->loop, &c->prep);
    ev_unref(c->loop); /* the flusher alone does not keep the loop alive */
    ev_idle_init(&c->idle, idle_cb);
    c->idle.data = c;
    ev_idle_init(&c->kick, kick_cb);
    c->kick.data = c;
    ev_timer_init(&c->expiry_w, expiry_cb, AWAIT_IN_SECONDS, 0.);
    c->expiry_w.data = c;
    ev_init(&c->hb, live_timer_cb);
    c->hb.data = c;
    return c;
}

int lei_ctx_listen(lei_ctx *c, const char *host, int port, const char **err) {
    struct sockaddr_in sa;
    socklen_t sl = sizeof sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
        *err = "listen address must be an IPv4 address";
        return -1;
    }
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int one = 1;
    if (fd < 0) {
        *err = strerror(errno);
        return -1;
    }
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) || listen(fd, 512) ||
        getsockname(fd, (struct sockaddr *)&sa, &sl)) {
        *err = strerror(errno);
        close(fd);
        return -1;
    }
    c->lfd = fd;
    snprintf(c->addr, sizeof c->addr, "%s:%u", host, ntohs(sa.sin_port));
    ev_io_init(&c->lio, accept_cb, fd, EV_READ);
    c->lio.data = c;
    ev_io_start(c->loop, &c->lio);
    return 0;
}

void lei_ctx_free(lei_ctx *c) {
    if (!c) return;
    lei_flush(c);
    while (c->conns) {
        lei_conn *k = c->conns;
        k->busy = 0;
        if (k->dead) {
            conn_unlink_free(k);
            continue;
        }
        if (k->peer) k->peer->conn = NULL;
        k->peer = NULL;
        conn_close(k, "context closed", 0);
    }
    lei_qitem *it;
    while ((it = q_pop(&c->lq))) item_free(c, it);
    while ((it = q_pop(&c->ldef))) item_free(c, it);
    for (int i = 0; i < c->npeers; i++) {
        lei_peer *p = c->peers[i];
        q_clear(c, p, 0);
        live_free(p);
        free(p->bound);
        free(p);
    }
    free(c->peers);
    for (uint32_t i = 0; i < c->nchans; i++) {
        free(c->chans[i]->name);
        free(c->chans[i]->dests);
        free(c->chans[i]);
    }
    free(c->chans);
    free(c->hash);
    while (c->syncs) lei_sync_free(c, c->syncs);
    lei_ctx_stop_listening(c);
    ev_ref(c->loop);
    ev_prepare_stop(c->loop, &c->prep);
    ev_idle_stop(c->loop, &c->idle);
    ev_idle_stop(c->loop, &c->kick);
    ev_timer_stop(c->loop, &c->expiry_w);
    ev_timer_stop(c->loop, &c->hb);
    free(c->notes);
    ev_loop_destroy(c->loop);
    free(c);
}
