/* lua_ws.c: `require "lecho.ws"`, WebSocket connections for the gateway
 * (lua/lecho/gateway/: conn.lua, http.lua), built as lua/lecho/ws.so.  The framing is wslay's
 * (Debian libwslay-dev, RFC 6455): this file only ties one wslay server
 * context to one non-blocking socket and hands whole messages to Lua.  The
 * opening handshake's key (SHA-1 and base64 of RFC 6455 section 4.2.2) comes
 * from nettle (Debian nettle-dev).  Knows Lua (a binding); no global mutable
 * state: everything lives in a connection's userdata.
 *
 *   ws.accept(key)            -> the Sec-WebSocket-Accept value for key
 *   ws.valid_utf8(s)          -> true when s is UTF-8 (a text frame must be)
 *   ws.server(fd, max_msg)    -> conn (fd stays the caller's to close)
 *   conn:feed(bytes)          bytes read with the HTTP head, read before the socket
 *   conn:recv([limit])        -> list {op1, data1, op2, data2, ...} of whole
 *                                messages (1 text, 2 binary), or nil, why
 *                                ("eof", "closed: CODE", a wslay error;
 *                                "message over N bytes ...", 1009: a data
 *                                frame's header declares more than max_msg;
 *                                "protocol error: ...", 1002: a header wslay
 *                                would refuse without a reason); reads
 *                                at most WS_BATCH messages (pings and
 *                                pongs among them) and stops reading
 *                                while queued() is past limit
 *   conn:partial()            -> true while a frame or a fragmented message
 *                                is incomplete
 *   conn:queue(data, binary)  a message (copied by wslay) -> true or nil, why
 *   conn:send()               -> true when nothing is left, false when the
 *                                socket is full, nil, why on failure
 *   conn:close(code, reason)  queues a close frame; nothing is read after it
 *   conn:want_read(), want_write(), queued() (bytes: what is queued to send,
 *                                each message's frame header and wslay's
 *                                bookkeeping counted, WS_MSG_COST),
 *                                bytes_in(), bytes_out()
 *   conn:ping()                 queues a ping frame (the pong comes back as input)
 *   conn:free()               frees the wslay context (also at __gc)
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <lauxlib.h>
#include <lua.h>
#include <nettle/base64.h>
#include <nettle/sha1.h>
#include <wslay/wslay.h>

#define WS_MT "lecho.ws.conn"
#define WS_BATCH 256
/* What one queued message costs besides its payload: its frame header and
 * wslay's bookkeeping (struct wslay_event_omsg, the queue's entry, malloc's
 * headers; ~76 bytes measured for an empty pong).  queued() counts it, so
 * a flood of empty pings is held to the bound as a flood of events is. */
#define WS_MSG_COST 96

/* A whole message received, waiting to be pushed to Lua.  Owner: the
 * connection's msgs array; data malloc'd (wslay's buffer is only lent to
 * the callback). */
typedef struct {
    int op;
    size_t len;
    char *data;
} ws_msg;

typedef struct {
    wslay_event_context_ptr ev; /* owned; wslay_event_context_free in ws_free */
    int fd;                     /* the caller's */
    char *pre;                  /* owned: bytes fed before the socket's */
    size_t pre_len, pre_off;
    ws_msg *msgs; /* owned: messages of the recv in progress */
    size_t nmsgs, capmsgs;
    size_t nctl;   /* control frames (ping, pong) read by the recv in progress */
    double rlimit; /* the recv in progress stops reading past this queued() (0: none) */
    int eof, oom, sock_err;
    int close_code; /* status code of a close frame received */
    double bytes_in, bytes_out;
    /* the frame headers of what wslay reads, followed here too: a data frame
     * that declares more than max is refused at its header (wslay would
     * only refuse once payload came); partial() says a frame or a
     * fragmented message is incomplete (the gateway's deadline) */
    uint64_t max, remain, too_big; /* remain: payload bytes of the frame left */
    uint64_t msglen;               /* bytes of the data message so far (its frames) */
    const char *bad;               /* a protocol error found in a header (static text) */
    unsigned char hdr[14];
    size_t hlen;
    int frag; /* a data frame without FIN seen, its final frame not yet */
    /* frames wslay wrote, gathered into one send() per flush (owned; 64 KiB):
     * one system call for many messages, not one each */
    unsigned char *obuf;
    size_t olen, ooff;
} ws_conn;

