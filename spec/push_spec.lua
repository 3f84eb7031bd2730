-- Pushing code to grow a service (issue 12 point 6, lua/lecho/push.lua):
-- a node started with accept_code serves lecho.code; the pusher (this
-- process; the name server is another) ships a service's Lua source to
-- it, a third process calls the service, the pusher unloads it and calls
-- then get "noservice".  A pushed looping service is stopped by its budget
-- while the node's other work (a producer's flow, counted here) goes on.
-- Keyed mode: a principal not in the node's accept_code list is refused.
local cjson = require "cjson"
local lecho = require "lecho"
local S = require "spec.support"

local WAIT = 20

-- The node: accept_code (JSON opts.accept), a producer sending 1, 2, 3...
-- on opts.channel every 5 ms until the file opts.stop exists.  Prints its
-- address on a line "ready ADDR", then one JSON line: sent.
local NODE = [[
local cjson = require "cjson"
local lecho = require "lecho"
local opts = cjson.decode(arg[1])
io.stdout:setvbuf("line")
local o = { nameserver = opts.ns, quiet = true, accept_code = opts.accept, modulator_budget = 0.05,
            modulator_memory = 8 * 1024 * 1024 }
for k, v in pairs(opts.ctx or {}) do o[k] = v end
if os.getenv("LECHO_KEY") then
  o.key = os.getenv("LECHO_KEY")
  o.trust = {}
  for t in os.getenv("LECHO_TRUST"):gmatch("[^:]+") do o.trust[#o.trust + 1] = t end
end
local ctx = lecho.context(o)
local p = opts.channel and assert(ctx:channel(opts.channel):producer())
if opts.serve then assert(ctx:service(opts.serve, function(a) return "node:" .. tostring(a) end)) end
if opts.fake_code then -- what a pusher could make before lecho. names were reserved
  assert(ctx:service("lecho.code", function() return { fake = true } end, { version = 2 },
                     require("lecho.service").RESERVED))
end
io.stdout:write("ready ", ctx.addr, "\n")
local sent, deadline = 0, ctx:now() + 60
local function stopped()
  local f = io.open(opts.stop)
  if f then f:close() end
  return f ~= nil
end
while not stopped() and ctx:now() < deadline do
  local su = opts.self_unload -- the node unloads (its own call of lecho.code) when su.file exists
  if su and not su.done and io.open(su.file) then
    su.done = true
    local r, e, code = ctx:unload_pushed(ctx.addr, su.name)
    io.stdout:write(cjson.encode{ self_unload = r or { err = e, code = code } }, "\n")
  end
  if p then
    sent = sent + 1
    assert(p:submit(sent))
  end
  ctx:run_once(0.005)
end
io.stdout:write(cjson.encode{ sent = sent }, "\n")
ctx:close{ linger = 5 }
]]

-- A caller: each of opts.calls { name, args, opts } in turn; one JSON line
-- with, for each, { ok, results = {...}, err, code }.
local CALLER = [[
local cjson = require "cjson"
local lecho = require "lecho"
local opts = cjson.decode(arg[1])
local ctx = lecho.context{ nameserver = opts.ns, quiet = true }
local out = {}
for i, c in ipairs(opts.calls) do
  local r = { n = 0 }
  local function keep(...) r = { n = select("#", ...), ... } end
  keep(ctx:call(c[1], c[2], c[3] or { timeout = 5 }))
  local res = { ok = r[1] ~= nil, n = r.n }
  if r[1] ~= nil then res.results = { unpack(r, 1, r.n) } else res.err, res.code = r[2], r[3] end
  out[i] = res
end
io.stdout:write(cjson.encode{ out = out }, "\n")
ctx:close{ linger = 1 }
]]

local ADDER = [[
local calls = 0
return function(args, meta)
  calls = calls + 1
  if type(args) ~= "table" then error({ code = 400, why = "args must be a table" }) end
  return args.x + args.y, calls, meta.service
end
]]

local function start_node(ns, extra, env)
  local stop = S.tmpname("stop")
  local o = { ns = ns, stop = stop }
  for k, v in pairs(extra or {}) do o[k] = v end
  local child = env and S.lua_with(env, NODE, cjson.encode(o)) or S.lua(NODE, cjson.encode(o))
  local line = S.wait_file(child.out, "ready %S+\n", WAIT)
  assert(line, "the node did not start: " .. S.errors(child))
  return child, line:match("ready (%S+)"), stop
end

local function calls(ns, list, ctx)
  local child = S.lua(CALLER, cjson.encode{ ns = ns, calls = list })
  return S.result(child, 40, ctx).out
end

-- Keyed mode (as spec/authz_keyed_spec.lua makes it): keys for every
-- principal, a policy letting the node serve and the others call.
local KEYED = pcall(require, "lecho.keys") and (require("lecho.core").protocol_version or 1) >= 2
local NAMES = { "nameserver", "node", "alice", "eve" }
local POLICY = [[
return {
  rules = {
    { principal = "node", channel = "svc:*", allow = { "consume", "produce" } },
    { principal = { "alice", "eve" }, channel = "svc:*", allow = { "produce" } },
  },
}
]]

local function keyed_world()
  local ns, dir, trust = S.keyed_nameserver(NAMES, POLICY)
  local function as(name)
    return lecho.context{ nameserver = ns, key = ("%s/%s.key"):format(dir, name), trust = trust, quiet = true }
  end
  local env = ("export LECHO_KEY=%s LECHO_TRUST=%s"):format(S.sh_quote(dir .. "/node.key"),
                                                           S.sh_quote(table.concat(trust, ":")))
  return ns, as, env
end

describe("pushing code (issue 12 point 6)", function()
  local c, ns
  before_each(function() ns, c = S.world() end)
  after_each(function()
    S.end_world(c)
    c = nil
  end)

  it("pushes a service to a running node, a third process calls it, unloading it makes calls noservice", function()
    local _, node = start_node(ns, { accept = true })
    local r, err, code = c:push(node, "pushed.adder", ADDER)
    assert(r, tostring(err) .. " " .. tostring(code))
    assert.are.same({ loaded = "pushed.adder@1", services = { "pushed.adder" } }, r)
    -- pushing the same name@version again is refused; another version is not
    local r2, err2, code2 = c:push(node, "pushed.adder", ADDER)
    assert.is_nil(r2)
    assert.are.equal("invalid", code2)
    assert.matches("pushed.adder@1 is loaded here", err2)
    assert(c:push(node, "pushed.adder", ADDER .. "-- v2", { version = 2 }))
    local out = calls(ns, {
      { "pushed.adder", { x = 1, y = 2 }, { version = 1, timeout = 5 } },
      { "pushed.adder", { x = 40, y = 2 }, { version = 1, timeout = 5 } },
      { "pushed.adder", "not a table", { version = 1, timeout = 5 } },
      { "pushed.adder", { x = 1, y = 1 }, { version = 2, timeout = 5 } },
    }, c)
    assert.are.same({ 3, 1, "pushed.adder" }, out[1].results)
    assert.are.same({ 42, 2, "pushed.adder" }, out[2].results)
    assert.is_false(out[3].ok)
    assert.are.same({ code = 400, why = "args must be a table" }, out[3].err)
    assert.are.equal("failed", out[3].code)
    assert.are.same({ 2, 1, "pushed.adder" }, out[4].results)
    local list = assert(c:pushed(node))
    assert.are.same({ "pushed.adder@1", "pushed.adder@2" }, (function()
      local k = {}
      for key in pairs(list) do k[#k + 1] = key end
      table.sort(k)
      return k
    end)())
    assert.are.equal(3, list["pushed.adder@1"].calls)
    -- unload version 1: version 2 still answers, version 1 is refused at once
    assert.are.same({ unloaded = { "pushed.adder@1" } }, assert(c:unload_pushed(node, "pushed.adder", 1)))
    out = calls(ns, {
      { "pushed.adder", { x = 1, y = 2 }, { version = 1, timeout = 5 } },
      { "pushed.adder", { x = 2, y = 2 }, { timeout = 5 } },
    }, c)
    assert.is_false(out[1].ok)
    assert.are.equal("version", out[1].code)
    assert.are.same({ 4, 2, "pushed.adder" }, out[2].results)
    assert.are.same({ unloaded = { "pushed.adder@2" } }, assert(c:unload_pushed(node, "pushed.adder")))
    local t0 = c:now()
    out = calls(ns, { { "pushed.adder", { x = 1, y = 2 }, { timeout = 5 } } }, c)
    assert.is_false(out[1].ok)
    assert.are.equal("noservice", out[1].code)
    assert.is_true(c:now() - t0 < 5, "noservice must come at once, not as a timeout")
    -- unloading what is not loaded says so
    local u, uerr, ucode = c:unload_pushed(node, "pushed.adder")
    assert.is_nil(u)
    assert.are.equal("notfound", ucode)
    assert.matches("pushed.adder is not loaded here", uerr)
  end)

  it("stops a pushed looping service by its budget while the node's other work goes on", function()
    local name = "push-flow"
    local plain = S.ordered_tally(c, name)
    local child, node, stop = start_node(ns, { accept = true, channel = name })
    assert(S.run_until(c, function() return plain.n >= 5 end, WAIT), "the flow did not start")
    local r, err = c:push(node, "pushed.hog", [[
      local n = 0
      return { spin = function() while true do end end,
               grow = function() local t = {} while true do t[#t + 1] = ("x"):rep(262144) .. #t end end,
               count = function() n = n + 1 return n end }]], { budget = S.asan and 0.05 or 0.02, memory = 2 * 1024 * 1024 })
    assert(r, tostring(err))
    assert.are.same({ "pushed.hog" }, r.services)
    assert.are.same({ "count", "grow", "spin" }, r.functions)
    local before = plain.n
    local out = calls(ns, {
      { "pushed.hog", { fn = "spin" } }, { "pushed.hog", { fn = "count" } }, { "pushed.hog", { fn = "grow" } },
      { "pushed.hog", { fn = "spin" } }, { "pushed.hog", { fn = "count" } },
    }, c)
    assert.is_false(out[1].ok)
    assert.matches("^budget exceeded: exceeded its CPU budget of %d+ ms", out[1].err)
    assert.are.equal("limit", out[1].code)
    assert.are.same({ 1 }, out[2].results)
    assert.is_false(out[3].ok)
    assert.matches("^memory: exceeded its memory cap of 2097152 bytes", out[3].err)
    assert.is_false(out[4].ok)
    assert.are.same({ 2 }, out[5].results)
    assert(S.run_until(c, function() return plain.n >= before + 20 end, WAIT), "the node's flow stopped")
    S.write(stop, "")
    local res = S.result(child, 30, c)
    S.assert_complete(c, plain, res.sent, "the node's flow")
  end)

  it("unloads a pushed service whose pusher passes the node's CPU share: calls then get noservice", function()
    local _, node = start_node(ns, { accept = true, ctx = { modulators_cpu = 0.05 } })
    assert(c:push(node, "pushed.hog", [[return function() local x = 0 for i = 1, 2e5 do x = x + i end return x end]]))
    local ended
    for _ = 1, 400 do
      local ok, err, code = c:call("pushed.hog", {}, { timeout = 5 })
      if ok == nil then ended = { err, code } break end
    end
    assert(ended, "the CPU share never ended the pushed service")
    assert.matches("^sandbox ended: used %d+%% of the producer's CPU", ended[1])
    local ok, err, code = c:call("pushed.hog", {}, { timeout = 5 })
    assert.are.same({ nil, "noservice" }, { ok, code }, tostring(err))
    assert.are.same({}, assert(c:pushed(node)))
  end)

  it("keyed mode: only the principals of accept_code may push; the others are refused, and may call", function()
    if not KEYED then pending("keyed mode (lecho.keys, protocol 2) is not in this build") return end
    local kns, as, env = keyed_world()
    local _, node = start_node(kns, { accept = { "alice" } }, env)
    local alice, eve = as("alice"), as("eve")
    local r, err, code = eve:push(node, "eve.adder", ADDER)
    assert.is_nil(r)
    assert.are.equal("refused", code)
    assert.are.equal("not allowed: eve may not push code to " .. node, err)
    -- names: a namespace per pusher by default
    r, err, code = alice:push(node, "eve.adder", ADDER)
    assert.are.same({ nil, "refused" }, { r, code })
    assert.are.equal("alice may not push eve.adder here: names allowed: alice.*", err)
    r, err = alice:push(node, "alice.adder", ADDER)
    assert(r, tostring(err))
    assert.are.equal("alice", assert(alice:pushed(node))["alice.adder@1"].by)
    r, err, code = eve:pushed(node)               -- listing is the pushers' too
    assert.are.same({ nil, "refused" }, { r, code })
    assert.are.same({ 5, 1, "alice.adder" }, { eve:call("alice.adder", { x = 2, y = 3 }, { timeout = 5 }) })
    r, err, code = eve:unload_pushed(node, "alice.adder")
    assert.are.same({ nil, "refused" }, { r, code })
    assert(alice:unload_pushed(node, "alice.adder"))
    alice:close()
    eve:close()
  end)

  it("refuses bad source with the loader's reason; a node without accept_code does not serve lecho.code", function()
    local _, node = start_node(ns, { accept = true })
    local r, err, code = c:push(node, "pushed.bad", "return (")
    assert.is_nil(r)
    assert.are.equal("invalid", code)
    assert.matches("unexpected symbol", err)
    r, err, code = c:push(node, "pushed.bad name!", "return function() end")
    assert.are.same({ nil, "invalid" }, { r, code })
    assert.matches("name must be", err)
    local _, plain_node = start_node(ns, {})
    r, err, code = c:push(plain_node, "adder", ADDER, { timeout = 5 })
    assert.is_nil(r)
    assert.truthy(code == "noservice" or code == "notfound", tostring(code) .. ": " .. tostring(err))
  end)
end)

-- What an outside attack on pushed code found (issue 12, /tmp/attackC):
-- the sandbox held, the service layer around it did not.
describe("pushed code stays in its place (issue 12: the attack on pushed code)", function()
  local c, ns
  before_each(function() ns, c = S.world() end)
  after_each(function()
    S.end_world(c)
    c = nil
  end)
  local function keys(t)
    local k = {}
    for key in pairs(t) do k[#k + 1] = key end
    table.sort(k)
    return k
  end
  local ONE = "return function(a) return 'one' end"
  -- A node started after ctx's first call of lecho.code: wait until ctx's
  -- member list has it (a call at an address not listed is "noservice").
  local function sees(ctx, node)
    assert(S.run_until(ctx, function() return select(3, ctx:pushed(node, { timeout = 5 })) ~= "noservice" end, 10),
           "lecho.code at " .. node .. " never listed")
    return node
  end
  -- A name server process forgetting unused channels after 0.5 s (the
  -- script's does after 30 s).
  local NS = [[
local lecho = require "lecho"
local ctx = lecho.context{ quiet = true, forget_after = 0.5 }
io.stdout:setvbuf("line")
io.stdout:write("ready ", ctx.addr, "\n")
local t0 = ctx:now()
while ctx:now() - t0 < 90 do ctx:run_once(0.05) end
]]

  it("reserves lecho. names: lecho.code@2 cannot be pushed nor served, and clients ask lecho.code@1", function()
    local _, node = start_node(ns, { accept = true })
    local r, err, code = c:push(node, "lecho.code", [[
      return function(req) return { loaded = "fake", services = { req.name } } end]], { version = 2 })
    assert.are.same({ nil, "refused" }, { r, code })
    assert.matches("lecho%. are the library's", err)
    local r2, _, code2 = c:push(node, "lecho.other", ONE)
    assert.are.same({ nil, "refused" }, { r2, code2 })
    assert.has_error(function() c:service("lecho.x", function() end) end)
    -- a lecho.code@2 beside the real one (as a pusher could make it) is
    -- never asked: clients call version 1 exactly
    local _, node2 = start_node(ns, { accept = true, fake_code = true })
    sees(c, node2)
    assert(c:push(node2, "pushed.mine", ONE))
    local list = assert(c:pushed(node2))
    assert.is_nil(list.fake)
    assert.are.same({ "pushed.mine@1" }, keys(list))
  end)

  it("refuses a name the node serves, another pusher's name, and names outside the node's list", function()
    local _, node = start_node(ns, { accept = true, serve = "legit" })
    local r, err, code = c:push(node, "legit", ONE, { version = 2 })
    assert.are.same({ nil, "refused" }, { r, code })
    assert.matches("names allowed: pushed%.%*", err)
    assert.are.same({ "node:x" }, { c:call("legit", "x", { timeout = 5 }) })
    -- a node that allows "legit": still not beside the node's own legit@1
    local _, node2 = start_node(ns, { accept = { names = { "legit", "pushed.*" } }, serve = "legit" })
    sees(c, node2)
    r, err, code = c:push(node2, "legit", ONE, { version = 2 })
    assert.are.same({ nil, "refused" }, { r, code })
    assert.matches("legit is served here %(version 1%) by the node", err)
    -- another pusher's name: not beside it; the same pusher may add versions
    local d = lecho.context{ nameserver = ns, quiet = true }
    sees(d, node2)
    assert(c:push(node2, "pushed.a", ONE))
    r, err, code = d:push(node2, "pushed.a", ONE, { version = 2 })
    assert.are.same({ nil, "refused" }, { r, code })
    assert.matches("by another pusher", err)
    assert(c:push(node2, "pushed.a", ONE, { version = 2 }))
    -- and only its pusher (or the node) unloads it
    r, err, code = d:unload_pushed(node2, "pushed.a")
    assert.are.same({ nil, "refused" }, { r, code })
    assert.matches("only its pusher or the node may unload it", err)
    assert.are.same({ unloaded = { "pushed.a@1", "pushed.a@2" } }, assert(c:unload_pushed(node2, "pushed.a")))
    -- two pushers loading one name at once: one gets it, the other is told
    -- it is another pusher's (its service is registered before its join)
    local got = {}
    c:call_async("lecho.code", { op = "load", name = "pushed.z", src = ONE }, { at = node2, version = 1 },
                 function(r, e) got[#got + 1] = r and "loaded" or e.why end)
    d:call_async("lecho.code", { op = "load", name = "pushed.z", version = 2, src = ONE }, { at = node2, version = 1 },
                 function(r, e) got[#got + 1] = r and "loaded" or e.why end)
    assert(S.run_until(c, function() d:run_once(0.001) return #got == 2 end, 20))
    table.sort(got)
    assert.are.equal("loaded", got[1])
    assert.matches("^pushed%.z is served here %(version [12]%) by another pusher$", got[2])
    d:close()
    -- the name list is checked when the node starts
    assert.has_error(function() lecho.context{ nameserver = ns, quiet = true, accept_code = { names = { "a b" } } } end)
    assert.has_error(function() lecho.context{ nameserver = ns, quiet = true, accept_code = { names = "x.*" } } end)
    assert.has_error(function() -- principals: keyed mode only
      lecho.context{ nameserver = ns, quiet = true, accept_code = { principals = { "alice" }, names = { "x.*" } } }
    end)
  end)

  it("lets the node itself unload what another pushed", function()
    local trigger = S.tmpname("unload")
    local child, node = start_node(ns, { accept = true, self_unload = { file = trigger, name = "pushed.p" } })
    assert(c:push(node, "pushed.p", ONE))
    S.write(trigger, "")
    local line = assert(S.wait_file(child.out, "self_unload[^\n]*\n", WAIT), S.errors(child))
    local got = cjson.decode(line:match("{[^\n]*self_unload[^\n]*}"))
    assert.are.same({ unloaded = { "pushed.p@1" } }, got.self_unload)
    assert.are.same({}, assert(c:pushed(node)))
  end)

  it("serves a chunk's table of functions as ONE service called by args.fn, at most 256 functions", function()
    local _, node = start_node(ns, { accept = true })
    local r, err, code = c:push(node, "pushed.many",
      "local t = {} for i = 1, 300 do t['f' .. i] = function() return i end end return t")
    assert.are.same({ nil, "limit" }, { r, code })
    assert.matches("300 functions: at most 256", err)
    r = assert(c:push(node, "pushed.calc", [[
      return { add = function(a) return a.x + a.y end, neg = function(a) return -a.x end }]]))
    assert.are.same({ loaded = "pushed.calc@1", services = { "pushed.calc" }, functions = { "add", "neg" } }, r)
    assert.are.same({ 5 }, { c:call("pushed.calc", { fn = "add", x = 2, y = 3 }, { timeout = 5 }) })
    assert.are.same({ -2 }, { c:call("pushed.calc", { fn = "neg", x = 2 }, { timeout = 5 }) })
    local ok, e, ecode = c:call("pushed.calc", { fn = {}, x = 1 }, { timeout = 5 })
    assert.are.same({ nil, "invalid" }, { ok, ecode })
    assert.matches("args.fn must name one %(got a table%)", e)
    assert.is_nil(c:call("pushed.calc.add", { x = 1, y = 1 }, { timeout = 2 }))
  end)

  it("unload returns memory: 10 push/unload rounds keep the node's RSS bounded, the name server forgets", function()
    local nsp = S.lua(NS)
    local nsaddr = assert(S.wait_file(nsp.out, "ready %S+\n", WAIT), S.errors(nsp)):match("ready (%S+)")
    local nsc = lecho.context{ nameserver = nsaddr, quiet = true }
    local child, node = start_node(nsaddr, { accept = true, ctx = { quiet = false } })
    local function rss()
      local f = assert(io.open("/proc/" .. child.pid .. "/status"))
      local kb = tonumber(f:read("*a"):match("VmRSS:%s*(%d+)"))
      f:close()
      return kb
    end
    local src = "local t = {} for i = 1, 200 do t['f' .. i] = function() return i end end return t"
    local first
    for round = 1, 10 do
      local name = "pushed.r" .. round
      local r, err = nsc:push(node, name, src, { timeout = 20 })
      assert(r, tostring(err))
      assert(nsc:unload_pushed(node, name, nil, { timeout = 20 }))
      if round == 2 then first = rss() end
    end
    local grown = rss() - first
    assert.is_true(grown < 2048, ("the node grew by %d kB over 8 push/unload rounds"):format(grown))
    -- the unloaded services' channels leave the name server
    local function svc_left()
      local n = 0
      for full in pairs(nsc:list() or {}) do if full:find("/svc:pushed%.r") then n = n + 1 end end
      return n
    end
    assert(S.run_until(nsc, function() return svc_left() == 0 end, 10), svc_left() .. " svc:pushed.r* left")
    -- one log line per load, with a count (not the list of its functions)
    local log = S.errors(child)
    local line = log:match("[^\n]*pushed service pushed%.r3@1 loaded[^\n]*")
    assert(line, log:sub(1, 400))
    assert.is_true(#line < 200, line:sub(1, 300))
    nsc:close()
  end)

  it("counts loads in progress against the limit of 64 pushed services", function()
    local _, node = start_node(ns, { accept = true })
    for i = 1, 62 do assert(c:push(node, "pushed.s" .. i, ONE, { timeout = 10 })) end
    local done, ok = 0, 0
    for i = 1, 4 do
      c:call_async("lecho.code", { op = "load", name = "pushed.c" .. i, src = ONE }, { at = node, version = 1 },
                   function(r) done = done + 1 if r then ok = ok + 1 end end)
    end
    assert(S.run_until(c, function() return done == 4 end, 20))
    assert.are.equal(2, ok)
    local n = #keys(assert(c:pushed(node)))
    assert.are.equal(64, n)
  end)

  it("shows no heap address and no node file in what a caller gets back", function()
    local _, node = start_node(ns, { accept = true })
    local r, err = c:call("lecho.code", { op = "unload", name = "n", version = {} }, { at = node, timeout = 5 })
    assert.is_nil(r)
    assert.is_nil(tostring(err.why or err):find("0x"), tostring(err.why or err))
    assert(c:push(node, "pushed.boom", "return function() local t = nil; return t.x end"))
    local ok, e, code, tb = c:call("pushed.boom", {}, { timeout = 5 })
    assert.are.same({ nil, "failed" }, { ok, code })
    assert.matches("attempt to index", e)
    assert.is_string(tb)
    assert.matches("pushed%.boom", tb)
    assert.is_nil(tb:find("lecho/", 1, true), tb)
    assert.is_nil(tb:find("0x", 1, true), tb)
  end)

  it("after version 2 is unloaded, a caller that still lists it gets version 1 of the same node", function()
    local _, node = start_node(ns, { accept = true })
    assert(c:push(node, "pushed.v", "return function() return 1 end"))
    assert(c:push(node, "pushed.v", "return function() return 2 end", { version = 2 }))
    local d = lecho.context{ nameserver = ns, quiet = true }
    assert.are.same({ 2 }, { d:call("pushed.v", {}, { timeout = 5 }) })
    assert(c:unload_pushed(node, "pushed.v", 2))
    assert.are.same({ 1 }, { d:call("pushed.v", {}, { timeout = 5 }) })
    d:close()
  end)
end)
