-- Modulators contained without holes (issue 11, item 1): the budget cannot
-- be defeated by message handlers or error objects, a call stuck in C
-- functions is stopped, and the modulators of a producer together are capped
-- in memory, CPU share, period and count per principal.  The producer runs
-- in a child process (a hang there must not hang the suite); the consumers,
-- a plain one and the hostile ones, run here, in the context the child uses
-- as its name server.  Each case checks the plain flow beside the attack:
-- every event the producer sent after the plain consumer joined arrives, in
-- order, without loss, and the producer goes on after the attack is stopped.
local cjson = require "cjson"
local lecho = require "lecho"
local S = require "spec.support"
local P = require "spec.support.proc"

-- opts: ns, channel, ctx (context options), grant (capabilities), stop (a
-- file: its existence ends the run), gap (seconds between events).  Prints
-- "ready", then one JSON line: sent, rss0 (VmRSS at start), hwm (VmHWM at
-- the end), derived (channels of modulator streams open at the end).
local PRODUCER = [[
local cjson = require "cjson"
local lecho = require "lecho"
local opts = cjson.decode(arg[1])
io.stdout:setvbuf("line")
local function status(field)
  local f = io.open("/proc/self/status")
  local s = f:read("*a")
  f:close()
  return tonumber(s:match(field .. ":%s*(%d+)")) * 1024
end
local o = opts.ctx
o.nameserver = opts.ns
if o.quiet == nil then o.quiet = not os.getenv("LECHO_SPEC_LOG") end
local ctx = lecho.context(o)
local p = assert(ctx:channel(opts.channel):producer{ grant = opts.grant })
local rss0 = status("VmRSS")
io.stdout:write("ready\n")
local sent, deadline = 0, ctx:now() + 40
local function stopped()
  local f = io.open(opts.stop)
  if f then f:close() end
  return f ~= nil
end
while not stopped() and ctx:now() < deadline do
  sent = sent + 1
  assert(p:submit(sent))
  ctx:run_once(opts.gap or 0.005)
end
local derived = 0
for name in pairs(ctx:stats().channels or {}) do
  if name:find("@", 1, true) then derived = derived + 1 end
end
io.stdout:write(cjson.encode{ sent = sent, rss0 = rss0, hwm = status("VmHWM"), derived = derived }, "\n")
ctx:close{ linger = 5 }
]]

local n = 0

-- The CPU share check counts modulators' CPU against at least 0.5 s a
-- window (SHARE_FLOOR_S, core/moe/moe_group.c, doc/modulators.md): at a
-- 50% cap past 0.25 s of CPU a second, more than a producer got at load
-- 12-20 (a spinner got 0.06 of a core at load 15), so "measures the share"
-- scales its modulators' work and cap by S.core_fraction(), as by 1/S.SLOW
-- under ASan.  ("does not blame a modest modulator" is not scaled: at caps
-- of 2-6% the modest one's few ms a second were charged 30-43 ms, 1 ms
-- ticks landing in its calls, and it was blamed in 2 of 6 runs.)
local core_fraction = S.core_fraction

