/* lua_rec.c: a recorder in the producer's own process, off its thread
 * (issue 29, binding).
 *
 * `ctx:recorder(path, ...)` (lua/lecho/recorder.lua) makes one; a producer
 * handle given to it (h:set_record, lua_prod.c) hands each event it
 * submits to lb_rec_event, on the producer's thread, once the core took
 * it: the event's record of doc/recording.md (length, a checksum left at
 * 0, kind `E`, indexes, sequence, time, flags, then the encoded value: the
 * bytes the wire gets) is in the 64 KiB chunk being filled.  An event
 * staged (lua_prod.c dp_stage, dp_submit_bytes: every Lua submit the FFI
 * encoder takes, and the C API's) is copied once, straight into the chunk
 * after room for its record's head (lb_rec_stage), and the message the
 * core, the wire and the queues get borrows those bytes (lei_msg.lent)
 * instead of a malloc'd buffer of its own; the submit then only writes the
 * head.  Another event (a value the FFI encoder does not take, a staged
 * one that cannot be placed) is copied in as a whole record, one memcpy
 * of the value.  A full chunk, one 50 ms old at the next event, and
 * every flush (and the 50 ms tick from Lua) are handed to the writer
 * thread through a ring; it fills in each record's CRC-32, rotates past
 * max bytes, write()s, and gives the chunk back through a second ring.
 * So the producer pays one copy, no checksum, no system call, no second TCP
 * destination; the file is the one `lecho record` writes (Lua wrote its
 * magic line and header, recording.writer), and a crash leaves what a
 * crash of `lecho record` leaves: whole records, and at worst one torn
 * one at the end (a write() cut short).
 *
 * Threads: the writer thread touches no Lua state, no libev, no lei_ctx:
 * only the chunks handed to it, its file and its part of this struct.  The
 * two rings are single-producer single-consumer: each counter is written
 * by one side (release) and read by the other (acquire), no lock on an
 * event's path; a chunk belongs to the side that took it from a ring.  The
 * mutex and condition variables only serve to sleep and wake: the writer
 * naps 2 ms after it found work, doubling to 50 ms while it finds none
 * (what was handed over is in the file within 50 ms), and is woken when a
 * quarter of the buffer waits, a flush or close asks, or the producer
 * waits for room.  (Woken per chunk, the futex wake cost the producer
 * more than the copy in this VM.)
 *
 * Memory: every chunk (being filled, in a ring, spare) counts in nbytes,
 * within limit (ctx:recorder's buffer_bytes, default 8 MiB; an event
 * larger than a chunk takes one its size, and one larger than the limit
 * alone may take it while no other chunk is held).  At the bound the
 * recorder's policy acts: "block" waits in the submit for the writer to
 * give a chunk back (the producer runs at the disk's pace, nothing lost);
 * "drop" does not record the event and counts it (stats dropped; its
 * sequence number is missing from the file, so `lecho replay --check`
 * names the gap).  A write error (disk full, EFBIG) stops the writing:
 * the events after it are counted as lost, the error kept for stats and
 * said once in the log (lecho.recorder), the producer never blocked by it.
 *
 * Lent bytes: a chunk whose bytes a message borrows is reused only once
 * the writer wrote it and the last such message is gone (rec_lent_done,
 * called by lei_msg_release on the context's thread: the wire wrote it, a
 * queue dropped it, a staged one was never submitted).  Back from the
 * writer before that, it is held (r->held): its bytes count in held_bytes,
 * not in nbytes, since only the loop, not the writer, lets them go and a
 * submit waiting for room must not wait for them.  They are the bytes
 * the queues hold (which would otherwise be buffers of the messages' own),
 * and a queue holds a run of events: it keeps alive the chunks its events
 * are in, and one more at most.  An event is staged in place only while
 * held_bytes is under the limit; past it (a consumer that stopped
 * reading, a local handler keeping messages) events are copied as above:
 * held chunks take less than twice the limit (the chunks in flight when
 * it was reached may all come back held), all chunks less than three
 * times it.
 *
 * Owners: the lb_rec is the userdata's memory (REC_MT); its chunks, rings,
 * path, header and kept records are malloc'd and owned by it (freed by
 * rec_close once the thread is joined), but a chunk some message still
 * borrows from, which rec_close leaves to it (owner NULL: the last lent
 * message frees it).  The userdata's environment pins the context
 * userdata; the context lists its open recorders (b->recs) and closes
 * them (flushed, joined) before it goes (lb_rec_close_all). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <libdeflate.h>

#include "lua_int.h"

#define REC_MT "lecho.recorder"
#define REC_CHUNK ((size_t)64 * 1024)
#define REC_AGE 0.05        /* s: a chunk older than this is handed over at the next event */
#define REC_HEAD_MAX 40     /* kind, 2 varint indexes, varint seq and time, flags */

typedef struct rec_chunk {
    struct rec_chunk *next; /* in spare */
    size_t len, cap;
    uint64_t nev;           /* its E records */
    /* the producer thread's (the writer reads none of these) */
    lb_rec *owner;          /* NULL once the recorder closed: its last lent message frees it */
    uint32_t lent;          /* messages whose bytes are in it (lb_rec_stage), alive */
    int held;               /* on owner->held: back from the writer, waiting for them */
    struct rec_chunk *hnext, **hprev;
    unsigned char data[];
} rec_chunk;

