-- Order and exact values across real processes: consumer processes
-- (luajit children of spec/children.lua) see a producer's events in the
-- order it submitted them, sync and async mixed, with every value intact,
-- also when they join while the stream runs.
local S = require "spec.support"
local kids = require "spec.children"

local gen = assert(loadstring(kids.gen .. " return gen, same"))()

describe("the order of events across processes", function()
  local ns, ctx
  before_each(function() ns, ctx = S.world() end)
  after_each(function() S.end_world(ctx); ctx = nil end)

  it("delivers every event, in order and with exact values, to consumers in two processes", function()
    local N = 6000
    local a = S.consumer{ ns = ns, channels = { "field" }, check = true, expect = N }
    local b = S.consumer{ ns = ns, channels = { "field" }, check = true, expect = N }
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
      local r = S.result(child, 30, ctx)
      assert.are.equal(N, r.count)
      assert.is_true(r.order_ok)
      assert.is_true(r.values_ok, "first bad value at seq " .. tostring(r.bad_value))
      assert.are.equal(1, r.first)
      assert.are.equal(N, r.last)
    end
  end)

  it("gives a consumer that joins mid-stream a gap-free suffix, and nothing after close", function()
    local p = assert(ctx:channel("m"):producer())
    local seq = 0
    local function burst(n)
      for _ = 1, n do seq = seq + 1; assert(p:submit(seq)) end
    end
    burst(200)
    local tick = ctx:every(0.002, function() burst(20) end)
    local a = S.consumer{ ns = ns, channels = { "m" }, duration = 3 }
    local started = seq
    S.run_until(ctx, function() return false end, 0.5)
    local joined_by = seq
    assert.is_true(joined_by > started)
    S.run_until(ctx, function() return false end, 0.5)
    tick:stop()
    p:flush()
    local r = S.result(a, 10, ctx)
    assert.is_true(r.order_ok)
    assert.are.equal(r.last - r.first + 1, r.count) -- no gap, no duplicate
    assert.is_true(r.first <= joined_by + 1)
    assert.are.equal(seq, r.last)
  end)
end)
