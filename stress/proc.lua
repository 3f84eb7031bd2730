-- stress/proc.lua ROLE JSON: one process of a stress scenario (stress/run.lua
-- starts them).  ROLE is producer, ff (a fire-and-forget publisher) or
-- consumer; JSON carries its part of the scenario.  Every process writes
-- what it did as JSON lines to spec.log (stress/check.lua reads them):
--   all:      ctx {addr,pid}, log {m} (lecho's own log lines), error {m}, exit
--   producer: ready {rss}, s {q,ok,err,t0,t1} per submit, y {q,ok,err,t0,t1}
--             per submit_sync, stats {channels, peers} at the end
--   consumer: join {t0,t1,v}, e {p,q,s,id,v,h,T} per event handled (written
--             inside the handler, before it returns), ver {v,params|mod,ok,err},
--             moderr {m}, leave {reason,T} (written before c:close())
package.path = (os.getenv("LECHO_ROOT") or ".") .. "/?.lua;" .. package.path
local lib = require "stress.lib"
local lecho = require "lecho"
local json = lib.json
local now = lib.now

local role = arg[1]
local spec = json.decode(arg[2])
local L = lib.logger(spec.log)
local T0 = spec.t0                   -- the scenario's start, on lib.now()'s clock
local BOUND = T0 + spec.bound        -- past this the process gives up (exit 3)

local MODS = {
  pass = "function enqueue(ev) return ev end",
  even = "function enqueue(ev) if ev.s % 2 == 0 then return ev end end",
  param = "function enqueue(ev) if ev.s % params.m == params.r then return ev end end",
}

local function new_ctx()
  local ctx = lecho.context{
    nameserver = spec.ns, queue_limit = spec.queue_limit, policy = spec.policy,
    batch_bytes = spec.batch_bytes,
    key = spec.key or false, trust = spec.trust or false,  -- keyed scenarios (stress/keys.lua)
    log = function(msg) L.w{ k = "log", m = msg } end,
  }
  L.w{ k = "ctx", addr = ctx.addr, pid = lib.getpid() }
  return ctx
end

-- Retries fn (a join) every 0.3 s until it works or `until_t` passes.
local function retry(ctx, what, until_t, fn)
  while true do
    local t0 = now()
    local r, err = fn()
    if r then return r, t0 end
    L.w{ k = "join_fail", what = what, err = tostring(err), t0 = t0, t1 = now() }
    if now() > until_t then return nil end
    local sf = io.open(spec.stopfile, "r")
    if sf then sf:close(); return nil end
    ctx:run_once(0.3)
  end
end

local function producer(ff)
  local ctx = new_ctx()
  local ch = ctx:channel(spec.ch)
  local p = retry(ctx, "producer", math.min(BOUND - 5, T0 + spec.stop),
                  function() return ch:producer{ policy = spec.policy } end)
  if not p then L.w{ k = "gave_up" }; ctx:close(); L.w{ k = "exit" }; os.exit(0) end
  L.w{ k = "ready", rss = lib.rss() }
  local pad = ("x"):rep(spec.size or 16)
  local id = spec.id

  -- depth: calls of one() in progress (a wait that runs the caller's timer
  -- re-enters it: issue 8, items 3 and 8); calls: how many were made.
  local depth, calls = 0, 0
  local function one(sync, final)
    local seq = p:_seq() + 1 -- the producer's sequence (lecho.producer)
    local ev = { s = seq, id = id .. ":" .. seq, pad = pad }
    depth, calls = depth + 1, calls + 1
    local d, c0 = depth, calls
    local t0 = now()
    local ok, err
    if sync then ok, err = p:submit_sync(ev, { timeout = spec.sync_timeout })
    else ok, err = p:submit(ev) end
    local t1 = now()
    depth = depth - 1
    local rec = { k = sync and "y" or "s", q = seq, ok = ok == true, t0 = t0, t1 = t1, final = final }
    if d > 1 then rec.depth = d end
    if calls > c0 then rec.inner = calls - c0 end
    if not ok then rec.err = tostring(err) end
    if ok and p:_seq() ~= seq then rec.seqerr = p:_seq() end
    L.w(rec)
  end

  if ff then
    for _ = 1, spec.n do one(false) end
    p:flush()
    local t0 = now()
    p:close()
    ctx:close()
    L.w{ k = "closed", t0 = t0, t1 = now() }
    L.w{ k = "exit" }
    L.close()
    os.exit(0)
  end

  local stop_at, max, rate = T0 + spec.stop, spec.max, spec.rate
  local every = spec.sync_every or 0
  local i, start = 0, now()
  local function next_one()
    i = i + 1
    one(every > 0 and i % every == 0)
  end
  if spec.mode == "timer" then
    -- Submits from a ctx:every timer, a burst a tick (issue 8, item 3).
    local burst = math.max(1, math.ceil(rate * 0.01))
    -- in_tick: the timer's call is running or waiting (a wait suspends only
    -- that call; the main line must not submit beside it, or the seq it
    -- computes beforehand would not be the one the event gets).
    local in_tick = false
    local tm = ctx:every(0.01, function()
      in_tick = true
      for _ = 1, burst do
        if i >= max or now() >= stop_at then ctx:stop(); break end
        if now() > BOUND - 5 then ctx:stop(); break end
        next_one()
      end
      in_tick = false
    end)
    ctx:after(math.max(0.01, stop_at - now() + 0.05), function() ctx:stop() end)
    ctx:run()
    tm:stop()
    while in_tick and now() < BOUND - 3 do ctx:run_once(0.05) end
  else
    while i < max do
      local n = now()
      if n >= stop_at or n > BOUND - 5 then break end
      local due = start + i / rate
      if n < due then
        ctx:run_once(math.min(due - n, 0.05))
      else
        local k = 0
        repeat next_one(); k = k + 1 until k >= 50 or i >= max or now() < start + i / rate
        ctx:run_once(0)
      end
    end
  end
  one(true, true)  -- the final submit_sync: what was submitted before it is in
  local st = ctx:stats()
  local chans, peers = {}, {}
  for name, c in pairs(st.channels) do
    chans[name] = { drops = c.drops, events_out = c.events_out, events_local = c.events_local }
  end
  for addr, pe in pairs(st.peers) do
    peers[addr] = { drops = pe.drops, events_out = pe.events_out, connected = pe.connected,
                    last_error = pe.last_error }
  end
  L.w{ k = "stats", channels = chans, peers = peers, rss = lib.rss() }
  p:close()
  ctx:close()
  L.w{ k = "exit" }
  L.close()
  os.exit(0)
