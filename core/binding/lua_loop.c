/* lua_loop.c: running the context's libev loop from Lua (run, run_once,
 * stop, flush), timers and fd watchers.
 */
#define _GNU_SOURCE
#include "lua_int.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>
#include <stdio.h>

/* ctx:want_turn(on): call the turn hook before each loop turn's writes. */
static int l_want_turn(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    b->want_turn = lua_toboolean(L, 2);
    return 0;
}

static int l_flush(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    lb_moe_flush_all(b);
    lei_peer_flush_all(b->c);
    return 0;
}

static int l_drain_local(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    lb_moe_flush_all(b);
    lei_drain_local(b->c);
    return 0;
}

/* Argument i as a time in seconds: raises unless it is a finite number
 * >= 0 (NaN, inf and negatives would abort libev, block or spin). */
static double check_time(lua_State *L, int i) {
    double t = luaL_checknumber(L, i);
    if (!(t >= 0) || !isfinite(t)) luaL_argerror(L, i, "must be a finite number >= 0");
    return t;
}

static void wake_cb(struct ev_loop *loop, ev_timer *w, int revents) {
    (void)loop;
    (void)w;
    (void)revents;
}

/* ctx:run_once([timeout]): one turn of the loop; blocks at most timeout
 * seconds (nil: until something happens, 0: not at all). */
static int l_run_once(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    lb_moe_not_busy(L, b, "a turn of the loop");
    if (lua_isnoneornil(L, 2)) {
        ev_run(lei_ctx_loop(b->c), EVRUN_ONCE);
    } else {
        double t = check_time(L, 2);
        if (t == 0) {
            ev_run(lei_ctx_loop(b->c), EVRUN_NOWAIT);
        } else {
            /* On this C stack frame: nested run_once calls each get their own. */
            ev_timer wake;
            struct ev_loop *loop = lei_ctx_loop(b->c);
            ev_timer_init(&wake, wake_cb, t, 0.);
            ev_timer_start(loop, &wake);
            ev_run(loop, EVRUN_ONCE);
            ev_timer_stop(loop, &wake);
        }
    }
    lb_close_if_pending(b, L);
    if (b->sig_in_cb) {
        /* (context.lua raises it again on the main line) */
        b->sig_in_cb = 0;
        lua_pushboolean(L, 1);
        return 1;
    }
    return 0;
}

/* SIGINT and SIGTERM during ctx:run(): lecho's own handler, not libev's
 * (libev's only records a signal for the loop: a handler or callback that
 * never returned kept the process from ending by any signal but SIGKILL).
 *
 * signals true: the first signal is recorded (b->sig_pending) and wakes the
 * loop (sigasync: the run ends, the caller closes and ends the process by
 * it); and, should Lua code be running (a handler that loops), a hook of
 * the main state (a count of 1, as LuaJIT's own luajit.c does; a
 * modulator's state has its own hook and is not touched) raises
 * "interrupted!" at its next instruction, which lecho's callers of
 * callbacks take as the signal (lecho.signals M.in_callback).  Code the
 * hook cannot reach (C, or a loop LuaJIT compiled: hooks do not run in
 * compiled traces) goes on, and a second signal while the first is pending
 * ends the process at once: the default action, raised again.
 *
 * signals false: the host's handler stays; when it is a function (LuaJIT's
 * interpreter, whose handler only sets a hook) it is called through this
 * one, which wakes the loop so that Lua runs once and the hook it set can
 * fire (an idle loop runs no Lua: the first Ctrl-C was lost).
 *
 * A signal handler reaches its context through this pointer only: the one
 * process-wide state it needs (one ctx:run at a time catches signals; a
 * nested run keeps the outer's and puts it back).  Written with the
 * signals blocked. */
static lb_ctx *volatile run_sig_ctx;
static struct sigaction run_sig_host[2]; /* signals false: the host's actions, chained */

static const int run_sigs[3] = {SIGINT, SIGTERM, SIGHUP};

static void die_by(int sig) {
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, NULL);
    /* Blocked while this handler runs: delivered, with its default
     * action, when it returns. */
    raise(sig);
}

