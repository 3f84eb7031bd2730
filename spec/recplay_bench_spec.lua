-- bench/recplay_bench.lua's recorder row (issue 29) measures a steady flow:
-- the producer's throughput with a recorder attached vs without, each run
-- a warm-up flow then the measured one, the process warmed before the
-- first repetition, the CPU per event of each process beside the rate, a
-- second plain consumer in the recorder's place as the control, and the
-- recording checked whole (every event since the recorder joined, in
-- order).  Run small here (RECPLAY_N/WARM/REPS); no timing is asserted.

local support = require "spec.support"
local cjson = require "cjson"

local function positive(x, what)
  assert(type(x) == "number" and x > 0 and x == x and x < math.huge,
         ("%s: expected a positive number, got %s"):format(what, tostring(x)))
end

describe("bench/recplay_bench.lua, the recorder row", function()
  local doc, out, rc
  local N, WARM, REPS = 3000, 1000, 2

  setup(function()
    local json = support.tmpname("recplay") .. ".json"
    local _
    _, out, rc = support.sh(("cd %s && RECPLAY_N=%d RECPLAY_WARM=%d RECPLAY_REPS=%d timeout -k 5 120 %s "
      .. "bench/recplay_bench.lua --quick --json %s 2>&1")
      :format(support.sh_quote(support.root), N, WARM, REPS, support.luajit, support.sh_quote(json)))
    local s = support.read(json)
    doc = s and cjson.decode(s)
  end)

  teardown(function() support.cleanup() end)

  it("exits 0 with the counts asked for", function()
    assert(rc == 0, "recplay_bench failed (status " .. tostring(rc) .. "):\n" .. out:sub(-3000))
    assert.is_table(doc, out)
    local t = doc.throughput
    assert.are.equal(N, t.n)
    assert.are.equal(WARM, t.warm)
    assert.are.equal(REPS, t.reps)
    assert.are.equal(REPS, #t.runs.plain)
    assert.are.equal(REPS, #t.runs.recorded)
    assert.are.equal(REPS, #t.runs.second)
  end)

  it("runs a warm-up flow before each measured one, and the process warm before the first", function()
    assert.is_table(doc, out)
    local t = doc.throughput
    assert.are.equal(2 * WARM, t.prewarm)
    for _, kind in ipairs{ "plain", "second", "recorded" } do
      for k, r in ipairs(t.runs[kind]) do
        assert.is_nil(r.error, kind .. " " .. k .. ": " .. tostring(r.error))
        positive(r.warm_ev_s, kind .. " " .. k .. " warm-up flow")
        positive(r.ev_s, kind .. " " .. k .. " events/s")
        positive(r.loop_ev_s, kind .. " " .. k .. " events/s of the submit loop")
        positive(r.producer_cpu_us, kind .. " " .. k .. " producer CPU per event")
        positive(r.consumer_cpu_us, kind .. " " .. k .. " consumer CPU per event")
        if kind == "recorded" then positive(r.recorder_cpu_us, "recorded " .. k .. " recorder CPU per event") end
        if kind == "second" then positive(r.second_cpu_us, "second " .. k .. " second consumer's CPU per event") end
      end
    end
  end)

  it("finds every event the recorder was sent in its file", function()
    assert.is_table(doc, out)
    for k, r in ipairs(doc.throughput.runs.recorded) do
      -- the warm-up flow, the measured one, the sync event ending each
      assert.are.equal(WARM + N + 2, r.recorded_events, "recorded run " .. k)
    end
  end)

  it("gives the producer's CPU per event with and without, with a second consumer instead, their ratios, the bound",
     function()
    assert.is_table(doc, out)
    local c = doc.throughput.cpu
    positive(c.producer_plain, "producer CPU plain")
    positive(c.producer_recorded, "producer CPU recorded")
    positive(c.recorder, "recorder CPU")
    positive(c.ratio.median, "producer CPU plain/recorded")
    assert.are.equal(REPS, #c.ratio.all)
    positive(c.producer_second, "producer CPU with a second consumer")
    positive(c.ratio_second.median, "producer CPU plain/second consumer")
    positive(c.bound_2cores, "2-core bound")
    positive(doc.throughput.ratio_second.median, "throughput second consumer/plain")
    positive(doc.throughput.ratio.median, "throughput recorded/plain")
  end)
end)
