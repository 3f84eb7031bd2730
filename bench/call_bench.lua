-- bench/call_bench.lua: what a call costs (issue 12 point 8: the Manta RMI
-- lesson, marshalling must not dominate), against raw TCP and ZeroMQ in the
-- same run.
--
--   luajit bench/call_bench.lua [--quick] [--json FILE]
--
-- Processes on 127.0.0.1: a name server (scripts/lecho-nameserver), this
-- process (the caller) and servers (luajit children serving a service with
-- ctx:service), all started here and killed at the end.  Figures, each the
-- median of interleaved repetitions (common.interleave: lecho and its
-- baselines alternated, the order rotated per repetition) with the spread of
-- the per-repetition ratios; every repetition is kept in the JSON:
--   null      ctx:call("null") round trip (a handler that returns nothing),
--             one call at a time, vs bench/baseline_tcp pingpong and
--             bench/baseline_zmq pingpong (REQ/REP) of the request's size
--   inflight  calls per second with 1, 8, 64 in flight (ctx:call_async),
--             vs baseline_zmq dealer (DEALER/ROUTER) and baseline_tcp reqrep
--             with the same count outstanding
--   failover  two replicas of "fo", A serving version 2 and B version 1;
--             calls with min_version = 1 go to A (the highest); A is killed
--             with SIGKILL, and the time from the kill to the first call
--             answered by B is measured (A restarted between repetitions)
-- Every loop is bounded in count and in time.

local dir = (arg and arg[0] or ""):match("^(.*)/[^/]*$") or "."
package.path = dir .. "/?.lua;" .. dir .. "/../?.lua;" .. package.path

local USAGE = [[
usage: luajit bench/call_bench.lua [--quick] [--json FILE]

The call figures of the benchmark suite (make bench runs it): the null call
round trip vs raw TCP and ZeroMQ REQ/REP, calls per second with 1, 8 and 64
in flight vs ZeroMQ DEALER/ROUTER, failover time between two replicas.
--quick (or QUICK=1): small counts, 3 repetitions instead of 5 (7 for
failover).  --json FILE: the results (every repetition) as JSON.
CALL_BENCH_ONLY=null in the environment: the null call round trip only.
]]

local lecho = require "lecho"
local cjson = require "cjson"
local common = require "common"
local proc = require "spec.support.proc"

local A = common.args(arg, USAGE)
local QUICK = A.quick
local ROOT = os.getenv("LECHO_ROOT") or (dir .. "/..")
local BENCH = ROOT .. "/bench"
local LUAJIT = os.getenv("LUAJIT") or "luajit"

local CFG = QUICK and {
  reps = 3, null_n = 500, null_warm = 50, base_n = 1000,
  inflight = { 1, 8, 64 }, if_n = 1000, fo_reps = 3, limit = 3,
} or {
  reps = 5, null_n = 10000, null_warm = 1000, base_n = 20000,
  inflight = { 1, 8, 64 }, if_n = 30000, fo_reps = 7, limit = 20,
}

-- A server: serves opts.name (version opts.version) with a handler that
-- returns opts.ret (nothing when nil); says "ready"; exits when its parent is
-- gone or after opts.bound seconds.
local SERVER = [[
local cjson = require "cjson"
local lecho = require "lecho"
local proc = require "spec.support.proc"
local o = cjson.decode(arg[1])
local ctx = lecho.context{ nameserver = o.ns, quiet = true }
local ret = o.ret
local s = assert(ctx:service(o.name, ret and function() return ret end or function() end,
                             { version = o.version or 1, concurrency = 256, queue = 4096 }))
io.stdout:write("ready\n") io.stdout:flush()
ctx:every(0.2, function() if not proc.alive(o.parent) then ctx:stop() end end)
ctx:after(o.bound or 300, function() ctx:stop() end)
ctx:run()
s:close()
ctx:close()
]]

local tmp = proc.tmpdir("lecho-callbench")
local kids = proc.group(tmp)
local server_file = proc.write(tmp .. "/server.lua", SERVER)
local MYPID = common.getpid()
local ctx

local clock = common.clock

local function start_server(o)
  o.ns, o.parent, o.bound = o.ns, MYPID, o.bound or 600
  local child = kids:spawn(("cd %s && %s %s %s"):format(proc.sh_quote(ROOT), LUAJIT, server_file,
                                                         proc.sh_quote(cjson.encode(o))), "server")
  local ok = proc.wait_file(child.out, "ready", 30, function(dt)
    ctx:run_once(dt)
    return proc.exit_code(child) ~= nil
  end)
  if not ok then error("server did not start: " .. proc.errors(child, 2000)) end
  return child
end

local json_line = common.json_line

