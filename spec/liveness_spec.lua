-- Liveness on loopback: heartbeats, dead peers, redials with backoff, and the
-- per-producer sequence checks that make a reconnect neither repeat nor
-- silently skip events.  (spec/netns_spec.lua does the same across real
-- links between network namespaces.)
--
-- Run: make && LUA_PATH="$PWD/lua/?.lua;$PWD/lua/?/init.lua;;" \
--   LUA_CPATH="$PWD/lua/?.so;;" LECHO_ROOT=$PWD luajit /usr/bin/busted spec/liveness_spec.lua

local cjson = require "cjson"
local lecho = require "lecho"
local socket = require "socket"
local S = require "spec.support"

local HB = 0.25 -- heartbeat of the contexts here: dead after 2 * HB

-- A consumer process: records every seq per producer, stops on ev == "done"
-- and prints one JSON line with what it saw, its stats and its log.
local CONSUMER = [[
local cjson = require "cjson"
local lecho = require "lecho"
local a = cjson.decode(arg[1])
local logs = {}
local ctx = lecho.context{ nameserver = a.ns, heartbeat = a.hb, log = function(m)
  logs[#logs + 1] = m
  io.stderr:write(m, "\n")
end }
local res = { count = 0, dups = 0, back = 0, missing = 0, first = {}, last = {} }
local ch = ctx:channel(a.ch)
assert(ch:consumer(function(ev, meta)
  if ev == "done" then ctx:stop() return end
  res.count = res.count + 1
  local l = res.last[meta.producer]
  if l then
    if meta.seq == l then res.dups = res.dups + 1 end
    if meta.seq < l then res.back = res.back + 1 end
    if meta.seq > l + 1 then res.missing = res.missing + (meta.seq - l - 1) end
  else
    res.first[meta.producer] = meta.seq
  end
  res.last[meta.producer] = meta.seq
end))
io.stdout:write("ready ", ctx.addr, "\n") io.stdout:flush()
ctx:after(a.duration or 30, function() res.timeout = true ctx:stop() end)
ctx:run()
local st = ctx:stats()
res.chan = st.channels[ch.name]
res.peers = st.peers
res.logs = logs
io.stdout:write(cjson.encode(res), "\n") io.stdout:flush()
ctx:close()
]]

-- ctx (the name server) runs its loop meanwhile: a context that does not
-- would be declared dead by the child (no handshake within 2 * HB).
local function start_consumer(ctx, hb, ch)
  local child = S.lua(CONSUMER, cjson.encode{ ns = ctx.addr, hb = hb, ch = ch or "live" })
  local out
  S.run_until(ctx, function()
    out = S.read(child.out)
    return out and out:match("ready %S+")
  end, 20)
  assert(out and out:match("ready %S+"), "consumer did not start: " .. S.errors(child))
  child.addr = out:match("ready (%S+)")
  return child
end

local function result(child, ctx)
  assert(S.wait(child, 30, ctx), "child did not finish: " .. S.errors(child))
  local line = S.output(child):match("\n({.*})")
  assert(line, "no result: " .. S.output(child) .. S.errors(child))
  return cjson.decode(line)
end

local function find(logs, pat)
  for i, m in ipairs(logs) do if m:find(pat) then return m, i end end
end

describe("liveness", function()
  local ctx, logs
  local function mklog()
    logs = {}
    return function(m) logs[#logs + 1] = { t = ctx and ctx:now() or 0, m = m } end
  end
  local function logged(pat)
    for _, e in ipairs(logs) do if e.m:find(pat) then return e end end
  end

  after_each(function()
    if ctx then ctx:close() end
    ctx = nil
    S.cleanup()
  end)

  it("declares a SIGSTOPped consumer dead within two intervals, fails its sync wait with the reason, and takes it back after SIGCONT", function()
    ctx = lecho.context{ heartbeat = HB, log = mklog() }
    local ch = ctx:channel("live")
    local p = assert(ch:producer())
    local c = start_consumer(ctx, HB)
    for i = 1, 50 do assert(p:submit(i)) end
    assert.is_true(p:submit_sync(51, { timeout = 5 }))
    S.kill(c, "STOP")
    local t0 = ctx:now()
    local ok, errs, code = p:submit_sync(52, { timeout = 5 })
    local took = ctx:now() - t0
    assert.is_nil(ok)
    -- a lost peer is "closed", whether it exited or went silent
    assert.are.same({ "closed", "closed" }, { code, errs[1].code })
    local e = tostring(errs)
    assert.truthy(e:find("no heartbeat from " .. c.addr:gsub("%p", "%%%0") .. " for 0%.%d s"), e)
    -- silence counts from the last frame it sent (the ack of 51, just
    -- before the stop): dead 2 * HB later, give or take a loop turn
    assert.is_true(took >= 1.5 * HB and took <= 2 * HB + 0.15, "detected after " .. took .. " s")
    print(("\n  SIGSTOP: declared dead %.3f s after the stop (heartbeat %g s, misses 2)"):format(took, HB))
    assert.are.equal(1, ctx:stats().peers[c.addr].heartbeat_timeouts)
    -- it left the membership: submits go nowhere (and are not waited for)
    assert(S.run_until(ctx, function() return ctx:stats().channels[ch.name].destinations == 0 end, 5))
    for i = 53, 80 do assert(p:submit(i)) end
    assert(p:submit(81))
    -- (no consumer anywhere now: issue 12 made a sync submit "noconsumer",
    -- not true; it sends nothing and takes no sequence number)
    assert.are.equal("noconsumer", select(3, p:submit_sync("none", { timeout = 5 })))
    -- back: it rejoins (dialling again) and receives again
    S.kill(c, "CONT")
    assert(S.run_until(ctx, function() return ctx:stats().channels[ch.name].destinations == 1 end, 10),
           "the consumer did not come back")
    for i = 82, 100 do assert(p:submit(i)) end
    assert.is_true(p:submit_sync(101, { timeout = 5 }))
    assert(p:submit("done"))
    p:flush()
    local r = result(c, ctx)
    assert.are.equal(0, r.dups)
    assert.are.equal(0, r.back)
    -- what it missed while out is a counted, logged gap, never silence
    assert.is_true(r.missing > 0)
    assert.are.equal(r.missing, r.chan.lost)
    assert.is_true(r.chan.gaps >= 1)
    assert.are.equal(0, r.chan.duplicates)
    assert.truthy(find(r.logs, "^gap from 127%.0%.0%.1:%d+#1 on .-: %d+ events? lost %(seq %d+%.%.%d+%)"),
                  table.concat(r.logs, "\n"))
    assert.are.equal(101 - r.count - (next(r.first) and r.first[next(r.first)] - 1 or 0), r.missing)
  end)

  it("closes a connection that stays silent, and one whose handshake never comes", function()
    ctx = lecho.context{ heartbeat = HB, log = mklog() }
    -- a raw client that says HELLO and then nothing
    local host, port = ctx.addr:match("^(.+):(%d+)$")
    local s = assert(socket.tcp())
    assert(s:connect(host, tonumber(port)))
    local fake = "127.0.0.1:61999"
    local hello = require("spec.wire").hello(fake, { incarnation = 7 })
    assert(s:send(hello))
    s:settimeout(0)
    local buf, t0 = "", ctx:now()
    local pings = 0
    assert(S.run_until(ctx, function()
      local d, err, part = s:receive(4096)
      buf = buf .. (d or part or "")
      return err == "closed"
    end, 5), "the silent peer was not closed")
    local took = ctx:now() - t0
    -- HELLO_OK, then HEARTBEATs (type 8, empty) and PINGs (9), then the close
    local pos = 1
    while pos + 4 <= #buf do
      local len = buf:byte(pos) + buf:byte(pos + 1) * 256
      if buf:byte(pos + 4) == 9 then pings = pings + 1 end
      pos = pos + 4 + len
    end
    assert.is_true(pings >= 1, "no PING before the close")
    -- not before two heartbeats; after them by a turn or two (wider on a
    -- loaded machine: 0.654 s was seen at load 12 with HB 0.25)
    assert.is_true(took >= 2 * HB - 0.05 and took <= 2 * HB + 0.5, took)
    assert.truthy(logged("no heartbeat from 127%.0%.0%.1:61999 for 0%.%d s"))
    s:close()
    -- a peer that accepts but never answers the handshake (a stopped process)
    local c = S.lua([[
      local ctx = require("lecho").context{ quiet = true }
      io.stdout:write("addr ", ctx.addr, "\n") io.stdout:flush()
      ctx:run_once(60)
    ]])
    local addr = S.wait_file(c.out, "addr %S+", 10):match("addr (%S+)")
    S.kill(c, "STOP")
    t0 = ctx:now()
    local ok, err = ctx:request(addr, { op = "ping" }, 5)
    took = ctx:now() - t0
    S.kill(c, "KILL")
    assert.is_nil(ok)
    assert.truthy(err:find("no handshake within"), err)
    assert.is_true(took <= 2 * HB + 0.15, took)
  end)

  it("sends no heartbeat on a connection that carries traffic both ways, a few on an idle one", function()
    ctx = lecho.context{ heartbeat = HB, quiet = true }
    local ch = ctx:channel("live")
    local p = assert(ch:producer())
    local c = start_consumer(ctx, HB)
    assert.is_true(p:submit_sync(0, { timeout = 5 }))
    local function hb()
      local st = ctx:stats().peers[c.addr]
      return st.heartbeats_out, st.heartbeats_in
    end
    -- 2 s of sync submits: acks come back all the time
    local o0, i0 = hb()
    local t0, n = ctx:now(), 0
    while ctx:now() - t0 < 2 do
      n = n + 1
      assert.is_true(p:submit_sync(n, { timeout = 5 }))
    end
    local o1, i1 = hb()
    print(("\n  busy 2 s: %d sync events, heartbeats out %d, in %d"):format(n, o1 - o0, i1 - i0))
    assert.is_true(n > 500, n)
    assert.are.equal(0, o1 - o0)
    assert.are.equal(0, i1 - i0)
    -- 2 s idle: about one HEARTBEAT per HB each way
    assert(S.run_until(ctx, function() return ctx:now() - t0 >= 4 end, 5) or true)
    local o2, i2 = hb()
    print(("  idle 2 s: heartbeats out %d, in %d"):format(o2 - o1, i2 - i1))
    assert.is_true(o2 - o1 + i2 - i1 >= 2 / HB - 1, "too few heartbeats when idle")
    assert.is_true(o2 - o1 + i2 - i1 <= 2 * (2 / HB + 2), "too many heartbeats when idle")
    assert.are.equal(0, ctx:stats().peers[c.addr].heartbeat_timeouts)
    assert(p:submit("done"))
    p:flush()
    local r = result(c, ctx)
    assert.are.equal(0, r.missing)
    assert.are.equal(0, r.chan.gaps)
  end)

  it("redials an unreachable peer with exponential backoff, capped at retry_max", function()
    ctx = lecho.context{ heartbeat = HB, retry_interval = 0.1, retry_max = 0.4, log = mklog() }
    local addr = S.refusing_addr() -- a port nobody listens on
    local t0, attempts = ctx:now(), 0
    while ctx:now() - t0 < 2 do
      ctx:_send_ctrl(addr, { op = "ping" })
      ctx:run_once(0.01)
    end
    -- (counted by the peer: "cannot reach" is logged once per 10 s, issue 11)
    attempts = ctx:stats().peers[addr].dials
    -- 0, 0.1, 0.3, 0.7, 1.1, 1.5, 1.9: 7 dials (not 200, nor 20 at a fixed 0.1 s)
    print(("\n  backoff 0.1 s doubling to 0.4 s: %d dials in 2 s"):format(attempts))
    assert.is_true(attempts >= 5 and attempts <= 8, attempts)
  end)
end)

describe("sequence numbers", function()
  -- Raw frames into a context: a fake producer process at one address.
  local ctx, got, logs, con

  local W = require "spec.wire"
  local varint, frame = W.varint, W.frame
  local FAKE = "127.0.0.1:61888"
  local function peer(incarnation)
    local host, port = ctx.addr:match("^(.+):(%d+)$")
    local s = assert(socket.tcp())
    assert(s:connect(host, tonumber(port)))
    assert(s:send(W.hello(FAKE, { incarnation = incarnation })))
    return s
  end
  local nil_value = "\0" -- the codec's nil
  local function ev(s, chidx, producer, seq)
    assert(s:send(frame(6, varint(chidx) .. varint(producer) .. varint(seq) .. varint(0) .. nil_value)))
  end
  local function settle(n)
    S.run_until(ctx, function() return #got >= n end, 2)
    ctx:run_once(0.05)
  end

  before_each(function()
    logs, got = {}, {}
    ctx = lecho.context{ heartbeat = 0, log = function(m) logs[#logs + 1] = m end }
    con = assert(ctx:channel("seq"):consumer(function(_, meta) got[#got + 1] = meta.seq end))
  end)
  after_each(function() ctx:close() end)

  it("delivers in order, drops duplicates, reports a gap once with its count", function()
    local s = peer(1)
    local name = ctx:channel("seq").name
    assert(s:send(W.bind(0, name)))
    for _, q in ipairs{ 1, 2, 3, 3, 2, 10, 11, 48, 49 } do ev(s, 0, 7, q) end
    settle(7)
    assert.are.same({ 1, 2, 3, 10, 11, 48, 49 }, got)
    local st = ctx:stats()
    assert.are.same({ 2, 6 + 36, 2 }, { st.channels[name].gaps, st.channels[name].lost,
                                         st.channels[name].duplicates })
    assert.are.same({ 2, 42, 2 }, { st.peers[FAKE].gaps, st.peers[FAKE].lost, st.peers[FAKE].duplicates })
    local text = table.concat(logs, "\n")
    assert.truthy(text:find("gap from 127.0.0.1:61888#7 on " .. name .. ": 6 events lost (seq 4..9)", 1, true), text)
    assert.truthy(text:find("gap from 127.0.0.1:61888#7 on " .. name .. ": 36 events lost (seq 12..47)", 1, true), text)
    s:close()
  end)

  it("keys by incarnation: a restarted producer at the same address starts at 1 without a gap, a reconnect of the same one continues", function()
    local name = ctx:channel("seq").name
    local function session(inc, seqs)
      local s = peer(inc)
      assert(s:send(W.bind(0, name)))
      for _, q in ipairs(seqs) do ev(s, 0, 1, q) end
      settle(#got + #seqs)
      s:close()
      S.run_until(ctx, function() return not ctx:stats().peers[FAKE].connected end, 2)
    end
    session(100, { 1, 2, 3 })
    session(200, { 1, 2 })         -- a new process: not duplicates
    session(200, { 5, 6 })         -- the same process reconnected: 3 and 4 were lost
    assert.are.same({ 1, 2, 3, 1, 2, 5, 6 }, got)
    local st = ctx:stats().channels[name]
    assert.are.same({ 1, 2, 0 }, { st.gaps, st.lost, st.duplicates })
  end)

  it("does not count as a gap what was sent while this process had no consumer", function()
    local name = ctx:channel("seq").name
    local s = peer(1)
    assert(s:send(W.bind(0, name)))
    ev(s, 0, 1, 1)
    settle(1)
    con:close()
    ev(s, 0, 1, 2)
    ctx:run_once(0.1)
    con = assert(ctx:channel("seq"):consumer(function(_, meta) got[#got + 1] = meta.seq end))
    ev(s, 0, 1, 9)
    settle(2)
    assert.are.same({ 1, 9 }, got)
    assert.are.equal(0, ctx:stats().channels[name].gaps)
    s:close()
  end)
end)
