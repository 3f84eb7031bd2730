-- Bounded outgoing queues and what each policy does when one is full.
-- The consumer process is stopped (SIGSTOP) so that its queue really fills;
-- the producer's heartbeat is off, or it would (rightly) declare the stopped
-- consumer dead after 2 s when the host is slow (spec/liveness_spec.lua).
local cjson = require "cjson"
local lecho = require "lecho"
local S = require "spec.support"
local kids = require "spec.children"

local LIMIT = 256 * 1024
local EV = ("z"):rep(64 * 1024)
local N = 400 -- 25 MiB: more than loopback socket buffers and the queue hold

local function result(child, ctx)
  assert(S.wait(child, 30, ctx), "child did not finish: " .. S.errors(child))
  return cjson.decode(S.output(child):match("({.*})"))
end

describe("queue policies", function()
  local ns_child, ns, ctx, cons, p, peer

  local function setup(policy, expect, slow)
    ns_child, ns = S.nameserver("--quiet")
    ctx = lecho.context{ nameserver = ns, quiet = true, queue_limit = LIMIT, policy = policy,
                         heartbeat = 0 }
    cons = S.lua(kids.consumer, cjson.encode{ ns = ns, channels = { "q" }, expect = expect,
                                                    stop_on = "end", duration = 20, slow = slow })
    assert(S.wait_file(cons.out, "ready", 20))
    p = assert(ctx:channel("q"):producer())
    assert.is_true(p:submit_sync("hello", { timeout = 5 })) -- connected
    if not slow then S.kill(cons, "STOP") end
    for addr in pairs(ctx:stats().peers) do
      if addr ~= ns then peer = addr end
    end
  end

  after_each(function()
    if cons then S.kill(cons, "CONT") end
    if ctx then ctx:close() end
    ctx, cons = nil, nil
    S.cleanup()
  end)

  it("drop_newest keeps the queue under its limit and counts what it dropped", function()
    setup("drop_newest", nil)
    for _ = 1, N do assert.is_true(p:submit(EV)) end
    local st = ctx:stats().peers[peer]
    assert.is_true(st.drops > 0)
    assert.is_true(st.queue_bytes <= LIMIT + #EV + 64)
    assert.are.equal(st.drops, ctx:stats().channels[ns .. "/q"].drops)
    S.kill(cons, "CONT")
    local delivered = N - st.drops
    assert.is_true(p:submit_sync("end", { timeout = 10 }))
    local r = result(cons, ctx)
    assert.are.equal(delivered + 2, r.count) -- hello and end included
  end)

  it("drop_oldest keeps the newest events", function()
    setup("drop_oldest", nil)
    for i = 1, N do assert.is_true(p:submit(i == N and "newest" or EV)) end
    local st = ctx:stats().peers[peer]
    assert.is_true(st.drops > 0)
    assert.is_true(st.queue_bytes <= LIMIT + #EV + 64)
    S.kill(cons, "CONT")
    assert.is_true(p:submit_sync("end", { timeout = 10 }))
    local r = result(cons, ctx)
    assert.are.equal(N - st.drops + 2, r.count)
    assert.are.equal(N + 2, r.last) -- the newest survived, in order
    assert.is_true(r.order_ok == false or r.count < N + 2) -- gaps are the drops
  end)

  it("drop_oldest drops batched small events of two channels, counted per channel", function()
    ns_child, ns = S.nameserver("--quiet")
    ctx = lecho.context{ nameserver = ns, quiet = true, queue_limit = LIMIT, policy = "drop_oldest",
                         heartbeat = 0 }
    cons = S.lua(kids.consumer, cjson.encode{ ns = ns, channels = { "q", "r" }, stop_on = "end",
                                              duration = 30 })
    assert(S.wait_file(cons.out, "ready", 20))
    local pq = assert(ctx:channel("q"):producer())
    local pr = assert(ctx:channel("r"):producer())
    assert.is_true(pq:submit_sync("hello", { timeout = 5 }))
    for addr in pairs(ctx:stats().peers) do
      if addr ~= ns then peer = addr end
    end
    S.kill(cons, "STOP")
    local small = ("s"):rep(100)   -- small events: batched in the queue
    -- Submits until both channels have dropped, and 20,000 more of each
    -- (at most 100,000): not a fixed count, whose time is this process's own
    -- work, while the stopped consumer's name server declares it dead after
    -- 10 s of silence (heartbeat 5 s, misses 2), and the producer, told so,
    -- has no consumer of q (under make asan at load 13-18, asan7: 100,000
    -- of each took more than that: "no consumer of q" at the sync below)
    local M, first = 0, nil
    for i = 1, 100000 do
      assert.is_true(pq:submit(small))
      assert.is_true(pr:submit(small))
      M = i
      if i % 5000 == 0 then
        ctx:run_once(0)
        local cs = ctx:stats().channels
        if not first and cs[ns .. "/q"].drops > 0 and cs[ns .. "/r"].drops > 0 then first = i end
        if first and i >= first + 20000 then break end
      end
    end
    local st = ctx:stats()
    local drops = st.peers[peer].drops
    local dq, dr = st.channels[ns .. "/q"].drops, st.channels[ns .. "/r"].drops
    assert.is_true(dq > 0 and dr > 0, ("drops q %d r %d"):format(dq, dr))
    assert.are.equal(drops, dq + dr)
    assert.is_true(st.peers[peer].queue_bytes <= LIMIT + 16 * 1024 + 256)
    S.kill(cons, "CONT")
    assert.is_true(pq:submit_sync("end", { timeout = 10 }))
    local r = result(cons, ctx)
    assert.are.equal(2 * M - drops + 2, r.count) -- hello and end included
  end)

  it("disconnect closes the slow peer's connection with a reason", function()
    setup("disconnect", nil)
    for _ = 1, N do p:submit(EV) end
    local st = ctx:stats().peers[peer]
    assert.is_true(st.drops > 0)
    assert.is_false(st.connected)
    assert.truthy(st.last_error:match("policy disconnect"))
  end)

  it("block makes the producer wait while the loop keeps running", function()
    -- A slow consumer (5 ms per event) rather than a stopped one: the
    -- producer must wait for it, and its own timers must fire meanwhile.
    setup("block", N + 1, 0.005)
    local ticks = 0
    local tick = ctx:every(0.05, function() ticks = ticks + 1 end)
    local t0 = ctx:now()
    for _ = 1, N do assert.is_true(p:submit(EV)) end
    p:flush()
    tick:stop()
    assert.is_true(ticks >= 5) -- timers fired while submit was blocked
    assert.is_true(ctx:now() - t0 >= 0.25)
    local st = ctx:stats().peers[peer]
    assert.are.equal(0, st.drops)
    local r = result(cons, ctx)
    assert.are.equal(N + 1, r.count)
    assert.is_true(r.order_ok)
  end)
end)
