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

#include <lauxlib.h>
#include <lua.h>
#include <luajit.h>
#include <lualib.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <errno.h>
#include <sys/syscall.h>
#include <unistd.h>

#define HOOK_COUNT 10000 /* instructions between budget checks */
#define REG_KEY "lecho.moe"

/* ST_HOOK: an optional function of the modulator called by name (period,
 * receivers), with hook_arg when >= 0. */
enum { ST_INIT, ST_PARAMS, ST_ENQ, ST_DEQ, ST_HOOK };

typedef struct moe_out {
    lei_msg *msg; /* one reference, owned until submitted */
    uint64_t producer, seq;
    int sync;
} moe_out;

typedef struct moe_held {
    uint64_t producer, seq;
    int sync;
} moe_held;

struct lei_moe {
    lua_State *L;          /* owned; NULL once failed */
    lei_ctx *ctx;          /* borrowed */
    uint32_t chid;
    lei_moe_opts o;
    char name[96];
    int own_alloc;         /* the allocator below counts memory */
    size_t mem;            /* bytes held by L (own_alloc) */
    int mem_hit;           /* an allocation was refused */
    int limit_on;          /* the cap applies (off while closing) */
    /* the call in progress */
    int in_call, over;
    volatile sig_atomic_t stop; /* set by the CPU-time timer; lpat polls it */
    struct timespec mono0;
    double cpu0;           /* thread CPU seconds at the first check, < 0: not yet */
    int stage, sync, policy;
    const char *hook_fn;   /* ST_HOOK: which function */
    int hook_arg;
    uint64_t producer, seq;
    const uint8_t *in;
    size_t inlen;
    /* outputs of the call, then submitted */
    moe_out *out;          /* owned */
    size_t nout, cout;
    /* events held for dequeue: values in the Lua table ref_q at [qhead, qtail) */
    int ref_q, ref_env;
    moe_held *held;        /* owned, parallel to the table: held[i - qhead + hoff] */
    size_t hoff, nheld, cheld;
    uint64_t qhead, qtail;
    /* sync ids of the last enqueue */
    uint64_t *sids;        /* owned */
    size_t nsids, csids;
    ev_timer period_w;
    uint64_t pseq;
    char err[256];
    lei_moe_stats st;
    /* shared caps (o.group) */
    lei_moe *gnext;        /* the group's list (borrowed) */
    int pool_hit;          /* the group's memory cap refused an allocation */
    uint64_t win_ns;       /* time in calls in the group's current window */
    char doom[160];        /* set by the CPU share check: fails at its next call */
};

struct lei_moe_group {
    lei_ctx *ctx;              /* borrowed */
    size_t mem, mem_cap;       /* bytes of all states; cap (0: none) */
    double cpu_share;          /* of one core over a window (0: none) */
    struct timespec win0;      /* the current 1 s window's start */
    uint64_t win_ns;           /* time in calls in it, all members */
    lei_moe *list;             /* members (borrowed: each unlinks itself when freed) */
    int has_timer;
    timer_t tid;               /* owned (timer_delete) */
    /* shared with the signal handler (same thread) */
    lei_moe *volatile cur;     /* the moe in a call, or NULL */
    volatile sig_atomic_t armed;
    volatile unsigned long callno;
    unsigned long sig_call;    /* handler only: the call its first tick saw */
    double sig_cpu0;           /* handler only: thread CPU at that tick */
};

void lei_moe_opts_default(lei_moe_opts *o) {
    memset(o, 0, sizeof *o);
    o->budget = 0.005;
    o->mem_limit = 32u << 20;
    o->max_pending = 4096;
    lei_codec_limits_default(&o->lim);
}

static double ts_sec(const struct timespec *t) { return (double)t->tv_sec + (double)t->tv_nsec * 1e-9; }

static double cpu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return ts_sec(&t);
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

static lei_moe *moe_of(lua_State *L) {
    lua_getfield(L, LUA_REGISTRYINDEX, REG_KEY);
    lei_moe *m = lua_touserdata(L, -1);
    lua_pop(L, 1);
    return m;
}

