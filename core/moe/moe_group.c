/* moe_group.c: what the modulators of one context share (moe.h): the
 * CPU-time timer that stops a call stuck in a C function, the memory of all
 * their states (counted by moe.c's allocator) and their share of the
 * thread's CPU.
 */
#define _GNU_SOURCE
#include "moe_int.h"

#include <errno.h>
#include <lua.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Every tick is charged to the call it lands in, the first microseconds of
 * a call included (64 modulators of 6 us a call went uncharged when they
 * were free).  The share is of the CPU the thread actually ran in the
 * window (a producer on a busy host gets less than a core), but never of
 * less than SHARE_FLOOR_S: modulators using a few ms of an idle producer's
 * second are not unloaded for being most of it. */
#define SHARE_FLOOR_S 0.5
/* A principal whose modulator the share check unloaded cannot install
 * another for this long (a consumer replacing it at once would go on). */
#define COOL_S 10.0
#define TICK_S (LEI_MOE_TICK_NS * 1e-9)

/* The timer's signal, on this thread, every tick of its CPU time while
 * armed.  Async-signal-safe: clock_gettime, timer_settime, timer_getoverrun
 * and lua_sethook (LuaJIT: "can be called asynchronously, e.g. during a
 * signal") only.
 *
 * Budget: the first tick a call sees starts its count (CPU before it is not
 * charged: at most one tick, or one kernel tick where CPU timers are
 * coarser); a later one past the budget stops the call at its next Lua
 * instruction, or at the next poll of the pattern functions (they read
 * m->stop).  CPU share: each tick (and each one the kernel merged into it,
 * the overrun) is a tick of CPU charged to the call it lands in, so a
 * producer starved by other processes is not charged the time it waited.
 * A tick outside any call disarms the timer: idle contexts get no
 * signals. */
