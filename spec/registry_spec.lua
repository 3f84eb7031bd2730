-- Proves lecho.ns.registry, the transport-free control plane of the name server
-- and channel managers: lookup and balancing, membership counts, the consumer
-- join that waits for producer confirmations (and its timeout), peer loss,
-- and that bad input gets clear errors instead of exceptions.
-- Run: luajit /usr/bin/busted --lpath='lua/?.lua;lua/?/init.lua' spec/registry_spec.lua

local R = require "lecho.ns.registry"

local NS = "127.0.0.1:7700"
local P1, P2, C1, C2 = "10.0.0.1:1", "10.0.0.2:2", "10.0.0.3:3", "10.0.0.4:4"
local M1, M2, M3 = "10.0.1.1:1", "10.0.1.2:2", "10.0.1.3:3"

-- A fake transport: records every message; `take(addr)` pops that address's
-- messages, `take()` pops all as { to, msg } pairs.
local function wire()
  local w = { log = {} }
  function w.send(to, msg) w.log[#w.log + 1] = { to = to, msg = msg } end
  function w.take(addr)
    local out, rest = {}, {}
    for _, e in ipairs(w.log) do
      if addr == nil then out[#out + 1] = e
      elseif e.to == addr then out[#out + 1] = e.msg
      else rest[#rest + 1] = e end
    end
    w.log = rest
    return out
  end
  return w
end

local function new(role, extra)
  local o = { addr = NS, role = role or "nameserver", ack_timeout = 2.0 }
  for k, v in pairs(extra or {}) do o[k] = v end
  return R.new(o)
end

-- Send a request, return the replies `from` got and every members message.
local rid = 0
local function req(reg, w, from, msg, now)
  rid = rid + 1
  msg.rid = rid
  assert.is_true(reg:handle(from, msg, w.send, now or 0))
  return rid
end

-- The single reply to `from` (asserts there is exactly one).
local function reply_to(w, from)
  local rs = {}
  for _, m in ipairs(w.take(from)) do
    if m.op == "reply" then rs[#rs + 1] = m end
  end
  assert.are.equal(1, #rs)
  return rs[1]
end

local function members_to(w, addr)
  local ms = {}
  for _, m in ipairs(w.take(addr)) do
    if m.op == "members" then ms[#ms + 1] = m end
  end
  return ms
end

describe("lecho.ns.registry lookup", function()
  it("self-manages channels when no manager registered", function()
    local reg, w = new(), wire()
    local id = req(reg, w, P1, { op = "lookup", ch = "a" })
    assert.are.same({ op = "reply", rid = id, ok = true, manager = NS }, reply_to(w, P1))
  end)

  it("balances new channels over registered managers, sticky", function()
    local reg, w = new(), wire()
    req(reg, w, M1, { op = "register_manager" })
    assert.is_true(reply_to(w, M1).ok)
    req(reg, w, M2, { op = "register_manager" })
    assert.is_true(reply_to(w, M2).ok)
    local got, per = {}, {}
    for _, ch in ipairs { "a", "b", "c", "d" } do
      req(reg, w, P1, { op = "lookup", ch = ch })
      got[ch] = reply_to(w, P1).manager
      per[got[ch]] = (per[got[ch]] or 0) + 1
    end
    assert.are.same({ [M1] = 2, [M2] = 2 }, per)
    -- a third manager gets the next new channels, old ones stay put
    req(reg, w, M3, { op = "register_manager" }); w.take()
    for _, ch in ipairs { "a", "b", "c", "d" } do
      req(reg, w, C1, { op = "lookup", ch = ch })
      assert.are.equal(got[ch], reply_to(w, C1).manager)
    end
    req(reg, w, P1, { op = "lookup", ch = "e" })
    assert.are.equal(M3, reply_to(w, P1).manager)
    req(reg, w, P1, { op = "lookup", ch = "f" })
    assert.are.equal(M3, reply_to(w, P1).manager)
  end)

  it("reassigns a down manager's channels on the next lookup", function()
    local reg, w = new(), wire()
    req(reg, w, M1, { op = "register_manager" })
    req(reg, w, M2, { op = "register_manager" }); w.take()
    req(reg, w, P1, { op = "lookup", ch = "a" })
    local first = reply_to(w, P1).manager
    local other = first == M1 and M2 or M1
    assert.is_true(reg:peer_down(first, w.send, 1))
    assert.are.same({ other }, reg:snapshot().managers)
    req(reg, w, P1, { op = "lookup", ch = "a" })
    assert.are.equal(other, reply_to(w, P1).manager)
    -- the last manager gone: the name server takes over
    reg:peer_down(other, w.send, 2)
    req(reg, w, P1, { op = "lookup", ch = "a" })
    assert.are.equal(NS, reply_to(w, P1).manager)
  end)

  it("keeps a self-managed channel when a manager registers later", function()
    local reg, w = new(), wire()
    req(reg, w, P1, { op = "lookup", ch = "a" })
    assert.are.equal(NS, reply_to(w, P1).manager)
    req(reg, w, M1, { op = "register_manager" }); w.take()
    req(reg, w, P1, { op = "lookup", ch = "a" })
    assert.are.equal(NS, reply_to(w, P1).manager)
    req(reg, w, P1, { op = "lookup", ch = "b" })
    assert.are.equal(M1, reply_to(w, P1).manager)
  end)

  it("refuses membership of a channel assigned to another manager", function()
    local reg, w = new(), wire()
    req(reg, w, M1, { op = "register_manager" }); w.take()
    req(reg, w, P1, { op = "lookup", ch = "a" }); w.take()
    req(reg, w, P1, { op = "join", ch = "a", role = "producer" })
    local r = reply_to(w, P1)
    assert.is_false(r.ok)
    assert.are.equal("join: channel 'a' is managed by " .. M1, r.err)
    assert.are.equal(M1, r.manager)
    req(reg, w, P1, { op = "leave", ch = "a", role = "producer" })
    assert.are.equal("leave: channel 'a' is managed by " .. M1, reply_to(w, P1).err)
  end)

  it("is refused by a plain manager", function()
    local reg, w = new("manager"), wire()
    req(reg, w, P1, { op = "lookup", ch = "a" })
    assert.are.equal("lookup: this context is a channel manager, not a name server", reply_to(w, P1).err)
    req(reg, w, M1, { op = "register_manager" })
    assert.are.equal("register_manager: this context is a channel manager, not a name server",
                     reply_to(w, M1).err)
  end)
end)

describe("lecho.ns.registry membership", function()
  for _, role in ipairs { "nameserver", "manager" } do
    it("gives a joining producer the current consumers (" .. role .. ")", function()
      local reg, w = new(role), wire()
      req(reg, w, C1, { op = "join", ch = "x", role = "consumer" })
      local cr = reply_to(w, C1)
      assert.is_true(cr.ok)                      -- no producer: answered at once
      local id = req(reg, w, P1, { op = "join", ch = "x", role = "producer" })
      -- sseq: each consumer context's last subscription change (none said: empty)
      assert.are.same({ op = "reply", rid = id, ok = true, consumers = { C1 }, mods = {}, ver = cr.ver,
                      count = 1, sseq = {} },
                      reply_to(w, P1))
    end)
  end

  it("makes a consumer join wait for every producer's members_ok", function()
    local reg, w = new("manager"), wire()
    req(reg, w, P1, { op = "join", ch = "x", role = "producer" })
    req(reg, w, P2, { op = "join", ch = "x", role = "producer" })
    local v0 = reply_to(w, P2).ver; w.take()
    local id = req(reg, w, C1, { op = "join", ch = "x", role = "consumer" }, 10)
    assert.are.same({}, w.take(C1))            -- not yet answered
    local m1, m2 = members_to(w, P1), members_to(w, P2)
    assert.are.equal(1, #m1); assert.are.equal(1, #m2)
    assert.are.same({ C1 }, m1[1].consumers)
    assert.are.equal("x", m1[1].ch)
    assert.is_true(m1[1].ver > v0)
    assert.are.equal(m1[1].ver, m2[1].ver)
    assert.are_not.equal(m1[1].mid, m2[1].mid)
    assert.are.equal(1, reg:snapshot().channels.x.waiting)

    reg:handle(P1, { op = "members_ok", ch = "x", ver = m1[1].ver, mid = m1[1].mid }, w.send, 10.5)
    assert.are.same({}, w.take())              -- P2 still awaited, and no reply to members_ok
    reg:tick(w.send, 11)                       -- before the deadline: nothing
    assert.are.same({}, w.take())
    reg:handle(P2, { op = "members_ok", ch = "x", ver = m2[1].ver, mid = m2[1].mid }, w.send, 11.5)
    assert.are.same({ op = "reply", rid = id, ok = true, ver = m1[1].ver, count = 1, errors = {},
                      producers = { P1, P2 } }, reply_to(w, C1))
    assert.are.same({}, w.take())
    assert.are.equal(0, reg:snapshot().channels.x.waiting)
  end)

  it("holds a join made while the control plane recovers until producers came back", function()
    -- A name server told by a rejoining context that it recovers answers
    -- lookups with `settle`; a join carrying it waits that long, and a
    -- producer that joins meanwhile confirms it (no event lost to it).
    local ns, w = new("nameserver", { settle = 2.0 }), wire()
    req(ns, w, C2, { op = "lookup", ch = "x" }, 49)   -- assigned before (held otherwise)
    reply_to(w, C2)
    req(ns, w, C2, { op = "lookup", ch = "x", recovering = true }, 50)
    assert.are.equal(2.0, reply_to(w, C2).settle)
    req(ns, w, C1, { op = "lookup", ch = "x" }, 50.5)
    local settle = reply_to(w, C1).settle
    assert.are.equal(1.5, settle)
    local id = req(ns, w, C1, { op = "join", ch = "x", role = "consumer", settle = settle }, 50.5)
    assert.are.same({}, w.take(C1))            -- no producer known, yet not answered
    ns:tick(w.send, 51)
    assert.are.same({}, w.take(C1))
    req(ns, w, P1, { op = "join", ch = "x", role = "producer" }, 51.2)
    local pr = reply_to(w, P1)
    assert.are.same({ C1 }, pr.consumers)      -- the producer back in time has the consumer
    ns:tick(w.send, 52.0)
    local r = reply_to(w, C1)
    assert.are.equal(id, r.rid)
    assert.are.same({ P1 }, r.producers)
    req(ns, w, C2, { op = "lookup", ch = "y" }, 53)
    assert.is_nil(reply_to(w, C2).settle)      -- recovered: no wait any more
  end)

  it("after a restart, keeps each channel with the manager that registers it again", function()
    -- A restarted name server knows no assignment: a lookup in its recovery
    -- window waits, a manager registering again claims its channels, and
    -- the lookup then names that manager (not a second one: split brain).
    local ns, w = new("nameserver", { settle = 3.0, recovering = true }), wire()
    req(ns, w, M2, { op = "register_manager" }, 0)
    reply_to(w, M2)
    local id = req(ns, w, C1, { op = "lookup", ch = "x" }, 0.5)
    assert.are.same({}, w.take(C1))            -- held
    req(ns, w, M1, { op = "register_manager", channels = { "x" } }, 1.0)
    assert.is_nil(reply_to(w, M1).taken)
    ns:tick(w.send, 2.9)
    assert.are.same({}, w.take(C1))
    ns:tick(w.send, 3.1)
    local r = reply_to(w, C1)
    assert.are.equal(id, r.rid)
    assert.are.equal(M1, r.manager)
    req(ns, w, M2, { op = "register_manager", channels = { "x" } }, 4)
    assert.are.same({ "x" }, reply_to(w, M2).taken)  -- x stays M1's
    req(ns, w, C1, { op = "lookup", ch = "y" }, 4)
    assert.are.equal(M2, reply_to(w, C1).manager)    -- recovered: new channels at once
  end)

  it("lets a context that comes back in the window join within it, before a caller's held join is answered", function()
    -- A caller's lookup opens the window of a restarted name server (0 .. 3);
    -- the server of the service, a consumer that lost it, comes back at 1.9
    -- (widened to 4.9).  Both lookups are answered when the first window
    -- ends, so the server joins again inside the widened one and the
    -- caller's join, held to its end, lists it.  (Holding each lookup to
    -- the end of the window it widened would answer the server's with the
    -- caller's join, whose list would lack it: "no service".)
    local ns, w = new("nameserver", { settle = 3.0, recovering = true }), wire()
    req(ns, w, C1, { op = "lookup", ch = "svc" }, 0)
    req(ns, w, C2, { op = "lookup", ch = "svc", recovering = true }, 1.9)
    assert.are.same({}, w.take())
    ns:tick(w.send, 3.0)
    local s1, s2 = reply_to(w, C1).settle, reply_to(w, C2).settle
    assert.is_true(math.abs(s1 - 1.9) < 1e-9 and math.abs(s2 - 1.9) < 1e-9, s1 .. " " .. s2)
    local id = req(ns, w, C1, { op = "join", ch = "svc", role = "producer", settle = s1 }, 3.0)
    assert.are.same({}, w.take(C1))            -- held to 4.9
    req(ns, w, C2, { op = "join", ch = "svc", role = "consumer", settle = s2 }, 3.1)
    local m = members_to(w, C1)[1]
    ns:handle(C1, { op = "members_ok", ch = "svc", ver = m.ver, mid = m.mid }, w.send, 3.2)
    ns:tick(w.send, 4.8)
    assert.are.same({}, w.take(C1))
    ns:tick(w.send, 4.95)
    local r = reply_to(w, C1)
    assert.are.equal(id, r.rid)
    assert.are.same({ C2 }, r.consumers)
  end)

  it("widens the recovery window once per rejoining lookup, not again when it answers a held one", function()
    -- (make asan, nameserver_restart: a rejoining context's lookup, held,
    -- widened the window again when it was answered: joins made after it
    -- waited up to `settle` more, and a caller started after the restart
    -- found no server within its 5 s)
    local ns, w = new("nameserver", { settle = 2.0 }), wire()
    req(ns, w, C1, { op = "lookup", ch = "x" }, 49)   -- (not recovering: answered)
    reply_to(w, C1)
    local id = req(ns, w, C2, { op = "lookup", ch = "y", recovering = true }, 50)   -- the window: 50 .. 52
    assert.are.same({}, w.take(C2))             -- held (y is assigned to nobody yet)
    ns:tick(w.send, 52.0)
    local r = reply_to(w, C2)
    assert.are.equal(id, r.rid)
    assert.is_nil(r.settle)                     -- the window it was held for has ended
    req(ns, w, C1, { op = "lookup", ch = "z" }, 52.5)
    r = reply_to(w, C1)                         -- recovered: answered at once, with no wait
    assert.is_nil(r.settle)
    assert.are.equal(NS, r.manager)
  end)
  it("believes a lookup's recovering only in its first seconds, and holds a lookup at most LOOKUP_HOLD", function()
    -- (s7 outside attack, b1: any peer's recovering lookup, every 2 s, kept
    -- the window open forever; b3: --settle 8 held a new channel's lookup
    -- past the asker's 5 s timeout)
    local naming = require "lecho.ns.naming"
    local ns, w = new("nameserver", { settle = 2.0 }), wire()
    req(ns, w, C1, { op = "lookup", ch = "a" }, 0)            -- the start: 0
    reply_to(w, C1)
    local late, hold = (naming.RECOVER_BELIEVE or 5) + 1, naming.LOOKUP_HOLD or 3
    req(ns, w, C2, { op = "lookup", ch = "b", recovering = true }, late)
    local r = reply_to(w, C2)                                   -- answered at once: not believed
    assert.are.equal(NS, r.manager)
    assert.is_nil(r.settle)
    req(ns, w, C1, { op = "lookup", ch = "c" }, late + 0.1)
    assert.is_nil(reply_to(w, C1).settle)                       -- nobody else waits
    -- a restarted name server with a window longer than LOOKUP_HOLD
    local ns2, w2 = new("nameserver", { settle = 8.0, recovering = true }), wire()
    local id = req(ns2, w2, C1, { op = "lookup", ch = "x" }, 0)
    assert.are.same({}, w2.take(C1))                            -- held
    ns2:tick(w2.send, hold - 0.1)
    assert.are.same({}, w2.take(C1))
    ns2:tick(w2.send, hold)
    r = reply_to(w2, C1)
    assert.are.equal(id, r.rid)
    assert.are.equal(8.0 - hold, r.settle)      -- the rest: its join waits it out
  end)

  it("answers a consumer join after ack_timeout with the late producers", function()
    local reg, w = new("manager", { ack_timeout = 2.0 }), wire()
    req(reg, w, P1, { op = "join", ch = "x", role = "producer" })
    req(reg, w, P2, { op = "join", ch = "x", role = "producer" }); w.take()
    local id = req(reg, w, C1, { op = "join", ch = "x", role = "consumer" }, 100)
    local m = members_to(w, P2)[1]; w.take()
    reg:handle(P2, { op = "members_ok", ch = "x", ver = m.ver, mid = m.mid }, w.send, 100.1)
    reg:tick(w.send, 101.9)
    assert.are.same({}, w.take())
    reg:tick(w.send, 102.0)
    assert.are.same({ op = "reply", rid = id, ok = true, ver = m.ver, count = 1, late = { P1 },
                      errors = {}, producers = { P1, P2 } },
                    reply_to(w, C1))
    reg:tick(w.send, 103)                      -- answered once only
    reg:handle(P1, { op = "members_ok", ch = "x", ver = m.ver }, w.send, 104)
    assert.are.same({}, w.take())
  end)

  it("stops awaiting a producer that goes down or leaves", function()
    local reg, w = new("manager"), wire()
    req(reg, w, P1, { op = "join", ch = "x", role = "producer" })
    req(reg, w, P2, { op = "join", ch = "x", role = "producer" }); w.take()
    local id1 = req(reg, w, C1, { op = "join", ch = "x", role = "consumer" })
    w.take()
    reg:peer_down(P1, w.send, 0.5)
    assert.are.same({}, w.take())              -- P2 still awaited
    req(reg, w, P2, { op = "leave", ch = "x", role = "producer" }, 0.6)
    assert.are.equal(id1, reply_to(w, C1).rid)
    assert.is_true(reply_to(w, P2).ok)
  end)

  it("answers a consumer join at once when the context already consumes, confirmed", function()
    local reg, w = new("manager"), wire()
    req(reg, w, P1, { op = "join", ch = "x", role = "producer" }); w.take()
    req(reg, w, C1, { op = "join", ch = "x", role = "consumer" })
    local m = members_to(w, P1)[1]
    reg:handle(P1, { op = "members_ok", ch = "x", ver = m.ver, mid = m.mid }, w.send, 0)
    assert.are.equal(1, reply_to(w, C1).count)
    req(reg, w, C1, { op = "join", ch = "x", role = "consumer" })
    local r = reply_to(w, C1)
    assert.are.equal(2, r.count); assert.are.equal(m.ver, r.ver)
    assert.are.same({}, w.take())              -- set unchanged: no members message
  end)

  it("counts endpoints per context (join x3, leave x2 keeps the member)", function()
    local reg, w = new("manager"), wire()
    req(reg, w, P1, { op = "join", ch = "x", role = "producer" }); w.take()
    for i = 1, 3 do
      req(reg, w, C1, { op = "join", ch = "x", role = "consumer" })
      local m = members_to(w, P1)
      assert.are.equal(i == 1 and 1 or 0, #m)
      if m[1] then reg:handle(P1, { op = "members_ok", ch = "x", ver = m[1].ver }, w.send, 0) end
      assert.are.equal(i, reply_to(w, C1).count)
    end
    for i = 1, 2 do
      req(reg, w, C1, { op = "leave", ch = "x", role = "consumer" })
      assert.are.equal(3 - i, reply_to(w, C1).count)
      assert.are.same({}, w.take())
    end
    assert.are.same({ [C1] = 1 }, reg:snapshot().channels.x.consumers)
    req(reg, w, C1, { op = "leave", ch = "x", role = "consumer" })
    local ms = members_to(w, P1)
    assert.are.equal(1, #ms)
    assert.are.same({}, ms[1].consumers)
    assert.are.equal(0, reply_to(w, C1).count)
    req(reg, w, C1, { op = "leave", ch = "x", role = "consumer" })
    assert.are.equal("leave: " .. C1 .. " is not a consumer of channel 'x'", reply_to(w, C1).err)
  end)

  -- issue 28, review 7: a context that lost its name server but not its
  -- manager joins that manager again (rejoin = true): its one membership,
  -- not one endpoint more, or its one leave at the close left it listed
  it("takes a rejoin of a member as its one membership (join, rejoin, leave: gone)", function()
    local reg, w = new("manager"), wire()
    req(reg, w, P1, { op = "join", ch = "x", role = "producer" }); w.take()
    req(reg, w, C1, { op = "join", ch = "x", role = "consumer" })
    local m = members_to(w, P1)
    reg:handle(P1, { op = "members_ok", ch = "x", ver = m[1].ver }, w.send, 0)
    assert.are.equal(1, reply_to(w, C1).count)
    req(reg, w, P1, { op = "join", ch = "x", role = "producer", rejoin = true })
    assert.are.equal(1, reply_to(w, P1).count)
    req(reg, w, C1, { op = "join", ch = "x", role = "consumer", rejoin = true })
    assert.are.equal(1, reply_to(w, C1).count)
    assert.are.same({ [C1] = 1 }, reg:snapshot().channels.x.consumers)
    req(reg, w, C1, { op = "leave", ch = "x", role = "consumer" })
    assert.are.equal(0, reply_to(w, C1).count)
    req(reg, w, P1, { op = "leave", ch = "x", role = "producer" })
    assert.are.equal(0, reply_to(w, P1).count)
    local snap = reg:snapshot().channels.x
    assert.is_true(snap == nil or (next(snap.consumers) == nil and next(snap.producers) == nil))
    -- a rejoin that finds no membership (the manager lost it) makes one
    req(reg, w, C1, { op = "join", ch = "x", role = "consumer", rejoin = true })
    assert.are.equal(1, reply_to(w, C1).count)
  end)

  it("sends members with increasing versions, only when the consumer set changes", function()
    local reg, w = new("manager"), wire()
    req(reg, w, P1, { op = "join", ch = "x", role = "producer" }); w.take()
    local vers = {}
    local function step(from, op)
      req(reg, w, from, { op = op, ch = "x", role = "consumer" })
      for _, m in ipairs(members_to(w, P1)) do vers[#vers + 1] = m end
      w.take()
    end
    step(C1, "join"); step(C2, "join"); step(C2, "join"); step(C1, "leave"); step(C2, "leave")
    assert.are.equal(3, #vers)
    assert.are.same({ C1 }, vers[1].consumers)
    assert.are.same({ C1, C2 }, vers[2].consumers)
    assert.are.same({ C2 }, vers[3].consumers)
    assert.is_true(vers[1].ver < vers[2].ver and vers[2].ver < vers[3].ver)
    assert.is_true(vers[1].mid < vers[2].mid and vers[2].mid < vers[3].mid)
  end)

  it("removes a lost context everywhere and notifies producers", function()
    local reg, w = new("nameserver"), wire()
    for _, ch in ipairs { "x", "y" } do
      req(reg, w, P1, { op = "join", ch = ch, role = "producer" })
      req(reg, w, C1, { op = "join", ch = ch, role = "consumer" })
      req(reg, w, C2, { op = "join", ch = ch, role = "consumer" })
      req(reg, w, C1, { op = "join", ch = ch, role = "producer" })
    end
    w.take()
    local before = reg:snapshot().channels.x.ver
    reg:peer_down(C1, w.send, 5)
    local got = members_to(w, P1)
    assert.are.equal(2, #got)
    for _, m in ipairs(got) do
      assert.are.same({ C2 }, m.consumers)
      assert.is_true(m.ver > before)
    end
    assert.are.same({}, w.take(C1))            -- nothing sent to the dead
    local s = reg:snapshot().channels
    assert.are.same({ [P1] = 1 }, s.x.producers)
    assert.are.same({ [C2] = 1 }, s.x.consumers)
    assert.are.same({ [C2] = 1 }, s.y.consumers)
  end)

  it("drops the pending join of a consumer that goes down", function()
    local reg, w = new("manager"), wire()
    req(reg, w, P1, { op = "join", ch = "x", role = "producer" })
    req(reg, w, C1, { op = "join", ch = "x", role = "consumer" })
    w.take()
    reg:peer_down(C1, w.send, 1)
    assert.are.equal(0, reg:snapshot().channels.x.waiting)
    reg:tick(w.send, 100)
    assert.are.same({}, w.take(C1))
  end)

  it("forgets a channel with no member left", function()
    local reg, w = new("manager"), wire()
    req(reg, w, P1, { op = "join", ch = "x", role = "producer" })
    req(reg, w, P1, { op = "leave", ch = "x", role = "producer" })
    assert.is_nil(reg:snapshot().channels.x)
  end)

  it("survives a send that re-enters the registry (loopback)", function()
    local reg, w = new("nameserver"), wire()
    local function send(to, msg)
      w.send(to, msg)
      if to == NS and msg.op == "members" then  -- own context confirms at once
        reg:handle(NS, { op = "members_ok", ch = msg.ch, ver = msg.ver, mid = msg.mid }, send, 0)
      end
    end
    reg:handle(NS, { op = "join", ch = "x", role = "producer", rid = 1 }, send, 0)
    reg:handle(C1, { op = "join", ch = "x", role = "consumer", rid = 2 }, send, 0)
    assert.is_true(reply_to(w, C1).ok)
  end)

  it("survives a send that raises", function()
    local logged = {}
    local reg = new("manager", { log = function(l, m) logged[#logged + 1] = l .. ": " .. m end })
    assert.is_true(reg:handle(P1, { op = "join", ch = "x", role = "producer", rid = 1 },
                              function() error("boom") end, 0))
    assert.are.same({ [P1] = 1 }, reg:snapshot().channels.x.producers)
    assert.matches("send to " .. P1 .. " failed", logged[#logged], 1, true)
  end)
end)

describe("lecho.ns.registry bad input", function()
  local reg, w
  before_each(function() reg, w = new(), wire() end)

  local function err_of(msg)
    msg.rid = msg.rid or 7
    assert.is_true(reg:handle(P1, msg, w.send, 0))
    local r = reply_to(w, P1)
    assert.is_false(r.ok)
    return r.err
  end

  it("answers unknown ops", function()
    assert.are.equal("unknown op 'xyz'", err_of { op = "xyz" })
    assert.are.equal("field 'op' must be a string", err_of { op = 42 })
    assert.are.equal("field 'op' must be a string", err_of {})
  end)

  it("answers malformed requests with clear errors", function()
    assert.are.equal("join: field 'ch' must be a non-empty string", err_of { op = "join", role = "producer" })
    assert.are.equal("join: field 'ch' must be a non-empty string", err_of { op = "join", ch = "", role = "producer" })
    assert.are.equal("lookup: field 'ch' must be a non-empty string", err_of { op = "lookup", ch = {} })
    assert.are.equal('join: field \'role\' must be "producer" or "consumer"', err_of { op = "join", ch = "x" })
    assert.are.equal('leave: field \'role\' must be "producer" or "consumer"',
                     err_of { op = "leave", ch = "x", role = 1 })
    assert.are.equal("join: channel name longer than 1024 bytes",
                     err_of { op = "join", ch = ("n"):rep(1025), role = "producer" })
    assert.are.equal("leave: " .. P1 .. " is not a producer of channel 'x'",
                     err_of { op = "leave", ch = "x", role = "producer" })
    assert.are.equal("field 'rid' must be a number", err_of { op = "join", rid = "r1" })
  end)

  it("refuses a modulator period that is not a finite number >= 0.001", function()
    for _, period in ipairs{ 0, -1, 0 / 0, math.huge, "1" } do
      assert.are.equal("join: modulator 'K': period must be a finite number >= 0.001",
        err_of { op = "join", ch = "x", role = "consumer",
                 subs = { mods = { K = { src = "function enqueue(ev) return ev end", period = period } } } })
    end
  end)

  it("enforces max_channels", function()
    reg = new("nameserver", { max_channels = 1 })
    req(reg, w, P1, { op = "lookup", ch = "a" }); w.take()
    assert.are.equal("lookup: too many channels (limit 1)", err_of { op = "lookup", ch = "b" })
    assert.are.equal("join: too many channels (limit 1)", err_of { op = "join", ch = "b", role = "producer" })
  end)

  it("ignores what it cannot answer, logs it, never raises", function()
    local logged = 0
    reg = new("manager", { log = function() logged = logged + 1 end })
    local junk = {
      { op = "join", ch = "x", role = "producer" },           -- request without rid
      { op = "reply", rid = 3, ok = true },                    -- a reply is never answered
      { op = "members_ok" }, { op = "members_ok", ch = "x", ver = "1" },
      { op = "members_ok", ch = "nope", ver = 1 },
      { op = "nosuch" },
      { op = "join", ch = "x", role = "producer", rid = 0/0 }, -- odd but a number
    }
    for _, m in ipairs(junk) do assert.is_true(reg:handle(P1, m, w.send, 0)) end
    local out = w.take()
    assert.are.equal(1, #out)                                   -- only the NaN-rid join answered
    assert.is_true(out[1].msg.ok)
    assert.is_true(logged >= 6)
    -- members_ok for a version never sent is ignored
    req(reg, w, C1, { op = "join", ch = "x", role = "consumer" }); w.take()
    assert.is_true(reg:handle(P1, { op = "members_ok", ch = "x", ver = 1e9 }, w.send, 0))
    assert.are.same({}, w.take())
  end)

  it("reports host misuse as nil, err", function()
    local fn = w.send
    assert.are.same({ nil, "handle: msg must be a table" }, { reg:handle(P1, "join", fn, 0) })
    assert.are.same({ nil, "handle: from must be a non-empty string" }, { reg:handle(nil, {}, fn, 0) })
    assert.are.same({ nil, "handle: send must be a function" }, { reg:handle(P1, {}, nil, 0) })
    assert.are.same({ nil, "handle: now must be a number" }, { reg:handle(P1, {}, fn) })
    assert.are.same({ nil, "tick: now must be a number" }, { reg:tick(fn) })
    assert.are.same({ nil, "peer_down: addr must be a string" }, { reg:peer_down(nil, fn, 0) })
  end)

  it("raises for bad constructor options", function()
    assert.has_error(function() R.new { addr = NS, role = "boss" } end,
                     'lecho.ns.registry.new: \'role\' must be "nameserver" or "manager"')
    assert.has_error(function() R.new { role = "manager" } end,
                     "lecho.ns.registry.new: 'addr' must be a non-empty string")
    assert.has_error(function() R.new { addr = NS, role = "manager", ack_timeout = -1 } end,
                     "lecho.ns.registry.new: 'ack_timeout' must be a non-negative number")
  end)
end)

describe("lecho.ns.registry modulator subscriptions", function()
  local SRC = "function enqueue(ev) return ev end"
  -- a key is the hash of its code and params (the manager checks it)
  local subs = require "lecho.subs"
  local function key_of(src, params) return subs.stream_key(subs.base_of(src), params) end
  local K = key_of(SRC, { k = 1 })

  it("merges equal modulators by key and sends producers their destinations", function()
    local reg, w = new("manager"), wire()
    req(reg, w, P1, { op = "join", ch = "x", role = "producer" }); w.take()
    local m = { src = SRC, params = { k = 1 } }
    req(reg, w, C1, { op = "join", ch = "x", role = "consumer", subs = { plain = false, mods = { [K] = m } } })
    req(reg, w, C2, { op = "join", ch = "x", role = "consumer", subs = { plain = true, mods = { [K] = m } } })
    local ms = members_to(w, P1)
    local last = ms[#ms]
    assert.are.same({ C2 }, last.consumers)            -- only C2 takes the plain stream
    assert.are.same({ C1, C2 }, last.mods[K].dests)
    assert.are.equal(SRC, last.mods[K].src)
  end)

  -- (a key is the hash of its code and params, checked here: another
  -- context's key with other code or params is a key that is not theirs'
  -- hash; issue 27's attack squatted a key so)
  it("refuses a key another context uses for a different modulator, and a key not its code's hash", function()
    local reg, w = new("manager"), wire()
    req(reg, w, C1, { op = "join", ch = "x", role = "consumer",
                      subs = { mods = { [K] = { src = SRC, params = { k = 1 } } } } })
    assert.is_true(reply_to(w, C1).ok)
    req(reg, w, C2, { op = "join", ch = "x", role = "consumer",
                      subs = { mods = { [K] = { src = SRC, params = { k = 2 } } } } })
    local r = reply_to(w, C2)
    assert.is_false(r.ok)
    assert.matches("is not the hash of its code and params", r.err)
    req(reg, w, C2, { op = "join", ch = "x", role = "consumer" })   -- plain: fine
    assert.is_true(reply_to(w, C2).ok)
    req(reg, w, C2, { op = "subscribe", ch = "x",
                      subs = { mods = { [K] = { src = "x = 1", params = { k = 1 } } } } })
    assert.is_false(reply_to(w, C2).ok)
    req(reg, w, C2, { op = "subscribe", ch = "x",
                      subs = { mods = { [K] = { src = SRC, params = { k = 1 } } } } })
    assert.is_true(reply_to(w, C2).ok)                 -- the same modulator: shared
    -- a key made up, first on the channel: refused all the same (squatted,
    -- the consumer whose code it is would join its instance directly)
    req(reg, w, C1, { op = "subscribe", ch = "x",
                      subs = { mods = { [key_of(SRC, { k = 9 })] = { src = "x = 2", params = { k = 9 } } } } })
    assert.is_false(reply_to(w, C1).ok)
  end)
end)

describe("lecho.ns.registry list and snapshot", function()
  it("shows full membership for own channels, the manager for assigned ones", function()
    local reg, w = new(), wire()
    req(reg, w, P1, { op = "join", ch = "own", role = "producer" })
    req(reg, w, C1, { op = "join", ch = "own", role = "consumer" })   -- waits for P1
    req(reg, w, M1, { op = "register_manager" })
    req(reg, w, P2, { op = "lookup", ch = "far" })
    w.take()
    local id = req(reg, w, C2, { op = "list" })
    local r = reply_to(w, C2)
    local own = r.channels.own
    assert.are.equal(id, r.rid)
    assert.are.same({ M1 }, r.managers)
    assert.are.same({ manager = M1 }, r.channels.far)
    assert.are.same({ manager = NS, ver = own.ver, producers = { [P1] = 1 }, consumers = { [C1] = 1 },
                      modulators = {}, waiting = 1 }, own)
    local s = reg:snapshot()
    assert.are.equal(NS, s.addr); assert.are.equal("nameserver", s.role)
    assert.are.same(r.channels, s.channels)
    s.channels.own.producers[P1] = 99                    -- a copy, not the state
    assert.are.same({ [P1] = 1 }, reg:snapshot().channels.own.producers)
  end)

  it("lists a manager's channels", function()
    local reg, w = new("manager"), wire()
    req(reg, w, P1, { op = "join", ch = "x", role = "producer" }); w.take()
    req(reg, w, C1, { op = "list" })
    local r = reply_to(w, C1)
    assert.are.same({ "x" }, (function() local t = {} for k in pairs(r.channels) do t[#t+1] = k end return t end)())
    assert.are.same({}, r.managers)
  end)
end)

describe("lecho.ns.registry under random traffic", function()
  it("never raises, answers every request once, keeps counts consistent", function()
    math.randomseed(42)
    local addrs = { P1, P2, C1, C2, M1, NS }
    local chs = { "a", "b", "c" }
    local values = { nil, 0, -1, 1e9, "", "a", "producer", "consumer", true, {}, { 1, 2 } }
    local opsl = { "join", "leave", "lookup", "list", "register_manager", "members_ok", "reply", "zz" }
    local reg, answered, pending = new(), {}, {}
    local function send(to, msg)
      if msg.op == "reply" then
        local key = to .. "#" .. tostring(msg.rid)
        assert.is_nil(answered[key])              -- exactly one reply per request
        answered[key] = true
        pending[key] = nil
      elseif msg.op == "members" and math.random() < 0.7 then
        reg:handle(to, { op = "members_ok", ch = msg.ch, ver = msg.ver, mid = msg.mid }, send, 0)
      end
    end
    local now, n = 0, 0
    for _ = 1, 5000 do
      now = now + 0.05
      local r = math.random()
      if r < 0.03 then
        local dead = addrs[math.random(#addrs)]
        for key, from in pairs(pending) do      -- its waiting joins are dropped
          if from == dead then pending[key] = nil end
        end
        assert.is_true(reg:peer_down(dead, send, now))
      elseif r < 0.1 then
        assert.is_true(reg:tick(send, now))
      else
        local from = addrs[math.random(#addrs)]
        local msg = { op = opsl[math.random(#opsl)], ch = chs[math.random(#chs)],
                      role = math.random() < 0.5 and "producer" or "consumer" }
        if math.random() < 0.1 then msg.ch = values[math.random(#values)] end
        if math.random() < 0.1 then msg.role = values[math.random(#values)] end
        if msg.op ~= "members_ok" and msg.op ~= "reply" and math.random() < 0.95 then
          n = n + 1
          msg.rid = n
          pending[from .. "#" .. n] = from
        end
        if msg.op == "members_ok" then msg.ver = math.random(0, 50) end
        assert.is_true(reg:handle(from, msg, send, now))
      end
      for _, c in pairs(reg.channels) do
        for _, p in pairs(c.producers) do assert.is_true(p.count > 0) end
        for _, q in pairs(c.consumers) do assert.is_true(q.count > 0) end
      end
    end
    reg:tick(send, now + 10)
    assert.are.same({}, pending)                -- every request answered (or its sender died)
    assert.is_true(n > 1000)
  end)
end)

-- Issue 13: a name server with many channels must not pay for them on every
-- tick (0.1 s): the tick visits the channels with a pending join only.
-- (Counted by the registry itself, reg.tick_visits: no timing.)
describe("lecho.ns.registry tick cost", function()
  it("visits only the channels with a pending join, not every channel", function()
    local reg, w = new("nameserver", { ack_timeout = 2.0 }), wire()
    for i = 1, 500 do
      req(reg, w, P1, { op = "lookup", ch = "c" .. i }, 0)
      req(reg, w, P1, { op = "join", ch = "c" .. i, role = "producer" }, 0)
    end
    w.take()
    local id = req(reg, w, C1, { op = "join", ch = "c7", role = "consumer" }, 1)  -- waits for P1
    w.take(P1)
    assert.are.same({}, w.take(C1))
    local v0 = reg.tick_visits
    for k = 1, 10 do reg:tick(w.send, 1 + k * 0.1) end     -- 10 ticks, the join still waiting
    assert.are.equal(10, reg.tick_visits - v0)               -- c7 each time, not 500 channels
    reg:tick(w.send, 3.5)                                    -- its deadline: answered late
    local r = reply_to(w, C1)
    assert.are.same({ id, true, { P1 } }, { r.rid, r.ok, r.late })
    v0 = reg.tick_visits
    for k = 1, 10 do reg:tick(w.send, 4 + k * 0.1) end
    assert.are.equal(0, reg.tick_visits - v0)                -- nothing waits: nothing visited
  end)
end)

describe("lecho.ns.registry forget cost", function()
  it("checks only the channels that may be due for forgetting, not every channel", function()
    local reg, w = new("nameserver", { forget_after = 10 }), wire()
    for i = 1, 500 do
      req(reg, w, P1, { op = "lookup", ch = "c" .. i }, 0)
      req(reg, w, P1, { op = "join", ch = "c" .. i, role = "producer" }, 0)
    end
    req(reg, w, P2, { op = "lookup", ch = "junk" }, 0)                 -- never joined
    req(reg, w, P1, { op = "leave", ch = "c7", role = "producer" }, 5)  -- unused from 5
    w.take()
    for t = 0, 10.5, 0.5 do reg:tick(w.send, t) end
    assert.is_nil(reg:snapshot().channels.junk)                         -- unused for 10 s: forgotten
    assert.is_truthy(reg:snapshot().channels.c7)                        -- not yet
    local v0 = reg.forget_visits
    for t = 11, 40, 0.5 do reg:tick(w.send, t) end
    assert.is_nil(reg:snapshot().channels.c7)                           -- forgotten at 15
    assert.is_truthy(reg:snapshot().channels.c8)
    assert.are.equal(1, reg.forget_visits - v0)                         -- c7 alone, not 500 channels a second
  end)
end)