/* A single-producer single-consumer ring of chunks: each counter written
 * by one side (release), read by the other (acquire). */
typedef struct rec_ring {
    rec_chunk **slot;       /* owned: cap slots */
    uint32_t cap;
    uint32_t head, tail;    /* __atomic: head the reader's, tail the writer's */
} rec_ring;

typedef struct rec_kept {   /* a C or P record, written again after a rotation */
    struct rec_kept *next;
    size_t len;
    unsigned char data[];
} rec_kept;

struct lb_rec {
    lb_ctx *b;              /* the producer's context; NULL once closed */
    lb_rec *next_rec;       /* b->recs */
    int open;               /* the thread runs */
    int policy_drop;        /* the producer thread's: 1 drop, 0 block */
    double created;         /* ro: the header's time */
    /* the producer thread's */
    rec_chunk *cur;         /* owned: being filled */
    double cur_t0;
    uint32_t nchan, nprod;  /* indexes given */
    uint64_t submitted, dropped, blocked;
    rec_chunk *spare;       /* owned: given back, REC_CHUNK each, reused last in first out */
    size_t nbytes, limit;   /* bytes of all chunks (cur, both rings, spare), its bound */
    /* records made in place (lb_rec_stage): the value's bytes staged
     * straight into cur, lent to the message the wire gets */
    lei_msg *pend;          /* the staged message whose record waits at cur's end, or NULL */
    rec_chunk *pend_ch;     /* the chunk it is in */
    size_t pend_hn;         /* its record's head: 8 + kind .. flags */
    uint64_t pend_seq;      /* the sequence number its head says */
    uint32_t pend_c, pend_p; /* and its indexes */
    double pend_t;          /* its time */
    rec_chunk *held;        /* owned: written chunks whose lent messages live on (hnext) */
    size_t held_bytes;      /* their bytes: events are lent while under limit (past it, copied) */
    uint64_t inplace;       /* events recorded in place */
    /* between the threads, lock-free */
    rec_ring full;          /* producer -> writer: chunks to write, in order */
    rec_ring back;          /* writer -> producer: chunks written */
    /* __atomic, written by the writer: its figures; err once set stays */
    uint64_t written, lost, bytes;
    int rotations, err;
    char errmsg[192];       /* written before err is set (release) */
    /* __atomic, written by the producer: requests */
    int stop;
    uint64_t sync_req;      /* flush requests (a generation each) */
    int fsync_req;          /* the last request wants an fsync */
    uint64_t sync_done;     /* __atomic, the writer's */
    /* sleeping and waking (rare) */
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_room, cv_done;
    int wwait, pwait;       /* __atomic: the writer naps, the producer waits for room */
    pthread_t thr;
    /* the writer thread's */
    int fd;
    char *path;             /* owned */
    unsigned char *hdr;     /* owned: magic line + header record, for a rotated file */
    size_t hdrlen;
    uint64_t size, max;     /* the file's bytes, the bound */
    int keep;
    int seg_events;         /* events in the current file */
    rec_kept *kept, **kept_tail; /* owned: every C and P record so far */
};

#define LOAD(x) __atomic_load_n(&(x), __ATOMIC_ACQUIRE)
#define STORE(x, v) __atomic_store_n(&(x), (v), __ATOMIC_RELEASE)

static int ring_put(rec_ring *q, rec_chunk *ch) { /* 0, or -1 when full */
    uint32_t t = q->tail;
    if (t - LOAD(q->head) >= q->cap) return -1;
    q->slot[t % q->cap] = ch;
    STORE(q->tail, t + 1);
    return 0;
}
static rec_chunk *ring_get(rec_ring *q) {
    uint32_t h = q->head;
    if (h == LOAD(q->tail)) return NULL;
    rec_chunk *ch = q->slot[h % q->cap];
    STORE(q->head, h + 1);
    return ch;
}
static uint32_t ring_count(rec_ring *q) { return LOAD(q->tail) - LOAD(q->head); }
static uint32_t get_u32(const unsigned char *o) {
    return (uint32_t)o[0] | (uint32_t)o[1] << 8 | (uint32_t)o[2] << 16 | (uint32_t)o[3] << 24;
}

static void wake(pthread_mutex_t *mu, pthread_cond_t *cv) {
    pthread_mutex_lock(mu);
    pthread_cond_broadcast(cv);
    pthread_mutex_unlock(mu);
}

static void deadline_in(struct timespec *ts, long ms) {
    clock_gettime(CLOCK_REALTIME, ts);
    ts->tv_nsec += ms * 1000000L;
    ts->tv_sec += ts->tv_nsec / 1000000000L;
    ts->tv_nsec %= 1000000000L;
}


/* ---- the writer thread ---- */

static void set_err(lb_rec *r, const char *what) {
    if (LOAD(r->err)) return;
    snprintf(r->errmsg, sizeof r->errmsg, "%s: %s", r->path, what);
    STORE(r->err, 1);
}

