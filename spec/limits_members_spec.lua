-- Proves the limits on member lists (issue 11, "duplicate or excessive
-- member lists refused"):
--
--   the manager of a channel is any local process in protected mode (here a
--   name server of the attacker's, which manages the channels of whoever
--   uses it).  A `members` list naming the attacker 20,000 times used to
--   queue every event 20,000 times; one naming 20,000 distinct addresses
--   made the producer dial them all.  Such lists are refused whole
--   (max_members, duplicates, max_peers): the producer keeps the list it
--   had, so the legitimate consumer gets every event; the log says why once;
--   the manager is told in the confirmation (members_ok `refused`), and a
--   manager refuses the consumer join past max_members itself (code limit).
--
-- The producer is a context of this process (the spec drives its loop); the
-- rogue manager and the legitimate consumer are child processes.
--
-- Run: make && LUA_PATH="$PWD/lua/?.lua;$PWD/lua/?/init.lua;;" \
--   LUA_CPATH="$PWD/lua/?.so;;" LECHO_ROOT=$PWD luajit /usr/bin/busted spec/limits_members_spec.lua

local lecho = require "lecho"
local cjson = require "cjson"
local registry = require "lecho.ns.registry"
local S = require "spec.support"
local kids = require "spec.children"

local WAIT = 20


local function received(sink)
  local n = 0
  for _ in (S.read(sink.out) or ""):gmatch("\nev ") do n = n + 1 end
  return n
end

describe("issue 11: member lists within max_members and max_peers", function()
  local ctx, logs
  after_each(function()
    if ctx then ctx:close() end
    ctx = nil
    S.cleanup()
  end)

  local function logged(text)
    local n = 0
    for _, l in ipairs(logs) do if l:find(text, 1, true) then n = n + 1 end end
    return n
  end

  -- The rogue manager, a producer here (opts: more context options) and a
  -- legitimate consumer; returns the rogue, the sink, the channel, its
  -- producer and the file that starts the attack.
  local function world(opts)
    logs = {}
    local go = S.tmpname("go")
    local rogue = S.lua(kids.rogue_manager, cjson.encode{ go = go })
    local ns = assert(S.wait_file(rogue.out, "ready %S+\n", WAIT), "rogue did not start: " .. S.errors(rogue))
      :match("ready (%S+)")
    local o = { nameserver = ns, log = function(m) logs[#logs + 1] = m end }
    for k, v in pairs(opts or {}) do o[k] = v end
    ctx = lecho.context(o)
    local ch = ctx:channel("x")
    local p = assert(ch:producer())
    local sink = S.lua(kids.sink, cjson.encode{ ns = ns, channel = "x", stop_on = "end", duration = 30 })
    assert(S.run_until(ctx, function() return (S.read(sink.out) or ""):find("ready", 1, true) end, WAIT),
           "consumer did not start: " .. S.errors(sink))
    local sink_addr = S.read(sink.out):match("ready (%S+)")
    assert(S.run_until(ctx, function() return ch.dests[1] == sink_addr end, WAIT), "the consumer never joined")
    return rogue, sink, ch, p, go, sink_addr
  end

  -- Sends the attack and waits until the producer answered it.
  local function attack(rogue, go, ch, list)
    list.ch = ch.name
    S.write(go, cjson.encode(list))
    assert(S.run_until(ctx, function()
      local out = S.read(rogue.out) or ""
      return out:find("\nrefused ", 1, true) or out:find("\napplied", 1, true)
    end, WAIT), "the rogue's list was never confirmed: " .. S.output(rogue) .. S.errors(rogue))
    return S.read(rogue.out)
  end

  -- The legitimate flow: n events and "end", every one received in time.
  local function flow(ch, p, sink, n)
    for i = 1, n do
      assert(p:submit({ i = i }))
      if i % 10 == 0 then ctx:run_once(0.001) end
    end
    assert.are.equal(1, ctx:stats().channels[ch.name].destinations)
    assert(p:submit("end"))
    assert(S.run_until(ctx, function() return (S.read(sink.out) or ""):find("\ndone") end, WAIT),
           "the legitimate consumer did not get its events: " .. S.errors(sink))
    assert.are.equal(n + 1, received(sink))
  end

  -- The manager was told why (its "refused" line), the list before stays,
  -- the consumer gets every event, the rogue none, one log line.
  local function refused_whole(out, why, raddr, ch, p, sink, sink_addr)
    assert.truthy(out:find("\nrefused " .. why .. "\n", 1, true), out)
    assert.are.same({ sink_addr }, ch.dests)
    flow(ch, p, sink, 200)
    assert.are.equal(nil, ctx:stats().peers[raddr] and ctx:stats().peers[raddr].events_out > 0 or nil)
    assert.are.equal(1, logged(why .. " (from " .. raddr .. ")"), table.concat(logs, "\n"))
  end

  it("a manager's list naming the attacker 20,000 times is refused whole, the consumer gets every event", function()
    local rogue, sink, ch, p, go, sink_addr = world()
    local list = { sink_addr }
    for i = 2, 20000 do list[i] = "SELF" end
    local out = attack(rogue, go, ch, { consumers = list })
    local raddr = out:match("ready (%S+)")
    local why = ("members of %s refused: 20000 consumers (limit 4096)"):format(ch.name)
    refused_whole(out, why, raddr, ch, p, sink, sink_addr)
  end)

  it("a list naming a context twice is refused whole, the consumer gets every event", function()
    local rogue, sink, ch, p, go, sink_addr = world()
    local out = attack(rogue, go, ch, { consumers = { sink_addr, "SELF", "SELF" } })
    local raddr = out:match("ready (%S+)")
    local why = ("members of %s refused: duplicate consumer %s"):format(ch.name, raddr)
    refused_whole(out, why, raddr, ch, p, sink, sink_addr)
  end)

  it("a list of 20,000 distinct addresses is refused (max_members): nothing is dialled", function()
    local rogue, sink, ch, p, go, sink_addr = world()
    local list = { sink_addr }
    for i = 1, 19999 do list[#list + 1] = ("127.0.0.1:%d"):format(i) end
    local out = attack(rogue, go, ch, { consumers = list })
    assert.truthy(out:find("\nrefused members of " .. ch.name .. " refused: 20000 consumers (limit 4096)\n", 1, true), out)
    local npeers = 0
    for _ in pairs(ctx:stats().peers) do npeers = npeers + 1 end
    assert.is_true(npeers <= 3, "peers: " .. npeers)   -- the name server, the consumer (and back)
    flow(ch, p, sink, 100)
  end)

  it("duplicates and long lists in a modulator's dests are refused the same way", function()
    local rogue, sink, ch, p, go, sink_addr = world()
    local mod = { src = "return { enqueue = function(ev) emit(ev) end }", dests = { sink_addr, sink_addr } }
    local out = attack(rogue, go, ch, { consumers = { sink_addr }, mods = { k1 = mod } })
    assert.truthy(out:find("\nrefused members of " .. ch.name .. " refused: modulator k1: duplicate consumer "
                           .. sink_addr .. "\n", 1, true), out)
    assert.are.same({}, ch.mods)
    flow(ch, p, sink, 50)
  end)

  it("counts max_peers over every channel's lists, and again when a list shrank", function()
    -- (The count is not made over every channel per list any more: 65,536
    -- channels' joins were quadratic, issue 13.  What a channel named
    -- before and names no more must stop counting.)
    logs = {}
    ctx = lecho.context{ max_peers = 3, log = function(m) logs[#logs + 1] = m end }
    local x, y = ctx:channel("x"), ctx:channel("y")
    assert(x:producer())
    assert(y:producer())
    assert(S.run_until(ctx, function() return x.manager and y.manager end, WAIT), "no manager")
    local ver = 2 ^ 40
    local function members(ch, list)
      ver = ver + 1
      ctx:_on_ctrl(ch.manager, { op = "members", ch = ch.name, ver = ver, mid = 1, consumers = list, mods = {} })
      return ch.dests
    end
    local a = {}
    for i = 1, 4 do a[i] = ("127.0.0.1:%d"):format(i) end
    assert.are.same({ a[1], a[2] }, members(y, { a[1], a[2] }))
    assert.are.same({ a[3] }, members(x, { a[3] }))            -- 3 peer contexts, the limit
    assert.are.same({ a[3] }, members(x, { a[3], a[4] }))      -- 4: refused, x keeps its list
    assert.are.equal(1, logged("members of " .. x.name .. " refused: they need 4 peer contexts here (limit 3)"),
                     table.concat(logs, "\n"))
    assert.are.same({}, members(y, {}))
    assert.are.same({ a[3], a[4] }, members(x, { a[3], a[4] })) -- y's two count no more
    assert.are.same({ a[1] }, members(y, { a[1] }))            -- 3 again
    assert.are.same({ a[1] }, members(y, { a[1], a[2] }))      -- 4: refused, y keeps its list
  end)

  it("a list needing more peer contexts than max_peers is refused, nothing dialled", function()
    local rogue, sink, ch, p, go, sink_addr = world{ max_peers = 8 }
    local list = { sink_addr }
    for i = 1, 40 do list[#list + 1] = ("127.0.0.1:%d"):format(i) end
    local out = attack(rogue, go, ch, { consumers = list })
    assert.truthy(out:find("\nrefused members of " .. ch.name .. " refused: they need 41 peer contexts here (limit 8)\n", 1, true),
                  out)
    for a in pairs(ctx:stats().peers) do
      assert.is_nil(a:match("^127%.0%.0%.1:(%d+)$") and tonumber(a:match(":(%d+)$")) <= 40 or nil, a)
    end
    flow(ch, p, sink, 50)
  end)

  it("a consumer past the producer's max_peers is told why (on_error), the others keep their events", function()
    logs = {}
    local _, ns = S.nameserver("--quiet")
    ctx = lecho.context{ nameserver = ns, max_peers = 1, log = function(m) logs[#logs + 1] = m end }
    local ch = ctx:channel("y")
    local p = assert(ch:producer())
    local CONSUMER = [=[
local cjson = require "cjson"
local lecho = require "lecho"
local opts = cjson.decode(arg[1])
io.stdout:setvbuf("line")
local ctx = lecho.context{ nameserver = opts.ns, quiet = true }
local n = 0
assert(ctx:channel("y"):consumer(function(ev)
  n = n + 1
  if ev == "end" then io.stdout:write("done ", n, "\n") ctx:stop() end
end, { on_error = function(msg) io.stdout:write("on_error ", msg, "\n") end }))
io.stdout:write("ready ", ctx.addr, "\n")
ctx:after(30, function() ctx:stop() end)
ctx:run()
ctx:close()
]=]
    local first = S.lua(CONSUMER, cjson.encode{ ns = ns })
    assert(S.run_until(ctx, function() return (S.read(first.out) or ""):find("ready") end, WAIT), S.errors(first))
    local second = S.lua(CONSUMER, cjson.encode{ ns = ns })
    assert(S.run_until(ctx, function() return (S.read(second.out) or ""):find("ready") end, WAIT), S.errors(second))
    local out = S.read(second.out)
    local why = ("on_error producer %s: members of %s refused: they need 2 peer contexts here (limit 1)\n")
                :format(ctx.addr, ch.name)
    assert.truthy(out:find(why, 1, true), out)
    assert.are.equal(1, #ch.dests)
    for i = 1, 30 do assert(p:submit(i)) end
    assert(p:submit("end"))
    assert(S.run_until(ctx, function() return (S.read(first.out) or ""):find("done 31", 1, true) end, WAIT),
           "the first consumer did not get its events: " .. S.read(first.out))
    assert.are.equal(1, logged("members of " .. ch.name .. " refused: they need 2 peer contexts here (limit 1)"),
                     table.concat(logs, "\n"))
  end)

  it("a manager refuses the consumer join past max_members (code limit)", function()
    local out = {}
    local reg = registry.new{ addr = "127.0.0.1:1", role = "nameserver", max_members = 2 }
    local send = function(to, msg) out[#out + 1] = { to = to, msg = msg } end
    local function last_reply(to)
      for i = #out, 1, -1 do
        if out[i].to == to and out[i].msg.op == "reply" then return out[i].msg end
      end
    end
    for i = 1, 3 do
      local c = "127.0.0.1:" .. (100 + i)
      reg:handle(c, { op = "join", ch = "x", role = "consumer", rid = i }, send, 0)
    end
    assert.is_true(last_reply("127.0.0.1:101").ok)
    assert.is_true(last_reply("127.0.0.1:102").ok)
    local r = last_reply("127.0.0.1:103")
    assert.is_false(r.ok)
    assert.are.equal("limit", r.code)
    assert.are.equal("join: channel 'x' has 2 consumer contexts (limit 2)", r.err)
    -- one leaves: there is room again
    reg:handle("127.0.0.1:101", { op = "leave", ch = "x", role = "consumer", rid = 4 }, send, 0)
    reg:handle("127.0.0.1:103", { op = "join", ch = "x", role = "consumer", rid = 5 }, send, 0)
    assert.is_true(last_reply("127.0.0.1:103").ok)
    reg:peer_down("127.0.0.1:102", send, 0)
    reg:handle("127.0.0.1:104", { op = "join", ch = "x", role = "consumer", rid = 6 }, send, 0)
    assert.is_true(last_reply("127.0.0.1:104").ok)
  end)
end)
