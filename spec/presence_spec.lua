-- Issue 12, point 4: several name servers (the `nameserver` option as a
-- list, ctx.nslist) and presence with leases (ctx:group, the name server's
-- gjoin/gleave/glist/gwatch ops).  Real processes on 127.0.0.1, ports chosen
-- by the OS, every wait bounded, every child killed at cleanup.
local lecho = require "lecho"
local cjson = require "cjson"
local S = require "spec.support"
local kids = require "spec.children"

-- The message fn(...) raises, without its position.
local function raised(fn, ...)
  local ok, err = pcall(fn, ...)
  assert.is_false(ok, "did not raise")
  return (tostring(err):gsub("^[^:]*:%d+: ", ""))
end

describe("the nameserver option", function()
  local ctx
  after_each(function()
    if ctx then ctx:close{ linger = 0 } end
    ctx = nil
    S.cleanup()
  end)

  it("takes one address: ctx.ns is it, ctx.nslist the list of it", function()
    local _, ns = S.nameserver("--quiet")
    ctx = lecho.context{ quiet = true, nameserver = ns }
    assert.are.equal(ns, ctx.ns)
    assert.are.same({ ns }, ctx.nslist)
  end)

  it("is this context's own address in nslist when omitted (embedded name server)", function()
    ctx = lecho.context{ quiet = true }
    assert.are.equal(ctx.addr, ctx.ns)
    assert.are.same({ ctx.addr }, ctx.nslist)
  end)

  it("takes an ordered list: ctx.ns is the first, channels are looked up there", function()
    local _, a = S.nameserver("--quiet")
    local _, b = S.nameserver("--quiet")
    ctx = lecho.context{ quiet = true, nameserver = { b, a } }
    assert.are.same({ b, a }, ctx.nslist)
    assert.are.equal(b, ctx.ns)
    local ch = ctx:channel("x")
    assert.are.equal(ctx.ns .. "/x", ch.name)
    assert(ch:producer())
    -- the channel was made at the first name server, not at the second
    local chans = assert(ctx:list(ctx.ns))
    assert.is_table(chans[ctx.ns .. "/x"])
    chans = assert(ctx:list(a))
    assert.is_nil(chans[ctx.ns .. "/x"])
  end)

  it("refuses a list with an address twice, or a bad one, saying which", function()
    assert.are.equal("lecho: nameserver 127.0.0.1:7 is listed twice",
                     raised(lecho.context, { quiet = true, nameserver = { "127.0.0.1:7", "127.0.0.1:7" } }))
    assert.matches("^lecho: bad nameserver 'nope'",
                   raised(lecho.context, { quiet = true, nameserver = { "127.0.0.1:7", "nope" } }))
    assert.matches("^lecho%.context: nameserver must be an address string .* or a list of 1 to 16",
                   raised(lecho.context, { quiet = true, nameserver = {} }))
    local many = {}
    for i = 1, 17 do many[i] = "127.0.0.1:" .. i end
    assert.matches("list of 1 to 16", raised(lecho.context, { quiet = true, nameserver = many }))
    assert.are.equal("lecho.context: manager takes one nameserver (the name server it registers with), not a list",
                     raised(lecho.context, { quiet = true, manager = true,
                                             nameserver = { "127.0.0.1:7", "127.0.0.1:8" } }))
  end)
end)

-- A member process (spec/children.lua group_member) of group `group` at
-- the name servers `ns` (a list); returns the child and its address.
local function member(ns, group, o)
  o = o or {}
  o.ns, o.group = ns, group
  local child = S.lua(kids.group_member, cjson.encode(o))
  local out = S.wait_file(child.out, "ready %S+\n", 20)
  assert(out, "member did not join: " .. S.output(child) .. S.errors(child))
  return child, out:match("ready (%S+)")
end

