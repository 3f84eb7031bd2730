/* lua_prod.c: the producer handle (binding): one userdata per producer
 * holding what a submit reads (channel, producer id, sequence, policy, the
 * channel's modulator list and whether it also goes plain), so a submit is
 * submit(handle, value).  lecho.producer keeps one per Producer and updates
 * its modulator list when the channel's changes (Channel:_hot_update);
 * liblecho submits through the same handle without entering Lua
 * (lb_dataplane, lua_prod.h).
 *
 * Ownership: the userdata owns its moes array, its staged and spare messages,
 * its pool array and one reference to each message in it (msg_done); its
 * environment table pins the context userdata (so b outlives the handle)
 * and the Lua modulator list whose userdata the moes array points at.
 */
#define _GNU_SOURCE
#include "lua_int.h"
#include "lua_prod.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROD_MT "lecho.producer"

/* The pool of a handle (lb_prod.pool): a full stage of a modulator (STG_MAX,
 * core/moe/moe_int.h, 64) and some, messages whose buffer is at most
 * POOL_CAP bytes: at most 72 KiB of buffers per handle. */
#define POOL_MAX 72
#define POOL_CAP 1024

typedef struct lb_prod {
    lb_ctx *b;     /* ro: the context (pinned by the environment table) */
    uint32_t chid; /* ro */
    uint64_t pid;  /* ro */
    uint64_t seq;  /* ro: the sequence of the last event submitted */
    int policy;    /* ro: LEI_* policy, or -1: the context's */
    int plain;     /* ro: also sent unmodulated on chid */
    int nmoes;     /* ro */
    lb_moe **moes; /* owned array; each pinned by the modulator list in the environment */
    int nwait;     /* rw (h:waiting): submits of this producer waiting for room in Lua */
    int closed;
    lei_msg *staged; /* owned: what lb_dataplane.stage copied for the next submit_staged */
    lei_msg *spare;  /* owned: an emptied message of a data-plane submit no queue kept, for the next one */
    /* owned, one reference each: messages of the data plane sent while
     * another still held them (a modulator's stage, a queue), oldest at
     * pool[phead]; msg_take reuses the oldest once it holds the only
     * reference (POOL_MAX, POOL_CAP below); the array (owned) made at the
     * first such message: a handle that never needs it costs no more */
    lei_msg **pool;
    int phead, npool;
    lb_rec *rec;     /* h:set_record: its recorder (lua_rec.c; pinned by the environment) or NULL */
    uint32_t rec_c, rec_p; /* its channel's and its own index in the recording */
} lb_prod;

/* Messages of the data plane (stage, submit_bytes): a small async event is
 * copied into its destinations' batches, so its message is ours alone again
 * once sent.  Keeping one emptied message (its buffer up to SPARE_MAX) saves
 * a calloc, a realloc and two frees per event (3.0M reallocs for 3.0M
 * events of `lecho bench` before). */
#define SPARE_MAX 4096

static lei_msg *msg_take(lb_prod *h) {
    lei_msg *m = h->spare;
    if (m) {
        h->spare = NULL;
        return m;
    }
    /* the pool's oldest, once nobody else holds it (the stage released it
     * when its batch ran, a queue when it was written): ours alone */
    if (h->npool && (m = h->pool[h->phead])->refcnt == 1) {
        h->pool[h->phead] = NULL;
        h->phead = (h->phead + 1) % POOL_MAX;
        h->npool--;
        m->own.len = 0;
        m->total = 0;
        return m;
    }
    return lei_msg_new();
}

/* Done with m (a message of the data plane: no pins): kept as the spare when
 * nobody else holds it; while another holds it (a modulator's stage, a
 * queue), our reference goes to the pool for msg_take to reuse it once that
 * one released it (a full pool drops its oldest: its holders keep it);
 * else released. */
