-- Calls under attack (issue 12, the outside tester's findings): a reply
-- never reaches another process that took a dead caller's address, bad
-- replies are refused and never leak an in-flight slot, replies obey the
-- argument limits, and a main-line wait sees what a callback finished.
local S = require "spec.support"
local lecho = require "lecho"

-- A caller: listens at arg[2] ("127.0.0.1:0": the OS chooses), writes its
-- address to arg[5], calls service arg[3] with argument arg[4] and writes
-- what it got to its stdout.
local CALLER = [[
local lecho = require "lecho"
local ctx = lecho.context{ nameserver = arg[1], listen = arg[2], quiet = true }
local f = assert(io.open(arg[5] .. ".tmp", "w")) f:write(ctx.addr, "\n") f:close()
os.rename(arg[5] .. ".tmp", arg[5])
local r, e, c = ctx:call(arg[3], arg[4], { timeout = 20 })
io.stdout:write(("GOT %s %s %s\n"):format(tostring(r), tostring(e), tostring(c)))
io.stdout:flush()
ctx:close{ linger = 0 }
]]

describe("a caller killed and replaced on its address mid-call", function()
  local ns, ctx
  before_each(function() ns, ctx = S.world() end)
  after_each(function() S.end_world(ctx); ctx = nil end)

  it("never gets the dead caller's late reply: the new process gets its own", function()
    local old_started, new_started, old_done = false, false, false
    local function wait_for(cond)
      local n = 0
      while not cond() and n < 400 do ctx:sleep(0.05); n = n + 1 end
    end
    -- "old" answers only once the new process's call runs, so its reply
    -- comes while the new process waits for a reply of the same first id
    assert(ctx:service("old", function(a)
      old_started = true
      wait_for(function() return new_started end)
      old_done = true
      return "old reply for " .. a
    end, { budget = 0 }))
    assert(ctx:service("new", function(a)
      new_started = true
      wait_for(function() return old_done end)
      ctx:sleep(0.2)
      return "new reply for " .. a
    end, { budget = 0 }))
    local af = S.tmpname("addr")
    local c1 = S.lua(CALLER, ns, "127.0.0.1:0", "old", "C1", af)
    assert(S.run_until(ctx, function() return old_started end, 20), "C1 did not call: " .. S.errors(c1))
    local addr = assert(S.read(af)):match("%S+")
    S.kill(c1, "KILL")
    S.wait(c1, 10, ctx)
    local stale0 = ctx.c:stats().stale_acks
    local c2 = S.lua(CALLER, ns, addr, "new", "C2", af .. "2")
    assert(S.wait(c2, 30, ctx), "C2 did not end")
    assert.is_true(old_done)
    assert.are.equal("GOT new reply for C2 nil nil\n", S.output(c2))
    -- the old reply was dropped at the server, not sent to C2
    assert.is_true(ctx.c:stats().stale_acks >= stale0 + 1)
  end)

  it("starts each context's sync ids at a random value below 2^53", function()
    local ids = {}
    for i = 1, 2 do
      local c = lecho.context{ quiet = true }
      local chid = c:channel("svc:ids").chid
      c.c:set_calls(chid)
      assert(c:service("ids", function(a) return a end))
      ids[i] = assert(c.c:call(chid, false, 1))
      assert.is_true(ids[i] > 0 and ids[i] < 2 ^ 53 and ids[i] == math.floor(ids[i]))
      c:close()
    end
    assert.are_not.equal(ids[1], ids[2])
    assert.is_true(ids[1] > 1e6 or ids[2] > 1e6)  -- not counting from 1
  end)
end)

-- A lying server: its replies are replaced by what the argument names.
local LIAR = [==[
local lecho = require "lecho"
local ctx = lecho.context{ nameserver = arg[1], quiet = true }
local BAD = { huge = { n = 1e7 }, neg = { n = -5 }, str = { n = "x" }, frac = { n = 1.5 },
              nontable = 42, hole = { n = 1, "a", [7] = "b" }, code = { e = "x", c = {} } }
local mt = getmetatable(ctx.c)
local idx = type(mt.__index) == "table" and mt.__index or mt
local ack = idx.ack
idx.ack = function(c, peer, sync, n, reply, strict, gen)
  if type(reply) == "table" and reply.n == 1 and BAD[reply[1]] then reply = BAD[reply[1]] end
  return ack(c, peer, sync, n, reply, strict, gen)
end
assert(ctx:service("liar", function(a) return a end))
local f = assert(io.open(arg[2], "w")) f:write("ready\n") f:close()
ctx:after(60, function() ctx:stop() end)
ctx:run()
]==]

describe("a reply that lies", function()
  local ns, ctx
  setup(function() ns = S.world() end)
  teardown(function() S.end_world(ctx); ctx = nil end)

  it("is refused as malformed, and never leaks an in-flight slot or a callback", function()
    local ready = S.tmpname("ready")
    local liar = S.lua(LIAR, ns, ready)
    assert(S.wait_file(ready, "ready", 20), "liar did not start: " .. S.errors(liar))
    ctx = lecho.context{ nameserver = ns, quiet = true, max_calls_in_flight = 2 }
    for _, mode in ipairs({ "huge", "neg", "str", "frac", "nontable", "hole", "code" }) do
      for _ = 1, 3 do -- more than max_calls_in_flight: a leaked slot would make it "busy"
        local ok, r, e, c = pcall(ctx.call, ctx, "liar", mode, { timeout = 5 })
        assert.is_true(ok, mode .. ": ctx:call raised: " .. tostring(r))
        assert.is_nil(r, mode)
        assert.are.equal("protocol", c, mode .. ": " .. tostring(e))
        assert.matches("^malformed reply from 127%.0%.0%.1:%d+: ", e)
      end
      local got
      ctx:call_async("liar", mode, { timeout = 5 }, function(...) got = { n = select("#", ...), ... } end)
      assert(S.run_until(ctx, function() return got end, 10), mode .. ": call_async's callback never ran")
      assert.is_nil(got[1])
      assert.are.equal("protocol", got[3])
    end
    assert.are.equal(0, ctx.svc_ncalls)
    assert.are.equal("fine", (ctx:call("liar", "fine", { timeout = 5 })))
  end)

  it("too many results are an error at the server (code limit), not at the caller", function()
    ctx = ctx or lecho.context{ nameserver = ns, quiet = true }
    local s = assert(ctx:service("many", function(n) return unpack({}, 1, n) end))
    local r = { ctx:call("many", 4096) }
    assert.are.equal(4096, select("#", ctx:call("many", 4096)))
    local ok, e, c = ctx:call("many", 5000)
    assert.is_nil(ok)
    assert.are.equal("limit", c)
    assert.matches("too many results: 5000", e)
    s:close()
    assert(r)
  end)
end)

describe("a large reply", function()
  local ns, ctx, srv
  before_each(function()
    ns, ctx = S.world()
    srv = lecho.context{ nameserver = ns, quiet = true }
    assert(srv:service("big", function(n) return ("r"):rep(n) end))
    assert(srv:service("slow", function(a) srv:sleep(0.5) return a end, { budget = 0 }))
  end)
  after_each(function() if srv then srv:close() end srv = nil; S.end_world(ctx); ctx = nil end)

  -- runs both loops until cond() or 20 s
  local function serve(cond)
    local deadline = ctx:now() + 20
    while not cond() and ctx:now() < deadline do
      srv:run_once(0.01)
      ctx:run_once(0.01)
    end
    return cond()
  end

  local function call_both(caller, name, big)
    local out = {}
    caller:call_async("slow", "unrelated", { timeout = 20 }, function(...) out.slow = { ... } end)
    caller:call_async(name, big, { timeout = 20 }, function(...) out.big = { n = select("#", ...), ... } end)
    assert(serve(function() return out.slow and out.big end), "calls did not end")
    return out
  end

  it("of 17 MiB comes whole, and a call in flight beside it is unharmed", function()
    local out = call_both(ctx, "big", 17 * 1024 * 1024)
    assert.is_true(out.big[1], tostring(out.big[2]))
    assert.are.equal(17 * 1024 * 1024, #out.big[2])
    assert.are.same({ true, "unrelated" }, out.slow)
  end)

  it("over what the caller takes is an error from the server, code limit; the connection lives", function()
    local small = lecho.context{ nameserver = ns, quiet = true, max_frame = 1024 * 1024 }
    local out = {}
    small:call_async("slow", "unrelated", { timeout = 20 }, function(...) out.slow = { ... } end)
    small:call_async("big", 2 * 1024 * 1024, { timeout = 20 }, function(...) out.big = { ... } end)
    local deadline = ctx:now() + 20
    while not (out.slow and out.big) and ctx:now() < deadline do
      srv:run_once(0.01)
      small:run_once(0.01)
    end
    assert.is_nil(out.big[1])
    assert.are.equal("limit", out.big[3])
    assert.matches("^result of %d+ bytes exceeds the limit %(%d+ bytes%)", out.big[2])
    assert.are.same({ true, "unrelated" }, out.slow)
    assert.are.equal(0, srv.c:stats().bad_frames + small.c:stats().bad_frames)
    small:close()
  end)
end)

-- A server that appends "run KEY" to its log file for each call of "slow"
-- and sleeps args.s seconds the first args.first times, then answers at once.
local SLOW = [[
local lecho = require "lecho"
local ctx = lecho.context{ nameserver = arg[1], quiet = true }
local runs = 0
assert(ctx:service("slow", function(a, meta)
  runs = runs + 1
  local f = io.open(arg[3], "a") f:write("run ", tostring(meta.key), "\n") f:close()
  if runs <= a.first then ctx:sleep(a.s) end
  return "done"
end, { budget = 0 }))
local f = assert(io.open(arg[2], "w")) f:write("ready\n") f:close()
ctx:after(60, function() ctx:stop() end)
ctx:run()
]]

describe("a call's timeout", function()
  local ns, ctx
  before_each(function() ns, ctx = S.world() end)
  after_each(function() S.end_world(ctx); ctx = nil end)

  local function runs(log)
    local n = 0
    for _ in (S.read(log) or ""):gmatch("run K\n") do n = n + 1 end
    return n
  end

  it("is the whole call's: keyed tries over three slow servers share it", function()
    local log = S.tmpname("runs")
    for i = 1, 3 do
      local ready = S.tmpname("ready" .. i)
      local child = S.lua(SLOW, ns, ready, log)
      assert(S.wait_file(ready, "ready", 20), "server did not start: " .. S.errors(child))
    end
    local t0 = ctx:now()
    local r, e, c = ctx:call("slow", { s = 5, first = 5 }, { timeout = 0.9, key = "K" })
    local took = ctx:now() - t0
    assert.is_nil(r)
    assert.are.equal("timeout", c, tostring(e))
    assert.is_true(took < 0.9 + 0.4, ("took %.2f s with a timeout of 0.9 s"):format(took))
    assert.are.equal(3, runs(log))           -- each server tried once, with its key
  end)

  it("leaves time to try a lone keyed server once more after it timed out", function()
    local log = S.tmpname("runs")
    local ready = S.tmpname("ready")
    local child = S.lua(SLOW, ns, ready, log)
    assert(S.wait_file(ready, "ready", 20), "server did not start: " .. S.errors(child))
    local r, e, c = ctx:call("slow", { s = 5, first = 1 }, { timeout = 3, key = "K" })
    assert.are.equal("done", r, tostring(e) .. " " .. tostring(c))
    assert.are.equal(2, runs(log))
  end)
end)

describe("a wait on the main line", function()
  local ctx
  before_each(function() ctx = lecho.context{ quiet = true } end)
  after_each(function() ctx:close(); ctx = nil end)

  it("sees at once what a callback coroutine finished (a local call whose handler waits)", function()
    assert(ctx:service("waits", function(a) ctx:sleep(0.01) return a end, { budget = 0 }))
    -- (the handler waits 0.01 s; before, each call also waited for the
    -- loop's next event: the context's 0.1 s tick here, up to 1 s elsewhere)
    local slow = 0
    for i = 1, 20 do
      local t0 = ctx:now()
      assert.are.equal(i, ctx:call("waits", i, { timeout = 5 }))
      if ctx:now() - t0 >= 0.06 then slow = slow + 1 end
    end
    assert.is_true(slow <= 2, slow .. " of 20 calls took 0.06 s or more")
  end)
end)

describe("a service's queue", function()
  local ctx
  before_each(function() ctx = lecho.context{ quiet = true } end)
  after_each(function() ctx:close(); ctx = nil end)

  it("is bounded in bytes (queue_bytes): past it 'busy' at once", function()
    local go, ran = false, 0
    local s = assert(ctx:service("q", function(a)
      ran = ran + 1
      ctx:_wait(function() return go end)
      return #a
    end, { concurrency = 1, queue = 10, queue_bytes = 1024 * 1024, budget = 0 }))
    local out = {}
    local function call(i, n)
      ctx:call_async("q", ("x"):rep(n), { timeout = 20, retries = 0 }, function(...) out[i] = { ... } end)
    end
    call(1, 10)                 -- runs, and waits
    assert(S.run_until(ctx, function() return ran == 1 end, 5))
    call(2, 600 * 1024)         -- queued
    call(3, 600 * 1024)         -- past 1 MiB of queued calls: busy
    call(4, 1000)               -- fits
    assert(S.run_until(ctx, function() return out[3] end, 5), "the call past queue_bytes was not refused")
    assert.is_nil(out[3][1])
    assert.are.equal("busy", out[3][3])
    assert.matches("bytes of calls queued %(queue_bytes 1048576%)", out[3][2])
    go = true
    assert(S.run_until(ctx, function() return out[1] and out[2] and out[4] end, 10))
    assert.are.same({ true, 10 }, out[1])
    assert.are.same({ true, 600 * 1024 }, out[2])
    assert.are.same({ true, 1000 }, out[4])
    assert.are.equal(3, ran)
    assert.are.equal(0, s.qbytes)
  end)

  it("drops calls whose caller's deadline passed before they could run", function()
    local go, ran = false, 0
    local s = assert(ctx:service("q", function(a)
      ran = ran + 1
      ctx:_wait(function() return go end)
      return a
    end, { concurrency = 1, queue = 10, budget = 0 }))
    local out = {}
    ctx:call_async("q", 1, { timeout = 20 }, function(...) out[1] = { ... } end)
    assert(S.run_until(ctx, function() return ran == 1 end, 5))
    ctx:call_async("q", 2, { timeout = 0.3, retries = 0 }, function(...) out[2] = { ... } end)
    assert(S.run_until(ctx, function() return out[2] and (s.expired or 0) >= 1 end, 5),
           "the queued call was not dropped at its deadline")
    assert.is_nil(out[2][1])
    assert.are.equal("timeout", out[2][3])
    go = true
    assert(S.run_until(ctx, function() return out[1] end, 10))
    ctx:run_once(0.05)
    assert.are.equal(1, ran)     -- the dropped call never ran
    assert.are.equal(0, #s.q)
  end)
end)

describe("a stalled name server", function()
  local ctx, ns1child
  after_each(function()
    if ns1child then S.kill(ns1child, "CONT") end
    if ctx then ctx:close() end
    ctx, ns1child = nil, nil
    S.cleanup()
  end)

  it("never makes a call overrun its timeout, and its failure is remembered", function()
    local ns1, ns2
    ns1child, ns1 = S.nameserver("--quiet")
    local _, a2 = S.nameserver("--quiet")
    ns2 = a2
    local ready = S.tmpname("ready")
    local srv = S.lua([[
local lecho = require "lecho"
local ctx = lecho.context{ nameserver = { arg[1], arg[2] }, quiet = true }
assert(ctx:service("ping", function() return "pong" end))
assert(ctx:service("echo", function(a) return a end))
local f = assert(io.open(arg[3], "w")) f:write("ready\n") f:close()
ctx:after(60, function() ctx:stop() end)
ctx:run()
]], ns1, ns2, ready)
    assert(S.wait_file(ready, "ready", 20), "server did not start: " .. S.errors(srv))
    ctx = lecho.context{ nameserver = { ns1, ns2 }, quiet = true }
    assert.are.equal("pong", ctx:call("ping", nil, { timeout = 5 }))
    S.kill(ns1child, "STOP")
    local over, results = 0, {}
    for i = 1, 4 do
      local t0 = ctx:now()
      local r, e, c = ctx:call("echo", i, { timeout = 0.5 })
      local took = ctx:now() - t0
      if took > 0.5 + 0.5 then over = over + 1 end
      results[#results + 1] = r or c
      assert.is_true(r == i or c == "timeout" or c == "noservice", tostring(e))
    end
    assert.are.equal(0, over)
    assert.are.equal("pong", ctx:call("ping", nil, { timeout = 0.5 }))   -- joined before: unharmed
    -- once ns1's join failed (control timeout, 5 s), calls do not wait for it
    local cl = ctx.svc_callers.echo
    assert(S.run_until(ctx, function() return cl.down_until[1] ~= nil end, 10), "ns1's join never failed")
    local t0 = ctx:now()
    ctx:call("echo", 9, { timeout = 2 })
    assert.is_true(ctx:now() - t0 < 1.5)
  end)
end)

describe("a service given as Lua source", function()
  local ctx
  before_each(function() ctx = lecho.context{ quiet = true } end)
  after_each(function() ctx:close(); ctx = nil end)

  it("runs in a sandbox whose budget stops its helpers' loops too, compiled or not", function()
    -- the helper is hot (a compiled trace in a native handler, where a
    -- count hook cannot stop it: doc/services.md, Budget)
    local s = assert(ctx:service("contained", { source = [[
local function helper(n) local s = 0 for i = 1, n do s = s + i % 7 end return s end
helper(1e6)
return function(a, meta)
  if a == "loop" then return helper(1e11) end
  return a * 2, meta.service
end
]] }, { budget = 0.3 }))
    assert.are.same({ 42, "contained" }, { ctx:call("contained", 21) })
    local r, e, c = ctx:call("contained", "loop", { timeout = 20 })
    assert.is_nil(r)
    assert.are.equal("limit", c)
    assert.matches("budget", e)
    assert.are.same({ 8, "contained" }, { ctx:call("contained", 4) })   -- serves on
    s:close()
    assert.are.equal("noservice", select(3, ctx:call("contained", 1)))
    local ok, err, code = ctx:service("bad", { source = "return 1 +" })
    assert.is_nil(ok)
    assert.truthy(err and code, "a source that does not compile is refused")
    assert.are.equal("invalid", select(3, ctx:service("nobudget", { source = "return function() end" }, { budget = 0 })))
  end)
end)