#define OBUF_CAP 65536

/* Bytes the connection holds to send (see WS_MSG_COST). */
static double cost(const ws_conn *c) {
    return (double)wslay_event_get_queued_msg_length(c->ev) +
           (double)wslay_event_get_queued_msg_count(c->ev) * WS_MSG_COST + (double)(c->olen - c->ooff);
}

/* Sends what obuf holds: 0 when all went or the socket is full, -1 on error. */
static int flush_out(ws_conn *c) {
    while (c->ooff < c->olen) {
        ssize_t r = send(c->fd, c->obuf + c->ooff, c->olen - c->ooff, MSG_NOSIGNAL);
        if (r > 0) {
            c->ooff += (size_t)r;
            c->bytes_out += (double)r;
        } else if (r < 0 && errno == EINTR) {
            continue;
        } else if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            return 0;
        } else {
            c->sock_err = r < 0 ? errno : EPIPE;
            return -1;
        }
    }
    c->ooff = c->olen = 0;
    return 0;
}

/* Follows the frame headers in the n bytes at p (what wslay is handed):
 * 0, or -1 when a data frame declares more than c->max bytes (too_big). */
static int track(ws_conn *c, const uint8_t *p, size_t n) {
    while (n > 0) {
        if (c->remain > 0) {
            size_t k = (uint64_t)n < c->remain ? n : (size_t)c->remain;
            c->remain -= k;
            p += k;
            n -= k;
            continue;
        }
        c->hdr[c->hlen++] = *p++;
        n--;
        if (c->hlen < 2) continue;
        unsigned l7 = c->hdr[1] & 0x7f;
        size_t ext = l7 == 126 ? 2 : l7 == 127 ? 8 : 0;
        if (c->hlen < 2 + ext + ((c->hdr[1] & 0x80) ? 4 : 0)) continue;
        uint64_t len = l7;
        if (ext) {
            len = 0;
            for (size_t i = 0; i < ext; i++) len = len << 8 | c->hdr[2 + i];
        }
        c->hlen = 0;
        unsigned op = c->hdr[0] & 0x0f, fin = c->hdr[0] & 0x80;
        /* the errors wslay would answer with a close frame without a
         * reason: found here, the gateway closes with 1002 and says why */
        if (!(c->hdr[1] & 0x80)) c->bad = "a client frame must be masked";
        else if (c->hdr[0] & 0x70) c->bad = "reserved bits set (no extension was agreed)";
        else if (op != 0 && op != 1 && op != 2 && op != 8 && op != 9 && op != 10) c->bad = "an unknown opcode";
        else if (op >= 8 && (len > 125 || !fin)) c->bad = "a control frame over 125 bytes or fragmented";
        else if (op == 0 && !c->frag) c->bad = "a continuation frame outside a fragmented message";
        else if ((op == 1 || op == 2) && c->frag) c->bad = "a new message inside a fragmented one";
        if (c->bad) return -1;
        if (op < 8) { /* a data or continuation frame: the message's length so far */
            c->msglen = op == 0 ? c->msglen + len : len;
            if (len > c->max || c->msglen > c->max) {
                c->too_big = c->msglen;
                return -1;
            }
            c->frag = !fin;
        }
        c->remain = len;
    }
    return 0;
}

