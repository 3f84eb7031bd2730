-- lecho.ns.registry: the control plane of the name server and of channel
-- managers, as a transport-free state machine (pure Lua 5.1 / LuaJIT, no I/O).
--
-- The host owns the sockets and the clock. It decodes a control message into
-- a plain Lua table and calls `reg:handle(from, msg, send, now)`; it reports
-- lost connections with `reg:peer_down(addr, send, now)` and calls
-- `reg:tick(send, now)` periodically (~0.1 s); keyed, a new policy comes with
-- `reg:set_policy(pol, send, now)` (members checked again). Everything this module says to
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
--
-- The name server's part is in lecho.ns.naming, the channel managers' in
-- lecho.ns.membership, the output queue in lecho.ns.outbox.
--
-- Never compiled: Debian's LuaJIT (2.1.0-beta3, git 2022-03-20) predates
-- the upstream fix of a JIT bug that ends a `pairs` loop early once it is
-- blacklisted and patched (LuaJIT issue #827); membership must not skip a
-- consumer, and none of this is hot.
if jit then jit.off(true, true) end

local M = {}

local Registry = {}
Registry.__index = Registry

local function noop() end

local outbox = require "lecho.ns.outbox"
local naming = require "lecho.ns.naming"
local membership = require "lecho.ns.membership"
local presence = require "lecho.ns.presence"
local policy = require "lecho.policy"

local sorted_keys = require("lecho.tables").sorted_keys
local reply, fail, flush = outbox.reply, outbox.fail, outbox.flush
local members_of, publish_members, check_waits, maybe_drop, answer_producer =
  membership.members_of, membership.publish_members, membership.check_waits,
  membership.maybe_drop, membership.answer_producer

-- Operations. Each is `function(self, from, msg, io)`; `msg.rid` is a number
-- for requests (checked by the dispatcher).
local ops = {}
for k, f in pairs(naming.ops) do ops[k] = f end
for k, f in pairs(membership.ops) do ops[k] = f end
for k, f in pairs(presence.ops) do ops[k] = f end
for k, f in pairs(require("lecho.ns.may").ops) do ops[k] = f end  -- may (stats in keyed mode)

-- What one `list` reply carries at most: channels, and bytes (estimated:
-- names, addresses, 16 per field), far below the receiver's 16 MiB CTRL
-- frame and its max_value_bytes, so that every asker gets an answer.
M.LIST_MAX, M.LIST_BYTES = 4096, 4 * 1024 * 1024

local function entry_bytes(name, e)
  local n = #name + 64
  for _, set in ipairs{ e.producers, e.consumers } do
    for a in pairs(set or {}) do n = n + #a + 16 end
  end
  for k, m in pairs(e.modulators or {}) do
    n = n + #k + 48
    for _, a in ipairs(m.consumers or {}) do n = n + #a + 16 end
  end
  return n
end

-- Introspection over the wire: same shape as snapshot() minus addr/role.
-- Keyed mode: only the channels the asker may list (refused when none).
-- The first channels by name up to LIST_MAX / LIST_BYTES; `truncated` says
-- how many more there are.
function ops.list(self, from, msg, io)
  local ok, err = naming.allowed(self, from, "list")
  if not ok then return fail(self, io, from, msg.rid, err, "refused") end
  local s = self:snapshot()
  local names = {}
  for name in pairs(s.channels) do
    if naming.allowed(self, from, "list", name) then names[#names + 1] = name end
  end
  table.sort(names)
  local chans, bytes, n = {}, 0, 0
  for _, name in ipairs(names) do
    local e = s.channels[name]
    local b = entry_bytes(name, e)
    if n >= M.LIST_MAX or bytes + b > M.LIST_BYTES then break end
    chans[name], bytes, n = e, bytes + b, n + 1
  end
  reply(self, io, from, msg.rid, { channels = chans, managers = s.managers,
                                   truncated = #names > n and #names - n or nil })
end

-- Ops that never get a reply (so never answered with an error either).
local ONEWAY = { members_ok = true, release = true, unreachable = true }

------------------------------------------------------------------------------
-- Public API.

-- R.new{ addr = "host:port", role = "nameserver"|"manager", ack_timeout = 2.0,
--        max_channels = 65536, channel_quota = 4096, max_name = 1024,
--        max_members = 4096,
--        settle = 3.0, recovering = false,
--        forget_after = 30, nameserver = "host:port" (manager),
--        max_groups = 65536, group_quota = 1024,
--        max_memberships = 262144, max_group_bytes = 256 MiB,
--        log = function(level, msg) }
-- channel_quota: the channel entries one requester (a context's address, or
-- its principal in keyed mode) may make at the name server by lookups and
-- joins, until another requester joins them or they are forgotten
-- (forget_after); past it a lookup or a join fails with code "limit".  max_members: consumer contexts of one channel (what
-- a producer takes in one member list); the join of one more fails with
-- code "limit".  max_groups, group_quota: groups with leases
-- (lecho.ns.presence): groups this name server holds, and the memberships and
-- watches one requester may have; max_memberships, max_group_bytes: the
-- memberships and the bytes of member data this name server holds in all
-- (claimed addresses evade group_quota in protected mode: not these).
-- Keyed mode (doc/security.md): identity = fn(addr) -> principal, pk (32
-- raw bytes) of an authenticated peer (this context's own for `addr`), nil
-- in protected mode; policy = a lecho.policy, its rules table or a policy
-- file's name (raises with the file's error when malformed; nil: every
-- trusted principal may do everything); sign = fn(msg) -> 64-byte signature with this
-- context's identity (producer tickets).
-- settle: the recovery window (seconds); recovering: it opens at start (a
-- standalone name server, which may be a restarted one); forget_after: a
-- name server forgets a channel it manages itself once it has had no
-- producer, no consumer and no lookup for that long (checked once a second);
-- a manager given its name server's address tells it of its own such
-- channels, and the name server forgets them the same way.
-- Raises on misuse (bad options); log levels are "debug", "info", "warn",
-- "error".
function M.new(opts)
  if type(opts) ~= "table" then error("lecho.ns.registry.new: options table expected", 2) end
  if type(opts.addr) ~= "string" or opts.addr == "" then
    error("lecho.ns.registry.new: 'addr' must be a non-empty string", 2)
  end
  if opts.role ~= "nameserver" and opts.role ~= "manager" then
    error("lecho.ns.registry.new: 'role' must be \"nameserver\" or \"manager\"", 2)
  end
  local function num(k, dflt)
    local v = opts[k]
    if v == nil then return dflt end
    if type(v) ~= "number" or v < 0 then
      error(("lecho.ns.registry.new: '%s' must be a non-negative number"):format(k), 3)
    end
    return v
  end
  if opts.nameserver ~= nil and type(opts.nameserver) ~= "string" then
    error("lecho.ns.registry.new: 'nameserver' must be a \"host:port\" string", 2)
  end
  for _, k in ipairs{ "identity", "sign" } do
    if opts[k] ~= nil and type(opts[k]) ~= "function" then
      error(("lecho.ns.registry.new: '%s' must be a function"):format(k), 2)
    end
  end
  local pol = opts.policy
  if type(pol) == "string" or (type(pol) == "table" and getmetatable(pol) == nil) then
    -- a file (lecho-nameserver --policy) or the rules themselves
    local perr
    if type(pol) == "string" then pol, perr = policy.load(pol) else pol, perr = policy.new(pol) end
    if not pol then error(perr, 2) end
  elseif pol ~= nil and (type(pol) ~= "table" or type(pol.check) ~= "function") then
    error("lecho.ns.registry.new: 'policy' must be a file name, a policy table or a lecho.policy", 2)
  end
  if opts.log ~= nil and type(opts.log) ~= "function" then
    error("lecho.ns.registry.new: 'log' must be a function", 2)
  end
  local self = setmetatable({
    addr = opts.addr,                     -- ro
    role = opts.role,                     -- ro
    ack_timeout = num("ack_timeout", 2.0),       -- rw, seconds
    settle = num("settle", 3.0),                 -- rw, seconds: recovery window
    max_channels = num("max_channels", 65536),   -- rw
    max_members = num("max_members", 4096),      -- rw: consumer contexts per channel
    channel_quota = num("channel_quota", 4096),  -- rw: entries one requester's lookups and joins may make
    max_name = num("max_name", 1024),            -- rw, bytes
    forget_after = num("forget_after", 30),      -- rw, seconds: name server, unused channels
    log = opts.log or noop,
    channels = {}, nchannels = 0,         -- channel records this context manages
    assign = {}, nassigned = 0,           -- name server: ch -> manager addr
    managers = {},                        -- name server: addr -> { nch }
    seq = 0,                              -- source of channel versions
    mid = 0,                              -- source of members message ids
    outq = {}, flushing = false,
    due = {},                             -- channel records with pending joins (waits, pwaits) -> true
    tick_visits = 0,                      -- channel records the ticks have visited (introspection)
    recover_until = -math.huge,           -- name server: recovering until then
    recover_at_start = opts.recovering == true, -- the window opens at the first call
    born = math.huge,                     -- the time of the first call (handle or tick): the start
    orphans = {},                         -- name server: ch -> when its manager died
    lwaits = {},                          -- name server: lookups held while recovering
    used = {}, forget_at = -math.huge,    -- name server: ch -> last time it was in use
    fheap = {}, fqueued = {},             -- name server: channels to check for forgetting (lecho.ns.naming)
    forget_visits = 0,                    -- name server: channels those checks visited (introspection)
    idle_remote = {},                     -- name server: ch -> its manager said unused
    nameserver = opts.nameserver,         -- manager: its name server's addr (release)
    idle = {},                            -- manager: ch -> since when it has no record
    created = {}, creator = {},           -- name server: requester -> entries made, ch -> requester
    lheld = {},                           -- name server: requester -> lookups held while recovering
    identity = opts.identity,             -- keyed mode: fn(addr) -> principal, pk
    policy = pol,                         -- rw, keyed mode: a lecho.policy (a manager's comes from its name server)
    sign = opts.sign,                     -- keyed mode: fn(msg) -> signature (producer tickets)
    ticket_ttl = opts.ticket_ttl or 3600, -- keyed: seconds a producer ticket is valid
    renewals = {}, rhead = 1, rtail = 0,  -- keyed: { at, c, addr, serial } in order of at, [rhead, rtail]
    clock = opts.clock or os.time,        -- wall clock (tickets' expiry: the consumers' clocks)
  }, Registry)
  presence.init(self, opts, num)          -- name server: groups with leases (lecho.ns.presence)
  return self
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
  if self.born == math.huge then self.born = now end
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
    fail(self, io, from, rid, "field 'rid' must be a number", "invalid")
  elseif type(op) ~= "string" then
    fail(self, io, from, rid, "field 'op' must be a string", "invalid")
  elseif not ops[op] then
    fail(self, io, from, rid, ("unknown op '%s'"):format(op), "invalid")
  else
    local ok, err = guarded(self, ops[op], self, from, msg, io)
    if not ok then fail(self, io, from, rid, op .. ": internal error: " .. tostring(err), "failed") end
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
        c.nconsumers = c.nconsumers - 1
        publish_members(self, c, io)
      end
      check_waits(self, c, io)
      maybe_drop(self, c, now)
    end
    presence.peer_down(self, addr)
    if self.managers[addr] then
      self.managers[addr] = nil
      for ch, owner in pairs(self.assign) do
        if owner == addr then
          self.assign[ch], self.used[ch], self.idle_remote[ch] = nil, nil, nil
          self.nassigned = self.nassigned - 1
          naming.uncharge(self, ch)
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
  if self.born == math.huge then self.born = now end
  guarded(self, function()
    if self.role == "nameserver" then
      naming.forget_unused(self, now)
      presence.tick(self, io)
    elseif self.nameserver then
      naming.release_unused(self, now, io)
    end
    if self.lwaits[1] and self.lwaits[1].hold <= now then
      local held = self.lwaits
      self.lwaits = {}
      for _, w in ipairs(held) do
        if w.who then naming.unhold(self, w) end
        w.msg.waited = true
        ops.lookup(self, w.from, w.msg, io)
      end
    end
    -- Tickets due for renewal: a queue in time order, the head only.
    membership.renew_tickets(self, io)
    -- Only the channels with a pending join (self.due), not every channel:
    -- a tick costs what is waiting, however many channels there are.
    local due = {}
    for c in pairs(self.due) do due[#due + 1] = c end
    for _, c in ipairs(due) do
      self.tick_visits = self.tick_visits + 1
      if self.channels[c.name] ~= c then c.pwaits = nil end   -- dropped: nothing to answer
      if c.pwaits then
        local keep = {}
        for _, w in ipairs(c.pwaits) do
          local p = c.producers[w.from]
          if w.hold > now then
            keep[#keep + 1] = w
          elseif p then
            p.acked = math.max(p.acked, c.ver)
            answer_producer(self, io, c, w.from, w.rid, p)
          end
        end
        c.pwaits = keep[1] and keep or nil
      end
      if #c.waits > 0 and self.channels[c.name] == c then check_waits(self, c, io) end
      if not c.pwaits and (#c.waits == 0 or self.channels[c.name] ~= c) then self.due[c] = nil end
    end
  end)
  flush(self)
  return true
end

-- reg:set_policy(pol, send, now): keyed mode: `pol` (a lecho.policy, or
-- nil: none) replaces the policy, and every member of every channel here
-- is checked against it again (membership.recheck): what it no longer
-- grants is withdrawn now, not at the next join.  Never raises.
function Registry:set_policy(pol, send, now)
  if type(send) ~= "function" then return host_misuse(self, "set_policy: send must be a function") end
  if type(now) ~= "number" then return host_misuse(self, "set_policy: now must be a number") end
  self.policy = pol
  local io = { send = send, now = now }
  guarded(self, membership.recheck, self, io)
  flush(self)
  return true
end

-- reg:snapshot(): a fresh table (safe to keep or encode):
--   { addr = <own addr>, role = "nameserver"|"manager",
--     channels = {
--       [name] = { manager = <own addr>, ver = n,          -- managed here
--                  producers = { [addr] = count }, consumers = { [addr] = count },
--                  modulators = { [key] = { consumers = { addr... }, period, caps } },
--                  waiting = <consumer joins awaiting confirmation> },
--       [name] = { manager = <other addr> },               -- name server: assigned elsewhere
--     },
--     managers = { addr, ... } }                           -- registered managers, sorted
-- A name server also lists channels assigned to itself that have no member yet
-- (as { manager = <own addr> }).  A modulator's source and params never
-- appear: they are its owner's (an API token in params, say), seen only by
-- the producers that run it (in their join reply and member lists); `list`
-- hands this table to anyone who asks.
function Registry:snapshot()
  local chans = {}
  for name, c in pairs(self.channels) do
    local ps, cs = {}, {}
    for a, p in pairs(c.producers) do ps[a] = p.count end
    for a, r in pairs(c.consumers) do cs[a] = r.count end
    local _, mods = members_of(c)
    local ms = {}
    for k, m in pairs(mods) do
      ms[k] = { consumers = m.dests, period = m.period, caps = m.caps }
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
