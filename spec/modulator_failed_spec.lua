-- Issue 28, fourth review (blocker): a consumer made with the modulator of
-- an instance that failed must never be told ok and then get nothing.  A
-- failure is the instance's: a later consumer with the same source gets a
-- fresh instance (or the error), in its own context or another one, while
-- the failed consumer is still open or after it closed.  The producer is
-- its own process.
local cjson = require "cjson"
local lecho = require "lecho"
local S = require "spec.support"

-- Submits 1, 2, ... every 10 ms; event 10 is "bad" (F raises on it), once.
local PRODUCER = [[
local cjson = require "cjson"
local lecho = require "lecho"
local a = cjson.decode(arg[1])
local ctx = lecho.context{ nameserver = a.ns, quiet = true, modulators_per_principal = a.limit }
local p = assert(ctx:channel("mf"):producer())
local i = 0
ctx:every(0.01, function()
  i = i + 1
  assert(p:submit(i == 10 and "bad" or i))
end)
ctx:after(60, function() ctx:stop() end)
ctx:run()
]]

local F = "function enqueue(ev) if ev == 'bad' then error('boom') end return ev end"

-- A consumer of F on ch: its events and errors.
local function consumer(ch, src)
  local r = { events = 0, errors = {} }
  r.con = assert(ch:consumer(function(ev) r.events = r.events + 1 end,
                             { modulator = src or F, on_error = function(m) r.errors[#r.errors + 1] = m end }))
  return r
end

describe("a consumer with the source of a failed shared modulator", function()
  local ctxs = {}
  after_each(function()
    for _, c in ipairs(ctxs) do c:close() end
    ctxs = {}
    S.cleanup()
  end)

  local function setup()
    local _, ns = S.nameserver("--quiet")
    S.lua(PRODUCER, cjson.encode{ ns = ns })
    local c = lecho.context{ nameserver = ns, quiet = true }
    ctxs[#ctxs + 1] = c
    local c1 = consumer(c:channel("mf"))
    assert(S.run_until(c, function() return #c1.errors > 0 end, 20), "c1's modulator never failed")
    assert.matches("boom", c1.errors[1])
    return c, c1, ns
  end

  it("gets a fresh instance in the same context while the failed one is open", function()
    local c, c1 = setup()
    local c2 = consumer(c:channel("mf"))
    S.run_until(c, function() return c2.events >= 5 or #c2.errors > 0 end, 10)
    assert.are.same({}, c2.errors)
    assert.is_true(c2.events >= 5, "c2: ok, then " .. c2.events .. " events, no error")
    -- a third one shares c2's live instance
    local c3 = consumer(c:channel("mf"))
    S.run_until(c, function() return c3.events >= 5 end, 10)
    assert.is_true(c3.events >= 5, "c3: " .. c3.events .. " events")
    assert.are.equal(c2.con.mod.key, c3.con.mod.key)
    assert.are_not.equal(c1.con.mod.key, c2.con.mod.key)
    assert.are.equal(1, #c1.errors)
  end)

  it("gets a fresh instance right after the failed one closed", function()
    local c, c1 = setup()
    c1.con:close()
    local c2 = consumer(c:channel("mf"))
    S.run_until(c, function() return c2.events >= 5 or #c2.errors > 0 end, 10)
    assert.are.same({}, c2.errors)
    assert.is_true(c2.events >= 5, "c2: ok, then " .. c2.events .. " events, no error")
  end)

  -- the gateway's "too many modulators (limit 16)": that source stayed dead
  it("refused for the producer's limit, gets an instance once there is room", function()
    local _, ns = S.nameserver("--quiet")
    S.lua(PRODUCER, cjson.encode{ ns = ns, limit = 1 })
    local c = lecho.context{ nameserver = ns, quiet = true }
    ctxs[#ctxs + 1] = c
    local ch = c:channel("mf")
    local g = consumer(ch, "function enqueue(ev) if ev ~= 'bad' then return ev end end")
    assert(S.run_until(c, function() return g.events > 0 end, 20), "g got nothing")
    local c1 = consumer(ch)
    assert(S.run_until(c, function() return #c1.errors > 0 end, 10), "c1 was not refused")
    assert.matches("too many modulators", c1.errors[1])
    g.con:close()
    S.run_until(c, function() return false end, 0.5)   -- its close reached the producer
    local c2 = consumer(ch)
    S.run_until(c, function() return c2.events >= 3 or #c2.errors > 0 end, 10)
    assert.are.same({}, c2.errors)
    assert.is_true(c2.events >= 3, "c2: ok, then " .. c2.events .. " events, no error")
  end)

  it("in another context is not told ok and then nothing", function()
    local _, _, ns = setup()
    local d = lecho.context{ nameserver = ns, quiet = true }
    ctxs[#ctxs + 1] = d
    local c2 = consumer(d:channel("mf"))
    S.run_until(d, function() return c2.events >= 5 or #c2.errors > 0 end, 10)
    assert.is_true(c2.events >= 5 or #c2.errors > 0, "c2: ok, then nothing")
    -- told: a consumer made after that gets a fresh instance
    if #c2.errors > 0 then
      local c3 = consumer(d:channel("mf"))
      S.run_until(d, function() return c3.events >= 5 or #c3.errors > 0 end, 10)
      assert.are.same({}, c3.errors)
      assert.is_true(c3.events >= 5, "c3: " .. c3.events .. " events")
    end
  end)

  it("in another context: the producer's mod_error comes at once, as doc/protocol.md says", function()
    local c, c1, ns = setup()
    local key = c1.con.mod.key
    local d = lecho.context{ nameserver = ns, quiet = true }
    ctxs[#ctxs + 1] = d
    -- the control messages d takes (Context:_on_ctrl, control.lua)
    local got = {}
    local on_ctrl = d._on_ctrl
    d._on_ctrl = function(self, from, msg, gen)
      if type(msg) == "table" and msg.op == "mod_error" then got[#got + 1] = { from = from, msg = msg } end
      return on_ctrl(self, from, msg, gen)
    end
    local t0 = d:now()
    local c2 = consumer(d:channel("mf"))
    assert.is_true(S.run_until(d, function() return #got > 0 end, 10), "no mod_error came")
    assert.is_true(d:now() - t0 < 5, "it came late")
    S.run_until(d, function() return false end, 0.5) -- (no second one)
    assert.are.equal(1, #got)
    local m = got[1].msg
    assert.are.equal(ns .. "/mf", m.ch)
    assert.are.equal(key, m.key)          -- the failed key, not a fresh one
    assert.matches("boom", m.err)         -- the first failure's error
    assert.are.equal(got[1].from, m.producer)
    assert.are.equal(0, c2.events)        -- nothing of the dead key
    assert.matches("boom", c2.errors[1])
    -- a consumer made after that subscribes on a stream of its own
    local c3 = consumer(d:channel("mf"))
    assert.are_not.equal(key, c3.con.mod.key)
    assert.is_true(S.run_until(d, function() return c3.events >= 5 end, 10), "c3: " .. c3.events .. " events")
    assert.are.equal(1, #got)
    c:close()
  end)
end)
