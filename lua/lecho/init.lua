-- lecho: event channels between processes, the API people call.
--
--   local lecho = require "lecho"
--   local ctx = lecho.context{ nameserver = "127.0.0.1:7700" } -- omitted: embedded
--   local ch  = ctx:channel("ozone")
--   local p   = ch:producer()
--   p:submit(ev)                 p:submit_sync(ev, { timeout = 2 })
--   local c   = ch:consumer(function(ev, meta) end)
--   local m   = ch:consumer(demod, { modulator = src, params = {...} })  -- doc/modulators.md
--   ctx:run()  ctx:run_once(t)  ctx:stop()  ctx:every(s, fn)  ctx:after(s, fn)
--
-- This file is the Lua half of a context: channels, endpoints, the dispatch
-- of events to consumer handlers, synchronous waits, and the client side of
-- the control plane (lookups and joins, answered by lecho.registry in the
-- name server and managers).  The C half (lecho.core) owns the loop, the
-- sockets, the queues and the codec.

local core = require "lecho.core"
local registry = require "lecho.registry"
local fastenc = require "lecho.fastenc"

local M = {
  _VERSION = "0.1.0",
  protocol_version = core.protocol_version,
  encode = core.encode,
  decode = core.decode,
}

local Context, Channel, Producer, Consumer = {}, {}, {}, {}
Context.__index, Channel.__index, Producer.__index, Consumer.__index =
  Context, Channel, Producer, Consumer

local function now(self) return self.c:now() end

