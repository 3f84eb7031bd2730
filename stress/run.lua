-- stress/run.lua: the seeded stress harness of lecho (issue 8).
--
--   luajit stress/run.lua --seed N [--seconds S] [--scenario NAME] [--dir DIR] [--keep]
--   luajit stress/run.lua --for TOTAL [--seconds S]     random seeds for TOTAL seconds
--
-- A seed makes a scenario (every random choice comes from one PRNG seeded by
-- it; the scenario name, unless given, too) and the scenario is run with real
-- processes on 127.0.0.1: a name server, maybe managers, producers and
-- consumers (plain and modulated) that join, leave, are SIGKILLed, SIGSTOPped
-- and resumed, fire-and-forget publishers, small queues under each policy,
-- the name server and managers killed and restarted, and for part of every
-- run one busy loop per core.  Each process logs what it did
-- (stress/proc.lua); stress/check.lua then checks the logs.  Exit status:
-- 0 no violation, 1 violations, 2 usage or harness failure, 130 interrupted.
-- Needs LUA_PATH/LUA_CPATH with the tree's lua/ first and the tree root on
-- the path (the Makefile's SPEC_ENV does it; `stress.*` modules are found
-- from the root).
local root = os.getenv("LECHO_ROOT") or "."
package.path = root .. "/?.lua;" .. package.path
local lib = require "stress.lib"
local sys = require "stress.os"
local keys = require "stress.keys"
local proc = require "spec.support.proc"
local check = require "stress.check"
local json = lib.json
local now = lib.now

local NAMES = { "mixed", "mixed", "block", "drops", "churn", "control", "ff" }
local SCENARIOS = { mixed = true, block = true, drops = true, churn = true, control = true, ff = true }
local LUAJIT = os.getenv("LUAJIT") or "luajit"
local DRAIN = 3       -- seconds between the last producer's exit and the consumers' stop
local SLACK = 32 * 1024 * 1024  -- producer RSS allowed above its start + queues (see check.lua)

------------------------------------------------------------------------------
-- Scenario generation: a pure function of (seed, seconds, name)

