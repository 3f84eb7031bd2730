/* ctx_int.h: the context's private structs and the functions the files of
 * the transport layer share (every .c of core/transport/ but addr.c and
 * frame.c, which know no context and have their own addr.h, frame.h).
 *
 * No other layer includes this header: the MOE, the binding and embedders
 * use the functions of ctx.h only (spec/layers_spec.lua fails a file of
 * another layer that includes it).  A struct field written from elsewhere
 * is a second implementation of that field's rules.  White-box code reads
 * it knowingly: the tests and fuzz harnesses that need a connection's
 * insides (core/test/test_inmap.c, core/test/test_shared.c,
 * core/fuzz/fuzz_conn.c, core/fuzz/fuzz_handshake.c) and bench/lecho_c.c
 * (c->loop, c->addr, c->h.ud, a channel's local flag).
 *
 * Its static inline functions are those of transport files that several
 * others call on a hot path; each is named for its file by the prefix rule
 * (lei_chan_dests: chan.c's, lei_peer_is_up: peer.c's, lei_ctx_hook_enter:
 * ctx.c's), and a header may hold only the inlines of its own file (X.h:
 * X.c's) or, a private header, of its layer's files (doc/architecture.md
 * "Layers"; spec/layers_spec.lua checks it).
 */
#ifndef LECHO_CTX_INT_H
#define LECHO_CTX_INT_H

#include "ctx.h"

/* Async events this small are copied, header and value, into one buffer per
 * run of them in a peer's queue (a batch item): no allocation and two iovecs
 * fewer per event and destination.  Bigger ones are queued by reference. */
#define SMALL_EVENT 512
/* A connection ended by the disconnect policy is closed this long after
 * its FIN at the latest, if the remote does not close first. */
#define RETIRE_SECONDS 5.0
#define BATCH_MAX (16 * 1024)
/* Batch buffers kept for reuse by the context (peer.c): what batch_bytes
 * (256 KiB) queued at a peer holds in flight, 256 KiB. */
#define SB_POOL 16

/* How long a peer that lost the tie-break of simultaneous dials waits for
 * the remote's own connection before it counts as lost. */
#define AWAIT_IN_SECONDS 5.0

/* An inmap entry: the remote's index is bound to a channel we refused. */
#define LEI_REFUSED UINT32_MAX

/* ---- identity and trust (auth.c) ---------------------------------------- */

typedef struct lei_tkey {     /* a trusted key and the principal name it must claim */
    uint8_t pk[32];
    char name[LEI_NAME_MAX + 1];
} lei_tkey;

typedef struct lei_pin {      /* a peer address pinned to a key, a principal, or both */
    char addr[LEI_ADDR_MAX];
    uint8_t pk[32];           /* valid when has_pk (lei_auth_expect) */
    int has_pk;
    char principal[LEI_NAME_MAX + 1]; /* "": none (lei_auth_expect_principal) */
} lei_pin;

typedef struct lei_auth {     /* a trusted authority and its own validity (0: unbounded) */
    uint8_t pk[32];
    uint64_t not_before, not_after;
} lei_auth;

typedef struct lei_ident {
    int keyed;                /* ro: an identity is set (keyed mode) */
    uint8_t sk[64], pk[32];   /* our Ed25519 identity (sk wiped at free) */
    char name[LEI_NAME_MAX + 1];
    uint8_t cert[LEI_CERT_MAX]; /* an authority's certificate of (name, pk), if has_cert */
    int has_cert;             /* 0, 1 (a v1 one: 64 bytes), 2 (cert_len bytes) */
    size_t cert_len;
    lei_tkey *keys;           /* owned: trusted keys */
    int nkeys, ckeys;
    lei_auth *auths;          /* owned: trusted authorities */
    int nauths, cauths;
    uint8_t (*revoked)[32];   /* owned: revoked keys (lei_auth_set_revoked) */
    int nrevoked;
    lei_pin *pins;            /* owned: address -> expected key */
    int npins, cpins;
    ev_tstamp rlog_t;         /* refused BINDs: log window start, lines, untold */
    int rlog_n;
    uint64_t rlog_skipped;
} lei_ident;

/* ---- security mechanisms (plain.c, secure.c) ----------------------------
 *
 * How a connection introduces itself and protects its bytes is a mechanism
 * object chosen per connection (ZeroMQ's null/plain/curve model: the
 * engine drives, the mechanism owns its state and its messages).  The
 * transport (conn.c, peer.c) reads, writes and closes through k->mech and
 * never asks which mode it is in; the handshake (handshake.c) walks the
 * connection's states and hands each step's frame to it.  Two mechanisms:
 * protected (plain.c: no keys, a HELLO of the address, frames go to the
 * socket as they are) and keyed (secure.c: the keyed HELLO fields, the
 * transcript and its signatures, the trust and pins of the remote's key,
 * AUTH, the record cipher's offer and choice, the key schedule, then
 * records).  The keyed state (struct lei_sec, k->sec) is secure.c's alone:
 * declared here, defined there; the others ask through `remote`. */

#include <sys/types.h>

#define LEI_REC_PLAIN_MAX 65536  /* plaintext bytes per record */
#define LEI_IOVN 512             /* iovecs per write of a queue */

typedef struct lei_sec lei_sec; /* secure.c's */

/* A connection's security mechanism.  Every function takes the connection
 * and is called while its socket is open (write_now also for the parting
 * ERROR inside lei_conn_close; end there, last). */