-- Runs one case: `hostile` is a list of consumer options (modulator,
-- params, period...), each expected to be told `why[i]` (a pattern) through
-- on_error; at least `min_errors` of them are told something.  Returns the
-- producer's result and the errors, by index.
local function run(c, ctx_opts, hostile, why, grant, min_errors)
  n = n + 1
  local name = "moe-contained-" .. n
  local ch = c:channel(name)
  local plain = { n = 0 }
  assert(ch:consumer(function(ev)
    if type(ev) ~= "number" then return end
    plain.first = plain.first or ev
    if plain.last and ev ~= plain.last + 1 then plain.gap = plain.gap or { plain.last, ev } end
    plain.last = ev
    plain.n = plain.n + 1
  end))
  local errs, nerr = {}, 0
  for i, h in ipairs(hostile) do
    h.on_error = function(e)
      if not errs[i] then nerr = nerr + 1 end
      errs[i] = errs[i] or e
    end
    assert(ch:consumer(function() end, h))
  end
  local stop = S.tmpname("stop")
  local child = S.lua(PRODUCER, cjson.encode{ ns = c.addr, channel = name, ctx = ctx_opts, stop = stop,
                                              grant = grant })
  assert(S.run_until(c, function() return plain.n >= 5 end, 20),
         "the plain flow did not start: " .. S.errors(child))
  local expected = min_errors or 0
  for i = 1, #hostile do if why[i] then expected = expected + 1 end end
  S.run_until(c, function() return nerr >= expected end, 20)
  assert.is_true(nerr >= expected, ("%d consumers told, %d expected (producer stuck?): %s")
                                   :format(nerr, expected, S.errors(child)))
  for i = 1, #hostile do
    if why[i] then
      assert(errs[i], ("hostile consumer %d was not told anything (producer stuck?): %s")
                      :format(i, S.errors(child)))
      assert.matches(why[i], errs[i])
    end
  end
  -- the producer goes on after the attack
  local after = plain.n
  assert(S.run_until(c, function() return plain.n >= after + 20 end, 20),
         "the producer stopped sending after the attack")
  S.write(stop, "")
  assert(S.wait(child, 30, c), "the producer did not finish: " .. S.errors(child))
  local line = S.output(child):match("({.*})")
  assert(line, "no result from the producer: " .. S.output(child) .. S.errors(child))
  local res = cjson.decode(line)
  assert(S.run_until(c, function() return plain.last == res.sent end, 10),
         ("the plain consumer got up to %s of %d"):format(tostring(plain.last), res.sent))
  assert.is_nil(plain.gap, "the plain flow lost events")
  assert.are.equal(plain.last - plain.first + 1, plain.n)
  return res, errs, child
end

local function escape(s) return (s:gsub("%p", "%%%0")) end

