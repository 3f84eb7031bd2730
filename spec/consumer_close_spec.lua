-- Closing a consumer tells the manager without waiting for a loop turn
-- that may never come (issue 28): Consumer:close put the leave off to the
-- next loop turn (so that a close and a new consumer in one go keep the
-- flow), and a program that closed its consumer and then did not run its
-- loop (slept, computed) stayed listed as a consumer of the channel until
-- its liveness ended (~10 s) or, its connection answering, longer; every
-- other process's submit_sync on the channel waited for it and failed
-- meanwhile.  On the main line the leave now goes out at once; a close in
-- a handler keeps the deferral (the loop goes on), and its leave goes out
-- when the loop call returns to the main line first (a handler that
-- closed and stopped the loop).
--
-- Run: make spec BUSTED_ARGS=spec/consumer_close_spec.lua

local lecho = require "lecho"
local cjson = require "cjson"
local socket = require "socket"
local S = require "spec.support"

-- Is addr listed as a consumer of channel `name` by the name server?
local function listed(ctx, name, addr)
  local chans, err = ctx:list()
  assert(chans, err)
  local e = chans[ctx.ns .. "/" .. name]
  return e ~= nil and e.consumers ~= nil and e.consumers[addr] ~= nil
end

-- Serves ctx's loop until pred() or secs pass: seconds it took, or nil.
local function within(ctx, secs, pred)
  local t0 = socket.gettime()
  repeat
    if pred() then return socket.gettime() - t0 end
    S.run_until(ctx, function() return false end, 0.1)
  until socket.gettime() - t0 > secs
  return nil
end

-- `lecho pub NAME VALUE --sync` from another process: exit code, stderr,
-- seconds it took.
local function pub_sync(ns, name, ctx)
  local t0 = socket.gettime()
  local child = S.lecho(("pub %s '\"steer\"' --sync --timeout 8 --nameserver %s"):format(name, ns))
  local done, rc = S.wait(child, 30, ctx)
  assert(done, "lecho pub did not finish: " .. S.errors(child))
  return rc, S.errors(child), socket.gettime() - t0
end

-- A process with one consumer of opts.ch that closes it (how: opts.how) and
-- then sleeps 30 s without running its loop.  It prints its address, then
-- "closed" once the close returned.
local CLOSER = [[
local cjson = require "cjson"
local lecho = require "lecho"
local a = cjson.decode(arg[1])
io.stdout:setvbuf("line")
local ctx = lecho.context{ nameserver = a.ns, quiet = true }
local ch = ctx:channel(a.ch)
local c
c = assert(ch:consumer(function(ev)
  if ev == "close-in-handler" then
    c:close()
    ctx:stop()
  elseif ev == "reopen-in-handler" then
    c:close()
    c = assert(ch:consumer(function() end))
    io.stdout:write("reopened\n")
  end
end))
io.stdout:write(ctx.addr, "\n")
if a.how == "main" then
  c:close()
  io.stdout:write("closed\n")
  os.execute("sleep 30")
elseif a.how == "handler" then
  io.stdout:write("running\n")
  ctx:run()          -- until the handler closed its consumer and stopped
  io.stdout:write("closed\n")
  local t = os.time() + 30
  while os.time() < t do end   -- a busy wait, no loop
elseif a.how == "loop" then
  ctx:after(60, function() ctx:stop() end)
  ctx:run()
end
]]

local function start_closer(ns, name, how)
  local child = S.lua(CLOSER, cjson.encode{ ns = ns, ch = name, how = how })
  local out = S.wait_file(child.out, "\n", 20)
  assert(out, "closer did not start: " .. S.errors(child))
  return child, out:match("^([^\n]+)")
end

-- The same from the C API: spec/support/capi_close.c.
local capi_bin
local function start_capi(ns, name, how)
  capi_bin = capi_bin or S.capi_program(S.root .. "/spec/support/capi_close.c")
  local child = S.spawn(("%s %s %s %s"):format(capi_bin, ns, name, how))
  local out = S.wait_file(child.out, "\n", 20)
  assert(out, "C closer did not start: " .. S.errors(child))
  return child, out:match("^([^\n]+)")
end

