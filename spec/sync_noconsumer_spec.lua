-- A sync event that reaches a consuming context where no handler runs for
-- it (its consumer closed just before: the producer has not learnt it yet)
-- fails with code "noconsumer", never true: README, "submit_sync returns
-- true only when every consumer ran its handler".  Found by an outside
-- reviewer: the consuming context answered such an event with an ACK of 0
-- handlers and no error, which the producer took for success.  Also from
-- a peer of before this fix (an ACK of 0 handlers, no entry), read by the
-- producer as "no handler ran"; a modulator's sync marker (an event the
-- modulator filtered) stays true.
--
-- Run: make && LUA_PATH="$PWD/lua/?.lua;$PWD/lua/?/init.lua;;" \
--   LUA_CPATH="$PWD/lua/?.so;;" LECHO_ROOT=$PWD luajit /usr/bin/busted spec/sync_noconsumer_spec.lua

local S = require "spec.support"
local core = require "lecho.core"
local socket = require "socket"

local function drive(ctxs, done, seconds)
  local deadline = socket.gettime() + (seconds or 5)
  while not done() do
    assert(socket.gettime() < deadline, "timed out")
    for _, c in ipairs(ctxs) do c:run_once(0.01) end
  end
end

-- Busy loops on every core for `secs` (the conditions users meet).
local function busy(n, secs)
  for _ = 1, n do
    S.lua(("local t = os.time() + %d while os.time() < t do end"):format(secs))
  end
end

