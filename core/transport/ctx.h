/* ctx.h: the context, lecho's concentrator (one per process).
 *
 * A context owns a libev loop, one listening socket, at most one connection
 * per remote context (a "peer", keyed by the remote's listen address), the
 * table of channels this process uses, the outgoing queues with their byte
 * limits and policies, the local delivery queue and the pending synchronous
 * submissions.  It knows nothing of Lua: values arrive already encoded as
 * lei_msg (codec.h) and leave as bytes handed to the hooks below.
 *
 * The structs are private (ctx_int.h): an embedder holds opaque handles
 * (lei_ctx, lei_peer, lei_chan, lei_sync) and uses the functions below.
 * Failures return the negative of an errors.h code with a message.
 *
 * Ownership: the context owns every peer, connection, channel, queue item
 * and sync record; lei_ctx_free releases them all.  Messages are shared by
 * reference count: lei_submit takes its own references, the caller keeps its
 * own.  Hooks must not free the context.
 */
#ifndef LECHO_CTX_H
#define LECHO_CTX_H

#include <ev.h>
#include <stddef.h>
#include <stdint.h>

#include "addr.h"
#include "codec.h"
#include "errors.h"
#include "frame.h"

enum lei_policy { LEI_BLOCK = 0, LEI_DROP_OLDEST, LEI_DROP_NEWEST, LEI_DISCONNECT };

typedef struct lei_ctx lei_ctx;
typedef struct lei_peer lei_peer;
typedef struct lei_conn lei_conn;

typedef struct lei_opts {
    size_t queue_limit;    /* bytes queued per peer (and locally) before the policy acts */
    int policy;            /* enum lei_policy, the default for submits */
    size_t batch_bytes;    /* a peer queue this full is written at once, not at loop end */
    size_t max_frame;      /* largest frame accepted from a peer */
    double retry_interval; /* seconds before a failed peer is dialled again */
    /* Liveness (live.c): a connection silent for `heartbeat`
     * seconds gets a PING; one silent for heartbeat * heartbeat_misses is
     * closed as dead.  0 disables both (PINGs are still answered). */
    double heartbeat;
    double heartbeat_misses;
    double retry_max;      /* cap of the exponential redial backoff */
    /* Containment (issue 11; doc/limits.md). */
    double handshake_timeout;   /* s: a connection not UP this long after accept or
                                 * connect is closed with an ERROR (0: never) */
    size_t max_connections;     /* connections of the context, any state */
    size_t max_buffered;        /* bytes of read buffers across all connections */
    size_t max_peer_channels;   /* BIND indexes per connection */
    /* Channels open in the context (local API and derived streams; a BIND
     * from a peer never opens one).  lei_chan_open past it fails.  Channel
     * ids stay stable for the context's life (they are the wire indexes we
     * send and index every peer's BIND bitmap), so a channel is never freed
     * before the context: this bounds what they hold. */
    uint32_t max_channels;
    /* Peer records (one per remote address): past it, the peers nothing uses
     * are freed at once, oldest first, not peer_free_after later. */
    size_t max_peers;
    /* s: a peer record nothing uses (no connection, queue, channel, sync
     * wait) is freed this long after (LEI_PEER_FREE_AFTER, 30). */
    double peer_free_after;
    /* s: lei_ratelog logs one line per kind of refusal per this long
     * (LEI_RATELOG_WINDOW, 10). */
    double log_window;
    /* keyed: 1 never offers nor chooses AES-256-GCM (ChaCha20-Poly1305 only,
     * as on a CPU without AES-NI); 0 (default) offers it where available. */
    int no_aes;
} lei_opts;

void lei_opts_default(lei_opts *o);

/* Hooks into the embedding layer (the Lua binding).  `from` is NULL for a
 * local delivery.  event and ctrl return 0, or -1 when the payload is not a
 * valid value: the connection it came on is then closed with that reason.
 * event may also return 1: the dispatch of that event is suspended (a
 * handler is waiting); nothing more from the same source (that connection,
 * or, locally, that channel's next events) is handed over until
 * lei_resume(from, chid).  peer's code is the LEI_E_* of a loss (closed,
 * refused, limit, io, ...: set where it happened), 0 when up.  peer is never
 * called from inside another call into the context: losses found while
 * submitting or writing are told from the next loop turn. */
/* One async EVENT of a batch (lei_hooks.events): its channel, producer,
 * sequence and value bytes p[0..n), valid during the call only. */
