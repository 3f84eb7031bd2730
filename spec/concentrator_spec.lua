-- The concentrator: one connection per pair of processes carries every
-- channel, an event is encoded once and sent once per receiving process
-- (group serialization), and producer and consumer in one process never
-- touch a socket.
local lecho = require "lecho"
local S = require "spec.support"

describe("the concentrator", function()
  local ns, ctx
  before_each(function() ns, ctx = S.world() end)
  after_each(function() S.end_world(ctx); ctx = nil end)

  it("carries thousands of channels over one connection per pair of processes", function()
    local names = {}
    for i = 1, 2000 do names[i] = "ch" .. i end
    local a = S.consumer{ ns = ns, channels = names, expect = 6000, duration = 30 }
    local ps = {}
    for i, name in ipairs(names) do ps[i] = assert(ctx:channel(name):producer()) end
    for round = 1, 3 do
      for i = 1, #ps do assert(ps[i]:submit({ round = round, i = i })) end
    end
    ctx:flush()
    local r = S.result(a, 40, ctx)
    assert.are.equal(6000, r.count)
    for _, name in ipairs(names) do
      assert.are.equal(3, r.by[name])
    end
    -- One data connection: the consumer's context, besides the name server.
    local peers = 0
    for addr, st in pairs(ctx:stats().peers) do
      if st.events_out > 0 then
        peers = peers + 1
        assert.are.equal(r.addr, addr)
        assert.are.equal(6000, st.events_out)
      end
    end
    assert.are.equal(1, peers)
  end)

  it("encodes an event once and sends one copy per receiving process", function()
    local N = 500
    local a = S.consumer{ ns = ns, channels = { "g" }, consumers = 3, expect = N }
    local b = S.consumer{ ns = ns, channels = { "g" }, consumers = 1, expect = N }
    local p = assert(ctx:channel("g"):producer())
    local ev = { payload = ("x"):rep(1000), n = 1 }
    local enc = #lecho.encode(ev)
    for _ = 1, N do assert(p:submit(ev)) end
    p:flush()
    local ra, rb = S.result(a, 30, ctx), S.result(b, 30, ctx)
    local st = ctx:stats()
    local cs = st.channels[ns .. "/g"]
    assert.are.equal(N, cs.encodes)             -- once per event, two receivers
    assert.are.equal(2 * N, cs.events_out)      -- once per receiving process
    assert.are.equal(2 * N * enc, cs.bytes_out)
    assert.are.equal(3 * N, ra.ran)             -- three handlers ran ...
    local in_a = ra.channels[ns .. "/g"]
    assert.are.equal(N, in_a.events_in)          -- ... on one copy
    assert.are.equal(N * enc, in_a.bytes_in)
    assert.are.equal(N, rb.ran)
    -- On the wire: each receiving context got about N * enc bytes, not 3x.
    local wire = st.peers[ra.addr].bytes_out
    assert.is_true(wire >= N * enc and wire < N * (enc + 64))
  end)
end)

describe("a context alone", function()
  it("delivers locally without a socket, in order, sync and async mixed", function()
    local ctx = lecho.context{ quiet = true }
    local ch = ctx:channel("local")
    local got = {}
    local c = ch:consumer(function(ev) got[#got + 1] = ev end)
    local p = assert(ch:producer())
    for i = 1, 100 do
      if i % 10 == 0 then assert.is_true(p:submit_sync(i)) else assert.is_true(p:submit(i)) end
    end
    assert.are.equal(100, #got)
    for i = 1, 100 do assert.are.equal(i, got[i]) end
    local st = ctx:stats()
    assert.are.equal(100, st.channels[ctx.addr .. "/local"].events_local)
    for _, ps in pairs(st.peers) do assert.are.equal(0, ps.events_out) end
    c:close()
    -- nobody consumes it now: no handler can run (issue 12: it said true)
    local ok, _, code = p:submit_sync(101)
    assert.is_nil(ok)
    assert.are.equal("noconsumer", code)
    assert.is_true(p:submit(102))
    assert.are.equal(100, #got) -- nothing for a closed consumer
    ctx:close()
  end)
end)