static ssize_t got(wslay_event_context_ptr ctx, ws_conn *c, const uint8_t *buf, ssize_t n) {
    if (c->too_big || c->bad || track(c, buf, (size_t)n) < 0) {
        /* "would block", not a failure: wslay would queue a close frame
         * of its own without a status; conn:recv says too big, the
         * gateway closes with 1009 and its reason */
        wslay_event_set_error(ctx, WSLAY_ERR_WOULDBLOCK);
        return -1;
    }
    return n;
}

static ssize_t recv_cb(wslay_event_context_ptr ctx, uint8_t *buf, size_t len, int flags, void *ud) {
    (void)flags;
    ws_conn *c = ud;
    /* at most WS_BATCH whole messages per conn:recv, control frames counted
     * (the rest stays in the socket; the loop says readable again): a flood
     * of small frames cannot grow the list without bound nor hold the loop,
     * and nothing more is read while what is queued for the client (pongs
     * wslay answers pings with among it) is past the caller's limit: one
     * read adds at most what one read buffer of pings answers */
    if (c->nmsgs + c->nctl >= WS_BATCH || (c->rlimit > 0 && cost(c) > c->rlimit)) {
        wslay_event_set_error(ctx, WSLAY_ERR_WOULDBLOCK);
        return -1;
    }
    if (c->pre_off < c->pre_len) {
        size_t n = c->pre_len - c->pre_off;
        if (n > len) n = len;
        memcpy(buf, c->pre + c->pre_off, n);
        c->pre_off += n;
        if (c->pre_off == c->pre_len) {
            free(c->pre);
            c->pre = NULL;
            c->pre_len = c->pre_off = 0;
        }
        c->bytes_in += (double)n;
        return got(ctx, c, buf, (ssize_t)n);
    }
    ssize_t r;
    do r = recv(c->fd, buf, len, 0);
    while (r < 0 && errno == EINTR);
    if (r > 0) {
        c->bytes_in += (double)r;
        return got(ctx, c, buf, r);
    }
    if (r == 0) {
        c->eof = 1;
        wslay_event_set_error(ctx, WSLAY_ERR_CALLBACK_FAILURE);
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        wslay_event_set_error(ctx, WSLAY_ERR_WOULDBLOCK);
    } else {
        c->sock_err = errno;
        wslay_event_set_error(ctx, WSLAY_ERR_CALLBACK_FAILURE);
    }
    return -1;
}

static ssize_t send_cb(wslay_event_context_ptr ctx, const uint8_t *data, size_t len, int flags, void *ud) {
    (void)flags;
    ws_conn *c = ud;
    if (!c->obuf) {
        c->obuf = malloc(OBUF_CAP);
        if (!c->obuf) {
            c->sock_err = ENOMEM;
            wslay_event_set_error(ctx, WSLAY_ERR_CALLBACK_FAILURE);
            return -1;
        }
    }
    if (OBUF_CAP - c->olen < len && c->ooff > 0) {
        memmove(c->obuf, c->obuf + c->ooff, c->olen - c->ooff);
        c->olen -= c->ooff;
        c->ooff = 0;
    }
    if (c->olen == OBUF_CAP) {
        if (flush_out(c) < 0) {
            wslay_event_set_error(ctx, WSLAY_ERR_CALLBACK_FAILURE);
            return -1;
        }
        if (c->ooff > 0) {
            memmove(c->obuf, c->obuf + c->ooff, c->olen - c->ooff);
            c->olen -= c->ooff;
            c->ooff = 0;
        }
        if (c->olen == OBUF_CAP) {
            wslay_event_set_error(ctx, WSLAY_ERR_WOULDBLOCK);
            return -1;
        }
    }
    size_t n = OBUF_CAP - c->olen;
    if (n > len) n = len;
    memcpy(c->obuf + c->olen, data, n);
    c->olen += n;
    return (ssize_t)n;
}

