-- ctx:close() and the program's end report the async events a connection's
-- end dropped (issue 28, fifth review B): a consumer's process SIGSTOPped,
-- a producer (queue_limit 1 MiB, policy "block") submits 900 events of
-- 1 KB, which wait in its queue for the stopped process; then the
-- connection goes (the handshake deadline, or the consumer SIGKILLed), which
-- drops the queue (counted in `drops`).  ctx:close() then found nothing
-- queued and returned true, and a script ending so exited 0: 900 events lost
-- and nobody told (Python's close raised "901 events not delivered" only when
-- its close came before the connection went).  Now close returns nil, the
-- count and why, code "closed"; the stats count them (`undelivered`: per
-- peer, per channel, the context); a script that ends so exits 1.  A queue
-- policy the user chose (disconnect) is a drop, not undelivered.  Two busy
-- loops run beside every case.
local S = require "spec.support"
local lecho = require "lecho"

-- A consumer of "cl.ch" with its own name server elsewhere: the producer
-- dials this process only for the events.  Writes "ready" once joined.
local CONSUMER = [[
local lecho = require "lecho"
local ctx = lecho.context{ nameserver = arg[1], quiet = true }
local n = 0
assert(ctx:channel("cl.ch"):consumer(function(ev) n = n + 1 end))
local f = assert(io.open(arg[2], "w")); f:write("ready\n"); f:close()
ctx:after(120, function() ctx:stop() end)
ctx:run()
]]

-- The producer of the script case: like the spec's, then it runs its loop
-- until the connection is gone (the queue dropped) and ends without close.
local PRODUCER = [[
local lecho = require "lecho"
local ctx = lecho.context{ nameserver = arg[1], quiet = true, queue_limit = 1048576, handshake_timeout = 1 }
local p = assert(ctx:channel("cl.ch"):producer{ policy = "block" })
local pad = ("x"):rep(1000)
for i = 1, 900 do assert(p:submit({ i = i, pad = pad })) end
io.stdout:write("submitted\n"); io.stdout:flush()
local function dropped()
  local n = 0
  for _, ps in pairs(ctx:stats().peers) do n = n + ps.drops end
  return n
end
local deadline = ctx:now() + 20
repeat ctx:run_once(0.05) until dropped() >= 900 or ctx:now() > deadline
io.stdout:write("dropped ", dropped(), " undelivered ", tostring(ctx:stats().undelivered), "\n")
]]

