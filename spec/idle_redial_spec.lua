-- A process that does not run its loop for longer than heartbeat *
-- heartbeat_misses is declared dead by its peers, which close their
-- connections to it.  Its next request (a sync submit, a call, a new
-- producer or consumer) must not fail on those dead sockets ("write: Broken
-- pipe", then "unreachable" for retry_interval): the closes are read first
-- and the peers dialled afresh (lei_live_catch_up).  Review of issue 28,
-- bug 4.
local S = require "spec.support"
local lecho = require "lecho"

-- A consumer, a service and the name server in one child, all with short
-- heartbeats (dead after 0.6 s): it drops an idle peer quickly.
local PEER = [[
local lecho = require "lecho"
local ctx = lecho.context{ quiet = true, heartbeat = 0.3, heartbeat_misses = 2 }
local n = 0
ctx:channel("idle.ch"):consumer(function(ev) if ev.x then n = n + 1 end end)
ctx:channel("idle.other"):consumer(function() end)
ctx:service("idle.svc", function(a) return a.x * 2 end)
local f = assert(io.open(arg[1], "w")); f:write(ctx.ns, "\n"); f:close()
ctx:after(60, function() ctx:stop() end)
ctx:run()
]]

describe("a process idle past its peers' heartbeats", function()
  after_each(function() S.cleanup() end)

  it("sends its next sync submit, call and join on fresh connections", function()
    local file = S.tmpname("ns")
    S.lua(PEER, file)
    local ns = assert(S.wait_file(file, "%d+%.%d+%.%d+%.%d+:%d+\n", 20)):match("(%S+)")
    local ctx = lecho.context{ nameserver = ns, quiet = true, heartbeat = 0.3, heartbeat_misses = 2 }
    local p = assert(ctx:channel("idle.ch"):producer())
    local ok
    for _ = 1, 200 do
      ok = p:submit_sync({ ping = true }, { timeout = 2 })
      if ok then break end
      ctx:sleep(0.05)
    end
    assert.is_true(ok)
    for round = 1, 2 do
      S.sleep(2) -- no loop turn: the peer declares us dead after 0.6 s and closes
      local t0 = ctx:now()
      local ok2, errs, code = p:submit_sync({ x = round }, { timeout = 3 })
      assert.is_true(ok2, ("round %d: %s %s"):format(round, tostring(errs), tostring(code)))
      assert.is_true(ctx:now() - t0 < 2)
      S.sleep(2)
      assert.are.same({ 2 * round }, { ctx:call("idle.svc", { x = round }, { timeout = 3 }) })
      S.sleep(2)
      local p2 = assert(ctx:channel("idle.other"):producer())
      assert.is_true(p2:submit_sync({ y = round }, { timeout = 3 }))
      p2:close()
    end
    assert(ctx:close())
  end)

  -- The walk before every request polls a connection silent past a
  -- heartbeat.  With heartbeats off nothing is ever heard on an idle
  -- connection, and every request polled every idle peer: with 60 of them a
  -- sync submit paid 60 poll() calls (~40 us of CPU, the round trip itself
  -- ~20 us).  A poll that found a connection open counts as hearing from it:
  -- polled again a heartbeat (1 s without heartbeats) later at the earliest.
  it("polls an idle connection at most once a heartbeat, not before every request", function()
    local N = 60
    local ctx = lecho.context{ quiet = true, heartbeat = 0 } -- the name server too
    local file = S.tmpname("up")
    S.lua([[
local lecho = require "lecho"
local cs = {}
for i = 1, ]] .. N .. [[ do
  cs[i] = lecho.context{ quiet = true, heartbeat = 0, nameserver = arg[2] }
  cs[i]:channel("many." .. i):consumer(function() end)
end
local f = assert(io.open(arg[1], "w")); f:write("up\n"); f:close()
local t_end = cs[1]:now() + 60
while cs[1]:now() < t_end do
  cs[1]:run_once(0.002)
  for i = 2, #cs do cs[i]:run_once(0) end
end
]], file, ctx.ns)
    S.run_until(ctx, function() local f = io.open(file) if f then f:close() end return f ~= nil end, 60)
    for i = 1, N do
      local p = assert(ctx:channel("many." .. i):producer())
      local ok
      for _ = 1, 100 do
        ok = p:submit_sync(i, { timeout = 5 })
        if ok then break end
        ctx:sleep(0.05)
      end
      assert.is_true(ok)
    end
    ctx:sleep(1.5) -- every connection silent past "a heartbeat" (1 s with heartbeats off)
    local n = 2000
    local t0 = os.clock()
    for _ = 1, n do ctx:_catch_up() end
    local us = (os.clock() - t0) * 1e6 / n
    -- each of N connections polled once (~N us), then none: ~1 us a request
    -- on average here; N polls every time: ~N us (CPU time, not wall)
    assert.is_true(us < N / 6, ("%d idle peers: %.1f us of CPU per request's walk"):format(N, us))
    assert(ctx:close())
  end)
end)