static void sig_hook(lua_State *L, lua_Debug *ar) {
    (void)ar;
    lb_ctx *b = run_sig_ctx;
    if (b)
        lua_sethook(L, b->old_hook, b->old_hook_mask, b->old_hook_count);
    else
        lua_sethook(L, NULL, 0, 0);
    /* Said to lecho.signals, the owner of the interrupt flag (its setter,
     * the registry's "lecho.interrupt": the flag in Lua and every open
     * context's b->intr_raised), before the raise, which a handler's pcall
     * may catch: no further event is dispatched to a handler (the next
     * event of a batch ran the interrupted handler again, and the program
     * did not stop).  (A hook may call Lua: LuaJIT runs no hook inside
     * it; an error of the setter's is dropped, the raise below is what
     * counts.) */
    lua_getfield(L, LUA_REGISTRYINDEX, "lecho.interrupt");
    if (lua_isfunction(L, -1)) {
        if (lua_pcall(L, 0, 0, 0) != 0) lua_pop(L, 1);
    } else {
        lua_pop(L, 1);
    }
    luaL_error(L, "interrupted!");
}

static void run_sig_handler(int sig) {
    int saved = errno;
    lb_ctx *b = run_sig_ctx;
    if (!b || b->sig_pending) {
        die_by(sig);
    } else {
        b->sig_pending = sig;
        lua_sethook(b->L, sig_hook, LUA_MASKCALL | LUA_MASKRET | LUA_MASKCOUNT, 1);
        ev_async_send(lei_ctx_loop(b->c), &b->sigasync);
    }
    errno = saved;
}

static void run_sig_chain(int sig, siginfo_t *si, void *uc) {
    int saved = errno;
    const struct sigaction *h = &run_sig_host[sig == SIGINT ? 0 : 1];
    if (h->sa_flags & SA_SIGINFO) h->sa_sigaction(sig, si, uc);
    else if (h->sa_handler != SIG_DFL && h->sa_handler != SIG_IGN) h->sa_handler(sig);
    lb_ctx *b = run_sig_ctx;
    if (b) {
        b->sig_chained = 1;
        ev_async_send(lei_ctx_loop(b->c), &b->sigasync);
    }
    errno = saved;
}

/* On the loop (the highest priority: before the callbacks of its turn). */
static void run_async_cb(struct ev_loop *loop, ev_async *w, int revents) {
    lb_ctx *b = w->data;
    (void)revents;
    if (b->sig_pending) {
        /* No Lua code runs now: the hook is not needed (the callbacks due
         * in this turn run as usual). */
        lua_sethook(b->L, b->old_hook, b->old_hook_mask, b->old_hook_count);
        b->signal = b->sig_pending;
        b->stopping = 1;
        ev_break(loop, EVBREAK_ALL);
    } else if (b->sig_chained) {
        ev_break(loop, EVBREAK_ALL);
    }
}

static void run_hup_cb(struct ev_loop *loop, ev_signal *w, int revents) {
    lb_ctx *b = w->data;
    (void)revents;
    b->hup = 1;
    ev_break(loop, EVBREAK_ONE);
}

/* signals false, after the host's handler ran: a Lua function called once
 * (a hook that handler set fires in it); its error is the run's. */
static int host_hook_check(lua_State *L) {
    if (luaL_loadbuffer(L, "return", 6, "=ctx:run") != 0) {
        lua_pop(L, 1);
        return 0;
    }
    if (lua_pcall(L, 0, 0, 0) == 0) return 0;
    /* LuaJIT's: "ctx:run:0: interrupted!", where the program is */
    size_t n;
    const char *e = lua_tolstring(L, -1, &n);
    if (e && n >= 12 && strcmp(e + n - 12, "interrupted!") == 0) {
        lua_pop(L, 1);
        lua_pushliteral(L, "interrupted!");
    }
    return 1;
}

/* ctx:run([signals [, reload]]): serves the loop until ctx:stop().  With
 * signals true, SIGINT and SIGTERM (those the process does not ignore) are
 * caught for the run only (lecho's handler above): they end it, and it
 * returns the signal's number; the actions and the signal mask the process
 * had are put back before it returns, or, when a signal ended it, the
 * default actions (the caller closes and exits: a second signal ends the
 * process at once; one during the run, while the first is pending, too).
 * With a function reload too, SIGHUP (unless ignored) is caught for the
 * run as well and calls it (a protected call; the run goes on).  With
 * signals false, a host's handler of SIGINT or SIGTERM is chained (above):
 * an error a hook of the host raised in Lua then is raised by the run.
 * Returns nothing otherwise. */
