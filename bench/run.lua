-- bench/run.lua: lecho's benchmark suite (`make bench`, `make bench QUICK=1`).
--
-- Runs every workload on lecho (Lua API, and the C API through
-- bench/lecho_c where the core has one) and, in the same run, the same
-- workload on raw TCP (bench/baseline_tcp) and ZeroMQ (bench/baseline_zmq),
-- with the encoded size of lecho's value as the baselines' message size;
-- the workload peers against NATS and Redis (bench/baseline_peers, servers
-- started and stopped here) and ZeroMQ CURVE (bench/README.md).
-- Every figure is measured 5 times (QUICK=1: 3), interleaved with what it
-- is compared to (issue 13, see "Workloads" below).  Prints how busy the
-- machine was (load average, steal time, per workload too) and whether to
-- trust the run, then one table "workload | lecho | baseline | ratio |
-- spread (reps) | target | flags"; writes bench/results/results.json
-- (lua-cjson: every repetition) and PNG plots (gnuplot).
--
-- This process is the producer of every workload and hosts the name server
-- (a lecho context without `nameserver`); consumers, relays and sinks are
-- bench/worker.lua processes, started in the background per workload and
-- killed when it ends (and on any error).  Every run is bounded in count and
-- in time: a run that hits its time bound is recorded with what it measured
-- and `truncated = true`.
--
-- Environment: QUICK=1 (small counts, fewer points, 3 repetitions: under 60 s),
-- BENCH_ONLY=latency,bulk (run only these workloads), LECHO_BENCH_LOG=1
-- (workers log to their stderr files), BENCH_KEEP_TMP=1.

local USAGE = [[
usage: luajit bench/run.lua [--help]      (or: make bench [QUICK=1])

Runs lecho's benchmark suite against raw TCP, ZeroMQ, NATS and Redis (their
servers started on loopback ports it picks, stopped at the end) and writes
results.json, table.md and *.png to bench/results/.  It takes no options;
the environment sets it up:
  QUICK=1           small counts, fewer points, 3 repetitions (not 5): < 60 s
  BENCH_ONLY=a,b    only these workloads: codec latency throughput sinks
                    pipeline channels bulk null_call calls modulators keyed
                    peers attacked patterns moe_calls scale arrays gateway
  BENCH_RESULTS=DIR results there instead of bench/results
  LECHO_BENCH_LOG=1 the workers log to their stderr files
  BENCH_KEEP_TMP=1  keep the temporary directory of the workers' output
  LUAJIT=PATH       the interpreter of the workers (luajit)
Needs the tree's lua/ on LUA_PATH/LUA_CPATH (make bench sets them) and
bench/baseline_tcp, bench/baseline_zmq, bench/baseline_peers, bench/lecho_c
(make bench builds them); nats-server, redis-server and openssl for the
workload peers (make bench-deps; a missing one leaves its rows unmeasured).
]]
if arg and arg[1] then
  if arg[1] == "--help" or arg[1] == "-h" then io.write(USAGE) os.exit(0) end
  io.stderr:write("bench/run.lua: unknown argument ", arg[1], "\n", USAGE)
  os.exit(2)
end

local dir = (arg and arg[0] or ""):match("^(.*)/[^/]*$") or "."
package.path = dir .. "/?.lua;" .. dir .. "/../?.lua;" .. package.path

local cjson = require "cjson"
local lecho = require "lecho"
local common = require "common"
local proc = require "spec.support.proc"
local report = require "report"

local clock, sh_quote = common.clock, common.sh_quote
local QUICK = (os.getenv("QUICK") or "") ~= "" and os.getenv("QUICK") ~= "0"
local ROOT = os.getenv("LECHO_ROOT") or (dir .. "/..")
local BENCH = ROOT .. "/bench"
local RESULTS = os.getenv("BENCH_RESULTS") or (BENCH .. "/results")
local LUAJIT = os.getenv("LUAJIT") or "luajit"
local PYTHON = os.getenv("PYTHON") or "/usr/bin/python3"
local SUITE_T0 = clock()
local MACHINE_BEFORE = common.machine()

local ONLY
if os.getenv("BENCH_ONLY") and os.getenv("BENCH_ONLY") ~= "" then
  ONLY = {}
  for w in os.getenv("BENCH_ONLY"):gmatch("[^,%s]+") do ONLY[w] = true end
end

-- Counts per repetition (full run / QUICK) and time bounds (seconds) per
-- run; every figure is measured 5 times (QUICK: 3), interleaved.
local CFG = QUICK and {
  lat_warm = 50, lat_n = 300, lat_bound = 2,
  tp = { { 64, 20000, 80000 }, { 1024, 10000, 40000 }, { 65536, 500, 1000 } }, tp_bound = 2,
  base_pp_n = 600,
  sinks = { 1, 2, 8 }, sink_sync_n = 150, sink_async_n = { null = 10000, composite = 1500 },
  sink_bound = 2,
  pipe = { 1, 2, 6 }, pipe_n = 10000, pipe_bound = 2,
  chans = { 1, 64, 4096 }, chan_n = 20000, chan_bound = 2, chan_setup_bound = 60,
  bulk_n = 5, bulk_bound = 5,
  -- { bytes, lecho's events (Lua and C API), raw TCP's }
  arrays = { { 8 * 1024 * 1024, 10, 10 }, { 65536, 1000, 2000 } }, arrays_bound = 5,
  null_n = 1000, c_stream_n = 100000,
  keyed_pp_n = 1000, keyed_stream = { { 1024, 30000 }, { 65536, 1000 } },
  -- 64 B: 200,000 events, not 20,000: a keyed connection's first ~256 KiB
  -- (its read buffers growing, a few hundred page faults at ~13 us) made
  -- 20,000 events measure the start-up, not the stream (0.05 s of work)
  peers_keyed = { { 64, 200000 }, { 1024, 10000 } },
} or {
  lat_warm = 200, lat_n = 2000, lat_bound = 4,
  -- { size, lecho's events, the baselines' (faster, except ZeroMQ at 64 KiB) }
  tp = { { 64, 500000, 1500000 }, { 1024, 150000, 300000 }, { 65536, 5000, 10000 } }, tp_bound = 4,
  base_pp_n = 2000,
  sinks = { 1, 2, 4, 8 }, sink_sync_n = 500, sink_async_n = { null = 50000, composite = 5000 },
  sink_bound = 4,
  pipe = { 1, 2, 3, 4, 5, 6 }, pipe_n = 50000, pipe_bound = 4,
  chans = { 1, 16, 256, 4096, 65536 }, chan_n = 200000, chan_bound = 4, chan_setup_bound = 120,
  bulk_n = 100, bulk_bound = 20,
  arrays = { { 8 * 1024 * 1024, 60, 60 }, { 65536, 10000, 20000 } }, arrays_bound = 20,
  null_n = 3000, c_stream_n = 1000000,
  keyed_pp_n = 3000, keyed_stream = { { 1024, 200000 }, { 65536, 5000 } },
  -- { size, events } of the keyed rows against NATS with TLS and ZeroMQ CURVE
  peers_keyed = { { 64, 500000 }, { 1024, 200000 } },
}

------------------------------------------------------------------------------
-- Child processes (spec/support/proc.lua): started in the background
-- (stdout/stderr to files), remembered, and always stopped and reaped (by
-- their wrapping shell).

local tmpdir = proc.tmpdir("lecho-bench")
local children = proc.group(tmpdir)

local function spawn(cmd, tag) return children:spawn(cmd, tag) end
local exited, kill = proc.exit_code, proc.stop
local function kill_all() children:kill_all() end
local function child_errors(child) return proc.errors(child, 2000) end

------------------------------------------------------------------------------
-- The producing context (and name server) and the report channel.