-- mode: "keyed" (every process with a key, the name server with a policy),
-- "protected" (no keys), or "both": keyed for odd seeds.  Every scenario has
-- the attacker of stress/attacker.lua beside it.
local function gen(seed, T, name, mode)
  local R = lib.rng(seed)
  local pick_name = R.pick(NAMES)
  name = name or pick_name
  local all = name == "mixed"
  mode = mode or "both"
  local sc = { seed = seed, seconds = T, name = name, procs = {}, actions = {}, drain = DRAIN,
               rss_slack = SLACK, attacker = true,
               keyed = mode == "keyed" or (mode == "both" and seed % 2 == 1) }
  local pend = 0.75 * T
  local function add(p) sc.procs[#sc.procs + 1] = p; return p end
  local function act(at, what, id, extra)
    local a = extra or {}
    a.at, a.what, a.id = at, what, id
    sc.actions[#sc.actions + 1] = a
    return a
  end
  local function stops_for(id, n, from, to)
    local total = 0
    for _ = 1, n do
      local at, dur = R.range(from, to), R.range(0.3, 2.0)
      act(at, "stop", id)
      act(at + dur, "cont", id)
      total = total + dur
    end
    return total
  end

  -- control plane
  sc.managers = 0
  if name == "control" or (all and R.chance(0.4)) then sc.managers = R.int(1, 2) end
  if name == "control" or (all and R.chance(0.3)) then
    local at = R.range(0.3, 0.55) * T
    act(at, "ns_kill", "ns", { down = R.range(0.3, 1.5) })
  end
  if sc.managers > 0 and (name == "control" or (all and R.chance(0.5))) then
    act(R.range(0.3, 0.6) * T, "mgr_kill", "m" .. R.int(1, sc.managers), { down = R.range(0.3, 1.5) })
  end
  -- busy loops, one per core, for part of every run
  local bstart = R.range(0.05, 0.35) * T
  sc.busy = { start = bstart, stop = math.min(bstart + R.range(0.3, 0.5) * T, 0.9 * T) }

  -- the block channel
  local stop_total = 0
  if name ~= "drops" then
    local ql = R.pick{ 4096, 8192, 16384, 65536 }
    local kinds = { "plain", "even", "pass", "param", "switch" }
    if name == "block" or name == "ff" then kinds = { "plain", "plain", "even", "pass" } end
    local nc = name == "churn" and R.int(3, 5) or R.int(2, 4)
    local initial = {}
    for i = 1, nc do
      local id = "c" .. i
      local p = add{ id = id, role = "consumer", ch = "blk", kind = R.pick(kinds) }
      if i <= 2 then
        p.start = R.range(0, 0.08) * T
        initial[#initial + 1] = id
      else
        p.start = R.range(0.1, 0.55) * T
        if R.chance(name == "churn" and 0.5 or 0.3) then
          p.leave = R.range(p.start + 1, 0.72 * T)
        elseif R.chance(name == "churn" and 0.4 or 0.2) then
          act(R.range(p.start + 1, 0.72 * T), "kill", id)
        end
      end
      if (name == "block" or all or name == "churn") and R.chance(0.4) then
        stop_total = stop_total + stops_for(id, R.int(1, 2), math.max(p.start + 0.5, 0.15 * T), 0.65 * T)
      end
      if p.kind == "param" then
        p.changes = {}
        local t = p.start + 0.5
        for _ = 1, R.int(1, 3) do
          t = R.range(t + 0.3, math.max(t + 0.4, 0.7 * T))
          local m = R.int(1, 3)
          p.changes[#p.changes + 1] = { at = t, params = { m = m, r = R.int(0, m - 1) } }
        end
      elseif p.kind == "switch" then
        p.changes = {}
        local t = p.start + 0.5
        for j = 1, R.int(1, 2) do
          t = R.range(t + 0.3, math.max(t + 0.4, 0.7 * T))
          p.changes[#p.changes + 1] = { at = t, mod = j % 2 == 1 and "even" or "pass",
                                        tag = j % 2 == 1 and "B" or "C" }
        end
      end
    end
    local np = name == "block" and 2 or R.int(1, 2)
    for i = 1, np do
      local id = "p" .. i
      local p = add{ id = id, role = "producer", ch = "blk", policy = "block", queue_limit = ql,
                     mode = (name == "block" and i == 2) and "timer" or R.pick{ "loop", "loop", "timer" },
                     start = R.range(0.05, 0.25) * T, stop = pend - R.range(0, 0.1) * T,
                     rate = R.int(100, 800), size = R.pick{ 16, 100, 500, 1500 },
                     sync_every = R.pick{ 0, 50, 200 }, sync_timeout = 5 }
      p.max = math.ceil(p.rate * (p.stop - p.start)) + 1
      if (all or name == "churn") and R.chance(0.15) then act(R.range(0.3, 0.6) * T, "kill", id) end
    end
    local nff = name == "ff" and R.int(2, 4) or (all and R.int(0, 2) or 0)
    for i = 1, nff do
      add{ id = "f" .. i, role = "ff", ch = "blk", policy = "block", queue_limit = ql,
           start = R.range(0.15, 0.7) * T, n = R.int(1, 50), size = R.pick{ 16, 500 }, stop = T,
           after_join = initial }
    end
  end

  -- drop channels: one producer process, one consumer process, per policy
  for _, pol in ipairs{ "drop_oldest", "drop_newest", "disconnect" } do
    if name == "drops" or (all and R.chance(0.35)) then
      local chn = "d_" .. pol
      local cid, pid = "dc_" .. pol, "dp_" .. pol
      add{ id = cid, role = "consumer", ch = chn, kind = R.pick{ "plain", "pass" },
           start = R.range(0, 0.05) * T, drop_pair = pid }
      local p = add{ id = pid, role = "producer", ch = chn, policy = pol,
                     queue_limit = R.pick{ 16384, 32768, 65536 }, batch_bytes = 262144,
                     mode = "loop", start = R.range(0.05, 0.15) * T, stop = pend,
                     rate = R.int(400, 1500), size = R.pick{ 2048, 4096, 8192 },
                     sync_every = 0, sync_timeout = 10, after_join = { cid }, drop_pair = cid }
      p.max = math.ceil(p.rate * (p.stop - p.start)) + 1
      local at = R.range(0.25, 0.45) * T
      local dur = R.range(1.0, 2.5)
      act(at, "stop", cid)
      act(at + dur, "cont", cid)
    end
  end

  -- bounds (seconds from the scenario's start) past which a process hangs
  for _, p in ipairs(sc.procs) do
    if p.role == "producer" then p.bound = p.stop + stop_total + 25
    elseif p.role == "ff" then p.bound = p.start + 25
    else p.bound = T + stop_total + 45 end
  end
  table.sort(sc.actions, function(a, b) return a.at < b.at end)
  return sc
end

------------------------------------------------------------------------------
-- Running a scenario

local interrupted
local function poll_signal()
  local s = sys.signalled()
  if s then interrupted = s end
  return interrupted
end

local function run(sc, dir)
  local T0 = now()
  sc.t0 = T0
  lib.write(dir .. "/scenario.json", json.encode(sc))
  local D = lib.logger(dir .. "/driver.jsonl")
  local anchor = proc.fork({ "sleep", tostring(math.floor(sc.seconds * 4 + 600)) },
                           "/dev/null", "/dev/null", 0)
  local pgid = anchor
  local live = {}       -- pid -> proc record
  local procs = {}      -- id -> { spec, pid, exit, ... }
  local function spawn(id, argv, role, extra)
    local out, err = dir .. "/" .. id .. ".out", dir .. "/" .. id .. ".err"
    local pid = proc.fork(argv, out, err, pgid)
    local r = procs[id] or { id = id, role = role, runs = {} }
    procs[id] = r
    r.pid, r.exited = pid, nil
    r.runs[#r.runs + 1] = { pid = pid, out = out, err = err }
    for k, v in pairs(extra or {}) do r[k] = v end
    live[pid] = r
    D.w{ k = "spawn", id = id, pid = pid, role = role }
    return r
  end
  local function signal(r, sig, what)
    if not r or not r.pid or r.exited then return end
    D.w{ k = what or sig:lower(), id = r.id, pid = r.pid, sig = sig }
    proc.signal(r.pid, sig)
  end
  local function reap()
    while true do
      local pid, st = proc.reap()
      if not pid then return end
      local r = live[pid]
      if r then
        live[pid] = nil
        r.exited = true
        D.w{ k = "exit", id = r.id, pid = pid, code = st.code, signal = st.signal, max_rss = r.max_rss,
             rss_peaks = r.rss_peaks }
      end
    end
  end
  local function wait_file(path, pat, secs, r)
    local s = proc.wait_file(path, pat, secs, function(dt)
      lib.sleep(dt)
      reap()
      return poll_signal() or (r and r.exited)
    end)
    return s and s:match("[^\n]+")
  end

  -- keyed: a key per process (named for its id; managers mgr1, mgr2), the
  -- name server's with the policy (stress/keys.lua)
  local K, ns_args = nil, { "--quiet" }
  if sc.keyed then
    local names = {}
    for _, p in ipairs(sc.procs) do names[#names + 1] = p.id end
    for i = 1, sc.managers do names[#names + 1] = "mgr" .. i end
    K = keys.make(dir, names)
    ns_args = { "--quiet", "--key", K.key.nameserver, "--trust", K.trust, "--policy", K.policy }
  end

  -- name server: on a port the OS chooses; restarted on the same port
  local ns_port_file = dir .. "/ns.addr"
  local function start_ns(listen, n)
    local r
    return proc.nameserver{
      root = root, luajit = LUAJIT, port_file = ns_port_file, listen = listen, args = ns_args,
      start = function(argv)
        r = spawn(n == 1 and "ns" or "ns" .. n, argv, "ns")
        return r
      end,
      timeout = 10, poll = function(dt)
        lib.sleep(dt)
        reap()
        return poll_signal() or r.exited
      end }
  end
  local _, ns = start_ns("127.0.0.1:0", 1)
  if not ns then
    D.w{ k = "harness", m = "name server did not start" }
    proc.signal(-pgid, "KILL")
    return false, "name server did not start"
  end
  D.w{ k = "ns", addr = ns }
  local nsn = 1
  local mgrs = {}
  local function start_mgr(i, gen_)
    local pf = dir .. "/m" .. i .. "." .. gen_ .. ".addr"
    local id = gen_ == 1 and "m" .. i or ("m%d.%d"):format(i, gen_)
    local argv = { LUAJIT, root .. "/scripts/lecho-manager", "--nameserver", ns, "--port-file", pf, "--quiet" }
    if K then
      for _, a in ipairs{ "--key", K.key["mgr" .. i], "--trust", K.trust } do argv[#argv + 1] = a end
    end
    local r = spawn(id, argv, "manager")
    mgrs["m" .. i] = r
    wait_file(pf, ":%d+", 10, r)
  end
  for i = 1, sc.managers do start_mgr(i, 1) end

  -- the attacker, from now to the end (stress/attacker.lua)
  local stopfile = dir .. "/stop"
  do
    local chans, seen = {}, {}
    for _, p in ipairs(sc.procs) do
      if not seen[p.ch] then seen[p.ch] = true; chans[#chans + 1] = p.ch end
    end
    local a = { log = dir .. "/attacker.jsonl", dir = dir, ns = ns, t0 = T0, stopfile = stopfile,
                bound = sc.seconds * 3 + 100, keyed = sc.keyed, channels = chans }
    if K then a.key = { pk = lib.hex(K.mallory.pk), sk = lib.hex(K.mallory.sk) } end
    spawn("attacker", { LUAJIT, root .. "/stress/attacker.lua", json.encode(a) }, "attacker")
  end

  local pending = {}
  for _, p in ipairs(sc.procs) do pending[#pending + 1] = p end
  table.sort(pending, function(a, b) return a.start < b.start end)
  local joined = {}
  local function has_joined(id)
    if joined[id] then return true end
    local s = lib.read(dir .. "/" .. id .. ".jsonl")
    local r = procs[id]
    if (s and (s:find('"k":"join"', 1, true) or s:find('"k":"gave_up"', 1, true)))
       or (r and r.exited) then
      joined[id] = true
    end
    return joined[id]
  end
  local function start_proc(p)
    local spec = {}
    for k, v in pairs(p) do spec[k] = v end
    spec.ns, spec.t0, spec.log, spec.stopfile = ns, T0, dir .. "/" .. p.id .. ".jsonl", stopfile
    if K then spec.key, spec.trust = K.key[p.id], K.trust end
    spawn(p.id, { LUAJIT, root .. "/stress/proc.lua", p.role == "ff" and "ff" or p.role,
                  json.encode(spec) }, p.role, { spec = p })
  end

  local actions = {}
  for _, a in ipairs(sc.actions) do actions[#actions + 1] = a end
  local ns_down = false
  local busy = {}
  local busy_started, busy_done = false, false
  local ncpu = tonumber((io.popen("nproc"):read("*l"))) or 2
  local last_rss = 0
  local HARD = T0 + sc.seconds * 3 + 120 -- the driver's own bound for the whole scenario

  -- The name server's restart on its old address (action ns_start): a try
  -- lasts up to 10 s, ten tries at most; ns_down holds until it listens.
  local restart
  local function restart_ns(t)
    if restart.child then
      local s = lib.read(ns_port_file)
      if s and s:match("[^\n]+\n") then
        restart, ns_down = nil, false
        return
      end
      if not restart.child.exited and t < restart.t0 + 10 then return end
      if not restart.child.exited then signal(restart.child, "KILL") end
      if restart.tries >= 10 then
        D.w{ k = "harness", m = "name server did not restart on " .. ns }
        restart, ns_down = nil, false
        return
      end
    end
    nsn = nsn + 1
    restart.tries, restart.t0 = restart.tries + 1, t
    restart.child = spawn("ns" .. nsn, proc.nameserver_argv{
      root = root, luajit = LUAJIT, port_file = ns_port_file, listen = ns, args = ns_args }, "ns")
  end

  local function step()
    reap()
    local t = now() - T0
    if restart then restart_ns(t) end
    -- processes to start (after their barrier: consumers they wait for joined)
    local i = 1
    while pending[i] do
      local p = pending[i]
      if t < p.start then break end
      local ready = true
      for _, id in ipairs(p.after_join or {}) do
        if not has_joined(id) then ready = false end
      end
      if ready or t > p.start + 20 then
        if not ready then D.w{ k = "note", m = p.id .. " started without its barrier" } end
        table.remove(pending, i)
        start_proc(p)
      else
        i = i + 1
      end
    end
    -- scheduled actions
    while actions[1] and actions[1].at <= t do
      local a = table.remove(actions, 1)
      local r = procs[a.id]
      if a.what == "stop" then signal(r, "STOP")
      elseif a.what == "cont" then signal(r, "CONT")
      elseif a.what == "kill" then signal(r, "KILL")
      elseif a.what == "ns_kill" then
        ns_down = true
        signal(procs[nsn == 1 and "ns" or "ns" .. nsn], "KILL")
        table.insert(actions, 1, { at = a.at + a.down, what = "ns_start" })
        table.sort(actions, function(x, y) return x.at < y.at end)
      elseif a.what == "ns_start" then
        -- Started here, watched by restart_ns() at every step: the driver
        -- keeps its schedule (resuming stopped consumers above all) while the
        -- name server comes up, however slowly a busy host lets it.
        restart = { tries = 0 }
        restart_ns(t)
      elseif a.what == "mgr_kill" then
        signal(mgrs[a.id], "KILL")
        table.insert(actions, 1, { at = a.at + a.down, what = "mgr_start", id = a.id })
        table.sort(actions, function(x, y) return x.at < y.at end)
      elseif a.what == "mgr_start" and ns_down then
        -- a manager registers with the name server: not before it is back
        a.at = t + 0.2
        table.insert(actions, 1, a)
        table.sort(actions, function(x, y) return x.at < y.at end)
        break
      elseif a.what == "mgr_start" then
        local n = tonumber(a.id:match("%d+"))
        mgrs.gens = mgrs.gens or {}
        mgrs.gens[n] = (mgrs.gens[n] or 1) + 1
        start_mgr(n, mgrs.gens[n])
      end
    end
    -- busy loops, one per core, each bounded by itself too
    if not busy_started and t >= sc.busy.start then
      busy_started = true
      local secs = math.ceil(sc.busy.stop - sc.busy.start) + 2
      for k = 1, ncpu do
        busy[k] = spawn("busy" .. k, { LUAJIT, "-e",
          ("local t = os.time() + %d while os.time() < t do end"):format(secs) }, "busy")
      end
    end
    if busy_started and not busy_done and t >= sc.busy.stop then
      busy_done = true
      for _, r in ipairs(busy) do signal(r, "KILL", "end_busy") end
    end
    -- producer memory, sampled
    if now() - last_rss > 0.2 then
      last_rss = now()
      for pid, r in pairs(live) do
        -- (only once it runs proc.lua: between fork and exec /proc shows a
        -- copy of the driver)
        if not r.execd then
          local cl = lib.read("/proc/" .. pid .. "/cmdline")
          r.execd = cl and cl:find("stress/proc.lua", 1, true) ~= nil
        end
        if (r.role == "producer" or r.role == "ff") and r.execd then
          local rss = lib.rss(pid)
          if rss and rss > (r.max_rss or 0) then
            r.max_rss = rss
            -- each new peak with its time: check.lua takes the peak up to the
            -- process's own exit record (after it: only the teardown)
            r.rss_peaks = r.rss_peaks or {}
            r.rss_peaks[#r.rss_peaks + 1] = { now(), rss }
          end
        end
      end
    end
    -- bounds: a process past its bound hangs
    for _, r in pairs(live) do
      if r.spec and t > r.spec.bound and not r.hung then
        r.hung = true
        signal(r, "CONT", "cont")
        D.w{ k = "hang", id = r.id, pid = r.pid, bound = r.spec.bound }
        signal(r, "KILL", "kill_hung")
      end
    end
    lib.sleep(0.02)
  end

  -- phase 1: until every producer and publisher started and exited
  local function producers_done()
    if #pending > 0 then
      for _, p in ipairs(pending) do if p.role ~= "consumer" then return false end end
    end
    for _, r in pairs(procs) do
      if (r.role == "producer" or r.role == "ff") and not r.exited then return false end
    end
    return true
  end
  repeat step() until (producers_done() and now() - T0 >= sc.seconds * 0.75) or poll_signal() or now() > HARD
  -- phase 2: everyone resumed, drain, then the consumers are told to stop
  for _, r in pairs(procs) do if r.role == "consumer" then signal(r, "CONT", "cont_end") end end
  -- what was killed to be restarted is restarted now; the rest of the plan is dropped
  local restarts = {}
  for _, a in ipairs(actions) do
    if a.what == "ns_start" or a.what == "mgr_start" then a.at = 0; restarts[#restarts + 1] = a end
  end
  actions = restarts
  table.sort(actions, function(x, y) return x.what > y.what end) -- ns_start first
  step()
  -- the name server is back before the managers (they register with it)
  while (restart or actions[1]) and not poll_signal() and now() < HARD do step() end
  if not busy_done then busy_done = true; for _, r in ipairs(busy) do signal(r, "KILL", "end_busy") end end
  local t_drain = now()
  while now() - t_drain < sc.drain and not poll_signal() do step() end
  for _, p in ipairs(pending) do D.w{ k = "note", m = p.id .. " never started" } end
  pending = {}
  D.w{ k = "stopfile" }
  lib.write(stopfile, "stop\n")
  local function consumers_done()
    for _, r in pairs(procs) do
      if (r.role == "consumer" or r.role == "attacker") and not r.exited then return false end
    end
    return true
  end
  local t_stop = now()
  while not consumers_done() and now() - t_stop < 15 and not poll_signal() do step() end
  for _, r in pairs(procs) do
    if (r.role == "consumer" or r.role == "attacker") and not r.exited and not interrupted then
      D.w{ k = "hang", id = r.id, pid = r.pid, phase = "stop" }
      signal(r, "KILL", "kill_hung")
    end
  end
  -- the control plane goes last, with SIGTERM (how the scripts are stopped)
  for _, r in pairs(procs) do
    if not r.exited and (r.role == "ns" or r.role == "manager") then signal(r, "TERM", "term_end") end
  end
  local t_term = now()
  while next(live) and now() - t_term < 5 do reap(); lib.sleep(0.02) end
  for _, r in pairs(live) do signal(r, "KILL", "kill_end") end
  proc.signal(-pgid, "KILL")
  local t_k = now()
  while next(live) and now() - t_k < 5 do reap(); lib.sleep(0.02) end
  reap()
  D.w{ k = "end" }
  D.close()
  return true
end

------------------------------------------------------------------------------
-- Command line

local opts = { seconds = 30 }
local i = 1
while arg[i] do
  local a = arg[i]
  if a == "--seed" then opts.seed = tonumber(arg[i + 1]); i = i + 1
  elseif a == "--seconds" then opts.seconds = tonumber(arg[i + 1]); i = i + 1
  elseif a == "--scenario" then opts.scenario = arg[i + 1]; i = i + 1
  elseif a == "--mode" then opts.mode = arg[i + 1]; i = i + 1
  elseif a == "--for" then opts.total = tonumber(arg[i + 1]); i = i + 1
  elseif a == "--dir" then opts.dir = arg[i + 1]; i = i + 1
  elseif a == "--keep" then opts.keep = true
  elseif a == "--print" then opts.print = true
  elseif a == "--help" or a == "-h" then
    print("usage: luajit stress/run.lua --seed N [--seconds S] [--scenario NAME] [--mode MODE] [--dir DIR] [--keep] [--print]\n" ..
          "       luajit stress/run.lua --for TOTAL [--seconds S] [--scenario NAME] [--mode MODE]\n" ..
          "scenarios: mixed block drops churn control ff (default: chosen by the seed)\n" ..
          "modes: keyed, protected, both (default: keyed for odd seeds); an attacker runs beside every scenario")
    os.exit(0)
  else io.stderr:write("stress/run.lua: unknown option ", a, "\n"); os.exit(2) end
  i = i + 1
end
if opts.mode and opts.mode ~= "keyed" and opts.mode ~= "protected" and opts.mode ~= "both" then
  io.stderr:write("stress/run.lua: unknown mode ", opts.mode, " (keyed, protected, both)\n"); os.exit(2)
end
if opts.scenario and not SCENARIOS[opts.scenario] then
  io.stderr:write("stress/run.lua: unknown scenario ", opts.scenario, "\n"); os.exit(2)
end
if not opts.seed and not opts.total then
  io.stderr:write("stress/run.lua: --seed N or --for TOTAL\n"); os.exit(2)
end
if not (opts.seconds and opts.seconds >= 4) then
  io.stderr:write("stress/run.lua: --seconds must be at least 4\n"); os.exit(2)
end

if opts.print then
  print(json.encode(gen(opts.seed, opts.seconds, opts.scenario, opts.mode)))
  os.exit(0)
end

sys.trap()
io.stdout:setvbuf("line")

local function random_seed()
  local f = io.open("/dev/urandom", "rb")
  local b = f:read(4)
  f:close()
  local n = 0
  for k = 1, 4 do n = n * 256 + b:byte(k) end
  return n % 1000000000
end

local function one(seed)
  local sc = gen(seed, opts.seconds, opts.scenario, opts.mode)
  print(("seed %d scenario %s %s seconds %g   (replay: make stress-seed SEED=%d SECONDS=%g%s%s)"):format(
    seed, sc.name, sc.keyed and "keyed" or "protected", sc.seconds, seed, sc.seconds,
    opts.scenario and " SCENARIO=" .. opts.scenario or "", opts.mode and " MODE=" .. opts.mode or ""))
  local dir = opts.dir
  if not dir or opts.total then
    local p = io.popen("mktemp -d /tmp/lecho-stress-" .. seed .. ".XXXXXX")
    dir = p:read("*l")
    p:close()
  else
    os.execute("mkdir -p '" .. dir .. "'")
  end
  local t = now()
  local ok, err = run(sc, dir)
  if interrupted then return nil, dir end
  local viol, summary
  if ok then viol, summary = check.run(dir) else viol = { { kind = "harness", msg = err } } end
  for _, v in ipairs(viol) do
    print(("VIOLATION seed %d %s: %s"):format(seed, v.kind, v.msg))
  end
  print(("seed %d: %s; %d violation(s) in %.1f s; logs %s"):format(seed, summary or "", #viol,
    now() - t, (#viol > 0 or opts.keep) and dir or "(removed)"))
  if #viol == 0 and not opts.keep then os.execute("rm -rf '" .. dir .. "'") end
  return viol
end

local runs, nviol, bykind = 0, 0, {}
local failed_seeds, seeds_run = {}, {}
if opts.total then
  local t_end = now() + opts.total
  -- a scenario takes its seconds plus start, drain and stop (~20 s at most
  -- when nothing hangs; the bounds allow more)
  while now() + opts.seconds + 20 <= t_end and not interrupted do
    local seed = random_seed()
    local v = one(seed)
    if not v then break end
    runs = runs + 1
    seeds_run[#seeds_run + 1] = seed
    nviol = nviol + #v
    if #v > 0 then failed_seeds[#failed_seeds + 1] = seed end
    for _, x in ipairs(v) do bykind[x.kind] = (bykind[x.kind] or 0) + 1 end
  end
else
  local v = one(opts.seed)
  if v then
    runs = 1
    seeds_run[1] = opts.seed
    nviol = #v
    for _, x in ipairs(v) do bykind[x.kind] = (bykind[x.kind] or 0) + 1 end
    if #v > 0 then failed_seeds[1] = opts.seed end
  end
end
if interrupted then
  io.stderr:write("stress/run.lua: interrupted (signal ", interrupted, "); every process killed\n")
  os.exit(130)
end
local kinds = {}
for k, n in pairs(bykind) do kinds[#kinds + 1] = k .. " " .. n end
table.sort(kinds)
print(("stress: %s: %d scenario(s) run (seeds %s), %d violation(s)%s%s"):format(
  (nviol > 0 or runs == 0) and "FAIL" or "PASS", runs, #seeds_run > 0 and table.concat(seeds_run, " ") or "none",
  nviol, #kinds > 0 and " (" .. table.concat(kinds, ", ") .. ")" or "",
  #failed_seeds > 0 and "; failing seeds " .. table.concat(failed_seeds, " ") or ""))
os.exit(nviol > 0 and 1 or 0)
