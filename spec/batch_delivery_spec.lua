-- Batched delivery (issue 27 item 2): the async events of one read reach
-- Lua in one crossing and run in a loop, and the semantics of issue 8 stay:
-- every event in order, a handler that waits holds back what its peer sends
-- next (no later handler starts before it ends, even from the same read),
-- and a sync submit's true means every earlier event was handled.  With
-- every core busy.
--
-- Run: make && LUA_PATH="$PWD/lua/?.lua;$PWD/lua/?/init.lua;;" \
--   LUA_CPATH="$PWD/lua/?.so;;" LECHO_ROOT=$PWD luajit /usr/bin/busted spec/batch_delivery_spec.lua

local cjson = require "cjson"
local S = require "spec.support"
local R = require "spec.support.rogue"

local N = 20000

-- The producer: N small async events in one burst, then a sync one.
local PRODUCER = [[
local lecho = require "lecho"
local cjson = require "cjson"
local ctx = lecho.context{ nameserver = arg[1], quiet = true }
local p = assert(ctx:channel("batched"):producer())
local n = tonumber(arg[2])
for i = 1, n do assert(p:submit(i)) end
local ok, err, code = p:submit_sync("end", { timeout = 60 })
print(cjson.encode({ ok = ok or false, err = err and tostring(err) or nil, code = code }))
io.stdout:flush()
ctx:close()
]]

describe("batched delivery with every core busy", function()
  local ns, ctx, busy
  before_each(function()
    ns, ctx = S.world()
    busy = S.busy_loops(2)
  end)
  after_each(function()
    for _, b in ipairs(busy or {}) do S.kill(b, "KILL") end
    S.end_world(ctx)
    ctx = nil
  end)

  it("runs a read's events in one crossing, in order; a waiting handler holds the rest; sync means handled", function()
    local seen, running, overlap, final = {}, nil, nil, nil
    local waits = 0
    assert(ctx:channel("batched"):consumer(function(ev)
      if running then overlap = overlap or ("%s started while %s waited"):format(tostring(ev), running) end
      if ev == "end" then final = #seen; return end
      running = ev
      seen[#seen + 1] = ev
      if ev % 2000 == 1000 then waits = waits + 1; ctx:sleep(0.01) end
      running = nil
    end))
    -- the crossings into Lua for events: one per batch, or one per event
    local C = getmetatable(ctx)
    local ob, od = C._dispatch_batch, C._dispatch
    local crossings = 0
    if ob then C._dispatch_batch = function(...) crossings = crossings + 1; return ob(...) end end
    C._dispatch = function(...) crossings = crossings + 1; return od(...) end
    local prod = S.lua(PRODUCER, ns, tostring(N))
    local ok = S.run_until(ctx, function() return final ~= nil end, 90)
    C._dispatch_batch, C._dispatch = ob, od
    assert(ok, "the sync event never came; producer: " .. S.errors(prod):sub(1, 1500))
    assert.is_nil(overlap)
    assert.equals(N, final) -- the sync event ran after every earlier one
    assert.equals(N, #seen)
    for i = 1, N do
      if seen[i] ~= i then error(("event %d came as %s"):format(i, tostring(seen[i]))) end
    end
    assert.equals(N / 2000, waits)
    -- the producer's true came after all that
    assert(S.wait_file(prod.out, "{", 30), "no result from the producer: " .. S.errors(prod):sub(1, 1500))
    local r = cjson.decode(S.output(prod):match("{[^\n]*"))
    assert.is_true(r.ok, tostring(r.err))
    assert.is_true(crossings < N / 8, ("%d crossings for %d events"):format(crossings, N))
  end)

  it("runs the events before a bad value of the same read, in order, and closes that connection", function()
    local got = {}
    local ch = ctx:channel("mid")
    assert(ch:consumer(function(ev) got[#got + 1] = ev end))
    local srv = assert(R.listen())   -- the address the rogue claims
    -- (this process serves the context: the handshake's answer is read
    -- between loop turns)
    local p, err = R.dial(ctx.addr, { addr = srv.addr, hello_only = true })
    assert(p, "the rogue's dial: " .. tostring(err))
    local up = false
    assert.is_true(S.run_until(ctx, function()
      local t = p:read(0.005)
      up = up or t == R.F.HELLO_OK
      return up
    end, 10), "no HELLO_OK")
    local name = ch.name
    -- one write: three good events, a value that does not decode, a good one
    p:send(R.bind(0, name) .. R.event(0, 1, 1, 0, 1) .. R.event(0, 1, 2, 0, 2) .. R.event(0, 1, 3, 0, 3)
           .. R.event(0, 1, 4, 0, "\9", true) .. R.event(0, 1, 5, 0, 5))
    local d
    assert.is_true(S.run_until(ctx, function()
      if not d then
        local t, body = p:read(0.005)
        if t == R.F.ERROR then d = body end
      end
      return d ~= nil and #got >= 3
    end, 20), "no ERROR for the bad value; got " .. #got .. " events")
    S.run_until(ctx, function() return false end, 0.3)
    assert.same({ 1, 2, 3 }, got)
    assert.matches("^malformed event value", d)
    p:close()
    srv.s:close()
  end)
end)
