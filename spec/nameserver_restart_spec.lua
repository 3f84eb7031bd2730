-- Issue 12, point 4: the name server holds only soft state, renewed by its
-- clients (channels: their rejoin; groups: their beacons).  A name server
-- killed with SIGKILL and restarted on the same port loses nothing: the
-- flow of a channel goes on (a consumer present before and after gets
-- every event, in order), a consumer that joins after the restart gets
-- events, a service registered before is callable after, the members of a group are registered again within a beacon and
-- a watcher is told no false "left".  Real processes on 127.0.0.1, every
-- wait bounded, every child killed at cleanup.
local lecho = require "lecho"
local cjson = require "cjson"
local S = require "spec.support"
local P = require "spec.support.proc"
local kids = require "spec.children"

-- Starts scripts/lecho-nameserver again at `addr` (its port is free: the
-- one there was killed), with a recovery window of `settle` seconds.
local function restart(addr, settle)
  local port_file = S.tmpname("ns-addr")
  local argv = P.nameserver_argv{ root = S.root, luajit = S.luajit, listen = addr, port_file = port_file,
                                  args = { "--for", "120", "--settle", tostring(settle), "--quiet" } }
  local child = S.spawn(P.sh_join(argv))
  assert(S.wait_file(port_file, "\n", 10), "the name server did not restart: " .. S.errors(child))
  return child
end

