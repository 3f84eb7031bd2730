-- lua/lecho/cli/bench.lua: `lecho bench`, a quick pub/sub throughput and
-- round-trip figure against a consumer in a child process (this same
-- command with --sink); an entry { opts, pos, usage, run } that lecho.cli
-- dispatches to.  Leans on lecho.cli.common and lecho.stats (the pid).

local C = require "lecho.cli.common"

local EXIT, COMMON = C.EXIT, C.COMMON
local die, emit, fmt_num = C.die, C.emit, C.fmt_num
local context, on_signals, signal_exit, finish = C.context, C.on_signals, C.signal_exit, C.finish
local wait_consumers = C.wait_consumers

local M = {}

M.bench = {
  opts = { { "--count", "count", "count" }, { "--size", "size", "count" }, { "--rtt", "rtt", "count" },
           { "--for", "duration", "seconds" }, { "--channel", "channel", "string" },
           { "--json", "json", "flag" },
           { "--sink", "sink", "string", internal = true } },   -- the child it starts
  pos = { {}, 0 },
  usage = [[
usage: lecho bench [--count N] [--size BYTES] [--rtt N] [--for SECONDS] [--json]

Starts a consumer in a child process, then measures from this one: async
pub/sub throughput (--count events of --size bytes, then one sync event
that returns once all were handled) and the sync round trip (--rtt
submit_sync one after the other: median, p99).  Bounded by --for seconds
(default 10): a part cut short says so.
  --count N          events for the throughput (default 100000)
  --size BYTES       bytes of each event's string (default 128)
  --rtt N            round trips (default 1000)
  --channel NAME     the channel (default bench.PID)
  --json             one JSON object with the figures
]] .. COMMON,
}

------------------------------------------------------------------------------
-- bench

-- The child: consumes the channel until its stdin closes.
local function bench_sink(opts)
  local ctx = context("bench", opts)
  local ch = ctx:channel(opts.sink)
  local n = 0
  local con = ch:consumer(function() n = n + 1 end)
  if not con then os.exit(EXIT.failed) end
  ctx:on_readable(0, function()
    local s = io.stdin:read(1)
    if s == nil then ctx:stop() end
  end)
  ctx:run()
  finish(ctx, EXIT.ok)
end

local function q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

-- This process's command line up to its script: the interpreter is arg's
-- lowest index, and what lies between it and the script (arg[0]) are its
-- options, passed along: LuaRocks' wrapper runs `luajit -e 'LOADER' SCRIPT`,
-- whose -e chunk sets the paths the child needs too.
local function self_command()
  if not arg or not arg[0] then return "luajit lecho" end
  local lo = 0
  while arg[lo - 1] ~= nil do lo = lo - 1 end
  local words = {}
  if lo == 0 then   -- no interpreter in arg (an embedding host): the running executable
    local ffi = require "ffi"
    pcall(ffi.cdef, "long readlink(const char *, char *, size_t);")
    local buf = ffi.new("char[4096]")
    local n = tonumber(ffi.C.readlink("/proc/self/exe", buf, 4096))
    words[1] = q(n > 0 and ffi.string(buf, n) or "luajit")
  end
  for i = lo, 0 do words[#words + 1] = q(arg[i]) end
  return table.concat(words, " ")
end

function M.bench.run(opts)
  if opts.sink then return bench_sink(opts) end
  local count, size, rtt = opts.count or 100000, opts.size or 128, opts.rtt or 1000
  local budget = opts.duration or 10
  local ctx = context("bench", opts)
  local t_end = ctx:now() + budget
  local name = opts.channel or ("bench." .. require("lecho.stats").snapshot(ctx).pid)
  local ch = ctx:channel(name)
  local p, perr = ch:producer()
  if not p then die("bench", tostring(perr), EXIT.failed) end
  local cmd = ("%s bench --sink %s --nameserver %s"):format(self_command(), q(name), q(ctx.ns))
  if opts.key then cmd = cmd .. " --key " .. q(opts.key) end
  for _, t in ipairs(opts.trust) do cmd = cmd .. " --trust " .. q(t) end
  local child = io.popen(cmd, "w")
  local interrupted
  on_signals(ctx, function(s) interrupted = s end)
  if not wait_consumers(ctx, ch, math.min(10, budget)) then
    child:close()
    io.stderr:write("lecho bench: the consumer process did not join within ", math.min(10, budget), " s\n")
    finish(ctx, EXIT.failed)
  end
  local payload = ("x"):rep(size)
  local res = { channel = name, size = size }
  -- throughput: count async events, then one sync event: all handled
  local t0 = ctx:now()
  local sent = 0
  for i = 1, count do
    if interrupted or (i % 1024 == 0 and ctx:now() > t_end) then break end
    local ok, err = p:submit(payload)
    if not ok then io.stderr:write("lecho bench: submit: ", tostring(err), "\n") break end
    sent = i
  end
  local ok, err = p:submit_sync("end", { timeout = math.max(1, t_end - ctx:now()) })
  local t1 = ctx:now()
  res.events, res.seconds = sent, t1 - t0
  res.events_per_s = sent / math.max(t1 - t0, 1e-9)
  res.mbytes_per_s = res.events_per_s * size / 1e6
  res.truncated = (sent < count) or nil
  if not ok then res.throughput_error = tostring(err) end
  -- round trips, one after the other
  local lat = {}
  for _ = 1, rtt do
    if interrupted or ctx:now() > t_end then res.truncated = true break end
    local a = ctx:now()
    local sok, serr = p:submit_sync(payload, { timeout = 5 })
    if not sok then res.rtt_error = tostring(serr) break end
    lat[#lat + 1] = ctx:now() - a
  end
  table.sort(lat)
  res.round_trips = #lat
  if #lat > 0 then
    res.rtt_median_us = lat[math.max(1, math.ceil(#lat * 0.5))] * 1e6
    res.rtt_p99_us = lat[math.max(1, math.ceil(#lat * 0.99))] * 1e6
  end
  p:close()
  -- ours first: the child's close waits until we closed our side
  ctx:close()
  child:close()
  if opts.json then
    emit(res)
  else
    io.write(("pub/sub   %d events of %d B in %.3f s: %s events/s, %.1f MB/s%s\n"):format(res.events, size,
      res.seconds, fmt_num(res.events_per_s), res.mbytes_per_s, res.throughput_error and (" (" .. res.throughput_error .. ")") or ""))
    if res.round_trips > 0 then
      io.write(("round trip %d sync submits: median %.0f us, p99 %.0f us%s\n"):format(res.round_trips,
        res.rtt_median_us, res.rtt_p99_us, res.rtt_error and (" (" .. res.rtt_error .. ")") or ""))
    end
    if res.truncated then io.write("(cut short by --for or a signal)\n") end
  end
  local code = (res.throughput_error or res.rtt_error) and EXIT.failed or EXIT.ok
  if interrupted then code = signal_exit(interrupted) end
  finish(ctx, code)
end

return M
