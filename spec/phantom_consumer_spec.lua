-- A context that was both a consumer and a producer of a channel closes both
-- (issue 28, the seventh outside review, a BLOCKER): after c:close();
-- p:close() in one turn the manager kept listing the context as a consumer
-- for as long as it ran (`lecho ls` showed it), and every other process's
-- submit_sync on the channel failed with "no consumer of ... at <it> any
-- more: not handled" (noconsumer).  The producer's leave forgot the
-- channel's manager while the consumer's leave still waited for the next
-- turn, which then had nowhere to go.  The gateway's client teardown closes
-- in that order (unsubscribe, then release the producer): a browser or a
-- JSON-lines client that subscribed and published to a channel, then went
-- away, left it.  Every order is checked, with and without a loop turn
-- between the closes; and a producer's join that failed (the manager's
-- address forgotten) must not cost the consumer's leave either.
--
-- Run: make spec BUSTED_ARGS=spec/phantom_consumer_spec.lua

local lecho = require "lecho"
local cjson = require "cjson"
local socket = require "socket"
local S = require "spec.support"
local P = require "spec.support.proc"
package.path = S.root .. "/spec/support/?.lua;" .. package.path
local W = require "wsclient"

local CASES = {
  { "consumer then producer, in one turn", "c", "p", false },
  { "consumer then producer, a loop turn between", "c", "p", true },
  { "producer then consumer, in one turn", "p", "c", false },
  { "producer then consumer, a loop turn between", "p", "c", true },
}

-- Is addr listed as a consumer of channel `name` by the name server (which
-- manages every channel here)?  Asked from ctx (its loop runs meanwhile).
-- (role: "producers" to ask of producers; at: the manager to ask, else
-- the name server)
local function listed(ctx, name, addr, role, at)
  local chans, err = ctx:list(at)
  assert(chans, err)
  local e = chans[ctx.ns .. "/" .. name]
  local set = e and e[role or "consumers"]
  return set ~= nil and set[addr] ~= nil
end

-- Runs ctx's loop until addr is no longer a listed consumer (or `role`) of
-- `name`, at most `secs` seconds: true when it left.
local function left(ctx, name, addr, secs, role, at)
  local deadline = socket.gettime() + secs
  repeat
    if not listed(ctx, name, addr, role, at) then return true end
    S.run_until(ctx, function() return false end, 0.1)
  until socket.gettime() > deadline
  return not listed(ctx, name, addr, role, at)
end

-- `lecho pub NAME VALUE --sync` from another process, ctx's loop served
-- meanwhile (so that a phantom consumer there answers, as it did when it
-- was found): its exit code and its stderr.
local function pub_sync(ns, name, ctx)
  local child = S.lecho(("pub %s '\"steer\"' --sync --timeout 5 --nameserver %s"):format(name, ns))
  local done, rc = S.wait(child, 30, ctx)
  assert(done, "lecho pub did not finish: " .. S.errors(child))
  return rc, S.errors(child)
end