static int write_all(lb_rec *r, const unsigned char *p, size_t n) {
    while (n) {
        ssize_t w = write(r->fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            set_err(r, strerror(errno));
            return -1;
        }
        p += w;
        n -= (size_t)w;
        r->size += (size_t)w;
        __atomic_fetch_add(&r->bytes, (uint64_t)w, __ATOMIC_RELAXED);
    }
    return 0;
}

/* The file becomes path.1 (path.1 path.2, ... up to keep), a fresh one
 * starts with the header and every channel and producer record. */
static int rotate(lb_rec *r) {
    close(r->fd);
    r->fd = -1;
    if (lb_rsink_rotate_names(r->path, r->keep)) {
        set_err(r, "out of memory");
        return -1;
    }
    r->fd = open(r->path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
    if (r->fd < 0) {
        set_err(r, strerror(errno));
        return -1;
    }
    r->size = 0;
    r->seg_events = 0;
    __atomic_fetch_add(&r->rotations, 1, __ATOMIC_RELAXED);
    if (write_all(r, r->hdr, r->hdrlen)) return -1;
    for (rec_kept *k = r->kept; k; k = k->next)
        if (write_all(r, k->data, k->len)) return -1;
    return 0;
}

/* Checksums and writes one chunk's records (whole records only); its
 * events counted written, or lost past a failure. */
static void write_chunk(lb_rec *r, rec_chunk *ch) {
    size_t off = 0, from = 0;
    uint64_t nev = 0, done = 0;
    int failed = 0;
    while (off < ch->len) {
        unsigned char *rec = ch->data + off;
        uint32_t len = get_u32(rec);
        size_t n = 8 + (size_t)len;
        lb_rsink_put_u32(rec + 4, libdeflate_crc32(0, rec + 8, len));
        if (rec[8] == 'C' || rec[8] == 'P') {
            rec_kept *k = malloc(sizeof *k + n); /* owned by r->kept */
            if (k) {
                k->next = NULL;
                k->len = n;
                memcpy(k->data, rec, n);
                *r->kept_tail = k;
                r->kept_tail = &k->next;
            }
        } else if (rec[8] == 'E') {
            if (r->max && r->seg_events && r->size + (off - from) + n > r->max) {
                if (write_all(r, ch->data + from, off - from)) {
                    failed = 1;
                    break;
                }
                done = nev;
                if (rotate(r)) {
                    failed = 1;
                    break;
                }
                from = off;
            }
            r->seg_events++;
            nev++;
        }
        off += n;
    }
    if (!failed && !write_all(r, ch->data + from, off - from)) done = ch->nev;
    __atomic_fetch_add(&r->written, done, __ATOMIC_RELEASE);
    __atomic_fetch_add(&r->lost, ch->nev - done, __ATOMIC_RELEASE);
}

/* write(2) to a recording raises SIGPIPE (a FIFO whose reader went) or
 * SIGXFSZ (past a file size limit, ulimit -f) at the thread that writes,
 * and their default action ends the whole process (an outside attack: exit
 * 141 and 153, nothing said).  The writer thread runs with both blocked
 * (pthread_create below, between rec_sigs_block and rec_sigs_restore: it
 * inherits the mask), so its write fails with EPIPE or EFBIG, said and
 * counted as any write error; a signal a write raised stays pending on that
 * thread alone (a thread's own signal), never delivered.  The one write on
 * the caller's thread (a stream's header into a FIFO) blocks them around
 * it and takes back what it raised. */
static void rec_sigs(sigset_t *s) {
    sigemptyset(s);
    sigaddset(s, SIGPIPE);
    sigaddset(s, SIGXFSZ);
}
static void rec_sigs_block(sigset_t *old) {
    sigset_t s;
    rec_sigs(&s);
    pthread_sigmask(SIG_BLOCK, &s, old);
}
static void rec_sigs_restore(const sigset_t *old, int take) {
    if (take) { /* what this thread's writes raised: not delivered at the unblock */
        sigset_t s;
        struct timespec zero = { 0, 0 };
        rec_sigs(&s);
        while (sigtimedwait(&s, NULL, &zero) > 0) {}
    }
    pthread_sigmask(SIG_SETMASK, old, NULL);
}

static void *writer_main(void *arg) {
    lb_rec *r = arg;
    long nap = 2; /* ms */
    pthread_setname_np(pthread_self(), "lecho-rec"); /* top -H, perf: the writer's CPU */
    for (;;) {
        rec_chunk *ch = ring_get(&r->full);
        if (ch) {
            if (LOAD(r->err))
                __atomic_fetch_add(&r->lost, ch->nev, __ATOMIC_RELEASE);
            else
                write_chunk(r, ch);
            ring_put(&r->back, ch); /* it has a slot for every chunk */
            if (LOAD(r->pwait)) wake(&r->mu, &r->cv_room);
            nap = 2;
            continue;
        }
        uint64_t req = LOAD(r->sync_req);
        if (req > LOAD(r->sync_done)) {
            int want = __atomic_exchange_n(&r->fsync_req, 0, __ATOMIC_ACQ_REL);
            if (want && r->fd >= 0 && !LOAD(r->err) && fsync(r->fd) != 0) set_err(r, strerror(errno));
            STORE(r->sync_done, req);
            wake(&r->mu, &r->cv_done);
            continue;
        }
        if (LOAD(r->stop)) break;
        /* Not woken per chunk (a futex wake is an IPI, in a VM dearer than
         * many events): it looks every `nap` (2 ms after it found work,
         * doubling to 50 ms while it finds none), and is woken when a
         * quarter of the buffer waits, a flush or a close asks, or the
         * producer waits for room. */
        pthread_mutex_lock(&r->mu);
        STORE(r->wwait, 1);
        if (!ring_count(&r->full) && LOAD(r->sync_req) == LOAD(r->sync_done) && !LOAD(r->stop)) {
            struct timespec ts;
            deadline_in(&ts, nap);
            pthread_cond_timedwait(&r->cv_work, &r->mu, &ts);
            nap = nap * 2 > 50 ? 50 : nap * 2;
        }
        STORE(r->wwait, 0);
        pthread_mutex_unlock(&r->mu);
    }
    return NULL;
}

/* ---- the producer thread ---- */

static void poke(lb_rec *r) {
    if (LOAD(r->wwait)) wake(&r->mu, &r->cv_work);
}

/* A chunk back on the producer's side (written, or empty): held while a
 * message lent bytes of it lives (its bytes then count in held_bytes, not
 * in nbytes: the wire's queue holds them, and only the loop, not the
 * writer, lets them go, so a submit never waits for them); else a
 * REC_CHUNK one kept for reuse (the last given back first: its lines are
 * the likeliest still in a cache), a larger one freed. */
static void park(lb_rec *r, rec_chunk *ch) {
    if (ch->lent) {
        r->nbytes -= ch->cap;
        r->held_bytes += ch->cap;
        ch->held = 1;
        ch->hnext = r->held;
        if (r->held) r->held->hprev = &ch->hnext;
        ch->hprev = &r->held;
        r->held = ch;
    } else if (ch->cap == REC_CHUNK) {
        ch->next = r->spare;
        r->spare = ch;
    } else {
        r->nbytes -= ch->cap;
        free(ch);
    }
}

/* Chunks the writer gave back. */
static void take_back(lb_rec *r) {
    rec_chunk *ch;
    while ((ch = ring_get(&r->back))) park(r, ch);
}

/* The last message lent bytes of ch is gone (lei_msg_release, on the
 * context's thread: the wire wrote it, a queue dropped it, or it was staged
 * and never submitted: its place at cur's end is free again). */
static void rec_lent_done(void *ud, lei_msg *m) {
    rec_chunk *ch = ud;
    lb_rec *r = ch->owner;
    if (r && r->pend == m) r->pend = NULL;
    if (--ch->lent) return;
    if (!r) { /* the recorder closed meanwhile: its last user frees it */
        free(ch);
        return;
    }
    if (!ch->held) return; /* being filled, or the writer's */
    *ch->hprev = ch->hnext;
    if (ch->hnext) ch->hnext->hprev = ch->hprev;
    ch->held = 0;
    r->held_bytes -= ch->cap;
    if (ch->cap == REC_CHUNK && r->nbytes + ch->cap <= r->limit) {
        r->nbytes += ch->cap;
        ch->next = r->spare;
        r->spare = ch;
    } else {
        free(ch);
    }
}

/* A chunk the recorder lets go of: freed, or left to its lent messages. */
static void drop_chunk(rec_chunk *ch) {
    if (ch->lent)
        ch->owner = NULL;
    else
        free(ch);
}

/* Hands the chunk being filled to the writer. */
static void hand_over(lb_rec *r) {
    rec_chunk *ch = r->cur;
    if (!ch || !ch->len) return;
    r->cur = NULL;
    ring_put(&r->full, ch); /* never full: it has a slot for every chunk the bound allows */
    if ((size_t)ring_count(&r->full) * REC_CHUNK >= r->limit / 4) poke(r);
}

/* Nothing more goes into the chunk being filled: a staged record's bytes
 * lie at its end (r->pend), and something else is to be appended first.
 * What it holds goes to the writer; the staged bytes stay where they are,
 * lent to their message (its record is then copied, lb_rec_event). */
static void retire_cur(lb_rec *r) {
    rec_chunk *ch = r->cur;
    if (!ch) return;
    if (ch->len) {
        hand_over(r);
        return;
    }
    r->cur = NULL;
    park(r, ch);
}

/* A chunk with room for need bytes as r->cur: 0; -1 when the policy
 * drops (or out of memory).  always: wait whatever the policy. */
static int take_chunk(lb_rec *r, size_t need, int always) {
    if (r->pend && r->pend_ch == r->cur) retire_cur(r);
    if (r->cur && r->cur->len + need <= r->cur->cap) return 0;
    size_t cap = need <= REC_CHUNK ? REC_CHUNK : need;
    hand_over(r);
    if (r->cur) { /* empty but too small: let go */
        r->nbytes -= r->cur->cap;
        free(r->cur);
        r->cur = NULL;
    }
    rec_chunk *ch = NULL;
    for (int waited = 0;; waited = 1) {
        take_back(r);
        if (cap == REC_CHUNK && r->spare) {
            ch = r->spare;
            r->spare = ch->next;
            break;
        }
        /* spare chunks that are no use for a large event are let go */
        while (cap != REC_CHUNK && r->spare && r->nbytes + cap > r->limit) {
            rec_chunk *x = r->spare;
            r->spare = x->next;
            r->nbytes -= x->cap;
            free(x);
        }
        if ((r->nbytes + cap <= r->limit || r->nbytes == 0) && r->nbytes / REC_CHUNK + 2 < r->full.cap) {
            ch = malloc(sizeof *ch + cap); /* owned by r: cur, the rings, spare */
            if (ch) {
                ch->cap = cap;
                r->nbytes += cap;
            }
            break;
        }
        if (r->policy_drop && !always) break;
        if (!waited) r->blocked++;
        /* block: wait for the writer to give one back */
        pthread_mutex_lock(&r->mu);
        STORE(r->pwait, 1);
        if (LOAD(r->wwait)) pthread_cond_broadcast(&r->cv_work);
        if (!ring_count(&r->back)) {
            struct timespec ts;
            deadline_in(&ts, 10);
            pthread_cond_timedwait(&r->cv_room, &r->mu, &ts);
        }
        STORE(r->pwait, 0);
        pthread_mutex_unlock(&r->mu);
    }
    if (!ch) return -1;
    ch->len = 0;
    ch->nev = 0;
    ch->next = NULL;
    ch->owner = r;
    ch->lent = 0;
    ch->held = 0;
    r->cur = ch;
    return 0;
}

/* A channel's or producer's record (never dropped: it waits for room
 * whatever the policy). */
static int rec_name(lb_rec *r, char kind, uint32_t idx, const char *name) {
    size_t nl = strlen(name), need = 8 + 1 + 5 + nl;
    if (take_chunk(r, need, 1)) return -1;
    if (!r->cur->len) r->cur_t0 = ev_time();
    unsigned char *o = r->cur->data + r->cur->len;
    size_t hn = 8;
    o[hn++] = (unsigned char)kind;
    hn += lb_rsink_put_varint(o + hn, idx);
    memcpy(o + hn, name, nl);
    hn += nl;
    lb_rsink_put_u32(o, (uint32_t)(hn - 8));
    lb_rsink_put_u32(o + 4, 0); /* the writer's */
    r->cur->len += hn;
    return 0;
}

/* A channel and a producer of this context, recorded from now on: their
 * indexes in the file (from h:set_record). */
int lb_rec_attach(lb_rec *r, const char *chname, const char *pname, uint32_t *cidx, uint32_t *pidx) {
    if (!r->open) return -1;
    *cidx = ++r->nchan;
    *pidx = ++r->nprod;
    if (rec_name(r, 'C', *cidx, chname) || rec_name(r, 'P', *pidx, pname)) return -1;
    return 0;
}

/* An event record's head after its length and checksum (kind E, channel
 * and producer indexes, sequence, time, flags) at o: its length (at most
 * REC_HEAD_MAX). */
static size_t event_head(const lb_rec *r, unsigned char *o, uint32_t cidx, uint32_t pidx, uint64_t seq,
                         double t, int sync) {
    size_t hn = 0;
    double us = (t - r->created) * 1e6;
    o[hn++] = 'E';
    hn += lb_rsink_put_varint(o + hn, cidx);
    hn += lb_rsink_put_varint(o + hn, pidx);
    hn += lb_rsink_put_varint(o + hn, seq);
    hn += lb_rsink_put_varint(o + hn, us > 0 ? (uint64_t)(us + 0.5) : 0);
    o[hn++] = sync ? 1 : 0;
    return hn;
}

/* A recording producer's stage (lua_prod.c dp_stage, dp_submit_bytes: the
 * encoded value, n bytes at p, the next submit's): the bytes copied
 * straight into the chunk being filled, after room for their record's
 * head, and lent to a new message (m->lent) that the submit gives the
 * core, the wire and the queues in place of a buffer of its own: the
 * submit (lb_rec_event with that message) then only writes the head.  The
 * producer's thread copies an event once, into memory it reuses, where it
 * copied it twice, the second time into memory the writer's core read
 * last (bench/README.md "recplay").  The chunk is reused once the writer
 * wrote it and its lent messages are gone (rec_lent_done).  NULL, nothing
 * done, when it cannot (recorder closed, another staged record waiting,
 * held chunks at the limit, no chunk under the drop policy, out of
 * memory): the caller stages as usual and lb_rec_event copies. */
lei_msg *lb_rec_stage(lb_rec *r, uint32_t cidx, uint32_t pidx, uint64_t seq, const uint8_t *p, size_t n) {
    if (!r->open || r->pend || r->held_bytes >= r->limit || n == 0) return NULL;
    double now = ev_time();
    size_t need = 8 + REC_HEAD_MAX + n;
    if (r->cur && r->cur->len && now - r->cur_t0 > REC_AGE) hand_over(r);
    if ((!r->cur || r->cur->len + need > r->cur->cap) && take_chunk(r, need, 0)) return NULL;
    lei_msg *m = lei_msg_new();
    if (!m) return NULL;
    rec_chunk *ch = r->cur;
    if (!ch->len) r->cur_t0 = now;
    unsigned char *o = ch->data + ch->len;
    size_t hn = 8 + event_head(r, o + 8, cidx, pidx, seq, now, 0);
    memcpy(o + hn, p, n);
    m->own.data = (char *)o + hn; /* lent: ch's, while m lives */
    m->own.len = m->own.cap = n;
    m->total = n;
    m->lent = rec_lent_done;
    m->lent_ud = ch;
    ch->lent++;
    r->pend = m;
    r->pend_ch = ch;
    r->pend_hn = hn;
    r->pend_seq = seq;
    r->pend_c = cidx;
    r->pend_p = pidx;
    r->pend_t = now;
    return m;
}

/* One event, after the core took it (lua_prod.c prod_send): its record
 * completed in place when m is the staged message whose bytes wait at the
 * chunk's end (lb_rec_stage), else appended to the chunk being filled
 * (the value's bytes copied, the checksum left to the writer); 1 when it
 * was not recorded (dropped under the policy, or the recorder is closed),
 * 0 else. */
int lb_rec_event(lb_rec *r, uint32_t cidx, uint32_t pidx, uint64_t seq, int sync, lei_msg *m) {
    if (!r->open) return 1;
    r->submitted++;
    if (r->pend && m == r->pend) {
        r->pend = NULL;
        rec_chunk *ch = r->cur;
        if (ch && ch == r->pend_ch) {
            unsigned char *o = ch->data + ch->len, head[REC_HEAD_MAX];
            size_t hn = r->pend_hn;
            /* (another submit of its producer came between, or it was
             * attached again: its head is written again) */
            int again = seq != r->pend_seq || cidx != r->pend_c || pidx != r->pend_p;
            if (again) hn = 8 + event_head(r, head, cidx, pidx, seq, r->pend_t, sync);
            if (hn == r->pend_hn) { /* (always, but when its sequence grew a byte since it was staged) */
                if (again) memcpy(o + 8, head, hn - 8);
                o[hn - 1] = sync ? 1 : 0; /* its flags */
                lb_rsink_put_u32(o, (uint32_t)(hn - 8 + m->own.len));
                lb_rsink_put_u32(o + 4, 0); /* the writer's */
                ch->len += hn + m->own.len;
                ch->nev++;
                r->inplace++;
                return 0;
            }
            /* its place cannot be completed: its bytes stay lent at the
             * chunk's end, and its record is copied into the next one */
            retire_cur(r);
        }
    } else if (r->pend && r->pend_ch == r->cur) {
        retire_cur(r); /* a staged record waits at cur's end */
    }
    size_t n = m->total, need = 8 + REC_HEAD_MAX + n;
    double now = ev_time();
    rec_chunk *ch = r->cur;
    if (ch && ch->len && now - r->cur_t0 > REC_AGE) hand_over(r);
    if (!r->cur || r->cur->len + need > r->cur->cap) {
        if (take_chunk(r, need, 0)) {
            r->dropped++;
            return 1;
        }
    }
    ch = r->cur;
    if (!ch->len) r->cur_t0 = now;
    unsigned char *o = ch->data + ch->len;
    size_t hn = 8 + event_head(r, o + 8, cidx, pidx, seq, now, sync);
    if (m->next == 0)
        memcpy(o + hn, m->own.data, n);
    else
        lei_msg_flatten(m, (char *)o + hn);
    lb_rsink_put_u32(o, (uint32_t)(hn - 8 + n));
    lb_rsink_put_u32(o + 4, 0); /* the writer's */
    ch->len += hn + n;
    ch->nev++;
    return 0;
}

/* Everything handed over is written (and fsync'd when asked): 0, or -1
 * with the recorder's error. */
static int rec_flush(lb_rec *r, int want_fsync) {
    if (!r->open) return -1;
    hand_over(r);
    if (want_fsync) STORE(r->fsync_req, 1);
    uint64_t g = r->sync_req + 1;
    STORE(r->sync_req, g);
    pthread_mutex_lock(&r->mu);
    pthread_cond_broadcast(&r->cv_work);
    while (LOAD(r->sync_done) < g) pthread_cond_wait(&r->cv_done, &r->mu);
    pthread_mutex_unlock(&r->mu);
    take_back(r);
    return LOAD(r->err) ? -1 : 0;
}

static void rec_close(lb_rec *r, int want_fsync) {
    if (!r->open) return;
    rec_flush(r, want_fsync);
    STORE(r->stop, 1);
    wake(&r->mu, &r->cv_work);
    pthread_join(r->thr, NULL);
    r->open = 0;
    if (r->fd >= 0) close(r->fd);
    r->fd = -1;
    /* chunks with lent messages alive (the wire's queue, a local one, a
     * staged one) are left to them: the last one frees it */
    r->pend = NULL;
    if (r->cur) drop_chunk(r->cur);
    r->cur = NULL;
    rec_chunk *ch;
    while ((ch = ring_get(&r->full))) drop_chunk(ch); /* none after the flush; for form */
    while ((ch = ring_get(&r->back))) drop_chunk(ch);
    while (r->spare) {
        ch = r->spare;
        r->spare = ch->next;
        free(ch);
    }
    while (r->held) {
        ch = r->held;
        r->held = ch->hnext;
        ch->held = 0;
        ch->owner = NULL;
    }
    r->held_bytes = 0;
    r->nbytes = 0;
    free(r->full.slot);
    free(r->back.slot);
    r->full.slot = r->back.slot = NULL;
    while (r->kept) {
        rec_kept *k = r->kept;
        r->kept = k->next;
        free(k);
    }
    r->kept_tail = &r->kept;
    free(r->path);
    r->path = NULL;
    free(r->hdr);
    r->hdr = NULL;
    pthread_cond_destroy(&r->cv_work);
    pthread_cond_destroy(&r->cv_room);
    pthread_cond_destroy(&r->cv_done);
    pthread_mutex_destroy(&r->mu);
    /* off the context's list */
    if (r->b) {
        for (lb_rec **pp = &r->b->recs; *pp; pp = &(*pp)->next_rec)
            if (*pp == r) {
                *pp = r->next_rec;
                break;
            }
        r->b = NULL;
    }
}

/* Before the context goes (lua_ctx.c): every recorder flushed and joined. */
void lb_rec_close_all(lb_ctx *b) {
    while (b->recs) rec_close(b->recs, 0);
}

/* ---- from Lua ---- */

lb_rec *lb_rec_check(lua_State *L, int idx) {
    return luaL_checkudata(L, idx, REC_MT);
}

lb_ctx *lb_rec_ctx(const lb_rec *r) { return r->open ? r->b : NULL; }

/* ctx:recorder_open(path, header_bytes, created, max_bytes, keep, policy,
 * buffer_bytes) -> recorder: the file (its magic line and header written by
 * Lua) appended to by a writer thread from now on; or nil, err. */
static int l_recorder_open(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    size_t pl, hl;
    const char *path = luaL_checklstring(L, 2, &pl);
    const char *hdr = luaL_checklstring(L, 3, &hl);
    double created = luaL_checknumber(L, 4);
    double max = luaL_optnumber(L, 5, 0);
    int keep = (int)luaL_optinteger(L, 6, 3);
    const char *pol = luaL_optstring(L, 7, "block");
    double limit = luaL_optnumber(L, 8, 8.0 * 1024 * 1024);
    size_t il = 0;
    const char *initial = luaL_optlstring(L, 9, NULL, &il);
    if (strcmp(pol, "block") != 0 && strcmp(pol, "drop") != 0)
        return luaL_argerror(L, 7, "policy must be \"block\" or \"drop\"");
    if (!(limit >= 2.0 * REC_CHUNK)) return luaL_argerror(L, 8, "buffer_bytes must be 131072 or more");
    if (!b->c) return luaL_error(L, "lecho: context is closed");
    /* (a FIFO: waits here for its reader, as a shell's > does) */
    int fd = open(path, O_WRONLY | O_APPEND | O_CLOEXEC);
    if (fd < 0) {
        lua_pushnil(L);
        lua_pushfstring(L, "%s: %s", path, strerror(errno));
        return 2;
    }
    lb_rec *r = lua_newuserdata(L, sizeof *r);
    memset(r, 0, sizeof *r);
    r->fd = fd;
    r->kept_tail = &r->kept;
    r->path = malloc(pl + 1);
    r->hdr = malloc(hl ? hl : 1);
    if (!r->path || !r->hdr) {
        free(r->path);
        free(r->hdr);
        close(fd);
        return luaL_error(L, "lecho: out of memory");
    }
    memcpy(r->path, path, pl + 1);
    memcpy(r->hdr, hdr, hl);
    r->hdrlen = hl;
    r->created = created;
    r->max = max > 0 ? (uint64_t)max : 0;
    r->keep = keep;
    r->policy_drop = pol[0] == 'd';
    r->limit = (size_t)limit;
    r->full.cap = r->back.cap = (uint32_t)(r->limit / REC_CHUNK) + 4;
    r->full.slot = calloc(r->full.cap, sizeof *r->full.slot); /* owned by r */
    r->back.slot = calloc(r->back.cap, sizeof *r->back.slot); /* owned by r */
    if (!r->full.slot || !r->back.slot) {
        free(r->full.slot);
        free(r->back.slot);
        free(r->path);
        free(r->hdr);
        close(fd);
        return luaL_error(L, "lecho: out of memory");
    }
    if (initial) { /* a stream's magic line and header (a FIFO: Lua did not open it) */
        size_t off = 0;
        sigset_t old;
        rec_sigs_block(&old);
        int e = 0;
        while (off < il) {
            ssize_t w = write(fd, initial + off, il - off);
            if (w < 0 && errno == EINTR) continue;
            if (w < 0) {
                e = errno;
                break;
            }
            off += (size_t)w;
        }
        rec_sigs_restore(&old, 1);
        if (e) {
            free(r->full.slot);
            free(r->back.slot);
            free(r->path);
            free(r->hdr);
            close(fd);
            lua_pushnil(L);
            lua_pushfstring(L, "%s: %s", path, strerror(e));
            return 2;
        }
    }
    off_t end = lseek(fd, 0, SEEK_END);
    r->size = end > 0 ? (uint64_t)end : 0;
    r->seg_events = 0;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv_work, NULL);
    pthread_cond_init(&r->cv_room, NULL);
    pthread_cond_init(&r->cv_done, NULL);
    sigset_t oldmask;
    rec_sigs_block(&oldmask); /* the writer inherits SIGPIPE and SIGXFSZ blocked */
    int cr = pthread_create(&r->thr, NULL, writer_main, r);
    rec_sigs_restore(&oldmask, 0);
    if (cr != 0) {
        free(r->full.slot);
        free(r->back.slot);
        free(r->path);
        free(r->hdr);
        close(fd);
        pthread_cond_destroy(&r->cv_work);
        pthread_cond_destroy(&r->cv_room);
        pthread_cond_destroy(&r->cv_done);
        pthread_mutex_destroy(&r->mu);
        lua_pushnil(L);
        lua_pushstring(L, "lecho: the recorder's thread could not start");
        return 2;
    }
    r->open = 1;
    r->b = b;
    r->next_rec = b->recs;
    b->recs = r;
    luaL_getmetatable(L, REC_MT);
    lua_setmetatable(L, -2);
    lua_createtable(L, 0, 1); /* pins the context userdata */
    lua_pushvalue(L, 1);
    lua_setfield(L, -2, "ctx");
    lua_setfenv(L, -2);
    return 1;
}