typedef struct lei_event_in {
    uint32_t chid;
    uint64_t producer, seq;
    const uint8_t *p;
    size_t n;
} lei_event_in;

/* The most EVENTs one batch holds, and the largest value one may carry
 * (larger ones, and sync ones, go one by one through event). */
#define LEI_BATCH_MAX 256
#define LEI_BATCH_VALUE_MAX 4096

typedef struct lei_hooks {
    void *ud;
    int (*event)(void *ud, lei_peer *from, uint32_t chid, uint64_t producer, uint64_t seq,
                 uint64_t sync, const uint8_t *p, size_t n);
    int (*ctrl)(void *ud, lei_peer *from, const uint8_t *p, size_t n);
    void (*peer)(void *ud, lei_peer *p, int up, const char *reason, int code);
    void (*unpin)(void *ud, int ref);
    void (*log)(void *ud, const char *msg);
    /* Called once per loop iteration, before the queues are written (the
     * binding runs modulators' dequeue there).  May be NULL. */
    void (*prepare)(void *ud);
    /* The async EVENTs of one read from one peer, in order, n >= 1 of them
     * (only once lei_ctx_batch(c, 1); NULL: never).  Returns how many it
     * took: n, or k < n when event k's value was bad (the ones before it
     * were handed over; the caller closes the connection, with the reason
     * set by lei_ctx_refusal).  *held: 1 when a handler of one of them
     * waits: the hook keeps the rest and ends the hold with lei_resume,
     * as event's 1 does. */
    int (*events)(void *ud, lei_peer *from, const lei_event_in *ev, int n, int *held);
} lei_hooks;

typedef struct lei_pstats {
    uint64_t ev_in, ev_out, bytes_in, bytes_out, batches, drops, ctrl_in, ctrl_out;
    uint64_t dials; /* connections we started to it ("cannot reach" is rate-logged) */
    uint64_t undelivered; /* of drops: async events its connection's end (or no connection)
                           * dropped, not a queue policy the user chose */
} lei_pstats;

typedef struct lei_chan lei_chan;
typedef struct lei_sync lei_sync;

/* What the stats functions below fill in (copies; nothing to free). */
typedef struct lei_stats_ctx {
    uint64_t encodes;         /* values encoded (counted by the embedder) */
    uint64_t bad_frames;      /* connections closed for bad input */
    size_t local_bytes, local_events;       /* the local delivery queue */
    size_t deferred_bytes, deferred_events; /* local events behind a waiting handler */
    size_t connections;       /* not closed (max_connections counts them) */
    size_t read_buffer_bytes; /* of all connections (max_buffered counts them) */
    uint64_t stale_acks;      /* ACKs dropped: the connection their event came on was gone */
    uint64_t rbuf_adopted;    /* read buffers handed over to a kept array (lei_rbuf_adopt) */
    uint64_t undelivered, undelivered_bytes; /* async events of ours a connection's end (or no
                               * connection) dropped, not a queue policy: since the start */
    uint64_t unconfirmed, unconfirmed_bytes; /* async events of ours written to a peer that
                               * offered read confirmation, on connections that ended
                               * abnormally before it confirmed them read: since the start */
} lei_stats_ctx;

typedef struct lei_stats_peer {
    lei_pstats st;
    uint64_t confirmed;       /* async events it confirmed read (read confirmation) */
    uint64_t unconfirmed, unconfirmed_bytes; /* written to it, never confirmed: their
                               * connection ended abnormally first */
    int confirms;             /* its current connection confirms reads (it offered) */
    size_t queue_bytes, queue_events;       /* waiting for the socket */
    uint64_t hb_in, hb_out, timeouts, gaps, lost, dups; /* liveness and sequences */
    uint64_t refused;         /* events dropped: their BIND had no valid ticket */
} lei_stats_peer;

typedef struct lei_stats_chan {
    uint64_t ev_out, bytes_out, ev_in, bytes_in, drops, ev_local, encodes;
    uint64_t gaps, lost, dups;
    uint64_t refused;         /* events dropped from producers without a valid ticket */
    uint64_t ev_nodest;       /* events submitted with no destination, remote or local */
    uint64_t undelivered;     /* of drops: lost with a connection, not by a queue policy */
    int ndests;               /* remote consuming contexts */
} lei_stats_chan;

