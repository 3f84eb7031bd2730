/* lua_chan.c: channels and their events from Lua: opening channels,
 * destinations, encoding, a submit without a producer (producers have a
 * handle: lua_prod.c), sync answers, acks and control messages.
 */
#define _GNU_SOURCE
#include "lua_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const lb_policy_names[] = {"block", "drop_oldest", "drop_newest", "disconnect",
                                           NULL};

static int l_channel(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    size_t n;
    const char *name = luaL_checklstring(L, 2, &n);
    uint32_t id = lei_chan_open(b->c, name, n);
    if (id == UINT32_MAX && lei_chan_at_limit(b->c)) {
        char msg[64];
        snprintf(msg, sizeof msg, "too many channels (limit %lu)",
                 (unsigned long)lei_ctx_opts(b->c)->max_channels);
        return lb_push_err(L, msg, LEI_E_LIMIT);
    }
    if (id == UINT32_MAX) return luaL_error(L, "lecho: out of memory");
    lua_pushnumber(L, id);
    return 1;
}

/* The channel id at index i, raising when there is no such channel. */
uint32_t lb_check_chan(lua_State *L, lb_ctx *b, int i) {
    uint32_t id = (uint32_t)luaL_checknumber(L, i);
    if (!lei_chan_get(b->c, id)) luaL_argerror(L, i, "no such channel");
    return id;
}

static int l_set_local(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    lei_chan_set_local(b->c, lb_check_chan(L, b, 2), lua_toboolean(L, 3));
    return 0;
}

static int l_set_dests(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    uint32_t chid = lb_check_chan(L, b, 2);
    luaL_checktype(L, 3, LUA_TTABLE);
    int n = (int)lua_objlen(L, 3);
    const char **a = n ? calloc((size_t)n, sizeof *a) : NULL;
    if (n && !a) return luaL_error(L, "lecho: out of memory");
    for (int i = 0; i < n; i++) {
        lua_rawgeti(L, 3, i + 1);
        a[i] = lua_tostring(L, -1);
        lua_pop(L, 1); /* strings stay alive in the table */
        if (!a[i]) {
            free(a);
            return luaL_argerror(L, 3, "addresses must be strings");
        }
    }
    lei_peer_set_dests(b->c, chid, a, n);
    free(a);
    return 0;
}

/* Encodes the value at idx of L into a new message (the caller releases it
 * with lb_hook_unpin); NULL with the code in *code and the message in err.
 * Pushes nothing. */
lei_msg *lb_encode(lb_ctx *b, lua_State *L, int idx, char *err, size_t errlen, int *code) {
    lei_msg *m = lei_msg_new();
    if (!m) {
        snprintf(err, errlen, "%s", lei_err_text(LEI_E_NOMEM));
        *code = LEI_E_NOMEM;
        return NULL;
    }
    int rc = lei_encode_lua(L, idx, m, &b->lim, b->pin_threshold, err, errlen);
    if (rc) {
        lei_msg_release(m, lb_hook_unpin, b);
        *code = -rc; /* the encoder's code, set where it failed */
        return NULL;
    }
    lei_ctx_count_encode(b->c);
    return m;
}

/* Encodes the value at idx into a new message; NULL with nil, err, code
 * pushed. */
static lei_msg *lb_encode_at(lua_State *L, lb_ctx *b, int idx) {
    char err[256];
    int code;
    lei_msg *m = lb_encode(b, L, idx, err, sizeof err, &code);
    if (!m) lb_push_err(L, err, code);
    return m;
}

/* Encodes the value at idx: 0, or -1 with nil, err, code pushed (3 results). */
int lb_flat_encode(lua_State *L, lb_ctx *b, int idx, lb_flat *f) {
    f->m = lb_encode_at(L, b, idx);
    if (!f->m) return -1;
    f->p = lei_msg_bytes(f->m, &f->tmp);
    f->n = f->m->total;
    if (!f->p) {
        lei_msg_release(f->m, lb_hook_unpin, b);
        lb_push_err(L, NULL, LEI_E_NOMEM);
        return -1;
    }
    return 0;
}

void lb_flat_done(lb_ctx *b, lb_flat *f) {
    free(f->tmp);
    lei_msg_release(f->m, lb_hook_unpin, b);
}

/* ctx:resume(peer_idx, chid): a suspended dispatch from that peer (0: a
 * local one, of channel chid) is over; what it held back comes next. */
