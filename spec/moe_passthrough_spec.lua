-- An event a modulator's enqueue returns unchanged goes out as the bytes it
-- was submitted as, not decoded and encoded again (issue 27 item 5,
-- doc/modulators.md "Costs"): counted in the modulator's stats as `passed`.
-- What it changed, rebuilt, emitted or held is encoded as before, and the
-- consumer sees the same values in the same order either way.
local lecho = require "lecho"
local S = require "spec.support"

local function mstats(c)
  local n, st = 0, nil
  for _, ms in pairs(c:stats().modulators or {}) do n, st = n + 1, ms end
  assert.are.equal(1, n)
  return st
end

describe("modulator pass-through (issue 27)", function()
  local c
  after_each(function() if c then c:close() end c = nil end)

  local function run(src, events)
    c = lecho.context{ quiet = true }
    local ch = c:channel("pt")
    local p = assert(ch:producer())
    local got = {}
    assert(ch:consumer(function(ev) got[#got + 1] = ev end, { modulator = src }))
    for _, ev in ipairs(events) do assert(p:submit(ev)) end
    assert(p:submit_sync("end"))
    assert(S.run_until(c, function() return got[#got] == "end" end, 5))
    got[#got] = nil
    return got, mstats(c)
  end

  local scalars = { 0, 1, -7, 2^53 + 2, 1.5, -0.0, 1 / 0, "", "text", ("x"):rep(5000), true, false }

  it("sends a number, string or boolean returned unchanged as the submitted message", function()
    local got, st = run("function enqueue(ev) return ev end", scalars)
    assert.are.same(scalars, got)
    assert.are.equal(1 / -0.0, 1 / got[6]) -- -0 stays -0
    -- every scalar and the "end" marker went as they came
    assert.are.equal(#scalars + 1, st.passed)
    assert.are.equal(#scalars + 1, st.events_out)
  end)

  it("encodes again what it changed, rebuilt or may have changed in place", function()
    local tables = { { a = 1 }, { 1, 2, 3 }, {} }
    local got, st = run("function enqueue(ev) if type(ev) == 'table' then ev.x = 1 end return ev end",
                        tables)
    assert.are.same({ { a = 1, x = 1 }, { 1, 2, 3, x = 1 }, { x = 1 } }, got)
    assert.are.equal(1, st.passed) -- only "end"
    got, st = run("function enqueue(ev) if type(ev) == 'number' then return ev + 1 end return ev end",
                  { 1, 2, 3 })
    assert.are.same({ 2, 3, 4 }, got)
    assert.are.equal(1, st.passed)
    -- 0 and -0 are equal, not the same bits: -0 rebuilt as 0 is sent as 0
    got, st = run("function enqueue(ev) if ev == 0 then return 0 end return ev end", { -0.0 })
    assert.are.equal(1 / 0, 1 / got[1])
    assert.are.equal(1, st.passed)
  end)

  it("keeps the order of what it emits before returning the event, and of several results", function()
    local got, st = run([[function enqueue(ev)
      if ev == "end" then return ev end
      emit("before " .. ev)
      return ev, ev
    end]], { "a", "b" })
    assert.are.same({ "before a", "a", "a", "before b", "b", "b" }, got)
    assert.are.equal(1, st.passed) -- two results are encoded each, as before
  end)

  -- nil, booleans, doubles and integers of one encoded byte (-64..63) reach
  -- enqueue without the decoder (core/moe/moe.c push_scalar): the same
  -- values, told unchanged from their bits, as the decoded ones were
  it("gives enqueue the same scalars whatever their encoding, and tells them unchanged by their bits", function()
    local evs = { -64, 63, -65, 64, 0, -0.0, 0 / 0, 0.5, true, false, 2^31, -2^53 }
    local got, st = run([[function enqueue(ev)
      if ev == "end" then return ev end
      return ev, type(ev), ev ~= ev and "nan" or ev == 0 and 1 / ev or ev
    end]], evs)
    assert.are.equal(3 * #evs, #got)
    for i, ev in ipairs(evs) do
      local v, t, x = got[3 * i - 2], got[3 * i - 1], got[3 * i]
      assert.are.equal(type(ev), t)
      if ev ~= ev then
        assert.is_true(v ~= v)
        assert.are.equal("nan", x)
      else
        assert.are.equal(ev, v)
        if ev == 0 then assert.are.equal(1 / ev, x) else assert.are.equal(ev, x) end
      end
    end
    assert.are.equal(1, st.passed) -- several results: each encoded; "end" passed
    -- one result, unchanged: passed, whatever the encoding; changed by type
    -- or bits (true for 1, 0 for -0, a NaN rebuilt): encoded
    got, st = run("function enqueue(ev) return ev end", evs)
    assert.are.equal(#evs, #got)
    assert.are.equal(#evs + 1, st.passed)
    got, st = run([[function enqueue(ev)
      if ev == 1 then return true elseif ev == true then return 1
      elseif ev == 0 then return 0 end
      return ev
    end]], { 1, true, -0.0, 5 })
    assert.are.same({ true, 1, 0, 5 }, got)
    assert.are.equal(1 / 0, 1 / got[3])
    assert.are.equal(2, st.passed) -- 5 and "end"; -0 -> 0 is other bits
  end)

  it("gives enqueue the null event as nil: passed when returned, dropped when not", function()
    c = lecho.context{ quiet = true }
    local ch = c:channel("nil")
    local p = assert(ch:producer())
    local got, n = {}, 0
    assert(ch:consumer(function(ev) n = n + 1; got[n] = ev end, { modulator = [[
      local k = 0
      function enqueue(ev)
        if ev ~= nil then return ev end
        k = k + 1
        if k == 1 then return ev elseif k == 2 then return nil, "second" end
      end]] }))
    for _ = 1, 3 do assert(p:submit(nil)) end
    assert(p:submit_sync("end"))
    assert(S.run_until(c, function() return got[n] == "end" end, 5))
    -- the first nil returned: a nil result is not sent (as decoded before);
    -- the second's "second"; the third returned nothing (dropped)
    assert.are.same({ "second", "end" }, { got[1], got[2] })
    assert.are.equal(2, n)
    local st = mstats(c)
    assert.are.equal(1, st.dropped)
    assert.are.equal(1, st.passed)
  end)

  it("shares the message with a plain consumer of the channel, sync and async", function()
    c = lecho.context{ quiet = true }
    local ch = c:channel("both")
    local p = assert(ch:producer())
    local plain, modded = {}, {}
    assert(ch:consumer(function(ev) plain[#plain + 1] = ev end))
    assert(ch:consumer(function(ev) modded[#modded + 1] = ev end,
                       { modulator = "function enqueue(ev) return ev end" }))
    for i = 1, 50 do
      if i % 5 == 0 then assert(p:submit_sync("s" .. i)) else assert(p:submit(i)) end
    end
    assert(S.run_until(c, function() return #plain == 50 and #modded == 50 end, 5))
    for i = 1, 50 do
      local want = i % 5 == 0 and "s" .. i or i
      assert.are.equal(want, plain[i])
      assert.are.equal(want, modded[i])
    end
    assert.are.equal(50, mstats(c).passed)
  end)

  it("holds what a modulator with dequeue returns, and sends it when dequeued", function()
    local got, st = run([[
      function enqueue(ev) return ev end
      function dequeue(ev) return ev end]], { 1, "two", true })
    assert.are.same({ 1, "two", true }, got)
    assert.are.equal(0, st.passed)
  end)
end)
