/* handshake.c: the handshake state machine of a connection (protocol 2),
 * the engine the security mechanisms plug into: it walks a connection's
 * states, reads the HELLO or HELLO_OK both modes share (the protocol
 * version, the address a dialler claims), and ties the connection to the
 * peer of that address: the tie-break of simultaneous dials, the rule that
 * no HELLO replaces a live connection, the peer told up.  What a mode says
 * and proves in its frames is its mechanism's (k->mech, ctx_int.h): our
 * HELLO and HELLO_OK, the checks of the remote's, and for keyed contexts
 * the transcript signatures, trust and pins, the record cipher's choice,
 * AUTH and the switch to records (secure.c; plain.c has none of those).
 * This file reads no mechanism's state: a peer's key comes from `remote`.
 *
 * The sockets are conn.c's, the peers peer.c's and peers.c's.  No Lua here.
 */
#define _GNU_SOURCE
#include "ctx_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the handshake -------------------------------------------------------
 *
 * A connection walks one way through enum lei_conn_state (ctx_int.h):
 *
 *   protected mode (no keys):
 *   dialled:  DIALING --connected, HELLO sent--> HELLO_SENT --HELLO_OK--> UP
 *   accepted:                                    HELLO_WAIT --HELLO-----> UP (HELLO_OK sent)
 *   keyed mode:
 *   dialled:  DIALING --HELLO sent--> HELLO_SENT --HELLO_OK verified, AUTH sent,
 *             records on--> AUTH_SENT --AUTH_OK (a record)--> UP
 *   accepted: HELLO_WAIT --HELLO trusted, signed HELLO_OK sent--> AUTH_WAIT
 *             --AUTH verified, records on, AUTH_OK sent--> UP
 *   UP --queue written while closing, FIN--> CLOSING
 *   UP or CLOSING --disconnect policy, FIN--> RETIRED
 *   any --error, remote closed, dead, superseded--> CLOSED
 *
 * Before UP only handshake frames and ERROR count; the protocol version
 * and the mode are checked in one place (hello_read) for both directions.
 * The mechanism's steps: hello (our HELLO, HELLO_OK), hello_check and
 * hello_in (the remote's), auth_in (AUTH, AUTH_OK: keyed only; hello_in
 * says whether that step follows), refused (an ERROR before UP). */

/* The reason sent to the loser of simultaneous dials: it keeps its queue
 * and waits for the connection the winner dialled. */
static const char DUP_REASON[] = "duplicate connection: the one dialled by the smaller address wins";

/* The dial connected: our HELLO goes out. */
void lei_handshake_hello(lei_conn *k) {
    uint8_t b[LEI_HELLO_MAX];
    lei_conn_write_now(k, b, k->mech->hello(k, LEI_F_HELLO, b));
}

/* Reads the remote's HELLO (want LEI_F_HELLO, we were dialled) or HELLO_OK
 * (we dialled).  Returns 0, or -1 after closing k as bad input. */
static int hello_read(lei_conn *k, const lei_frame *f, uint8_t want, lei_hello *h) {
    const char *err = NULL;
    char why[160];
    if (f->type != want) {
        err = want == LEI_F_HELLO ? "expected a handshake (HELLO) first"
                                  : "expected a handshake answer (HELLO_OK)";
    } else if (lei_parse_hello(f->body, f->len, h, &err)) {
        /* err set */
    } else if (h->version != LEI_PROTO_VERSION) {
        snprintf(why, sizeof why, "protocol version mismatch: peer speaks %u, this side speaks %u",
                 h->version, LEI_PROTO_VERSION);
        err = why;
    } else {
        err = k->mech->hello_check(k, h, want); /* the mode, and the mode's fields */
    }
    if (!err) return 0;
    lei_conn_close(k, err, 1);
    return -1;
}

