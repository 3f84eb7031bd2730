-- bench/modulator_bench.lua: what modulators cost (JECho §5: installing a
-- modulator about 1.23 ms, a params update about 0.5 ms on 1999 hardware),
-- each as a ratio to a plain sync round trip measured in the same run:
-- REPS interleaved repetitions (bench/common.lua interleave, the order
-- rotated each time), the medians and the spread of the per-repetition
-- ratios reported, every repetition kept in the JSON (runs, order).
--
--   luajit bench/modulator_bench.lua [--quick] [--json FILE]
--
-- Processes on 127.0.0.1: this one and three peers (luajit, started here and
-- killed at the end): a plain consumer, a consumer with the filter, a producer.  Figures:
--   rt_plain     sync round trip of a small integer to a plain consumer in the peer (us)
--   rt_filter    the same with a trivial filter modulator in between (us)
--   async_plain, async_filter   time per async event at the consumer (us)
--   install      ch:consumer(fn, { modulator = ... }) until every producer
--                (the peer) installed it (us)
--   params       c:set_params(p) until every producer applied it (us)
--   *_cpu, *_cpu_peer   CPU time per install, params update or async event
--                of this process and of the peer (us): on a busy host the
--                times above are mostly waiting, these are the work done
--                (this process is the consumer and the channel's manager
--                for install and params, the producer for the async events)
-- Every loop is bounded in count and in time.

local dir = (arg and arg[0] or ""):match("^(.*)/[^/]*$") or "."
package.path = dir .. "/?.lua;" .. dir .. "/../?.lua;" .. package.path

local lecho = require "lecho"
local cjson = require "cjson"
local proc = require "spec.support.proc"

local USAGE = [[
usage: luajit bench/modulator_bench.lua [--quick] [--json FILE]

What modulators cost (install, params update, a trivial filter), each as a
ratio to a plain sync round trip of the same run (make bench runs it).
--quick (or QUICK=1): small counts; --json FILE: the results as JSON.
]]
local common = require "common"
local A = common.args(arg, USAGE)   -- bench/common.lua: --quick, --json FILE, --help
local QUICK, json_out = A.quick, A.json
local N_RT = QUICK and 500 or 5000
local N_ASYNC = QUICK and 20000 or 200000
local N_INSTALL = QUICK and 20 or 200
local N_PARAMS = QUICK and 50 or 500
local LIMIT = QUICK and 2 or 5 -- seconds per chunk at most
local REPS = QUICK and 3 or 5   -- interleaved repetitions (bench/common.lua interleave)

local FILTER = "function enqueue(ev) return ev end"

-- The peer: role "consumer" (plain or with the filter; answers counts) or
-- "producer" (a producer of channel "m" that only serves the loop).
local PEER = [[
local lecho = require "lecho"
local ns, role, chan, mod = arg[1], arg[2], arg[3], arg[4]
local ctx = lecho.context{ nameserver = ns, quiet = true }
local ch = ctx:channel(chan)
if role == "producer" then
  local p = assert(ch:producer())
  local done = ctx:channel("ctl"):consumer(function(ev)
    if ev == "quit" then ctx:stop() end
    if ev == "cpu" then io.stdout:write(("cpu %.6f\n"):format(os.clock())) io.stdout:flush() end
  end)
  io.stdout:write("ready\n"); io.stdout:flush()
  ctx:after(300, function() ctx:stop() end)
  ctx:run()
else
  local n, t0 = 0, nil
  local rep = assert(ctx:channel(chan .. ".rep"):producer())
  local opts = mod ~= "" and { modulator = mod } or nil
  assert(ch:consumer(function(ev)
    if ev == "mark" then n, t0 = 0, ctx:now() return end
    -- async: the bench is inside its submit_sync("report") and runs no
    -- handler until it returns, so a sync submit here waited for its ack
    -- until the timeout (10 s per run)
    if ev == "report" then rep:submit({ n = n, t = ctx:now() - (t0 or ctx:now()) }) rep:flush() return end
    if ev == "quit" then ctx:stop() return end
    n = n + 1
  end, opts))
  io.stdout:write("ready\n"); io.stdout:flush()
  ctx:after(300, function() ctx:stop() end)
  ctx:run()
end
]]

local tmp = proc.tmpdir("lecho-modbench")
local peer_file = proc.write(tmp .. "/peer.lua", PEER)
local kids = proc.group(tmp)