/* r:flush(fsync) -> true, or nil, err: what its producers submitted so far
 * is in the file (and on the disk with fsync). */
static int l_flush(lua_State *L) {
    lb_rec *r = lb_rec_check(L, 1);
    if (!r->open) return lb_push_err(L, "recorder is closed", LEI_E_CLOSED);
    if (rec_flush(r, lua_toboolean(L, 2))) {
        return lb_push_err(L, r->errmsg, LEI_E_IO); /* set before err, never again */
    }
    lua_pushboolean(L, 1);
    return 1;
}

/* r:stats() -> { events (written), submitted, dropped, lost, queued
 * (events handed over, not written yet), bytes, rotations, blocked (waits
 * for room), buffered (bytes of chunks held), held (bytes of written
 * chunks whose lent messages live on), inplace (events staged straight
 * into a chunk), error }. */
static int l_stats(lua_State *L) {
    lb_rec *r = lb_rec_check(L, 1);
    if (r->open) take_back(r);
    lua_createtable(L, 0, 12);
    uint64_t written = LOAD(r->written), lost = LOAD(r->lost);
    uint64_t queued = r->submitted - r->dropped - written - lost;
    lua_pushnumber(L, (lua_Number)written);
    lua_setfield(L, -2, "events");
    lua_pushnumber(L, (lua_Number)r->submitted);
    lua_setfield(L, -2, "submitted");
    lua_pushnumber(L, (lua_Number)r->dropped);
    lua_setfield(L, -2, "dropped");
    lua_pushnumber(L, (lua_Number)lost);
    lua_setfield(L, -2, "lost");
    lua_pushnumber(L, (lua_Number)queued);
    lua_setfield(L, -2, "queued");
    lua_pushnumber(L, (lua_Number)LOAD(r->bytes));
    lua_setfield(L, -2, "bytes");
    lua_pushinteger(L, LOAD(r->rotations));
    lua_setfield(L, -2, "rotations");
    lua_pushnumber(L, (lua_Number)r->blocked);
    lua_setfield(L, -2, "blocked");
    lua_pushnumber(L, (lua_Number)r->nbytes);
    lua_setfield(L, -2, "buffered");
    lua_pushnumber(L, (lua_Number)r->held_bytes);
    lua_setfield(L, -2, "held");
    lua_pushnumber(L, (lua_Number)r->inplace);
    lua_setfield(L, -2, "inplace");
    lua_pushboolean(L, r->open);
    lua_setfield(L, -2, "open");
    if (LOAD(r->err)) {
        lua_pushstring(L, r->errmsg);
        lua_setfield(L, -2, "error");
    }
    return 1;
}

/* r:tick(): the chunk being filled handed to the writer (a 50 ms timer in
 * Lua: what an idle producer submitted last is written all the same). */
static int l_tick(lua_State *L) {
    lb_rec *r = lb_rec_check(L, 1);
    if (r->open) {
        hand_over(r);
        take_back(r);
    }
    return 0;
}

static int l_close(lua_State *L) {
    lb_rec *r = lb_rec_check(L, 1);
    rec_close(r, lua_toboolean(L, 2));
    return 0;
}

static int l_gc(lua_State *L) {
    rec_close(lb_rec_check(L, 1), 0);
    return 0;
}

static const luaL_Reg rec_methods[] = {
    {"flush", l_flush}, {"tick", l_tick}, {"stats", l_stats}, {"close", l_close}, {NULL, NULL}};

const luaL_Reg lb_rec_ctx_methods[] = {{"recorder_open", l_recorder_open}, {NULL, NULL}};

void lb_rec_open(lua_State *L) {
    lb_metatable(L, REC_MT, rec_methods, l_gc);
}