static void msg_cb(wslay_event_context_ptr ctx, const struct wslay_event_on_msg_recv_arg *a, void *ud) {
    (void)ctx;
    ws_conn *c = ud;
    if (a->opcode == WSLAY_CONNECTION_CLOSE) {
        c->close_code = a->status_code ? a->status_code : 1005;
        return;
    }
    if (a->opcode != WSLAY_TEXT_FRAME && a->opcode != WSLAY_BINARY_FRAME) { /* ping/pong: wslay's */
        c->nctl++;
        return;
    }
    if (c->oom) return;
    if (c->nmsgs == c->capmsgs) {
        size_t cap = c->capmsgs ? c->capmsgs * 2 : 8;
        ws_msg *m = realloc(c->msgs, cap * sizeof *m);
        if (!m) {
            c->oom = 1;
            return;
        }
        c->msgs = m;
        c->capmsgs = cap;
    }
    char *d = malloc(a->msg_length ? a->msg_length : 1);
    if (!d) {
        c->oom = 1;
        return;
    }
    memcpy(d, a->msg, a->msg_length);
    c->msgs[c->nmsgs++] = (ws_msg){ a->opcode == WSLAY_TEXT_FRAME ? 1 : 2, a->msg_length, d };
}

static void drop_msgs(ws_conn *c) {
    for (size_t i = 0; i < c->nmsgs; i++) free(c->msgs[i].data);
    c->nmsgs = 0;
}

static ws_conn *check(lua_State *L) {
    ws_conn *c = luaL_checkudata(L, 1, WS_MT);
    if (!c->ev) luaL_error(L, "lecho.ws: connection is freed");
    return c;
}

static int l_server(lua_State *L) {
    int fd = (int)luaL_checkinteger(L, 1);
    lua_Number max = luaL_checknumber(L, 2);
    ws_conn *c = lua_newuserdata(L, sizeof *c);
    memset(c, 0, sizeof *c);
    c->fd = fd;
    luaL_getmetatable(L, WS_MT);
    lua_setmetatable(L, -2);
    struct wslay_event_callbacks cb = { recv_cb, send_cb, NULL, NULL, NULL, NULL, msg_cb };
    if (wslay_event_context_server_init(&c->ev, &cb, c) != 0) {
        c->ev = NULL;
        return luaL_error(L, "lecho.ws: out of memory");
    }
    c->max = max > 0 ? (uint64_t)max : 1;
    wslay_event_config_set_max_recv_msg_length(c->ev, c->max);
    return 1;
}

static int l_feed(lua_State *L) {
    ws_conn *c = check(L);
    size_t n;
    const char *s = luaL_checklstring(L, 2, &n);
    if (n == 0) return 0;
    char *p = realloc(c->pre, c->pre_len + n);
    if (!p) return luaL_error(L, "lecho.ws: out of memory");
    memcpy(p + c->pre_len, s, n);
    c->pre = p;
    c->pre_len += n;
    return 0;
}

static int l_recv(lua_State *L) {
    ws_conn *c = check(L);
    c->rlimit = luaL_optnumber(L, 2, 0);
    c->nctl = 0;
    int r = wslay_event_recv(c->ev);
    /* the messages are pushed even when the read ended in an error */
    if (!lua_checkstack(L, 4)) {
        drop_msgs(c);
        return luaL_error(L, "lecho.ws: stack");
    }
    lua_createtable(L, (int)c->nmsgs * 2, 0);
    for (size_t i = 0; i < c->nmsgs; i++) {
        lua_pushinteger(L, c->msgs[i].op);
        lua_rawseti(L, -2, (int)(2 * i + 1));
        lua_pushlstring(L, c->msgs[i].data, c->msgs[i].len);
        lua_rawseti(L, -2, (int)(2 * i + 2));
        free(c->msgs[i].data);
        c->msgs[i].data = NULL;
    }
    c->nmsgs = 0;
    if (c->oom) {
        lua_pushnil(L);
        lua_pushstring(L, "out of memory");
        return 2;
    }
    if (c->too_big) {
        lua_pushnil(L);
        lua_pushfstring(L, "message over %d bytes (its frames declare %f)", (int)c->max, (lua_Number)c->too_big);
        lua_pushinteger(L, 1009);
        return 3;
    }
    if (c->bad) {
        lua_pushnil(L);
        lua_pushfstring(L, "protocol error: %s", c->bad);
        lua_pushinteger(L, 1002);
        return 3;
    }
    if (r != 0) {
        lua_pushnil(L);
        if (c->eof) lua_pushstring(L, "eof");
        else if (c->sock_err) lua_pushstring(L, strerror(c->sock_err));
        else lua_pushfstring(L, "wslay error %d", r);
        return 2;
    }
    if (c->close_code) {
        lua_pushnil(L);
        lua_pushfstring(L, "closed: %d", c->close_code);
        return 2;
    }
    return 1;
}

