/* test_shared.c: one batch for many destinations (peer.c "shared
 * batches"): a channel's small async events are written once and every
 * destination's queue refers to them; each destination still gets exactly
 * its events, in order, and the queue policies (drop_newest, drop_oldest)
 * count exactly what each destination lost, with destinations read at
 * different speeds and one not read until the end.
 * One producer context and NDEST consumer contexts in this process, on
 * loopback, each on its own loop, pumped by hand.
 * Prints "N passed, N failed" (read by .ci/run).
 *
 * Leans on the core's C files (ctx.h, and ctx_int.h for the queues), no Lua.
 */
#define _GNU_SOURCE
#include "ctx_int.h"

#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "test.h"

#define NDEST 8
#define NPROD 3

typedef struct side {
    lei_ctx *c;
    uint64_t got[NPROD + 1];  /* events received per producer */
    uint64_t last[NPROD + 1]; /* the last seq per producer */
    int disorder;             /* a seq not above the last one of its producer */
    int bad;                  /* a payload not the one sent */
} side;

static void nolog(void *ud, const char *msg) {
    (void)ud;
    if (getenv("LECHO_TEST_LOG")) fprintf(stderr, "log: %s\n", msg);
}

/* The payload of (producer, seq): a string of 40..103 bytes whose bytes
 * tell both. */
static size_t payload(uint64_t producer, uint64_t seq, uint8_t *out) {
    size_t n = 40 + (size_t)((seq * 7 + producer) % 64);
    for (size_t i = 0; i < n; i++) out[i] = (uint8_t)(seq * 31 + producer * 17 + i);
    return n;
}

static int on_event(void *ud, lei_peer *from, uint32_t chid, uint64_t producer, uint64_t seq,
                    uint64_t sync, const uint8_t *p, size_t n) {
    side *s = ud;
    (void)chid, (void)sync;
    if (!from || producer < 1 || producer > NPROD) return 0;
    uint8_t want[128];
    size_t wn = payload(producer, seq, want);
    uint64_t len;
    size_t used;
    if (!(n > 1 && p[0] == 5 && lei_varint_decode(p + 1, n - 1, &len, &used) == 0 && len == wn &&
          1 + used + len == n && memcmp(p + 1 + used, want, wn) == 0))
        s->bad++;
    if (seq <= s->last[producer]) s->disorder++;
    s->last[producer] = seq;
    s->got[producer]++;
    return 0;
}

static void side_init(side *s, size_t queue_limit, size_t batch_bytes) {
    memset(s, 0, sizeof *s);
    lei_hooks h;
    memset(&h, 0, sizeof h);
    h.ud = s;
    h.event = on_event;
    h.log = nolog;
    lei_opts o;
    lei_opts_default(&o);
    o.retry_interval = 30;
    o.retry_max = 30;
    o.heartbeat = 0;
    if (queue_limit) o.queue_limit = queue_limit;
    if (batch_bytes) o.batch_bytes = batch_bytes;
    s->c = lei_ctx_new(&o, &h);
    char err[160];
    CHECK(lei_accept_listen(s->c, "127.0.0.1:0", NULL, NULL, err) == 0);
}

static void pump(side *s) { ev_run(lei_ctx_loop(s->c), EVRUN_NOWAIT); }

static lei_msg *msg_of(uint64_t producer, uint64_t seq) {
    uint8_t b[128];
    size_t n = payload(producer, seq, b);
    lei_msg *m = lei_msg_new();
    lei_enc_string(&m->own, (const char *)b, n);
    lei_msg_sync(m);
    return m;
}

static side prod, cons[NDEST];
static uint32_t pch;
static uint64_t seqs[NPROD + 1];
static int submit_fails;

static void submit_on(uint32_t chid, uint64_t producer, int policy) {
    lei_msg *m = msg_of(producer, ++seqs[producer]);
    const char *err;
    uint64_t sid = 0;
    if (lei_submit(prod.c, chid, producer, seqs[producer], m, 0, policy, &sid, &err)) submit_fails++;
    lei_msg_release(m, NULL, NULL);
}

static void submit(uint64_t producer, int policy) { submit_on(pch, producer, policy); }

static lei_peer *dest(int k) { return lei_peer_get(prod.c, lei_ctx_addr(cons[k].c), 0); }

static uint64_t received(int k) {
    uint64_t n = 0;
    for (int j = 1; j <= NPROD; j++) n += cons[k].got[j];
    return n;
}

static void setup(size_t queue_limit, size_t batch_bytes) {
    side_init(&prod, queue_limit, batch_bytes);
    const char *addrs[NDEST];
    for (int k = 0; k < NDEST; k++) {
        side_init(&cons[k], 0, 0);
        lei_chan_set_local(cons[k].c, lei_chan_open(cons[k].c, "ns/s", 4), 1);
        lei_chan_set_local(cons[k].c, lei_chan_open(cons[k].c, "ns/u", 4), 1);
        lei_chan_set_local(cons[k].c, lei_chan_open(cons[k].c, "ns/v", 4), 1);
        addrs[k] = lei_ctx_addr(cons[k].c);
    }
    pch = lei_chan_open(prod.c, "ns/s", 4);
    lei_peer_set_dests(prod.c, pch, addrs, NDEST);
    memset(seqs, 0, sizeof seqs);
}