/* -> UP: k serves p from now on.  An accepted connection answers HELLO_OK
 * (protected) or AUTH_OK (keyed, the first record) first; a keyed peer's
 * identity is recorded (an address is bound to a key by its live
 * connection, and beyond it only by an explicit pin: a first-come pin let
 * any trusted key squat an address not yet in use); then the peer is told
 * up and what queued for it while it was down goes out. */
static void handshake_up(lei_conn *k, lei_peer *p, uint64_t incarnation) {
    lei_ctx *c = k->ctx;
    enum lei_conn_state was = k->state;
    k->peer = p;
    p->conn = k;
    p->gen = ++c->conn_gen;
    k->state = LEI_CONN_UP;
    lei_dial_done(k);
    p->await_in = 0;
    p->reason[0] = '\0';
    p->reason_code = p->next_code = 0;
    p->policy_cut = 0; /* what this connection loses is undelivered (peer.c) */
    memset(&p->loss, 0, sizeof p->loss);
    memset(&p->next_loss, 0, sizeof p->next_loss);
    const lei_hello *r = k->mech->remote(k);
    if (r) {
        p->has_key = 1;
        memcpy(p->key, r->idpk, 32);
        memcpy(p->principal, r->name, sizeof p->principal);
        lei_cert_watch(k); /* closed when its certificate ends */
    }
    lei_live_peer_up(p, incarnation);
    if (was == LEI_CONN_HELLO_WAIT) {
        uint8_t b[LEI_HELLO_MAX];
        lei_conn_write_now(k, b, k->mech->hello(k, LEI_F_HELLO_OK, b));
    } else if (was == LEI_CONN_AUTH_WAIT) {
        uint8_t b[LEI_FRAME_HDR];
        lei_frame_hdr(b, LEI_F_AUTH_OK, 0);
        lei_conn_write_now(k, b, sizeof b);
    }
    lei_peer_note(p, 1, NULL);
    if (p->held) ev_io_stop(c->loop, &k->rio);
    lei_peer_flush(p);
}

/* The remote (HELLO, or AUTH when keyed) is who it says: tie k to the peer
 * of that address.  With two connections between the same pair of contexts
 * the one dialled by the smaller address wins, so both sides agree on one;
 * a connection that is up and heard from lately is never replaced (a real
 * restart's old connection dies first, by RST or the liveness timeout).
 * Returns 0 (k is UP), or -1 (k must be closed; an ERROR already sent). */
/* How long a quiet connection still counts as live for a takeover: until
 * the liveness timeout would close it (heartbeat * heartbeat_misses, at
 * least 1 s).  One heartbeat was the bound before, but a peer hears from a
 * quiet connection only every heartbeat, so a HELLO landing just past it
 * (a late timer on a busy host) replaced a live connection. */
static double live_window(const lei_ctx *c) {
    double w = c->o.heartbeat * c->o.heartbeat_misses;
    return w > 1.0 ? w : 1.0;
}

