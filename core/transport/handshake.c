/* handshake.c: the handshake state machine of a connection (protocol 2):
 * HELLO / HELLO_OK in both modes, and for keyed contexts the transcript
 * signatures, AUTH, AUTH_OK and the switch to records; trust, pins, the
 * tie-break of simultaneous dials and the rule that no HELLO replaces a
 * live connection.
 *
 * The crypto is secure.c's, the trust tables auth.c's, the sockets
 * conn.c's.  No Lua here.
 */
#define _GNU_SOURCE
#include "ctx_int.h"

#include <sodium.h>
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
 * and the mode are checked in one place (hello_read) for both directions. */

/* The reason sent to the loser of simultaneous dials: it keeps its queue
 * and waits for the connection the winner dialled. */
static const char DUP_REASON[] = "duplicate connection: the one dialled by the smaller address wins";
/* What a v3 acceptor of before the record cipher offer answers a mode 2
 * HELLO (frame.c's parser): the dialler tries again in mode 1. */
static const char OLD_ACCEPTOR[] = "bad mode in handshake";

/* Our HELLO (dialled) or HELLO_OK (accepted) into b[LEI_HELLO_MAX]; a keyed
 * one goes into the transcript, a keyed HELLO_OK ends with our signature. */
static size_t build_hello(lei_conn *k, uint8_t type, uint8_t *b) {
    lei_ctx *c = k->ctx;
    lei_sec *s = k->sec;
    if (!s) return lei_frame_hello(b, type, LEI_PROTO_VERSION, c->incarnation, c->addr, NULL);
    lei_hello key;
    memcpy(key.eph, s->eph_pk, 32);
    memcpy(key.idpk, c->id.pk, 32);
    memcpy(key.name, c->id.name, sizeof key.name);
    key.has_cert = (uint8_t)c->id.has_cert;
    key.cert_len = (uint16_t)c->id.cert_len;
    memcpy(key.cert, c->id.cert, c->id.cert_len);
    /* The record ciphers: a dialler offers those it has (mode 2), unless
     * its peer refused an offer just now (a v3 acceptor of before: mode 1,
     * this once); an acceptor answers an offer with its choice, a mode 1
     * HELLO in mode 1 (ChaCha20-Poly1305). */
    key.mode = LEI_MODE_KEYED;
    key.nsuites = 0;
    if (type == LEI_F_HELLO && k->peer && k->peer->no_offer) {
        k->peer->no_offer = 0;
        s->fallback = 1;
    } else if (type == LEI_F_HELLO) {
        key.nsuites = (uint8_t)lei_cipher_offer(c, key.suites);
        key.mode = LEI_MODE_KEYED_OFFER;
        s->offered = 1;
    } else if (!s->legacy) {
        key.nsuites = 1;
        key.suites[0] = s->cs->suite;
        key.mode = LEI_MODE_KEYED_OFFER;
    }
    size_t n = lei_frame_hello(b, type, LEI_PROTO_VERSION, c->incarnation, c->addr, &key);
    if (type == LEI_F_HELLO) {
        lei_sec_hash(s, b + LEI_FRAME_HDR, n - LEI_FRAME_HDR);
    } else {
        lei_sec_hash(s, b + LEI_FRAME_HDR, n - LEI_FRAME_HDR - LEI_SIG_BYTES);
        lei_sec_final(s);
        lei_sec_sign(c, s, 1, b + n - LEI_SIG_BYTES);
    }
    return n;
}

/* The dial connected: our HELLO goes out. */
void lei_handshake_hello(lei_conn *k) {
    uint8_t b[LEI_HELLO_MAX];
    lei_conn_write_now(k, b, build_hello(k, LEI_F_HELLO, b));
}

/* Reads the remote's HELLO (want LEI_F_HELLO, we were dialled) or HELLO_OK
 * (we dialled).  Returns 0, or -1 after closing k as bad input. */
static int hello_read(lei_conn *k, const lei_frame *f, uint8_t want, lei_hello *h) {
    const char *err = NULL;
    char why[160];
    int keyed = k->sec != NULL;
    if (f->type != want) {
        err = want == LEI_F_HELLO ? "expected a handshake (HELLO) first"
                                  : "expected a handshake answer (HELLO_OK)";
    } else if (lei_parse_hello(f->body, f->len, h, &err)) {
        /* err set */
    } else if (h->version != LEI_PROTO_VERSION) {
        snprintf(why, sizeof why, "protocol version mismatch: peer speaks %u, this side speaks %u",
                 h->version, LEI_PROTO_VERSION);
        err = why;
    } else if (keyed ? h->mode == LEI_MODE_PROTECTED : h->mode != LEI_MODE_PROTECTED) {
        err = keyed ? "mode mismatch: this side is keyed and refuses a peer without keys "
                      "(protected mode)"
                    : "mode mismatch: this side has no keys (protected mode) and refuses a "
                      "keyed peer";
    } else if (keyed && h->has_sig != (want == LEI_F_HELLO_OK)) {
        err = want == LEI_F_HELLO_OK ? "handshake answer without its signature"
                                     : "trailing bytes in handshake";
    } else if (keyed && !lei_name_ok(h->name, strlen(h->name))) {
        err = "bad principal name in handshake";
    }
    if (!err) return 0;
    lei_conn_close(k, err, 1);
    return -1;
}