static int l_run(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    lb_moe_not_busy(L, b, "running the loop");
    int catch = lua_toboolean(L, 2), caught[3] = {0, 0, 0};
    int nsigs = catch && lua_isfunction(L, 3) ? 3 : 2;
    struct sigaction old[3], host_saved[2];
    sigset_t oldmask, sigs;
    struct ev_loop *loop = lei_ctx_loop(b->c);
    lb_ctx *outer = run_sig_ctx;
    b->stopping = 0;
    b->signal = 0;
    b->hup = 0;
    b->sig_pending = 0;
    b->sig_chained = 0;
    b->old_hook = lua_gethook(b->L);
    b->old_hook_mask = lua_gethookmask(b->L);
    b->old_hook_count = lua_gethookcount(b->L);
    ev_async_init(&b->sigasync, run_async_cb);
    ev_set_priority(&b->sigasync, EV_MAXPRI);
    b->sigasync.data = b;
    ev_async_start(loop, &b->sigasync);
    sigemptyset(&sigs);
    for (int i = 0; i < 3; i++) sigaddset(&sigs, run_sigs[i]);
    /* The handlers' state is set with the signals blocked. */
    sigprocmask(SIG_BLOCK, &sigs, &oldmask);
    memcpy(host_saved, run_sig_host, sizeof host_saved);
    run_sig_ctx = b;
    for (int i = 0; i < nsigs; i++) {
        if (sigaction(run_sigs[i], NULL, &old[i]) != 0) continue;
        int ign = !(old[i].sa_flags & SA_SIGINFO) && old[i].sa_handler == SIG_IGN;
        int dfl = !(old[i].sa_flags & SA_SIGINFO) && old[i].sa_handler == SIG_DFL;
        if (i == 2) {
            /* An ignored signal stays ignored (nohup, a background job). */
            if (!catch || ign) continue;
            ev_signal_init(&b->sigw[2], run_hup_cb, SIGHUP);
            b->sigw[2].data = b;
            ev_signal_start(loop, &b->sigw[2]);
            caught[2] = 1;
            continue;
        }
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sigemptyset(&sa.sa_mask);
        sigaddset(&sa.sa_mask, SIGINT);
        sigaddset(&sa.sa_mask, SIGTERM);
        if (catch) {
            if (ign) continue;
            sa.sa_handler = run_sig_handler;
        } else {
            /* the host's: chained when it is a function */
            if (ign || dfl) continue;
            run_sig_host[i] = old[i];
            sa.sa_sigaction = run_sig_chain;
            sa.sa_flags = SA_SIGINFO | (old[i].sa_flags & SA_RESTART);
        }
        sigaction(run_sigs[i], &sa, NULL);
        caught[i] = 1;
    }
    /* (the signals the process had blocked stay blocked) */
    sigprocmask(SIG_SETMASK, &oldmask, NULL);
    int raised = 0;
    /* A SIGINT that came as the run began (before the handlers above) to
     * LuaJIT's handler set a hook and nothing else: a Lua function called
     * once lets it fire (an idle loop runs none). */
    if (lua_gethook(b->L) && host_hook_check(L)) {
        const char *e = lua_tostring(L, -1);
        if (catch && e && strcmp(e, "interrupted!") == 0) {
            lua_pop(L, 1);
            b->signal = SIGINT;
            b->stopping = 1;
        } else {
            raised = 1;
        }
    }
    /* No Lua error leaves this loop (every callback is a protected call). */
    b->sig_in_cb = 0;
    while (!raised && !b->stopping && b->c && !b->close_pending && !b->sig_in_cb) {
        ev_run(loop, EVRUN_ONCE);
        if (b->sig_chained) {
            b->sig_chained = 0;
            if (host_hook_check(L)) {
                raised = 1;
                break;
            }
        }
        if (b->hup) {
            b->hup = 0;
            lua_pushvalue(L, 3);
            if (lua_pcall(L, 0, 0, 0) != 0) {
                if (b->c) lei_logf(b->c, "reload on SIGHUP failed: %s", lua_tostring(L, -1));
                lua_pop(L, 1);
            }
        }
    }
    /* A callback that the hook interrupted stopped the loop itself. */
    sigprocmask(SIG_BLOCK, &sigs, NULL);
    if (catch && b->sig_pending) b->signal = b->sig_pending;
    /* LuaJIT's SIGINT inside a callback C called: with signals, closed as
     * one this run caught; without, raised on the main line below. */
    if (b->sig_in_cb && catch && !b->signal) b->signal = SIGINT;
    if (b->sig_in_cb && !catch && !raised) {
        lua_pushliteral(L, "interrupted!");
        raised = 1;
    }
    b->sig_in_cb = 0;
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    for (int i = 0; i < nsigs; i++) {
        if (!caught[i]) continue;
        const struct sigaction *to = b->signal ? &dfl : &old[i];
        if (i == 2) {
            /* The action is set before the stop (with signalfd, libev
             * unblocks the signal there: one pending is delivered to it)
             * and again after (without, libev sets SIG_DFL). */
            sigaction(SIGHUP, to, NULL);
            ev_signal_stop(loop, &b->sigw[2]);
        }
        sigaction(run_sigs[i], to, NULL);
    }
    if (b->sig_pending) lua_sethook(b->L, b->old_hook, b->old_hook_mask, b->old_hook_count);
    b->sig_pending = 0;
    b->sig_chained = 0;
    run_sig_ctx = outer;
    memcpy(run_sig_host, host_saved, sizeof host_saved);
    ev_async_stop(loop, &b->sigasync);
    sigprocmask(SIG_SETMASK, &oldmask, NULL);
    b->stopping = 0;
    if (raised) lua_error(L);
    lb_close_if_pending(b, L);
    if (b->signal) {
        lua_pushinteger(L, b->signal);
        return 1;
    }
    return 0;
}

