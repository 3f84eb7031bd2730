/* moe.c: modulators in sandboxed LuaJIT states (see moe.h).
 *
 * Every touch of a modulator's state happens inside one lua_cpcall (step),
 * so that a memory error or a budget error raised anywhere, decoding
 * included, unwinds to us and never reaches LuaJIT's panic handler.  Outputs
 * are encoded inside the step and submitted after it returned, so that a
 * blocking submit (which serves the loop) never runs while the state is in a
 * call.
 */
#define _GNU_SOURCE
#include "moe.h"

#include "moe_int.h"
#include "lpat.h"

#include <lauxlib.h>
#include <luajit.h>
#include <lualib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void lei_moe_opts_default(lei_moe_opts *o) {
    memset(o, 0, sizeof *o);
    o->budget = 0.005;
    o->mem_limit = 32u << 20;
    o->max_pending = 4096;
    lei_codec_limits_default(&o->lim);
}

double moe_ts_sec(const struct timespec *t) { return (double)t->tv_sec + (double)t->tv_nsec * 1e-9; }

double moe_cpu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return moe_ts_sec(&t);
}

/* ---- allocator and budget --------------------------------------------- */

static void *moe_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
    lei_moe *m = ud;
    lei_moe_group *g = m->o.group;
    size_t old = ptr ? osize : 0;
    size_t cur = m->mem - old;
    if (nsize == 0) {
        free(ptr);
        m->mem = cur;
        if (g) g->mem -= old;
        return NULL;
    }
    if (m->limit_on && cur + nsize > m->o.mem_limit) {
        m->mem_hit = 1;
        return NULL;
    }
    if (m->limit_on && g && g->mem_cap && nsize > old && g->mem - old + nsize > g->mem_cap) {
        m->mem_hit = m->pool_hit = 1;
        return NULL;
    }
    void *q = realloc(ptr, nsize);
    if (q) {
        m->mem = cur + nsize;
        if (g) g->mem = g->mem - old + nsize;
    }
    return q;
}

lei_moe *moe_of(lua_State *L) {
    lua_getfield(L, LUA_REGISTRYINDEX, REG_KEY);
    lei_moe *m = lua_touserdata(L, -1);
    lua_pop(L, 1);
    return m;
}

lei_moe *moe_step_of(lua_State *L) {
    /* a C function without upvalues reads nil here (LuaJIT's index2adr) */
    lei_moe *m = lua_touserdata(L, lua_upvalueindex(1));
    return m ? m : moe_of(L);
}

/* The hot step of m (moe_int.h), m as its upvalue, and for a modulator
 * the environment and the names "enqueue" and "dequeue" (upvalues 2-4:
 * push_env_ref's lookup in two API calls); in the registry. */
static void make_hot(lua_State *L, lei_moe *m) {
    lua_pushlightuserdata(L, m);
    int n = 1;
    if (m->ref_kenq != LUA_NOREF) {
        lua_rawgeti(L, LUA_REGISTRYINDEX, m->ref_env);
        lua_rawgeti(L, LUA_REGISTRYINDEX, m->ref_kenq);
        lua_rawgeti(L, LUA_REGISTRYINDEX, m->ref_kdeq);
        n = 4;
    }
    lua_pushcclosure(L, m->hot_fn, n);
    m->hot_ref = luaL_ref(L, LUA_REGISTRYINDEX);
}

/* Budget check every HOOK_COUNT instructions.  Short calls never get here,
 * so the thread's CPU clock (a system call of several microseconds here) is
 * read only by long ones.  The budget counts this thread's CPU time from the
 * first check on: the first HOOK_COUNT instructions are not charged, and
 * neither is any time the thread spent preempted (wall time on a busy host
 * is not the modulator's doing). */
void moe_hook(lua_State *L, lua_Debug *ar) {
    (void)ar;
    lei_moe *m = moe_of(L);
    if (!m || !m->in_call) return;
    if (!m->own_alloc && (size_t)lua_gc(L, LUA_GCCOUNT, 0) * 1024u > m->o.mem_limit) {
        m->mem_hit = 1;
        luaL_error(L, "out of memory");
    }
    if (m->stop) m->over = 1;
    if (!m->over) {
        double cpu = moe_cpu_now();
        if (m->cpu0 < 0) m->cpu0 = cpu;
        if (cpu - m->cpu0 > m->o.budget) m->over = 1;
    }
    if (m->over) {
        /* From now on every instruction fails, so a pcall inside the
         * modulator cannot swallow this and go on. */
        m->over = 1;
        lua_sethook(L, moe_hook, LUA_MASKCOUNT, 1);
        luaL_error(L, "CPU budget exceeded");
    }
}

/* ---- outputs ------------------------------------------------------------ */

/* The encoded outputs of a call count against the memory caps (the moe's
 * and the group's) until they are submitted: a call returning the same
 * 63 MiB table 16 times must not take 1 GB of the producer's memory. */
static void out_charge(lei_moe *m, moe_out *o, size_t n) {
    o->mem = n;
    m->mem += n;
    if (m->o.group) m->o.group->mem += n;
}

static void out_uncharge(lei_moe *m, moe_out *o) {
    m->mem -= o->mem;
    if (m->o.group) m->o.group->mem -= o->mem;
    o->mem = 0;
}

static void out_clear(lei_moe *m) {
    for (size_t i = 0; i < m->nout; i++) {
        lei_msg_release(m->out[i].msg, NULL, NULL);
        out_uncharge(m, &m->out[i]);
    }
    m->nout = 0;
}