static void msg_done(lb_prod *h, lei_msg *m) {
    if (!m) return;
    if (m->refcnt == 1 && !h->spare && m->next == 0 && !m->lent && m->own.cap <= SPARE_MAX) {
        m->own.len = 0;
        m->total = 0;
        h->spare = m;
        return;
    }
    /* (never a message whose bytes a recorder's chunk lends: lua_rec.c
     * takes those back when the last holder releases it) */
    if (m->refcnt > 1 && m->next == 0 && !m->lent && m->own.cap <= POOL_CAP &&
        (h->pool || (h->pool = calloc(POOL_MAX, sizeof *h->pool)))) {
        if (h->npool == POOL_MAX) {
            lei_msg_release(h->pool[h->phead], NULL, NULL);
            h->pool[h->phead] = NULL;
            h->phead = (h->phead + 1) % POOL_MAX;
            h->npool--;
        }
        h->pool[(h->phead + h->npool) % POOL_MAX] = m;
        h->npool++;
        return;
    }
    lei_msg_release(m, NULL, NULL);
}

static lb_prod *check_prod(lua_State *L) {
    return luaL_checkudata(L, 1, PROD_MT);
}

static int policy_of(const lb_prod *h) {
    return h->policy >= 0 ? h->policy : lei_ctx_opts(h->b->c)->policy;
}

/* 1 when the plain channel (if sent plain) and the derived channel of every
 * live modulator have room for a blocking submit.  A modulator whose
 * stream has none runs its staged events first (they were let in, each
 * with room then): a queue passes its limit by at most one batch. */
static int prod_room(const lb_prod *h) {
    lei_ctx *c = h->b->c;
    if (h->plain && !lei_submit_room(c, h->chid)) return 0;
    for (int i = 0; i < h->nmoes; i++) {
        lei_moe *m = h->moes[i]->m;
        if (m && !lei_moe_error(m) && !lei_submit_room(c, lei_moe_chid(m))) {
            lei_moe_flush(m);
            return 0;
        }
    }
    return 1;
}

/* The modulator sent nothing for a sync event: a marker (producer 0, seq
 * 0, value nil) goes on its stream instead, acknowledged by the consuming
 * context once everything before it was handled.  0 with its sync id. */
static int sync_marker(lb_ctx *b, uint32_t chid, uint64_t *sid) {
    lei_msg *m = lei_msg_new();
    const uint8_t nil = LEI_T_NIL;
    const char *err = NULL;
    if (!m || lei_wbuf_put(&m->own, &nil, 1)) {
        lei_msg_release(m, NULL, NULL);
        return -1;
    }
    lei_msg_sync(m);
    int rc = lei_submit(b->c, chid, 0, 0, m, 1, LEI_BLOCK, sid, &err);
    lei_msg_release(m, NULL, NULL);
    return rc;
}

/* Sends m (the caller keeps its reference) as the producer's next event:
 * plain, then through each modulator (a failing one is reported by its
 * hook and does not stop the others).  Sync: its ids are pushed on L (one
 * number, or a list through modulators).  0, or a code with *err (NULL:
 * the code's text), nothing sent. */
