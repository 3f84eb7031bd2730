-- Proves the bounds on peer records and dials (issue 11, fix round F3,
-- findings 1 and 4 of the outside attack):
--
--   a manager's member list of 4,000 closed ports (within max_peers) made
--   the producer dial all 4,000 at once (fds up to max_connections), spend
--   most of a CPU looking peers up by address (a linear search per
--   destination per event), starve the legitimate flow on another channel
--   and log one "cannot reach" line per failed dial (34,132 lines in 19 s).
--   Now at most 64 of our dials are in progress, peers are found by a hash,
--   and "cannot reach" goes through lei_ratelog (one line per 10 s).
--
--   a peer record was kept 30 s after its last use: dial, HELLO with a new
--   address, close, repeat made 37,742 records (129 MB) in 12 s.  Past
--   max_peers the records nothing uses are freed at once, oldest first.
--
-- The producer is a context of this process (the spec drives its loop); the
-- rogue manager, the churner and the legitimate consumer are child processes.
--
-- Run: make && LUA_PATH="$PWD/lua/?.lua;$PWD/lua/?/init.lua;;" \
--   LUA_CPATH="$PWD/lua/?.so;;" LECHO_ROOT=$PWD luajit /usr/bin/busted spec/limits_peers_spec.lua

local lecho = require "lecho"
local cjson = require "cjson"
local S = require "spec.support"
local kids = require "spec.children"

local WAIT = 20


-- Dials opts.target opts.n times, each time a protected HELLO claiming a new
-- address, and closes once answered; says "done N answered".
local CHURN = [[
local cjson = require "cjson"
local socket = require "socket"
local R = require "spec.support.rogue"
local opts = cjson.decode(arg[1])
io.stdout:setvbuf("line")
local host, port = opts.target:match("^(.-):(%d+)$")
local ok = 0
for n = 1, opts.n do
  local s = socket.tcp()
  s:settimeout(3)
  if s:connect(host, tonumber(port)) then
    local claim = ("127.0.%d.%d:%d"):format(math.floor(n / 256) % 256, n % 256, 20000 + n)
    s:send(R.hello{ version = R.VERSION, incarnation = n, addr = claim, mode = 0 })
    local h = s:receive(4)
    if h then
      local b = s:receive(R.get_u32le(h, 1))
      if b and b:byte(1) == R.F.HELLO_OK then ok = ok + 1 end
    end
  end
  s:close()
end
io.stdout:write("done ", ok, "\n")
]]

local function received(sink)
  local n = 0
  for _ in (S.read(sink.out) or ""):gmatch("\nev ") do n = n + 1 end
  return n
end

local function count(t) local n = 0 for _ in pairs(t) do n = n + 1 end return n end

describe("issue 11 F3: peers and dials stay bounded", function()
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

  it("a member list of 4,000 closed ports: at most 64 dials at once, the log bounded, the flow on another channel whole", function()
    logs = {}
    local go = S.tmpname("go")
    local rogue = S.lua(kids.rogue_manager, cjson.encode{ go = go })
    local ns = assert(S.wait_file(rogue.out, "ready %S+\n", WAIT), "rogue did not start: " .. S.errors(rogue))
      :match("ready (%S+)")
    ctx = lecho.context{ nameserver = ns, log = function(m) logs[#logs + 1] = m end }
    local x, y = ctx:channel("x"), ctx:channel("y")
    local px, py = assert(x:producer()), assert(y:producer())
    local sink = S.lua(kids.sink, cjson.encode{ ns = ns, channel = "y", stop_on = "end", duration = 40 })
    assert(S.run_until(ctx, function() return (S.read(sink.out) or ""):find("ready", 1, true) end, WAIT),
           "consumer did not start: " .. S.errors(sink))
    local sink_addr = S.read(sink.out):match("ready (%S+)")
    assert(S.run_until(ctx, function() return y.dests[1] == sink_addr end, WAIT), "the consumer never joined")
    -- ports 1..4000 of 127.0.0.1: closed (a listener there gets a dial; no matter)
    local list = {}
    for i = 1, 4000 do list[i] = ("127.0.0.1:%d"):format(i) end
    S.write(go, cjson.encode{ ch = x.name, consumers = list })
    assert(S.run_until(ctx, function() return #x.dests == 4000 end, WAIT),
           "the list was not applied: " .. S.output(rogue) .. S.errors(rogue))
    -- 6 s of events on both channels (x: to the 4,000; y: to the consumer)
    local most, n = 0, 0
    local t0 = ctx:now()
    while ctx:now() - t0 < 6 do
      n = n + 1
      assert(py:submit({ i = n }))
      px:submit({ i = n })
      ctx:run_once(0.005)
      local open = ctx.c:pending()
      if open > most then most = open end
    end
    assert(py:submit("end"))
    assert(S.run_until(ctx, function() return (S.read(sink.out) or ""):find("\ndone") end, WAIT),
           "the legitimate consumer did not get its events: " .. S.errors(sink))
    assert.are.equal(n + 1, received(sink))
    -- 64 dials, the name server, the consumer, its connection back, margin
    assert.is_true(most <= 64 + 8, "connections open at once: " .. most)
    -- one line per 10 s window (the first, then one with the count)
    assert.is_true(logged("cannot reach") <= 2, logged("cannot reach") .. " lines:\n"
                   .. table.concat(logs, "\n", 1, math.min(#logs, 20)))
  end)

  it("past max_peers, peer records nothing uses are freed at once: HELLO churn stays bounded", function()
    logs = {}
    local MAXP = 32
    ctx = lecho.context{ max_peers = MAXP, log = function(m) logs[#logs + 1] = m end }
    local churn = S.lua(CHURN, cjson.encode{ target = ctx.addr, n = 400 })
    local most = 0
    assert(S.run_until(ctx, function()
      local np = count(ctx:stats().peers)
      if np > most then most = np end
      return (S.read(churn.out) or ""):find("done", 1, true)
    end, WAIT), "the churner did not finish: " .. S.errors(churn))
    local ok = tonumber(S.read(churn.out):match("done (%d+)"))
    assert.is_true(ok >= 300, "HELLOs answered: " .. tostring(ok) .. " " .. S.errors(churn))
    ctx:run_once(0.05)
    -- records: max_peers + the connections still closing; never the 400 made
    assert.is_true(most <= MAXP + 16, "peer records at most: " .. most)
    assert.is_true(count(ctx:stats().peers) <= MAXP, "peer records after: " .. count(ctx:stats().peers))
    assert.is_true(logged("unused ones freed at once") >= 1, table.concat(logs, "\n"))
  end)
end)
