-- lecho.ns.membership: a channel manager's part of the registry: per channel,
-- which contexts produce and which consume (with their subscriptions), the
-- channel version, which version each producing context confirmed, and the
-- consumer joins that wait for those confirmations.  Ops are
-- `function(self, from, msg, io)` on a registry.

-- Never compiled, as lecho.ns.registry (Debian's LuaJIT and LuaJIT #827).
if jit then jit.off(true, true) end

local bit = require "bit"
local outbox = require "lecho.ns.outbox"
local naming = require "lecho.ns.naming"

local tables = require "lecho.tables"
local sorted_keys, same = tables.sorted_keys, tables.same
local add_dest = require("lecho.subs").add_dest
local emit, reply, fail = outbox.emit, outbox.reply, outbox.fail
local check_ch, claim, allowed = naming.check_ch, naming.claim, naming.allowed

local M = {}

-- A channel record. `producers[addr] = { count, acked }` where acked is the
-- highest channel version that context confirmed; `consumers[addr] = { count,
-- ver }` where ver is the channel version that first included the context.
-- The consumer record is the place for future per-consumer-context data
-- (modulators, shared objects). `waits` is the FIFO of consumer joins not yet
-- answered: `{ from, rid, ver, count, deadline }`.
local function new_channel(self, name)
  self.seq = self.seq + 1
  local c = { name = name, ver = self.seq, producers = {}, consumers = {}, nconsumers = 0, waits = {} }
  self.channels[name] = c
  self.nchannels = self.nchannels + 1
  self.idle[name] = nil
  return c
end

-- Forget a channel that has no member and no pending join (bounded memory).
-- A name server keeps its self-assignment until forget_after (naming); a
-- manager tells the name server once the channel stayed unused that long.
local function maybe_drop(self, c, now)
  if next(c.producers) == nil and next(c.consumers) == nil and #c.waits == 0
     and self.channels[c.name] == c then
    self.channels[c.name] = nil
    self.nchannels = self.nchannels - 1
    if self.role == "nameserver" then
      if self.used[c.name] then
        self.used[c.name] = now
        naming.forget_later(self, c.name, now)
      end
    elseif self.nameserver then
      self.idle[c.name] = now
    end
  end
end

-- What producing contexts need: the contexts that take the plain stream,
-- and each distinct modulator (by key) with the contexts that asked for it.
-- Fresh tables on every call (they are handed to `send`).
local function members_of(c)
  -- sseq: always sent (empty too): a producer takes direct installs only
  -- under a manager that says what each consumer's last change was
  local plain, mods, svc, sseq = {}, {}, nil, {}
  for _, a in ipairs(sorted_keys(c.consumers)) do
    local subs = c.consumers[a].subs
    if subs.sseq then sseq[a] = subs.sseq end
    if subs.plain then plain[#plain + 1] = a end
    if subs.svc then
      svc = svc or {}
      svc[a] = subs.svc
    end
    for _, k in ipairs(sorted_keys(subs.mods)) do
      add_dest(mods, k, subs.mods[k], a)
    end
  end
  return plain, mods, svc, sseq
end

-- Keyed mode with a policy: the capability sets each consumer context of
-- c may modulate with ({ [addr] = { "", "clock", "clock,log", ... } }, a
-- set sorted and joined by commas, as lecho.modulator's caps_combo): a
-- producer believes a consumer's direct install (doc/protocol.md
-- `install`) only within them.  nil otherwise (no policy: all granted).
local CAP_SETS = { {}, { "clock" }, { "log" }, { "clock", "log" } }
local function grants_of(self, c)
  if not (self.identity and self.policy) then return nil end
  local g = {}
  for a in pairs(c.consumers) do
    local l = {}
    for _, cs in ipairs(CAP_SETS) do
      if allowed(self, a, "modulate", c.name, cs[1] and cs or nil) then l[#l + 1] = table.concat(cs, ",") end
    end
    g[a] = l
  end
  return g
end

-- The text of grants `g` (grants_of), to tell a change: what the last
-- member lists of a channel said is kept as c.grants_sent.
local function grants_text(g)
  if not g then return "" end
  local out = {}
  for _, a in ipairs(sorted_keys(g)) do out[#out + 1] = a .. "=" .. table.concat(g[a], "|") end
  return table.concat(out, ";")
end

-- Keyed mode: the public keys of the consumer contexts a member list
-- names, { [addr] = pk }: the producer pins each address to its key before
-- it sends there.  nil in protected mode.
local function keys_of(self, plain, mods)
  if not self.identity then return nil end
  local keys, any = {}, false
  local function add(a)
    if keys[a] == nil then
      local _, pk = self.identity(a)
      if pk then keys[a], any = pk, true end
    end
  end
  for _, a in ipairs(plain) do add(a) end
  for _, m in pairs(mods) do
    for _, a in ipairs(m.dests) do add(a) end
  end
  return any and keys or nil
end

-- A channel's base name: the channel a derived stream "ns/name@key" comes
-- from (producer tickets name it); the protocol's rule, lecho.addr.base.
local base_of = require("lecho.addr").base
M.base_of = base_of

-- u64 big-endian of integer n in [0, 2^53)
local function u64(n)
  local hi, lo = math.floor(n / 2^32), n % 2^32
  return string.char(bit.band(bit.rshift(hi, 24), 255), bit.band(bit.rshift(hi, 16), 255),
                     bit.band(bit.rshift(hi, 8), 255), bit.band(hi, 255),
                     bit.band(bit.rshift(lo, 24), 255), bit.band(bit.rshift(lo, 16), 255),
                     bit.band(bit.rshift(lo, 8), 255), bit.band(lo, 255))
end

-- Keyed mode: the ticket that lets producer `addr` BIND channel c's name
-- at its consumers until ticket_ttl from now (doc/security.md "Tickets"):
-- u64be expiry || this manager's signature over "lecho-producer-v2" 0
-- base-name 0 producer-pk || u64be expiry.  Its renewal is queued at 2/3
-- of its life (renew_tickets).  nil in protected mode.
local function ticket_for(self, c, addr)
  if not (self.sign and self.identity) then return nil end
  local _, pk = self.identity(addr)
  if not pk then return nil end
  local now = self.clock()
  local exp = u64(math.ceil(now + self.ticket_ttl))
  local p = c.producers[addr]
  if p then
    p.tserial = (p.tserial or 0) + 1
    self.rtail = (self.rtail or 0) + 1          -- (a queue: #renewals is unreliable past consumed slots)
    self.renewals[self.rtail] = { at = now + self.ticket_ttl * 2 / 3, c = c, addr = addr, serial = p.tserial }
  end
  return exp .. self.sign("lecho-producer-v2\0" .. base_of(c.name) .. "\0" .. pk .. exp)
end

-- The tickets due: a renewed one goes to its producer in a `members` of
-- the version it has (the list is not applied again, the ticket is taken,
-- doc/protocol.md); a producer gone, or a channel dropped, is skipped.
function M.renew_tickets(self, io)
  local q, now = self.renewals, nil
  while q[self.rhead] do
    local r = q[self.rhead]
    now = now or self.clock()
    if r.at > now then break end
    q[self.rhead] = nil
    self.rhead = self.rhead + 1
    local c = r.c
    local p = self.channels[c.name] == c and c.producers[r.addr]
    -- renewed only while the policy still grants it (a reloaded policy may
    -- not); refused, the ticket runs out and consumers refuse the producer
    local ok, why = true, nil
    if p and p.tserial == r.serial then ok, why = allowed(self, r.addr, "produce", c.name) end
    if p and p.tserial == r.serial and not ok then
      self.log("warn", ("ticket of %s for '%s' not renewed: %s"):format(r.addr, c.name, tostring(why)))
    elseif p and p.tserial == r.serial then
      self.mid = self.mid + 1
      local plain, mods, svc, sseq = members_of(c)
      emit(self, io, r.addr, { op = "members", ch = c.name, ver = c.ver, consumers = plain, mods = mods,
                               svc = svc, keys = keys_of(self, plain, mods), mid = self.mid,
                               sseq = sseq, grants = grants_of(self, c),
                               ticket = ticket_for(self, c, r.addr) })
    end
  end
  local tail = self.rtail or 0
  if self.rhead > 1024 and self.rhead > tail / 2 then   -- compact what was consumed
    local nq = {}
    for i = self.rhead, tail do nq[#nq + 1] = q[i] end
    self.renewals, self.rhead, self.rtail = nq, 1, #nq
  end
end

-- Keyed mode, after a policy change (a reload): is `addr` still granted
-- `action` on c (a context with no authenticated identity now is left to
-- peer_down: its connection is gone, not its rights)?  true, or nil, why.
local function still(self, c, addr, action, caps)
  if not (self.identity and self.policy) or addr == self.addr then return true end
  if self.identity(addr) == nil then return true end
  return allowed(self, addr, action, c.name, caps)
end

-- Drops producing context `addr` from c: its produce was withdrawn.  No
-- member list (consumers' addresses, keys, modulator sources and params)
-- goes to it any more; it is told why (`revoked`); its ticket is not
-- renewed and runs out within ticket_ttl.
local function drop_producer(self, c, addr, why, io)
  c.producers[addr] = nil
  if c.pwaits then
    local keep = {}
    for _, w in ipairs(c.pwaits) do
      if w.from == addr then fail(self, io, addr, w.rid, why, "refused") else keep[#keep + 1] = w end
    end
    c.pwaits = keep[1] and keep or nil
  end
  self.log("warn", ("producer %s dropped from '%s': %s"):format(addr, c.name, tostring(why)))
  emit(self, io, addr, { op = "revoked", ch = c.name, role = "producer", err = why })
end

-- The consumer set changed: new version, `members` to every producing
-- context still granted produce (one whose produce a reloaded policy
-- withdrew is dropped, never sent the list).  hist: { to, n, key } when
-- the change is a late joiner's that wants history (lecho.history): each
-- producer sends it to `to` as it applies this list.
local function publish_members(self, c, io, hist)
  self.seq = self.seq + 1
  c.ver = self.seq
  for _, p in ipairs(sorted_keys(c.producers)) do
    -- (checked once per policy: `checked` is the policy it was granted by)
    local r = c.producers[p]
    if r.checked ~= self.policy then
      local ok, why = still(self, c, p, "produce")
      if ok then r.checked = self.policy else drop_producer(self, c, p, why, io) end
    end
  end
  local grants = grants_of(self, c)
  c.grants_sent = grants_text(grants)
  for _, p in ipairs(sorted_keys(c.producers)) do
    self.mid = self.mid + 1
    local plain, mods, svc, sseq = members_of(c)
    emit(self, io, p, { op = "members", ch = c.name, ver = c.ver, consumers = plain, mods = mods, svc = svc,
                        keys = keys_of(self, plain, mods), mid = self.mid, hist = hist,
                        sseq = sseq, grants = grants })
  end
end

-- The modulator errors producing contexts reported for the keys a waiting
-- consumer context asked for: a list of { producer, key, err }.
local function wait_errors(c, w)
  local out = {}
  for _, a in ipairs(sorted_keys(c.producers)) do
    local errs = c.producers[a].errs
    local refused = c.producers[a].refused
    if refused then
      -- (for each modulator asked for; for the plain stream, without key)
      for _, k in ipairs(w.keys) do out[#out + 1] = { producer = a, key = k, err = refused } end
      if #w.keys == 0 then out[#out + 1] = { producer = a, err = refused } end
    end
    if errs then
      for _, k in ipairs(w.keys) do
        if errs[k] then out[#out + 1] = { producer = a, key = k, err = errs[k] } end
      end
    end
  end
  return out
end

local function all_acked(c, ver)
  for _, p in pairs(c.producers) do
    if p.acked < ver then return false end
  end
  return true
end

-- Answers waiting consumer join `w` (late: the producing contexts that had
-- not confirmed by its deadline).
local function answer(self, io, c, w, late)
  reply(self, io, w.from, w.rid, { ver = w.ver, count = w.count, late = late,
                                   errors = wait_errors(c, w), producers = sorted_keys(c.producers) })
end

-- Answers a producer's join with the current member list (its confirmation);
-- refused instead to one whose produce a reloaded policy withdrew meanwhile.
local function answer_producer(self, io, c, to, rid, p)
  local ok, why = still(self, c, to, "produce")
  if not ok then
    if c.producers[to] == p then c.producers[to] = nil end
    return fail(self, io, to, rid, why, "refused")
  end
  local plain, mods, svc, sseq = members_of(c)
  reply(self, io, to, rid, { consumers = plain, mods = mods, svc = svc, keys = keys_of(self, plain, mods),
                             sseq = sseq, grants = grants_of(self, c),
                             ver = c.ver, count = p.count, ticket = ticket_for(self, c, to) })
end

-- Answer every waiting consumer join whose version all current producers
-- have confirmed; and those whose deadline passed, with `late` (the
-- producing contexts that had not confirmed).
local function check_waits(self, c, io)
  local keep = {}
  for _, w in ipairs(c.waits) do
    if w.hold <= io.now and all_acked(c, w.ver) then
      answer(self, io, c, w)
    elseif w.deadline <= io.now then
      local late = {}
      for _, a in ipairs(sorted_keys(c.producers)) do
        if c.producers[a].acked < w.ver then late[#late + 1] = a end
      end
      self.log("warn", ("channel '%s': join of %s answered without confirmation from %s")
                       :format(c.name, w.from, table.concat(late, ", ")))
      answer(self, io, c, w, late)
    else
      keep[#keep + 1] = w
    end
  end
  c.waits = keep
end

local function check_role(msg)
  local role = msg.role
  if role ~= "producer" and role ~= "consumer" then
    return nil, ("%s: field 'role' must be \"producer\" or \"consumer\""):format(msg.op)
  end
  return role
end

-- A consumer context's subscriptions, checked: lecho.subs (shared with
-- a producer's check of a direct install).
local check_subs, key_ok = require("lecho.subs").check, require("lecho.subs").key_ok
local same_mod = require("lecho.subs").same_mod

-- Keys name modulators (a 64-bit hash made by the consumer): two consumers
-- using one key must mean one modulator, or one would receive the other's
-- stream.  Returns nil, err when `subs` reuses a key of another context's
-- subscription for different code or params, or names a key that is not
-- the hash of its code, params and stream (recomputed here, and `base`
-- with it, for an entry not the same as in `from`'s subscription before):
-- a key squatted with other code would be joined by the consumer whose
-- code it is (a direct install, checked by hash at the producer, joins
-- the instance running under its key) and take that code's output for
-- its own modulator's.
local function check_keys(c, from, subs, op)
  local before = c.consumers[from] and c.consumers[from].subs and c.consumers[from].subs.mods or {}
  for key, m in pairs(subs.mods) do
    local o = before[key]
    if o and o.base and o.src == m.src and o.period == m.period and same(o.caps, m.caps)
       and same(o.params, m.params) and o.stream == m.stream then
      m.base = o.base
    else
      local ok, base = key_ok(key, m)
      if not ok then
        return nil, ("%s: modulator key %s: %s"):format(op, key, base)
      end
      m.base = base
    end
    for addr, r in pairs(c.consumers) do
      -- (params compared as values: arrays by content, not identity, or
      -- a second consumer of one modulator with array params was refused)
      local o = addr ~= from and r.subs.mods[key]
      if o and not (same_mod(o, m) and o.stream == m.stream) then
        return nil, ("%s: modulator key %s is already used by %s for another modulator"):format(
          op, key, addr)
      end
      -- a stream kept through in-band params changes is its consumer's:
      -- another context naming it would take its derived channel at the
      -- producers (consumer.lua _params_inband)
      if addr ~= from and m.stream ~= nil and m.stream ~= key then
        for k2, o2 in pairs(r.subs.mods) do
          if (o2.stream or k2) == m.stream then
            return nil, ("%s: modulator stream %s is %s's"):format(op, m.stream, addr)
          end
        end
      end
    end
  end
  return true
end

-- A join may carry `settle` (seconds, from the name server's lookup reply):
-- the control plane is recovering (a restarted name server, a channel whose
-- manager died), and producers that exist may not have joined here yet.
-- Such a join is answered no sooner than that, so the producers that come
-- back meanwhile confirm it too.
local function wait_for(self, c, from, msg, r, io)
  local settle = type(msg.settle) == "number" and msg.settle > 0
                 and math.min(msg.settle, self.settle) or 0
  local w = { from = from, rid = msg.rid, ver = r.ver, count = r.count,
              hold = io.now + settle,
              deadline = io.now + settle + self.ack_timeout, keys = sorted_keys(r.subs.mods) }
  if settle == 0 and all_acked(c, r.ver) then
    return answer(self, io, c, w)
  end
  c.waits[#c.waits + 1] = w
  self.due[c] = true      -- the tick looks at it until answered
end

-- The subscriptions a join or subscribe carries, checked (shape, and keys
-- that mean one modulator everywhere); or nil once `from` was answered why.
local function checked_subs(self, c, from, msg, io)
  local subs, err = check_subs(msg)
  if subs then
    local ok; ok, err = check_keys(c, from, subs, msg.op)
    if ok then return subs end
  end
  fail(self, io, from, msg.rid, err, "invalid")
end

-- Consumer context record `r` takes `subs` from now on: a new member list
-- for the producers, and the answer to `from` waits for their confirmations.
local function subscribed(self, c, from, msg, r, subs, io)
  r.subs = subs
  local h = subs.histq
  publish_members(self, c, io, h and { to = from, n = h.n, key = h.key } or nil)
  r.ver = c.ver
  wait_for(self, c, from, msg, r, io)
end

-- Keyed mode: may `from` take `role` on `ch` ("consumer": with the
-- modulators its subscriptions ask for, each with its capabilities)?
-- Checked before anything is made.  Returns true, or nil, err.
local function authorize(self, from, msg, role, ch)
  local ok, err = allowed(self, from, role == "producer" and "produce" or "consume", ch)
  if not ok or role == "producer" then return ok, err end
  local mods = type(msg.subs) == "table" and type(msg.subs.mods) == "table" and msg.subs.mods or {}
  local keys = {}
  for k in pairs(mods) do keys[#keys + 1] = tostring(k) end  -- (a key that is no string fails later)
  table.sort(keys)
  for _, k in ipairs(keys) do
    local m = mods[k]
    local caps = type(m) == "table" and type(m.caps) == "table" and m.caps or nil
    ok, err = allowed(self, from, "modulate", ch, caps)
    if not ok then return nil, err end
  end
  return true
end

-- A refusal's text is the policy's, as it is (doc/security.md).
local function refuse(self, io, from, msg, err)
  return fail(self, io, from, msg.rid, err, "refused")
end

local ops = {}

-- A context adds one producer or consumer endpoint to `ch`.
function ops.join(self, from, msg, io)
  local ch, err = check_ch(self, msg)
  if not ch then return fail(self, io, from, msg.rid, err, "invalid") end
  local role; role, err = check_role(msg)
  if not role then return fail(self, io, from, msg.rid, err, "invalid") end
  local ok; ok, err = authorize(self, from, msg, role, ch)
  if not ok then return refuse(self, io, from, msg, err) end
  local c = self.channels[ch]
  local who = self.role == "nameserver" and naming.requester(self, from) or nil
  if not c then
    -- A join that makes the name server's entry is charged to its requester
    -- like a lookup (channel_quota): else joins alone would fill the table.
    local fresh = who ~= nil and self.assign[ch] == nil
    if fresh then
      local qerr
      ok, qerr = naming.quota_room(self, who, "join")
      if not ok then return fail(self, io, from, msg.rid, qerr, "limit") end
    end
    local e, ecode, owner
    ok, e, ecode, owner = claim(self, ch, "join")
    if not ok then return fail(self, io, from, msg.rid, e, ecode, { manager = owner }) end
    if self.nchannels >= self.max_channels then
      return fail(self, io, from, msg.rid, ("join: too many channels (limit %d)"):format(self.max_channels), "limit")
    end
    c = new_channel(self, ch)
    if fresh then naming.charge(self, ch, who) end
  end
  -- used by another requester than the one that made the entry: no junk
  if who ~= nil and self.creator[ch] ~= nil and self.creator[ch] ~= who then naming.uncharge(self, ch) end

  if role == "producer" then
    local p = c.producers[from]
    if p then
      -- (a rejoin, after the context lost its name server but not us: its
      -- one membership, or its one leave at the end leaves a phantom)
      if msg.rejoin ~= true then p.count = p.count + 1 end
    else
      -- The reply carries the current list: that is this context's confirmation.
      p = { count = 1, acked = c.ver, checked = self.policy }   -- (authorize granted it)
      c.producers[from] = p
    end
    -- While the control plane recovers (`settle`, as for consumers), the
    -- consumers that exist may not have joined again yet: the reply waits
    -- (member updates reach the producer meanwhile), then carries the list.
    local settle = type(msg.settle) == "number" and msg.settle > 0
                   and math.min(msg.settle, self.settle) or 0
    if settle > 0 then
      c.pwaits = c.pwaits or {}
      c.pwaits[#c.pwaits + 1] = { from = from, rid = msg.rid, hold = io.now + settle }
      self.due[c] = true
      return
    end
    return answer_producer(self, io, c, from, msg.rid, p)
  end

  local subs = checked_subs(self, c, from, msg, io)
  if not subs then return end
  local r = c.consumers[from]
  if not r and c.nconsumers >= self.max_members then
    -- (a producer refuses a longer member list whole: one context past it
    -- would cost every other its events)
    return fail(self, io, from, msg.rid, ("join: channel '%s' has %d consumer contexts (limit %d)")
                :format(ch, c.nconsumers, self.max_members), "limit")
  end
  if r then
    if msg.rejoin ~= true then r.count = r.count + 1 end   -- (a rejoin: as for a producer)
    if msg.subs == nil then return wait_for(self, c, from, msg, r, io) end
  else
    r = { count = 1 }
    c.consumers[from] = r
    c.nconsumers = c.nconsumers + 1
  end
  subscribed(self, c, from, msg, r, subs, io)
end

-- A consumer context replaces its subscriptions to `ch` (modulators added,
-- changed or removed).  Answered like a join: once every producing context
-- confirmed, with the modulator errors they reported.
function ops.subscribe(self, from, msg, io)
  local ch, err = check_ch(self, msg)
  if not ch then return fail(self, io, from, msg.rid, err, "invalid") end
  local ok; ok, err = authorize(self, from, msg, "consumer", ch)
  if not ok then return refuse(self, io, from, msg, err) end
  local c = self.channels[ch]
  local r = c and c.consumers[from]
  if not r then
    return fail(self, io, from, msg.rid, ("subscribe: %s is not a consumer of channel '%s'"):format(from, ch), "invalid")
  end
  local subs = checked_subs(self, c, from, msg, io)
  if not subs then return end
  subscribed(self, c, from, msg, r, subs, io)
end

-- A context removes one producer or consumer endpoint from `ch`.
function ops.leave(self, from, msg, io)
  local ch, err = check_ch(self, msg)
  if not ch then return fail(self, io, from, msg.rid, err, "invalid") end
  local role; role, err = check_role(msg)
  if not role then return fail(self, io, from, msg.rid, err, "invalid") end
  local c = self.channels[ch]
  if not c and self.role == "nameserver" then
    local owner = self.assign[ch]
    if owner and owner ~= self.addr then
      return fail(self, io, from, msg.rid, ("leave: channel '%s' is managed by %s"):format(ch, owner), "refused",
                  { manager = owner })
    end
  end
  local set = c and (role == "producer" and c.producers or c.consumers)
  local r = set and set[from]
  if not r then
    return fail(self, io, from, msg.rid, ("leave: %s is not a %s of channel '%s'"):format(from, role, ch), "invalid")
  end
  r.count = r.count - 1
  if r.count == 0 then
    set[from] = nil
    if role == "consumer" then
      c.nconsumers = c.nconsumers - 1
      publish_members(self, c, io)
    else
      check_waits(self, c, io)      -- its confirmations are no longer awaited
    end
  end
  reply(self, io, from, msg.rid, { ver = c.ver, count = r.count })
  maybe_drop(self, c, io.now)
end

-- A producing context could not connect to a consumer context of `ch`
-- (one-way, issue 25): told to that consumer context as `unreached`, so
-- that it learns why nothing comes and what to do.  Believed only from a
-- producer of the channel, and only about a consumer of it.
local MAX_WHY = 200
function ops.unreachable(self, from, msg, io)
  local c = type(msg.ch) == "string" and self.channels[msg.ch]
  if not (c and c.producers[from]) then
    return self.log("debug", ("unreachable from %s: not a producer of '%s'"):format(from, tostring(msg.ch)))
  end
  local to = msg.consumer
  if type(to) ~= "string" or not c.consumers[to] then
    return self.log("debug", ("unreachable from %s: %s is not a consumer of '%s'"):format(from, tostring(to), c.name))
  end
  local why = type(msg.err) == "string" and msg.err:sub(1, MAX_WHY) or "no reason given"
  emit(self, io, to, { op = "unreached", ch = c.name, producer = from, err = why })
end

-- Does `ch` have members here?  { producers = n, consumers = n } (contexts),
-- or an error with code "notfound" (ctx:channel(name, { create = false }));
-- "refused" when the asker may not produce, consume or list it.
function ops.info(self, from, msg, io)
  local ch, err = check_ch(self, msg)
  if not ch then return fail(self, io, from, msg.rid, err, "invalid") end
  local ok, serr = naming.may_see(self, from, ch)    -- before "notfound": existence is news too
  if not ok then return fail(self, io, from, msg.rid, serr, "refused") end
  local c = self.channels[ch]
  local np, nc = 0, 0
  for _ in pairs(c and c.producers or {}) do np = np + 1 end
  for _ in pairs(c and c.consumers or {}) do nc = nc + 1 end
  if np + nc == 0 then
    return fail(self, io, from, msg.rid, ("info: no such channel: %s"):format(ch), "notfound")
  end
  reply(self, io, from, msg.rid, { producers = np, consumers = nc })
end

-- A producing context confirms it applied members list `ver` (not a request).
function ops.members_ok(self, from, msg, io)
  local ch, ver = msg.ch, msg.ver
  if type(ch) ~= "string" or type(ver) ~= "number" then
    return self.log("warn", ("members_ok from %s: needs string 'ch' and number 'ver'"):format(from))
  end
  local c = self.channels[ch]
  local p = c and c.producers[from]
  if not p then
    return self.log("debug", ("members_ok from %s: not a producer of '%s'"):format(from, ch))
  end
  if ver > c.ver then
    return self.log("warn", ("members_ok from %s: version %d of '%s' was never sent"):format(from, ver, ch))
  end
  if ver > p.acked then
    p.acked = ver
    -- modulators that failed to install there, by key (latest report wins)
    p.errs = type(msg.errs) == "table" and msg.errs or nil
    -- the producer refused the list whole (its max_members, max_peers): it
    -- keeps the one before; the joins waiting for it are answered (the
    -- consumers' errors say why) rather than left to time out
    if type(msg.refused) == "string" then
      self.log("warn", ("producer %s: %s"):format(from, msg.refused:sub(1, 300)))
      p.refused = msg.refused:sub(1, 300)
    else
      p.refused = nil
    end
    check_waits(self, c, io)
  end
end

-- The policy changed (a reload on the name server, or the one it handed
-- this manager): every member of every channel here is checked again.  A
-- producing context no longer granted produce is dropped at once
-- (drop_producer); a consumer context no longer granted consume is removed
-- from the member lists, and so is each modulator whose caps are no longer
-- granted (the consumer context keeps the rest); the producers stop
-- sending to it at the next version, published now; it is told why
-- (`revoked`: its consumers' on_error).  Its joins still waiting are
-- refused.
function M.recheck(self, io)
  if not (self.identity and self.policy) then return end
  for _, name in ipairs(sorted_keys(self.channels)) do
    local c = self.channels[name]
    for _, p in ipairs(sorted_keys(c.producers)) do
      local ok, why = still(self, c, p, "produce")
      if not ok then drop_producer(self, c, p, why, io) end
    end
    local changed = false
    for _, a in ipairs(sorted_keys(c.consumers)) do
      local r = c.consumers[a]
      local ok, why = still(self, c, a, "consume")
      if not ok then
        c.consumers[a] = nil
        c.nconsumers = c.nconsumers - 1
        changed = true
        local keep = {}
        for _, w in ipairs(c.waits) do
          if w.from == a then fail(self, io, a, w.rid, why, "refused") else keep[#keep + 1] = w end
        end
        c.waits = keep
        self.log("warn", ("consumer %s removed from '%s': %s"):format(a, c.name, tostring(why)))
        emit(self, io, a, { op = "revoked", ch = c.name, role = "consumer", err = why })
      elseif r.subs and r.subs.mods then
        for _, k in ipairs(sorted_keys(r.subs.mods)) do
          local m = r.subs.mods[k]
          local mok, mwhy = still(self, c, a, "modulate", type(m.caps) == "table" and m.caps or nil)
          if not mok then
            r.subs.mods[k] = nil
            changed = true
            self.log("warn", ("modulator %s of %s removed from '%s': %s"):format(k:sub(1, 8), a, c.name,
                                                                                 tostring(mwhy)))
            emit(self, io, a, { op = "revoked", ch = c.name, role = "consumer", key = k, err = mwhy })
          end
        end
      end
    end
    -- the grants changed alone (no modulator the manager knows of lost
    -- its caps): the producers take them from a new list all the same,
    -- since a direct install the manager has not heard of yet may hold
    -- caps no longer granted (lecho.modulator _direct_wrong)
    if not changed and c.grants_sent ~= nil and grants_text(grants_of(self, c)) ~= c.grants_sent then
      changed = true
    end
    if changed then publish_members(self, c, io) end
    check_waits(self, c, io)
    maybe_drop(self, c, io.now)
  end
end

M.members_of, M.publish_members, M.check_waits, M.maybe_drop, M.answer_producer =
  members_of, publish_members, check_waits, maybe_drop, answer_producer
M.ops = ops

return M