describe("modulator containment (issue 11)", function()
  local c
  before_each(function() c = lecho.context{ quiet = true } end)
  after_each(function()
    if c then c:close{ linger = 0 } end
    c = nil
    S.cleanup()
  end)

  it("unloads a modulator whose xpcall handler loops, and the producer goes on", function()
    run(c, { modulator_budget = 0.01 }, {
      { modulator = [[function enqueue(ev)
          xpcall(function() while true do end end, function() while true do end end) end]] },
    }, { "CPU budget" })
  end)

  it("unloads pcall loops and error objects whose metamethods loop", function()
    local obj = [[local bad = setmetatable({}, { __tostring = function() while true do end end,
                                                 __index = function() while true do end end }) ]]
    run(c, { modulator_budget = 0.01 }, {
      { modulator = [[function enqueue(ev)
          xpcall(function() while true do end end, function(e) while true do pcall(error, e) end end) end]] },
      { modulator = obj .. [[function enqueue(ev)
          xpcall(function() while true do end end, function(e) return tostring(bad) end) end]] },
      { modulator = obj .. [[function enqueue(ev)
          xpcall(function() while true do end end, function(e) return bad.message end) end]] },
      { modulator = [[function enqueue(ev)
          local function f() while true do pcall(f) end end
          f() end]] },
      -- (each over its CPU budget; four at once may first take the
      -- producer past its CPU share, the other reason that unloads them:
      -- make asan at load 6, "used 56% of the producer's CPU")
    }, { "CPU", "CPU", "CPU", "CPU" })
  end)

  it("stops calls that spend their time inside C functions", function()
    -- 2,400 s:upper() on 1 MiB ran 1.26 s before the count hook fired
    local big = [[local s = ("x"):rep(2^20) ]]
    run(c, { modulator_budget = 0.01 }, {
      { modulator = big .. [[function enqueue() for i = 1, 2400 do s:upper() end end]] },
      { modulator = big .. [[function enqueue() for i = 1, 2400 do s:lower(); s:reverse() end end]] },
      { modulator = big .. [[function enqueue() for i = 1, 2400 do local t = s .. s end end]] },
      { modulator = big .. [[function enqueue() for i = 1, 2400 do local t = ("y"):rep(2^20) end end]] },
      { modulator = big .. [[function enqueue() for i = 1, 2400 do local t = ("%s%s"):format(s, s) end end]] },
      { modulator = big .. [[local t = { s, s } function enqueue() for i = 1, 2400 do local u = table.concat(t) end end]] },
      -- one C call of about half a second: table.sort of 1.5 million numbers
      { modulator = [[local t, n = {}, 0
          function enqueue(ev)
            if n < 1500000 then for i = 1, 100000 do n = n + 1; t[n] = (n * 7919) % 1000003 end return end
            table.sort(t) end]], params = { budget_hog = true } },
    }, { "CPU budget", "CPU budget", "CPU budget", "CPU budget", "CPU budget", "CPU budget", "CPU budget" })
  end)

  it("stops array operations past the CPU budget and refuses arrays past the memory cap (issue 24)", function()
    -- operations of ~0.3 ms each, 10,000 of them against a 20 ms budget
    -- (the array is made at the install, which the budget bounds too);
    -- the budget times S.SLOW: the memory cases' own work (a 4 MiB array
    -- zeroed at the install, the refusal) is no CPU case, and under make
    -- asan at load 13-18 (asan7) one of them passed 20 ms ("exceeded its
    -- CPU budget of 20 ms in one call" where "memory cap" was expected);
    -- 3 s of operations pass 80 ms still
    local big = [[local a = array.new("<f8", { 2 ^ 18 }) ]]
    run(c, { modulator_budget = 0.02 * S.SLOW, modulators_cpu = 0 }, {
      { modulator = big .. [[function enqueue() for i = 1, 10000 do a:stats() end end]] },
      { modulator = big .. [[function enqueue() for i = 1, 10000 do a:reduce(2, "mean") end end]] },
      { modulator = big .. [[function enqueue() for i = 1, 10000 do a:box(0, nil, 3):copy() end end]] },
      { modulator = big .. [[function enqueue() for i = 1, 10000 do pcall(a.sum, a) end end]] },
      -- 64 MiB at once, past the 32 MiB cap
      { modulator = [[function enqueue() local b = array.new("<f8", { 2 ^ 23 }) end]] },
      -- a reduction whose result (8 bytes per element) is past the cap
      { modulator = [[local a = array.new("<u1", { 2 ^ 22 })
          function enqueue() local r = a:reduce(1, "sum") end]] },
      -- a shape no Lua object can hold
      { modulator = [[function enqueue() local b = array.new("<f8", { 2 ^ 20, 2 ^ 20 }) end]] },
    }, { "CPU budget", "CPU budget", "CPU budget", "CPU budget", "memory cap", "memory cap", "shape too large" })
  end)

  it("caps the memory of all modulators of a producer together", function()
    -- 20 consumers with ~28 MiB modulators took a producer from 3 to 569 MiB
    local hostile = {}
    for i = 1, 8 do
      hostile[i] = { modulator = [[local keep = ("x"):rep(12 * 2^20)]], params = { i = i } }
    end
    local cap = 48 * 2^20
    local res, errs = run(c, { modulators_memory = cap, modulator_budget = 0.2, modulators_cpu = 0 }, hostile, {}, nil, 5)
    local refused = 0
    for _, e in pairs(errs) do
      assert.matches("modulators of this producer exceed their memory cap of " .. cap .. " bytes", e, 1, true)
      refused = refused + 1
    end
    assert.is_true(refused >= 5, refused .. " refused, 3 fit at most")
    local grew = (res.hwm - res.rss0) / 2^20
    assert.is_true(grew < 48 + 32, ("the producer grew by %.0f MiB"):format(grew))
  end)

  it("refuses a period below the producer's minimum", function()
    run(c, { modulator_min_period = 0.01 }, {
      { modulator = [[function period() end]], period = 0.001 },
      { modulator = [[function period() end]], period = 0.01 },
    }, { escape("period 0.001 s is below this producer's minimum 0.01 s") })
  end)

  it("unloads the modulator that takes the producer's CPU past its share", function()
    -- a 1 ms period costing ~3 ms per call took the producer to 99% CPU
    -- (a busy wait of 9 ms every 10 ms: the share is CPU time, which a
    -- loaded host gives less of; the cap is low enough to trip anyway)
    local _, errs = run(c, { modulator_budget = 0.05, modulators_cpu = 0.1 }, {
      { modulator = [[function period() local t = clock() + 0.009 while clock() < t do end end]],
        period = 0.01, capabilities = { "clock" } },
      { modulator = [[function period() end]], period = 0.01, capabilities = { "clock" } },
    }, { "used %d+%% of the producer's CPU over [%d.]+ s.*%(cap 10%% over 1 s%)" }, { "clock" })
    assert.is_nil(errs[2])
  end)

  it("measures the share against what the producer thread ran", function()
    -- 3.5 ms per period at 0.01 s is 35% of a core: under a 50% cap of one
    -- core, but most of what a producer thread runs (on a busy host that
    -- gave the producer 45% of a core, legit 1000 -> 80-300 for 10 s).
    -- All of it divided by S.SLOW (make asan: 0.875 ms, a cap of 12.5%): a
    -- cap trips only past cap * 0.5 s of modulator CPU within 1 s
    -- (SHARE_FLOOR_S, core/moe/moe_group.c), 250 ms at 50%, more than a
    -- producer got at load 11 with ASan's dearer work beside (0 of 1 told).
    -- On a loaded host, by the fraction of a core a busy process gets
    -- (core_fraction; at load 15 and more, 0 of 1 told in 3 of 3 runs)
    local k = math.min(1 / S.SLOW, core_fraction())
    local _, errs = run(c, { modulator_budget = 0.05, modulators_cpu = 0.5 * k }, {
      { modulator = [[function period() local t = clock() + params.t while clock() < t do end end]],
        params = { t = 0.0035 * k }, period = 0.01, capabilities = { "clock" } },
      { modulator = [[function period() local t = clock() + params.t while clock() < t do end end]],
        params = { t = 0.0002 * k }, period = 0.01, capabilities = { "clock" } },
    }, { "used %d+%% of the producer's CPU over [%d.]+ s.*%(cap " .. (k == 1 and "50" or "[%d.]+") .. "%% over 1 s%)" },
    { "clock" })
    assert.is_nil(errs[2])
  end)

  it("caps the modulators one principal has installed in a producer", function()
    local hostile = {}
    for i = 1, 5 do
      hostile[i] = { modulator = [[function enqueue(ev) return ev end]], params = { i = i } }
    end
    local res, errs, child = run(c, { modulators_per_principal = 3, quiet = false }, hostile, {}, nil, 2)
    local refused = 0
    for _, e in pairs(errs) do
      assert.matches("too many modulators from " .. c.addr .. " (limit 3)", e, 1, true)
      refused = refused + 1
    end
    assert.are.equal(2, refused)
    -- a refused modulator gets no channel for its stream
    assert.are.equal(3, res.derived)
    -- the producer logged the first refusal, not each (one line per kind per window)
    local _, lines = S.errors(child):gsub("not running here: too many modulators", "")
    assert.are.equal(1, lines, S.errors(child))
  end)
end)

