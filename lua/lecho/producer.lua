-- lecho.producer: producers and submits (async, blocking, sync).  A submit
-- is the hot path: encoded once (by the compiled encoder when it can), no
-- closure or table made unless it waits for room.

local options = require "lecho.options"
local Channel = require "lecho.channel"
local stats = require "lecho.stats"
local history = require "lecho.history"
-- Loops over keys as `in each(t)`, never `in pairs(t)`: no ITERN loop, which
-- Debian's LuaJIT may never end in the close at the program's end (context.lua).
local each = pairs

local sorted_keys = require("lecho.tables").sorted_keys

local Producer = {}
Producer.__index = Producer

-- What a submit reads sits in the producer's array part, in these slots: a
-- small array is allocated with the table's header, so a submit touches two
-- adjacent cache lines of it, not a hash part's scattered nodes (thousands
-- of channels round-robin: these misses were the producer's cost).  H is the
-- core's producer handle (core/binding/lua_prod.c: channel, producer id, sequence,
-- policy and the channel's modulators; liblecho submits through it too), HP
-- its address for the FFI; MODS (the channel's modulator list, or false) and
-- PLAIN are Lua's copies for submit_sync's "no consumer" check; ENC is false
-- without the compiled encoder.
local H, HP, MODS, PLAIN, ENC = 1, 2, 3, 4, 5
Producer.MODS, Producer.PLAIN = MODS, PLAIN

-- lb_dataplane (core/binding/lua_prod.h): stage copies fastenc's buffer into the
-- handle's next message, once, without a Lua string or a Lua C call.
local DP
do
  local ok, ffi = pcall(require, "ffi")
  local core = require "lecho.core"
  if ok then
    if not pcall(ffi.typeof, "lb_dataplane") then ffi.cdef(core.dataplane_cdef) end
    DP = ffi.cast("const lb_dataplane *", core.dataplane())
    Producer._ffi = ffi
  end
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

--- Creates a producer.  opts.policy overrides the context's queue policy.
-- Returns once the manager told this context where the consumers are.
function Channel:producer(opts)
  opts = options.check(opts, options.PRODUCER, "ch:producer", 2)
  local ctx = self.ctx
  if ctx.closed then error("lecho: context is closed", 2) end
  ctx:_catch_up()
  -- Granted before joining: the join installs the current modulators.
  for _, cap in ipairs(opts.grant or {}) do self.grants[cap] = true end
  if self.nprod == 0 then
    local ok, err, code = self:_join("producer")
    if not ok then return nil, err, code end
  end
  self.nprod = self.nprod + 1
  ctx.nextpid = ctx.nextpid + 1
  local h = ctx.c:producer(self.chid, ctx.nextpid, opts.policy or false)
  local mods, plain = self.modlist[1] and self.modlist or false, self:_plain()
  h:set_mods(mods, plain)
  -- What submit reads sits in the producer itself (one table per event:
  -- with thousands of channels, cache misses are the cost): the slots above.
  local p = setmetatable({ h, DP and Producer._ffi.cast("void *", h) or false, mods, plain,
                           DP and ctx.fastenc or false, ch = self, id = ctx.nextpid }, Producer)
  if opts.history then p.hist = history.ring(history.count(opts.history),
                                                   opts.history_bytes or history.DEFAULT_BYTES) end
  self.producers[p] = true
  if opts.record then
    -- issue 29: recorded in this process, off its thread (lecho.recorder)
    local ok, err, code = p:record(opts.record)
    if not ok then
      p:close()
      return nil, err, code
    end
  end
  return p
end

-- The channel's modulators or consumers changed (Channel:_hot_update).
function Producer:_retarget(mods, plain)
  self[MODS], self[PLAIN] = mods, plain
  self[H]:set_mods(mods, plain)
end

-- The sequence of the last event this producer submitted.
function Producer:_seq() return self[H]:seq() end

-- The producer id its events carry from now on (lecho.replay's producers).
function Producer:_set_pid(pid)
  self[H]:set_pid(pid)
  self.id = pid
end

-- One try: the core answers "wouldblock" when a queue has no room (and
-- then did nothing).  bytes: a string holding the encoded value (a retry
-- after a wait); else the value, staged from fastenc's buffer when it
-- encoded it.  Returns again, r, err, code.
local function try_submit(self, ev, sync, bytes)
  local h = self[H]
  local r, err, code
  -- (with history: this event's sequence number if the core takes it,
  -- read before: a submit from a log hook within this one's modulator
  -- calls takes the next ones)
  local seq
  if bytes then
    if DP.stage(self[HP], bytes, #bytes) ~= 0 then return false, nil, "out of memory", "nomem" end
    if self.hist then seq = h:seq() + 1 end
    r, err, code = h:submit_staged(sync)
  else
    local enc = self[ENC]
    local p, n
    if enc then p, n = enc(ev) end
    if p then
      if DP.stage(self[HP], p, n) ~= 0 then return false, nil, "out of memory", "nomem" end
      -- issue 29: a producer keeping history keeps these bytes (a string),
      -- taken before the submit: the encoder's buffer is the context's, and
      -- a log hook a modulator's call runs within it may submit (on any
      -- producer here), encoding its event over this one's
      if self.hist then bytes, seq = Producer._ffi.string(p, n), h:seq() + 1 end
      r, err, code = h:submit_staged(sync)
      -- a wait keeps the bytes (the encoder's buffer is the next submit's)
      if code == "wouldblock" then return true, nil, err, code, bytes or Producer._ffi.string(p, n) end
    else
      if self.hist then seq = h:seq() + 1 end
      r, err, code = h:submit(ev, sync)
    end
  end
  if r then
    if self.hist then history.add(self, seq, bytes, ev) end  -- kept for late joiners
    return false, r
  end
  return code == "wouldblock", r, err, code
end

-- The waiting part of submit_core: behind the submits of this producer
-- already waiting, until there is room.
local function submit_wait(self, ev, sync, bytes, deadline)
  local h = self[H]
  local q = self.waitq or {}
  self.waitq = q
  local me = {}
  q[#q + 1] = me
  h:waiting(1)  -- liblecho's submits take this path while any waits
  local ctx = self.ch.ctx
  local function ready()
    return self.closed or q[1] == me and h:room()
  end
  while true do
    -- false without a deadline: closed, or an embedder's interrupt
    -- (lecho_set_interrupt: Python's Ctrl-C), which main_wait answers at
    -- once without a loop turn: retrying would spin (issue 28, review 4).
    local ok = ctx:_wait(ready, deadline)
    if q[1] == me then table.remove(q, 1) end
    if self.closed or ctx.closed then
      h:waiting(-1)
      return nil, "producer closed while waiting for room", "closed"
    end
    if not ok then
      for i = #q, 1, -1 do if q[i] == me then table.remove(q, i) end end  -- the next may go
      h:waiting(-1)
      if deadline and ctx.c:now() >= deadline then
        -- a sync submit's timeout counts from its call, its wait for room
        -- included (it waited past it, then said true: issue 28, review 5)
        return nil, "no room in the queues within the timeout (nothing was sent)", "timeout"
      end
      return nil, "interrupted while waiting for room (nothing was sent)", "timeout"
    end
    local again, r, err, code, b = try_submit(self, ev, sync, bytes)
    bytes = bytes or b
    if not again then
      h:waiting(-1)
      return r, err, code
    end
    table.insert(q, 1, me)
  end
end

-- One submit to the core: encoded once, through the modulators.  Under the
-- block policy (and for every sync submit) it first waits for room, in the
-- order the submits of this producer were called.  No closure is made unless
-- it waits (a submit is the hot path).
local function submit_core(self, ev, sync, deadline)
  local q = self.waitq
  local bytes
  if not q or not q[1] then
    local again, r, err, code, b = try_submit(self, ev, sync)
    if not again then return r, err, code end
    bytes = b
  end
  return submit_wait(self, ev, sync, bytes, deadline)
end

--- Queues ev for every consumer: true, or nil, err (nothing was sent: the
-- value cannot be encoded, or the producer is closed).  Returns at once,
-- but under the block policy first waits for room in the queues.
function Producer:submit(ev)
  if self.closed then return nil, "producer is closed", "closed" end
  return submit_core(self, ev, false)
end

-- failed plus ch's failed modulators not in it yet (failed nil and none
-- failed: nil, no table).
local function add_failed(failed, ch)
  for key, why in each(ch.failed) do
    if not (failed and failed[key]) then
      failed = failed or {}
      failed[key] = { why = why, dests = ch.failed_dests[key] }
    end
  end
  return failed
end

-- Waits until every sync record of ids (one id, or the list of a submit
-- through modulators) settled: on the core's settled notice, as a call
-- does (Context:_wait_sync): in a coroutine no poll per loop turn (the
-- main line polls ctx:sync_pending once a turn).  False when the
-- deadline came first or the context closed.
local function wait_settled(ctx, ids, deadline)
  if type(ids) ~= "table" then return ctx:_wait_sync(ids, deadline) end
  for i = 1, #ids do
    if not ctx:_wait_sync(ids[i], deadline) then return false end
  end
  return true
end

--- Submits ev and waits until every consumer ran its handler.
-- Returns true, or nil, errors, code: errors a list of { context,
-- consumer, err, code } (it prints as one line) with each failing or silent
-- consumer, and each consumer whose modulator failed here; every code set
-- where its error happened (a remote handler's comes in the ACK, a lost
-- connection's or a timeout's from the sync record), never read from a
-- message.  The list's code is theirs when they agree, else "failed".
function Producer:submit_sync(ev, opts)
  if self.closed then return nil, "producer is closed", "closed" end
  local ctx = self.ch.ctx
  local c = ctx.c
  if opts ~= nil then options.check(opts, options.SUBMIT_SYNC, "p:submit_sync", 2) end
  ctx:_catch_up()
  local timeout = opts and opts.timeout or ctx.sync_timeout
  -- Nobody anywhere takes it (no consumer context, no local consumer, no
  -- modulator running or failed here): no handler can run, and "true"
  -- would say that all of them ran.
  local ch0 = self.ch
  if not self[PLAIN] and not self[MODS] and next(ch0.failed) == nil then
    return nil, "no consumer of " .. ch0.short, "noconsumer"
  end
  local t0 = c:now()
  local deadline = t0 + timeout
  local ids, err, code = submit_core(self, ev, true, deadline)
  local nobody  -- the core had no destination for it (nothing sent)
  if not ids then
    -- nobody takes it plain, but consumers whose modulator failed here
    -- are told below (as when it went plain to no one)
    if code ~= "noconsumer" or next(self.ch.failed) == nil then return nil, err, code end
    ids, nobody = {}, { err, code }
  end
  -- Consumers whose modulator failed or was refused here got nothing: as
  -- they were at the submit (a membership change during the wait may drop
  -- the record) and as they are after it.
  local ch = self.ch
  local failed = add_failed(nil, ch)
  -- Then one call collects: true, or nil, errors (no tables unless
  -- something failed); past the deadline, with the timeout, silent
  -- consumers become errors.
  wait_settled(ctx, ids, deadline)
  if ctx.closed then return nil, "context closed while waiting", "closed" end
  local ok, all = c:sync_result(ids)
  if ok == false and c:depth() == 0 then
    -- The deadline came before a loop turn ran this process's consumers
    -- (timeout 0): they run now all the same.  Not from inside a callback,
    -- where events after the running one of its channel would overtake it.
    c:drain_local()
    ok, all = c:sync_result(ids)
  end
  if ok == false then ok, all = c:sync_result(ids, timeout) end
  failed = add_failed(failed, ch)
  for _, key in ipairs(failed and sorted_keys(failed) or {}) do
    local f = failed[key]
    for _, a in ipairs(f.dests or {}) do
      all = all or {}
      all[#all + 1] = { context = a, code = "failed", err = ("modulator %s not running at %s: %s")
        :format(key, ctx.addr, f.why) }
    end
  end
  if all and #all > 0 then
    -- The list's code is its entries' when they agree.
    local lcode
    for _, e in ipairs(all) do
      lcode = (lcode == nil or lcode == e.code) and e.code or "failed"
    end
    stats.observe(ctx, ch.name, c:now() - t0, false)
    return nil, setmetatable(all, ErrList), lcode
  end
  if nobody then return nil, nobody[1], nobody[2] end
  stats.observe(ctx, ch.name, c:now() - t0, true)  -- the sync latency histogram
  return true
end

-- An event already encoded (lecho.replay: the bytes a recording holds),
-- submitted as submit does (room, order, modulators).
function Producer:_submit_encoded(s)
  if self.closed then return nil, "producer is closed", "closed" end
  local q = self.waitq
  if not q or not q[1] then
    local again, r, err, code = try_submit(self, nil, false, s)
    if not again then return r, err, code end
  end
  return submit_wait(self, nil, false, s)
end

--- Records every event this producer submits from now on (issue 29,
-- lecho.recorder): into rec (ctx:recorder), or into a file of its own
-- (a name: a recorder closed with the producer or the next record call);
-- nil: no more (its own recorder closed).  true, or nil, err, code.
function Producer:record(target)
  if self.closed then return nil, "producer is closed", "closed" end
  local own = self.own_rec
  if own then
    self.own_rec = nil
    self[H]:set_record(nil)
    own:close()
  end
  if target == nil then
    self[H]:set_record(nil)
    return true
  end
  local rec, err, code = target, nil, nil
  if type(target) == "string" then
    rec, err, code = self.ch.ctx:recorder(target)
    if not rec then return nil, err, code end
    self.own_rec = rec
  elseif type(target) ~= "table" or not target._attach then
    error("p:record: a file name, a recorder (ctx:recorder) or nil expected", 2)
  end
  return rec:_attach(self)
end

--- Writes whatever this context has queued, now.
function Producer:flush() self.ch.ctx.c:flush() end

function Producer:close()
  if self.closed then return end
  self.closed = true
  local ch = self.ch
  ch.producers[self] = nil
  ch.nprod = ch.nprod - 1
  self[H]:close()
  if self.own_rec then self.own_rec:close() end
  if ch.nprod == 0 then
    ch.ctx.c:flush()
    ch:_leave("producer")
  end
end

return Producer