end

local function consumer()
  local ctx = new_ctx()
  local ch = ctx:channel(spec.ch)
  local function handler(tag)
    return function(ev, meta)
      local r = { k = "e", p = meta.producer, q = meta.seq, v = meta.params_version, h = tag, T = now() }
      if type(ev) == "table" then r.s, r.id = ev.s, ev.id else r.bad = type(ev) end
      L.w(r)
    end
  end
  local kind = spec.kind
  local opts = { on_error = function(err) L.w{ k = "moderr", m = tostring(err) } end }
  local params
  if kind == "pass" or kind == "switch" then opts.modulator = MODS.pass
  elseif kind == "even" then opts.modulator = MODS.even
  elseif kind == "param" then opts.modulator, params = MODS.param, { m = 1, r = 0 } end
  opts.params = params
  if kind == "plain" then opts = nil end
  local leave_at = spec.leave and T0 + spec.leave or math.huge
  local c, t0 = retry(ctx, "consumer", math.min(leave_at, BOUND - 5), function()
    return ch:consumer(handler(kind == "switch" and "A" or "P"), opts)
  end)
  if not c then L.w{ k = "gave_up" }; ctx:close(); L.w{ k = "exit" }; os.exit(0) end
  L.w{ k = "join", t0 = t0, t1 = now(), kind = kind, v = c:params_version(),
       params = params, mod = kind == "switch" and "pass" or nil }
  local changes = spec.changes or {}
  local nextc = 1
  local reason
  while true do
    ctx:run_once(0.05)
    local n = now()
    local ch_ = changes[nextc]
    if ch_ and n >= T0 + ch_.at then
      nextc = nextc + 1
      local a = now()
      local ok, err
      if ch_.params then
        ok, err = c:set_params(ch_.params)
      else
        ok, err = c:set_modulator(MODS[ch_.mod], {}, handler(ch_.tag))
      end
      L.w{ k = "ver", v = c:params_version(), params = ch_.params, mod = ch_.mod, ok = ok == true,
           err = err and tostring(err) or nil, t0 = a, t1 = now() }
    end
    if n >= leave_at then reason = "leave"; break end
    local sf = io.open(spec.stopfile, "r")
    if sf then sf:close(); reason = "end"; break end
    if n > BOUND then L.w{ k = "bound" }; L.close(); os.exit(3) end
  end
  L.w{ k = "leave", reason = reason, T = now() }
  c:close()
  L.w{ k = "cstats", stats = c:stats() }
  ctx:close()
  L.w{ k = "exit" }
  L.close()
  os.exit(0)
end

local ok, err = xpcall(function()
  if role == "producer" then producer(false)
  elseif role == "ff" then producer(true)
  elseif role == "consumer" then consumer()
  else error("unknown role " .. tostring(role)) end
end, debug.traceback)
if not ok then
  L.w{ k = "error", m = tostring(err) }
  io.stderr:write("stress/proc.lua ", tostring(spec.id), ": ", tostring(err), "\n")
  os.exit(1)
end