-- A baseline program, in the background while this context's loop is
-- served: blocked in io.popen for the 10 s of a long baseline run, it
-- answered no heartbeat and the server dropped the connection as dead.
local function run_c(bin, args)
  local child = kids:spawn(("timeout -k 5 90 %s/%s %s"):format(BENCH, bin, args), "base")
  local done = proc.wait(child, 100, ctx and function(dt) ctx:run_once(dt) end)
  if not done then proc.kill(child, "KILL") end
  local out = proc.output(child) .. proc.errors(child)
  local v = json_line(out)
  if not v then return nil, bin .. " " .. args .. ": " .. out:sub(1, 500) end
  return v
end

-- true when a call's results are a failure (nil, err, code)
local function failed(n, first) return n >= 2 and first == nil end

--- One call; raises on failure.
local function call(name, args, opts)
  local function check(...)
    if failed(select("#", ...), (...)) then
      local _, err, code = ...
      error(("call %s: %s (%s)"):format(name, tostring(err), tostring(code)), 3)
    end
    return ...
  end
  return check(ctx:call(name, args, opts))
end

------------------------------------------------------------------------------
-- The null call, one at a time

local CALL_OPTS = { timeout = 10 }

local function lecho_null()
  for _ = 1, CFG.null_warm do call("null", nil, CALL_OPTS) end
  local samples, t0, n = {}, clock(), 0
  local deadline = t0 + CFG.limit
  for i = 1, CFG.null_n do
    local a = clock()
    call("null", nil, CALL_OPTS)
    local b = clock()
    samples[i] = b - a
    n = i
    if b > deadline then break end
  end
  local secs = clock() - t0
  table.sort(samples)
  return { n = n, seconds = secs, us_per_op = secs * 1e6 / n,
           p50_us = samples[math.max(1, math.ceil(0.5 * n))] * 1e6,
           p99_us = samples[math.max(1, math.ceil(0.99 * n))] * 1e6,
           truncated = n < CFG.null_n or nil }
end

------------------------------------------------------------------------------
-- Calls in flight

local function lecho_inflight(F)
  local function run(total)
    local done, bad, sent, err = 0, 0, 0, nil
    local one
    local function cb(ok, e)
      if ok then done = done + 1 else bad = bad + 1; err = err or e end
      if sent < total and bad == 0 then one() end
    end
    function one()
      sent = sent + 1
      local ok, e = ctx:call_async("null", nil, CALL_OPTS, cb)
      -- (a refusal may come as a return value or through the callback)
      if ok == nil and e ~= nil then bad = bad + 1; err = err or e end
    end
    for _ = 1, math.min(F, total) do one() end
    local t0 = clock()
    local deadline = t0 + CFG.limit + 10
    while done + bad < sent and clock() < deadline do ctx:run_once(0.001) end
    if bad > 0 then error("calls failed: " .. tostring(err)) end
    return done, clock() - t0
  end
  run(math.max(F, math.floor(CFG.if_n / 10)))   -- warm
  local n, secs = run(CFG.if_n)
  return { inflight = F, n = n, seconds = secs, ops_per_s = n / secs, us_per_op = secs * 1e6 / n }
end

------------------------------------------------------------------------------
-- Failover

local function failover(res)
  local B = start_server{ ns = res.ns, name = "fo", version = 1, ret = "B" }
  local reps = {}
  for k = 1, CFG.fo_reps do
    local a = start_server{ ns = res.ns, name = "fo", version = 2, ret = "A" }
    -- calls reach A (the highest version) once the stub knows it
    local seen, t_wait = nil, clock()
    while clock() - t_wait < 20 do
      local who = ctx:call("fo", nil, { min_version = 1, timeout = 5 })
      if who == "A" then seen = true break end
      ctx:run_once(0.01)
    end
    if not seen then error("calls never reached replica A") end
    local before = {}
    for i = 1, 20 do before[i] = ctx:call("fo", nil, { min_version = 1, timeout = 5 }) end
    local all_a = true
    for _, w in ipairs(before) do if w ~= "A" then all_a = false end end
    proc.signal(a.pid, "KILL")
    local t_kill = clock()
    local fails, who, err = 0, nil, nil
    while clock() - t_kill < 30 do
      local w, e = ctx:call("fo", nil, { min_version = 1, timeout = 5 })
      if w == "B" then who = w break end
      if w == nil then fails = fails + 1; err = err or e end
    end
    local t = clock() - t_kill
    if who ~= "B" then error("no call answered by B within 30 s after the kill: " .. tostring(err)) end
    reps[k] = { ms = t * 1e3, failed_calls = fails, first_error = err, all_to_a_before = all_a }
    proc.wait(a, 5)
  end
  proc.stop(B)
  local ms = {}
  for i, r in ipairs(reps) do ms[i] = r.ms end
  local lo, hi = common.spread(ms)
  return { reps = reps, median_ms = common.median(ms), lo_ms = lo, hi_ms = hi }