static int l_queue(lua_State *L) {
    ws_conn *c = check(L);
    size_t n;
    const char *s = luaL_checklstring(L, 2, &n);
    struct wslay_event_msg m = { lua_toboolean(L, 3) ? WSLAY_BINARY_FRAME : WSLAY_TEXT_FRAME, (const uint8_t *)s,
                                 n };
    int r = wslay_event_queue_msg(c->ev, &m);
    if (r == 0) {
        lua_pushboolean(L, 1);
        return 1;
    }
    lua_pushnil(L);
    lua_pushstring(L, r == WSLAY_ERR_NO_MORE_MSG ? "closing" : "cannot queue");
    return 2;
}

/* A ping (RFC 6455 5.5.2) with a short payload; the client's pong comes
 * back as input (counted in bytes_in like any frame). */
static int l_ping(lua_State *L) {
    ws_conn *c = check(L);
    static const uint8_t P[] = "lecho";
    struct wslay_event_msg m = { WSLAY_PING, P, sizeof P - 1 };
    lua_pushboolean(L, wslay_event_queue_msg(c->ev, &m) == 0);
    return 1;
}

static int l_send(lua_State *L) {
    ws_conn *c = check(L);
    int r = wslay_event_send(c->ev);
    if (r == 0 && flush_out(c) < 0) r = -1;
    if (r != 0) {
        lua_pushnil(L);
        lua_pushstring(L, c->sock_err ? strerror(c->sock_err) : "wslay send error");
        return 2;
    }
    lua_pushboolean(L, !wslay_event_want_write(c->ev) && c->ooff == c->olen);
    return 1;
}

static int l_close(lua_State *L) {
    ws_conn *c = check(L);
    int code = (int)luaL_optinteger(L, 2, 1000);
    size_t n = 0;
    const char *why = luaL_optlstring(L, 3, "", &n);
    if (n > 123) n = 123; /* a control frame's payload is at most 125 bytes */
    wslay_event_queue_close(c->ev, (uint16_t)code, (const uint8_t *)why, n);
    wslay_event_shutdown_read(c->ev);
    return 0;
}

static int l_partial(lua_State *L) {
    ws_conn *c = check(L);
    lua_pushboolean(L, c->hlen > 0 || c->remain > 0 || c->frag);
    return 1;
}

static int l_want_read(lua_State *L) {
    lua_pushboolean(L, wslay_event_want_read(check(L)->ev));
    return 1;
}
static int l_want_write(lua_State *L) {
    ws_conn *c = check(L);
    lua_pushboolean(L, wslay_event_want_write(c->ev) || c->ooff < c->olen);
    return 1;
}
static int l_queued(lua_State *L) {
    ws_conn *c = check(L);
    lua_pushnumber(L, (lua_Number)cost(c));
    return 1;
}
static int l_bytes_in(lua_State *L) {
    lua_pushnumber(L, check(L)->bytes_in);
    return 1;
}
static int l_bytes_out(lua_State *L) {
    lua_pushnumber(L, check(L)->bytes_out);
    return 1;
}

