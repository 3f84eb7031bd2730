-- lecho.consumer: consumers, their handlers, and switching a consumer's
-- modulator (params or code) at every producer of the channel.

local core = require "lecho.core"
local options = require "lecho.options"
local modulator = require "lecho.modulator"
local history = require "lecho.history"
local Channel = require "lecho.channel"
-- Loops over keys as `in each(t)`, never `in pairs(t)`: no ITERN loop, which
-- Debian's LuaJIT may never end in the close at the program's end (context.lua).
local each = pairs

local mod_spec, reply_errors = modulator.spec, modulator.reply_errors

local Consumer = {}
Consumer.__index = Consumer

local tell_manager_later   -- (below, with the direct install)

--- Creates a consumer; handler(ev, meta) with meta = { channel, producer, seq }.
-- Returns once every producing context knows of it: it receives every event
-- submitted after this call returns.  opts.modulator (Lua source), params,
-- period, capabilities, on_error: see doc/modulators.md.  opts.buffer: a
-- string value reaches the handler as a string.buffer, emptied when the
-- handler returns (a long one points at the bytes where they were read:
-- no copy; context.lua run_buffered).
function Channel:consumer(handler, opts)
  if type(handler) ~= "function" then error("lecho: consumer needs a handler function", 2) end
  local ctx = self.ctx
  if ctx.closed then error("lecho: context is closed", 2) end
  opts = options.check(opts, options.CONSUMER, "ch:consumer", 2)
  ctx:_catch_up()
  local spec
  if opts.modulator ~= nil then
    spec = self:_fresh(mod_spec(opts.modulator, opts.params, opts.period, opts.capabilities, 3))
    spec.version = 1
    if spec.stream ~= spec.key then spec.pseq = 1 end   -- a stream of its own (_fresh)
  end
  ctx.nextcid = ctx.nextcid + 1
  local con = setmetatable({
    ch = self, handler = handler, id = ("%s/c%d"):format(ctx.addr, ctx.nextcid),
    errors = 0, mod_errors = 0, opts = opts, mod = spec, on_error = opts.on_error, chids = {},
    buffer = opts.buffer or nil,
  }, Consumer)
  if opts.buffer then ctx.c:views(true) ctx.views_on = true end   -- (lecho.history reads it)
  self.all[#self.all + 1] = con
  if spec then
    local err, code
    con.entry, err, code = self:_attach(con, spec, handler)
    if not con.entry then
      table.remove(self.all)
      return nil, err, code
    end
  else
    local list = self.consumers
    list[#list + 1] = con
    if #list == 1 then ctx.c:set_local(self.chid, true) end
    self:_hot_update()
    con.chids[self.chid] = true
  end
  -- issue 29: a consumer with history holds what comes until each producer
  -- answered; a new one changes this context's subscription, so the
  -- manager answers once every producer confirmed, and names them
  local hist
  if opts.history then
    hist = history.consumer(con, history.count(opts.history))
    self.hist_gen = (self.hist_gen or 0) + 1
    self.hist_want = { n = math.min(hist.n, history.MAX_N), key = con.mod and con.mod.key or nil }
  end
  local r, err, code
  if spec and not hist then r, err, code = self:_install_direct() end
  if not r then r, err, code = self:_update_subs() end
  self.hist_want = nil
  if not r then
    if hist then history.done_waiting(self) end
    con:_unlink()
    return nil, err, code
  end
  if type(r) == "table" and r.late and #r.late > 0 then
    ctx.log(("consumer on '%s': producers %s did not confirm in time"):format(
      self.short, table.concat(r.late, ", ")))
  end
  -- a producer that refused the member list naming us (its max_members,
  -- max_peers) sends us nothing: told to on_error, else logged
  for _, e in ipairs(type(r) == "table" and type(r.errors) == "table" and r.errors or {}) do
    if type(e) == "table" and e.key == nil and type(e.err) == "string" then
      local msg = ("producer %s: %s"):format(tostring(e.producer), e.err)
      if con.on_error then
        local ok, herr = pcall(con.on_error, msg)
        if not ok then ctx.log("on_error handler failed: " .. tostring(herr)) end
      else
        ctx.log(("consumer on '%s': %s"):format(self.short, msg))
      end
    end
  end
  if hist then history.fetch(hist, r) end
  return con
end

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
  local ch = self.ch
  if ch.ctx.closed then return end
  -- a modulated consumer of a context that stays a consumer here: its
  -- producers are told directly, after this turn (with the next install,
  -- or by the timer: tell_manager_later)
  if self.mod and #ch.all > 0 and ch:_direct_ok() then
    ch.direct_dirty = true
    return tell_manager_later(ch)
  end
  ch:_update_subs(true)
end

-- Switches to modulator spec with demodulator handler; waits for producers.
function Consumer:_switch(spec, handler)
  if self.closed then return nil, "consumer is closed", "closed" end
  local ch = self.ch
  spec = ch:_fresh(spec)      -- not a key whose instance failed (review 4 of issue 28)
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
  if spec.stream ~= spec.key then spec.pseq = spec.version end   -- a stream of its own
  local old_entry = self.entry
  -- Back to a modulator whose old stream is still ending here (A, B, A
  -- again before A's end came): the same key is one stream; its old entry
  -- goes now, or each event would reach both.
  local st = ch.streams[spec.stream or spec.key]
  if st then
    for _, e in ipairs(self.old_entries or {}) do
      for _, x in ipairs(st.consumers) do
        if x == e then ch:_detach(e) break end
      end
    end
  end
  local old_handler = self.handler
  local entry, aerr, acode = ch:_attach(self, spec, handler)
  if not entry then return nil, aerr, acode end
  self.mod, self.handler = spec, handler
  self.entry = entry
  -- ends of the old stream that come before the reply are kept (_stream_ended)
  if old_entry then old_entry.leaving, old_entry.early = true, nil end
  local r, err, code = ch:_update_subs()
  if old_entry then old_entry.leaving = nil end
  if not r then
    if old_entry then old_entry.early = nil end
    -- Not applied (the manager is unreachable, say): the old modulator stays
    -- this consumer's, its stream untouched.  The new entry is kept for a
    -- while in case some producer did switch before the failure was known:
    -- until its stream stayed quiet for sync_timeout (_end_watch).
    local new_entry = self.entry
    self.mod, self.handler, self.entry = old, old_handler, old_entry
    ch.subs_sig = nil
    self.old_entries = self.old_entries or {}
    self.old_entries[#self.old_entries + 1] = new_entry
    local nst = ch.streams[spec.stream or spec.key]
    if nst then ch:_end_watch(new_entry, spec.key, nst.chid) else ch:_detach(new_entry) end
    -- The request may have reached the manager before it failed: say again
    -- what this consumer takes (now if a manager is known, else at rejoin).
    if not ch.ctx.closed then ch:_update_subs(true) end
    return nil, err, code
  end
  if old_entry then
    -- What the old modulator sent and is still on its way goes to the old
    -- demodulator, until every producer said (in band, after its last event
    -- of that stream) that it sends no more, or its connection was lost; or
    -- the stream stayed quiet for sync_timeout (a producer that never
    -- answered: _end_watch).  Unless another consumer of this context still
    -- uses that modulator: then it stops at once.
    local st = old and ch.streams[old.stream or old.key]
    local ending = {}
    for _, a in ipairs(type(r) == "table" and r.producers or {}) do ending[a] = true end
    -- producers that ended it already, for this change (the list of the
    -- reply's version or a later one), not an earlier use of the same key
    local rver = type(r) == "table" and type(r.ver) == "number" and r.ver or math.huge
    for a, v in each(old_entry.early or {}) do
      if v >= rver then ending[a] = nil end
    end
    old_entry.early = nil
    if not st or #st.consumers > 1 or next(ending) == nil then
      ch:_detach(old_entry)
    else
      old_entry.ending = ending
      local keep = { old_entry }
      for _, e in ipairs(self.old_entries or {}) do
        if not e.detached then keep[#keep + 1] = e end
      end
      self.old_entries = keep
      ch:_end_watch(old_entry, old.key, st.chid)
    end
  end
  local perr = reply_errors(r, spec.key)
  if perr then return nil, perr, "failed" end
  return true
end

-- Waits (at most ctx.timeout) until every request of pend ({ p } each,
-- from ctx:_pend, sent to a producer) has its reply or failed, or the
-- context closed.
local function wait_replies(ctx, pend)
  ctx:_wait(function()
    if ctx.closed then return true end
    for _, q in ipairs(pend) do
      if not (q.p.reply or q.p.failed) then return false end
    end
    return true
  end, ctx.c:now() + ctx.timeout)
end

-- The producing contexts this consumer context knows of on channel ch:
-- those the manager named in its last answer here, this context if it
-- produces, and every peer that sent us events and has the channel (or
-- stream chid) bound here.  A list of addresses.
local function known_producers(ch, chid)
  local ctx = ch.ctx
  local to, seen = {}, {}
  local function add(a)
    if type(a) == "string" and not seen[a] then seen[a] = true; to[#to + 1] = a end
  end
  for _, a in ipairs(type(ch.producers_seen) == "table" and ch.producers_seen or {}) do add(a) end
  if ch.nprod > 0 then add(ctx.addr) end
  for idx in each(ctx.pnames) do
    local a = idx ~= 0 and ctx:_peer_addr(idx)
    if a and not seen[a] and (ctx.c:peer_binds(a, ch.chid) or (chid and ctx.c:peer_binds(a, chid))) then
      add(a)
    end
  end
  return to
end

-- The manager told of what the producers were told directly (not waited
-- for; one subscription for a burst of changes, SUBS_LATER): a producer
-- that joins later gets it in its list (its reply is not waited for, so
-- the producers known here are those of the last answer waited for).
-- A close sent directly is sent then too, unless an install since carried
-- it (ch.direct_dirty): a burst of closes and installs is one message per
-- install, the producer's instance of a closed consumer unloaded within
-- SUBS_LATER (its events meanwhile reach no handler here: the consumer
-- stopped at once, as when the close went through the manager).
local SUBS_LATER = 0.02   -- s
function tell_manager_later(ch)
  local ctx = ch.ctx
  if ch.subs_later then return end
  ch.subs_later = true
  ctx:after(SUBS_LATER, function()
    ch.subs_later = nil
    if ctx.closed then return end
    if ch.direct_dirty then
      ch.direct_dirty = nil
      if ch:_install_direct(true) then return end
    end
    -- not joined (the manager was lost): the rejoin sends what we take now
    if ch.cjoined then ch:_update_subs(true) end
  end)
end

-- The direct install (issue 27 item 6; doc/protocol.md `install`): this
-- context's whole set of modulators on the channel, sent straight to each
-- producer it knows, one message and one reply each, where the manager
-- already admitted this context as a consumer (a producer believes it
-- only then: lecho.modulator _install_req); the manager is told after.
-- Returns the reply as _update_subs does ({ producers, errors }), or
-- false when it does not apply or a producer did not take it (then the
-- change goes through the manager, whose list every producer takes).
-- nowait (a close): sent without waiting; true when sent.
function Channel:_direct_ok()
  local ctx = self.ctx
  return not (ctx.closed or ctx.closing or not self.cjoined or self.rejoin or not self.manager or #self.all == 0
              or self.svc_versions)   -- a call channel's servers: through the manager
end

function Channel:_install_direct(nowait)
  local ctx = self.ctx
  if not self:_direct_ok() then return false end
  local to = known_producers(self)
  if #to == 0 then return false end
  local subs = self:_subs()
  if subs.svc then return false end
  local msg = { op = "install", ch = self.name, sseq = subs.sseq, mods = subs.mods }
  if nowait then
    for _, a in ipairs(to) do ctx:_notify(a, { op = msg.op, ch = msg.ch, sseq = msg.sseq, mods = msg.mods }) end
    tell_manager_later(self)
    return true
  end
  self.direct_dirty = nil                 -- (this install carries every close before it)
  local pend = {}
  for _, a in ipairs(to) do
    local rid, p = ctx:_pend(a)
    pend[#pend + 1] = { a = a, rid = rid, p = p }
  end
  for _, q in ipairs(pend) do
    ctx:_send_ctrl(q.a, { op = msg.op, rid = q.rid, ch = msg.ch, sseq = msg.sseq, mods = msg.mods })
  end
  wait_replies(ctx, pend)
  local ok, errs, producers = true, {}, {}
  for _, q in ipairs(pend) do
    ctx.pending[q.rid] = nil
    local r = q.p.reply
    if r and r.ok then
      producers[#producers + 1] = q.a
      for _, k in ipairs(require("lecho.tables").sorted_keys(type(r.errs) == "table" and r.errs or {})) do
        errs[#errs + 1] = { producer = q.a, key = k, err = tostring(r.errs[k]):sub(1, 1000) }
      end
    elseif not (r and r.code == "notfound" and q.a ~= ctx.addr) then
      -- refused, failed, lost or silent: through the manager (its list is
      -- whole, with an sseq above this install's)
      ok = false
    end
  end
  if ctx.closed then return nil, "context closed while waiting", "closed" end
  if not ok then return false end
  tell_manager_later(self)
  return { producers = producers, errors = errs }
end

--- Replaces the params of this consumer's modulator at every producer.
-- Returns true once every producing context applied them, or nil, err.
function Consumer:set_params(params)
  if not self.mod then error("lecho: set_params: this consumer has no modulator", 2) end
  local m = self.mod
  if m.stream ~= m.key then
    -- in band (a change after the first): the key of these params on the
    -- stream is all it needs (one hash, not two: a respec is ~3 us of the
    -- consumer's ~35 us per change); the same params are no change
    local spec = modulator.respec(m, params, 3, m.stream)
    local r, err, code = self:_params_inband(spec)
    if r ~= false then return r, err, code end
    return self:_switch(modulator.respec(m, spec.params, 3), self.handler)
  end
  local spec = modulator.respec(m, params, 3)
  if spec.key == m.key then return true end
  -- The first change: to a stream of this consumer's own, through the
  -- manager (a new stream, as set_modulator).  Its id is no modulator's
  -- key, so a context asking for the first params later shares nothing
  -- with it; the changes after it go in band.
  local own = core.hash(m.key .. "|" .. self.id)
  return self:_switch(modulator.respec(m, spec.params, 3, own), self.handler)
end

-- The in-band change (doc/modulators.md "Ordering"): when this consumer is
-- the only one of its stream here, a `params` request goes to each
-- producer the manager last named, which applies it between two submits
-- and answers after the last event made with the old params, on the same
-- connection; the manager is told at the same time (not waited for), so
-- that a producer joining later installs the new params.  The stream,
-- its channel and the instance's state stay.  Returns false when it does
-- not apply (then the change goes through the manager: a new stream).
function Consumer:_params_inband(spec)
  local ch = self.ch
  local ctx = ch.ctx
  local old, e = self.mod, self.entry
  if not spec or self.closed or ctx.closed or not ch.cjoined then return false end
  local st = ch.streams[old.stream or old.key]
  if not st or #st.consumers ~= 1 or st.consumers[1] ~= e then return false end
  -- the producers (those with the channel or this stream bound here too)
  local to = known_producers(ch, st.chid)
  for _, x in ipairs(self.old_entries or {}) do
    if not x.detached then return false end
  end
  if spec.key == old.key then return true end
  self.vmax = math.max(self.vmax or 0, old.version or 0) + 1
  spec.version, spec.pseq = self.vmax, self.vmax
  -- the versions of this stream's keys (a producer says in band which it
  -- runs: the reply, or params_at), the last 64
  e.vkeys = e.vkeys or { [old.key] = old.version }
  e.vorder = e.vorder or { old.key }
  e.vkeys[spec.key] = spec.version
  e.vorder[#e.vorder + 1] = spec.key
  if #e.vorder > 64 then e.vkeys[table.remove(e.vorder, 1)] = nil end
  e.pver = e.pver or {}
  local pend, left = {}, 0
  for _, a in ipairs(to) do
    local rid, p = ctx:_pend(a)
    left = left + 1
    p.on_reply = function(msg)
      -- in band: the events before this reply were made with the old params
      if msg.ok then e.pver[a] = spec.version end
    end
    pend[#pend + 1] = { a = a, rid = rid, p = p }
  end
  self.mod = spec
  for _, q in ipairs(pend) do
    ctx:_send_ctrl(q.a, { op = "params", rid = q.rid, ch = ch.name, stream = spec.stream, key = spec.key,
                          pseq = spec.pseq, params = spec.params })
  end
  wait_replies(ctx, pend)
  local busy, other, applied
  -- none known here: the manager says who they are (its reply comes once
  -- each took the list; those that switch on it say so in band)
  if #to == 0 then other = "no producer known here" end
  for _, q in ipairs(pend) do
    ctx.pending[q.rid] = nil
    local r = q.p.reply
    applied = applied or (r and r.ok)
    if r and not r.ok then
      if r.code == "busy" then busy = true
      elseif r.code ~= "notfound" then other = ("producer %s: %s"):format(q.a, tostring(r.err)) end
    elseif not r and not q.p.failed then
      other = ("no answer from producer %s within %gs"):format(q.a, ctx.timeout)
    end
  end
  if ctx.closed then return nil, "context closed while waiting", "closed" end
  if busy then
    -- shared with another context at a producer: a stream of its own,
    -- through the manager (told nothing of the in-band key)
    self.mod = old
    e.vkeys[spec.key] = nil
    if not applied then self.vmax = self.vmax - 1 end   -- nothing was made with it
    return self:_switch(modulator.respec(spec, spec.params, 3), self.handler)
  end
  -- the manager, not waited for: a producer that joins later installs the
  -- new params; one the manager lists that we did not know switches when
  -- the list comes, and says so in band (params_at)
  if not other and not ch.subs_later then
    -- one subscription update for a burst of changes (each would cost the
    -- manager a member list and every producer its confirmation)
    ch.subs_later = true
    ctx:after(SUBS_LATER, function()
      ch.subs_later = nil
      -- not joined (the manager was lost): the rejoin sends what we take now
      if not ctx.closed and ch.cjoined then ch:_update_subs(true) end
    end)
  end
  if other then
    -- through the manager: its reply comes once every producer took the list
    -- naming the new key (those that switch then say so in band: params_at)
    ch.subs_sig = nil
    local r, err, code = ch:_update_subs()
    if not r then return nil, err, code end
    local perr = reply_errors(r, spec.key)
    if perr then return nil, perr, "failed" end
  end
  -- e.version stays: the version of producers that never said (they run
  -- the key the stream started with)
  return true
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
-- encoded payloads received over the wire; local deliveries count 0 bytes);
-- undelivered: events of an old modulator's stream that came after it was
-- given up (a producer that never ended it, doc/modulators.md "Ordering").
function Consumer:stats()
  local c = self.ch.ctx.c
  local ev, by = 0, 0
  for chid in each(self.chids) do
    local ein, bin, eloc = c:chan_stats(chid)
    ev, by = ev + ein + eloc, by + bin
  end
  local lost = self.undelivered or 0
  for _, rec in each(self.given_up or {}) do
    lost = lost + (rec.upto or modulator.stream_events(c, rec.chid)) - rec.base
  end
  return { events = ev, bytes = by, errors = self.errors, modulator_errors = self.mod_errors,
           undelivered = lost }
end

return Consumer