static int prod_send(lb_prod *h, lei_msg *m, int sync, lua_State *L, const char **err) {
    lb_ctx *b = h->b;
    int policy = policy_of(h);
    uint64_t seq = h->seq + 1, sid = 0;
    *err = NULL;
    /* From a hook that one of its modulators' own call runs (a granted
     * log's handler), an event that modulator could not stage behind the
     * running one (sync, large): refused, nothing sent */
    for (int i = 0; i < h->nmoes; i++) {
        lei_moe *x = h->moes[i]->m;
        if (x && !lei_moe_error(x) && lei_moe_busy_for(x, m, m->total, sync, policy)) {
            *err = "submitted from inside the call of one of its own modulators (a log hook): "
                   "only a small async event can be, nothing sent";
            return LEI_E_INVALID;
        }
    }
    /* A sync event with nobody to take it plain (the last consuming
     * context went while this submit waited for room): no handler can
     * run it there, and a record without destinations would settle as
     * handled.  Without modulators: noconsumer, nothing sent; with them,
     * only they take it. */
    int plain = h->plain;
    if (sync && plain && !lei_chan_has_dest(b->c, h->chid)) {
        if (h->nmoes == 0) {
            *err = "no consumer of the channel anywhere (its last consuming context is gone)";
            return LEI_E_NOCONSUMER;
        }
        plain = 0;
    }
    lei_chan_count_encode(b->c, h->chid);
    int rc = plain ? lei_submit(b->c, h->chid, h->pid, seq, m, sync, policy, &sid, err) : 0;
    if (rc) return rc < 0 ? -rc : rc;
    h->seq = seq;
    /* the core took it: recorded (a copy for the writer thread, lua_rec.c) */
    if (h->rec) lb_rec_event(h->rec, h->rec_c, h->rec_p, seq, sync, m);
    if (h->nmoes == 0) {
        if (sync) lua_pushnumber(L, (lua_Number)sid);
        return 0;
    }
    /* What a modulator sent for the event before failing is waited for all
     * the same (its sync records would stay otherwise). */
    int nids = 0, ids = 0;
    if (sync) {
        lua_newtable(L);
        ids = lua_gettop(L);
        if (plain) {
            lua_pushnumber(L, (lua_Number)sid);
            lua_rawseti(L, ids, ++nids);
        }
    }
    uint8_t *tmp;
    const uint8_t *bytes = lei_msg_bytes(m, &tmp);
    for (int i = 0; bytes && i < h->nmoes; i++) {
        lei_moe *x = h->moes[i]->m;
        if (!x || lei_moe_error(x)) continue;
        int failed = lei_moe_enqueue_msg(x, h->pid, seq, m, bytes, m->total, sync, policy);
        if (!sync) continue;
        const uint64_t *sids;
        size_t n = lei_moe_syncs(x, &sids);
        uint64_t marker;
        if (n == 0 && !failed && sync_marker(b, lei_moe_chid(x), &marker) == 0) {
            sids = &marker;
            n = 1;
        }
        for (size_t k = 0; k < n; k++) {
            lua_pushnumber(L, (lua_Number)sids[k]);
            lua_rawseti(L, ids, ++nids);
        }
    }
    free(tmp);
    /* The plain event went; the modulators could not be given it. */
    if (!bytes) return LEI_E_NOMEM;
    return 0;
}

/* ---- the data plane for liblecho and the FFI ---- */

static int dp_submit(void *hp, lua_State *L, int idx, char *err, size_t errlen) {
    lb_prod *h = hp;
    if (h->closed || !h->b->c || h->nwait > 0) return LB_PROD_SLOW;
    if (policy_of(h) == LEI_BLOCK && !prod_room(h)) return LB_PROD_SLOW;
    int code;
    lei_msg *m = lb_encode(h->b, L, idx, err, errlen, &code);
    if (!m) return code;
    const char *e;
    int rc = prod_send(h, m, 0, L, &e);
    lei_msg_release(m, lb_hook_unpin, h->b);
    if (rc) snprintf(err, errlen, "%s", e ? e : lei_err_text(rc));
    return rc;
}

static int dp_stage(void *hp, const uint8_t *p, size_t n) {
    lb_prod *h = hp;
    msg_done(h, h->staged); /* a staged message has no pins */
    h->staged = NULL;
    /* recorded: the bytes go straight into the recording, lent to the message (lua_rec.c) */
    lei_msg *m = h->rec ? lb_rec_stage(h->rec, h->rec_c, h->rec_p, h->seq + 1, p, n) : NULL;
    if (m) {
        h->staged = m;
        return 0;
    }
    m = msg_take(h);
    if (!m || lei_wbuf_put(&m->own, p, n)) {
        lei_msg_release(m, NULL, NULL);
        return -1;
    }
    lei_msg_sync(m);
    h->staged = m;
    return 0;
}

/* 1 when what bd vouches for is within the limits (lb_bounds), with
 * max_depth read as the reader reads it (at most LEI_MAX_DEPTH_CEIL). */
