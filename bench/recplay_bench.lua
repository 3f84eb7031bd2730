-- bench/recplay_bench.lua: what recording and history cost (issue 29).
--
--   luajit bench/recplay_bench.lua [--quick] [--json FILE]
--
-- Processes on 127.0.0.1: a name server, a consumer (counts events), a
-- recorder (`scripts/lecho record`, started for the "recorded" runs only),
-- a history producer, all started here and killed at the end; this process
-- produces and joins.  Figures (each the median of interleaved repetitions,
-- common.interleave, with the spread of the per-repetition ratios):
--   throughput  async events of 1000 B per second, then one submit_sync
--               that returns once every consumer handled them all: with a
--               recorder attached vs without (target >= 0.9x); each run a
--               warm-up flow then the measured one (bench/README.md says
--               why), with every process's CPU per event beside the rate;
--               the recording is checked whole after each recorded run
--   disk        the recording's bytes per event (its file, less the
--               header) vs the wire bytes per event toward the recorder
--               (the producer's peer counters: frame headers included)
--               (target within 5%)
--   late        a late joiner's time to its first value (history "last"),
--               from its join's answer to the value, vs a sync round trip
--               between the same two processes (target <= 2x)

local dir = (arg and arg[0] or ""):match("^(.*)/[^/]*$") or "."
package.path = dir .. "/?.lua;" .. dir .. "/../?.lua;" .. package.path

local USAGE = [[
usage: luajit bench/recplay_bench.lua [--quick] [--json FILE]

Recording and history (issue 29): producer throughput with a recorder
attached vs without, the recording's bytes per event vs the wire's, a late
joiner's time to first value vs a sync round trip.
]]

local lecho = require "lecho"
local cjson = require "cjson"
local common = require "common"
local proc = require "spec.support.proc"
local history = require "lecho.history"

local A = common.args(arg, USAGE)
local QUICK = A.quick
local ROOT = os.getenv("LECHO_ROOT") or (dir .. "/..")
local LUAJIT = os.getenv("LUAJIT") or "luajit"
-- n: events of the measured flow; warm: events of the flow before it in
-- every run (see run_flow); reps: interleaved repetitions of each kind.
-- RECPLAY_N, RECPLAY_WARM, RECPLAY_REPS override them (spec/recplay_bench_spec.lua
-- runs it small).
local CFG = QUICK and { reps = 3, n = 40000, warm = 8000, size = 1000, late = 20, rtt = 200 }
                   or { reps = 7, n = 100000, warm = 20000, size = 1000, late = 50, rtt = 1000 }
CFG.n = tonumber(os.getenv("RECPLAY_N") or "") or CFG.n
CFG.warm = tonumber(os.getenv("RECPLAY_WARM") or "") or CFG.warm
CFG.reps = tonumber(os.getenv("RECPLAY_REPS") or "") or CFG.reps

local tmp = proc.tmpdir("lecho-recplay")
local kids = proc.group(tmp)
local function spawn(cmd) return kids:spawn(cmd) end

local ns_child, ns = proc.nameserver{ root = ROOT, luajit = LUAJIT, port_file = tmp .. "/ns", args = { "--quiet", "--settle", "0", "--for", "900" },
                                      start = function(argv) return spawn(proc.sh_join(argv)) end }
assert(ns, "name server did not start")

-- a consumer of `ch` and `rtt` (sync round trips answered at once), and a
-- producer of `hist` that keeps its last value
local PEER = [[
local lecho = require "lecho"
local ns, parent = arg[1], tonumber(arg[2])
local proc = require "spec.support.proc"
local ctx = lecho.context{ nameserver = ns, quiet = true }
local n = 0
assert(ctx:channel("rp.data"):consumer(function() n = n + 1 end))
assert(ctx:channel("rp.rtt"):consumer(function() end))
local p = assert(ctx:channel("rp.hist"):producer{ history = "last" })
assert(p:submit({ state = "current", pad = ("s"):rep(100) }))
io.stdout:write("ready ", ctx.addr, "\n") io.stdout:flush()
ctx:every(0.2, function() if not proc.alive(parent) then ctx:stop() end end)
ctx:after(900, function() ctx:stop() end)
ctx:run()
ctx:close()
]]
local peer_file = proc.write(tmp .. "/peer.lua", PEER)
-- the control: a second plain consumer of `ch` (in its own process, as the
-- recorder), started for the "second" runs only, ended by SIGINT (ctx:run
-- closes the context)
local SECOND = [[
local lecho = require "lecho"
local ns, parent = arg[1], tonumber(arg[2])
local proc = require "spec.support.proc"
local ctx = lecho.context{ nameserver = ns, quiet = true }
local n = 0
assert(ctx:channel("rp.data"):consumer(function() n = n + 1 end))
io.stdout:write("ready ", ctx.addr, "\n") io.stdout:flush()
ctx:every(0.2, function() if not proc.alive(parent) then ctx:stop() end end)
ctx:after(900, function() ctx:stop() end)
ctx:run()
]]
local second_file = proc.write(tmp .. "/second.lua", SECOND)
local peer = spawn(("%s %s %s %d"):format(LUAJIT, peer_file, ns, common.getpid()))
local line = proc.wait_file(peer.out, "ready", 30)
assert(line, "peer did not start")
local peer_addr = line:match("ready (%S+)")

local ctx = lecho.context{ nameserver = ns, quiet = true }
local data = ctx:channel("rp.data")
local p = assert(data:producer())
local payload = ("x"):rep(CFG.size)

-- dests of rp.data in this context's stats
local function ndests()
  local s = ctx:stats().channels[data.name]
  return s and s.destinations or 0
end

-- A process's time on a CPU so far, in ns (/proc/PID/schedstat's first
-- field, exact, not sampled): CPU per event, a figure the load does not
-- skew as much as a rate.
local function sched_ns(pid)
  local s = common.read("/proc/" .. pid .. "/schedstat")
  return s and tonumber(s:match("^(%d+)"))