static void teardown(void) {
    lei_ctx_free(prod.c);
    for (int k = 0; k < NDEST; k++) lei_ctx_free(cons[k].c);
}

/* Pumps everyone until every destination has `want` events or drops
 * accounting for them (want: per destination), or 20 s. */
static int settle(uint64_t want) {
    for (int round = 0; round < 200000; round++) {
        pump(&prod);
        int done = 1;
        for (int k = 0; k < NDEST; k++) {
            pump(&cons[k]);
            lei_stats_peer st;
            lei_peer_stats(dest(k), &st);
            if (received(k) + st.st.drops < want || st.queue_events) done = 0;
        }
        if (done) return 1;
        if (round % 64 == 63) {
            struct timespec ts = {0, 100000};
            nanosleep(&ts, NULL);
        }
    }
    return 0;
}

/* The bytes of shared buffers p's queue keeps alive. */
static size_t shared_alive(lei_peer *p) {
    size_t alive = 0;
    lei_msg *prev = NULL;
    for (lei_qitem *it = p->q.head; it; it = it->next)
        if (it->shared && it->msg != prev) {
            alive += it->msg->own.cap;
            prev = it->msg;
        }
    return alive;
}

/* What peer.c promises for it: twice its queued bytes plus batch_bytes
 * when an item is made, and the head item, being written, may keep a
 * buffer alive for the bytes it has left (twice BATCH_MAX of slack). */
static size_t shared_bound(lei_peer *p) {
    return 2 * p->q.bytes + lei_ctx_opts(prod.c)->batch_bytes + 2 * BATCH_MAX;
}

/* The events of one submit loop are written once: every destination's
 * queue refers to the same buffer, and all of them arrive intact, in
 * order. */
static void test_one_copy(void) {
    setup(0, 0);
    for (int i = 0; i < 300; i++) submit(1, LEI_BLOCK);
    lei_msg *first = NULL;
    int same = 1, queued = 1;
    for (int k = 0; k < NDEST; k++) {
        lei_peer *p = dest(k);
        if (!p || !p->q.tail) {
            queued = 0;
            continue;
        }
        if (!first) first = p->q.tail->msg;
        if (p->q.tail->msg != first) same = 0;
    }
    CHECK(submit_fails == 0);
    CHECK(queued);
    CHECK(same); /* before shared batches: one batch of its own per destination */
    CHECK(settle(300));
    /* Then channels interleaved toward the same peers: ns/s and ns/u to
     * all eight, ns/v to the first only.  Events of one channel cannot
     * form runs in a peer's queue then: copies in its own batches, not an
     * item per event; all delivered intact, in order. */
    uint32_t uch = lei_chan_open(prod.c, "ns/u", 4), vch = lei_chan_open(prod.c, "ns/v", 4);
    const char *addrs[NDEST];
    for (int k = 0; k < NDEST; k++) addrs[k] = lei_ctx_addr(cons[k].c);
    lei_peer_set_dests(prod.c, uch, addrs, NDEST);
    lei_peer_set_dests(prod.c, vch, addrs, 1);
    for (int i = 0; i < 300; i++) {
        submit(1, LEI_BLOCK);
        submit_on(uch, 2, LEI_BLOCK);
        submit_on(vch, 3, LEI_BLOCK);
    }
    int items_ok = 1;
    for (int k = 0; k < NDEST; k++)
        if (dest(k)->q.count > 40) items_ok = 0; /* 600-900 events, 60-100 KiB */
    CHECK(items_ok);
    CHECK(settle(600 + 300));
    for (int round = 0; round < 100000 && received(0) < 1200; round++) {
        pump(&prod);
        pump(&cons[0]);
    }
    for (int k = 0; k < NDEST; k++) {
        lei_stats_peer st;
        lei_peer_stats(dest(k), &st);
        CHECK(cons[k].got[1] == 600);
        CHECK(cons[k].got[2] == 300);
        CHECK(cons[k].got[3] == (k == 0 ? 300u : 0u));
        CHECK(st.st.drops == 0);
        CHECK(cons[k].disorder == 0);
        CHECK(cons[k].bad == 0);
    }
    teardown();
}

/* Two producers of the channel, one dropping its newest events when a
 * destination's queue is full, the other the oldest; destination k read
 * every 2^k rounds, the last one only at the end: what each destination
 * got plus what was counted dropped for it is exactly what was sent, in
 * order, and the channel's drops are the sum of the destinations'. */