static int l_resume(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    int idx = (int)luaL_checkinteger(L, 2);
    if (idx == 0)
        lei_resume(b->c, NULL, (uint32_t)luaL_checknumber(L, 3));
    else if (lei_peers_by_idx(b->c, idx))
        lei_resume(b->c, lei_peers_by_idx(b->c, idx), 0);
    return 0;
}

/* ctx:submit(chid, producer, seq, value, sync, policy) -> true | sync id |
 * nil, err, code: one event on chid without a producer handle (specs and
 * tools; producers submit through theirs, lua_prod.c).  "wouldblock":
 * under the block policy or sync, no room, nothing done. */
static int l_submit(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    uint32_t chid = lb_check_chan(L, b, 2);
    uint64_t producer = (uint64_t)luaL_checknumber(L, 3);
    uint64_t seq = (uint64_t)luaL_checknumber(L, 4);
    luaL_checkany(L, 5);
    int sync = lua_toboolean(L, 6);
    int policy = lua_isnoneornil(L, 7) ? lei_ctx_opts(b->c)->policy
                                       : luaL_checkoption(L, 7, NULL, lb_policy_names);
    if ((policy == LEI_BLOCK || sync) && !lei_submit_room(b->c, chid))
        return lb_push_err(L, "queue full", LEI_E_WOULDBLOCK);
    lei_msg *m = lb_encode_at(L, b, 5);
    if (!m) return 3;
    lei_chan_count_encode(b->c, chid);
    const char *err = NULL;
    uint64_t sid = 0;
    int rc = lei_submit(b->c, chid, producer, seq, m, sync, policy, &sid, &err);
    lei_msg_release(m, lb_hook_unpin, b);
    if (rc) return lb_push_err(L, err, rc);
    if (sync)
        lua_pushnumber(L, (lua_Number)sid);
    else
        lua_pushboolean(L, 1);
    return 1;
}

/* ctx:chan_stats(chid) -> events_in, bytes_in, events_local */
static int l_chan_stats(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    uint32_t chid = lb_check_chan(L, b, 2);
    lei_stats_chan st;
    lei_chan_stats(b->c, chid, &st);
    lua_pushnumber(L, (lua_Number)st.ev_in);
    lua_pushnumber(L, (lua_Number)st.bytes_in);
    lua_pushnumber(L, (lua_Number)st.ev_local);
    return 3;
}

/* The sync id at position i of the ids argument at idx (a number, or a list
 * of them when many). */
static uint64_t sync_id_at(lua_State *L, int idx, int i, int many) {
    if (!many) return (uint64_t)luaL_checknumber(L, idx);
    lua_rawgeti(L, idx, i);
    uint64_t id = (uint64_t)luaL_checknumber(L, -1);
    lua_pop(L, 1);
    return id;
}

/* Sets t.code (t on top) to the code the entry names when it is one of
 * errors.h's list, else to "failed": an ACK of a peer older than codes
 * (protocol.md, section 2) names none, and its entries are handler errors.
 * Never read from the message's text. */
static void entry_code(lua_State *L) {
    size_t n;
    lua_getfield(L, -1, "code");
    const char *name = lua_type(L, -1) == LUA_TSTRING ? lua_tolstring(L, -1, &n) : NULL;
    int code = name ? lei_err_code(name, n) : 0;
    lua_pop(L, 1);
    lua_pushstring(L, lei_err_name(code ? code : LEI_E_FAILED));
    lua_setfield(L, -2, "code");
}

/* Appends what went wrong in record s to the error list at index `list`
 * (made on first need; *list 0: none yet): each consumer context that
 * failed or never answered (code: the record's, set where it failed, or
 * "timeout"), then each handler error its ack listed (code: the one the
 * ack carried).  Every entry is { context, consumer, err, code }: this is
 * the one place the list is read from the records.  Returns the new
 * length. */