/* One consumer context's answer to a sync submit (lei_sync_reply). */
typedef struct lei_sync_answer {
    const char *addr;         /* the consuming context; NULL: the local consumers */
    int done;                 /* answered or failed */
    const char *err;          /* transport failure, or NULL */
    int code;                 /* that failure's code (LEI_E_*), set where it happened */
    const uint8_t *errs;      /* encoded handler errors from the ack, elen bytes */
    size_t elen;
} lei_sync_answer;

lei_ctx *lei_ctx_new(const lei_opts *o, const lei_hooks *h);
void lei_ctx_free(lei_ctx *c);
/* Listens on addr (the grammar of addr.h: "a.b.c.d:PORT", "[V6]:PORT",
 * "unix:/PATH"; port 0: the OS chooses) and decides the address peers are
 * told (lei_addr_advertise's rule; advertise and toward, the name server,
 * may be NULL).  0, or -LEI_E_INVALID (a bad address, or without an
 * identity one other than loopback or unix: protected mode) or -LEI_E_IO (the
 * socket calls: in use, a live unix socket or a file that is not a socket
 * at the path, ...), with a message in err[LEI_ADDR_ERR_MAX]. */
int lei_accept_listen(lei_ctx *c, const char *addr, const char *advertise, const char *toward,
                   char *err);
/* The context's loop (owned by the context) and options (read only). */
struct ev_loop *lei_ctx_loop(const lei_ctx *c);
const lei_opts *lei_ctx_opts(const lei_ctx *c);
/* Our advertised address ("" before lei_accept_listen). */
const char *lei_ctx_addr(const lei_ctx *c);
/* The address we are bound to ("" before lei_accept_listen). */
const char *lei_ctx_bound(const lei_ctx *c);
/* A callback of the embedder's own (a timer, a watcher) begins or ends:
 * the context counts its nesting like that of its hooks. */
void lei_ctx_enter(lei_ctx *c);
void lei_ctx_leave(lei_ctx *c);
/* > 0 inside a hook or an entered callback. */
int lei_ctx_depth(const lei_ctx *c);
/* live.c: before a request that needs peers (a sync submit, a call, a
 * join): the connections whose remote closed while this process did not
 * run its loop are read to their close now (non-blocking loop turns), so
 * that the request dials afresh instead of being written to a dead socket
 * (EPIPE); those peers may be dialled at once.  The number found. */
int lei_live_catch_up(lei_ctx *c);
/* rbuf.c: the read buffer holding [p, p + n), a received array's bytes
 * during its dispatch, handed over instead of copied (the caller owns the
 * returned address: free(); p stays valid while it does), when n is at
 * least half the buffer and no frame further down the stack reads from it;
 * NULL else (copy the bytes). */
uint8_t *lei_rbuf_adopt(lei_ctx *c, const void *p, size_t n, size_t *cap);
/* rbuf.c: an adopted buffer of cap bytes given back (its owner let go):
 * kept for the next large frames' read buffers, or freed. */
void lei_rbuf_return(lei_ctx *c, uint8_t *b, size_t cap);
/* rbuf.c: an adopted buffer given back by its owner, who let go of it
 * (kept or freed as lei_rbuf_return says; no longer counted as out). */
void lei_rbuf_give(lei_ctx *c, uint8_t *b, size_t cap);
/* rbuf.c: 1 when the embedder should collect what its program let go of
 * now: no spare fits the next frame of cap bytes (0: the size of the last
 * buffer adopted) and at least min_out adopted buffers are out. */