static int bounds_within(const lb_bounds *bd, const lei_codec_limits *lim) {
    unsigned depth = lim->max_depth > LEI_MAX_DEPTH_CEIL ? LEI_MAX_DEPTH_CEIL : lim->max_depth;
    return bd && bd->longest <= lim->max_string && bd->tables <= depth &&
           bd->decoded <= lim->max_value_bytes;
}

static int dp_submit_bytes(void *hp, const uint8_t *p, size_t n, const lb_bounds *bd, char *err,
                           size_t errlen) {
    lb_prod *h = hp;
    if (h->closed || !h->b->c || h->nwait > 0) return LB_PROD_SLOW;
    if (policy_of(h) == LEI_BLOCK && !prod_room(h)) return LB_PROD_SLOW;
    const char *why;
    /* read item by item (~150 instructions for a 64-byte string, a third
     * of the rest of this call) only when the maker's bounds do not
     * settle it */
    if (!bounds_within(bd, &h->b->lim) && lei_codec_validate(p, n, &h->b->lim, &why)) {
        snprintf(err, errlen, "%s", why);
        return LEI_E_LIMIT; /* a C-built value is well formed: only a limit fails it */
    }
    /* ours until msg_done below; the queues take their own references */
    lei_msg *m = h->rec ? lb_rec_stage(h->rec, h->rec_c, h->rec_p, h->seq + 1, p, n) : NULL;
    if (!m && (!(m = msg_take(h)) || lei_wbuf_put(&m->own, p, n))) {
        lei_msg_release(m, NULL, NULL);
        snprintf(err, errlen, "%s", lei_err_text(LEI_E_NOMEM));
        return LEI_E_NOMEM;
    }
    lei_msg_sync(m);
    lei_ctx_count_encode(h->b->c);
    const char *e;
    int rc = prod_send(h, m, 0, NULL, &e); /* async: L is not used */
    msg_done(h, m);
    if (rc) snprintf(err, errlen, "%s", e ? e : lei_err_text(rc));
    return rc;
}

static const lb_dataplane dataplane = {dp_submit, dp_stage, dp_submit_bytes};

/* core.dataplane() -> light userdata: the lb_dataplane table (lua_prod.h). */
static int l_dataplane(lua_State *L) {
    lua_pushlightuserdata(L, (void *)&dataplane);
    return 1;
}

/* ---- the handle from Lua ---- */

/* Replaces the handle's modulators by the lb_moe userdata of the array at
 * idx (nil or false: none), pinning the array in the environment table. */
static void set_mods(lua_State *L, lb_prod *h, int idx) {
    int n = lua_istable(L, idx) ? (int)lua_objlen(L, idx) : 0;
    lb_moe **a = NULL;
    if (n) {
        a = malloc((size_t)n * sizeof *a);
        if (!a) luaL_error(L, "lecho: out of memory");
        for (int i = 0; i < n; i++) {
            lua_rawgeti(L, idx, i + 1);
            a[i] = lua_touserdata(L, -1);
            if (!a[i] || !lua_getmetatable(L, -1)) {
                free(a);
                luaL_argerror(L, idx, "modulators expected");
            }
            luaL_getmetatable(L, MOE_MT);
            int ok = lua_rawequal(L, -1, -2);
            lua_pop(L, 3);
            if (!ok) {
                free(a);
                luaL_argerror(L, idx, "modulators expected");
            }
        }
    }
    free(h->moes);
    h->moes = a;
    h->nmoes = n;
    lua_getfenv(L, 1);
    if (n)
        lua_pushvalue(L, idx);
    else
        lua_pushnil(L);
    lua_setfield(L, -2, "mods");
    lua_pop(L, 1);
}

/* ctx:producer(chid, pid, policy) -> a producer handle (policy nil: the
 * context's, read at each submit). */
