/* moe_env.c: what a modulator sees (doc/modulators.md): curated copies of
 * the pure libraries, the host functions (emit, clock, log), and the
 * replacements that keep the budget in force: pcall and xpcall that a stop
 * goes through, a table.sort that polls it.
 */
#define _GNU_SOURCE
#include "moe_int.h"
#include "array.h"

#include <lauxlib.h>
#include <lualib.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int env_emit(lua_State *L) {
    lei_moe *m = lua_touserdata(L, lua_upvalueindex(1));
    luaL_checkany(L, 1);
    if (!m->in_call || m->stage == ST_INIT || m->stage == ST_PARAMS)
        return luaL_error(L, "emit: only from enqueue, dequeue or period");
    int key = 0;
    if (!lua_isnoneornil(L, 2)) {
        luaL_checktype(L, 2, LUA_TTABLE);
        lua_pushliteral(L, "key");
        lua_rawget(L, 2); /* raw: no metamethod of the modulator's runs here */
        key = lua_toboolean(L, -1);
        lua_pop(L, 1);
    }
    m->route_key = key; /* moe_route takes it (and clears it) */
    moe_route(L, m, 1);
    return 0;
}

static int env_clock(lua_State *L) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    lua_pushnumber(L, moe_ts_sec(&t));
    return 1;
}

/* log(...): a line in the producer's log, at most LOG_LINES a second per
 * modulator (a granted log must not let one flood it); how many were not
 * logged is said once the next second starts with a line. */
