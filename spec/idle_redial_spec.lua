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
end)
