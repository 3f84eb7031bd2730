-- A C peer (core/lecho.h) and a Lua peer exchange the same values (issue 27,
-- item 1: the C API's data plane in C; events a Lua peer sends and a C peer
-- reads, and back, are what they were).  spec/support/capi_relay.c consumes
-- "a" with a C handler (its async events come from the core's event hook,
-- core/binding/lua_sink.c; its sync ones through the Lua dispatch) and sends each
-- value on to "b" with lecho_submit from inside the handler (the producer
-- handle's C path, core/binding/lua_prod.c), with the meta it was given.  The Lua
-- side sends a mix of async and sync submits of every kind of value
-- (strings with NULs, a 70,000-byte string, integers, doubles, booleans,
-- nil, nested tables, arrays of several dtypes and sizes) and checks what
-- comes back: the same values (and the same encoded bytes for everything
-- but maps, whose key order is the table's), in order, with the meta Lua
-- handlers get, a failing C handler reported (sync: in submit_sync's error
-- list; async: logged once, "consumer ... failed"), and all of it again with
-- every core busy.
local S = require "spec.support"
local lecho = require "lecho"
local array = require "lecho.array"
local core = require "lecho.core"

-- Deep equality; arrays by their encoding (dtype, shape, bytes).
local function same(a, b)
  if array.is(a) or array.is(b) then
    return array.is(a) and array.is(b) and core.encode(a) == core.encode(b)
  end
  if type(a) ~= "table" or type(b) ~= "table" then return a == b end
  for k, v in pairs(a) do
    if not same(v, b[k]) then return false end
  end
  for k in pairs(b) do
    if a[k] == nil then return false end
  end
  return true
end

local function is_map(v)
  return type(v) == "table" and not array.is(v) and next(v) ~= nil and #v == 0
end

local function values()
  local big = ("z"):rep(70000)
  local wide = array.new("<f8", { 1024 }) -- 8 KiB: received as a view into the payload
  for i = 0, 1023 do wide[i] = i / 7 end
  return {
    "hello", "", "\0\1\2\255", big, 0, -1, 42, 2 ^ 53, -2 ^ 40, 1.5, -0.25, 1e300, true, false,
    { 1, 2, 3 }, { a = 1, b = { c = "d", e = { true, false } } }, { 1, "two", { 3 } },
    array.from({ 1.5, 2.5, 3.5 }), array.from({ { 1, 2 }, { 3, 4 } }, "<i4"),
    { field = array.from({ 0.5, 0.25 }), name = "with an array" }, wide, { wide, "after" },
  }
end

describe("a C peer through lecho.h and a Lua peer", function()
  local relay_bin

  setup(function()
    relay_bin = S.capi_program(S.root .. "/spec/support/capi_relay.c")
  end)

  teardown(function() S.cleanup() end)

  local function exchange()
    local ctx = assert(lecho.context{ quiet = true })
    local relay = S.spawn(("%s %s"):format(relay_bin, S.sh_quote(ctx.addr)))
    assert(S.run_until(ctx, function() return (S.read(relay.out) or ""):find("ready") end, 30),
           "the C relay did not start: " .. S.errors(relay))
    local got = {}
    assert(ctx:channel("b"):consumer(function(ev)
      ctx:keep_values() -- kept past the handler: arrays received as views get a copy
      got[#got + 1] = ev
    end))
    local p = assert(ctx:channel("a"):producer())
    local vals = values()
    local sent = {} -- { value, seq } of what the relay sends back
    for i, v in ipairs(vals) do
      if i % 3 == 0 then
        assert.is_true(p:submit_sync(v))
      else
        assert.is_true(p:submit(v))
      end
      sent[#sent + 1] = { v, p:_seq() }
      if i == 5 then
        -- a C handler failing: a sync submit lists it, an async one is logged
        local ok, errs, code = p:submit_sync("fail-me")
        assert.is_nil(ok)
        assert.are.equal("failed", code)
        assert.are.equal(1, #errs)
        assert.are.equal("asked to fail", errs[1].err)
        assert.truthy(errs[1].consumer)
        assert.is_true(p:submit("fail-me"))
      end
    end
    assert.is_true(p:submit(nil))
    sent[#sent + 1] = { nil, p:_seq() }
    assert.is_true(p:submit("end"))
    sent[#sent + 1] = { "end", p:_seq() }
    assert(S.run_until(ctx, function() return #got >= #sent end, 30),
           ("%d of %d values came back; relay: %s"):format(#got, #sent, S.errors(relay)))
    assert.is_true(S.wait(relay, 20, ctx), "the C relay did not exit")
    assert.are.equal(0, relay.rc, S.errors(relay))
    local pname = ctx.addr .. "#" .. p.id
    for k, s in ipairs(sent) do
      local g = got[k]
      assert(same(s[1], g.v), ("value %d came back as %s"):format(k, tostring(g.v)))
      if not is_map(s[1]) then
        assert(core.encode(s[1]) == core.encode(g.v), ("value %d: other bytes"):format(k))
      end
      assert.are.same({ "a", pname, s[2] }, { g.channel, g.producer, g.seq })
    end
    assert.are.equal(#sent, #got)
    local log = S.errors(relay)
    local _, nfail = log:gsub("consumer %S+ on 'a' failed: asked to fail", "")
    assert.are.equal(1, nfail, log)
    ctx:close()
  end

  it("exchange the same values, in order, with their meta", exchange)

  it("exchange the same values with every core busy", function()
    for _ = 1, 3 do S.spawn(("%s -e 'while true do end'"):format(S.luajit)) end
    exchange()
  end)
end)