static int l_producer(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    uint32_t chid = lb_check_chan(L, b, 2);
    uint64_t pid = (uint64_t)luaL_checknumber(L, 3);
    int policy = lua_toboolean(L, 4) ? luaL_checkoption(L, 4, NULL, lb_policy_names) : -1;
    lb_prod *h = lua_newuserdata(L, sizeof *h);
    memset(h, 0, sizeof *h);
    h->b = b;
    h->chid = chid;
    h->pid = pid;
    h->policy = policy;
    h->plain = 1;
    luaL_getmetatable(L, PROD_MT);
    lua_setmetatable(L, -2);
    lua_createtable(L, 0, 2);
    lua_pushvalue(L, 1);
    lua_setfield(L, -2, "ctx");
    lua_setfenv(L, -2);
    return 1;
}

/* h:set_mods(list|false, plain): the channel's modulators and whether a
 * submit also goes plain (when it has modulators; without, always). */
static int l_set_mods(lua_State *L) {
    lb_prod *h = check_prod(L);
    set_mods(L, h, 2);
    h->plain = h->nmoes == 0 || lua_toboolean(L, 3);
    return 0;
}

/* The common part of h:submit and h:submit_staged: m (released here). */
static int submit_msg(lua_State *L, lb_prod *h, lei_msg *m, int sync) {
    const char *err;
    int rc = prod_send(h, m, sync, L, &err);
    lei_msg_release(m, lb_hook_unpin, h->b);
    if (rc) return lb_push_err(L, err, rc);
    if (!sync) lua_pushboolean(L, 1);
    return 1;
}

/* Nothing done: the caller waits for room (h:room) and retries. */
static int would_block(lua_State *L) { return lb_push_err(L, "queue full", LEI_E_WOULDBLOCK); }

/* 1 when the submit must wait for room first (checked before encoding). */
static int must_wait(lb_prod *h, int sync) {
    return (sync || policy_of(h) == LEI_BLOCK) && !prod_room(h);
}

/* h:set_record(recorder, channel_name, producer_name) -> true, or nil,
 * err: every event it submits from now on is recorded there
 * (ctx:recorder_open, lua_rec.c); h:set_record(nil): no more. */
static int l_set_record(lua_State *L) {
    lb_prod *h = check_prod(L);
    lua_getfenv(L, 1);
    if (lua_isnoneornil(L, 2)) {
        h->rec = NULL;
        lua_pushnil(L);
        lua_setfield(L, -2, "rec");
        lua_pushboolean(L, 1);
        return 1;
    }
    lb_rec *r = lb_rec_check(L, 2);
    const char *cn = luaL_checkstring(L, 3), *pn = luaL_checkstring(L, 4);
    if (lb_rec_ctx(r) != h->b) return lb_push_err(L, "recorder closed, or of another context", LEI_E_INVALID);
    uint32_t c, p;
    if (lb_rec_attach(r, cn, pn, &c, &p)) return lb_push_err(L, "recorder closed or out of memory", LEI_E_NOMEM);
    lua_pushvalue(L, 2);
    lua_setfield(L, -2, "rec");
    h->rec = r;
    h->rec_c = c;
    h->rec_p = p;
    lua_pushboolean(L, 1);
    return 1;
}

/* h:submit(value, sync) -> true | sync id(s) | nil, err, code.  Sync
 * through modulators: a list of the sync ids to wait for.  "wouldblock":
 * nothing done, the caller waits for room (h:room) and retries. */
static int l_submit(lua_State *L) {
    lb_prod *h = check_prod(L);
    luaL_checkany(L, 2);
    int sync = lua_toboolean(L, 3);
    if (h->closed) return lb_push_err(L, "producer is closed", LEI_E_CLOSED);
    if (!h->b->c) luaL_error(L, "lecho: context is closed");
    if (must_wait(h, sync)) return would_block(L);
    char err[256];
    int code;
    lei_msg *m = lb_encode(h->b, L, 2, err, sizeof err, &code);
    if (!m) return lb_push_err(L, err, code);
    return submit_msg(L, h, m, sync);
}

/* h:submit_staged(sync): h:submit of what lb_dataplane.stage copied last
 * (taken: a second call without a stage is misuse). */
