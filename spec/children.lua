-- spec/children.lua: the child processes the multi-process specs start.
-- Each is Lua source run under luajit by spec/support.lua; options travel
-- as one JSON argument and results come back as one JSON line on stdout.

local M = {}

-- What most children start with: the modules, their JSON options, line output.
M.prelude = [[
local cjson = require "cjson"
local socket = require "socket"
local lecho = require "lecho"
local opts = cjson.decode(arg[1])
io.stdout:setvbuf("line")
]]

-- The deterministic event generator shared by producers and checkers.
M.gen = [[
local function gen(i)
  local k = i % 6
  if k == 0 then return i end
  if k == 1 then return { i = i, f = i + 0.25, s = "e" .. i } end
  if k == 2 then return ("\0bin%d\255"):format(i) end
  if k == 3 then return { i, -i, 2^53 - i, { deep = { i } }, n = "x" } end
  if k == 4 then return i % 2 == 0 end
  return { i = i, list = { 1.5, -2^53, 1/0, -1/0 } }
end
local function same(a, b)
  if type(a) ~= type(b) then return false end
  if type(a) ~= "table" then return a == b end
  for k, v in pairs(a) do if not same(v, b[k]) then return false end end
  for k in pairs(b) do if a[k] == nil then return false end end
  return true
end
]]

-- A consuming process.  opts: ns, channels (list), consumers (per channel,
-- default 1), fail (error text raised by one extra consumer when ev == 7),
-- check (verify values against gen), expect (stop after this many events
-- per consumer), stop_on (stop after this event value), duration (seconds bound), slow (seconds per event).
M.consumer = M.gen .. [[
local cjson = require "cjson"
local lecho = require "lecho"
local opts = cjson.decode(arg[1])
-- LECHO_SPEC_LOG=1 in the environment shows the child's lecho log on its stderr.
local ctx = lecho.context{ nameserver = opts.ns, quiet = not os.getenv("LECHO_SPEC_LOG") }
-- order_ok: every producer's seq went up by exactly one (no gap, no
-- duplicate); increasing_ok: it only went up (gaps allowed).
local res = { count = 0, ran = 0, order_ok = true, increasing_ok = true, values_ok = true, by = {} }
local ffi = require "ffi"
ffi.cdef "int poll(void *fds, unsigned long nfds, int timeout);"
local last = {}
local cons = {}
for _, name in ipairs(opts.channels) do
  local ch = ctx:channel(name)
  for j = 1, opts.consumers or 1 do
    local c = assert(ch:consumer(function(ev, meta)
      res.ran = res.ran + 1
      if j > 1 then return end
      res.count = res.count + 1
      res.by[name] = (res.by[name] or 0) + 1
      local key = name .. meta.producer
      if last[key] and meta.seq <= last[key] then res.increasing_ok = false end
      if last[key] and meta.seq ~= last[key] + 1 then
        res.order_ok = false
        res.bad_order = res.bad_order or { last[key], meta.seq }
      end
      last[key] = meta.seq
      res.first = res.first or meta.seq
      res.last = meta.seq
      if opts.check and not same(ev, gen(meta.seq)) then
        res.values_ok = false
        res.bad_value = res.bad_value or meta.seq
      end
      -- (a sleep without a fork: under `make asan` every forked sh and sleep
      -- loads the sanitizer runtime and took ~50 ms instead of 5)
      if opts.slow then ffi.C.poll(nil, 0, math.floor(opts.slow * 1000 + 0.5)) end
      if (opts.expect and res.count >= opts.expect) or (opts.stop_on and ev == opts.stop_on) then
        ctx:stop()
      end
    end))
    cons[#cons + 1] = c
  end
  if opts.fail then
    assert(ch:consumer(function(ev) if ev == 7 then error(opts.fail, 0) end end))
  end
end
io.stdout:write("ready\n")
io.stdout:flush()
ctx:after(opts.duration or 20, function() res.timeout = true; ctx:stop() end)
ctx:run()
local s = ctx:stats()
res.peers = {}
for addr, p in pairs(s.peers) do res.peers[addr] = p end
res.channels = s.channels
res.addr = ctx.addr
io.stdout:write(cjson.encode(res), "\n")
io.stdout:flush()
ctx:close()
]]

------------------------------------------------------------------------------
-- Children of spec/delivery_spec.lua (issue 8).  Times are socket.gettime()
-- (wall clock, comparable between processes on one host).