typedef struct lei_mech {
    const char *name;        /* "protected", "keyed" */
    /* The connection's state for it (k->sec): 0, or -1 ENOMEM; freed at close. */
    int (*start)(lei_conn *k);
    void (*end)(lei_conn *k);
    /* A small frame (handshake, parting ERROR) out now, behind what is pending. */
    void (*write_now)(lei_conn *k, const uint8_t *b, size_t n);
    /* The peer's queue to the socket: as much as it takes; arms the write
     * watcher when full; may close the connection. */
    void (*flush)(lei_peer *p);
    /* Bytes already protected (sealed) but not written: 1 or 0, and the
     * write of them (1 all written, 0 the socket is full, -1 error). */
    int (*out_pending)(const lei_conn *k);
    int (*write_pending)(lei_conn *k);
    /* A read from the socket into the connection's input: > 0 bytes read,
     * 0 the remote closed, < 0 errno set (or k closed: k->state says). */
    ssize_t (*read)(lei_conn *k);
    /* Bytes read but not yet opened (ciphertext; 0 while there are no records). */
    size_t (*in_pending)(const lei_conn *k);
    /* Opens what was read into k's frame buffer: 0, or -1 after closing k. */
    int (*open)(lei_conn *k);
    /* A CTRL frame read on k, before it is handed up: 0, or -1 after
     * closing k (keyed: an acceptor of a mode 1 HELLO closes on the marker
     * of a dialler forced to fall back after a refused cipher offer). */
    int (*ctrl_in)(lei_conn *k, const lei_frame *f);
    /* The record cipher's name ("aes-256-gcm", ...), NULL without one. */
    const char *(*cipher)(const lei_conn *k);

    /* The handshake's steps of this mode; handshake.c calls them in the
     * order of its states (its head comment) and owns the states. */
    /* Our HELLO (LEI_F_HELLO, we dialled) or HELLO_OK (LEI_F_HELLO_OK, we
     * were dialled) into b[LEI_HELLO_MAX]: its size. */
    size_t (*hello)(lei_conn *k, uint8_t type, uint8_t *b);
    /* The remote's HELLO or HELLO_OK (want), parsed and of our protocol
     * version: NULL when it is one of this mode, else why not (bad input). */
    const char *(*hello_check)(const lei_conn *k, const lei_hello *h, uint8_t want);
    /* The remote's HELLO_OK (HELLO_SENT, k not superseded) or HELLO
     * (HELLO_WAIT, its address one we could dial back), checked: 1 the
     * remote is who it says (UP next), 0 this mode's AUTH step follows
     * (our AUTH or our HELLO_OK is out: AUTH_SENT, AUTH_WAIT next), -1
     * after closing k. */
    int (*hello_in)(lei_conn *k, const lei_frame *f, const lei_hello *h);
    /* The remote's AUTH (AUTH_WAIT, LEI_SIG_BYTES of signature) or AUTH_OK
     * (AUTH_SENT, k not superseded): 0 the remote proved who it is (UP
     * next), -1 after closing k.  Reached only when hello_in returned 0. */
    int (*auth_in)(lei_conn *k, const lei_frame *f);
    /* An ERROR before UP on a connection we dialled, not the tie-break's:
     * 1 when it is this mode's to answer (k closed; keyed: an acceptor of
     * before the cipher offer refused ours: dialled again in mode 1), 0 else. */
    int (*refused)(lei_conn *k, const lei_frame *f);
    /* The remote's identity (key, name, certificate, address, incarnation)
     * as its keyed HELLO or HELLO_OK stated it: the name empty until one
     * was read, proven once UP; NULL without keys (protected) or once k
     * is closed. */
    const lei_hello *(*remote)(const lei_conn *k);
} lei_mech;

extern const lei_mech lei_mech_protected, lei_mech_keyed;

/* A peer's connection came up or went down; told to the hook later. */
struct lei_note {
    int idx, up;
    int code; /* down: the LEI_E_* of reason (p->reason_code when it was lost) */
    char reason[160];
};
/* One queued frame: hdr bytes, then msg's bytes if msg is set. */
typedef struct lei_qitem {
    struct lei_qitem *next;
    lei_msg *msg;       /* one reference owned by the item, or NULL */
    size_t size;        /* hlen + msg->total */
    uint32_t chid;      /* local queue: channel */
    uint32_t moff;      /* shared: where its bytes start in msg->own (< BATCH_MAX; in
                         * what was padding: the item stays 120 bytes, a malloc size
                         * class whose heap layout the batches' reallocs like) */
    uint64_t producer, seq, sync;
    uint8_t hlen;
    uint8_t droppable;  /* an async event: policies may drop it */
    uint8_t batch;      /* msg holds whole small async EVENT frames, nev of them */
    uint8_t mixed;      /* a batch with events of more than one channel (chid: the first) */
    uint8_t ack;        /* an ACK frame: counted in its peer's ack_bytes while queued */
    uint8_t ctrl;       /* a CTRL frame: counted in its peer's ctrl_bytes while queued */
    uint8_t shared;     /* a batch in a channel's shared buffer (peer.c): msg is that
                         * buffer, the item its bytes [moff, moff + size), frames of
                         * chid only; no hdr */
    uint32_t nev;
    uint8_t hdr[LEI_EVENT_HDR_MAX];
} lei_qitem;

typedef struct lei_queue {
    lei_qitem *head, *tail;
    size_t bytes;       /* ro: queued bytes */
    size_t count;       /* ro: queued frames */
} lei_queue;

static inline void lei_q_push(lei_queue *q, lei_qitem *it) {
    it->next = NULL;
    if (q->tail)
        q->tail->next = it;
    else
        q->head = it;
    q->tail = it;
    q->bytes += it->size;
    q->count++;
}

static inline lei_qitem *lei_q_pop(lei_queue *q) {
    lei_qitem *it = q->head;
    if (!it) return NULL;
    q->head = it->next;
    if (!q->head) q->tail = NULL;
    q->bytes -= it->size;
    q->count--;
    return it;
}

/* Per peer: the last sequence number seen from each (channel, producer) of
 * the peer's current incarnation (last == 0: empty).  The first producer
 * seen on a channel has its entry in an array indexed by our channel id
 * (bych: events round-robin over thousands of channels read it in order,
 * where a hash's random probes each missed the cache); the others are in
 * an open-addressing table (seqs). */
typedef struct lei_seqent {
    uint64_t producer, last;
    uint32_t chid, epoch;
} lei_seqent;

typedef struct lei_live {
    uint64_t incarnation;     /* ro: from the last handshake (0: none yet) */
    int fails;                /* ro: dials since the last handshake (backoff) */
    int caught;               /* lei_live_catch_up reads its remote's close: dial again at once */
    lei_seqent *seqs;         /* owned */
    uint32_t seqcap, seqn, seqhit;
    lei_seqent *bych;         /* owned: [chid], nbych entries, at most 4 per used + 64 */
    uint32_t nbych, nbych_used;
    /* owned: [chid], nbind entries, at most 4 per used + 64: per channel the
     * peer BINDs to us, our channel's epoch at its last BIND and how often a
     * BIND started its producers' sequences again (lei_live_bind) */
    struct lei_bindst { uint32_t epoch, restarts; } *bind;
    uint32_t nbind, nbind_used;
    ev_tstamp log_t;          /* gap logging: window start, lines, untold gaps */
    uint32_t log_n;
    uint64_t log_skipped;
    uint64_t hb_in, hb_out, timeouts, gaps, lost, dups; /* ro: counters */
} lei_live;

/* Read confirmation of our async events (doc/protocol.md "Read
 * confirmation"), per peer.  The remote offers it (a CTRL, after the first
 * BIND it accepts on a connection); we then ask now and then (CONFIRM_ASK
 * with a token, behind what is queued: on the liveness timer when events
 * went out since the last ask, and at shutdown) and it answers CONFIRM with
 * the token once it has read up to the ask.  Counted from the connection's
 * start (reset by lei_live_peer_up): wr by peer.c as items are written, an
 * ask's counts by peer.c when the ask is written, ok by live.c from the
 * answer; what a connection that ends abnormally leaves unconfirmed is
 * counted by peer.c's lei_peer_lost. */
