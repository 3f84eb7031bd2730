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

/* A tick that lands in the first FREE_S of a call (wall time) is not
 * charged to the CPU share: what lecho itself spends per event (decoding,
 * encoding: about a microsecond) and what a cheap modulator adds scale with
 * the producer's own submits, not with the consumer's wishes (eight trivial
 * filters on a producer that does nothing but submit take half its
 * thread). */
#define FREE_S 10e-6
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
        int over = timer_getoverrun(g->tid);
        unsigned long n = 1 + (over > 0 ? (unsigned long)over : 0);
        clock_gettime(CLOCK_MONOTONIC, &t);
        if (moe_ts_sec(&t) - moe_ts_sec(&m->mono0) > FREE_S) {
            m->win_ticks += n;
            g->win_ticks += n;
        }
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

/* After each call of a member: the CPU share check (ticks are charged by
 * the signal handler).  Past the cap within a 1 s window, the member
 * charged the most in it is failed (at once when it is the caller, else at
 * its next call: it may be up the stack, submitting), and a new window
 * starts.  Without the timer there are no ticks and no share cap. */
void moe_group_leave(lei_moe_group *g, const struct timespec *now) {
    g->cur = NULL;
    if (!(g->cpu_share > 0)) return;
    double age = moe_ts_sec(now) - moe_ts_sec(&g->win0);
    if (age >= 1.0) {
        for (lei_moe *x = g->list; x; x = x->gnext) x->win_ticks = 0;
        g->win_ticks = 0;
        g->win0 = *now;
        return;
    }
    if ((double)g->win_ticks * TICK_S <= g->cpu_share) return;
    lei_moe *worst = NULL;
    for (lei_moe *x = g->list; x; x = x->gnext)
        if (x->L && !x->doom[0] && (!worst || x->win_ticks > worst->win_ticks)) worst = x;
    if (worst) {
        /* shares of the window so far (it trips before its end) */
        double span = moe_ts_sec(now) - moe_ts_sec(&g->win0);
        if (span < 0.001) span = 0.001;
        double own = (double)worst->win_ticks * TICK_S * 100 / span,
               all = (double)g->win_ticks * TICK_S * 100 / span;
        if (worst->win_ticks == g->win_ticks)
            snprintf(worst->doom, sizeof worst->doom,
                     "used %.0f%% of the producer's CPU over %.1f s (cap %.0f%% over 1 s)", own,
                     span, g->cpu_share * 100);
        else
            snprintf(worst->doom, sizeof worst->doom,
                     "used %.0f%% of the producer's CPU over %.1f s, the most of its modulators, "
                     "which used %.0f%% together (cap %.0f%% over 1 s)",
                     own, span, all, g->cpu_share * 100);
    }
    for (lei_moe *x = g->list; x; x = x->gnext) x->win_ticks = 0;
    g->win_ticks = 0;
    g->win0 = *now;
}
