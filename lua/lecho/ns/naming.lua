-- lecho.ns.naming: the name server's part of the registry: which manager
-- owns each channel (sticky, least-loaded first; the name server itself
-- when no manager registered), managers registering (again, after a
-- restart, with the channels they had), and lookups held while the control
-- plane recovers.  Ops are `function(self, from, msg, io)` on a registry.

-- Never compiled, as lecho.ns.registry (Debian's LuaJIT and LuaJIT #827).
if jit then jit.off(true, true) end

local outbox = require "lecho.ns.outbox"
local policy = require "lecho.policy"

local sorted_keys = require("lecho.tables").sorted_keys
local reply, fail = outbox.reply, outbox.fail

local M = {}

local function check_ch(self, msg)
  local ch = msg.ch
  if type(ch) ~= "string" or ch == "" then
    return nil, ("%s: field 'ch' must be a non-empty string"):format(msg.op)
  end
  if #ch > self.max_name then
    return nil, ("%s: channel name longer than %d bytes"):format(msg.op, self.max_name)
  end
  return ch
end

-- The principal of `from` (keyed mode), or nil (protected mode: every
-- local process is trusted).
local function principal(self, from)
  if not self.identity then return nil end
  local name = self.identity(from)
  return name
end

-- Authorization (doc/security.md): may `from` do `action` on channel `ch`
-- (nil: on some channel), its modulators asking for `caps`?  Always in
-- protected mode, always for this context itself, and for every trusted
-- principal while no policy is loaded.  Returns true, or nil, err.
local function allowed(self, from, action, ch, caps)
  if from == self.addr or not self.identity then return true end
  if not self.policy then
    if not self.said_open and self.role == "nameserver" then
      self.said_open = true
      self.log("warn", "keyed mode without a policy: every trusted principal may produce, consume, "
                       .. "modulate, manage and list every channel (doc/security.md)")
    end
    return true
  end
  local who = principal(self, from)
  if who == nil then
    -- keyed, yet no authenticated identity (its connection is gone)
    return nil, ("not allowed: %s has no authenticated identity"):format(from)
  end
  return self.policy:check(who, action, ch, caps)
end

-- The public key of the context at `addr` (keyed mode), for a lookup
-- reply: the asker pins the manager's address to it.
local function key_of(self, addr)
  if not self.identity then return nil end
  local _, pk = self.identity(addr)
  return pk
end

-- A lookup that makes a channel's entry needs one of produce and consume.
local function may_create(self, from, ch)
  if allowed(self, from, "produce", ch) or allowed(self, from, "consume", ch) then return true end
  return nil, ("not allowed: %s may not produce or consume %s"):format(principal(self, from),
                                                                      policy.base_name(ch))
end

-- Learning of a channel (where it is managed and by which key: lookup;
-- whether it has members: info) needs one of produce, consume and list on
-- it: a principal allowed nothing there learns nothing, not even whether
-- it exists.
local function may_see(self, from, ch)
  local ok, err = allowed(self, from, "list", ch)
  if ok or allowed(self, from, "produce", ch) or allowed(self, from, "consume", ch) then return true end
  local who = principal(self, from)
  if who == nil then return nil, err end      -- (no authenticated identity)
  return nil, ("not allowed: %s may not produce, consume or list %s"):format(who, policy.base_name(ch))
end

-- Quotas.  A channel entry that a lookup or a join makes is charged to its
-- requester until another requester joins the channel here (then it is in
-- use, not junk) or the entry is forgotten: one requester's junk lookups and
-- joins fill its own share (channel_quota), never the table that the
-- others' channels need.  A context that alone uses more channels than
-- that needs a name server with a larger channel_quota.  (An entry assigned
-- to another manager stays charged until it is forgotten: the name server
-- does not see its joins.)  A requester is a principal in keyed mode, else
-- a context's address (protected mode: any local process may claim many).
local function requester(self, from)
  return principal(self, from) or from
end

-- Room for one more entry of `who` (its held lookups count too)?
-- Returns true, or nil, err.
local function quota_room(self, who, op)
  if (self.created[who] or 0) + (self.lheld[who] or 0) >= self.channel_quota then
    return nil, ("%s: too many channels created by %s (limit %d per requester)")
                :format(op, who, self.channel_quota)
  end
  return true
end

local function charge(self, ch, who)
  self.created[who] = (self.created[who] or 0) + 1
  self.creator[ch] = who
end

-- The entry of `ch` is gone: its requester may make another.
local function uncharge(self, ch)
  local who = self.creator[ch]
  if who == nil then return end
  self.creator[ch] = nil
  local n = self.created[who] - 1
  self.created[who] = n > 0 and n or nil
end

-- A lookup held while recovering is no longer held (it runs now).
local function unhold(self, w)
  local n = (self.lheld[w.who] or 1) - 1
  self.lheld[w.who] = n > 0 and n or nil
end

-- Name server: the channels that may become forgettable, in a binary heap
-- by the time `at` they were last seen in use (self.fheap; self.fqueued:
-- ch -> its entry, one per channel).  Queued when an entry is made (lookup,
-- join), when its record is dropped (membership.maybe_drop) and when its
-- manager releases it; a channel in use when its turn comes leaves the heap
-- until it is dropped again.  So the once-a-second check touches only what
-- is due, however many channels there are.
local function hup(h, i)
  local e = h[i]
  while i > 1 do
    local p = math.floor(i / 2)
    if h[p].at <= e.at then break end
    h[i] = h[p]
    i = p
  end
  h[i] = e
end

local function hpop(h)
  local top, last = h[1], h[#h]
  h[#h] = nil
  local n = #h
  if n > 0 then
    local i = 1
    while true do
      local l, r, m = 2 * i, 2 * i + 1, i
      local ml = last
      if l <= n and h[l].at < ml.at then m, ml = l, h[l] end
      if r <= n and h[r].at < ml.at then m = r end
      if m == i then break end
      h[i] = h[m]
      i = m
    end
    h[i] = last
  end
  return top
end

-- Queue `ch` to be checked once forget_after has passed since `at` (no-op
-- when it is queued already: its check looks at self.used then).
local function forget_later(self, ch, at)
  if self.fqueued[ch] then return end
  local e = { ch = ch, at = at }
  self.fqueued[ch] = e
  local h = self.fheap
  h[#h + 1] = e
  hup(h, #h)
end

-- Name server: may this context manage `ch`? Claims unassigned channels.
-- Returns true, or nil, err, code ("limit", "refused": owner manages it), owner.
local function claim(self, ch, op)
  if self.role ~= "nameserver" then return true end
  local owner = self.assign[ch]
  if owner == nil then
    if self.nassigned >= self.max_channels then
      return nil, ("%s: too many channels (limit %d)"):format(op, self.max_channels), "limit"
    end
    self.assign[ch] = self.addr
    self.nassigned = self.nassigned + 1
    forget_later(self, ch, -math.huge)   -- its first check stamps it (used)
  elseif owner ~= self.addr then
    return nil, ("%s: channel '%s' is managed by %s"):format(op, ch, owner), "refused", owner
  end
  return true
end

-- Does channel `ch`, managed here, have a producer or a consumer?
local function in_use(self, ch)
  local c = self.channels[ch]
  return c ~= nil and (next(c.producers) ~= nil or next(c.consumers) ~= nil)
end

local function unassign(self, ch, why)
  local owner = self.assign[ch]
  self.assign[ch], self.used[ch], self.idle_remote[ch] = nil, nil, nil
  self.nassigned = self.nassigned - 1
  uncharge(self, ch)
  if self.managers[owner] then self.managers[owner].nch = self.managers[owner].nch - 1 end
  self.log("info", ("channel '%s' forgotten: %s"):format(ch, why))
end

-- Name server, from the tick: forgets the channels that had no producer,
-- no consumer and no lookup for `forget_after` seconds (a misspelled name
-- does not stay listed): those it manages itself, and those whose manager
-- said so (op release).  Checked once a second, over the due part of the
-- heap only.
local function forget_unused(self, now)
  if now < self.forget_at then return end
  self.forget_at = now + 1
  local used, limit, h = self.used, self.forget_after, self.fheap
  while h[1] and now - h[1].at >= limit do
    local ch = hpop(h).ch
    self.fqueued[ch] = nil
    self.forget_visits = self.forget_visits + 1
    local owner = self.assign[ch]
    if owner == nil then
      -- (forgotten already, or its manager died)
    elseif owner ~= self.addr then
      if self.idle_remote[ch] then   -- else: queued again by its next release
        if now - (used[ch] or -math.huge) >= limit then
          unassign(self, ch, ("unused at %s for %gs"):format(owner, limit))
        else
          forget_later(self, ch, used[ch])
        end
      end
    elseif self.channels[ch] then
      used[ch] = now   -- in use: queued again when its record is dropped
    elseif not used[ch] then
      used[ch] = now
      forget_later(self, ch, now)
    elseif now - used[ch] >= limit then
      unassign(self, ch, ("no producer and no consumer for %gs"):format(limit))
    else
      forget_later(self, ch, used[ch])
    end
  end
end

-- Manager, from the tick: tells the name server (op release) which of its
-- channels have had no producer and no consumer for `forget_after` seconds.
-- Checked once a second.
local function release_unused(self, now, io)
  if now < self.forget_at then return end
  self.forget_at = now + 1
  for ch, since in pairs(self.idle) do
    if self.channels[ch] then
      self.idle[ch] = nil
    elseif now - since >= self.forget_after then
      self.idle[ch] = nil
      outbox.emit(self, io, self.nameserver, { op = "release", ch = ch })
    end
  end
end

local ops = {}

-- A lookup held while the name server recovers is answered when the window
-- ends, or LOOKUP_HOLD seconds after it came if that is sooner: the
-- asker's request gives up at its `timeout` (5 s by default), and a
-- `--settle` longer than that made a new channel's producer fail after a
-- restart (s7 attack, b3).  By then the managers have registered again
-- (they dial at least every `retry_max`, 2 s), so the channel is not split;
-- the reply's `settle` (what is left of the window) holds the asker's join
-- at its manager for the rest, and the asker waits for that join its
-- `timeout` plus that `settle`.
M.LOOKUP_HOLD = 3.0
-- (the first seconds of a name server in which a lookup's `recovering` is
-- believed: below)
M.RECOVER_BELIEVE = 5.0
local function hold_until(self, io)
  return math.min(self.recover_until, io.now + M.LOOKUP_HOLD)
end

-- Name server: which manager owns `ch`? Assigns (stickily) on first lookup.
function ops.lookup(self, from, msg, io)
  if self.role ~= "nameserver" then
    return fail(self, io, from, msg.rid, "lookup: this context is a channel manager, not a name server", "refused")
  end
  local ch, err = check_ch(self, msg)
  if not ch then return fail(self, io, from, msg.rid, err, "invalid") end
  if msg.create == false or self.assign[ch] ~= nil then
    -- (a lookup that would make the entry needs more: may_create below)
    local ok, serr = may_see(self, from, ch)
    if not ok then return fail(self, io, from, msg.rid, serr, "refused") end
  end
  -- A context that lost its name server and joins again says so
  -- (`recovering`): the control plane is recovering, for `settle` seconds
  -- from when it said so (a lookup held meanwhile and answered now widened
  -- the window then, not again), so that the joins of the others wait for
  -- it too.  Believed only from a context that could have known a name
  -- server before this one: in this one's first RECOVER_BELIEVE seconds,
  -- or `settle` if longer (such a context dials again at least every
  -- `retry_max`, 2 s, so it is back by then; a run mark cannot tell: a
  -- name server first started on port 0 has none).  So the window ends at
  -- most that plus `settle` after the start, whoever sends what (any
  -- peer's flag, every 2 s, kept it open forever: s7 attack, b1).  A
  -- channel whose manager died is the name server's own knowledge
  -- (orphans, below).
  if msg.recovering == true and not msg.waited
     and io.now < self.born + math.max(M.RECOVER_BELIEVE, self.settle) then
    self.recover_until = math.max(self.recover_until, io.now + self.settle)
  end
  local settle = self.recover_until - io.now
  local orphan = self.orphans[ch]
  if orphan then
    if orphan + self.settle > io.now then
      settle = math.max(settle, orphan + self.settle - io.now)
    else
      self.orphans[ch] = nil
    end
  end
  local owner = self.assign[ch]
  if owner == nil and self.recover_until > io.now and not msg.waited then
    -- Recovering: the manager of this channel may not have registered again
    -- yet; assigning it now could split it between two managers.  A held
    -- lookup counts against its requester's quota (the list is bounded).
    if msg.create ~= false then
      local ok, qerr = may_create(self, from, ch)
      if not ok then return fail(self, io, from, msg.rid, qerr, "refused") end
      local who = requester(self, from)
      ok, qerr = quota_room(self, who, "lookup")
      if not ok then return fail(self, io, from, msg.rid, qerr, "limit") end
      self.lheld[who] = (self.lheld[who] or 0) + 1
      self.lwaits[#self.lwaits + 1] = { from = from, msg = msg, hold = hold_until(self, io), who = who }
      return
    end
    self.lwaits[#self.lwaits + 1] = { from = from, msg = msg, hold = hold_until(self, io) }
    return
  end
  if msg.create == false then
    -- Only asking (ctx:channel(name, { create = false })): a channel with
    -- no producer and no consumer is not one.  A channel managed elsewhere
    -- is answered by its manager (op "info").
    if owner == nil or (owner == self.addr and not in_use(self, ch)) then
      return fail(self, io, from, msg.rid, ("lookup: no such channel: %s"):format(ch), "notfound")
    end
    return reply(self, io, from, msg.rid, { manager = owner, manager_key = key_of(self, owner),
                                            settle = settle > 0 and settle or nil })
  end
  self.used[ch] = io.now
  self.idle_remote[ch] = nil    -- the manager tells again once it is unused
  if owner == nil then
    if self.nassigned >= self.max_channels then
      return fail(self, io, from, msg.rid, ("lookup: too many channels (limit %d)"):format(self.max_channels), "limit")
    end
    local ok, qerr = may_create(self, from, ch)
    if not ok then return fail(self, io, from, msg.rid, qerr, "refused") end
    local who = requester(self, from)
    ok, qerr = quota_room(self, who, "lookup")
    if not ok then return fail(self, io, from, msg.rid, qerr, "limit") end
    charge(self, ch, who)
    owner = self.addr
    local best
    for _, a in ipairs(sorted_keys(self.managers)) do
      if (best == nil or self.managers[a].nch < self.managers[best].nch) and allowed(self, a, "manage", ch) then
        best = a
      end
    end
    if best then
      owner = best
      self.managers[best].nch = self.managers[best].nch + 1
    end
    self.assign[ch] = owner
    self.nassigned = self.nassigned + 1
    self.used[ch] = io.now
    forget_later(self, ch, io.now)
    self.log("info", ("channel '%s' assigned to %s"):format(ch, owner))
  end
  reply(self, io, from, msg.rid, { manager = owner, manager_key = key_of(self, owner),
                                   settle = settle > 0 and settle or nil })
end

-- Name server: `from` is a channel manager ready to take channels.
function ops.register_manager(self, from, msg, io)
  if self.role ~= "nameserver" then
    return fail(self, io, from, msg.rid, "register_manager: this context is a channel manager, not a name server", "refused")
  end
  local ok, err = allowed(self, from, "manage")
  if not ok then return fail(self, io, from, msg.rid, err, "refused") end
  if not self.managers[from] then
    self.managers[from] = { nch = 0 }
    self.log("info", "manager registered: " .. from)
  end
  -- A manager registering again (this name server restarted, or it lost
  -- its connection) lists the channels it manages: they stay its own, so
  -- that the contexts which use it and those that look up now agree.
  local taken = {}
  if type(msg.channels) == "table" then
    for _, ch in ipairs(msg.channels) do
      if type(ch) == "string" and ch ~= "" and #ch <= self.max_name then
        local owner = self.assign[ch]
        if owner == nil and self.nassigned < self.max_channels and allowed(self, from, "manage", ch) then
          self.assign[ch] = from
          self.nassigned = self.nassigned + 1
          self.managers[from].nch = self.managers[from].nch + 1
          owner = from
        end
        if owner ~= from then taken[#taken + 1] = ch end
      end
    end
  end
  -- the manager enforces the same policy on the joins it takes
  reply(self, io, from, msg.rid, { taken = taken[1] and taken or nil,
                                   policy = self.policy and self.policy:table() or nil })
end

-- Name server: manager `from` has had no producer and no consumer of `ch`
-- for forget_after (a one-way message).  Forgotten now, unless a lookup
-- came within forget_after: then once that long has passed since it.
function ops.release(self, from, msg, io)
  local ch = msg.ch
  if self.role ~= "nameserver" or type(ch) ~= "string" or self.assign[ch] ~= from then return end
  if io.now - (self.used[ch] or -math.huge) >= self.forget_after then
    unassign(self, ch, ("unused at %s for %gs"):format(from, self.forget_after))
  else
    self.idle_remote[ch] = true
    forget_later(self, ch, self.used[ch])
  end
end

M.forget_later = forget_later
M.check_ch, M.claim, M.forget_unused, M.release_unused, M.uncharge, M.unhold, M.ops =
  check_ch, claim, forget_unused, release_unused, uncharge, unhold, ops
M.principal, M.allowed, M.may_see, M.key_of = principal, allowed, may_see, key_of
M.requester, M.quota_room, M.charge = requester, quota_room, charge

return M
