-- One batch for many destinations (issue 27 item 3): a channel's small
-- async events are written once into a shared buffer and each consuming
-- process's queue refers to them (core/transport/peer.c "shared batches").
-- The queue policies must still be exact per destination: eight consumer
-- processes reading at different speeds (fast, slow, stopped while the
-- producers run), two producers of the channel with different policies
-- (drop_newest, drop_oldest) whose events interleave in the same shared
-- buffers, on a host kept busy by two spinning processes.  Each consumer
-- must get exactly what was sent minus what the producer counted dropped
-- for it, in order per producer, and the channel's drops must be the sum
-- of the destinations'.  (core/test/test_shared.c checks the same inside
-- one process, with the payloads, and that the queues share one buffer.)
local cjson = require "cjson"
local lecho = require "lecho"
local S = require "spec.support"
local kids = require "spec.children"

describe("shared batches: eight destinations, two drop policies, busy cores", function()
  local busy = {}

  after_each(function()
    for _, b in ipairs(busy) do S.kill(b, "KILL") end
    busy = {}
    S.cleanup()
  end)

  it("gives every destination exactly its events and counts its drops exactly", function()
    for i = 1, 2 do busy[i] = S.spawn(("%s -e 'while true do end'"):format(S.luajit)) end
    local ns_child, ns = S.nameserver("--quiet")
    local ctx = lecho.context{ nameserver = ns, quiet = true, queue_limit = 32 * 1024, heartbeat = 0 }
    -- speeds: seconds per event (0: as fast as it can), "stop": SIGSTOPped
    -- while the producers submit
    local speeds = { 0, 0, 0, 0.00005, 0.0002, 0.0002, "stop", "stop" }
    local cons = {}
    for k, sp in ipairs(speeds) do
      cons[k] = S.lua(kids.consumer, cjson.encode{ ns = ns, channels = { "f" }, stop_on = "end",
                                                   duration = 120, slow = sp ~= "stop" and sp > 0 and sp or nil })
    end
    for k = 1, #speeds do assert(S.wait_file(cons[k].out, "ready", 30), S.errors(cons[k])) end
    local ch = ctx:channel("f")
    local p0 = assert(ch:producer())                        -- block: hello and end
    local pn = assert(ch:producer{ policy = "drop_newest" })
    local po = assert(ch:producer{ policy = "drop_oldest" })
    local ok, err = p0:submit_sync("hello", { timeout = 30 })
    assert(ok, cjson.encode(err))
    for k, sp in ipairs(speeds) do if sp == "stop" then S.kill(cons[k], "STOP") end end
    local M = 10000
    local ev = ("x"):rep(80)                                -- small: batched, shared
    for i = 1, M do
      assert.is_true(pn:submit(ev))
      assert.is_true(po:submit(ev))
      if i % 250 == 0 then ctx:run_once(0) end
    end
    for k, sp in ipairs(speeds) do if sp == "stop" then S.kill(cons[k], "CONT") end end
    ok, err = p0:submit_sync("end", { timeout = 90 })
    assert(ok, cjson.encode(err))
    local st = ctx:stats()
    local sum, dropped = 0, 0
    for k = 1, #speeds do
      local r = S.result(cons[k], 30, ctx)
      local pst = assert(st.peers[r.addr], "no peer " .. tostring(r.addr))
      sum = sum + pst.drops
      if pst.drops > 0 then dropped = dropped + 1 end
      assert.are.equal(2 * M - pst.drops + 2, r.count,
        ("consumer %d (%s): %d events, %d dropped for it"):format(k, tostring(speeds[k]), r.count, pst.drops))
      assert.is_true(r.increasing_ok, "consumer " .. k .. ": out of order")
    end
    assert.are.equal(sum, st.channels[ns .. "/f"].drops)
    -- the stopped consumers' queues overflowed: the policies did drop
    assert.is_true(dropped >= 2, "drops at " .. dropped .. " destinations")
    ctx:close()
    S.kill(ns_child)
  end)
end)