static int settled_errors(lua_State *L, lb_ctx *b, lei_sync *s, int *list, int n, int timeout) {
    char err[256];
    lei_sync_answer w;
    int nw = lei_sync_nreplies(s);
    for (int i = 0; i < nw; i++) {
        lei_sync_reply(s, i, &w);
        if (w.done && !w.err && !w.elen) continue;
        if (!*list) {
            lua_newtable(L);
            *list = lua_gettop(L);
        }
        const char *ctxname = w.addr ? w.addr : "local";
        if (!w.done || w.err) {
            lua_createtable(L, 0, 3);
            lua_pushstring(L, ctxname);
            lua_setfield(L, -2, "context");
            lua_pushstring(L, lei_err_name(!w.done ? LEI_E_TIMEOUT : w.code ? w.code : LEI_E_FAILED));
            lua_setfield(L, -2, "code");
            if (w.err)
                lua_pushstring(L, w.err);
            else
                lua_pushfstring(L, "consumer context %s: no answer within %s s", ctxname,
                                timeout && lua_tostring(L, timeout) ? lua_tostring(L, timeout)
                                                                    : "the timeout");
            lua_setfield(L, -2, "err");
            lua_rawseti(L, *list, ++n);
        }
        if (w.elen && lei_decode_lua(L, w.errs, w.elen, &b->lim, err, sizeof err) == 0) {
            /* a list of { consumer =, err =, code = } from the acknowledging side */
            if (lua_istable(L, -1)) {
                int m = (int)lua_objlen(L, -1);
                for (int j = 1; j <= m; j++) {
                    lua_rawgeti(L, -1, j);
                    if (lua_istable(L, -1)) {
                        lua_pushstring(L, ctxname);
                        lua_setfield(L, -2, "context");
                        entry_code(L);
                        lua_rawseti(L, *list, ++n);
                    } else {
                        lua_pop(L, 1);
                    }
                }
            }
            lua_pop(L, 1);
        }
    }
    return n;
}

/* ctx:sync_result(ids[, timeout]) -> false | true | nil, errors
 * The outcome of a sync submit, in one call.  ids: its sync id, or the list
 * of them of a submit through modulators.  While a consumer context has not
 * answered and no timeout is given: false, the records are kept.  Else the
 * records are freed and the result is true when every consumer ran its
 * handler without error, or nil and a list of { context =, consumer =,
 * err =, code = } (given the timeout, each context that never answered is an error
 * "no answer within <timeout> s").  An id without a record counts as
 * answered.  No table is made in the common case of a clean round trip. */
static int l_sync_result(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    int many = lua_istable(L, 2);
    int nids = many ? (int)lua_objlen(L, 2) : 1;
    int timeout = lua_isnoneornil(L, 3) ? 0 : 3;
    if (!timeout) {
        for (int i = 1; i <= nids; i++) {
            lei_sync *s = lei_sync_find(b->c, sync_id_at(L, 2, i, many));
            if (s && lei_sync_pending(s)) {
                lua_pushboolean(L, 0);
                return 1;
            }
        }
    }
    int list = 0, n = 0;
    for (int i = 1; i <= nids; i++) {
        lei_sync *s = lei_sync_find(b->c, sync_id_at(L, 2, i, many));
        if (!s) continue;
        n = settled_errors(L, b, s, &list, n, timeout);
        lei_sync_free(b->c, s);
    }
    if (n == 0) {
        lua_pushboolean(L, 1);
        return 1;
    }
    lua_pushnil(L);
    lua_pushvalue(L, list);
    return 2;
}

/* Acknowledges sync event `sync` from p (NULL: a local one): nran handlers
 * ran, and the value at idx (nil: none) lists their errors; a list that
 * cannot be encoded is left out, the ack goes all the same.  gen (NULL: the
 * current connection): only to the connection of that generation. */
void lb_ack(lb_ctx *b, lei_peer *p, const uint64_t *gen, uint64_t sync, uint64_t nran, lua_State *L,
            int idx) {
    lei_msg *m = NULL;
    char *flat = NULL;
    if (!lua_isnoneornil(L, idx)) {
        if (!(m = lb_encode_at(L, b, idx)))
            lua_pop(L, 3); /* nil, err, code */
        else if ((flat = malloc(m->total ? m->total : 1)))
            lei_msg_flatten(m, flat);
    }
    if (gen)
        lei_ack_gen(b->c, p, *gen, sync, nran, (const uint8_t *)flat, flat ? m->total : 0);
    else
        lei_ack(b->c, p, sync, nran, (const uint8_t *)flat, flat ? m->total : 0);
    free(flat);
    if (m) lei_msg_release(m, lb_hook_unpin, b);
}

/* The largest reply value this context sends or takes: the frame limit
 * less the ACK header, and max_value_bytes. */
static size_t reply_limit(lb_ctx *b) {
    size_t lim = lei_ctx_opts(b->c)->max_frame;
    lim = lim > LEI_FRAME_HDR + 20 ? lim - LEI_FRAME_HDR - 20 : 0;
    return b->lim.max_value_bytes && b->lim.max_value_bytes < lim ? b->lim.max_value_bytes : lim;
}

