/* fuzz_ns.c: a libFuzzer harness (make fuzz) for the name server's
 * protocol: the control plane (lua/lecho/ns/registry.lua with naming.lua,
 * membership.lua, policy.lua) runs in a LuaJIT state in this process, a name
 * server and a channel manager, and is fed control messages decoded by the
 * core's decoder, as lecho-nameserver is, from four client addresses; what
 * they send each other is delivered, what they send the clients must
 * encode.  Lost connections and the clock's ticks come from the input too.
 *
 * A bug is: a raise out of handle/peer_down/tick, a registry "internal
 * error" (an op that raised: the registry catches it and logs it), a reply
 * that does not encode, or a host-misuse answer.
 *
 * Input: byte 0 bit 0 keyed (an identity per address and a policy) or
 * protected; then records: u8 kind (0 to the name server, 1 to the manager,
 * 2 a connection lost, 3 a tick), u8 sender (one of four clients, or the
 * other registry), u8 time step (1/16 s), u16le length, an encoded value.
 * Lua lines are fed to libFuzzer as extra coverage counters (a line hook).
 * Leans on core/base/codec.c, core/base/codec_lua.c, LuaJIT and the Lua files of this
 * tree (LECHO_LUA_DIR, compile-time).  Seeds: core/fuzz/ns/.
 */
#include "codec.h"

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef LECHO_LUA_DIR
#define LECHO_LUA_DIR "lua"
#endif

static lua_State *L; /* the harness's state, for the process's life */

/* libFuzzer sees the C code's coverage only: the Lua lines run (pairs of
 * them, by chunk) are counted here, in counters it reads as extra ones, so
 * that inputs reaching new paths of the registry are kept. */
#define LUA_COV (1 << 16)
__attribute__((used, section("__libfuzzer_extra_counters"))) static uint8_t lua_cov[LUA_COV];
static uintptr_t cov_prev;

static void cov_hook(lua_State *S, lua_Debug *ar) {
    if (!lua_getinfo(S, "S", ar)) return;
    uintptr_t here = ((uintptr_t)ar->source >> 4) * 31u + (uintptr_t)ar->currentline;
    uint8_t *c = &lua_cov[((here * 2654435761u) ^ cov_prev) % LUA_COV];
    if (*c < 255) (*c)++;
    cov_prev = here >> 1;
}
static int run_ref;  /* the driver's run(bytes) */
static unsigned long runs;

/* The driver: builds both registries per input and plays the records. */
static const char DRIVER[] =
    "local decode, encode, bad = ...\n"
    /* lecho.subs (the manager recomputes modulator keys) needs lecho.core's
     * encode and hash: the codec's encode here, and a deterministic stand-in
     * for the hash (keys only have to agree within this process); no C key
     * (stream_key nil: the Lua canon makes every key) */
    "package.preload['lecho.core'] = function()\n"
    "  local bit = require 'bit'\n"
    "  local function hash(s)\n"
    "    local h = 0x811c9dc5\n"
    "    for i = 1, #s do h = bit.tobit(bit.bxor(h, s:byte(i)) * 16777619 % 4294967296) end\n"
    "    return bit.tohex(h, 8) .. bit.tohex(bit.bnot(h), 8)\n"
    "  end\n"
    "  return { encode = encode, hash = hash, stream_key = function() return nil end }\n"
    "end\n"
    "local registry = require 'lecho.ns.registry'\n"
    "local verbose = os.getenv('LECHO_FUZZ_LOG')\n"
    "local policy = require 'lecho.policy'\n"
    "local NS, MGR = '127.0.0.1:7000', '127.0.0.1:7100'\n"
    "local FROM = { '127.0.0.1:7001', '127.0.0.1:7002', '127.0.0.1:7003', '[::1]:7004' }\n"
    "local NAMES = { ['127.0.0.1:7001'] = 'sim', ['127.0.0.1:7002'] = 'viewer-1',\n"
    "  ['127.0.0.1:7003'] = 'eve', ['[::1]:7004'] = 'mgr-1', [NS] = 'nameserver', [MGR] = 'mgr-1' }\n"
    "local POLICY = assert(policy.new({ rules = {\n"
    "  { principal = 'sim', channel = 'atmos/*', allow = { 'produce' } },\n"
    "  { principal = 'viewer-*', channel = { 'atmos/*', 'x' }, allow = { 'consume', 'list', 'modulate' },\n"
    "    caps = { 'clock' } },\n"
    "  { principal = 'mgr-1', channel = '*', allow = 'manage' } } }, 'fuzz'))\n"
    "local function identity(addr)\n"
    "  local n = NAMES[addr]\n"
    "  if n then return n, ('K'):rep(31) .. addr:sub(-1) end\n"
    "end\n"
    "local function log(level, msg)\n"
    "  if level == 'error' then bad('registry logged an error: ' .. tostring(msg)) end\n"
    "end\n"
    "return function(s)\n"
    "  local keyed = s:byte(1) % 2 == 1\n"
    "  local o = { addr = NS, role = 'nameserver', log = log, settle = 1, ack_timeout = 1,\n"
    "              forget_after = 2 }\n"
    "  if keyed then o.identity, o.policy, o.sign = identity, POLICY, function(m) return ('S'):rep(64) end end\n"
    "  local ns = registry.new(o)\n"
    "  o.addr, o.role, o.nameserver = MGR, 'manager', NS\n"
    "  if keyed then o.policy = nil end\n"
    "  local mgr = registry.new(o)\n"
    "  local regs = { [NS] = ns, [MGR] = mgr }\n"
    "  local q, now = {}, 0\n"
    "  local function send(to, msg)\n"
    "    if verbose then io.stderr:write(('fuzz: to %s %s %s %s\\n'):format(to, tostring(msg.op),\n"
    "      tostring(msg.ok), tostring(msg.err))) end\n"
    "    local ok, err = encode(msg)\n"
    "    if not ok then bad('a message to ' .. tostring(to) .. ' does not encode: ' .. tostring(err)) end\n"
    "    if regs[to] and #q < 10000 then q[#q + 1] = { to, ok } end\n"
    "  end\n"
    "  local function deliver(from, target)\n"
    "    local n = 0\n"
    "    while #q > 0 and n < 1000 do\n"
    "      n = n + 1\n"
    "      local m = table.remove(q, 1)\n"
    "      local okd, v = decode(m[2])\n"
    "      if not okd then bad('what was encoded does not decode: ' .. tostring(v)) end\n"
    "      local r, err = regs[m[1]]:handle(m[1] == NS and MGR or NS, v, send, now)\n"
    "      if not r then bad('handle: ' .. tostring(err)) end\n"
    "    end\n"
    "  end\n"
    "  local pos = 2\n"
    "  while pos + 5 <= #s do\n"
    "    local kind, who, dt, lo, hi = s:byte(pos, pos + 4)\n"
    "    local len = lo + hi * 256\n"
    "    local body = s:sub(pos + 5, pos + 4 + len)\n"
    "    pos = pos + 5 + len\n"
    "    now = now + dt / 16\n"
    "    local from = FROM[who % 5 + 1] or (kind % 4 == 0 and MGR or NS)\n"
    "    kind = kind % 4\n"
    "    if kind <= 1 then\n"
    "      local okd, msg = decode(body)\n"
    "      if okd and type(msg) == 'table' then\n"
    "        local r, err = (kind == 0 and ns or mgr):handle(from, msg, send, now)\n"
    "        if not r then bad('handle: ' .. tostring(err)) end\n"
    "      end\n"
    "    elseif kind == 2 then\n"
    "      ns:peer_down(from, send, now)\n"
    "      mgr:peer_down(from, send, now)\n"
    "    else\n"
    "      ns:tick(send, now)\n"
    "      mgr:tick(send, now)\n"
    "    end\n"
    "    deliver()\n"
    "  end\n"
    "end\n";

