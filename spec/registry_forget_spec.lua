-- The registry forgets unused channels (lecho.ns.naming, lecho.ns.membership):
-- the state machine alone, with the clock and the transport injected.
-- Run: luajit /usr/bin/busted --lpath='lua/?.lua;lua/?/init.lua' spec/registry_forget_spec.lua
local registry = require "lecho.ns.registry"

local function host()
  local sent = {}
  return sent, function(to, msg) sent[#sent + 1] = { to = to, msg = msg } end
end

local function assigned(reg, ch)
  local c = reg:snapshot().channels[ch]
  return c and c.manager
end

describe("a name server", function()
  local sent, send, ns
  before_each(function()
    sent, send = host()
    ns = registry.new{ addr = "ns:1", role = "nameserver", forget_after = 10 }
  end)

  it("forgets a channel it manages after forget_after without member or lookup", function()
    ns:handle("c:1", { op = "lookup", ch = "x", rid = 1 }, send, 0)
    ns:handle("c:1", { op = "join", ch = "x", role = "producer", rid = 2 }, send, 0)
    ns:tick(send, 50)                                       -- a member: kept however long
    assert.are.equal("ns:1", assigned(ns, "x"))
    ns:handle("c:1", { op = "leave", ch = "x", role = "producer", rid = 3 }, send, 51)
    ns:tick(send, 60.5)                                     -- unused since 51, not 50
    assert.are.equal("ns:1", assigned(ns, "x"))
    ns:tick(send, 61.5)
    assert.is_nil(assigned(ns, "x"))
    ns:handle("c:1", { op = "lookup", ch = "x", create = false, rid = 4 }, send, 62)
    assert.are.same({ ok = false, code = "notfound", err = "lookup: no such channel: x", op = "reply", rid = 4 },
                    sent[#sent].msg)
  end)

  it("forgets a channel its manager released, but not within forget_after of a lookup", function()
    ns:handle("m:1", { op = "register_manager", rid = 1 }, send, 0)
    ns:handle("c:1", { op = "lookup", ch = "x", rid = 2 }, send, 0)
    ns:handle("c:1", { op = "lookup", ch = "y", rid = 3 }, send, 0)
    assert.are.equal("m:1", assigned(ns, "x"))
    ns:handle("m:2", { op = "release", ch = "x" }, send, 20)  -- not its manager: ignored
    ns:handle("m:1", { op = "release", ch = "x" }, send, 20)
    assert.is_nil(assigned(ns, "x"))
    assert.are.equal(1, ns.managers["m:1"].nch)
    ns:handle("c:1", { op = "lookup", ch = "y", rid = 4 }, send, 25)
    ns:handle("m:1", { op = "release", ch = "y" }, send, 30)  -- looked up 5 s ago: kept
    ns:tick(send, 34)
    assert.are.equal("m:1", assigned(ns, "y"))
    ns:tick(send, 35.5)
    assert.is_nil(assigned(ns, "y"))
    assert.are.equal(0, ns.managers["m:1"].nch)
  end)

  it("keeps a released channel that was looked up after the release", function()
    ns:handle("m:1", { op = "register_manager", rid = 1 }, send, 0)
    ns:handle("c:1", { op = "lookup", ch = "x", rid = 2 }, send, 0)
    ns:handle("m:1", { op = "release", ch = "x" }, send, 5)
    ns:handle("c:1", { op = "lookup", ch = "x", rid = 3 }, send, 6)
    ns:tick(send, 100)
    assert.are.equal("m:1", assigned(ns, "x"))
  end)
end)

describe("a manager", function()
  it("releases a channel after forget_after without member", function()
    local sent, send = host()
    local m = registry.new{ addr = "m:1", role = "manager", nameserver = "ns:1", forget_after = 10 }
    m:handle("c:1", { op = "join", ch = "x", role = "producer", rid = 1 }, send, 0)
    m:handle("c:1", { op = "leave", ch = "x", role = "producer", rid = 2 }, send, 1)
    local function releases()
      local n = 0
      for _, s in ipairs(sent) do
        if s.msg.op == "release" then
          assert.are.same({ to = "ns:1", msg = { op = "release", ch = "x" } }, s)
          n = n + 1
        end
      end
      return n
    end
    m:tick(send, 10.5)
    assert.are.equal(0, releases())
    m:tick(send, 11.5)
    assert.are.equal(1, releases())
    m:tick(send, 30)
    assert.are.equal(1, releases())
    -- a channel used again is released again only once unused again
    m:handle("c:1", { op = "join", ch = "x", role = "producer", rid = 3 }, send, 31)
    m:tick(send, 50)
    assert.are.equal(1, releases())
  end)
end)
