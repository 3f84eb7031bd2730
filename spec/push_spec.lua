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
io.stdout:write("ready ", ctx.addr, "\n")
local sent, deadline = 0, ctx:now() + 60
local function stopped()
  local f = io.open(opts.stop)
  if f then f:close() end
  return f ~= nil
end
while not stopped() and ctx:now() < deadline do
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
  local dir = S.tmpdir() .. "/keys"
  assert(os.execute("mkdir -p " .. S.sh_quote(dir)))
  local ok, out = S.sh(("%s %s/scripts/lecho-keygen %s --dir %s"):format(S.luajit, S.root,
                                                                         table.concat(NAMES, " "), S.sh_quote(dir)))
  assert(ok, out)
  local trust = {}
  for i, n in ipairs(NAMES) do trust[i] = ("%s/%s.pub"):format(dir, n) end
  local pol = S.write(dir .. "/policy.lua", POLICY)
  local args = { "--quiet", "--key", dir .. "/nameserver.key", "--policy", pol }
  for _, t in ipairs(trust) do args[#args + 1] = "--trust " .. t end
  local _, ns = S.nameserver(table.concat(args, " "))
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
    local r, err, code = c:push(node, "adder", ADDER)
    assert(r, tostring(err) .. " " .. tostring(code))
    assert.are.same({ loaded = "adder@1", services = { "adder" } }, r)
    -- pushing the same name@version again is refused; another version is not
    local r2, err2, code2 = c:push(node, "adder", ADDER)
    assert.is_nil(r2)
    assert.are.equal("invalid", code2)
    assert.matches("adder@1 is loaded here", err2)
    assert(c:push(node, "adder", ADDER .. "-- v2", { version = 2 }))
    local out = calls(ns, {
      { "adder", { x = 1, y = 2 }, { version = 1, timeout = 5 } },
      { "adder", { x = 40, y = 2 }, { version = 1, timeout = 5 } },
      { "adder", "not a table", { version = 1, timeout = 5 } },
      { "adder", { x = 1, y = 1 }, { version = 2, timeout = 5 } },
    }, c)
    assert.are.same({ 3, 1, "adder" }, out[1].results)
    assert.are.same({ 42, 2, "adder" }, out[2].results)
    assert.is_false(out[3].ok)
    assert.are.same({ code = 400, why = "args must be a table" }, out[3].err)
    assert.are.equal("failed", out[3].code)
    assert.are.same({ 2, 1, "adder" }, out[4].results)
    local list = assert(c:pushed(node))
    assert.are.same({ "adder@1", "adder@2" }, (function()
      local k = {}
      for key in pairs(list) do k[#k + 1] = key end
      table.sort(k)
      return k
    end)())
    assert.are.equal(3, list["adder@1"].calls)
    -- unload version 1: version 2 still answers, version 1 is refused at once
    assert.are.same({ unloaded = { "adder@1" } }, assert(c:unload_pushed(node, "adder", 1)))
    out = calls(ns, {
      { "adder", { x = 1, y = 2 }, { version = 1, timeout = 5 } },
      { "adder", { x = 2, y = 2 }, { timeout = 5 } },
    }, c)
    assert.is_false(out[1].ok)
    assert.are.equal("version", out[1].code)
    assert.are.same({ 4, 2, "adder" }, out[2].results)
    assert.are.same({ unloaded = { "adder@2" } }, assert(c:unload_pushed(node, "adder")))
    local t0 = c:now()
    out = calls(ns, { { "adder", { x = 1, y = 2 }, { timeout = 5 } } }, c)
    assert.is_false(out[1].ok)
    assert.are.equal("noservice", out[1].code)
    assert.is_true(c:now() - t0 < 5, "noservice must come at once, not as a timeout")
    -- unloading what is not loaded says so
    local u, uerr, ucode = c:unload_pushed(node, "adder")
    assert.is_nil(u)
    assert.are.equal("notfound", ucode)
    assert.matches("adder is not loaded here", uerr)
  end)

  it("stops a pushed looping service by its budget while the node's other work goes on", function()
    local name = "push-flow"
    local plain = { n = 0 }
    assert(c:channel(name):consumer(function(ev)
      plain.first = plain.first or ev
      if plain.last and ev ~= plain.last + 1 then plain.gap = plain.gap or { plain.last, ev } end
      plain.last = ev
      plain.n = plain.n + 1
    end))
    local child, node, stop = start_node(ns, { accept = true, channel = name })
    assert(S.run_until(c, function() return plain.n >= 5 end, WAIT), "the flow did not start")
    local r, err = c:push(node, "hog", [[
      local n = 0
      return { spin = function() while true do end end,
               grow = function() local t = {} while true do t[#t + 1] = ("x"):rep(262144) .. #t end end,
               count = function() n = n + 1 return n end }]], { budget = S.asan and 0.05 or 0.02, memory = 2 * 1024 * 1024 })
    assert(r, tostring(err))
    assert.are.same({ "hog.count", "hog.grow", "hog.spin" }, r.services)
    local before = plain.n
    local out = calls(ns, {
      { "hog.spin", {} }, { "hog.count", {} }, { "hog.grow", {} }, { "hog.spin", {} }, { "hog.count", {} },
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
    assert(S.run_until(c, function() return plain.last == res.sent end, 10),
           ("the consumer got up to %s of %d"):format(tostring(plain.last), res.sent))
    assert.is_nil(plain.gap, "the node's flow lost events")
    assert.are.equal(plain.last - plain.first + 1, plain.n)
  end)

  it("unloads a pushed service whose pusher passes the node's CPU share: calls then get noservice", function()
    local _, node = start_node(ns, { accept = true, ctx = { modulators_cpu = 0.05 } })
    assert(c:push(node, "hog", [[return function() local x = 0 for i = 1, 2e5 do x = x + i end return x end]]))
    local ended
    for _ = 1, 400 do
      local ok, err, code = c:call("hog", {}, { timeout = 5 })
      if ok == nil then ended = { err, code } break end
    end
    assert(ended, "the CPU share never ended the pushed service")
    assert.matches("^sandbox ended: used %d+%% of the producer's CPU", ended[1])
    local ok, err, code = c:call("hog", {}, { timeout = 5 })
    assert.are.same({ nil, "noservice" }, { ok, code }, tostring(err))
    assert.are.same({}, assert(c:pushed(node)))
  end)

  it("keyed mode: only the principals of accept_code may push; the others are refused, and may call", function()
    if not KEYED then pending("keyed mode (lecho.keys, protocol 2) is not in this build") return end
    local kns, as, env = keyed_world()
    local _, node = start_node(kns, { accept = { "alice" } }, env)
    local alice, eve = as("alice"), as("eve")
    local r, err, code = eve:push(node, "adder", ADDER)
    assert.is_nil(r)
    assert.are.equal("refused", code)
    assert.are.equal("not allowed: eve may not push code to " .. node, err)
    r, err = alice:push(node, "adder", ADDER)
    assert(r, tostring(err))
    assert.are.equal("alice", assert(alice:pushed(node))["adder@1"].by)
    r, err, code = eve:pushed(node)               -- listing is the pushers' too
    assert.are.same({ nil, "refused" }, { r, code })
    assert.are.same({ 5, 1, "adder" }, { eve:call("adder", { x = 2, y = 3 }, { timeout = 5 }) })
    r, err, code = eve:unload_pushed(node, "adder")
    assert.are.same({ nil, "refused" }, { r, code })
    assert(alice:unload_pushed(node, "adder"))
    alice:close()
    eve:close()
  end)

  it("refuses bad source with the loader's reason; a node without accept_code does not serve lecho.code", function()
    local _, node = start_node(ns, { accept = true })
    local r, err, code = c:push(node, "bad", "return (")
    assert.is_nil(r)
    assert.are.equal("invalid", code)
    assert.matches("unexpected symbol", err)
    r, err, code = c:push(node, "bad name!", "return function() end")
    assert.are.same({ nil, "invalid" }, { r, code })
    assert.matches("name must be", err)
    local _, plain_node = start_node(ns, {})
    r, err, code = c:push(plain_node, "adder", ADDER, { timeout = 5 })
    assert.is_nil(r)
    assert.truthy(code == "noservice" or code == "notfound", tostring(code) .. ": " .. tostring(err))
  end)
end)
