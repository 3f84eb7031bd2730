-- Sandboxes (issue 12 point 6, core/moe/moe_svc.c): Lua source loaded in a
-- state made like a modulator's and called with values.  Hostile functions
-- (loops, unbounded allocation, raised tables, results that cannot travel,
-- the absent os/io, huge arguments) each fail alone with a reason and a
-- code, the state goes on serving, and a producer in the same process goes
-- on sending: the sandboxes run in a child process, the plain consumer
-- here counts its events, all of them, in order.
local cjson = require "cjson"
local lecho = require "lecho"
local S = require "spec.support"

local HOSTILE = [==[
local count = 0
local t = {}
function t.count() count = count + 1 return count end
function t.loop() while true do end end
function t.loop_pcall() pcall(function() while true do end end) return "escaped" end
function t.loop_xpcall() xpcall(function() while true do end end, function() while true do end end) end
function t.pattern() return (("x"):rep(200000)):find(".-.-.-.-.-y") end
function t.grow() local a = {} while true do a[#a + 1] = ("x"):rep(1048576 + #a) end end
function t.big_result() return ("x"):rep(64 * 1024 * 1024) end
function t.raise_table() error({ code = 400, why = "bad request" }) end
function t.raise_string() error("boom") end
function t.raise_fn() error(function() end) end
function t.recurse() local function f(n) return 1 + f(n + 1) end return f(1) end
function t.ret_fn() return function() end end
function t.ret_cycle() local a = {} a.self = a return a end
function t.ret_many() local r = {} for i = 1, 1000 do r[i] = i end return unpack(r) end
function t.env() return type(os), type(io), type(require), type(load), type(loadstring),
  type(debug), type(string.dump), type(emit), type(getfenv), type(collectgarbage) end
function t.size(x) if type(x) == "table" then return #x end return #x end
return t
]==]

-- Runs each case of opts.cases (fname and how to make its argument) in a
-- sandbox while a producer sends 1, 2, 3... to opts.channel; after each, calls
-- count() to prove the state lives.  Prints "ready", then one JSON line.
local CHILD = [[
local cjson = require "cjson"
local lecho = require "lecho"
local opts = cjson.decode(arg[1])
io.stdout:setvbuf("line")
local ctx = lecho.context{ nameserver = opts.ns, quiet = true, modulator_budget = opts.budget,
                           modulator_memory = 8 * 1024 * 1024, modulators_cpu = opts.cpu }
local p = assert(ctx:channel(opts.channel):producer())
local sb = assert(ctx:sandbox(opts.src, "hostile"))
io.stdout:write("ready\n")
local sent = 0
local function send(n)
  for _ = 1, n do
    sent = sent + 1
    assert(p:submit(sent))
    ctx:run_once(0.002)
  end
end
send(20)
local out = {}
local ARGS = {
  huge_string = function() return ("y"):rep(16 * 1024 * 1024) end,
  big_table = function() local a = {} for i = 1, 100000 do a[i] = i end return a end,
}
for i, case in ipairs(opts.cases) do
  local arg = case.arg and ARGS[case.arg]()
  local r = table.pack and table.pack(sb:invoke(case.fn, arg)) or { n = select("#", sb:invoke(case.fn, arg)), sb:invoke(case.fn, arg) }
  local res = { ok = r[1], code = r[3], tb = r[4], n = r.n }
  if type(r[2]) == "table" then res.err = r[2] else res.err = tostring(r[2]) end
  if r[1] then res.results = { unpack(r, 2, r.n) } end
  local ok, c = sb:invoke("count")
  res.count = ok and c or -1
  out[i] = res
  send(5)
end
send(20)
io.stdout:write(cjson.encode{ sent = sent, out = out, closed = sb:error() }, "\n")
ctx:close{ linger = 5 }
]]

describe("sandboxes (issue 12: code pushed to a node runs contained)", function()
  local c
  before_each(function() c = lecho.context{ quiet = true } end)
  after_each(function()
    if c then c:close{ linger = 0 } end
    c = nil
    S.cleanup()
  end)

  it("calls with values: nils, tables and several results kept; a table of functions; state kept", function()
    local sb = assert(c:sandbox([[
      local n = 0
      return { add = function(a, b) n = n + 1 return a + b, nil, { sum = a + b, n = n } end,
               echo = function(...) return ... end }]], "calc"))
    local names = assert(sb:names())
    table.sort(names)
    assert.are.same({ "add", "echo" }, names)
    local r = { n = select("#", sb:invoke("add", 1, 2)), sb:invoke("add", 1, 2) }
    assert.are.same({ n = 4, true, 3, nil, { sum = 3, n = 2 } }, r)
    r = { n = select("#", sb:invoke("echo", nil, "a", nil)), sb:invoke("echo", nil, "a", nil) }
    assert.are.same({ n = 4, true, nil, "a", nil }, r)
    assert.are.equal(0, select("#", sb:invoke("echo")) - 1)
    -- one function: call(); naming one of a table's is invoke()
    local one = assert(c:sandbox("return function(x) return x * 2 end", "double"))
    assert.is_false(one:names())
    assert.are.same({ true, 42 }, { one:call(21) })
    local ok, err, code = sb:call(1)
    assert.is_nil(ok)
    assert.matches("name one", err)
    assert.are.equal("invalid", code)
    ok, err, code = sb:invoke("nope")
    assert.is_nil(ok)
    assert.matches("no function 'nope'", err)
    assert.are.equal("invalid", code)
    -- what cannot travel is refused before the call
    ok, err, code = one:call(print)
    assert.is_nil(ok)
    assert.matches("function", err)
    assert.are.equal("invalid", code)
    assert.are.equal(2, sb:stats().calls >= 2 and 2 or 0)
    sb:close()
    assert.has_error(function() sb:call() end, "lecho: sandbox is closed")
  end)

  it("cannot be called or closed from inside its own call (a granted log's handler)", function()
    local sb, inner
    local ctx = lecho.context{ quiet = true, log = function(msg)
      if sb and msg:find("inside", 1, true) then
        inner = { call = { sb:call(1) }, close = { pcall(sb.close, sb) } }
      end
    end }
    sb = assert(ctx:sandbox("return function(x) log('inside') return x end", "re", { log = true }))
    assert.are.same({ true, 5 }, { sb:call(5) })
    assert.are.same({ nil, "the sandbox is in a call: it cannot be called from inside it", "invalid" }, inner.call)
    assert.are.same({ false, "lecho: a sandbox cannot be closed from inside its own call" }, inner.close)
    assert.are.same({ true, 6 }, { sb:call(6) })
    ctx:close()
  end)

  it("is ended for good, with the reason, when its principal passes the context's CPU share", function()
    local ctx = lecho.context{ quiet = true, modulator_budget = 0.05, modulators_cpu = 0.05 }
    local sb = assert(ctx:sandbox([[return {
      spin = function() local x = 0 for i = 1, 2e5 do x = x + i end return x end,
      ok = function() return 1 end }]], "hog", { principal = "pusher" }))
    local ended
    for _ = 1, 400 do
      local ok, err, code = sb:invoke("spin")
      if not ok then ended = { err, code } break end
      ctx:run_once(0.001)
    end
    assert(ended, "the CPU share never ended the sandbox")
    assert.matches("^sandbox ended: used %d+%% of the producer's CPU .* modulators from pusher are refused", ended[1])
    assert.are.equal("closed", ended[2])
    local ok, err, code = sb:invoke("ok")
    assert.are.same({ nil, "closed" }, { ok, code })
    assert.matches("^sandbox ended", err)
    assert.matches("^used", sb:error())
    -- and the principal's next sandbox is refused while it cools down
    ok, err = ctx:sandbox("return function() end", "again", { principal = "pusher" })
    assert.is_nil(ok)
    assert.matches("went past the producer's CPU share", err)
    ctx:close()
  end)

  it("says the CPU share, not the budget, when the share ends a sandbox stopped by its budget", function()
    -- each call spins until its budget stops it; the share check that runs
    -- after that same call ends the sandbox: its reason is the share
    local ctx = lecho.context{ quiet = true, modulator_budget = 0.05, modulators_cpu = 0.05 }
    local sb = assert(ctx:sandbox("return function() while true do end end", "spin", { principal = "pusher" }))
    local ended, stops = nil, 0
    for _ = 1, 100 do
      local ok, err, code = sb:call()
      if code == "closed" then ended = err break end
      assert.are.equal("limit", code, tostring(err))
      stops = stops + 1
      ctx:run_once(0.001)
    end
    assert(ended, "the CPU share never ended the sandbox")
    assert.matches("^sandbox ended: used %d+%% of the producer's CPU", ended)
    assert.is_nil(ended:find("budget", 1, true), ended)
    assert.matches("^used %d+%% of the producer's CPU", sb:error())
    ctx:close()
  end)

  it("refuses at load what is not a function or a table of functions, bytecode, a loop", function()
    local cases = {
      { "return 1", "must return a function or a table of functions, not number" },
      { "return { f = 1 }", "only functions named by strings" },
      { "return {}", "holds no function" },
      { "return (", "unexpected symbol" },
      { string.dump(function() end), "not bytecode" },
      { "while true do end", "budget exceeded" },
      { "local t = {} while true do t[#t + 1] = (\"x\"):rep(262144) .. #t end", "memory cap" },
      { "return function() return os, io end", nil },
    }
    for _, case in ipairs(cases) do
      local sb, err, code = c:sandbox(case[1], "load", { memory = 1024 * 1024 })
      if case[2] then
        assert.is_nil(sb, case[1])
        assert.matches(case[2], err)
        assert.are.equal("invalid", code)
      else
        assert.truthy(sb)
        assert.are.same({ true }, { sb:call() })   -- os, io: absent
      end
    end
    -- budget and memory may be lowered, never raised past the node's
    local sb = assert(c:sandbox("return function() while true do end end", "cap", { budget = 1e9 }))
    local t0 = os.clock()
    local ok, err, code = sb:call()
    assert.is_nil(ok)
    assert.matches("budget exceeded: .*budget of 5 ms", err)
    assert.are.equal("limit", code)
    assert.is_true(os.clock() - t0 < 1)
  end)

  it("fails each hostile call alone, keeps the state, and the producer beside it goes on", function()
    local name = "sandbox-flow"
    local plain = S.ordered_tally(c, name)
    local cases = {
      { fn = "loop", code = "limit", err = "^budget exceeded" },
      { fn = "loop_pcall", code = "limit", err = "^budget exceeded" },
      { fn = "loop_xpcall", code = "limit", err = "^budget exceeded" },
      { fn = "pattern", code = "limit", err = "^budget exceeded" },
      { fn = "grow", code = "limit", err = "^memory: exceeded its memory cap of 8388608" },
      { fn = "big_result", code = "limit", err = "^memory" },
      { fn = "raise_table", code = "failed", tb = true },
      { fn = "raise_string", code = "failed", err = "^hostile:%d+: boom$", tb = true },
      { fn = "raise_fn", code = "failed", err = "^error object is a function value$", tb = true },
      { fn = "recurse", code = "failed", err = "stack overflow", tb = true },
      { fn = "ret_fn", code = "invalid", err = "cannot encode a function" },
      { fn = "ret_cycle", code = "invalid", err = "cycle" },
      { fn = "ret_many", code = "invalid", err = "more than 250 results" },
      { fn = "size", arg = "huge_string", code = "limit", err = "^memory" },
      { fn = "size", arg = "big_table", ok = true, results = { 100000 } },
      { fn = "env", ok = true, results = { "nil", "nil", "nil", "nil", "nil", "nil", "nil", "nil", "nil", "nil" } },
    }
    -- (x10 under make asan: the instrumented decoder of the big table; then
    -- the looping cases' 0.2 s each pass the CPU share, which would end the
    -- sandbox: no share cap under ASan, the share has its own specs)
    local child = S.lua(CHILD, cjson.encode{ ns = c.addr, channel = name, src = HOSTILE, cases = cases,
                                             budget = S.asan and 0.2 or 0.02, cpu = S.asan and 0 or nil })
    local res = S.result(child, 60, c)
    S.assert_complete(c, plain, res.sent, "the plain flow")
    assert.is_nil(res.closed)
    for i, case in ipairs(cases) do
      local r = res.out[i]
      local what = case.fn .. (case.arg and "(" .. case.arg .. ")" or "")
      assert.are.equal(i, r.count, what .. ": the state did not serve the next call")
      if case.ok then
        assert.is_true(r.ok, what)
        assert.are.same(case.results, r.results, what)
      else
        assert.are.equal(cjson.null, r.ok == nil and cjson.null or r.ok, what)
        assert.are.equal(case.code, r.code, what .. ": " .. cjson.encode(r.err))
        if case.err then assert.matches(case.err, r.err, nil, false, what) end
        if case.tb then assert.matches("stack traceback", r.tb, nil, false, what) end
      end
    end
    assert.are.same({ code = 400, why = "bad request" }, res.out[7].err)
    assert.is_nil(res.out[8].tb:find("0x", 1, true), "no address in a traceback")
  end)
end)
