-- lecho.context: the Lua half of a context's run loop: the scheduler of
-- waits (every callback runs in a coroutine of the context's), timers and
-- descriptors, the dispatch of decoded events to consumer handlers (or to
-- a channel's route), stats and close.  The context is made by
-- lecho.context() (init.lua).  This is the home of Context, the object
-- lecho.context() returns: its methods not defined here are defined in
-- these modules (each adds them when required; spec/lua_layout_spec.lua
-- checks this list against the code):
--   lecho.channel:   channel, _fullname
--   lecho.control:   request, list, _send_ctrl, _notify, _pend, _fail_pending,
--                    _reply_wrong, _warn_limited, _expect, _on_ctrl, _registered,
--                    _tell_unreachable, _on_peer, _channel_exists
--   lecho.service:   service
--   lecho.call:      call, call_async, _call
--   lecho.group:     group, _on_gchange
--   lecho.push:      sandbox, push, unload_pushed, pushed
--   lecho.modulator: _moe_error
--   lecho.recorder:  recorder
-- SIGINT and SIGTERM (the interrupt flag, the end of a run a signal ended):
-- lecho.signals, called from here (it defines no method).

local options = require "lecho.options"
local ffi = require "ffi"
local sbuf = require "string.buffer"
local core = require "lecho.core"
local logfmt = require("lecho.log").format
-- SIGINT and SIGTERM: the interrupt flag, "interrupted!" in a callback, the
-- end of a run a signal ended (lecho.signals)
local signals = require "lecho.signals"
local INTR = signals.INTR
local interrupted_event, sigint_in_callback, raise_sigint =
  signals.interrupted_event, signals.in_callback, signals.raise

-- Every loop over a table's keys here is `for k, v in each(t)`, never
-- `in pairs(t)` nor `in next, t`: LuaJIT's parser makes those two an ITERN
-- loop, and LuaJIT 2.1 before its commit 119fd1f (August 2023, "Ensure
-- forward progress on trace exit to BC_ITERN", its issues 1000 and 1045;
-- Debian 12's 2.1.0~beta3+git20220320 is one) never ends a compiled ITERN
-- loop whose trace exits back to the loop's head when no side trace can be
-- recorded there: the exit enters the same trace again, which exits again,
-- at full CPU for ever.  No trace is recorded in a finalizer nor after
-- lua_close turned the compiler off, and the close at the program's end
-- runs there (Context:_at_end); nor flushed (jit.flush and jit.off raise
-- "bad action while in __gc metamethod").  3 of ~47 runs of
-- spec/moe_passthrough_spec.lua at load 18-21, 4 of 40 at load 14-19, spun
-- in lua_close for minutes: in the trace of channel.lua's _hot_update's
-- loop over a channel's producers, at the exit of the loop's end (its side
-- trace never compiles: it returns into control.lua or modulator.lua,
-- never compiled); which loops are compiled at the end depends on the
-- timing, hence the load.  A loop of `each(t)` is an ITERC one, compiled
-- too, whose head checks the key before it enters the trace.  The close at
-- the end runs no ITERN loop of a compiled function: spec/exit_close_spec.lua
-- "runs no compiled pairs loop" checks it, by bytecode.
local each = pairs

local Context = {}
pcall(ffi.cdef, "int getpid(void);")
Context.__index = Context

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
-- meta[HOLD]: the held ack of a sync event (Context:_hold_ack)
local HOLD = {}
local traceback = require("lecho.errors").traceback  -- (without lecho's own frames)

function Context:_peer_addr(idx)
  local a = self.peer_addrs[idx]
  if not a then
    a = self.c:peer_addr(idx) or "?"
    self.peer_addrs[idx] = a
  end
  return a
end

-- Keyed mode: a name server must be the principal nameserver_principal
-- (ns_principal): ours, and any other a channel name ("host:port/name")
-- points at (a trusted key of another name would otherwise run the
-- control plane of those channels: their managers, members, modulators).
-- True when addr is not a name server's, or when the connection to it
-- authenticated that principal.
function Context:_nameserver_ok(addr)
  if not self.nameservers[addr] or addr == self.addr then return true end
  return self.c:peer_identity(addr) == self.ns_principal
end

-- Records addr as a name server's address.  Keyed, the core pins it to
-- ns_principal: the handshake of a connection to or from it refuses any
-- other principal before the connection is up, so nothing queued for the
-- name server (a gjoin with a member's data, a lookup) is ever written to
-- an impostor there (issue 23).
function Context:_add_nameserver(addr)
  if self.nameservers[addr] then return end
  self.nameservers[addr] = true
  if self.keyed and addr ~= self.addr then
    local ok, err = self.c:expect_principal(addr, self.ns_principal)
    if not ok then self.log(("cannot pin name server %s to %s: %s"):format(addr, self.ns_principal, err)) end
  end
end

-- From the peer hook, when the connection to addr came up in keyed mode:
-- one to the name server that is not ns_principal is closed, and the
-- requests waiting on it fail with "refused" (its messages are dropped by
-- the ctrl hook until then).  Returns why, or nil when addr is fine.
function Context:_check_nameserver(addr)
  if self:_nameserver_ok(addr) then return nil end
  local name, pk = self.c:peer_identity(addr)
  local why = name and ("refused: name server %s is %s (key %s), not %s"):format(addr, name,
    core.hex(pk), self.ns_principal)
    or ("refused: name server %s did not authenticate as %s"):format(addr, self.ns_principal)
  self.log(why)
  self:_fail_pending(addr, why, "refused")
  self.c:close_peer(addr, why)
  return why
end

-- Runs every consumer of the channel on one decoded event (one copy per
-- context, however many consumers).  Returns the handlers run and, for a
-- sync event, the list of their errors (or nil): the ack is sent from C.
-- A modulated stream (`ch.derived`) lists { con, handler, version } entries:
-- each demodulator gets what its own modulator sent, tagged with its version.
-- "host:port#id" once per (peer, producer), not once per event: the
-- concatenation interned a new string for every event.
local function pname_of(self, peer, producer)
  local names = self.pnames[peer]
  if not names then names = {}; self.pnames[peer] = names end
  local pname = names[producer]
  if not pname then
    local from = peer == 0 and self.addr or self:_peer_addr(peer)
    pname = from .. "#" .. producer
    names[producer] = pname
  end
  return pname
end

-- Runs one handler; a raise is counted on con and, for a sync event, added
-- to errs (returned) with its code, "failed" (the ACK carries it: the
-- producer never reads a code from the message), else logged.
local function run_handler(self, con, handler, value, meta, sync, errs, short)
  local ok, err = pcall(handler, value, meta)
  if not ok then
    err = tostring(err)
    sigint_in_callback(self, err)
    -- a C-API handler an embedder's interrupt ended (Python's
    -- KeyboardInterrupt): as "interrupted!" in Lua
    if self.interrupt and self.interrupt() then self:_interrupted() end
    con.errors = con.errors + 1
    if sync > 0 then
      errs = errs or {}
      errs[#errs + 1] = { consumer = con.id, err = err, code = "failed" }
    else
      self.log(("consumer %s on '%s' failed: %s"):format(con.id, short, err))
    end
  end
  return errs
end

-- Buffers (a consumer's `buffer` option).  A string value of 64 KiB or
-- more (encoded) comes from C as a view: a pointer to its bytes where they
-- were read, and its length (lua_hook.c view_of; only once
-- ctx.c:views(true)).  rv = { p = pointer, n = length, s = the string once
-- made, bufs = buffers made pointing at p }: a `buffer` consumer gets a
-- string.buffer pointing at the bytes (no copy), any other one the string
-- (made once per event).  The bytes are valid while the dispatch runs on
-- the loop's stack only: before a wait in the dispatch (Context:_wait,
-- _wait_sync: in the waiting coroutine, where running out of memory is the
-- handler's error) or the loop running inside it (run_once, run, a main
-- line wait), keep_views copies them once, and the buffers still pointing
-- at them point at the copy at the same read position (one the handler
-- filled or set itself is left alone).  Each buffer is emptied when its
-- handler returns.
local charp = ffi.typeof("const char *")

-- A copy of n bytes at p; out of memory, a full collection and once more
-- (LuaJIT does not collect before it fails an allocation: the copies of
-- earlier events' values may be garbage by now).  May raise.
local function copy_bytes(p, n)
  local ok, s = pcall(ffi.string, p, n)
  if ok then return s end
  collectgarbage()
  return ffi.string(p, n)
end

-- Arrays (lecho.array) of 4 KiB or more come from C as views too, into
-- the same bytes (lua_hook.c, LB_ARRAY_VIEW_MIN): rv = { a = the list of
-- them } and the handlers get the value itself.  keep_view keeps each past
-- the dispatch (c:keep_array, views made from them follow): one that is
-- most of its read buffer (256 KiB or more) takes the buffer over, no
-- copy (lei_rbuf_adopt), the others get their own copy; a dispatch
-- that ends with them not kept ends them (core.array_end: no elements
-- left, so a handler that stored one reads nothing, never freed memory).
-- c: the core context (self.c).
-- The arrays that took their buffer over are listed in rv.kept, oldest
-- first (lecho.capi's queued consumer gives them back when its handle on
-- the event is freed, see lecho.capi).
local function keep_view(rv, c)
  local avs = rv.a
  if avs then
    for i = 1, #avs do
      if c:keep_array(avs[i]) > 0 then -- may raise (memory)
        local kept = rv.kept
        if not kept then kept = {}; rv.kept = kept end
        kept[#kept + 1] = avs[i]
      end
    end
    rv.a = nil
    return
  end
  local p, n = rv.p, rv.n
  if not p then return end
  local s = copy_bytes(p, n) -- may raise (memory): rv is unchanged then
  rv.s, rv.p = s, nil
  for _, b in ipairs(rv.bufs) do
    local at, len = b:ref()
    local off = tonumber(ffi.cast(charp, at) - p)
    if off >= 0 and off <= n and len == n - off then
      b:set(s)
      b:skip(off)
    end
  end
end

-- Every view of a dispatch on the stack (none: nothing to do).
local function keep_views(self)
  local live = self.views
  local c = self.c
  for i = 1, #live do keep_view(live[i], c) end
end

--- For a handler that stores its event for later (lecho.capi's queued
-- consumers): the values being dispatched get their own copies of what
-- points into the read buffer (arrays of 4 KiB or more, long strings for
-- buffer consumers), as before a wait.  May raise (memory).
function Context:keep_values() keep_views(self) end

local LOST = "lecho: this event's value was lost: out of memory keeping it while a handler waited"

-- What a consumer's handler gets: the value, and the buffer made for it.
-- May raise (memory).
local function view_value(con, value, rv)
  local buffered = con.buffer and (rv or type(value) == "string")
  if buffered and rv and rv.p then -- the bytes where they were read
    local b = sbuf.new():set(rv.p, rv.n)
    rv.bufs[#rv.bufs + 1] = b
    return b, b
  end
  if rv then -- the string, made once per event
    value = rv.s
    if not value then
      if not rv.p then error(LOST, 0) end
      value = copy_bytes(rv.p, rv.n)
      rv.s = value
    end
  end
  if buffered then
    local b = sbuf.new():set(value)
    return b, b
  end
  return value
end

local function raise(err) error(err, 0) end

-- A handler of an event that is a view, or of a `buffer` consumer.  When
-- its value cannot be made (out of memory), that is its handler's error:
-- counted, and a sync event's producer is told.
local function run_buffered(self, con, handler, value, meta, sync, errs, short, rv)
  local ok, v, b = pcall(view_value, con, value, rv)
  if not ok then return run_handler(self, con, raise, v, meta, sync, errs, short) end
  errs = run_handler(self, con, handler, v, meta, sync, errs, short)
  if b then b:free() end
  return errs
end

-- Producer ids from 2^40 up are a replay's (lecho.replay): meta.replay
local REPLAY_PID = 2 ^ 40
Context.REPLAY_PID = REPLAY_PID

-- A sync event no handler ran for (its consumers here closed before it
-- came, the producer not told yet): the ACK says so, code noconsumer, so
-- that the producer's submit_sync fails as it does once it knows (never
-- true: nothing handled it).  Not for a sync marker (handled by its filter),
-- nor a call (nil).
local function unhandled(self, chid)
  local ch = self.bychid[chid]
  -- a call channel whose service is gone here: the ACK without a value
  -- says so to the caller (noservice, lecho.call), as before
  if ch and ch.calls then return nil end
  local name = ch and (ch.name or ch.short) or "the channel"
  return { { consumer = self.addr, code = "noconsumer",
             err = ("no consumer of %s at %s any more: not handled"):format(name, tostring(self.addr)) } }
end

-- An interrupt was raised in a handler (a SIGINT's "interrupted!", caught
-- or not; an embedder's, lecho_set_interrupt): no handler runs for an
-- event until the main line took it (lecho.signals owns the flag).
function Context:_interrupted() signals.interrupted() end

-- The close at the program's end has begun (Context:_at_end, any context
-- of this state): a signal then (core.end_signal) is an interrupt, no
-- handler runs for a further event (a read of 30 events from a peer ran all
-- their handlers of 0.2 s in one loop turn before the close looked at the
-- signal: the process ended 8.4 s after a Ctrl-C, outside attack s8 F3);
-- they are counted and said by close (signals.close_report).
local AT_END = {}
local function end_interrupted()
  if core.end_signal() then signals.interrupted() return true end
  return false
end

function Context:_on_event(chid, value, peer, producer, seq, sync, rv)
  -- producer 0, seq 0: a sync marker on a modulated stream (the modulator
  -- sent nothing for a sync event): acknowledged once all before it ran.
  if producer == 0 and seq == 0 then return 0, nil end
  if INTR.raised or (AT_END.on and end_interrupted()) then return interrupted_event(self, chid, sync) end
  -- A plain channel with one consumer: two dense arrays, not the channel's
  -- tables (thousands of channels: cache misses are the cost).
  local con = self.dcon[chid]
  if con then
    if con.closed then
      if sync > 0 then return 0, unhandled(self, chid) end
      return 0, nil
    end
    local short = self.dshort[chid]
    local meta = { channel = short, producer = pname_of(self, peer, producer), seq = seq }
    if sync > 0 then meta.sync = true end
    if producer >= REPLAY_PID then meta.replay = true end  -- lecho.replay's producers
    local errs
    if rv or con.buffer then
      errs = run_buffered(self, con, con.handler, value, meta, sync, nil, short, rv)
    else
      errs = run_handler(self, con, con.handler, value, meta, sync, nil, short)
    end
    if sync > 0 then return 1, errs, meta[HOLD] end
    return 1, errs
  end
  -- The consumer list carries its channel's short name and kind, so that an
  -- event touches a few small tables, not the channel object.
  local list = self.disp[chid]
  local ch = list
  local nran, errs = 0, nil
  if list and list[1] then
    local meta = { channel = ch.short, producer = pname_of(self, peer, producer), seq = seq }
    if sync > 0 then meta.sync = true end
    if producer >= REPLAY_PID then meta.replay = true end
    local n = #list
    local snap = list
    if n > 1 then snap = { unpack(list, 1, n) } end
    local derived = ch.derived
    for i = 1, n do
      local c, handler = snap[i], nil
      if derived then
        -- per producer while an in-band params change goes round (consumer.lua)
        local pv = c.pver
        meta.params_version = pv and pv[peer == 0 and self.addr or self:_peer_addr(peer)] or c.version
        handler, c = c.handler, c.con
      else
        handler = c.handler
      end
      if not c.closed then
        nran = nran + 1
        if rv or c.buffer then
          errs = run_buffered(self, c, handler, value, meta, sync, errs, ch.short, rv)
        else
          errs = run_handler(self, c, handler, value, meta, sync, errs, ch.short)
        end
      end
    end
    if sync > 0 and nran > 0 then return nran, errs, meta[HOLD] end
  end
  if sync > 0 and nran == 0 then return 0, unhandled(self, chid) end
  return nran, errs
end

-- Held acks.  A handler that takes a sync event without being done with it
-- (lecho.capi's queued consumer: the event waits in a queue for a binding's
-- code) holds the event's ack: Context:_hold_ack(meta) during the handler
-- gives a record; Context:_settle_ack(rec, consumer, err[, code]) later says
-- this consumer is done with it (err nil) or failed (err its message, code
-- its code, "failed" when not given).  Once
-- every holder settled and the dispatch ended, the ack goes out with what
-- the dispatch found plus the holders' failures, on the connection the
-- event came on only (gen).  The dispatch itself does not wait: the
-- connection is not held (other events of that peer, other channels
-- included, go on), unlike a handler that waits (ctx.held).  A record whose
-- context closed first is never sent (the producer sees its connection go).
function Context:_hold_ack(meta)
  if not meta.sync then return nil end
  local rec = meta[HOLD]
  if not rec then
    rec = { left = 0 }
    meta[HOLD] = rec
  end
  rec.left = rec.left + 1
  return rec
end

local function send_held(self, rec)
  if rec.left > 0 or not rec.ready or self.closed then return end
  local errs = rec.errs
  if rec.failed then
    errs = errs or {}
    for _, e in ipairs(rec.failed) do errs[#errs + 1] = e end
  end
  rec.ready = nil -- once
  self.c:ack(rec.peer, rec.sync, rec.nran, errs, nil, rec.gen)
end

function Context:_settle_ack(rec, consumer, err, code)
  if rec.left <= 0 then return end
  rec.left = rec.left - 1
  if err then
    rec.failed = rec.failed or {}
    rec.failed[#rec.failed + 1] = { consumer = consumer, err = err, code = code or "failed" }
  end
  send_held(self, rec)
end

-- The dispatch of a sync event whose ack a handler holds ended: what it
-- found waits in rec until the holders settled.
local function held_ack(self, rec, peer, sync, nran, errs, gen)
  rec.ready, rec.peer, rec.sync, rec.nran, rec.errs, rec.gen = true, peer, sync, nran, errs, gen
  send_held(self, rec)
end

-- Spawned functions run in worker coroutines that are kept for the next
-- one once their function returned (at most POOL_MAX idle): a coroutine made
-- per call (a service's handler, ctx:call_async) was a large share of a
-- call's cost, in its making and its collection.  A worker yields FREE when
-- its function is over; one whose function raised stays usable (the error
-- is caught and logged here), one left suspended elsewhere is never reused.
local FREE = {}
local POOL_MAX = 128

-- (lecho.service: a service handler's "interrupted!"; lecho.signals)
function Context:_sigint_in_callback(err) sigint_in_callback(self, err) end
local function callback_failed(self, err)
  if sigint_in_callback(self, err) then
    -- not the callback's error but the program's signal: one line, info
    -- (it logged "error in callback: ...interrupted!" with a traceback)
    self.log("a signal interrupted a callback (lecho's or the program's): the loop stops", "info")
    return
  end
  self.log("error in callback: " .. err)
end

local function work(self, fn, ...)
  local ok, err = xpcall(fn, traceback, ...)
  if not ok then callback_failed(self, tostring(err)) end
  return work(self, coroutine.yield(FREE))
end

-- Runs fn(...) in a coroutine of the context's; true when it is waiting.
function Context:_spawn(fn, ...)
  local pool = self.copool
  local n = pool and #pool or 0
  if n > 0 then
    local co = pool[n]
    pool[n] = nil
    return self:_resume(co, fn, ...)
  end
  local co = coroutine.create(work)
  self.cos[co] = true
  return self:_resume(co, self, fn, ...)
end

-- Resumes one of the context's coroutines; true when it waits again.
-- A handler or callback that yields with coroutine.yield itself (not
-- through a lecho wait) is resumed at once, its yield returning nothing:
-- left suspended, the event it was running would never finish (a sync one
-- acknowledged as if it had) and the next event would be resumed into it.
local function bare_yield(self, co, r)
  if r == WAIT or r == DONE or r == FREE or coroutine.status(co) == "dead" then return false end
  if not self.warned_yield then
    self.warned_yield = true
    self.log("a handler yielded with coroutine.yield outside a lecho wait: resumed at once (said once)")
  end
  return true
end

function Context:_resume(co, ...)
  local ok, r = coroutine.resume(co, ...)
  while ok and bare_yield(self, co, r) do ok, r = coroutine.resume(co) end
  if not ok then
    callback_failed(self, traceback(co, tostring(r)))
    return false
  end
  if r == FREE then
    local pool = self.copool
    if not pool then
      pool = {}
      self.copool = pool
    end
    if #pool < POOL_MAX and not self.closed then pool[#pool + 1] = co end
    return false
  end
  if coroutine.status(co) == "dead" or r == DONE then return false end
  return true -- WAIT (bare_yield resumed any other yield)
end

-- One timer wakes the loop for every wait's deadline, armed at the
-- earliest one (a timer per wait cost a userdata, a libev watcher and its
-- collection per call); when it fires, _turn looks at every wait's deadline
-- and arms it again at the earliest left.
-- (The timer's function is made once per context, outside _wake_at: a
-- function that makes a closure is not compiled by LuaJIT 2.1 on its early
-- returns, bytecode UCLO.)
local function wake_fn(self)
  return function()
    self.wake_t, self.wake_timer = nil, nil
    self.wake_due = true
  end
end

function Context:_wake_at(deadline)
  if self.wake_t and self.wake_t <= deadline then return end
  if self.wake_timer then self.wake_timer:stop() end
  self.wake_t = deadline
  self.wake_fn = self.wake_fn or wake_fn(self)
  self.wake_timer = self.c:timer(math.max(deadline - now(self), 0) + 0.001, 0, self.wake_fn)
end

-- The main line's wait: serves the loop here (callbacks run beside, not
-- inside) until done(a, b) is true (true), the deadline passes or the
-- context closes (false).  Counted in main_waits: _turn breaks the loop
-- turn when it resumed a waiter meanwhile (that waiter may have made done()
-- true: without the break run_once slept until the next event, up to a
-- second).  done and its arguments, not a closure: _wait_sync is a call's
-- hot path.
local function main_wait(self, done, a, b, deadline)
  self.main_waits = (self.main_waits or 0) + 1
  local r
  while true do
    if self.closed then r = false break end
    if done(a, b) then r = true break end
    local left = deadline and deadline - now(self)
    if left and left <= 0 then r = false break end
    -- an embedder's interrupt (lecho_set_interrupt: Python's Ctrl-C)
    if self.interrupt and self.interrupt() then r = false break end
    keep_views(self)
    if self.c:run_once(left) then self.sigint_pending = true end
    if self.sigint_pending or INTR.raised then self.main_waits = self.main_waits - 1 raise_sigint(self) end
  end
  self.main_waits = self.main_waits - 1
  return r
end
-- A coroutine's wait, w = { deadline, co [, ready] }: listed as the waiter
-- of sync record sid (resumed when the core says it settled) or, sid nil,
-- already in self.waiters (asked each turn); then yields until resumed,
-- its wait hook (Context:_on_wait) paused meanwhile.
local function suspend(self, co, w, sid)
  if sid then
    local sw = self.sync_waiters
    if not sw then
      sw = {}
      self.sync_waiters, self.nsyncw, self.sync_ids = sw, 0, {}
    end
    sw[sid] = w
    self.nsyncw = self.nsyncw + 1
  end
  if w.deadline then self:_wake_at(w.deadline) end
  self.c:want_turn(true)
  local h = self.wait_hooks and self.wait_hooks[co]
  if h then h:pause() end
  local r = coroutine.yield(WAIT)
  if h then h:resume() end
  if w.cancel then error(w.cancel, 0) end
  return r
end
local function call_ready(ready) return ready() end

-- Ends the lecho wait coroutine co is suspended in (a sleep, a call, a
-- sync submit, a lookup) by raising err there, at the next loop turn: the
-- REPL's Ctrl-C on a line that waits.  False when co waits in none.
function Context:_interrupt_wait(co, err)
  for _, w in ipairs(self.waiters) do
    if w.co == co then
      w.cancel, w.deadline = err, 0
      self.c:want_turn(true)
      return true
    end
  end
  for _, w in each(self.sync_waiters or {}) do
    if w.co == co then
      w.cancel, w.deadline = err, 0
      self.wake_due = true
      self.c:want_turn(true)
      return true
    end
  end
  return false
end
local function settled(c, sid) return not c:sync_pending(sid) end

-- Waits until ready() is true: true; or until deadline (a ctx:now() time,
-- nil: none) or the context closes: false.  sid: ready() waits on that
-- sync record (a call's): the core tells when it settles (ctx:sync_done),
-- so the scheduler does not ask ready() every turn.
function Context:_wait(ready, deadline, sid)
  if ready() then return true end
  if self.closed then return false end
  local co = coroutine.running()
  if co and self.cos[co] then
    keep_views(self) -- before the yield (see keep_view)
    local w = { ready = ready, deadline = deadline, co = co }
    if sid and self.c:sync_watch(sid) then return suspend(self, co, w, sid) end
    self.waiters[#self.waiters + 1] = w
    return suspend(self, co, w, nil)
  end
  return main_wait(self, call_ready, ready, nil, deadline)
end

-- Waits until sync record sid (a call's) settles: true; or until deadline
-- or the context closes: false.  The record is left for ctx:call_result.
-- No closure, no poll: the core lists the records settled each turn.
function Context:_wait_sync(sid, deadline)
  local c = self.c
  if self.closed then return false end
  local co = coroutine.running()
  if co and self.cos[co] then
    if not c:sync_watch(sid) then return true end
    keep_views(self) -- before the yield (see keep_view)
    return suspend(self, co, { deadline = deadline, co = co }, sid)
  end
  return main_wait(self, settled, c, sid, deadline)
end

-- Sets h as coroutine co's wait hook (nil: none): h:pause() runs before
-- each wait of co (_wait, _wait_sync), h:resume() when it goes on.  A
-- service handler's CPU budget (lecho.service) is one: a wait is not CPU.
-- Weak keys: a coroutine that ends takes its hook with it.
function Context:_on_wait(co, h)
  local hooks = self.wait_hooks
  if not hooks then
    if h == nil then return end
    hooks = setmetatable({}, { __mode = "k" })
    self.wait_hooks = hooks
  end
  hooks[co] = h
end

-- The waits on sync records (_wait's sid, _wait_sync): those whose record settled
-- (all of them when the core could not list them, or the context closed),
-- and, when the wake timer fired, those past their deadline.
function Context:_turn_syncs()
  local sw, c = self.sync_waiters, self.c
  local go = nil
  local resumed = false
  if self.closed then
    go = {}
    for sid, w in each(sw) do go[#go + 1] = { sid, w, false } end
  else
    local ids = self.sync_ids
    local n = c:sync_done(ids)
    if n < 0 then
      go = {}
      for sid, w in each(sw) do
        if not c:sync_pending(sid) and (not w.ready or w.ready()) then go[#go + 1] = { sid, w, true } end
      end
    else
      for k = 1, n do
        local sid = ids[k]
        local w = sw[sid]
        if w and (not w.ready or w.ready()) then
          sw[sid] = nil
          self.nsyncw = self.nsyncw - 1
          self:_resume(w.co, true)
          resumed = true
        end
      end
    end
    if self.wake_due then
      local t = now(self)
      go = go or {}
      for sid, w in each(sw) do
        if w.deadline and t >= w.deadline then go[#go + 1] = { sid, w, false } end
      end
    end
  end
  if go then
    for k = 1, #go do
      local sid, w, res = go[k][1], go[k][2], go[k][3]
      if sw[sid] == w then
        sw[sid] = nil
        self.nsyncw = self.nsyncw - 1
        self:_resume(w.co, res)
        resumed = true
      end
    end
  end
  return resumed
end

-- Before each loop turn's writes: resumes, in the order they began, the
-- waits that can go on or whose deadline passed.
function Context:_turn()
  local resumed = self.sync_waiters and self:_turn_syncs() or false
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
      self:_resume(w.co, res)
      resumed = true
      ws = self.waiters
    end
  end
  if self.wake_due and not self.closed then
    -- the wake timer fired: armed again at the earliest deadline left
    self.wake_due = false
    local first
    for _, w in ipairs(ws) do
      if w.deadline and (not first or w.deadline < first) then first = w.deadline end
    end
    for _, w in each(self.sync_waiters or {}) do
      if w.deadline and (not first or w.deadline < first) then first = w.deadline end
    end
    if first then self:_wake_at(first) end
  end
  if resumed and (self.main_waits or 0) > 0 and not self.closed then self.c:break_once() end
  if not ws[1] and (self.nsyncw or 0) == 0 and not self.closed then
    self.c:want_turn(false)
    -- nothing waits: no timer left to keep the loop busy
    if self.wake_timer then
      self.wake_timer:stop()
      self.wake_t, self.wake_timer = nil, nil
    end
  end
end

-- A batch (the events hook, lua_hook.c batch_call): the async events of
-- one read from peer, t[4i+1 .. 4i+4] = chid, value, producer, seq, n of
-- them, run in order by this compiled loop inside the dispatcher's
-- coroutine.  A handler that waits suspends the coroutine with the rest of
-- the batch in it: C holds the peer (Context:_dispatch_batch returned
-- true) until the loop is through, then ctx:resume.  No ack: async only.
local BATCH = {}
local function run_batch(self, co, t, n, peer)
  local routes = self.routes
  for k = 0, 4 * (n - 1), 4 do
    local chid = t[k + 1]
    -- a routed channel (a service's call channel, Context:_route) takes no
    -- async event: it is no call, nothing to run (as _dispatch's route)
    if not (routes and routes[chid]) then self:_on_event(chid, t[k + 2], peer, t[k + 3], t[k + 4], 0, nil) end
  end
  local held = self.held[co]
  if held then
    -- it waited: the hook returned long ago, what C held back comes next
    self.held[co] = nil
    if not self.closed then self.c:resume(held, 0) end
  end
end

-- The event hook: dispatches in a coroutine kept for it.  Returns true
-- when a handler waits: C then holds back what comes next from the same
-- peer (or the local queue) until the dispatch ends (ctx:resume).
local function dispatcher(self)
  local co = coroutine.running()
  local chid, value, peer, producer, seq, sync, gen, rv = coroutine.yield(DONE)
  while true do
    while chid == BATCH do
      -- (value: the batch's table, producer: its count)
      run_batch(self, co, value, producer, peer)
      value = nil -- not held while this waits for the next (see below)
      chid, value, peer, producer, seq, sync, gen, rv = coroutine.yield(DONE)
    end
    local nran, errs, hrec = self:_on_event(chid, value, peer, producer, seq, sync, rv)
    local held = self.held[co]
    if hrec then
      -- a handler holds the ack (Context:_hold_ack): not C's to send now
      if held then self.held[co] = nil; if not self.closed then self.c:resume(held, chid) end end
      if not self.closed then held_ack(self, hrec, peer, sync, nran, errs, gen) end
      nran, errs = nil, nil
    elseif held then
      -- The dispatch waited: its event hook returned long ago, so the ack
      -- (if sync) is ours to send.
      self.held[co] = nil
      if not self.closed then
        -- only on the connection the event came on (gen): another
        -- process may have its address now
        if sync > 0 then self.c:ack(peer, sync, nran, errs, nil, gen) end
        self.c:resume(held, chid)
      end
      nran, errs = nil, nil
    end
    -- The event is let go of while this waits for the next: the suspended
    -- coroutine's locals are reachable, and a value its handlers let go of
    -- (an adopted read buffer's array, a long string) stayed alive until
    -- the next event came, its buffer not to be found before that event's
    -- frame needed one (doc/python.md).
    value, rv = nil, nil
    chid, value, peer, producer, seq, sync, gen, rv = coroutine.yield(DONE, nran, errs)
  end
end

function Context:_dispatch(chid, value, peer, producer, seq, sync, gen, nbytes, vlen, avs)
  local rv
  if vlen then
    -- a view (see keep_view): valid until this returns
    rv = { p = ffi.cast(charp, value), n = vlen, bufs = {} }
    value = nil
  elseif avs then
    rv = { a = avs, v = value } -- the value's array views (see keep_view), and the value
  end
  -- a routed channel (Context:_route: a service's call channel) takes the
  -- event itself, and answers it itself: no ack from C
  local routes = self.routes
  local route = routes and routes[chid]
  if route then
    -- it takes requests (tables): a long string is none, passed as ""
    -- rather than copied
    if rv and rv.p then value = "" end
    -- the value outlives this dispatch: its arrays are copied first
    if avs then keep_view(rv, self.c) end
    return route(value, peer, sync, gen, nbytes)
  end
  if rv then
    local live = self.views
    live[#live + 1] = rv
    -- protected: nothing may leave rv listed (keep_views would read its
    -- bytes after C freed them)
    local ok, held, nran, errs = pcall(self._dispatch_value, self, chid, value, peer, producer, seq, sync, gen, rv.p and rv)
    live[#live] = nil
    -- A handler waits: _wait kept the view before it yielded (the later
    -- handlers of this event read the copy).  Else every handler returned
    -- and their buffers are empty.  Either way C may free the bytes now.
    if ok and held and (rv.p or rv.a) and not pcall(keep_view, rv, self.c) then
      self.log("out of memory keeping a value while its handler waits: the buffers of this event are emptied")
    end
    if rv.p then
      rv.p = nil
      for _, b in ipairs(rv.bufs) do b:free() end
    end
    if rv.a then
      local a = rv.a
      rv.a = nil
      for i = 1, #a do core.array_end(a[i]) end
    end
    if not ok then error(held, 0) end
    return held, nran, errs
  end
  return self:_dispatch_value(chid, value, peer, producer, seq, sync, gen)
end

--- Routes the events of channel chid to fn(value, peer, sync, gen, nbytes)
-- instead of the consumer handlers (nil: back to them).  fn runs on the
-- loop's own call, not in a coroutine (it may start one), and answers a
-- sync event itself (ctx.c:ack): what it returns goes back to C as the
-- dispatch's "no count", so C sends no ACK.  value outlives the dispatch
-- (arrays copied); a long string comes as "".  lecho.service routes its
-- call channels here: the dispatcher knows no service.
function Context:_route(chid, fn)
  local routes = self.routes
  if not routes then
    if fn == nil then return end
    routes = {}
    self.routes = routes
  end
  routes[chid] = fn
end

-- Runs one resume of the dispatch coroutine with a..h (an event, or a
-- batch) for peer: held (a handler waits: C holds the peer until
-- ctx:resume), and what the dispatcher returned.  self.dco is the dispatch
-- coroutine, suspended, or nil: taken out while it runs (an event
-- dispatched from inside a handler gets another one), put back when it
-- yielded DONE (no coroutine.status per event).
local function run_dispatcher(self, peer, a, b, c, d, e, f, g, h)
  local co = self.dco
  if co then
    self.dco = nil
  else
    co = coroutine.create(dispatcher)
    self.cos[co] = true
    coroutine.resume(co, self)
  end
  local ok, r, nran, errs = coroutine.resume(co, a, b, c, d, e, f, g, h)
  while ok and bare_yield(self, co, r) do ok, r, nran, errs = coroutine.resume(co) end
  if not ok then
    self.log("error dispatching an event: " .. traceback(co, tostring(r)))
    return false
  end
  if r == WAIT then
    -- A handler waits: this coroutine belongs to its waiter now.
    self.held[co] = peer
    return true
  end
  if not self.dco then self.dco = co end
  return false, nran, errs
end

function Context:_dispatch_value(chid, value, peer, producer, seq, sync, gen, rv)
  -- C acknowledges a sync event with nran, errs (ctx:hooks, lua_hook.c).
  return run_dispatcher(self, peer, chid, value, peer, producer, seq, sync, gen, rv)
end

-- The events hook (lua_hook.c lb_hook_events): a read's async events, in
-- one resume of the dispatcher (not one crossing and one resume each).
-- True when a handler waits (C holds the peer until ctx:resume).
function Context:_dispatch_batch(t, n, peer)
  return (run_dispatcher(self, peer, BATCH, t, peer, n))
end

--- Calls fn(timer) every sec seconds (a finite number > 0) until
-- timer:stop().  fn runs in a coroutine of its own and may wait
-- (submit_sync, a blocking submit); a tick that comes while the previous
-- call still waits is skipped.
function Context:every(sec, fn)
  options.check_time(sec, "ctx:every", "sec", 2, true)
  local busy = false
  local function run(t)
    local ok, err = xpcall(fn, traceback, t)
    busy = false
    if not ok then callback_failed(self, tostring(err)) end
  end
  return self.c:timer(sec, sec, function(t)
    if busy then return end
    busy = true
    self:_spawn(run, t)
  end)
end

--- Calls fn() once, sec seconds (a finite number >= 0) from now.
function Context:after(sec, fn)
  options.check_time(sec, "ctx:after", "sec", 2)
  return self.c:timer(sec, 0, function()
    self:_spawn(function()
      local ok, err = xpcall(fn, traceback)
      if not ok then callback_failed(self, tostring(err)) end
    end)
  end)
end

--- Waits sec seconds (a finite number >= 0) while the loop serves
-- everything else: inside a callback or a service handler only that one
-- waits; on the main line the loop runs meanwhile.
function Context:sleep(sec)
  options.check_time(sec, "ctx:sleep", "sec", 2)
  local deadline = self.c:now() + sec
  self:_wait(function() return self.c:now() >= deadline end, deadline)
end

--- Calls fn(watcher) on the loop whenever descriptor fd is readable, until
-- watcher:stop() (a REPL reading its terminal, say).  Each call runs in a
-- coroutine of its own and may wait; fn must read what is there, or it is
-- called again on the next loop turn.
function Context:on_readable(fd, fn)
  return self.c:io(fd, function(w)
    self:_spawn(function()
      local ok, err = xpcall(fn, traceback, w)
      if not ok then callback_failed(self, tostring(err)) end
    end)
  end)
end

-- Back on the main line from a loop call (ctx:run, run_once): the leaves
-- that closes in its turns put off to the next turn go out now, for no
-- turn may come (a handler closed its consumer and stopped the loop, and
-- the script sleeps): else the manager still listed this context as a
-- consumer (lecho.control _update_subs, issue 28).  Not inside a callback
-- (a nested run_once: the loop goes on).
local function leaves_due(self)
  local due = self.leaves_due
  if not due or self.closed or self.c:depth() > 0 then return end
  self.leaves_due = nil
  local list = {}
  for ch in each(due) do list[#list + 1] = ch end
  for _, ch in ipairs(list) do ch:_leave_due() end
end

-- (A dispatch's view is copied before the loop runs inside it.)
local open_ctxs -- (below: the open contexts of this state)
local signal_closing -- a signal ended ctx:run(): its closes run (Context:run)

--- Serves the loop until ctx:stop().  Unless the context was made with
-- signals = false, SIGINT and SIGTERM (those the process does not ignore)
-- are caught while it runs, and only then: one closes the context (what was
-- submitted is delivered within linger) and ends the process by that signal
-- (a shell's $? 130, 143); the actions the process had are back after a
-- run that ends otherwise.  During that close a second signal ends the
-- process at once.
function Context:run()
  keep_views(self)
  -- keyed: SIGHUP reloads the trust files and policy (lecho.trustwatch)
  local sig = self.c:run(self.signals, self.trustwatch and self._trustwatch.hup or nil)
  leaves_due(self)
  -- a signal's close follows (lecho.signals run_ended): the other
  -- contexts' closes there (_at_end) leave the default actions it set (a
  -- second signal ends the process at once)
  if sig or (self.sigint_pending and self.signals) then signal_closing = true end
  -- a SIGINT or SIGTERM ended it (or came as it began): every open context
  -- closed, the process ended by the signal (lecho.signals)
  signals.run_ended(self, sig, open_ctxs)
end

--- One loop turn, waiting at most timeout seconds (nil: until something
-- happens; 0: not at all).
function Context:run_once(timeout)
  if timeout ~= nil then options.check_time(timeout, "ctx:run_once", "timeout", 2) end
  keep_views(self)
  if self.c:run_once(timeout) then self.sigint_pending = true end
  leaves_due(self)
  if self.sigint_pending or INTR.raised then raise_sigint(self) end
end

function Context:stop() return self.c:stop() end

function Context:flush() return self.c:flush() end

function Context:now() return self.c:now() end

-- Before a request that needs peers (a sync submit, a call, a join), on the
-- main line: the connections its peers closed while the program did not run
-- the loop (they declared it dead after heartbeat * heartbeat_misses) are
-- read to their close first, so that the request dials them afresh instead
-- of failing on a dead socket (lei_live_catch_up; doc/semantics.md
-- "Liveness").  Inside a callback the loop is running: nothing to catch up.
function Context:_catch_up()
  self.c:catch_up()   -- (nothing inside a callback: the C side checks the depth)
end

-- Whether a producer of this context sent events to another context (what
-- close must answer for: an async event has no other way to say it was not
-- read).  A context that only consumed, served or called has not.
local function sent_events(self)
  for _, cs in each(self.c:stats().channels or {}) do
    if (cs.events_out or 0) > 0 then return true end
  end
  return false
end

--- Counters per channel and per peer (see doc/semantics.md "Statistics").
function Context:stats()
  local s = self.c:stats()
  s.addr = self.addr
  for name, ch in each(self.byname) do
    local cs = s.channels[name]
    if cs then
      cs.consumers = #ch.all
      cs.producers = ch.nprod
    end
    -- Modulators running here for this channel's consumers, by key.
    for key, inst in each(ch.mods) do
      local ms = inst.moe:stats()
      ms.consumers = inst.dests
      s.modulators = s.modulators or {}
      s.modulators[ch.name .. "@" .. key] = ms
    end
  end
  return s
end

-- The contexts of this Lua state still open (weak keys: a Lua table per
-- state, no C state), for a close at the program's end (Context:_at_end).
open_ctxs = setmetatable({}, { __mode = "k" })
signals.track(open_ctxs)  -- (the contexts the interrupt flag is kept in)
function Context:_opened()
  open_ctxs[self] = true
  signals.opened(self)
end
-- The others still open, or nil.
local function open_others(self)
  local t
  for o in each(open_ctxs) do
    if o ~= self and not o.closed then t = t or {}; t[#t + 1] = o end
  end
  return t
end

-- A close's state (Context:close, and lecho_close's first step,
-- Context:_close_local): its linger, start and deadline, whether it may
-- wait, and what ended its linger early: a signal.  On the main line
-- LuaJIT's (or lecho's) "interrupted!" raised in a wait (intr: raised again
-- once the context is closed, so that the program still stops; the close
-- itself is finished, and a second close returns its result: an
-- interrupted close left `closing` set and a second close waited forever,
-- outside attack s8 A); the embedder's interrupt (Python's Ctrl-C:
-- self.interrupt); at the program's end, the signal lecho catches then
-- (core.end_signal, Context:_at_end).  cut: the linger was ended so.
local function close_state(self, linger)
  local st = self._cst
  if st then return st end
  -- (at the program's end, the linger left after the other contexts wrote)
  local wait = self.end_deadline and math.max(self.end_deadline - now(self), 0) or linger
  local t0 = now(self)
  st = { linger = linger, wait = wait, t0 = t0, deadline = t0 + wait,
         -- lingering waits: on the main line, or in a callback of ours (it suspends)
         can_wait = self.c:depth() == 0 or self.cos[coroutine.running() or 0] }
  self._cst = st
  return st
end

local function close_stopped(self, st)
  if st.cut then return true end
  if (self.interrupt and self.interrupt()) or (self.ending and core.end_signal()) then st.cut = true end
  return st.cut
end

-- Waits until ready() or the close's deadline.
local function close_wait(self, st, ready)
  if self.ending and self.c:depth() == 0 then
    -- at the program's end: turns of at most 50 ms, so that a signal that
    -- came between two turns (not in a poll it would cut short) is seen soon
    while not ready() and now(self) < st.deadline do
      self.c:run_once(math.min(0.05, math.max(st.deadline - now(self), 0)))
    end
    return
  end
  local wok, werr = pcall(self._wait, self, ready, st.deadline)
  if not wok then st.intr, st.cut = werr, true end
end

-- Events submitted to this context's own consumers (local delivery: a
-- loop turn runs them) are handled first, while those consumers are still
-- here, within the linger (they were freed unseen when close came before
-- a loop turn: outside attack s8 D).  In a callback of ours, those held
-- behind a waiting handler (its own, maybe) are not waited for; what is
-- left is reported by close.
local function close_local(self, st)
  st.local_done = true
  if st.wait > 0 and st.can_wait and not st.cut and self.c:local_queued() > 0 then
    local main = self.c:depth() == 0
    -- one handler per loop turn: the linger's end and a signal are seen
    -- between two handlers (a handler already running finishes), the rest
    -- is reported by close (30 handlers of 0.2 s all ran in one turn, 9.8 s
    -- for a linger of 2, and a Ctrl-C waited for them all: outside attack
    -- s8 F4, F3, F2)
    self.c:local_batch(1)
    st.delivering = true
    close_wait(self, st, function()
      if close_stopped(self, st) or now(self) >= st.deadline then return true end
      local n, _, held = self.c:local_queued()
      return n == 0 or (not main and n == held)
    end)
    st.delivering = nil
    if not self.closed then self.c:local_batch(0) end
  end
end

-- lecho_close's first step (lua/lecho/capi.lua), while the C API's
-- handlers still run: the events for this context's own consumers handled,
-- within the close's linger (opts as close's; the close that follows
-- counts its linger from here).
function Context:_close_local(opts)
  if self.closed or self.closing then return true end
  local st = close_state(self, opts and opts.linger or self.linger)
  close_local(self, st)
  return true
end

--- Closes the context.  What was submitted before is delivered first:
-- every queue is written, then each connection ends and close waits until
-- the remote closed its side too (it has read everything), for at most
-- opts.linger seconds (the context's `linger`, 2 s by default; 0: do not
-- wait); the events submitted to its own consumers are handled first,
-- within the same linger.  Returns true, or nil, what could not be
-- delivered (also logged), "timeout".  A signal's "interrupted!" in its
-- wait ends the linger: the close is finished, then raises it.
function Context:close(opts)
  if opts ~= nil then options.check(opts, options.CLOSE, "ctx:close", 2) end
  if self.closed then return self.close_ok, self.close_err, self.close_code end
  -- from a log hook that a modulator's call runs: its state is up the
  -- stack (the close would free it, its delivery turn the loop): refused
  -- before anything is closed
  if self.c:moe_busy() then
    error("lecho: ctx:close() from inside a modulator's call (its log hook): refused, "
          .. "the modulator's state is in use up the stack", 2)
  end
  local linger = opts and opts.linger or self.linger
  local cst = self._cst
  if cst and cst.delivering and self.c:depth() > 0 then
    -- from a handler that close's local delivery runs: that close goes on
    -- below (its result is its own); waiting for it here waited for this
    -- handler to return, and it never returned (outside attack s8 F5)
    return nil, "ctx:close() in a handler that the close of this context runs: that close goes on", "busy"
  end
  if self.closing then
    -- Another close is delivering (in a callback that waits, or up the
    -- stack: a handler that close's linger runs): its result, waited for
    -- at most this close's linger (it waited with no deadline: a close up
    -- the stack never ended, the program hung)
    if not self:_wait(function() return self.closed end, now(self) + linger) then
      return nil, ("another close of this context is still delivering (waited %gs)"):format(linger), "timeout"
    end
    return self.close_ok, self.close_err, self.close_code
  end
  self.closing = true
  if self.trustwatch then self._trustwatch.stop(self) end
  local st = close_state(self, linger)
  local wait, t0, deadline, can_wait = st.wait, st.t0, st.deadline, st.can_wait
  linger = st.linger
  local function stopped() return close_stopped(self, st) end
  local function wait_for(ready) return close_wait(self, st, ready) end
  -- this context's own consumers first (lecho_close ran it already: capi)
  if not st.local_done then close_local(self, st) end
  -- groups (lecho.group): left at every name server, the others told now
  for _, g in each(self.groups or {}) do g:leave() end
  for _, ch in each(self.byname) do
    for _, con in ipairs({ unpack(ch.all) }) do con:close() end
    for p in each(ch.producers) do p:close() end
    if ch.rejoin then ch.rejoin:stop() end
  end
  -- in-process recorders (lecho.recorder): what their producers submitted, written
  if self.recorders then
    local list = {}
    for r in each(self.recorders) do list[#list + 1] = r end
    for _, r in ipairs(list) do r:close() end
  end
  if self.tick then self.tick:stop() end
  if self.metrics then self.metrics:close() end
  if self.reregister then self.reregister:stop() end
  local ok, err = true, nil
  if wait > 0 and can_wait and not st.cut then
    self.c:shutdown()
    local others = self.ending and open_others(self)
    if others then
      -- at the program's end no loop runs but this one: the other contexts
      -- of this state (this one's peers, maybe) are turned beside it, so
      -- that they read what it sends and close their side
      while self.c:pending() ~= 0 and now(self) < deadline and not stopped() do
        self.c:run_once(0.01)
        for _, o in ipairs(others) do
          if not o.closed and o.c:depth() == 0 then o.c:run_once(0) end
        end
      end
    else
      wait_for(function() return stopped() or self.c:pending() == 0 end)
    end
  end
  -- the time the close waited: its linger, or what it had of it when a
  -- signal ended it (it said "within the linger time of 10s" after 1 s:
  -- outside attack s8 H)
  local span = st.cut and ("when a signal interrupted the close after %.1fs of its linger time of %gs"):format(
    now(self) - t0, linger) or ("within the linger time of %gs"):format(linger)
  -- what is still queued, and what a connection's end (or no connection)
  -- dropped since the start: async events nobody was told of otherwise
  -- (not a queue policy the user chose; doc/semantics.md "Close")
  local open, events, bytes, lost, lost_bytes, lost_why, unc, unc_bytes, unc_why = self.c:pending()
  local code
  if events > 0 then
    ok, err, code = nil, ("%d events (%d bytes) not delivered %s"):format(events, bytes, span), "timeout"
  end
  -- events for this context's own consumers whose handlers did not run
  -- (linger 0, a close inside a callback, the linger's end, a signal)
  local lq, lq_bytes = self.c:local_queued()
  if lq > 0 then
    -- (a close inside a callback: those behind the running handler, of
    -- its channel, wait for it to return; a callback that cannot wait runs
    -- none)
    local why = span
    if not can_wait then
      why = "(a close inside a callback does not wait)"
    elseif wait > 0 and not st.cut and now(self) < deadline then
      why = "(queued behind the handler that called close)"
    end
    local m = ("%d events (%d bytes) to this context's own consumers not handled %s"):format(lq, lq_bytes, why)
    ok, err, code = nil, err and (err .. "; " .. m) or m, code or "timeout"
  end
  if lost > 0 then
    local m = ("%d events (%d bytes) not delivered: lost with a connection that ended before they were "
      .. "written (the last: %s)"):format(lost, lost_bytes, lost_why)
    ok, err, code = nil, err and (err .. "; " .. m) or m, code or "closed"
  end
  if unc > 0 then
    -- written (the kernel took them) to a context that confirms reads, on
    -- a connection that ended abnormally before it confirmed reading them
    -- (doc/semantics.md "Close", "Read confirmation")
    local m = ("%d events (%d bytes) not confirmed: written to a consuming context whose connection "
      .. "ended before it confirmed reading them (the last: %s)"):format(unc, unc_bytes, unc_why)
    ok, err, code = nil, err and (err .. "; " .. m) or m, code or "closed"
  end
  -- events that came after an interrupt, not handled: said (lecho.signals)
  local said = signals.close_report(self)
  if said and self.ending and self.quiet then
    -- (at the program's end: nobody can see it otherwise)
    pcall(io.stderr.write, io.stderr, logfmt("warn", ("lecho[%s]"):format(self.addr), "context", said) .. "\n")
  end
  if lost > 0 or unc > 0 then
    -- (said above)
  elseif events > 0 then
    -- (said above)
  elseif open > 0 and linger > 0 then
    -- Nothing of ours unread there (no event sent, the last one a sync
    -- event the remote answered: it read everything before it too, in
    -- order; or every event written there confirmed read): a remote slow to
    -- close (not running its loop) is said, not a failure of this close.
    -- (review 7 of issue 28: eight sync events, all true, then the consumer
    -- stopped its loop: close failed.)
    -- (and, from the same walk, what was written to a consumer that
    -- confirms reads not confirmed read yet)
    local unsure, unc_open, unc_open_bytes = 0, 0, 0
    if sent_events(self) then unsure, unc_open, unc_open_bytes = self.c:unsure() end
    local function conns(n)
      return n == 1 and "1 connection not closed by its remote" or ("%d connections not closed by their remotes"):format(n)
    end
    if unsure == 0 then
      self.log(("close: %s %s (nothing of ours unread there: no event sent, "
        .. "the last one answered, or all confirmed read)"):format(conns(open), span))
    else
      -- (a consumer that confirms reads: how much was not confirmed read)
      local what = unc_open > 0 and ("%d events (%d bytes) written there not confirmed read"):format(
        unc_open, unc_open_bytes) or "what was sent there may not have been read"
      local m = ("%s %s: %s"):format(conns(unsure), span, what)
      ok, err, code = nil, err and (err .. "; " .. m) or m, code or "timeout"
    end
  end
  if err and self.ending then
    err = err .. " (at the program's end: ctx:close() was not called)"
  end
  if err and (self.ending or st.intr or st.cut) then
    -- (a close a signal interrupted raises it: its caller does not get this;
    -- st.cut: the embedder's interrupt, Python's KeyboardInterrupt)
    if self.quiet then
      -- quiet silences the log, not a loss no caller can see any more
      pcall(io.stderr.write, io.stderr, logfmt("error", ("lecho[%s]"):format(self.addr),
        "context", "close: " .. err) .. "\n")
    end
  end
  if err then self.log("close: " .. err) end
  self.close_ok, self.close_err, self.close_code = ok, err, code
  self.closed = true
  open_ctxs[self] = nil
  self:_end_guard_off()
  self.c:close()
  -- the signal that ended the linger, raised again now that the context is
  -- closed: the program still stops
  self._cst = nil
  if st.intr then error(st.intr, 0) end
  return ok, err, code
end

--- The program ends (LuaJIT's lua_close runs the finalizers: a script's
-- last line, an uncaught error, os.exit(code, true)) and the context is
-- still open: it is closed as ctx:close() does, delivering what was
-- submitted within `linger`, and what could not be is logged (to stderr
-- even with quiet).  Called by the finalizer of the cdata lecho.context
-- keeps in _end_guard: LuaJIT runs every cdata finalizer before any
-- userdata's __gc, so the core context, the producer handles, timers,
-- modulator states and open files are all still there.  (No GC step runs
-- inside a finalizer: what the linger allocates waits for lua_close.)
-- Nothing on the close's path requires a module: a test runner (busted's
-- insulate) may have emptied package.loaded, so the module's chunk would
-- run again, and lua-cjson's (under lecho.keys) made a userdata whose __gc
-- ran, in the next round of finalizers, after cjson.so was unloaded:
-- SIGSEGV (spec/exit_close_spec.lua).  The keyed modules are kept in the
-- context (init.lua), the others required when context.lua loads.
function Context:_at_end()
  if self.closed or self.closing then return end
  -- A forked child that ends shares our sockets: a graceful close there
  -- would end the parent's connections.  It leaves them alone (the core
  -- context's __gc frees its copy, saying what that copy held).
  if ffi.C.getpid() ~= self._pid then return end
  self.ending = true
  AT_END.on = true
  -- SIGINT and SIGTERM now end the linger, not the process: what was not
  -- delivered is said, then the process ends by the signal (core.end_signals);
  -- not in the closes of a signal ctx:run() caught, where a second signal
  -- ends the process at once
  if not signal_closing then core.end_signals() end
  local others = open_others(self)
  if others and self.c:depth() == 0 then
    -- Several contexts in this state (one may consume what another
    -- produces): all write their queues while all are still open, their
    -- loops turned in turn, then a few more turns to read what was just
    -- written; then each closes (which turns the others), all of it
    -- within this context's linger.
    local all, deadline = { self, unpack(others) }, now(self) + self.linger
    self.end_deadline = deadline
    local settle = 10
    while settle > 0 and now(self) < deadline and not core.end_signal() do
      local queued = false
      for _, o in ipairs(all) do
        if not o.closed and o.c:depth() == 0 then
          o.c:run_once(0.002)
          local _, ev = o.c:pending()
          if ev > 0 then queued = true end
        end
      end
      if not queued then settle = settle - 1 end
    end
  end
  local pok, ok, err = pcall(self.close, self)
  -- (an error raised once closed, the close done: its result)
  if not pok and self.closed then pok, ok = true, self.close_ok end
  if not pok then
    pcall(io.stderr.write, io.stderr, ("lecho[%s]: close at the program's end failed, what was queued "
      .. "is lost: %s\n"):format(tostring(self.addr), tostring(ok)))
    pcall(self.c.close, self.c)
  end
  -- what could not be delivered (said on stderr) fails the process's exit
  -- status too: 1 instead of 0 (core/binding/lua_ctx.c, lb_exit)
  if (not pok or not ok) and core.exit_lost then core.exit_lost() end
end

--- exit() with contexts open and LuaJIT's state not closed (os.exit(code),
-- a C program's return from main with a liblecho context): each is closed
-- as at the program's end.  Run by core.on_exit's handler
-- (core/binding/lua_ctx.c), in the thread and process that made them.
function Context._exit_all()
  local list = {}
  for o in each(open_ctxs) do
    if not o.closed then list[#list + 1] = o end
  end
  for _, o in ipairs(list) do
    local ok, err = pcall(o._at_end, o)
    if not ok then
      pcall(io.stderr.write, io.stderr, ("lecho[%s]: close at exit failed, what was queued may be lost: %s\n")
        :format(tostring(o.addr), tostring(err)))
    end
  end
end

-- The guard's finalizer removed (a closed context owes nothing at the end):
-- else the finalizer table (weak keys, strong values) would keep the
-- closure, and through it the context, alive until the program ends.
function Context:_end_guard_off()
  if self._end_guard then
    ffi.gc(self._end_guard, nil)
    self._end_guard = nil
  end
end

return Context