static void moe_group_sig(int sig, siginfo_t *si, void *uc) {
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
        int over = timer_getoverrun(g->tid);
        unsigned long n = 1 + (over > 0 ? (unsigned long)over : 0);
        m->win_ticks += n;
        g->win_ticks += n;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
        double now = moe_ts_sec(&t);
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
    clock_gettime(MOE_WALL_CLOCK, &g->win0);
    g->win_cpu0 = moe_cpu_now();
    /* The handler is installed once per process and shared (it finds its
     * group in the signal's value); a handler the application put there
     * first is left alone, and budgets fall back to the count hook. */
    struct sigaction old;
    if (sigaction(LEI_MOE_SIGNAL, NULL, &old) == 0 &&
        ((old.sa_flags & SA_SIGINFO) ? old.sa_sigaction == moe_group_sig
                                     : (old.sa_handler == SIG_DFL || old.sa_handler == SIG_IGN))) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = moe_group_sig;
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

int lei_moe_group_busy(const lei_moe_group *g) { return g && g->busy > 0; }

void lei_moe_group_free(lei_moe_group *g) {
    if (!g) return;
    /* timer_delete drops a signal of it still pending (Linux) */
    if (g->has_timer) timer_delete(g->tid);
    for (lei_moe *m = g->list; m; m = m->gnext) m->o.group = NULL;
    free(g->env_bc);
    free(g->pc);
    free(g);
}

/* Around each call of a member: the timer runs while it does. */
void moe_group_enter(lei_moe_group *g, lei_moe *m) {
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

static moe_pcharge *pc_find(lei_moe_group *g, const char *name) {
    for (size_t i = 0; i < g->npc; i++)
        if (strcmp(g->pc[i].name, name) == 0) return &g->pc[i];
    return NULL;
}

/* The principal's entry, made if need be; NULL when out of memory. */
static moe_pcharge *pc_get(lei_moe_group *g, const char *name) {
    moe_pcharge *p = pc_find(g, name);
    if (p) return p;
    if (g->npc == g->cpc) {
        size_t nc = g->cpc ? g->cpc * 2 : 8;
        moe_pcharge *a = realloc(g->pc, nc * sizeof *a);
        if (!a) return NULL;
        g->pc = a;
        g->cpc = nc;
    }
    p = &g->pc[g->npc++];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    return p;
}

void moe_group_retain(lei_moe_group *g, lei_moe *m) {
    if (!m->win_ticks) return;
    moe_pcharge *p = pc_get(g, m->principal);
    if (p) p->ticks += m->win_ticks;
}

static double mono_now(void) {
    struct timespec t;
    clock_gettime(MOE_WALL_CLOCK, &t);
    return moe_ts_sec(&t);
}

double moe_group_cooling(lei_moe_group *g, const char *principal) {
    moe_pcharge *p = pc_find(g, principal);
    if (!p) return 0;
    double left = p->cool_until - mono_now();
    return left > 0 ? left : 0;
}

/* A new window: charges go, cool-downs stay (entries without one go). */
static void new_window(lei_moe_group *g, const struct timespec *now) {
    for (lei_moe *x = g->list; x; x = x->gnext) x->win_ticks = 0;
    double t = moe_ts_sec(now);
    size_t k = 0;
    for (size_t i = 0; i < g->npc; i++)
        if (g->pc[i].cool_until > t) {
            g->pc[k] = g->pc[i];
            g->pc[k++].ticks = 0;
        }
    g->npc = k;
    g->win_ticks = 0;
    g->win0 = *now;
    g->win_cpu0 = moe_cpu_now();
}

/* A principal's charge in the window: its gone members' and its live ones'. */
static unsigned long principal_ticks(lei_moe_group *g, const char *name) {
    moe_pcharge *p = pc_find(g, name);
    unsigned long t = p ? p->ticks : 0;
    for (lei_moe *x = g->list; x; x = x->gnext)
        if (strcmp(x->principal, name) == 0) t += x->win_ticks;
    return t;
}

/* After each call of a member: the CPU share check (ticks are charged by
 * the signal handler).  Past the cap within a 1 s window (the share of
 * what the thread ran, at least SHARE_FLOOR_S), the principal charged the
 * most in it (its gone modulators' charges included) loses its costliest
 * live modulator (failed at once when it is the caller, else at its next
 * call: it may be up the stack, submitting) and cannot install one for
 * COOL_S; a new window starts.  Without the timer there are no ticks and
 * no share cap. */
void moe_group_leave(lei_moe_group *g, const struct timespec *now) {
    g->cur = NULL;
    if (!(g->cpu_share > 0)) return;
    double age = moe_ts_sec(now) - moe_ts_sec(&g->win0);
    if (age >= 1.0) {
        new_window(g, now);
        return;
    }
    double used = (double)g->win_ticks * TICK_S;
    if (used <= g->cpu_share * SHARE_FLOOR_S) return; /* cheap test first */
    double ran = moe_cpu_now() - g->win_cpu0;
    if (used <= g->cpu_share * (ran > SHARE_FLOOR_S ? ran : SHARE_FLOOR_S)) return;
    /* Principals in order of their charges, the most first: each loses its
     * costliest live modulators until the live rest is under the cap (or it
     * has none left: then its gone ones' charges no longer count), and is
     * refused installs for COOL_S.  One per window was too slow: 64 cheap
     * modulators from 4 principals needed a minute. */
    double base = ran > SHARE_FLOOR_S ? ran : SHARE_FLOOR_S, cap = g->cpu_share * base;
    double span = age < 0.001 ? 0.001 : age, all = used * 100 / base;
    double tnow = moe_ts_sec(now);
    g->pass++;
    while (used > cap) {
        char who[96] = "";
        int found = 0;
        unsigned long wt = 0;
        for (size_t i = 0; i < g->npc; i++) {
            if (g->pc[i].pass == g->pass) continue;
            unsigned long t = principal_ticks(g, g->pc[i].name);
            if (!found || t > wt) snprintf(who, sizeof who, "%s", g->pc[i].name), wt = t, found = 1;
        }
        for (lei_moe *x = g->list; x; x = x->gnext) {
            moe_pcharge *q = pc_find(g, x->principal);
            if (!x->L || x->doom[0] || (q && q->pass == g->pass)) continue;
            unsigned long t = principal_ticks(g, x->principal);
            if (!found || t > wt) snprintf(who, sizeof who, "%s", x->principal), wt = t, found = 1;
        }
        if (!found) break;
        moe_pcharge *p = pc_get(g, who);
        if (!p) break; /* out of memory: next time */
        p->pass = g->pass;
        p->cool_until = tnow + COOL_S;
        double own = (double)wt * TICK_S * 100 / base;
        for (;;) {
            lei_moe *worst = NULL;
            for (lei_moe *x = g->list; x; x = x->gnext)
                if (x->L && !x->doom[0] && strcmp(x->principal, who) == 0 &&
                    (!worst || x->win_ticks > worst->win_ticks))
                    worst = x;
            if (!worst) {
                used -= (double)p->ticks * TICK_S;
                break;
            }
            if (wt == g->win_ticks)
                snprintf(worst->doom, sizeof worst->doom,
                         "used %.0f%% of the producer's CPU over %.1f s (cap %.0f%% over 1 s); "
                         "modulators from %.60s are refused for %.0f s",
                         own, span, g->cpu_share * 100, who, COOL_S);
            else
                snprintf(worst->doom, sizeof worst->doom,
                         "used %.0f%% of the producer's CPU over %.1f s with the other modulators "
                         "from %.60s, the most of all, which used %.0f%% together (cap %.0f%% over "
                         "1 s); modulators from %.60s are refused for %.0f s",
                         own, span, who, all, g->cpu_share * 100, who, COOL_S);
            used -= (double)worst->win_ticks * TICK_S;
            if (used <= cap) break;
        }
    }
    new_window(g, now);
}
