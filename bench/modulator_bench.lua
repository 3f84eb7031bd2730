-- bench/modulator_bench.lua: what modulators cost (JECho §5: installing a
-- modulator about 1.23 ms, a params update about 0.5 ms on 1999 hardware),
-- each as a ratio to a plain sync round trip measured in the same run.
--
--   luajit bench/modulator_bench.lua [--quick] [--json FILE]
--
-- Processes on 127.0.0.1: this one and four peers (luajit, started here
-- and killed at the end: a plain consumer, a consumer through the filter,
-- two producers).  Each figure is the median of 5 (--quick: 3) interleaved
-- repetitions (bench/common.lua interleave: plain, filter, install, params
-- in an order rotated each repetition); `ratios` holds the median of the
-- per-repetition ratios to rt_plain, their min-max and every one, `runs`
-- every repetition.  Figures:
--   rt_plain     sync round trip of a small integer to a plain consumer in the peer (us)
--   rt_filter    the same with a trivial filter modulator in between (us)
--   async_plain, async_filter   time per async event at the consumer (us)
--   install      ch:consumer(fn, { modulator = ... }) until every producer
--                (the peer) installed it (us)
--   params       c:set_params(p) until every producer applied it (us)
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
-- counts per repetition; REPS interleaved repetitions (issue 13)
local REPS = QUICK and 3 or 5
local N_RT = QUICK and 300 or 2000
local N_ASYNC = QUICK and 10000 or 100000
local N_INSTALL = QUICK and 10 or 60
local N_PARAMS = QUICK and 30 or 200
local LIMIT = QUICK and 2 or 8 -- seconds per measurement at most

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
  local done = ctx:channel("ctl"):consumer(function(ev) if ev == "quit" then ctx:stop() end end)
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

-- A consumer in a peer (plain or through the filter) and this process's
-- producer to it; its sync round trips and async time per event, measured
-- again at each repetition.
local function consumer_peer(chan, mod)
  wait_ready(spawn(ctx.addr, "consumer", chan, mod or ""))
  local p = assert(ctx:channel(chan):producer())
  local st = { p = p }
  assert(ctx:channel(chan .. ".rep"):consumer(function(ev) st.reply = ev end))
  for _ = 1, 200 do assert(p:submit_sync(0)) end   -- warm up (0: a filter passes it; nil would be a drop)
  return st
end

local function to_consumer(st)
  local p = st.p
  local t0, n = ctx:now(), 0
  while n < N_RT and ctx:now() - t0 < LIMIT do
    assert(p:submit_sync(0))
    n = n + 1
  end
  local rt = (ctx:now() - t0) / n * 1e6
  assert(p:submit_sync("mark"))
  local m = 0
  local t1 = ctx:now()
  while m < N_ASYNC and ctx:now() - t1 < LIMIT do
    for _ = 1, 1000 do assert(p:submit(m)) end
    m = m + 1000
    ctx:run_once(0)
  end
  st.reply = nil
  assert(p:submit_sync("report", { timeout = 60 }))
  local deadline = ctx:now() + 10
  while not st.reply and ctx:now() < deadline do ctx:run_once(0.05) end
  local reply = st.reply
  return { us = rt, n_rt = n, n_async = m,
           async = reply and reply.n > 0 and reply.t / reply.n * 1e6 or nil }
end

-- Install: ch:consumer with a modulator, distinct params each time (a new
-- modulator state, not a shared one), until every producer installed it.
local installs = 0
local function install(ch)
  local t0, n = ctx:now(), 0
  while n < N_INSTALL and ctx:now() - t0 < LIMIT do
    installs = installs + 1
    local c = assert(ch:consumer(function() end, { modulator = FILTER, params = { i = installs } }))
    n = n + 1
    c:close()
  end
  return { us = (ctx:now() - t0) / n * 1e6, n = n }
end

local pv = 0
local function params(c)
  local t0, n = ctx:now(), 0
  while n < N_PARAMS and ctx:now() - t0 < LIMIT do
    n, pv = n + 1, pv + 1
    assert(c:set_params{ v = pv })
  end
  return { us = (ctx:now() - t0) / n * 1e6, n = n }
end

local res = { quick = QUICK, reps = REPS }
local ok, err = pcall(function()
  local plain, filter = consumer_peer("plain"), consumer_peer("filter", FILTER)
  -- Install and params: peers produce channels "m" and "mp", this process
  -- consumes (the params consumer lives across the repetitions).
  wait_ready(spawn(ctx.addr, "producer", "m", ""))
  wait_ready(spawn(ctx.addr, "producer", "mp", ""))
  local m, mp = ctx:channel("m"), ctx:channel("mp")
  local c = assert(mp:consumer(function() end, { modulator = FILTER, params = { v = 0 } }))
  -- rotated order per repetition: a drift of the machine's load hits all
  local iv = common.interleave{
    reps = REPS, value = function(r) return r.us end,
    runs = { { "plain", function() return to_consumer(plain) end },
             { "filter", function() return to_consumer(filter) end },
             { "install", function() return install(m) end },
             { "params", function() return params(c) end } },
    ratios = { { "install", "plain" }, { "params", "plain" }, { "filter", "plain" } } }
  for _, name in ipairs{ "plain", "filter", "install", "params" } do
    if not iv.median[name] then
      error(name .. ": " .. tostring(iv.runs[name][1] and iv.runs[name][1].error))
    end
  end
  local async = function(r) return r.async end
  res.rt_plain, res.rt_filter = iv.median.plain, iv.median.filter
  res.async_plain = common.median_of(iv, "plain", async)
  res.async_filter = common.median_of(iv, "filter", async)
  res.install, res.params = iv.median.install, iv.median.params
  res.n_rt = iv.runs.plain[1].n_rt
  -- the median of the per-repetition ratios, their min-max, every one
  res.ratios = {
    install = iv.ratios["install/plain"], params = iv.ratios["params/plain"],
    rt_filter = iv.ratios["filter/plain"], async_filter = common.ratio(iv, "filter", "plain", async),
  }
  res.runs, res.order = iv.runs, iv.order
  ctx:channel("ctl"):producer():submit("quit")
  plain.p:submit("quit")
  filter.p:submit("quit")
  ctx:flush()
end)
cleanup()
if not ok then
  io.stderr:write("modulator bench failed: " .. tostring(err) .. "\n")
  os.exit(1)
end

local function r(k)
  local x = res.ratios[k]
  return x and x.median and ("%.2fx (%.2f-%.2fx)"):format(x.median, x.lo, x.hi) or "-"
end
print(("modulators (vs a plain sync round trip of %.1f us, same run; medians of %d interleaved reps)")
  :format(res.rt_plain, REPS))
print(("  install a modulator        %8.1f us   %s   (JECho 1999: 1230 us)"):format(res.install, r("install")))
print(("  params update              %8.1f us   %s   (JECho 1999: 500 us)"):format(res.params, r("params")))
print(("  sync round trip, filter    %8.1f us   %s"):format(res.rt_filter, r("rt_filter")))
if res.async_plain and res.async_filter then
  print(("  async per event, plain     %8.3f us"):format(res.async_plain))
  print(("  async per event, filter    %8.3f us   %s of plain"):format(res.async_filter, r("async_filter")))
end
if json_out then
  local f = assert(io.open(json_out, "w"))
  f:write(cjson.encode(res), "\n")
  f:close()
end
ctx:close()
