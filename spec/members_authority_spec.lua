-- Proves that a producer takes a member list only from its channel's
-- manager, and only a well-formed one (issue 10, protected mode):
--
--   a `members` message forged by another local process (a raw socket that
--   speaks the protocol, advertising an address it listens on) does not make
--   the producer send the channel's events to it, is not confirmed
--   (no members_ok) and is logged once; a list with version 1e300 or any
--   other malformed field, even from the manager's address, is ignored, so
--   it cannot freeze the channel: a consumer that joins later receives.
--
-- The producer is a context of this process (the spec drives its loop); the
-- name server and the legitimate consumers are child processes.
--
-- Run: make && LUA_PATH="$PWD/lua/?.lua;$PWD/lua/?/init.lua;;" \
--   LUA_CPATH="$PWD/lua/?.so;;" LECHO_ROOT=$PWD luajit /usr/bin/busted spec/members_authority_spec.lua

local lecho = require "lecho"
local socket = require "socket"
local cjson = require "cjson"
local S = require "spec.support"
local W = require "spec.wire"
local kids = require "spec.children"

local WAIT = 15

local frames = W.frames

-- A rogue local process: it listens (so that it could be dialled at the
-- address it advertises) and speaks to `target` over a raw socket.
local function rogue(ctx, target)
  local srv = assert(socket.bind("127.0.0.1", 0))
  srv:settimeout(0)
  local _, port = srv:getsockname()
  local claimed = "127.0.0.1:" .. port
  local host, tport = target:match("^(.+):(%d+)$")
  local c = assert(socket.tcp())
  c:settimeout(5)
  assert(c:connect(host, tonumber(tport)))
  c:settimeout(0)
  local r = { srv = srv, c = c, addr = claimed, buf = "", dialled = {} }
  function r.pump()
    repeat
      local data, err, partial = c:receive(65536)
      local got = data or partial
      if got and #got > 0 then r.buf = r.buf .. got end
    until not data or err
    local d = srv:accept()
    if d then r.dialled[#r.dialled + 1] = d end
  end
  function r.send(bytes)
    c:settimeout(5)
    assert(c:send(bytes))
    c:settimeout(0)
  end
  function r.types()
    local seen = {}
    for _, f in ipairs(frames(r.buf)) do seen[f.type] = (seen[f.type] or 0) + 1 end
    return seen
  end
  function r.close()
    c:close()
    srv:close()
    for _, d in ipairs(r.dialled) do d:close() end
  end
  r.send(W.hello(claimed))
  assert(S.run_until(ctx, function()
    r.pump()
    local f = frames(r.buf)[1]
    return f ~= nil
  end, WAIT), "no answer to the rogue's HELLO")
  assert.are.equal(W.HELLO_OK, frames(r.buf)[1].type)
  return r
end

local function ctrl(msg) return W.frame(W.CTRL, assert(lecho.encode(msg))) end

-- The "ev SEQ VALUE" lines of a spec/children.lua sink.
local function received(sink)
  local n = 0
  for _ in (S.read(sink.out) or ""):gmatch("\nev ") do n = n + 1 end
  return n
end

local function start_sink(ctx, ns, name)
  local sink = S.lua(kids.sink, cjson.encode{ ns = ns, channel = name, stop_on = "end", duration = 25 })
  assert(S.run_until(ctx, function() return (S.read(sink.out) or ""):find("ready", 1, true) end, WAIT),
         "consumer did not start: " .. S.errors(sink))
  return sink
end

-- Submits n events, serving the loop between them.
local function produce(ctx, p, n)
  for i = 1, n do
    assert(p:submit({ i = i, secret = "s3cr3t" }))
    ctx:run_once(0.01)
  end
end

describe("issue 10: member lists come only from the channel's manager", function()
  local ctx, logs
  before_each(function()
    logs = {}
  end)
  after_each(function()
    if ctx then ctx:close() end
    ctx = nil
    S.cleanup()
  end)

  local function world()
    local _, ns = S.nameserver("--quiet")
    ctx = lecho.context{ nameserver = ns, log = function(m) logs[#logs + 1] = m end }
    return ns
  end

  local function logged(pat)
    local n = 0
    for _, l in ipairs(logs) do if l:find(pat, 1, true) then n = n + 1 end end
    return n
  end

  it("a members message forged by another local process does not make the producer send to it", function()
    local ns = world()
    local ch = ctx:channel("secret")
    local p = assert(ch:producer())
    local sink = start_sink(ctx, ns, "secret")
    local sink_addr = S.read(sink.out):match("ready (%S+)")
    local r = rogue(ctx, ctx.addr)
    r.send(ctrl{ op = "members", ch = ch.name, ver = 2 ^ 40, mid = 1,
                 consumers = { r.addr, sink_addr } })
    -- a modulator of the attacker's, run by the producer if it took the list
    r.send(ctrl{ op = "members", ch = ch.name, ver = 2 ^ 40 + 1, mid = 2, consumers = {},
                 mods = { k1 = { src = "return { enqueue = function(ev) emit(ev) end }", dests = { r.addr } } } })
    produce(ctx, p, 50)
    assert(p:submit("end"))
    assert(S.run_until(ctx, function() r.pump(); return (S.read(sink.out) or ""):find("\ndone") end, WAIT),
           "the legitimate consumer did not get its events: " .. S.errors(sink))
    S.run_until(ctx, function() r.pump() return false end, 0.5)
    local seen = r.types()
    assert.are.equal(nil, seen[W.BIND], "the producer bound the channel on the rogue's connection")
    assert.are.equal(nil, seen[W.EVENT], "the producer sent events to the rogue")
    assert.are.equal(nil, seen[W.CTRL], "the producer answered the rogue's members (members_ok)")
    assert.are.equal(0, #r.dialled, "the producer dialled the rogue's address")
    assert.are.same({}, ch.mods)
    assert.are.equal(51, received(sink))
    assert.are.equal(1, logged("ignoring a members message from " .. r.addr .. ": not the manager of '"
                               .. ch.name .. "'"), table.concat(logs, "\n"))
    r.close()
  end)

  it("a list with version 1e300, even from the manager's address, does not freeze the channel", function()
    local ns = world()
    local ch = ctx:channel("frozen")
    local p = assert(ch:producer())
    local r = rogue(ctx, ctx.addr)
    r.send(ctrl{ op = "members", ch = ch.name, ver = 1e300, mid = 1, consumers = {} })
    S.run_until(ctx, function() r.pump() return false end, 0.3)
    -- what a process that got hold of the manager's address could say
    local sent = {}
    local real = ctx._send_ctrl
    ctx._send_ctrl = function(self, to, msg)
      if msg.op == "members_ok" then sent[#sent + 1] = msg end
      return real(self, to, msg)
    end
    local ver = ch.ver
    for _, bad in ipairs{ 1e300, 2 ^ 53, -1, 1.5, 0 / 0, 1 / 0, "7" } do
      ctx:_on_ctrl(ch.manager, { op = "members", ch = ch.name, ver = bad, mid = 9, consumers = {} })
    end
    assert.are.equal(ver, ch.ver)
    assert.are.same({}, sent)
    ctx._send_ctrl = real
    local sink = start_sink(ctx, ns, "frozen")
    produce(ctx, p, 20)
    assert(p:submit("end"))
    assert(S.run_until(ctx, function() return (S.read(sink.out) or ""):find("\ndone") end, WAIT),
           "the consumer that joined after the forged lists got nothing: " .. S.errors(sink))
    assert.are.equal(21, received(sink))
    r.close()
  end)

  it("a malformed list from the manager's address is ignored, logged once, not confirmed", function()
    world()
    local ch = ctx:channel("shape")
    assert(ch:producer())
    local sent = {}
    local real = ctx._send_ctrl
    ctx._send_ctrl = function(self, to, msg)
      if msg.op == "members_ok" then sent[#sent + 1] = msg end
      return real(self, to, msg)
    end
    local ver, dests = ch.ver, ch.dests
    local mgr = ch.manager
    for _, m in ipairs{
      { consumers = "127.0.0.1:9" },
      { consumers = { 1, 2 } },
      { consumers = { [1] = "127.0.0.1:9", [3] = "127.0.0.1:10" } },
      { consumers = { ("x"):rep(200) } },
      { consumers = {}, mods = "x" },
      { consumers = {}, mods = { k = { src = 1 } } },
      { consumers = {}, mods = { k = { src = "", period = 0 } } },
      { consumers = {}, mods = { k = { src = "", caps = { 1 } } } },
      { consumers = {}, mods = { k = { src = "", dests = { false } } } },
      { consumers = {}, mods = { [("k"):rep(65)] = { src = "" } } },
    } do
      m.op, m.ch, m.ver, m.mid = "members", ch.name, 2 ^ 40, 1
      ctx:_on_ctrl(mgr, m)
    end
    assert.are.equal(ver, ch.ver)
    assert.are.equal(dests, ch.dests)
    assert.are.same({}, sent)
    assert.are.equal(1, logged("ignoring a members message from " .. mgr), table.concat(logs, "\n"))
    -- the manager's own well-formed list still applies and is confirmed
    ctx:_on_ctrl(mgr, { op = "members", ch = ch.name, ver = 2 ^ 40, mid = 2, consumers = {} })
    assert.are.equal(2 ^ 40, ch.ver)
    assert.are.equal(1, #sent)
    ctx._send_ctrl = real
  end)

  it("stream_end speaks for its sender, never for the producer it names; mod_error only from a bound producer", function()
    world()
    local ch = ctx:channel("said")
    local told, ended = {}, {}
    assert(ch:consumer(function() end, { modulator = "function enqueue(ev) return ev end",
                                         on_error = function(e) told[#told + 1] = e end }))
    local key = next(ch.streams)
    assert.is_string(key)
    local real = ch._stream_ended
    ch._stream_ended = function(self, k, producer) ended[#ended + 1] = producer; return real(self, k, producer) end
    local rogue_addr, victim = "127.0.0.1:9", "127.0.0.1:10"
    ctx:_on_ctrl(rogue_addr, { op = "stream_end", ch = ch.name, key = key, producer = victim })
    ctx:_on_ctrl(rogue_addr, { op = "mod_error", ch = ch.name, key = key, producer = victim, err = "boom" })
    assert.are.same({ rogue_addr }, ended)
    -- a mod_error needs more: its sender must have the channel bound here
    -- (a producer of it for this context; this peer bound nothing), else it
    -- is ignored (issue 23; a real producer's: spec/trust_reload_spec.lua)
    assert.are.same({}, told)
  end)
end)
