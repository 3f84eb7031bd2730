-- A channel's counters (doc/semantics.md "Statistics") say where its events
-- went, in real processes: events_out counts what was queued toward a
-- consuming context of another process, once per destination (bytes_out
-- likewise); events_local what consumers of this process got;
-- events_no_dest what was submitted with no consumer at all.  A modulated
-- consumer's events go out on the derived stream "name@key", not the base.
local cjson = require "cjson"
local S = require "spec.support"

-- The producer process: arg[1] the name server, arg[2] the channel, arg[3]
-- how many destinations (the channel's and its derived streams') to wait
-- for, arg[4] "local" for a consumer in this process.  Submits N events,
-- lets them be written, prints the counters of the channel and its derived
-- streams as one JSON line, then stays up until killed (or 30 s).
local PRODUCER = [[
  local cjson = require "cjson"
  local lecho = require "lecho"
  local ctx = lecho.context{ nameserver = arg[1], quiet = true }
  local ch = ctx:channel(arg[2])
  local want, N = tonumber(arg[3]), 5
  local got = 0
  if arg[4] == "local" then assert(ch:consumer(function() got = got + 1 end)) end
  local p = assert(ch:producer())
  local function mine()
    local t = {}
    for name, s in pairs(ctx:stats().channels) do
      if name == ch.name or name:sub(1, #ch.name + 1) == ch.name .. "@" then
        t[name == ch.name and "base" or "derived"] = s
      end
    end
    return t
  end
  local function dests()
    local n = 0
    for _, s in pairs(mine()) do n = n + s.destinations end
    return n
  end
  local deadline = ctx:now() + 20
  while dests() < want and ctx:now() < deadline do ctx:run_once(0.05) end
  assert(dests() >= want, "destinations never came")
  for i = 1, N do assert(p:submit(i)) end
  local t1 = ctx:now() + 0.5
  while ctx:now() < t1 do ctx:run_once(0.05) end
  local out = mine()
  out.got_local = got
  print(cjson.encode(out)) io.stdout:flush()
  ctx:after(30, function() ctx:stop() end)
  ctx:run()
]]

local N = 5

describe("channel counters", function()
  local ctx, ns
  before_each(function() ns, ctx = S.world() end)
  after_each(function() S.end_world(ctx) ctx = nil end)

  -- Runs the producer and returns its counters, serving ctx's loop meanwhile.
  local function produce(name, want, mode)
    local child = S.lua(PRODUCER, ns, name, tostring(want), mode or "")
    local line
    assert(S.run_until(ctx, function()
      line = (S.read(child.out) or ""):match("({.*})")
      return line ~= nil
    end, 30), "no counters from the producer: " .. S.errors(child))
    return cjson.decode(line)
  end

  it("with no consumer: events_no_dest, nothing counted as sent", function()
    local t = produce("nobody", 0)
    assert.are.equal(N, t.base.events_no_dest)
    assert.are.equal(0, t.base.events_out)
    assert.are.equal(0, t.base.bytes_out)
    assert.are.equal(0, t.base.events_local)
    assert.are.equal(0, t.base.destinations)
    assert.is_nil(t.derived)
  end)

  it("with a local consumer: events_local, nothing out", function()
    local t = produce("home", 0, "local")
    assert.are.equal(N, t.got_local)
    assert.are.equal(N, t.base.events_local)
    assert.are.equal(0, t.base.events_out)
    assert.are.equal(0, t.base.bytes_out)
    assert.are.equal(0, t.base.events_no_dest)
    assert.are.equal(0, t.base.destinations)
  end)

  it("with a remote plain consumer: events_out once per event to it", function()
    local got = 0
    assert(ctx:channel("plain"):consumer(function() got = got + 1 end))
    local t = produce("plain", 1)
    assert(S.run_until(ctx, function() return got == N end, 10), "consumer got " .. got)
    assert.are.equal(N, t.base.events_out)
    assert.is_true(t.base.bytes_out > 0)
    assert.are.equal(0, t.base.events_local)
    assert.are.equal(0, t.base.events_no_dest)
    assert.are.equal(1, t.base.destinations)
  end)

  it("with a remote modulated consumer: events_out on the derived stream", function()
    local got = 0
    assert(ctx:channel("mod"):consumer(function() got = got + 1 end,
                                       { modulator = "function enqueue(ev) return ev end" }))
    local t = produce("mod", 1)
    assert(S.run_until(ctx, function() return got == N end, 10), "consumer got " .. got)
    assert.is_table(t.derived, "no derived stream in the producer")
    assert.are.equal(N, t.derived.events_out)
    assert.is_true(t.derived.bytes_out > 0)
    assert.are.equal(1, t.derived.destinations)
    assert.are.equal(0, t.derived.events_no_dest)
    -- the base channel sent nothing itself, and nothing went nowhere
    assert.are.equal(0, t.base.events_out)
    assert.are.equal(0, t.base.events_no_dest)
    assert.are.equal(0, t.base.destinations)
  end)

  it("with two remote consumers: events_out once per destination", function()
    local got = 0
    assert(ctx:channel("two"):consumer(function() got = got + 1 end))
    local other = S.consumer{ ns = ns, channels = { "two" }, expect = N, duration = 30 }
    local t = produce("two", 2)
    assert(S.run_until(ctx, function() return got == N end, 10), "consumer got " .. got)
    assert.are.equal(2 * N, t.base.events_out, cjson.encode(t))
    assert.are.equal(0, t.base.events_no_dest)
    assert.are.equal(N, S.result(other, 20, ctx).count)
  end)
end)
