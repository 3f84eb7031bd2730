-- bench/rt_bench.lua: the bulk transfer and the sync null round trip
-- (issue 13), each against raw TCP, as interleaved repetitions.
--
--   luajit bench/rt_bench.lua [--quick] [--json FILE] [bulk] [null]
--
-- Processes on 127.0.0.1: this process (producer and name server) and one
-- bench/worker.lua consumer; bench/baseline_tcp forks its own pair.  Every
-- figure is the median of interleaved repetitions (common.interleave:
-- lecho and raw TCP alternated, the order rotated per repetition) with the
-- spread of the per-repetition ratios, and the load average before and
-- after; every repetition is kept in the JSON.
--   bulk   100 (QUICK: 10) values of 10 MiB, async, MB/s, vs baseline_tcp bulk
--   null   submit_sync(nil), one at a time, us per round trip, vs
--          baseline_tcp pingpong of the same frame size; and the C API's
--          (bench/lecho_c pingpong, its own two processes) in the same rotation
-- Every run is bounded in count and in time.

local dir = (arg and arg[0] or ""):match("^(.*)/[^/]*$") or "."
package.path = dir .. "/?.lua;" .. dir .. "/../?.lua;" .. package.path

local USAGE = [[
usage: luajit bench/rt_bench.lua [--quick] [--json FILE] [bulk] [null]

The bulk (100 x 10 MiB) and sync null round trip figures against raw TCP,
as the median of interleaved repetitions with their spread.  --quick (or
QUICK=1): small counts, 3 repetitions.  REPS=n overrides the repetitions.
]]