#define LEI_CF_ASKS 4
typedef struct lei_confirm {
    uint8_t on;               /* the remote offered confirmations on this connection */
    uint8_t offered;          /* we offered ours on this connection */
    uint8_t nasks, nwritten;  /* asks outstanding, of them written (the oldest first) */
    uint64_t wr, wr_bytes;    /* async EVENTs of ours (and their bytes) written on this connection */
    uint64_t ok, ok_bytes;    /* of them, confirmed read (by a CONFIRM) */
    uint64_t mark;            /* wr when the last ask was queued: the timer asks again only past it */
    uint64_t tok;             /* the last ask's token (per peer, never reset: no answer
                               * on one connection matches an ask of another) */
    struct lei_cf_ask { uint64_t tok, ev, bytes; } asks[LEI_CF_ASKS]; /* oldest first */
    uint64_t confirmed;       /* ro: events confirmed read, since the start */
    uint64_t unconfirmed, unconfirmed_bytes; /* ro: since the start, async events written to
                               * it on connections that ended abnormally (not the remote's
                               * orderly close) before it confirmed them read */
} lei_confirm;

struct lei_peer {
    lei_ctx *ctx;
    size_t ack_bytes;         /* ACK frames in q: a peer that does not read them is cut at queue_limit */
    size_t ctrl_bytes;        /* CTRL frames in q (replies): the same bound, lei_send_ctrl */
    char ctrl_why[120];       /* lei_send_ctrl: why the last one was refused (its err) */
    int idx;                  /* ro: 1-based handle, stable while the peer lives; a
                               * freed peer's idx goes to the next new one (the
                               * hook was told it went down before) */
    int pos;                  /* its index in ctx->peers_s.peers */
    ev_tstamp unused_at;      /* since when nothing uses it (0: in use); freed
                               * LEI_PEER_FREE_AFTER later (lei_peers_sweep) */
    uint8_t mark;             /* lei_peers_sweep: something refers to it */
    uint8_t in_dests;         /* scratch of lei_peer_set_dests: in the new list */
    char addr[LEI_ADDR_MAX];  /* ro: the remote context's listen address */
    lei_conn *conn;           /* ro: current connection or NULL */
    uint64_t gen;             /* ro: generation of conn (unique in the context,
                               * set when it came up): an ACK goes only to the
                               * connection its event came on (lei_ack_gen) */
    int held;                 /* ro: a handler of an event from this peer is suspended */
    lei_conn *retiring;       /* a connection ended by the disconnect policy,
                               * still delivering: no new one until it closes */
    uint8_t policy_cut;       /* the disconnect policy ended its connection: what
                               * its queue drops then, and what is submitted to it
                               * until the next dial, is the policy's, not
                               * undelivered (cleared when a dial starts or a
                               * connection comes up) */
    ev_tstamp await_in;       /* our dial lost the tie-break: the remote's own
                               * connection is awaited until then, queue kept */
    int dial_pending;         /* waits for a dial slot (LEI_DIALS_MAX): live,
                               * its queue kept, dialled by lei_peer_turn */
    int no_offer;             /* keyed: it refused our mode 2 HELLO (a v3 peer
                               * of before the cipher offer): mode 1 to it */
    lei_queue q;              /* ro: frames waiting for the socket */
    size_t woff;              /* bytes of q.head already written */
    size_t wfull;             /* q.bytes when a write last found the socket full
                               * (lei_peer_enqueue tries again batch_bytes later) */
    int nshared;              /* items of q in shared batches (peer.c: each keeps a
                               * buffer of up to BATCH_MAX alive) */
    lei_msg *spare;           /* owned: an empty batch buffer (BATCH_MAX) kept for the
                               * next batch, freed with the peer (peers.c peer_free) */
    uint8_t *bound;           /* channels announced (BIND) on this connection */
    size_t nbound;
    ev_tstamp last_fail;      /* when the last connection failed */
    char reason[160];         /* ro: why the last connection ended */
    int reason_code;          /* ro: its LEI_E_* code, set where it happened (0: closed) */
    int next_code;            /* the code lei_peer_lost takes for a loss set up before it (0: closed);
                               * cleared when a dial starts and when a connection comes up */
    lei_loss loss;            /* ro: the last loss's flags (lei_peer_loss); zero while up */
    lei_loss next_loss;       /* what lei_peer_lost takes as loss, set up where the loss
                               * happens (conn_io.c: a dial that did not connect; secure.c:
                               * an identity a principal pin refuses); cleared when a dial
                               * starts and when a connection comes up */
    lei_pstats st;            /* ro */
    uint64_t last_sync;       /* the sync id of the last sync event queued to it */
    uint64_t last_sync_ev;    /* st.ev_out once it was queued */
    uint64_t acked_ev;        /* last_sync_ev when the peer ACKed last_sync: while it
                               * equals st.ev_out (no event queued since), the peer read
                               * everything queued to it, nothing of ours can be unread
                               * there (lei_ctx_unsure); the async path writes none */
    lei_live lv;              /* liveness and sequence tracking (live.c) */
    int has_key;              /* ro: key/principal are those of the current or last
                               * authenticated connection */
    uint8_t key[32];
    char principal[LEI_NAME_MAX + 1];
    uint64_t refused;         /* ro: events dropped from BINDs without a valid ticket */
    lei_confirm cf;           /* read confirmation (live.c, peer.c) */
};

/* What every event reads or counts sits in the first 64 bytes, and the
 * struct is allocated 64-byte aligned (chan.c lei_chan_open): with thousands
 * of channels round-robin the struct is out of cache at each event, so an
 * event costs one line of it on either side (producing: lei_submit_room,
 * lei_submit; consuming: conn_frame, lei_live_seq), where the fields spread
 * over 232 bytes and the destinations in an array of their own cost two or
 * three.  One destination (the usual case) is kept in the struct itself:
 * read the list with lei_chan_dests.  Keep it so when adding fields: rare
 * ones go after the first line (chan.c asserts the size of the first). */