local function spawn(...)
  local args = {}
  for i, a in ipairs({ ... }) do args[i] = proc.sh_quote(a) end
  return kids:spawn(("luajit %s %s"):format(peer_file, table.concat(args, " ")), "peer")
end

local function cleanup()
  kids:kill_all("KILL")
  proc.remove(tmp)
end

local ctx = lecho.context{ quiet = true }

local function wait_ready(child)
  local ok = proc.wait_file(child.out, "ready", 20, function(dt)
    ctx:run_once(dt)
    return proc.exit_code(child) ~= nil
  end)
  if not ok then error("peer did not start: " .. proc.errors(child)) end
end

-- A consumer in a peer (plain, or with the filter) and this process's
-- producer to it, warmed up; then chunks of sync round trips and of async
-- events to it, as often as the repetitions ask.
local function consumer_peer(chan, mod)
  local child = spawn(ctx.addr, "consumer", chan, mod or "")
  wait_ready(child)
  local P = { p = assert(ctx:channel(chan):producer()) }
  assert(ctx:channel(chan .. ".rep"):consumer(function(ev) P.reply = ev end))
  for _ = 1, 200 do assert(P.p:submit_sync(0)) end   -- warm up (0: a filter passes it; nil would be a drop)
  return P
end

local function rt_chunk(P)
  local p = P.p
  local t0, n = ctx:now(), 0
  while n < N_RT and ctx:now() - t0 < LIMIT do
    assert(p:submit_sync(0))
    n = n + 1
  end
  return { us_per_op = (ctx:now() - t0) / n * 1e6, n = n }
end

-- Time per async event at the consumer (from the mark to the report), and
-- this (producing) process's CPU per event.
local function async_chunk(P)
  local p = P.p
  assert(p:submit_sync("mark"))
  local m = 0
  local t1, c1 = ctx:now(), os.clock()
  while m < N_ASYNC and ctx:now() - t1 < LIMIT do
    for _ = 1, 1000 do assert(p:submit(m)) end
    m = m + 1000
    ctx:run_once(0)
  end
  local cpu = (os.clock() - c1) / m * 1e6
  P.reply = nil
  assert(p:submit_sync("report", { timeout = 60 }))
  local deadline = ctx:now() + 10
  while not P.reply and ctx:now() < deadline do ctx:run_once(0.05) end
  local r = P.reply
  if not (r and r.n > 0) then return nil, "no report from the consumer" end
  return { us_per_op = r.t / r.n * 1e6, n = m, cpu = cpu }
end