#define LOG_LINES 10
static int env_log(lua_State *L) {
    lei_moe *m = lua_touserdata(L, lua_upvalueindex(1));
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    double now = moe_ts_sec(&t);
    if (now - m->log_t0 >= 1.0) {
        if (m->log_dropped)
            lei_logf(m->ctx, "modulator %s: %lu more lines not logged (limit %d a second)", m->name,
                     m->log_dropped, LOG_LINES);
        m->log_t0 = now;
        m->log_n = 0;
        m->log_dropped = 0;
    }
    if (m->log_n >= LOG_LINES) {
        m->log_dropped++;
        return 0;
    }
    m->log_n++;
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

/* The position table.insert(t, pos, v) uses, as LuaJIT's lj_lib_checkint
 * takes it (truncated toward zero; out of range or NaN: INT32_MIN), or
 * nothing when pos is not a number (the real insert then raises). */
static int env_inspos(lua_State *L) {
    if (!lua_isnumber(L, 1)) return 0;
    double d = lua_tonumber(L, 1);
    int32_t n = INT32_MIN;
    if (d > -2147483649.0 && d < 2147483648.0) n = (int32_t)d;
    lua_pushinteger(L, n);
    return 1;
}

/* The real metatable of v (getmetatable shows a __metatable field instead). */
static int env_realmt(lua_State *L) {
    if (!lua_getmetatable(L, 1)) lua_pushnil(L);
    return 1;
}

/* Builds the environment: curated copies of the pure libraries, the host
 * functions, then removes what could reach outside from the state itself
 * (the string metatable's __index is the real string table).  tostring,
 * string.format's %s and log show a function, table, userdata or thread as
 * "table: 1" (a number per object, stable in this state), never its heap
 * address, and %p is refused: addresses would help an attacker who found a
 * hole in the sandbox (issue 10). */
static const char sandbox_lua[] =
    "local env, emit, clock, log, inspos, realmt = ...\n"
    "string.dump = nil\n"
    "local rawtostring, rawformat, type, getmetatable, rawget, select, unpack, byte, error =\n"
    "  tostring, string.format, type, getmetatable, rawget, select, unpack, string.byte, error\n"
    "local HEAP = { ['function'] = true, table = true, userdata = true, thread = true, cdata = true }\n"
    "local ids, nid = setmetatable({}, { __mode = 'k' }), 0\n"
    "local function safe(v)\n"
    "  local t = type(v)\n"
    "  if not HEAP[t] then return rawtostring(v) end\n"
    "  local mt = realmt(v)\n"
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
    "        if (c == 115 or c == 113) and HEAP[type(args[a])] then args[a] = safe(args[a]) end\n"
    "      end\n"
    "    end\n"
    "    i = i + 1\n"
    "  end\n"
    "  return rawformat(fmt, unpack(args, 1, n))\n"
    "end\n"
    "string.format, tostring = format, safe\n"
    /* table.insert(t, pos, v) with pos < 1 moves #t + 1 - pos slots in C
     * (2^31 for pos = -2^31 + 2: 15 s): below 1, the same moves in Lua, where
     * the count hook stops them; in range, LuaJIT's (at most #t moves) */
    "local rawinsert, rawset = table.insert, rawset\n"
    "table.insert = function(t, ...)\n"
    "  if select('#', ...) == 2 and type(t) == 'table' then\n"
    "    local pos, v = ...\n"
    "    local n = inspos(pos)\n"
    "    if n and n < 1 then\n"
    "      for i = #t + 1, n + 1, -1 do rawset(t, i, rawget(t, i - 1)) end\n"
    "      rawset(t, n, v)\n"
    "      return\n"
    "    end\n"
    "  end\n"
    "  return rawinsert(t, ...)\n"
    "end\n"
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

static int sandbox_libs(lua_State *L) {
    static const lua_CFunction libs[] = {luaopen_base, luaopen_string, luaopen_table,
                                         luaopen_math, luaopen_bit};
    for (size_t i = 0; i < sizeof libs / sizeof *libs; i++) {
        lua_pushcfunction(L, libs[i]);
        lua_call(L, 0, 0);
    }
    return 0;
}

void moe_env_sandbox_open(lua_State *L) { sandbox_libs(L); }

/* lua_dump's writer: appends to a malloc'd buffer (dump_buf.p, owned by
 * the caller); a failed allocation stops the dump. */
typedef struct dump_buf {
    char *p;
    size_t n, cap;
} dump_buf;

static int dump_write(lua_State *L, const void *d, size_t n, void *ud) {
    (void)L;
    dump_buf *b = ud;
    if (b->n + n > b->cap) {
        size_t nc = b->cap ? b->cap : 4096;
        while (nc < b->n + n) nc *= 2;
        char *q = realloc(b->p, nc);
        if (!q) return 1;
        b->p = q;
        b->cap = nc;
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
    return 0;
}

/* Pushes the sandbox's setup chunk: the group's bytecode of it when there
 * is one (our own, dumped in this process from sandbox_lua: never anything
 * a modulator gave), else compiled from the text and, with a group, dumped
 * for the next states. */
static void load_sandbox(lua_State *L, lei_moe_group *g) {
    if (g && g->env_bc) {
        if (luaL_loadbuffer(L, g->env_bc, g->env_bclen, "=sandbox")) lua_error(L);
        return;
    }
    if (luaL_loadbuffer(L, sandbox_lua, sizeof sandbox_lua - 1, "=sandbox")) lua_error(L);
    if (!g) return;
    dump_buf b = {NULL, 0, 0};
    if (lua_dump(L, dump_write, &b) == 0 && b.n > 0) {
        g->env_bc = b.p;
        g->env_bclen = b.n;
    } else {
        free(b.p);
    }
}

int moe_env_build(lua_State *L, lei_moe *m) {
    /* pcall, xpcall and table.sort that a stop goes through, copied into
     * the sandbox */
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
    load_sandbox(L, m->o.group);
    lua_pushvalue(L, env);
    if (m->svc) { /* a sandbox returns its results: nothing to emit */
        lua_pushnil(L);
    } else {
        lua_pushlightuserdata(L, m);
        lua_pushcclosure(L, env_emit, 1);
    }
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
    lua_pushcfunction(L, env_inspos);
    lua_pushcfunction(L, env_realmt);
    lua_call(L, 6, 0);
    /* env.array and the arrays' methods: in C, stopped by the budget */
    lei_array_lua_moe(L, env, &m->stop);
    lua_pushvalue(L, env);
    m->ref_env = luaL_ref(L, LUA_REGISTRYINDEX);
    return env;
}