describe("events a connection's end dropped", function()
  after_each(function() S.cleanup() end)

  -- The name server, the consumer (stopped), two busy loops.
  local function world()
    local _, ns = S.nameserver("--quiet")
    local file = S.tmpname("ready")
    local c = S.lua(CONSUMER, ns, file)
    assert(S.wait_file(file, "ready", 30), "consumer did not start: " .. S.errors(c))
    S.busy_loops(2)
    S.sigstop(c, "the consumer")
    return ns, c
  end

  -- A producer of this process, 900 x 1 KB queued for the stopped consumer.
  local function produce(ns, opts)
    local o = { nameserver = ns, quiet = true, queue_limit = 1048576, handshake_timeout = 1 }
    for k, v in pairs(opts or {}) do o[k] = v end
    local ctx = lecho.context(o)
    local p = assert(ctx:channel("cl.ch"):producer{ policy = "block" })
    local pad = ("x"):rep(1000)
    for i = 1, 900 do assert(p:submit({ i = i, pad = pad })) end
    return ctx, p
  end

  -- Until the connection went and its queue with it (counted in drops).
  local function wait_dropped(ctx)
    local function dropped()
      local n = 0
      for _, ps in pairs(ctx:stats().peers) do n = n + ps.drops end
      return n
    end
    assert.is_true(S.run_until(ctx, function() return dropped() >= 900 end, 20),
                   "the connection did not end: " .. require("cjson").encode(ctx:stats().peers))
  end

  -- The consumer's peer entry in stats st: the one that queued or lost events.
  local function peer_of(st)
    for addr, ps in pairs(st.peers) do
      if (ps.undelivered or 0) > 0 or ps.queue_events > 0 then return addr, ps end
    end
  end

  local function assert_reported(ctx, ok, err, code)
    assert.is_nil(ok, "close returned true with 900 events lost")
    assert.are.equal("closed", code, err)
    assert.matches("^900 events %(%d+ bytes%) not delivered: lost with a connection", err)
  end

  it("close says so (nil, why, closed) after the handshake deadline dropped them; stats count them", function()
    local ns = world()
    local ctx = produce(ns)
    wait_dropped(ctx)
    local st = ctx:stats()
    local ok, err, code = ctx:close()
    assert_reported(ctx, ok, err, code)
    assert.matches("handshake timeout", err, 1, true)
    assert.are.equal(900, st.undelivered)
    assert.is_true(st.undelivered_bytes >= 900 * 1000)
    local _, ps = peer_of(st)
    assert.is_false(ps.connected)
    assert.are.equal(0, ps.queue_events)
    assert.are.equal(900, ps.undelivered)
    assert.are.equal(900, ps.drops)
    local _, cs = next(st.channels)
    assert.are.equal(900, cs.undelivered)
    -- asked again: the same answer
    local ok2, err2, code2 = ctx:close()
    assert.are.same({ ok, err, code }, { ok2, err2, code2 })
  end)

  it("close says so after the consumer's process was SIGKILLed", function()
    local ns, c = world()
    local ctx = produce(ns, { handshake_timeout = 30 })
    S.run_until(ctx, function() return false end, 0.3)
    assert.is_true(select(2, peer_of(ctx:stats())).queue_events >= 900) -- (and the channel's BIND)
    S.kill(c, "KILL")
    wait_dropped(ctx)
    assert_reported(ctx, ctx:close())
  end)

  it("close says so when the connection ends during its linger", function()
    local ns = world()
    local ctx = produce(ns, { handshake_timeout = 1, linger = 10 })
    local clock = require("socket").gettime
    local t0 = clock()
    local ok, err, code = ctx:close()
    assert_reported(ctx, ok, err, code)
    assert.is_true(clock() - t0 < 9, "close waited its whole linger")
  end)

  it("a script that ends so (its last line, or os.exit(0)) says it on stderr and exits 1", function()
    local ns = world()
    for _, ending in ipairs{ "", "os.exit(0)" } do
      local child = S.lua(PRODUCER .. ending .. "\n", ns)
      local done, rc = S.wait(child, 60)
      assert(done, "producer did not end: " .. S.errors(child))
      assert.matches("dropped 900", S.output(child), 1, true)
      assert.are.equal(1, rc, ending .. ": " .. S.errors(child))
      assert.matches("900 events %(%d+ bytes%) not delivered: lost with a connection", S.errors(child))
      assert.matches("ctx:close() was not called", S.errors(child), 1, true)
    end
  end)

  it("what the disconnect policy dropped is a drop, not undelivered", function()
    local ns = world()
    local ctx = lecho.context{ nameserver = ns, quiet = true, queue_limit = 65536, handshake_timeout = 30 }
    local p = assert(ctx:channel("cl.ch"):producer{ policy = "disconnect" })
    local pad = ("x"):rep(1000)
    for i = 1, 900 do p:submit({ i = i, pad = pad }) end
    local st = ctx:stats()
    local drops = 0
    for _, ps in pairs(st.peers) do drops = drops + ps.drops end
    assert.is_true(drops >= 800, "the policy dropped " .. drops)
    assert.are.equal(0, st.undelivered)
    local _, cs = next(st.channels)
    assert.are.equal(0, cs.undelivered)
    local _, err = ctx:close{ linger = 0 }
    assert.is_nil(err and err:match("lost with a connection"), err)
  end)
end)
