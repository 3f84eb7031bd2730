-- Event channels across real processes: a name server process, consumer
-- processes (luajit children) and a producer context in the spec's process.
local cjson = require "cjson"
local lecho = require "lecho"
local S = require "spec.support"
local kids = require "spec.children"

local gen = assert(loadstring(kids.gen .. " return gen, same"))()

local function start_consumer(opts)
  local child = S.lua(kids.consumer, cjson.encode(opts))
  assert(S.wait_file(child.out, "ready", 20), "consumer did not start: " .. S.errors(child))
  return child
end

local function result(child, timeout, ctx)
  local done = S.wait(child, timeout or 30, ctx)
  assert(done, "child did not finish: " .. S.errors(child))
  local line = S.output(child):match("({.*})")
  assert(line, "no result from child: " .. S.output(child) .. S.errors(child))
  return cjson.decode(line)
end

describe("event channels across processes", function()
  local ns_child, ns, ctx

  before_each(function()
    ns_child, ns = S.nameserver("--quiet")
    ctx = lecho.context{ nameserver = ns, quiet = true }
  end)

  after_each(function()
    if ctx then ctx:close() end
    ctx = nil
    S.cleanup()
  end)

  it("delivers every event, in order and with exact values, to consumers in two processes", function()
    local N = 6000
    local a = start_consumer{ ns = ns, channels = { "field" }, check = true, expect = N }
    local b = start_consumer{ ns = ns, channels = { "field" }, check = true, expect = N }
    local p = assert(ctx:channel("field"):producer())
    for i = 1, N do
      if i % 500 == 0 then
        assert.is_true(p:submit_sync(gen(i)))
      else
        assert.is_true(p:submit(gen(i)))
      end
    end
    p:flush()
    for _, child in ipairs{ a, b } do
      local r = result(child, 30, ctx)
      assert.are.equal(N, r.count)
      assert.is_true(r.order_ok)
      assert.is_true(r.values_ok, "first bad value at seq " .. tostring(r.bad_value))
      assert.are.equal(1, r.first)
      assert.are.equal(N, r.last)
    end
  end)

  it("returns from a sync submit with each failing handler's message", function()
    local a = start_consumer{ ns = ns, channels = { "c" }, fail = "bad value 7", duration = 10 }
    local b = start_consumer{ ns = ns, channels = { "c" }, duration = 10 }
    local p = assert(ctx:channel("c"):producer())
    assert.is_true(p:submit_sync(6, { timeout = 5 }))
    local ok, errs = p:submit_sync(7, { timeout = 5 })
    assert.is_nil(ok)
    assert.are.equal(1, #errs)
    assert.are.equal("bad value 7", errs[1].err)
    assert.truthy(errs[1].consumer:match("^127%.0%.0%.1:%d+/c%d+$"))
    assert.truthy(tostring(errs):match("bad value 7"))
    assert.is_true(p:submit_sync(8, { timeout = 5 }))
    S.kill(a)
    S.kill(b)
  end)

  it("turns a consumer killed with SIGKILL mid-stream into an error, never a hang", function()
    local a = start_consumer{ ns = ns, channels = { "k" }, duration = 20 }
    local b = start_consumer{ ns = ns, channels = { "k" }, expect = 3000, duration = 20 }
    local p = assert(ctx:channel("k"):producer())
    for i = 1, 1000 do assert(p:submit(i)) end
    assert.is_true(p:submit_sync(1000, { timeout = 5 }))
    S.kill(a, "KILL")
    local t0 = ctx:now()
    local ok, errs = p:submit_sync(1001, { timeout = 3 })
    assert.is_true(ctx:now() - t0 < 4)
    if not ok then
      assert.truthy(tostring(errs):match("consumer context 127%.0%.0%.1:%d+"))
    end
    -- The survivor keeps receiving, and the manager soon forgets the dead one.
    local sent = 1002
    assert.is_true(S.run_until(ctx, function()
      sent = sent + 1
      return p:submit_sync("probe", { timeout = 2 }) == true
    end, 10))
    for i = sent + 1, 3000 do assert(p:submit(i)) end
    p:flush()
    local r = result(b, 30, ctx)
    assert.are.equal(3000, r.count)
    assert.is_true(r.order_ok)
  end)

  it("carries thousands of channels over one connection per pair of processes", function()
    local names = {}
    for i = 1, 2000 do names[i] = "ch" .. i end
    local a = start_consumer{ ns = ns, channels = names, expect = 6000, duration = 30 }
    local ps = {}
    for i, name in ipairs(names) do ps[i] = assert(ctx:channel(name):producer()) end
    for round = 1, 3 do
      for i = 1, #ps do assert(ps[i]:submit({ round = round, i = i })) end
    end
    ctx:flush()
    local r = result(a, 40, ctx)
    assert.are.equal(6000, r.count)
    for _, name in ipairs(names) do
      assert.are.equal(3, r.by[name])
    end
    -- One data connection: the consumer's context, besides the name server.
    local peers = 0
    for addr, st in pairs(ctx:stats().peers) do
      if st.events_out > 0 then
        peers = peers + 1
        assert.are.equal(r.addr, addr)
        assert.are.equal(6000, st.events_out)
      end
    end
    assert.are.equal(1, peers)
  end)

  it("encodes an event once and sends one copy per receiving process", function()
    local N = 500
    local a = start_consumer{ ns = ns, channels = { "g" }, consumers = 3, expect = N }
    local b = start_consumer{ ns = ns, channels = { "g" }, consumers = 1, expect = N }
    local p = assert(ctx:channel("g"):producer())
    local ev = { payload = ("x"):rep(1000), n = 1 }
    local enc = #lecho.encode(ev)
    for _ = 1, N do assert(p:submit(ev)) end
    p:flush()
    local ra, rb = result(a, 30, ctx), result(b, 30, ctx)
    local st = ctx:stats()
    local cs = st.channels[ns .. "/g"]
    assert.are.equal(N, cs.encodes)             -- once per event, two receivers
    assert.are.equal(N, cs.events_out)
    assert.are.equal(N * enc, cs.bytes_out)
    assert.are.equal(3 * N, ra.ran)             -- three handlers ran ...
    local in_a = ra.channels[ns .. "/g"]
    assert.are.equal(N, in_a.events_in)          -- ... on one copy
    assert.are.equal(N * enc, in_a.bytes_in)
    assert.are.equal(N, rb.ran)
    -- On the wire: each receiving context got about N * enc bytes, not 3x.
    local wire = st.peers[ra.addr].bytes_out
    assert.is_true(wire >= N * enc and wire < N * (enc + 64))
  end)

  it("gives a consumer that joins mid-stream a gap-free suffix, and nothing after close", function()
    local p = assert(ctx:channel("m"):producer())
    local seq = 0
    local function burst(n)
      for _ = 1, n do seq = seq + 1; assert(p:submit(seq)) end
    end
    burst(200)
    local tick = ctx:every(0.002, function() burst(20) end)
    local a = start_consumer{ ns = ns, channels = { "m" }, duration = 3 }
    local started = seq
    S.run_until(ctx, function() return false end, 0.5)
    local joined_by = seq
    assert.is_true(joined_by > started)
    S.run_until(ctx, function() return false end, 0.5)
    tick:stop()
    p:flush()
    local r = result(a, 10, ctx)
    assert.is_true(r.order_ok)
    assert.are.equal(r.last - r.first + 1, r.count) -- no gap, no duplicate
    assert.is_true(r.first <= joined_by + 1)
    assert.are.equal(seq, r.last)
  end)
end)

describe("a context alone", function()
  after_each(function() S.cleanup() end)

  it("delivers locally without a socket, in order, sync and async mixed", function()
    local ctx = lecho.context{ quiet = true }
    local ch = ctx:channel("local")
    local got = {}
    local c = ch:consumer(function(ev) got[#got + 1] = ev end)
    local p = assert(ch:producer())
    for i = 1, 100 do
      if i % 10 == 0 then assert.is_true(p:submit_sync(i)) else assert.is_true(p:submit(i)) end
    end
    assert.are.equal(100, #got)
    for i = 1, 100 do assert.are.equal(i, got[i]) end
    local st = ctx:stats()
    assert.are.equal(100, st.channels[ctx.addr .. "/local"].events_local)
    for _, ps in pairs(st.peers) do assert.are.equal(0, ps.events_out) end
    c:close()
    assert.is_true(p:submit_sync(101))
    assert.are.equal(100, #got) -- nothing for a closed consumer
    ctx:close()
  end)

  it("refuses functions, userdata, cycles and deep nesting at submit, sending nothing", function()
    local ctx = lecho.context{ quiet = true, max_depth = 10 }
    local ch = ctx:channel("v")
    local n = 0
    ch:consumer(function() n = n + 1 end)
    local p = assert(ch:producer())
    local cyc = {}
    cyc.self = cyc
    local deep = {}
    local t = deep
    for _ = 1, 20 do t.x = {}; t = t.x end
    local cases = {
      { { f = print }, "cannot encode a function" },
      { io.stdout, "cannot encode a userdata" },
      { cyc, "cannot encode a cycle" },
      { deep, "nesting too deep" },
    }
    for _, case in ipairs(cases) do
      local ok, err = p:submit(case[1])
      assert.is_nil(ok)
      assert.truthy(err:find(case[2], 1, true), err)
      local ok2, err2 = p:submit_sync(case[1])
      assert.is_nil(ok2)
      assert.truthy(err2:find(case[2], 1, true), err2)
    end
    ctx:run_once(0)
    assert.are.equal(0, n)
    assert.are.equal(0, ctx:stats().channels[ctx.addr .. "/v"].events_out)
    ctx:close()
  end)

  it("keeps serving its other channels while a sync submit waits", function()
    local ns_child, ns = S.nameserver("--quiet")
    local ctx = lecho.context{ nameserver = ns, quiet = true }
    local slow = start_consumer{ ns = ns, channels = { "slow" }, slow = 0.5, duration = 10 }
    -- Another process streams on "fast" to a consumer in this process.
    local fast = S.lua([[
      local lecho = require "lecho"
      local ctx = lecho.context{ nameserver = arg[1], quiet = true }
      local p = assert(ctx:channel("fast"):producer())
      local i = 0
      ctx:every(0.01, function() i = i + 1; p:submit(i) end)
      ctx:after(10, function() ctx:stop() end)
      ctx:run()
    ]], ns)
    local got = 0
    ctx:channel("fast"):consumer(function() got = got + 1 end)
    local p = assert(ctx:channel("slow"):producer())
    S.run_until(ctx, function() return got > 0 end, 5)
    local before = got
    assert.is_true(p:submit_sync("x", { timeout = 5 }))
    assert.is_true(got > before + 5)
    ctx:close()
    S.kill(slow)
    S.kill(fast)
    S.kill(ns_child)
  end)
end)
