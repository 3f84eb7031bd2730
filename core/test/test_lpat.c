/* test_lpat.c: the step limit of the pattern matcher (core/moe/lpat.c).  A
 * matcher stuck in one C call (backtracking, a huge class, a plain find
 * over a big subject) must see the stop flag within a few thousand steps
 * and raise "CPU budget exceeded"; with no flag it finishes as LuaJIT's.
 * The flag is set by a second thread, as a timer signal would. */
#define _GNU_SOURCE
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "lpat.h"
#include "test.h"

typedef struct setter {
    volatile sig_atomic_t *stop;
    long delay_ns;
    clockid_t runner; /* the CPU clock of the thread running the chunk */
    struct timespec at; /* that thread's CPU time when the flag was set */
} setter;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void *set_later(void *arg) {
    setter *s = arg;
    struct timespec d = {0, s->delay_ns};
    nanosleep(&d, NULL);
    clock_gettime(s->runner, &s->at);
    *s->stop = 1;
    return NULL;
}

/* Runs setup, then chunk (both use S, a table of the four functions) in a
 * fresh state; the flag is set delay_ms after chunk starts (< 0: never).  Returns
 * the error text ("" when it ran through) in err; *late: the CPU seconds the
 * running thread spent from the set to the end of the call (its CPU time, not
 * the wall clock: on a busy host the thread may wait for a core meanwhile,
 * which says nothing of how soon the matcher looks at the flag). */
static void run(const char *setup, const char *chunk, long delay_ms, char *err, size_t errlen, double *late) {
    volatile sig_atomic_t stop = 0;
    lua_State *L = luaL_newstate();
    luaL_openlibs(L);
    lua_newtable(L);
    lei_lpat_open(L, &stop);
    lua_setglobal(L, "S");
    if (luaL_dostring(L, setup)) fprintf(stderr, "  setup: %s\n", lua_tostring(L, -1));
    setter st = {&stop, delay_ms * 1000000L, CLOCK_THREAD_CPUTIME_ID, {0, 0}};
    if (pthread_getcpuclockid(pthread_self(), &st.runner)) st.runner = CLOCK_MONOTONIC;
    pthread_t th;
    if (delay_ms >= 0) pthread_create(&th, NULL, set_later, &st);
    int rc = luaL_dostring(L, chunk);
    struct timespec e;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &e);
    double end = st.runner == CLOCK_MONOTONIC ? now() : (double)e.tv_sec + (double)e.tv_nsec * 1e-9;
    if (delay_ms >= 0) pthread_join(th, NULL);
    snprintf(err, errlen, "%s", rc ? lua_tostring(L, -1) : "");
    *late = delay_ms >= 0 ? end - ((double)st.at.tv_sec + (double)st.at.tv_nsec * 1e-9) : 0;
    lua_close(L);
}

static int stopped_soon(const char *setup, const char *chunk) {
    char err[256];
    double late;
    run(setup, chunk, 50, err, sizeof err, &late);
    int ok = strstr(err, "CPU budget exceeded") != NULL && late < 0.05;
    if (!ok) fprintf(stderr, "  %s: '%s', %.3f CPU s after the flag\n", chunk, err, late);
    return ok;
}

int main(void) {
    char err[256];
    double late;
    /* no flag set: the same results as LuaJIT's */
    run("", "local a, b = S.find(('a'):rep(40), '.-.-b') assert(a == nil)"
        " assert(S.gsub('hello  world', '%s+', ' ') == 'hello world')"
        " local n = 0 for k in S.gmatch('xyz', '()%1') do n = n + 1 end assert(n == 0)"
        " assert(select(2, pcall(S.find, ('a'):rep(201), ('a?'):rep(201))) == 'pattern too complex')",
        -1, err, sizeof err, &late);
    CHECK(strcmp(err, "") == 0);
    if (*err) fprintf(stderr, "  %s\n", err);
    /* stuck in one call: backtracking, by find, match, gmatch and gsub */
    CHECK(stopped_soon("", "S.find(('a'):rep(3000), '.-.-.-.-b')"));
    CHECK(stopped_soon("", "S.match(('a'):rep(3000), '(.-)(.-)(.-)b')"));
    CHECK(stopped_soon("", "for x in S.gmatch(('a'):rep(3000), 'a*a*a*a*b') do end"));
    CHECK(stopped_soon("", "S.gsub(('a'):rep(3000), 'a-a-a-b', '')"));
    /* a back-reference compared at every place, a 300 kB class */
    CHECK(stopped_soon("s = ('ab'):rep(300000)", "for i = 1, 1e6 do S.find(s, '(.*)%1x') end"));
    CHECK(stopped_soon("c = '[' .. ('b'):rep(300000) .. ']' s = ('a'):rep(1000)",
                       "for i = 1, 1e6 do S.find(s, c) end"));
    /* a plain find over 64 MiB, and a huge pattern, polled within the call */
    CHECK(stopped_soon("s = ('a'):rep(64 * 2^20)", "for i = 1, 1e6 do S.find(s, 'ab', 1, true) end"));
    CHECK(stopped_soon("p = ('a?'):rep(150) .. ('x'):rep(300000) s = ('a'):rep(200)",
                       "for i = 1, 1e6 do S.find(s, p) end"));
    /* calls too short to reach a poll by their steps look at the flag at
     * their start when their input passes 64 KiB */
    CHECK(stopped_soon("s = ('a'):rep(100000)",
                       "repeat local ok, e = pcall(S.find, s, 'z', 1, true) if not ok then error(e) end"
                       " until false"));
    return TEST_SUMMARY();
}
