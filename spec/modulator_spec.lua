-- Modulators (doc/modulators.md): consumer code that runs in the producer's
-- process, in sandboxed LuaJIT states owned by the C core.
local cjson = require "cjson"
local lecho = require "lecho"
local S = require "spec.support"

local function ctx() return lecho.context{ quiet = true } end

-- Runs ctx's loop until fn() or 5 s.
local function until_(c, fn, t) return S.run_until(c, fn, t or 5) end

describe("modulator sandbox", function()
  local c
  after_each(function() if c then c:close() end c = nil end)

  it("sees only the curated environment, and refuses bytecode", function()
    c = ctx()
    local ch = c:channel("env")
    local p = assert(ch:producer())
    local got
    assert(ch:consumer(function(ev) got = ev end, { modulator = [[
      local names = { "io", "os", "require", "load", "loadstring", "loadfile", "dofile", "ffi",
        "debug", "jit", "package", "coroutine", "getfenv", "setfenv", "collectgarbage",
        "module", "newproxy", "print", "clock", "log" }
      function enqueue(ev)
        local seen = {}
        for _, n in ipairs(names) do if _G[n] ~= nil then seen[#seen + 1] = n end end
        if string.dump ~= nil or getmetatable("").__index.dump ~= nil then seen[#seen + 1] = "dump" end
        return { seen = seen, has = { string.format ~= nil, table.concat ~= nil, math.floor ~= nil,
                 bit.band ~= nil, type(params) == "table", type(emit) == "function" } }
      end ]] }))
    assert(p:submit_sync({}))
    assert.are.same({}, got.seen)
    assert.are.same({ true, true, true, true, true, true }, got.has)
    -- Bytecode is refused at the call (spec/modulator_source_spec.lua), and
    -- by the producer's sandbox should a consumer skip that check.
    local ok, err = pcall(ch.consumer, ch, function() end, { modulator = string.dump(function() end) })
    assert.is_false(ok)
    assert.matches("not bytecode", err)
    local moe
    moe, err = c.c:moe(1000, c.c:channel("env@bytecode"), "bytecode", string.dump(function() end), {},
                       { budget = 0.005, memory = 1024 * 1024 })
    assert.is_nil(moe)
    assert.matches("not bytecode", err)
  end)

  it("grants capabilities per producer, refuses the others with a reason", function()
    c = ctx()
    local granted, refused = c:channel("g"), c:channel("r")
    local pg = assert(granted:producer{ grant = { "clock", "log" } })
    local pr = assert(refused:producer())
    local src = [[ function enqueue(ev) log("tick"); return clock() end ]]
    local t, err
    assert(granted:consumer(function(ev) t = ev end, { modulator = src, capabilities = { "clock", "log" } }))
    assert(refused:consumer(function() end, { modulator = src, capabilities = { "clock" },
                                              on_error = function(e) err = e end }))
    assert(pg:submit_sync(1))
    -- A sync submit says which consumer got nothing: its modulator was refused.
    local ok, errs = pr:submit_sync(1)
    assert.is_nil(ok)
    assert.are.equal(1, #errs)
    assert.matches("capability 'clock' not granted by the producer", errs[1].err)
    assert.is_number(t)
    assert(until_(c, function() return err end))
    assert.matches("capability 'clock' not granted", err)
    assert.has_error(function() granted:consumer(function() end, { modulator = "x=1", capabilities = { "net" } }) end)
  end)
end)

describe("modulator containment", function()
  local c
  after_each(function() if c then c:close() end c = nil end)

  -- Each hostile modulator is stopped and its consumer told why, while a
  -- plain consumer and a well-behaved modulator get every event.
  local hostile = {
    { "raises", "function enqueue(ev) error('boom') end", "boom" },
    { "loops forever", "function enqueue(ev) while true do end end", "CPU budget" },
    { "loops inside pcall", "function enqueue(ev) while true do pcall(function() while true do end end) end end", "CPU budget" },
    -- (touching 16 MiB of fresh memory takes 10-50 ms of CPU on some hosts:
    -- the budget, which counts time in C functions too, must not come first)
    { "allocates without bound", "function enqueue(ev) local t = {} for i = 1, 1e9 do t[i] = ('x'):rep(2^20) .. i end end", "memory",
      budget = 1 },
    { "one huge string", "function enqueue(ev) return ('x'):rep(2^30) end", "memory" },
    { "recurses", "local function f() return f() + 1 end function enqueue() return f() end", "stack overflow" },
    { "sends a function", "function enqueue(ev) return function() end end", "cannot send" },
    { "fails at load", "error('at load')", "at load" },
    { "backtracks a pattern for ever", "function enqueue(ev) return (('a'):rep(3000)):find('.-.-.-.-b') end",
      "CPU budget" },
    { "backtracks a pattern as a method", "function enqueue(ev) local s = ('a'):rep(3000) return s:match('(.-)(.-)(.-)b') end",
      "CPU budget" },
  }
  for _, h in ipairs(hostile) do
    it("stops a modulator that " .. h[1] .. " and nothing else", function()
      -- (ASan: its allocator makes the same work several times dearer)
      c = lecho.context{ quiet = true, modulator_budget = (h.budget or 0.01) * (S.asan and 10 or 1),
                         modulator_memory = 16 * 2^20 }
      local ch = c:channel("h")
      local p = assert(ch:producer())
      local plain, good, err = 0, 0, nil
      assert(ch:consumer(function() plain = plain + 1 end))
      assert(ch:consumer(function() good = good + 1 end,
                         { modulator = "function enqueue(ev) if ev % 2 == 0 then return ev end end" }))
      local bad = assert(ch:consumer(function() error("must not run") end,
                                     { modulator = h[2], on_error = function(e) err = e end }))
      for i = 1, 100 do assert(p:submit(i)) end
      -- true would say every consumer handled it: the failed one did not.
      local ok, errs = p:submit_sync(0)
      assert.is_nil(ok)
      assert.are.equal(1, #errs)
      assert.matches("modulator " .. bad.mod.key .. " not running at ", errs[1].err, 1, true)
      assert(until_(c, function() return err end))
      assert.matches(h[3], err)
      assert.are.equal(101, plain)
      assert.are.equal(51, good)
      assert.are.equal(1, bad:stats().modulator_errors)
      -- unloaded at the producer, not re-installed for the same modulator
      for name in pairs(c:stats().modulators or {}) do
        assert.is_nil(name:match(bad.mod.key), "the failed modulator is still loaded")
      end
    end)
  end
end)

describe("modulator functions", function()
  local c
  after_each(function() if c then c:close() end c = nil end)

  it("enqueue may change, drop, or multiply events; emit adds", function()
    c = ctx()
    local ch = c:channel("f")
    local p = assert(ch:producer())
    local got = {}
    assert(ch:consumer(function(ev) got[#got + 1] = ev end, { modulator = [[
      function enqueue(ev)
        if ev == 1 then return nil end
        if ev == 2 then return "a", "b" end
        if ev == 3 then emit("e"); return ev * 10 end
        return ev
      end ]] }))
    for i = 1, 4 do assert(p:submit_sync(i)) end
    assert.are.same({ "a", "b", "e", 30, 4 }, got)
  end)

  it("dequeue sees how many wait and can merge; period emits on its timer", function()
    c = ctx()
    local ch = c:channel("d")
    local p = assert(ch:producer())
    local got, ticks = {}, 0
    assert(ch:consumer(function(ev) got[#got + 1] = ev end, { modulator = [[
      local sum = 0
      function dequeue(ev, waiting)
        sum = sum + ev
        if waiting == 0 then local s = sum; sum = 0; return s end
      end ]] }))
    assert(ch:consumer(function(ev) if ev == "tick" then ticks = ticks + 1 end end,
                       { modulator = "function enqueue() end function period() emit('tick') end",
                         period = 0.05 }))
    for i = 1, 10 do assert(p:submit(i)) end     -- all held before the loop runs
    assert(until_(c, function() return #got >= 1 and ticks >= 3 end))
    assert.are.same({ 55 }, got)                 -- merged into one by dequeue
    assert(p:submit_sync(5))                     -- sync: dequeued at once
    assert.are.same({ 55, 5 }, got)
  end)
end)

describe("params and replacement", function()
  local c
  after_each(function() if c then c:close() end c = nil end)

  it("set_params applies from one point of the stream on, keeping the modulator's state", function()
    c = ctx()
    local ch = c:channel("p")
    local p = assert(ch:producer())
    local got = {}
    local con = assert(ch:consumer(function(ev, meta) got[#got + 1] = { ev, meta.params_version } end, {
      modulator = "local n = 0 function enqueue(ev) n = n + 1 return { ev * params.k, n } end",
      params = { k = 1 } }))
    for i = 1, 3 do assert(p:submit(i)) end
    assert(con:set_params{ k = 100 })
    for i = 4, 5 do assert(p:submit(i)) end
    assert(until_(c, function() return #got == 5 end))
    assert.are.same({ { { 1, 1 }, 1 }, { { 2, 2 }, 1 }, { { 3, 3 }, 1 },
                      { { 400, 4 }, 2 }, { { 500, 5 }, 2 } }, got)
    assert.are.equal(2, con:params_version())
  end)

  it("a params update lets the old stream go once its producer ended it (issue 13)", function()
    -- The producer's end of the old stream came before the manager's reply
    -- to the change, and was dropped: each update kept its old stream (its
    -- channel, a timer) for sync_timeout, and every later one walked them.
    c = ctx()
    local ch = c:channel("pe")
    local p = assert(ch:producer())
    local got = {}
    local con = assert(ch:consumer(function(ev, meta) got[#got + 1] = { ev, meta.params_version } end, {
      modulator = "function enqueue(ev) return { ev, params.k } end", params = { k = 0 } }))
    for i = 1, 50 do
      assert(p:submit(i))
      assert(con:set_params{ k = i })
    end
    assert(until_(c, function() return #got == 50 end))
    for i = 1, 50 do assert.are.same({ { i, i - 1 }, i }, got[i]) end
    local kept = 0
    for _ in pairs(ch.streams) do kept = kept + 1 end
    assert.are.equal(1, kept)
  end)

  it("set_params reaches a modulator that rebound its globals", function()
    c = ctx()
    local ch = c:channel("g")
    local p = assert(ch:producer())
    local got
    local con = assert(ch:consumer(function(ev) got = ev end, {
      modulator = "_G = nil; local P = function() return params.k end function enqueue(ev) return P() end",
      params = { k = 1 } }))
    assert(p:submit_sync(0))
    assert.are.equal(1, got)
    assert(con:set_params{ k = 7 })
    assert(p:submit_sync(0))
    assert.are.equal(7, got)
  end)

  it("set_modulator never mixes an old modulator with a new demodulator", function()
    c = ctx()
    local ch = c:channel("m")
    local p = assert(ch:producer())
    local mixed, n1, n2 = 0, 0, 0
    local con = assert(ch:consumer(function(ev) if ev.m ~= 1 then mixed = mixed + 1 end n1 = n1 + 1 end,
      { modulator = "function enqueue(ev) return { m = 1, v = ev } end" }))
    for i = 1, 50 do assert(p:submit(i)) end
    assert(con:set_modulator("function enqueue(ev) return { m = 2, v = ev } end", nil,
      function(ev) if ev.m ~= 2 then mixed = mixed + 1 end n2 = n2 + 1 end))
    for i = 51, 100 do assert(p:submit(i)) end
    assert(until_(c, function() return n1 + n2 == 100 end))
    assert.are.equal(0, mixed)
    assert.are.equal(50, n1); assert.are.equal(50, n2)
  end)
end)

-- Across processes: two viewer processes ask for the same modulator before
-- the producer exists; the producer that joins later installs it once and
-- sends its output once to each viewer; a params change reaches it in order.
local VIEWER = [[
local cjson = require "cjson"
local lecho = require "lecho"
local a = cjson.decode(arg[1])
local ctx = lecho.context{ nameserver = a.ns, quiet = true }
local ch = ctx:channel("field")
local got, versions, order_ok, last, dones = 0, {}, true, {}, 0
local con
con = assert(ch:consumer(function(ev, meta)
  if ev.done then
    dones = dones + 1
    if dones < (a.producers or 1) then return end
    io.stdout:write(cjson.encode{ got = got, versions = versions, order_ok = order_ok,
                                  stats = con:stats(), final = last }, "\n")
    io.stdout:flush()
    ctx:stop()
    return
  end
  got = got + 1
  versions[meta.params_version] = (versions[meta.params_version] or 0) + 1
  if ev.tag ~= meta.params_version then order_ok = false end
  local prev = last[meta.producer]
  if prev and (meta.seq <= prev.seq or meta.params_version < prev.v) then order_ok = false end
  last[meta.producer] = { seq = meta.seq, v = meta.params_version, tag = ev.tag,
                         first_v = prev and prev.first_v or meta.params_version }
end, { modulator = "function enqueue(ev) if ev.done or ev.i % 2 == 0 then ev.tag = params.tag return ev end end",
       params = { tag = 1 } }))
io.stdout:write("ready\n"); io.stdout:flush()
if a.switch then
  ctx:every(0.05, function()
    if not a.switched and got >= 20 then
      a.switched = true
      assert(con:set_params{ tag = 2 })
      io.stderr:write("switched\n")
    end
  end)
end
ctx:after(30, function() ctx:stop() end)
ctx:run()
]]

local PRODUCER = [[
local cjson = require "cjson"
local lecho = require "lecho"
local a = cjson.decode(arg[1])
local ctx = lecho.context{ nameserver = a.ns, quiet = true }
local p = assert(ctx:channel("field"):producer())
local i = 0
local t = ctx:every(0.002, function(t)
  for _ = 1, 5 do i = i + 1; assert(p:submit{ i = i }) end
  if i >= a.n then t:stop(); ctx:stop() end
end)
ctx:run()
ctx:after(0.5, function() ctx:stop() end); ctx:run()   -- let a set_params land
local stats = ctx:stats()   -- before the viewers see the end and leave
assert(p:submit_sync({ done = true, i = 0 }, { timeout = 10 }))
io.stdout:write(cjson.encode(stats), "\n")
ctx:close()
]]

describe("modulators across processes", function()
  after_each(function() S.cleanup() end)

  it("run once in a producer that joined later, output sent once per viewer, params in order", function()
    local _, ns = S.nameserver("--quiet")
    local v1 = S.lua(VIEWER, cjson.encode{ ns = ns, switch = true })
    local v2 = S.lua(VIEWER, cjson.encode{ ns = ns })
    assert(S.wait_file(v1.out, "ready", 20)); assert(S.wait_file(v2.out, "ready", 20))
    local prod = S.lua(PRODUCER, cjson.encode{ ns = ns, n = 400 })
    for _, k in ipairs{ prod, v1, v2 } do
      local done, rc = S.wait(k, 60)
      assert(done, "child did not finish: " .. S.errors(k))
      assert.are.equal(0, rc, S.errors(k))
    end
    local st = cjson.decode(S.output(prod))
    local r1 = cjson.decode(S.output(v1):match("{.*}"))
    local r2 = cjson.decode(S.output(v2):match("{.*}"))
    assert.is_true(r1.order_ok); assert.is_true(r2.order_ok)
    assert.are.equal(200, r2.got)                 -- the even ones, all of them
    assert.are.same({ 200 }, r2.versions)       -- cjson: { [1] = 200 } is an array
    assert.is_true(r1.versions[1] >= 20 and r1.versions[2] >= 1, cjson.encode(r1.versions))
    assert.are.equal(200, r1.versions[1] + r1.versions[2])  -- none lost or doubled
    -- In the producer: while both viewers used the same modulator it ran
    -- once; after v1's change there are two, each sending to one viewer.
    local mods, total_in = 0, 0
    for _, m in pairs(st.modulators) do
      mods = mods + 1
      assert.are.equal(1, #m.consumers)
      total_in = total_in + m.events_in
    end
    assert.are.equal(2, mods)
    -- v2's instance saw every event once.
    local v2_in = 0
    for _, m in pairs(st.modulators) do v2_in = math.max(v2_in, m.events_in) end
    assert.are.equal(400, v2_in)
    assert.is_true(r1.stats.bytes > 0 and r2.stats.bytes > 0)
  end)
end)

describe("modulators across processes, two producers", function()
  after_each(function() S.cleanup() end)

  it("a params change reaches every producer in order; one joining later gets the current params", function()
    local _, ns = S.nameserver("--quiet")
    local v1 = S.lua(VIEWER, cjson.encode{ ns = ns, switch = true, producers = 2 })
    assert(S.wait_file(v1.out, "ready", 20))
    local p1 = S.lua(PRODUCER, cjson.encode{ ns = ns, n = 400 })
    -- The second producer joins after the change: it installs the current params.
    assert(S.wait_file(v1.err, "switched", 30), "no switch: " .. S.errors(v1))
    local p2 = S.lua(PRODUCER, cjson.encode{ ns = ns, n = 400 })
    for _, k in ipairs{ p1, p2, v1 } do
      local done, rc = S.wait(k, 60)
      assert(done, "child did not finish: " .. S.errors(k))
      assert.are.equal(0, rc, S.errors(k))
    end
    local r1 = cjson.decode(S.output(v1):match("{.*}"))
    assert.is_true(r1.order_ok)                 -- per producer: seq up, version never down
    assert.are.equal(400, r1.versions[1] + r1.versions[2])  -- 2 x 200 even events, none lost
    local n, started_new = 0, 0
    for _, l in pairs(r1.final) do            -- both replicas ended on the new params
      n = n + 1
      assert.are.equal(2, l.v)
      assert.are.equal(2, l.tag)
      if l.first_v == 2 then started_new = started_new + 1 end
    end
    assert.are.equal(2, n)
    assert.are.equal(1, started_new)           -- the late one never ran the old params
  end)
end)

-- A context that joins a running, shared modulator: receivers(n) lets the
-- modulator start over, so the newcomer's first event is a key frame.
local KEYED_VIEWER = [[
local cjson = require "cjson"
local lecho = require "lecho"
local a = cjson.decode(arg[1])
local ctx = lecho.context{ nameserver = a.ns, quiet = true }
local got = {}
assert(ctx:channel("keyed"):consumer(function(ev)
  if ev.done then
    io.stdout:write(cjson.encode(got), "\n") io.stdout:flush()
    ctx:stop()
    return
  end
  got[#got + 1] = ev
end, { modulator = a.src }))
io.stdout:write("ready\n") io.stdout:flush()
ctx:after(30, function() ctx:stop() end)
ctx:run()
]]

describe("modulators and receivers that join later", function()
  after_each(function() S.cleanup() end)

  it("call receivers(n) when a context joins a shared modulator", function()
    local src = [[
      local last, calls = nil, 0
      function receivers(n) last = nil; calls = calls + 1; emit({ note = "receivers", n = n }) end
      function enqueue(ev)
        if ev.done then return ev end
        local key = last == nil
        last = ev.i
        return { i = ev.i, key = key }
      end ]]
    local ctx = lecho.context{ quiet = true }
    local p = assert(ctx:channel("keyed"):producer())
    local a = S.lua(KEYED_VIEWER, cjson.encode{ ns = ctx.addr, src = src })
    assert(S.run_until(ctx, function() return S.output(a):match("ready") end, 20))
    for i = 1, 5 do assert(p:submit_sync({ i = i })) end
    local b = S.lua(KEYED_VIEWER, cjson.encode{ ns = ctx.addr, src = src })
    assert(S.run_until(ctx, function() return S.output(b):match("ready") end, 20))
    for i = 6, 8 do assert(p:submit_sync({ i = i })) end
    local n = 0                                -- one shared instance
    for _ in pairs(ctx:stats().modulators) do n = n + 1 end
    assert.are.equal(1, n)
    assert(p:submit_sync({ done = true }))
    assert(S.wait(a, 20, ctx)); assert(S.wait(b, 20, ctx))
    local ra = cjson.decode(S.output(a):match("%[.*%]"))
    local rb = cjson.decode(S.output(b):match("%[.*%]"))
    -- one shared instance: B's first event is the notice, then a key frame
    assert.are.same({ note = "receivers", n = 2 }, rb[1])
    assert.are.same({ i = 6, key = true }, rb[2])
    assert.are.equal(3, #rb - 1)
    -- A: a key frame at 1, the notice, then a key frame again at 6
    assert.are.same({ i = 1, key = true }, ra[1])
    assert.are.same({ i = 5, key = false }, ra[5])
    assert.are.same({ note = "receivers", n = 2 }, ra[6])
    assert.are.same({ i = 6, key = true }, ra[7])
    ctx:close()
  end)
end)

-- A backlogged consumer switches modulators: every old event still queued
-- reaches the old demodulator (the producer ends the old stream in band),
-- however long the backlog takes to drain: here ~3 s of work against a
-- sync_timeout of 1 s (issue 13: the old stream was cut sync_timeout after
-- the switch, and what was still queued of it reached no demodulator; with
-- the default 10 s that took a busy host).
local SLOW_SWITCHER = [[
local cjson = require "cjson"
local lecho = require "lecho"
local ffi = require "ffi"
local a = cjson.decode(arg[1])
local ctx = lecho.context{ nameserver = a.ns, quiet = true, sync_timeout = a.st or 1 }
local n1, n2, mixed, switching, switched, slept = 0, 0, 0, false, false, false
local function busy(s) local t = os.clock() + s while os.clock() < t do end end
ffi.cdef "typedef struct { long s, us; } sw_tv; int gettimeofday(sw_tv *, void *);"
local tv = ffi.new("sw_tv")
local function wall() ffi.C.gettimeofday(tv, nil) return tonumber(tv.s) + tonumber(tv.us) * 1e-6 end
local con
local function demod2(ev)
  if ev.done then
    io.stdout:write(cjson.encode{ n1 = n1, n2 = n2, mixed = mixed }, "\n") io.stdout:flush()
    ctx:stop()
    return
  end
  if ev.m ~= 2 then mixed = mixed + 1 end
  n2 = n2 + 1
end
local function demod1(ev)
  if ev.done then return end
  if ev.m ~= 1 then mixed = mixed + 1 end
  n1 = n1 + 1
  busy(a.work or 0.015)            -- a slow viewer: the backlog takes seconds
  -- a.wait: once, after the switch, the old demodulator waits that long
  -- (what comes next from the producer is held back meanwhile)
  if a.wait and switched and not slept then slept = true ctx:sleep(a.wait) end
  if not switching then
    switching = true
    ctx:after(0, function()
      assert(con:set_modulator("function enqueue(ev) ev.m = 2 return ev end", nil, demod2))
      switched = true
      io.stderr:write("switched\n")
      -- a.burn: then the viewer computes for that long (wall clock) without
      -- a turn of its loop (the backlog waits unread in the kernel meanwhile)
      if a.burn then
        local t = wall() + a.burn
        while wall() < t do end
      end
    end)
  end
end
con = assert(ctx:channel("slow"):consumer(demod1,
  { modulator = "function enqueue(ev) ev.m = 1 return ev end" }))
io.stdout:write("ready\n") io.stdout:flush()
ctx:after(90, function() ctx:stop() end)
ctx:run()
]]

describe("replacing the modulator of a backlogged consumer", function()
  after_each(function() S.cleanup() end)

  local function backlog(wait, o)
    o = o or {}
    -- the manager is another process: its answers do not queue behind the events
    local _, ns = S.nameserver("--quiet")
    local ctx = lecho.context{ nameserver = ns, quiet = true }
    local p = assert(ctx:channel("slow"):producer())
    -- the viewer's CPU per event scaled by the fraction of a core it gets
    -- (S.core_fraction), so its backlog takes ~3 s of wall at any load: 3 s
    -- of CPU at 0.04-0.05 of a core (load 23-25, 2 busy loops, make asan)
    -- took past the 60 s bounds (3 of 4 cases: "switched" never seen, "no
    -- answer within 60 s")
    local work = 0.015 * S.core_fraction()
    local v = S.lua(SLOW_SWITCHER, cjson.encode{ ns = ns, wait = wait, burn = o.burn, st = o.st, work = work })
    assert(S.run_until(ctx, function() return S.output(v):match("ready") end, 20))
    -- ~3 s of work for the viewer; 8 KB each, so that one read does not
    -- take them all in before the viewer sees the manager's answer
    local pad = ("x"):rep(8000)
    for i = 1, 200 do assert(p:submit({ i = i, pad = pad })) end
    p:flush()
    assert(S.run_until(ctx, function() return S.errors(v):match("switched") end, 60))
    for i = 201, 250 do assert(p:submit({ i = i })) end
    -- (generous: ~3 s of CPU for the viewer, on a host that may be busy)
    assert(p:submit_sync({ done = true }, { timeout = 60 }))
    assert(S.wait(v, 60, ctx))
    local r = cjson.decode(S.output(v):match("{.*}"))
    assert.are.equal(0, r.mixed)
    assert.are.equal(200, r.n1)
    assert.are.equal(50, r.n2)
    ctx:close()
  end

  it("delivers every old event to the old demodulator, however long the backlog", function()
    backlog()
  end)

  it("delivers them too when the old demodulator waits longer than sync_timeout", function()
    backlog(2.5)
  end)

  -- Issue 26/27 (n1 = 33 of 200 under load and ASan): the old stream was
  -- given up as quiet while its backlog waited unread.  The loop's clock
  -- stands still through a turn: the switch resumes before the next poll,
  -- on the clock of a turn whose handlers ran longer than sync_timeout, and
  -- the watch's timer, already due, ran at the next poll before the read.
  it("delivers them too when one turn of the viewer's loop takes longer than sync_timeout", function()
    backlog(nil, { st = 0.2 })     -- a read's 15 ms handlers take longer than 0.2 s
  end)

  -- A viewer that stalls (a long computation, a descheduled process) with
  -- its backlog waiting in the kernel: nothing of the stream arrived for
  -- longer than sync_timeout, yet it is not quiet.
  it("delivers them too when the viewer stalls longer than sync_timeout after the switch", function()
    backlog(nil, { burn = 1.5 })
  end)
end)

-- A producer that stays connected but never ends the old stream (here one
-- whose in-band end is switched off): the old demodulator is let go once its
-- stream brought no event for sync_timeout, and the log says so.
local SILENT_PRODUCER = [[
local cjson = require "cjson"
local lecho = require "lecho"
require "lecho.modulator"
local Channel = require "lecho.channel"
Channel._end_streams = function(self) self.sub_dests = {} end   -- never ends a stream
local a = cjson.decode(arg[1])
local ctx = lecho.context{ nameserver = a.ns, quiet = true }
local p = assert(ctx:channel("stuck"):producer())
local i = 0
ctx:every(0.05, function() i = i + 1 p:submit({ i = i }) end)
io.stdout:write("ready\n") io.stdout:flush()
ctx:after(30, function() ctx:stop() end)
ctx:run()
]]

describe("a producer that never ends the old stream", function()
  after_each(function() S.cleanup() end)

  it("costs the old demodulator once that stream is quiet for sync_timeout, logged", function()
    local _, ns = S.nameserver("--quiet")
    local logs = {}
    local c = lecho.context{ nameserver = ns, sync_timeout = 0.5,
                             log = function(m) logs[#logs + 1] = m end }
    local pr = S.lua(SILENT_PRODUCER, cjson.encode{ ns = ns })
    assert(S.run_until(c, function() return S.output(pr):match("ready") end, 20))
    local n1, n2 = 0, 0
    local ch = c:channel("stuck")
    local con = assert(ch:consumer(function() n1 = n1 + 1 end,
      { modulator = "function enqueue(ev) ev.m = 1 return ev end" }))
    assert(S.run_until(c, function() return n1 > 0 end, 20))
    local old = con.mod.key
    assert(con:set_modulator("function enqueue(ev) ev.m = 2 return ev end", nil,
                             function() n2 = n2 + 1 end))
    assert.is_truthy(ch.streams[old])          -- waiting for the end that never comes
    local function logged()
      for _, m in ipairs(logs) do
        if m:match("no end of the stream of modulator") then return true end
      end
    end
    assert(S.run_until(c, function() return logged() and n2 > 0 end, 20))
    assert.is_nil(ch.streams[old])
    c:close()
  end)
end)

describe("a switch that fails", function()
  after_each(function() S.cleanup() end)

  it("keeps the old modulator and lets the new stream go once it is quiet for sync_timeout", function()
    local nsp, ns = S.nameserver("--quiet")
    local c = lecho.context{ nameserver = ns, quiet = true, timeout = 1, sync_timeout = 0.3 }
    local ch = c:channel("unswitched")
    local con = assert(ch:consumer(function() end,
      { modulator = "function enqueue(ev) ev.m = 1 return ev end" }))
    local old = con.mod.key
    S.kill(nsp, "STOP")                        -- the manager does not answer
    local ok = con:set_modulator("function enqueue(ev) ev.m = 2 return ev end", nil, function() end)
    assert.is_nil(ok)
    assert.are.equal(old, con.mod.key)
    local new
    for k in pairs(ch.streams) do if k ~= old then new = k end end
    assert.is_truthy(new)                      -- kept: a producer may have switched
    assert(S.run_until(c, function() return ch.streams[new] == nil end, 10))
    assert.is_truthy(ch.streams[old])
    S.kill(nsp, "CONT")
    c:close()
  end)
end)

-- Issue 27 (modulator install 0.76x of 909b227 in make bench QUICK=1): an
-- install runs the control plane's Lua on both sides (lecho.control,
-- lecho.modulator), per member list and control message.  Compiled, LuaJIT
-- recorded traces of it again and again and aborted them (a closure made in
-- a loop, a loop left in a root trace): in the bench's 20 installs per chunk
-- those attempts were half the CPU of an install.  Both modules now run
-- interpreted, as lecho.ns.* do: no trace starts in them, however many
-- installs.
describe("modulator installs", function()
  it("record no JIT trace in the control plane's modules (lecho.control, lecho.modulator)", function()
    if not jit then return end
    local c = lecho.context{ quiet = true }
    local ch = c:channel("jitless")
    local p = assert(ch:producer())
    local keep = assert(ch:consumer(function() end, { modulator = "function enqueue(ev) return ev end",
                                                     params = { v = 0 } }))
    local funcinfo = require("jit.util").funcinfo
    local began, n = {}, 0
    local function on_trace(what, _, func)   -- (kept minimal: it runs inside the recorder)
      if what == "start" and n < 10000 then n = n + 1; began[n] = func end
    end
    jit.attach(on_trace, "trace")
    local ok, err = pcall(function()
      for i = 1, 300 do
        local con = assert(ch:consumer(function() end, { modulator = "function enqueue(ev) return ev end",
                                                         params = { i = i } }))
        con:close()
      end
      assert(p:submit_sync(1))
    end)
    jit.attach(on_trace)
    keep:close()
    c:close()
    assert(ok, err)
    local starts = {}
    for i = 1, n do
      local src = began[i] and funcinfo(began[i]).source or "?"
      local file = src:match("lecho/(control%.lua)$") or src:match("lecho/(modulator%.lua)$")
      if file then starts[file] = (starts[file] or 0) + 1 end
    end
    assert.are.same({}, starts)
  end)
end)