static void fail(const char *what) {
    fprintf(stderr, "fuzz_ns: %s\n", what);
    abort();
}

/* bad(msg): the driver found a bug */
static int l_bad(lua_State *S) {
    fail(luaL_optstring(S, 1, "?"));
    return 0;
}

/* decode(s) -> true, v | nil, err, with small limits (what a name server
 * reads is small) */
static int l_decode(lua_State *S) {
    size_t n;
    const char *s = luaL_checklstring(S, 1, &n);
    lei_codec_limits lim;
    char err[256];
    lei_codec_limits_default(&lim);
    lim.max_value_bytes = 1 << 20;
    lim.max_depth = 32;
    lua_pushboolean(S, 1);
    if (lei_decode_lua(S, (const uint8_t *)s, n, &lim, err, sizeof err)) {
        lua_pushnil(S);
        lua_pushstring(S, err);
        return 2;
    }
    return 2;
}

/* encode(v) -> bytes | nil, err */
static int l_encode(lua_State *S) {
    lei_msg *m = lei_msg_new();
    char err[256];
    if (!m) fail("out of memory");
    if (lei_encode_lua(S, 1, m, NULL, 0, err, sizeof err)) {
        lei_msg_release(m, NULL, NULL);
        lua_pushnil(S);
        lua_pushstring(S, err);
        return 2;
    }
    lua_pushlstring(S, m->own.data, m->own.len);
    lei_msg_release(m, NULL, NULL);
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > 65536) return 0;
    lua_settop(L, 0);
    lua_rawgeti(L, LUA_REGISTRYINDEX, run_ref);
    lua_pushlstring(L, (const char *)data, size);
    if (lua_pcall(L, 1, 0, 0)) fail(lua_tostring(L, -1));
    lua_settop(L, 0);
    if (++runs % 1024 == 0) lua_gc(L, LUA_GCCOLLECT, 0);
    return 0;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    L = luaL_newstate();
    if (!L) abort();
    luaL_openlibs(L);
    lua_getglobal(L, "package");
    lua_pushstring(L, LECHO_LUA_DIR "/?.lua;" LECHO_LUA_DIR "/?/init.lua;;");
    lua_setfield(L, -2, "path");
    lua_pop(L, 1);
    if (luaL_loadbuffer(L, DRIVER, sizeof DRIVER - 1, "=fuzz_ns driver")) fail(lua_tostring(L, -1));
    lua_pushcfunction(L, l_decode);
    lua_pushcfunction(L, l_encode);
    lua_pushcfunction(L, l_bad);
    if (lua_pcall(L, 3, 1, 0)) fail(lua_tostring(L, -1));
    run_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_sethook(L, cov_hook, LUA_MASKLINE, 0);
    return 0;
}