-- A watcher in this process: the group, and the list of what it was told
-- ({ at = ctx:now(), joined =, left = } each).
local function watcher(ctx, group, o)
  local seen = {}
  o = o or {}
  o.watch = function(c) seen[#seen + 1] = { at = ctx:now(), joined = c.joined, left = c.left } end
  local g, err, code = ctx:group(group, o)
  assert(g, tostring(err) .. " " .. tostring(code))
  return g, seen
end

-- How many notices in `seen` say `addr` left (and the last why), or joined.
local function lefts(seen, addr)
  local n, why, at = 0, nil, nil
  for _, c in ipairs(seen) do
    if c.left[addr] then n, why, at = n + 1, c.left[addr], c.at end
  end
  return n, why, at
end
local function joins(seen, addr)
  local n = 0
  for _, c in ipairs(seen) do
    if c.joined[addr] ~= nil then n = n + 1 end
  end
  return n
end

-- Who the watcher believes online now (the fold of what it was told).
local function online(seen)
  local on = {}
  for _, c in ipairs(seen) do
    for a, d in pairs(c.joined) do on[a] = d end
    for a in pairs(c.left) do on[a] = nil end
  end
  return on
end

local function count(t)
  local n = 0
  for _ in pairs(t) do n = n + 1 end
  return n
end

describe("a group", function()
  local ctx
  after_each(function()
    if ctx then ctx:close{ linger = 0 } end
    ctx = nil
    S.cleanup()
  end)

  it("is joined, listed with each member's data, watched, and left (the others told 'left')", function()
    local _, ns = S.nameserver("--quiet")
    ctx = lecho.context{ quiet = true, nameserver = ns }
    local g, seen = watcher(ctx, "chat", { lease = 2, data = { nick = "me" } })
    local _, a1 = member({ ns }, "chat", { lease = 2, data = { nick = "ann" }, leave_after = 1.5 })
    local _, a2 = member({ ns }, "chat", { lease = 2, data = { nick = "bob", n = 2 } })
    assert.is_true(S.run_until(ctx, function() return count(online(seen)) == 3 end, 10))
    local m = assert(g:members())
    assert.are.same({ [ctx.addr] = { nick = "me" }, [a1] = { nick = "ann" }, [a2] = { nick = "bob", n = 2 } }, m)
    assert.are.same(m, online(seen))
    -- ann leaves: told once, as "left", and the list no longer has her
    assert.is_true(S.run_until(ctx, function() return lefts(seen, a1) > 0 end, 10))
    S.run_until(ctx, function() return false end, 0.5)
    local n, why = lefts(seen, a1)
    assert.are.same({ 1, "left" }, { n, why })
    assert.are.equal(1, joins(seen, a1))
    m = assert(g:members())
    assert.is_nil(m[a1])
    assert.are.same({ nick = "bob", n = 2 }, m[a2])
    -- a watcher that is not a member sees the same, and is not listed
    local w = lecho.context{ quiet = true, nameserver = ns }
    local seen2 = {}
    local wg = assert(w:group("chat", { join = false, lease = 1, watch = function(c) seen2[#seen2 + 1] = c end }))
    assert.is_true(S.run_until(w, function() return count(online(seen2)) == 2 end, 5))
    assert.is_nil(assert(wg:members())[w.addr])
    w:close{ linger = 0 }
    -- leaving twice is harmless; the group at the name server lists who is left
    assert.is_true(g:leave())
    assert.is_true(g:leave())
    local r = assert(ctx:request(ns, { op = "glist", group = "chat" }))
    assert.are.same({ a2 }, require("lecho.registry").sorted_keys(r.members))
  end)

  it("loses a member killed with SIGKILL after its lease; the others are told once, 'expired'", function()
    local _, ns = S.nameserver("--quiet")
    ctx = lecho.context{ quiet = true, nameserver = ns }
    local g, seen = watcher(ctx, "room", { lease = 1 })
    local child, a = member({ ns }, "room", { lease = 1 })
    assert.is_true(S.run_until(ctx, function() return online(seen)[a] ~= nil end, 10))
    S.kill(child, "KILL")
    local t0 = ctx:now()
    -- lease (1 s) + 2 s, generous: the name server's tick is 0.1 s
    assert.is_true(S.run_until(ctx, function() return lefts(seen, a) > 0 end, 3), "not told within lease + 2 s")
    local _, why, at = lefts(seen, a)
    assert.are.equal("expired", why)
    assert.is_true(at - t0 <= 3)
    S.run_until(ctx, function() return false end, 1)
    assert.are.equal(1, lefts(seen, a))
    assert.is_nil(assert(g:members())[a])
  end)

  it("loses a SIGSTOPped member after its lease, and has it again after SIGCONT", function()
    local _, ns = S.nameserver("--quiet")
    ctx = lecho.context{ quiet = true, nameserver = ns }
    local g, seen = watcher(ctx, "room", { lease = 1 })
    local child, a = member({ ns }, "room", { lease = 1, data = "x" })
    assert.is_true(S.run_until(ctx, function() return online(seen)[a] ~= nil end, 10))
    S.kill(child, "STOP")
    assert.is_true(S.run_until(ctx, function() return lefts(seen, a) > 0 end, 3), "not told within lease + 2 s")
    assert.are.equal("expired", select(2, lefts(seen, a)))
    assert.is_nil(assert(g:members())[a])
    S.kill(child, "CONT")
    -- its beacon (every lease/3) joins it again
    assert.is_true(S.run_until(ctx, function() return online(seen)[a] ~= nil end, 3), "not back within 3 s")
    assert.are.equal("x", assert(g:members())[a])
    assert.are.same({ 1, 2 }, { (lefts(seen, a)), joins(seen, a) })
  end)
end)

describe("a group at two name servers", function()
  local ctx
  after_each(function()
    if ctx then ctx:close{ linger = 0 } end
    ctx = nil
    S.cleanup()
  end)

  it("answers members() throughout while one is killed and restarted, and tells no false 'left'", function()
    local nsa_child, nsa = S.nameserver("--quiet")
    local _, nsb = S.nameserver("--quiet")
    ctx = lecho.context{ quiet = true, nameserver = { nsa, nsb }, timeout = 1 }
    local g, seen = watcher(ctx, "pool", { lease = 1.5 })
    local _, a1 = member({ nsa, nsb }, "pool", { lease = 1.5, data = 1, timeout = 1 })
    local _, a2 = member({ nsb, nsa }, "pool", { lease = 1.5, data = 2, timeout = 1 })
    assert.is_true(S.run_until(ctx, function() return count(online(seen)) == 3 end, 10))
    local want = { [ctx.addr] = {}, [a1] = 1, [a2] = 2 }
    assert.are.same(want, assert(g:members()))
    S.kill(nsa_child, "KILL")
    S.wait(nsa_child, 5)
    -- the first name server is gone: the list comes from the second
    local t0 = ctx:now()
    while ctx:now() - t0 < 2 do
      assert.are.same(want, assert(g:members()))
      S.run_until(ctx, function() return false end, 0.2)
    end
    -- restarted on the same port, it has the members again within a beacon
    local port_file = S.tmpname("ns-addr")
    local argv = require("spec.support.proc").nameserver_argv{ root = S.root, luajit = S.luajit, listen = nsa,
      port_file = port_file, args = { "--for", "120", "--settle", "0", "--quiet" } }
    S.spawn(require("spec.support.proc").sh_join(argv))
    assert(S.wait_file(port_file, "\n", 10), "the name server did not restart")
    local back = S.run_until(ctx, function()
      local r = ctx:request(nsa, { op = "glist", group = "pool" })
      return r and count(r.members) == 3
    end, 1.5 / 3 + 2)
    assert.is_true(back, "not every member registered again at the restarted name server")
    for _ = 1, 5 do
      assert.are.same(want, assert(g:members()))
      S.run_until(ctx, function() return false end, 0.2)
    end
    -- nobody was ever said to have left
    for _, c in ipairs(seen) do assert.are.same({}, c.left) end
    assert.are.same(want, online(seen))
  end)
end)