-- A consuming process that reports every event as it comes, one line each,
-- so that a spec can count what arrived even while it still runs (or after
-- it was killed): "ready ADDR", then "ev SEQ VALUE" per event (VALUE: ev.i
-- for a table, the string itself when short, "#LEN" when long), then
-- "done COUNT" or "timeout COUNT".  opts: ns, channel, expect (stop after
-- this many events), stop_on (stop after this value), duration (bound,
-- seconds), modulator (source: a modulated consumer), verbose (lecho log on
-- stderr).
M.sink = [[
local cjson = require "cjson"
local lecho = require "lecho"
local opts = cjson.decode(arg[1])
io.stdout:setvbuf("line")
local ctx = lecho.context{ nameserver = opts.ns,
                           quiet = not (opts.verbose or os.getenv("LECHO_SPEC_LOG")) }
local count = 0
local function show(ev)
  if type(ev) == "table" then return tostring(ev.i) end
  if type(ev) == "string" then return #ev <= 40 and ev or ("#" .. #ev) end
  return tostring(ev)
end
local copts = opts.modulator and { modulator = opts.modulator } or nil
assert(ctx:channel(opts.channel):consumer(function(ev, meta)
  count = count + 1
  io.stdout:write("ev ", meta.seq, " ", show(ev), "\n")
  if (opts.expect and count >= opts.expect) or (opts.stop_on ~= nil and ev == opts.stop_on) then
    io.stdout:write("done ", count, "\n")
    ctx:stop()
  end
end, copts))
io.stdout:write("ready ", ctx.addr, "\n")
ctx:after(opts.duration or 20, function() io.stdout:write("timeout ", count, "\n"); ctx:stop() end)
ctx:run()
ctx:close()
]]

-- A fire-and-forget publisher (obs. 1): joins, submits opts.n events of
-- about opts.size bytes ({ i = k, pad = ... }), flush, close, close, exits.
M.short_publisher = [[
local cjson = require "cjson"
local lecho = require "lecho"
local opts = cjson.decode(arg[1])
local ctx = lecho.context{ nameserver = opts.ns, quiet = true }
local p = assert(ctx:channel(opts.channel):producer())
local pad = opts.size and ("x"):rep(opts.size) or nil
for i = 1, opts.n do assert(p:submit({ i = i, pad = pad })) end
p:flush()
p:close()
ctx:close()
io.stdout:write("submitted ", opts.n, "\n")
io.stdout:flush()
os.exit(0)
]]

-- A producer with policy "block" and a small queue submitting opts.n events
-- of about opts.size bytes in a tight loop (obs. 2).  Prints "sub K" after
-- each submit returned, then one JSON line { elapsed = seconds of the loop,
-- sync = true or the error of the final submit_sync("end") }.
M.block_burst = M.prelude .. [[
local ctx = lecho.context{ nameserver = opts.ns, quiet = true, policy = "block",
                           queue_limit = opts.queue_limit }
local p = assert(ctx:channel(opts.channel):producer())
local pad = ("x"):rep(opts.size - 12) -- { i = k, pad = ... } encodes to about opts.size bytes
local t0 = socket.gettime()
for i = 1, opts.n do
  local ok, err = p:submit({ i = i, pad = pad })
  if not ok then io.stdout:write("submit ", i, " failed: ", tostring(err), "\n") os.exit(3) end
  io.stdout:write("sub ", i, "\n")
end
local elapsed = socket.gettime() - t0
local ok, err = p:submit_sync("end", { timeout = 5 })
io.stdout:write(cjson.encode{ elapsed = elapsed, sync = ok and true or tostring(err) }, "\n")
ctx:close()
os.exit(0)
]]

