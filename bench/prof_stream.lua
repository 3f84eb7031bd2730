-- bench/prof_stream.lua: one async stream, CPU per event per process, for
-- profiles (bench/README.md "Issue 27: what stands in the way").  Not a row
-- of make bench: a probe to run by hand, alone or under valgrind/strace.
--
--   luajit bench/prof_stream.lua prod SIZE N NSUBS [ADDRFILE]
--   luajit bench/prof_stream.lua cons ADDR [ID]
--
-- prod: this process is the name server and the producer of channel
-- "prof.s"; it writes its address to ADDRFILE (default /tmp/prof_stream.addr),
-- waits for NSUBS consumers, sends 10,000 warm events of a SIZE-byte string
-- (SIZE 0: nil, the null event), a sync "reset", then N events, a flush and
-- a sync "end"; each consumer reports its count and its CPU between the
-- reset and the end.  Prints one JSON line: the producer's CPU per event
-- (user, system, on-CPU from /proc/self/schedstat) over the N events and
-- the end's ack, each consumer's, and the time per event at the slowest.
-- cons: one consumer of "prof.s" (a counting handler, as bench/worker.lua).
-- inst install|rt|call N: modulator installs (and closes) against a producer
-- peer (iprod ADDR), or null sync round trips to it; this process's and
-- the peer's CPU per operation.
-- SIZE -1: the integer 7 (the modulator row's events).  LECHO_PROF_MOD in a
-- consumer's environment: its modulator's source (the trivial filter:
-- "function enqueue(ev) return ev end").  Under valgrind, run N twice: the
-- difference over the difference of N is per event, start-up excluded
-- (LECHO_PROF_BUDGET=1 for the producer: a modulator's calls run ~50x
-- slower there than the default 5 ms budget allows).
local dir = (arg and arg[0] or ""):match("^(.*)/[^/]*$") or "."
package.path = dir .. "/?.lua;" .. dir .. "/../?.lua;" .. dir .. "/../lua/?.lua;"
  .. dir .. "/../lua/?/init.lua;" .. package.path
package.cpath = dir .. "/../lua/?.so;" .. package.cpath

if arg[1] == "--help" or arg[1] == "-h" then
  io.write("usage: luajit bench/prof_stream.lua prod SIZE N NSUBS [ADDRFILE] | cons ADDR [ID]\n"
    .. "       luajit bench/prof_stream.lua inst install|rt|call N [ADDRFILE] | iprod ADDR\n"
    .. "       luajit bench/prof_stream.lua chans K N ROUNDS [ADDRFILE]  (cons with LECHO_PROF_CHANS=K)\n"
    .. "A probe for profiles (bench/README.md \"Issue 27: what stands in the way\"), not a row of make bench.\n")
  os.exit(0)
end
local lecho = require "lecho"
local common = require "common"
local cjson = require "cjson"
local clock = common.clock
local ffi = require "ffi"
pcall(ffi.cdef, [[
struct lecho_prof_sched_param { int sched_priority; };
int sched_setscheduler(int pid, int policy, const struct lecho_prof_sched_param *param);
]])
-- SCHED_FIFO at priority p for this process, or back to SCHED_OTHER (nil)
common = setmetatable({ fifo = function(p)
  local sp = ffi.new("struct lecho_prof_sched_param", { p or 0 })
  ffi.C.sched_setscheduler(0, p and 1 or 0, sp)
end }, { __index = common })

-- CPU of this process so far: user and system (clock ticks of
-- /proc/self/stat) and on-CPU ns (/proc/self/schedstat).
local TICK = 100
local function cpu()
  local st = common.read("/proc/self/stat")
  local rest = st:match("%) (.*)$")
  local f = {}
  for w in rest:gmatch("%S+") do f[#f + 1] = w end
  -- fields after the name: state(1) ... utime is field 14 overall = rest's 12th
  local ut, stt = tonumber(f[12]), tonumber(f[13])
  local sched = tonumber(common.read("/proc/self/schedstat"):match("^(%d+)"))
  return { user = ut / TICK, sys = stt / TICK, oncpu = sched / 1e9 }
end
local function delta(a, b, n)
  return { user_us = (b.user - a.user) * 1e6 / n, sys_us = (b.sys - a.sys) * 1e6 / n,
           oncpu_us = (b.oncpu - a.oncpu) * 1e6 / n }
end

local mode = arg[1]
if mode == "prod" then
  local size, n, nsubs = tonumber(arg[2]), tonumber(arg[3]), tonumber(arg[4])
  local addrfile = arg[5] or "/tmp/prof_stream.addr"
  -- under valgrind a modulator's first call overruns the default 5 ms budget
  local ctx = lecho.context{ quiet = true, timeout = 20,
                            modulator_budget = tonumber(os.getenv("LECHO_PROF_BUDGET")) }
  local ready, reports = 0, {}
  local _rc = assert(ctx:channel("prof.report"):consumer(function(ev)
    if type(ev) ~= "table" then return end
    if ev.ready then ready = ready + 1 else reports[#reports + 1] = ev end
  end))
  local p = assert(ctx:channel("prof.s"):producer())
  common.write(addrfile, ctx.addr)
  assert(common.run_until(ctx, function() return ready >= nsubs end, 120), "consumers not ready")
  -- SIZE -1: small integers (the modulator row's events), 0: nil, else a string
  local v = size > 0 and ("x"):rep(size) or nil
  if size < 0 then v = 7 end
  for _ = 1, 10000 do assert(p:submit(v)) end
  assert(p:submit_sync({ ctl = "reset" }, { timeout = 60 }))
  local c0, t0 = cpu(), clock()
  for _ = 1, n do assert(p:submit(v)) end
  ctx:flush()
  assert(p:submit_sync({ ctl = "end" }, { timeout = 600 }))
  local c1 = cpu()
  assert(common.run_until(ctx, function() return #reports >= nsubs end, 600), "reports missing")
  local t_last = 0
  for _, r in ipairs(reports) do t_last = math.max(t_last, r.t_last) end
  io.write(cjson.encode{ size = size, n = n, subs = nsubs, producer = delta(c0, c1, n),
    us_per_ev_slowest = (t_last - t0) * 1e6 / n, consumers = reports }, "\n")
  ctx:close()
elseif mode == "cons" then
  local ctx = lecho.context{ nameserver = arg[2], quiet = true, timeout = 20 }
  local rep = assert(ctx:channel("prof.report"):producer())
  local id = arg[3] or "c"
  local count, c0 = 0, nil
  local done = false
  local mod = os.getenv("LECHO_PROF_MOD")
  local function handler(ev)
    if type(ev) == "table" then
      if ev.ctl == "reset" then
        if ev.fifo then common.fifo(ev.fifo) end
        count, c0 = 0, cpu()
      elseif ev.ctl == "end" then
        local c1 = cpu()
        local t = clock()
        common.fifo(nil)
        assert(rep:submit{ id = id, count = count, t_last = t, cpu = delta(c0, c1, math.max(count, 1)) })
        rep:flush()
        done = not os.getenv("LECHO_PROF_CHANS")  -- chans: several runs, then "quit"
      elseif ev.ctl == "quit" then
        done = true
      end
      return
    end
    count = count + 1
  end
  local keep = { assert(ctx:channel("prof.s"):consumer(handler, mod and { modulator = mod } or nil)) }
  for i = 1, tonumber(os.getenv("LECHO_PROF_CHANS") or 0) do
    keep[#keep + 1] = assert(ctx:channel("prof.k" .. i):consumer(handler))
    if i % 256 == 0 then ctx:run_once(0) end
  end
  assert(rep:submit_sync({ ready = true, id = id }, { timeout = 20 }))
  common.run_until(ctx, function() return done end, 900)
  ctx:run_once(0.05)
  ctx:close()
elseif mode == "chans" then
  -- K N ROUNDS: this process the name server and producer of 1 channel and
  -- of K channels (prof.k1 .. prof.kK), a consumer process (cons, with
  -- LECHO_PROF_CHANS=K) of all of them; ROUNDS times, alternating in an
  -- order rotated each round, N null events on the one channel and N
  -- round-robin over the K: events per second at the consumer and each
  -- process's CPU per event.  LECHO_PROF_FIFO=P: both processes run the
  -- measured part (not the set-up) under SCHED_FIFO priority P.
  local k, n, rounds = tonumber(arg[2]), tonumber(arg[3]), tonumber(arg[4])
  local addrfile = arg[5] or "/tmp/prof_stream.addr"
  local ctx = lecho.context{ quiet = true, timeout = 60, channel_quota = 2 * k + 64 }
  local ready, reports = 0, {}
  local _rc = assert(ctx:channel("prof.report"):consumer(function(ev)
    if type(ev) ~= "table" then return end
    if ev.ready then ready = ready + 1 else reports[#reports + 1] = ev end
  end))
  local one = { assert(ctx:channel("prof.s"):producer()) }
  common.write(addrfile, ctx.addr)
  assert(common.run_until(ctx, function() return ready >= 1 end, 900), "consumer not ready")
  local t0 = clock()
  local many = {}
  for i = 1, k do
    many[i] = assert(ctx:channel("prof.k" .. i):producer())
    if i % 256 == 0 then ctx:run_once(0) end
  end
  io.stderr:write(("chans: %d producers in %.1f s\n"):format(k, clock() - t0))
  local fifo = tonumber(os.getenv("LECHO_PROF_FIFO"))
  local function run(ps)
    local np = #ps
    for i = 1, math.max(np, 20000) do assert(ps[(i - 1) % np + 1]:submit(nil)) end
    assert(one[1]:submit_sync({ ctl = "reset", fifo = fifo }, { timeout = 120 }))
    if fifo then common.fifo(fifo) end
    local c0, t1 = cpu(), clock()
    for i = 1, n do assert(ps[(i - 1) % np + 1]:submit(nil)) end
    ctx:flush()
    local want = #reports + 1
    assert(one[1]:submit_sync({ ctl = "end" }, { timeout = 600 }))
    local c1 = cpu()
    if fifo then common.fifo(nil) end
    assert(common.run_until(ctx, function() return #reports >= want end, 600), "report missing")
    local r = reports[want]
    return { ev_s = n / (r.t_last - t1), producer = delta(c0, c1, n), consumer = r.cpu, count = r.count }
  end
  local out = { k = k, n = n, runs = {} }
  for r = 1, rounds do
    local order = r % 2 == 1 and { "1", "k" } or { "k", "1" }
    if os.getenv("LECHO_PROF_ONLY") == "k" then order = { "k" } end  -- for a profiler attached
    local res = {}
    for _, which in ipairs(order) do res[which] = run(which == "1" and one or many) end
    res.ratio = res["1"] and res.k.ev_s / res["1"].ev_s
    res.load = common.read("/proc/loadavg"):match("^(%S+)")
    out.runs[r] = res
    io.stderr:write(("round %d: 1 channel %.0f ev/s, %d channels %.0f ev/s, %.2fx (load %s)\n"):format(
      r, res["1"] and res["1"].ev_s or 0, k, res.k.ev_s, res.ratio or 0, res.load))
  end
  io.write(cjson.encode(out), "\n")
  one[1]:submit({ ctl = "quit" })
  ctx:flush()
  ctx:close()
elseif mode == "inst" then
  -- KIND N: this process the name server, the channel's manager and the
  -- consumer; the peer (iprod) a producer of "prof.i" and a consumer of
  -- "prof.rt".  KIND install: N times a consumer with the trivial filter
  -- (distinct params: a new state each time) made and closed, as
  -- bench/modulator_bench.lua; KIND rt: N null sync round trips to the peer;
  -- KIND call: N ctx:call("prof.null") round trips (the peer serves it).
  local kind, n = arg[2], tonumber(arg[3])
  local addrfile = arg[4] or "/tmp/prof_stream.addr"
  local ctx = lecho.context{ quiet = true, timeout = 20 }
  local peer
  local _rc = assert(ctx:channel("prof.report"):consumer(function(ev)
    if type(ev) == "table" and ev.ready then peer = ev.pid end
  end))
  local ch = ctx:channel("prof.i")
  local rt = assert(ctx:channel("prof.rt"):producer())
  common.write(addrfile, ctx.addr)
  assert(common.run_until(ctx, function() return peer end, 120), "peer not ready")
  local function peer_cpu() return tonumber(common.read("/proc/" .. peer .. "/schedstat"):match("^(%d+)")) / 1e9 end
  local FILTER = "function enqueue(ev) return ev end"
  local serial = 0
  local function one()
    if kind == "rt" then assert(rt:submit_sync(0)) return end
    if kind == "call" then assert(ctx:call("prof.null", nil, { timeout = 60 }) ~= false) return end
    serial = serial + 1
    local c = assert(ch:consumer(function() end, { modulator = FILTER, params = { i = serial } }))
    c:close()
  end
  for _ = 1, 20 do one() end
  local c0, p0, t0 = cpu(), peer_cpu(), clock()
  for _ = 1, n do one() end
  local c1, p1, t1 = cpu(), peer_cpu(), clock()
  io.write(cjson.encode{ kind = kind, n = n, us_per_op = (t1 - t0) * 1e6 / n,
    this = delta(c0, c1, n), peer_oncpu_us = (p1 - p0) * 1e6 / n }, "\n")
  rt:submit("quit")
  ctx:flush()
  ctx:close()
elseif mode == "iprod" then
  local ctx = lecho.context{ nameserver = arg[2], quiet = true, timeout = 20,
                            modulator_budget = tonumber(os.getenv("LECHO_PROF_BUDGET")) }
  local _p = assert(ctx:channel("prof.i"):producer())
  local _c = assert(ctx:channel("prof.rt"):consumer(function(ev) if ev == "quit" then ctx:stop() end end))
  local _s = assert(ctx:service("prof.null", function() end))
  local rep = assert(ctx:channel("prof.report"):producer())
  assert(rep:submit_sync({ ready = true, pid = common.getpid() }, { timeout = 20 }))
  ctx:after(600, function() ctx:stop() end)
  ctx:run()
else
  io.stderr:write("usage: luajit bench/prof_stream.lua prod SIZE N NSUBS [ADDRFILE] | cons ADDR [ID]\n"
    .. "       luajit bench/prof_stream.lua inst install|rt|call N [ADDRFILE] | iprod ADDR\n"
    .. "       luajit bench/prof_stream.lua chans K N ROUNDS [ADDRFILE]  (cons with LECHO_PROF_CHANS=K)\n")
  os.exit(2)
end