struct lei_chan {
    uint32_t id;              /* ro: index in ctx->chan_s.chans, also the wire idx we send */
    int ndests;
    uint32_t epoch;           /* ro: bumped when local consumers appear again */
    uint8_t local;            /* rw via lei_chan_set_local: local consumers exist */
    uint8_t held;             /* ro: a local handler of it is suspended */
    uint8_t derived;          /* ro: a modulated stream (name@key): filters skip seqs */
    uint8_t calls;            /* rw via lei_chan_set_calls: a call channel (svc:NAME): no seq check */
    union {                   /* ro: remote consuming contexts (lei_chan_dests) */
        lei_peer *one;        /* ndests == 1: the destination itself */
        lei_peer **many;      /* ndests > 1: owned array; else NULL */
    } d;
    uint64_t ev_out, bytes_out, encodes, ev_in, bytes_in; /* end of the first 64 bytes */
    uint64_t drops, ev_local;
    uint64_t ev_nodest;       /* ro: events submitted with no destination at all */
    uint64_t undelivered;     /* ro: of drops, those lost with a connection (no policy) */
    char *name;               /* ro: owned, NUL-terminated */
    size_t namelen;
    uint64_t gaps, lost, dups;  /* ro: sequence gaps seen, events they lost, duplicates dropped */
    uint8_t has_mkey, has_ticket;
    uint8_t mkey[32];         /* consumer side: the channel manager's key (BIND tickets) */
    uint8_t ticket[LEI_TICKET_BYTES]; /* producer side: our ticket for the channel (expiry, sig) */
    uint64_t refused;         /* ro: events dropped from unauthorized producers */
    lei_msg *sb;              /* peer.c: the channel's open shared batch, its small async
                               * events of two or more destinations written once and
                               * sent to each by reference (one reference owned; NULL:
                               * none; dropped when full or when no queue holds it) */
    uint8_t sb_busy;          /* peer.c: its last shared batch was dropped full (the next
                               * one may be a pooled BATCH_MAX buffer) */
    /* lei_chan_epoch_recent: the epoch as it was between LEI_EPOCH_RECENT
     * and twice that seconds ago (ep_old), at ep_t (ep_cur) */
    uint32_t ep_old, ep_cur;
    ev_tstamp ep_t;
};

/* The channel's destinations, ch->ndests of them. */
static inline lei_peer **lei_chan_dests(lei_chan *ch) {
    return ch->ndests == 1 ? &ch->d.one : ch->d.many;
}

typedef struct lei_sync_wait {
    lei_peer *peer;           /* NULL: the local consumers */
    int done;
    char *err;                /* owned: transport failure, or NULL */
    int code;                 /* that failure's LEI_E_* code, set where it happened */
    uint8_t *errs;            /* owned: encoded handler errors from the ack */
    size_t elen;
} lei_sync_wait;

struct lei_sync {
    struct lei_sync *next, *prev; /* c->sync_s.syncs, every record */
    struct lei_sync *hnext;   /* c->sync_s.shash chain */
    uint64_t id;
    int watch;                /* its id goes on c->sync_s.sdone when it settles */
    int nwait;                /* waits not yet done */
    int nw;
    lei_sync_wait *w;         /* owned */
    uint64_t nran;
    int want_ran;             /* an event (no sync marker, no call): an ACK of
                               * 0 handlers and no entry is a failure */
};

/* ---- the context's state, by the file that owns it ----------------------
 * struct lei_ctx holds one sub-struct per file that owns a part of the
 * context's state (c->peers_s is peers.c's, c->sync_s sync.c's, ...).  The
 * rule that holds: a sub-struct's fields are written only by its file
 * (others call the owner: lei_accept_conn_added, lei_dial_done,
 * lei_local_kick, lei_peers_evict, lei_expiry_at), with these
 * exceptions, all ctx.c's: lei_ctx_new and lei_ctx_free, the context's
 * constructor and destructor, initialise and free the sub-structs (the
 * watchers' callbacks, the tables, the spare read buffer; accept_s and
 * sync_s through their files' lei_accept_init and lei_sync_init, the
 * listener closed by accept.c's lei_accept_close), lei_ctx_stats reads
 * them, and lei_submit and lei_call push onto local.c's queue (local_s.lq)
 * and start its idle watcher themselves: the local submit's hot path, kept
 * inline.
 * Other files read other sub-structs (the peer table's peers_s.peers,
 * npeers; local_s.lq through lei_local_full).  What stays at the top level
 * is ctx.c's, or shared by several files (rbuf, nbound_all: the
 * containment counters conn.c, rbuf.c and inmap.c keep; unflushed, set by
 * peer.c's lei_peer_flush_deferred and cleared by ctx.c's check_cb), but rlog,
 * log.c's, and kops, the connection table's operations ctx.c registers. */

/* peers.c: the peer table, by position, by idx and by address */
struct lei_peers_state {
    lei_peer **peers;         /* owned: the peers, dense (p->pos), any order */
    int npeers, cpeers;
    lei_peer **byidx;         /* owned array (not the peers): idx-1 -> peer or NULL */
    int *freeidx;             /* owned: idx of freed peers, reused (capacity cbyidx) */
    int nbyidx, cbyidx, nfreeidx;
    lei_peer **phash;         /* owned array (not the peers): open addressing by
                               * address, phcap slots (a power of 2), half full at most */
    int phcap;
    int peers_over;           /* a peer was created past max_peers: lei_peer_turn evicts */
    ev_timer expiry_w;        /* the timed clean-ups: unused peers, peers' await_in,
                               * retired connections, certificates (lei_expiry_at;
                               * run by peer.c's lei_expiry_cb) */
};

/* chan.c: the channel table, by id and by name */
struct lei_chan_state {
    lei_chan **chans;         /* owned */
    uint32_t nchans, cchans;
    uint32_t *hash;           /* open addressing: chid+1, 0 empty */
    uint32_t hcap;
};

/* sync.c: the sync records, by id, and the watched ones settled */
struct lei_sync_state {
    lei_sync *syncs;
    uint64_t next_sync;       /* starts random below 2^52 (ids reach Lua as numbers:
                               * a late ACK meant for a dead process that used our
                               * address must not meet an id of ours) */
    uint64_t stale_acks;      /* ro: ACKs dropped: their event's connection was gone */
    lei_sync **shash;         /* owned array (not the records): by id & (shcap-1) */
    uint32_t shcap, nsyncs;
    uint64_t *sdone;          /* owned: ids of watched records settled since the last
                               * lei_sync_done_take (Lua resumes only their waiters) */
    uint32_t nsdone, csdone;
    int sdone_lost;           /* a push failed (no memory): the taker looks at all */
};

/* local.c: local delivery (producer and consumer in this process) */
struct lei_local_state {
    ev_idle idle;             /* runs the local delivery queue */
    lei_queue lq;             /* local deliveries */
    lei_queue ldef;           /* local items of held channels, in order */
    int batch;                /* handlers run per loop turn at most (0: 4096); close's
                               * local delivery sets 1 (lei_local_batch) */
};

/* accept.c: listening, accepting, the limits on connections */
struct lei_accept_state {
    int lfd;
    ev_io lio;
    ev_timer hs_w;            /* closes connections not UP within handshake_timeout */
    ev_timer acc_w;           /* restarts accepting after EMFILE/ENFILE */
    double acc_backoff;       /* s: the next pause (0.1 doubling to 2) */
    int reserve_fd;           /* owned: /dev/null held to accept-and-refuse when out of fds */
};