end

------------------------------------------------------------------------------

local res = { quick = QUICK, machine_before = common.machine() }
local ok, err = xpcall(function()
  local nsc, ns = proc.nameserver{
    root = ROOT, luajit = LUAJIT, port_file = tmp .. "/ns-addr", args = { "--for", "600", "--quiet" },
    start = function(argv) return kids:spawn(proc.sh_join(argv), "ns") end, timeout = 20 }
  if not ns then error("name server did not start: " .. proc.errors(nsc, 2000)) end
  res.ns = ns
  ctx = lecho.context{ nameserver = ns, quiet = true }
  start_server{ ns = ns, name = "null" }
  -- the request a null call sends, for the baselines' message size
  res.size = #assert(lecho.encode({}))

  local null = common.interleave{
    reps = CFG.reps,
    runs = {
      { "lecho", lecho_null },
      { "tcp", function() return run_c("baseline_tcp", ("pingpong %d %d"):format(res.size, CFG.base_n)) end },
      { "zmq", function() return run_c("baseline_zmq", ("pingpong %d %d"):format(res.size, CFG.base_n)) end },
    },
    ratios = { { "lecho", "tcp" }, { "lecho", "zmq" } },
  }
  res.null = null

  res.inflight = {}
  -- CALL_BENCH_ONLY=null: the null round trip only (a by-hand re-measure
  -- of that row under chrt, a run of seconds; make bench never sets it)
  local only_null = os.getenv("CALL_BENCH_ONLY") == "null"
  for _, F in ipairs(only_null and {} or CFG.inflight) do
    local iv = common.interleave{
      reps = CFG.reps, value = function(r) return r.ops_per_s end,
      runs = {
        { "lecho", function() return lecho_inflight(F) end },
        { "zmq", function()
            return run_c("baseline_zmq", ("--inflight %d dealer %d %d"):format(F, res.size, CFG.if_n * math.min(F, 4)))
          end },
        { "tcp", function()
            return run_c("baseline_tcp", ("--inflight %d reqrep %d %d"):format(F, res.size, CFG.if_n * math.min(F, 4)))
          end },
      },
      ratios = { { "lecho", "zmq" }, { "lecho", "tcp" } },
    }
    iv.inflight = F
    res.inflight[#res.inflight + 1] = iv
  end

  if only_null then
    res.failover = { error = "not run (CALL_BENCH_ONLY=null)" }
  else
    local okf, fo = pcall(failover, res)
    res.failover = okf and fo or { error = tostring(fo) }
  end
end, debug.traceback)
res.machine_after = common.machine()
kids:kill_all("KILL")
if os.getenv("BENCH_KEEP_TMP") then io.stderr:write("call bench: kept ", tmp, "\n") else proc.remove(tmp) end
if not ok then
  io.stderr:write("call bench failed: ", tostring(err), "\n")
  os.exit(1)
end

local function r3(x) return x and ("%.2f"):format(x) or "-" end
local n = res.null
print(("calls (%d interleaved reps%s)"):format(CFG.reps, QUICK and ", QUICK" or ""))
print(("  null call round trip   %8.1f us   tcp %6.1f us  %sx   zmq REQ/REP %6.1f us  %sx   (%s)"):format(
  n.median.lecho or 0, n.median.tcp or 0, r3(n.ratios["lecho/tcp"].median), n.median.zmq or 0,
  r3(n.ratios["lecho/zmq"].median), common.spread_text(n.ratios["lecho/tcp"])))
for _, iv in ipairs(res.inflight) do
  print(("  %2d in flight, calls/s %9.0f   zmq DEALER/ROUTER %9.0f  %sx   tcp %9.0f  %sx   (%s)"):format(
    iv.inflight, iv.median.lecho or 0, iv.median.zmq or 0, r3(iv.ratios["lecho/zmq"].median),
    iv.median.tcp or 0, r3(iv.ratios["lecho/tcp"].median), common.spread_text(iv.ratios["lecho/zmq"])))
end
if res.failover.median_ms then
  print(("  failover (SIGKILL to the first call through the other replica) %.1f ms, %d reps %.1f-%.1f ms"):format(
    res.failover.median_ms, #res.failover.reps, res.failover.lo_ms, res.failover.hi_ms))
else
  print("  failover: " .. tostring(res.failover.error))
end
if A.json then
  local f = assert(io.open(A.json, "w"))
  f:write(cjson.encode(res), "\n")
  f:close()
end
pcall(function() ctx:close() end)
os.exit(0)