int lei_rbuf_collect_due(const lei_ctx *c, size_t cap, size_t min_out);
/* The embedder encoded a value (for the context, for channel chid). */
void lei_ctx_count_encode(lei_ctx *c);
void lei_chan_count_encode(lei_ctx *c, uint32_t chid);
void lei_ctx_stats(const lei_ctx *c, lei_stats_ctx *out);
/* The last loss counted in lei_stats_ctx.undelivered: "ADDR: reason" ("": none). */
const char *lei_ctx_undelivered_why(const lei_ctx *c);
/* The last connection counted in lei_stats_ctx.unconfirmed: "ADDR: reason" ("": none). */
const char *lei_ctx_unconfirmed_why(const lei_ctx *c);
/* log.c: one line to the log hook (lei_hooks log), or stderr. */
void lei_logf(lei_ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The kinds of refusal lei_ratelog counts apart (issue 11: a refused peer
 * costs at most one log line per kind per window).  The enum lives here,
 * not in ctx_int.h, so the binding and moe.c can log through it too.
 * Append new kinds before LEI_RL_NKINDS. */
enum lei_ratelog_kind {
    LEI_RL_HANDSHAKE_TIMEOUT, /* accept.c: not UP within handshake_timeout */
    LEI_RL_CONNECTIONS,       /* accept.c, peer.c: past max_connections */
    LEI_RL_ACCEPT,            /* accept.c: accept() failed (EMFILE, ENFILE, ...) */
    LEI_RL_FRAME,             /* rbuf.c: a frame past max_frame or the buffer budget */
    LEI_RL_BIND_INDEX,        /* conn_io.c: a BIND index out of range */
    LEI_RL_HELLO_ADDR,        /* handshake.c: a HELLO address refused */
    LEI_RL_CHANNELS,          /* chan.c: past max_channels */
    LEI_RL_PEERS,             /* peer.c / members: past max_peers */
    LEI_RL_MEMBERS,           /* members lists refused */
    LEI_RL_VALUE,             /* decoders: a value past max_value_bytes */
    LEI_RL_MODULATOR,         /* modulator refusals and unloads */
    LEI_RL_REFUSED_BINDS,     /* conn_io.c: too many BINDs of channels refused or not here */
    LEI_RL_HANDSHAKE,         /* conn.c: bad input before UP (garbage, untrusted key, ...) */
    LEI_RL_LIVENESS,          /* live.c: no handshake / no heartbeat within the deadline */
    LEI_RL_TAKEOVER,          /* handshake.c: a HELLO claiming an address with a live connection */
    LEI_RL_SLOW_ACKS,         /* peer.c: a peer leaving queue_limit bytes of our ACKs unread */
    LEI_RL_SLOW_CTRL,         /* peer.c: a peer leaving queue_limit bytes of our CTRL frames (replies) unread */
    LEI_RL_DIAL,              /* conn_io.c: a dial failed ("cannot reach") */
    LEI_RL_NKINDS
};
#define LEI_RATELOG_WINDOW 10.0
/* Logs like lei_logf, but at most one line per kind per log_window seconds
 * (option; default LEI_RATELOG_WINDOW): the first refusal of a window is
 * logged, the others counted, and the next line logged says "(N more in the
 * last 10 s)". */
void lei_ratelog(lei_ctx *c, int kind, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* on: async EVENTs of one read go to the events hook together (when it is
 * set), not one by one through event. */
void lei_ctx_batch(lei_ctx *c, int on);
/* From an event or ctrl hook about to return -1 (a value it refuses): why,
 * for the ERROR the peer gets ("malformed event value: <why>"). */
void lei_ctx_refusal(lei_ctx *c, const char *why);

/* Finds or creates the channel with this full name; returns its id, or
 * UINT32_MAX (out of memory, or max_channels open: lei_chan_at_limit). */
uint32_t lei_chan_open(lei_ctx *c, const char *name, size_t len);
/* The channel with this id (an opaque handle), or NULL. */
lei_chan *lei_chan_get(lei_ctx *c, uint32_t id);
/* Channels are numbered 0 .. lei_chan_total - 1, for the context's life. */
uint32_t lei_chan_total(const lei_ctx *c);
/* max_channels are open: lei_chan_open of a new name fails. */
int lei_chan_at_limit(const lei_ctx *c);
/* The full name of channel id (NULL: no such channel). */
const char *lei_chan_name(const lei_ctx *c, uint32_t id);
/* 0, or -1 when there is no such channel. */
int lei_chan_stats(const lei_ctx *c, uint32_t id, lei_stats_chan *out);
/* Local consumers of the channel exist (on) or not.  When they appear again
 * the sequence tracking of the channel starts over: what was sent while
 * nobody here listened is not a gap. */
void lei_chan_set_local(lei_ctx *c, uint32_t id, int on);
/* Marks channel id a call channel (svc:NAME): its events are not
 * sequence-checked (calls carry producer 1, seq 1). */
void lei_chan_set_calls(lei_ctx *c, uint32_t id, int on);
/* Replaces the remote destinations of a channel (addresses of consuming
 * contexts, our own excluded by the caller). */
void lei_peer_set_dests(lei_ctx *c, uint32_t id, const char **addrs, int n);

/* 1 when a live destination of the channel has a full queue (a submit
 * would block or drop). */
int lei_chan_full(lei_ctx *c, uint32_t chid);
/* 1 when an event submitted on chid now would go somewhere: a remote
 * consuming context or a local consumer. */
int lei_chan_has_dest(lei_ctx *c, uint32_t chid);

/* Finds the peer for addr, creating it (and dialling it) when create is set. */
lei_peer *lei_peer_get(lei_ctx *c, const char *addr, int create);
/* Peer idx (1-based, stable while the peer lives; NULL: none, or freed).
 * A peer nothing uses is freed a while after (ctx_int.h); its idx may then
 * name a new peer, after the hook was told the old one went down. */
lei_peer *lei_peers_by_idx(lei_ctx *c, int idx);
/* The peers now: lei_peers_at(c, 0 .. lei_peer_total - 1), any order. */
int lei_peer_total(const lei_ctx *c);
lei_peer *lei_peers_at(lei_ctx *c, int i);
int lei_peer_idx(const lei_peer *p);
/* The remote context's listen address. */
const char *lei_peer_addr(const lei_peer *p);
/* 1 when the handshake is done on the peer's current connection (UP, or
 * CLOSING: still delivering).  The same test as the inline lei_peer_is_up
 * the transport's files use (ctx_int.h), out of line for the binding. */
int lei_peer_up(const lei_peer *p);
/* Why the last connection ended ("" if none did). */
const char *lei_peer_reason(const lei_peer *p);
/* What p's last loss was beyond its text and its code (the peer hook's),
 * set where it happened: the hook and a caller read flags here, never the
 * reason's words.  Zero while a connection is up.  The hook reads it when
 * told (the next loop turn): the loss it is told of, p being dialled again
 * only after its backoff. */
typedef struct lei_loss {
    /* A dial of ours did not connect: connect() failed (refused, no route,
     * timed out, no socket at that path) or the address has port 0: the
     * address cannot be reached from here.  Not a refused handshake, not
     * a failure of this side (no descriptor, max_connections). */
    int unreached;
    /* Keyed: the remote showed, in its HELLO_OK, an identity the address's
     * principal pin refuses (a name server's address, lei_auth_expect_principal):
     * the principal and key it claimed (not proven: refused before its
     * signature counts); "" when not so. */
    char principal[LEI_NAME_MAX + 1];
    uint8_t key[32];
} lei_loss;
const lei_loss *lei_peer_loss(const lei_peer *p);
/* The record cipher of p's keyed connection while it is up ("aes-256-gcm",
 * "chacha20-poly1305"), NULL otherwise (down, or protected mode). */
const char *lei_peer_cipher(const lei_peer *p);
void lei_peer_stats(const lei_peer *p, lei_stats_peer *out);
/* The bytes that came from p and wait in the kernel, not read yet (FIONREAD
 * on its current connection; 0 without one): whether a context that did
 * not read for a while has something of p waiting (lua/lecho/modulator.lua
 * _end_watch: a stream is not quiet while its backlog waits unread). */
size_t lei_peer_unread(const lei_peer *p);

/* 1 when every live destination of channel chid has room in its queue,
 * after writing what the sockets take now; 0 when a submit under the block
 * policy must wait (the write watcher is armed: the loop wakes when room
 * may have come). */
int lei_submit_room(lei_ctx *c, uint32_t chid);

/* Queues an event of channel chid for every destination and the local
 * consumers.  Takes its own references on msg.  sync: a sync record is made
 * and its id stored in *sync_id.  Never runs the loop and never waits: under
 * the block policy the caller waits for lei_submit_room first (a submit may
 * then take a queue past its limit by one event).  Local consumers run from
 * the loop, in order.  Returns 0, or -LEI_E_NOTFOUND (no such channel),
 * -LEI_E_LIMIT (over max_frame) or -LEI_E_NOMEM with *err (nothing was
 * queued anywhere, no record left). */
int lei_submit(lei_ctx *c, uint32_t chid, uint64_t producer, uint64_t seq, lei_msg *msg,
               int sync, int policy, uint64_t *sync_id, const char **err);
/* A call: msg as a sync event (producer 1, seq 1) to ONE destination of
 * channel chid: dest, one of its current destinations, or NULL for its
 * local consumers.  The answer is the ACK of *sync_id, whose value is the
 * reply (lei_sync_reply: errs/elen).  -LEI_E_NOTFOUND "no such destination"
 * when dest is not a destination (NULL: no local consumer); an unreachable
 * dest fails the record at once, as lei_submit does.  Takes its own
 * references on msg; the record is the context's until lei_sync_free. */
int lei_call(lei_ctx *c, uint32_t chid, const char *dest, lei_msg *msg, int policy,
             uint64_t *sync_id, const char **err);
/* Sends a control message (an encoded value) to addr.  0, or, the peer
 * unreachable, the negative of the code of why (*err says it: refused,
 * io, ... from where its connection failed, else -LEI_E_CLOSED), or
 * -LEI_E_NOMEM. */
int lei_send_ctrl(lei_ctx *c, const char *addr, lei_msg *msg, const char **err);
/* peer.c: acknowledges sync event `sync` received from peer (NULL: local). errs: the
 * encoded handler errors or NULL. */
void lei_ack(lei_ctx *c, lei_peer *from, uint64_t sync, uint64_t nran, const uint8_t *errs,
             size_t elen);
/* lei_ack only if from's connection is still generation gen (lei_peer_gen
 * when the event was dispatched): an answer never goes to another process
 * that took the address meanwhile; else dropped and counted (stale_acks). */
void lei_ack_gen(lei_ctx *c, lei_peer *from, uint64_t gen, uint64_t sync, uint64_t nran,
                 const uint8_t *errs, size_t elen);
uint64_t lei_peer_gen(const lei_peer *p);
/* Bytes of ACK frames queued to p, not written yet. */
size_t lei_peer_ack_bytes(const lei_peer *p);
/* The sync record of a submit (NULL: no such record, or freed). */
lei_sync *lei_sync_find(lei_ctx *c, uint64_t id);
/* Consumer contexts that have not answered yet (0: the submit is over). */
int lei_sync_pending(const lei_sync *s);
/* Handlers that ran, summed over the answers. */
uint64_t lei_sync_nran(const lei_sync *s);
/* The number of consumer contexts waited for; lei_sync_reply fills in the
 * answer of the i-th (0-based).  Pointers stay valid until lei_sync_free. */
int lei_sync_nreplies(const lei_sync *s);
void lei_sync_reply(const lei_sync *s, int i, lei_sync_answer *out);
void lei_sync_free(lei_ctx *c, lei_sync *s);
/* Settled-record notice (the Lua scheduler resumes only the waiters whose
 * records settled this turn): lei_sync_watch(c, s) puts s's id on the
 * settled list once no wait of it is pending; lei_sync_done_take empties
 * that list into *ids (valid until the next watch), its count, or -1 when
 * a push failed for lack of memory (look at every watched record). */
void lei_sync_watch(lei_ctx *c, lei_sync *s);
int lei_sync_done_take(lei_ctx *c, const uint64_t **ids);
/* Writes every ready queue now. */
void lei_peer_flush_all(lei_ctx *c);
/* Runs the local delivery queue until it is empty. */
void lei_drain_local(lei_ctx *c);
/* At most n local handlers run per loop turn (n <= 0: the default, 4096).
 * Close's local delivery (lecho.context) sets 1: between two handlers it
 * sees its linger's end and a signal (a turn of 30 slow handlers ran all
 * of them past the linger: outside attack s8 F4, F3). */
void lei_local_batch(lei_ctx *c, int n);
/* Closes a peer's connection, dropping its queue, with a logged reason. */
void lei_peer_close(lei_peer *p, const char *reason);
/* The suspended dispatch from `from` finished (NULL: a local one of
 * channel chid; other channels' local events went on meanwhile): what it
 * held back is handed over from the next loop turn. */
void lei_resume(lei_ctx *c, lei_peer *from, uint32_t chid);

/* ---- identity and trust (auth.c; design: doc/wire-format.md) ----------
 * A context with an identity is keyed: every connection is authenticated
 * and encrypted; one without is in protected mode.  Returns 0, or the
 * negative of an errors.h code. */
/* Our Ed25519 identity: sk (64 bytes, seed || pk: the embedded pk must be
 * the seed's), a principal name (1..64 of [A-Za-z0-9._-]) and optionally an
 * authority's certificate of cert_len bytes (doc/security.md: 64 is an old
 * v1 one, sent as such and refused by peers).  -LEI_E_INVALID with
 * err[160], also once a connection exists.  Set it before lei_accept_listen
 * to listen on other than loopback or unix addresses. */
int lei_auth_set_identity(lei_ctx *c, const uint8_t sk[64], const char *name, const uint8_t *cert,
                         size_t cert_len, char *err);
/* Trusts pk for principal `name` (a second call for pk renames it). */
int lei_auth_trust_key(lei_ctx *c, const uint8_t pk[32], const char *name);
/* Trusts every (name, pk) an authority certified, within the authority's
 * own validity [not_before, not_after) (Unix seconds; 0: unbounded); a
 * second call for pk sets its validity. */
int lei_auth_trust_authority(lei_ctx *c, const uint8_t pk[32], uint64_t not_before,
                            uint64_t not_after);
/* The revoked keys: n keys of 32 bytes at pks (replacing the list before).
 * Refused at every handshake from now on; live connections of them are
 * closed now (one log line each).  Returns how many were closed, or
 * -LEI_E_NOMEM (the list before stays). */
int lei_auth_set_revoked(lei_ctx *c, const uint8_t *pks, size_t n);
int lei_auth_keyed(const lei_ctx *c);
/* Signs m with our identity: 0, or -LEI_E_INVALID when there is none. */
int lei_auth_sign(const lei_ctx *c, const void *m, size_t n, uint8_t sig[64]);
/* Pins addr to pk: a connection to or from addr must authenticate with it;
 * one up with another key is closed now. */
int lei_auth_expect(lei_ctx *c, const char *addr, const uint8_t pk[32]);
/* Pins addr to principal `name` (a name server address: nameserver_principal):
 * a connection to or from addr must authenticate with a key certified or
 * trusted for that name, checked in the handshake before the connection is
 * up and anything queued for addr is written; one up as another principal
 * is closed now.  0, or -LEI_E_INVALID (address or name too long),
 * -LEI_E_NOMEM. */
int lei_auth_expect_principal(lei_ctx *c, const char *addr, const char *name);
/* The authenticated key (32 bytes) and principal of the peer's current or
 * last connection; NULL in protected mode or before one authenticated. */
const uint8_t *lei_auth_peer_key(const lei_peer *p);
/* Has peer p's current connection bound channel chid here (its BIND taken:
 * open here; keyed, with a ticket of the channel's manager for p's key, not
 * expired)?  The word of a producer of chid about it (mod_error) is
 * believed only then. */
int lei_auth_peer_binds(const lei_peer *p, uint32_t chid);
/* Queues a BIND of channel chid to the peer at addr now (as its first
 * event would; nothing when already bound): a producer that reports on the
 * channel before it sent an event proves it may (mod_error).  -1 when the
 * peer is not live or (keyed) we have no ticket for chid. */
int lei_peer_bind(lei_ctx *c, const char *addr, uint32_t chid);
const char *lei_auth_peer_principal(const lei_peer *p);
/* Consumer side: the channel manager's key, against which BIND tickets of
 * the channel (and its derived streams) are verified.  In keyed mode a BIND
 * without a valid ticket, or for a channel not open here, is refused: its
 * events are dropped and counted (stats refused), a sync one answered with
 * 0 handlers and "not an authorized producer of NAME". */
int lei_auth_set_manager_key(lei_ctx *c, uint32_t chid, const uint8_t pk[32]);
/* Producer side: the ticket our BINDs of the channel carry (72 bytes: its
 * u64 big-endian expiry, then the manager's signature; doc/security.md). */
int lei_auth_set_ticket(lei_ctx *c, uint32_t chid, const uint8_t t[72]);

/* Graceful close, step one: stop accepting, write every queue, then end
 * each connection with a FIN once its queue is empty and read until the
 * remote closes too (it then has read everything we sent).  Nothing is
 * dropped; lei_ctx_free later drops what is left. */
void lei_ctx_shutdown(lei_ctx *c);
/* Closes the listening socket (a close asked for from inside a callback). */
void lei_ctx_stop_listening(lei_ctx *c);
/* After lei_ctx_shutdown: connections still open, and the events and bytes
 * still queued on them (not yet written). */
int lei_ctx_pending(lei_ctx *c, uint64_t *events, uint64_t *bytes);
/* Close's report after the linger, from one walk of the open connections:
 * returns those where an event of ours may be unread: events were queued
 * to their peer and the last of them is not a sync event the peer answered
 * (an ACK says everything before it on the connection was read too), nor
 * one the peer confirmed reading with all before it (read confirmation)
 * with nothing left queued; and sets *events, *bytes to the async events
 * (and their bytes) written on them to peers that confirm reads, not
 * confirmed yet. */
int lei_ctx_unsure(const lei_ctx *c, uint64_t *events, uint64_t *bytes);

#endif