/* Budget check every HOOK_COUNT instructions.  Short calls never get here,
 * so the thread's CPU clock (a system call of several microseconds here) is
 * read only by long ones.  The budget counts this thread's CPU time from the
 * first check on: the first HOOK_COUNT instructions are not charged, and
 * neither is any time the thread spent preempted (wall time on a busy host
 * is not the modulator's doing). */
static void moe_hook(lua_State *L, lua_Debug *ar) {
    (void)ar;
    lei_moe *m = moe_of(L);
    if (!m || !m->in_call) return;
    if (!m->own_alloc && (size_t)lua_gc(L, LUA_GCCOUNT, 0) * 1024u > m->o.mem_limit) {
        m->mem_hit = 1;
        luaL_error(L, "out of memory");
    }
    if (m->stop) m->over = 1;
    if (!m->over) {
        double cpu = cpu_now();
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

/* ---- the group: CPU-time timer, memory pool, CPU share -------------------- */

/* The timer's signal, on this thread, every tick of its CPU time while
 * armed.  Async-signal-safe: clock_gettime, timer_settime and lua_sethook
 * (LuaJIT: "can be called asynchronously, e.g. during a signal") only.  The
 * first tick a call sees starts its count (CPU before it is not charged:
 * at most one tick, or one kernel tick where CPU timers are coarser); a
 * later one past the budget stops the call at its next Lua instruction, or
 * at the next poll of the pattern functions (they read m->stop).  A tick
 * outside any call disarms the timer: idle contexts get no signals. */
static void moe_sig(int sig, siginfo_t *si, void *uc) {
    (void)sig;
    (void)uc;
    if (si->si_code != SI_TIMER) return;
    lei_moe_group *g = si->si_value.sival_ptr;
    if (!g) return;
    int saved = errno;
    lei_moe *m = g->cur;
    if (!m) {
        struct itimerspec off;
        memset(&off, 0, sizeof off);
        timer_settime(g->tid, 0, &off, NULL);
        g->armed = 0;
    } else if (m->L) {
        struct timespec t;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
        double now = ts_sec(&t);
        if (g->sig_call != g->callno) {
            g->sig_call = g->callno;
            g->sig_cpu0 = now;
        } else if (now - g->sig_cpu0 > m->o.budget && !m->stop) {
            m->stop = 1;
            lua_sethook(m->L, moe_hook, LUA_MASKCOUNT, 1);
        }
    }
    errno = saved;
}

lei_moe_group *lei_moe_group_new(lei_ctx *c, size_t mem_cap, double cpu_share) {
    lei_moe_group *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->ctx = c;
    g->mem_cap = mem_cap;
    g->cpu_share = cpu_share;
    clock_gettime(CLOCK_MONOTONIC, &g->win0);
    /* The handler is installed once per process and shared (it finds its
     * group in the signal's value); a handler the application put there
     * first is left alone, and budgets fall back to the count hook. */
    struct sigaction old;
    if (sigaction(LEI_MOE_SIGNAL, NULL, &old) == 0 &&
        ((old.sa_flags & SA_SIGINFO) ? old.sa_sigaction == moe_sig
                                     : (old.sa_handler == SIG_DFL || old.sa_handler == SIG_IGN))) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = moe_sig;
        sa.sa_flags = SA_SIGINFO | SA_RESTART;
        sigemptyset(&sa.sa_mask);
        struct sigevent sev;
        memset(&sev, 0, sizeof sev);
        sev.sigev_notify = SIGEV_THREAD_ID;
        sev.sigev_signo = LEI_MOE_SIGNAL;
        sev.sigev_value.sival_ptr = g;
        sev._sigev_un._tid = (pid_t)syscall(SYS_gettid);
        if (sigaction(LEI_MOE_SIGNAL, &sa, NULL) == 0 &&
            timer_create(CLOCK_THREAD_CPUTIME_ID, &sev, &g->tid) == 0)
            g->has_timer = 1;
    }
    if (!g->has_timer)
        lei_logf(c, "modulators: no CPU-time timer (signal %d taken or timer_create failed): a call "
                    "stuck in a C function is stopped only when it returns",
                 LEI_MOE_SIGNAL);
    return g;
}

void lei_moe_group_free(lei_moe_group *g) {
    if (!g) return;
    /* timer_delete drops a signal of it still pending (Linux) */
    if (g->has_timer) timer_delete(g->tid);
    for (lei_moe *m = g->list; m; m = m->gnext) m->o.group = NULL;
    free(g);
}

size_t lei_moe_group_mem(const lei_moe_group *g) { return g->mem; }

/* Around each call of a member: the timer runs while it does. */
static void group_enter(lei_moe_group *g, lei_moe *m) {
    g->callno++;
    g->cur = m;
    if (g->has_timer && !g->armed) {
        struct itimerspec it;
        it.it_interval.tv_sec = it.it_value.tv_sec = 0;
        it.it_interval.tv_nsec = it.it_value.tv_nsec = LEI_MOE_TICK_NS;
        g->armed = 1;
        if (timer_settime(g->tid, 0, &it, NULL)) g->armed = 0;
    }
}

/* A call took ns: the CPU share check.  Time in calls is wall time (read
 * anyway for the stats): on a busy host it overstates CPU, never the
 * reverse.  The first FREE_NS of each call are not charged: what lecho
 * itself spends per event (decoding, encoding: about a microsecond) and
 * what a cheap modulator adds scale with the producer's own submits, not
 * with the consumer's wishes (eight trivial filters on a producer that does
 * nothing but submit took half its thread).  Past the cap within a window,
 * the member charged the most in it is failed (at once when it is the
 * caller, else at its next call: it may be up the stack, submitting), and a
 * new window starts. */
#define FREE_NS 10000u
static void group_leave(lei_moe_group *g, lei_moe *m, const struct timespec *now, uint64_t ns) {
    g->cur = NULL;
    if (!(g->cpu_share > 0) || ns <= FREE_NS) return;
    ns -= FREE_NS;
    double age = ts_sec(now) - ts_sec(&g->win0);
    if (age >= 1.0) {
        for (lei_moe *x = g->list; x; x = x->gnext) x->win_ns = 0;
        g->win_ns = 0;
        g->win0 = *now;
    }
    m->win_ns += ns;
    g->win_ns += ns;
    if ((double)g->win_ns * 1e-9 <= g->cpu_share) return;
    lei_moe *worst = NULL;
    for (lei_moe *x = g->list; x; x = x->gnext)
        if (x->L && !x->doom[0] && (!worst || x->win_ns > worst->win_ns)) worst = x;
    if (worst) {
        /* shares of the window so far (it trips before its end) */
        double span = ts_sec(now) - ts_sec(&g->win0);
        if (span < 0.001) span = 0.001;
        double own = (double)worst->win_ns * 1e-7 / span, all = (double)g->win_ns * 1e-7 / span;
        if (worst->win_ns == g->win_ns)
            snprintf(worst->doom, sizeof worst->doom,
                     "used %.0f%% of the producer's CPU over %.1f s (cap %.0f%% over 1 s)", own,
                     span, g->cpu_share * 100);
        else
            snprintf(worst->doom, sizeof worst->doom,
                     "used %.0f%% of the producer's CPU over %.1f s, the most of its modulators, "
                     "which used %.0f%% together (cap %.0f%% over 1 s)",
                     own, span, all, g->cpu_share * 100);
    }
    for (lei_moe *x = g->list; x; x = x->gnext) x->win_ns = 0;
    g->win_ns = 0;
    g->win0 = *now;
}

/* ---- outputs ------------------------------------------------------------ */

static void out_clear(lei_moe *m) {
    for (size_t i = 0; i < m->nout; i++) lei_msg_release(m->out[i].msg, NULL, NULL);
    m->nout = 0;
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

/* Sends (after the step) or holds the value at idx, per the stage. */
static void route(lua_State *L, lei_moe *m, int idx) {
    char err[256];
    if (lua_isnil(L, idx)) return;
    if ((m->stage == ST_ENQ || m->stage == ST_HOOK) && m->ref_q != LUA_NOREF) {
        lua_pushvalue(L, idx);
        hold(L, m);
        return;
    }
    if (m->nout == m->cout) {
        size_t nc = m->cout ? m->cout * 2 : 8;
        moe_out *o = realloc(m->out, nc * sizeof *o);
        if (!o) luaL_error(L, "out of memory");
        m->out = o;
        m->cout = nc;
    }
    lei_msg *msg = lei_msg_new();
    if (!msg) luaL_error(L, "out of memory");
    /* Never pinned: the state may be gone before the bytes are written. */
    if (lei_encode_lua(L, idx, msg, &m->o.lim, 0, err, sizeof err)) {
        lei_msg_release(msg, NULL, NULL);
        luaL_error(L, "cannot send what it produced: %s", err);
    }
    moe_out *o = &m->out[m->nout++];
    o->msg = msg;
    o->producer = m->producer;
    o->seq = m->seq;
    o->sync = m->sync;
}

/* ---- the environment ---------------------------------------------------- */

static int env_emit(lua_State *L) {
    lei_moe *m = lua_touserdata(L, lua_upvalueindex(1));
    luaL_checkany(L, 1);
    if (!m->in_call || m->stage == ST_INIT || m->stage == ST_PARAMS)
        return luaL_error(L, "emit: only from enqueue, dequeue or period");
    route(L, m, 1);
    return 0;
}

static int env_clock(lua_State *L) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    lua_pushnumber(L, ts_sec(&t));
    return 1;
}

static int env_log(lua_State *L) {
    lei_moe *m = lua_touserdata(L, lua_upvalueindex(1));
    int n = lua_gettop(L);
    luaL_Buffer b;
    lua_pushvalue(L, lua_upvalueindex(2)); /* tostring */
    int ts = lua_gettop(L);
    luaL_buffinit(L, &b);
    for (int i = 1; i <= n; i++) {
        lua_pushvalue(L, ts);
        lua_pushvalue(L, i);
        lua_call(L, 1, 1);
        if (!lua_isstring(L, -1)) luaL_error(L, "log: tostring must return a string");
        if (i > 1) luaL_addchar(&b, ' ');
        luaL_addvalue(&b);
    }
    luaL_pushresult(&b);
    size_t len;
    const char *s = lua_tolstring(L, -1, &len);
    lei_logf(m->ctx, "modulator %s: %.*s", m->name, (int)(len > 1000 ? 1000 : len), s);
    return 0;
}

/* A stop (budget or memory) is final: no pcall or xpcall of the modulator
 * may catch it, and no message handler may run once it happened (a handler
 * that loops would otherwise be called again for every budget error raised
 * inside it, for ever). */
static int stopped(const lei_moe *m) { return m->over || m->stop || m->mem_hit; }

static int rethrow_stop(lua_State *L, lei_moe *m) {
    m->over = m->over || m->stop;
    lua_pushstring(L, m->over ? "CPU budget exceeded" : "not enough memory");
    return lua_error(L);
}

/* pcall(f, ...): Lua's, except that a stop goes through. */
static int env_pcall(lua_State *L) {
    lei_moe *m = lua_touserdata(L, lua_upvalueindex(1));
    luaL_checkany(L, 1);
    int rc = lua_pcall(L, lua_gettop(L) - 1, LUA_MULTRET, 0);
    if (stopped(m)) return rethrow_stop(L, m);
    lua_pushboolean(L, rc == 0);
    lua_insert(L, 1);
    return lua_gettop(L);
}

/* The message handler xpcall installs: the modulator's, unless stopped. */
static int env_xpcall_handler(lua_State *L) {
    lei_moe *m = lua_touserdata(L, lua_upvalueindex(1));
    if (stopped(m)) return 1;
    lua_pushvalue(L, lua_upvalueindex(2));
    lua_insert(L, 1);
    lua_call(L, lua_gettop(L) - 1, 1);
    return 1;
}

/* xpcall(f, handler, ...): Lua's (LuaJIT passes the extra arguments), except
 * that a stop goes through and its handler is not run. */
static int env_xpcall(lua_State *L) {
    lei_moe *m = lua_touserdata(L, lua_upvalueindex(1));
    luaL_checkany(L, 2);
    lua_pushlightuserdata(L, m);
    lua_pushvalue(L, 2);
    lua_pushcclosure(L, env_xpcall_handler, 2);
    lua_replace(L, 2);
    lua_pushvalue(L, 1);
    lua_pushvalue(L, 2);
    lua_replace(L, 1);
    lua_replace(L, 2); /* handler, f, args... */
    int rc = lua_pcall(L, lua_gettop(L) - 2, LUA_MULTRET, 1);
    if (stopped(m)) return rethrow_stop(L, m);
    lua_pushboolean(L, rc == 0);
    lua_replace(L, 1);
    return lua_gettop(L);
}

/* table.sort(t [, less]): a heap sort the budget can stop (LuaJIT's runs
 * in C without a hook: 4 million numbers, all the memory cap allows, take
 * a second).  O(n log n) in the worst case; the order of equal elements is
 * unspecified, as in Lua's. */
static int sort_less(lua_State *L, lei_moe *m, int cmp, int i, int j, unsigned *polls) {
    if ((++*polls & 63) == 0 && (m->stop || m->over)) luaL_error(L, "CPU budget exceeded");
    lua_rawgeti(L, 1, i);
    lua_rawgeti(L, 1, j);
    if (!cmp) {
        int r = lua_lessthan(L, -2, -1);
        lua_pop(L, 2);
        return r;
    }
    lua_pushvalue(L, 2);
    lua_insert(L, -3);
    lua_call(L, 2, 1);
    int r = lua_toboolean(L, -1);
    lua_pop(L, 1);
    return r;
}

static void sort_swap(lua_State *L, int i, int j) {
    lua_rawgeti(L, 1, i);
    lua_rawgeti(L, 1, j);
    lua_rawseti(L, 1, i);
    lua_rawseti(L, 1, j);
}

static void sort_sift(lua_State *L, lei_moe *m, int cmp, int root, int end, unsigned *polls) {
    while (2 * root <= end) {
        int child = 2 * root;
        if (child + 1 <= end && sort_less(L, m, cmp, child, child + 1, polls)) child++;
        if (!sort_less(L, m, cmp, root, child, polls)) return;
        sort_swap(L, root, child);
        root = child;
    }
}

static int env_sort(lua_State *L) {
    lei_moe *m = lua_touserdata(L, lua_upvalueindex(1));
    luaL_checktype(L, 1, LUA_TTABLE);
    int cmp = !lua_isnoneornil(L, 2);
    if (cmp) luaL_checktype(L, 2, LUA_TFUNCTION);
    lua_settop(L, 2);
    size_t len = lua_objlen(L, 1);
    if (len > INT32_MAX / 2) return luaL_error(L, "table too big to sort");
    int n = (int)len;
    unsigned polls = 0;
    for (int i = n / 2; i >= 1; i--) sort_sift(L, m, cmp, i, n, &polls);
    for (int end = n; end > 1; end--) {
        sort_swap(L, 1, end);
        sort_sift(L, m, cmp, 1, end - 1, &polls);
    }
    return 0;
}

/* Builds the environment: curated copies of the pure libraries, the host
 * functions, then removes what could reach outside from the state itself
 * (the string metatable's __index is the real string table).  tostring,
 * string.format's %s and log show a function, table, userdata or thread as
 * "table: 1" (a number per object, stable in this state), never its heap
 * address, and %p is refused: addresses would help an attacker who found a
 * hole in the sandbox (issue 10). */
static const char sandbox_lua[] =
    "local env, emit, clock, log = ...\n"
    "string.dump = nil\n"
    "local rawtostring, rawformat, type, getmetatable, rawget, select, unpack, byte, error =\n"
    "  tostring, string.format, type, getmetatable, rawget, select, unpack, string.byte, error\n"
    "local HEAP = { ['function'] = true, table = true, userdata = true, thread = true, cdata = true }\n"
    "local ids, nid = setmetatable({}, { __mode = 'k' }), 0\n"
    "local function safe(v)\n"
    "  local t = type(v)\n"
    "  if not HEAP[t] then return rawtostring(v) end\n"
    "  local mt = getmetatable(v)\n"
    "  if type(mt) == 'table' and rawget(mt, '__tostring') ~= nil then return rawtostring(v) end\n"
    "  local id = ids[v]\n"
    "  if not id then nid = nid + 1; id = nid; ids[v] = id end\n"
    "  return t .. ': ' .. id\n"
    "end\n"
    "local SPEC = {}\n"
    "for _, c in ipairs{ 32, 35, 43, 45, 46, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57 } do SPEC[c] = true end\n"
    "local function format(fmt, ...)\n"
    "  if type(fmt) ~= 'string' then return rawformat(fmt, ...) end\n"
    "  local n, args, a, i, len = select('#', ...), { ... }, 0, 1, #fmt\n"
    "  while i <= len do\n"
    "    if byte(fmt, i) == 37 then\n"
    "      i = i + 1\n"
    "      while SPEC[byte(fmt, i)] do i = i + 1 end\n"
    "      local c = byte(fmt, i)\n"
    "      if c ~= 37 then\n"
    "        a = a + 1\n"
    "        if c == 112 then error(\"bad argument #\" .. (a + 1) .. \" to 'format' (%p is not available in a modulator)\", 2) end\n"
    "        if c == 115 and HEAP[type(args[a])] then args[a] = safe(args[a]) end\n"
    "      end\n"
    "    end\n"
    "    i = i + 1\n"
    "  end\n"
    "  return rawformat(fmt, unpack(args, 1, n))\n"
    "end\n"
    "string.format, tostring = format, safe\n"
    "if log then\n"
    "  local rawlog = log\n"
    "  log = function(...)\n"
    "    local n, t = select('#', ...), { ... }\n"
    "    for i = 1, n do t[i] = safe(t[i]) end\n"
    "    return rawlog(unpack(t, 1, n))\n"
    "  end\n"
    "end\n"
    "for _, k in ipairs{ 'assert', 'error', 'ipairs', 'next', 'pairs', 'pcall', 'select',\n"
    "  'rawequal', 'rawget', 'rawset', 'setmetatable', 'getmetatable', 'tonumber',\n"
    "  'tostring', 'type', 'unpack', 'xpcall' } do env[k] = _G[k] end\n"
    "local function copy(t) local r = {} for k, v in pairs(t) do r[k] = v end return r end\n"
    "env.string, env.table, env.math, env.bit = copy(string), copy(table), copy(math), copy(bit)\n"
    "env.emit, env.clock, env.log = emit, clock, log\n"
    "env._G = env\n"
    "for _, k in ipairs{ 'load', 'loadstring', 'loadfile', 'dofile', 'require', 'module',\n"
    "  'getfenv', 'setfenv', 'collectgarbage', 'gcinfo', 'newproxy', 'print', 'coroutine',\n"
    "  'io', 'os', 'debug', 'jit', 'package', 'ffi' } do _G[k] = nil end\n";

static int sandbox_open(lua_State *L) {
    static const lua_CFunction libs[] = {luaopen_base, luaopen_string, luaopen_table,
                                         luaopen_math, luaopen_bit};
    for (size_t i = 0; i < sizeof libs / sizeof *libs; i++) {
        lua_pushcfunction(L, libs[i]);
        lua_call(L, 0, 0);
    }
    return 0;
}

/* ---- steps: everything that touches the state runs inside one ---------- */

static void push_env_fn(lua_State *L, lei_moe *m, const char *fn) {
    lua_rawgeti(L, LUA_REGISTRYINDEX, m->ref_env);
    lua_getfield(L, -1, fn);
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
    for (int i = base + 1; i <= top; i++) route(L, m, i);
    lua_settop(L, base);
}

typedef struct init_args {
    const char *src;
    size_t len;
} init_args;

static int step(lua_State *L) {
    lei_moe *m = moe_of(L);
    switch (m->stage) {
    default:
        break;
    case ST_PARAMS:
        /* the environment itself: the modulator may have rebound _G */
        lua_rawgeti(L, LUA_REGISTRYINDEX, m->ref_env);
        decode_in(L, m);
        lua_setfield(L, -2, "params");
        lua_pop(L, 1);
        break;
    case ST_ENQ:
        push_env_fn(L, m, "enqueue");
        if (lua_isnil(L, -1)) {
            lua_pop(L, 1);
            decode_in(L, m);
            route(L, m, -1);
            lua_pop(L, 1);
        } else {
            decode_in(L, m);
            call_route(L, m, 1);
        }
        break;
    case ST_DEQ: {
        lua_rawgeti(L, LUA_REGISTRYINDEX, m->ref_q);
        int q = lua_gettop(L);
        push_env_fn(L, m, "dequeue");
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
    sandbox_open(L);
    if (m->o.prelude) {
        /* Replaces the string table's pattern functions by stoppable ones
         * before the sandbox copies it (and for string methods). */
        if (luaL_loadbuffer(L, m->o.prelude, m->o.prelude_len, "=lecho.patterns")) lua_error(L);
        lua_call(L, 0, 1);
        lua_getfield(L, LUA_GLOBALSINDEX, "string");
        lua_call(L, 1, 0);
    }
    /* pcall and xpcall that a stop goes through, copied into the sandbox */
    lua_pushlightuserdata(L, m);
    lua_pushcclosure(L, env_pcall, 1);
    lua_setfield(L, LUA_GLOBALSINDEX, "pcall");
    lua_pushlightuserdata(L, m);
    lua_pushcclosure(L, env_xpcall, 1);
    lua_setfield(L, LUA_GLOBALSINDEX, "xpcall");
    lua_getfield(L, LUA_GLOBALSINDEX, "table");
    lua_pushlightuserdata(L, m);
    lua_pushcclosure(L, env_sort, 1);
    lua_setfield(L, -2, "sort");
    lua_pop(L, 1);
    lua_newtable(L); /* env */
    int env = lua_gettop(L);
    if (luaL_loadbuffer(L, sandbox_lua, sizeof sandbox_lua - 1, "=sandbox")) lua_error(L);
    lua_pushvalue(L, env);
    lua_pushlightuserdata(L, m);
    lua_pushcclosure(L, env_emit, 1);
    if (m->o.grant_clock)
        lua_pushcfunction(L, env_clock);
    else
        lua_pushnil(L);
    if (m->o.grant_log) {
        lua_pushlightuserdata(L, m);
        lua_getfield(L, LUA_GLOBALSINDEX, "tostring");
        lua_pushcclosure(L, env_log, 2);
    } else {
        lua_pushnil(L);
    }
    lua_call(L, 4, 0);
    lua_pushvalue(L, env);
    m->ref_env = luaL_ref(L, LUA_REGISTRYINDEX);
    /* params */
    decode_in(L, m);
    lua_setfield(L, env, "params");
    /* text only: a bytecode chunk is refused by the loader */
    if (a->len && a->src[0] == LUA_SIGNATURE[0])
        luaL_error(L, "modulator must be Lua source text, not bytecode");
    lua_pushfstring(L, "=%s", m->name);
    if (luaL_loadbufferx(L, a->src, a->len, lua_tostring(L, -1), "t")) lua_error(L);
    lua_remove(L, -2);
    lua_pushvalue(L, env);
    lua_setfenv(L, -2);
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
    return 0;
}

/* ---- running a step under the budget ----------------------------------- */

static void moe_fail(lei_moe *m, const char *why) {
    if (!m->L) return;
    snprintf(m->err, sizeof m->err, "%s", why);
    out_clear(m);
    m->limit_on = 0;
    lua_close(m->L);
    m->L = NULL;
    m->nheld = 0;
    m->hoff = 0;
    if (m->o.period > 0) ev_timer_stop(lei_ctx_loop(m->ctx), &m->period_w);
}

/* Runs fn in the state; 0, or -1 with the modulator failed (m->err set). */
static int run_step(lei_moe *m, lua_CFunction fn, void *arg) {
    lua_State *L = m->L;
    if (!L) return -1;
    if (m->doom[0]) {
        moe_fail(m, m->doom);
        return -1;
    }
    lei_moe_group *g = m->o.group;
    lei_moe *outer = g ? g->cur : NULL; /* a log hook may run another moe's call */
    m->in_call = 1;
    m->over = 0;
    m->stop = 0;
    m->cpu0 = -1;
    clock_gettime(CLOCK_MONOTONIC, &m->mono0);
    if (g) group_enter(g, m);
    int rc = lua_cpcall(L, fn, arg);
    m->in_call = 0;
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    uint64_t ns = (uint64_t)((ts_sec(&t) - ts_sec(&m->mono0)) * 1e9);
    if (g) {
        group_leave(g, m, &t, ns);
        if (outer) g->cur = outer;
    }
    m->st.time_ns += ns;
    m->st.calls++;
    if (m->stop) m->over = 1;
    if (rc == 0 && !m->over && !m->mem_hit && !m->doom[0]) return 0;
    char why[256];
    if (m->over)
        snprintf(why, sizeof why, "exceeded its CPU budget of %g ms in one call", m->o.budget * 1e3);
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
    moe_fail(m, why);
    return -1;
}

/* Submits the outputs of the last step, in order. */
static void submit_outs(lei_moe *m, int keep_syncs) {
    for (size_t i = 0; i < m->nout; i++) {
        moe_out *o = &m->out[i];
        const char *err = NULL;
        uint64_t sid = 0;
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
        o->msg = NULL;
    }
    m->nout = 0;
}

static void notify_fail(lei_moe *m) {
    if (m->o.on_fail) m->o.on_fail(m->o.ud, m, m->err);
}

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
        int rc = run_step(m, step, NULL);
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
    if (!m->L) return -1;
    m->stage = ST_HOOK;
    m->hook_fn = fn;
    m->hook_arg = arg;
    m->producer = 0;
    m->seq = ++m->pseq;
    m->sync = 0;
    m->policy = lei_ctx_opts(m->ctx)->policy;
    if (run_step(m, step, NULL)) {
        notify_fail(m);
        return -1;
    }
    submit_outs(m, 0);
    return 0;
}

static void period_cb(struct ev_loop *loop, ev_timer *w, int revents) {
    (void)loop;
    (void)revents;
    call_hook(w->data, "period", -1);
}

int lei_moe_receivers(lei_moe *m, int n) { return call_hook(m, "receivers", n); }

/* ---- public ------------------------------------------------------------- */

lei_moe *lei_moe_new(lei_ctx *c, uint32_t chid, const char *name, const char *src, size_t len,
                     const uint8_t *p, size_t plen, const lei_moe_opts *o, char *err,
                     size_t errlen) {
    lei_moe *m = calloc(1, sizeof *m);
    if (!m) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    m->ctx = c;
    m->chid = chid;
    m->o = *o;
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
    int rc = run_step(m, step_init, &a);
    m->in = NULL;
    if (rc) {
        snprintf(err, errlen, "%s", m->err);
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
    if (m->L) {
        if (m->o.period > 0) ev_timer_stop(lei_ctx_loop(m->ctx), &m->period_w);
        m->limit_on = 0;
        lua_close(m->L);
    }
    out_clear(m);
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
    if (!m->L) return -1;
    m->stage = ST_PARAMS;
    m->in = p;
    m->inlen = plen;
    int rc = run_step(m, step, NULL);
    m->in = NULL;
    if (rc) notify_fail(m);
    return rc;
}

int lei_moe_enqueue(lei_moe *m, uint64_t producer, uint64_t seq, const uint8_t *p, size_t n,
                    int sync, int policy) {
    m->nsids = 0;
    if (!m->L) return -1;
    m->stage = ST_ENQ;
    m->producer = producer;
    m->seq = seq;
    m->sync = sync;
    m->policy = policy;
    m->in = p;
    m->inlen = n;
    m->st.events_in++;
    int rc = run_step(m, step, NULL);
    m->in = NULL;
    if (rc == 0) {
        submit_outs(m, 1);
        if (sync) rc = pump(m, 1);
    }
    if (rc) notify_fail(m);
    return rc;
}

int lei_moe_retarget(lei_moe *m, uint32_t chid) {
    if (!m->L) return -1;
    m->policy = lei_ctx_opts(m->ctx)->policy;
    if (pump(m, 1)) {
        notify_fail(m);
        return -1;
    }
    m->chid = chid;
    return 0;
}

uint32_t lei_moe_chid(const lei_moe *m) { return m->chid; }

size_t lei_moe_syncs(const lei_moe *m, const uint64_t **ids) {
    *ids = m->sids;
    return m->nsids;
}

void lei_moe_pump(lei_moe *m) {
    if (m->L && m->nheld > 0) {
        m->policy = lei_ctx_opts(m->ctx)->policy;
        if (pump(m, 0)) notify_fail(m);
    }
}

int lei_moe_has_pending(const lei_moe *m) { return m->L && m->nheld > 0; }

const char *lei_moe_error(const lei_moe *m) { return m->L ? NULL : m->err; }

void lei_moe_get_stats(const lei_moe *m, lei_moe_stats *s) {
    *s = m->st;
    s->pending = m->L ? m->nheld : 0;
    s->mem = m->L ? (m->own_alloc ? m->mem : (size_t)lua_gc(m->L, LUA_GCCOUNT, 0) * 1024u) : 0;
}
