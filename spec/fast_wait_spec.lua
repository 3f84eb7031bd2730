-- The main line's fast wait (core/conn.c, lei_conn_fast_wait): a sync
-- submit or a call waiting for one peer's ACK reads that connection
-- blocking, bounded, instead of a loop turn.  What it must keep: other
-- connections and timers are served while back-to-back sync submits run,
-- the sync timeout holds, and a connection left in blocking mode never
-- blocks a write (issue 13).
local S = require "spec.support"

describe("the main line's fast wait", function()
  local ns, ctx
  before_each(function() ns, ctx = S.world() end)
  after_each(function() S.end_world(ctx); ctx = nil end)

  it("serves other connections and timers during back-to-back sync submits", function()
    local a = S.consumer{ ns = ns, channels = { "fw" }, duration = 20 }
    -- Another process streams on "side" to a consumer in this process.
    local side = S.lua([[
      local lecho = require "lecho"
      local ctx = lecho.context{ nameserver = arg[1], quiet = true }
      local p = assert(ctx:channel("side"):producer())
      local i = 0
      ctx:every(0.01, function() i = i + 1; p:submit(i) end)
      ctx:after(15, function() ctx:stop() end)
      ctx:run()
    ]], ns)
    local got = 0
    assert(ctx:channel("side"):consumer(function() got = got + 1 end))
    assert.is_true(S.run_until(ctx, function() return got > 0 end, 10), "no side event at all")
    local ticks = 0
    local t = ctx:every(0.02, function() ticks = ticks + 1 end)
    local p = assert(ctx:channel("fw"):producer())
    local got0 = got
    local t0 = ctx:now()
    local n = 0
    -- only sync submits on the main line: no loop turn of its own
    while ctx:now() - t0 < 1 do
      n = n + 1
      assert(p:submit_sync(n, { timeout = 5 }))
    end
    t:stop()
    assert.is_true(n > 10)
    assert.is_true(got > got0, "no event of the other connection during the sync submits")
    assert.is_true(ticks > 0, "no timer ran during the sync submits")
    S.kill(a)
    S.kill(side)
  end)

  it("returns at its timeout when the consumer does not answer", function()
    S.consumer{ ns = ns, channels = { "fwslow" }, slow = 3, duration = 20 }
    local p = assert(ctx:channel("fwslow"):producer())
    local t0 = ctx:now()
    local ok, errs, code = p:submit_sync(1, { timeout = 0.5 })
    local dt = ctx:now() - t0
    assert.is_nil(ok)
    assert.are.equal("timeout", code, tostring(errs))
    assert.is_true(dt >= 0.45 and dt < 2.5, ("returned after %.2f s"):format(dt))
  end)

  it("never blocks a write on a connection it left in blocking mode", function()
    local a = S.consumer{ ns = ns, channels = { "fwblk" }, duration = 30 }
    -- The producer runs in a child: sync submits (fast waits), then a
    -- stream of 1 MiB events to its consumer, stopped meanwhile, that the
    -- socket cannot take: every submit returns (the queue fills, then
    -- refuses), none blocks in a write.
    local go = S.tmpname("go")
    local child = S.lua([[
      local lecho = require "lecho"
      local ctx = lecho.context{ nameserver = arg[1], quiet = true, queue_limit = 8 * 2^20 }
      local p = assert(ctx:channel("fwblk"):producer{ policy = "drop_newest" })
      for i = 1, 200 do assert(p:submit_sync(i, { timeout = 5 })) end
      io.stdout:write("synced\n") io.stdout:flush()
      -- waits for the parent to stop the consumer
      local f
      repeat ctx:run_once(0.05); f = io.open(arg[2]) until f
      f:close()
      local big = ("x"):rep(2^20)
      for _ = 1, 100 do p:submit(big); ctx:run_once(0) end
      ctx:flush()
      io.stdout:write("{\"done\":true}\n") io.stdout:flush()
      ctx:close{ linger = 0 }
    ]], ns, go)
    assert(S.wait_file(child.out, "synced", 20), "child did not sync: " .. S.errors(child))
    S.kill(a, "STOP")
    S.write(go, "go")
    local ok, r = pcall(S.result, child, 20, ctx)
    S.kill(a, "CONT")
    assert(ok, r)
    assert.is_true(r.done)
  end)
end)
