-- bench/scale_bench.lua: the scale points people ask about (issue 13):
-- fan-out to 64 and 256 consuming contexts, 10,000 idle peers, 65,536
-- channels.
--
--   luajit bench/scale_bench.lua [--quick] [--json FILE]
--
-- Its own processes on 127.0.0.1, all started here and killed at the end:
-- a name server per part (scripts/lecho-nameserver), this process (the
-- producer of the fan-out) and children running the CHILD script below,
-- each holding one or many lecho contexts (2 cores cannot hold 256
-- processes: a child with many contexts serves them in turn, run_once(0)
-- each, sleeping 1 ms when a sweep found nothing to do).
--
--   fanout  one producer here; D consuming contexts (D = 1, 64, 256: 8
--           processes x 8 or x 32 contexts, each context its own
--           destination and connection).  Per repetition and payload (null,
--           composite): warm events, then n events async; the producer's CPU
--           (os.clock over the submits, the flush and the closing sync
--           event) / n / D against D = 1, and the time per event at the
--           consumers (the first submit to the slowest consumer's last
--           receive).  Every consumer must have got every event (counted).
--           Points interleaved (common.interleave), median and spread.
--   peers   one accepting context (a consumer of channel "idle"); 10,000
--           contexts (8 processes x 1,250) each produce on "idle" and
--           submit one event, so each dials it and handshakes; all then
--           idle (heartbeats on).  VmRSS delta / peers on both sides (the
--           connecting side's is a whole context each: its loop, listening
--           socket and name server connection too, and in a process of
--           1,250 contexts: each context's libev loop has arrays indexed by
--           descriptor number, so a context costs more the more descriptors
--           its process has), the Lua heap's and the core's read buffers'.  The accepting context's max_connections
--           and max_peers are raised to 10,100 (defaults 1024 and 4096), the
--           name server's --max-connections too, and `ulimit -n` to 20000
--           in the spawned shells.
--   channels 65,536 channels on a name server of their own (like run.lua's
--           channels workload): one context with a consumer on each, one
--           with a producer on each (one event submitted on each, every one
--           counted at the consumer): VmRSS delta / channels on each side
--           and the name server's.
-- Every wait is bounded; a child exits when this process is gone.
-- Environment, for looking closer: SCALE_ONLY=fanout,peers,channels (those
-- parts), SCALE_FAN=1,256, SCALE_REPS=N, SCALE_PEERS=N, SCALE_CHANS=N,
-- SCALE_JP=FILE (LuaJIT's profiler over the producing child's joins),
-- SCALE_NS_LUAJIT (the name servers' interpreter command, e.g. with -jp),
-- BENCH_KEEP_TMP=1 (keep the children's output).

local dir = (arg and arg[0] or ""):match("^(.*)/[^/]*$") or "."
package.path = dir .. "/?.lua;" .. dir .. "/../?.lua;" .. package.path

local USAGE = [[
usage: luajit bench/scale_bench.lua [--quick] [--json FILE]

The scale points of the benchmark suite (make bench runs it as workload
"scale"): fan-out to 64 and 256 consuming contexts (the producer's CPU per
event per destination against one destination, async null and composite,
and the time per event at the consumers; 5 interleaved repetitions),
memory per peer with 10,000 idle peers connected to one context, memory
per channel with 65,536 channels (producer, consumer, name server).
--quick (or QUICK=1): fan-out to 1 and 16 contexts, 3 repetitions, 200
peers, 1,024 channels (a few seconds: the figures are not the scale points).  --json FILE: the results (every repetition) as JSON.
]]

local cjson = require "cjson"
local common = require "common"
local proc = require "spec.support.proc"

local A = common.args(arg, USAGE)
local lecho = require "lecho"
local QUICK = A.quick
local ROOT = os.getenv("LECHO_ROOT") or (dir .. "/..")
local LUAJIT = os.getenv("LUAJIT") or "luajit"

local CFG = QUICK and {
  reps = 3, fan = { 1, 16 }, procs = 2,
  fan_n = { null = { min = 300, deliveries = 3000 }, composite = { min = 100, deliveries = 1000 } },
  peers = 200, peer_procs = 1, chans = 1024, bound = 20,
} or {
  reps = 5, fan = { 1, 64, 256 }, procs = 8,
  fan_n = { null = { min = 2000, deliveries = 50000 }, composite = { min = 500, deliveries = 20000 } },
  peers = 10000, peer_procs = 8, chans = 65536, bound = 60,
}

------------------------------------------------------------------------------
-- The children: one script, its mode in its JSON options.  Lines of JSON on
-- stdout are its reports.

local CHILD = [[
local cjson = require "cjson"
local lecho = require "lecho"
local proc = require "spec.support.proc"
local o = cjson.decode(arg[1])

local function say(t) io.stdout:write(cjson.encode(t), "\n") io.stdout:flush() end
local function rss_kb()
  local s = proc.read("/proc/self/status") or ""
  return tonumber(s:match("VmRSS:%s*(%d+)"))
end
-- What a memory figure is taken as: after a full collection.
local function mem()
  collectgarbage() collectgarbage()
  return { rss_kb = rss_kb(), lua_kb = collectgarbage("count") }
end
local CTX = { nameserver = o.ns, quiet = true, timeout = 30 }
local function new_ctx(extra)
  local t = {}
  for k, v in pairs(CTX) do t[k] = v end
  for k, v in pairs(extra or {}) do t[k] = v end
  return lecho.context(t)
end

local ctxs, total = {}, 0
-- Serves every context of this process in turn until stopped; fn, if any,
-- every 0.2 s (false from it: stop).
local function serve(fn)
  local t_check, t_end = 0, proc.clock() + (o.bound or 300)
  while true do
    local before = total
    for i = 1, #ctxs do ctxs[i]:run_once(0) end
    if total == before then proc.sleep(0.001) end
    local now = proc.clock()
    if now > t_check then
      t_check = now + 0.2
      if not proc.alive(o.parent) or now > t_end then return end
      if fn and fn() == false then return end
    end
  end
end
local function flag_seen() return proc.read(o.flag) ~= nil end

if o.mode == "fan" then
  -- o.groups: { { channel =, n = } }: n contexts consuming channel each.
  -- Control events { ctl = "reset" | "end", phase = P }: at "end" seen by
  -- every context of a group, one line { group, phase, counts, t_last }.
  for _, g in ipairs(o.groups) do
    g.st = {}
    for i = 1, g.n do
      local ctx = new_ctx()
      ctxs[#ctxs + 1] = ctx
      local st = { count = 0 }
      g.st[i] = st
      assert(ctx:channel(g.channel):consumer(function(ev)
        if type(ev) == "table" and ev.ctl then
          if ev.ctl == "reset" then st.count, st.t_last = 0, nil
          elseif ev.ctl == "end" then
            st.phase = ev.phase
            local counts, t_last = {}, 0
            for k, s in ipairs(g.st) do
              if s.phase ~= ev.phase then return end
              counts[k] = s.count
              t_last = math.max(t_last, s.t_last or 0)
            end
            say{ group = g.channel, phase = ev.phase, counts = counts, t_last = t_last }
          end
          return
        end
        st.count = st.count + 1
        total = total + 1
        st.t_last = proc.clock()
      end))
    end
  end
  say{ ready = true, contexts = #ctxs }
  serve()
elseif o.mode == "accept" then
  local m0 = mem()
  local ctx = new_ctx{ max_connections = o.max, max_peers = o.max, handshake_timeout = 60 }
  ctxs[1] = ctx
  local count = 0
  assert(ctx:channel(o.channel):consumer(function() count = count + 1; total = total + 1 end))
  local m1 = mem()
  say{ ready = true, mem_before = m1, mem_bare = m0 }
  local said = false
  serve(function()
    if count >= o.expect and not said then said = true; say{ count = count } end
    if flag_seen() then
      local st = ctx:stats()
      local up = 0
      for _, p in pairs(st.peers) do if p.connected then up = up + 1 end end
      say{ measured = true, mem = mem(), count = count, connections = st.connections,
           peers_up = up, read_buffer_bytes = st.read_buffer_bytes }
      return false
    end
  end)
  serve()
elseif o.mode == "connect" then
  local m0 = mem()
  local ps = {}
  local t0, t_sweep = proc.clock(), proc.clock()
  for i = 1, o.n do
    -- (on a loaded machine a handshake with the busy name server can take
    -- longer than the default 10 s)
    local ctx = new_ctx{ handshake_timeout = 60 }
    ctxs[i] = ctx
    local p = assert(ctx:channel(o.channel):producer())
    assert(p:submit{ from = o.id, i = i })
    ps[i] = p
    -- the earlier ones keep answering heartbeats while the others start
    if proc.clock() > t_sweep then
      for k = 1, #ctxs do ctxs[k]:run_once(0) end
      t_sweep = proc.clock() + 1
    end
  end
  say{ started = o.n, seconds = proc.clock() - t0 }
  serve(function()
    if flag_seen() then
      say{ measured = true, mem_before = m0, mem = mem(), n = o.n }
      return false
    end
  end)
  serve()
elseif o.mode == "chan_consume" then
  local ctx = new_ctx()
  ctxs[1] = ctx
  local m0 = mem()
  local count = 0
  local t0 = proc.clock()
  local cons = {}
  local function h() count = count + 1; total = total + 1 end
  for i = 1, o.n do
    cons[i] = assert(ctx:channel(o.prefix .. i):consumer(h))
    if i % 4096 == 0 then io.stderr:write(("consumers %d %.2f s\n"):format(i, proc.clock() - t0)) end
  end
  say{ ready = true, seconds = proc.clock() - t0, mem_before = m0 }
  local said = false
  serve(function()
    if count >= o.n and not said then said = true; say{ count = count } end
    if flag_seen() then say{ measured = true, mem = mem(), count = count } return false end
  end)
  serve()
elseif o.mode == "chan_produce" then
  local ctx = new_ctx()
  ctxs[1] = ctx
  local m0 = mem()
  local t0 = proc.clock()
  local ps = {}
  local jp = os.getenv("SCALE_JP") and require("jit.p")
  if jp then jp.start("Fl2", os.getenv("SCALE_JP")) end
  for i = 1, o.n do
    if jp and i == o.n then jp.stop() end
    ps[i] = assert(ctx:channel(o.prefix .. i):producer())
    if i % 4096 == 0 then io.stderr:write(("producers %d %.2f s\n"):format(i, proc.clock() - t0)) end
  end
  local t1 = proc.clock()
  for i = 1, o.n do assert(ps[i]:submit(i)) end
  ctx:flush()
  say{ joined = true, seconds = t1 - t0, mem_before = m0 }
  serve(function()
    if flag_seen() then say{ measured = true, mem = mem() } return false end
  end)
  serve()
end
for _, c in ipairs(ctxs) do pcall(c.close, c, { linger = 0 }) end
os.exit(0)
]]

local tmp = proc.tmpdir("lecho-scalebench")
local kids = proc.group(tmp)
local child_file = proc.write(tmp .. "/child.lua", CHILD)
local MYPID = common.getpid()
local clock = common.clock
local ctx -- the fan-out's producing context (this process)

local function poll(dt)
  if ctx then ctx:run_once(dt) else proc.sleep(dt) end
end

local function rss_of(pid)
  local s = proc.read(("/proc/%d/status"):format(pid)) or ""
  return tonumber(s:match("VmRSS:%s*(%d+)"))
end

--- A child running CHILD with options o (ns, parent, bound added); ulimit
-- -n raised to `nofile` first when given.
local function spawn_child(o, tag, nofile)
  o.parent, o.bound = MYPID, o.bound or 600
  local cmd = ("cd %s && %sexec %s %s %s"):format(proc.sh_quote(ROOT),
    nofile and ("ulimit -n %d && "):format(nofile) or "", LUAJIT, child_file, proc.sh_quote(cjson.encode(o)))
  return kids:spawn("sh -c " .. proc.sh_quote(cmd), tag)
end

--- The JSON lines child wrote so far.
local function lines(child)
  local out = {}
  for l in proc.output(child):gmatch("[^\n]+") do
    local ok, v = pcall(cjson.decode, l)
    if ok and type(v) == "table" then out[#out + 1] = v end
  end
  return out
end

--- Waits (bound s) until every child of list wrote a line pred accepts;
-- returns those lines (in list order), or raises.
local function wait_lines(list, pred, bound, what)
  local got = {}
  local ok = proc.wait_until(function()
    for i, c in ipairs(list) do
      if not got[i] then
        for _, l in ipairs(lines(c)) do if pred(l) then got[i] = l end end
        if not got[i] and proc.exit_code(c) then
          error(("%s: a child exited: %s"):format(what, proc.errors(c, 2000)))
        end
      end
    end
    for i = 1, #list do if not got[i] then return false end end
    return true
  end, bound, function(dt) poll(math.min(dt, 0.01)) end)
  if not ok then
    local errs = {}
    for i, c in ipairs(list) do
      if not got[i] then errs[#errs + 1] = proc.errors(c, 500) end
    end
    error(("%s: not every child answered in %d s: %s"):format(what, bound, table.concat(errs, "; ")))
  end
  return got
end

local function nameserver(tag, args)
  local child
  local _, addr = proc.nameserver{
    root = ROOT, luajit = os.getenv("SCALE_NS_LUAJIT") or LUAJIT, port_file = tmp .. "/" .. tag .. "-addr",
    args = args,
    start = function(argv)
      child = kids:spawn("ulimit -n 20000 && exec " .. proc.sh_join(argv), tag)
      return child
    end,
    timeout = 20, poll = function(dt) poll(dt) return proc.exit_code(child) end }
  if not addr then error(tag .. ": name server did not start: " .. proc.errors(child, 2000)) end
  return child, addr
end

local function stop_all(list) for _, c in ipairs(list) do proc.stop(c) end end

------------------------------------------------------------------------------
-- Fan-out

local function fanout(res)
  local ns_child, ns = nameserver("ns-fan", { "--for", "600", "--quiet" })
  ctx = lecho.context{ nameserver = ns, quiet = true, timeout = 30 }
  local prods = {}
  for _, D in ipairs(CFG.fan) do prods[D] = assert(ctx:channel("fan" .. D):producer()) end
  -- D = 1: one context in the first process; D > 1: CFG.procs processes,
  -- D / procs contexts each
  local list = {}
  for k = 1, CFG.procs do
    local groups = {}
    for _, D in ipairs(CFG.fan) do
      if D == 1 and k == 1 then groups[#groups + 1] = { channel = "fan1", n = 1 }
      elseif D > 1 then groups[#groups + 1] = { channel = "fan" .. D, n = D / CFG.procs } end
    end
    list[k] = spawn_child({ mode = "fan", ns = ns, groups = groups }, "fan" .. k)
  end
  local t0 = clock()
  wait_lines(list, function(l) return l.ready end, CFG.bound * 2, "fan-out consumers")
  res.setup_seconds = clock() - t0
  for _, D in ipairs(CFG.fan) do
    local st = ctx:stats().channels[prods[D].ch.name]
    if not st or st.destinations ~= D then
      error(("fan%d: the producer has %s destinations"):format(D, st and st.destinations))
    end
  end

  local phase = 0
  local function control(p, op)
    phase = phase + 1
    local ok, err = p:submit_sync({ ctl = op, phase = phase }, { timeout = 60 })
    if not ok then error(("control %s: %s"):format(op, tostring(err))) end
    return phase
  end

  local function run(D, pl)
    local p = prods[D]
    local v = common.payload(pl)
    local cf = CFG.fan_n[pl]
    local n = math.max(cf.min, math.floor(cf.deliveries / D))
    for _ = 1, math.max(50, math.floor(n / 10)) do assert(p:submit(v)) end
    control(p, "reset")
    local drops0 = ctx:stats().channels[p.ch.name].drops
    local t0 = clock()
    local cpu0 = os.clock()
    for _ = 1, n do
      local ok, err = p:submit(v)
      if not ok then error("submit: " .. tostring(err)) end
    end
    ctx:flush()
    local ph = control(p, "end")
    local cpu = os.clock() - cpu0
    local t_sync = clock()
    local who = D == 1 and { list[1] } or list
    local got = wait_lines(who, function(l) return l.group == "fan" .. D and l.phase == ph end,
                           CFG.bound, "fan" .. D .. " end")
    local t_last, short, ncons = 0, 0, 0
    for _, l in ipairs(got) do
      t_last = math.max(t_last, l.t_last)
      for _, c in ipairs(l.counts) do
        ncons = ncons + 1
        if c ~= n then short = short + 1 end
      end
    end
    local drops = ctx:stats().channels[p.ch.name].drops - drops0
    if ncons ~= D then error(("fan%d: %d consumers reported"):format(D, ncons)) end
    if short > 0 and drops == 0 then
      error(("fan%d %s: %d consumers missed events and nothing was counted as dropped"):format(D, pl, short))
    end
    return { n = n, dests = D, cpu_us = cpu * 1e6, cpu_us_per_ev = cpu * 1e6 / n,
             us_per_ev_dest = cpu * 1e6 / n / D, consumer_us_per_ev = (t_last - t0) * 1e6 / n,
             seconds = t_sync - t0, short_consumers = short, drops = drops }
  end

  for _, pl in ipairs{ "null", "composite" } do
    local runs, ratios = {}, {}
    for _, D in ipairs(CFG.fan) do
      runs[#runs + 1] = { "d" .. D, function() return run(D, pl) end }
      if D > 1 then ratios[#ratios + 1] = { "d" .. D, "d1" } end
    end
    local iv = common.interleave{ reps = CFG.reps, runs = runs, ratios = ratios,
                                  value = function(r) return r.us_per_ev_dest end }
    -- the time per event at the consumers, per repetition and its median
    iv.consumer_us = {}
    for name, rs in pairs(iv.runs) do
      local xs = {}
      for _, r in ipairs(rs) do
        if r.error then error(("fan-out %s %s: %s"):format(pl, name, r.error)) end
        xs[#xs + 1] = r.consumer_us_per_ev
      end
      iv.consumer_us[name] = common.median(xs)
    end
    res[pl] = iv
  end
  for _, D in ipairs(CFG.fan) do prods[D]:close() end
  stop_all(list)
  ctx:close{ linger = 0 }
  ctx = nil
  proc.stop(ns_child)
end

------------------------------------------------------------------------------
-- Idle peers

local function peers(res)
  local N, P = CFG.peers, CFG.peer_procs
  local max = N + 100
  local ns_child, ns = nameserver("ns-peers", { "--for", os.getenv("SCALE_NS_FOR") or "600", "--quiet", "--max-connections", tostring(max + 16) })
  local flag = tmp .. "/peers-measure"
  local ns_rss0 = rss_of(ns_child.pid)
  local acc = spawn_child({ mode = "accept", ns = ns, channel = "idle", expect = N, max = max, flag = flag },
                          "accept", 20000)
  local a0 = wait_lines({ acc }, function(l) return l.ready end, 30, "accepting context")[1]
  local t0 = clock()
  local list = {}
  for k = 1, P do
    list[k] = spawn_child({ mode = "connect", ns = ns, channel = "idle", n = math.floor(N / P), id = k, flag = flag },
                          "connect" .. k, 20000)
  end
  local st = wait_lines(list, function(l) return l.started end, CFG.bound * 5, "connecting contexts")
  wait_lines({ acc }, function(l) return l.count end, CFG.bound, "every peer's event at the accepting context")
  res.setup_seconds = clock() - t0
  proc.sleep(2)   -- idle
  proc.write(flag, "go\n")
  local a1 = wait_lines({ acc }, function(l) return l.measured end, 30, "accepting side's memory")[1]
  local cs = wait_lines(list, function(l) return l.measured end, 30, "connecting side's memory")
  local ns_rss1 = rss_of(ns_child.pid)
  res.peers = N
  res.accept = {
    rss_kb_before = a0.mem_before.rss_kb, rss_kb_after = a1.mem.rss_kb,
    kib_per_peer = (a1.mem.rss_kb - a0.mem_before.rss_kb) / N,
    lua_kib_per_peer = (a1.mem.lua_kb - a0.mem_before.lua_kb) / N,
    read_buffer_bytes = a1.read_buffer_bytes, connections = a1.connections, peers_up = a1.peers_up,
    events = a1.count,
  }
  local d_rss, d_lua, n = 0, 0, 0
  res.connect = { procs = {} }
  for i, c in ipairs(cs) do
    d_rss = d_rss + c.mem.rss_kb - c.mem_before.rss_kb
    d_lua = d_lua + c.mem.lua_kb - c.mem_before.lua_kb
    n = n + c.n
    res.connect.procs[i] = { n = c.n, rss_kb_before = c.mem_before.rss_kb, rss_kb_after = c.mem.rss_kb,
                             start_seconds = st[i].seconds }
  end
  res.connect.kib_per_peer = d_rss / n
  res.connect.lua_kib_per_peer = d_lua / n
  res.nameserver = { rss_kb_before = ns_rss0, rss_kb_after = ns_rss1,
                     kib_per_peer = ns_rss0 and ns_rss1 and (ns_rss1 - ns_rss0) / N }
  if a1.count ~= N then error(("peers: %d events of %d at the accepting context"):format(a1.count, N)) end
  stop_all(list)
  proc.stop(acc)
  proc.stop(ns_child)
end

------------------------------------------------------------------------------
-- Channels

local function channels(res)
  local N = CFG.chans
  local ns_child, ns = nameserver("ns-chan", { "--for", "600", "--quiet", "--channel-quota", tostring(N + 100) })
  local flag = tmp .. "/chan-measure"
  local prefix = "ch_"
  local ns_rss0 = rss_of(ns_child.pid)
  local t0 = clock()
  local con = spawn_child({ mode = "chan_consume", ns = ns, n = N, prefix = prefix, flag = flag }, "chan-consume")
  local c0 = wait_lines({ con }, function(l) return l.ready end, CFG.bound * 2, "consumers")[1]
  local pro = spawn_child({ mode = "chan_produce", ns = ns, n = N, prefix = prefix, flag = flag }, "chan-produce")
  local p0 = wait_lines({ pro }, function(l) return l.joined end, CFG.bound * 2, "producers")[1]
  local cc = wait_lines({ con }, function(l) return l.count end, CFG.bound, "every channel's event")[1]
  res.setup_seconds = clock() - t0
  res.consume_join_seconds, res.produce_join_seconds = c0.seconds, p0.seconds
  proc.sleep(1)
  proc.write(flag, "go\n")
  local c1 = wait_lines({ con }, function(l) return l.measured end, 30, "consumer's memory")[1]
  local p1 = wait_lines({ pro }, function(l) return l.measured end, 30, "producer's memory")[1]
  local ns_rss1 = rss_of(ns_child.pid)
  res.channels = N
  res.consumer = { rss_kb_before = c0.mem_before.rss_kb, rss_kb_after = c1.mem.rss_kb,
                   b_per_ch = (c1.mem.rss_kb - c0.mem_before.rss_kb) * 1024 / N,
                   lua_b_per_ch = (c1.mem.lua_kb - c0.mem_before.lua_kb) * 1024 / N, events = cc.count }
  res.producer = { rss_kb_before = p0.mem_before.rss_kb, rss_kb_after = p1.mem.rss_kb,
                   b_per_ch = (p1.mem.rss_kb - p0.mem_before.rss_kb) * 1024 / N,
                   lua_b_per_ch = (p1.mem.lua_kb - p0.mem_before.lua_kb) * 1024 / N }
  res.nameserver = { rss_kb_before = ns_rss0, rss_kb_after = ns_rss1,
                     b_per_ch = ns_rss0 and ns_rss1 and (ns_rss1 - ns_rss0) * 1024 / N }
  if cc.count ~= N then error(("channels: %d events of %d"):format(cc.count, N)) end
  proc.stop(pro)
  proc.stop(con)
  proc.stop(ns_child)
end

------------------------------------------------------------------------------

local res = { quick = QUICK, reps = CFG.reps, machine_before = common.machine(), fanout = {}, peers = {},
              channels = {} }
local ONLY = os.getenv("SCALE_ONLY")
if os.getenv("SCALE_CHANS") then CFG.chans = tonumber(os.getenv("SCALE_CHANS")) end
if os.getenv("SCALE_PEERS") then CFG.peers = tonumber(os.getenv("SCALE_PEERS")) end
if os.getenv("SCALE_FAN") then
  CFG.fan = {}
  for d in os.getenv("SCALE_FAN"):gmatch("%d+") do CFG.fan[#CFG.fan + 1] = tonumber(d) end
end
if os.getenv("SCALE_REPS") then CFG.reps = tonumber(os.getenv("SCALE_REPS")) end
local failed = {}
for _, part in ipairs{ { "fanout", fanout }, { "peers", peers }, { "channels", channels } } do
  if not ONLY or ONLY:find(part[1], 1, true) then
    local t0 = clock()
    local ok, err = xpcall(part[2], debug.traceback, res[part[1]])
    res[part[1]].seconds = clock() - t0
    if not ok then
      res[part[1]].error = tostring(err)
      failed[#failed + 1] = part[1]
      io.stderr:write("scale bench: ", part[1], " failed: ", tostring(err), "\n")
      kids:kill_all("KILL")
      if ctx then pcall(ctx.close, ctx, { linger = 0 }) ctx = nil end
    end
  end
end
res.machine_after = common.machine()
res.failed = failed
kids:kill_all("KILL")
if os.getenv("BENCH_KEEP_TMP") then io.stderr:write("scale bench: kept ", tmp, "\n") else proc.remove(tmp) end

local function f2(x) return x and ("%.2f"):format(x) or "-" end
print(("scale (%d interleaved reps%s; load %.2f before, %.2f after)"):format(CFG.reps, QUICK and ", QUICK" or "",
  res.machine_before.load1 or 0, res.machine_after.load1 or 0))
for _, pl in ipairs{ "null", "composite" } do
  local iv = res.fanout[pl]
  if iv then
    for _, D in ipairs(CFG.fan) do
      local k = "d" .. D
      local r = iv.ratios[k .. "/d1"]
      print(("  fan-out %3d async %-9s producer %s us/ev/dest%s   consumers %s us/ev"):format(D, pl,
        f2(iv.median[k]), r and ("  %sx 1 dest (%s)"):format(f2(r.median), common.spread_text(r)) or "",
        f2(iv.consumer_us[k])))
    end
  end
end
local p = res.peers
if p.accept then
  print(("  %d idle peers: accepting %.1f KiB/peer (Lua %.2f), connecting %.1f KiB/context (Lua %.2f), name server %s KiB/peer; setup %.1f s")
    :format(p.peers, p.accept.kib_per_peer, p.accept.lua_kib_per_peer, p.connect.kib_per_peer,
            p.connect.lua_kib_per_peer, f2(p.nameserver.kib_per_peer), p.setup_seconds))
end
local c = res.channels
if c.consumer then
  print(("  %d channels: consumer %.0f B/ch (Lua %.0f), producer %.0f B/ch (Lua %.0f), name server %s B/ch; setup %.1f s")
    :format(c.channels, c.consumer.b_per_ch, c.consumer.lua_b_per_ch, c.producer.b_per_ch,
            c.producer.lua_b_per_ch, f2(c.nameserver.b_per_ch), c.setup_seconds))
end
for _, f in ipairs(failed) do print("  " .. f .. " FAILED: " .. tostring(res[f].error):sub(1, 400)) end
if A.json then
  local fh = assert(io.open(A.json, "w"))
  fh:write(cjson.encode(res), "\n")
  fh:close()
end
os.exit(#failed == 0 and 0 or 1)
