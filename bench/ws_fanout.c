/* bench/ws_fanout.c: K WebSocket subscribers in one process (epoll), for the
 * gateway row of bench/README.md: lecho-gateway's and nats-server's
 * WebSocket listeners fanning 1 KiB events out to 100 clients.
 *
 *   ws_fanout gateway|nats PORT K N SECONDS
 *
 * Opens K connections to 127.0.0.1:PORT, does the RFC 6455 handshake,
 * subscribes each (gateway: {"op":"sub","ch":"bench.ws"} and its reply;
 * nats: CONNECT, SUB bench.ws 1, PING and its PONG), prints "ready", then
 * counts events per client until every client has N or SECONDS pass, and
 * prints one JSON line: clients, events (all clients), min (the fewest one
 * client got), seconds (from the first event to the last), drops (events
 * the gateway said it dropped).  Server frames are unmasked; a message
 * split over frames or several NATS messages in one frame are handled.
 * The client masks its frames with a fixed key (a test client). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define BUF (1 << 20)

typedef struct {
    int fd;
    unsigned char *buf; /* owned: read buffer */
    size_t len;
    int upgraded, ready;
    long events, drops;
    /* nats: the text stream inside the frames */
    char *txt; /* owned */
    size_t tlen;
} cl_t;

static int nats;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void send_all(int fd, const void *p, size_t n) {
    const char *c = p;
    while (n > 0) {
        ssize_t r = send(fd, c, n, MSG_NOSIGNAL);
        if (r < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        if (r <= 0) {
            perror("send");
            exit(1);
        }
        c += r;
        n -= (size_t)r;
    }
}

static void send_frame(int fd, const char *s, size_t n) {
    unsigned char h[8 + 4 + 65536];
    size_t o = 0;
    h[o++] = 0x81;
    if (n < 126) h[o++] = 0x80 | (unsigned char)n;
    else {
        h[o++] = 0x80 | 126;
        h[o++] = (unsigned char)(n >> 8);
        h[o++] = (unsigned char)n;
    }
    unsigned char key[4] = { 1, 2, 3, 4 };
    memcpy(h + o, key, 4);
    o += 4;
    for (size_t i = 0; i < n; i++) h[o + i] = (unsigned char)s[i] ^ key[i & 3];
    send_all(fd, h, o + n);
}

/* nats: the text stream: MSG lines and payloads, PONG, PING */
static void nats_text(cl_t *c, const unsigned char *p, size_t n) {
    c->txt = realloc(c->txt, c->tlen + n + 1);
    memcpy(c->txt + c->tlen, p, n);
    c->tlen += n;
    size_t off = 0;
    for (;;) {
        char *s = c->txt + off;
        size_t left = c->tlen - off;
        char *nl = memchr(s, '\n', left);
        if (!nl) break;
        if (!strncmp(s, "MSG ", 4)) {
            /* MSG subj sid len\r\n payload \r\n */
            char *sp = nl - 1;
            while (sp > s && sp[-1] != ' ') sp--;
            size_t plen = strtoul(sp, NULL, 10);
            size_t need = (size_t)(nl - s) + 1 + plen + 2;
            if (left < need) break;
            c->events++;
            off += need;
        } else {
            if (!strncmp(s, "PONG", 4)) c->ready = 1;
            else if (!strncmp(s, "PING", 4)) send_frame(c->fd, "PONG\r\n", 6);
            else if (!strncmp(s, "-ERR", 4)) fprintf(stderr, "nats: %.*s\n", (int)(nl - s), s);
            off += (size_t)(nl - s) + 1;
        }
    }
    memmove(c->txt, c->txt + off, c->tlen - off);
    c->tlen -= off;
}

static void gateway_msg(cl_t *c, const unsigned char *p, size_t n) {
    if (n > 6 && !memcmp(p, "{\"ch\":", 6)) {
        c->events++;
    } else if (n > 11 && !memcmp(p, "{\"dropped\":", 11)) {
        c->drops += strtol((const char *)p + 11, NULL, 10);
    } else if (memmem(p, n, "\"ok\":true", 9)) {
        c->ready = 1;
    } else if (memmem(p, n, "\"error\"", 7)) {
        fprintf(stderr, "gateway: %.*s\n", (int)n, p);
    }
}

/* whole frames out of the read buffer */
static void frames(cl_t *c) {
    size_t o = 0;
    for (;;) {
        if (c->len - o < 2) break;
        unsigned char *h = c->buf + o;
        size_t len = h[1] & 0x7f, hl = 2;
        if (len == 126) {
            if (c->len - o < 4) break;
            len = (size_t)h[2] << 8 | h[3];
            hl = 4;
        } else if (len == 127) {
            if (c->len - o < 10) break;
            len = 0;
            for (int i = 0; i < 8; i++) len = len << 8 | h[2 + i];
            hl = 10;
        }
        if (c->len - o < hl + len) break;
        int op = h[0] & 0x0f;
        if (op == 8) {
            fprintf(stderr, "closed by the server: %d %.*s\n", len >= 2 ? h[hl] << 8 | h[hl + 1] : 0,
                    (int)(len > 2 ? len - 2 : 0), h + hl + 2);
            exit(1);
        }
        if (op == 1 || op == 2 || op == 0) {
            if (nats) nats_text(c, h + hl, len);
            else gateway_msg(c, h + hl, len);
        }
        o += hl + len;
    }
    memmove(c->buf, c->buf + o, c->len - o);
    c->len -= o;
}

/* Closes the k clients' sockets and frees their buffers and cs. */
static void clients_free(cl_t *cs, int k) {
    for (int i = 0; i < k; i++) {
        if (cs[i].fd > 0) close(cs[i].fd);
        free(cs[i].buf);
        free(cs[i].txt);
    }
    free(cs);
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: ws_fanout gateway|nats PORT K N SECONDS\n");
        return 2;
    }
    nats = !strcmp(argv[1], "nats");
    int port = atoi(argv[2]), k = atoi(argv[3]);
    long n = atol(argv[4]);
    double bound = atof(argv[5]);
    /* the clients and their buffers: owned by main, freed on every way out
     * (clients_free), so that make asan's leak check sees nothing left */
    cl_t *cs = calloc((size_t)k, sizeof *cs);
    int rc = 1;
    if (!cs) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    int ep = epoll_create1(0);
    for (int i = 0; i < k; i++) {
        cl_t *c = &cs[i];
        c->buf = malloc(BUF);
        c->fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (connect(c->fd, (struct sockaddr *)&a, sizeof a) < 0) {
            perror("connect");
            goto out;
        }
        char req[512];
        int m = snprintf(req, sizeof req,
                         "GET %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                         "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
                         nats ? "/" : "/ws", port);
        send_all(c->fd, req, (size_t)m);
        /* the response head, then any bytes after it stay in buf */
        for (;;) {
            ssize_t r = recv(c->fd, c->buf + c->len, BUF - c->len, 0);
            if (r <= 0) {
                fprintf(stderr, "handshake: connection closed\n");
                goto out;
            }
            c->len += (size_t)r;
            unsigned char *e = memmem(c->buf, c->len, "\r\n\r\n", 4);
            if (e) {
                if (memcmp(c->buf, "HTTP/1.1 101", 12)) {
                    fprintf(stderr, "handshake refused: %.*s\n", 40, c->buf);
                    goto out;
                }
                size_t hl = (size_t)(e - c->buf) + 4;
                memmove(c->buf, c->buf + hl, c->len - hl);
                c->len -= hl;
                break;
            }
        }
        if (nats) {
            const char *sub = "CONNECT {\"verbose\":false,\"pedantic\":false,\"echo\":false}\r\nSUB bench.ws 1\r\nPING\r\n";
            send_frame(c->fd, sub, strlen(sub));
        } else {
            const char *sub = "{\"op\":\"sub\",\"id\":1,\"ch\":\"bench.ws\"}";
            send_frame(c->fd, sub, strlen(sub));
        }
        int one = 1, rb = 4 << 20;
        setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        setsockopt(c->fd, SOL_SOCKET, SO_RCVBUF, &rb, sizeof rb);
        struct epoll_event ev = { .events = EPOLLIN, .data.u32 = (uint32_t)i };
        epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev);
        frames(c);
    }
    double t_end = now() + 30;
    int ready = 0;
    struct epoll_event evs[256];
    double first = 0, last = 0;
    int started = 0;
    for (;;) {
        if (!started) {
            ready = 0;
            for (int i = 0; i < k; i++) ready += cs[i].ready;
            if (ready == k) {
                printf("ready\n");
                fflush(stdout);
                started = 1;
                t_end = now() + bound;
            } else if (now() > t_end) {
                fprintf(stderr, "only %d of %d subscribed\n", ready, k);
                goto out;
            }
        }
        long minev = -1;
        if (started) {
            for (int i = 0; i < k; i++)
                if (minev < 0 || cs[i].events + cs[i].drops < minev) minev = cs[i].events + cs[i].drops;
            if (minev >= n || now() > t_end) break;
        }
        int ne = epoll_wait(ep, evs, 256, 100);
        for (int j = 0; j < ne; j++) {
            cl_t *c = &cs[evs[j].data.u32];
            ssize_t r = recv(c->fd, c->buf + c->len, BUF - c->len, MSG_DONTWAIT);
            if (r == 0) {
                fprintf(stderr, "connection closed by the server\n");
                goto out;
            }
            if (r < 0) continue;
            c->len += (size_t)r;
            long before = c->events;
            frames(c);
            if (c->events > before) {
                last = now();
                if (first == 0) first = last;
            }
        }
    }
    long total = 0, minev = -1, drops = 0;
    for (int i = 0; i < k; i++) {
        total += cs[i].events;
        drops += cs[i].drops;
        if (minev < 0 || cs[i].events < minev) minev = cs[i].events;
    }
    printf("{\"clients\":%d,\"events\":%ld,\"min\":%ld,\"drops\":%ld,\"seconds\":%.6f}\n", k, total, minev, drops,
           last > first ? last - first : 0.0);
    rc = 0;
out:
    if (ep >= 0) close(ep);
    clients_free(cs, k);
    return rc;
}