-- Waiting.  Every callback the loop runs (timers, descriptors, consumer
-- handlers) runs in a coroutine of the context's.  A wait inside one (a
-- blocking submit, submit_sync, a control request, close's linger) suspends
-- that coroutine only: the loop goes on serving everything else, and the
-- scheduler (Context:_turn, run before each loop turn's writes) resumes it
-- when it can go on or its deadline passed.  A wait on the program's main
-- line, outside any callback, serves the loop itself until it can go on.
-- So waits never nest: no callback ever runs inside another one's wait.
local WAIT, DONE = {}, {}
local traceback = debug.traceback

-- A deterministic text of a value (sorted keys), so that equal params give
-- equal modulator keys in every process.  The value was checked encodable.
local function canon(v, out)
  local t = type(v)
  if t == "table" then
    local keys = {}
    for k in pairs(v) do keys[#keys + 1] = k end
    table.sort(keys, function(a, b)
      local ta, tb = type(a), type(b)
      if ta ~= tb then return ta < tb end
      if ta == "boolean" then return not a and b end
      return a < b
    end)
    out[#out + 1] = "{"
    for _, k in ipairs(keys) do
      canon(k, out)
      out[#out + 1] = "="
      canon(v[k], out)
      out[#out + 1] = ";"
    end
    out[#out + 1] = "}"
  elseif t == "string" then
    out[#out + 1] = ("%q"):format(v)
  elseif t == "number" then
    out[#out + 1] = ("%.17g"):format(v)
  else
    out[#out + 1] = tostring(v)
  end
  return out
end

local CAPS = { clock = true, log = true }

-- The source of lecho.patterns, run in every modulator state before its own
-- code: pattern functions the CPU budget can stop (the C ones cannot be).
local PATTERNS_SRC
do
  local path = package.searchpath and package.searchpath("lecho.patterns", package.path)
  local f = path and io.open(path, "rb")
  if f then
    PATTERNS_SRC = f:read("*a")
    f:close()
  end
end

local sorted_keys = registry.sorted_keys

-- The identity of a modulator: `base` names the code (source, period,
-- capabilities), `key` the code with its params.
local function mod_spec(src, params, period, caps, level)
  if type(src) ~= "string" or src == "" then
    error("lecho: modulator must be Lua source text (a non-empty string)", level)
  end
  if params == nil then params = {} end
  local ok, err = core.encode(params)
  if not ok then error("lecho: modulator params cannot be sent: " .. err, level) end
  if period ~= nil and (type(period) ~= "number" or not (period >= 0.001)) then
    error("lecho: period must be a number of seconds >= 0.001", level)
  end
  local cl = {}
  for _, c in ipairs(caps or {}) do
    if not CAPS[c] then error(("lecho: unknown capability '%s' (known: clock, log)"):format(tostring(c)), level) end
    cl[#cl + 1] = c
  end
  table.sort(cl)
  local base = core.hash(table.concat(canon({ src, period or 0, cl }, {})))
  local key = core.hash(base .. table.concat(canon(params, {})))
  return { src = src, params = params, period = period, caps = cl, base = base, key = key }
end

-- "host:port" with host an IPv4 address ("localhost" is taken as 127.0.0.1).
local function parse_addr(s, what)
  if type(s) ~= "string" then
    error(("lecho: %s must be a \"host:port\" string"):format(what), 3)
  end
  local host, port = s:match("^([^:/]+):(%d+)$")
  if not host then error(("lecho: bad %s '%s' (want host:port)"):format(what, s), 3) end
  if host == "localhost" then host = "127.0.0.1" end
  return host, tonumber(port)
end

-- An error list (from submit_sync) prints as one line per failing consumer.
local ErrList = {
  __tostring = function(t)
    local out = {}
    for i, e in ipairs(t) do
      out[i] = e.consumer and ("%s: %s"):format(e.consumer, e.err) or e.err
    end
    return table.concat(out, "; ")
  end,
}

------------------------------------------------------------------------------
-- Context

--- Creates the context of this process.
-- opts: nameserver ("host:port"; omitted: a name server runs inside this
-- context), listen ("127.0.0.1:0"), manager (true: act as a channel manager
-- registered with opts.nameserver), timeout (control requests, 5 s),
-- sync_timeout (10 s), queue_limit, policy, batch_bytes, max_string,
-- max_depth, max_frame, pin_threshold, retry_interval, retry_max, heartbeat,
-- heartbeat_misses (see README), log (fn(msg)), quiet.
function M.context(opts)
  opts = opts or {}
  local host, port = parse_addr(opts.listen or "127.0.0.1:0", "listen address")
  local c = core.new(opts)
  local addr, err = c:listen(host, port)
  if not addr then c:close(); error("lecho: " .. err, 2) end
  local self = setmetatable({
    c = c, addr = addr,
    byname = {}, bychid = {},
    disp = {},            -- chid -> the list of its consumers (a small table: hot path)
    peer_addrs = {}, pnames = {},
    pending = {}, rid = 0,
    nextpid = 0, nextcid = 0,
    selfq = {}, draining = false,
    waiters = {}, cos = setmetatable({}, { __mode = "k" }), held = {},
    linger = opts.linger or 2,
    moes = {}, nextmoe = 0, moe_failed = {},
    -- the compiled encoder for submits (nil without string.buffer): same
    -- bytes as the C one, which still does what it declines
    fastenc = fastenc.new{ max_depth = opts.max_depth, max_string = opts.max_string,
                           pin = opts.pin_threshold },
    mod_budget = opts.modulator_budget or 0.005,
    mod_memory = opts.modulator_memory or 32 * 1024 * 1024,
    timeout = opts.timeout or 5,
    sync_timeout = opts.sync_timeout or 10,
    closed = false,
  }, Context)
  if opts.log then
    self.log = opts.log
  elseif opts.quiet then
    self.log = function() end
  else
    self.log = function(msg) io.stderr:write(("lecho[%s]: %s\n"):format(addr, msg)) end
  end
  self._send = function(to, msg) self:_send_ctrl(to, msg) end
  if opts.nameserver then
    local h, p = parse_addr(opts.nameserver, "nameserver")
    self.ns = h .. ":" .. p
  else
    self.ns = addr
  end
  if opts.manager or not opts.nameserver then
    self.reg = registry.new{
      addr = addr, role = opts.manager and opts.nameserver and "manager" or "nameserver",
      ack_timeout = opts.ack_timeout or 2.0,
      settle = opts.settle, recovering = opts.recovering,
      log = function(level, msg)
        if level == "warn" or level == "error" then self.log(("%s: %s"):format(level, msg)) end
      end,
    }
    self.tick = c:timer(0.1, 0.1, function() self.reg:tick(self._send, now(self)) end)
  end
  c:hooks{
    event = function(...) return self:_dispatch(...) end,
    ctrl = function(from, msg) return self:_on_ctrl(from, msg) end,
    peer = function(idx, paddr, up, reason) return self:_on_peer(idx, paddr, up, reason) end,
    log = function(msg) self.log(msg) end,
    moe_error = function(id, why) self:_moe_error(id, why) end,
    turn = function() self:_turn() end,
  }
  if opts.manager and opts.nameserver then
    local ok, rerr = self:request(self.ns, { op = "register_manager" })
    if not ok then
      self:close()
      error("lecho: cannot register as a manager with " .. self.ns .. ": " .. tostring(rerr), 2)
    end
  end
  return self
end

-- Control messages to ourselves never touch a socket: they are queued and
-- handled in order once the current handler has returned (a trampoline).
function Context:_send_ctrl(to, msg)
  if to == self.addr then
    local q = self.selfq
    q[#q + 1] = msg
    if not self.draining then
      self.draining = true
      local i = 1
      while q[i] do
        local m = q[i]
        q[i] = false
        i = i + 1
        local ok, err = pcall(self._on_ctrl, self, self.addr, m)
        if not ok then self.log("error handling a control message: " .. tostring(err)) end
      end
      self.selfq = {}
      self.draining = false
    end
    return true
  end
  local ok, err = self.c:send_ctrl(to, msg)
  if not ok then
    self.log(("cannot send to %s: %s"):format(to, err))
    self:_fail_pending(to, err)
  end
  return ok, err
end

function Context:_fail_pending(addr, why)
  for _, p in pairs(self.pending) do
    if p.to == addr and not p.reply then p.failed = why end
  end
end

--- Sends a control request and waits (serving the loop) for its reply.
-- Returns the reply table, or nil, err.
function Context:request(to, msg, timeout)
  self.rid = self.rid + 1
  local rid = self.rid
  msg.rid = rid
  local p = { to = to }
  self.pending[rid] = p
  self:_send_ctrl(to, msg)
  self:_wait(function() return p.reply or p.failed or self.closed end,
             now(self) + (timeout or self.timeout))
  self.pending[rid] = nil
  if p.reply then
    if p.reply.ok then return p.reply end
    return nil, p.reply.err or "request failed", p.reply
  end
  if p.failed then return nil, ("%s unreachable: %s"):format(to, p.failed) end
  return nil, ("no answer from %s within %gs"):format(to, timeout or self.timeout)
end

function Context:_notify(to, msg)
  self.rid = self.rid + 1
  msg.rid = self.rid
  self:_send_ctrl(to, msg)
end

function Context:_on_ctrl(from, msg)
  if type(msg) ~= "table" or type(msg.op) ~= "string" then
    self.log(("ignoring a control message without op from %s"):format(from))
    return
  end
  local op = msg.op
  if op == "reply" then
    local p = self.pending[msg.rid]
    if p then p.reply = msg end
  elseif op == "members" then
    local ch = self.byname[msg.ch]
    if ch and type(msg.ver) == "number" and type(msg.consumers) == "table"
       and msg.ver > ch.ver then
      ch.ver = msg.ver
      ch:_apply_members(msg.consumers, msg.mods)
    end
    self:_send_ctrl(from, { op = "members_ok", ch = msg.ch, ver = msg.ver, mid = msg.mid,
                            errs = ch and ch:_mod_errors(msg.mods) })
  elseif op == "stream_end" then
    local ch = self.byname[msg.ch]
    if ch and type(msg.key) == "string" then ch:_stream_ended(msg.key, msg.producer or from) end
  elseif op == "mod_error" then
    local ch = self.byname[msg.ch]
    if ch and type(msg.key) == "string" then
      ch:_tell_mod_error(msg.key, ("modulator at %s: %s"):format(tostring(msg.producer or from),
                                                                 tostring(msg.err)))
    end
  elseif self.reg then
    self.reg:handle(from, msg, self._send, now(self))
  elseif msg.rid then
    self:_send_ctrl(from, { op = "reply", rid = msg.rid, ok = false,
                            err = ("unknown op '%s' (this context is not a name server)"):format(op) })
  end
end

function Context:_on_peer(idx, addr, up, reason)
  if up then
    self.peer_addrs[idx] = addr
    return
  end
  self:_fail_pending(addr, reason or "connection lost")
  if self.reg then self.reg:peer_down(addr, self._send, now(self)) end
  -- A manager that lost its name server registers again, with the channels
  -- it manages (a restarted name server has forgotten who manages what).
  if self.reg and self.reg.role == "manager" and addr == self.ns and not self.reregister then
    self.reregister = self:every(0.5, function(t)
      local r = self:request(self.ns, { op = "register_manager",
                                        channels = sorted_keys(self.reg.channels) })
      if r then
        t:stop()
        self.reregister = nil
        for _, ch in ipairs(r.taken or {}) do
          self.log(("channel '%s' is now managed by another manager"):format(ch))
        end
      end
    end)
  end
  -- Soft state: channels managed by the lost context are joined again
  -- (lookup first: the name server may hand them to another manager).
  for _, ch in pairs(self.byname) do
    for key in pairs(ch.streams) do ch:_stream_ended(key, addr) end
    ch:_forget_kept(addr)
    if ch.manager == addr or (ch.ns == addr and ch.manager ~= self.addr) then
      ch.manager = nil
      -- Versions are the lost manager's: the next one counts from its own
      -- start, and its member lists must not look older than what we had.
      ch.ver = -1
      ch.regrace = true
      ch.recovering = true
      ch:_schedule_rejoin()
    end
  end
end

function Context:_peer_addr(idx)
  local a = self.peer_addrs[idx]
  if not a then
    a = self.c:peer_addr(idx) or "?"
    self.peer_addrs[idx] = a
  end
  return a
end

-- Runs every consumer of the channel on one decoded event (one copy per
-- context, however many consumers).  Returns the handlers run and, for a
-- sync event, the list of their errors (or nil): the ack is sent from C.
-- A modulated stream (`ch.derived`) lists { con, handler, version } entries:
-- each demodulator gets what its own modulator sent, tagged with its version.
function Context:_on_event(chid, value, peer, producer, seq, sync)
  -- The consumer list carries its channel's short name and kind, so that an
  -- event touches a few small tables, not the channel object (many channels:
  -- cache misses dominate).
  local list = self.disp[chid]
  local ch = list
  local nran, errs = 0, nil
  -- producer 0, seq 0: a sync marker on a modulated stream (the modulator
  -- sent nothing for a sync event): acknowledged once all before it ran.
  if list and list[1] and (producer ~= 0 or seq ~= 0) then
    -- "host:port#id" once per (peer, producer), not once per event: the
    -- concatenation interned a new string for every event.
    local names = self.pnames[peer]
    if not names then names = {}; self.pnames[peer] = names end
    local pname = names[producer]
    if not pname then
      local from = peer == 0 and self.addr or self:_peer_addr(peer)
      pname = from .. "#" .. producer
      names[producer] = pname
    end
    local meta = { channel = ch.short, producer = pname, seq = seq }
    local n = #list
    local snap = list
    if n > 1 then snap = { unpack(list, 1, n) } end
    local derived = ch.derived
    for i = 1, n do
      local con, handler = snap[i], nil
      if derived then
        meta.params_version = con.version
        handler, con = con.handler, con.con
      else
        handler = con.handler
      end
      if not con.closed then
        nran = nran + 1
        local ok, err = pcall(handler, value, meta)
        if not ok then
          err = tostring(err)
          con.errors = con.errors + 1
          if sync > 0 then
            errs = errs or {}
            errs[#errs + 1] = { consumer = con.id, err = err }
          else
            self.log(("consumer %s on '%s' failed: %s"):format(con.id, ch.short, err))
          end
        end
      end
    end
  end
  return nran, errs
end

function Context:_fullname(name)
  if type(name) ~= "string" or name == "" then
    error("lecho: a channel name must be a non-empty string", 3)
  end
  local ns, short = name:match("^([^/]+:%d+)/(.+)$")
  if ns then
    local h, p = parse_addr(ns, "name server of the channel")
    ns = h .. ":" .. p
  else
    ns, short = self.ns, name
  end
  return ns .. "/" .. short, ns, short
end

--- Returns the channel object for name ("ozone" or "host:port/ozone").
function Context:channel(name)
  if self.closed then error("lecho: context is closed", 2) end
  local full, ns, short = self:_fullname(name)
  local ch = self.byname[full]
  if ch then return ch end
  ch = setmetatable({
    ctx = self, name = full, ns = ns, short = short,
    chid = self.c:channel(full),
    consumers = { short = short }, producers = {}, nprod = 0,
    ver = -1, manager = nil,
    dests = {}, mods = {}, modlist = {}, failed = {}, failed_dests = {}, grants = {},  -- producing side
    all = {}, streams = {}, cjoined = false,             -- consuming side
  }, Channel)
  self.byname[full] = ch
  self.bychid[ch.chid] = ch
  self.disp[ch.chid] = ch.consumers
  return ch
end

-- Runs fn(...) in a coroutine of the context's; true when it is waiting.
function Context:_spawn(fn, ...)
  local co = coroutine.create(fn)
  self.cos[co] = true
  return self:_resume(co, ...)
end

-- Resumes one of the context's coroutines; true when it waits again.
function Context:_resume(co, ...)
  local ok, r = coroutine.resume(co, ...)
  if not ok then
    self.log("error in callback: " .. traceback(co, tostring(r)))
    return false
  end
  if coroutine.status(co) == "dead" or r == DONE then return false end
  if r ~= WAIT then
    self.log("error in callback: it yielded outside a lecho wait; it will not be resumed")
    return false
  end
  return true
end

-- Waits until ready() is true: true; or until deadline (a ctx:now() time,
-- nil: none) or the context closes: false.
function Context:_wait(ready, deadline)
  if ready() then return true end
  if self.closed then return false end
  local co = coroutine.running()
  local w = { ready = ready, deadline = deadline }
  if co and self.cos[co] then
    w.co = co
    if deadline then
      w.timer = self.c:timer(math.max(deadline - now(self), 0) + 0.001, 0, function() end)
    end
    self.waiters[#self.waiters + 1] = w
    self.c:want_turn(true)
    return coroutine.yield(WAIT)
  end
  -- The main line: serve the loop here (callbacks run beside, not inside).
  while true do
    if self.closed then return false end
    if ready() then return true end
    local left = deadline and deadline - now(self)
    if left and left <= 0 then return false end
    self.c:run_once(left)
  end
end

-- Before each loop turn's writes: resumes, in the order they began, the
-- waits that can go on or whose deadline passed.
function Context:_turn()
  local ws, i, t = self.waiters, 1, nil
  while ws[i] do
    local w = ws[i]
    local res
    if self.closed then
      res = false
    elseif w.ready() then
      res = true
    elseif w.deadline then
      t = t or now(self)
      if t >= w.deadline then res = false end
    end
    if res == nil then
      i = i + 1
    else
      table.remove(ws, i)
      if w.timer then w.timer:stop() end
      self:_resume(w.co, res)
      ws = self.waiters
    end
  end
  if not ws[1] and not self.closed then self.c:want_turn(false) end
end

-- The event hook: dispatches in a coroutine kept for it.  Returns true
-- when a handler waits: C then holds back what comes next from the same
-- peer (or the local queue) until the dispatch ends (ctx:resume).
local function dispatcher(self)
  local co = coroutine.running()
  local chid, value, peer, producer, seq, sync = coroutine.yield(DONE)
  while true do
    local nran, errs = self:_on_event(chid, value, peer, producer, seq, sync)
    local held = self.held[co]
    if held then
      -- The dispatch waited: its event hook returned long ago, so the ack
      -- (if sync) is ours to send.
      self.held[co] = nil
      if not self.closed then
        if sync > 0 then self.c:ack(peer, sync, nran, errs) end
        self.c:resume(held, chid)
      end
      nran, errs = nil, nil
    end
    chid, value, peer, producer, seq, sync = coroutine.yield(DONE, nran, errs)
  end
end

function Context:_dispatch(chid, value, peer, producer, seq, sync)
  local co = self.dco
  if not co or coroutine.status(co) ~= "suspended" then
    co = coroutine.create(dispatcher)
    self.cos[co] = true
    coroutine.resume(co, self)
    self.dco = co
  end
  local ok, r, nran, errs = coroutine.resume(co, chid, value, peer, producer, seq, sync)
  if not ok then
    self.dco = nil
    self.log("error dispatching an event: " .. traceback(co, tostring(r)))
    return false
  end
  if r == WAIT then
    -- A handler waits: this coroutine belongs to its waiter now.
    self.held[co] = peer
    self.dco = nil
    return true
  end
  -- C acknowledges a sync event with these (ctx:hooks, lua_hook.c).
  return false, nran, errs
end

--- Calls fn(timer) every sec seconds until timer:stop().  fn runs in a
-- coroutine of its own and may wait (submit_sync, a blocking submit); a
-- tick that comes while the previous call still waits is skipped.
function Context:every(sec, fn)
  local busy = false
  local function run(t)
    local ok, err = xpcall(fn, traceback, t)
    busy = false
    if not ok then self.log("error in callback: " .. tostring(err)) end
  end
  return self.c:timer(sec, sec, function(t)
    if busy then return end
    busy = true
    self:_spawn(run, t)
  end)
end

function Context:after(sec, fn)
  return self.c:timer(sec, 0, function()
    self:_spawn(function()
      local ok, err = xpcall(fn, traceback)
      if not ok then self.log("error in callback: " .. tostring(err)) end
    end)
  end)
end

--- Calls fn(watcher) on the loop whenever descriptor fd is readable, until
-- watcher:stop() (a REPL reading its terminal, say).  Each call runs in a
-- coroutine of its own and may wait; fn must read what is there, or it is
-- called again on the next loop turn.
function Context:on_readable(fd, fn)
  return self.c:io(fd, function(w)
    self:_spawn(function()
      local ok, err = xpcall(fn, traceback, w)
      if not ok then self.log("error in callback: " .. tostring(err)) end
    end)
  end)
end

function Context:run() return self.c:run() end
function Context:run_once(timeout) return self.c:run_once(timeout) end
function Context:stop() return self.c:stop() end
function Context:flush() return self.c:flush() end
function Context:now() return self.c:now() end

--- Counters per channel and per peer (see README "Statistics").
function Context:stats()
  local s = self.c:stats()
  s.addr = self.addr
  for name, ch in pairs(self.byname) do
    local cs = s.channels[name]
    if cs then
      cs.consumers = #ch.all
      cs.producers = ch.nprod
    end
    -- Modulators running here for this channel's consumers, by key.
    for key, inst in pairs(ch.mods) do
      local ms = inst.moe:stats()
      ms.consumers = inst.dests
      s.modulators = s.modulators or {}
      s.modulators[ch.name .. "@" .. key] = ms
    end
  end
  return s
end

--- Snapshot of the name server's (or a manager's) view: channels with their
-- producing and consuming contexts.
function Context:list(addr)
  local r, err = self:request(addr or self.ns, { op = "list" })
  if not r then return nil, err end
  return r.channels, r.managers
end

-- A modulator failed in this (producing) context: unloaded already; its
-- consumers are told, once the C call that found it has returned.
function Context:_moe_error(id, why)
  self.moe_failed[#self.moe_failed + 1] = { id = id, why = why }
  if not self.moe_reaper then
    self.moe_reaper = self.c:timer(0, 0, function()
      self.moe_reaper = nil
      local list = self.moe_failed
      self.moe_failed = {}
      for _, f in ipairs(list) do
        local inst = self.moes[f.id]
        if inst then inst.ch:_mod_failed(inst, f.why) end
      end
    end)
  end
end

--- Closes the context.  What was submitted before is delivered first:
-- every queue is written, then each connection ends and close waits until
-- the remote closed its side too (it has read everything), for at most
-- opts.linger seconds (the context's `linger`, 2 s by default; 0: do not
-- wait).  Returns true, or nil and what could not be delivered (also
-- logged).
function Context:close(opts)
  if self.closed then return self.close_ok, self.close_err end
  if self.closing then
    -- Another close is delivering (in a callback that waits): its result.
    self:_wait(function() return self.closed end)
    return self.close_ok, self.close_err
  end
  self.closing = true
  local linger = opts and opts.linger or self.linger
  for _, ch in pairs(self.byname) do
    for _, con in ipairs({ unpack(ch.all) }) do con:close() end
    for p in pairs(ch.producers) do p:close() end
    if ch.rejoin then ch.rejoin:stop() end
  end
  if self.tick then self.tick:stop() end
  if self.reregister then self.reregister:stop() end
  local ok, err = true, nil
  -- Lingering waits: on the main line, or in a callback of ours (it suspends).
  local can_wait = self.c:depth() == 0 or self.cos[coroutine.running() or 0]
  if linger > 0 and can_wait then
    self.c:shutdown()
    self:_wait(function() return self.c:pending() == 0 end, now(self) + linger)
  end
  local open, events, bytes = self.c:pending()
  if events > 0 then
    ok, err = nil, ("%d events (%d bytes) not delivered within the linger time of %gs"):format(
      events, bytes, linger)
  elseif open > 0 and linger > 0 then
    ok, err = nil, ("%d connections not closed by their remote within the linger time of %gs: "
      .. "what was sent there may not have been read"):format(open, linger)
  end
  if err then self.log("close: " .. err) end
  self.close_ok, self.close_err = ok, err
  self.closed = true
  self.c:close()
  return ok, err
end

------------------------------------------------------------------------------
-- Channel membership (client side of the control plane)

function Channel:_manager()
  if self.manager then return self.manager end
  local ctx = self.ctx
  local r, err = ctx:request(self.ns, { op = "lookup", ch = self.name,
                                        recovering = self.recovering or nil })
  if not r then return nil, ("name server %s: %s"):format(self.ns, err) end
  self.manager = r.manager
  self.settle = r.settle
  return r.manager
end

function Channel:_join(role)
  local mgr, err = self:_manager()
  if not mgr then return nil, err end
  local r
  local ver_before = self.ver
  local settle = self.settle
  r, err = self.ctx:request(mgr, { op = "join", ch = self.name, role = role, settle = settle,
                                   subs = role == "consumer" and self:_subs() or nil },
                            self.ctx.timeout + (settle or 0))
  if not r then
    self.manager = nil
    return nil, ("joining '%s' as %s: %s"):format(self.name, role, err)
  end
  if role == "producer" then
    -- A `members` update handled while we waited (it can come in the same
    -- read as this reply, and was already confirmed) is newer: keep it.
    if self.ver == ver_before or (r.ver or -1) > self.ver then
      self.ver = r.ver or self.ver
      self:_apply_members(r.consumers or {}, r.mods)
    end
  else
    self.cjoined = true
  end
  return r
end

function Channel:_leave(role)
  if role == "consumer" then self.cjoined = false end
  if self.manager and not self.ctx.closed then
    self.ctx:_notify(self.manager, { op = "leave", ch = self.name, role = role })
  end
end

local function others(list, me)
  local out = {}
  for _, a in ipairs(list or {}) do
    if a ~= me then out[#out + 1] = a end
  end
  return out
end

-- How long a producer that lost its manager keeps sending to the consumers
-- it had, beside those the next manager lists: the consumers join that
-- manager again too, and until they have, its lists lack them.  A consumer
-- context that the manager lists, or whose connection closes, stops being
-- kept at once; the time only bounds the others (it is sync_timeout's).
local REJOIN_GRACE = 10

local function union(a, b)
  local out, seen = {}, {}
  for _, l in ipairs({ a or {}, b or {} }) do
    for _, x in ipairs(l) do
      if not seen[x] then seen[x] = true; out[#out + 1] = x end
    end
  end
  return out
end

-- A member list from the manager.  After a manager was lost, the first
-- lists of the next one may lack consumers that have not joined it yet: for
-- REJOIN_GRACE seconds the consumers (and modulators) this producer already
-- had are kept beside them, so that a restart of the control plane costs no
-- event to a consumer present before and after it.
function Channel:_apply_members(list, mods)
  local ctx = self.ctx
  self.last_members = { list = list, mods = mods }
  if self.regrace then
    self.regrace = nil
    local kmods = {}
    for key, inst in pairs(self.mods) do kmods[key] = { base = inst.base, dests = inst.dests } end
    self.kept = { dests = self.dests, mods = kmods }
    if self.kept_timer then self.kept_timer:stop() end
    self.kept_timer = ctx:after(REJOIN_GRACE, function()
      self.kept, self.kept_timer = nil, nil
      local last = self.last_members
      if last and not ctx.closed then self:_set_consumers(last.list, last.mods) end
    end)
  end
  local kept = self.kept
  if not kept then return self:_set_consumers(list, mods) end
  -- A context the manager lists in any way has joined it again: what the
  -- manager says of it is whole.  Only the others are kept.
  mods = type(mods) == "table" and mods or {}
  local known = {}
  for _, a in ipairs(list) do known[a] = true end
  for _, m in pairs(mods) do
    for _, a in ipairs(m.dests or {}) do known[a] = true end
  end
  local function missing(l)
    local out = {}
    for _, a in ipairs(l or {}) do
      if not known[a] then out[#out + 1] = a end
    end
    return out
  end
  local mlist = union(list, missing(kept.dests))
  local mmods = {}
  for key, m in pairs(mods) do mmods[key] = m end
  for key, k in pairs(kept.mods) do
    local extra = missing(k.dests)
    if #extra > 0 then
      local m = mmods[key]
      local c = {}
      for f, v in pairs(m or k) do c[f] = v end
      c.dests = union(m and m.dests, extra)
      mmods[key] = c
    end
  end
  return self:_set_consumers(mlist, mmods)
end

-- A consumer context kept after a manager loss went away: not kept any more.
function Channel:_forget_kept(addr)
  local kept, last = self.kept, self.last_members
  if not kept then return end
  local function drop(l)
    local out = {}
    for _, a in ipairs(l or {}) do
      if a ~= addr then out[#out + 1] = a end
    end
    return out
  end
  kept.dests = drop(kept.dests)
  for _, k in pairs(kept.mods) do k.dests = drop(k.dests) end
  if last and not self.ctx.closed then self:_apply_members(last.list, last.mods) end
end

-- Producing side: who takes the plain stream, and which modulators run
-- here (installed, re-targeted after a params change, or unloaded).
function Channel:_set_consumers(list, mods)
  local ctx = self.ctx
  local dests = others(list, ctx.addr)
  self.dests = dests
  ctx.c:set_dests(self.chid, dests)
  self:_hot_update()
  mods = type(mods) == "table" and mods or {}
  -- Instances whose key went: reused for a new key of the same code and the
  -- same consumers (a params change keeps the modulator's state), else closed.
  local gone = {}
  for key, inst in pairs(self.mods) do
    if not mods[key] then gone[#gone + 1] = inst end
  end
  for key in pairs(self.failed) do
    if not mods[key] then self.failed[key], self.failed_dests[key] = nil, nil end
  end
  for _, key in ipairs(sorted_keys(mods)) do
    local m = mods[key]
    local inst = self.mods[key]
    if not inst and not self.failed[key] then
      local same = table.concat(m.dests or {}, ",")
      for i, old in ipairs(gone) do
        if old.base == m.base and old.dests_key == same then
          table.remove(gone, i)
          inst = self:_rekey(old, key, m)
          break
        end
      end
      if not inst then inst = self:_install(key, m) end
    end
    if inst then
      local added = false
      if inst.dests then
        local had = {}
        for _, d in ipairs(inst.dests) do had[d] = true end
        for _, d in ipairs(m.dests or {}) do added = added or not had[d] end
      end
      inst.dests = m.dests
      inst.dests_key = table.concat(m.dests or {}, ",")
      ctx.c:set_dests(inst.dchid, others(m.dests, ctx.addr))
      -- A context joined a running modulator: it may want to start over
      -- (a differencing modulator sends a key frame).  Failures are reported
      -- through the moe_error hook.
      if added then inst.moe:receivers(#m.dests) end
    end
  end
  for _, inst in ipairs(gone) do self:_unload(inst) end
  self:_rebuild_modlist()
  self:_end_streams(mods)
end

-- Each context that no longer takes modulator `key` from this process is
-- told so in band: the message goes after the last event of that stream on
-- the same connection, so the consumer knows nothing more will come.
function Channel:_end_streams(mods)
  local ctx = self.ctx
  local now = {}
  for key, m in pairs(mods) do
    local set = {}
    for _, a in ipairs(m.dests or {}) do set[a] = true end
    now[key] = set
  end
  for key, set in pairs(self.sub_dests or {}) do
    for a in pairs(set) do
      if not (now[key] and now[key][a]) then
        if a == ctx.addr then ctx.c:drain_local() end -- local events first
        ctx:_send_ctrl(a, { op = "stream_end", ch = self.name, key = key, producer = ctx.addr })
      end
    end
  end
  self.sub_dests = now
end

function Channel:_rebuild_modlist()
  local list = {}
  for _, key in ipairs(sorted_keys(self.mods)) do list[#list + 1] = self.mods[key].moe end
  self.modlist = list
  self:_hot_update()
end

-- Does a submit also send the plain (unmodulated) event?  Only when some
-- context takes it.
function Channel:_hot_update()
  local plain = #self.dests > 0 or #self.consumers > 0
  for p in pairs(self.producers) do
    p.mods, p.plain = self.modlist, plain
  end
end

function Channel:_derived_name(key) return self.name .. "@" .. key end

-- Loads modulator `key` here; on refusal or failure, remembers why and
-- tells its consumers.  Returns the instance or nil.
function Channel:_install(key, m)
  local ctx = self.ctx
  local err
  local grant = {}
  for _, cap in ipairs(m.caps or {}) do
    if not CAPS[cap] then
      err = ("unknown capability '%s'"):format(tostring(cap))
    elseif not self.grants[cap] then
      err = ("capability '%s' not granted by the producer"):format(cap)
    end
    if err then break end
    grant[cap] = true
  end
  local moe
  local dchid = ctx.c:channel(self:_derived_name(key))
  if not err then
    ctx.nextmoe = ctx.nextmoe + 1
    moe, err = ctx.c:moe(ctx.nextmoe, dchid, ("%s@%s"):format(self.short, key:sub(1, 8)), m.src,
                         m.params == nil and {} or m.params,
                         { budget = ctx.mod_budget, memory = ctx.mod_memory, period = m.period,
                           clock = grant.clock, log = grant.log, prelude = PATTERNS_SRC })
  end
  if not moe then
    self:_refuse(key, err, m.dests)
    return nil
  end
  local inst = { id = ctx.nextmoe, key = key, base = m.base, moe = moe, dchid = dchid, ch = self,
                 dests = m.dests }
  ctx.moes[inst.id] = inst
  self.mods[key] = inst
  return inst
end

function Channel:_rekey(inst, key, m)
  local ctx = self.ctx
  self.mods[inst.key] = nil
  local dchid = ctx.c:channel(self:_derived_name(key))
  local ok, err = inst.moe:retarget(dchid)
  if ok then ok, err = inst.moe:params(m.params == nil and {} or m.params) end
  if not ok then
    ctx.moes[inst.id] = nil
    inst.moe:close()
    self:_refuse(key, err, m.dests)
    return nil
  end
  inst.key, inst.dchid, inst.dests = key, dchid, m.dests
  self.mods[key] = inst
  return inst
end

function Channel:_unload(inst)
  self.ctx.moes[inst.id] = nil
  if self.mods[inst.key] == inst then self.mods[inst.key] = nil end
  inst.moe:close()
end

function Channel:_refuse(key, err, dests)
  local ctx = self.ctx
  self.failed[key] = err
  self.failed_dests[key] = dests
  ctx.log(("modulator %s on '%s' not running here: %s"):format(key, self.short, err))
  for _, a in ipairs(dests or {}) do
    ctx:_send_ctrl(a, { op = "mod_error", ch = self.name, key = key, err = err, producer = ctx.addr })
  end
end

-- A running modulator failed (error, budget, memory): already unloaded.
function Channel:_mod_failed(inst, why)
  if self.mods[inst.key] ~= inst then return end
  self:_unload(inst)
  self:_rebuild_modlist()
  self:_refuse(inst.key, why, inst.dests)
end

-- For members_ok: the keys of `mods` refused or failed here.
function Channel:_mod_errors(mods)
  local errs
  for key, err in pairs(self.failed) do
    if type(mods) == "table" and mods[key] then
      errs = errs or {}
      errs[key] = err
    end
  end
  return errs
end

-- After losing the manager (or the name server), join again every second
-- until it works: the control plane is soft state.
function Channel:_schedule_rejoin()
  if self.rejoin or self.ctx.closed then return end
  self.rejoin = self.ctx:every(0.5, function(t)
    if self.nprod > 0 and not self:_join("producer") then return end
    if #self.all > 0 and not self:_join("consumer") then return end
    t:stop()
    self.rejoin = nil
    self.recovering = nil
  end)
end

--- Creates a producer.  opts.policy overrides the context's queue policy.
-- Returns once the manager told this context where the consumers are.
function Channel:producer(opts)
  opts = opts or {}
  local ctx = self.ctx
  if ctx.closed then error("lecho: context is closed", 2) end
  if opts.policy and opts.policy ~= "block" and opts.policy ~= "drop_oldest"
     and opts.policy ~= "drop_newest" and opts.policy ~= "disconnect" then
    error("lecho: unknown policy '" .. tostring(opts.policy) .. "'", 2)
  end
  for _, cap in ipairs(opts.grant or {}) do
    if not CAPS[cap] then
      error(("lecho: unknown capability '%s' (known: clock, log)"):format(tostring(cap)), 2)
    end
  end
  -- Granted before joining: the join installs the current modulators.
  for _, cap in ipairs(opts.grant or {}) do self.grants[cap] = true end
  if self.nprod == 0 then
    local ok, err = self:_join("producer")
    if not ok then return nil, err end
  end
  self.nprod = self.nprod + 1
  ctx.nextpid = ctx.nextpid + 1
  -- What submit reads sits in the producer itself (one table per event:
  -- with thousands of channels, cache misses are the cost).
  local p = setmetatable({ ch = self, c = ctx.c, enc = ctx.fastenc, chid = self.chid,
                           id = ctx.nextpid, seq = 0,
                           policy = opts.policy, mods = self.modlist,
                           plain = #self.dests > 0 or #self.consumers > 0 }, Producer)
  self.producers[p] = true
  return p
end

-- Consuming side: what this context asks of the producers.
function Channel:_subs()
  local mods = {}
  for _, con in ipairs(self.all) do
    local m = con.mod
    if m then
      mods[m.key] = { src = m.src, params = m.params, period = m.period, caps = m.caps, base = m.base }
    end
  end
  return { plain = #self.consumers > 0, mods = mods }
end

local function subs_sig(subs)
  return tostring(subs.plain) .. ":" .. table.concat(sorted_keys(subs.mods), ",")
end

-- Joins, re-subscribes or leaves to match the consumers; waits for the
-- producers' confirmations.  Returns the reply (or true), or nil, err.
function Channel:_update_subs(nowait)
  if #self.all == 0 then
    self.subs_sig = nil
    if self.cjoined then self:_leave("consumer") end
    return true
  end
  local subs = self:_subs()
  local sig = subs_sig(subs)
  if self.cjoined and sig == self.subs_sig then return true end
  if not self.cjoined then
    local r, err = self:_join("consumer")
    if r then self.subs_sig = sig end
    return r, err
  end
  local mgr, err = self:_manager()
  if not mgr then return nil, err end
  self.subs_sig = sig
  local msg = { op = "subscribe", ch = self.name, subs = subs }
  if nowait then return self.ctx:_notify(mgr, msg) end
  local r
  r, err = self.ctx:request(mgr, msg)
  if not r then
    self.subs_sig = nil
    return nil, ("updating the subscription to '%s': %s"):format(self.name, err)
  end
  return r
end

-- The stream of modulator `key` into this context, with its demodulators.
function Channel:_attach(con, spec, handler)
  local ctx = self.ctx
  local st = self.streams[spec.key]
  if not st then
    local name = self:_derived_name(spec.key)
    st = { derived = true, short = self.short, key = spec.key,
           consumers = { short = self.short, derived = true }, chid = ctx.c:channel(name) }
    self.streams[spec.key] = st
    ctx.bychid[st.chid] = st
    ctx.disp[st.chid] = st.consumers
    ctx.c:set_local(st.chid, true)
  end
  local e = { con = con, handler = handler, version = spec.version }
  st.consumers[#st.consumers + 1] = e
  con.chids[st.chid] = true
  return e
end

function Channel:_detach(e)
  e.detached = true
  for key, st in pairs(self.streams) do
    local list = st.consumers
    for i = #list, 1, -1 do
      if list[i] == e then table.remove(list, i) end
    end
    if #list == 0 then
      self.streams[key] = nil
      if self.ctx.bychid[st.chid] == st then
        self.ctx.bychid[st.chid] = nil
        self.ctx.disp[st.chid] = nil
      end
      if not self.ctx.closed then self.ctx.c:set_local(st.chid, false) end
    end
  end
end

-- A producer will send nothing more of stream `key` here: old entries
-- waiting for it are detached once no producer is left to wait for.
function Channel:_stream_ended(key, producer)
  local st = self.streams[key]
  if not st then return end
  for _, e in ipairs({ unpack(st.consumers) }) do
    if e.ending then
      e.ending[producer] = nil
      if next(e.ending) == nil then self:_detach(e) end
    end
  end
end

function Channel:_tell_mod_error(key, msg)
  for _, con in ipairs({ unpack(self.all) }) do
    if con.mod and con.mod.key == key and not con.closed then
      con.mod_errors = con.mod_errors + 1
      if con.on_error then
        local ok, err = pcall(con.on_error, msg)
        if not ok then self.ctx.log("on_error handler failed: " .. tostring(err)) end
      else
        self.ctx.log(("consumer %s on '%s': %s"):format(con.id, self.short, msg))
      end
    end
  end
end

-- The errors a subscription reply reports for modulator `key`, as one string.
local function reply_errors(r, key)
  local out = {}
  for _, e in ipairs(type(r) == "table" and r.errors or {}) do
    if e.key == key then out[#out + 1] = ("modulator at %s: %s"):format(e.producer, e.err) end
  end
  if #out > 0 then return table.concat(out, "; ") end
end

--- Creates a consumer; handler(ev, meta) with meta = { channel, producer, seq }.
-- Returns once every producing context knows of it: it receives every event
-- submitted after this call returns.  opts.modulator (Lua source), params,
-- period, capabilities, on_error: see doc/modulators.md.
function Channel:consumer(handler, opts)
  if type(handler) ~= "function" then error("lecho: consumer needs a handler function", 2) end
  local ctx = self.ctx
  if ctx.closed then error("lecho: context is closed", 2) end
  opts = opts or {}
  if opts.on_error ~= nil and type(opts.on_error) ~= "function" then
    error("lecho: on_error must be a function", 2)
  end
  local spec
  if opts.modulator ~= nil then
    spec = mod_spec(opts.modulator, opts.params, opts.period, opts.capabilities, 3)
    spec.version = 1
  end
  ctx.nextcid = ctx.nextcid + 1
  local con = setmetatable({
    ch = self, handler = handler, id = ("%s/c%d"):format(ctx.addr, ctx.nextcid),
    errors = 0, mod_errors = 0, opts = opts, mod = spec, on_error = opts.on_error, chids = {},
  }, Consumer)
  self.all[#self.all + 1] = con
  if spec then
    con.entry = self:_attach(con, spec, handler)
  else
    local list = self.consumers
    list[#list + 1] = con
    if #list == 1 then ctx.c:set_local(self.chid, true) end
    self:_hot_update()
    con.chids[self.chid] = true
  end
  local r, err = self:_update_subs()
  if not r then
    con:_unlink()
    return nil, err
  end
  if type(r) == "table" and r.late and #r.late > 0 then
    ctx.log(("consumer on '%s': producers %s did not confirm in time"):format(
      self.short, table.concat(r.late, ", ")))
  end
  return con
end

------------------------------------------------------------------------------
-- Producer

-- One try: the core answers "wouldblock" when a queue has no room (and
-- then did nothing).  Returns again, r, err.
local function try_submit(self, ev, sync, bytes)
  local r, err, code = self.c:submit(self.chid, self.id, self.seq + 1, bytes or ev, sync,
                                     self.policy, self.mods, self.plain, bytes ~= nil)
  if r then self.seq = self.seq + 1 end
  return code == "wouldblock", r, err
end

-- The waiting part of submit_core: behind the submits of this producer
-- already waiting, until there is room.
local function submit_wait(self, ev, sync, bytes)
  local c = self.c
  local q = self.waitq or {}
  self.waitq = q
  local me = {}
  q[#q + 1] = me
  local ctx = self.ch.ctx
  local function ready()
    return self.closed or q[1] == me and c:room(self.chid, self.mods, self.plain)
  end
  while true do
    ctx:_wait(ready)
    if q[1] == me then table.remove(q, 1) end
    if self.closed or ctx.closed then return nil, "producer closed while waiting for room" end
    local again, r, err = try_submit(self, ev, sync, bytes)
    if not again then return r, err end
    table.insert(q, 1, me)
  end
end

-- One submit to the core: encoded once, through the modulators.  Under the
-- block policy (and for every sync submit) it first waits for room, in the
-- order the submits of this producer were called.  No closure is made unless
-- it waits (a submit is the hot path).
local function submit_core(self, ev, sync)
  local enc = self.enc
  local bytes = enc and enc(ev)
  local q = self.waitq
  if not q or not q[1] then
    local again, r, err = try_submit(self, ev, sync, bytes)
    if not again then return r, err end
  end
  return submit_wait(self, ev, sync, bytes)
end

--- Queues ev for every consumer: true, or nil, err (nothing was sent: the
-- value cannot be encoded, or the producer is closed).  Returns at once,
-- but under the block policy first waits for room in the queues.
function Producer:submit(ev)
  if self.closed then return nil, "producer is closed" end
  return submit_core(self, ev, false)
end

--- Submits ev and waits until every consumer ran its handler.
-- Returns true, or nil, errors: a list of { context, consumer, err } (it
-- prints as one line) with each failing or silent consumer, and each
-- consumer whose modulator failed here.
function Producer:submit_sync(ev, opts)
  if self.closed then return nil, "producer is closed" end
  local ctx = self.ch.ctx
  local c = ctx.c
  local timeout = opts and opts.timeout or ctx.sync_timeout
  local ids, err = submit_core(self, ev, true)
  if not ids then return nil, err end
  local deadline = c:now() + timeout
  -- Consumers whose modulator failed or was refused here got nothing: as
  -- they were at the submit (a membership change during the wait may drop
  -- the record) and as they are after it.
  local ch = self.ch
  local failed
  if next(ch.failed) then
    failed = {}
    for key, why in pairs(ch.failed) do failed[key] = { why = why, dests = ch.failed_dests[key] } end
  end
  -- One call per look: false while waiting, then true or nil, errors (no
  -- tables unless something failed); past the deadline, with the timeout,
  -- silent consumers become errors.
  local ok, all
  ctx:_wait(function()
    ok, all = c:sync_result(ids)
    return ok ~= false
  end, deadline)
  if ctx.closed then return nil, "context closed while waiting" end
  if ok == false then ok, all = c:sync_result(ids, timeout) end
  for key, why in pairs(ch.failed) do
    if not (failed and failed[key]) then
      failed = failed or {}
      failed[key] = { why = why, dests = ch.failed_dests[key] }
    end
  end
  for _, key in ipairs(failed and sorted_keys(failed) or {}) do
    local f = failed[key]
    for _, a in ipairs(f.dests or {}) do
      all = all or {}
      all[#all + 1] = { context = a, err = ("modulator %s not running at %s: %s"):format(
        key, ctx.addr, f.why) }
    end
  end
  if all and #all > 0 then return nil, setmetatable(all, ErrList) end
  return true
end

--- Writes whatever this context has queued, now.
function Producer:flush() self.ch.ctx.c:flush() end

function Producer:close()
  if self.closed then return end
  self.closed = true
  local ch = self.ch
  ch.producers[self] = nil
  ch.nprod = ch.nprod - 1
  if ch.nprod == 0 then
    ch.ctx.c:flush()
    ch:_leave("producer")
  end
end

------------------------------------------------------------------------------
-- Consumer

-- Removes the consumer from the channel's lists (its handlers stop at once).
function Consumer:_unlink()
  local ch = self.ch
  for _, list in ipairs({ ch.all, ch.consumers }) do
    for i = #list, 1, -1 do
      if list[i] == self then table.remove(list, i) end
    end
  end
  if self.entry then ch:_detach(self.entry) end
  for _, e in ipairs(self.old_entries or {}) do ch:_detach(e) end
  if not self.mod and #ch.consumers == 0 and not ch.ctx.closed then
    ch.ctx.c:set_local(ch.chid, false)
  end
  ch:_hot_update()
end

--- Stops the handler at once: nothing is delivered to it after close().
function Consumer:close()
  if self.closed then return end
  self.closed = true
  self:_unlink()
  if not self.ch.ctx.closed then self.ch:_update_subs(true) end
end

-- Switches to modulator spec with demodulator handler; waits for producers.
function Consumer:_switch(spec, handler)
  if self.closed then return nil, "consumer is closed" end
  local ch = self.ch
  local old = self.mod
  if old and spec.key == old.key then
    -- Same modulator: only the demodulator changes, from the next event on.
    self.handler, self.entry.handler = handler, handler
    return true
  end
  -- Versions never repeat, not even after a change that failed and was
  -- rolled back (its events may still arrive, tagged with it).
  self.vmax = math.max(self.vmax or 0, old and old.version or 0) + 1
  spec.version = self.vmax
  local old_entry = self.entry
  -- Back to a modulator whose old stream is still ending here (A, B, A
  -- again before A's end came): the same key is one stream; its old entry
  -- goes now, or each event would reach both.
  local st = ch.streams[spec.key]
  if st then
    for _, e in ipairs(self.old_entries or {}) do
      for _, x in ipairs(st.consumers) do
        if x == e then ch:_detach(e) break end
      end
    end
  end
  local old_handler = self.handler
  self.mod, self.handler = spec, handler
  self.entry = ch:_attach(self, spec, handler)
  local r, err = ch:_update_subs()
  if not r then
    -- Not applied (the manager is unreachable, say): the old modulator stays
    -- this consumer's, its stream untouched.  The new entry is kept for a
    -- while in case some producer did switch before the failure was known.
    local new_entry = self.entry
    self.mod, self.handler, self.entry = old, old_handler, old_entry
    ch.subs_sig = nil
    self.old_entries = self.old_entries or {}
    self.old_entries[#self.old_entries + 1] = new_entry
    ch.ctx:after(ch.ctx.sync_timeout, function()
      if self.entry ~= new_entry then ch:_detach(new_entry) end
    end)
    -- The request may have reached the manager before it failed: say again
    -- what this consumer takes (now if a manager is known, else at rejoin).
    if not ch.ctx.closed then ch:_update_subs(true) end
    return nil, err
  end
  if old_entry then
    -- What the old modulator sent and is still on its way goes to the old
    -- demodulator, until every producer said (in band, after its last event
    -- of that stream) that it sends no more; or sync_timeout passed (a
    -- producer that died or never answered).  Unless another consumer of
    -- this context still uses that modulator: then it stops at once.
    local st = old and ch.streams[old.key]
    local ending = {}
    for _, a in ipairs(type(r) == "table" and r.producers or {}) do ending[a] = true end
    if (st and #st.consumers > 1) or next(ending) == nil then
      ch:_detach(old_entry)
    else
      old_entry.ending = ending
      local keep = { old_entry }
      for _, e in ipairs(self.old_entries or {}) do
        if not e.detached then keep[#keep + 1] = e end
      end
      self.old_entries = keep
      ch.ctx:after(ch.ctx.sync_timeout, function() ch:_detach(old_entry) end)
    end
  end
  if not r then return nil, err end
  local perr = reply_errors(r, spec.key)
  if perr then return nil, perr end
  return true
end

--- Replaces the params of this consumer's modulator at every producer.
-- Returns true once every producing context applied them, or nil, err.
function Consumer:set_params(params)
  if not self.mod then error("lecho: set_params: this consumer has no modulator", 2) end
  local m = self.mod
  return self:_switch(mod_spec(m.src, params, m.period, m.caps, 3), self.handler)
end

--- Replaces the modulator and demodulator together (params: the new
-- modulator's; handler: the new demodulator, default the current one).
function Consumer:set_modulator(src, params, handler)
  if handler ~= nil and type(handler) ~= "function" then
    error("lecho: set_modulator: the demodulator must be a function", 2)
  end
  local m = self.mod or {}
  return self:_switch(mod_spec(src, params, m.period, m.caps, 3), handler or self.handler)
end

function Consumer:params_version() return self.mod and self.mod.version or 0 end

--- What arrived for this consumer's stream(s): { events, bytes } (bytes:
-- encoded payloads received over the wire; local deliveries count 0 bytes).
function Consumer:stats()
  local ev, by = 0, 0
  for chid in pairs(self.chids) do
    local ein, bin, eloc = self.ch.ctx.c:chan_stats(chid)
    ev, by = ev + ein + eloc, by + bin
  end
  return { events = ev, bytes = by, errors = self.errors, modulator_errors = self.mod_errors }
end

return M