-- A producer with policy "block" submitting { i = k, pad } from a
-- ctx:every(opts.interval) timer for opts.run_for seconds (obs. 3), with a
-- 0.1 s status timer beside it.  Counts the re-entrant depth of the submit
-- timer, the log lines with "stack overflow", the submits that returned
-- true (their i, in order) and the largest gap between status ticks.
-- Prints "ready" once connected, then a JSON line at the end.
M.timer_block = M.prelude .. [[
local overflow, logs = 0, {}
local ctx = lecho.context{ nameserver = opts.ns, policy = "block", queue_limit = opts.queue_limit,
  log = function(m)
    if m:find("stack overflow", 1, true) then overflow = overflow + 1 end
    if #logs < 20 then logs[#logs + 1] = m end
  end }
local p = assert(ctx:channel(opts.channel):producer())
assert(p:submit_sync("hello", { timeout = 5 }))
local pad = ("x"):rep(opts.size)
local depth, maxdepth, n, trues, fails = 0, 0, 0, {}, {}
local st = { last = nil, maxgap = 0, ticks = 0 }
local t_end = socket.gettime() + opts.run_for
local tick
tick = ctx:every(opts.interval, function()
  depth = depth + 1
  if depth > maxdepth then maxdepth = depth end
  if socket.gettime() < t_end then
    n = n + 1
    local i = n
    local ok, err = p:submit({ i = i, pad = pad })
    if ok then trues[#trues + 1] = i elseif #fails < 20 then fails[#fails + 1] = tostring(err) end
  else
    tick:stop()
    ctx:stop()
  end
  depth = depth - 1
end)
local status = ctx:every(0.1, function()
  local now = socket.gettime()
  if st.last and now - st.last > st.maxgap then st.maxgap = now - st.last end
  st.last = now
  st.ticks = st.ticks + 1
end)
io.stdout:write("ready\n")
ctx:run()
status:stop()
local ok, err = p:submit_sync("end", { timeout = 10 })
io.stdout:write(cjson.encode{ submitted = n, trues = trues, fails = fails, maxdepth = maxdepth,
                              overflow = overflow, status_maxgap = st.maxgap, status_ticks = st.ticks,
                              sync = ok and true or tostring(err), logs = logs }, "\n")
ctx:close()
os.exit(0)
]]

-- A producer with policy "block" and queue_limit opts.queue_limit
-- submitting opts.per_tick strings of opts.size bytes from a 10 ms timer
-- (obs. 6).  A status timer prints "blocked" once a submit has been waiting
-- for 0.3 s; the spec then kills the consumer.  The submit that was blocked
-- must return; the producer goes on submitting for opts.after_for seconds
-- and prints a JSON line { ok_before, blocked = { ok, err, waited },
-- after_total, after_ok, after_fail }.  (A submit entered again while one waits is
-- skipped: re-entrancy is obs. 3, not this spec's subject.)  Without
-- opts.ns, this process is the name server: the consumer's death then
-- changes the membership, and unloads its modulator, inside the peer-down
-- callback, i.e. while the submit still waits.
M.block_kill = M.prelude .. [[
-- Without opts.ns the name server runs in this context: it prints "ns ADDR"
-- and waits for the file opts.go (the consumer has joined) before starting.
local ctx = lecho.context{ nameserver = opts.ns, policy = "block", queue_limit = opts.queue_limit }
if not opts.ns then
  io.stdout:write("ns ", ctx.addr, "\n")
  local t0 = socket.gettime()
  while not io.open(opts.go) do
    if socket.gettime() - t0 > 20 then error("no go file") end
    ctx:run_once(0.05)
  end
end
local p = assert(ctx:channel(opts.channel):producer())
assert(p:submit_sync("hello", { timeout = 5 }))
io.stdout:write("ready\n")
local pad = ("x"):rep(opts.size)
local insubmit, t_sub, reported = false, 0, false
local res = { ok_before = 0, after_ok = 0, after_total = 0, after_fail = {} }
local phase, t_after = "before", nil
local tick
tick = ctx:every(0.01, function()
  if insubmit then return end
  for _ = 1, opts.per_tick do
    insubmit, t_sub = true, socket.gettime()
    local ok, err = p:submit(pad)
    local waited = socket.gettime() - t_sub
    insubmit = false
    if phase == "before" then
      if reported then
        res.blocked = { ok = ok and true or false, err = err and tostring(err), waited = waited }
        io.stdout:write("returned\n")
        phase, t_after = "after", socket.gettime()
      elseif ok then
        res.ok_before = res.ok_before + 1
      end
    else
      res.after_total = res.after_total + 1
      if ok then
        res.after_ok = res.after_ok + 1
      elseif #res.after_fail < 10 then
        res.after_fail[#res.after_fail + 1] = tostring(err)
      end
    end
  end
  if phase == "after" and socket.gettime() - t_after > opts.after_for then
    tick:stop()
    ctx:stop()
  end
end)
ctx:every(0.05, function()
  if insubmit and not reported and socket.gettime() - t_sub > 0.3 then
    reported = true
    io.stdout:write("blocked\n")
  end
end)
ctx:run()
io.stdout:write(cjson.encode(res), "\n")
ctx:close()
os.exit(0)
]]

-- A producer submitting { i = k } every opts.interval seconds for opts.n
-- events, then submit_sync("end") (a legitimate neighbour of obs. 7); with
-- opts.end_after (a path), "end" only once that file exists (30 s at most):
-- the spec says when.
M.steady = [[
local cjson = require "cjson"
local lecho = require "lecho"
local opts = cjson.decode(arg[1])
io.stdout:setvbuf("line")
local ctx = lecho.context{ nameserver = opts.ns, quiet = true }
local p = assert(ctx:channel(opts.channel):producer())
local n = 0
local tick
tick = ctx:every(opts.interval, function()
  n = n + 1
  assert(p:submit({ i = n }))
  if n >= opts.n then tick:stop(); ctx:stop() end
end)
ctx:run()
if opts.end_after then
  local waited = 0
  ctx:every(0.05, function(t)
    waited = waited + 0.05
    local f = io.open(opts.end_after)
    if f or waited > 30 then t:stop(); ctx:stop() end
    if f then f:close() end
  end)
  ctx:run()
end
local ok, err = p:submit_sync("end", { timeout = 10 })
io.stdout:write(cjson.encode{ submitted = n, sync = ok and true or tostring(err) }, "\n")
ctx:close()
os.exit(0)
]]

-- A producer submitting { i = k } every 10 ms from one timer and calling
-- submit_sync(ev, { timeout = opts.sync_timeout }) from a 1 s timer, for
-- opts.run_for seconds (obs. 8).  Records each sync call (start, return,
-- result, depth), the nesting depth and the largest gap between 10 ms ticks.
-- The consumer is stopped and resumed by the spec.
M.sync_nesting = M.prelude .. [[
local ctx = lecho.context{ nameserver = opts.ns }
local p = assert(ctx:channel(opts.channel):producer())
assert(p:submit_sync("hello", { timeout = 5 }))
local fast = { ticks = 0, maxgap = 0 }
local n = 0
local t_end = socket.gettime() + opts.run_for
local fast_t, slow_t
fast_t = ctx:every(0.01, function()
  local now = socket.gettime()
  if fast.last and now - fast.last > fast.maxgap then fast.maxgap = now - fast.last end
  fast.last = now
  fast.ticks = fast.ticks + 1
  n = n + 1
  p:submit({ i = n })
  if now > t_end then fast_t:stop(); slow_t:stop(); ctx:stop() end
end)
-- Nesting is a call entered on the stack of one still waiting: counted per
-- coroutine (calls suspended side by side in coroutines do not nest);
-- "concurrent" counts calls in progress at once, whatever the stack.
local depth, maxdepth, conc, maxconc, calls = {}, 0, 0, 0, {}
slow_t = ctx:every(1.0, function()
  local co = coroutine.running() or "main"
  depth[co] = (depth[co] or 0) + 1
  if depth[co] > maxdepth then maxdepth = depth[co] end
  conc = conc + 1
  if conc > maxconc then maxconc = conc end
  local call = { t0 = socket.gettime(), depth = depth[co] }
  calls[#calls + 1] = call
  local ok, err = p:submit_sync({ sync = #calls }, { timeout = opts.sync_timeout })
  call.t1 = socket.gettime()
  call.ok = ok and true or false
  call.err = err and tostring(err) or nil
  depth[co] = depth[co] - 1
  conc = conc - 1
end)
io.stdout:write("ready ", socket.gettime(), "\n")
ctx:run()
-- A call still waiting when the loop stopped is suspended, not lost: let it end.
while conc > 0 do ctx:run_once(0.05) end
fast.last = nil
io.stdout:write(cjson.encode{ calls = calls, maxdepth = maxdepth, maxconc = maxconc, fast = fast }, "\n")
ctx:close()
os.exit(0)
]]

-- ctx:close() from inside a timer callback during ctx:run() (obs. 9).
-- Prints "run returned" (and the error, if run raised) once run is over,
-- then whether a TCP connect to the context's address still succeeds, then
-- the result of a second ctx:close().
M.close_in_callback = [[
local socket = require "socket"
local lecho = require "lecho"
io.stdout:setvbuf("line")
local logs = {}
local ctx = lecho.context{ log = function(m) logs[#logs + 1] = m end }
local addr = ctx.addr
io.stdout:write("addr ", addr, "\n")
ctx:after(0.1, function() ctx:close() end)
local ok, err = pcall(ctx.run, ctx)
io.stdout:write("run returned ", tostring(ok), " ", tostring(err), "\n")
local host, port = addr:match("^(.+):(%d+)$")
local s = socket.tcp()
s:settimeout(2)
local c = s:connect(host, tonumber(port))
s:close()
io.stdout:write("connect ", c and "accepted" or "refused", "\n")
local ok2, err2 = pcall(ctx.close, ctx)
io.stdout:write("second close ", tostring(ok2), " ", tostring(err2), "\n")
for _, m in ipairs(logs) do io.stdout:write("log ", m, "\n") end
os.exit(0)
]]

------------------------------------------------------------------------------
-- Children of spec/busy_host_spec.lua (issue 8, obs. 4 and 5).  Times are
-- socket.gettime() (wall clock, comparable between processes on one host).

-- The consuming process of obs. 4: adds three modulated consumers to
-- opts.channel one after another, each ch:consumer returning once every
-- producing process knows of it:
--   filter  keeps the tables { i = k } with k even, and every non-table
--           ("probe", "final");
--   loop    loops for ever on the first event it sees;
--   escape  tries sandbox escapes at load (each under pcall: os.execute and
--           io.open writing opts.flag, load, loadstring, getfenv, setfenv,
--           string.dump and the string metatable's dump, debug, require,
--           jit, collectgarbage); if one worked, it passes { escaped =
--           names } on; if none did, its enqueue calls os.execute unguarded,
--           which fails on the first event: a modulator that fails at once.
-- The filter's handler writes opts.probe_file ("probe") on the first
-- "probe", checks that the tables come as 2, 4, 6, ... and on "final" writes
-- opts.final_file: "final COUNT ORDER_OK TIME" (before its handler returns,
-- so before the sync acknowledgement).  opts.added_file is written once all
-- three ch:consumer calls returned.  The process stays until the spec writes
-- opts.done_file (or opts.duration passes), then prints one JSON line:
-- { keys = { filter, loop, escape } (modulator keys),
-- errors = { name = on_error messages }, count, order_ok, bad_order,
-- after_final, others = events handled by loop and escape, escaped }.
M.busy_consumers = [==[
local cjson = require "cjson"
local socket = require "socket"
local lecho = require "lecho"
local opts = cjson.decode(arg[1])
io.stdout:setvbuf("line")
local ctx = lecho.context{ nameserver = opts.ns, quiet = not os.getenv("LECHO_SPEC_LOG") }
local ch = ctx:channel(opts.channel)
local function write(path, text)
  local tmp = path .. ".tmp"
  local f = assert(io.open(tmp, "w"))
  f:write(text)
  f:close()
  assert(os.rename(tmp, path))
end
local res = { keys = {}, errors = { filter = {}, loop = {}, escape = {} }, count = 0, order_ok = true,
              after_final = 0, others = { loop = 0, escape = 0 }, escaped = {} }
local final_seen, last = false, 0
local mods = {
  filter = [[ function enqueue(ev) if type(ev) ~= "table" or ev.i % 2 == 0 then return ev end end ]],
  loop = [[ function enqueue(ev) while true do end end ]],
  escape = [=[
    local worked = {}
    local function try(name, f)
      local ok, r = pcall(f)
      if ok and r ~= nil and r ~= false then worked[#worked + 1] = name end
    end
    try("os.execute", function() return os.execute("touch " .. params.flag) end)
    try("io.open", function() return io.open(params.flag, "w") end)
    try("load", function() return load("return 1") end)
    try("loadstring", function() return loadstring("return 1") end)
    try("getfenv", function() return getfenv(0) end)
    try("setfenv", function() return setfenv(1, {}) end)
    try("string.dump", function() return string.dump(function() end) end)
    try("string metatable dump", function() return getmetatable("").__index.dump(function() end) end)
    try("debug", function() return debug.getregistry() end)
    try("require", function() return require("ffi") end)
    try("jit", function() return jit.version end)
    try("collectgarbage", function() return collectgarbage("count") end)
    function enqueue(ev)
      if #worked > 0 then return { escaped = worked } end
      return os.execute("touch " .. params.flag)
    end
  ]=],
}
local cons = {}
local function add(name, handler)
  local c = assert(ch:consumer(handler, {
    modulator = mods[name], params = { flag = opts.flag },
    on_error = function(e) table.insert(res.errors[name], tostring(e)) end }))
  res.keys[name] = c.mod.key
  cons[#cons + 1] = c
end
add("filter", function(ev, meta)
  if ev == "probe" then
    if not res.probed then
      res.probed = socket.gettime()
      write(opts.probe_file, "probe\n")
    end
    return
  end
  if final_seen then res.after_final = res.after_final + 1; return end
  if ev == "final" then
    final_seen = true
    write(opts.final_file, ("final %d %s %.6f\n"):format(res.count, tostring(res.order_ok), socket.gettime()))
    return
  end
  res.count = res.count + 1
  local want = last + 2
  if type(ev) ~= "table" or ev.i ~= want then
    if res.order_ok then res.bad_order = { want = want, got = type(ev) == "table" and ev.i or tostring(ev),
                                           count = res.count } end
    res.order_ok = false
  end
  if type(ev) == "table" and ev.i then last = ev.i end
end)
add("loop", function() res.others.loop = res.others.loop + 1 end)
add("escape", function(ev)
  res.others.escape = res.others.escape + 1
  if type(ev) == "table" and ev.escaped then
    for _, n in ipairs(ev.escaped) do res.escaped[n] = true end
  end
end)
write(opts.added_file, "added\n")
io.stdout:write("added ", socket.gettime(), "\n")
ctx:every(0.05, function()
  local f = io.open(opts.done_file, "r")
  if f then f:close(); ctx:stop() end
end)
ctx:after(opts.duration or 30, function() res.timeout = true; ctx:stop() end)
ctx:run()
io.stdout:write(cjson.encode(res), "\n")
ctx:close()
os.exit(0)
]==]

-- The producing process of obs. 4: submits "probe" every 50 ms until
-- opts.probe_file exists, then opts.n tables { i = k } (the loop runs
-- between every opts.chunk of them, so joins and installs of the other
-- consumers may interleave with the burst), then waits until
-- opts.added_file exists (every consumer is then known here), then
-- submit_sync("final").  Reads opts.final_file right after
-- the sync returned.  One JSON line: { ok, errs = { { context, consumer,
-- err } }, t_sync, t_return, final_at_return, probes, burst }.
M.busy_producer = M.prelude .. [[
local ctx = lecho.context{ nameserver = opts.ns, quiet = not os.getenv("LECHO_SPEC_LOG") }
local p = assert(ctx:channel(opts.channel):producer())
local function exists(path) local f = io.open(path, "r") if f then f:close() return true end end
local probes, t_end = 0, socket.gettime() + (opts.probe_for or 20)
while not exists(opts.probe_file) do
  if socket.gettime() > t_end then io.stdout:write("no answer to the probe\n") os.exit(3) end
  assert(p:submit("probe"))
  probes = probes + 1
  ctx:run_once(0.05)
end
io.stdout:write("probed\n")
local t0 = socket.gettime()
for i = 1, opts.n do
  assert(p:submit({ i = i }))
  if i % opts.chunk == 0 then ctx:run_once(0) end
end
local burst = socket.gettime() - t0
t_end = socket.gettime() + (opts.probe_for or 20)
while not exists(opts.added_file) do
  if socket.gettime() > t_end then io.stdout:write("the consumers were not all added\n") os.exit(3) end
  ctx:run_once(0.05)
end
local t_sync = socket.gettime()
local ok, errs = p:submit_sync("final", { timeout = opts.sync_timeout or 20 })
local t_return = socket.gettime()
local f = io.open(opts.final_file, "r")
local final_at_return = f and f:read("*a") or false
if f then f:close() end
local list = {}
for _, e in ipairs(type(errs) == "table" and errs or {}) do
  list[#list + 1] = { context = e.context, consumer = e.consumer, err = e.err }
end
io.stdout:write(cjson.encode{ ok = ok and true or false, errs = list, errtext = errs and tostring(errs),
                              t_sync = t_sync, t_return = t_return, final_at_return = final_at_return,
                              probes = probes, burst = burst }, "\n")
ctx:close()
os.exit(0)
]]

-- The consuming process of obs. 5 (heartbeat 0: a producer starved for
-- longer than two heartbeats would otherwise be declared dead, doc/semantics.md's
-- liveness rule, which is not what obs. 5 is about): two modulated
-- consumers of opts.channel,
--   modest  a loop of opts.iters iterations per event (well under the
--           budget in CPU time), stamping each event with the wall time the
--           call took (ev.wall, from the granted clock capability);
--   looping loops for ever on every event.
-- Prints "ready", then once opts.done_file exists (or after opts.duration)
-- one JSON line:
-- { keys, errors = { modest, looping }, seqs (ev.i of modest, in order),
--   walls (max, count over opts.budget), got_end }.
M.starved_consumers = [=[
local cjson = require "cjson"
local lecho = require "lecho"
local opts = cjson.decode(arg[1])
io.stdout:setvbuf("line")
local ctx = lecho.context{ nameserver = opts.ns, quiet = not os.getenv("LECHO_SPEC_LOG"), heartbeat = 0 }
local ch = ctx:channel(opts.channel)
local res = { keys = {}, errors = { modest = {}, looping = {} }, seqs = {}, wall_max = 0, wall_over = 0,
              looping_events = 0 }
local modest = assert(ch:consumer(function(ev)
  if ev == "end" then res.got_end = true; return end
  res.seqs[#res.seqs + 1] = ev.i
  if ev.wall > res.wall_max then res.wall_max = ev.wall end
  if ev.wall > opts.budget then res.wall_over = res.wall_over + 1 end
end, { modulator = [[
  function enqueue(ev)
    if type(ev) ~= "table" then return ev end
    local t0 = clock()
    local x = 0
    for i = 1, params.iters do x = x + i end
    ev.x = x
    ev.wall = clock() - t0
    return ev
  end ]], params = { iters = opts.iters }, capabilities = { "clock" },
  on_error = function(e) table.insert(res.errors.modest, tostring(e)) end }))
local looping = assert(ch:consumer(function() res.looping_events = res.looping_events + 1 end, {
  modulator = [[ function enqueue(ev) while true do end end ]],
  on_error = function(e) table.insert(res.errors.looping, tostring(e)) end }))
res.keys = { modest = modest.mod.key, looping = looping.mod.key }
io.stdout:write("ready\n")
-- Stays until the spec writes opts.done_file (the producer has finished):
-- a consumer leaving while the producer waits in its sync submit is not
-- this spec's subject.
ctx:every(0.05, function()
  local f = io.open(opts.done_file, "r")
  if f then f:close(); ctx:stop() end
end)
ctx:after(opts.duration or 40, function() res.timeout = true; ctx:stop() end)
ctx:run()
io.stdout:write(cjson.encode(res), "\n")
ctx:close()
os.exit(0)
]=]

-- The starved producing process of obs. 5 (the spec runs it under taskset
-- and nice; heartbeat 0 as its consumer): grants "clock", submits opts.n tables { i = k } (the loop runs
-- between every 50), then submit_sync("end").  One JSON line: { ok, errs,
-- elapsed, cpu (this process's CPU seconds), modulators (ctx:stats()) }.
M.starved_producer = M.prelude .. [[
local ctx = lecho.context{ nameserver = opts.ns, quiet = not os.getenv("LECHO_SPEC_LOG"), heartbeat = 0 }
local p = assert(ctx:channel(opts.channel):producer{ grant = { "clock" } })
local t0, c0 = socket.gettime(), os.clock()
for i = 1, opts.n do
  assert(p:submit({ i = i }))
  if i % 50 == 0 then ctx:run_once(0) end
end
local ok, errs = p:submit_sync("end", { timeout = opts.sync_timeout or 30 })
local list = {}
for _, e in ipairs(type(errs) == "table" and errs or {}) do
  list[#list + 1] = { context = e.context, consumer = e.consumer, err = e.err }
end
local mods = {}
for k, m in pairs(ctx:stats().modulators or {}) do mods[k] = { calls = m.calls, time = m.time } end
io.stdout:write(cjson.encode{ ok = ok and true or false, errs = list, errtext = errs and tostring(errs),
                              elapsed = socket.gettime() - t0, cpu = os.clock() - c0,
                              modulators = mods }, "\n")
ctx:close()
os.exit(0)
]]

-- A producer that submits one event (opts.first), runs its loop for
-- opts.settle seconds (time for a modulator that fails on it to be reported
-- and unloaded), prints "submitting TIME", then submit_sync(opts.last).  One
-- JSON line: { ok, errs, errtext, t_submit, t_return }.
M.sync_after_failure = M.prelude .. [[
local ctx = lecho.context{ nameserver = opts.ns, quiet = not os.getenv("LECHO_SPEC_LOG") }
local p = assert(ctx:channel(opts.channel):producer())
assert(p:submit(opts.first))
local t = ctx:now() + opts.settle
while ctx:now() < t do ctx:run_once(0.05) end
local t_submit = socket.gettime()
io.stdout:write("submitting ", t_submit, "\n")
local ok, errs = p:submit_sync(opts.last, { timeout = opts.sync_timeout or 10 })
local t_return = socket.gettime()
local list = {}
for _, e in ipairs(type(errs) == "table" and errs or {}) do
  list[#list + 1] = { context = e.context, consumer = e.consumer, err = e.err }
end
io.stdout:write(cjson.encode{ ok = ok and true or false, errs = list, errtext = errs and tostring(errs),
                              t_submit = t_submit, t_return = t_return }, "\n")
ctx:close()
os.exit(0)
]]

-- A name server that is also the attacker: it serves lookups and joins as
-- any, and once the file opts.go names exists it sends the producer of
-- channel `ch` the member list the file holds (JSON: ch, consumers, mods), with
-- a version above the real one (no mods: none; SELF in the list stands for
-- its own address).  It says "ready ADDR", then "sent" and whatever the
-- producer confirmed ("refused TEXT" or "applied").  (limits_members_spec,
-- limits_peers_spec)
M.rogue_manager = [[
local cjson = require "cjson"
local lecho = require "lecho"
local opts = cjson.decode(arg[1])
io.stdout:setvbuf("line")
local ctx = lecho.context{ quiet = true }
io.stdout:write("ready ", ctx.addr, "\n")
local sent = false
local real = ctx._on_ctrl
ctx._on_ctrl = function(self, from, msg, ...)  -- (...: the connection's generation)
  if sent and type(msg) == "table" and msg.op == "members_ok" and msg.ver == 2 ^ 40 then
    io.stdout:write(msg.refused and ("refused " .. msg.refused) or "applied", "\n")
  end
  return real(self, from, msg, ...)
end
ctx:every(0.05, function(t)
  local f = io.open(opts.go)
  if not f then return end
  local list = cjson.decode(f:read("*a"))
  f:close()
  local c = ctx.reg.channels[list.ch]
  local producer = c and next(c.producers)
  if not producer then return end
  t:stop()
  for i, a in ipairs(list.consumers) do
    if a == "SELF" then list.consumers[i] = ctx.addr end
  end
  sent = true
  ctx:_send_ctrl(producer, { op = "members", ch = list.ch, ver = 2 ^ 40, mid = 1,
                             consumers = list.consumers, mods = list.mods or {} })
  io.stdout:write("sent\n")
end)
ctx:after(60, function() ctx:stop() end)
ctx:run()
ctx:close()
]]

-- A member of a group (lecho.group; presence_spec, nameserver_restart_spec).
-- opts: ns (a list of addresses), group, lease, data, watch (print every
-- change as "change JSON"), join (false: watch only), leave_after (seconds: then g:leave() and say
-- "left"), leave_on (a file: once it exists, the same), duration (seconds bound, default 60).  Says "ready ADDR" once
-- joined, or "failed ERR CODE".
M.group_member = M.prelude .. [[
local ctx = lecho.context{ quiet = true, nameserver = opts.ns, timeout = opts.timeout or 2 }
local watch = opts.watch and function(c)
  io.stdout:write("change ", cjson.encode(c), "\n")
end or nil
local g, err, code = ctx:group(opts.group, { lease = opts.lease, data = opts.data, watch = watch, join = opts.join })
if not g then
  io.stdout:write("failed ", tostring(err), " ", tostring(code), "\n")
  os.exit(1)
end
io.stdout:write("ready ", ctx.addr, "\n")
if opts.leave_after then
  ctx:after(opts.leave_after, function() g:leave() io.stdout:write("left\n") end)
end
if opts.leave_on then
  ctx:every(0.05, function(t)
    local f = io.open(opts.leave_on)
    if f then f:close() t:stop() g:leave() io.stdout:write("left\n") end
  end)
end
ctx:after(opts.duration or 60, function() ctx:stop() end)
ctx:run()
ctx:close{ linger = 0 }
]]

-- A producer of "field" for the specs of modulator changes
-- (spec/install_direct_spec.lua, spec/params_inband_spec.lua; opts
-- { ns, n, secs, linger }): says "ready ADDR", submits events { i = 1, 2,
-- ... } every 2 ms in fives until n were sent or secs seconds passed,
-- then a sync { done = true, i = 0 } (so every event before it reached
-- the consumers), says "sent", and stays for linger seconds (0.1 by
-- default: the attacks of a spec run meanwhile).
M.field_producer = [[
local cjson = require "cjson"
local lecho = require "lecho"
local a = cjson.decode(arg[1])
local ctx = lecho.context{ nameserver = a.ns }
local p = assert(ctx:channel("field"):producer())
io.stdout:write("ready ", ctx.addr, "\n"); io.stdout:flush()
local i, t0 = 0, ctx:now()
ctx:every(0.002, function(t)
  for _ = 1, 5 do
    if a.n and i >= a.n then break end
    i = i + 1
    assert(p:submit{ i = i })
  end
  if (a.n and i >= a.n) or (a.secs and ctx:now() - t0 > a.secs) then t:stop(); ctx:stop() end
end)
ctx:run()
assert(p:submit_sync({ done = true, i = 0 }, { timeout = 20 }))
io.stdout:write("sent\n"); io.stdout:flush()
ctx:after(a.linger or 0.1, function() ctx:stop() end); ctx:run()
ctx:close()
]]

-- The modulator those specs install: each event tagged with its params' tag.
M.tag_modulator = "function enqueue(ev) ev.tag = params.tag return ev end"

return M
