-- Read confirmation of async events (issue 28, sixth review, its blocker):
-- a consumer's process SIGSTOPped *after* its connection came up and its
-- first event was read; the producer submits 900 events of 1 KB, all
-- written into the socket (the kernel took them); then the liveness
-- deadline (or the consumer SIGKILLed: a reset) ends the connection.
-- ctx:close() returned true and counted 0 undelivered, though no consumer
-- read those events (close counted only what a queue dropped before it was
-- written).  Now the consumer confirms what it read (CONFIRM_ASK / CONFIRM,
-- doc/protocol.md section 8) and close says what a connection's abnormal
-- end left unconfirmed: nil, "900 events (B bytes) not confirmed: ...",
-- "closed"; the stats count it (`unconfirmed`); a script that ends so exits
-- 1.  A consumer alive and reading: close true, within linger.  Two busy
-- loops run beside every case.
local S = require "spec.support"
local P = require "spec.support.proc"
local lecho = require "lecho"

-- A consumer of "cf.ch" (its own name server elsewhere): writes "got" to
-- arg[2] once it read its first event, then "n N" to arg[3] at each 100th.
local CONSUMER = [[
local lecho = require "lecho"
local ctx = lecho.context{ nameserver = arg[1], quiet = true }
local n = 0
assert(ctx:channel("cf.ch"):consumer(function(ev)
  n = n + 1
  if n == 1 then local f = assert(io.open(arg[2], "w")); f:write("got\n"); f:close() end
end))
local f = assert(io.open(arg[3], "w")); f:write("ready\n"); f:close()
ctx:after(120, function() ctx:stop() end)
ctx:run()
]]

-- The producer of the script case: its first events read and confirmed
-- (said on stdout), then, once the spec stopped the consumer and wrote the
-- file arg[2], 900 events, its loop run until the connection is gone; ends
-- without close.
local PRODUCER = [[
local lecho = require "lecho"
local ctx = lecho.context{ nameserver = arg[1], quiet = true, heartbeat = 0.5, heartbeat_misses = 2 }
local p = assert(ctx:channel("cf.ch"):producer())
local function peer()
  for _, ps in pairs(ctx:stats().peers) do if ps.events_out > 0 then return ps end end
end
local deadline = ctx:now() + 30
repeat p:submit({ i = 0 }); ctx:run_once(0.05)
until (peer() and (peer().confirmed or 1) >= 1) or ctx:now() > deadline
-- all of those first events confirmed (asked about once per heartbeat; a
-- core without read confirmation: a second)
local t1 = ctx:now()
repeat ctx:run_once(0.05)
until (peer().confirmed or (ctx:now() - t1 > 1 and math.huge) or 0) >= peer().events_out or ctx:now() > deadline
io.stdout:write("confirmed ", peer() and peer().confirmed or "(none)", "\n"); io.stdout:flush()
-- the spec stops the consumer, then writes the file arg[2]
while not io.open(arg[2]) and ctx:now() < deadline do ctx:run_once(0.05) end
local pad = ("x"):rep(1000)
for i = 1, 900 do assert(p:submit({ i = i, pad = pad })) end
repeat ctx:run_once(0.05) until not peer().connected or ctx:now() > deadline
io.stdout:write("unconfirmed ", tostring(ctx:stats().unconfirmed), "\n"); io.stdout:flush()
]]

local function busy_loops(n)
  local t = {}
  for i = 1, n do t[i] = S.spawn(("%s -e 'while true do end'"):format(S.luajit)) end
  S.sleep(0.2)
  for i = 1, n do assert(S.alive(t[i]), "busy loop did not start: " .. S.errors(t[i])) end
  return t
end

local function state(pid)
  local s = S.read(("/proc/%d/stat"):format(pid)) or ""
  return s:match("^%d+ %b() (%a)")
end

local function stop(child)
  S.kill(child, "STOP")
  assert(P.wait_until(function() return state(child.pid) == "T" end, 5), "the consumer did not stop")
end

-- The consumer's entry in ctx's stats: the peer events went to.
local function peer_of(ctx)
  for addr, ps in pairs(ctx:stats().peers) do
    if ps.events_out > 0 then return ps, addr end
  end
end