local argv, which = {}, {}
for _, a in ipairs(arg or {}) do
  if a == "bulk" or a == "null" then which[a] = true else argv[#argv + 1] = a end
end
argv[0] = arg and arg[0]
if not next(which) then which = { bulk = true, null = true } end

local lecho = require "lecho"
local cjson = require "cjson"
local common = require "common"
local proc = require "spec.support.proc"

local A = common.args(argv, USAGE)
local QUICK = A.quick
local ROOT = os.getenv("LECHO_ROOT") or (dir .. "/..")
local BENCH = ROOT .. "/bench"
local LUAJIT = os.getenv("LUAJIT") or "luajit"
local clock = common.clock

local CFG = QUICK and { reps = 3, bulk_n = 10, null_n = 2000, bound = 10 }
  or { reps = 5, bulk_n = 100, null_n = 20000, bound = 30 }
CFG.reps = tonumber(os.getenv("REPS")) or CFG.reps

local tmp = proc.tmpdir("lecho-rtbench")
local kids = proc.group(tmp)
local MYPID = common.getpid()
local worker_pid = {}   -- worker id -> its pid (from its ready report)
local ctx = lecho.context{ quiet = true, timeout = 20 }
local ready, reports = {}, {}
local report_con = assert(ctx:channel("report"):consumer(function(ev)
  if type(ev) ~= "table" then return end
  if ev.ready then ready[ev.id] = ev else reports[#reports + 1] = ev end
end))

local function run_until(pred, bound) return common.run_until(ctx, pred, bound) end

local function start_worker(o)
  o.ns, o.parent, o.bound = ctx.addr, MYPID, 600
  local child = kids:spawn(("%s %s/worker.lua %s"):format(LUAJIT, BENCH, proc.sh_quote(cjson.encode(o))), o.id)
  if not run_until(function() return ready[o.id] or proc.exit_code(child) end, 60) or not ready[o.id] then
    error("worker not ready: " .. proc.errors(child, 2000))
  end
  worker_pid[o.id] = ready[o.id].pid
  return child
end

local json_line = common.json_line

-- A baseline run in the background while this context's loop is served.
-- With the CPU time of both its processes (/usr/bin/time: user + system of
-- the baseline and the child it waited for), in cpu_s.
local function run_c(bin, args)
  local child = kids:spawn(("/usr/bin/time -f 'cpu %%U %%S' timeout -k 5 90 %s/%s %s"):format(BENCH, bin, args), "base")
  local done = proc.wait(child, 100, function(dt) ctx:run_once(dt) end)
  if not done then proc.kill(child, "KILL") end
  local out = proc.output(child) .. proc.errors(child)
  local v = json_line(out)
  if not v then return nil, bin .. " " .. args .. ": " .. out:sub(1, 500) end
  local u, sy = out:match("cpu ([%d.]+) ([%d.]+)")
  v.cpu_s = u and tonumber(u) + tonumber(sy)
  return v
end

local SYNC = { timeout = 10 }
local phase = 0
local function control(p, op)
  phase = phase + 1
  assert(p:submit_sync({ bench_ctl = op, phase = phase }, { timeout = 30 }))
  return phase
end

-- CPU seconds (user + system) of process pid so far.
local TICK = tonumber((io.popen("getconf CLK_TCK"):read("*l"))) or 100
local function cpu_of(pid)
  local st = common.read("/proc/" .. pid .. "/stat")
  local rest = st and st:match("%) (.*)$")
  if not rest then return 0 end
  local f = {}
  for x in rest:gmatch("%S+") do f[#f + 1] = x end
  return (tonumber(f[12]) + tonumber(f[13])) / TICK   -- utime, stime (fields 14, 15)
end
local MY_CPU = function() return cpu_of(MYPID) end

local function bulk_lecho(p, chunk)
  for _ = 1, 2 do assert(p:submit(chunk)) end
  control(p, "reset")
  local wpid = worker_pid.bulk
  local c0, w0 = MY_CPU(), cpu_of(wpid)
  local t0 = clock()
  local deadline = t0 + CFG.bound
  local sent = 0
  for i = 1, CFG.bulk_n do
    assert(p:submit(chunk))
    sent = i
    if clock() > deadline then break end
  end
  ctx:flush()
  local ph = control(p, "end")
  local got
  run_until(function()
    for _, r in ipairs(reports) do if r.phase == ph then got = r end end
    return got
  end, CFG.bound + 10)
  if not got or got.count < 1 then error("no report from the consumer") end
  local secs = got.t_last - t0
  local cs, cr = MY_CPU() - c0, cpu_of(wpid) - w0
  return { n = sent, received = got.count, seconds = secs, mb_per_s = got.count * #chunk / 1e6 / secs,
           send_cpu_s = cs, recv_cpu_s = cr, cpu_s = cs + cr }
end

local function null_lecho(p)
  for _ = 1, math.floor(CFG.null_n / 10) do assert(p:submit_sync(nil, SYNC)) end
  local wpid = worker_pid.null
  local c0, w0 = MY_CPU(), cpu_of(wpid)
  local t0 = clock()
  local deadline = t0 + CFG.bound
  local n = 0
  for i = 1, CFG.null_n do
    assert(p:submit_sync(nil, SYNC))
    n = i
    if i % 256 == 0 and clock() > deadline then break end
  end
  local secs = clock() - t0
  local cs, cr = MY_CPU() - c0, cpu_of(wpid) - w0
  return { n = n, seconds = secs, us_per_op = secs * 1e6 / n, send_cpu_s = cs, recv_cpu_s = cr, cpu_s = cs + cr }
end

local out = { machine_before = common.machine() }
local function summary(name, iv, key, unit)
  local r = iv.ratios[key]
  io.write(("%-6s lecho %.2f tcp %.2f %s; ratio %s median %.3f (%s)\n"):format(
    name, iv.median.lecho or -1, iv.median.tcp or -1, unit, key, r.median or -1, common.spread_text(r, iv.reps)))
  local cl, ct, cr = {}, {}, {}
  for k = 1, iv.reps do
    local a, b = iv.runs.lecho[k], iv.runs.tcp[k]
    io.write(("   rep %d: lecho %s tcp %s  cpu lecho %s (send %s recv %s) tcp %s\n"):format(k,
      tostring(iv.values.lecho[k]), tostring(iv.values.tcp[k]), tostring(a.cpu_s), tostring(a.send_cpu_s),
      tostring(a.recv_cpu_s), tostring(b.cpu_s)))
    if a.cpu_s and b.cpu_s then
      local na, nb = a.n or 1, b.n or 1
      cl[#cl + 1], ct[#ct + 1] = a.cpu_s / na, b.cpu_s / nb
      cr[#cr + 1] = (a.cpu_s / na) / (b.cpu_s / nb)
    end
  end
  if #cr > 0 then
    local lo, hi = common.spread(cr)
    io.write(("   cpu per op: lecho %.1f us, tcp %.1f us; ratio median %.3f (%.2f-%.2fx)\n"):format(
      common.median(cl) * 1e6, common.median(ct) * 1e6, common.median(cr), lo, hi))
  end
end

local ok, err = xpcall(function()
  if which.bulk then
    start_worker{ id = "bulk", subs = { { group = "bulk", channels = { "bulk" } } } }
    local p = assert(ctx:channel("bulk"):producer())
    local chunk = ("0123456789abcdef"):rep(10 * 1024 * 1024 / 16)
    local es = #assert(lecho.encode(chunk))
    out.bulk = common.interleave{
      reps = CFG.reps,
      runs = { { "lecho", function() return bulk_lecho(p, chunk) end },
               { "tcp", function() return run_c("baseline_tcp", ("bulk %d %d"):format(es, CFG.bulk_n)) end } },
      value = function(r) return r.mb_per_s end,
      ratios = { { "lecho", "tcp" } },
    }
    summary("bulk", out.bulk, "lecho/tcp", "MB/s")
    p:close()
  end
  if which.null then
    start_worker{ id = "null", subs = { { group = "null", channels = { "null" } } } }
    local p = assert(ctx:channel("null"):producer())
    local size = #assert(lecho.encode(nil))
    out.null = common.interleave{
      reps = CFG.reps,
      runs = { { "lecho", function() return null_lecho(p) end },
               { "tcp", function() return run_c("baseline_tcp", ("pingpong %d %d"):format(size, CFG.null_n)) end },
               { "lecho_c", function() return run_c("lecho_c", ("pingpong 0 %d"):format(CFG.null_n)) end } },
      ratios = { { "lecho", "tcp" }, { "lecho_c", "tcp" } },
    }
    summary("null", out.null, "lecho/tcp", "us/rt")
    local rc = out.null.ratios["lecho_c/tcp"]
    io.write(("null   C API (bench/lecho_c) %.2f us/rt; ratio lecho_c/tcp median %.3f (%s)\n"):format(
      out.null.median.lecho_c or -1, rc.median or -1, common.spread_text(rc, out.null.reps)))
    p:close()
  end
end, debug.traceback)
out.machine_after = common.machine()
io.write(("load before %.2f after %.2f\n"):format(out.machine_before.load1 or -1, out.machine_after.load1 or -1))
kids:kill_all()
report_con:close()
ctx:close()
if A.json then proc.write(A.json, cjson.encode(out)) end
if not ok then io.stderr:write(err, "\n") os.exit(1) end