/* SIGINT and SIGTERM during the close at the program's end (lecho.context
 * Context:_at_end: a script that ended without ctx:close(), os.exit, a C
 * program's return from main).  No ctx:run() catches them then, and
 * LuaJIT's interpreter has put back the default action after the script:
 * one Ctrl-C during that close's linger killed the process with nothing
 * said about what was still queued (outside attack s8 B).
 *
 * core.end_signals() sets this handler for both (unless ignored): the
 * first signal is recorded (end_sig), and the wait it interrupts (a loop
 * turn's poll returns, EINTR) ends; the close sees core.end_signal(), ends
 * its linger, says what it did not deliver, and the process then ends by
 * that signal (lb_loop_end_exit, from the exit handler: a shell's $? 130
 * or 143, as after ctx:run).  A second signal ends the process at once.
 * Process-wide, as a signal is, and written by the handler only: the
 * program is ending, the action is never put back. */
static volatile sig_atomic_t end_sig;

static void end_sig_handler(int sig) {
    int saved = errno;
    if (end_sig) die_by(sig);
    end_sig = sig;
    errno = saved;
}

static int l_end_signals(lua_State *L) {
    (void)L;
    for (int i = 0; i < 2; i++) {
        struct sigaction old, sa;
        if (sigaction(run_sigs[i], NULL, &old) != 0) continue;
        if (!(old.sa_flags & SA_SIGINFO) && old.sa_handler == SIG_IGN) continue;
        if (!(old.sa_flags & SA_SIGINFO) && old.sa_handler == end_sig_handler) continue;
        memset(&sa, 0, sizeof sa);
        sigemptyset(&sa.sa_mask);
        sigaddset(&sa.sa_mask, SIGINT);
        sigaddset(&sa.sa_mask, SIGTERM);
        sa.sa_handler = end_sig_handler;
        sigaction(run_sigs[i], &sa, NULL);
    }
    return 0;
}

/* core.end_signal() -> the signal that came during the program's end, or nil. */
static int l_end_signal(lua_State *L) {
    if (!end_sig) return 0;
    lua_pushinteger(L, end_sig);
    return 1;
}