-- The closer has said `closed`: within 2 s the name server no longer lists
-- it as a consumer of name, and another process's `lecho pub --sync` then
-- answers in under 4 s (times S.SLOW).  Returns its exit code, error text, seconds.
local function gone(ctx, ns, name, child, addr)
  assert(S.wait_file(child.out, "closed", 20), S.errors(child))
  local t = within(ctx, 2, function() return not listed(ctx, name, addr) end)
  assert.truthy(t, addr .. " still listed as a consumer of " .. name .. " 2 s after its close")
  local rc, err, secs = pub_sync(ns, name, ctx)
  -- (the pub is a new process: make asan's start S.SLOW times dearer; 6 s seen)
  assert.truthy(secs < 4 * S.SLOW, ("submit_sync took %.1f s: %s"):format(secs, err))
  return rc, err
end

describe("a consumer closed, then no loop runs (issue 28)", function()
  local ns
  lazy_setup(function()
    _, ns = S.nameserver("--quiet")
    -- the real consumer of ccB*, another process
    S.consumer{ ns = ns, channels = { "ccB1", "ccB2", "ccB3", "ccB4" }, duration = 300 }
  end)
  lazy_teardown(function() S.cleanup() end)

  it("on the main line: no longer listed, and another process's submit_sync goes through at once", function()
    local ctx = lecho.context{ nameserver = ns, quiet = true }
    local child, addr = start_closer(ns, "ccB1", "main")
    local rc, err = gone(ctx, ns, "ccB1", child, addr)
    assert.are.equal(0, rc, err)
    assert.falsy(err:find(addr, 1, true), err)
    assert.truthy(S.alive(child), "the closer should still be sleeping")
    ctx:close()
  end)

  it("on the main line, the only consumer: no longer listed; submit_sync fails at once (no consumer)", function()
    local ctx = lecho.context{ nameserver = ns, quiet = true }
    local child, addr = start_closer(ns, "ccA1", "main")
    local rc, err = gone(ctx, ns, "ccA1", child, addr)
    assert.are_not.equal(0, rc)
    assert.truthy(err:find("no consumer", 1, true), err)
    ctx:close()
  end)

  it("in a handler that then stops the loop: no longer listed once the loop returned", function()
    local ctx = lecho.context{ nameserver = ns, quiet = true }
    local child, addr = start_closer(ns, "ccB2", "handler")
    assert(S.wait_file(child.out, "running", 20), S.errors(child))
    local p = assert(ctx:channel("ccB2"):producer())
    -- both consumers (the closer's, the real one) run it; the closer's
    -- handler closes its consumer and stops its loop
    assert.is_true(p:submit_sync("close-in-handler", { timeout = 8 }))
    local rc, err = gone(ctx, ns, "ccB2", child, addr)
    assert.are.equal(0, rc, err)
    ctx:close()
  end)

  it("C API, lecho_consumer_close on the main line then sleep: no longer listed, submit_sync goes through", function()
    local ctx = lecho.context{ nameserver = ns, quiet = true }
    local child, addr = start_capi(ns, "ccB3", "main")
    local rc, err = gone(ctx, ns, "ccB3", child, addr)
    assert.are.equal(0, rc, err)
    assert.truthy(S.alive(child), "the C closer should still be sleeping")
    ctx:close()
  end)

  it("C API, lecho_consumer_close in a handler that stops lecho_run, then sleep: no longer listed", function()
    local ctx = lecho.context{ nameserver = ns, quiet = true }
    local child, addr = start_capi(ns, "ccB4", "handler")
    assert(S.wait_file(child.out, "running", 20), S.errors(child))
    local p = assert(ctx:channel("ccB4"):producer())
    assert.is_true(p:submit_sync("close-in-handler", { timeout = 8 }))
    local rc, err = gone(ctx, ns, "ccB4", child, addr)
    assert.are.equal(0, rc, err)
    ctx:close()
  end)

  it("in a handler, closed and opened again: still a consumer, and it runs the next events", function()
    local ctx = lecho.context{ nameserver = ns, quiet = true }
    local child, addr = start_closer(ns, "ccA2", "loop")
    local p = assert(ctx:channel("ccA2"):producer())
    assert.is_true(S.run_until(ctx, function() return p:submit_sync("probe", { timeout = 3 }) end, 15))
    assert.is_true(p:submit_sync("reopen-in-handler", { timeout = 8 }))
    assert(S.wait_file(child.out, "reopened", 20), S.errors(child))
    -- a turn of the closer's loop later: still listed, and it answers
    S.run_until(ctx, function() return false end, 0.5)
    assert.is_true(listed(ctx, "ccA2", addr))
    for _ = 1, 3 do assert.is_true(p:submit_sync("after", { timeout = 8 })) end
    ctx:close()
    S.kill(child, "TERM")
  end)
end)