/* The remote's identity (keyed): trusted, and the key pinned to its
 * address if any (addr: the address we dialled, or the one the remote
 * claims).  Returns 0, or -1 after closing k with an ERROR saying why. */
static int identity_check(lei_conn *k, const lei_hello *h, const char *addr, int dialled) {
    char why[LEI_ADDR_MAX + 2 * LEI_NAME_MAX + 200];
    if (lei_trusted(k->ctx, h, addr, why, sizeof why) == 0) {
        const lei_pin *pin = lei_pin_find(k->ctx, addr);
        int key_ok = !pin || !pin->has_pk || memcmp(pin->pk, h->idpk, 32) == 0;
        int name_ok = !pin || !pin->principal[0] || strcmp(pin->principal, h->name) == 0;
        if (key_ok && name_ok) return 0;
        char got[65], want[65];
        sodium_bin2hex(got, sizeof got, h->idpk, 32);
        sodium_bin2hex(want, sizeof want, pin->pk, 32);
        if (!dialled)
            snprintf(why, sizeof why, "address %s belongs to another identity", addr);
        else if (!key_ok)
            snprintf(why, sizeof why, "%s presented key %s, expected %s", addr, got, want);
        else /* a principal pin (a name server's address): refused before UP, nothing written */
            snprintf(why, sizeof why, "%s is principal %s (key %s), expected %s", addr, h->name, got,
                     pin->principal);
    }
    if (dialled && k->peer && k->peer->conn == k) k->peer->next_code = LEI_E_REFUSED; /* the loss's code */
    lei_conn_close(k, why, 1);
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
    p->reason_code = 0;
    if (k->sec) {
        p->has_key = 1;
        memcpy(p->key, k->sec->remote.idpk, 32);
        memcpy(p->principal, k->sec->remote.name, sizeof p->principal);
        lei_cert_watch(k); /* closed when its certificate ends */
    }
    lei_live_peer_up(p, incarnation);
    if (was == LEI_CONN_HELLO_WAIT) {
        uint8_t b[LEI_HELLO_MAX];
        lei_conn_write_now(k, b, build_hello(k, LEI_F_HELLO_OK, b));
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
        } else if (old->sec && k->sec &&
                   memcmp(old->sec->remote.idpk, k->sec->remote.idpk, 32) != 0) {
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
    if (p && p->conn == k && k->sec && k->sec->offered && f->len == sizeof OLD_ACCEPTOR - 1 &&
        memcmp(f->body, OLD_ACCEPTOR, f->len) == 0) {
        /* A v3 acceptor of before the record cipher offer: dialled again at
         * once in mode 1 (ChaCha20-Poly1305), the queue kept.  The new
         * connection says so in its first record (lei_sec_fallback_frame):
         * an acceptor that reads offers takes this refusal for a forgery
         * and closes, so it cannot downgrade two peers that have AES. */
        p->conn = NULL;
        k->peer = NULL;
        lei_conn_close(k, "refused the record cipher offer (a peer of before it)", 0);
        lei_ratelog(c, LEI_RL_HANDSHAKE,
                    "%s does not read record cipher offers (lecho of before them): dialling it "
                    "again in mode 1, chacha20-poly1305", p->addr);
        p->no_offer = 1;
        if (lei_conn_dial(p)) lei_peer_lost(p, p->reason[0] ? p->reason : "dial failed");
        return -1;
    }
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

/* The acceptor's choice of record cipher (keyed HELLO_OK): one of those
 * we offered, or none when we offered none (mode 1: ChaCha20-Poly1305).
 * Both HELLOs are in the transcript both signatures cover: an offer or a
 * choice changed on the way fails the signatures, it cannot downgrade.
 * 0, or -1 after closing k. */
static int cipher_answer(lei_conn *k, const lei_hello *h) {
    lei_sec *s = k->sec;
    const char *err = NULL;
    if (!s->offered) {
        if (h->mode != LEI_MODE_KEYED) err = "record cipher chosen, none offered (HELLO_OK)";
    } else if (h->mode != LEI_MODE_KEYED_OFFER || h->nsuites != 1) {
        err = "no record cipher chosen (HELLO_OK)";
    } else {
        uint8_t mine[LEI_SUITES_MAX];
        int n = lei_cipher_offer(k->ctx, mine);
        const lei_cipher *cs = lei_cipher_get(h->suites[0]);
        if (!cs || !memchr(mine, h->suites[0], (size_t)n))
            err = "record cipher chosen that was not offered (HELLO_OK)";
        else
            s->cs = cs;
    }
    if (!err) return 0;
    lei_conn_close(k, err, 1);
    return -1;
}

/* HELLO_SENT: the remote answered our HELLO.  Returns 0 (k is UP, or keyed:
 * AUTH_SENT), or -1 after closing k. */
static int hello_answered(lei_conn *k, const lei_frame *f) {
    lei_ctx *c = k->ctx;
    lei_hello h;
    if (f->type == LEI_F_ERROR) return dial_refused(k, f);
    if (hello_read(k, f, LEI_F_HELLO_OK, &h) || superseded(k)) return -1;
    lei_sec *s = k->sec;
    if (!s) {
        handshake_up(k, k->peer, h.incarnation);
        return 0;
    }
    if (identity_check(k, &h, k->peer->addr, 1)) return -1;
    if (cipher_answer(k, &h)) return -1;
    lei_sec_hash(s, f->body, f->len - LEI_SIG_BYTES);
    lei_sec_final(s);
    if (lei_sec_verify(s, 1, h.idpk, h.sig) || lei_sec_keys(s, 1, h.eph)) {
        lei_conn_close(k, "bad handshake signature or key (HELLO_OK)", 1);
        return -1;
    }
    s->remote = h;
    uint8_t b[LEI_FRAME_HDR + LEI_SIG_BYTES];
    lei_frame_hdr(b, LEI_F_AUTH, LEI_SIG_BYTES);
    lei_sec_sign(c, s, 0, b + LEI_FRAME_HDR);
    lei_conn_write_now(k, b, sizeof b);
    /* From the byte after AUTH both directions are records. */
    s->rec_out = 1;
    if (lei_sec_records_in(k)) return -1;
    k->state = LEI_CONN_AUTH_SENT;
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
    /* Trust and pins may have changed since HELLO_OK (the acceptor held
     * AUTH_OK past its certificate's end, a reload revoked its key, a pin
     * was made): checked again before anything queued goes out. */
    if (identity_check(k, &k->sec->remote, k->peer->addr, 1)) return -1;
    if (k->sec->fallback) { /* before anything queued: the acceptor reads it first */
        uint8_t b[LEI_FALLBACK_MAX];
        lei_conn_write_now(k, b, lei_sec_fallback_frame(b));
    }
    handshake_up(k, k->peer, k->sec->remote.incarnation);
    return 0;
}

/* AUTH_WAIT: the dialler's AUTH proves it holds its identity's key. */
static int auth_read(lei_conn *k, const lei_frame *f) {
    lei_sec *s = k->sec;
    if (f->type != LEI_F_AUTH || f->len != LEI_SIG_BYTES) {
        lei_conn_close(k, "expected AUTH", 1);
        return -1;
    }
    if (lei_sec_keys(s, 0, s->remote.eph)) {
        lei_conn_close(k, "bad ephemeral key in handshake", 1);
        return -1;
    }
    /* The dialler reads records from now on: a refusal goes in one. */
    s->rec_out = 1;
    if (lei_sec_records_in(k)) return -1;
    if (lei_sec_verify(s, 0, s->remote.idpk, f->body)) {
        lei_conn_close(k, "bad handshake signature (AUTH)", 1);
        return -1;
    }
    /* Pins may have changed since the HELLO. */
    if (identity_check(k, &s->remote, s->remote.addr, 0)) return -1;
    if (hello_accepted(k, &s->remote)) {
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
    lei_sec *s = k->sec;
    if (!s) {
        if (hello_accepted(k, &h)) {
            lei_conn_close(k, "handshake refused", 0);
            return -1;
        }
        return 0;
    }
    /* Keyed: refused at once if untrusted or pinned to another key; bound to
     * its peer only once AUTH proved the key is the remote's. */
    if (identity_check(k, &h, h.addr, 0)) return -1;
    if (h.mode == LEI_MODE_KEYED_OFFER) {
        const lei_cipher *cs = lei_cipher_choose(k->ctx, h.suites, h.nsuites);
        if (!cs) {
            lei_conn_close(k, "no record cipher in common (this side has chacha20-poly1305 and, "
                              "with AES-NI, aes-256-gcm)", 1);
            return -1;
        }
        s->cs = cs;
    } else {
        s->legacy = 1; /* a v3 dialler of before the offer, or one falling back */
    }
    s->remote = h;
    lei_sec_hash(s, f->body, f->len);
    uint8_t b[LEI_HELLO_MAX];
    lei_conn_write_now(k, b, build_hello(k, LEI_F_HELLO_OK, b));
    k->state = LEI_CONN_AUTH_WAIT;
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


