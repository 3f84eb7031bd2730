-- Services and calls across real processes (issue 12, points 1 to 3):
-- values and errors travel as values, "no service" and "busy" come at
-- once, many calls share one connection, services are unloaded live,
-- versions run side by side, limits hold, and a server survives handlers
-- that raise, loop or return what cannot be sent, and peers that send junk.
local S = require "spec.support"
local W = require "spec.wire"
local R = require "spec.support.rogue"
local socket = require "socket"
local lecho = require "lecho"

-- A server process: serves the services listed in its JSON options, each
-- with the handler below (args.op says what it does), and a "ctl" service
-- that unloads one of them.  Writes "ready" to its ready file.
local SERVER = [[
local cjson = require "cjson"
local lecho = require "lecho"
local opts = cjson.decode(arg[1])
local ctx = lecho.context{ nameserver = opts.ns, quiet = true, max_calls_in_flight = opts.max_calls,
                           key = opts.key, trust = opts.trust }
local running, max_running, ran = 0, 0, 0
local svcs = {}
local function handler(version)
  return function(a, meta)
    ran = ran + 1
    running = running + 1
    if running > max_running then max_running = running end
    local op = type(a) == "table" and a.op or "echo"
    local ok, r = pcall(function()
      if op == "sleep" then ctx:sleep(a.s) end
      return true
    end)
    running = running - 1
    if op == "echo" then return a.x, version, meta.caller, meta.service end
    if op == "sleep" then return a.tag, version end
    if op == "many" then return nil, 2, nil, "four", nil end
    if op == "raise" then error("bad request " .. tostring(a.x)) end
    if op == "raisetab" then error({ code = 400, why = "no" }) end
    if op == "fn" then return function() end end
    if op == "loop" then while true do end end
    if op == "swallow" then    -- catches every error, the budget's too
      local n = 0
      while true do n = n + 1; pcall(function() for _ = 1, 1e6 do n = n + 1 end end) end
    end
    if op == "stats" then return { max_running = max_running, ran = ran } end
    if op == "reset" then max_running, ran = 0, 0 return true end
    if op == "size" then return #a.blob end
    return nil
  end
end
for _, s in ipairs(opts.services) do
  local name = s.name
  s.name = nil
  local obj = assert(ctx:service(name, handler(s.version or 1), s))
  svcs[name .. "@" .. (s.version or 1)] = obj
end
assert(ctx:service("ctl" .. opts.tag, function(a)
  local obj = svcs[a.unload]
  if not obj then return nil, "no such service here" end
  obj:close()
  return true
end))
local f = assert(io.open(opts.ready, "w")) f:write("ready\n") f:close()
ctx:after(opts.duration or 60, function() ctx:stop() end)
ctx:run()
ctx:close()
]]

local function server(ns, services, tag, extra)
  local ready = S.tmpname("ready")
  local o = { ns = ns, services = services, tag = tag or "", ready = ready, duration = 60 }
  for k, v in pairs(extra or {}) do o[k] = v end
  local child = S.lua(SERVER, require("cjson").encode(o))
  assert(S.wait_file(ready, "ready", 20), "server did not start: " .. S.errors(child))
  return child
end

