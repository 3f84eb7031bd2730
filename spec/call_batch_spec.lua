-- Many calls in flight (issue 12 point 8, the call path's cost): calls
-- sent and answered inside the loop's callbacks go out in one write per
-- peer and loop turn, not one write each; a call's waiter is resumed when
-- the core says its record settled (not by asking every waiter every turn),
-- and still: the calls that get no answer time out, their late answers are
-- dropped, and a server lost fails every call waiting on it at once.
-- Counts, never rates (rates: make bench BENCH_ONLY=calls).
local S = require "spec.support"
local P = require "spec.support.proc"

-- A server of "b": args.sleep > 0: waits that long first; returns args.i.
-- "bstats" answers how many writes this server made to the caller.
local SERVER = [[
local cjson = require "cjson"
local lecho = require "lecho"
local o = cjson.decode(arg[1])
local ctx = lecho.context{ nameserver = o.ns, quiet = true }
assert(ctx:service("b", function(a)
  if a.sleep and a.sleep > 0 then ctx:sleep(a.sleep) end
  return a.i
end, { concurrency = 512, queue = 512, budget = 0 }))
assert(ctx:service("bstats", function(_, meta)
  local p = ctx:stats().peers[meta.caller]
  return p and p.batches or -1
end))
local f = assert(io.open(o.ready, "w")) f:write("ready\n") f:close()
ctx:after(60, function() ctx:stop() end)
ctx:run()
ctx:close{ linger = 0 }
]]

local function server(ns)
  local ready = S.tmpname("ready")
  -- (exec: the child's pid is luajit's, for the kill below)
  local child = S.lua_with("true", SERVER, require("cjson").encode{ ns = ns, ready = ready })
  assert(S.wait_file(ready, "ready", 20), "server did not start: " .. S.errors(child))
  return child
end

-- The writes (sendmsg calls) this context made to the server of "b".
local function writes_to(ctx, addr)
  local p = ctx:stats().peers[addr]
  return p and p.batches or 0
end

-- Runs `total` calls with `inflight` of them in flight, each started from
-- the callback of the one before (inside the loop); args(i) -> the call's
-- argument.  Returns the results { [i] = { ok, value_or_err, code } }.
local function flight(ctx, total, inflight, args, opts)
  local res, sent, ended = {}, 0, 0
  local one
  function one()
    sent = sent + 1
    local i = sent
    ctx:call_async("b", args(i), opts, function(ok, v, code)
      res[i] = { ok, v, code }
      ended = ended + 1
      if sent < total then one() end
    end)
  end
  -- started from a callback too: every call is made inside the loop
  ctx:after(0, function() for _ = 1, inflight do one() end end)
  assert(S.run_until(ctx, function() return ended >= total end, 30),
         ("%d of %d calls ended"):format(ended, total))
  return res
end

describe("calls in flight", function()
  local ns, ctx
  before_each(function() ns, ctx = S.world() end)
  after_each(function() S.end_world(ctx); ctx = nil end)

  it("go out and are answered in a write per loop turn, not a write per call", function()
    server(ns)
    assert.are.equal(0, ctx:call("b", { i = 0 }, { timeout = 10 }))
    local addr
    for a in pairs(ctx.svc_callers.b.chans[1].svc) do addr = a end
    local w0 = writes_to(ctx, addr)
    local sw0 = ctx:call("bstats", nil, { at = addr, timeout = 10 })
    local N = 1280
    local res = flight(ctx, N, 64, function(i) return { i = i } end, { timeout = 10 })
    for i = 1, N do assert.are.same({ true, i }, { res[i][1], res[i][2] }) end
    local w = writes_to(ctx, addr) - w0
    local sw = ctx:call("bstats", nil, { at = addr, timeout = 10 }) - sw0
    assert.is_true(sw0 > 0 and sw > 0, ("server writes %d, %d"):format(sw0, sw))
    -- one write per call before: N writes each way
    assert.is_true(w <= N / 2, ("the caller wrote %d times for %d calls"):format(w, N))
    assert.is_true(sw <= N / 2, ("the server wrote %d times for %d answers"):format(sw, N))
  end)

  it("time out when unanswered among many answered, and drop the late answers", function()
    server(ns)
    assert.are.equal(0, ctx:call("b", { i = 0 }, { timeout = 10 }))
    local N = 512
    -- every 8th call waits 1.5 s at the server: past its 0.4 s timeout
    local t0 = ctx:now()
    local res = flight(ctx, N, 64, function(i) return { i = i, sleep = i % 8 == 0 and 1.5 or 0 } end,
                       { timeout = 0.4 })
    local good, timeouts = 0, 0
    for i = 1, N do
      local r = res[i]
      if i % 8 == 0 then
        assert.are.equal("timeout", r[3], tostring(r[2]))
        timeouts = timeouts + 1
      else
        assert.are.same({ true, i }, { r[1], r[2] })
        good = good + 1
      end
    end
    assert.are.equal(N / 8, timeouts)
    assert.are.equal(N - N / 8, good)
    -- the slow handlers' answers come in after their timeouts: dropped
    S.run_until(ctx, function() return false end, 2.0)
    assert.is_true(ctx:now() - t0 > 1.5)
    assert.are.equal(0, ctx.nsyncw or 0)
    assert.are.same({}, ctx.waiters)
    assert.are.equal(7, ctx:call("b", { i = 7 }, { timeout = 10 }))
  end)

  it("fail at once when the server is lost, not at their timeout", function()
    local child = server(ns)
    assert.are.equal(0, ctx:call("b", { i = 0 }, { timeout = 10 }))
    local N, ended, failed = 64, 0, 0
    for i = 1, N do
      ctx:call_async("b", { i = i, sleep = 30 }, { timeout = 20 }, function(ok, _, code)
        ended = ended + 1
        if ok == nil and code == "closed" then failed = failed + 1 end
      end)
    end
    S.run_until(ctx, function() return false end, 0.3)
    P.signal(child.pid, "KILL")
    local t0 = ctx:now()
    assert.is_true(S.run_until(ctx, function() return ended >= N end, 10), ended .. " of " .. N .. " ended")
    assert.is_true(ctx:now() - t0 < 10)
    assert.are.equal(N, failed)
    assert.are.equal(0, ctx.nsyncw or 0)
  end)
end)
