-- lecho.capi: the Lua half of liblecho (core/capi/lecho.c), loaded in the private
-- LuaJIT state that each C context runs.  It calls only the public API of
-- `lecho` and turns its results into what lecho.c reads: every function
-- returns its results, or nil, message, code (a name of the shared error
-- list) for an expected failure or a raised one.  Not for Lua programs.

local lecho = require "lecho"
local address = require "lecho.addr"
local core = require "lecho.core"
-- Loops over keys as `in each(t)`, never `in pairs(t)`: no ITERN loop, which
-- Debian's LuaJIT may never end in the close at the program's end (context.lua).
local each = pairs

local M = {}

-- consumer -> its queue (M.consumer_queued), for M.consumer_close
local queues = setmetatable({}, { __mode = "k" })

-- A raised error's message without the "file.lua:12: " prefixes Lua adds
-- (a C caller cannot use them).
local function bare(msg)
  msg = tostring(msg)
  local prev
  repeat
    prev = msg
    msg = msg:gsub("^[^%s:]+%.lua:%d+: ", ""):gsub('^%[string "[^"]*"%]:%d+: ', "")
  until msg == prev
  return msg
end

-- The code of a raised error: misuse (a bad argument, an unknown option,
-- lecho.errors) is "invalid", running out of memory "nomem".  The code of a
-- returned failure is the Lua layer's third value, never read from the
-- message; "failed" when it gave none.
local function raised(err)
  local msg = bare(err)
  if msg == "not enough memory" then return nil, msg, "nomem" end
  return nil, msg, "invalid"
end

-- Calls fn(...) protected: its results, or nil, message, code.
local function protect(fn, ...)
  local r = { pcall(fn, ...) }
  if not r[1] then return raised(r[2]) end
  if r[2] == nil then return nil, tostring(r[3]), type(r[4]) == "string" and r[4] or "failed" end
  return unpack(r, 2, table.maxn(r))
end