/* rbuf.c: large read buffers handed back (lei_rbuf_return: a drained
 * connection's, or one the program that adopted it let go of), for the
 * next large frames: their pages are in already (a fresh buffer's page
 * faults cost more than the copy the adoption saved).  Owned, at most
 * LEI_SPARES of them and LEI_SPARE_MAX bytes together, freed with the
 * context (ctx.c).  Several, not one: an adopted buffer comes back only
 * when the collector finds it let go of, and one collection may find
 * several (lei_rbuf_collect_due tells the binding when it is time for one). */
#define LEI_SPARES 4
struct lei_rbuf_state {
    uint8_t *spare[LEI_SPARES];
    size_t spare_cap[LEI_SPARES];
    int nspare;               /* spare[0 .. nspare) are set */
    size_t spare_bytes;       /* their caps together */
    size_t out_n, out_bytes;  /* adopted buffers not given back yet (lei_rbuf_give) */
    size_t last_cap;          /* the size of the last one adopted */
    uint64_t adopted;         /* read buffers handed over (lei_rbuf_adopt) */
};

/* peer.c: dials in progress, peer changes to tell, batch buffers */
struct lei_peer_state {
    int ndialing;             /* our dials not yet UP (LEI_DIALS_MAX) */
    int ndial_pending;        /* peers with dial_pending set */
    struct lei_note *notes;   /* owned: peer changes not yet told to the hook */
    int nnotes, cnotes;
    ev_idle kick;             /* keeps one loop turn from blocking (peer notes) */
    lei_msg *sb_pool[SB_POOL]; /* owned: empty batch buffers (cap BATCH_MAX, refcnt 1) for
                               * the next busy channel's shared batch or busy peer's own:
                               * no malloc, realloc, page faults or heap trims per batch;
                               * freed in lei_ctx_free */
    int nsb_pool;
    /* ro: async events of ours (and their wire bytes) dropped from a queue
     * because its connection ended or there was none (not a queue policy
     * the user chose): ctx:close() reports them (lei_ctx_undelivered);
     * why: the last such loss, "ADDR: reason" */
    uint64_t und_events, und_bytes;
    char und_why[LEI_ADDR_MAX + 162];
    /* ro: async events of ours (and their wire bytes) written to a peer
     * that offered read confirmation, on connections that ended abnormally
     * before it confirmed them read (lei_peer_lost): ctx:close() reports
     * them (lei_ctx_unconfirmed_why: the last, "ADDR: reason") */
    uint64_t unc_events, unc_bytes;
    char unc_why[LEI_ADDR_MAX + 162];
};

struct lei_ctx {
    struct ev_loop *loop;     /* ro: owned */
    lei_opts o;               /* rw before lei_accept_listen */
    lei_hooks h;
    char addr[LEI_ADDR_MAX];  /* ro: our advertised address (what peers dial, HELLO carries) */
    char bound[LEI_ADDR_MAX]; /* ro: what we are bound to (differs for a wildcard) */
    lei_addr laddr;           /* ro: the listening address, for lei_addr_close */
    uint64_t incarnation;
    ev_prepare prep;          /* writes batched queues once per loop turn */
    ev_check chk;             /* after a turn's callbacks: writes what they deferred */
    int unflushed;            /* a callback deferred a sync write (lei_peer_flush_deferred) */
    ev_timer hb;              /* liveness: PINGs and dead peers, all connections */
    lei_conn *conns;          /* all live connections (list through conn->next) */
    size_t nconns;            /* connections not CLOSED (max_connections): conn.c's */
    uint64_t conn_gen;        /* last connection generation given (handshake_up) */
    int depth;                /* ro: nesting of hooks in progress (lei_ctx_hook_enter) */
    int closing;              /* ro: lei_ctx_shutdown was called */
    uint64_t encodes;         /* values encoded (lei_ctx_count_encode) */
    uint64_t bad_frames;      /* ro: connections closed for bad input */
    lei_ident id;             /* identity, trust, pins (auth.c) */
    /* Containment: BIND indexes bound on all connections (inmap.c), bytes
     * of the connections' read buffers (rcap, rbuf.c); the count of
     * connections is nconns above, the handshake deadline accept_s's. */
    size_t nbound_all;
    size_t rbuf;
    struct {                  /* lei_ratelog: per kind, the window's start and */
        ev_tstamp t;          /* the lines it did not log */
        uint64_t skipped;
        int used;
    } rlog[LEI_RL_NKINDS];
    /* rw: why the event or ctrl hook just refused its value ("": it did not
     * say), set by lei_ctx_refusal; conn.c adds it to the peer's ERROR */
    char refusal[200];
    struct lei_peers_state peers_s;   /* peers.c's */
    struct lei_chan_state chan_s;     /* chan.c's */
    struct lei_sync_state sync_s;     /* sync.c's */
    struct lei_local_state local_s;   /* local.c's */
    struct lei_accept_state accept_s; /* accept.c's */
    struct lei_peer_state peer_s;     /* peer.c's */
    int batch;                /* rw: lei_ctx_batch: the events hook takes a read's async EVENTs */
    struct lei_rbuf_state rbuf_s;     /* rbuf.c's */
    /* The operations that cross the transport's layers upward
     * (core/transport/README.md "Order"), registered by lei_ctx_new, never
     * called by name; none is called per event: rbuf.c refuses a hog and
     * closes a connection it cannot grow (accept.c's lei_accept_refuse,
     * conn.c's lei_conn_close); conn.c sets a new connection's watchers'
     * callbacks (conn_io.c's lei_conn_io_read_cb, _write_cb: libev calls
     * them, no call of ours between), starts its liveness
     * (lei_live_conn_new) and tells a connection's end to its peer
     * (peer.c's lei_peer_lost, lei_dial_done); peer.c asks liveness
     * whether the redial backoff is over (lei_live_may_dial); conn.c
     * starts a connection with a mechanism (lei_mech_protected of plain.c,
     * lei_mech_keyed of secure.c; a CTRL goes to its ctrl_in) and conn_io.c
     * hands the frames before UP and our HELLO to the handshake
     * (handshake.c's lei_handshake_frame, _hello). */
    struct {
        void (*refuse)(lei_conn *k, int kind, const char *reason);
        void (*close)(lei_conn *k, const char *reason, int bad);
        void (*read_cb)(struct ev_loop *loop, ev_io *w, int revents);
        void (*write_cb)(struct ev_loop *loop, ev_io *w, int revents);
        void (*live_new)(lei_conn *k);
        void (*peer_lost)(lei_peer *p, const char *reason);
        void (*dial_done)(lei_conn *k);
        int (*may_dial)(lei_peer *p);
        const lei_mech *mech_protected, *mech_keyed;
        int (*hs_frame)(lei_conn *k, const lei_frame *f);
        void (*hs_hello)(lei_conn *k);
    } kops;
};

