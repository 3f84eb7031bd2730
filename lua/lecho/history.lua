-- lecho.history: last values for late joiners (issue 29).
--
-- Producing side: a producer made with `history = N` keeps the last N
-- events it submitted (their encoded bytes and sequence numbers), bounded
-- by `history_bytes` (`Producer:_hist_add`, called by producer.lua's
-- try_submit once the core took the event, so the ring holds exactly what
-- was sent, in order).  A consumer context asks for it with the control
-- request `history` (`M.serve`): believed only from a context this process
-- already sends the channel (or that modulator's stream) to.  For a
-- modulated consumer the entries go through a fresh instance of that
-- consumer's modulator (`run_modulator`), so what arrives is what its
-- demodulator would have got, and a stateful modulator's state for the
-- newcomer starts from the history.
--
-- Consuming side: a consumer made with `history = "last" | N` takes its
-- events through a catch-up wrapper (`M.consumer`) until every producing
-- context answered.  Where the seam is: a producer answers from its loop
-- at some moment T, and its reply goes on the same connection, after every
-- event it sent us before T.  So for producer P the wrapper holds P's live
-- events (held acks for sync ones: a submit_sync is not told "handled"
-- before the handler ran) until P's reply; then it delivers the history
-- entries older than the first held event, the held events, and from then
-- on live events whose sequence is past the last delivered one (a local
-- producer's queued events can come after its reply).  No gap (history is
-- the last entries up to T, held events start at or before T + 1) and no
-- duplicate (everything at or below the last delivered sequence is dropped),
-- whatever the rate.  meta.history is true on what came from history.

local core = require "lecho.core"
-- Loops over keys as `in each(t)`, never `in pairs(t)`: no ITERN loop, which
-- Debian's LuaJIT may never end in the close at the program's end (context.lua).
local each = pairs

local M = {}

M.DEFAULT_BYTES = 1024 * 1024      -- history_bytes: per producer
M.MAX_N = 1024                     -- history = N: at most this many per producer
M.MAX_HELD = 1000000               -- events held per consumer while catching up
-- A producer's answer comes after every event it queued for us before it
-- (that is the seam): behind a backlog of up to its queue_limit
M.REPLY_TIMEOUT = 30
M.MAX_HELD_BYTES = 64 * 1024 * 1024

---------------------------------------------------------------------------
-- Producing side
---------------------------------------------------------------------------

-- The ring of one producer: seqs[i], data[i] for i = first .. last.
local Ring = {}
Ring.__index = Ring

function M.ring(n, max_bytes)
  return setmetatable({ n = n, max = max_bytes, seqs = {}, data = {}, first = 1, last = 0, bytes = 0,
                        skipped = 0 }, Ring)
end

-- Keeps event (seq, encoded string) as the newest; drops the oldest past n
-- entries or max bytes.  One larger than max alone is not kept (counted in
-- `skipped`): the ring then holds nothing older either, since what it holds
-- would no longer end at the producer's last event.
function Ring:add(seq, s)
  local len = #s
  if len > self.max then
    self.seqs, self.data, self.first, self.last, self.bytes = {}, {}, 1, 0, 0
    self.skipped = self.skipped + 1
    return
  end
  local last = self.last + 1
  self.last = last
  -- in sequence order: an event submitted from a log hook within this
  -- one's modulator call was added first (its submit returned first)
  local at = last
  while at > self.first and self.seqs[at - 1] > seq do
    self.seqs[at], self.data[at] = self.seqs[at - 1], self.data[at - 1]
    at = at - 1
  end
  self.seqs[at], self.data[at] = seq, s
  self.bytes = self.bytes + len
  local first = self.first
  while last - first + 1 > self.n or self.bytes > self.max do
    self.bytes = self.bytes - #self.data[first]
    self.seqs[first], self.data[first] = nil, nil
    first = first + 1
  end
  self.first = first
end

-- The newest n entries, oldest first, appended to out as { pid, seq, data }.
function Ring:tail(n, pid, out)
  local from = math.max(self.first, self.last - n + 1)
  for i = from, self.last do
    out[#out + 1] = { pid = pid, seq = self.seqs[i], data = self.data[i] }
  end
  return out
end

-- producer.lua's hook: what the core took (bytes: fastenc's, or nil when the
-- C encoder did it: encoded again here, the price of keeping it).
function M.add(p, seq, bytes, ev)
  local s = bytes
  if s == nil then
    local err
    s, err = core.encode(ev)
    if not s then return end  -- the core encoded it: cannot happen short of memory
  end
  p.hist:add(seq, s)
end

-- Reads a consumer's or producer's history option: "last" is 1, and so is
-- "key" (a consumer's: from the last key frame of its modulator when it
-- marks them, else the last event through a fresh copy of it).
function M.count(v)
  if v == "last" or v == "key" then return 1 end
  return v
end

-- Does context `from` already take what `key` (nil: the plain stream) sends?
local function listed(ch, from, key)
  if from == ch.ctx.addr then return true end
  local dests
  if key then
    local inst = ch.mods[key]
    dests = inst and inst.dests
  else
    dests = ch.dests
  end
  for _, a in ipairs(dests or {}) do
    if a == from then return true end
  end
  return false
end

-- The history entries of channel ch (its open producers here), all that
-- their rings hold.
local function collect_all(ch)
  local out = {}
  local ps = {}
  for p in each(ch.producers) do
    if p.hist then ps[#ps + 1] = p end
  end
  table.sort(ps, function(a, b) return a.id < b.id end)
  for _, p in ipairs(ps) do p.hist:tail(p.hist.n, p.id, out) end
  return out
end

M.SNAPSHOTS = 16      -- member-list versions remembered per channel
M.SNAPSHOT_AGE = 30   -- seconds

--- At each member list this producing context applies (control.lua
-- `Channel:_apply_members`, ch.ver already the list's version): what every
-- producer's ring holds now, by reference.  Everything submitted after it
-- goes to the contexts that list names, so a consumer whose join or
-- subscribe was answered with version v is owed exactly the entries of the
-- snapshot of v: the seam, however many events come before it asks.
function M.snapshot(ch)
  local any = false
  for p in each(ch.producers) do any = any or p.hist ~= nil end
  -- each modulator instance's key-frame ring (what it sent since the last
  -- key frame it marked, doc/modulators.md "Key frames"), copied: the
  -- instance sends on, to the joiner too, once this list is applied
  local keys
  for key, inst in each(ch.mods or {}) do
    local kf = inst.moe and inst.moe:keyframes()
    if kf then
      keys = keys or {}
      keys[key] = kf
      any = true
    end
  end
  if not any then return end
  local snaps = ch.hist_snaps or {}
  ch.hist_snaps = snaps
  local now = ch.ctx.c:now()
  -- the seam: each producer's last sequence number (with or without history)
  local seam = {}
  for p in each(ch.producers) do seam[#seam + 1] = { pid = p.id, seq = p:_seq() } end
  snaps[#snaps + 1] = { ver = ch.ver, t = now, entries = collect_all(ch), seam = seam, keys = keys }
  while #snaps > M.SNAPSHOTS or (snaps[1] and now - snaps[1].t > M.SNAPSHOT_AGE) do
    table.remove(snaps, 1)
  end
end

-- The entries owed for member-list version ver: the first snapshot at or
-- after it; else (a version not seen yet, or forgotten) the rings now.
-- With key (a modulated stream): when instance key had a key-frame ring
-- then, its entries, true (in the order they were sent: the key frame
-- first); else the raw entries, to run through a fresh copy of it.
local function owed(ch, ver, n, key)
  local src, seam, snap
  for _, sn in ipairs(ch.hist_snaps or {}) do
    if type(ver) == "number" and sn.ver >= ver then src, seam, snap = sn.entries, sn.seam, sn break end
  end
  if key then
    local kf
    if snap then
      kf = snap.keys and snap.keys[key]
    else
      local inst = ch.mods[key]
      kf = inst and inst.moe and inst.moe:keyframes()
    end
    if kf then return kf, seam, true end
  end
  src = src or collect_all(ch)
  -- the newest n of each producer
  local count, out = {}, {}
  for i = #src, 1, -1 do
    local e = src[i]
    local k = count[e.pid] or 0
    if k < n then
      count[e.pid] = k + 1
      out[#out + 1] = e
    end
  end
  local rev = {}
  for i = #out, 1, -1 do rev[#rev + 1] = out[i] end
  return rev, seam, nil, snap
end

-- Runs entries through a fresh instance of modulator `key` (its spec as the
-- member list gave it): what it returns or emits for each, with that
-- entry's producer and sequence.  The instance's outputs go to a channel
-- of this context only, delivered here by drain_local; then it is closed.
local function run_modulator(ch, key, entries)
  local ctx = ch.ctx
  local inst = ch.mods[key]
  local m = inst and inst.spec
  if not m then return nil, "modulator not running here" end
  ctx.nexthist = (ctx.nexthist or 0) + 1
  local name = ("%s@%s@hist%d"):format(ch.name, key, ctx.nexthist)
  local chid, err = ctx.c:channel(name)
  if not chid then return nil, err end
  local out = {}
  local list = { short = ch.short, derived = true }
  -- the outputs taken as the bytes the copy encoded (ctx:raw, as a
  -- recorder takes them: checked to be one value, not decoded and encoded
  -- again: for a 9 MiB key frame two copies of it fewer, review 3 #1);
  -- not while this context hands large strings out as views (a `buffer`
  -- consumer here: those come decoded, lua_hook.c view_of)
  local raw = not ctx.views_on
  if raw then ctx.c:raw(chid, true) end
  list[1] = { con = {}, handler = function(v, meta)
    local s = v
    if not raw or type(v) ~= "string" then s = core.encode(v) end
    if s then out[#out + 1] = { pid = meta.pid, seq = meta.seq, data = s, raw = meta.producer } end
  end }
  ctx.disp[chid] = list
  ctx.c:set_local(chid, true)
  ctx.nextmoe = ctx.nextmoe + 1
  local grant = {}
  for _, cap in ipairs(m.caps or {}) do grant[cap] = ch.grants[cap] end
  local moe, merr = ctx.c:moe(ctx.nextmoe, chid, ("%s@%s history"):format(ch.short, key:sub(1, 8)), m.src,
                              m.params == nil and {} or m.params,
                              { budget = ctx.mod_budget, memory = ctx.mod_memory, period = nil,
                                clock = grant.clock, log = grant.log,
                                pool_memory = ctx.mods_memory, cpu_share = ctx.mods_cpu })
  if moe then
    -- a handle of its own: only through the modulator, each kept event
    -- with its producer id and sequence
    local h = ctx.c:producer(chid, 0, false)
    h:set_mods({ moe }, false)
    for _, e in ipairs(entries) do
      local _, v = core.decode(e.data)
      h:set_pid(e.pid)
      h:set_seq(e.seq - 1)
      h:submit(v, false)
    end
    h:close()
    ctx.c:drain_local()
    moe:close()
  end
  ctx.c:set_local(chid, false)
  if raw then ctx.c:raw(chid, false) end
  ctx.disp[chid] = nil
  if not moe then return nil, merr end
  -- the producer id of an output: pname_of made "addr#pid"
  for _, o in ipairs(out) do
    o.pid = tonumber(tostring(o.raw):match("#(%d+)$")) or 0
    o.raw = nil
  end
  return out
end

-- The entries owed (owed's) run through a fresh copy of modulator key
-- (run_modulator), once per snapshot, key and n: kept with the snapshot
-- (as long as it is: M.SNAPSHOTS lists, M.SNAPSHOT_AGE s), so the push
-- made with the member list (M.push) and a `history` request for the same
-- version (M.serve: the joiner asks when its join was answered before
-- the push came, which is when the copy was slow) share one run.  Third
-- outside review of issue 29 (#1): with 9 MiB key frames (past the 8 MiB
-- ring, so every joiner's history is made this way) each run cost the
-- producer ~0.2 s of CPU, 2-3 s of its timer on a loaded machine, and the
-- second one came while the joiner was catching up.  nil, err when the
-- modulator cannot run.
local function modulated(ch, key, entries, snap, n)
  local inst = ch.mods[key]
  local spec = inst and inst.spec
  local memo = snap and snap.modout and snap.modout[key]
  if memo and memo.spec == spec and memo.n == n then return memo.out end
  local out, err = run_modulator(ch, key, entries)
  if not out then return nil, err end
  if snap and spec then
    snap.modout = snap.modout or {}
    snap.modout[key] = { spec = spec, n = n, out = out }
  end
  return out
end

-- The connection to producing context addr was lost (Context:_on_peer,
-- after its pending history request failed): the seam of its producers is
-- forgotten.  What comes from addr next comes on a new connection, from a
-- restarted process or not, and is taken as new, as the core's sequence
-- check takes it (doc/semantics.md "Restarts"): a restarted producer's
-- 1..N are not "delivered from history already".
function M.peer_lost(ctx, addr)
  for st in each(ctx.hist_states or {}) do
    local s = st.by[addr]
    if s and s.late then M.settle_late(st, addr, nil, ("no history from %s: connection lost"):format(addr)) end
    if s and s.done then
      for _ in each(s.last) do st.lasts = st.lasts - 1 end
      s.last = {}
      if st.lasts <= 0 and st.fetched and (st.late or 0) == 0 then M.unwrap(st) end
    end
  end
end

--- The control request `history` { ch, n, key }: the last n events of each
-- producer of ch here, or (key) those events through modulator key.
function M.serve(ctx, from, msg)
  local function fail(err, code)   -- (code: lecho.errors, set here where each refusal is made)
    if msg.rid then ctx:_send_ctrl(from, { op = "reply", rid = msg.rid, ok = false, err = err, code = code }) end
  end
  local ch = type(msg.ch) == "string" and ctx.byname[msg.ch]
  if not ch or ch.nprod == 0 then return fail("history: not a producer of that channel here", "notfound") end
  local key = msg.key
  if key ~= nil and type(key) ~= "string" then return fail("history: key must be a string", "invalid") end
  local n = msg.n
  if type(n) ~= "number" or n < 1 or n % 1 ~= 0 then return fail("history: n must be a positive integer", "invalid") end
  n = math.min(n, M.MAX_N)
  -- believed only from a context that already takes this stream from us
  if not listed(ch, from, key) then
    ctx:_warn_limited("history", ("refusing a history request from %s for '%s': not a consumer of it here")
                                 :format(from, ch.name))
    return fail("history: not a consumer of this stream here", "refused")
  end
  local entries, seam, kf, snap = owed(ch, msg.ver, n, key)
  if key and not kf and entries[1] then
    local out, err = modulated(ch, key, entries, snap, n)
    if not out then return fail("history: " .. tostring(err), "failed") end
    entries = out
  end
  if msg.rid then
    ctx:_send_ctrl(from, { op = "reply", rid = msg.rid, ok = true, entries = entries, seam = seam, kf = kf })
    ctx.c:flush()  -- now, not at the end of the turn: a late joiner waits on it
  end
  return entries, seam, kf
end

--- A member list this context just applied (control.lua, `members` from
-- the channel's manager) took a late joiner that wants history, h = { to,
-- n, key }: what serve would answer for that list's version goes to it
-- now, unasked (`history_push`), ahead of every event of the list on the
-- same connection: the joiner need not ask after its join returned
-- (issue 29: its first value within 2x a round trip).  Not sent (the
-- joiner then asks, M.fetch) when `to` is this context, or no producer of
-- ch is here, or the list does not name it, or its modulator cannot run.
function M.push(ch, h)
  local ctx = ch.ctx
  if type(h) ~= "table" or type(h.to) ~= "string" or type(h.n) ~= "number" or h.n < 1 or h.n % 1 ~= 0 then return end
  local key = h.key
  if key ~= nil and type(key) ~= "string" then return end
  if h.to == ctx.addr or ch.nprod == 0 or not listed(ch, h.to, key) then return end
  local n = math.min(h.n, M.MAX_N)
  local entries, seam, kf, snap = owed(ch, ch.ver, n, key)
  if key and not kf and entries[1] then
    entries = modulated(ch, key, entries, snap, n)
    if not entries then return end
  end
  ctx:_send_ctrl(h.to, { op = "history_push", ch = ch.name, ver = ch.ver, key = key, entries = entries,
                         seam = seam, kf = kf })
  ctx.c:flush()  -- now: the joiner waits on it
end

M.MAX_PUSHED = 256   -- producing contexts whose pushed history a channel keeps while a joiner waits

--- A `history_push` came from `from`: kept for M.fetch while a consumer of
-- that channel here waits for its history (else dropped), one per
-- producing context; believed there only from a producer the join's
-- answer named, for the version it named.
function M.pushed(ctx, from, msg)
  local ch = type(msg.ch) == "string" and ctx.byname[msg.ch]
  if not ch or (ch.hist_waiting or 0) <= 0 then return end
  if type(msg.ver) ~= "number" or type(msg.entries) ~= "table" then return end
  -- a consumer here whose join stopped waiting for it (M.late): taken now,
  -- where it comes on a's connection (after what came before the seam)
  for st in each(ctx.hist_states or {}) do
    local s = st.con.ch == ch and st.by[from]
    if s and s.late and s.late.ver == msg.ver and s.late.key == msg.key then
      M.settle_late(st, from, msg)
      return
    end
  end
  local kept = ch.hist_pushed
  if not kept then
    kept = { n = 0, by = {} }
    ch.hist_pushed = kept
  end
  if not kept.by[from] then
    if kept.n >= M.MAX_PUSHED then return end
    kept.n = kept.n + 1
  end
  kept.by[from] = msg
end

-- The history producing context a pushed for version ver and modulator
-- key (nil: none came, or for another list or stream); take: forgotten.
local function take_push(ch, a, ver, key, take)
  local kept = ch.hist_pushed
  local m = kept and kept.by[a]
  if not m or m.ver ~= ver or m.key ~= key then return nil end
  if take then
    kept.by[a] = nil
    kept.n = kept.n - 1
  end
  return m
end

-- A history consumer of ch no longer waits (fetched, or its join failed):
-- with none left, what was pushed goes.
function M.done_waiting(ch)
  ch.hist_waiting = (ch.hist_waiting or 1) - 1
  if ch.hist_waiting <= 0 then ch.hist_waiting, ch.hist_pushed = nil, nil end
end

---------------------------------------------------------------------------
-- Consuming side
---------------------------------------------------------------------------

local function split(pname)
  local a, id = tostring(pname):match("^(.*)#(%d+)$")
  return a or tostring(pname), tonumber(id) or 0
end

local function copy_meta(meta)
  local m = {}
  for k, v in each(meta) do
    if type(k) == "string" then m[k] = v end
  end
  return m
end

-- Wraps consumer con's handler (con.handler and, modulated, its entry's)
-- for the catch-up; returns the state M.fetch finishes.
function M.consumer(con, n)
  local ctx = con.ch.ctx
  local real = con.handler
  local st = { n = n, by = {}, held = 0, held_bytes = 0, real = real, con = con }
  con.hist_state = st
  -- the catch-ups of this context, for M.peer_lost (weak: a closed
  -- consumer's goes with it)
  ctx.hist_states = ctx.hist_states or setmetatable({}, { __mode = "k" })
  ctx.hist_states[st] = true
  local function run(v, meta, rec)
    local ok, err = pcall(real, v, meta)
    if not ok then
      con.errors = con.errors + 1
      ctx.log(("handler error on '%s' (history catch-up): %s"):format(con.ch.short, tostring(err)))
    end
    if rec then ctx:_settle_ack(rec, con.id, not ok and tostring(err) or nil) end
  end
  st.run = run
  local function wrapper(ev, meta)
    local paddr, pid = split(meta.producer)
    local s = st.by[paddr]
    if not s then
      if st.listed then return real(ev, meta) end  -- a producer that came after the join
      s = { buf = {}, last = {} }
      st.by[paddr] = s
    end
    if s.done then
      local last = s.last[pid]
      if last then
        if pid ~= 0 and meta.seq <= last then return end  -- delivered from history already
        s.last[pid] = nil
        st.lasts = st.lasts - 1
        if st.lasts == 0 and st.fetched and (st.late or 0) == 0 then M.unwrap(st) end
      end
      return real(ev, meta)
    end
    local late = s.late
    if late and pid ~= 0 then
      -- a late producer (M.late): what it sends before its push is at or
      -- below the seam, cut when the push comes: not kept
      if not late.cut[pid] or meta.seq > late.cut[pid] then late.cut[pid] = meta.seq end
      late.n = late.n + 1
      return
    end
    local data = core.encode(ev)
    if st.held >= M.MAX_HELD or st.held_bytes + #(data or "") > M.MAX_HELD_BYTES or not data then
      -- too much came before the history: it is given up for this producer,
      -- nothing of the live stream is
      local why = ("history from %s given up: more than %d events or %d bytes came first")
                  :format(paddr, M.MAX_HELD, M.MAX_HELD_BYTES)
      if s.late then M.settle_late(st, paddr, nil, why) else M.flush(st, paddr, nil, why) end
      return real(ev, meta)
    end
    st.held, st.held_bytes = st.held + 1, st.held_bytes + #data
    s.buf[#s.buf + 1] = { data = data, meta = copy_meta(meta), pid = pid, rec = ctx:_hold_ack(meta) }
  end
  st.wrapper = wrapper
  st.lasts = 0
  -- pushed histories are kept for this channel until it fetched (M.pushed)
  con.ch.hist_waiting = (con.ch.hist_waiting or 0) + 1
  con.handler = wrapper
  if con.entry then con.entry.handler = wrapper end
  return st
end

-- Caught up, and nothing left to drop: the consumer's own handler again
-- (unless it was switched meanwhile).
function M.unwrap(st)
  local con = st.con
  if con.ch.ctx.hist_states then con.ch.ctx.hist_states[st] = nil end
  if con.handler == st.wrapper then con.handler = st.real end
  if con.entry and con.entry.handler == st.wrapper then con.entry.handler = st.real end
end

-- Producer context paddr answered (entries, or nil when it gave none: why):
-- its history older than what was held, then what was held.  kf: the
-- entries are a key-frame ring, in the order the instance sent them (not
-- sorted by producer: one instance interleaves its producers' outputs).
function M.flush(st, paddr, entries, why, seam, kf)
  local con = st.con
  local ctx = con.ch.ctx
  local s = st.by[paddr]
  if not s then
    s = { buf = {}, last = {} }
    st.by[paddr] = s
  end
  if s.done then return end
  s.done = true
  if why then
    -- a history that did not come (its producer refused our key, went,
    -- did not answer): the consumer's on_error is told, as a producer's
    -- refusal of the member list is (consumer.lua), else the log (issue
    -- 29 F10: `lecho sub --history` said nothing of it)
    local msg = ("consumer on '%s': %s"):format(con.ch.short, why)
    local ok, herr = true, nil
    if con.on_error then ok, herr = pcall(con.on_error, msg) end
    if not con.on_error then ctx.log(msg)
    elseif not ok then ctx.log("on_error handler failed: " .. tostring(herr)) end
  end
  -- where the history ends for each producer: the seam the producer said
  -- (its last seq when it applied the member list that took us: held
  -- events up to it came before ch:consumer() returned, the history stands
  -- for them), else the first event held
  local cut = {}
  for _, e in ipairs(seam or {}) do cut[e.pid] = e.seq end
  local first = {}
  for _, b in ipairs(s.buf) do
    if not first[b.pid] then first[b.pid] = b.meta.seq end
  end
  for pid, seq in each(cut) do first[pid] = seq + 1 end
  local last = s.last
  if not kf then
    table.sort(entries or {}, function(a, b)
      if a.pid ~= b.pid then return a.pid < b.pid end
      return a.seq < b.seq
    end)
  end
  for _, e in ipairs(entries or {}) do
    local f = first[e.pid]
    if (not f or e.seq < f) and not (con.closed) then
      local ok, v = core.decode(e.data)
      -- a channel taken raw (ctx:raw, a recorder: lecho.recording) gets
      -- the entry's bytes as they came, checked to be one value, as its
      -- live events come
      if ok and con.ch.raw_bytes then v = e.data end
      if ok then
        local meta = { channel = con.ch.short, producer = paddr .. "#" .. e.pid, seq = e.seq, history = true }
        if con.mod then meta.params_version = con.mod.version end
        -- a replay's producer (lecho.replay) keeps history too: its values
        -- say so as its live events do
        if e.pid >= require("lecho.context").REPLAY_PID then meta.replay = true end
        st.run(v, meta)
        if e.pid ~= 0 and (not last[e.pid] or e.seq > last[e.pid]) then last[e.pid] = e.seq end
      end
    end
  end
  for _, b in ipairs(s.buf) do
    st.held, st.held_bytes = st.held - 1, st.held_bytes - #b.data
    local c = cut[b.pid]
    if con.closed then
      -- never handed to the handler: a sync one's producer is told
      if b.rec then ctx:_settle_ack(b.rec, con.id, "not handled: the consumer closed", "noconsumer") end
    elseif c and b.meta.seq <= c then
      -- the history stood for it
      if b.rec then ctx:_settle_ack(b.rec, con.id, nil) end
    else
      local _, v = core.decode(b.data)
      st.run(v, b.meta, b.rec)
      if b.pid ~= 0 and (not last[b.pid] or b.meta.seq > last[b.pid]) then last[b.pid] = b.meta.seq end
    end
  end
  -- what is at or below the seam and still comes (a local producer's queue) is dropped
  for pid, seq in each(cut) do
    if not last[pid] or last[pid] < seq then last[pid] = seq end
  end
  for _ in each(last) do st.lasts = st.lasts + 1 end
  s.buf = {}
end

-- After the join (r: its reply, with the producing contexts): asks each for
-- its history and delivers it at the seam.  Returns nothing; failures are
-- logged, and the live stream goes on.
function M.fetch(st, r)
  local con = st.con
  local ch = con.ch
  local ctx = ch.ctx
  local producers = type(r) == "table" and type(r.producers) == "table" and r.producers or {}
  -- every listed producer holds its events until it answered; one that
  -- was not listed (it came after the join, or left) is live only
  local listed = {}
  for _, a in ipairs(producers) do
    listed[a] = true
    st.by[a] = st.by[a] or { buf = {}, last = {} }
  end
  st.listed = true
  for paddr in each(st.by) do
    if not listed[paddr] then M.flush(st, paddr, {}) end
  end
  local key = con.mod and con.mod.key or nil
  -- the member-list version that took this consumer's subscription: the seam
  local ver = type(r) == "table" and type(r.ver) == "number" and r.ver or nil
  for _, a in ipairs(producers) do
    if con.closed or ctx.closed then break end
    local entries, err, seam, kf
    if a == ctx.addr then
      entries, seam, kf = M.serve(ctx, a, { ch = ch.name, n = st.n, key = key, ver = ver })
      if not entries then err = "no history here" end
    else
      -- pushed with the member list that took us (M.push); else asked
      -- for, and whichever comes first is taken (both are that version's)
      local function push_in() return take_push(ch, a, ver, key) ~= nil end
      local rep, rerr, rcode = take_push(ch, a, ver, key, true), nil, nil
      if not rep then
        -- waited for at most the context's timeout: this process may be far
        -- behind a's stream (the push comes after every event a sent us
        -- before it), or the join was made in a handler (a's events, and its
        -- push, are not read until it returns)
        rep, rerr, rcode = ctx:request(a, { op = "history", ch = ch.name, n = st.n, key = key, ver = ver },
                                       ctx.timeout, push_in)
        if not rep and push_in() then rep, rerr = take_push(ch, a, ver, key, true), nil end
      end
      if not rep and rcode == "timeout" and type(ver) == "number" and not con.closed and not ctx.closed then
        -- late: what comes from a until its push is still from before the
        -- seam, held as before; the push, when it comes, is taken then
        -- (M.pushed), or the history is given up after REPLY_TIMEOUT
        M.late(st, a, ver, key)
        goto next
      end
      if rep then
        entries = type(rep.entries) == "table" and rep.entries or {}
        kf = key ~= nil and rep.kf == true
        -- what a producer sends is checked like any value from the wire
        -- (a key-frame ring is bounded in bytes at the producer, and here
        -- by the size of the message that brought it)
        local good = {}
        for _, e in ipairs(entries) do
          if type(e) == "table" and type(e.seq) == "number" and type(e.pid) == "number"
             and type(e.data) == "string" and (kf or #good < st.n * 64) then
            good[#good + 1] = e
          end
        end
        entries = good
        seam = {}
        for _, e in ipairs(type(rep.seam) == "table" and rep.seam or {}) do
          if type(e) == "table" and type(e.pid) == "number" and type(e.seq) == "number" and #seam < 4096 then
            seam[#seam + 1] = e
          end
        end
      else
        err = rerr
      end
    end
    M.flush(st, a, entries, err and ("no history from %s: %s"):format(a, err) or nil, seam, kf)
    ::next::
  end
  -- everything listed answered (or is late): the wrapper only drops
  -- repeats now, and goes once none can come
  st.fetched = true
  if (st.late or 0) == 0 then
    M.done_waiting(ch)
    if st.lasts == 0 then M.unwrap(st) end
  end
end

-- Producer context a did not answer within the join's wait: its events
-- are still held (they were sent before its push, so before the seam:
-- delivering them would give the newcomer what was submitted before it
-- existed, and count the window to the seam as lost), its push is taken
-- when it comes (M.pushed), else the history is given up after
-- REPLY_TIMEOUT (or a lost connection, or past MAX_HELD): the held events
-- are cut, not delivered (logged with their count), the live stream goes on.
function M.late(st, a, ver, key)
  local con = st.con
  local ctx = con.ch.ctx
  local s = st.by[a]
  s.late = { ver = ver, key = key, cut = {}, n = 0 }
  st.late = (st.late or 0) + 1
  s.late.timer = ctx:after(M.REPLY_TIMEOUT, function()
    if s.late and not s.done then
      M.settle_late(st, a, nil, ("no history from %s: no answer within %gs"):format(a, M.REPLY_TIMEOUT))
    end
  end)
end

-- A late producer a answered (push: its history_push) or was given up
-- (why): flushed, and the catch-up ends once none is late.
function M.settle_late(st, a, push, why)
  local s = st.by[a]
  if not s or not s.late then return end
  local con = st.con
  local ch = con.ch
  local late = s.late
  if late.timer then late.timer:stop() end
  s.late = nil
  st.late = st.late - 1
  if push then
    local entries, seam = {}, {}
    local kf = push.key ~= nil and push.kf == true
    for _, e in ipairs(push.entries) do
      if type(e) == "table" and type(e.seq) == "number" and type(e.pid) == "number"
         and type(e.data) == "string" and (kf or #entries < st.n * 64) then
        entries[#entries + 1] = e
      end
    end
    for _, e in ipairs(type(push.seam) == "table" and push.seam or {}) do
      if type(e) == "table" and type(e.pid) == "number" and type(e.seq) == "number" and #seam < 4096 then
        seam[#seam + 1] = e
      end
    end
    M.flush(st, a, entries, nil, seam, kf)
  else
    -- no seam: cut at the last event held (they came before a's push, so
    -- before the join took effect there: as without history they go to
    -- nobody here, and the stream runs on from them without a gap)
    local cut, n = late.cut, late.n
    for _, b in ipairs(s.buf) do
      if b.pid ~= 0 then
        cut[b.pid] = math.max(cut[b.pid] or b.meta.seq, b.meta.seq)
        n = n + 1
      end
    end
    local seam = {}
    for pid, seq in each(cut) do seam[#seam + 1] = { pid = pid, seq = seq } end
    M.flush(st, a, nil, n > 0 and ("%s; the %d events it sent before the seam are not delivered"):format(why, n)
                        or why, seam)
  end
  if st.late == 0 and st.fetched then
    M.done_waiting(ch)
    if st.lasts == 0 then M.unwrap(st) end
  end
end

return M