void lb_loop_end_exit(void) {
    if (!end_sig) return;
    fflush(NULL);
    die_by(end_sig);
    _exit(128 + end_sig); /* (the signal blocked by the host program) */
}

const luaL_Reg lb_loop_end_funcs[] = {{"end_signals", l_end_signals}, {"end_signal", l_end_signal}, {NULL, NULL}};

/* c:interrupted(on): sets or clears b->intr_raised, this context's copy
 * of the interrupt flag for its C sinks; written by lecho.signals only
 * (M.interrupted, M.taken: the flag's owner keeps every open context's
 * copy in step with its own).  c:interrupted(): the copy, true or false.
 * A field of the userdata: a closed context's too (no error). */
static int l_interrupted(lua_State *L) {
    lb_ctx *b = luaL_checkudata(L, 1, CTX_MT);
    if (lua_gettop(L) < 2) {
        lua_pushboolean(L, b->intr_raised);
        return 1;
    }
    b->intr_raised = lua_toboolean(L, 2);
    return 0;
}

/* c:break_once(): the innermost ev_run returns once this loop iteration's
 * callbacks are done; called from the turn hook (the prepare phase), it
 * returns before the poll: a main-line wait whose condition a resumed
 * coroutine just made true does not sleep until the next event. */
static int l_break_once(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    ev_break(lei_ctx_loop(b->c), EVBREAK_ONE);
    return 0;
}

static int l_stop(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    b->stopping = 1;
    ev_break(lei_ctx_loop(b->c), EVBREAK_ALL);
    return 0;
}

/* ctx:catch_up(): lei_live_catch_up before a request (a sync submit, a
 * call, a join) from a program that may have been away from its loop: the
 * number of connections found closed by their remote.  Nothing inside a
 * callback (the loop is running), one crossing otherwise. */
static int l_catch_up(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    /* (not inside a modulator's call either: what it reads could unload it) */
    int n = lei_ctx_depth(b->c) > 0 || (b->moeg && lei_moe_group_busy(b->moeg)) ? 0 : lei_live_catch_up(b->c);
    lb_close_if_pending(b, L);
    lua_pushinteger(L, n);
    return 1;
}

static int l_now(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    ev_now_update(lei_ctx_loop(b->c));
    lua_pushnumber(L, ev_now(lei_ctx_loop(b->c)));
    return 1;
}

static void timer_cb(struct ev_loop *loop, ev_timer *w, int revents) {
    (void)loop;
    (void)revents;
    lb_timer *t = (lb_timer *)w;
    lb_ctx *b = t->b;
    lua_State *L = b->L;
    int self = t->ref_self;
    lua_rawgeti(L, LUA_REGISTRYINDEX, self); /* keeps t alive during the call */
    if (!t->is_io && !w->repeat && t->active) {
        t->active = 0;
        t->ref_self = LUA_NOREF;
        luaL_unref(L, LUA_REGISTRYINDEX, self);
    }
    lua_rawgeti(L, LUA_REGISTRYINDEX, t->ref_fn);
    lua_pushvalue(L, -2);
    lei_ctx_enter(b->c);
    lb_pcall(b, 1, 0);
    if (b->c) lei_ctx_leave(b->c);
    lua_pop(L, 1);
}

/* A new watcher userdata on the stack, calling the function at index fn;
 * the caller initialises and starts the libev watcher, then registers it. */
static lb_timer *watcher_new(lua_State *L, lb_ctx *b, int fn, int is_io) {
    lb_timer *t = lua_newuserdata(L, sizeof *t);
    memset(t, 0, sizeof *t);
    t->b = b;
    t->is_io = is_io;
    lua_pushvalue(L, fn);
    t->ref_fn = luaL_ref(L, LUA_REGISTRYINDEX);
    return t;
}

/* The started watcher on top of the stack pins itself until stopped. */
static int watcher_register(lua_State *L, lb_ctx *b, lb_timer *t) {
    lua_pushvalue(L, -1);
    t->ref_self = luaL_ref(L, LUA_REGISTRYINDEX);
    t->active = 1;
    t->next = b->timers;
    b->timers = t;
    luaL_getmetatable(L, TIMER_MT);
    lua_setmetatable(L, -2);
    return 1;
}