/* A hook of c->h (the binding's) is called, or an embedder's callback runs
 * (ctx.c's lei_ctx_enter/leave): c->depth counts them, nested.  Inside one
 * a sync write waits for the end of the turn (peer.c) and a close for the
 * outermost to return (the binding).  Every change of c->depth is one of
 * these two. */
static inline void lei_ctx_hook_enter(lei_ctx *c) { c->depth++; }
static inline void lei_ctx_hook_leave(lei_ctx *c) { c->depth--; }

/* The states of a connection, in the order it walks them (handshake.c's
 * head comment draws the transitions).  Before UP only handshake
 * frames count. */
enum lei_conn_state {
    LEI_CONN_DIALING = 1, /* we dialled: connect() in progress */
    LEI_CONN_HELLO_SENT,  /* we dialled: our HELLO is out, awaiting HELLO_OK */
    LEI_CONN_HELLO_WAIT,  /* accepted: awaiting the remote's HELLO */
    LEI_CONN_AUTH_WAIT,   /* accepted, keyed: our signed HELLO_OK is out, awaiting AUTH */
    LEI_CONN_AUTH_SENT,   /* dialled, keyed: AUTH is out, records on, awaiting AUTH_OK */
    LEI_CONN_UP,          /* handshake done: frames flow both ways */
    LEI_CONN_CLOSING,     /* up, the context closes: our FIN followed the queue,
                           * reading until the remote's */
    LEI_CONN_RETIRED,     /* detached from its peer (disconnect policy), FIN
                           * sent: what the socket holds is still delivered,
                           * input is ignored until the remote closes or
                           * RETIRE_SECONDS after `retired` */
    LEI_CONN_CLOSED       /* socket closed; freed once busy is 0 */
};

/* One TCP connection.  Owned by the context (ctx->conns list); tied to at
 * most one peer.  Freed once closed and no read callback is running on it. */
struct lei_conn {
    lei_conn *next;
    lei_ctx *ctx;
    lei_peer *peer;     /* dialled: from the start; accepted: from UP; NULL
                         * once detached */
    int fd;
    enum lei_conn_state state;
    int busy;           /* read callbacks in progress on this connection */
    int dial_slot;      /* dialled by us, not yet UP: counted in ctx->peer_s.ndialing */
    lei_peer *was;      /* retired: the peer it served (p->retiring == this) */
    ev_tstamp retired;  /* RETIRED: when */
    ev_io rio, wio;
    uint8_t *rb;        /* owned read buffer */
    size_t rlen, rpos, rcap;
    int rfull;          /* the last read filled the room it had: read into
                         * LEI_RBUF_MIN next (else LEI_RBUF_SMALL will do) */
    /* The remote's channel indexes (inmap.c): idx -> local chid + 1, or
     * LEI_REFUSED (a channel not open here; keyed: or a
     * BIND without a valid ticket); below 65536 in
     * the array inmap, above in the table hmap. */
    uint32_t *inmap;    /* owned */
    size_t ninmap;
    struct lei_inent { uint32_t idx, val; } *hmap; /* owned; idx 0: empty */
    size_t hcap, hn;
    size_t nbound;      /* indexes bound, both parts (max_peer_channels) */
    /* The refused indexes, resolved once at their BIND (an EVENT on one
     * costs no lookup): the channel here (UINT32_MAX: none) and the text of
     * the reason the ACKs carry (owned, at most LEI_BIND_NAME_MAX + 64). */
    struct lei_rname { uint64_t idx; uint32_t chid; char *why; } *rnames; /* owned */
    size_t nrnames, crnames;
    size_t rname_bytes; /* their why texts' lengths (conn.c: REFUSED_NAMES_MAX) */
    size_t nrefused;    /* BINDs refused on this connection (REFUSED_BINDS_MAX) */
    uint64_t cert_end;  /* keyed, up: when the peer's certificate (within its
                         * authority's validity) ends, Unix seconds; 0: never */
    int cert_end_auth;  /* cert_end is its authority's end (cert_apk), not its own */
    uint8_t cert_apk[32];
    /* Keyed: the indexes bound with a ticket, and when each ticket expires
     * (auth.c): at that time the index is refused, as a BIND without a
     * valid ticket (a renewed ticket comes with a new BIND).  At most one
     * entry per bound index: bounded by max_peer_channels. */
    struct lei_texp { uint64_t idx, exp; } *texp; /* owned */
    size_t ntexp, ctexp;
    size_t skip;        /* bytes of a dropped EVENT still to come, not buffered */
    ev_tstamp born, last_in, last_out, last_ping; /* liveness: created, last read, write, PING */
    ev_tstamp hs_grace; /* accept.c: when the handshake deadline started again (its
                         * answer waited unread at the deadline); 0: never */
    ev_tstamp open_at;  /* lei_live_catch_up: when a poll last found it open (0: never) */
    const lei_mech *mech; /* how it introduces itself and protects its bytes
                           * (plain.c, secure.c) */
    lei_sec *sec;       /* owned by the keyed mechanism: its state, opaque
                         * outside secure.c; NULL (protected, or closed) */
    int fin_pending;    /* our FIN goes out once the pending records are written */
    int eof;            /* the remote closed in order (its FIN read): not an abnormal end */
};

/* The handshake is done and the connection still carries the peer's
 * frames (UP or CLOSING).  Inline, for the transport's files: asked per
 * event and destination; ctx.h's lei_peer_up is the same test out of line.
 * Not to be confused with live.c's lei_live_peer_up, which is not a test
 * but what liveness does when a handshake completes. */
static inline int lei_peer_is_up(const lei_peer *p) {
    return p->conn && (p->conn->state == LEI_CONN_UP || p->conn->state == LEI_CONN_CLOSING);
}

/* Connected or on its way (a connection not closed, the remote's awaited,
 * a dial waiting its turn): what is queued for it may still go out.  Inline:
 * asked per event and destination. */
static inline int lei_peer_live(const lei_peer *p) {
    return (p->conn && p->conn->state != LEI_CONN_CLOSED) || p->await_in > 0 || p->dial_pending;
}

/* The first live destination of ch whose queue is at its limit, or NULL:
 * chan.c's lei_chan_full, ctx.c's lei_submit_room (which writes to it).
 * Inline: asked per submit. */
static inline lei_peer *lei_chan_full_dest(const lei_ctx *c, lei_chan *ch) {
    lei_peer **dests = lei_chan_dests(ch);
    for (int i = 0; i < ch->ndests; i++) {
        lei_peer *p = dests[i];
        if (p->q.bytes >= c->o.queue_limit && lei_peer_live(p)) return p;
    }
    return NULL;
}