/* c:reply_limit() -> bytes: the largest reply this context takes (sent
 * with each call, lecho.service: the server answers a larger one with an
 * error, code limit, instead of sending it). */
static int l_reply_limit(lua_State *L) {
    lua_pushnumber(L, (lua_Number)reply_limit(lb_check_ctx(L)));
    return 1;
}

/* ctx:ack(peer_idx, sync, nran, errors | nil[, strict[, gen[, limit]]]): the ack of a
 * sync event whose dispatch waited (one that did not is acknowledged by the
 * event hook's return, lua_hook.c), or a call's reply (lecho.service).
 * gen: the connection generation the event hook was given with the event:
 * the ack goes only to that connection (its process may be gone and another
 * have taken its address: dropped, counted in stats().stale_acks).  limit
 * (strict only): the largest reply the caller takes, in bytes; a larger
 * one, or one the caller's ACK queue has no room for, is not sent: nil,
 * "result of N bytes exceeds the limit ...", "limit".
 * strict: a value that cannot be encoded is not left out: nothing is sent,
 * nil, err, code is returned (the caller answers with another value). */
static int l_ack(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    int idx = (int)luaL_checkinteger(L, 2);
    uint64_t sync = (uint64_t)luaL_checknumber(L, 3);
    uint64_t nran = (uint64_t)luaL_checknumber(L, 4);
    lei_peer *p = idx ? lei_peers_by_idx(b->c, idx) : NULL;
    if (idx && !p) return 0;
    uint64_t gen = 0;
    int has_gen = idx && !lua_isnoneornil(L, 7);
    if (has_gen) gen = (uint64_t)luaL_checknumber(L, 7);
    if (lua_toboolean(L, 6) && !lua_isnoneornil(L, 5)) {
        lb_flat f;
        if (lb_flat_encode(L, b, 5, &f)) return 3;
        const lei_opts *o = lei_ctx_opts(b->c);
        size_t lim = reply_limit(b);
        if (lua_isnumber(L, 8) && lua_tonumber(L, 8) >= 0 && lua_tonumber(L, 8) < (lua_Number)lim)
            lim = (size_t)lua_tonumber(L, 8); /* the caller takes no more */
        char why[200];
        if (f.n > lim) {
            snprintf(why, sizeof why, "result of %zu bytes exceeds the limit (%zu bytes)", f.n, lim);
            lb_flat_done(b, &f);
            return lb_push_err(L, why, LEI_E_LIMIT);
        }
        size_t queued = lei_peer_ack_bytes(p);
        if (queued && queued + f.n + LEI_FRAME_HDR + 20 > o->queue_limit) {
            /* lei_ack would cut the connection (a peer not reading its
             * answers), failing the caller's other calls: this one fails */
            snprintf(why, sizeof why,
                     "result of %zu bytes exceeds the limit: %zu bytes of replies wait for that caller "
                     "(queue_limit %zu)", f.n, queued, o->queue_limit);
            lb_flat_done(b, &f);
            return lb_push_err(L, why, LEI_E_LIMIT);
        }
        if (has_gen)
            lei_ack_gen(b->c, p, gen, sync, nran, f.p, f.n);
        else
            lei_ack(b->c, p, sync, nran, f.p, f.n);
        lb_flat_done(b, &f);
        lua_pushboolean(L, 1);
        return 1;
    }
    lb_ack(b, p, has_gen ? &gen : NULL, sync, nran, L, 5);
    return 0;
}

/* ctx:set_calls(chid[, on]): a call channel (no sequence check). */
static int l_set_calls(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    lei_chan_set_calls(b->c, lb_check_chan(L, b, 2), lua_isnone(L, 3) || lua_toboolean(L, 3));
    return 0;
}

/* ctx:call(chid, dest | false, value[, policy]) -> sync id | nil, err, code
 * One sync event to one destination (false: the local consumers); the
 * reply is the ACK's value (ctx:call_result). */
static int l_call(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    uint32_t chid = lb_check_chan(L, b, 2);
    const char *dest = lua_toboolean(L, 3) ? luaL_checkstring(L, 3) : NULL;
    luaL_checkany(L, 4);
    int policy = lua_isnoneornil(L, 5) ? lei_ctx_opts(b->c)->policy
                                       : luaL_checkoption(L, 5, NULL, lb_policy_names);
    lei_msg *m = lb_encode_at(L, b, 4);
    if (!m) return 3;
    const char *err = NULL;
    uint64_t sid = 0;
    int rc = lei_call(b->c, chid, dest, m, policy, &sid, &err);
    lei_msg_release(m, lb_hook_unpin, b);
    if (rc) return lb_push_err(L, err, rc);
    lua_pushnumber(L, (lua_Number)sid);
    return 1;
}

