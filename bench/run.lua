-- bench/run.lua: lecho's benchmark suite (`make bench`, `make bench QUICK=1`).
--
-- Runs every workload on lecho (Lua API, and the C API through
-- bench/lecho_c where the core has one) and, in the same run, the same
-- workload on raw TCP (bench/baseline_tcp) and ZeroMQ (bench/baseline_zmq),
-- with the encoded size of lecho's value as the baselines' message size.
-- Prints one table "workload | lecho | baseline | ratio | target", writes
-- bench/results/results.json (lua-cjson) and PNG plots (gnuplot).
--
-- This process is the producer of every workload and hosts the name server
-- (a lecho context without `nameserver`); consumers, relays and sinks are
-- bench/worker.lua processes, started in the background per workload and
-- killed when it ends (and on any error).  Every run is bounded in count and
-- in time: a run that hits its time bound is recorded with what it measured
-- and `truncated = true`.
--
-- Environment: QUICK=1 (small counts, fewer points: well under 30 s),
-- BENCH_ONLY=latency,bulk (run only these workloads), LECHO_BENCH_LOG=1
-- (workers log to their stderr files), BENCH_KEEP_TMP=1.

local USAGE = [[
usage: luajit bench/run.lua [--help]      (or: make bench [QUICK=1])

Runs lecho's benchmark suite against raw TCP and ZeroMQ and writes
results.json, table.md and *.png to bench/results/.  It takes no options;
the environment sets it up:
  QUICK=1           small counts, fewer points: well under 30 s
  BENCH_ONLY=a,b    only these workloads: codec latency throughput sinks
                    pipeline channels bulk null_call calls modulators keyed
                    attacked patterns scale
  BENCH_RESULTS=DIR results there instead of bench/results
  LECHO_BENCH_LOG=1 the workers log to their stderr files
  BENCH_KEEP_TMP=1  keep the temporary directory of the workers' output
  LUAJIT=PATH       the interpreter of the workers (luajit)
Needs the tree's lua/ on LUA_PATH/LUA_CPATH (make bench sets them) and
bench/baseline_tcp, bench/baseline_zmq, bench/lecho_c (make bench builds them).
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
local SUITE_T0 = clock()
local MACHINE_BEFORE = common.machine()

local ONLY
if os.getenv("BENCH_ONLY") and os.getenv("BENCH_ONLY") ~= "" then
  ONLY = {}
  for w in os.getenv("BENCH_ONLY"):gmatch("[^,%s]+") do ONLY[w] = true end
end

-- Counts (full run / QUICK) and time bounds (seconds) per run.
local CFG = QUICK and {
  lat_warm = 100, lat_n = 600, lat_bound = 3,
  tp = { { 64, 30000 }, { 1024, 20000 }, { 65536, 1000 } }, tp_bound = 3,
  base_pp_n = 2000, base_tp_mult = 4,
  sinks = { 1, 2, 8 }, sink_sync_n = 300, sink_async_n = { null = 20000, composite = 3000 },
  sink_bound = 3,
  pipe = { 1, 2, 6 }, pipe_n = 20000, pipe_bound = 3,
  chans = { 1, 64, 4096 }, chan_n = 30000, chan_bound = 3,
  bulk_n = 10, bulk_bound = 10,
  null_n = 2000, c_stream_n = 100000,
  keyed_pp_n = 2000, keyed_stream = { { 1024, 100000 }, { 65536, 3000 } }, keyed_reps = 3,
} or {
  lat_warm = 1000, lat_n = 10000, lat_bound = 8,
  tp = { { 64, 1000000 }, { 1024, 300000 }, { 65536, 10000 } }, tp_bound = 8,
  base_pp_n = 20000, base_tp_mult = 4,
  sinks = { 1, 2, 4, 8 }, sink_sync_n = 3000, sink_async_n = { null = 200000, composite = 30000 },
  sink_bound = 6,
  pipe = { 1, 2, 3, 4, 5, 6 }, pipe_n = 200000, pipe_bound = 6,
  chans = { 1, 16, 256, 4096, 65536 }, chan_n = 300000, chan_bound = 6,
  bulk_n = 100, bulk_bound = 30,
  null_n = 20000, c_stream_n = 2000000,
  keyed_pp_n = 20000, keyed_stream = { { 1024, 1000000 }, { 65536, 30000 } }, keyed_reps = 5,
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

local function run_until(pred, bound)
  local deadline = clock() + bound
  while not pred() do
    if clock() > deadline then return false end
    ctx:run_once(0.02)
  end
  return true
end

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
    o.ns, o.parent, o.bound = ctx.addr, MYPID, o.bound or 240
    ready[o.id] = nil
    local cmd = ("%s %s/worker.lua %s"):format(LUAJIT, BENCH, sh_quote(cjson.encode(o)))
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
    check(p:submit_sync({ bench_ctl = op, phase = phase }, { timeout = 30 }), "control " .. op)
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

local function json_line(out)
  local last
  for line in out:gmatch("[^\n]+") do
    if line:match("^%s*{") then last = line end
  end
  if not last then return nil end
  local ok, v = pcall(cjson.decode, last)
  return ok and v or nil
end

--- Runs a C program (baseline or lecho_c) bounded by `timeout`; its one
-- JSON line, or nil and the output.
local function run_c(bin, args)
  local cmd = ("timeout -k 5 90 %s/%s %s 2>&1"):format(BENCH, bin, args)
  local f = io.popen(cmd)
  local out = f:read("*a")
  f:close()
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

local R = {}     -- results by workload
local ROWS = {}  -- the table

local function row(t) ROWS[#ROWS + 1] = t end

local function enabled(w) return not ONLY or ONLY[w] end

local function log(fmt, ...)
  io.stderr:write(("[%6.1fs] "):format(clock() - SUITE_T0), fmt:format(...), "\n")
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
  log("latency (sync round trip by payload)")
  local w = start_workers{ { id = "lat", subs = { { group = "lat", channels = { "lat" } } } } }
  local p = assert(ctx:channel("lat"):producer())
  local res = {}
  for _, pl in ipairs(LAT_PAYLOADS) do
    local v = common.payload(pl[1])
    local size = esize(v)
    local r = { payload = pl[1], label = pl[2], size = size }
    r.lecho = sync_rtt(p, v, CFG.lat_warm, CFG.lat_n, CFG.lat_bound)
    r.tcp = run_c("baseline_tcp", ("pingpong %d %d"):format(size, CFG.base_pp_n))
    r.zmq = run_c("baseline_zmq", ("pingpong %d %d"):format(size, CFG.base_pp_n))
    res[#res + 1] = r
    row{ workload = "latency " .. pl[2] .. (" (%d B)"):format(size), metric = "us/rt",
         lecho = r.lecho.us_per_op, base = "tcp", base_v = r.tcp.us_per_op, lower = true,
         truncated = r.lecho.truncated }
    row{ workload = "", metric = "us/rt", lecho = r.lecho.us_per_op, base = "zmq",
         base_v = r.zmq.us_per_op, lower = true }
  end
  p:close()
  stop_workers(w)
  R.latency = res
end

local function w_throughput()
  log("async throughput")
  local w = start_workers{ { id = "tp", subs = { { group = "tp", channels = { "tp" } } } } }
  local p = assert(ctx:channel("tp"):producer())
  local res = {}
  for _, sz in ipairs(CFG.tp) do
    local size, n = sz[1], sz[2]
    local v = common.payload("bytes" .. size)
    local es = esize(v)
    local r = { size = size, encoded = es }
    r.lecho = async_run({ p }, v, math.max(1, math.floor(n / 20)), n, CFG.tp_bound, 1)
    r.lecho.mb_per_s = r.lecho.ops_per_s * size / 1e6
    local bn = n * CFG.base_tp_mult
    r.tcp = run_c("baseline_tcp", ("stream %d %d"):format(es, bn))
    r.zmq = run_c("baseline_zmq", ("stream %d %d"):format(es, bn))
    res[#res + 1] = r
    local label = size >= 1024 and ("%d KiB"):format(math.floor(size / 1024)) or ("%d B"):format(size)
    row{ workload = "async " .. label .. " events/s", metric = "ev/s", lecho = r.lecho.ops_per_s,
         base = "zmq", base_v = r.zmq.ops_per_s, truncated = r.lecho.truncated,
         target = size == 64 and { ">=", 1.0 } or nil,
         extra = ("%.0f MB/s"):format(r.lecho.mb_per_s) }
    row{ workload = "", metric = "ev/s", lecho = r.lecho.ops_per_s, base = "tcp",
         base_v = r.tcp.ops_per_s }
  end
  p:close()
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

local function w_sinks()
  log("sink scalability")
  local list = layered(CFG.sinks, "sink", function(n)
    return { group = "sinks" .. n, channels = { "sinks" .. n } }
  end)
  local w = start_workers(list)
  local res = {}
  for _, n in ipairs(CFG.sinks) do
    local p = assert(ctx:channel("sinks" .. n):producer())
    local r = { sinks = n }
    for _, pl in ipairs{ "null", "composite" } do
      local v = common.payload(pl)
      r["sync_" .. pl] = sync_rtt(p, v, math.floor(CFG.sink_sync_n / 10), CFG.sink_sync_n, CFG.sink_bound)
      local an = CFG.sink_async_n[pl]
      r["async_" .. pl] = async_run({ p }, v, math.floor(an / 20), an, CFG.sink_bound, n)
    end
    p:close()
    res[#res + 1] = r
  end
  stop_workers(w)
  R.sinks = res
  local first, last = res[1], res[#res]
  for _, mode in ipairs{ "async_null", "async_composite", "sync_null", "sync_composite" } do
    row{ workload = ("%d sinks %s, time/event"):format(last.sinks, mode:gsub("_", " ")),
         metric = "us/ev", lecho = last[mode].us_per_op, base = ("1 sink"),
         base_v = first[mode].us_per_op, lower = true,
         target = mode:match("^async") and { "<=", 2.0 } or nil,
         truncated = last[mode].truncated }
  end
  -- What encode-once is about: the producer's CPU per event does not grow
  -- with the sinks the way the consumers' total does (on 2 cores, 8 sink
  -- processes cannot each run at one sink's pace).
  for _, mode in ipairs{ "async_null", "async_composite" } do
    row{ workload = ("%d sinks %s, producer CPU/event"):format(last.sinks, mode:gsub("_", " ")),
         metric = "us/ev", lecho = last[mode].producer_cpu_us, base = "1 sink",
         base_v = first[mode].producer_cpu_us, lower = true, target = { "<=", 2.0 } }
  end
end

local function w_pipeline()
  log("pipeline")
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
  local res = {}
  for _, L in ipairs(CFG.pipe) do
    local p = assert(ctx:channel(("pipe%d_1"):format(L)):producer())
    local r = { length = L }
    r.async_null = async_run({ p }, nil, math.floor(CFG.pipe_n / 20), CFG.pipe_n, CFG.pipe_bound, 1)
    p:close()
    res[#res + 1] = r
  end
  stop_workers(w)
  R.pipeline = res
  local lo, hi
  for _, r in ipairs(res) do
    if r.length >= 2 then
      local t = r.async_null.us_per_op
      if not lo or t < lo.async_null.us_per_op then lo = r end
      if not hi or t > hi.async_null.us_per_op then hi = r end
    end
  end
  if lo then
    row{ workload = ("pipeline 2..%d, slowest (len %d) vs fastest (len %d)"):format(maxl, hi.length, lo.length),
         metric = "us/ev", lecho = hi.async_null.us_per_op, base = "len " .. lo.length,
         base_v = lo.async_null.us_per_op, lower = true, target = { "<=", 1.2 } }
  end
end

-- A name server keeps at most 65536 channels (lecho.registry max_channels),
-- the report channel included: points above 4096 get a name server of their
-- own (scripts/lecho-nameserver), with channels named "host:port/name".
local function own_nameserver()
  local child
  local _, addr = proc.nameserver{
    root = ROOT, luajit = LUAJIT, port_file = tmpdir .. "/ns2-addr",
    -- the bench alone makes every channel: a quota above the table (issue 11)
    args = { "--for", "240", "--quiet", "--channel-quota", "70000" },
    start = function(argv)
      child = spawn(proc.sh_join(argv), "ns2")
      return child
    end,
    timeout = 20, poll = function(dt)
      ctx:run_once(dt)
      return exited(child)
    end }
  assert(addr, "second name server did not start: " .. child_errors(child))
  return child, addr
end

local function channels_point(res, k, prefix)
  local t0 = clock()
  local ps = {}
  for i = 1, k do ps[i] = assert(ctx:channel(prefix .. i):producer()) end
  local r = { channels = k, setup_seconds = clock() - t0 }
  local n = math.max(CFG.chan_n, 2 * k)
  r.async_null = async_run(ps, nil, math.max(k, math.floor(n / 20)), n, CFG.chan_bound, 1)
  for _, p in ipairs(ps) do p:close() end
  res[#res + 1] = r
end

local function w_channels()
  log("channels")
  local subs, big = {}, {}
  for _, k in ipairs(CFG.chans) do
    if k <= 4096 then
      subs[#subs + 1] = { group = "chan" .. k, prefix = ("chan%d_"):format(k), n = k }
    else
      big[#big + 1] = k
    end
  end
  local w = start_workers({ { id = "chan", subs = subs } }, 120)
  local res = {}
  for _, s in ipairs(subs) do channels_point(res, s.n, s.prefix) end
  stop_workers(w)
  for _, k in ipairs(big) do
    local ns2, addr = own_nameserver()
    local prefix = ("%s/chanbig%d_"):format(addr, k)
    log("channels: %d on name server %s", k, addr)
    local wb = start_workers({ { id = "chanbig" .. k, subs = { { group = "chanbig" .. k, prefix = prefix, n = k } } } }, 150)
    channels_point(res, k, prefix)
    stop_workers(wb)
    kill(ns2)
  end
  R.channels = res
  local one = res[1].async_null.ops_per_s
  for _, r in ipairs(res) do
    if r.channels == 4096 or (r.channels > 1 and r.channels == CFG.chans[#CFG.chans]) then
      row{ workload = ("%d channels round-robin, events/s"):format(r.channels), metric = "ev/s",
           lecho = r.async_null.ops_per_s, base = "1 channel", base_v = one,
           target = r.channels == 4096 and { ">=", 0.9 } or nil,
           truncated = r.async_null.truncated }
    end
  end
end

local function w_bulk()
  log("bulk transfer")
  local w = start_workers{ { id = "bulk", subs = { { group = "bulk", channels = { "bulk" } } } } }
  local p = assert(ctx:channel("bulk"):producer())
  local chunk = ("0123456789abcdef"):rep(10 * 1024 * 1024 / 16)
  local es = esize(chunk)
  local r = { chunk = #chunk, encoded = es }
  r.lecho = async_run({ p }, chunk, 2, CFG.bulk_n, CFG.bulk_bound, 1)
  r.lecho.mb_per_s = r.lecho.ops_per_s * #chunk / 1e6
  r.tcp = run_c("baseline_tcp", ("bulk %d %d"):format(es, CFG.bulk_n))
  r.zmq = run_c("baseline_zmq", ("bulk %d %d"):format(es, CFG.bulk_n))
  p:close()
  stop_workers(w)
  R.bulk = r
  row{ workload = ("bulk %d x 10 MiB, MB/s"):format(CFG.bulk_n), metric = "MB/s",
       lecho = r.lecho.mb_per_s, base = "tcp", base_v = r.tcp.mb_per_s, target = { ">=", 0.9 },
       truncated = r.lecho.truncated }
  row{ workload = "", metric = "MB/s", lecho = r.lecho.mb_per_s, base = "zmq", base_v = r.zmq.mb_per_s }
end

local function w_null()
  log("null call (Lua and C API)")
  local w = start_workers{ { id = "null", subs = { { group = "null", channels = { "null" } } } } }
  local p = assert(ctx:channel("null"):producer())
  local r = { size = esize(nil) }
  r.lua = sync_rtt(p, nil, math.floor(CFG.null_n / 10), CFG.null_n, CFG.lat_bound)
  p:close()
  stop_workers(w)
  r.c = run_c("lecho_c", ("pingpong 0 %d"):format(CFG.null_n))
  r.tcp = run_c("baseline_tcp", ("pingpong %d %d"):format(r.size, CFG.null_n))
  r.zmq = run_c("baseline_zmq", ("pingpong %d %d"):format(r.size, CFG.null_n))
  r.c_stream = run_c("lecho_c", ("stream 64 %d"):format(CFG.c_stream_n))
  R.null_call = r
  row{ workload = "null sync round trip, Lua API", metric = "us/rt", lecho = r.lua.us_per_op,
       base = "tcp", base_v = r.tcp.us_per_op, lower = true, target = { "<=", 1.25 },
       truncated = r.lua.truncated }
  row{ workload = "null sync round trip, C API", metric = "us/rt", lecho = r.c.us_per_op,
       base = "tcp", base_v = r.tcp.us_per_op, lower = true, target = { "<=", 1.25 } }
  row{ workload = "", metric = "us/rt", lecho = r.lua.us_per_op, base = "zmq",
       base_v = r.zmq.us_per_op, lower = true }
  local zs = R.throughput and R.throughput[1] and R.throughput[1].zmq
  if zs and zs.ops_per_s then
    row{ workload = "async 64 B events/s, C API", metric = "ev/s", lecho = r.c_stream.ops_per_s,
         base = "zmq", base_v = zs.ops_per_s }
  end
end

-- Modulator costs (issue: install, params update, per-event filter), each as
-- a ratio to the plain sync round trip bench/modulator_bench.lua measures in
-- the same run.
local function w_modulators()
  log("modulators (install, params update, trivial filter)")
  local f = io.popen(("%s %s/modulator_bench.lua --json %s/modulators.json %s 2>&1")
    :format(LUAJIT, BENCH, sh_quote(RESULTS), QUICK and "--quick" or ""))
  local out = f:read("*a")
  f:close()
  local s = common.read(RESULTS .. "/modulators.json")
  local v = s and cjson.decode(s)
  if not v or not v.rt_plain then error("modulator_bench failed: " .. out) end
  R.modulators = v
  row{ workload = "modulator install", metric = "us", lecho = v.install, base = "sync rt",
       base_v = v.rt_plain, lower = true }
  row{ workload = "modulator params update", metric = "us", lecho = v.params, base = "sync rt",
       base_v = v.rt_plain, lower = true }
  row{ workload = "sync round trip through a trivial filter", metric = "us/rt", lecho = v.rt_filter,
       base = "plain", base_v = v.rt_plain, lower = true }
  if v.async_filter and v.async_plain then
    row{ workload = "async event through a trivial filter", metric = "us/ev", lecho = v.async_filter,
         base = "plain", base_v = v.async_plain, lower = true }
  end
end

-- The cost of keyed mode (authenticated, encrypted records) in the C API:
-- the same bench/lecho_c runs plain and with --keyed, interleaved
-- (plain, keyed, then keyed, plain, ...: a drift of the machine's load hits
-- both), CFG.keyed_reps times.  Each row gives the medians, the ratio of the
-- medians, and in `extra` the spread of the per-repetition ratios.
-- Runs `args` plain and keyed CFG.keyed_reps times, interleaved
-- (common.interleave); returns { plain = run, keyed = run (the runs of
-- median `field`), plain_median, keyed_median, ratios = {...}, runs = every
-- repetition }.
local function keyed_pair(args, field)
  local iv = common.interleave{
    reps = CFG.keyed_reps, value = function(r) return r[field] end,
    runs = { { "plain", function() return run_c("lecho_c", args) end },
             { "keyed", function() return run_c("lecho_c", "--keyed " .. args) end } },
    ratios = { { "keyed", "plain" } } }
  local out = { ratios = iv.ratios["keyed/plain"].all, runs = iv.runs }
  for _, mode in ipairs{ "plain", "keyed" } do
    local m = iv.median[mode]
    out[mode .. "_median"] = m
    for _, r in ipairs(iv.runs[mode]) do if r[field] == m or not out[mode] then out[mode] = r end end
  end
  return out
end

local function spread(ratios)
  local lo, hi = common.spread(ratios)
  return ("%d interleaved runs each, ratios %.2f-%.2fx"):format(#ratios, lo, hi)
end

local function w_keyed()
  log("keyed (encrypted) vs plain, C API, %d interleaved repetitions", CFG.keyed_reps)
  local r = { stream = {} }
  r.pingpong = keyed_pair(("pingpong 0 %d"):format(CFG.keyed_pp_n), "us_per_op")
  row{ workload = "null sync round trip, keyed, C API", metric = "us/rt",
       lecho = r.pingpong.keyed_median, base = "plain", base_v = r.pingpong.plain_median,
       lower = true, extra = spread(r.pingpong.ratios) }
  for i, t in ipairs(CFG.keyed_stream) do
    local size, n = t[1], t[2]
    local s = keyed_pair(("stream %d %d"):format(size, n), "mb_per_s")
    s.size = size
    r.stream[i] = s
    row{ workload = ("async %d B events, keyed, C API, MB/s"):format(size), metric = "MB/s",
         lecho = s.keyed_median, base = "plain", base_v = s.plain_median, extra = spread(s.ratios) }
  end
  R.keyed = r
end

-- Services and calls (issue 12 point 8): bench/call_bench.lua, its own
-- processes.  Every figure there is the median of interleaved repetitions
-- (common.interleave), the ratio column the median of the per-repetition
-- ratios, their spread in `extra`; calls.json keeps every repetition.
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
  local q = QUICK and ", QUICK" or ""
  row{ workload = "null call round trip, ctx:call (Lua API)", metric = "us/rt", lecho = n.median.lecho,
       base = "tcp", base_v = n.median.tcp, ratio = n.ratios["lecho/tcp"].median, lower = true,
       target = { "<=", 1.25 }, extra = common.spread_text(n.ratios["lecho/tcp"], v.null.reps) .. q }
  row{ workload = "", metric = "us/rt", lecho = n.median.lecho, base = "zmq REQ/REP", base_v = n.median.zmq,
       ratio = n.ratios["lecho/zmq"].median, lower = true,
       extra = common.spread_text(n.ratios["lecho/zmq"], v.null.reps) .. q }
  for _, iv in ipairs(v.inflight) do
    row{ workload = ("calls/s, %d in flight (ctx:call_async)"):format(iv.inflight), metric = "calls/s",
         lecho = iv.median.lecho, base = "zmq DEALER/ROUTER", base_v = iv.median.zmq,
         ratio = iv.ratios["lecho/zmq"].median, extra = common.spread_text(iv.ratios["lecho/zmq"], iv.reps) .. q }
  end
  local fo = v.failover
  if fo and fo.median_ms then
    row{ workload = "failover: replica SIGKILLed to the first call through the other", metric = "ms",
         lecho = fo.median_ms, base = "null call rt", base_v = n.median.lecho and n.median.lecho / 1e3,
         lower = true, extra = ("median of %d, %.1f-%.1f ms"):format(#fo.reps, fo.lo_ms, fo.hi_ms) .. q }
  elseif fo then
    error("call_bench failover: " .. tostring(fo.error))
  end
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
  row{ workload = "async 100 B events/s beside an attacker", metric = "ev/s", lecho = v.attacked,
       base = "no attacker", base_v = v.clean,
       extra = ("%d interleaved runs each, ratios %.2f-%.2fx, %d lost"):format(v.reps, v.ratio_lo,
                                                                           v.ratio_hi, v.lost) }
end

-- The modulators' pattern functions (core/lpat.c) against LuaJIT's own,
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
         base_v = c.luajit_us, lower = true, target = { "<=", 2 },
         extra = ("%d interleaved reps, ratios %.2f-%.2fx"):format(c.reps, c.ratio_lo, c.ratio_hi) }
  end
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
  local q = QUICK and ", QUICK" or ""
  for _, pl in ipairs{ "null", "composite" } do
    local iv, ds = v.fanout[pl], {}
    for name in pairs(iv.ratios) do ds[#ds + 1] = tonumber(name:match("^d(%d+)/")) end
    table.sort(ds)
    for _, d in ipairs(ds) do
      local r = iv.ratios[("d%d/d1"):format(d)]
      row{ workload = ("fan-out to %d contexts, async %s, producer CPU/event/destination"):format(d, pl),
           metric = "us/ev/dest", lecho = iv.median["d" .. d], base = "1 dest", base_v = iv.median.d1,
           ratio = r.median, lower = true, extra = common.spread_text(r, v.reps) .. q }
    end
    local top = ds[#ds]
    row{ workload = ("fan-out to %d contexts, async %s, time/event at the consumers"):format(top, pl),
         metric = "us/ev", lecho = iv.consumer_us["d" .. top], base = "1 dest", base_v = iv.consumer_us.d1,
         lower = true, extra = ("medians of %d interleaved reps%s"):format(v.reps, q) }
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

------------------------------------------------------------------------------

local WORKLOADS = {
  { "codec", w_codec }, { "latency", w_latency }, { "throughput", w_throughput },
  { "sinks", w_sinks }, { "pipeline", w_pipeline }, { "channels", w_channels },
  { "bulk", w_bulk }, { "null_call", w_null }, { "calls", w_calls }, { "modulators", w_modulators },
  { "keyed", w_keyed }, { "attacked", w_attacked }, { "patterns", w_patterns }, { "scale", w_scale },
}

local function main()
  os.execute("mkdir -p " .. sh_quote(RESULTS))
  log("lecho benchmark suite%s; name server %s", QUICK and " (QUICK)" or "", ctx.addr)
  local failed = {}
  for _, w in ipairs(WORKLOADS) do
    if enabled(w[1]) then
      local ok, err = xpcall(w[2], debug.traceback)
      if not ok then
        failed[#failed + 1] = w[1]
        io.stderr:write(("bench: workload %s failed: %s\n"):format(w[1], err))
        R[w[1]] = R[w[1]] or { error = tostring(err) }
        kill_all()
      end
    end
  end
  report.finish_rows(ROWS)
  print()
  if R.codec and R.codec.table then print(R.codec.table) print() end
  local tbl = report.print_table(ROWS)
  local uname = io.popen("uname -srm"):read("*l")
  local doc = {
    meta = {
      date = os.date("!%Y-%m-%dT%H:%M:%SZ"), quick = QUICK, machine = uname,
      load_before = MACHINE_BEFORE, load_after = common.machine(),
      cores = tonumber(io.popen("nproc"):read("*l")), luajit = jit.version,
      lecho = lecho._VERSION, seconds = clock() - SUITE_T0,
      note = "baselines run with lecho's encoded value size as message size",
    },
    workloads = R, rows = ROWS, table = tbl, failed = failed,
  }
  common.write(RESULTS .. "/results.json", cjson.encode(doc) .. "\n")
  common.write(RESULTS .. "/table.md", tbl .. "\n")
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