-- Runs ctx's loop until n callbacks of call_async came in (or 20 s).
local function gather(ctx, n, results)
  assert(S.run_until(ctx, function() return #results >= n end, 20), "calls did not all end")
end

describe("ctx:service and ctx:call across processes", function()
  local ns, ctx, srv

  setup(function()
    ns, ctx = S.world()
    srv = server(ns, {
      { name = "echo", concurrency = 256, queue = 16 },
      { name = "v", version = 1 }, { name = "v", version = 2 },
      { name = "tight", concurrency = 2, queue = 1 },
      { name = "spin", budget = 0.3 },
      { name = "unload", concurrency = 1, queue = 8 },
    }, "1")
  end)
  teardown(function() S.end_world(ctx); ctx = nil end)

  it("returns the handler's results, nils and count kept, and a table argument as a table", function()
    local x = { list = { 1, 2.5, "three" }, nested = { deep = true }, bin = "\0\255" }
    local r = { n = 0 }
    local function keep(...) r = { n = select("#", ...), ... } end
    keep(ctx:call("echo", { op = "echo", x = x }, { timeout = 10 }))
    assert.are.equal(4, r.n)
    assert.are.same(x, r[1])
    assert.are.equal(1, r[2])                                   -- the version that ran
    assert.are.equal(ctx.addr, r[3])                            -- meta.caller
    assert.are.equal("echo", r[4])
    keep(ctx:call("echo", { op = "many" }))
    assert.are.equal(5, r.n)
    assert.is_nil(r[1]); assert.are.equal(2, r[2]); assert.is_nil(r[3])
    assert.are.equal("four", r[4]); assert.is_nil(r[5])
  end)

  it("returns a raised table as a table, a raised string with where and a traceback", function()
    local ok, err, code, tb = ctx:call("echo", { op = "raisetab" })
    assert.is_nil(ok)
    assert.are.same({ code = 400, why = "no" }, err)
    assert.are.equal("failed", code)
    assert.truthy(tb:match("^stack traceback:\n"), tb)
    ok, err, code, tb = ctx:call("echo", { op = "raise", x = 7 })
    assert.is_nil(ok)
    assert.are.equal("failed", code)
    assert.truthy(err:match("^[^:]+%.lua:%d+: bad request 7$"), err)
    assert.truthy(tb:match("stack traceback"), tb)
    -- a handler returning a function: an error value, the server serves on
    ok, err, code = ctx:call("echo", { op = "fn" })
    assert.is_nil(ok)
    assert.are.equal("invalid", code)
    assert.truthy(tostring(err):match("cannot encode a function"), err)
    assert.are.equal(5, (ctx:call("echo", { op = "echo", x = 5 })))
  end)

  it("says what is wrong in the caller's and the handler's words, not lecho's (issue 25)", function()
    -- an argument that cannot be sent: its path in the args, not in the request
    local ok, err, code = ctx:call("echo", { op = "echo", x = { y = print } })
    assert.is_nil(ok)
    assert.are.equal("invalid", code)
    assert.are.equal("cannot encode a function at args.x.y", err)
    -- a result that cannot be sent: which result
    ok, err, code = ctx:call("echo", { op = "fn" })
    assert.matches("at result 1$", err)
    -- a handler's traceback: its frames, none of lecho's own
    local tb
    ok, err, code, tb = ctx:call("echo", { op = "raise", x = 7 })
    assert.matches("stack traceback:\n", tb)
    assert.not_matches("lua/lecho/", tb)
    assert.not_matches("xpcall", tb)
  end)

  it("logs a callback's error with the user's frames only (issue 25)", function()
    local out = S.sh_out(("%s -e %s"):format(S.luajit, S.sh_quote([[
local lecho = require "lecho"
local ctx = assert(lecho.context{})
local function boom() error("boom") end
ctx:after(0.01, function() boom() return 1 end)
ctx:after(0.2, function() ctx:stop() end)
ctx:run()
ctx:close()
]])))
    assert.matches("error in callback: [^\n]*boom\n%s*stack traceback:\n", out)
    assert.matches("in function 'boom'", out)
    assert.not_matches("lua/lecho/", out)
  end)

  it("answers 'no service' at once, not at the timeout", function()
    local t0 = ctx:now()
    local ok, err, code = ctx:call("nosuch", 1, { timeout = 8 })
    assert.is_nil(ok)
    assert.are.equal("noservice", code)
    assert.are.equal("no service nosuch", err)
    assert.is_true(ctx:now() - t0 < 4)
    assert.has_error(function() ctx:call("bad/name", 1) end)
    assert.has_error(function() ctx:call("echo", 1, { versoin = 1 }) end)
  end)

  it("keeps many calls in flight on one connection and answers each its own", function()
    assert(ctx:call("echo", { op = "reset" }))
    local results = {}
    for i = 1, 200 do
      ctx:call_async("echo", { op = "sleep", s = 0.3, tag = i }, { timeout = 15 }, function(ok, tag)
        results[#results + 1] = ok and tag == i
      end)
    end
    gather(ctx, 200, results)
    local good = 0
    for _, g in ipairs(results) do if g then good = good + 1 end end
    assert.are.equal(200, good)
    local st = ctx:call("echo", { op = "stats" })
    assert.are.equal(201, st.ran)               -- (and the stats call)
    assert.is_true(st.max_running >= 50, "at most " .. st.max_running .. " ran at once")
    -- one connection to the server: the calls did not open more
    local peers = 0
    for _ in pairs(ctx:stats().peers or {}) do peers = peers + 1 end
    assert.is_true(peers <= 2, peers .. " peers")     -- the server (and the name server)
  end)

  it("runs side by side versions: exact, minimum, highest, and refuses naming both", function()
    assert.are.equal(1, select(2, ctx:call("v", { op = "echo" }, { version = 1 })))
    assert.are.equal(2, select(2, ctx:call("v", { op = "echo" }, { version = 2 })))
    assert.are.equal(2, select(2, ctx:call("v", { op = "echo" }, { min_version = 1 })))
    assert.are.equal(2, select(2, ctx:call("v", { op = "echo" })))
    local t0 = ctx:now()
    local ok, err, code = ctx:call("v", { op = "echo" }, { version = 3, timeout = 8 })
    assert.is_nil(ok)
    assert.are.equal("version", code)
    assert.are.equal("no compatible version of v: asked 3, servers have 1, 2", err)
    ok, err, code = ctx:call("v", { op = "echo" }, { min_version = 3 })
    assert.are.equal("version", code)
    assert.are.equal("no compatible version of v: asked >= 3, servers have 1, 2", err)
    assert.is_true(ctx:now() - t0 < 4)
  end)

  it("refuses past concurrency + queue with 'busy' at once, and runs the others", function()
    local order, results = {}, {}
    for i = 1, 6 do
      ctx:call_async("tight", { op = "sleep", s = 1, tag = i }, { timeout = 15 }, function(ok, a, code)
        order[#order + 1] = ok and "ok" or code
        results[#results + 1] = true
      end)
    end
    gather(ctx, 6, results)
    -- 2 running + 1 queued; the other 3 refused before any call ended
    assert.are.same({ "busy", "busy", "busy", "ok", "ok", "ok" }, order)
    local ok, err, code = ctx:call("tight", { op = "echo", x = 1 })
    assert.are.equal(1, ok)
  end)

  it("stops a looping handler at its CPU budget; the server serves on", function()
    local ok, err, code = ctx:call("spin", { op = "loop" }, { timeout = 20 })
    assert.is_nil(ok)
    assert.are.equal("limit", code)
    assert.truthy(tostring(err):match("^budget exceeded: spin@1"), err)
    assert.are.equal(3, (ctx:call("spin", { op = "echo", x = 3 })))
    -- one that catches the budget's error with pcall meets it again outside
    ok, err, code = ctx:call("spin", { op = "swallow" }, { timeout = 20 })
    assert.are.equal("limit", code)
    assert.truthy(tostring(err):match("^budget exceeded: spin@1"), err)
    assert.are.equal(4, (ctx:call("echo", { op = "echo", x = 4 })))
  end)

  it("unloads live: running calls finish, queued and later ones get 'noservice' at once", function()
    local got = {}
    for i = 1, 4 do
      ctx:call_async("unload", { op = "sleep", s = 1.5, tag = i }, { timeout = 15 }, function(ok, a, code)
        got[i] = ok and a or code
      end)
    end
    -- the first runs, three wait; unloading now
    assert(S.run_until(ctx, function() return false end, 0.5) == false)
    assert.is_true(ctx:call("ctl1", { unload = "unload@1" }))
    assert(S.run_until(ctx, function() return got[1] and got[2] and got[3] and got[4] end, 10))
    assert.are.same({ 1, "noservice", "noservice", "noservice" }, got)
    local t0 = ctx:now()
    local ok, err, code = ctx:call("unload", { op = "echo" }, { timeout = 8 })
    assert.is_nil(ok)
    assert.are.equal("noservice", code)
    assert.is_true(ctx:now() - t0 < 4)
  end)

  it("takes a huge argument (8 MiB)", function()
    local blob = ("x"):rep(8 * 1024 * 1024)
    assert.are.equal(#blob, ctx:call("echo", { op = "size", blob = blob }, { timeout = 20 }))
  end)

  it("answers junk from a rogue peer on the call channel, and never crashes", function()
    local host, port = ctx.ns:match("^(.+):(%d+)$")
    -- the server's address: from the caller's view of the service
    local chname = ns .. "/svc:echo"
    local ch = ctx:channel(chname)
    local saddr
    for a in pairs(ch.svc or {}) do saddr = a end
    assert.truthy(saddr)
    local shost, sport = saddr:match("^(.+):(%d+)$")
    local s = assert(socket.tcp())
    s:settimeout(5)
    assert(s:connect(shost, tonumber(sport)))
    assert(s:send(W.hello("127.0.0.1:1", { incarnation = 777 })))
    assert(s:send(W.bind(1, chname)))
    local sends = {
      { v = 42, sync = 1 },                                   -- not a request table
      { v = { v = "two", a = 1 }, sync = 2 },                 -- a version that is no number
      { v = { a = { op = "echo", x = ("y"):rep(100000) } }, sync = 3 },  -- big, fine
      { v = { a = { op = "echo", x = 1 } }, sync = 0 },       -- no sync id: nothing to answer
      { v = { v = 99, a = 1 }, sync = 4 },                    -- a version not served
      { v = { a = { op = "raise", x = 1 } }, sync = 5 },
      { v = { mv = 2, a = 1 }, sync = 6 },                   -- a minimum version not served
    }
    for i, e in ipairs(sends) do
      assert(s:send(W.event(1, assert(lecho.encode(e.v)), i, { sync = e.sync })))
    end
    local acks, buf = {}, ""
    local deadline = socket.gettime() + 10
    s:settimeout(0.2)
    while socket.gettime() < deadline do
      local data, err, partial = s:receive(65536)
      buf = buf .. (data or partial or "")
      acks = {}
      for _, f in ipairs(W.frames(buf)) do
        if f.type == W.ACK then
          local a = assert(R.parse_ack(f.body))
          acks[a.sync] = a.errs
        end
      end
      if acks[1] and acks[2] and acks[3] and acks[4] and acks[5] and acks[6] then break end
      if err == "closed" then break end
    end
    s:close()
    assert.are.equal("invalid", acks[1] and acks[1].c)
    assert.are.equal("invalid", acks[2] and acks[2].c)
    assert.are.equal(4, acks[3] and acks[3].n)
    assert.are.equal(100000, acks[3] and #acks[3][1])
    assert.are.equal("noservice", acks[4] and acks[4].c)
    assert.are.equal("failed", acks[5] and acks[5].c)
    assert.are.equal("noservice", acks[6] and acks[6].c)
    assert.are.equal("no service echo@>=2 here", acks[6] and acks[6].e)
    assert.is_nil(acks[0])
    assert.is_true(S.alive(srv))
    assert.are.equal(9, (ctx:call("echo", { op = "echo", x = 9 })))
  end)
end)

describe("calls inside one process", function()
  local ns, ctx
  before_each(function() ns, ctx = S.world() end)
  after_each(function() S.end_world(ctx); ctx = nil end)

  it("calls a service of the same context, sync and async", function()
    local s = assert(ctx:service("here", function(a, meta) return a * 2, meta.caller end))
    local r, caller = ctx:call("here", 21)
    assert.are.equal(42, r)
    assert.are.equal(ctx.addr, caller)
    local got
    ctx:call_async("here", 5, nil, function(ok, v) got = { ok, v } end)
    assert(S.run_until(ctx, function() return got end, 5))
    assert.are.same({ true, 10 }, got)
    s:close()
    local ok, err, code = ctx:call("here", 1)
    assert.is_nil(ok)
    assert.are.equal("noservice", code)
  end)

  it("c:call takes only a current destination; c:call_result frees each record once", function()
    local c = ctx.c
    local chid = ctx:channel("svc:raw").chid
    c:set_calls(chid)
    local sid, err, code = c:call(chid, "127.0.0.1:9", { a = 1 })
    assert.is_nil(sid)
    assert.are.equal("notfound", code)
    assert.are.equal("no such destination", err)
    sid, err, code = c:call(chid, false, { a = 1 })       -- no local consumer either
    assert.are.equal("notfound", code)
    assert(ctx:service("raw", function(a) return a + 1 end))
    sid = assert(c:call(chid, false, { a = 41 }))
    assert.is_false(c:call_result(sid))
    assert(S.run_until(ctx, function() return c:call_result(sid) ~= false end, 5))
    -- (the look above freed it)
    local ok, e2, c2 = c:call_result(sid)
    assert.is_nil(ok)
    assert.are.equal("notfound", c2)
    sid = assert(c:call(chid, false, { a = 1 }))
    local r1, r2, r3 = c:call_result(sid, true)            -- final, still pending
    assert.are.same({ nil, "timeout", "timeout" }, { r1, r2, r3 })
    ctx:run_once(0.1)                                       -- the late reply is dropped
    assert.are.equal(2, (ctx:call("raw", 1)))
  end)

  it("refuses an argument past the frame limit before sending anything", function()
    local c2 = lecho.context{ nameserver = ns, quiet = true, max_frame = 65536 }
    assert(ctx:service("big", function(a) return #a end))
    local ok, err, code
    c2:call_async("big", ("z"):rep(100000), nil, function(...) ok, err, code = ... end)
    local deadline = ctx:now() + 10
    while code == nil and ok == nil and ctx:now() < deadline do
      c2:run_once(0.01)
      ctx:run_once(0.01)
    end
    assert.is_nil(ok)
    assert.are.equal("limit", code)
    assert.truthy(err:match("frame limit"), err)
    c2:close()
  end)

  it("answers a reply past the frame limit with an error, and serves on", function()
    local c2 = lecho.context{ nameserver = ns, quiet = true, max_frame = 65536 }
    assert(c2:service("bigreply", function(n) return ("r"):rep(n) end))
    local out = {}
    for _, n in ipairs({ 100000, 10 }) do
      ctx:call_async("bigreply", n, nil, function(...) out[#out + 1] = { ... } end)
    end
    local deadline = ctx:now() + 10
    while #out < 2 and ctx:now() < deadline do
      c2:run_once(0.01)
      ctx:run_once(0.01)
    end
    table.sort(out, function(a, b) return a[1] ~= nil and b[1] == nil end)
    assert.are.same({ true, "rrrrrrrrrr" }, out[1])           -- (call_async: true first)
    assert.is_nil(out[2][1])
    assert.are.equal("limit", out[2][3])
    assert.truthy(out[2][2]:match("^result of %d+ bytes exceeds the limit"), out[2][2])
    c2:close()
  end)

  it("limits the calls in flight of a context (max_calls_in_flight)", function()
    local c2 = lecho.context{ nameserver = ns, quiet = true, max_calls_in_flight = 3 }
    assert(ctx:service("slow", function(a) ctx:sleep(0.5) return a end, { concurrency = 10 }))
    local out = {}
    for i = 1, 5 do
      c2:call_async("slow", i, { timeout = 10 }, function(ok, v, code) out[#out + 1] = ok and v or code end)
    end
    local deadline = ctx:now() + 10
    while #out < 5 and ctx:now() < deadline do
      c2:run_once(0.01)
      ctx:run_once(0.01)
    end
    table.sort(out, function(a, b) return tostring(a) < tostring(b) end)
    assert.are.same({ 1, 2, 3, "busy", "busy" }, out)
    local r
    c2:call_async("slow", 9, nil, function(ok, v) r = v end)
    while not r and ctx:now() < deadline do
      c2:run_once(0.01)
      ctx:run_once(0.01)
    end
    assert.are.equal(9, r)
    c2:close()
  end)
end)

describe("a sync submit to a channel nobody consumes", function()
  local ns, ctx
  before_each(function() ns, ctx = S.world() end)
  after_each(function() S.end_world(ctx); ctx = nil end)

  it("fails with 'noconsumer' instead of returning true, and works once a consumer exists", function()
    local p = assert(ctx:channel("lonely"):producer())
    local ok, err, code = p:submit_sync(1, { timeout = 5 })
    assert.is_nil(ok)
    assert.are.equal("noconsumer", code)
    assert.are.equal("no consumer of lonely", err)
    local got = 0
    local con = assert(ctx:channel("lonely"):consumer(function() got = got + 1 end))
    assert.is_true(p:submit_sync(2, { timeout = 5 }))
    assert.are.equal(1, got)
    con:close()
    ok, err, code = p:submit_sync(3, { timeout = 5 })
    assert.are.equal("noconsumer", code)
  end)
end)

describe("examples/services/echo.lua", function()
  after_each(function() S.cleanup() end)

  local EXPECT = {
    "call echo {x=21} (highest: 2)      -> 42, echo@2 at ",
    "call echo {x=21} version=1         -> 21, echo@1 at ",
    "call echo min_version=2            -> 10, echo@2 at ",
    "an error that is a table           -> nil, { code = 400, why = no x }, failed, (its traceback)",
    "a string error                     -> nil, ",
    "version=3                          -> nil, no compatible version of echo: asked 3, servers have 1, 2, version, nil",
    "no such service (0.",
    "32 calls at once                   -> 16 answered, 16 refused busy at once",
  }
  local function check(out)
    local lines = {}
    for l in out:gmatch("[^\n]+") do lines[#lines + 1] = l end
    for i, e in ipairs(EXPECT) do
      assert.are.equal(e, (lines[i] or ""):sub(1, #e), out)
    end
    assert.truthy(lines[5]:match("echo%.lua:%d+: x must be a number, failed, %(its traceback%)$"), out)
  end

  it("runs the tour in one process", function()
    local ok, out = S.sh(("timeout 30 %s %s/examples/services/echo.lua"):format(S.luajit, S.root))
    assert.is_true(ok, out)
    check(out)
  end)

  it("runs it across processes (--serve, --call)", function()
    local _, ns = S.nameserver("--quiet")
    local srv = S.spawn(("%s %s/examples/services/echo.lua --serve %s"):format(S.luajit, S.root, ns))
    assert(S.wait_file(srv.out, "serving", 20), S.errors(srv))
    local ok, out = S.sh(("timeout 30 %s %s/examples/services/echo.lua --call %s"):format(S.luajit, S.root, ns))
    assert.is_true(ok, out)
    check(out)
    assert.truthy(out:match("echo@1 at 127%.0%.0%.1:%d+, called by 127%.0%.0%.1:%d+"), out)
  end)
end)

describe("calls in keyed mode", function()
  after_each(function() S.cleanup() end)

  it("works through tickets, and the handler sees the caller's principal", function()
    local dir = S.tmpdir() .. "/keys"
    assert(os.execute("mkdir -p " .. S.sh_quote(dir)))
    local ok, out = S.sh(("%s %s/scripts/lecho-keygen nameserver srv cli --dir %s"):format(
      S.luajit, S.root, S.sh_quote(dir)))
    assert(ok, out)
    local trust = { dir .. "/nameserver.pub", dir .. "/srv.pub", dir .. "/cli.pub" }
    local _, ns = S.nameserver(("--quiet --key %s/nameserver.key --trust %s --trust %s --trust %s")
      :format(dir, trust[1], trust[2], trust[3]))
    server(ns, { { name = "echo" } }, "k", { key = dir .. "/srv.key", trust = trust })
    local ctx = lecho.context{ nameserver = ns, quiet = true, key = dir .. "/cli.key", trust = trust }
    local x, v, caller = ctx:call("echo", { op = "echo", x = 11 }, { timeout = 10 })
    assert.are.equal(11, x)
    assert.are.equal("cli", caller)
    ctx:close()
  end)
end)