static void test_policies_exact(void) {
    setup(24 * 1024, 4096);
    int bloated = 0;
    /* everyone connected first */
    submit(1, LEI_BLOCK);
    CHECK(settle(1));
    /* the slowest destinations' sockets small, so that their queues fill */
    for (int k = NDEST - 2; k < NDEST; k++) {
        int sz = 4096;
        lei_peer *p = dest(k);
        CHECK(p->conn && setsockopt(p->conn->fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz) == 0);
        lei_peer *back = lei_peer_get(cons[k].c, lei_ctx_addr(prod.c), 0);
        CHECK(back && back->conn && setsockopt(back->conn->fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof sz) == 0);
    }
    uint64_t sent = 1;
    for (int round = 0; round < 400; round++) {
        for (int i = 0; i < 150; i++) {
            submit(1, LEI_DROP_NEWEST);
            submit(2, LEI_DROP_OLDEST);
            sent += 2;
        }
        pump(&prod);
        for (int k = 0; k < NDEST - 1; k++)
            if (round % (1 << k) == 0) pump(&cons[k]);
        for (int k = 0; k < NDEST; k++)
            if (shared_alive(dest(k)) > shared_bound(dest(k))) bloated++;
    }
    CHECK(bloated == 0);
    CHECK(submit_fails == 0);
    CHECK(settle(sent));
    uint64_t sum = 0, dropped_any = 0, dropped_last = 0;
    for (int k = 0; k < NDEST; k++) {
        lei_stats_peer st;
        lei_peer_stats(dest(k), &st);
        if (received(k) + st.st.drops != sent)
            fprintf(stderr, "destination %d: received %llu + drops %llu != sent %llu\n", k,
                    (unsigned long long)received(k), (unsigned long long)st.st.drops,
                    (unsigned long long)sent);
        CHECK(received(k) + st.st.drops == sent);
        CHECK(st.st.ev_out >= received(k));
        CHECK(cons[k].disorder == 0);
        CHECK(cons[k].bad == 0);
        sum += st.st.drops;
        if (st.st.drops) dropped_any++;
        if (k == NDEST - 1) dropped_last = st.st.drops;
    }
    CHECK(dropped_any > 0);   /* the policies did drop */
    CHECK(dropped_last > 0);  /* the destination never read meanwhile most */
    CHECK(lei_chan_get(prod.c, pch)->drops == sum);
    teardown();
}

/* A destination whose runs are broken by its drops keeps no more shared
 * buffers alive than its bytes allow.  Here one never connected (a socket
 * that never answers: its queue is kept, not written), its queue made of
 * small items first (sync events between async ones: each async one a run
 * of its own), then full, drained by hand an item at a time now and then
 * while the channel's other destination takes everything: what it admits
 * is a frame or two per 16 KiB written, and an item per admission would
 * keep a whole shared buffer alive for each. */
static void test_sparse_bound(void) {
    setup(64 * 1024, 4096);
    int mute = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    socklen_t al = sizeof a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(bind(mute, (struct sockaddr *)&a, sizeof a) == 0 && listen(mute, 4) == 0 &&
          getsockname(mute, (struct sockaddr *)&a, &al) == 0);
    char maddr[64];
    snprintf(maddr, sizeof maddr, "127.0.0.1:%d", ntohs(a.sin_port));
    const char *addrs[2] = {lei_ctx_addr(cons[0].c), maddr};
    lei_peer_set_dests(prod.c, pch, addrs, 2);
    lei_peer *m = lei_peer_get(prod.c, maddr, 0);
    CHECK(m != NULL);
    int bloated = 0, over = 0;
    size_t most = 0;
    for (int i = 0; i < 400 && m; i++) {
        lei_msg *sm = msg_of(2, ++seqs[2]);
        const char *err;
        uint64_t sid = 0;
        if (lei_submit(prod.c, pch, 2, seqs[2], sm, 1, LEI_BLOCK, &sid, &err)) submit_fails++;
        lei_msg_release(sm, NULL, NULL);
        submit(1, LEI_DROP_NEWEST);
    }
    for (int i = 0; i < 40000 && m; i++) {
        submit(1, LEI_DROP_NEWEST);
        if (i % 64 == 0) {
            pump(&prod);
            pump(&cons[0]);
        }
        /* its two head items written per 160 events (~16 KiB) submitted */
        if (i % 160 == 159 && !lei_peer_is_up(m))
            for (int j = 0; j < 2 && m->q.head; j++) lei_peer_queue_took(m, m->q.head->size - m->woff);
        if (shared_alive(m) > shared_bound(m)) bloated++;
        if (shared_alive(m) > most) most = shared_alive(m);
        if (m->q.bytes > 64 * 1024 + 400 * 256) over++;
    }
    CHECK(submit_fails == 0);
    CHECK(m && m->st.drops > 0);
    CHECK(over == 0);
    CHECK(bloated == 0);
    if (getenv("LECHO_TEST_LOG")) fprintf(stderr, "sparse: most shared bytes alive %zu\n", most);
    teardown();
    close(mute);
}

int main(void) {
    test_one_copy();
    test_policies_exact();
    test_sparse_bound();
    return TEST_SUMMARY();
}