lei_msg *moe_take_out(lei_moe *m) {
    if (m->nout == 0) return NULL;
    lei_msg *msg = m->out[0].msg;
    out_uncharge(m, &m->out[0]);
    m->out[0].msg = NULL;
    for (size_t i = 1; i < m->nout; i++) {
        lei_msg_release(m->out[i].msg, NULL, NULL);
        out_uncharge(m, &m->out[i]);
    }
    m->nout = 0;
    return msg;
}

/* Holds the value on top (popped) for dequeue. Raises on memory errors. */
static void hold(lua_State *L, lei_moe *m) {
    if (m->nheld >= m->o.max_pending) {
        /* The oldest held event goes: dequeue is too slow for the source. */
        lua_rawgeti(L, LUA_REGISTRYINDEX, m->ref_q);
        lua_pushnil(L);
        lua_rawseti(L, -2, (int)m->qhead);
        lua_pop(L, 1);
        m->qhead++;
        m->hoff++;
        m->nheld--;
        m->st.pending_drops++;
    }
    if (m->hoff + m->nheld >= m->cheld) {
        if (m->hoff > 0) {
            memmove(m->held, m->held + m->hoff, m->nheld * sizeof *m->held);
            m->hoff = 0;
        }
        if (m->nheld >= m->cheld) {
            size_t nc = m->cheld ? m->cheld * 2 : 16;
            moe_held *h = realloc(m->held, nc * sizeof *h);
            if (!h) luaL_error(L, "out of memory");
            m->held = h;
            m->cheld = nc;
        }
    }
    moe_held *h = &m->held[m->hoff + m->nheld];
    h->producer = m->producer;
    h->seq = m->seq;
    h->sync = m->sync;
    lua_rawgeti(L, LUA_REGISTRYINDEX, m->ref_q);
    lua_insert(L, -2);
    lua_rawseti(L, -2, (int)m->qtail);
    lua_pop(L, 1);
    m->qtail++;
    m->nheld++;
}

/* Room for one more output; a stop of the budget between two outputs is
 * taken here (each encode can be long). Raises. */
static void out_room(lua_State *L, lei_moe *m) {
    if (m->nout == m->cout) {
        size_t nc = m->cout ? m->cout * 2 : 8;
        moe_out *o = realloc(m->out, nc * sizeof *o);
        if (!o) luaL_error(L, "out of memory");
        m->out = o;
        m->cout = nc;
    }
    if (m->stop || m->over) {
        m->over = 1;
        luaL_error(L, "CPU budget exceeded");
    }
}

/* The event enqueue was given, returned unchanged, goes out as it came:
 * the submitted message itself (one more reference), neither encoded again
 * nor charged to the caps (its bytes are the producer's, already made). */
static void route_same(lua_State *L, lei_moe *m) {
    int key = m->route_key;
    m->route_key = 0;
    out_room(L, m);
    moe_out *o = &m->out[m->nout++];
    m->in_msg->refcnt++;
    m->st.passed++;
    o->msg = m->in_msg;
    o->mem = 0;
    o->producer = m->producer;
    o->seq = m->seq;
    o->sync = m->sync;
    o->key = key;
}

/* The bits of a number (the same bits: the same number, -0 and NaN kept
 * apart as the bytes would be). */