-- { "name", "value", ... } strings to an options table (see lecho.h).
local function options(list)
  local opts = {}
  for i = 1, #list, 2 do
    local k, v = list[i], list[i + 1]
    if v == "true" then
      v = true
    elseif v == "false" then
      v = false
    elseif tonumber(v) then
      v = tonumber(v)
    elseif k == "trust" and v:find(":", 1, true) then
      -- several trust files, separated by ":" as in $LECHO_TRUST
      local list = {}
      for f in v:gmatch("[^:]+") do list[#list + 1] = f end
      v = list
    end
    opts[k] = v
  end
  return opts
end

function M.open(list)
  return protect(function()
    local ctx = lecho.context(options(list))
    return ctx, ctx.addr, ctx.ns
  end)
end

-- lecho_close's first step, before the C API's handlers stop: the events
-- for the context's own consumers handled (Context:_close_local)
function M.close_local(ctx, linger)
  return protect(ctx._close_local, ctx, not (linger < 0) and { linger = linger } or nil)
end

function M.close(ctx, linger)
  local opts = not (linger < 0) and { linger = linger } or nil
  local ok, a, b, c = pcall(ctx.close, ctx, opts)
  if not ok and ctx.closed then
    -- "interrupted!" raised once the close was finished (a signal, the
    -- embedder's interrupt in a handler the close ran): the close's result;
    -- the embedder raises its own interrupt (it came back as "invalid",
    -- which Python took for a refused close: the loss was not kept, a
    -- second close succeeded, outside attack s8 F2)
    if ctx.close_ok then return true end
    return nil, tostring(ctx.close_err), ctx.close_code or "failed"
  end
  if not ok then return raised(a) end
  if a == nil then return nil, tostring(b), type(c) == "string" and c or "failed" end
  return a, b, c
end

function M.run(ctx) return protect(function() ctx:run(); return true end) end

function M.run_once(ctx, t)
  return protect(function()
    if t < 0 then ctx:run_once() else ctx:run_once(t) end
    return true
  end)
end

function M.stop(ctx) return protect(function() ctx:stop(); return true end) end

-- lecho_set_interrupt: f() (a C function) true ends a main-line wait
-- (Context:_wait's main_wait) as its deadline would; nil: none.
function M.set_interrupt(ctx, f)
  ctx.interrupt = f
  return true
end

function M.channel(ctx, name)
  return protect(function()
    local ch = ctx:channel(name)
    return ch, ch.name
  end)
end

function M.producer(ch, policy)
  return protect(ch.producer, ch, policy and { policy = policy } or nil)
end

-- The hot path: no table per call.
function M.submit(p, ev)
  local ok, r, err, code = pcall(p.submit, p, ev)
  if not ok then return raised(r) end
  if r == nil then return nil, tostring(err), type(code) == "string" and code or "failed" end
  return true
end

-- true; or nil, message, code (the Lua layer's) and, when the failure is per
-- consumer, a flat list { context, consumer, err, code, ... }.
function M.submit_sync(p, ev, timeout)
  local r = { pcall(p.submit_sync, p, ev, not (timeout < 0) and { timeout = timeout } or nil) }
  if not r[1] then return raised(r[2]) end
  if r[2] then return true end
  local errs, code = r[3], type(r[4]) == "string" and r[4] or "failed"
  if type(errs) ~= "table" then return nil, tostring(errs), code end
  local flat = {}
  for _, e in ipairs(errs) do
    flat[#flat + 1] = tostring(e.context or "")
    flat[#flat + 1] = tostring(e.consumer or "")
    flat[#flat + 1] = tostring(e.err or "")
    flat[#flat + 1] = type(e.code) == "string" and e.code or code
  end
  return nil, tostring(errs), code, flat
end

-- A started operation r just ended: r.done, and the loop call that carries it
-- returns without polling first.  Its coroutine is mostly resumed by the
-- turn hook (the prepare phase, Context:_turn), after which the poll would
-- sleep until the next event or the caller's turn timeout (0.1 s a call in
-- the same process) before the caller could see it (c:break_once: that
-- iteration, ctx:run goes on).
local function done_now(ctx, r)
  r.done = true
  if not ctx.closed then ctx.c:break_once() end
end

-- lecho_submit_sync_start: the submit now, its wait in a coroutine of the
-- context (ctx:_spawn runs it at once: the event is encoded and queued
-- before this returns, so memory lent to it may change after).  r =
-- { done = false } until it ends; then ok, and message, code, errors (the
-- flat list of M.submit_sync) when it failed.
function M.submit_sync_start(p, ev, timeout)
  local r = { done = false }
  local ctx = p.ch.ctx
  local ok, err = pcall(ctx._spawn, ctx, function()
    local res = { M.submit_sync(p, ev, timeout) }
    if res[1] then
      r.ok = true
    else
      r.ok, r.message, r.code, r.errors = false, res[2], res[3], res[4]
    end
    done_now(ctx, r)
  end)
  if not ok then return raised(err) end
  return r
end

-- lecho_call_start: ctx:call_async; r as above, with results ({ n, ... })
-- or the error value (value), and took (seconds from the start to the
-- answer: the Python binding tells a late same-process answer by it).
function M.call_start(ctx, name, args, opts)
  local r = { done = false }
  local t0 = ctx:now()
  local ok, err = pcall(ctx.call_async, ctx, name, args, opts or {}, function(...)
    r.took = ctx:now() - t0
    local a = { n = select("#", ...), ... }
    if a[1] then
      local res = { n = a.n - 1 }
      for i = 2, a.n do res[i - 1] = a[i] end
      r.ok, r.results = true, res
    else
      local e = a[2]
      r.ok, r.value = false, e
      r.message = type(e) == "string" and e or (type(e) == "table" and type(e.message) == "string" and e.message)
        or tostring(e)
      r.code = type(a[3]) == "string" and a[3] or "failed"
    end
    done_now(ctx, r)
  end)
  if not ok then return raised(err) end
  return r
end

function M.flush(p) return protect(function() p:flush(); return true end) end

-- path: record what p submits into that file (lecho.recorder); nil: no more
-- (or into a recorder of M.recorder_open)
function M.producer_record(p, path) return protect(p.record, p, path) end

-- ctx:recorder(path, opts) (lecho.recorder); opts: a table or nil
function M.recorder_open(ctx, path, opts)
  require "lecho.recorder"
  return protect(ctx.recorder, ctx, path, opts)
end
function M.recorder_flush(r, fsync) return protect(r.flush, r, { fsync = fsync }) end
function M.recorder_stats(r) return protect(r.stats, r) end
function M.recorder_close(r) return protect(r.close, r) end

function M.producer_close(p) return protect(function() p:close(); return true end) end

-- cfn(ev, meta) is lecho.c's trampoline: nothing, or the handler's message.
-- opts: nil, or the consumer options lecho_consumer_open_opts takes
-- (modulator, params, period, capabilities; ch:consumer checks them).
-- sink: lecho.c's C sink for the same handler: while this is the channel's
-- only plain consumer, its async events go to the sink from the event hook
-- (core/binding/lua_sink.c, Channel:_hot_update), the rest through the trampoline.
-- Returns the consumer and the channel's short name (meta.channel).
-- opts.on_error = true (the C API's way to ask for one before the open,
-- which turns the loop: a failure reported meanwhile would be logged): the
-- modulator's failures are held (at most HELD) until lecho_consumer_on_error
-- sets the function (M.on_error), which then hears them.
local HELD = 100
local function hold_errors(opts)
  if type(opts) ~= "table" or opts.on_error ~= true then return opts, nil end
  local o = {}
  for k, v in each(opts) do o[k] = v end
  local held = { n = 0, lost = 0 }
  o.on_error = function(msg)
    if held.n < HELD then held.n = held.n + 1 held[held.n] = msg else held.lost = held.lost + 1 end
  end
  return o, held
end

function M.consumer(ch, cfn, opts, sink)
  local held
  opts, held = hold_errors(opts)
  local c, err, code = protect(ch.consumer, ch, function(ev, meta)
    local err = cfn(ev, meta)
    if err then error(err, 0) end
  end, opts)
  if not c then return nil, err, code end
  c.held_errors = held
  if sink and not c.mod and not c.buffer then
    c.sink = sink
    ch:_hot_update()
  end
  return c, ch.short
end

-- A C sink's handler failed on an async event: counted and logged as
-- Context:_on_event does for a Lua handler.
function M.consumer_failed(c, err)
  c.errors = c.errors + 1
  -- the embedder's interrupt ended it (Python's KeyboardInterrupt): no
  -- further event goes to a handler until the main line raised it
  local ctx = c.ch.ctx
  if ctx.interrupt and ctx.interrupt() then ctx:_interrupted() end
  c.ch.ctx.log(("consumer %s on '%s' failed: %s"):format(c.id, c.ch.short, err))
end

-- A queued consumer (lecho_consumer_open_queued): its handler appends to
-- a queue { head, tail, dropped } that M.take empties; no call into C per
-- event.  Past `limit` events waiting, an event fails at this consumer
-- ("queue full": a sync submit sees it) and is counted in q.dropped.
function M.consumer_queued(ch, opts, limit)
  local held
  opts, held = hold_errors(opts)
  -- nin, nout, nset: events queued, taken, settled since the consumer
  -- opened; acks: the held acks of sync events, oldest first, each
  -- { rec, position }, from ahead (the next to settle) to atail
  -- rel: per event, the arrays that took their read buffer over for this
  -- consumer alone (see below), given back when the handle they were taken
  -- into is freed (M.release)
  local q = { head = 1, tail = 0, dropped = 0, prod = {}, seq = {}, chan = {}, rel = {},
              nin = 0, nout = 0, nset = 0, acks = {}, ahead = 1, atail = 0 }
  local ctx = ch.ctx
  local c
  local err, code
  c, err, code = protect(ch.consumer, ch, function(ev, meta)
    local t = q.tail
    if t - q.head + 1 >= limit then
      q.dropped = q.dropped + 1
      error("queue full", 0)
    end
    -- kept past its dispatch: arrays received as views get their own copy,
    -- or the read buffer they are in (Context:keep_values).  Those adopted
    -- here, of this event (the innermost dispatch's, rv.v), while this is
    -- the only consumer of the channel in the context (its fast path,
    -- Channel:_hot_update): nothing but this queue, and then the handle
    -- M.take puts it in, holds them (no other consumer was given the
    -- event; one that kept it before this one ran adopted them first).
    local views = ctx.views
    local rv = views[#views]
    if rv and rv.v ~= ev then rv = nil end
    local k0 = rv and rv.kept and #rv.kept or 0
    ctx:keep_values()
    t = t + 1
    local kept = rv and rv.kept
    if kept and #kept > k0 and ctx.dcon[ch.chid] == c then
      q.rel[t] = { unpack(kept, k0 + 1) }
    end
    q[t], q.prod[t], q.seq[t], q.chan[t] = ev, meta.producer, meta.seq, meta.channel
    q.tail = t
    q.nin = q.nin + 1
    -- a sync event: its ack waits until the binding's code is done with it
    -- (M.settle), not merely queued
    if meta.sync then
      local rec = ctx:_hold_ack(meta)
      q.atail = q.atail + 1
      q.acks[q.atail] = { rec, q.nin }
    end
  end, opts)
  if not c then return nil, err, code end
  c.held_errors = held
  q.ctx, q.id = ctx, c.id
  queues[c] = q
  return c, q
end

-- Settles the n oldest taken events not settled yet (at most those taken):
-- the held acks among them go out, as handled (err nil) or failed with err.
local function settle(q, n, err)
  local upto = math.min(q.nset + n, q.nout)
  q.nset = upto
  local acks, a = q.acks, q.ahead
  while a <= q.atail and acks[a][2] <= upto do
    q.ctx:_settle_ack(acks[a][1], q.id, err)
    acks[a] = nil
    a = a + 1
  end
  if a > q.atail then a, q.atail = 1, 0 end
  q.ahead = a
end

-- lecho_consumer_wait: loop turns until q has an event, t seconds pass
-- (t < 0: no limit) or the context closes.  One call from the binding
-- instead of one per turn: an 8 MiB event comes in dozens of reads.
function M.wait(q, t)
  return protect(function()
    local ctx = q.ctx
    if q.head <= q.tail then return true end
    -- the caller let go of what it took (its iterator waits for the next):
    -- the read buffers of its arrays come back now, for the next frames
    ctx.c:reclaim()
    local deadline = t >= 0 and ctx:now() + t or nil
    repeat
      if deadline then
        local left = deadline - ctx:now()
        if left <= 0 then break end
        ctx:run_once(left)
      else
        ctx:run_once()
      end
    until q.head <= q.tail or ctx.closed
    return true
  end)
end

function M.settle(q, n, err)
  return protect(function() settle(q, n, err); return true end)
end

-- At most max events of q, oldest first: the list { ev, ... } or, with
-- meta, { { ev, producer, seq, channel }, ... }; q.dropped; and how many
-- (a nil event is a hole in the list: its length may miss the last ones).
--
-- Fourth: the arrays of those events to give back when the handle they go
-- into is freed (M.release), or nil: only this queue held them, and the
-- caller's handle holds them from now on (lecho.c op_take; any use of that
-- handle that may let another hold them, lecho_field, lecho_set_value from
-- it, a submit, clears that, lecho_value.c).
function M.take(q, max, meta)
  local out, n = {}, 0
  local h, t = q.head, q.tail
  local prod, seq, chan, rel = q.prod, q.seq, q.chan, q.rel
  local rels
  while h <= t and n < max do
    n = n + 1
    if meta then out[n] = { q[h], prod[h], seq[h], chan[h] } else out[n] = q[h] end
    local r = rel[h]
    if r then
      rels = rels or {}
      for i = 1, #r do rels[#rels + 1] = r[i] end
      rel[h] = nil
    end
    q[h], prod[h], seq[h], chan[h] = nil, nil, nil, nil
    h = h + 1
  end
  if h > t then h, q.tail = 1, 0 end
  q.head = h
  q.nout = q.nout + n
  return out, q.dropped, n, rels
end

-- lecho_value_free of a handle M.take filled with rels: nothing holds
-- those arrays any more, their read buffers go back to the context now
-- (core.array_release), not at a collection of this whole state (one per
-- event: 17% of a Python consumer of 8 MiB arrays), and the next large
-- frame is read into the same memory.
function M.release(rels)
  local release = core.array_release
  for i = 1, #rels do release(rels[i]) end
  return true
end

-- lecho_consumer_on_error: fn (lecho.c's C closure) becomes c's on_error;
-- false clears it (the context logs again); nil keeps the one set.
function M.on_error(c, fn)
  return protect(function()
    if fn == false then c.on_error = nil elseif fn then c.on_error = fn end
    local held = c.held_errors
    if held then  -- those that came during the open (hold_errors)
      c.held_errors = nil
      local h = c.on_error
      for i = 1, held.n do
        if h then
          local ok, herr = pcall(h, held[i])
          if not ok then c.ch.ctx.log("on_error handler failed: " .. tostring(herr)) end
        else
          c.ch.ctx.log(("consumer on '%s': %s"):format(c.ch.short, held[i]))
        end
      end
      if held.lost > 0 then
        c.ch.ctx.log(("consumer on '%s': %d more modulator failures during the open not told"):format(
          c.ch.short, held.lost))
      end
    end
    return true
  end)
end

function M.set_params(c, params)
  return protect(function()
    local ok, err, code = c:set_params(params)
    if not ok then return nil, err, code end
    return true
  end)
end

-- cfn(args, meta) is lecho.c's service trampoline: true, result; or nil,
-- message (raised here: the caller gets it with code "failed").
-- A C handler's failure goes to the caller as its message alone (a Lua
-- traceback here would show only this wrapper: "[C]: in function 'error'");
-- one that the embedder's interrupt ended (Python's KeyboardInterrupt, kept
-- for the loop call to raise) says so, as a Lua service's does.
function M.service(ctx, name, cfn, opts)
  local Service = require "lecho.service"
  return protect(ctx.service, ctx, name, function(args, meta)
    local ok, r = cfn(args, meta)
    if not ok then
      if ctx.interrupt and ctx.interrupt() then
        Service.fail(("%s@%s: interrupted: the service's program got a signal"):format(meta.service, tostring(meta.version)), "failed")
      end
      Service.fail(r, "failed")
    end
    return r
  end, opts)
end

function M.service_close(s) return protect(function() s:close(); return true end) end

-- ctx:call through call_async, whose callback tells a failure from results
-- that begin with nil: true, { n = N, results... }; or nil, message, code,
-- the error value.  Waits on the loop (a main-line call, as submit_sync).
function M.call(ctx, name, args, opts)
  local done, r
  local ok, err = pcall(ctx.call_async, ctx, name, args, opts or {}, function(...)
    done, r = true, { n = select("#", ...), ... }
  end)
  if not ok then return raised(err) end
  while not done do
    if ctx.closed then return nil, "context is closed", "closed" end
    local okr, rerr = pcall(ctx.run_once, ctx, 1)
    if not okr then return raised(rerr) end
  end
  if r[1] then
    local res = { n = r.n - 1 }
    for i = 2, r.n do res[i - 1] = r[i] end
    return true, res
  end
  local e = r[2]
  local msg = type(e) == "string" and e or (type(e) == "table" and type(e.message) == "string" and e.message)
    or tostring(e)
  return nil, msg, type(r[3]) == "string" and r[3] or "failed", e
end

function M.consumer_close(c)
  return protect(function()
    c:close()
    -- a queued consumer: what it took and did not settle, and what still
    -- waits in its queue, was not handled
    local q = queues[c]
    if q then
      queues[c] = nil
      -- said, as a callback consumer's close says the events no handler
      -- ran (lecho.signals close_report): those taken by the binding and
      -- not handed out, and those still queued (a Ctrl-C in the loop body
      -- dropped them without a word: outside attack s8 C)
      local n = q.nin - q.nset
      if n > 0 then
        q.ctx.log(("close: %d events received not handled: subscription %s on '%s' closed with them unread")
          :format(n, tostring(q.id), c.ch.short), "warn")
      end
      q.nout = q.nin
      settle(q, q.nin, "not handled: the subscription closed")
    end
    return true
  end)
end

function M.stats(ctx) return protect(function() return ctx:stats() end) end

function M.stat(ctx, name, counter)
  return protect(function()
    -- Only looks (ctx:channel would create the channel it is asked about):
    -- the full name by lecho.addr's grammar, then the stats row if any.
    local ns, short = address.split(name, ctx.ns)
    if not ns then return nil, short, "invalid" end
    local cs = ctx:stats().channels[address.join(ns, short)]
    local v = cs and cs[counter]
    return type(v) == "number" and v or -1
  end)
end

-- A bounded one-line text of a value, for logs.
local function show(v, depth, out)
  local t = type(v)
  if t == "string" then
    out[#out + 1] = #v > 60 and ("%q..."):format(v:sub(1, 60)) or ("%q"):format(v)
  elseif t ~= "table" then
    out[#out + 1] = tostring(v)
  elseif depth > 3 then
    out[#out + 1] = "{...}"
  else
    out[#out + 1] = "{ "
    local n, shown = #v, 0
    for i = 1, n do
      if shown == 8 then out[#out + 1] = "..., "; break end
      show(v[i], depth + 1, out)
      out[#out + 1] = ", "
      shown = shown + 1
    end
    local keys = {}
    for k in each(v) do
      if not (type(k) == "number" and k >= 1 and k <= n and k % 1 == 0) then keys[#keys + 1] = k end
    end
    table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
    for i, k in ipairs(keys) do
      if i > 16 then out[#out + 1] = "..., "; break end
      out[#out + 1] = type(k) == "string" and k:match("^[%a_][%w_]*$") and k or ("[" .. tostring(k) .. "]")
      out[#out + 1] = " = "
      show(v[k], depth + 1, out)
      out[#out + 1] = ", "
    end
    if out[#out] == ", " then out[#out] = " " end
    out[#out + 1] = "}"
  end
  return out
end

function M.show(v) return table.concat(show(v, 0, {})) end

return M
