-- Error codes end to end (issue 26, "codes end to end"): every code a user
-- sees is set where the error happens and carried (the decoder's, a name
-- server's or manager's reply, a lost connection's from the core, a
-- modulator file's from errno), never read from a message's text: each
-- path is checked with its message reworded, so a code that still followed
-- the wording would change.  A code from a peer is believed only when it is
-- one of lecho.errors (else "failed"): a forged reply cannot set another.
--
-- Run: make && LUA_PATH="$PWD/lua/?.lua;$PWD/lua/?/init.lua;;" \
--   LUA_CPATH="$PWD/lua/?.so;;" LECHO_ROOT=$PWD luajit /usr/bin/busted spec/codes_spec.lua

local S = require "spec.support"
local lecho = require "lecho"
local core = require "lecho.core"
local Context = require "lecho.context"

-- Runs fn with every string.format result (and so every ("..."):format)
-- passed through reword; restored after, whatever fn does.
local function with_format(reword, fn)
  local orig = string.format
  string.format = function(...) return reword(orig(...)) end
  local ok, err = pcall(fn)
  string.format = orig
  assert(ok, err)
end

describe("lecho.decode", function()
  it("gives the decoder's code, set where it failed", function()
    local v = assert(lecho.encode({ "abc", k = true }))       -- decodes to 164 bytes
    local r = { lecho.decode(v, { max_value_bytes = 163 }) }
    assert.same({ nil, "value decodes to more than 163 bytes", "limit" }, r)
    r = { lecho.decode(assert(lecho.encode(("x"):rep(10))), { max_string = 9 }) }
    assert.are.equal("limit", r[3])
    r = { lecho.decode(assert(lecho.encode({ { { 1 } } })), { max_depth = 2 }) }
    assert.are.equal("limit", r[3])
    r = { lecho.decode("\255") }                                -- no such tag
    assert.are.equal(nil, r[1])
    assert.are.equal("invalid", r[3])
    r = { lecho.decode(v .. "x") }                              -- trailing bytes
    assert.are.equal("invalid", r[3])
    -- and the core says it itself: three values
    assert.same({ nil, "value decodes to more than 163 bytes", "limit" },
                { core.decode(v, { max_value_bytes = 163 }) })
  end)
end)

describe("a name server's reply", function()
  local ctx
  after_each(function() if ctx then ctx:close() end ctx = nil end)

  it("carries the code its refusal was made with, whatever its text says", function()
    ctx = lecho.context{ quiet = true, channel_quota = 1, timeout = 2 }   -- a name server inside
    assert(ctx:request(ctx.addr, { op = "lookup", ch = "first" }))
    with_format(function(s)
      return (s:gsub("too many", "more than allowed"):gsub("limit", "cap"))
    end, function()
      local r, err, code = ctx:request(ctx.addr, { op = "lookup", ch = "second" })
      assert.is_nil(r)
      assert.matches("more than allowed", err, nil, true)
      assert.are.equal("limit", code)
      -- a bad field: "invalid", though its text says "too many" now
      r, err, code = ctx:request(ctx.addr, { op = "lookup", ch = 7 })
      assert.is_nil(r)
      assert.are.equal("invalid", code, err)
    end)
  end)

  it("cannot set a code that is not one of lecho.errors: a forged one reads 'failed'", function()
    -- a name server that answers every request with a code of its own making
    local addr_file = S.tmpname("forger")
    local child = S.lua(([[
      local lecho = require "lecho"
      local ns = lecho.context{ quiet = true }
      local on_ctrl = ns._on_ctrl
      ns._on_ctrl = function(self, from, msg, gen)
        if msg.op == "gjoin" then     -- taken, so that the group is made
          return self:_send_ctrl(from, { op = "reply", rid = msg.rid, ok = true, epoch = 1, age = 0, ver = 0 })
        end
        if msg.op == "info" then       -- a peer of before codes: none at all
          return self:_send_ctrl(from, { op = "reply", rid = msg.rid, ok = false, err = "old: limit" })
        end
        if msg.rid and msg.op ~= "reply" then
          return self:_send_ctrl(from, { op = "reply", rid = msg.rid, ok = false,
                                         err = "forged: limit refused", code = msg.op == "glist" and "bogus" or "wouldblock2" })
        end
        return on_ctrl(self, from, msg, gen)
      end
      local f = io.open(%q, "w"); f:write(ns.addr, "\n"); f:close()
      ns:run(30)
    ]]):format(addr_file))
    local addr = assert(S.wait_file(addr_file, "\n", 10), "the forger did not start"):match("^(%S+)")
    ctx = lecho.context{ quiet = true, nameserver = addr, timeout = 3 }
    local r, err, code = ctx:request(addr, { op = "lookup", ch = "x" })
    assert.is_nil(r)
    assert.are.equal("forged: limit refused", err)
    assert.are.equal("failed", code)
    r, err, code = ctx:request(addr, { op = "info", ch = "x" })
    assert.is_nil(r)
    assert.are.same({ "old: limit", "failed" }, { err, code })
    -- the group's member list, asked of every name server at once (lecho.group)
    local g = assert(ctx:group("pool"))
    local members, gerr, gcode = g:members()
    assert.is_nil(members)
    assert.matches("forged", gerr, nil, true)
    assert.are.equal("failed", gcode)
    S.cleanup()
    assert.is_true(child ~= nil)
  end)
end)

describe("a request whose connection failed", function()
  local ctx, orig
  before_each(function() orig = Context._fail_pending end)
  after_each(function()
    Context._fail_pending = orig
    if ctx then ctx:close() end
    ctx = nil
    S.cleanup()
  end)

  -- The loss's text reworded on its way from the core to the requests
  -- (from the peer hook, or from a send to an address in backoff)
  local function reword_losses(to)
    Context._fail_pending = function(self, addr, why, ...) return orig(self, addr, to, ...) end
  end

  it("refused: the core's code, not the word", function()
    reword_losses("it went away")
    ctx = lecho.context{ quiet = true, timeout = 3, retry_max = 0.2 }
    local addr = S.refusing_addr()
    local r, err, code = ctx:request(addr, { op = "lookup", ch = "x" })
    assert.is_nil(r)
    assert.matches("it went away", err, nil, true)
    assert.are.equal("refused", code)
    -- again at once: the address is in backoff, the send fails with its code
    r, err, code = ctx:request(addr, { op = "lookup", ch = "y" })
    assert.is_nil(r)
    assert.matches("it went away", err, nil, true)
    assert.are.equal("refused", code)
  end)

  it("closed: the core's code, though the text says refused", function()
    -- a listener that takes each connection and closes it at once
    local port_file = S.tmpname("closer")
    S.lua(([[
      local socket = require "socket"
      local s = assert(socket.bind("127.0.0.1", 0))
      local _, port = s:getsockname()
      local f = io.open(%q, "w"); f:write(port, "\n"); f:close()
      s:settimeout(0.1)
      local t = socket.gettime() + 30
      while socket.gettime() < t do
        local c = s:accept()
        if c then c:close() end
      end
    ]]):format(port_file))
    local port = assert(S.wait_file(port_file, "\n", 10), "the closer did not start"):match("^(%d+)")
    reword_losses("refused: connection refused by peer")
    ctx = lecho.context{ quiet = true, timeout = 3 }
    local r, err, code = ctx:request("127.0.0.1:" .. port, { op = "lookup", ch = "x" })
    assert.is_nil(r)
    assert.matches("refused", err, nil, true)
    assert.are.equal("closed", code)
  end)

  -- A failed dial's code belongs to that dial: a unix socket's dial fails
  -- at once (the sender is told notfound, no loss follows), and a later
  -- connection to the address that comes up and is then lost has its own
  -- code.  Before, the core kept the failed dial's code for the next loss
  -- whenever it came: that later close read "notfound".
  it("closed: a later loss's own code, not the code of a dial that failed before it", function()
    Context._fail_pending = orig
    local addr = "unix:" .. S.tmpname("late") .. ".sock"
    ctx = lecho.context{ quiet = true, timeout = 3, retry_max = 0.2 }
    local downs = {}
    ctx._on_peer = function(self, idx, paddr, up, reason, gen, code, ...)
      if paddr == addr and not up then downs[#downs + 1] = code end
      return Context._on_peer(self, idx, paddr, up, reason, gen, code, ...)
    end
    local r, err, _, unreachable = ctx:request(addr, { op = "lookup", ch = "x" })
    assert.is_nil(r)
    assert.is_true(unreachable, err)
    local _, _, scode = ctx.c:send_ctrl(addr, { op = "x" })  -- in backoff: the failed dial's code
    assert.are.equal("notfound", scode)
    local other = S.lua([[
local lecho = require "lecho"
local ctx = assert(lecho.context{ listen = arg[1], quiet = true })
io.stdout:write("ready\n") io.stdout:flush()
ctx:after(3, function() ctx:stop() end)
ctx:run()
ctx:close()
]], addr)
    assert(S.wait_file(other.out, "ready", 20), S.errors(other))
    -- past the backoff, a request reaches it: the connection is up
    local got
    S.run_until(ctx, function()
      got = got or ctx:request(addr, { op = "lookup", ch = "x" })
      return got ~= nil
    end, 10)
    assert.is_truthy(got, "no request reached the listener: " .. S.errors(other))
    local before = #downs
    -- it closes: the loss is "closed"
    S.run_until(ctx, function() return #downs > before end, 15)
    assert.are.same({ "closed" }, { table.unpack(downs, before + 1) })
  end)
end)

describe("a plain context's replies", function()
  it("carry the code of each refusal: an unknown op, a history request", function()
    local ctx = lecho.context{ quiet = true, nameserver = S.refusing_addr(), timeout = 2 }  -- no registry inside
    local r = { ctx:request(ctx.addr, { op = "no_such_op" }) }
    local h = { ctx:request(ctx.addr, { op = "history", ch = "nope", n = 1 }) }
    local hn = { ctx:request(ctx.addr, { op = "history", ch = "nope", n = 0 }) }
    ctx:close()
    S.cleanup()
    assert.same({ nil, "unknown op 'no_such_op' (this context is not a name server)", "invalid" }, r)
    assert.same({ nil, "history: not a producer of that channel here", "notfound" }, h)
    assert.are.equal("notfound", hn[3])     -- (the channel is looked at first)
  end)
end)

describe("a group at a name server that cannot be reached", function()
  it("is renewed there every 0.5 s, told unreachable by where it failed, not by the words", function()
    local _, ns = S.nameserver("--quiet")
    local down = S.refusing_addr()
    local ctx = lecho.context{ quiet = true, nameserver = { ns, down }, timeout = 2, retry_max = 0.2 }
    local asked = 0
    local request = Context.request
    Context.request = function(self, to, ...)
      if to == down then asked = asked + 1 end
      return request(self, to, ...)
    end
    local ok, err = pcall(with_format, function(s) return (s:gsub(" unreachable: ", " not reached: ")) end,
      function()
        local g = assert(ctx:group("pool", { lease = 30 }))   -- beacons every 10 s
        ctx:sleep(2.2)
        g:leave()
      end)
    Context.request = request
    ctx:close()
    S.cleanup()
    assert(ok, err)
    assert.is_true(asked >= 3, ("asked the unreachable name server %d times in 2.2 s"):format(asked))
  end)
end)

describe("lecho.modulator(file)", function()
  local open = io.open
  after_each(function() io.open = open end)

  it("takes notfound or io from the system's errno, not from the message", function()
    io.open = function() return nil, "cannot be had (reworded)", 2 end          -- ENOENT
    assert.same({ nil, "no such file: gone.lua", "notfound" }, { lecho.modulator("gone.lua") })
    io.open = function() return nil, "No such file or directory, it says", 21 end  -- EISDIR
    assert.same({ nil, "No such file or directory, it says", "io" }, { lecho.modulator("dir.lua") })
    io.open = open
    local r = { lecho.modulator(S.tmpname("none") .. ".lua") }
    assert.are.equal("notfound", r[3])
  end)
end)

describe("the name server's replies", function()
  it("each carry a code set at the call (outbox.fail wants one of lecho.errors)", function()
    local outbox = require "lecho.ns.outbox"
    local sent = {}
    local self = { outq = {}, log = function() end }
    local io_ = { send = function(to, m) sent[#sent + 1] = m end }
    outbox.fail(self, io_, "a", 1, "too many things, managed by someone", "invalid")
    outbox.flush(self)
    assert.same({ { op = "reply", rid = 1, ok = false, err = "too many things, managed by someone", code = "invalid" } },
                sent)
    assert.has_error(function() outbox.fail(self, io_, "a", 2, "no code given") end)
    assert.has_error(function() outbox.fail(self, io_, "a", 3, "a made-up code", "bogus") end)
  end)
end)

describe("the C API (lecho.h)", function()
  -- A C program that opens a producer on each channel named and prints the
  -- code lecho_producer_open returned, its name and lecho_errmsg.
  local SRC = [[
#include <stdio.h>
#include "lecho.h"
int main(int argc, char **argv) {
    const char *opts[] = {"nameserver", argv[1], "quiet", "true", "timeout", "3", NULL};
    lecho_ctx *ctx;
    char err[256];
    if (lecho_open(opts, &ctx, err, sizeof err)) { printf("open failed: %s\n", err); return 1; }
    for (int i = 2; i < argc; i++) {
        lecho_producer *p;
        int rc = lecho_producer_open(lecho_channel_get(ctx, argv[i]), NULL, &p);
        printf("%s %d %s %s\n", argv[i], rc, lecho_strerror(rc), rc ? lecho_errmsg(ctx) : "");
    }
    lecho_close(ctx, 0);
    return 0;
}
]]
  local bin
  setup(function()
    bin = S.capi_program(S.write(S.tmpname("codes_capi") .. ".c", SRC))
  end)
  teardown(function() S.cleanup() end)

  it("gets the name server's code, and 'failed' for a forged one", function()
    -- a name server that refuses the second channel a requester makes
    -- (limit), its messages reworded ("too many" and "limit" gone)
    local ns_file = S.tmpname("ns")
    S.lua(([[
      local format = string.format
      string.format = function(...) return (format(...):gsub("too many", "more than allowed"):gsub("limit", "cap")) end
      local lecho = require "lecho"
      local ns = lecho.context{ quiet = true, channel_quota = 1 }
      local f = io.open(%q, "w"); f:write(ns.addr, "\n"); f:close()
      ns:run(30)
    ]]):format(ns_file))
    local ns = assert(S.wait_file(ns_file, "\n", 10), "the name server did not start"):match("^(%S+)")
    local out = S.sh_out(("%s %s a b"):format(bin, ns))
    assert.matches("\na 0 success", "\n" .. out, nil, true)
    assert.matches("\nb 4 limit name server [^\n]*: lookup: more than allowed channels created by", "\n" .. out)
    -- a name server that answers a lookup with a code of its own making
    local addr_file = S.tmpname("forger")
    S.lua(([[
      local lecho = require "lecho"
      local ns = lecho.context{ quiet = true }
      ns._on_ctrl = function(self, from, msg)
        if msg.rid and msg.op ~= "reply" then
          return self:_send_ctrl(from, { op = "reply", rid = msg.rid, ok = false, err = "forged", code = "notacode" })
        end
      end
      local f = io.open(%q, "w"); f:write(ns.addr, "\n"); f:close()
      ns:run(30)
    ]]):format(addr_file))
    local addr = assert(S.wait_file(addr_file, "\n", 10), "the forger did not start"):match("^(%S+)")
    out = S.sh_out(("%s %s c"):format(bin, addr))
    assert.matches("\nc 11 failed [^\n]*forged", "\n" .. out)
  end)
end)

-- One table of codes (issue 26 review: errors.c, lecho.c's checks and
-- codec_lua.c's enc_code_name were three maps of code to name): the rows of
-- core/base/errors.h's LEI_ERRDEF are lecho.errors.CODES and lecho.h's
-- LECHO_E* codes, both ways, and only errors.c turns a code into its name
-- (every other file asks lei_err_name; core/test/test_errors.c checks each
-- row's code -> name -> code through the built library).
describe("the list of error codes", function()
  local function read(path)
    local f = assert(io.open(S.root .. "/" .. path, "rb"))
    local s = f:read("*a")
    f:close()
    return s
  end
  -- errors.h's rows: { code, name, pub }
  local function rows()
    local out = {}
    local def = assert(read("core/base/errors.h"):match("#define LEI_ERRDEF%(_%)(.-)\n\n"))
    for code, name, rest in def:gmatch('_%((%u+), "(%l+)", "[^"]*"([^)]*)%)') do
      out[#out + 1] = { code = code, name = name, pub = rest:match("^, (E%u+)$") }
    end
    return out
  end

  it("is one: errors.h's rows are lecho.errors.CODES and lecho.h's codes, both ways", function()
    local errors = require "lecho.errors"
    local list = rows()
    assert.is_true(#list >= 15, "rows found in errors.h: " .. #list)
    local names = {}
    local h = read("core/lecho.h")
    for i, r in ipairs(list) do
      names[r.name] = true
      assert.is_string(errors.CODES[r.name], r.name .. " (errors.h) is not in lecho.errors.CODES")
      assert.is_string(r.pub, r.code .. ": no public name in errors.h's row")
      -- lecho.h: LECHO_<pub>, in the same place, says the same name
      local n, said = 0, nil
      for e, s in h:gmatch("\n%s+LECHO_(E%u+),?%s*/%* \"(%l+)\"") do
        n = n + 1
        if n == i then assert.are.equal(r.pub, e); said = s end
      end
      assert.are.equal(r.name, said, "lecho.h's LECHO_" .. r.pub)
      assert.are.equal(#list, n, "lecho.h's codes")
    end
    for name in pairs(errors.CODES) do assert.is_true(names[name], name .. " (lecho.errors) is not in errors.h") end
    -- the core's codec names its failures from the table
    assert.are.same({ nil, "cannot encode a function at ev", "invalid" }, { core.encode(function() end) })
  end)

  it("is turned into names only by errors.c: no other expansion of LEI_ERRDEF into names, no name pushed as a literal", function()
    local names = {}
    for _, r in ipairs(rows()) do names[r.name] = true end
    local bad = {}
    local p = assert(io.popen(("cd '%s' && find core -name '*.c' -not -path 'core/test/*' -not -path 'core/fuzz/*' | sort")
                              :format(S.root)))
    for f in p:lines() do
      local src = read(f)
      -- lecho.c expands it into compile-time checks of numbers, not names
      if src:find("LEI_ERRDEF(", 1, true) and f ~= "core/base/errors.c" and f ~= "core/capi/lecho.c" then
        bad[#bad + 1] = f .. ": LEI_ERRDEF"
      end
      for name in src:gmatch("lua_push%a+%(%s*L%s*,%s*\"(%l+)\"%s*%)") do
        if names[name] then bad[#bad + 1] = f .. ": pushes \"" .. name .. "\"" end
      end
    end
    p:close()
    table.sort(bad)
    assert.are.same({}, bad)
  end)
end)