/* ctx:timer(after, repeat, fn) -> timer; fn(timer) runs on the loop. */
static int l_timer(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    double after = check_time(L, 2);
    double rep = lua_isnoneornil(L, 3) ? 0 : check_time(L, 3);
    luaL_checktype(L, 4, LUA_TFUNCTION);
    lb_timer *t = watcher_new(L, b, 4, 0);
    ev_timer_init(&t->w, timer_cb, after, rep);
    ev_timer_start(lei_ctx_loop(b->c), &t->w);
    return watcher_register(L, b, t);
}

static void io_cb(struct ev_loop *loop, ev_io *w, int revents) {
    timer_cb(loop, (ev_timer *)(void *)w, revents);
}

/* ctx:io(fd, fn [, "w"]) -> watcher; fn(watcher) runs on the loop whenever
 * fd is readable (with "w": writable), until watcher:stop().  For a REPL
 * reading stdin, say, or the gateway waiting for a client's socket to take
 * more. */
static int l_io(lua_State *L) {
    lb_ctx *b = lb_check_ctx(L);
    double d = luaL_checknumber(L, 2);
    luaL_checktype(L, 3, LUA_TFUNCTION);
    /* libev aborts on a descriptor that is not open, and sizes its tables by
     * the largest one: only an open descriptor below the rlimit goes on. */
    struct rlimit rl;
    double bound = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY
                       ? (double)rl.rlim_cur
                       : 65536.0;
    if (!(d >= 0 && d < bound && d <= INT_MAX) || d != floor(d))
        return luaL_error(L, "ctx:on_readable: fd %f is not a descriptor (an integer >= 0 "
                             "below the open files limit, %f)",
                          d, bound);
    int fd = (int)d;
    if (fcntl(fd, F_GETFD) < 0) return luaL_error(L, "ctx:on_readable: fd %d is not open", fd);
    const char *mode = luaL_optstring(L, 4, "r");
    lb_timer *t = watcher_new(L, b, 3, 1);
    ev_io_init(&t->io, io_cb, fd, strcmp(mode, "w") == 0 ? EV_WRITE : EV_READ);
    ev_io_start(lei_ctx_loop(b->c), &t->io);
    return watcher_register(L, b, t);
}

static void watcher_stop(lb_timer *t) {
    if (!t->b || !t->b->c) return;
    if (t->is_io)
        ev_io_stop(lei_ctx_loop(t->b->c), &t->io);
    else
        ev_timer_stop(lei_ctx_loop(t->b->c), &t->w);
}

static void timer_unlink(lb_timer *t) {
    if (!t->b) return;
    for (lb_timer **pp = &t->b->timers; *pp; pp = &(*pp)->next)
        if (*pp == t) {
            *pp = t->next;
            break;
        }
}

static int l_timer_stop(lua_State *L) {
    lb_timer *t = luaL_checkudata(L, 1, TIMER_MT);
    watcher_stop(t);
    if (t->active) {
        luaL_unref(L, LUA_REGISTRYINDEX, t->ref_self);
        t->active = 0;
    }
    return 0;
}

static int l_timer_gc(lua_State *L) {
    lb_timer *t = luaL_checkudata(L, 1, TIMER_MT);
    watcher_stop(t);
    timer_unlink(t);
    luaL_unref(L, LUA_REGISTRYINDEX, t->ref_fn);
    t->b = NULL;
    return 0;
}

const luaL_Reg lb_loop_methods[] = {
    {"flush", l_flush},           {"drain_local", l_drain_local},
    {"run_once", l_run_once},     {"run", l_run},
    {"stop", l_stop},             {"now", l_now},
    {"catch_up", l_catch_up},
    {"break_once", l_break_once},
    {"interrupted", l_interrupted},
    {"timer", l_timer},           {"io", l_io},
    {"want_turn", l_want_turn},   {NULL, NULL}};

/* The metatable of timers and watchers. */
void lb_loop_open(lua_State *L) {
    static const luaL_Reg timer_methods[] = {{"stop", l_timer_stop}, {NULL, NULL}};
    lb_metatable(L, TIMER_MT, timer_methods, l_timer_gc);
}