static int hello_accepted(lei_conn *k, const lei_hello *h) {
    lei_ctx *c = k->ctx;
    lei_peer *p = lei_peers_find(c, h->addr);
    if (p && p->conn && p->conn->state != LEI_CONN_CLOSED && p->conn != k) {
        lei_conn *old = p->conn;
        const lei_hello *rold = old->mech->remote(old), *rk = k->mech->remote(k);
        if (old->state == LEI_CONN_DIALING || old->state == LEI_CONN_HELLO_SENT ||
            old->state == LEI_CONN_AUTH_SENT) {
            if (strcmp(c->addr, h->addr) < 0) {
                lei_conn_send_error(k, DUP_REASON);
                return -1;
            }
            /* Ours loses: adopt the inbound one, keep the queue. */
            p->conn = NULL;
            old->peer = NULL;
            lei_conn_close(old, "superseded", 0);
        } else if (rold && rk && memcmp(rold->idpk, rk->idpk, 32) != 0) {
            /* Keyed: a live connection binds its address to its key; no
             * HELLO of another identity replaces it, however quiet it is. */
            char why[LEI_ADDR_MAX + 80];
            snprintf(why, sizeof why, "address %s belongs to another identity", h->addr);
            lei_ratelog(c, LEI_RL_TAKEOVER,
                        "refusing a connection claiming %s: its live connection is another identity's",
                        h->addr);
            lei_conn_send_error(k, why);
            return -1;
        } else if (ev_now(c->loop) - old->last_in < live_window(c)) {
            if (p->lv.incarnation == h->incarnation) {
                /* The same process: a HELLO of a crossing dial that arrives
                 * late (its sender already took ours). */
                lei_conn_send_error(k, DUP_REASON);
            } else {
                char why[LEI_ADDR_MAX + 80];
                snprintf(why, sizeof why, "address %s already has a live connection", h->addr);
                lei_ratelog(c, LEI_RL_TAKEOVER, "refusing a connection claiming %s: it has a live one",
                            h->addr);
                lei_conn_send_error(k, why);
            }
            return -1;
        } else {
            lei_conn_close(old, "replaced by a new connection from the same context", 0);
        }
    }
    if (!p && !(p = lei_peers_new(c, h->addr))) return -1;
    handshake_up(k, p, h->incarnation);
    return 0;
}

/* An ERROR before UP on a connection we dialled.  Returns -1 (k closed). */
static int dial_refused(lei_conn *k, const lei_frame *f) {
    lei_ctx *c = k->ctx;
    lei_peer *p = k->peer;
    char why[256];
    if (p && p->conn == k && f->len == sizeof DUP_REASON - 1 &&
        memcmp(f->body, DUP_REASON, f->len) == 0) {
        /* We lost the tie-break: the remote's own connection comes.
         * Nothing of the queue was written on this one (the handshake was
         * not done): the queue, BINDs included, goes whole on the next one. */
        p->conn = NULL;
        p->await_in = ev_now(c->loop) + AWAIT_IN_SECONDS;
        lei_expiry_at(c, p->await_in);
        k->peer = NULL;
        lei_conn_close(k, "lost the tie-break of simultaneous dials", 0);
        return -1;
    }
    if (k->mech->refused(k, f)) return -1; /* the mode's (keyed: a refused cipher offer) */
    snprintf(why, sizeof why, "refused by peer: %.*s", (int)(f->len > 200 ? 200 : f->len),
             (const char *)f->body);
    lei_logf(c, "connection to %s %s", p ? p->addr : "?", why);
    if (p && p->conn == k) p->next_code = LEI_E_REFUSED; /* the loss's code, for its syncs and the peer hook */
    lei_conn_close(k, why, 0);
    return -1;
}

/* Another connection took over k's peer meanwhile: 1 after closing k. */
static int superseded(lei_conn *k) {
    lei_peer *p = k->peer;
    if (p && p->conn == k) return 0;
    k->peer = NULL;
    lei_conn_close(k, "superseded by another connection to the same context", 0);
    return 1;
}

/* HELLO_SENT: the remote answered our HELLO.  Returns 0 (k is UP, or keyed:
 * AUTH_SENT), or -1 after closing k. */
static int hello_answered(lei_conn *k, const lei_frame *f) {
    lei_hello h;
    if (f->type == LEI_F_ERROR) return dial_refused(k, f);
    if (hello_read(k, f, LEI_F_HELLO_OK, &h) || superseded(k)) return -1;
    int r = k->mech->hello_in(k, f, &h);
    if (r < 0) return -1;
    if (r == 0) { /* keyed: our AUTH is out, records on */
        k->state = LEI_CONN_AUTH_SENT;
        return 0;
    }
    handshake_up(k, k->peer, h.incarnation);
    return 0;
}

/* AUTH_SENT: the acceptor's first record: AUTH_OK, or an ERROR. */
static int auth_answered(lei_conn *k, const lei_frame *f) {
    if (f->type == LEI_F_ERROR) return dial_refused(k, f);
    if (f->type != LEI_F_AUTH_OK || f->len != 0) {
        lei_conn_close(k, "expected AUTH_OK", 1);
        return -1;
    }
    if (superseded(k)) return -1;
    if (k->mech->auth_in(k, f)) return -1;
    handshake_up(k, k->peer, k->mech->remote(k)->incarnation);
    return 0;
}