describe("a sync event no handler ran for", function()
  local nsc, ns, ctx
  before_each(function()
    nsc, ns = S.nameserver("--quiet")
    ctx = require("lecho").context{ nameserver = ns, quiet = true }
  end)
  after_each(function() S.kill(nsc, "CONT"); S.end_world(ctx); ctx = nil end)

  it("fails with noconsumer when the consumer closed just before (real processes, busy cores)", function()
    -- The consumer closes its consumer on its first event and keeps its
    -- context open: the sync events after it come to a context with no
    -- consumer of the channel until the producer learns it left.
    local child = S.lua([[
      local lecho = require "lecho"
      local ctx = lecho.context{ nameserver = arg[1], quiet = true }
      local ch = ctx:channel("gone")
      local ran = 0
      local c
      c = assert(ch:consumer(function(ev)
        ran = ran + 1
        if ev ~= "probe" then ctx:after(0, function() c:close() end) end
      end))
      io.stdout:write("ready\n"); io.stdout:flush()
      ctx:after(8, function() ctx:stop() end)
      ctx:run()
      io.stdout:write(("ran %d in %d\n"):format(ran, ctx:stats().channels[ch.name].events_in or -1))
      io.stdout:flush()
      ctx:close()
    ]], ns)
    assert(S.wait_file(child.out, "ready", 20), S.errors(child))
    busy(2, 6)
    local p = assert(ctx:channel("gone"):producer())
    -- the consumer is known to the producer before the first event
    assert.is_true(S.run_until(ctx, function() return p:submit_sync("probe", { timeout = 3 }) end, 10))
    -- The window made wide: the name server (the channel's manager) is
    -- stopped, so the consumer's leave reaches this producer only when it
    -- goes on.  The first is handled (and closes the consumer), the others
    -- reach a context with no consumer of the channel left.
    S.kill(nsc, "STOP")
    local res = {}
    for i = 1, 4 do res[i] = { p:submit_sync({ i = i }, { timeout = 3 }) } end
    assert.is_true(res[1][1], tostring(res[1][2]))
    for i = 2, 4 do
      assert.is_nil(res[i][1], ("sync %d returned true: no handler ran for it"):format(i))
      assert.equals("noconsumer", res[i][3], tostring(res[i][2]))
    end
    -- each answered by the consuming context, not refused at once by this
    -- producer: it names that context and the channel
    for i = 2, 4 do
      assert.truthy(tostring(res[i][2]):match("^127%.0%.0%.1:%d+: no consumer of [^ ]*/gone at 127%.0%.0%.1:%d+ any more"),
                    tostring(res[i][2]))
    end
    -- once the manager goes on, the producer learns it: at once, from here
    S.kill(nsc, "CONT")
    assert.is_true(S.run_until(ctx, function()
      return select(2, p:submit_sync("late", { timeout = 3 })) == "no consumer of gone"
    end, 10))
    local ok = S.wait(child, 15, ctx)
    assert.truthy(ok)
    -- the probe and sync 1 ran, nothing else
    local ran = S.output(child):match("ran (%d+)")
    assert.equals("2", ran, S.output(child))
  end)
end)

describe("a consuming context's answer for a sync event no handler ran for (core)", function()
  local c, r, ch, rch
  before_each(function()
    c, r = core.new(), core.new()
    assert(c:listen("127.0.0.1:0"))
    assert(r:listen("127.0.0.1:0"))
    ch = c:channel("127.0.0.1:1/nobody")
    rch = r:channel("127.0.0.1:1/nobody")
    c:set_dests(ch, { r:addr() })
  end)
  after_each(function() c:close(); r:close() end)

  local function result(sid)
    local ok, errs, code
    drive({ c, r }, function() ok, errs, code = c:sync_result(sid); return ok ~= false end)
    return ok, errs, code
  end

  it("the channel open there but no consumer left: code noconsumer from its ACK", function()
    -- r has the channel open (bound) and no local consumer: C answers
    r:set_local(rch, true)
    r:hooks({ event = function() return false, 1, nil end })
    assert.equals(true, result(assert(c:submit(ch, 1, 1, "v", true, "block"))))
    r:set_local(rch, false)
    local ok, errs = result(assert(c:submit(ch, 1, 2, "v", true, "block")))
    assert.is_nil(ok)
    assert.same({ { context = r:addr(), consumer = r:addr(), code = "noconsumer",
                    err = "no consumer of 127.0.0.1:1/nobody at " .. r:addr() .. " any more: not handled" } }, errs)
  end)

  it("an ACK of 0 handlers and no error (a peer of before) is no handler run: noconsumer", function()
    r:set_local(rch, true)
    r:hooks({ event = function() return false, 0, nil end })
    local ok, errs = result(assert(c:submit(ch, 1, 1, "v", true, "block")))
    assert.is_nil(ok)
    assert.same({ { context = r:addr(), code = "noconsumer",
                    err = "consumer context " .. r:addr() .. ": no handler ran (no consumer of the channel there any more)" } },
                errs)
  end)

  it("a sync marker (producer 0, seq 0: the modulator sent nothing) answered with 0 handlers is true", function()
    r:set_local(rch, true)
    r:hooks({ event = function() return false, 0, nil end })
    assert.equals(true, result(assert(c:submit(ch, 0, 0, nil, true, "block"))))
    -- and so with no consumer left there at all
    r:set_local(rch, false)
    assert.equals(true, result(assert(c:submit(ch, 0, 0, nil, true, "block"))))
  end)

  it("a local consumer closed before the local queue ran: noconsumer", function()
    local lch = c:channel("127.0.0.1:1/here")
    c:set_local(lch, true)
    c:hooks({ event = function() return false, 1, nil end })
    local sid = assert(c:submit(lch, 1, 1, "v", true, "block"))
    c:set_local(lch, false)
    c:drain_local()
    local ok, errs = c:sync_result(sid)
    assert.is_nil(ok)
    assert.equals("noconsumer", errs[1].code)
  end)
end)

describe("the Lua dispatch of a sync event no consumer ran for", function()
  it("answers code noconsumer (a closed consumer, a list left empty); a sync marker and an async event nothing", function()
    local lecho = require "lecho"
    local ctx = lecho.context{ quiet = true, listen = "127.0.0.1:0" }
    local ch = ctx:channel("lua_gone")
    local ran = 0
    local c = assert(ch:consumer(function() ran = ran + 1 end))
    assert.same({ 1 }, { ctx:_on_event(ch.chid, "v", 0, 1, 1, 9) })
    -- closed, still listed for the fast path (as while its close goes round)
    c.closed = true
    local nran, errs = ctx:_on_event(ch.chid, "v", 0, 1, 2, 10)
    assert.equals(0, nran)
    assert.same({ { consumer = ctx.addr, code = "noconsumer",
                    err = ("no consumer of %s at %s any more: not handled"):format(ch.name, ctx.addr) } }, errs)
    c.closed = false
    c:close()
    nran, errs = ctx:_on_event(ch.chid, "v", 0, 1, 3, 11)
    assert.equals(0, nran)
    assert.equals("noconsumer", errs[1].code)
    assert.same({ 0 }, { ctx:_on_event(ch.chid, "v", 0, 1, 4, 0) })   -- async: no answer
    assert.same({ 0 }, { ctx:_on_event(ch.chid, nil, 0, 0, 0, 12) })  -- a sync marker
    assert.equals(1, ran)
    ctx:close()
  end)
end)

describe("a sync submit that waits for room under the block policy (issue 28, fifth review)", function()
  it("a sync event the core has no destination for is never settled as handled", function()
    -- (the reviewer's true: the last consuming context went while the
    -- submit waited for room; the handle submits as Producer:submit_sync
    -- does once its own check passed)
    local ctx = require("lecho").context{ quiet = true }
    local p = assert(ctx:channel("nodest"):producer())
    local ok, err, code = p[1]:submit("x", true)   -- p[1]: the producer's handle (producer.lua H)
    assert.is_nil(ok, "a sync record without destinations: " .. tostring(ok))
    assert.equals("noconsumer", code, tostring(err))
    ctx:close()
  end)

  it("keeps its timeout and is never true once its consumer's process is gone", function()
    local nsc, ns = S.nameserver("--quiet")
    local child = S.lua([[
      local lecho = require "lecho"
      local ctx = lecho.context{ nameserver = arg[1], quiet = true }
      assert(ctx:channel("st9"):consumer(function() end))
      io.stdout:write("ready\n"); io.stdout:flush()
      ctx:run(60)
    ]], ns)
    assert(S.wait_file(child.out, "ready", 20), S.errors(child))
    local ctx = require("lecho").context{ nameserver = ns, quiet = true, queue_limit = 1048576 }
    local p = assert(ctx:channel("st9"):producer{ policy = "block" })
    assert(p:submit_sync("warm", { timeout = 10 }))
    S.kill(child, "STOP")   -- stopped: its queue fills, then it is declared dead
    local pad = ("z"):rep(1000)
    for i = 1, 900 do assert(p:submit({ i = i, pad = pad })) end
    local big = ("y"):rep(200000)
    local res = {}
    for k = 1, 3 do
      local t0 = socket.gettime()
      local ok, err, code = p:submit_sync(big, { timeout = 1 })
      res[k] = { ok = ok, code = code, took = socket.gettime() - t0, err = tostring(err) }
    end
    S.kill(child, "KILL")
    for k, r in ipairs(res) do
      assert.is_nil(r.ok, ("sync %d true, after %.1f s"):format(k, r.took))
      assert.truthy(r.code == "timeout" or r.code == "noconsumer", r.code .. ": " .. r.err)
      assert.is_true(r.took < 1 + 0.8, ("sync %d waited %.1f s for a 1 s timeout (%s)"):format(k, r.took, r.err))
    end
    ctx:close{ linger = 0 }
    S.kill(nsc, "KILL")
  end)
end)
