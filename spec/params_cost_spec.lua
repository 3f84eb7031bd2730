-- What one in-band params change costs the consumer's process (issue 27
-- item 6, target: a params update <= 1.5x a sync round trip; measured
-- ~1.8x under load on 874af8a, bench/README.md "Params update in band").
-- Profiled per step (wall-clock medians of 3,000 changes, consumer and
-- producer in two processes): the consumer's key of the new params was
-- computed twice per change (once without the stream, only to be thrown
-- away; a respec is canon + hash, ~2.6 us), and each request id was one
-- getrandom (~1.5 us of a ~3 us bookkeeping step).  Counted here, not
-- timed (a shared machine's clock cannot tell a few microseconds): per
-- change, one key hash at the consumer, and request ids drawn from a pool
-- (one read of the system's randomness per 64 requests).  On 874af8a: two
-- hashes and one randomness read per change.
local S = require "spec.support"
local lecho = require "lecho"
local core = require "lecho.core"

local PRODUCER = [[
local lecho = require "lecho"
local ctx = lecho.context{ nameserver = arg[1], quiet = true }
local p = assert(ctx:channel("pc"):producer())
io.stdout:write("ready\n"); io.stdout:flush()
ctx:after(60, function() ctx:stop() end)
ctx:run()
]]

describe("an in-band params change", function()
  teardown(function() S.cleanup() end)

  it("hashes its key once at the consumer and draws no randomness per request", function()
    local ctx = assert(lecho.context{ quiet = true })
    local child = S.lua(PRODUCER, ctx.addr)
    assert(S.run_until(ctx, function() return (S.read(child.out) or ""):find("ready") end, 30),
           "the producer did not start: " .. S.errors(child))
    local c = assert(ctx:channel("pc"):consumer(function() end,
      { modulator = "function enqueue(ev) return ev end", params = { v = 0 } }))
    -- the first change goes through the manager (a stream of its own);
    -- wait until the producer runs the modulator, then changes go in band
    assert(c:set_params{ v = 1 })
    for i = 2, 10 do assert(c:set_params{ v = i }) end
    -- (lecho.modulator and lecho.control look these up at each call)
    local hash, random_ids = core.hash, core.random_ids
    local nhash, nrand = 0, 0
    core.hash = function(...) nhash = nhash + 1 return hash(...) end
    if random_ids then core.random_ids = function(...) nrand = nrand + 1 return random_ids(...) end end
    local ok, err = pcall(function()
      for i = 1, 128 do assert(c:set_params{ v = 100 + i }) end
    end)
    core.hash, core.random_ids = hash, random_ids
    assert(ok, err)
    -- one key per change (the manager, told once per 20 ms burst, may
    -- hash a few more of its own)
    assert(nhash >= 128 and nhash <= 128 + 16, ("%d key hashes for 128 changes"):format(nhash))
    -- ids from a pool: at most one read per 64 requests (and the manager's
    -- subscription updates among them)
    assert(nrand <= 8, ("%d reads of randomness for 128 changes"):format(nrand))
    ctx:close()
  end)
end)