describe("no heap addresses visible to a modulator (issue 11)", function()
  it("in what any sandbox function returns or raises, the replacements included", function()
    local c = lecho.context{ quiet = true, modulator_budget = 2 }
    local ch = c:channel("addresses")
    local p = assert(ch:producer{ grant = { "log" } })
    local lines = {}
    local got
    c.log = function(l) lines[#lines + 1] = l end
    assert(ch:consumer(function(ev) got = ev end, { capabilities = { "log" }, modulator = [[
      function enqueue()
        local out = {}
        local t, f = {}, function() end
        local bad = setmetatable({}, { __tostring = function() return "bad" end })
        local args = { {}, { t }, { f }, { "x", t }, { t, t }, { "%s", t }, { "%s", f }, { 1, f },
                       { t, f }, { f, t }, { "x", 1, t }, { bad }, { nil, t } }
        local libs = { _G = _G, string = string, table = table, math = math, bit = bit }
        for lname, lib in pairs(libs) do
          for name, fn in pairs(lib) do
            if type(fn) == "function" and fn ~= enqueue then
              out[#out + 1] = lname .. "." .. name .. " " .. tostring(fn)
              for _, a in ipairs(args) do
                local r = { pcall(fn, unpack(a, 1, 3)) }
                for i = 1, #r do out[#out + 1] = lname .. "." .. name .. " " .. tostring(r[i]) end
              end
            end
          end
        end
        out[#out + 1] = select(2, xpcall(function() error(t) end, function(e) return tostring(e) end))
        out[#out + 1] = select(2, pcall(function() return t .. "" end))
        out[#out + 1] = select(2, pcall(function() return t < f end))
        out[#out + 1] = select(2, pcall(function() return #f end))
        log(t, f, bad, pcall, xpcall, table.sort)
        return out
      end ]] }))
    assert(p:submit_sync(0))
    assert.is_table(got)
    assert.is_true(#got > 500, "too few results: " .. #got)
    for _, line in ipairs(got) do
      assert.is_nil(line:match("0x%x%x%x%x"), line)
    end
    assert.is_true(#lines >= 1)
    for _, line in ipairs(lines) do
      assert.is_nil(line:match("0x%x%x%x%x"), line)
    end
    c:close()
  end)
end)

describe("a modulator granted log (issue 11)", function()
  it("logs at most 10 lines a second, then says how many it did not", function()
    local c = lecho.context{ quiet = true, modulator_budget = 1 }
    local lines = {}
    c.log = function(l) lines[#lines + 1] = l end
    local ch = c:channel("chatty")
    local p = assert(ch:producer{ grant = { "log" } })
    assert(ch:consumer(function() end, { capabilities = { "log" }, modulator = [[
      function enqueue(ev) for i = 1, 1000 do log("line", ev, i) end return ev end ]] }))
    assert(p:submit_sync(1))
    local function count(pat)
      local n = 0
      for _, l in ipairs(lines) do if l:find(pat) then n = n + 1 end end
      return n
    end
    assert.are.equal(10, count(": line 1 %d+$"))
    S.sleep(1.1)
    assert(p:submit_sync(2))
    assert.are.equal(1, count("990 more lines not logged %(limit 10 a second%)"))
    assert.are.equal(10, count(": line 2 %d+$"))
    c:close()
  end)
end)

describe("modulators per principal in keyed mode (issue 11)", function()
  after_each(function() S.cleanup() end)

  it("counts the modulators of two consumer contexts of one principal together", function()
    local dir = S.tmpdir() .. "/keys"
    assert(os.execute("mkdir -p " .. S.sh_quote(dir)))
    local ok, out = S.sh(("%s %s/scripts/lecho-keygen nameserver prod cons --dir %s")
                         :format(S.luajit, S.root, S.sh_quote(dir)))
    assert(ok, out)
    local trust = {}
    for i, n in ipairs{ "nameserver", "prod", "cons" } do trust[i] = ("%s/%s.pub"):format(dir, n) end
    local _, ns = S.nameserver(("--quiet --key %s --trust %s --trust %s --trust %s")
                               :format(dir .. "/nameserver.key", trust[1], trust[2], trust[3]))
    local ctxs, errs, nerr, plain = {}, {}, 0, 0
    for i = 1, 2 do
      ctxs[i] = lecho.context{ nameserver = ns, key = dir .. "/cons.key", trust = trust, quiet = true }
      local ch = ctxs[i]:channel("keyed-mods")
      if i == 1 then assert(ch:consumer(function() plain = plain + 1 end)) end
      for j = 1, 2 do
        local k = (i - 1) * 2 + j
        assert(ch:consumer(function() end, { modulator = "function enqueue(ev) return ev end", params = { k = k },
                                             on_error = function(e) nerr = nerr + 1; errs[k] = e end }))
      end
    end
    local function serve(pred, t)
      local deadline = ctxs[1]:now() + t
      while not pred() and ctxs[1]:now() < deadline do
        for _, c in ipairs(ctxs) do c:run_once(0.01) end
      end
      return pred()
    end
    local stop = S.tmpname("stop")
    local child = S.lua(PRODUCER, cjson.encode{ ns = ns, channel = "keyed-mods", stop = stop,
      ctx = { key = dir .. "/prod.key", trust = trust, modulators_per_principal = 2 } })
    assert(serve(function() return plain >= 5 and nerr >= 2 end, 30),
           ("%d events, %d refusals: %s"):format(plain, nerr, S.errors(child)))
    -- named as the producer's trust file names the key
    for _, e in pairs(errs) do
      assert.matches("too many modulators from cons (limit 2)", e, 1, true)
    end
    assert.are.equal(2, nerr)
    S.write(stop, "")
    assert(serve(function() return P.exit_code(child) ~= nil end, 30), "the producer did not finish")
    for _, c in ipairs(ctxs) do c:close{ linger = 0 } end
  end)
end)

describe("the CPU share check (issue 11)", function()
  it("does not blame a modest modulator for what replaced ones used", function()
    -- the churner's charges stay with its principal (its context) when its
    -- modulators fail or are replaced: it is the one stopped, and its
    -- installs are refused for a while; the modest one, another
    -- principal's, stays
    local c = lecho.context{ quiet = true, modulator_budget = 0.05, modulators_cpu = 0.3 }
    local ch = c:channel("churn")
    local p = assert(ch:producer{ grant = { "clock" } })
    local churned, refused = 0, 0
    -- about 10% of the thread: 1 ms of busy wait every 10 ms, from another
    -- process (another principal)
    local stop = S.tmpname("stop")
    local modest = S.lua([[
      local lecho = require "lecho"
      io.stdout:setvbuf("line")
      local c2 = lecho.context{ quiet = true, nameserver = arg[1] }
      local got, said = 0, false
      assert(c2:channel("churn"):consumer(function() got = got + 1 end, { capabilities = { "clock" }, period = 0.01,
        modulator = [=[function enqueue() end function period() local t = clock() + 0.001 while clock() < t do end emit(1) end]=],
        on_error = function(e) io.stdout:write("told: ", e, "\n") end }))
      local deadline = c2:now() + tonumber(arg[3])
      while not io.open(arg[2]) and c2:now() < deadline do
        c2:run_once(0.05)
        if got > 0 and not said then said = true io.stdout:write("flowing\n") end
      end
      c2:close{ linger = 0 }
    ]], c.addr, stop, tostring(30 * S.SLOW))
    local told = function() return S.output(modest):match("told: [^\n]*") end
    S.run_until(c, function() return S.output(modest):find("flowing", 1, true) ~= nil end, 20)
    assert(S.output(modest):find("flowing", 1, true), "the modest modulator did not run: " .. S.errors(modest))
    -- a consumer that burns 8 ms of CPU in its modulator, which then fails,
    -- and installs another, over and over.  CPU, not the clock: a busy wait
    -- of 8 ms by clock() got a fraction of that on a busy host, under 30% of
    -- the share's 0.5 s floor, and was rightly never stopped (at load 16, two
    -- busy loops: "the churner was never stopped", 440-549 replacements in
    -- 20 s, 3 of 3).  The loop's iterations per ms of CPU are measured here,
    -- interpreted as a modulator's state runs it (its JIT is off).
    local function spin(n) local x = 0 for i = 1, n do x = (x + i) % 7 end return x end
    if jit then jit.off(spin) end
    local per_ms = 0
    for _ = 1, 3 do
      local c0 = os.clock()
      spin(200000)
      per_ms = math.max(per_ms, 200000 / math.max((os.clock() - c0) * 1000, 0.001))
    end
    local CHURN = [[function enqueue() local x = 0 for i = 1, %d do x = (x + i) %% 7 end error("again %d " .. x) end]]
    local n8 = math.floor(8 * per_ms)
    -- The share's floor (0.5 s, core/moe/moe_group.c SHARE_FLOOR_S): at a 30%
    -- cap, modulators are stopped past 0.15 s of CPU in a 1 s window, more
    -- than all a producer runs when it gets less than ~30% of a core (at load
    -- 13-16, two busy loops: 0.1 s a second, 82-197 replacements in 20 s, 7
    -- of 7 "never stopped", 8 or 25 ms of CPU a call).  Then the churner
    -- cannot be stopped, by design; the modest one must still not be told.
    local can_stop = core_fraction() >= 0.3
    local function on_error(e) if e:find("refused for", 1, true) then refused = refused + 1 end end
    local churner = assert(ch:consumer(function() end, { capabilities = { "clock" }, on_error = on_error,
      modulator = CHURN:format(n8, 0) }))
    local t0 = c:now()
    -- at least 80 replacements, and on until the churner was stopped (on a
    -- loaded machine its share takes more of them to show; 20 s times
    -- S.SLOW, each replacement's compile and call this process's own work:
    -- under make asan at load 13-18, asan7, 20 s ended first, "the churner
    -- was never stopped"; the modest one runs as long, 30 s times S.SLOW)
    while c:now() - t0 < 20 * S.SLOW and (churned < 80 or (can_stop and refused == 0)) and not told() do
      churned = churned + 1
      churner:set_modulator(CHURN:format(n8, churned), nil, on_error)
      p:submit(churned)
      c:run_once(0.001)
    end
    S.write(stop, "")
    assert(S.wait(modest, 10, c))
    assert.is_nil(told(), ("after %d replacements: %s"):format(churned, tostring(told())))
    assert.is_true(churned >= 80, churned)
    if can_stop then
      assert.is_true(refused > 0, ("the churner was never stopped (%d replacements in %.1f s)")
                                  :format(churned, c:now() - t0))
    end
    c:close()
    S.cleanup()
  end)
end)