static inline uint64_t num_bits(lua_Number x) {
    uint64_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

/* 1 when the value at r is the decoded event at v unchanged: the same
 * boolean, the same string (interned: the same bytes), a number of the same
 * bits.  A table or an array may have been changed in place: never. */
static int unchanged(lua_State *L, int v, int r) {
    int t = lua_type(L, v);
    if (lua_type(L, r) != t) return 0;
    if (t == LUA_TBOOLEAN || t == LUA_TSTRING) return lua_rawequal(L, v, r);
    if (t != LUA_TNUMBER) return 0;
    return num_bits(lua_tonumber(L, v)) == num_bits(lua_tonumber(L, r));
}

/* Sends (after the step) or holds the value at idx, per the stage. */
void moe_route(lua_State *L, lei_moe *m, int idx) {
    char err[256];
    int key = m->route_key; /* taken here: an error below must not mark a later output */
    m->route_key = 0;
    if (lua_isnil(L, idx)) return;
    if ((m->stage == ST_ENQ || m->stage == ST_HOOK) && m->ref_q != LUA_NOREF) {
        lua_pushvalue(L, idx);
        hold(L, m);
        return;
    }
    out_room(L, m);
    /* The encoder charges at most what the caps leave (its charge, the
     * decoded size, is never below the encoded size): it stops there
     * instead of encoding the whole value first. */
    lei_codec_limits lim = m->o.lim;
    lei_moe_group *g = m->o.group;
    size_t room = m->o.mem_limit > m->mem ? m->o.mem_limit - m->mem : 0;
    int by_group = 0;
    if (g && g->mem_cap) {
        size_t groom = g->mem_cap > g->mem ? g->mem_cap - g->mem : 0;
        if (groom < room) {
            room = groom;
            by_group = 1;
        }
    }
    int capped = m->limit_on && room < lim.max_value_bytes;
    if (capped) lim.max_value_bytes = room;
    lei_msg *msg = lei_msg_new();
    if (!msg) luaL_error(L, "out of memory");
    /* Never pinned: the state may be gone before the bytes are written. */
    int why = 0;
    if (lei_codec_lua_encode(L, idx, msg, &lim, 0, err, sizeof err, &why)) {
        lei_msg_release(msg, NULL, NULL);
        if (capped && why == LEI_ESIZE) { /* the cap of the state's memory, said by the encoder */
            m->mem_hit = m->out_hit = 1;
            m->pool_hit = by_group;
            luaL_error(L, "not enough memory");
        }
        luaL_error(L, "cannot send what it produced: %s", err);
    }
    /* the buffer grew by doubling: give back the slack before charging it */
    if (msg->own.cap - msg->own.len > 4096) {
        char *d = realloc(msg->own.data, msg->own.len ? msg->own.len : 1);
        if (d) {
            msg->own.data = d;
            msg->own.cap = msg->own.len ? msg->own.len : 1;
        }
    }
    moe_out *o = &m->out[m->nout++];
    out_charge(m, o, msg->own.cap);
    o->msg = msg;
    o->producer = m->producer;
    o->seq = m->seq;
    o->sync = m->sync;
    o->key = key;
}

/* ---- steps: everything that touches the state runs inside one ---------- */

static void push_env_fn(lua_State *L, lei_moe *m, const char *fn) {
    lua_rawgeti(L, LUA_REGISTRYINDEX, m->ref_env);
    lua_getfield(L, -1, fn);
    lua_remove(L, -2);
}

/* push_env_fn with the name kept in the registry at ref (the same lookup,
 * metamethods of the environment included, without interning the name). */
static void push_env_ref(lua_State *L, lei_moe *m, int ref, const char *fn) {
    /* the hot step (make_hot): every step of a modulator once its state is
     * set up (hot_ref is set last in step_init), with these upvalues */
    if (m->hot_ref != LUA_NOREF && ref != LUA_NOREF) {
        lua_pushvalue(L, lua_upvalueindex(ref == m->ref_kenq ? 3 : 4));
        lua_gettable(L, lua_upvalueindex(2));
        return;
    }
    if (ref == LUA_NOREF) {
        push_env_fn(L, m, fn);
        return;
    }
    lua_rawgeti(L, LUA_REGISTRYINDEX, m->ref_env);
    lua_rawgeti(L, LUA_REGISTRYINDEX, ref);
    lua_gettable(L, -2);
    lua_remove(L, -2);
}

static void decode_in(lua_State *L, lei_moe *m) {
    char err[256];
    if (lei_decode_lua(L, m->in, m->inlen, &m->o.lim, err, sizeof err))
        luaL_error(L, "bad input: %s", err);
}

/* Calls the function below nargs arguments and routes every result. */
static void call_route(lua_State *L, lei_moe *m, int nargs) {
    int base = lua_gettop(L) - nargs - 1;
    lua_call(L, nargs, LUA_MULTRET);
    int top = lua_gettop(L);
    if (top == base) m->st.dropped++;
    for (int i = base + 1; i <= top; i++) moe_route(L, m, i);
    lua_settop(L, base);
}

typedef struct init_args {
    const char *src;
    size_t len;
} init_args;

/* The event m->in pushed without the decoder when it is nil, a boolean, a
 * double or an integer of one byte (the encodings lei_codec_read_item reads
 * for them: codec.h; what most streams of numbers carry): its Lua type,
 * and in *bits its number's bits or its boolean; -1 and nothing pushed for
 * anything else (the decoder's business). */
static int push_scalar(lua_State *L, const lei_moe *m, uint64_t *bits) {
    const uint8_t *p = m->in;
    size_t n = m->inlen;
    if (n == 1 && p[0] == LEI_T_NIL) {
        lua_pushnil(L);
        *bits = 0;
        return LUA_TNIL;
    }
    if (n == 1 && (p[0] == LEI_T_TRUE || p[0] == LEI_T_FALSE)) {
        *bits = p[0] == LEI_T_TRUE;
        lua_pushboolean(L, (int)*bits);
        return LUA_TBOOLEAN;
    }
    lua_Number x;
    if (n == 2 && p[0] == LEI_T_INT && p[1] < 0x80) {
        x = (lua_Number)lei_zigzag_decode(p[1]);
    } else if (n == 9 && p[0] == LEI_T_DOUBLE) {
        uint64_t u = 0;
        for (int i = 0; i < 8; i++) u |= (uint64_t)p[1 + i] << (8 * i);
        memcpy(&x, &u, sizeof x);
    } else {
        return -1;
    }
    lua_pushnumber(L, x);
    *bits = num_bits(x);
    return LUA_TNUMBER;
}

/* One enqueue call on the event m->in (the ST_ENQ step, and each event of
 * a batch): its results routed, a lone one that is the event unchanged as
 * the submitted message (route_same). */
static void enq_one(lua_State *L, lei_moe *m) {
    push_env_ref(L, m, m->ref_kenq, "enqueue");
    int f = lua_gettop(L), t = lua_type(L, f);
    uint64_t bits;
    if (t == LUA_TNIL) {
        lua_pop(L, 1);
        decode_in(L, m);
        moe_route(L, m, -1);
        lua_pop(L, 1);
    } else if (m->in_msg && m->ref_q == LUA_NOREF && (t = push_scalar(L, m, &bits)) >= 0) {
        /* a boolean or a number (push_scalar): the event unchanged is
         * told from its bits, no copy of it kept on the stack */
        lua_call(L, 1, LUA_MULTRET);
        int top = lua_gettop(L);
        if (top == f - 1)
            m->st.dropped++;
        else if (top == f && t != LUA_TNIL && lua_type(L, top) == t &&
                 (t == LUA_TNUMBER ? num_bits(lua_tonumber(L, top)) : (uint64_t)lua_toboolean(L, top)) == bits)
            route_same(L, m);
        else
            for (int i = f; i <= top; i++) moe_route(L, m, i);
        lua_settop(L, f - 1);
    } else if (m->in_msg && m->ref_q == LUA_NOREF) {
        decode_in(L, m);
        int v = lua_gettop(L);
        lua_pushvalue(L, v - 1);
        lua_pushvalue(L, v);
        lua_call(L, 1, LUA_MULTRET);
        int top = lua_gettop(L);
        if (top == v) m->st.dropped++;
        if (top == v + 1 && unchanged(L, v, top))
            route_same(L, m);
        else
            for (int i = v + 1; i <= top; i++) moe_route(L, m, i);
        lua_settop(L, v - 2);
    } else {
        decode_in(L, m);
        call_route(L, m, 1);
    }
}

/* The staged events from istg on, one enqueue call each with a budget of
 * its own (the group's call number and the CPU clock start again: the
 * timer's handler and the hook measure each call apart), until they are
 * all done or the outputs pass STG_OUT_BYTES.  A stop that came during
 * the previous call fails the modulator here, as after a lone call. */
static void step_batch(lua_State *L, lei_moe *m) {
    size_t bytes = 0;
    while (m->istg < m->nstg && bytes <= STG_OUT_BYTES) {
        if (m->stop || m->over) {
            m->over = 1;
            luaL_error(L, "CPU budget exceeded");
        }
        moe_stg *g = &m->stg[m->istg++];
        m->producer = g->producer;
        m->seq = g->seq;
        m->in_msg = g->msg;
        m->in = (const uint8_t *)g->msg->own.data;
        m->inlen = g->msg->total;
        m->st.events_in++;
        if (m->o.group) m->o.group->callno++;
        m->cpu0 = -1;
        size_t n0 = m->nout;
        enq_one(L, m);
        for (size_t i = n0; i < m->nout; i++)
            bytes += m->out[i].mem ? m->out[i].mem : m->out[i].msg->total;
        m->nout_ok = m->nout;
    }
}

static int step(lua_State *L) {
    lei_moe *m = moe_step_of(L);
    switch (m->stage) {
    default:
        break;
    case ST_BATCH:
        step_batch(L, m);
        break;
    case ST_PARAMS:
        /* the environment itself: the modulator may have rebound _G */
        lua_rawgeti(L, LUA_REGISTRYINDEX, m->ref_env);
        decode_in(L, m);
        lua_setfield(L, -2, "params");
        lua_pop(L, 1);
        break;
    case ST_ENQ:
        enq_one(L, m);
        break;
    case ST_DEQ: {
        lua_rawgeti(L, LUA_REGISTRYINDEX, m->ref_q);
        int q = lua_gettop(L);
        push_env_ref(L, m, m->ref_kdeq, "dequeue");
        lua_rawgeti(L, q, (int)m->qhead);
        lua_pushnil(L);
        lua_rawseti(L, q, (int)m->qhead);
        lua_pushinteger(L, (lua_Integer)m->nheld);
        call_route(L, m, 2);
        lua_pop(L, 1);
        break;
    }
    case ST_HOOK:
        push_env_fn(L, m, m->hook_fn);
        if (lua_isfunction(L, -1)) {
            if (m->hook_arg >= 0) lua_pushinteger(L, m->hook_arg);
            call_route(L, m, m->hook_arg >= 0 ? 1 : 0);
        } else {
            lua_pop(L, 1);
        }
        break;
    }
    return 0;
}

/* Loads the source and sets up the state (the ST_INIT step). */
static int step_init(lua_State *L) {
    lei_moe *m = moe_of(L);
    init_args *a = lua_touserdata(L, 1);
    lua_settop(L, 0);
    moe_env_sandbox_open(L);
    /* The string table's pattern functions: ours, which the budget stops
     * (core/moe/lpat.c), before the sandbox copies it (and for string methods). */
    lua_getfield(L, LUA_GLOBALSINDEX, "string");
    lei_lpat_open(L, &m->stop);
    lua_pop(L, 1);
    int env = moe_env_build(L, m);
    /* params */
    if (!m->svc) {
        decode_in(L, m);
        lua_setfield(L, env, "params");
    }
    /* text only: a bytecode chunk is refused by the loader */
    if (a->len && a->src[0] == LUA_SIGNATURE[0])
        luaL_error(L, "modulator must be Lua source text, not bytecode");
    lua_pushfstring(L, "=%s", m->name);
    if (luaL_loadbufferx(L, a->src, a->len, lua_tostring(L, -1), "t")) lua_error(L);
    lua_remove(L, -2);
    lua_pushvalue(L, env);
    lua_setfenv(L, -2);
    if (m->svc) {
        /* a sandbox: the chunk returns a function or a table of functions,
         * copied (named by strings) so that the chunk cannot change it later */
        lua_call(L, 0, 1);
        if (lua_istable(L, -1)) {
            lua_newtable(L);
            int n = 0;
            for (lua_pushnil(L); lua_next(L, -3); lua_pop(L, 1)) {
                if (lua_type(L, -2) != LUA_TSTRING || !lua_isfunction(L, -1))
                    luaL_error(L, "a sandbox's table holds only functions named by strings");
                lua_pushvalue(L, -2);
                lua_pushvalue(L, -2);
                lua_rawset(L, -5);
                n++;
            }
            if (n == 0) luaL_error(L, "a sandbox's table holds no function");
        } else if (!lua_isfunction(L, -1)) {
            luaL_error(L, "a sandbox's chunk must return a function or a table of functions, not %s",
                       luaL_typename(L, -1));
        }
        m->ref_fn = luaL_ref(L, LUA_REGISTRYINDEX);
        make_hot(L, m);
        return 0;
    }
    lua_call(L, 0, 0);
    push_env_fn(L, m, "dequeue");
    int has_deq = lua_isfunction(L, -1);
    lua_pop(L, 1);
    if (has_deq) {
        lua_newtable(L);
        m->ref_q = luaL_ref(L, LUA_REGISTRYINDEX);
    }
    for (const char *const *f = (const char *const[]){"enqueue", "dequeue", "period", "receivers",
                                                       NULL};
         *f; f++) {
        push_env_fn(L, m, *f);
        if (!lua_isnil(L, -1) && !lua_isfunction(L, -1))
            luaL_error(L, "'%s' must be a function", *f);
        lua_pop(L, 1);
    }
    lua_pushliteral(L, "enqueue");
    m->ref_kenq = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_pushliteral(L, "dequeue");
    m->ref_kdeq = luaL_ref(L, LUA_REGISTRYINDEX);
    make_hot(L, m);
    return 0;
}

/* ---- running a step under the budget ----------------------------------- */

/* A modulator going away leaves its CPU charges of the window with its
 * principal (moe_group.c): replacing a modulator over and over must not
 * wipe what the replaced ones used. */
static void forget_ticks(lei_moe *m) {
    if (m->o.group) moe_group_retain(m->o.group, m);
    m->win_ticks = 0;
}

static void moe_fail(lei_moe *m, const char *why) {
    if (!m->L) return;
    forget_ticks(m);
    snprintf(m->err, sizeof m->err, "%s", why);
    out_clear(m);
    m->limit_on = 0;
    lua_close(m->L);
    m->L = NULL;
    m->nheld = 0;
    m->hoff = 0;
    if (m->o.period > 0) ev_timer_stop(lei_ctx_loop(m->ctx), &m->period_w);
}

static void submit_outs_n(lei_moe *m, size_t n, int keep_syncs);

/* Runs fn in the state; 0, or -1 with the modulator failed (m->err set). */
int moe_run_step(lei_moe *m, lua_CFunction fn, void *arg) {
    lua_State *L = m->L;
    if (!L) return -1;
    if (m->doom[0]) {
        m->svc_kind = SVC_FATAL;
        moe_fail(m, m->doom);
        return -1;
    }
    lei_moe_group *g = m->o.group;
    lei_moe *outer = g ? g->cur : NULL; /* a log hook may run another moe's call */
    if (g) g->busy++;
    m->in_call = 1;
    m->over = 0;
    m->stop = 0;
    m->cpu0 = -1;
    clock_gettime(MOE_WALL_CLOCK, &m->mono0);
    if (g) moe_group_enter(g, m);
    int rc;
    if (fn == m->hot_fn && m->hot_ref != LUA_NOREF) {
        /* the step kept in the registry: nothing allocated per call (moe_int.h) */
        (void)arg; /* the hot steps take none */
        lua_rawgeti(L, LUA_REGISTRYINDEX, m->hot_ref);
        rc = lua_pcall(L, 0, 0, 0);
    } else {
        rc = lua_cpcall(L, fn, arg);
    }
    m->in_call = 0;
    if (g) g->busy--;
    struct timespec t;
    clock_gettime(MOE_WALL_CLOCK, &t);
    uint64_t ns = (uint64_t)((moe_ts_sec(&t) - moe_ts_sec(&m->mono0)) * 1e9);
    if (g) {
        moe_group_leave(g, &t);
        if (outer) g->cur = outer;
    }
    m->st.time_ns += ns;
    m->st.calls++;
    if (m->stop) m->over = 1;
    if (rc == 0 && !m->over && !m->mem_hit && !m->doom[0]) return 0;
    char why[384];
    if (m->doom[0]) /* the group's CPU share check (moe_group.c), not the budget */
        snprintf(why, sizeof why, "%s", m->doom);
    else if (m->over)
        snprintf(why, sizeof why, "exceeded its CPU budget of %g ms in one call", m->o.budget * 1e3);
    else if (m->out_hit)
        snprintf(why, sizeof why, "what it returned or emitted in one call passes %s of %zu bytes",
                 m->pool_hit ? "the memory cap of this producer's modulators" : "its memory cap",
                 m->pool_hit && g ? g->mem_cap : m->o.mem_limit);
    else if (m->pool_hit)
        snprintf(why, sizeof why, "modulators of this producer exceed their memory cap of %zu bytes",
                 g ? g->mem_cap : 0);
    else if (m->mem_hit || rc == LUA_ERRMEM)
        snprintf(why, sizeof why, "exceeded its memory cap of %zu bytes", m->o.mem_limit);
    else if (rc == 0)
        snprintf(why, sizeof why, "%s", m->doom);
    else {
        const char *e = lua_tostring(L, -1);
        snprintf(why, sizeof why, "%s", e ? e : "error object is not a string");
    }
    if (m->svc && !m->doom[0] && m->stage == ST_SVC) {
        /* a sandbox's call: the call fails, the state stays (a stop
         * unwound it to here; the next call starts with a fresh budget) */
        m->svc_kind = m->over ? SVC_BUDGET : (m->mem_hit || rc == LUA_ERRMEM) ? SVC_MEMORY : SVC_ERROR;
        snprintf(m->err, sizeof m->err, "%s", why);
        out_clear(m);
        lua_settop(L, 0);
        lua_sethook(L, moe_hook, LUA_MASKCOUNT, HOOK_COUNT);
        if (m->mem_hit) {
            m->limit_on = 0; /* a collection may allocate a little */
            lua_gc(L, LUA_GCCOLLECT, 0);
            m->limit_on = 1;
        }
        m->over = m->stop = m->mem_hit = m->out_hit = m->pool_hit = 0;
        return -1;
    }
    m->svc_kind = SVC_FATAL;
    /* a batch: what the calls before the failing one returned goes out, as
     * it would have had each been called alone */
    if (m->stage == ST_BATCH) submit_outs_n(m, m->nout_ok, 0);
    moe_fail(m, why);
    return -1;
}

/* ---- the key-frame ring ------------------------------------------------ */

static void kf_clear(lei_moe *m) {
    for (size_t i = 0; i < m->nkf; i++) free(m->kf[i].data);
    m->nkf = 0;
    m->kf_bytes = 0;
}

static void kf_drop(lei_moe *m) {
    kf_clear(m);
    m->kf_valid = 0;
}

/* Output o is about to be submitted: a key frame restarts the ring; while
 * the ring is valid, a copy of its bytes goes in (a message of a modulator
 * is never pinned: its bytes are all in own). */
static void kf_add(lei_moe *m, const moe_out *o) {
    if (o->key) {
        kf_clear(m);
        m->kf_valid = 1;
    }
    if (!m->kf_valid) return;
    const lei_msg *msg = o->msg;
    size_t len = msg->own.len;
    size_t cap = m->o.mem_limit < KF_BYTES ? m->o.mem_limit : KF_BYTES;
    if (msg->next || m->kf_bytes + len > cap || m->nkf >= KF_ENTRIES) {
        kf_drop(m); /* too much since the key frame: a joiner gets none until the next */
        return;
    }
    if (m->nkf == m->ckf) {
        size_t nc = m->ckf ? m->ckf * 2 : 16;
        lei_moe_kf *k = realloc(m->kf, nc * sizeof *k);
        if (!k) {
            kf_drop(m);
            return;
        }
        m->kf = k;
        m->ckf = nc;
    }
    uint8_t *d = malloc(len ? len : 1);
    if (!d) {
        kf_drop(m);
        return;
    }
    memcpy(d, msg->own.data, len);
    lei_moe_kf *k = &m->kf[m->nkf++];
    k->data = d;
    k->len = len;
    k->producer = o->producer;
    k->seq = o->seq;
    m->kf_bytes += len;
}

long lei_moe_keyframes(const lei_moe *m, const lei_moe_kf **kf) {
    if (!m->L || !m->kf_valid) return -1;
    *kf = m->kf;
    return (long)m->nkf;
}

/* Submits the first n outputs of the last step, in order; the others are
 * dropped. */
static void submit_outs_n(lei_moe *m, size_t n, int keep_syncs) {
    lei_moe_group *g = m->o.group; /* a line logged here may run the application's Lua */
    if (g) g->busy++;
    for (size_t i = 0; i < m->nout; i++) {
        moe_out *o = &m->out[i];
        if (i >= n) {
            lei_msg_release(o->msg, NULL, NULL);
            out_uncharge(m, o);
            o->msg = NULL;
            continue;
        }
        const char *err = NULL;
        uint64_t sid = 0;
        kf_add(m, o);
        if (lei_submit(m->ctx, m->chid, o->producer, o->seq, o->msg, o->sync, m->policy, &sid, &err))
            lei_logf(m->ctx, "modulator %s: output not sent: %s", m->name, err);
        else
            m->st.events_out++;
        if (o->sync && sid && keep_syncs) {
            if (m->nsids == m->csids) {
                size_t nc = m->csids ? m->csids * 2 : 4;
                uint64_t *s = realloc(m->sids, nc * sizeof *s);
                if (s) {
                    m->sids = s;
                    m->csids = nc;
                }
            }
            if (m->nsids < m->csids) m->sids[m->nsids++] = sid;
        }
        lei_msg_release(o->msg, NULL, NULL);
        out_uncharge(m, o);
        o->msg = NULL;
    }
    m->nout = 0;
    if (g) g->busy--;
}

/* Submits the outputs of the last step, in order. */
static void submit_outs(lei_moe *m, int keep_syncs) { submit_outs_n(m, m->nout, keep_syncs); }

static void notify_fail(lei_moe *m) {
    if (m->o.on_fail) m->o.on_fail(m->o.ud, m, m->err);
}

/* Runs the staged async events (one entry into the state for up to
 * STG_MAX calls) and submits what they returned; a failure is notified
 * when notify.  The staged messages are released; with the modulator
 * failed (now or before), the rest of them go as every later event does. */
static int run_batch(lei_moe *m, int notify) {
    int rc = 0;
    lei_moe_group *g = m->o.group; /* between the steps too (lei_moe_group_busy) */
    if (g) g->busy++;
    m->in_batch = 1;
    m->istg = 0;
    while (m->L && m->istg < m->nstg) {
        m->stage = ST_BATCH;
        m->sync = 0;
        m->policy = m->stg_policy;
        m->nout_ok = 0;
        uint64_t calls = m->st.calls;
        int first = m->istg;
        rc = moe_run_step(m, step, NULL);
        m->st.calls = calls + (uint64_t)(m->istg - first); /* a call per event */
        m->in = NULL;
        m->in_msg = NULL;
        if (rc) break;
        submit_outs(m, 0);
    }
    for (int i = 0; i < m->nstg; i++) lei_msg_release(m->stg[i].msg, NULL, NULL);
    m->nstg = m->istg = 0;
    m->in_batch = 0;
    if (g) g->busy--;
    if (rc && notify) notify_fail(m);
    return rc ? -1 : 0;
}

/* Not from inside a call of m or its batch (a log hook's Lua may flush):
 * the batch running then finishes what is staged, in order. */
int lei_moe_flush(lei_moe *m) { return m->nstg && !m->in_call && !m->in_batch ? run_batch(m, 1) : 0; }

/* Dequeues held events; all of them when force, else while there is room. */
static int pump(lei_moe *m, int force) {
    while (m->L && m->nheld > 0 && (force || !lei_chan_full(m->ctx, m->chid))) {
        moe_held h = m->held[m->hoff];
        m->hoff++;
        m->nheld--;
        m->stage = ST_DEQ;
        m->producer = h.producer;
        m->seq = h.seq;
        m->sync = h.sync;
        int rc = moe_run_step(m, step, NULL);
        m->qhead++;
        if (rc) return -1;
        submit_outs(m, 1);
    }
    if (m->nheld == 0) m->hoff = 0;
    return 0;
}

/* Calls the modulator's function fn (if it has one) with arg (< 0: none);
 * what it emits carries producer id 0 and the modulator's own sequence. */
static int call_hook(lei_moe *m, const char *fn, int arg) {
    if (lei_moe_flush(m) || !m->L) return -1;
    m->stage = ST_HOOK;
    m->hook_fn = fn;
    m->hook_arg = arg;
    m->producer = 0;
    m->seq = ++m->pseq;
    m->sync = 0;
    m->policy = lei_ctx_opts(m->ctx)->policy;
    if (moe_run_step(m, step, NULL)) {
        notify_fail(m);
        return -1;
    }
    submit_outs(m, 0);
    return 0;
}

/* Under the block policy a period() whose destinations are at their
 * queue_limit is not called for this tick (counted): its output would go
 * past the limit, as nothing makes a timer wait (2 x 512 KiB every 10 ms
 * grew a producer by 100 MiB a second).  Nothing is lost: the modulator is
 * called at the next tick with room. */
static void period_cb(struct ev_loop *loop, ev_timer *w, int revents) {
    (void)loop;
    (void)revents;
    lei_moe *m = w->data;
    if (m->L && lei_ctx_opts(m->ctx)->policy == LEI_BLOCK && lei_chan_full(m->ctx, m->chid)) {
        m->st.period_skips++;
        return;
    }
    call_hook(m, "period", -1);
}

int lei_moe_receivers(lei_moe *m, int n) { return call_hook(m, "receivers", n); }

/* ---- public ------------------------------------------------------------- */

lei_moe *lei_moe_new(lei_ctx *c, uint32_t chid, const char *name, const char *src, size_t len,
                     const uint8_t *p, size_t plen, const lei_moe_opts *o, char *err,
                     size_t errlen) {
    return moe_new(c, chid, name, src, len, p, plen, o, 0, NULL, err, errlen);
}

lei_moe *moe_new(lei_ctx *c, uint32_t chid, const char *name, const char *src, size_t len,
                 const uint8_t *p, size_t plen, const lei_moe_opts *o, int svc, int *over,
                 char *err, size_t errlen) {
    if (over) *over = 0;
    lei_moe *m = calloc(1, sizeof *m);
    if (!m) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    m->svc = svc;
    m->ref_fn = LUA_NOREF;
    m->hot_fn = svc ? moe_svc_step : step;
    m->hot_ref = LUA_NOREF;
    m->ref_kenq = m->ref_kdeq = LUA_NOREF;
    m->ctx = c;
    m->chid = chid;
    m->o = *o;
    snprintf(m->principal, sizeof m->principal, "%s", o->principal ? o->principal : "");
    m->o.principal = NULL;
    double cool = o->group ? moe_group_cooling(o->group, m->principal) : 0;
    if (cool > 0) {
        snprintf(err, errlen,
                 "modulators from %s went past the producer's CPU share: its installs are refused "
                 "for another %.0f s",
                 m->principal, cool < 1 ? 1 : cool);
        free(m);
        return NULL;
    }
    double cpu_in = moe_cpu_now(); /* an install's CPU is charged too */
    m->ref_q = m->ref_env = LUA_NOREF;
    snprintf(m->name, sizeof m->name, "%s", name);
    if (m->o.group) {
        m->gnext = m->o.group->list;
        m->o.group->list = m;
    }
    m->L = lua_newstate(moe_alloc, m);
    if (m->L) {
        m->own_alloc = 1;
    } else {
        /* Builds without GC64 refuse custom allocators on 64-bit targets: the
         * cap is then checked by the budget hook from the GC's own count. */
        m->L = luaL_newstate();
    }
    if (!m->L) {
        lei_moe_free(m);
        snprintf(err, errlen, "cannot create a Lua state");
        return NULL;
    }
    luaJIT_setmode(m->L, 0, LUAJIT_MODE_ENGINE | LUAJIT_MODE_OFF);
    lua_pushlightuserdata(m->L, m);
    lua_setfield(m->L, LUA_REGISTRYINDEX, REG_KEY);
    lua_sethook(m->L, moe_hook, LUA_MASKCOUNT, HOOK_COUNT);
    m->limit_on = 1;
    init_args a = {src, len};
    m->stage = ST_INIT;
    m->in = p;
    m->inlen = plen;
    int rc = moe_run_step(m, step_init, &a);
    m->in = NULL;
    if (m->o.group) {
        /* what the ticks of the init step did not see: the state's creation */
        double spent = moe_cpu_now() - cpu_in - (double)m->win_ticks * LEI_MOE_TICK_NS * 1e-9;
        unsigned long extra = spent > 0 ? (unsigned long)(spent / (LEI_MOE_TICK_NS * 1e-9) + 0.5) : 0;
        m->win_ticks += extra;
        m->o.group->win_ticks += extra;
    }
    if (rc) {
        snprintf(err, errlen, "%s", m->err);
        if (over) *over = m->over;
        lei_moe_free(m);
        return NULL;
    }
    if (o->period > 0) {
        ev_timer_init(&m->period_w, period_cb, o->period, o->period);
        m->period_w.data = m;
        ev_timer_start(lei_ctx_loop(c), &m->period_w);
    }
    return m;
}

void lei_moe_free(lei_moe *m) {
    if (!m) return;
    /* what was submitted before goes out (a failure is not notified: the
     * modulator is going away) */
    if (m->nstg && !m->in_call && !m->in_batch) run_batch(m, 0);
    for (int i = 0; i < m->nstg; i++) lei_msg_release(m->stg[i].msg, NULL, NULL);
    m->nstg = 0;
    if (m->L) {
        if (m->o.period > 0) ev_timer_stop(lei_ctx_loop(m->ctx), &m->period_w);
        m->limit_on = 0;
        lua_close(m->L);
    }
    out_clear(m);
    kf_drop(m);
    free(m->kf);
    forget_ticks(m);
    if (m->o.group)
        for (lei_moe **pp = &m->o.group->list; *pp; pp = &(*pp)->gnext)
            if (*pp == m) {
                *pp = m->gnext;
                break;
            }
    free(m->out);
    free(m->held);
    free(m->sids);
    free(m);
}

int lei_moe_set_params(lei_moe *m, const uint8_t *p, size_t plen) {
    if (lei_moe_flush(m) || !m->L) return -1;
    m->stage = ST_PARAMS;
    m->in = p;
    m->inlen = plen;
    int rc = moe_run_step(m, step, NULL);
    m->in = NULL;
    if (rc) notify_fail(m);
    return rc;
}

/* 1 when the event can be staged (async, flat, small, the staged ones'
 * policy, room, no dequeue). */
static int stageable(const lei_moe *m, const lei_msg *msg, size_t n, int sync, int policy) {
    return !sync && m->nstg < STG_MAX && msg && msg->next == 0 && msg->total == n &&
           n <= STG_EV_BYTES && m->ref_q == LUA_NOREF && (m->nstg == 0 || policy == m->stg_policy);
}

int lei_moe_busy_for(const lei_moe *m, const lei_msg *msg, size_t n, int sync, int policy) {
    return m->L && m->in_call && !stageable(m, msg, n, sync, policy);
}

int lei_moe_enqueue_msg(lei_moe *m, uint64_t producer, uint64_t seq, lei_msg *msg,
                        const uint8_t *p, size_t n, int sync, int policy) {
    if (!m->L) return -1;
    /* an async event under the policy of those staged: staged (the batch
     * runs when full, before any other call, once per loop turn, and when
     * the binding flushes); any other runs after the batch.  Submitted from
     * a hook that m's own call runs (a granted log's handler): staged too,
     * behind the event whose call runs, the batch running takes it; what
     * cannot be staged then was refused by the caller (lei_moe_busy_for):
     * a step inside m's running step would mix the two events' outputs. */
    if (stageable(m, msg, n, sync, policy)) {
        msg->refcnt++;
        moe_stg *g = &m->stg[m->nstg++];
        g->msg = msg;
        g->producer = producer;
        g->seq = seq;
        m->stg_policy = policy;
        return m->nstg == STG_MAX && !m->in_batch && !m->in_call ? run_batch(m, 1) : 0;
    }
    if (m->in_call) return 0; /* refused before (lei_moe_busy_for): not reached */
    m->nsids = 0;
    if (lei_moe_flush(m) || !m->L) return -1;
    m->stage = ST_ENQ;
    m->producer = producer;
    m->seq = seq;
    m->sync = sync;
    m->policy = policy;
    m->in = p;
    m->inlen = n;
    m->in_msg = msg && msg->next == 0 && msg->total == n ? msg : NULL;
    m->st.events_in++;
    int rc = moe_run_step(m, step, NULL);
    m->in = NULL;
    m->in_msg = NULL;
    if (rc == 0) {
        submit_outs(m, 1);
        if (sync) rc = pump(m, 1);
    }
    if (rc) notify_fail(m);
    return rc;
}

int lei_moe_retarget(lei_moe *m, uint32_t chid) {
    if (lei_moe_flush(m) || !m->L) return -1;
    m->policy = lei_ctx_opts(m->ctx)->policy;
    if (pump(m, 1)) {
        notify_fail(m);
        return -1;
    }
    m->chid = chid;
    kf_drop(m); /* a new stream: its joiners are owed none of the old one's */
    return 0;
}

uint32_t lei_moe_chid(const lei_moe *m) { return m->chid; }

size_t lei_moe_syncs(const lei_moe *m, const uint64_t **ids) {
    *ids = m->sids;
    return m->nsids;
}

void lei_moe_pump(lei_moe *m) {
    if (lei_moe_flush(m)) return;
    if (m->L && m->nheld > 0) {
        m->policy = lei_ctx_opts(m->ctx)->policy;
        if (pump(m, 0)) notify_fail(m);
    }
}

int lei_moe_has_pending(const lei_moe *m) { return m->L && (m->nheld > 0 || m->nstg > 0); }

int lei_moe_staged(const lei_moe *m) { return m->in_call || m->in_batch ? 0 : m->nstg; }

const char *lei_moe_error(const lei_moe *m) { return m->L ? NULL : m->err; }

void lei_moe_get_stats(const lei_moe *m, lei_moe_stats *s) {
    *s = m->st;
    s->pending = m->L ? m->nheld : 0;
    s->staged = (size_t)m->nstg;
    s->mem = m->L ? (m->own_alloc ? m->mem : (size_t)lua_gc(m->L, LUA_GCCOUNT, 0) * 1024u) : 0;
}
