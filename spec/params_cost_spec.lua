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
    -- (lecho.modulator and lecho.control look these up at each call; a
    -- key is core.stream_key's, or core.hash's of the Lua canon's text)
    local hash, skey, random_ids = core.hash, core.stream_key, core.random_ids
    -- the manager (lecho.ns, in this context too) checks each subscription
    -- update it is told, once per 20 ms burst: its hashes are counted
    -- apart (by the stack), as the bursts are as many as the changes take
    -- 20 ms (184 hashes in all at load 18, 128 + 16 allowed)
    local nhash, nmgr, nrand = 0, 0, 0
    local function count()
      if debug.traceback("", 3):find("lecho/ns/", 1, true) then nmgr = nmgr + 1 else nhash = nhash + 1 end
    end
    core.hash = function(...) count() return hash(...) end
    if skey then core.stream_key = function(...) count() return skey(...) end end
    if random_ids then core.random_ids = function(...) nrand = nrand + 1 return random_ids(...) end end
    local ok, err = pcall(function()
      for i = 1, 128 do assert(c:set_params{ v = 100 + i }) end
    end)
    core.hash, core.stream_key, core.random_ids = hash, skey, random_ids
    assert(ok, err)
    -- one key per change at the consumer; the manager at most one per
    -- change it is told of
    assert(nhash >= 128 and nhash <= 128 + 16, ("%d key hashes for 128 changes"):format(nhash))
    assert(nmgr <= 128, ("the manager hashed %d keys for 128 changes"):format(nmgr))
    -- ids from a pool: at most one read per 64 requests (and the manager's
    -- subscription updates among them)
    assert(nrand <= 8, ("%d reads of randomness for 128 changes"):format(nrand))
    ctx:close()
  end)

  -- core.stream_key (C) writes the key for the params it is sure of, the
  -- Lua canon for the rest: they must agree wherever C answers, or two
  -- processes would name one instance two ways.
  it("gets its key from C exactly as the Lua canon makes it", function()
    local modulator = require "lecho.modulator"
    math.randomseed(27)
    local chars = { "a", "Z", "0", " ", "~", "_", "\"", "\\", "\n", "\r", "\0", "\1", "\127", "\200", "\255", "=" }
    local function rstring()
      local t = {}
      for i = 1, math.random(0, 6) do
        -- mostly printable (C's), sometimes what only %q writes (Lua's)
        t[i] = math.random() < 0.9 and string.char(math.random(0x20, 0x7e)) or chars[math.random(#chars)]
      end
      return table.concat(t)
    end
    local function rnum()
      local r = math.random(7)
      if r == 1 then return math.random(-1000, 1000) end
      if r == 2 then return 2 ^ 53 * (math.random() < 0.5 and -1 or 1) end
      if r == 3 then return 2 ^ 53 + 2 end
      if r == 4 then return math.random() * 1e6 end
      if r == 5 then return -0.0 end
      if r == 6 then return math.random(-2 ^ 31, 2 ^ 31) * 4096 end
      return 1 / 3
    end
    local function rvalue(depth)
      local r = math.random(depth < 3 and 5 or 4)
      if r == 1 then return rstring() end
      if r == 2 then return rnum() end
      if r == 3 then return math.random() < 0.5 end
      if r == 4 then return rstring() end
      local t = {}
      for _ = 1, math.random(0, 6) do
        local kr = math.random(4)
        local k = kr == 1 and rstring() or kr == 2 and rnum() or kr == 3 and (math.random() < 0.5) or rstring()
        if k == k then t[k] = rvalue(depth + 1) end
      end
      return t
    end
    local base, n, byc = core.hash("base"), 0, 0
    for _ = 1, 5000 do
      local p = rvalue(0)
      local stream = math.random() < 0.5 and "s" .. math.random(100) or nil
      local c = core.stream_key(base, p, stream)
      local l = modulator._lua_stream_key(base, p, stream)
      if c then
        byc = byc + 1
        assert.are.equal(l, c, "C and Lua keys differ")
      end
      n = n + 1
    end
    -- both kinds were tried
    assert(byc > 1000 and byc < n, ("C made %d of %d keys"):format(byc, n))
  end)
end)