-- The peer's CPU seconds so far (it writes them when asked on "ctl").
local function peer_cpu(child, ctlp)
  local have = select(2, proc.output(child):gsub("cpu ", ""))
  assert(ctlp:submit_sync("cpu"))
  local deadline = ctx:now() + 10
  repeat
    local all = {}
    for x in proc.output(child):gmatch("cpu ([%d.]+)\n") do all[#all + 1] = tonumber(x) end
    if all[have + 1] then return all[have + 1] end
    ctx:run_once(0.01)
  until ctx:now() > deadline
  error("the peer did not say its CPU time")
end

local res = { quick = QUICK, reps = REPS }
local ok, err = pcall(function()
  local plain, filter = consumer_peer("plain"), consumer_peer("filter", FILTER)
  -- Install and params: the peer produces, this process consumes.
  local peer = spawn(ctx.addr, "producer", "m", "")
  wait_ready(peer)
  local ch = ctx:channel("m")
  local ctlp = ctx:channel("ctl"):producer()
  local serial = 0
  local function install_chunk()
    local pc0, c0 = peer_cpu(peer, ctlp), os.clock()
    local t0, n = ctx:now(), 0
    while n < N_INSTALL and ctx:now() - t0 < LIMIT do
      -- distinct params each time: a new modulator state, not a shared one
      serial = serial + 1
      local c = assert(ch:consumer(function() end, { modulator = FILTER, params = { i = serial } }))
      n = n + 1
      c:close()
    end
    local us = (ctx:now() - t0) / n * 1e6
    return { us_per_op = us, n = n, cpu = (os.clock() - c0) / n * 1e6,
             cpu_peer = (peer_cpu(peer, ctlp) - pc0) / n * 1e6 }
  end
  local pc = assert(ch:consumer(function() end, { modulator = FILTER, params = { v = 0 } }))
  local function params_chunk()
    local pc0, c0 = peer_cpu(peer, ctlp), os.clock()
    local t0, n = ctx:now(), 0
    while n < N_PARAMS and ctx:now() - t0 < LIMIT do
      n = n + 1
      serial = serial + 1
      assert(pc:set_params{ v = serial })
    end
    return { us_per_op = (ctx:now() - t0) / n * 1e6, n = n, cpu = (os.clock() - c0) / n * 1e6,
             cpu_peer = (peer_cpu(peer, ctlp) - pc0) / n * 1e6 }
  end
  local iv = common.interleave{
    reps = REPS,
    runs = { { "rt_plain", function() return rt_chunk(plain) end },
             { "install", install_chunk },
             { "rt_filter", function() return rt_chunk(filter) end },
             { "params", params_chunk },
             { "async_plain", function() return async_chunk(plain) end },
             { "async_filter", function() return async_chunk(filter) end } },
    ratios = { { "install", "rt_plain" }, { "params", "rt_plain" }, { "rt_filter", "rt_plain" },
               { "async_filter", "async_plain" } },
  }
  for name, runs in pairs(iv.runs) do
    for _, r in ipairs(runs) do
      if r.error then error(("%s, repetition %d: %s"):format(name, r.rep, r.error)) end
    end
  end
  res.order, res.runs = iv.order, iv.runs
  -- the figures: medians of the repetitions (us), and of the per-repetition ratios with their spread
  for name, m in pairs(iv.median) do res[name] = m end
  local function med(name, field)
    local xs = {}
    for _, r in ipairs(iv.runs[name]) do xs[#xs + 1] = r[field] end
    return common.median(xs)
  end
  res.n_rt, res.n_install, res.n_params = med("rt_plain", "n"), med("install", "n"), med("params", "n")
  res.install_cpu, res.install_cpu_peer = med("install", "cpu"), med("install", "cpu_peer")
  res.params_cpu, res.params_cpu_peer = med("params", "cpu"), med("params", "cpu_peer")
  res.async_plain_cpu, res.async_filter_cpu = med("async_plain", "cpu"), med("async_filter", "cpu")
  local cpu_ratio = {}
  for k = 1, REPS do cpu_ratio[k] = iv.runs.async_filter[k].cpu / iv.runs.async_plain[k].cpu end
  local lo, hi = common.spread(cpu_ratio)
  res.spread = { async_filter_cpu = { median = common.median(cpu_ratio), lo = lo, hi = hi, all = cpu_ratio } }
  res.ratios = {}
  for _, k in ipairs{ "install", "params", "rt_filter" } do
    local r = iv.ratios[k .. "/rt_plain"]
    res.ratios[k], res.spread[k] = r.median, r
  end
  local r = iv.ratios["async_filter/async_plain"]
  res.ratios.async_filter, res.spread.async_filter = r.median, r
  res.ratios.async_filter_cpu = res.spread.async_filter_cpu.median
  ctlp:submit("quit")
  plain.p:submit("quit")
  filter.p:submit("quit")
  ctx:flush()
end)
cleanup()
if not ok then
  io.stderr:write("modulator bench failed: " .. tostring(err) .. "\n")
  os.exit(1)
end

local function r(name)
  local x = res.spread[name]
  return ("%.2fx (%.2f-%.2f)"):format(x.median, x.lo, x.hi)
end
print(("modulators: medians of %d interleaved repetitions, ratios per repetition (spread)"):format(REPS))
print(("  sync round trip, plain     %8.1f us"):format(res.rt_plain))
print(("  install a modulator        %8.1f us   %s of it   (JECho 1999: 1230 us)"):format(res.install, r("install")))
print(("  params update              %8.1f us   %s of it   (JECho 1999: 500 us)"):format(res.params, r("params")))
print(("  sync round trip, filter    %8.1f us   %s of it"):format(res.rt_filter, r("rt_filter")))
print(("  async per event, plain     %8.3f us"):format(res.async_plain))
print(("  async per event, filter    %8.3f us   %s of plain"):format(res.async_filter, r("async_filter")))
print(("  CPU per install            %8.1f us here (consumer, manager) + %.1f us at the producer")
  :format(res.install_cpu, res.install_cpu_peer))
print(("  CPU per params update      %8.1f us here (consumer, manager) + %.1f us at the producer")
  :format(res.params_cpu, res.params_cpu_peer))
print(("  producer CPU per event     %8.3f us plain, %.3f us filter   %s")
  :format(res.async_plain_cpu, res.async_filter_cpu, r("async_filter_cpu")))
if json_out then
  local f = assert(io.open(json_out, "w"))
  f:write(cjson.encode(res), "\n")
  f:close()
end
ctx:close()