static int l_submit_staged(lua_State *L) {
    lb_prod *h = check_prod(L);
    int sync = lua_toboolean(L, 2);
    if (h->closed) return lb_push_err(L, "producer is closed", LEI_E_CLOSED);
    if (!h->b->c) luaL_error(L, "lecho: context is closed");
    if (!h->staged) return luaL_error(L, "lecho: nothing staged");
    if (must_wait(h, sync)) return would_block(L); /* stays staged */
    lei_msg *m = h->staged;
    h->staged = NULL;
    lei_ctx_count_encode(h->b->c);
    const char *err;
    int rc = prod_send(h, m, sync, L, &err);
    msg_done(h, m); /* a staged message has no pins */
    if (rc) return lb_push_err(L, err, rc);
    if (!sync) lua_pushboolean(L, 1);
    return 1;
}

/* h:room() -> true when a blocking submit would not wait. */
static int l_room(lua_State *L) {
    lb_prod *h = check_prod(L);
    lua_pushboolean(L, h->b->c && prod_room(h));
    return 1;
}

/* h:waiting(delta): submits of this producer waiting for room in Lua (the
 * C path takes the Lua path while any does, to keep their order). */
static int l_waiting(lua_State *L) {
    lb_prod *h = check_prod(L);
    h->nwait += (int)luaL_checkinteger(L, 2);
    return 0;
}

/* h:seq() -> the sequence of the last event submitted. */
static int l_seq(lua_State *L) {
    lua_pushnumber(L, (lua_Number)check_prod(L)->seq);
    return 1;
}

static void prod_free(lb_prod *h) {
    free(h->moes);
    h->moes = NULL;
    h->nmoes = 0;
    lei_msg_release(h->staged, NULL, NULL);
    h->staged = NULL;
    lei_msg_release(h->spare, NULL, NULL);
    h->spare = NULL;
    for (; h->npool; h->npool--, h->phead = (h->phead + 1) % POOL_MAX) {
        lei_msg_release(h->pool[h->phead], NULL, NULL);
        h->pool[h->phead] = NULL;
    }
    h->phead = 0;
    free(h->pool);
    h->pool = NULL;
}

/* h:set_pid(pid): the producer id its events carry from now on (a replay's
 * producers take ids of their own, lecho.replay). */
static int l_set_pid(lua_State *L) {
    lb_prod *h = check_prod(L);
    h->pid = (uint64_t)luaL_checknumber(L, 2);
    return 0;
}

/* h:set_seq(seq): the sequence of the last event, so the next is seq + 1
 * (lecho.history runs kept events through a modulator with theirs). */
static int l_set_seq(lua_State *L) {
    lb_prod *h = check_prod(L);
    h->seq = (uint64_t)luaL_checknumber(L, 2);
    return 0;
}

/* h:close(): no submit goes through it any more. */
static int l_close(lua_State *L) {
    lb_prod *h = check_prod(L);
    h->closed = 1;
    prod_free(h);
    return 0;
}

static int l_gc(lua_State *L) {
    prod_free(check_prod(L));
    return 0;
}

static const luaL_Reg prod_methods[] = {
    {"submit", l_submit}, {"submit_staged", l_submit_staged}, {"room", l_room},
    {"waiting", l_waiting}, {"seq", l_seq}, {"set_mods", l_set_mods}, {"set_pid", l_set_pid}, {"set_seq", l_set_seq}, {"set_record", l_set_record}, {"close", l_close},
    {NULL, NULL}};

const luaL_Reg lb_prod_ctx_methods[] = {{"producer", l_producer}, {NULL, NULL}};

/* The handle's metatable; core.dataplane and core.dataplane_cdef in the
 * module table on top. */
void lb_prod_open(lua_State *L) {
    lb_metatable(L, PROD_MT, prod_methods, l_gc);
    lua_pushcfunction(L, l_dataplane);
    lua_setfield(L, -2, "dataplane");
    lua_pushstring(L, LB_DATAPLANE_CDEF);
    lua_setfield(L, -2, "dataplane_cdef");
}