/* ctx:call_result(sid[, final]) -> false (pending) | true, reply, nran |
 * nil, why, code.  Anything but false frees the record.  reply: the ACK's
 * decoded value (nil: none); final and still pending: nil, "timeout". */
static int l_call_result(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    uint64_t sid = (uint64_t)luaL_checknumber(L, 2);
    int final = lua_toboolean(L, 3);
    lei_sync *s = lei_sync_find(b->c, sid);
    if (!s) return lb_push_err(L, "no such call", LEI_E_NOTFOUND);
    if (lei_sync_pending(s) && !final) {
        lua_pushboolean(L, 0);
        return 1;
    }
    lei_sync_answer w;
    lei_sync_reply(s, 0, &w);
    int n;
    if (!w.done) {
        n = lb_push_err(L, "timeout", LEI_E_TIMEOUT);
    } else if (w.err) {
        n = lb_push_err(L, w.err, w.code ? w.code : LEI_E_FAILED);
    } else {
        char err[256];
        lua_pushboolean(L, 1);
        if (!w.elen)
            lua_pushnil(L);
        else if (lei_decode_lua(L, w.errs, w.elen, &b->lim, err, sizeof err)) {
            lua_pop(L, 1);
            n = lb_push_err(L, err, LEI_E_PROTOCOL);
            lei_sync_free(b->c, s);
            return n;
        }
        lua_pushnumber(L, (lua_Number)lei_sync_nran(s));
        n = 3;
    }
    lei_sync_free(b->c, s);
    return n;
}

/* ctx:sync_watch(sid): true when the record is pending: its id goes on
 * the settled list (ctx:sync_done) once it settles; false (nothing
 * watched) when it settled already or there is no such record. */
static int l_sync_watch(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    lei_sync *s = lei_sync_find(b->c, (uint64_t)luaL_checknumber(L, 2));
    int pending = s && lei_sync_pending(s);
    if (pending) lei_sync_watch(b->c, s);
    lua_pushboolean(L, pending);
    return 1;
}

/* ctx:sync_pending(sid): true while the record waits for an answer (the
 * record is left as it is). */
static int l_sync_pending(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    lei_sync *s = lei_sync_find(b->c, (uint64_t)luaL_checknumber(L, 2));
    lua_pushboolean(L, s && lei_sync_pending(s));
    return 1;
}

/* ctx:sync_done(t) -> n: the watched records settled since the last call,
 * their ids in t[1..n] (t reused: no table per turn); -1: look at all. */
static int l_sync_done(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    luaL_checktype(L, 2, LUA_TTABLE);
    const uint64_t *ids;
    int n = lei_sync_done_take(b->c, &ids);
    for (int i = 0; i < n; i++) {
        lua_pushnumber(L, (lua_Number)ids[i]);
        lua_rawseti(L, 2, i + 1);
    }
    lua_pushinteger(L, n);
    return 1;
}

static int l_send_ctrl(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    const char *addr = luaL_checkstring(L, 2);
    luaL_checkany(L, 3);
    /* a control message comes after the events submitted before it (a
     * stream's end after its last event): staged ones are queued first */
    lb_moe_flush_all(b);
    lei_msg *m = lb_encode_at(L, b, 3);
    if (!m) return 3;
    const char *err;
    int rc = lei_send_ctrl(b->c, addr, m, &err);
    lei_msg_release(m, lb_hook_unpin, b);
    return lb_ok_or_err(L, rc ? err : NULL, rc);
}

const luaL_Reg lb_chan_methods[] = {
    {"channel", l_channel},       {"set_local", l_set_local},
    {"set_dests", l_set_dests},   {"chan_stats", l_chan_stats},
    {"submit", l_submit},
    {"resume", l_resume},         {"sync_result", l_sync_result},
    {"ack", l_ack},               {"reply_limit", l_reply_limit},
    {"send_ctrl", l_send_ctrl},   {"set_calls", l_set_calls},
    {"call", l_call},             {"call_result", l_call_result},
    {"sync_watch", l_sync_watch}, {"sync_done", l_sync_done},
    {"sync_pending", l_sync_pending},
    {NULL, NULL}};
