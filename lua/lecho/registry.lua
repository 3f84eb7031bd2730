-- lecho.registry: the control plane of the name server and of channel
-- managers, as a transport-free state machine (pure Lua 5.1 / LuaJIT, no I/O).
--
-- The host owns the sockets and the clock. It decodes a control message into
-- a plain Lua table and calls `reg:handle(from, msg, send, now)`; it reports
-- lost connections with `reg:peer_down(addr, send, now)` and calls
-- `reg:tick(send, now)` periodically (~0.1 s). Everything this module says to
-- the world goes through `send(addr, msg)`. Addresses are "host:port" strings,
-- one per process context. Nothing here raises on any input: bad messages get
-- `ok=false` replies (or a log line when they cannot be answered).
--
-- What it keeps:
--   name server: registered managers and the sticky channel -> manager
--                assignment (channels go to the least-loaded manager; with no
--                manager registered, the name server manages them itself);
--   manager:     per channel, which contexts produce and which consume (with
--                endpoint counts), the channel version, which version each
--                producing context has confirmed, and the consumer joins that
--                wait for those confirmations.
--
-- The rule it enforces: a consumer `join` is answered only once every
-- producing context has confirmed (`members_ok`) a membership list that
-- contains the new consumer, or after `ack_timeout` seconds (then with
-- `late`). So "a consumer receives every event a producer submits after
-- ch:consumer() returned" holds for every producer that confirmed in time.
-- While the control plane recovers (a lookup said `recovering`: its sender
-- lost its name server or manager; or the channel's manager died), lookups
-- answer `settle`, and a join carrying it is answered no sooner: producers
-- that exist but have not joined this manager again yet get that time to.
--
-- Outgoing messages are queued and sent after the state change is complete,
-- in FIFO order, each through pcall. A `send` that re-enters the registry
-- (loopback to its own context) is therefore safe: the nested call's messages
-- join the same queue, after ours.

-- Never compiled: Debian's LuaJIT (2.1.0-beta3, git 2022-03-20) predates
-- the upstream fix of a JIT bug that ends a `pairs` loop early once it is
-- blacklisted and patched (LuaJIT issue #827); membership must not skip a
-- consumer, and none of this is hot.
if jit then jit.off(true, true) end

local M = {}

local Registry = {}
Registry.__index = Registry

local function noop() end

local function sorted_keys(t)
  local ks = {}
  for k in pairs(t) do ks[#ks + 1] = k end
  table.sort(ks)
  return ks
end
M.sorted_keys = sorted_keys   -- the keys of t, sorted (shared with lecho.init)

-- A channel record. `producers[addr] = { count, acked }` where acked is the
-- highest channel version that context confirmed; `consumers[addr] = { count,
-- ver }` where ver is the channel version that first included the context.
-- The consumer record is the place for future per-consumer-context data
-- (modulators, shared objects). `waits` is the FIFO of consumer joins not yet
-- answered: `{ from, rid, ver, count, deadline }`.
local function new_channel(self, name)
  self.seq = self.seq + 1
  local c = { name = name, ver = self.seq, producers = {}, consumers = {}, waits = {} }
  self.channels[name] = c
  self.nchannels = self.nchannels + 1
  return c
end

-- Forget a channel that has no member and no pending join (bounded memory).
-- A name server keeps its self-assignment (sticky), only the record goes.
local function maybe_drop(self, c)
  if next(c.producers) == nil and next(c.consumers) == nil and #c.waits == 0
     and self.channels[c.name] == c then
    self.channels[c.name] = nil
    self.nchannels = self.nchannels - 1
  end
end

------------------------------------------------------------------------------
-- Output: queue now, send when the state is consistent.

local function emit(self, io, addr, msg)
  local q = self.outq
  q[#q + 1] = { io.send, addr, msg }
end

local function reply(self, io, to, rid, fields)
  local m = fields or {}
  m.op, m.rid = "reply", rid
  if m.ok == nil then m.ok = true end
  emit(self, io, to, m)
end

local function fail(self, io, to, rid, err, extra)
  local m = extra or {}
  m.ok, m.err = false, err
  reply(self, io, to, rid, m)
end

-- Drain the queue. Re-entrant calls only append; the outermost call sends.
local function flush(self)
  if self.flushing then return end
  self.flushing = true
  local q, i = self.outq, 1
  while q[i] do
    local item = q[i]
    q[i] = false
    local ok, err = pcall(item[1], item[2], item[3])
    if not ok then
      self.log("warn", ("send to %s failed: %s"):format(tostring(item[2]), tostring(err)))
    end
    i = i + 1
  end
  self.outq = {}
  self.flushing = false
end

------------------------------------------------------------------------------
-- Membership helpers.

-- What producing contexts need: the contexts that take the plain stream,
-- and each distinct modulator (by key) with the contexts that asked for it.
-- Fresh tables on every call (they are handed to `send`).
local function members_of(c)
  local plain, mods = {}, {}
  for _, a in ipairs(sorted_keys(c.consumers)) do
    local subs = c.consumers[a].subs
    if subs.plain then plain[#plain + 1] = a end
    for _, k in ipairs(sorted_keys(subs.mods)) do
      local m = subs.mods[k]
      local e = mods[k]
      if not e then
        e = { src = m.src, params = m.params, period = m.period, caps = m.caps, base = m.base,
              dests = {} }
        mods[k] = e
      end
      e.dests[#e.dests + 1] = a
    end
  end
  return plain, mods
end

-- The consumer set changed: new version, `members` to every producing context.
local function publish_members(self, c, io)
  self.seq = self.seq + 1
  c.ver = self.seq
  for _, p in ipairs(sorted_keys(c.producers)) do
    self.mid = self.mid + 1
    local plain, mods = members_of(c)
    emit(self, io, p, { op = "members", ch = c.name, ver = c.ver, consumers = plain, mods = mods,
                        mid = self.mid })
  end
end

-- The modulator errors producing contexts reported for the keys a waiting
-- consumer context asked for: a list of { producer, key, err }.
local function wait_errors(c, w)
  local out = {}
  for _, a in ipairs(sorted_keys(c.producers)) do
    local errs = c.producers[a].errs
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

-- Answer every waiting consumer join whose version all current producers
-- have confirmed.
local function check_waits(self, c, io)
  local keep = {}
  for _, w in ipairs(c.waits) do
    if all_acked(c, w.ver) and w.hold <= io.now then
      reply(self, io, w.from, w.rid, { ver = w.ver, count = w.count, errors = wait_errors(c, w),
                                       producers = sorted_keys(c.producers) })
    else
      keep[#keep + 1] = w
    end
  end
  c.waits = keep
end

------------------------------------------------------------------------------
-- Validation.

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

local function check_role(msg)
  local role = msg.role
  if role ~= "producer" and role ~= "consumer" then
    return nil, ("%s: field 'role' must be \"producer\" or \"consumer\""):format(msg.op)
  end
  return role
end

-- A consumer context's subscriptions: { plain = bool, mods = { [key] = {
-- src, params, period, caps, base } } }.  Absent: the plain stream only.
local MAX_SOURCE = 1024 * 1024
local function check_subs(msg)
  local s = msg.subs
  if s == nil then return { plain = true, mods = {} } end
  local op = msg.op
  if type(s) ~= "table" then return nil, op .. ": field 'subs' must be a table" end
  if s.mods ~= nil and type(s.mods) ~= "table" then return nil, op .. ": 'subs.mods' must be a table" end
  local mods = {}
  for k, m in pairs(s.mods or {}) do
    if type(k) ~= "string" or #k == 0 or #k > 64 then
      return nil, op .. ": modulator keys must be strings of 1 to 64 bytes"
    end
    if type(m) ~= "table" or type(m.src) ~= "string" then
      return nil, ("%s: modulator '%s' needs a string 'src'"):format(op, k)
    end
    if #m.src > MAX_SOURCE then
      return nil, ("%s: modulator '%s' source longer than %d bytes"):format(op, k, MAX_SOURCE)
    end
    if m.period ~= nil and (type(m.period) ~= "number" or not (m.period >= 0.001)) then
      return nil, ("%s: modulator '%s': period must be a number >= 0.001"):format(op, k)
    end
    if m.caps ~= nil and type(m.caps) ~= "table" then
      return nil, ("%s: modulator '%s': caps must be a list of strings"):format(op, k)
    end
    for _, cap in ipairs(m.caps or {}) do
      if type(cap) ~= "string" then
        return nil, ("%s: modulator '%s': caps must be a list of strings"):format(op, k)
      end
    end
    mods[k] = { src = m.src, params = m.params, period = m.period, caps = m.caps,
                base = type(m.base) == "string" and m.base or nil }
  end
  return { plain = s.plain ~= false, mods = mods }
end

-- Deep equality of plain values (params, capability lists).
local function same(a, b)
  if a == b then return true end
  if type(a) ~= "table" or type(b) ~= "table" then return a ~= a and b ~= b end -- NaN
  for k, v in pairs(a) do
    if not same(v, b[k]) then return false end
  end
  for k in pairs(b) do
    if a[k] == nil then return false end
  end
  return true
end

-- Keys name modulators (a 64-bit hash made by the consumer): two consumers
-- using one key must mean one modulator, or one would receive the other's
-- stream.  Returns nil, err when `subs` reuses a key of another context's
-- subscription for different code or params.
local function check_keys(c, from, subs, op)
  for key, m in pairs(subs.mods) do
    for addr, r in pairs(c.consumers) do
      local o = addr ~= from and r.subs.mods[key]
      if o and not (o.src == m.src and o.period == m.period and same(o.caps, m.caps)
                    and same(o.params, m.params)) then
        return nil, ("%s: modulator key %s is already used by %s for another modulator"):format(
          op, key, addr)
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
    return reply(self, io, from, msg.rid, { ver = r.ver, count = r.count, errors = wait_errors(c, w),
                                            producers = sorted_keys(c.producers) })
  end
  c.waits[#c.waits + 1] = w
end

-- Name server: may this context manage `ch`? Claims unassigned channels.
-- Returns true, or nil, err, owner.
local function claim(self, ch, op)
  if self.role ~= "nameserver" then return true end
  local owner = self.assign[ch]
  if owner == nil then
    if self.nassigned >= self.max_channels then
      return nil, ("%s: too many channels (limit %d)"):format(op, self.max_channels)
    end
    self.assign[ch] = self.addr
    self.nassigned = self.nassigned + 1
  elseif owner ~= self.addr then
    return nil, ("%s: channel '%s' is managed by %s"):format(op, ch, owner), owner
  end
  return true
end

------------------------------------------------------------------------------
-- Operations. Each is `function(self, from, msg, io)`; `msg.rid` is a number
-- for requests (checked by the dispatcher).

local ops = {}

-- Name server: which manager owns `ch`? Assigns (stickily) on first lookup.
function ops.lookup(self, from, msg, io)
  if self.role ~= "nameserver" then
    return fail(self, io, from, msg.rid, "lookup: this context is a channel manager, not a name server")
  end
  local ch, err = check_ch(self, msg)
  if not ch then return fail(self, io, from, msg.rid, err) end
  -- A context that lost its name server or manager and joins again says
  -- so: the control plane is recovering, for `settle` seconds from now.
  if msg.recovering == true then self.recover_until = math.max(self.recover_until, io.now + self.settle) end
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
    -- yet; assigning it now could split it between two managers.
    self.lwaits[#self.lwaits + 1] = { from = from, msg = msg, hold = self.recover_until }
    return
  end
  if owner == nil then
    if self.nassigned >= self.max_channels then
      return fail(self, io, from, msg.rid, ("lookup: too many channels (limit %d)"):format(self.max_channels))
    end
    owner = self.addr
    local best
    for _, a in ipairs(sorted_keys(self.managers)) do
      if best == nil or self.managers[a].nch < self.managers[best].nch then best = a end
    end
    if best then
      owner = best
      self.managers[best].nch = self.managers[best].nch + 1
    end
    self.assign[ch] = owner
    self.nassigned = self.nassigned + 1
    self.log("info", ("channel '%s' assigned to %s"):format(ch, owner))
  end
  reply(self, io, from, msg.rid, { manager = owner, settle = settle > 0 and settle or nil })
end

-- Name server: `from` is a channel manager ready to take channels.
function ops.register_manager(self, from, msg, io)
  if self.role ~= "nameserver" then
    return fail(self, io, from, msg.rid, "register_manager: this context is a channel manager, not a name server")
  end
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
        if owner == nil and self.nassigned < self.max_channels then
          self.assign[ch] = from
          self.nassigned = self.nassigned + 1
          self.managers[from].nch = self.managers[from].nch + 1
          owner = from
        end
        if owner ~= from then taken[#taken + 1] = ch end
      end
    end
  end
  reply(self, io, from, msg.rid, { taken = taken[1] and taken or nil })
end

-- Introspection over the wire: same shape as snapshot() minus addr/role.
function ops.list(self, from, msg, io)
  local s = self:snapshot()
  reply(self, io, from, msg.rid, { channels = s.channels, managers = s.managers })
end

-- A context adds one producer or consumer endpoint to `ch`.
function ops.join(self, from, msg, io)
  local ch, err = check_ch(self, msg)
  if not ch then return fail(self, io, from, msg.rid, err) end
  local role; role, err = check_role(msg)
  if not role then return fail(self, io, from, msg.rid, err) end
  local c = self.channels[ch]
  if not c then
    local ok, e, owner = claim(self, ch, "join")
    if not ok then return fail(self, io, from, msg.rid, e, { manager = owner }) end
    if self.nchannels >= self.max_channels then
      return fail(self, io, from, msg.rid, ("join: too many channels (limit %d)"):format(self.max_channels))
    end
    c = new_channel(self, ch)
  end

  if role == "producer" then
    local p = c.producers[from]
    if p then
      p.count = p.count + 1
    else
      -- The reply carries the current list: that is this context's confirmation.
      p = { count = 1, acked = c.ver }
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
      return
    end
    local plain, mods = members_of(c)
    return reply(self, io, from, msg.rid, { consumers = plain, mods = mods, ver = c.ver, count = p.count })
  end

  local subs; subs, err = check_subs(msg)
  if not subs then return fail(self, io, from, msg.rid, err) end
  local ok; ok, err = check_keys(c, from, subs, "join")
  if not ok then return fail(self, io, from, msg.rid, err) end
  local r = c.consumers[from]
  if r then
    r.count = r.count + 1
    if msg.subs ~= nil then
      r.subs = subs
      publish_members(self, c, io)
      r.ver = c.ver
    end
  else
    r = { count = 1, subs = subs }
    c.consumers[from] = r
    publish_members(self, c, io)
    r.ver = c.ver
  end
  wait_for(self, c, from, msg, r, io)
end

-- A consumer context replaces its subscriptions to `ch` (modulators added,
-- changed or removed).  Answered like a join: once every producing context
-- confirmed, with the modulator errors they reported.
function ops.subscribe(self, from, msg, io)
  local ch, err = check_ch(self, msg)
  if not ch then return fail(self, io, from, msg.rid, err) end
  local c = self.channels[ch]
  local r = c and c.consumers[from]
  if not r then
    return fail(self, io, from, msg.rid, ("subscribe: %s is not a consumer of channel '%s'"):format(from, ch))
  end
  local subs; subs, err = check_subs(msg)
  if not subs then return fail(self, io, from, msg.rid, err) end
  local ok; ok, err = check_keys(c, from, subs, "subscribe")
  if not ok then return fail(self, io, from, msg.rid, err) end
  r.subs = subs
  publish_members(self, c, io)
  r.ver = c.ver
  wait_for(self, c, from, msg, r, io)
end

-- A context removes one producer or consumer endpoint from `ch`.
function ops.leave(self, from, msg, io)
  local ch, err = check_ch(self, msg)
  if not ch then return fail(self, io, from, msg.rid, err) end
  local role; role, err = check_role(msg)
  if not role then return fail(self, io, from, msg.rid, err) end
  local c = self.channels[ch]
  if not c and self.role == "nameserver" then
    local owner = self.assign[ch]
    if owner and owner ~= self.addr then
      return fail(self, io, from, msg.rid, ("leave: channel '%s' is managed by %s"):format(ch, owner),
                  { manager = owner })
    end
  end
  local set = c and (role == "producer" and c.producers or c.consumers)
  local r = set and set[from]
  if not r then
    return fail(self, io, from, msg.rid, ("leave: %s is not a %s of channel '%s'"):format(from, role, ch))
  end
  r.count = r.count - 1
  if r.count == 0 then
    set[from] = nil
    if role == "consumer" then
      publish_members(self, c, io)
    else
      check_waits(self, c, io)      -- its confirmations are no longer awaited
    end
  end
  reply(self, io, from, msg.rid, { ver = c.ver, count = r.count })
  maybe_drop(self, c)
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
    check_waits(self, c, io)
  end
end

-- Ops that never get a reply (so never answered with an error either).
local ONEWAY = { members_ok = true }

------------------------------------------------------------------------------
-- Public API.

-- R.new{ addr = "host:port", role = "nameserver"|"manager", ack_timeout = 2.0,
--        max_channels = 65536, max_name = 1024, settle = 3.0, recovering = false,
--        log = function(level, msg) }
-- settle: the recovery window (seconds); recovering: it opens at start (a
-- standalone name server, which may be a restarted one).
-- Raises on misuse (bad options); log levels are "debug", "info", "warn",
-- "error".
function M.new(opts)
  if type(opts) ~= "table" then error("lecho.registry.new: options table expected", 2) end
  if type(opts.addr) ~= "string" or opts.addr == "" then
    error("lecho.registry.new: 'addr' must be a non-empty string", 2)
  end
  if opts.role ~= "nameserver" and opts.role ~= "manager" then
    error("lecho.registry.new: 'role' must be \"nameserver\" or \"manager\"", 2)
  end
  local function num(k, dflt)
    local v = opts[k]
    if v == nil then return dflt end
    if type(v) ~= "number" or v < 0 then
      error(("lecho.registry.new: '%s' must be a non-negative number"):format(k), 3)
    end
    return v
  end
  if opts.log ~= nil and type(opts.log) ~= "function" then
    error("lecho.registry.new: 'log' must be a function", 2)
  end
  return setmetatable({
    addr = opts.addr,                     -- ro
    role = opts.role,                     -- ro
    ack_timeout = num("ack_timeout", 2.0),       -- rw, seconds
    settle = num("settle", 3.0),                 -- rw, seconds: recovery window
    max_channels = num("max_channels", 65536),   -- rw
    max_name = num("max_name", 1024),            -- rw, bytes
    log = opts.log or noop,
    channels = {}, nchannels = 0,         -- channel records this context manages
    assign = {}, nassigned = 0,           -- name server: ch -> manager addr
    managers = {},                        -- name server: addr -> { nch }
    seq = 0,                              -- source of channel versions
    mid = 0,                              -- source of members message ids
    outq = {}, flushing = false,
    recover_until = -math.huge,           -- name server: recovering until then
    recover_at_start = opts.recovering == true, -- the window opens at the first call
    orphans = {},                         -- name server: ch -> when its manager died
    lwaits = {},                          -- name server: lookups held while recovering
  }, Registry)
end

local function host_misuse(self, what)
  self.log("error", what)
  return nil, what
end

local function guarded(self, fn, ...)
  local ok, err = pcall(fn, ...)
  if not ok then self.log("error", "registry internal error: " .. tostring(err)) end
  return ok, err
end

-- reg:handle(from, msg, send, now): a decoded message `msg` arrived from
-- context `from`. Replies and `members` updates go out through `send` before
-- this returns (unless a send is already in progress up the stack: then they
-- are queued behind it). Returns true, or nil, err when the host itself
-- misused the call (from/msg/send/now of the wrong type); never raises.
function Registry:handle(from, msg, send, now)
  if type(send) ~= "function" then return host_misuse(self, "handle: send must be a function") end
  if type(from) ~= "string" or from == "" then return host_misuse(self, "handle: from must be a non-empty string") end
  if type(now) ~= "number" then return host_misuse(self, "handle: now must be a number") end
  if type(msg) ~= "table" then return host_misuse(self, "handle: msg must be a table") end
  local io = { send = send, now = now }
  local op, rid = msg.op, msg.rid
  if self.recover_at_start then
    self.recover_at_start = nil
    self.recover_until = now + self.settle
  end

  if op == "reply" then
    self.log("debug", "ignoring a reply from " .. from)
  elseif ONEWAY[op] then
    guarded(self, ops[op], self, from, msg, io)
  elseif rid == nil then
    self.log("warn", ("request '%s' from %s without rid: ignored"):format(tostring(op), from))
  elseif type(rid) ~= "number" then
    fail(self, io, from, rid, "field 'rid' must be a number")
  elseif type(op) ~= "string" then
    fail(self, io, from, rid, "field 'op' must be a string")
  elseif not ops[op] then
    fail(self, io, from, rid, ("unknown op '%s'"):format(op))
  else
    local ok, err = guarded(self, ops[op], self, from, msg, io)
    if not ok then fail(self, io, from, rid, op .. ": internal error: " .. tostring(err)) end
  end
  flush(self)
  return true
end

-- reg:peer_down(addr, send, now): the connection to `addr` is gone. Removes it
-- from every channel (both roles), publishes new consumer sets, stops waiting
-- for its confirmations, drops its own pending joins (no reply to the dead),
-- and, on a name server, forgets the channels assigned to it.
function Registry:peer_down(addr, send, now)
  if type(send) ~= "function" then return host_misuse(self, "peer_down: send must be a function") end
  if type(addr) ~= "string" then return host_misuse(self, "peer_down: addr must be a string") end
  local io = { send = send, now = now }
  guarded(self, function()
    for _, name in ipairs(sorted_keys(self.channels)) do
      local c = self.channels[name]
      local keep = {}
      for _, w in ipairs(c.waits) do
        if w.from ~= addr then keep[#keep + 1] = w end
      end
      c.waits = keep
      c.producers[addr] = nil
      if c.consumers[addr] then
        c.consumers[addr] = nil
        publish_members(self, c, io)
      end
      check_waits(self, c, io)
      maybe_drop(self, c)
    end
    if self.managers[addr] then
      self.managers[addr] = nil
      for ch, owner in pairs(self.assign) do
        if owner == addr then
          self.assign[ch] = nil
          self.nassigned = self.nassigned - 1
          self.orphans[ch] = now -- reassigned on its next lookup, recovering
        end
      end
      self.log("info", "manager down, its channels will be reassigned: " .. addr)
    end
  end)
  flush(self)
  return true
end

-- reg:tick(send, now): answer consumer joins whose deadline passed, with
-- `ok=true, late={producer addr...}` (the producing contexts that had not
-- confirmed). Cheap when nothing waits.
function Registry:tick(send, now)
  if type(send) ~= "function" then return host_misuse(self, "tick: send must be a function") end
  if type(now) ~= "number" then return host_misuse(self, "tick: now must be a number") end
  local io = { send = send, now = now }
  guarded(self, function()
    if self.lwaits[1] and self.lwaits[1].hold <= now then
      local held = self.lwaits
      self.lwaits = {}
      for _, w in ipairs(held) do
        w.msg.waited = true
        ops.lookup(self, w.from, w.msg, io)
      end
    end
    for _, c in pairs(self.channels) do
      if c.pwaits then
        local keep = {}
        for _, w in ipairs(c.pwaits) do
          local p = c.producers[w.from]
          if w.hold > now then
            keep[#keep + 1] = w
          elseif p then
            local plain, mods = members_of(c)
            p.acked = math.max(p.acked, c.ver)
            reply(self, io, w.from, w.rid, { consumers = plain, mods = mods, ver = c.ver, count = p.count })
          end
        end
        c.pwaits = keep[1] and keep or nil
      end
      if #c.waits > 0 then
        local keep = {}
        for _, w in ipairs(c.waits) do
          if w.hold <= now and all_acked(c, w.ver) then
            reply(self, io, w.from, w.rid, { ver = w.ver, count = w.count, errors = wait_errors(c, w),
                                             producers = sorted_keys(c.producers) })
          elseif w.deadline <= now then
            local late = {}
            for _, a in ipairs(sorted_keys(c.producers)) do
              if c.producers[a].acked < w.ver then late[#late + 1] = a end
            end
            self.log("warn", ("channel '%s': join of %s answered without confirmation from %s")
                             :format(c.name, w.from, table.concat(late, ", ")))
            reply(self, io, w.from, w.rid, { ver = w.ver, count = w.count, late = late,
                                             errors = wait_errors(c, w),
                                             producers = sorted_keys(c.producers) })
          else
            keep[#keep + 1] = w
          end
        end
        c.waits = keep
      end
    end
  end)
  flush(self)
  return true
end

-- reg:snapshot(): a fresh table (safe to keep or encode):
--   { addr = <own addr>, role = "nameserver"|"manager",
--     channels = {
--       [name] = { manager = <own addr>, ver = n,          -- managed here
--                  producers = { [addr] = count }, consumers = { [addr] = count },
--                  modulators = { [key] = { consumers = { addr... }, bytes, period, caps, params } },
--                  waiting = <consumer joins awaiting confirmation> },
--       [name] = { manager = <other addr> },               -- name server: assigned elsewhere
--     },
--     managers = { addr, ... } }                           -- registered managers, sorted
-- A name server also lists channels assigned to itself that have no member yet
-- (as { manager = <own addr> }).
function Registry:snapshot()
  local chans = {}
  for name, c in pairs(self.channels) do
    local ps, cs = {}, {}
    for a, p in pairs(c.producers) do ps[a] = p.count end
    for a, r in pairs(c.consumers) do cs[a] = r.count end
    local _, mods = members_of(c)
    local ms = {}
    for k, m in pairs(mods) do
      ms[k] = { consumers = m.dests, bytes = #m.src, period = m.period, caps = m.caps,
                params = m.params }
    end
    chans[name] = { manager = self.addr, ver = c.ver, producers = ps, consumers = cs,
                    modulators = ms, waiting = #c.waits }
  end
  for name, owner in pairs(self.assign) do
    if not chans[name] then chans[name] = { manager = owner } end
  end
  return { addr = self.addr, role = self.role, channels = chans, managers = sorted_keys(self.managers) }
end

return M