describe("read confirmation of async events", function()
  after_each(function() S.cleanup() end)

  -- The name server, the consumer (running), two busy loops.
  local function world()
    local _, ns = S.nameserver("--quiet")
    local got, ready = S.tmpname("got"), S.tmpname("ready")
    local c = S.lua(CONSUMER, ns, got, ready)
    assert(S.wait_file(ready, "ready", 30), "consumer did not start: " .. S.errors(c))
    busy_loops(2)
    return ns, c, got
  end

  -- A producer of this process whose first event the consumer read and
  -- confirmed (its connection is up, the consumer offered confirmation).
  local function producer(ns, got, opts)
    local o = { nameserver = ns, quiet = true }
    for k, v in pairs(opts or {}) do o[k] = v end
    local ctx = lecho.context(o)
    local p = assert(ctx:channel("cf.ch"):producer())
    assert.is_true(S.run_until(ctx, function()
      p:submit({ i = 0 })
      return S.read(got) == "got\n"
    end, 30), "the consumer did not read a first event")
    -- (a core without read confirmation, the base this spec failed on, has
    -- no `confirmed`: a second's wait there, so that its close is what fails)
    local t0 = ctx:now()
    assert.is_true(S.run_until(ctx, function()
      local ps = peer_of(ctx)
      return ps and (ps.confirmed or (ctx:now() - t0 > 1 and 1) or 0) >= 1
    end, 20), "the first events were not confirmed")
    local ps = peer_of(ctx)
    if ps.confirmed then
      assert.is_true(ps.confirms)
      assert.are.equal(0, ps.unconfirmed)
    end
    return ctx, p
  end

  local function submit900(p)
    local pad = ("x"):rep(1000)
    for i = 1, 900 do assert(p:submit({ i = i, pad = pad })) end
  end

  -- Until all of it is written (the kernel took it: nothing queued).
  local function wait_written(ctx)
    assert.is_true(S.run_until(ctx, function() return peer_of(ctx).queue_events == 0 end, 20),
                   "the 900 events were not all written")
  end

  local function wait_gone(ctx)
    assert.is_true(S.run_until(ctx, function() return not peer_of(ctx).connected end, 30),
                   "the connection did not end")
  end

  local function assert_reported(ok, err, code)
    assert.is_nil(ok, "close returned true though 900 events were never read")
    assert.are.equal("closed", code, err)
    assert.matches("^900 events %(%d+ bytes%) not confirmed: written to a consuming context whose "
                   .. "connection ended before it confirmed reading them", err)
  end

  it("close says so (nil, why, closed) after the liveness deadline ended the connection; stats count them",
     function()
    local ns, c, got = world()
    local ctx, p = producer(ns, got, { heartbeat = 0.5, heartbeat_misses = 2 })
    local before = peer_of(ctx).confirmed
    stop(c)
    submit900(p)
    wait_written(ctx)
    wait_gone(ctx)
    local st = ctx:stats()
    local ps = peer_of(ctx)
    local ok, err, code = ctx:close()
    assert_reported(ok, err, code)
    assert.matches("no heartbeat", err, 1, true)
    assert.matches("no heartbeat", ps.last_error, 1, true)
    assert.are.equal(900, st.unconfirmed)
    assert.is_true(st.unconfirmed_bytes >= 900 * 1000, st.unconfirmed_bytes)
    assert.are.equal(900, ps.unconfirmed)
    assert.are.equal(before, ps.confirmed)
    assert.are.equal(0, st.undelivered) -- written, not dropped from a queue
    -- asked again: the same answer
    assert.are.same({ ok, err, code }, { ctx:close() })
  end)

  it("close says so after the consumer's process was SIGKILLed (the reset)", function()
    local ns, c, got = world()
    local ctx, p = producer(ns, got, { heartbeat = 5 }) -- the deadline (10 s) does not come first
    stop(c)
    submit900(p)
    wait_written(ctx)
    assert.is_true(peer_of(ctx).connected)
    S.kill(c, "KILL")
    wait_gone(ctx)
    local st = ctx:stats()
    assert_reported(ctx:close())
    assert.are.equal(900, st.unconfirmed)
  end)

  it("a consumer stopped when close comes: its linger ends with the count not confirmed (timeout)", function()
    local ns, c, got = world()
    local ctx, p = producer(ns, got, { heartbeat = 5, linger = 1 })
    stop(c)
    submit900(p)
    wait_written(ctx)
    assert.is_true(peer_of(ctx).connected)
    local ok, err, code = ctx:close()
    assert.is_nil(ok)
    assert.are.equal("timeout", code, err)
    assert.matches("^1 connection not closed by its remote within the linger time of 1s: 900 events "
                   .. "%(%d+ bytes%) written there not confirmed read", err)
  end)

  it("a consumer alive and reading: close true, well within linger, nothing unconfirmed", function()
    local ns, _, got = world()
    local ctx, p = producer(ns, got, { linger = 10 })
    submit900(p)
    wait_written(ctx)
    local clock = require("socket").gettime
    local t0 = clock()
    local ok, err = ctx:close()
    assert.is_true(ok, err)
    assert.is_true(clock() - t0 < 5, "close took " .. (clock() - t0) .. " s")
  end)

  it("a consumer alive and reading whose connection then ends in order counts nothing", function()
    local ns, c, got = world()
    local ctx, p = producer(ns, got, { heartbeat = 0.5, heartbeat_misses = 2 })
    submit900(p)
    wait_written(ctx)
    -- read and confirmed within a few heartbeats
    assert.is_true(S.run_until(ctx, function() return (peer_of(ctx).confirmed or 901) >= 901 end, 20),
                   "not confirmed: " .. tostring(peer_of(ctx).confirmed))
    S.kill(c, "TERM") -- (its process ends; the kernel closes the socket)
    wait_gone(ctx)
    assert.are.equal(0, ctx:stats().unconfirmed)
    local ok, err = ctx:close()
    assert.is_true(ok, err)
  end)

  it("a script that ends so (without close) says it on stderr and exits 1", function()
    local ns, c, got = world()
    local go = S.tmpname("go")
    local child = S.lua(PRODUCER, ns, go)
    assert(P.wait_until(function() return S.output(child):match("confirmed %S+") end, 60),
           "producer did not start: " .. S.errors(child))
    assert.are.equal("got\n", S.read(got))
    stop(c)
    S.write(go, "go\n")
    local done, rc = S.wait(child, 60)
    assert(done, "producer did not end: " .. S.errors(child))
    assert.are.equal(1, rc, S.errors(child))
    assert.matches("900 events %(%d+ bytes%) not confirmed", S.errors(child))
    assert.matches("confirmed [1-9]", S.output(child))
    assert.matches("unconfirmed 900", S.output(child), 1, true)
    assert.matches("ctx:close() was not called", S.errors(child), 1, true)
  end)
end)
