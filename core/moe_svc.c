/* moe_svc.c: sandboxes, states made like a modulator's for calls with
 * values (moe.h, "sandboxes"): loading a chunk that returns a function or a
 * table of functions, and calling them with arguments encoded as a table
 * { n = N, ... }.  Everything runs in moe.c's steps, under the same budget,
 * memory cap and group; a failed call leaves the state as it was when the
 * call unwound (moe.c: moe_run_step), so one bad request does not end a
 * service.
 */
#define _GNU_SOURCE
#include "moe_int.h"

#include <lauxlib.h>
#include <stdio.h>
#include <string.h>

#define TB_KEY "lecho.svc_tb"
#define MAX_ARGS 250 /* arguments and results of one call (the C stack's slots) */

lei_moe *lei_moe_svc_new(lei_ctx *c, const char *name, const char *src, size_t len,
                         const lei_moe_opts *o, char *err, size_t errlen) {
    lei_moe *m = moe_new(c, 0, name, src, len, NULL, 0, o, 1, err, errlen);
    if (!m && strncmp(err, "exceeded its CPU budget", 23) == 0) {
        char why[384];
        snprintf(why, sizeof why, "budget exceeded: %s", err);
        snprintf(err, errlen, "%s", why);
    }
    return m;
}

/* The message handler of a call: keeps the traceback beside the error value
 * (which goes back unchanged: a table stays a table); nothing once stopped. */
static int svc_traceback(lua_State *L) {
    lei_moe *m = moe_of(L);
    lua_settop(L, 1);
    if (m->over || m->stop || m->mem_hit) return 1;
    luaL_traceback(L, L, NULL, 1);
    /* without the lines that show a C function's address (no heap or code
     * address leaves the sandbox: moe_env.c) */
    size_t len;
    const char *tb = lua_tolstring(L, -1, &len);
    luaL_Buffer buf;
    luaL_buffinit(L, &buf);
    for (const char *p = tb, *end = tb + len; p < end;) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *e = nl ? nl + 1 : end;
        const char *at = memmem(p, (size_t)(e - p), " at 0x", 6);
        if (!at) luaL_addlstring(&buf, p, (size_t)(e - p));
        p = e;
    }
    luaL_pushresult(&buf);
    lua_setfield(L, LUA_REGISTRYINDEX, TB_KEY);
    lua_settop(L, 1);
    return 1;
}

/* Pushes the function to call (raises when there is none). */
static void push_fn(lua_State *L, lei_moe *m) {
    lua_rawgeti(L, LUA_REGISTRYINDEX, m->ref_fn);
    if (m->svc_fn) {
        if (!lua_istable(L, -1)) luaL_error(L, "no function '%s': the sandbox has one function", m->svc_fn);
        lua_getfield(L, -1, m->svc_fn);
        if (!lua_isfunction(L, -1)) luaL_error(L, "no function '%s' in the sandbox", m->svc_fn);
        lua_remove(L, -2);
    } else if (!lua_isfunction(L, -1)) {
        luaL_error(L, "the sandbox has several functions: name one");
    }
}

/* Packs the values from base + 1 to the top into { n = N, ... } (on top). */
static void pack(lua_State *L, int base) {
    int n = lua_gettop(L) - base;
    lua_createtable(L, n, 1);
    for (int i = 1; i <= n; i++) {
        lua_pushvalue(L, base + i);
        lua_rawseti(L, -2, i);
    }
    lua_pushinteger(L, n);
    lua_setfield(L, -2, "n");
}