static int l_free(lua_State *L) {
    ws_conn *c = luaL_checkudata(L, 1, WS_MT);
    if (c->ev) wslay_event_context_free(c->ev);
    c->ev = NULL;
    drop_msgs(c);
    free(c->msgs);
    c->msgs = NULL;
    c->capmsgs = 0;
    free(c->pre);
    c->pre = NULL;
    c->pre_len = c->pre_off = 0;
    free(c->obuf);
    c->obuf = NULL;
    c->olen = c->ooff = 0;
    return 0;
}

/* RFC 6455 4.2.2: base64(SHA-1(key .. GUID)). */
static int l_accept(lua_State *L) {
    size_t n;
    const char *key = luaL_checklstring(L, 1, &n);
    static const char guid[] = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
    struct sha1_ctx h;
    uint8_t d[SHA1_DIGEST_SIZE];
    char out[BASE64_ENCODE_RAW_LENGTH(SHA1_DIGEST_SIZE) + 1];
    sha1_init(&h);
    sha1_update(&h, n, (const uint8_t *)key);
    sha1_update(&h, sizeof guid - 1, (const uint8_t *)guid);
    sha1_digest(&h, SHA1_DIGEST_SIZE, d);
    base64_encode_raw((void *)out, SHA1_DIGEST_SIZE, d);
    lua_pushlstring(L, out, BASE64_ENCODE_RAW_LENGTH(SHA1_DIGEST_SIZE));
    return 1;
}

/* Strict UTF-8 (RFC 3629: no overlongs, no surrogates, <= U+10FFFF). */
static int l_valid_utf8(lua_State *L) {
    size_t n;
    const unsigned char *s = (const unsigned char *)luaL_checklstring(L, 1, &n);
    size_t i = 0;
    while (i < n) {
        unsigned char b = s[i];
        if (b < 0x80) {
            i++;
            continue;
        }
        size_t k;
        unsigned lo = 0x80, hi = 0xBF;
        if (b >= 0xC2 && b <= 0xDF) k = 1;
        else if (b >= 0xE0 && b <= 0xEF) {
            k = 2;
            if (b == 0xE0) lo = 0xA0;
            if (b == 0xED) hi = 0x9F;
        } else if (b >= 0xF0 && b <= 0xF4) {
            k = 3;
            if (b == 0xF0) lo = 0x90;
            if (b == 0xF4) hi = 0x8F;
        } else {
            lua_pushboolean(L, 0);
            return 1;
        }
        if (i + k >= n) { /* truncated sequence */
            lua_pushboolean(L, 0);
            return 1;
        }
        if (s[i + 1] < lo || s[i + 1] > hi) {
            lua_pushboolean(L, 0);
            return 1;
        }
        for (size_t j = 2; j <= k; j++)
            if (s[i + j] < 0x80 || s[i + j] > 0xBF) {
                lua_pushboolean(L, 0);
                return 1;
            }
        i += k + 1;
    }
    lua_pushboolean(L, 1);
    return 1;
}

static const luaL_Reg conn_m[] = {
    { "feed", l_feed },           { "recv", l_recv },       { "queue", l_queue },
    { "send", l_send },           { "close", l_close },     { "want_read", l_want_read }, { "partial", l_partial },
    { "want_write", l_want_write }, { "queued", l_queued }, { "bytes_in", l_bytes_in },
    { "bytes_out", l_bytes_out }, { "ping", l_ping },       { "free", l_free },       { NULL, NULL },
};

static const luaL_Reg mod_f[] = {
    { "server", l_server },
    { "accept", l_accept },
    { "valid_utf8", l_valid_utf8 },
    { NULL, NULL },
};

__attribute__((visibility("default"))) int luaopen_lecho_ws(lua_State *L) {
    if (luaL_newmetatable(L, WS_MT)) {
        lua_newtable(L);
        luaL_register(L, NULL, conn_m);
        lua_setfield(L, -2, "__index");
        lua_pushcfunction(L, l_free);
        lua_setfield(L, -2, "__gc");
    }
    lua_pop(L, 1);
    lua_newtable(L);
    luaL_register(L, NULL, mod_f);
    return 1;
}
