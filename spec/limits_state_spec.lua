-- Proves the limits on the state peers can make a context keep (issue 11,
-- "channels ... freed when nothing uses them", "maximum channels ... in
-- total"):
--
--   a BIND no longer opens a channel (protected mode as keyed mode): one
--   naming a channel not open here maps its index to "not here", events on
--   it are dropped and counted and a sync one is answered with the reason;
--   past 256 such BINDs the connection is closed with that reason.  So
--   200,000 BINDs with distinct names (which kept 67 MiB after the
--   connection closed) cost the target almost nothing, while a legitimate
--   flow beside them delivers every event.  max_channels bounds the
--   channels a context opens (ctx:channel, derived streams): nil, "too many
--   channels (limit N)", "limit".
--
-- Run: make && LUA_PATH="$PWD/lua/?.lua;$PWD/lua/?/init.lua;;" \
--   LUA_CPATH="$PWD/lua/?.so;;" LECHO_ROOT=$PWD luajit /usr/bin/busted spec/limits_state_spec.lua

local lecho = require "lecho"
local cjson = require "cjson"
local R = require "spec.support.rogue"
local S = require "spec.support"
local kids = require "spec.children"

local WAIT = 20

-- Resident memory of process pid, in bytes.
local function rss(pid)
  local s = assert(S.read("/proc/" .. pid .. "/status"))
  return tonumber(s:match("VmRSS:%s*(%d+) kB")) * 1024
end

-- The attacker as a child process: dials opts.target, BINDs index 0 to a
-- channel not open there and sends an async and a sync EVENT on it, then
-- BINDs index 1 to opts.here (open there) and sends opts.n events on it;
-- then opts.junk more BINDs with distinct names.  Prints "ack NRAN ERR" for
-- the sync event's ACK and "error TEXT" for the ERROR that closes it.
local ATTACKER = [[
package.path = os.getenv("LECHO_ROOT") .. "/?.lua;" .. package.path
local cjson = require "cjson"
local R = require "spec.support.rogue"
local opts = cjson.decode(arg[1])
io.stdout:setvbuf("line")
local p = assert(R.dial(opts.target, { addr = "127.0.0.1:9" }))
assert(p:send(R.bind(0, opts.nothere) .. R.event(0, 1, 1, 0, "dropped") .. R.event(0, 1, 2, 7, "sync")))
local body = assert(p:expect(R.F.ACK, 10))
local a = assert(R.parse_ack(body))
io.stdout:write("ack ", a.nran, " ", tostring(a.errs and a.errs[1] and a.errs[1].err), "\n")
local out = { R.bind(1, opts.here) }
for i = 1, opts.n do out[#out + 1] = R.event(1, 1, i, 0, { i = i }) end
assert(p:send(table.concat(out)))
out = {}
for i = 2, opts.junk + 1 do out[#out + 1] = R.bind(i, "junk/" .. i) end
p:send(table.concat(out))
local r = p:drain(10)
io.stdout:write("error ", tostring(r.error), "\n")
p:close()
]]

-- Connections from opts.n distinct claimed addresses (127.0.0.1:opts.base + i),
-- each a handshake and a close: opts.n peer records at the target.
local MANY_PEERS = [[
package.path = os.getenv("LECHO_ROOT") .. "/?.lua;" .. package.path
local cjson = require "cjson"
local R = require "spec.support.rogue"
local opts = cjson.decode(arg[1])
io.stdout:setvbuf("line")
for i = 1, opts.n do
  local p = assert(R.dial(opts.target, { addr = "127.0.0.1:" .. (opts.base + i) }))
  p:close()
end
io.stdout:write("done\n")
]]

describe("issue 11: state a peer can make a context keep", function()
  local ctx
  after_each(function()
    if ctx then ctx:close() end
    ctx = nil
    S.cleanup()
  end)

  it("a BIND for a channel not open here opens none: its events dropped and counted, a sync one answered", function()
    local logs = {}
    ctx = lecho.context{ log = function(m) logs[#logs + 1] = m end }
    local got = {}
    assert(ctx:channel("here"):consumer(function(ev) got[#got + 1] = ev.i end))
    local here = ctx:channel("here").name
    local before = ctx:stats()
    local atk = S.lua(ATTACKER, cjson.encode{ target = ctx.addr, nothere = "nothere", here = here,
                                              n = 100, junk = 300 })
    assert(S.run_until(ctx, function() return (S.read(atk.out) or ""):find("\nerror ") end, WAIT),
           "the attacker did not finish: " .. S.output(atk) .. S.errors(atk))
    local out = S.read(atk.out)
    assert.truthy(out:find("ack 0 no channel nothere open here\n", 1, true), out)
    assert.truthy(out:find("error too many refused channel bindings (limit 256)\n", 1, true), out)
    -- the legitimate events on the open channel, every one, in order
    assert(S.run_until(ctx, function() return #got == 100 end, WAIT), "got " .. #got)
    for i = 1, 100 do assert.are.equal(i, got[i]) end
    local st = ctx:stats()
    local n0, n1 = 0, 0
    for _ in pairs(before.channels) do n0 = n0 + 1 end
    for _ in pairs(st.channels) do n1 = n1 + 1 end
    assert.are.equal(n0, n1)
    assert.is_nil(st.channels.nothere)
    assert.are.equal(2, st.peers["127.0.0.1:9"].refused)
    local n = 0
    for _, m in ipairs(logs) do
      if m:find("dropping events of nothere from 127.0.0.1:9: no such channel open here", 1, true) then n = n + 1 end
    end
    assert.are.equal(1, n, table.concat(logs, "\n"))
  end)

  it("200,000 BINDs with distinct names: the connection is closed, the target's memory stays bounded", function()
    local ns, addr = S.nameserver("--quiet")
    local rss0 = rss(ns.pid)
    local function binds(from, n)
      local out = {}
      for i = from, from + n - 1 do
        out[#out + 1] = R.bind(i - from, ("junk/%07d/%s"):format(i, ("x"):rep(40)))
      end
      return table.concat(out)
    end
    -- the first connection is told why it is closed
    local p = assert(R.dial(addr, { addr = "127.0.0.1:9" }))
    assert(p:send(binds(0, 300)))
    assert.are.equal("too many refused channel bindings (limit 256)", p:drain(10).error)
    p:close()
    -- the others send 1000 each, 200,000 in all (the rest of each is cut short)
    for from = 300, 199999, 1000 do
      p = assert(R.dial(addr, { addr = "127.0.0.1:9" }))
      p:send(binds(from, math.min(1000, 200000 - from)))
      p:drain(0.05)
      p:close()
    end
    -- the name server still answers, and kept next to nothing
    local q = assert(R.dial(addr, { addr = "127.0.0.1:10" }))
    q:ctrl{ op = "lookup", ch = "x", rid = 1 }
    assert.is_true(assert(q:reply(1, 10)).ok)
    q:close()
    local grew = rss(ns.pid) - rss0
    assert.is_true(grew < (16 * 1024 + S.MEM_SLACK_KIB) * 1024, ("the name server grew by %.1f MiB"):format(grew / 2 ^ 20))
  end)

  it("peers nothing uses are freed (300 claimed addresses), the legitimate flow unaffected", function()
    local _, ns = S.nameserver("--quiet")
    -- freed 3 s after their last use here (the default, 30 s, is the
    -- option's default: option_values_spec): the 30 s wait proved no more
    ctx = lecho.context{ nameserver = ns, quiet = true, peer_free_after = 3 }
    local got = {}
    assert(ctx:channel("x"):consumer(function(ev, meta) got[#got + 1] = meta.producer end))
    local function npeers()
      local n = 0
      for _ in pairs(ctx:stats().peers) do n = n + 1 end
      return n
    end
    local base = npeers()
    local atk = S.lua(MANY_PEERS, cjson.encode{ target = ctx.addr, n = 300, base = 20000 })
    assert(S.run_until(ctx, function() return (S.read(atk.out) or ""):find("done") end, WAIT),
           "the attacker did not finish: " .. S.errors(atk))
    assert(S.run_until(ctx, function() return npeers() >= base + 300 end, 5), "peers: " .. npeers())
    -- 3 s after their connections ended, and nothing else uses them (not before 2 s)
    local t_done = ctx:now()
    assert(S.run_until(ctx, function() return npeers() <= base end, 15), "peers left: " .. npeers())
    assert.is_true(ctx:now() - t_done >= 2, "peers freed before peer_free_after")
    -- a producer coming now (its peer may take a freed number) is named right
    local pub = S.lua(kids.short_publisher, cjson.encode{ ns = ns, channel = "x", n = 50 })
    assert(S.run_until(ctx, function() return #got == 50 end, WAIT), "got " .. #got .. S.errors(pub))
    local who = got[1]:match("^(.*)#%d+$")
    assert.is_truthy(ctx:stats().peers[who], who)
    for i = 2, 50 do assert.are.equal(got[1], got[i]) end
  end)

  it("lecho-nameserver --max-connections N: the connection past N is refused with the reason", function()
    local _, addr = S.nameserver("--quiet --max-connections 3")
    local held = {}
    for i = 1, 3 do held[i] = assert(R.dial(addr, { addr = "127.0.0.1:" .. (20400 + i) })) end
    local p, err = R.dial(addr, { addr = "127.0.0.1:20404" })
    assert.is_nil(p)
    assert.are.equal("ERROR: too many connections (limit 3)", err)
    -- one goes: there is room again, and the name server answers
    held[1]:close()
    local q
    for _ = 1, 50 do
      q = R.dial(addr, { addr = "127.0.0.1:20405" })
      if q then break end
      S.sleep(0.1)
    end
    assert(q, "no room after a connection closed")
    q:ctrl{ op = "lookup", ch = "x", rid = 1 }
    assert.is_true(assert(q:reply(1, 10)).ok)
    q:close()
    for i = 2, 3 do held[i]:close() end
    local out = S.sh_out(("%s %s/scripts/lecho-nameserver --max-connections 0")
                         :format(S.luajit, S.root))
    assert.are.equal("lecho-nameserver: --max-connections needs a whole number >= 1, not '0'\nrc=2\n", out)
  end)

  it("max_channels bounds the channels a context opens: nil, 'too many channels (limit N)', 'limit'", function()
    ctx = lecho.context{ max_channels = 3, quiet = true }
    assert(ctx:channel("a"))
    assert(ctx:channel("b"))
    assert(ctx:channel("c"))
    assert(ctx:channel("a"))          -- open already: no new one
    local ch, err, code = ctx:channel("d")
    assert.is_nil(ch)
    assert.are.equal("too many channels (limit 3)", err)
    assert.are.equal("limit", code)
    -- a consumer's modulated stream is a channel too
    local c
    c, err, code = ctx:channel("a"):consumer(function() end,
                                             { modulator = "return { enqueue = function(ev) emit(ev) end }" })
    assert.is_nil(c)
    assert.are.equal("too many channels (limit 3)", err)
    assert.are.equal("limit", code)
    assert.are.equal(0, #ctx:channel("a").all)
    assert.has_error(function() lecho.context{ max_channels = 0 } end,
                     "lecho.context: max_channels must be an integer from 1 to 2^53")
  end)
end)