/* The local queue has no room for ch's next event: the queue itself, and
 * for a channel whose handler waits, what waits behind it (other channels'
 * events go on).  One rule for the submit's drop policy and for
 * lei_submit_room's wait. */
static inline int lei_local_full(const lei_ctx *c, const lei_chan *ch) {
    return c->local_s.lq.bytes >= c->o.queue_limit || (ch->held && c->local_s.ldef.bytes >= c->o.queue_limit);
}


/* ---- shared between the context's files -------------------------------- */

/* item.c: queue items (an item owns one reference to its msg) */
lei_qitem *lei_item_new(lei_msg *m);
void lei_item_free(lei_ctx *c, lei_qitem *it);
lei_qitem *lei_item_bytes(const uint8_t *hdr, size_t hlen, const void *body, size_t blen);
/* peer.c: peers.  One nothing uses (no connection, nothing queued or held,
 * no channel's destination, no sync waiting on it, no note untold) for
 * peer_free_after seconds (option; default LEI_PEER_FREE_AFTER) is freed (its counters go with it). */
#define LEI_PEER_FREE_AFTER 30.0
/* Our dials in progress (connecting or in the handshake) at most; the other
 * peers to dial wait their turn (dial_pending), their queues kept. */
#define LEI_DIALS_MAX 64
void lei_peers_sweep(lei_ctx *c);
/* The peer records (their queues cleared first: lei_peer_q_clear). */
void lei_peers_free(lei_ctx *c);
/* The expiry timer fires at `when` at the latest (peers.c; lei_expiry_cb, peer.c, runs it). */
void lei_expiry_at(lei_ctx *c, ev_tstamp when);
lei_peer *lei_peers_find(lei_ctx *c, const char *addr);
lei_peer *lei_peers_new(lei_ctx *c, const char *addr);
void lei_peer_note(lei_peer *p, int up, const char *reason);
void lei_tell_notes(lei_ctx *c);
void lei_peer_lost(lei_peer *p, const char *reason);
void lei_peer_q_clear(lei_ctx *c, lei_peer *p, int count_drops);
void lei_peer_flush(lei_peer *p);
/* For the mechanisms' flush: iovecs of p's queue from its written offset
 * (at most max - 2), and w bytes of it gone out (or into records): the
 * items done are freed. */
struct iovec;
int lei_peer_queue_iov(lei_peer *p, struct iovec *iov, int max);
void lei_peer_queue_took(lei_peer *p, size_t w);
void lei_peer_enqueue(lei_ctx *c, lei_peer *p, lei_chan *ch, const uint8_t *hdr, size_t hlen,
                      lei_msg *msg, uint64_t sync, int policy);
/* A small async event of several destinations (lei_submit): its frame
 * (hdr, then msg's own bytes; msg->next == 0, msg->total <= SMALL_EVENT)
 * written once into ch's shared batch, of which it returns one reference
 * the caller releases with lei_peer_shared_unref after queueing (*off:
 * where the frame starts); NULL: out of memory, nothing written. */
lei_msg *lei_peer_shared_append(lei_ctx *c, lei_chan *ch, const uint8_t *hdr, size_t hlen,
                                const lei_msg *msg, size_t *off);
/* lei_peer_enqueue of that frame (n bytes at off in sb) to p: the same
 * policies and counts, the peer's queue referring to sb. */
void lei_peer_enqueue_shared(lei_ctx *c, lei_peer *p, lei_chan *ch, lei_msg *sb, size_t off,
                             size_t n, size_t total, int policy);
/* Drops one reference to a shared batch of ch (ch may be NULL): the
 * channel's own goes too when nothing else holds the batch; the last
 * reference puts the buffer in the context's pool or frees it. */
void lei_peer_shared_unref(lei_ctx *c, lei_chan *ch, lei_msg *sb);
/* lei_ctx_free: the pool's buffers. */
void lei_peer_pool_free(lei_ctx *c);
void lei_expiry_cb(struct ev_loop *loop, ev_timer *w, int revents);
void lei_kick_cb(struct ev_loop *loop, ev_idle *w, int revents);
/* peer.c: dials p (a connection in DIALING, a dial slot held until UP or
 * closed): 0, or -1 with the reason in p (reason, reason_code, loss). */
int lei_peer_dial(lei_peer *p);
/* Once per loop turn (prepare): dials waiting for a slot, peers past max_peers. */
void lei_peer_turn(lei_ctx *c);
/* More than max_peers peers: the unused ones freed at once (peers.c). */
void lei_peers_evict(lei_ctx *c);
/* k, dialled by us, is UP or closed: its dial slot is free (no-op else). */
void lei_dial_done(lei_conn *k);
/* conn.c: connection records (sockets, closing, retiring); reading them is
 * conn_io.c's, dialling peer.c's, the handshake handshake.c's. */
void lei_conn_close(lei_conn *k, const char *reason, int bad);
void lei_conn_retire(lei_conn *k, const char *reason);
void lei_conn_fin(lei_conn *k);
void lei_conn_free(lei_conn *k);
/* Writes bytes straight to the socket (handshake, parting ERROR): sealed
 * as a record once records are on. */
void lei_conn_write_now(lei_conn *k, const uint8_t *b, size_t n);
void lei_conn_send_error(lei_conn *k, const char *msg);
/* The code (LEI_E_*) of a failed connect()'s errno. */
int lei_conn_connect_code(int e);
/* Refuses k: ERROR with the reason to the peer, one log line per kind per
 * window (lei_ratelog), k closed. */
void lei_accept_refuse(lei_conn *k, int kind, const char *reason);
/* rbuf.c: k's read buffer is now (b, ncap), the context's total follows;
 * grow k's buffer to at least need bytes (need > rcap) within max_buffered
 * for the frame ending at end (0: not known) of fsize bytes: 0, or -1
 * after closing k. */
void lei_rbuf_set(lei_conn *k, uint8_t *b, size_t ncap);
/* rbuf.c: room for need bytes in k's buffer for records opened into it
 * (charged, not checked against the budget): 0, or -1 out of memory. */
int lei_rbuf_reserve(lei_conn *k, size_t need);
int lei_rbuf_grow(lei_conn *k, size_t need, size_t end, size_t fsize);
/* rbuf.c: k closed: its buffer out of the budget, freed unless k is busy
 * (then by lei_conn_free). */
void lei_rbuf_close(lei_conn *k);
/* A connection reads into LEI_RBUF_MIN bytes of room while its reads fill
 * the room they get (a stream), else into LEI_RBUF_SMALL: a quiet or idle
 * connection holds a small buffer, not 64 KiB of max_buffered each (10,000
 * idle peers held 625 MiB of a 512 MiB budget).  lei_rbuf_idle (from the
 * liveness timer): frees k's drained buffer when it is larger than
 * LEI_RBUF_SMALL and its last read did not fill it, or idle is set (nothing
 * came for a heartbeat). */
