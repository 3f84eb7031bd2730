-- Issue 11, "a cap on decoded size per value (amplification)": a few bytes
-- on the wire must not make a decoder allocate many times their size.  The
-- reader charges each table header for the slots it announces (a decoder
-- presizes them) and each string for its length, before anything is made,
-- and refuses a value past max_value_bytes (64 MiB): "value decodes to more
-- than N bytes" (doc/wire-format.md, "Limits and errors").
--
-- Through core.decode (the codec every receive path uses), then from a
-- rogue peer (spec/support/rogue.lua) at a consumer process of a protected
-- world (spec/support/trust_world.lua): the connection is closed with the
-- reason in the ERROR the rogue gets and in the consumer's log, the consumer's memory stays bounded, and the legitimate
-- producer's events all arrive.
--
-- Run: make && LUA_PATH="$PWD/?.lua;$PWD/lua/?.lua;$PWD/lua/?/init.lua;;" \
--   LUA_CPATH="$PWD/lua/?.so;;" LECHO_ROOT=$PWD luajit /usr/bin/busted spec/limits_decode_spec.lua

local core = require "lecho.core"
local support = require "spec.support"
local T = require "spec.support.trust_world"
local R = require "spec.support.rogue"

local LIMIT = 64 * 1024 * 1024
local REFUSED = ("value decodes to more than %d bytes"):format(LIMIT)

-- Bombs: a few MB each that decode (on main) to many times their size.
local function nil_slots(n)     -- { nil, nil, ... }: n presized array slots
  return "\6" .. R.varint(n) .. "\0" .. ("\0"):rep(n)
end
local function empty_tables(n)  -- { {}, {}, ... }: n tables, 3 bytes each
  return "\6" .. R.varint(n) .. "\0" .. ("\6\0\0"):rep(n)
end
local function hash_slots(n)    -- { [false] = nil, ... }: n presized hash nodes
  return "\6\0" .. R.varint(n) .. ("\1\0"):rep(n)
end

-- Refused with REFUSED (never prints what a failing decode gave: it is big).
local function refused(bytes)
  local ok, err = core.decode(bytes)
  assert(ok == nil, "it decoded, to a " .. type(err))
  assert.equals(REFUSED, err)
end

