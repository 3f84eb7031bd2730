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
--               recorder attached vs without (target >= 0.9x)
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
local CFG = QUICK and { reps = 3, n = 20000, size = 1000, late = 20, rtt = 200 }
                   or { reps = 5, n = 100000, size = 1000, late = 50, rtt = 1000 }

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

local function run_flow()
  local t0 = ctx:now()
  for i = 1, CFG.n do
    assert(p:submit({ i = i, pad = payload }))
  end
  assert(p:submit_sync({ last = true }, { timeout = 60 }))
  return CFG.n / (ctx:now() - t0)
end

local recfile = tmp .. "/run.lecho"
-- a process's time on a CPU so far, in ns (/proc/PID/schedstat's first
-- field): the recorder's CPU per event, a figure the load does not skew
-- as much as a rate
local function sched_ns(pid)
  local s = common.read("/proc/" .. pid .. "/schedstat")
  return s and tonumber(s:match("^(%d+)"))
end
local disk = {}
local iv = common.interleave{
  reps = CFG.reps,
  runs = {
    { "plain", function()
      common.run_until(ctx, function() return ndests() == 1 end, 20)
      return { ev_s = run_flow() }
    end },
    { "recorded", function()
      os.remove(recfile)
      local rec = spawn(("%s %s/scripts/lecho record rp.data --out %s --json --nameserver %s")
                        :format(LUAJIT, ROOT, recfile, ns))
      assert(common.run_until(ctx, function() return ndests() == 2 end, 20), "recorder did not join")
      local cpu0, self0, peer0 = sched_ns(rec.pid), sched_ns("self"), sched_ns(peer.pid)
      local before = {}
      for a, s in pairs(ctx:stats().peers) do before[a] = { s.events_out, s.bytes_out } end
      local ev_s = run_flow()
      local wire
      for a, s in pairs(ctx:stats().peers) do
        if a ~= peer_addr and a ~= ns and before[a] and s.events_out > before[a][1] then
          wire = (s.bytes_out - before[a][2]) / (s.events_out - before[a][1])
        end
      end
      local cpu1, self1, peer1 = sched_ns(rec.pid), sched_ns("self"), sched_ns(peer.pid)
      proc.signal(rec.pid, "INT")
      local done = proc.wait(rec, 20, function(dt) ctx:run_once(dt) end)
      assert(done, "recorder did not stop")
      local sum = common.json_line(proc.read(rec.out) or "")
      -- the file less its magic line and header record: the events' bytes
      local scan = require("lecho.recording").scan(recfile)
      local hdr = #require("lecho.recording").MAGIC
      local body = 0
      for _, e in ipairs(scan.events) do body = body + #e.data end
      local per_event = (scan.size - hdr - 8 - 1 - #assert(lecho.encode(scan.header))) / #scan.events
      local function per(a, b) return a and b and (b - a) / 1e3 / (CFG.n + 1) or nil end
      disk[#disk + 1] = { disk = per_event, wire = wire, events = #scan.events, summary = sum,
                          cpu_us = per(cpu0, cpu1), producer_cpu_us = per(self0, self1),
                          consumer_cpu_us = per(peer0, peer1) }
      common.run_until(ctx, function() return ndests() == 1 end, 20)
      return { ev_s = ev_s, disk = per_event, wire = wire }
    end },
  },
  value = function(r) return r.ev_s end,
  ratios = { { "recorded", "plain" } },
}

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
local out = {
  throughput = { median = iv.median, ratio = iv.ratios["recorded/plain"], runs = iv.runs, n = CFG.n, size = CFG.size },
  disk = { per_event = common.median((function() local t = {} for _, d in ipairs(disk) do t[#t + 1] = d.disk end return t end)()),
           wire = common.median((function() local t = {} for _, d in ipairs(disk) do t[#t + 1] = d.wire end return t end)()),
           ratio = common.median(ratios), lo = dlo, hi = dhi, all = ratios, runs = disk,
           recorder_cpu_us = med_of(disk, "cpu_us"), producer_cpu_us = med_of(disk, "producer_cpu_us"),
           consumer_cpu_us = med_of(disk, "consumer_cpu_us") },
  late = { median = late.median, ratio = late.ratios["first_value/rtt"], runs = late.runs,
           join_us = med_of(late.runs.first_value or {}, "join_us") },
}
ctx:close()
kids:kill_all("KILL")
proc.remove(tmp)
-- what the CPU allows: with a core per process the slowest one bounds the
-- flow; on 2 cores shared by the three, their sum over 2
local d = out.disk
if d.recorder_cpu_us and d.producer_cpu_us and d.consumer_cpu_us then
  local p, c, r = d.producer_cpu_us, d.consumer_cpu_us, d.recorder_cpu_us
  -- plain: at most 1 / max(p, c) events a second (two processes, two
  -- cores); recorded: at most min(2 / (p + c + r), 1 / max(p, c, r)); p is
  -- the recorded runs' (two destinations), so these are upper bounds
  d.bound_2cores = math.max(p, c) * math.min(2 / (p + c + r), 1 / math.max(p, c, r))
  d.bound_3cores = math.max(p, c) / math.max(p, c, r)
end
if A.json then
  local f = assert(io.open(A.json, "w"))
  f:write(cjson.encode(out))
  f:close()
end
io.stdout:write(("CPU per event: producer %.2f us, consumer %.2f us, recorder %.2f us: the best recorded/plain "
  .. "with 2 cores %.2fx, with a core each %.2fx\n"):format(d.producer_cpu_us or 0, d.consumer_cpu_us or 0,
  d.recorder_cpu_us or 0, d.bound_2cores or 0, d.bound_3cores or 0))
io.stdout:write(("throughput recorded/plain %.2fx (%s); recorder CPU %.2f us/event; disk/wire bytes per event %.3f (%.1f vs %.1f); "
  .. "late first value %.0f us vs sync rtt %.0f us (%.2fx), its join %.0f us\n"):format(
  out.throughput.ratio.median or 0, common.spread_text(out.throughput.ratio, CFG.reps), out.disk.recorder_cpu_us or 0,
  out.disk.ratio or 0,
  out.disk.per_event or 0, out.disk.wire or 0, late.median.first_value or 0, late.median.rtt or 0,
  out.late.ratio.median or 0, out.late.join_us or 0))