-- channel_quota: one worker subscribes to every channel of the channels
-- workload (1 + 16 + 256 + 4096) before their producers exist, and an entry
-- stays charged to its maker until another context joins it (issue 11)
local ctx = lecho.context{ quiet = not os.getenv("LECHO_BENCH_LOG"), timeout = 20, channel_quota = 16384 }
local ready, reports = {}, {}
local report_con = assert(ctx:channel("report"):consumer(function(ev)
  if type(ev) ~= "table" then return end
  if ev.ready then ready[ev.id] = ev else reports[#reports + 1] = ev end
end))
local MYPID = common.getpid()

local function run_until(pred, bound) return common.run_until(ctx, pred, bound) end

--- Starts workers (list of option tables with id and subs) and waits until
-- every one said ready (bound s).  sequential: one at a time, in list order,
-- each ready before the next starts.  Returns the children.
local function start_workers(list, bound, sequential)
  local started = {}
  local function wait_ready(upto)
    local ok = run_until(function()
      for i = 1, upto do
        local o = list[i]
        if not ready[o.id] then
          if exited(started[i]) then
            error(("worker %s exited: %s"):format(o.id, child_errors(started[i])))
          end
          return false
        end
      end
      return true
    end, bound or 60)
    if not ok then
      local errs = {}
      for i = 1, upto do
        if not ready[list[i].id] then errs[#errs + 1] = list[i].id .. ": " .. child_errors(started[i]) end
      end
      error("workers not ready in time: " .. table.concat(errs, "; "))
    end
  end
  for i, o in ipairs(list) do
    o.ns, o.parent, o.bound = ctx.addr, MYPID, o.bound or 900
    ready[o.id] = nil
    local cmd = ("%s %s/worker.lua %s"):format(LUAJIT, BENCH, sh_quote(cjson.encode(o)))
    if o.python then
      -- bench/py_worker.py: the same role from the Python package
      cmd = ("PYTHONPATH=%s %s %s/py_worker.py %s"):format(sh_quote(ROOT .. "/python"), PYTHON, BENCH,
                                                         sh_quote(cjson.encode(o)))
    end
    started[i] = spawn(cmd, o.id)
    if sequential then wait_ready(i) end
  end
  wait_ready(#list)
  return started
end

local function stop_workers(started)
  for _, c in ipairs(started) do kill(c) end
end

------------------------------------------------------------------------------
-- Measurements

local SYNC_OPTS = { timeout = 10 }

local function check(ok, err, what)
  if not ok then error(("%s: %s"):format(what, tostring(err)), 2) end
end

local function percentile(sorted, p)
  local n = #sorted
  local k = math.max(1, math.min(n, math.ceil(p * n)))
  return sorted[k]
end

--- Sync round trips: warm untimed, then up to n timed ones within bound s.
local function sync_rtt(p, v, warm, n, bound)
  for _ = 1, warm do check(p:submit_sync(v, SYNC_OPTS)) end
  local samples = {}
  local t0 = clock()
  local deadline = t0 + bound
  local done = 0
  for i = 1, n do
    local a = clock()
    check(p:submit_sync(v, SYNC_OPTS))
    local b = clock()
    samples[i] = b - a
    done = i
    if b > deadline then break end
  end
  local secs = clock() - t0
  table.sort(samples)
  return {
    n = done, seconds = secs, us_per_op = secs * 1e6 / done,
    p50_us = percentile(samples, 0.50) * 1e6, p99_us = percentile(samples, 0.99) * 1e6,
    truncated = done < n or nil,
  }
end

local phase = 0
--- Sends a control event to the channel(s) of producers ps (sync: every
-- consumer ran it) and returns the phase number it carries.
local function control(ps, op)
  phase = phase + 1
  for _, p in ipairs(ps) do
    local ok, err = p:submit_sync({ bench_ctl = op, phase = phase }, { timeout = 30 })
    check(ok, err, "control " .. op)
  end
  return phase
end

local function collect(ph, want, bound)
  local got = {}
  run_until(function()
    for _, r in ipairs(reports) do
      if r.phase == ph and not got[r.id] then got[r.id] = r; got[#got + 1] = r end
    end
    return #got >= want
  end, bound)
  return got
end

--- Async stream: warm events, reset, then up to n events (round robin over
-- the producers ps) within bound s, then "end"; time per event is measured
-- at the consumers: from the first timed submit to the last receive of the
-- slowest consumer.  nsinks reports are expected.
local function async_run(ps, v, warm, n, bound, nsinks)
  local np = #ps
  for i = 1, warm do check(ps[(i - 1) % np + 1]:submit(v)) end
  control({ ps[1] }, "reset")
  local t0 = clock()
  local cpu0 = os.clock()   -- the producer's own CPU (encode, queue, write)
  local deadline = t0 + bound
  local sent = 0
  for i = 1, n do
    local ok, err = ps[(i - 1) % np + 1]:submit(v)
    if not ok then error("submit: " .. tostring(err)) end
    sent = i
    if i % 512 == 0 and clock() > deadline then break end
  end
  local t_sent = clock()
  ctx:flush()
  local cpu = os.clock() - cpu0
  local ph = control({ ps[(sent - 1) % np + 1] }, "end")
  local got = collect(ph, nsinks, bound + 10)
  if #got < nsinks then
    error(("only %d of %d consumers reported (phase %d, channel %s, reports: %s)"):format(
      #got, nsinks, ph, ps[1].ch.name, cjson.encode(reports)))
  end
  local t_last, count = 0, math.huge
  for _, r in ipairs(got) do
    t_last = math.max(t_last, r.t_last or 0)
    count = math.min(count, r.count)
  end
  if count < 1 then error("consumers received nothing") end
  local secs = t_last - t0
  return {
    n = sent, received = count, seconds = secs, us_per_op = secs * 1e6 / count,
    ops_per_s = count / secs, send_seconds = t_sent - t0,
    producer_cpu_us = cpu * 1e6 / sent,
    truncated = (sent < n or count < sent) or nil,
  }
end

local json_line = common.json_line

--- Runs a C program (baseline or lecho_c) bounded by `timeout`, in the
-- background while this context's loop is served (blocked in io.popen for
-- a baseline's run at a busy host's pace, it answered no heartbeat and the
-- workers dropped it as dead: "write: Broken pipe", then "no consumer");
-- its one JSON line, or { error = the output }.
local function run_c(bin, args)
  local child = spawn(("timeout -k 5 90 %s/%s %s"):format(BENCH, bin, args), "c")
  if not proc.wait(child, 100, function(dt) ctx:run_once(dt) end) then proc.kill(child, "KILL") end
  local out = (proc.output(child) or "") .. (proc.errors(child, 4000) or "")
  local v = json_line(out)
  if not v then
    io.stderr:write(("bench: %s %s failed: %s\n"):format(bin, args, out))
    return { error = out:sub(1, 500) }
  end
  return v
end

local function esize(v) return #assert(lecho.encode(v)) end

------------------------------------------------------------------------------
-- Workloads
--
-- Every figure compared is measured REPS times (5; QUICK: 3), interleaved
-- with what it is compared to (bench/common.lua interleave: lecho and its
-- baselines, or the points of a scale, alternated in an order rotated each
-- repetition, so a drift of the machine's load hits all alike).  A row's
-- lecho and baseline are the medians over the repetitions, its ratio the
-- median of the per-repetition ratios, lo-hi their min-max; results.json
-- keeps every repetition (`runs`, and `order`).

local REPS = QUICK and 3 or 5
local R = {}     -- results by workload
local ROWS = {}  -- the table

local function row(t) ROWS[#ROWS + 1] = t end

local function enabled(w) return not ONLY or ONLY[w] end

local function log(fmt, ...)
  io.stderr:write(("[%6.1fs] "):format(clock() - SUITE_T0), fmt:format(...), "\n")
end

local function us_per_op(r) return r.us_per_op end
local function ops_per_s(r) return r.ops_per_s end
local function mb_per_s(r) return r.mb_per_s end

--- fn(...), its error extended with what the worker `child` wrote on
-- stderr (a consumer that went away says why there, if it could).
local function with_worker(child, fn, ...)
  local r = { pcall(fn, ...) }
  if not r[1] then error(tostring(r[2]) .. "; worker: " .. child_errors(child), 0) end
  return unpack(r, 2)
end

--- REPS interleaved repetitions of runs ({ name, fn }...).
local function repeated(runs)
  return common.interleave{ reps = REPS, runs = runs, value = function() return nil end }
end

--- A row from a ratio { median, lo, hi, all } (common.ratio): ratio, its
-- spread and how many repetitions it comes from.
local function ratio_row(t, ratio)
  t.ratio, t.lo, t.hi = ratio.median, ratio.lo, ratio.hi
  t.reps, t.ratios = #ratio.all, ratio.all
  row(t)
end

--- A row comparing run a to run b of the repetitions iv by value(result):
-- the medians of each, the median of the per-repetition ratios a/b.
local function iv_row(t, iv, a, b, value)
  t.lecho = common.median_of(iv, a, value)
  t.base_v = common.median_of(iv, b, value)
  for _, r in ipairs(iv.runs[a]) do if r.truncated then t.truncated = true end end
  local ratio = common.ratio(iv, a, b, value)
  if #ratio.all < iv.reps then
    -- a repetition that failed (its error is in results.json's runs)
    t.flags = t.flags or {}
    t.flags[#t.flags + 1] = ("%d of %d reps failed"):format(iv.reps - #ratio.all, iv.reps)
  end
  ratio_row(t, ratio)
end

--- The repetition of each run whose value(result) is the median (what the
-- plots and a quick look use), plus every repetition (runs) and the orders.
local function medians(iv, value, into)
  into = into or {}
  for name, runs in pairs(iv.runs) do
    local _, pick = common.median_of(iv, name, value)
    into[name] = pick or runs[1]
  end
  into.runs, into.order = iv.runs, iv.order
  return into
end

local LAT_PAYLOADS = {
  { "null", "null" }, { "int100", "100 integers" }, { "str400", "400-byte string" },
  { "num100", "100 numbers" }, { "composite", "composite" },
}

local function w_codec()
  log("codec comparison")
  local f = io.popen(("%s %s/codec_bench.lua --json %s 2>&1"):format(LUAJIT, BENCH, QUICK and "--quick" or ""))
  local out = f:read("*a")
  f:close()
  local v = json_line(out)
  if not v then error("codec_bench failed: " .. out) end
  R.codec = v
end

local function w_latency()
  log("latency (sync round trip by payload), %d interleaved repetitions", REPS)
  local w = start_workers{ { id = "lat", subs = { { group = "lat", channels = { "lat" } } } } }
  local p = assert(ctx:channel("lat"):producer())
  local res = {}
  for _, pl in ipairs(LAT_PAYLOADS) do
    local v = common.payload(pl[1])
    local size = esize(v)
    local pp = ("pingpong %d %d"):format(size, CFG.base_pp_n)
    local iv = repeated{
      { "lecho", function() return sync_rtt(p, v, CFG.lat_warm, CFG.lat_n, CFG.lat_bound) end },
      { "tcp", function() return run_c("baseline_tcp", pp) end },
      { "zmq", function() return run_c("baseline_zmq", pp) end } }
    res[#res + 1] = medians(iv, us_per_op, { payload = pl[1], label = pl[2], size = size })
    -- issue 13: the composite value's round trip <= 1.25x raw TCP (the null
    -- one's target is on the row of the workload null_call)
    iv_row({ workload = "latency " .. pl[2] .. (" (%d B)"):format(size), metric = "us/rt",
             base = "tcp", lower = true, target = pl[1] == "composite" and { "<=", 1.25 } or nil },
           iv, "lecho", "tcp", us_per_op)
    iv_row({ workload = "", metric = "us/rt", base = "zmq REQ/REP", lower = true }, iv, "lecho", "zmq", us_per_op)
  end
  p:close()
  stop_workers(w)
  R.latency = res
end

local function w_throughput()
  log("async throughput, %d interleaved repetitions", REPS)
  local w = start_workers{ { id = "tp", subs = { { group = "tp", channels = { "tp" } } } },
                          { id = "tp_py", python = true, subs = { { group = "tp_py", channels = { "tp_py" } } } } }
  local p = assert(ctx:channel("tp"):producer())
  local p_py = assert(ctx:channel("tp_py"):producer())
  local res = {}
  for _, sz in ipairs(CFG.tp) do
    local size, n, bn = sz[1], sz[2], sz[3]
    local v = common.payload("bytes" .. size)
    local es = esize(v)
    local runs = {
      { "lecho", function()
          local r = with_worker(w[1], async_run, { p }, v, math.max(1, math.floor(n / 20)), n, CFG.tp_bound, 1)
          r.mb_per_s = r.ops_per_s * size / 1e6
          return r
        end },
      -- raw TCP batched: frames copied into a 64 KiB buffer, one write()
      -- each time it is full (bench/baseline_tcp.c stream)
      { "tcp", function() return run_c("baseline_tcp", ("stream %d %d"):format(es, bn)) end },
      { "zmq", function() return run_c("baseline_zmq", ("stream %d %d"):format(es, bn)) end } }
    if size == 64 then
      -- the Python package (bench/py_worker.py: a Subscription) beside the
      -- Lua consumer, the same producer and events (issue 28)
      runs[#runs + 1] = { "python", function()
        return with_worker(w[2], async_run, { p_py }, v, math.max(1, math.floor(n / 20)), n, CFG.tp_bound, 1)
      end }
      -- the C API (bench/lecho_c: strings of `size` bytes, encoded as the
      -- Lua binding does: the same bytes on the wire)
      runs[#runs + 1] = { "lecho_c", function()
        return run_c("lecho_c", ("stream %d %d"):format(size, CFG.c_stream_n))
      end }
    end
    local iv = repeated(runs)
    local r = medians(iv, ops_per_s, { size = size, encoded = es })
    res[#res + 1] = r
    local label = size >= 1024 and ("%d KiB"):format(math.floor(size / 1024)) or ("%d B"):format(size)
    iv_row({ workload = "async " .. label .. " events/s, Lua API", metric = "ev/s", base = "zmq PUB/SUB",
             target = size == 64 and { ">=", 2.0 } or nil,
             extra = r.lecho.mb_per_s and ("%.0f MB/s"):format(r.lecho.mb_per_s) },
           iv, "lecho", "zmq", ops_per_s)
    iv_row({ workload = "", metric = "ev/s", base = "tcp batched" }, iv, "lecho", "tcp", ops_per_s)
    if r.python then
      iv_row({ workload = "async " .. label .. " events/s, Python consumer", metric = "ev/s",
               base = "Lua consumer", target = { ">=", 0.5 }, target_issue = 28 }, iv, "python", "lecho", ops_per_s)
    end
    if r.lecho_c then
      iv_row({ workload = "async " .. label .. " events/s, C API", metric = "ev/s", base = "tcp batched",
               target = { ">=", 0.6 } }, iv, "lecho_c", "tcp", ops_per_s)
      iv_row({ workload = "", metric = "ev/s", base = "zmq PUB/SUB" }, iv, "lecho_c", "zmq", ops_per_s)
    end
  end
  p:close()
  p_py:close()
  stop_workers(w)
  R.throughput = res
end

--- Workers for points of sizes `counts` (ascending) sharing processes:
-- worker k (id .. k) holds sub(n, k) for every point n >= k, so the point
-- of size n uses workers 1..n.
local function layered(counts, id, sub)
  local list = {}
  for k = 1, counts[#counts] do
    local subs = {}
    for _, n in ipairs(counts) do
      if n >= k then subs[#subs + 1] = sub(n, k) end
    end
    list[k] = { id = id .. k, subs = subs }
  end
  return list
end

--- The points of a scale (sinks, stages, channels) as runs of one
-- interleave, and per point the median repetition of each mode.
local function scale_points(points, name_of, run, modes, value)
  local runs = {}
  for _, pt in ipairs(points) do runs[#runs + 1] = { name_of(pt), function() return run(pt) end } end
  local iv = repeated(runs)
  local res = {}
  for _, pt in ipairs(points) do
    local name = name_of(pt)
    local r = { runs = iv.runs[name] }
    for _, mode in ipairs(modes) do
      local _, pick = common.median_of(iv, name, function(x) return x[mode] and value(x[mode]) end)
      r[mode] = pick and pick[mode]
    end
    res[#res + 1] = r
  end
  return iv, res
end

local function w_sinks()
  log("sink scalability, %d interleaved repetitions", REPS)
  local list = layered(CFG.sinks, "sink", function(n)
    return { group = "sinks" .. n, channels = { "sinks" .. n } }
  end)
  local w = start_workers(list)
  local ps = {}
  for _, n in ipairs(CFG.sinks) do ps[n] = assert(ctx:channel("sinks" .. n):producer()) end
  local modes = { "async_null", "async_composite", "sync_null", "sync_composite" }
  local iv, res = scale_points(CFG.sinks, tostring, function(n)
    local p, r = ps[n], {}
    for _, pl in ipairs{ "null", "composite" } do
      local v = common.payload(pl)
      r["sync_" .. pl] = sync_rtt(p, v, math.floor(CFG.sink_sync_n / 10), CFG.sink_sync_n, CFG.sink_bound)
      local an = CFG.sink_async_n[pl]
      r["async_" .. pl] = async_run({ p }, v, math.floor(an / 20), an, CFG.sink_bound, n)
    end
    return r
  end, modes, us_per_op)
  for i, n in ipairs(CFG.sinks) do res[i].sinks = n; ps[n]:close() end
  stop_workers(w)
  R.sinks = res
  local one, last = "1", tostring(CFG.sinks[#CFG.sinks])
  -- Time per event: on 2 cores the 8-sink point runs 9 busy processes, it
  -- cannot be flat (no target, issue 13); measured still.
  for _, mode in ipairs(modes) do
    iv_row({ workload = ("%s sinks %s, time/event"):format(last, mode:gsub("_", " ")), metric = "us/ev",
             base = "1 sink", lower = true }, iv, last, one, function(x) return x[mode].us_per_op end)
  end
  -- What encode-once is about: the producer's CPU per event (encode once,
  -- then a copy per destination), issue 13: <= 1.5x of one sink.
  for _, mode in ipairs{ "async_null", "async_composite" } do
    iv_row({ workload = ("%s sinks %s, producer CPU/event"):format(last, mode:gsub("_", " ")), metric = "us/ev",
             base = "1 sink", lower = true, target = { "<=", 1.5 } },
           iv, last, one, function(x) return x[mode].producer_cpu_us end)
  end
end

local function w_pipeline()
  log("pipeline, %d interleaved repetitions", REPS)
  local maxl = CFG.pipe[#CFG.pipe]
  -- Worker j is stage j of every pipeline of length >= j; started from the
  -- last stage back (the list reversed).
  local stages = layered(CFG.pipe, "pipe", function(L, j)
    return { group = "pipe" .. L, channels = { ("pipe%d_%d"):format(L, j) },
             relay_to = j < L and ("pipe%d_%d"):format(L, j + 1) or nil }
  end)
  local list = {}
  for j = 1, maxl do list[maxl + 1 - j] = stages[j] end
  -- From the sink back to the first relay, one at a time: each relay's
  -- producer joins once its downstream consumer exists.  (Started together,
  -- a producer's join reply can overwrite a newer member list that arrived
  -- in the same read: see the bench report; lua/lecho/init.lua Channel:_join.)
  local w = start_workers(list, 60, true)
  local ps = {}
  for _, L in ipairs(CFG.pipe) do ps[L] = assert(ctx:channel(("pipe%d_1"):format(L)):producer()) end
  local iv, res = scale_points(CFG.pipe, tostring, function(L)
    return { async_null = async_run({ ps[L] }, nil, math.floor(CFG.pipe_n / 20), CFG.pipe_n, CFG.pipe_bound, 1) }
  end, { "async_null" }, us_per_op)
  for i, L in ipairs(CFG.pipe) do res[i].length = L; ps[L]:close() end
  stop_workers(w)
  R.pipeline = res
  -- like the sinks: wall time per event grows with the processes on 2
  -- cores (no target); the producer's CPU per event does not
  iv_row({ workload = ("pipeline of %d processes, time/event"):format(maxl), metric = "us/ev",
           base = "1 process", lower = true }, iv, tostring(maxl), "1",
         function(x) return x.async_null.us_per_op end)
  iv_row({ workload = ("pipeline of %d processes, producer CPU/event"):format(maxl), metric = "us/ev",
           base = "1 process", lower = true }, iv, tostring(maxl), "1",
         function(x) return x.async_null.producer_cpu_us end)
end

-- A name server keeps at most 65536 channels (lecho.ns.registry max_channels),
-- the report channel included: points above 4096 get a name server of their
-- own (scripts/lecho-nameserver), with channels named "host:port/name".
local function own_nameserver(k)
  local child
  local _, addr = proc.nameserver{
    root = ROOT, luajit = LUAJIT, port_file = tmpdir .. "/ns-" .. k .. "-addr",
    -- the bench alone makes every channel: a quota above the table (issue 11)
    args = { "--for", "900", "--quiet", "--channel-quota", "70000" },
    start = function(argv)
      child = spawn(proc.sh_join(argv), "ns" .. k)
      return child
    end,
    timeout = 20, poll = function(dt)
      ctx:run_once(dt)
      return exited(child)
    end }
  assert(addr, "second name server did not start: " .. child_errors(child))
  return child, addr
end

local function w_channels()
  log("channels, %d interleaved repetitions", REPS)
  local subs, points = {}, {}
  for _, k in ipairs(CFG.chans) do
    if k <= 4096 then
      subs[#subs + 1] = { group = "chan" .. k, prefix = ("chan%d_"):format(k), n = k }
      points[#points + 1] = { channels = k, prefix = subs[#subs].prefix }
    end
  end
  local w = start_workers({ { id = "chan", subs = subs } }, 120)
  local servers, skipped = {}, {}
  -- Every point's consumers and producers exist together, so that the
  -- points alternate in each repetition.  Making a point's channels is
  -- bounded (CFG.chan_setup_bound s: each is a lookup and a join at the
  -- name server, whose work per request grows with its channels): a point
  -- not set up in time is left out, and said so in a row.
  local function make_producers(pt)
    local t0 = clock()
    pt.ps = {}
    for i = 1, pt.channels do
      pt.ps[i] = assert(ctx:channel(pt.prefix .. i):producer())
      if i % 256 == 0 and clock() - t0 > CFG.chan_setup_bound then
        for _, p in ipairs(pt.ps) do p:close() end
        pt.ps = nil
        error(("%d of %d producers made in %.0f s"):format(i, pt.channels, clock() - t0), 0)
      end
    end
    pt.setup_seconds = clock() - t0
  end
  local made = {}
  for _, pt in ipairs(points) do
    local ok, err = pcall(make_producers, pt)
    if ok then made[#made + 1] = pt
    elseif pt.channels == 1 then error(err)
    else
      log("channels: %d left out: %s", pt.channels, tostring(err))
      skipped[#skipped + 1] = { channels = pt.channels, error = tostring(err) }
    end
  end
  points = made
  for _, k in ipairs(CFG.chans) do
    if k > 4096 then
      local ns2, wb
      local ok, err = pcall(function()
        local addr
        ns2, addr = own_nameserver(k)
        local prefix = ("%s/chanbig%d_"):format(addr, k)
        log("channels: %d on name server %s", k, addr)
        local t0 = clock()
        wb = start_workers({ { id = "chanbig" .. k, subs = { { group = "chanbig" .. k, prefix = prefix, n = k } } } },
                           CFG.chan_setup_bound)
        local pt = { channels = k, prefix = prefix, consumer_setup_seconds = clock() - t0 }
        make_producers(pt)
        points[#points + 1] = pt
      end)
      if ok then
        servers[#servers + 1], w[#w + 1] = ns2, wb[1]
      else
        -- a point left out stops its processes at once: an idle name
        -- server and consumer of 65,536 channels still cost CPU (the
        -- 1-channel point measured 295k ev/s in a full run beside them, 1.7-1.9M
        -- in QUICK runs without)
        if wb then stop_workers(wb) end
        if ns2 then kill(ns2) end
        log("channels: %d left out: %s", k, tostring(err))
        skipped[#skipped + 1] = { channels = k, error = tostring(err) }
      end
    end
  end
  local name = function(pt) return tostring(pt.channels) end
  local iv, res = scale_points(points, name, function(pt)
    local n = math.max(CFG.chan_n, 2 * pt.channels)
    return { async_null = async_run(pt.ps, nil, math.max(pt.channels, math.floor(n / 20)), n, CFG.chan_bound, 1) }
  end, { "async_null" }, ops_per_s)
  for i, pt in ipairs(points) do
    res[i].channels, res[i].setup_seconds = pt.channels, pt.setup_seconds
    for _, p in ipairs(pt.ps) do p:close() end
  end
  stop_workers(w)
  for _, s in ipairs(servers) do kill(s) end
  R.channels = res
  R.channels_skipped = skipped[1] and skipped or nil
  local measured, left = {}, {}
  for _, pt in ipairs(points) do measured[pt.channels] = pt end
  for _, sk in ipairs(skipped) do left[sk.channels] = sk end
  for _, k in ipairs{ 4096, 65536 } do
    local t = { workload = ("%d channels round-robin, events/s"):format(k), metric = "ev/s", base = "1 channel",
                target = { ">=", k == 4096 and 0.9 or 0.8 } }
    if measured[k] then
      iv_row(t, iv, tostring(k), "1", function(x) return x.async_null.ops_per_s end)
    elseif left[k] then
      t.flags = { "not measured: setup " .. left[k].error:sub(1, 80) }
      row(t)
    end
  end
end

local function w_bulk()
  log("bulk transfer, %d interleaved repetitions", REPS)
  -- "lecho": the handler gets each value as a Lua string (a copy of what
  -- was read); "buffer": as a string.buffer pointing at the bytes where
  -- they were read (the consumer's `buffer` option: no copy)
  local w = start_workers{ { id = "bulk", subs = { { group = "bulk", channels = { "bulk" } } } },
                           { id = "bulkb", subs = { { group = "bulkb", channels = { "bulkb" }, buffer = true } } } }
  local p = assert(ctx:channel("bulk"):producer())
  local pb = assert(ctx:channel("bulkb"):producer())
  local chunk = ("0123456789abcdef"):rep(10 * 1024 * 1024 / 16)
  local es = esize(chunk)
  local function run(wk, prod)
    return function()
      local r = with_worker(wk, async_run, { prod }, chunk, 2, CFG.bulk_n, CFG.bulk_bound, 1)
      r.mb_per_s = r.ops_per_s * #chunk / 1e6
      return r
    end
  end
  local iv = repeated{
    { "lecho", run(w[1], p) },
    { "buffer", run(w[2], pb) },
    -- one writev of header + chunk, read straight into the chunk's buffer;
    -- 2 warm chunks like lecho's (their default is N/10: none at QUICK's 5)
    { "tcp", function() return run_c("baseline_tcp", ("--warmup 2 bulk %d %d"):format(es, CFG.bulk_n)) end },
    { "zmq", function() return run_c("baseline_zmq", ("--warmup 2 bulk %d %d"):format(es, CFG.bulk_n)) end } }
  p:close()
  pb:close()
  stop_workers(w)
  R.bulk = medians(iv, mb_per_s, { chunk = #chunk, encoded = es })
  iv_row({ workload = ("bulk %d x 10 MiB, MB/s, buffer consumer"):format(CFG.bulk_n), metric = "MB/s",
           base = "tcp", target = { ">=", 0.9 } }, iv, "buffer", "tcp", mb_per_s)
  iv_row({ workload = ("bulk %d x 10 MiB, MB/s, string consumer"):format(CFG.bulk_n), metric = "MB/s",
           base = "tcp" }, iv, "lecho", "tcp", mb_per_s)
  iv_row({ workload = "", metric = "MB/s", base = "zmq" }, iv, "lecho", "zmq", mb_per_s)
end

--- Arrays (issue 24): array events producer -> consumer (a Lua worker,
-- the array a view into its read buffer) against raw TCP, the C API
-- (bench/lecho_h --array: lecho_set_array with a free function) against the
-- Lua API publishing the same, and ZFP at the demo's error bound (0.01)
-- against zstd on a 32 MiB smooth <f8 field, in this process.
local function w_arrays()
  log("arrays, %d interleaved repetitions", REPS)
  local array = lecho.array
  local w = start_workers{ { id = "arr", subs = { { group = "arr", channels = { "arr" } } } },
                           { id = "arr_py", python = true, subs = { { group = "arr_py", channels = { "arr_py" } } } } }
  local p = assert(ctx:channel("arr"):producer())
  local p_py = assert(ctx:channel("arr_py"):producer())
  local res = {}
  for _, sz in ipairs(CFG.arrays) do
    local bytes, n, bn = sz[1], sz[2], sz[3]
    local a = array.new("<f8", { bytes / 8 })
    local ptr = a:ptr()
    for i = 0, bytes / 8 - 1 do ptr[i] = i * 0.5 end
    local v = { field = a } -- the array is written from its own memory (>= 64 KiB: pinned)
    local es = esize(v)
    local big = bytes >= 1024 * 1024
    local runs = {
      { "lecho", function()
          local r = with_worker(w[1], async_run, { p }, v, big and 2 or math.max(1, math.floor(n / 20)), n,
                                CFG.arrays_bound, 1)
          r.mb_per_s = r.ops_per_s * es / 1e6
          return r
        end },
      -- 8 MiB: one writev of header + payload, read straight into a buffer
      -- (bulk); 64 KiB: frames batched in a 64 KiB buffer (stream)
      { "tcp", function()
          return run_c("baseline_tcp", big and ("--warmup 2 bulk %d %d"):format(es, bn) or ("stream %d %d"):format(es, bn))
        end },
      { "lecho_h", function()
          return run_c("lecho_h", ("--array %sstream %d %d"):format(big and "--warmup 2 " or "", bytes, n))
        end } }
    if big then
      -- the Python package (bench/py_worker.py, a Subscription: each event's
      -- field a NumPy array over the received memory) beside the Lua
      -- consumer, the same events (issue 28: >= 0.9x raw TCP, no copy)
      runs[#runs + 1] = { "python", function()
        local r = with_worker(w[2], async_run, { p_py }, v, 2, n, CFG.arrays_bound, 1)
        r.mb_per_s = r.ops_per_s * es / 1e6
        return r
      end }
    end
    local iv = repeated(runs)
    local r = medians(iv, mb_per_s, { bytes = bytes, encoded = es })
    res[#res + 1] = r
    local label = big and ("%d MiB"):format(bytes / 2 ^ 20) or ("%d KiB"):format(bytes / 1024)
    iv_row({ workload = ("array events %s (<f8), MB/s, Lua API"):format(label), metric = "MB/s",
             base = big and "tcp" or "tcp batched", target = { ">=", big and 0.9 or 0.8 } },
           iv, "lecho", "tcp", mb_per_s)
    iv_row({ workload = ("array events %s (<f8), MB/s, C API"):format(label), metric = "MB/s",
             base = big and "tcp" or "tcp batched" }, iv, "lecho_h", "tcp", mb_per_s)
    iv_row({ workload = "", metric = "MB/s", base = "Lua API", target = { ">=", 0.9 } }, iv, "lecho_h", "lecho", mb_per_s)
    if r.python then
      iv_row({ workload = ("array events %s (<f8), MB/s, Python consumer"):format(label), metric = "MB/s",
               base = "tcp", target = { ">=", 0.9 }, target_issue = 28 }, iv, "python", "tcp", mb_per_s)
    end
  end
  p:close()
  p_py:close()
  stop_workers(w)

  -- ZFP at the demo's error bound against zstd (level 1), in this process
  local N = 2048
  local f = array.new("<f8", { N, N })
  local fp = f:ptr()
  for i = 0, N * N - 1 do
    local x, y = i % N, math.floor(i / N)
    fp[i] = math.sin(x * 0.01) * math.cos(y * 0.013) * 50 + 280
  end
  local raw = N * N * 8
  local function codec(name, pack, unpack)
    return { name, function()
      local t0 = clock()
      local z = pack()
      local t1 = clock()
      local back = unpack(z)
      local t2 = clock()
      local _ = back
      return { bytes = #z, mb_per_s = raw / (t1 - t0) / 1e6, unpack_mb_per_s = raw / (t2 - t1) / 1e6,
               ratio = raw / #z }
    end }
  end
  local iv = repeated{
    codec("zfp", function() return f:zfp(0.01) end, array.unzfp),
    codec("zstd", function() return f:zstd(1) end, array.unzstd) }
  local function bytes_of(r) return r.bytes end
  local function unpack_of(r) return r.unpack_mb_per_s end
  R.arrays = { transfer = res, codecs = medians(iv, mb_per_s, { field = "2048x2048 <f8", tolerance = 0.01 }) }
  local zr = R.arrays.codecs.zfp
  iv_row({ workload = "ZFP (tolerance 0.01), 32 MiB <f8 field, compress MB/s", metric = "MB/s", base = "zstd -1",
           extra = zr and zr.bytes and ("%.2f MB, %.1f:1"):format(zr.bytes / 1e6, zr.ratio) }, iv, "zfp", "zstd", mb_per_s)
  iv_row({ workload = "", metric = "MB/s", base = "zstd -1 (decompress)" }, iv, "zfp", "zstd", unpack_of)
  iv_row({ workload = "", metric = "bytes", base = "zstd -1", lower = true }, iv, "zfp", "zstd", bytes_of)
end

local function w_null()
  log("null call (Lua and C API), %d interleaved repetitions", REPS)
  local w = start_workers{ { id = "null", subs = { { group = "null", channels = { "null" } } } } }
  local p = assert(ctx:channel("null"):producer())
  local size = esize(nil)
  local pp = ("pingpong %d %d"):format(size, CFG.null_n)
  local iv = repeated{
    { "lua", function() return sync_rtt(p, nil, math.floor(CFG.null_n / 10), CFG.null_n, CFG.lat_bound) end },
    { "c", function() return run_c("lecho_c", ("pingpong 0 %d"):format(CFG.null_n)) end },
    { "tcp", function() return run_c("baseline_tcp", pp) end },
    { "zmq", function() return run_c("baseline_zmq", pp) end } }
  p:close()
  stop_workers(w)
  R.null_call = medians(iv, us_per_op, { size = size })
  iv_row({ workload = "null sync round trip, Lua API", metric = "us/rt", base = "tcp", lower = true,
           target = { "<=", 1.15 } }, iv, "lua", "tcp", us_per_op)
  iv_row({ workload = "null sync round trip, C API", metric = "us/rt", base = "tcp", lower = true },
         iv, "c", "tcp", us_per_op)
  iv_row({ workload = "", metric = "us/rt", base = "zmq REQ/REP", lower = true }, iv, "lua", "zmq", us_per_op)
end

-- Modulator costs (install, params update, per-event filter), each as a
-- ratio to the plain sync round trip: bench/modulator_bench.lua, its own
-- interleaved repetitions (plain, filter, install, params).
local function w_modulators()
  log("modulators (install, params update, trivial filter)")
  local f = io.popen(("%s %s/modulator_bench.lua --json %s/modulators.json %s 2>&1")
    :format(LUAJIT, BENCH, sh_quote(RESULTS), QUICK and "--quick" or ""))
  local out = f:read("*a")
  f:close()
  local s = common.read(RESULTS .. "/modulators.json")
  local v = s and cjson.decode(s)
  if not v or not v.rt_plain or type(v.spread) ~= "table" then error("modulator_bench failed: " .. out) end
  R.modulators = v
  local rs = v.spread   -- per figure { median, lo, hi, all } of the per-repetition ratios
  ratio_row({ workload = "modulator install", metric = "us", lecho = v.install, base = "sync rt",
              base_v = v.rt_plain, lower = true, target = { "<=", 3 } }, rs.install)
  ratio_row({ workload = "modulator params update", metric = "us", lecho = v.params, base = "sync rt",
              base_v = v.rt_plain, lower = true, target = { "<=", 1.5 } }, rs.params)
  ratio_row({ workload = "sync round trip through a trivial filter", metric = "us/rt", lecho = v.rt_filter,
              base = "plain", base_v = v.rt_plain, lower = true }, rs.rt_filter)
  if v.async_filter and v.async_plain and rs.async_filter then
    -- issue 27's target (issue 13 had 1.5x)
    ratio_row({ workload = "async event through a trivial filter", metric = "us/ev", lecho = v.async_filter,
                base = "plain", base_v = v.async_plain, lower = true, target = { "<=", 1.3 }, target_issue = 27 },
              rs.async_filter)
  end
end

-- The cost of keyed mode (authenticated, encrypted records) in the C API:
-- the same bench/lecho_c runs plain and with --keyed, interleaved
-- (common.interleave), REPS times.  Returns { plain = run, keyed = run
-- (the runs of median `field`), plain_median, keyed_median, ratios = {...},
-- ratio = { median, lo, hi, all }, runs = every repetition }.
local function keyed_pair(args, field)
  local iv = common.interleave{
    reps = REPS, value = function(r) return r[field] end,
    runs = { { "plain", function() return run_c("lecho_c", args) end },
             { "keyed", function() return run_c("lecho_c", "--keyed " .. args) end } },
    ratios = { { "keyed", "plain" } } }
  local ratio = iv.ratios["keyed/plain"]
  local out = { ratios = ratio.all, ratio = ratio, runs = iv.runs }
  for _, mode in ipairs{ "plain", "keyed" } do
    local m, pick = common.median_of(iv, mode, function(r) return r[field] end)
    out[mode .. "_median"], out[mode] = m, pick or iv.runs[mode][1]
  end
  return out
end

local function w_keyed()
  log("keyed (encrypted) vs plain, C API, %d interleaved repetitions", REPS)
  local r = { stream = {} }
  r.pingpong = keyed_pair(("pingpong 0 %d"):format(CFG.keyed_pp_n), "us_per_op")
  ratio_row({ workload = "null sync round trip, keyed, C API", metric = "us/rt",
              lecho = r.pingpong.keyed_median, base = "plain", base_v = r.pingpong.plain_median,
              lower = true }, r.pingpong.ratio)
  for i, t in ipairs(CFG.keyed_stream) do
    local size, n = t[1], t[2]
    local s = keyed_pair(("stream %d %d"):format(size, n), "mb_per_s")
    s.size = size
    r.stream[i] = s
    ratio_row({ workload = ("async %d B events, keyed, C API, MB/s"):format(size), metric = "MB/s",
                lecho = s.keyed_median, base = "plain", base_v = s.plain_median }, s.ratio)
  end
  R.keyed = r
end

-- Services and calls (issue 12 point 8): bench/call_bench.lua, its own
-- processes.  Every figure there is the median of interleaved repetitions
-- (common.interleave), the ratio column the median of the per-repetition
-- ratios, their spread beside it; calls.json keeps every repetition.
local function w_calls()
  log("calls (null call round trip, calls in flight, failover)")
  local file = RESULTS .. "/calls.json"
  os.remove(file)
  local f = io.popen(("%s %s/call_bench.lua --json %s %s 2>&1")
    :format(LUAJIT, BENCH, sh_quote(file), QUICK and "--quick" or ""))
  local out = f:read("*a")
  f:close()
  local s = common.read(file)
  local v = s and cjson.decode(s)
  if not v or not v.null then error("call_bench failed: " .. out) end
  R.calls = v
  local n = v.null
  ratio_row({ workload = "null call round trip, ctx:call (Lua API)", metric = "us/rt", lecho = n.median.lecho,
              base = "tcp", base_v = n.median.tcp, lower = true, target = { "<=", 1.25 }, target_issue = 12 },
            n.ratios["lecho/tcp"])
  ratio_row({ workload = "", metric = "us/rt", lecho = n.median.lecho, base = "zmq REQ/REP", base_v = n.median.zmq,
              lower = true }, n.ratios["lecho/zmq"])
  for _, iv in ipairs(v.inflight) do
    ratio_row({ workload = ("calls/s, %d in flight (ctx:call_async)"):format(iv.inflight), metric = "calls/s",
                lecho = iv.median.lecho, base = "zmq DEALER/ROUTER", base_v = iv.median.zmq },
              iv.ratios["lecho/zmq"])
  end
  local fo = v.failover
  if fo and fo.median_ms then
    row{ workload = "failover: replica SIGKILLed to the first call through the other", metric = "ms",
         lecho = fo.median_ms, base = "", reps = #fo.reps,
         extra = ("median of %d, %.1f-%.1f ms"):format(#fo.reps, fo.lo_ms, fo.hi_ms) }
  elseif fo then
    error("call_bench failover: " .. tostring(fo.error))
  end
end

-- Recording and history (issue 29): bench/recplay_bench.lua, its own
-- processes: the producer's throughput with a recorder attached vs without,
-- the recording's bytes per event vs the wire's, a late joiner's time to
-- its first value vs a sync round trip.
local function w_recplay()
  log("recplay (a recorder attached, disk vs wire bytes, a late joiner's first value)")
  local file = RESULTS .. "/recplay.json"
  os.remove(file)
  local f = io.popen(("%s %s/recplay_bench.lua --json %s %s 2>&1")
    :format(LUAJIT, BENCH, sh_quote(file), QUICK and "--quick" or ""))
  local out = f:read("*a")
  f:close()
  local s = common.read(file)
  local v = s and cjson.decode(s)
  if not v or not v.throughput then error("recplay_bench failed: " .. out) end
  R.recplay = v
  local t = v.throughput
  ratio_row({ workload = ("async %d B events/s, a recorder attached (lecho record)"):format(t.size), metric = "ev/s",
              lecho = t.median.recorded, base = "no recorder", base_v = t.median.plain,
              target = { ">=", 0.9 }, target_issue = 29,
              extra = t.cpu and t.cpu.producer_recorded and ("CPU/ev: producer %.2f us, %.2f without (%.2fx, %.2f-%.2f); "
                .. "recorder %.2f, consumer %.2f; 2-core bound %.2fx"):format(t.cpu.producer_recorded,
                t.cpu.producer_plain or 0, t.cpu.ratio.median or 0, t.cpu.ratio.lo or 0, t.cpu.ratio.hi or 0,
                t.cpu.recorder or 0, t.cpu.consumer_recorded or 0, t.cpu.bound_2cores or 0) or nil }, t.ratio)
  -- the control: what any second destination costs (a second plain
  -- consumer process in the recorder's place), no target
  if t.ratio_second and t.median.second then
    ratio_row({ workload = ("async %d B events/s, a second consumer instead of the recorder (control)"):format(t.size),
                metric = "ev/s", lecho = t.median.second, base = "no second consumer", base_v = t.median.plain,
                extra = t.cpu and t.cpu.producer_second and ("CPU/ev: producer %.2f us, %.2f without (%.2fx); second "
                  .. "consumer %.2f"):format(t.cpu.producer_second, t.cpu.producer_plain or 0,
                  t.cpu.ratio_second.median or 0, t.cpu.second or 0) or nil }, t.ratio_second)
  end
  -- the recorder in the producer's process (ch:producer{ record = },
  -- core/binding/lua_rec.c): no second destination, a writer thread
  local ip = v.inproc
  if ip and ip.ratio and ip.median then
    ratio_row({ workload = ("async %d B events/s, a recorder in the producer's process (ch:producer{ record = })")
                  :format(t.size), metric = "ev/s", lecho = ip.median, base = "no recorder", base_v = ip.plain,
                target = { ">=", 0.9 }, target_issue = 29,
                extra = ip.cpu and ip.cpu.producer and ("CPU/ev: producer %.2f us, %.2f without (%.2fx, %.2f-%.2f); "
                  .. "writer thread %.2f; disk/wire %.3f"):format(ip.cpu.producer, ip.cpu.producer_plain or 0,
                  ip.cpu.ratio.median or 0, ip.cpu.ratio.lo or 0, ip.cpu.ratio.hi or 0, ip.cpu.writer or 0,
                  ip.disk and ip.disk.ratio or 0) or nil }, ip.ratio)
  end
  local d = v.disk
  row{ workload = "recording: disk bytes per event", metric = "B/ev", lecho = d.per_event, base = "wire",
       base_v = d.wire, lower = true, target = { "<=", 1.05 }, target_issue = 29, ratio = d.ratio, lo = d.lo,
       hi = d.hi, reps = #d.all }
  local l = v.late
  ratio_row({ workload = "late joiner: join answered to first value (history)", metric = "us",
              lecho = l.median.first_value, base = "sync round trip", base_v = l.median.rtt, lower = true,
              target = { "<=", 2 }, target_issue = 29 }, l.ratio)
end

-- A legitimate flow beside an attacker (idle sockets, partial headers, junk
-- BINDs, junk lookups): bench/attacked_bench.lua, its own processes.
local function w_attacked()
  log("attacked: a legitimate flow with and without an attacker beside it")
  local file = RESULTS .. "/attacked.json"
  local f = io.popen(("%s %s/attacked_bench.lua --json %s %s 2>&1")
    :format(LUAJIT, BENCH, sh_quote(file), QUICK and "--quick" or ""))
  local out = f:read("*a")
  f:close()
  local s = common.read(file)
  local v = s and cjson.decode(s)
  if not v or not v.clean then error("attacked_bench failed: " .. out) end
  R.attacked = v
  ratio_row({ workload = "async 100 B events/s beside an attacker", metric = "ev/s", lecho = v.attacked,
              base = "no attacker", base_v = v.clean, extra = ("%d lost"):format(v.lost) },
            { median = common.median(v.ratios), lo = v.ratio_lo, hi = v.ratio_hi, all = v.ratios })
end

-- The modulators' pattern functions (core/moe/lpat.c) against LuaJIT's own,
-- in bench/pattern_bench.lua: per case the medians of interleaved
-- repetitions (7, QUICK 3) and the spread of the per-repetition ratios.
local function w_patterns()
  log("patterns (modulators' matcher vs LuaJIT's)")
  local f = io.popen(("%s %s/pattern_bench.lua --json %s 2>&1"):format(LUAJIT, BENCH, QUICK and "--quick" or ""))
  local out = f:read("*a")
  f:close()
  local v = json_line(out)
  if not v or not v.cases then error("pattern_bench failed: " .. out) end
  R.patterns = v
  for _, c in ipairs(v.cases) do
    row{ workload = "pattern " .. c.name, metric = "us/call", lecho = c.ours_us, base = "LuaJIT",
         base_v = c.luajit_us, lower = true, target = { "<=", 2 }, target_issue = 12,
         ratio = c.ratio_median or c.ratio, lo = c.ratio_lo, hi = c.ratio_hi, reps = c.reps }
  end
end

-- What a modulator's own code costs per call in the MOE (issue 27 item 5):
-- bench/moe_jit_bench.lua, in-process sandboxes (the MOE's states), its own
-- interleaved repetitions; each ratio to the call's two encode/decode rounds.
local function w_moe_calls()
  log("moe_calls (a modulator's call in the MOE: trivial, Lua loop, region)")
  local file = RESULTS .. "/moe_calls.json"
  os.remove(file)
  local f = io.popen(("%s %s/moe_jit_bench.lua --json %s %s 2>&1")
    :format(LUAJIT, BENCH, sh_quote(file), QUICK and "--quick" or ""))
  local out = f:read("*a")
  f:close()
  local s = common.read(file)
  local v = s and cjson.decode(s)
  if not v or not v.median or not v.ratio then error("moe_jit_bench failed: " .. out) end
  R.moe_calls = v
  local m = v.median
  ratio_row({ workload = "modulator call, trivial filter (5-key event)", metric = "us/call", lecho = m.trivial,
              base = "2 codec rounds", base_v = m.codec_small, lower = true }, v.ratio.trivial)
  ratio_row({ workload = "modulator call, stats of 1,000 numbers (Lua loop)", metric = "us/call", lecho = m.stats,
              base = "2 codec rounds", base_v = m.codec_numbers, lower = true }, v.ratio.stats)
  row{ workload = "modulator call, atmosphere region (4x90x180 <f8)", metric = "us/call", lecho = m.region,
       base = "-", lower = true, reps = v.reps, extra = "its work is C (box views, one reduce)" }
end

-- Scale points (issue 13): fan-out to 64/256 consuming contexts, idle
-- peers, 65,536 channels: bench/scale_bench.lua, its own processes.
local function w_scale()
  log("scale (fan-out to many contexts, idle peers, many channels)")
  local file = RESULTS .. "/scale.json"
  os.remove(file)
  local f = io.popen(("%s %s/scale_bench.lua --json %s %s 2>&1")
    :format(LUAJIT, BENCH, sh_quote(file), QUICK and "--quick" or ""))
  local out = f:read("*a")
  f:close()
  local s = common.read(file)
  local v = s and cjson.decode(s)
  if not v or #v.failed > 0 then error("scale_bench failed: " .. out) end
  R.scale = v
  for _, pl in ipairs{ "null", "composite" } do
    local iv, ds = v.fanout[pl], {}
    for name in pairs(iv.ratios) do ds[#ds + 1] = tonumber(name:match("^d(%d+)/")) end
    table.sort(ds)
    for _, d in ipairs(ds) do
      local r = iv.ratios[("d%d/d1"):format(d)]
      ratio_row({ workload = ("fan-out to %d contexts, async %s, producer CPU/event/destination"):format(d, pl),
                  metric = "us/ev/dest", lecho = iv.median["d" .. d], base = "1 dest", base_v = iv.median.d1,
                  lower = true }, r)
    end
    local top = ds[#ds]
    row{ workload = ("fan-out to %d contexts, async %s, time/event at the consumers"):format(top, pl),
         metric = "us/ev", lecho = iv.consumer_us["d" .. top], base = "1 dest", base_v = iv.consumer_us.d1,
         lower = true, reps = v.reps }
  end
  local p, c = v.peers, v.channels
  row{ workload = ("%d idle peers, accepting context"):format(p.peers), metric = "KiB/peer",
       lecho = p.accept.kib_per_peer, base = "-", extra = ("connecting side %.1f KiB/context"):format(
         p.connect.kib_per_peer) }
  for _, side in ipairs{ "consumer", "producer", "nameserver" } do
    row{ workload = ("%d channels, %s"):format(c.channels, side), metric = "B/ch", lecho = c[side].b_per_ch,
         base = "-" }
  end
end

-- The peers users would pick instead (issue 27 item 7): NATS (nats-server,
-- plain and with TLS) and Redis (redis-server) pub/sub, through small
-- clients of our own (bench/baseline_peers.c: the NATS text protocol,
-- RESP), and ZeroMQ with CURVE, beside lecho in interleaved repetitions of
-- one run.  The servers are started here on loopback ports picked here
-- (the OS's choice of a free port, then the server on it; a start that
-- fails is retried on another), the TLS one with a throwaway self-signed
-- certificate made with the openssl command in build/bench-tls/, and
-- stopped at the end (kill_all on an error).  A server not installed
-- leaves its rows out, flagged "not measured" (make bench-deps installs
-- them).  bench/README.md says what each row runs.

local socket = require "socket"

local function have(cmd)
  return os.execute(("command -v %s >/dev/null 2>&1"):format(sh_quote(cmd))) == 0
end

local function free_port()
  local s = assert(socket.bind("127.0.0.1", 0))
  local _, port = s:getsockname()
  s:close()
  return tonumber(port)
end

--- True once the server on port answers as `kind` does: NATS sends INFO
-- first (in the clear, TLS or not), Redis answers PING.
local function probe(kind, port)
  local c = socket.tcp()
  c:settimeout(0.5)
  local ok = c:connect("127.0.0.1", port)
  if ok then
    if kind == "redis" then c:send("PING\r\n") end
    local l = c:receive("*l")
    ok = l and (kind == "redis" and l:match("^%+PONG") or kind ~= "redis" and l:match("^INFO ")) and true
  end
  c:close()
  return ok or false
end

--- Starts a server: cmd(port) its command line; its child and port once
-- it answers (10 s), at most 3 ports tried.
local function start_server(kind, cmd)
  local last
  for _ = 1, 3 do
    local port = free_port()
    local child = spawn(cmd(port), kind)
    local up = run_until(function() return exited(child) or probe(kind, port) end, 10)
    if up and not exited(child) then return child, port end
    last = child_errors(child)
    kill(child)
  end
  error(("%s did not start: %s"):format(kind, tostring(last)))
end

--- build/bench-tls/{cert,key}.pem: a throwaway self-signed certificate
-- (P-256, for IP 127.0.0.1, 1 day), made afresh each run.
local function tls_cert()
  local d = ROOT .. "/build/bench-tls"
  local cert, key = d .. "/cert.pem", d .. "/key.pem"
  local rc = os.execute(("mkdir -p %s && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 "
    .. "-nodes -keyout %s -out %s -days 1 -subj /CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1 "
    .. ">%s/openssl.log 2>&1"):format(sh_quote(d), sh_quote(key), sh_quote(cert), sh_quote(d)))
  if rc ~= 0 then error("openssl req failed: " .. tostring(common.read(d .. "/openssl.log"))) end
  return cert, key
end

local function w_peers()
  log("peers (NATS, NATS with TLS, Redis, ZeroMQ CURVE), %d interleaved repetitions", REPS)
  local res, missing = { servers = {} }, {}
  local nats, redis = have("nats-server"), have("redis-server")
  if not nats then missing[#missing + 1] = "nats-server" end
  if not redis then missing[#missing + 1] = "redis-server" end
  local tls = nats and have("openssl")
  if nats and not tls then missing[#missing + 1] = "openssl" end
  local servers = {}
  local port = {}
  if nats then
    servers.nats, port.nats = start_server("nats", function(p)
      return ("nats-server -a 127.0.0.1 -p %d"):format(p)
    end)
  end
  if tls then
    local cert, key = tls_cert()
    res.ca = cert
    servers.nats_tls, port.nats_tls = start_server("nats_tls", function(p)
      return ("nats-server -a 127.0.0.1 -p %d --tls --tlscert %s --tlskey %s"):format(p, sh_quote(cert), sh_quote(key))
    end)
  end
  if redis then
    local rdir = tmpdir .. "/redis"
    os.execute("mkdir -p " .. sh_quote(rdir))
    servers.redis, port.redis = start_server("redis", function(p)
      return ("redis-server --port %d --bind 127.0.0.1 --save '' --appendonly no --dir %s --daemonize no")
        :format(p, sh_quote(rdir))
    end)
  end
  res.servers = port
  local function peer(kind, args)
    if kind == "nats_tls" then
      return run_c("baseline_peers", ("nats %d --tls %s %s"):format(port.nats_tls, sh_quote(res.ca), args))
    end
    return run_c("baseline_peers", ("%s %d %s"):format(kind, port[kind], args))
  end
  local PEERS = { { "nats", "NATS" }, { "redis", "Redis pub/sub" } }
  local function add_peers(runs, args)
    for _, k in ipairs(PEERS) do
      if port[k[1]] then runs[#runs + 1] = { k[1], function() return peer(k[1], args) end } end
    end
  end
  --- A row per peer of lecho's run `a` against it (or "not measured");
  -- t.targets: the target of each peer's row, by peer (issue 27's table).
  local function peer_rows(t, iv, a, value, only)
    local first = true
    for _, k in ipairs(PEERS) do
      if not only or only[k[1]] then
        local r = {}
        for f, v in pairs(t) do r[f] = v end
        if not first then r.workload = "" end
        r.base = k[2]
        r.targets, r.target = nil, t.targets and t.targets[k[1]] or nil
        if iv.runs[k[1]] then
          iv_row(r, iv, a, k[1], value)
        else
          r.flags = { "not measured: " .. (k[1] == "redis" and "redis-server" or "nats-server") .. " not installed" }
          row(r)
        end
        first = false
      end
    end
  end

  local w = start_workers(
    (function()
      local list = { { id = "ptp", subs = { { group = "ptp", channels = { "peers_tp" } } } } }
      for k = 1, 8 do list[#list + 1] = { id = "pfan" .. k, subs = { { group = "pfan", channels = { "peers_fan" } } } } end
      return list
    end)())
  local p = assert(ctx:channel("peers_tp"):producer())
  local pf = assert(ctx:channel("peers_fan"):producer())
  local ok, err = pcall(function()
    -- async publish -> subscribe, 64 B and 1 KiB
    res.throughput = {}
    for i, sz in ipairs{ CFG.tp[1], CFG.tp[2] } do
      local size, n, bn = sz[1], sz[2], sz[3]
      local v = common.payload("bytes" .. size)
      local es = esize(v)
      local runs = {
        { "lecho", function()
            local r = with_worker(w[1], async_run, { p }, v, math.max(1, math.floor(n / 20)), n, CFG.tp_bound, 1)
            r.mb_per_s = r.ops_per_s * size / 1e6
            return r
          end } }
      add_peers(runs, ("stream %d %d"):format(es, bn))
      local c_api = size == 64 and io.open(BENCH .. "/lecho_h", "r")
      if c_api then
        c_api:close()
        runs[#runs + 1] = { "lecho_h", function()
          return run_c("lecho_h", ("stream %d %d"):format(size, CFG.c_stream_n))
        end }
        -- the core it wraps (bench/lecho_c: the same workload without Lua),
        -- in the same repetitions: the ratio of issue 27's target
        runs[#runs + 1] = { "lecho_c", function()
          return run_c("lecho_c", ("stream %d %d"):format(size, CFG.c_stream_n))
        end }
      end
      local iv = repeated(runs)
      res.throughput[i] = medians(iv, ops_per_s, { size = size, encoded = es })
      local label = size >= 1024 and "1 KiB" or ("%d B"):format(size)
      peer_rows({ workload = ("async %s events/s, Lua API, vs peers"):format(label), metric = "ev/s",
                  targets = size == 64 and { nats = { ">=", 2.5 } } or nil, target_issue = 27 },
                iv, "lecho", ops_per_s)
      if iv.runs.lecho_h then
        peer_rows({ workload = ("async %s events/s, public C API (lecho.h), vs peers"):format(label),
                    metric = "ev/s", targets = { nats = { ">=", 3 } }, target_issue = 27 }, iv, "lecho_h", ops_per_s,
                  { nats = true })
        iv_row({ workload = "", metric = "ev/s", base = "core (lecho_c)", target = { ">=", 0.8 }, target_issue = 27 },
               iv, "lecho_h", "lecho_c", ops_per_s)
      end
    end
    -- round trip: lecho's sync null round trip; NATS request with an
    -- inbox; Redis ping-pong over two channels
    local size = esize(nil)
    local iv = repeated((function()
      local runs = { { "lecho", function()
        return sync_rtt(p, nil, math.floor(CFG.null_n / 10), CFG.null_n, CFG.lat_bound)
      end } }
      add_peers(runs, ("pingpong %d %d"):format(size, CFG.base_pp_n))
      return runs
    end)())
    res.round_trip = medians(iv, us_per_op, { size = size })
    peer_rows({ workload = "null round trip, Lua API (sync) vs request/reply", metric = "us/rt", lower = true },
              iv, "lecho", us_per_op)
    -- fan-out 1 -> 8: time per event at the slowest subscriber
    local fn = CFG.sink_async_n.null
    iv = repeated((function()
      local runs = { { "lecho", function()
        return async_run({ pf }, nil, math.floor(fn / 20), fn, CFG.sink_bound, 8)
      end } }
      add_peers(runs, ("--subs 8 stream %d %d"):format(size, fn))
      return runs
    end)())
    res.fanout = medians(iv, us_per_op, { size = size, subs = 8 })
    peer_rows({ workload = "fan-out 1->8 null, time/event at the slowest subscriber", metric = "us/ev",
                lower = true, targets = { nats = { "<=", 0.5 }, redis = { "<=", 0.5 } }, target_issue = 27 },
              iv, "lecho", us_per_op)
    -- keyed: lecho's keyed mode (C API, bench/lecho_c --keyed) against
    -- NATS with TLS and ZeroMQ CURVE, plain NATS beside (what TLS costs it)
    res.keyed = {}
    for i, t in ipairs(CFG.peers_keyed) do
      local ksize, kn = t[1], t[2]
      local kes = esize(common.payload("bytes" .. ksize))
      local runs = { { "lecho_keyed", function() return run_c("lecho_c", ("--keyed stream %d %d"):format(ksize, kn)) end },
                     { "zmq_curve", function() return run_c("baseline_zmq", ("--curve stream %d %d"):format(kes, kn)) end } }
      if port.nats_tls then
        runs[#runs + 1] = { "nats_tls", function() return peer("nats_tls", ("stream %d %d"):format(kes, kn)) end }
        runs[#runs + 1] = { "nats", function() return peer("nats", ("stream %d %d"):format(kes, kn)) end }
      end
      local kiv = repeated(runs)
      res.keyed[i] = medians(kiv, ops_per_s, { size = ksize, encoded = kes })
      local label = ksize >= 1024 and "1 KiB" or ("%d B"):format(ksize)
      local kw = ("async %s events/s, keyed, C API"):format(label)
      if kiv.runs.nats_tls then
        iv_row({ workload = kw, metric = "ev/s", base = "NATS with TLS" }, kiv, "lecho_keyed", "nats_tls", ops_per_s)
      else
        row{ workload = kw, metric = "ev/s", base = "NATS with TLS",
             flags = { "not measured: " .. table.concat(missing, ", ") .. " not installed" } }
      end
      iv_row({ workload = "", metric = "ev/s", base = "zmq CURVE" }, kiv, "lecho_keyed", "zmq_curve", ops_per_s)
      if kiv.runs.nats_tls then
        iv_row({ workload = ("NATS with TLS, async %s, vs plain NATS"):format(label), metric = "ev/s", base = "NATS",
                 peer = "nats_tls" }, kiv, "nats_tls", "nats", ops_per_s)
      end
    end
  end)
  p:close()
  pf:close()
  stop_workers(w)
  for _, name in ipairs{ "nats", "nats_tls", "redis" } do
    if servers[name] then kill(servers[name]) end
  end
  res.missing = missing
  R.peers = res
  if not ok then error(err, 0) end
end

--- Gateway (issue 28): WebSocket fan-out of 1 KiB events to 100 clients,
-- lecho-gateway against nats-server's WebSocket listener, interleaved:
-- bench/gateway_bench.lua run as a child (its own name server, producer,
-- gateway and bench/ws_fanout clients; QUICK: 1,000 events, else 10,000;
-- 3 repetitions), its repetitions read back from gateway.json.
local function w_gateway()
  log("gateway WebSocket fan-out (100 clients) vs nats-server, gateway_bench.lua")
  if not have("nats-server") then
    row{ workload = "gateway WebSocket fan-out, 100 clients, 1 KiB", metric = "deliveries/s",
         flags = { "not measured: nats-server missing (make bench-deps)" } }
    return
  end
  local out = RESULTS .. "/gateway.json"
  os.remove(out)
  -- (3 repetitions even in QUICK, as every row of the table)
  local child = spawn(("QUICK=%s GW_REPS=3 BENCH_RESULTS=%s %s %s/gateway_bench.lua"):format(QUICK and "1" or "", sh_quote(RESULTS),
                                                                                  LUAJIT, BENCH), "gateway")
  if not proc.wait(child, 300, function(dt) ctx:run_once(dt) end) then proc.kill(child, "KILL") end
  local f = io.open(out)
  local g = f and cjson.decode(f:read("*a"))
  if f then f:close() end
  if not g then error("gateway_bench.lua wrote no results: " .. child_errors(child)) end
  local iv = { reps = g.reps, runs = { lecho = g.runs.lecho, nats = g.runs.nats } }
  R.gateway = g
  local label = ("gateway WebSocket fan-out, %d clients, 1 KiB"):format(g.clients)
  iv_row({ workload = label .. ", deliveries/s", metric = "ev/s", base = "nats-server WebSocket" }, iv, "lecho", "nats",
         function(r) return r.deliveries_per_s end)
  iv_row({ workload = "", metric = "us CPU/delivery", base = "nats-server WebSocket", lower = true }, iv, "lecho", "nats",
         function(r) return r.cpu_us_per_delivery end)
end

------------------------------------------------------------------------------

local WORKLOADS = {
  { "codec", w_codec }, { "latency", w_latency }, { "throughput", w_throughput },
  { "sinks", w_sinks }, { "pipeline", w_pipeline }, { "channels", w_channels },
  { "bulk", w_bulk }, { "null_call", w_null }, { "calls", w_calls }, { "modulators", w_modulators },
  { "keyed", w_keyed }, { "peers", w_peers }, { "attacked", w_attacked }, { "patterns", w_patterns },
  { "moe_calls", w_moe_calls }, { "scale", w_scale }, { "arrays", w_arrays }, { "gateway", w_gateway },
  { "recplay", w_recplay },
}

local CORES = tonumber(io.popen("nproc"):read("*l"))

local function main()
  os.execute("mkdir -p " .. sh_quote(RESULTS))
  log("lecho benchmark suite%s; %d interleaved repetitions per figure; name server %s",
      QUICK and " (QUICK)" or "", REPS, ctx.addr)
  local failed, per = {}, {}
  for _, w in ipairs(WORKLOADS) do
    if enabled(w[1]) then
      local m0, t0, first = common.machine(), clock(), #ROWS + 1
      local ok, err = xpcall(w[2], debug.traceback)
      if not ok then
        failed[#failed + 1] = w[1]
        io.stderr:write(("bench: workload %s failed: %s\n"):format(w[1], err))
        R[w[1]] = R[w[1]] or { error = tostring(err) }
        kill_all()
      end
      -- how busy the machine was during this workload, on its rows too
      local b = common.busy(m0, common.machine(), CORES)
      b.seconds = clock() - t0
      per[w[1]] = b
      for i = first, #ROWS do
        local r = ROWS[i]
        r.group, r.load1, r.steal_pct = w[1], b.load1_before, b.steal_pct
        r.flags = r.flags or {}
        for _, f in ipairs(b.flags) do r.flags[#r.flags + 1] = f end
      end
    end
  end
  local busy = common.busy(MACHINE_BEFORE, common.machine(), CORES)
  report.finish_rows(ROWS, QUICK)
  local trust = report.trust(busy, ROWS)
  print()
  if R.codec and R.codec.table then print(R.codec.table) print() end
  local uname = io.popen("uname -srm"):read("*l")
  local head = report.header{ busy = busy, trust = trust, reps = REPS, quick = QUICK, machine = uname,
                              date = os.date("!%Y-%m-%d %H:%M UTC"), seconds = clock() - SUITE_T0 }
  print(head)
  print()
  local tbl = report.print_table(ROWS)
  local doc = {
    meta = {
      date = os.date("!%Y-%m-%dT%H:%M:%SZ"), quick = QUICK, machine = uname, reps = REPS,
      load_before = MACHINE_BEFORE, load_after = common.machine(), busy = busy, workloads = per,
      trust = trust, thresholds = common.TRUST,
      cores = CORES, luajit = jit.version,
      lecho = lecho._VERSION, seconds = clock() - SUITE_T0,
      note = "baselines run with lecho's encoded value size as message size; a row's ratio is the median of "
        .. "the per-repetition ratios of interleaved runs, lo-hi their min-max, runs in workloads.*",
    },
    workloads = R, rows = ROWS, table = tbl, header = head, failed = failed,
  }
  common.write(RESULTS .. "/results.json", cjson.encode(doc) .. "\n")
  common.write(RESULTS .. "/table.md", head .. "\n\n" .. tbl .. "\n")
  report.plots(R, RESULTS)
  log("done: results in %s (results.json, table.md, *.png)", RESULTS)
  return #failed == 0
end

local ok, res = xpcall(main, debug.traceback)
kill_all()
pcall(function() report_con:close(); ctx:close() end)
if not os.getenv("BENCH_KEEP_TMP") then proc.remove(tmpdir) end
if not ok then
  io.stderr:write("bench: ", tostring(res), "\n")
  os.exit(1)
end
os.exit(res and 0 or 1)