describe("core.decode: a value that decodes to more than max_value_bytes", function()
  it("refuses a table header announcing 4.2 million array slots (4.2 MB of input)", function()
    refused(nil_slots(4200000))
  end)

  it("refuses 1.1 million nested empty tables (3.3 MB of input)", function()
    refused(empty_tables(1100000))
  end)

  it("refuses a table header announcing 2.1 million hash pairs (4.2 MB of input)", function()
    refused(hash_slots(2100000))
  end)

  it("refuses a string longer than the cap, though under max_string", function()
    local s = "\5" .. R.varint(LIMIT) .. ("x"):rep(LIMIT)
    refused(s)
  end)

  it("charges exactly: 64 per table, 16 per array slot, 32 per hash pair, 24 + length per string", function()
    local v = assert(core.encode({ "abc", k = true }))  -- 64 + 16 + 32 + (24 + 3) + (24 + 1)
    assert.same({ true, { "abc", k = true } }, { core.decode(v, { max_value_bytes = 164 }) })
    assert.same({ nil, "value decodes to more than 163 bytes", "limit" },
                { core.decode(v, { max_value_bytes = 163 }) })
    assert.same({ nil, "value decodes to more than max_value_bytes" },
                { core.validate(v, { max_value_bytes = 163 }) })
    -- scalars cost nothing beyond their slot
    assert.same({ true, 1.5 }, { core.decode(assert(core.encode(1.5)), { max_value_bytes = 0 }) })
  end)

  it("still decodes what the benches send: 10 MiB strings, a million numbers", function()
    local big = ("0123456789abcdef"):rep(10 * 1024 * 1024 / 16)
    local ok, v = core.decode(assert(core.encode({ payload = big, n = 1 })))
    assert.is_true(ok)
    assert.equals(#big, #v.payload)
    local nums = {}
    for i = 1, 1000000 do nums[i] = i end
    ok, v = core.decode(assert(core.encode(nums)))
    assert.is_true(ok)
    assert.equals(1000000, #v)
  end)

  it("presizes no more slots than the bytes left could fill: 4 MB of nils under the cap touch little", function()
    -- (third attack: arrays of 4 million nils, 4 MB each, under the cap,
    -- made the receiver zero 32 MiB per event: 140 ms, its loop frozen)
    local child = support.lua([[
      local core = require "lecho.core"
      local function hwm()
        local f = io.open("/proc/self/status")
        local s = f:read("*a")
        f:close()
        return tonumber(s:match("VmHWM:%s*(%d+)"))
      end
      local s = arg[1] == "" and "" or "\6" .. arg[1] .. "\0" .. ("\0"):rep(4000000)
      collectgarbage()
      local h0 = hwm()
      local ok = core.decode(s)
      io.stdout:write(tostring(ok), " ", hwm() - h0, "\n")
    ]], R.varint(4000000))
    assert(support.wait(child, 20), support.errors(child))
    local ok, grew = support.output(child):match("(%S+) (%d+)")
    assert.equals("true", ok)
    assert(tonumber(grew) < 8 * 1024, ("decoding grew the peak by %s KiB"):format(grew))
  end)

  it("is an option of the context, checked", function()
    local lecho = require "lecho"
    local ctx = lecho.context{ quiet = true, max_value_bytes = 1024 }
    ctx:close()
    assert.has_error(function() lecho.context{ quiet = true, max_value_bytes = -1 } end)
  end)
end)

describe("a producer submitting a value past max_value_bytes", function()
  it("is told at the submit (code limit), by either encoder, rather than its consumers closing on it", function()
    local lecho = require "lecho"
    local ctx = lecho.context{ quiet = true, max_value_bytes = 1000 }
    local p = assert(ctx:channel("big"):producer())
    local nums = {}
    for i = 1, 100 do nums[i] = i end               -- 64 + 1600: the compiled encoder's case
    local r1 = { p:submit(nums) }
    local r2 = { p:submit({ ("x"):rep(2000) }) }     -- a long string: the C encoder's
    local r3 = { p:submit({ 1, 2, 3 }) }
    ctx:close()
    assert.same({ nil, "value decodes to more than 1000 bytes", "limit" }, r1)
    assert.same({ nil, "value decodes to more than 1000 bytes", "limit" }, r2)
    assert.is_true(r3[1])
    assert.same({ nil, "value decodes to more than 200 bytes", "limit" },
                { core.encode({ ("x"):rep(100) }, { max_value_bytes = 200 }) })  -- 64 + 16 + 124
    assert.truthy(core.encode({ ("x"):rep(100) }, { max_value_bytes = 204 }))
  end)
end)

-- VmRSS (now) or VmHWM (the peak) of a process, KiB.
local function vm_kb(pid, field)
  local f = io.open(("/proc/%d/status"):format(pid))
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return tonumber(s:match(field .. ":%s*(%d+)"))
end

describe("a rogue peer sending a value that decodes to hundreds of MB", function()
  local w
  after_each(function() T.stop(w); w = nil end)

  it("gets its connection closed with the reason; the consumer stays small; no legitimate event is lost", function()
    w = T.start{ mode = "protected", duration = 40 }
    local pid = w.cons.pid
    local rss0 = assert(vm_kb(pid, "VmRSS"), "no VmRSS for the consumer")
    local p, err = T.dial(w, w.cons.addr, nil)
    assert(p, "the rogue's handshake: " .. tostring(err))
    -- 24 MB of empty tables: ~600 MB once decoded (on main, the consumer
    -- peaked that much higher)
    p:send(R.bind(0, w.ns .. "/" .. T.CHANNEL) .. R.event(0, 1, 1, 0, empty_tables(8000000), true))
    local d = p:drain(20)
    local peak = assert(vm_kb(pid, "VmHWM"), "the consumer died")
    assert.equals("malformed event value: " .. REFUSED, d.error, "the rogue is not told why: " .. tostring(d.ended))
    support.sleep(0.3)
    local log = support.errors(w.cons)
    assert.truthy(log:find("bad event value from " .. w.rogue_srv.addr .. ": " .. REFUSED, 1, true),
                  "the consumer's log does not say why: " .. log:sub(-600))
    -- its peak: the 24 MB frame and what was decoded before the refusal
    assert(peak - rss0 < 64 * 1024, ("the consumer's peak RSS grew by %d KiB"):format(peak - rss0))
    -- the legitimate flow: every event from the first one on, no gap
    local first = T.events(w.cons)
    local n0 = #first
    assert(T.wait_events(w.cons, n0 + 50, 10), "the legitimate flow stopped after the attack")
    local evs = T.events(w.cons)
    for k = 2, #evs do
      assert.equals(evs[k - 1].i + 1, evs[k].i, "an event of the legitimate producer was lost")
    end
  end)
end)