int moe_svc_step(lua_State *L) {
    lei_moe *m = moe_step_of(L);
    char err[256];
    lua_settop(L, 0);
    m->svc_raised = 0;
    lua_pushnil(L);
    lua_setfield(L, LUA_REGISTRYINDEX, TB_KEY);
    lua_pushcfunction(L, svc_traceback); /* 1 */
    push_fn(L, m);                       /* 2 */
    if (lei_decode_lua(L, m->in, m->inlen, &m->o.lim, err, sizeof err))
        luaL_error(L, "bad arguments: %s", err);
    if (!lua_istable(L, 3)) luaL_error(L, "bad arguments: not a table { n = N, ... }");
    lua_getfield(L, 3, "n");
    lua_Number nn = lua_isnumber(L, -1) ? lua_tonumber(L, -1) : (lua_Number)lua_objlen(L, 3);
    lua_pop(L, 1);
    if (!(nn >= 0 && nn <= MAX_ARGS) || nn != (int)nn)
        luaL_error(L, "bad arguments: n must be an integer in [0, %d]", MAX_ARGS);
    int nargs = (int)nn;
    luaL_checkstack(L, nargs + 4, "too many arguments");
    for (int i = 1; i <= nargs; i++) lua_rawgeti(L, 3, i);
    lua_remove(L, 3);
    int rc = lua_pcall(L, nargs, LUA_MULTRET, 1);
    if (m->over || m->stop || m->mem_hit) luaL_error(L, "stopped"); /* run_step says why */
    if (rc != 0) {
        /* raised: { e = the error value, tb = traceback }; a value that
         * cannot travel (a function, a coroutine) is said by its type */
        int t = lua_type(L, -1);
        if (t == LUA_TFUNCTION || t == LUA_TTHREAD || t == LUA_TUSERDATA || t == LUA_TLIGHTUSERDATA)
            lua_pushfstring(L, "error object is a %s value", luaL_typename(L, -1));
        else
            lua_pushvalue(L, -1);
        lua_createtable(L, 0, 2);
        lua_insert(L, -2);
        lua_setfield(L, -2, "e");
        lua_getfield(L, LUA_REGISTRYINDEX, TB_KEY);
        lua_setfield(L, -2, "tb");
        m->svc_raised = 1;
    } else {
        /* the results replaced the function: from 2 to the top */
        if (lua_gettop(L) - 1 > MAX_ARGS)
            luaL_error(L, "cannot send what it produced: more than %d results", MAX_ARGS);
        luaL_checkstack(L, 4, "too many results");
        pack(L, 1);
    }
    moe_route(L, m, -1);
    return 0;
}

int lei_moe_svc_call(lei_moe *m, const char *fn, const uint8_t *in, size_t n, lei_msg **out,
                     char *err, size_t errlen) {
    *out = NULL;
    if (!m->L || !m->svc) {
        snprintf(err, errlen, "sandbox ended: %s", m->L ? "not a sandbox" : m->err);
        return -LEI_E_CLOSED;
    }
    if (m->in_call) { /* from a hook its own call ran (a granted log's handler) */
        snprintf(err, errlen, "the sandbox is in a call: it cannot be called from inside it");
        return -LEI_E_INVALID;
    }
    m->stage = ST_SVC;
    m->svc_fn = fn;
    m->in = in;
    m->inlen = n;
    m->st.events_in++;
    int rc = moe_run_step(m, moe_svc_step, NULL);
    m->in = NULL;
    m->svc_fn = NULL;
    if (rc == 0) {
        *out = moe_take_out(m);
        if (!*out) {
            snprintf(err, errlen, "out of memory");
            return -LEI_E_NOMEM;
        }
        m->st.events_out++;
        return m->svc_raised ? -LEI_E_FAILED : 0;
    }
    switch (m->svc_kind) {
    case SVC_BUDGET:
        snprintf(err, errlen, "budget exceeded: %s", m->err);
        return -LEI_E_LIMIT;
    case SVC_MEMORY:
        snprintf(err, errlen, "memory: %s", m->err);
        return -LEI_E_LIMIT;
    case SVC_FATAL:
        snprintf(err, errlen, "sandbox ended: %s", m->err);
        return -LEI_E_CLOSED;
    default:
        snprintf(err, errlen, "%s", m->err);
        return -LEI_E_INVALID;
    }
}

static int step_names(lua_State *L) {
    lei_moe *m = moe_of(L);
    lua_settop(L, 0);
    lua_rawgeti(L, LUA_REGISTRYINDEX, m->ref_fn);
    if (!lua_istable(L, 1)) return 0;
    lua_newtable(L);
    int i = 0;
    for (lua_pushnil(L); lua_next(L, 1); lua_pop(L, 1)) {
        lua_pushvalue(L, -2);
        lua_rawseti(L, 2, ++i);
    }
    moe_route(L, m, 2);
    return 0;
}

int lei_moe_svc_names(lei_moe *m, lei_msg **names) {
    *names = NULL;
    if (!m->L || !m->svc) return -LEI_E_CLOSED;
    if (m->in_call) return -LEI_E_INVALID;
    m->stage = ST_SVC;
    if (moe_run_step(m, step_names, NULL)) return m->L ? -LEI_E_NOMEM : -LEI_E_CLOSED;
    *names = moe_take_out(m);
    return 0;
}

int lei_moe_svc_in_call(const lei_moe *m) { return m->in_call; }