-- The sequence numbers a sink child (spec/children.lua) printed.
local function seqs(child)
  local l = {}
  for seq in S.output(child):gmatch("ev (%d+) ") do l[#l + 1] = tonumber(seq) end
  return l
end

local function contiguous(l)
  for i = 2, #l do
    if l[i] ~= l[i - 1] + 1 then return false, ("%d after %d"):format(l[i], l[i - 1]) end
  end
  return true
end

local function pause(ctx, s) S.run_until(ctx, function() return false end, s) end

describe("a name server killed and restarted on the same port", function()
  after_each(S.cleanup)

  it("loses no event of a flowing channel, and a consumer joining after it gets events", function()
    local ctx, ns, ns_child = S.ns_context{ timeout = 2 }
    local before = S.lua(kids.sink, cjson.encode({ ns = ns, channel = "flow", stop_on = "end", duration = 40 }))
    assert(S.wait_file(before.out, "ready", 20), "consumer did not start: " .. S.errors(before))
    local p = assert(ctx:channel("flow"):producer())
    local n = 0
    local ticker = ctx:every(0.01, function() n = n + 1; p:submit({ i = n }) end)
    assert.is_true(S.run_until(ctx, function() return #seqs(before) >= 20 end, 10), "no flow before")
    S.kill(ns_child, "KILL")
    S.wait(ns_child, 5)
    pause(ctx, 1)
    local sent_down = n
    restart(ns, 1)
    -- the clients join again (the settle window: 1 s), then a new consumer
    pause(ctx, 2)
    local after = S.lua(kids.sink, cjson.encode({ ns = ns, channel = "flow", stop_on = "end", duration = 40 }))
    -- (our loop runs meanwhile: the producer confirms the new member list)
    assert(S.run_until(ctx, function() return S.output(after):find("ready") ~= nil end, 20),
           "consumer did not start after the restart: " .. S.errors(after))
    local at_ready = n
    pause(ctx, 1)
    ticker:stop()
    assert(p:submit_sync("end", { timeout = 10 }))
    assert(S.wait(before, 10, ctx) and S.wait(after, 10, ctx), "the consumers did not get the end")
    local b, a = seqs(before), seqs(after)
    -- the one before got everything, in order (the end marker is seq n + 1)
    assert.are.same({ true }, { contiguous(b) })
    assert.are.equal(1, b[1])
    assert.are.equal(n + 1, b[#b])
    assert(sent_down > 20)
    -- the one after got what was submitted once it had joined, in order
    assert.are.same({ true }, { contiguous(a) })
    assert.is_true(#a > 0 and a[1] <= at_ready + 1 and a[#a] == n + 1,
                   ("after the restart: %d events from %s"):format(#a, tostring(a[1])))
  end)

  it("has a group's members again within a beacon, and its watchers are told no false 'left'", function()
    local ctx, ns, ns_child = S.ns_context{ timeout = 1 }
    -- the lease: the member's own renewals (every third of it) must come in
    -- time, a margin of a process's work (under make asan a member at load
    -- 17 missed three and was told expired: scaled)
    local lease = 1.5 * S.SLOW
    local seen = {}
    local g = assert(ctx:group("room", { lease = lease, watch = function(c) seen[#seen + 1] = c end }))
    local m = S.lua(kids.group_member, cjson.encode({ ns = { ns }, group = "room", lease = lease, data = "m", timeout = 1 }))
    local addr = (assert(S.wait_file(m.out, "ready %S+\n", 20), "member did not join")):match("ready (%S+)")
    -- a watcher that is no member, in a process of its own
    local w = S.lua(kids.group_member, cjson.encode({ ns = { ns }, group = "room", lease = lease, watch = true,
                                                      join = false, timeout = 1 }))
    assert(S.wait_file(w.out, "ready %S+\n", 20), "watcher did not start")
    local want = { [ctx.addr] = {}, [addr] = "m" }
    assert.is_true(S.run_until(ctx, function()
      local l = g:members()
      return l and l[addr] ~= nil
    end, 5))
    S.kill(ns_child, "KILL")
    S.wait(ns_child, 5)
    pause(ctx, 1)
    assert.is_nil((g:members()))          -- (nobody to ask)
    restart(ns, 1)
    local t0 = ctx:now()
    local back = S.run_until(ctx, function()
      local r = ctx:request(ns, { op = "glist", group = "room" })
      return r and r.members[addr] ~= nil and r.members[ctx.addr] ~= nil
    end, lease / 3 + 2)
    assert.is_true(back, "the members did not register again")
    assert.is_true(ctx:now() - t0 <= lease / 3 + 2)
    pause(ctx, 2)
    assert.are.same(want, assert(g:members()))
    for _, c in ipairs(seen) do assert.are.same({}, c.left) end
    assert.is_nil(S.output(w):find('"left":{"', 1, true), S.output(w))
    -- and a member killed now is told to both, once its lease has passed
    -- (the watcher that is no member registered its watch again too)
    S.kill(m, "KILL")
    assert.is_true(S.run_until(ctx, function()
      for _, c in ipairs(seen) do if c.left[addr] then return true end end
    end, lease + 2))
    assert.is_true(S.run_until(ctx, function()
      return S.output(w):find(('"left":{"%s":"expired"}'):format(addr), 1, true) ~= nil
    end, 2), S.output(w))
  end)

  it("tells a watcher a member that died meanwhile is gone by the member's lease, not the watcher's", function()
    -- (attack restart3 MODE=restart: the member's lease 1.5 s, the
    -- watcher's 10: its "expired" came 12.6 s after the member died; the
    -- lease of a member learnt from a notice was the watcher's own)
    local ctx, ns, ns_child = S.ns_context{ timeout = 1 }
    local seen = {}
    assert(ctx:group("room", { join = false, lease = 12, watch = function(c) seen[#seen + 1] = c end }))
    local m = S.lua(kids.group_member, cjson.encode({ ns = { ns }, group = "room", lease = 1.5, data = "m", timeout = 1 }))
    local addr = (assert(S.wait_file(m.out, "ready %S+\n", 20), "member did not join")):match("ready (%S+)")
    assert.is_true(S.run_until(ctx, function() return seen[1] and seen[1].joined[addr] ~= nil end, 5))
    S.kill(ns_child, "KILL")
    S.wait(ns_child, 5)
    pause(ctx, 0.5)
    S.kill(m, "KILL")
    pause(ctx, 1)
    restart(ns, 0)
    local t0 = ctx:now()
    local told = S.run_until(ctx, function()
      for _, c in ipairs(seen) do if c.left[addr] then return true end end
    end, 1.5 + 3)
    assert.is_true(told, ("no 'left' within the member's lease (+3 s) of the restart: %.1fs"):format(ctx:now() - t0))
  end)

  it("never tells a member gone, then joined again, when a name server that listed it comes back", function()
    -- (attack restart3 MODE=restart WL=3: expired, a false joined, expired again)
    local nsa_child, nsa = S.nameserver("--quiet")
    local _, nsb = S.nameserver("--quiet")
    local ctx = S.context{ quiet = true, nameserver = { nsa, nsb }, timeout = 1 }
    local seen = {}
    assert(ctx:group("room", { join = false, lease = 3, watch = function(c) seen[#seen + 1] = c end }))
    local m = S.lua(kids.group_member, cjson.encode({ ns = { nsa, nsb }, group = "room", lease = 1.5, data = "m",
                                                      timeout = 1 }))
    local addr = (assert(S.wait_file(m.out, "ready %S+\n", 20), "member did not join")):match("ready (%S+)")
    assert.is_true(S.run_until(ctx, function() return seen[1] and seen[1].joined[addr] ~= nil end, 5))
    S.kill(nsa_child, "KILL")
    S.wait(nsa_child, 5)
    pause(ctx, 0.5)
    S.kill(m, "KILL")
    pause(ctx, 1)
    restart(nsa, 0)
    pause(ctx, 6)
    local joined, left = 0, 0
    for _, c in ipairs(seen) do
      if c.joined[addr] ~= nil then joined = joined + 1 end
      if c.left[addr] then left = left + 1 end
    end
    assert.are.same({ 1, 1 }, { joined, left }, cjson.encode(seen))
  end)

  it("never answers members() with a just-restarted name server's empty list over another's", function()
    -- (attack restart_members: a fresh client's g:members() was {} for 5-8 s
    -- after one of two name servers restarted, while the other listed the member)
    local nsa_child, nsa = S.nameserver("--quiet")
    local _, nsb = S.nameserver("--quiet")
    local ctx = S.context{ quiet = true, nameserver = { nsa, nsb }, timeout = 2 }
    local m = S.lua(kids.group_member, cjson.encode({ ns = { nsa, nsb }, group = "room", lease = 30, data = "m" }))
    local addr = (assert(S.wait_file(m.out, "ready %S+\n", 20), "member did not join")):match("ready (%S+)")
    S.kill(nsa_child, "KILL")
    S.wait(nsa_child, 5)
    restart(nsa, 0)
    local fresh = lecho.context{ quiet = true, nameserver = { nsa, nsb }, timeout = 2 }
    local g = assert(fresh:group("room", { join = false, watch = function() end }))
    local got = {}
    for i = 1, 5 do
      local l = assert(g:members())
      got[i] = l[addr] or "missing"
    end
    fresh:close{ linger = 0 }
    assert.are.same({ "m", "m", "m", "m", "m" }, got)
  end)

  it("keeps a service registered before it callable after it", function()
    local ctx, ns, ns_child = S.ns_context{ timeout = 2 }
    local server = S.lua(kids.prelude .. [==[
local ctx = lecho.context{ nameserver = opts.ns, quiet = true }
assert(ctx:service("echo", function(a) return a, ctx.addr end))
io.stdout:write("ready ", ctx.addr, "\n")
ctx:after(60, function() ctx:stop() end)
ctx:run()
]==], cjson.encode({ ns = ns }))
    local saddr = (assert(S.wait_file(server.out, "ready %S+\n", 20), "server did not start: " .. S.errors(server)))
                  :match("ready (%S+)")
    local r1, r2 = ctx:call("echo", 1, { timeout = 5 })
    assert.are.same({ 1, saddr }, { r1, r2 })
    S.kill(ns_child, "KILL")
    S.wait(ns_child, 5)
    pause(ctx, 0.5)
    -- (the script's default recovery window, 3 s: the server's redial
    -- backoff, up to retry_max 2 s, and its rejoin, every 0.5 s, fit in it;
    -- a caller whose join comes in the window is answered once it closed)
    restart(ns, 3)
    -- a call goes through (the caller too joins again; its member list
    -- comes from the restarted name server)
    local got
    assert.is_true(S.run_until(ctx, function()
      local a, b = ctx:call("echo", 2, { timeout = 2 })
      got = { a, b }
      return a == 2
    end, 10), "no call went through after the restart: " .. tostring(got and got[2]))
    assert.are.same({ 2, saddr }, got)
    -- and a caller that starts after the restart finds it too: its lookup
    -- and join are held while the name server recovers, which is 3 s from
    -- the first message, or from the last lookup of a context that lost it
    -- (the server's: it dials again at least every retry_max, 2 s), so
    -- its timeout outlasts both (make asan: the server's lookup came 1.9 s
    -- after the caller's, the window ended 4.9 s after the caller began)
    local late = lecho.context{ quiet = true, nameserver = ns }
    local a, b = late:call("echo", 3, { timeout = 3 + 2 + 2 * S.SLOW })
    late:close{ linger = 0 }
    assert.are.same({ 3, saddr }, { a, b })
  end)
end)