describe("a context that consumed and produced a channel, both closed (issue 28, review 7)", function()
  local nsc, ns
  lazy_setup(function()
    nsc, ns = S.nameserver("--quiet")
    -- the real consumer of every channel below, another process
    local names = {}
    for i = 1, #CASES + 4 do names[i] = "steer" .. i end
    S.consumer{ ns = ns, channels = names, duration = 300 }
  end)
  lazy_teardown(function() S.cleanup() end)

  for i, case in ipairs(CASES) do
    local what, first, second, turn = case[1], case[2], case[3], case[4]
    it("leaves no phantom consumer: " .. what, function()
      local name = "steer" .. i
      local ctx = lecho.context{ nameserver = ns, quiet = true }
      local ran = 0
      local c = assert(ctx:channel(name):consumer(function() ran = ran + 1 end))
      local p = assert(ctx:channel(name):producer())
      -- both consumers (this one, the real one) ran it
      assert.is_true(S.run_until(ctx, function() return p:submit_sync("probe", { timeout = 3 }) end, 15))
      assert.are.equal(1, ran)
      local ends = { c = c, p = p }
      ends[first]:close()
      if turn then ctx:run_once(0) end
      ends[second]:close()
      local gone = left(ctx, name, ctx.addr, 5)
      -- another process's submit_sync: true (the real consumer ran it), no
      -- error from this context, which consumes nothing any more
      local rc, err = pub_sync(ns, name, ctx)
      assert.are.equal(0, rc, err)
      assert.falsy(err:find(ctx.addr, 1, true), err)
      assert.falsy(err:find("no consumer", 1, true), err)
      assert.is_true(gone, ctx.addr .. " still listed as a consumer of " .. name)
      assert.are.equal(1, ran)
      ctx:close()
    end)
  end

  it("leaves no phantom consumer when closed, opened again and closed with the producer in one turn", function()
    local name = "steer" .. (#CASES + 1)
    local ctx = lecho.context{ nameserver = ns, quiet = true }
    local ch = ctx:channel(name)
    local c = assert(ch:consumer(function() end))
    local p = assert(ch:producer())
    assert.is_true(S.run_until(ctx, function() return p:submit_sync("probe", { timeout = 3 }) end, 15))
    c:close(); p:close()
    -- opened again at once: a consumer again (on the main line the leave
    -- went out at the close, and this joins again: consumer_close_spec)
    local ran = 0
    local c2 = assert(ch:consumer(function() ran = ran + 1 end))
    assert.is_true(S.run_until(ctx, function() return listed(ctx, name, ctx.addr) end, 5))
    local rc, err = pub_sync(ns, name, ctx)
    assert.are.equal(0, rc, err)
    assert.are.equal(1, ran)
    c2:close()
    assert.is_true(left(ctx, name, ctx.addr, 5), ctx.addr .. " still listed as a consumer of " .. name)
    rc, err = pub_sync(ns, name, ctx)
    assert.are.equal(0, rc, err)
    assert.falsy(err:find(ctx.addr, 1, true), err)
    ctx:close()
  end)

  -- The consumer's leave goes to the manager it joined even when the
  -- channel's manager was forgotten since: here by a producer's join that
  -- timed out (the name server stopped meanwhile).
  it("leaves no phantom consumer after a producer's join failed", function()
    local name = "steer" .. (#CASES + 2)
    local ctx = lecho.context{ nameserver = ns, quiet = true, timeout = 1 }
    local ch = ctx:channel(name)
    local c = assert(ch:consumer(function() end))
    assert.is_true(listed(ctx, name, ctx.addr))
    S.kill(nsc, "STOP")
    local ok, p, perr = pcall(ch.producer, ch)
    S.kill(nsc, "CONT")
    assert(ok, p)
    assert.is_nil(p, "the producer's join should have timed out")
    assert.truthy(perr)
    c:close()
    assert.is_true(left(ctx, name, ctx.addr, 5), ctx.addr .. " still listed as a consumer of " .. name)
    -- nor as a producer: the join the name server answered too late was
    -- taken back (a producer the manager lists and this context does not know)
    assert.is_true(left(ctx, name, ctx.addr, 5, "producers"), ctx.addr .. " still listed as a producer of " .. name)
    local rc, err = pub_sync(ns, name, ctx)
    assert.are.equal(0, rc, err)
    assert.falsy(err:find(ctx.addr, 1, true), err)
    ctx:close()
  end)
  -- The gateway's client teardown: a client that subscribed to a channel and
  -- published to it (a browser that steered in the live view, then closed
  -- the tab; a device over JSON lines) goes away.
  for j, how in ipairs({ "JSON lines", "WebSocket" }) do
    it("leaves no phantom consumer at the gateway when a " .. how .. " client that sub'd and pub'd goes", function()
      local name = "steer" .. (#CASES + 2 + j)
      local gw = S.spawn(("%s %s/scripts/lecho-gateway --nameserver %s --http 127.0.0.1:0 --lines 127.0.0.1:0 --for 120")
        :format(S.luajit, S.root, ns))
      local line = P.wait_file(gw.err, "lecho%-gateway: http://[%d.]+:%d+/.-JSON lines on [%d.]+:%d+", 20)
      assert(line, "gateway did not start: " .. S.errors(gw))
      local port = tonumber(how == "JSON lines" and line:match("JSON lines on [%d.]+:(%d+)")
                                                or line:match("lecho%-gateway: http://[%d.]+:(%d+)/"))
      local ctx = lecho.context{ nameserver = ns, quiet = true }
      local before = {}
      for a in pairs((ctx:list() or {})[ns .. "/" .. name].consumers) do before[a] = true end
      local c = assert((how == "JSON lines" and W.lines or W.connect)("127.0.0.1", port))
      assert.are.equal("lecho-gateway", c:json(5).hello)
      c:send_json{ op = "sub", id = 1, ch = name }
      local r = c:json(20, true)
      assert.is_true(r.ok, cjson.encode(r))
      c:send_json{ op = "pub", id = 2, ch = name, data = "steer", sync = true }
      repeat r = c:json(20, true) until r == nil or r.id == 2
      assert.is_true(r and r.ok, cjson.encode(r or {}))
      -- the gateway's context: the consumer the sub added
      local gwaddr
      for a in pairs(ctx:list()[ns .. "/" .. name].consumers) do
        if not before[a] then gwaddr = a end
      end
      assert.truthy(gwaddr, "the gateway's consumer is not listed")
      c:close()
      local gone = left(ctx, name, gwaddr, 5)
      local rc, err = pub_sync(ns, name, ctx)
      assert.are.equal(0, rc, err)
      assert.falsy(err:find(gwaddr, 1, true), err)
      assert.falsy(err:find("no consumer", 1, true), err)
      assert.is_true(gone, gwaddr .. " (the gateway) still listed as a consumer of " .. name)
      ctx:close()
      S.kill(gw, "TERM")
    end)
  end
end)

-- A name server restarted while its channel's manager (a lecho-manager of
-- its own) ran on: the context joined that manager again, which still
-- listed it, and counted one endpoint more; the one leave of each close
-- then left it listed as a consumer and a producer for as long as it ran.
describe("a name server restarted, its manager not (issue 28, review 7)", function()
  after_each(function() S.cleanup() end)

  it("the context's rejoin is its one membership: closing both leaves no phantom", function()
    local nsc, ns = S.nameserver("--quiet")
    local pf = S.tmpname("mgr")
    S.spawn(("%s %s/scripts/lecho-manager --nameserver %s --port-file %s --for 120 --quiet")
      :format(S.luajit, S.root, ns, pf))
    local mgr = S.wait_file(pf, "%d+:%d+", 20)
    assert(mgr, "manager did not start")
    mgr = mgr:match("[^\n]+")
    local name = "rejoined"
    S.consumer{ ns = ns, channels = { name }, duration = 120 }
    local ctx = lecho.context{ nameserver = ns, quiet = true, timeout = 2 }
    local ch = ctx:channel(name)
    local c = assert(ch:consumer(function() end))
    local p = assert(ch:producer())
    assert.are.equal(mgr, ch.manager)
    assert.is_true(S.run_until(ctx, function() return p:submit_sync("probe", { timeout = 3 }) end, 15))
    S.kill(nsc, "KILL")
    S.wait(nsc, 5)
    local port_file = S.tmpname("ns-addr")
    local argv = P.nameserver_argv{ root = S.root, luajit = S.luajit, listen = ns, port_file = port_file,
                                    args = { "--for", "120", "--settle", "2", "--quiet" } }
    S.spawn(P.sh_join(argv))
    assert(S.wait_file(port_file, "\n", 10), "the name server did not restart")
    -- lost, then joined the same manager again
    assert.is_true(S.run_until(ctx, function() return ch.recovering ~= nil end, 10), "the name server's loss not seen")
    assert.is_true(S.run_until(ctx, function() return ch.recovering == nil and ch.manager == mgr end, 20),
                   ("not joined again to %s (manager %s)"):format(mgr, tostring(ch.manager)))
    assert.is_true(listed(ctx, name, ctx.addr, "consumers", mgr))
    c:close(); p:close()
    local gone_c = left(ctx, name, ctx.addr, 5, "consumers", mgr)
    local gone_p = left(ctx, name, ctx.addr, 5, "producers", mgr)
    local rc, err = pub_sync(ns, name, ctx)
    assert.are.equal(0, rc, err)
    assert.falsy(err:find(ctx.addr, 1, true), err)
    assert.is_true(gone_c, ctx.addr .. " still listed as a consumer by the manager")
    assert.is_true(gone_p, ctx.addr .. " still listed as a producer by the manager")
    ctx:close()
  end)
end)