/* AUTH_WAIT: the dialler's AUTH proves it holds its identity's key. */
static int auth_read(lei_conn *k, const lei_frame *f) {
    if (f->type != LEI_F_AUTH || f->len != LEI_SIG_BYTES) {
        lei_conn_close(k, "expected AUTH", 1);
        return -1;
    }
    if (k->mech->auth_in(k, f)) return -1;
    if (hello_accepted(k, k->mech->remote(k))) {
        lei_conn_close(k, "handshake refused", 0);
        return -1;
    }
    return 0;
}

/* A dialling peer's claimed address must be an address in its canonical
 * text (addr.h): two spellings of one address would make two peers of it
 * and break the smaller-address-wins rule.  (The HELLO_OK of a dial we made
 * names the address we dialled: ours to trust.) */
static int addr_canonical(const char *text) {
    lei_addr a;
    const char *why;
    char canon[LEI_ADDR_TEXT_MAX];
    return lei_addr_parse(text, 0, &a, &why) == 0 &&
           lei_addr_format(&a, canon, sizeof canon) >= 0 && strcmp(canon, text) == 0;
}

/* Why a dialling peer's claimed address is refused, or NULL: it must be an
 * address we could dial back (no control characters, canonical, not a
 * wildcard, port 0 refused by the parser), one context's (not broadcast or
 * multicast), in one spelling (not IPv4-mapped IPv6) and not ours. */
static const char *hello_addr_refused(const lei_ctx *c, const char *text, char *buf, size_t size) {
    for (const unsigned char *q = (const unsigned char *)text; *q; q++)
        if (*q < 0x20 || *q == 0x7f) return "bad address in handshake: a control character";
    if (!addr_canonical(text)) return "bad address in handshake: not an address in canonical form";
    lei_addr a;
    const char *why;
    if (lei_addr_parse(text, 0, &a, &why) == 0 && lei_addr_is_wildcard(&a))
        return "bad address in handshake: a wildcard address cannot be dialled";
    const char *no = lei_addr_parse(text, 0, &a, &why) == 0 ? lei_addr_unclaimable(&a) : NULL;
    if (no) {
        snprintf(buf, size, "bad address in handshake: %s", no);
        return buf;
    }
    if (strcmp(text, c->addr) == 0 || strcmp(text, c->bound) == 0)
        return "bad address in handshake: this context's own address";
    return NULL;
}

/* HELLO_WAIT: the remote introduced itself. */
static int hello_received(lei_conn *k, const lei_frame *f) {
    lei_hello h;
    if (hello_read(k, f, LEI_F_HELLO, &h)) return -1;
    char buf[160];
    const char *bad = hello_addr_refused(k->ctx, h.addr, buf, sizeof buf);
    if (bad) { /* malformed input: told, logged and counted as such */
        lei_conn_close(k, bad, 1);
        return -1;
    }
    int r = k->mech->hello_in(k, f, &h);
    if (r < 0) return -1;
    if (r == 0) { /* keyed: our signed HELLO_OK is out; bound once AUTH proves the key */
        k->state = LEI_CONN_AUTH_WAIT;
        return 0;
    }
    if (hello_accepted(k, &h)) {
        lei_conn_close(k, "handshake refused", 0);
        return -1;
    }
    return 0;
}

int lei_handshake_frame(lei_conn *k, const lei_frame *f) {
    switch (k->state) {
    case LEI_CONN_HELLO_SENT:
        return hello_answered(k, f);
    case LEI_CONN_AUTH_SENT:
        return auth_answered(k, f);
    case LEI_CONN_AUTH_WAIT:
        return auth_read(k, f);
    default:
        return hello_received(k, f);
    }
}


