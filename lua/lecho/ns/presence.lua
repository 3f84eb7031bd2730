-- lecho.ns.presence: the name server's part of the registry for groups with
-- leases (issue 12, doc/presence.md).  A member joins a group with a
-- lease and renews it by beacon (the same gjoin again); a member whose
-- lease runs out is removed in the registry tick, and the group's watchers
-- are told (gchange).  Soft state only: a restarted name server learns the
-- groups again from the beacons.
--
-- Ops (`function(self, from, msg, io)` on a registry, requests with a rid):
--   gjoin  { group, data, lease, watch = bool, ver =, epoch =, dv = }  the member is `from`:
--          creates or renews; watch: `from` is also a watcher, for as long;
--          dv: the version of data the member stamps (its wall clock when it
--          set it): an older dv renews the lease and keeps the newer data
--   gleave { group }                    `from` leaves (members and watchers)
--   glist  { group }                    -> members = { [addr] = { data, lease, left } }
--   gwatch { group, on = bool, lease, ver =, epoch = }  watch (renewed like a member) or stop
-- gjoin and gwatch answer { epoch, age, ver } and, when the asker watches and
-- its `epoch`/`ver` are not the group's, the members as glist does: a
-- watcher that missed a change (or whose name server restarted) catches up
-- at its next renewal.  A change is sent to every watcher as
--   gchange { group, epoch, ver, joined = { [addr] = data }, left = { [addr] = why } }
-- (why: "left", "expired"); `ver` counts the group's changes at this name
-- server (epoch: this name server's run), so a watcher sees a gap.
--
-- Bounds, each refused with its reason: group names (1 to 200 bytes of
-- A-Z a-z 0-9 . _ - /), data (4 KiB encoded, estimated), lease ([0.1, 3600] s),
-- members per group (max_members), member data per group (GROUP_BYTES),
-- groups (max_groups), and the entries (memberships and watches) one
-- requester may have (group_quota; a principal in keyed mode, else an address),
-- the memberships (max_memberships) and member data (max_group_bytes) in all.
-- Keyed mode: joining and leaving need the policy's `produce` on the group's
-- name, listing and watching `consume` (groups are named like channels).  A
-- membership or a watch is bound to the key (and principal) that made it:
-- another key at that address may not renew, replace or end it while its
-- lease runs; glist entries carry `principal`, gchange `who = { [addr] =
-- principal }` and `lease = { [addr] = seconds }` for those joined.

-- Never compiled, as lecho.ns.registry (Debian's LuaJIT and LuaJIT #827).
if jit then jit.off(true, true) end

local outbox = require "lecho.ns.outbox"
local naming = require "lecho.ns.naming"
local same = require("lecho.tables").same  -- (unchanged data is no news)

local emit, reply, fail = outbox.emit, outbox.reply, outbox.fail

local M = {}

M.MAX_DATA = 4096               -- bytes of one member's data (encoded, estimated)
M.GROUP_BYTES = 4 * 1024 * 1024 -- of all of one group's members' data (a glist reply stays far below a frame)
M.MIN_LEASE, M.MAX_LEASE = 0.1, 3600
M.MAX_GROUP_NAME = 200

-- The size of value v as the codec would write it, about (a tag and a
-- length per item): nil once it passes `limit` or nests deeper than 32.
local function value_bytes(v, limit)
  local n = 0
  local function walk(x, depth)
    if n > limit then return end
    local t = type(x)
    if t == "string" then
      n = n + 5 + #x
    elseif t == "table" then
      if depth > 32 then n = limit + 1 return end
      n = n + 5
      for k, val in pairs(x) do
        walk(k, depth + 1)
        walk(val, depth + 1)
        if n > limit then return end
      end
    else
      n = n + 9
    end
  end
  walk(v, 1)
  if n > limit then return nil end
  return n
end
M.value_bytes = value_bytes

local function check_group(self, msg)
  local g = msg.group
  if type(g) ~= "string" or g == "" or #g > M.MAX_GROUP_NAME or g:find("[^%w%._/%-]") or g:byte(1) == 47 then
    return nil, ("%s: field 'group' must be 1 to %d bytes of A-Z a-z 0-9 . _ - / (not first)")
                :format(tostring(msg.op), M.MAX_GROUP_NAME), "invalid"
  end
  if self.role ~= "nameserver" then
    return nil, ("%s: this context is a channel manager, not a name server"):format(msg.op), "refused"
  end
  return g
end

local function check_lease(msg)
  local l = msg.lease
  if type(l) ~= "number" or not (l >= M.MIN_LEASE and l <= M.MAX_LEASE) then
    return nil, ("%s: field 'lease' must be a number of seconds from %g to %g")
                :format(msg.op, M.MIN_LEASE, M.MAX_LEASE)
  end
  return l
end

-- This name server's run, told with every answer: a watcher that sees it
-- change knows the name server restarted (its versions start again).
local function epoch(self, now)
  if not self.gepoch then
    -- (the wall clock's second, this run's heap and CPU time: a restart
    -- within the same second differs too)
    self.gepoch = ("%s@%d/%s/%.6f"):format(self.addr, os.time(), tostring({}):match("%x+$") or "", os.clock())
    self.gstart = now
  end
  return self.gepoch
end


-- The deadlines: one binary min-heap (self.gheap) of every membership and
-- watch by `expires`, each entry holding its index (hi), its group (g), its
-- address (addr) and whether it is a watch: a tick costs what expires, not
-- what is held (1 M memberships scanned each tick stalled the name server).
local floor = math.floor

local function hswap(h, i, j)
  h[i], h[j] = h[j], h[i]
  h[i].hi, h[j].hi = i, j
end

local function hup(h, i)
  while i > 1 do
    local p = floor(i / 2)
    if h[p].expires <= h[i].expires then return end
    hswap(h, i, p)
    i = p
  end
end

local function hdown(h, i)
  local n = #h
  while true do
    local c = 2 * i
    if c > n then return end
    if c < n and h[c + 1].expires < h[c].expires then c = c + 1 end
    if h[i].expires <= h[c].expires then return end
    hswap(h, i, c)
    i = c
  end
end

-- Entry e (in the heap or not) expires at t.
local function hset(h, e, t)
  local old = e.expires
  e.expires = t
  if e.hi then
    if t < old then hup(h, e.hi) else hdown(h, e.hi) end
  else
    local n = #h + 1
    h[n], e.hi = e, n
    hup(h, n)
  end
end

local function hremove(h, e)
  local i = e.hi
  if not i then return end
  e.hi = nil
  local n = #h
  local last = h[n]
  h[n] = nil
  if i == n then return end
  h[i], last.hi = last, i
  hup(h, i)
  hdown(h, last.hi)
end
M._heap = { set = hset, remove = hremove }   -- (for the specs)

-- Room for one more entry (a membership or a watch) of requester `who`?
local function quota_room(self, who)
  if (self.gcount[who] or 0) >= self.group_quota then
    return nil, ("too many groups joined or watched by %s (limit %d per requester)"):format(who, self.group_quota)
  end
  return true
end

-- Entries (memberships and watches) of requester `who`.
local function charge(self, who, d)
  local n = (self.gcount[who] or 0) + d
  self.gcount[who] = n > 0 and n or nil
end

local function get_group(self, name, create, op)
  local g = self.groups[name]
  if g or not create then return g end
  if self.ngroups >= self.max_groups then
    return nil, ("%s: too many groups (limit %d)"):format(op, self.max_groups)
  end
  g = { name = name, members = {}, n = 0, bytes = 0, watchers = {}, ver = 0 }
  self.groups[name] = g
  self.ngroups = self.ngroups + 1
  return g
end

local function maybe_drop(self, g)
  if g.n == 0 and next(g.watchers) == nil and self.groups[g.name] == g then
    self.groups[g.name] = nil
    self.ngroups = self.ngroups - 1
  end
end

local function member_list(g, now)
  local out = {}
  for a, m in pairs(g.members) do
    -- (one whose lease ran out is not listed, though the tick has not
    -- removed it yet: a name server resumed after a stop answers the
    -- requests that waited before its tick runs)
    if m.expires > now then
      out[a] = { data = m.data, lease = m.lease, left = m.expires - now, principal = m.principal, dv = m.dv }
    end
  end
  return out
end

-- Keyed mode: the principal and public key of `from`'s connection (nil, nil
-- in protected mode).  A membership (and a watch) is bound to the key that
-- made it: another key claiming the same address (after a name server
-- restart, any trusted key may take a disconnected address) may neither
-- renew, replace nor end it while its lease runs.
local function ident(self, from)
  if not self.identity then return nil, nil end
  return self.identity(from)
end

-- nil when `pk` may act on entry e (a member or a watch); else why not.
local function foreign(self, e, pk, from, name, op)
  if not e or not self.identity or e.key == pk then return nil end
  return ("%s: address %s is in group '%s' under another key (principal %s) until its lease runs out (%.1fs)")
         :format(op, from, name, tostring(e.principal), math.max(e.expires - (self.gnow or 0), 0))
end

-- Tells every watcher of g one change (joined / left: { [addr] = ... }).
local function changed(self, io, g, joined, left)
  g.ver = g.ver + 1
  local ep = epoch(self, io.now)
  -- joined members' leases (a watcher times a member it learnt of here by
  -- the member's own lease) and, keyed, their principals
  local lease, who, dv
  if joined then
    lease = {}
    for a in pairs(joined) do
      local m = g.members[a]
      if m then
        lease[a] = m.lease
        if m.dv then dv = dv or {}; dv[a] = m.dv end
        if m.principal then who = who or {}; who[a] = m.principal end
      end
    end
  end
  for a in pairs(g.watchers) do
    emit(self, io, a, { op = "gchange", group = g.name, epoch = ep, ver = g.ver, joined = joined, left = left,
                        lease = lease, who = who, dv = dv })
  end
end

local function set_watch(self, g, from, who, lease, now, op)
  local w = g.watchers[from]
  local principal, pk = ident(self, from)
  local bad = foreign(self, w, pk, from, g.name, op)
  if bad then return nil, bad, "refused" end
  if not w then
    local ok, err = quota_room(self, who)
    if not ok then return nil, err end
    charge(self, who, 1)
    w = { who = who, key = pk, principal = principal, g = g, addr = from, watch = true }
    g.watchers[from] = w
  end
  hset(self.gheap, w, now + lease)
  return true
end

local function drop_watch(self, g, from)
  local w = g.watchers[from]
  if w then
    g.watchers[from] = nil
    hremove(self.gheap, w)
    charge(self, w.who, -1)
  end
end

-- The answer to a renewal: the group's version, and its members when the
-- asker watches and has not seen this version of this run.
local function renewal(self, io, from, msg, g, watch)
  local ep = epoch(self, io.now)
  local r = { epoch = ep, age = io.now - self.gstart, ver = g and g.ver or 0 }
  if watch and (msg.epoch ~= ep or msg.ver ~= r.ver) then r.members = g and member_list(g, io.now) or {} end
  reply(self, io, from, msg.rid, r)
end

local ops = {}

function ops.gjoin(self, from, msg, io)
  local name, err, ecode = check_group(self, msg)
  if not name then return fail(self, io, from, msg.rid, err, ecode) end
  local lease; lease, err = check_lease(msg)
  if not lease then return fail(self, io, from, msg.rid, err, "invalid") end
  local ok; ok, err = naming.allowed(self, from, "produce", name)
  if ok and msg.watch == true then ok, err = naming.allowed(self, from, "consume", name) end  -- (watching too)
  if not ok then return fail(self, io, from, msg.rid, "gjoin: " .. err, "refused") end
  local data = msg.data
  if data == nil then data = {} end
  local dv = msg.dv
  if type(dv) ~= "number" or dv ~= dv then dv = nil end
  local size = value_bytes(data, M.MAX_DATA)
  if not size then
    return fail(self, io, from, msg.rid, ("gjoin: data larger than %d bytes encoded (or nested deeper than 32)")
                                          :format(M.MAX_DATA), "limit")
  end
  local who = naming.requester(self, from)
  local g = self.groups[name]
  local m = g and g.members[from]
  local principal, pk = ident(self, from)
  self.gnow = io.now
  local bad = foreign(self, m, pk, from, name, "gjoin")
  if bad then return fail(self, io, from, msg.rid, bad, "refused") end
  if not m then
    if g and g.n >= self.max_members then
      return fail(self, io, from, msg.rid, ("gjoin: group '%s' has %d members (limit %d)")
                                            :format(name, g.n, self.max_members), "limit")
    end
    ok, err = quota_room(self, who)
    if not ok then return fail(self, io, from, msg.rid, err, "limit") end
    if self.nmemberships >= self.max_memberships then
      return fail(self, io, from, msg.rid, ("gjoin: too many memberships at this name server (limit %d)")
                                            :format(self.max_memberships), "limit")
    end
  end
  if self.gbytes - (m and m.size or 0) + size > self.max_group_bytes then
    return fail(self, io, from, msg.rid, ("gjoin: this name server holds %d bytes of member data (limit %d)")
                                          :format(self.gbytes, self.max_group_bytes), "limit")
  end
  if (g and g.bytes or 0) - (m and m.size or 0) + size > M.GROUP_BYTES then
    return fail(self, io, from, msg.rid, ("gjoin: group '%s' holds %d bytes of member data (limit %d)")
                                          :format(name, g.bytes, M.GROUP_BYTES), "limit")
  end
  if not g then
    g, err = get_group(self, name, true, "gjoin")
    if not g then return fail(self, io, from, msg.rid, err, "limit") end
  end
  local expires = io.now + lease
  local news = false
  if not m then
    m = { who = who, key = pk, principal = principal, g = g, addr = from }
    g.members[from] = m
    g.n = g.n + 1
    self.nmemberships = self.nmemberships + 1
    charge(self, who, 1)
    news = true
    self.log("info", ("group '%s': %s joined"):format(name, from))
  elseif m.dv and dv and dv < m.dv then
    -- a beacon older than the data held (it waited in a stopped name
    -- server's socket): renews the lease, never brings back older data
    data, size, dv = m.data, m.size, m.dv
  elseif m.data ~= data and not same(m.data, data) then
    news = true     -- the same member with other data: told as joined again
  end
  g.bytes = g.bytes - (m.size or 0) + size
  self.gbytes = self.gbytes - (m.size or 0) + size
  m.data, m.size, m.lease, m.dv = data, size, lease, dv
  hset(self.gheap, m, expires)
  if msg.watch == true then
    local wcode
    ok, err, wcode = set_watch(self, g, from, who, lease, io.now, "gjoin")
    if not ok then
      if news then changed(self, io, g, { [from] = data }, nil) end
      return fail(self, io, from, msg.rid, err, wcode or "limit")
    end
  elseif msg.watch == false and not foreign(self, g.watchers[from], pk, from, name, "gjoin") then
    drop_watch(self, g, from)
  end
  if news then changed(self, io, g, { [from] = data }, nil) end
  -- (the reply is queued after the gchange: the joiner's own gchange, if it
  -- watches, comes first and its ver is the reply's; either order converges)
  renewal(self, io, from, msg, g, msg.watch == true)
end

-- The group request msg (op) names, checked, when from holds right
-- ("produce" or "consume") on it; else nil, the failure answered.
local function group_allowed(self, from, msg, io, op, right)
  local name, err, ecode = check_group(self, msg)
  if not name then
    fail(self, io, from, msg.rid, err, ecode)
    return nil
  end
  local ok; ok, err = naming.allowed(self, from, right, name)
  if not ok then
    fail(self, io, from, msg.rid, op .. ": " .. err, "refused")
    return nil
  end
  return name
end

function ops.gleave(self, from, msg, io)
  -- (leaving needs the right joining needs: produce)
  local name = group_allowed(self, from, msg, io, "gleave", "produce")
  if not name then return end
  local g = self.groups[name]
  local m = g and g.members[from]
  local _, pk = ident(self, from)
  self.gnow = io.now
  local bad = foreign(self, m, pk, from, name, "gleave") or foreign(self, g and g.watchers[from], pk, from, name, "gleave")
  if bad then return fail(self, io, from, msg.rid, bad, "refused") end
  if m then
    g.members[from] = nil
    hremove(self.gheap, m)
    g.n, g.bytes = g.n - 1, g.bytes - m.size
    self.nmemberships, self.gbytes = self.nmemberships - 1, self.gbytes - m.size
    charge(self, m.who, -1)
    self.log("info", ("group '%s': %s left"):format(name, from))
    changed(self, io, g, nil, { [from] = "left" })
  end
  if g then
    drop_watch(self, g, from)
    maybe_drop(self, g)
  end
  reply(self, io, from, msg.rid, { was = m ~= nil })
end

function ops.glist(self, from, msg, io)
  local name = group_allowed(self, from, msg, io, "glist", "consume")
  if not name then return end
  local g = self.groups[name]
  local ep = epoch(self, io.now)
  reply(self, io, from, msg.rid, { members = g and member_list(g, io.now) or {}, epoch = ep,
                                   age = io.now - self.gstart, ver = g and g.ver or 0 })
end

function ops.gwatch(self, from, msg, io)
  local name, err, ecode = check_group(self, msg)
  if not name then return fail(self, io, from, msg.rid, err, ecode) end
  if type(msg.on) ~= "boolean" then return fail(self, io, from, msg.rid, "gwatch: field 'on' must be a boolean", "invalid") end
  local g = self.groups[name]
  if not msg.on then
    local _, pk = ident(self, from)
    self.gnow = io.now
    local bad = foreign(self, g and g.watchers[from], pk, from, name, "gwatch")
    if bad then return fail(self, io, from, msg.rid, bad, "refused") end
    if g then
      drop_watch(self, g, from)
      maybe_drop(self, g)
    end
    return reply(self, io, from, msg.rid, {})
  end
  local lease; lease, err = check_lease(msg)
  if not lease then return fail(self, io, from, msg.rid, err, "invalid") end
  local ok; ok, err = naming.allowed(self, from, "consume", name)
  if not ok then return fail(self, io, from, msg.rid, "gwatch: " .. err, "refused") end
  local who = naming.requester(self, from)
  if not g then
    g, err = get_group(self, name, true, "gwatch")
    if not g then return fail(self, io, from, msg.rid, err, "limit") end
  end
  self.gnow = io.now
  local wcode
  ok, err, wcode = set_watch(self, g, from, who, lease, io.now, "gwatch")
  if not ok then
    maybe_drop(self, g)
    return fail(self, io, from, msg.rid, err, wcode or "limit")
  end
  renewal(self, io, from, msg, g, true)
end

-- From the registry tick: members and watchers whose lease ran out go;
-- the watchers are told which members expired, one gchange per group.
-- Costs what expires (the deadline heap), nothing while nothing is due.
function M.tick(self, io)
  local now, h = io.now, self.gheap
  local e = h[1]
  if not e or e.expires > now then return end
  local gone = {}            -- group -> { [addr] = "expired" }
  local touched = {}
  while e and e.expires <= now do
    hremove(h, e)
    local g = e.g
    touched[g] = true
    if e.watch then
      if g.watchers[e.addr] == e then g.watchers[e.addr] = nil end
      charge(self, e.who, -1)
    elseif g.members[e.addr] == e then
      g.members[e.addr] = nil
      g.n, g.bytes = g.n - 1, g.bytes - e.size
      self.nmemberships, self.gbytes = self.nmemberships - 1, self.gbytes - e.size
      charge(self, e.who, -1)
      gone[g] = gone[g] or {}
      gone[g][e.addr] = "expired"
      self.log("info", ("group '%s': %s expired (no beacon for %gs)"):format(g.name, e.addr, e.lease))
    end
    e = h[1]
  end
  for g, left in pairs(gone) do changed(self, io, g, nil, left) end
  for g in pairs(touched) do maybe_drop(self, g) end
end

-- The connection to `addr` is gone: it watches nothing any more (a
-- member stays until its lease runs out: a lost connection is not proof
-- of death, and a beacon may come through the next one).
function M.peer_down(self, addr)
  for _, g in pairs(self.groups) do
    drop_watch(self, g, addr)
    maybe_drop(self, g)
  end
end

-- The registry's fields for groups (lecho.ns.registry.new).
function M.init(self, opts, num)
  self.groups, self.ngroups = {}, 0
  self.gcount = {}                                   -- requester -> entries
  self.gheap = {}                                    -- memberships and watches by expiry (hset)
  self.max_groups = num("max_groups", 65536)         -- rw
  self.group_quota = num("group_quota", 1024)        -- rw: entries one requester may have
  self.max_memberships = num("max_memberships", 262144)          -- rw: memberships held in all
  self.max_group_bytes = num("max_group_bytes", 256 * 1024 * 1024) -- rw: member data held in all (estimated)
  self.nmemberships, self.gbytes = 0, 0
end

M.ops = ops

return M