#define LEI_RBUF_MIN ((size_t)64 * 1024)
#define LEI_RBUF_SMALL ((size_t)4 * 1024)
void lei_rbuf_idle(lei_conn *k, int idle);
/* conn.c: a connection record for fd (owned by the context from now on),
 * counted in nconns; the caller arms the handshake deadline
 * (lei_accept_conn_added). */
lei_conn *lei_conn_new(lei_ctx *c, int fd, enum lei_conn_state state);
/* accept.c: the context's timers, the reserved fd; the handshake deadline
 * (armed by lei_accept_conn_added once a connection is made); room for one
 * more connection (0, or -1 with the reason in why[n]). */
void lei_accept_init(lei_ctx *c);
void lei_accept_stop(lei_ctx *c);
void lei_accept_close(lei_ctx *c);
void lei_accept_conn_added(lei_ctx *c);
int lei_accept_room(lei_ctx *c, char *why, size_t n);
/* conn_io.c -> handshake.c (c->kops): one frame before UP (0, or -1 after
 * closing k), our HELLO once a dial connected. */
int lei_handshake_frame(lei_conn *k, const lei_frame *f);
void lei_handshake_hello(lei_conn *k);
/* conn_io.c: frames from the socket into k's buffer as they come (the
 * protected mechanism's read): > 0, 0 (closed by the remote), < 0 errno;
 * the watchers' callbacks (c->kops.read_cb, write_cb). */
ssize_t lei_conn_io_read(lei_conn *k);
void lei_conn_io_read_cb(struct ev_loop *loop, ev_io *w, int revents);
void lei_conn_io_write_cb(struct ev_loop *loop, ev_io *w, int revents);
/* inmap.c: a connection's channel indexes.  get: 0 with *val, or -1 (not
 * bound); set: 0, or -1 (out of memory, or idx past 2^32 - 1). */
int lei_inmap_get(const lei_conn *k, uint64_t idx, uint32_t *val);
int lei_inmap_set(lei_conn *k, uint64_t idx, uint32_t val);
const struct lei_rname *lei_inmap_rname(const lei_conn *k, uint64_t idx);
int lei_inmap_set_rname(lei_conn *k, uint64_t idx, uint32_t chid, const char *why);
void lei_inmap_drop_rname(lei_conn *k, uint64_t idx);
void lei_inmap_free(lei_conn *k);
/* Does k have an index bound to channel chid (a BIND taken, keyed: its
 * ticket not expired)?  Linear in the indexes k bound (max_peer_channels). */
int lei_inmap_binds(const lei_conn *k, uint32_t chid);
/* chan.c: the channel of that name, or NULL (never created) */
lei_chan *lei_chan_find(lei_ctx *c, const char *name, size_t len);
/* auth.c */
int lei_name_ok(const char *name, size_t n);
/* Whether (pk, name, cert) is trusted now at addr (the address a HELLO
 * advertises, or the one we dialled): 0, or -1 with the reason in why[n]. */
int lei_trusted(const lei_ctx *c, const lei_hello *h, const char *addr, char *why, size_t n);
/* A BIND of idx on k: its ticket's expiry recorded (ticket NULL: the index
 * has none any more).  0, or -1 out of memory. */
int lei_ticket_bound(lei_conn *k, uint64_t idx, const uint8_t *ticket);
/* k is up: the expiry timer is armed for its peer's certificate's end. */
void lei_cert_watch(lei_conn *k);
/* Closes the up connections whose peer's certificate expired by now (one
 * log line each); returns the next end of one, or 0. */
ev_tstamp lei_certs_expire(lei_ctx *c, ev_tstamp now);
/* The ticket a BIND of ch carries (its base channel's for a derived stream), or NULL. */
const uint8_t *lei_auth_ticket_for(lei_ctx *c, const lei_chan *ch);
/* Keyed consumer side of a BIND: the local channel, or NULL when refused. */
lei_chan *lei_auth_bind_check(lei_ctx *c, const lei_peer *p, const char *name, size_t nl,
                         const uint8_t *ticket);
void lei_refused_log(lei_ctx *c, const lei_peer *p, const char *name, size_t nl);
const lei_pin *lei_pin_find(const lei_ctx *c, const char *addr);
void lei_ident_free(lei_ctx *c);
/* local.c */
void lei_local_idle_cb(struct ev_loop *loop, ev_idle *w, int revents);
void lei_local_kick(lei_ctx *c);
/* peer.c: the answer to a sync event no handler here ran (no consumer of
 * channel chname left): 0 handlers and one entry, code noconsumer. */
void lei_ack_noconsumer(lei_ctx *c, lei_peer *from, uint64_t sync, const char *chname);
void lei_sync_init(lei_ctx *c);
void lei_sync_link(lei_ctx *c, lei_sync *s);

/* sync.c */
/* Fails wait w of s (once): why, and code (LEI_E_*), what it was. */
void lei_sync_fail(lei_sync_wait *w, lei_sync *s, const char *why, int code);
void lei_syncs_peer_lost(lei_ctx *c, lei_peer *p, const char *reason);
void lei_sync_answered(lei_ctx *c, lei_peer *p, uint64_t sync, uint64_t nran,
                       const uint8_t *errs, size_t elen);
/* An answer dropped: its connection is another generation now (stale_acks). */
void lei_sync_stale_ack(lei_ctx *c);
/* live.c: liveness and sequence tracking */
void lei_live_conn_new(lei_conn *k);
int lei_live_may_dial(lei_peer *p);
/* A handshake completed (incarnation from the remote's HELLO): liveness
 * and sequence tracking start again for a new incarnation. */
void lei_live_peer_up(lei_peer *p, uint64_t incarnation);
int lei_live_frame(lei_conn *k, const lei_frame *f);
int lei_live_confirm_frame(lei_conn *k, const lei_frame *f);
int lei_live_offer_in(lei_conn *k, const lei_frame *f);
void lei_live_offer(lei_peer *p);
void lei_live_ask(lei_peer *p);
int lei_live_seq(lei_ctx *c, lei_peer *p, lei_chan *ch, uint64_t producer, uint64_t seq);
/* A BIND of ch from p (again: the index was bound to ch on this connection
 * already): its producers' sequences there start again when our local
 * consumers of ch went away since its last BIND. */
void lei_live_bind(lei_peer *p, lei_chan *ch, int again);
/* ch's epoch as it was a few seconds ago (LEI_EPOCH_RECENT to twice that):
 * the appearances of local consumers since may still have BINDs again on
 * their way (lei_live_bind) */
#define LEI_EPOCH_RECENT 10.0
uint32_t lei_chan_epoch_recent(lei_chan *ch, ev_tstamp now);
void lei_live_timer_cb(struct ev_loop *loop, ev_timer *w, int revents);

#endif