end

-- One flow: n async events, then one submit_sync that returns once every
-- consumer (the recorder too: it acknowledges from C) handled them all.
-- Returns events a second over the whole flow (its end included: what is
-- still queued when the submit loop ends is drained before the sync
-- returns), events a second of the submit loop alone, and the CPU each
-- process spent per event meanwhile (us; rec: the recorder's pid or nil).
local seq = 0
local function run_flow(n, rec)
  local p0, c0, r0 = sched_ns("self"), sched_ns(peer.pid), rec and rec.sched()
  local t0 = ctx:now()
  for i = 1, n do
    assert(p:submit({ i = i, pad = payload }))
  end
  local t_loop = ctx:now() - t0
  assert(p:submit_sync({ last = true }, { timeout = 60 }))
  local dt = ctx:now() - t0
  local p1, c1, r1 = sched_ns("self"), sched_ns(peer.pid), rec and rec.sched()
  seq = seq + n + 1
  local function per(x, y) return x and y and (y - x) / 1e3 / (n + 1) or nil end
  return { ev_s = n / dt, loop_ev_s = n / t_loop, producer_cpu_us = per(p0, p1), consumer_cpu_us = per(c0, c1),
           recorder_cpu_us = per(r0, r1) }
end
-- The CPU of a process (a recorder, a second consumer) for run_flow.
local function of_pid(pid) return { pid = pid, sched = function() return sched_ns(pid) end } end
-- The CPU of this process's threads but the main one (the in-process
-- recorder's writer thread), listed once before the flow (no fork in it).
local function other_threads()
  local me = common.getpid()
  local f = io.popen("ls /proc/" .. me .. "/task")
  local tids = {}
  for t in f:read("*a"):gmatch("%d+") do if tonumber(t) ~= me then tids[#tids + 1] = t end end
  f:close()
  return { sched = function()
    local sum = 0
    for _, t in ipairs(tids) do sum = sum + (sched_ns(me .. "/task/" .. t) or 0) end
    return sum
  end }
end

-- The steady flow measured in every kind of run: the same workload, the same
-- preparation.  A first flow of CFG.warm events (not measured) brings the
-- run to its steady state: the recorder (or second consumer) has joined,
-- connected, compiled its paths and caught up (the sync of that flow
-- returned only once it had handled everything), and the producer's
-- queues and buffers have grown to their size.  Then the measured flow of
-- CFG.n events.
local function measured(rec)
  local warm = run_flow(CFG.warm, rec)
  local r = run_flow(CFG.n, rec)
  r.warm_ev_s = warm.ev_s
  return r
end

-- The process's first flows pay for LuaJIT compiling the paths and the
-- heap growing to the queues' size (5-8 us of producer CPU per event
-- instead of ~1): the first run of the first repetition was the slowest of
-- all, by up to 5x, and the ratio of that repetition with it.  Both paths
-- run once before anything is measured.
common.run_until(ctx, function() return ndests() == 1 end, 20)
local PREWARM = CFG.warm * 2
run_flow(PREWARM)

local recfile = tmp .. "/run.lecho"
local recording = require "lecho.recording"
local function start_recorder()
  os.remove(recfile)
  local rec = spawn(("%s %s/scripts/lecho record rp.data --out %s --json --nameserver %s")
                    :format(LUAJIT, ROOT, recfile, ns))
  assert(common.run_until(ctx, function() return ndests() == 2 end, 20), "recorder did not join")
  rec.sched = function() return sched_ns(rec.pid) end
  return rec, seq
end
-- Reads a recording back: every event sent since seq0 must be in it, in
-- order, none lost (a faster recorder must still count every event);
-- returns the file's figures.
local function check_file(path, sum, seq0)
  local scan = assert(recording.scan(path))
  assert(not scan.torn, "the recording has a torn tail after a clean stop")
  local want = seq - seq0
  assert(#scan.events == want, ("the recorder wrote %d events of %d"):format(#scan.events, want))
  for k = 1, #scan.events do   -- (an index of FFI structs: no ipairs)
    local e = scan.events[k]
    assert(e.seq == seq0 + k, ("event %d of the recording has seq %d, not %d"):format(k, e.seq, seq0 + k))
  end
  assert(not sum or sum.events == want, "the recorder's summary counts another number of events")
  -- the file less its magic line and header record: the events' bytes
  local per_event = (scan.size - #recording.MAGIC - 8 - 1 - #assert(lecho.encode(scan.header))) / #scan.events
  return { events = #scan.events, disk = per_event, summary = sum }
end
-- Stops the recorder process and reads its file.
local function stop_recorder(rec, seq0)
  proc.signal(rec.pid, "INT")
  local done = proc.wait(rec, 20, function(dt) ctx:run_once(dt) end)
  assert(done, "recorder did not stop")
  return check_file(recfile, common.json_line(proc.read(rec.out) or ""), seq0)
end

-- The wire bytes per event toward the consumer (frame headers included),
-- from the producer's peer counters: what a recorded event is compared with.
local function peer_counts()
  local s = ctx:stats().peers[peer_addr]
  return s and { s.events_out, s.bytes_out }
end

local disk, inproc_disk = {}, {}
local inproc_file = tmp .. "/inproc.lecho"
local iv = common.interleave{
  reps = CFG.reps,
  runs = {
    { "plain", function()
      common.run_until(ctx, function() return ndests() == 1 end, 20)
      return measured(nil)
    end },
    { "second", function()
      local sc = spawn(("%s %s %s %d"):format(LUAJIT, second_file, ns, common.getpid()))
      assert(common.run_until(ctx, function() return ndests() == 2 end, 20), "the second consumer did not join")
      local r = measured(of_pid(sc.pid))
      proc.signal(sc.pid, "INT")
      assert(proc.wait(sc, 20, function(dt) ctx:run_once(dt) end), "the second consumer did not stop")
      common.run_until(ctx, function() return ndests() == 1 end, 20)
      -- its CPU per event in the recorder's slot of measured()
      r.second_cpu_us, r.recorder_cpu_us = r.recorder_cpu_us, nil
      return r
    end },
    { "recorded", function()
      local rec, seq0 = start_recorder()
      local before = {}
      for a, s in pairs(ctx:stats().peers) do before[a] = { s.events_out, s.bytes_out } end
      local r = measured(rec)
      local wire
      for a, s in pairs(ctx:stats().peers) do
        if a ~= peer_addr and a ~= ns and before[a] and s.events_out > before[a][1] then
          wire = (s.bytes_out - before[a][2]) / (s.events_out - before[a][1])
        end
      end
      local f = stop_recorder(rec, seq0)
      r.disk, r.wire, r.recorded_events = f.disk, wire, f.events
      disk[#disk + 1] = { disk = f.disk, wire = wire, events = f.events, summary = f.summary,
                          cpu_us = r.recorder_cpu_us, producer_cpu_us = r.producer_cpu_us,
                          consumer_cpu_us = r.consumer_cpu_us }
      common.run_until(ctx, function() return ndests() == 1 end, 20)
      return r
    end },
    -- the recorder in this process (ch:producer{ record = }, p:record):
    -- the producer's thread copies each event into a chunk, a writer
    -- thread checksums and writes them (core/binding/lua_rec.c)
    { "inproc", function()
      common.run_until(ctx, function() return ndests() == 1 end, 20)
      os.remove(inproc_file)
      assert(p:record(inproc_file))
      local seq0 = seq
      local before = peer_counts()
      local r = measured(other_threads())
      local after = peer_counts()
      local st = p.own_rec:stats()
      assert(p:record(nil))
      local f = check_file(inproc_file, nil, seq0)
      r.disk, r.recorded_events = f.disk, f.events
      r.wire = before and after and after[1] > before[1] and (after[2] - before[2]) / (after[1] - before[1]) or nil
      r.writer_blocked = st.blocked
      inproc_disk[#inproc_disk + 1] = { disk = f.disk, wire = r.wire, events = f.events, cpu_us = r.recorder_cpu_us,
                                        producer_cpu_us = r.producer_cpu_us }
      return r
    end },
  },
  value = function(r) return r.ev_s end,
  ratios = { { "recorded", "plain" }, { "second", "plain" }, { "recorded", "second" }, { "inproc", "plain" } },
}
-- The producer's CPU per event, plain over recorded, repetition by
-- repetition: the throughput ratio the producer allows when it is the
-- bottleneck and has a core of its own (it is, here: the consumer and the
-- recorder each take less per event), a figure the load skews less than
-- a rate.
local cpu_ratio = common.ratio(iv, "plain", "recorded", function(r) return r.producer_cpu_us end)
local cpu_ratio_second = common.ratio(iv, "plain", "second", function(r) return r.producer_cpu_us end)
local cpu_ratio_inproc = common.ratio(iv, "plain", "inproc", function(r) return r.producer_cpu_us end)

-- the late joiner: from its join's answer (lecho.history's fetch) to the
-- first value, against a sync round trip to the same process
local rtt_p = assert(ctx:channel("rp.rtt"):producer())
local late = common.interleave{
  reps = CFG.reps,
  runs = {
    { "rtt", function()
      local xs = {}
      for i = 1, CFG.rtt do
        local t0 = ctx:now()
        assert(rtt_p:submit_sync(i))
        xs[#xs + 1] = ctx:now() - t0
      end
      return { us = common.median(xs) * 1e6 }
    end },
    { "first_value", function()
      local xs, js = {}, {}
      for _ = 1, CFG.late do
        local t_first
        local fetch = history.fetch
        local t_join
        history.fetch = function(st, r) t_join = ctx:now() return fetch(st, r) end
        local t_call = ctx:now()
        local c = assert(ctx:channel("rp.hist"):consumer(function(ev, meta)
          if meta.history and not t_first then t_first = ctx:now() end
        end, { history = "last" }))
        history.fetch = fetch
        assert(t_first and t_join, "no history value")
        xs[#xs + 1] = t_first - t_join
        js[#js + 1] = t_join - t_call
        c:close()
      end
      return { us = common.median(xs) * 1e6, join_us = common.median(js) * 1e6 }
    end },
  },
  value = function(r) return r.us end,
  ratios = { { "first_value", "rtt" } },
}

local function med_of(rows, k)
  local t = {}
  for _, d in ipairs(rows) do t[#t + 1] = d[k] end
  return t[1] and common.median(t) or nil
end
local ratios = {}
for _, d in ipairs(disk) do if d.wire then ratios[#ratios + 1] = d.disk / d.wire end end
local dlo, dhi = common.spread(ratios)
local function med_run(name, k) return common.median_of(iv, name, function(r) return r[k] end) end
local cpu = { producer_plain = med_run("plain", "producer_cpu_us"), producer_recorded = med_run("recorded", "producer_cpu_us"),
              consumer_plain = med_run("plain", "consumer_cpu_us"), consumer_recorded = med_run("recorded", "consumer_cpu_us"),
              recorder = med_run("recorded", "recorder_cpu_us"), ratio = cpu_ratio,
              producer_second = med_run("second", "producer_cpu_us"), second = med_run("second", "second_cpu_us"),
              ratio_second = cpu_ratio_second }
local out = {
  throughput = { median = iv.median, ratio = iv.ratios["recorded/plain"], runs = iv.runs, n = CFG.n, warm = CFG.warm,
                 prewarm = PREWARM,
                 size = CFG.size, reps = CFG.reps, cpu = cpu,
                 loop_ev_s = { plain = med_run("plain", "loop_ev_s"), recorded = med_run("recorded", "loop_ev_s"),
                               second = med_run("second", "loop_ev_s") },
                 ratio_second = iv.ratios["second/plain"], ratio_recorded_second = iv.ratios["recorded/second"] },
  disk = { per_event = common.median((function() local t = {} for _, d in ipairs(disk) do t[#t + 1] = d.disk end return t end)()),
           wire = common.median((function() local t = {} for _, d in ipairs(disk) do t[#t + 1] = d.wire end return t end)()),
           ratio = common.median(ratios), lo = dlo, hi = dhi, all = ratios, runs = disk,
           recorder_cpu_us = med_of(disk, "cpu_us"), producer_cpu_us = med_of(disk, "producer_cpu_us"),
           consumer_cpu_us = med_of(disk, "consumer_cpu_us") },
  -- the recorder in this process (its writer thread's CPU: recorder_cpu_us)
  inproc = { ratio = iv.ratios["inproc/plain"], median = iv.median.inproc, plain = iv.median.plain,
             cpu = { producer = med_run("inproc", "producer_cpu_us"), producer_plain = med_run("plain", "producer_cpu_us"),
                     writer = med_run("inproc", "recorder_cpu_us"), consumer = med_run("inproc", "consumer_cpu_us"),
                     ratio = cpu_ratio_inproc },
             loop_ev_s = med_run("inproc", "loop_ev_s"),
             disk = { per_event = med_of(inproc_disk, "disk"), wire = med_of(inproc_disk, "wire"),
                      ratio = (function()
                        local t = {}
                        for _, d in ipairs(inproc_disk) do if d.wire then t[#t + 1] = d.disk / d.wire end end
                        return t[1] and common.median(t) or nil
                      end)(), runs = inproc_disk } },
  late = { median = late.median, ratio = late.ratios["first_value/rtt"], runs = late.runs,
           join_us = med_of(late.runs.first_value or {}, "join_us") },
}
ctx:close()
kids:kill_all("KILL")
proc.remove(tmp)
-- What the CPU allows (medians of the CPU per event, us): a flow of k
-- processes needing x_i us of CPU per event each goes at most at
-- min(1 / max(x_i), cores / sum(x_i)) events a second.  Plain: producer p
-- (one destination) and consumer c; recorded: producer p' (two), consumer
-- c', recorder r.  On this machine's 2 cores the three of the recorded run
-- share them; with a core each only the slowest counts.
local d = out.disk
local function rate(xs, cores)
  local sum, max = 0, 0
  for _, x in ipairs(xs) do sum, max = sum + x, math.max(max, x) end
  return math.min(1 / max, cores / sum)
end
if cpu.producer_plain and cpu.consumer_plain and cpu.producer_recorded and cpu.consumer_recorded and cpu.recorder then
  local plain = { cpu.producer_plain, cpu.consumer_plain }
  local rec = { cpu.producer_recorded, cpu.consumer_recorded, cpu.recorder }
  d.bound_2cores = rate(rec, 2) / rate(plain, 2)
  d.bound_3cores = rate(rec, 3) / rate(plain, 3)
  cpu.bound_2cores, cpu.bound_3cores = d.bound_2cores, d.bound_3cores
end
if A.json then
  local f = assert(io.open(A.json, "w"))
  f:write(cjson.encode(out))
  f:close()
end
io.stdout:write(("CPU per event (medians): producer %.2f us plain, %.2f recorded (plain/recorded %.2fx, %s), "
  .. "%.2f with a second consumer instead (%.2fx); consumer %.2f / %.2f us, recorder %.2f us, second consumer %.2f us: "
  .. "the best recorded/plain with 2 cores %.2fx, with a core each %.2fx\n")
  :format(cpu.producer_plain or 0, cpu.producer_recorded or 0, cpu_ratio.median or 0,
  common.spread_text(cpu_ratio, CFG.reps), cpu.producer_second or 0, cpu_ratio_second.median or 0,
  cpu.consumer_plain or 0, cpu.consumer_recorded or 0, cpu.recorder or 0, cpu.second or 0,
  d.bound_2cores or 0, d.bound_3cores or 0))
do
  local ip = out.inproc
  io.stdout:write(("in-process recorder: throughput inproc/plain %.2fx (%s); producer CPU %.2f us/event vs %.2f plain "
    .. "(plain/inproc %.2fx, %s), writer thread %.2f us/event; disk/wire bytes per event %.3f (%.1f vs %.1f)\n")
    :format(ip.ratio.median or 0, common.spread_text(ip.ratio, CFG.reps), ip.cpu.producer or 0, ip.cpu.producer_plain or 0,
    cpu_ratio_inproc.median or 0, common.spread_text(cpu_ratio_inproc, CFG.reps), ip.cpu.writer or 0,
    ip.disk.ratio or 0, ip.disk.per_event or 0, ip.disk.wire or 0))
end
io.stdout:write(("throughput with a second consumer instead of the recorder / plain %.2fx (%s); recorded / second consumer %.2fx (%s)\n")
  :format(out.throughput.ratio_second.median or 0, common.spread_text(out.throughput.ratio_second, CFG.reps),
  out.throughput.ratio_recorded_second.median or 0, common.spread_text(out.throughput.ratio_recorded_second, CFG.reps)))
io.stdout:write(("throughput recorded/plain %.2fx (%s); recorder CPU %.2f us/event; disk/wire bytes per event %.3f (%.1f vs %.1f); "
  .. "late first value %.0f us vs sync rtt %.0f us (%.2fx), its join %.0f us\n"):format(
  out.throughput.ratio.median or 0, common.spread_text(out.throughput.ratio, CFG.reps), out.disk.recorder_cpu_us or 0,
  out.disk.ratio or 0,
  out.disk.per_event or 0, out.disk.wire or 0, late.median.first_value or 0, late.median.rtt or 0,
  out.late.ratio.median or 0, out.late.join_us or 0))
