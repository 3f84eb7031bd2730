-- lecho.group: the client of groups with leases (issue 12, doc/presence.md);
-- the name server's side is lecho.ns.presence.
--
--   local g = ctx:group("chat", { lease = 3, data = { nick = "ann" },
--                                 watch = function(change) end, join = true })
--   g:members()   -- { [addr] = data }: the union of the name servers that answer
--   g:set_data(d) -- this member's data, told to the watchers as joined again
--   g:leave()
--
-- A group registers with every name server of ctx.nslist and renews there
-- every lease/3 (the beacon: gjoin again; a watcher that is not a member
-- renews its gwatch the same way).  The watch callback gets { joined =
-- { [addr] = data }, left = { [addr] = why } }, deduplicated across the name
-- servers: a member is online while any name server that answers lists it.
-- Each name server's view is kept here (its list at the last renewal that
-- brought one, then its gchange notices in order; a gap or a restart, seen
-- by its epoch, brings the whole list again at the next renewal).  After a
-- name server restarted, a member it listed before and does not list yet
-- stays counted for it until that member's lease has passed since the
-- restart (its beacon re-registers it before): no false "left".

local options = require "lecho.options"
local errors = require "lecho.errors"
local Context = require "lecho.context"
local same = require("lecho.tables").same  -- (a member's unchanged data is no news)
-- Loops over keys as `in each(t)`, never `in pairs(t)`: no ITERN loop, which
-- Debian's LuaJIT may never end in the close at the program's end (context.lua).
local each = pairs

local Group = {}
Group.__index = Group

local MAX_ADDR = 127
local RETRY = 0.5      -- seconds between renewals at a name server that did not answer
local MERGE_WINDOW = 0.2   -- members(): how long the others may answer after the first

local function now(ctx) return ctx.c:now() end

-- A member list from a name server (glist, or a renewal's answer): the
-- view { [addr] = { data, lease } }, or nil when malformed.
local function parse_members(t, limit)
  if type(t) ~= "table" then return nil end
  local view, n = {}, 0
  for a, m in each(t) do
    n = n + 1
    if n > limit or type(a) ~= "string" or a == "" or #a > MAX_ADDR or type(m) ~= "table" then return nil end
    local lease = m.lease
    if type(lease) ~= "number" or not (lease > 0 and lease <= 3600) then lease = nil end
    local principal = m.principal
    if type(principal) ~= "string" then principal = nil end
    local dv = m.dv
    if type(dv) ~= "number" or dv ~= dv then dv = nil end
    view[a] = { data = m.data, lease = lease, principal = principal, dv = dv }
  end
  return view
end

-- Sends msg_of(addr) to every name server of ctx.nslist at once and waits
-- (up to ctx.timeout) until enough(results) or every one answered or
-- failed.  results[i]: { addr, r } or { addr, nil, err, code } in nslist
-- order (nil: no answer yet).
local function ask_all(ctx, msg_of, enough, window)
  local sent, results = {}, {}
  local function collect()
    for i, q in ipairs(sent) do
      if not results[i] then
        local p = q.p
        if p.reply and p.reply.ok then
          results[i] = { q.addr, p.reply }
        elseif p.reply then
          results[i] = { q.addr, nil, p.reply.err or "refused", errors.peer_code(p.reply.code) }
        elseif p.failed then
          results[i] = { q.addr, nil, ("%s unreachable: %s"):format(q.addr, p.failed), "closed" }
        end
      end
    end
  end
  for i, addr in ipairs(ctx.nslist) do
    local msg = msg_of(addr)
    local rid, p = ctx:_pend(addr)   -- its reply only from addr's connection (lecho.control)
    msg.rid = rid
    sent[i] = { rid = rid, addr = addr, p = p }
    ctx:_send_ctrl(addr, msg)
  end
  local function all()
    if ctx.closed then return true end
    collect()
    for i = 1, #sent do
      if not results[i] then return false end
    end
    return true
  end
  local deadline = now(ctx) + ctx.timeout
  ctx:_wait(function() return all() or (enough ~= nil and enough(results)) end, deadline)
  -- enough: the others still get `window` seconds (within the timeout)
  if window and not all() then ctx:_wait(all, math.min(now(ctx) + window, deadline)) end
  collect()
  for i, q in ipairs(sent) do
    ctx.pending[q.rid] = nil
    results[i] = results[i] or { q.addr, nil, ("no answer from %s within %gs"):format(q.addr, ctx.timeout), "timeout" }
  end
  return results
end

-- The changes since what the callback was last told: delivered in order,
-- one at a time, each in a coroutine of the context's (it may wait).
local function deliver(self, change)
  local q = self.changes
  q[#q + 1] = change
  if self.delivering then return end
  self.delivering = true
  self.ctx:_spawn(function()
    local i = 1
    while q[i] do
      local c = q[i]
      q[i] = false
      i = i + 1
      if not self.closed then
        local ok, err = xpcall(self.watch, debug.traceback, c)
        if not ok then self.ctx.log(("group '%s': error in watch: %s"):format(self.name, tostring(err))) end
      end
    end
    self.changes = {}
    self.delivering = false
  end)
end

-- One name server's view { [addr] = { data, principal, dv } } merged into
-- data, who, dvs ({ [addr] = ... }): a member new there, or whose data
-- this view has newer (by the version dv its member stamped), takes it.
local function merge_view(view, data, who, dvs)
  for a, m in each(view) do
    if data[a] == nil or (m.dv and (dvs[a] == nil or m.dv > dvs[a])) then
      data[a], who[a], dvs[a] = m.data, m.principal, m.dv
    end
  end
end

-- Who is online now (the union over the name servers with a view) against
-- what the callback was told: the difference goes to it.  No name server
-- with a view: nothing is known, nothing changes.
function Group:_recompute()
  if not self.watch or self.closed then return end
  local t = now(self.ctx)
  local online, known, principal, dvs = {}, false, {}, {}
  local due = math.huge     -- the earliest end of a carried member
  for _, addr in ipairs(self.ctx.nslist) do
    local st = self.ns[addr]
    if st.view then
      known = true
      merge_view(st.view, online, principal, dvs)
    end
  end
  for _, addr in ipairs(self.ctx.nslist) do
    local st = self.ns[addr]
    if st.view and st.carry then
      -- (a carried member keeps one told online so; it never brings back
      -- one told gone meanwhile: that was a false "joined")
      local left = false
      for a, m in each(st.carry) do
        if st.view[a] or m.till <= t or self.online[a] == nil then
          st.carry[a] = nil
        else
          left = true
          if m.till < due then due = m.till end
          if online[a] == nil then online[a], principal[a] = m.data, m.principal end
        end
      end
      if not left then st.carry = nil end
    end
  end
  if due < math.huge and due < (self.carry_due or math.huge) then
    -- told gone when its carry ends, not at the next renewal (a lease/3 later)
    if self.carry_timer then self.carry_timer:stop() end
    self.carry_due = due
    self.carry_timer = self.ctx:after(math.max(due - t, 0.001) + 0.001, function()
      self.carry_timer, self.carry_due = nil, nil
      self:_recompute()
    end)
  end
  if not known then return end
  local joined, left, any, who = {}, {}, false, nil
  for a, d in each(online) do
    local told = self.dvs[a]
    if told and (dvs[a] == nil or dvs[a] < told) and self.online[a] ~= nil then
      -- older data than the watcher was told (a resumed name server's
      -- late notice): the newer stays
      d, dvs[a] = self.online[a], told
      online[a] = d
    end
    local before = self.online[a]
    local news = before == nil or (before ~= d and type(d) ~= "table")
                 or (type(d) == "table" and before ~= d and not same(before, d))
    if news then
      joined[a], any = d, true
      if principal[a] then who = who or {}; who[a] = principal[a] end
    end
  end
  for a in each(self.online) do
    if online[a] == nil then
      left[a], any = self.why[a] or "expired", true
    end
  end
  self.why = {}
  self.online, self.dvs = online, dvs
  if any then deliver(self, { joined = joined, left = left, who = who }) end
end


-- A name server answered a renewal (reply r) or a list.
function Group:_absorb(st, r)
  if type(r.epoch) ~= "string" or type(r.ver) ~= "number" then return end
  local t = now(self.ctx)
  if r.epoch ~= st.epoch then
    -- a restarted name server (or the first answer): what it listed before
    -- counts until each member's lease has passed since its restart
    local age = type(r.age) == "number" and r.age >= 0 and r.age or 0
    local before = st.view or st.stale
    if st.epoch and before then
      local carry = st.carry or {}
      for a, m in each(before) do
        -- (the member's own lease; unknown: not carried.  Never the
        -- watcher's: a dead member was told gone a watcher's lease late)
        if m.lease then carry[a] = { data = m.data, principal = m.principal, till = t - age + m.lease } end
      end
      st.carry = carry
    end
    st.epoch, st.ver, st.view = r.epoch, nil, nil
  end
  if r.members ~= nil and (st.ver == nil or r.ver >= st.ver) then
    local view = parse_members(r.members, self.ctx.max_members)
    if view then st.view, st.ver, st.stale = view, r.ver, nil end
  end
end

-- The message that renews this group at name server `st`: its beacon
-- (gjoin) or, for a watcher that is not a member, its gwatch.
function Group:_renewal(st)
  if self.joined then
    return { op = "gjoin", group = self.name, data = self.data, lease = self.lease,
             watch = self.watch ~= nil, ver = st.ver, epoch = st.epoch, dv = self.dv }
  end
  return { op = "gwatch", group = self.name, on = true, lease = self.lease, ver = st.ver, epoch = st.epoch }
end

-- What a renewal at `st` came to: r, or nil, err, code.
function Group:_renewed(st, r, err, code)
  if self.closed or self.ctx.closed then return end
  if r then
    st.ok, st.err, st.code = true, nil, nil
    self:_absorb(st, r)
  else
    -- no answer, or refused: this name server's view counts no more
    -- (the others' do), and the next answer brings its whole list
    st.ok, st.err, st.code = false, err, code
    st.stale = st.view or st.stale     -- (what it listed, should it come back restarted)
    st.view, st.ver = nil, nil
    if code ~= "timeout" and code ~= "closed" then
      self.ctx:_warn_limited("group:" .. self.name, ("group '%s' at %s: %s"):format(self.name, st.addr, tostring(err)))
    end
  end
end

-- One renewal at the name server `st` (beacon, watch), unless one is on
-- its way there.  In a coroutine of its own: the others do not wait.
function Group:_renew(st, timeout)
  if st.busy or self.closed then return end
  st.busy = true
  local ctx = self.ctx
  ctx:_spawn(function()
    local r, err, code, lost = ctx:request(st.addr, self:_renewal(st), timeout or math.min(ctx.timeout, self.lease))
    st.busy = false
    -- a notice not applied while this was on its way (no view here yet, or
    -- a gap) and newer than its answer: the list the answer brings is
    -- behind it, so it is not taken, and another renewal brings the list
    -- as it is now (taken, the members the notice told of were missing
    -- here until the next beacon, a lease/3 later: gone, if no other name
    -- server listed them)
    local me, mv = st.missed_epoch, st.missed_ver
    st.missed_epoch, st.missed_ver = nil, nil
    local behind = r and mv and (r.epoch ~= me or type(r.ver) ~= "number" or r.ver < mv)
    self:_renewed(st, r, err, code)
    if behind then st.view, st.ver = nil, nil end
    self:_recompute()
    if behind then return self:_renew(st) end
    local unreachable = lost or code == "closed" or code == "timeout"
    if not r and unreachable and not st.retry and self.lease / 3 > RETRY then
      -- unreachable: tried again every RETRY s, not only at the next beacon,
      -- so a restarted name server is told this member (or watcher) and
      -- tells what it lists soon after it is back
      st.retry = ctx:after(RETRY, function()
        st.retry = nil
        if not st.ok then self:_renew(st) end
      end)
    end
  end)
end

function Group:_beacon()
  for _, addr in ipairs(self.ctx.nslist) do self:_renew(self.ns[addr]) end
  self:_recompute()
end

--- The members: { [addr] = data } (and { [addr] = principal }), the union
-- of the lists of the name servers that answer within MERGE_WINDOW of the
-- first (all are asked at once: one that is stopped or slow costs at most
-- that while another answers; a just-restarted one's short list never
-- hides a member another lists), each member's newest data (by the version
-- its member stamped); or nil, err, code when none answers.
function Group:members()
  local ctx = self.ctx
  local function usable(res) return res and res[2] and parse_members(res[2].members, ctx.max_members) end
  local results = ask_all(ctx, function() return { op = "glist", group = self.name } end, function(results)
    for i = 1, #ctx.nslist do
      if usable(results[i]) then return true end
    end
    return false
  end, MERGE_WINDOW)
  local errs, code = {}, nil
  local out, who, dvs, any = {}, {}, {}, false
  for _, res in ipairs(results) do
    local view = usable(res)
    if view then
      any = true
      merge_view(view, out, who, dvs)
    end
  end
  if any then return out, who end
  for _, res in ipairs(results) do
    errs[#errs + 1] = res[2] and ("%s: a malformed member list"):format(res[1]) or res[3]
    code = code or (res[2] and "protocol" or res[4])
  end
  return nil, ("no name server listed the members of '%s': %s"):format(self.name, table.concat(errs, "; ")), code
end

--- Changes this member's data (any value, 4 KiB encoded at most): sent
-- with a beacon now; the watchers are told it as `joined` with the new
-- data.  A name server that refuses it keeps the old (logged).  true.
function Group:set_data(data)
  if self.closed then error("lecho: group was left", 2) end
  if not self.joined then error("lecho: a watch-only group has no data", 2) end
  if data == nil then data = {} end
  self.data = data
  -- its version: this member's wall clock, always increasing here
  self.dv = math.max(now(self.ctx), self.dv + 1e-6)
  self:_beacon()
  return true
end

--- Leaves the group at every name server (and stops watching).  The
-- others are told at once ("left"); true.
function Group:leave()
  if self.closed then return true end
  self.closed = true
  if self.timer then self.timer:stop() end
  for _, st in each(self.ns) do
    if st.retry then st.retry:stop(); st.retry = nil end
  end
  if self.carry_timer then self.carry_timer:stop(); self.carry_timer = nil end
  local ctx = self.ctx
  if ctx.groups[self.name] == self then ctx.groups[self.name] = nil end
  if not ctx.closed then
    for _, addr in ipairs(ctx.nslist) do ctx:_notify(addr, { op = "gleave", group = self.name }) end
  end
  return true
end

--- Joins (or only watches) group `name` at every name server of
-- ctx.nslist; see the top of this file.  opts: lease (seconds, 0.1 to
-- 3600, default 10), data (this member's, any value, 4 KiB encoded at
-- most; default {}), watch (fn(change)), join (default true; false: watch
-- only, needs watch).  Returns the group, or nil, err, code when no name
-- server took it (each refused, or none answered within ctx.timeout).
function Context:group(name, opts)
  if self.closed then error("lecho: context is closed", 2) end
  opts = options.check(opts, options.GROUP, "ctx:group", 2)
  if type(name) ~= "string" then error("ctx:group: name must be a string", 2) end
  local join = opts.join
  if join == nil then join = true end
  if not join and not opts.watch then error("ctx:group: join = false needs watch (a function)", 2) end
  self.groups = self.groups or {}
  if self.groups[name] then error(("ctx:group: group '%s' is already open here (leave it first)"):format(name), 2) end
  local g = setmetatable({
    ctx = self, name = name, lease = opts.lease or options.GROUP.lease,
    data = opts.data == nil and {} or opts.data, watch = opts.watch, joined = join,
    ns = {}, online = {}, why = {}, changes = {}, closed = false,
    dv = self.c:now(),      -- the version of data (set_data), told with every gjoin
    dvs = {},               -- watcher: the version of each member's data it was told
  }, Group)
  for _, addr in ipairs(self.nslist) do g.ns[addr] = { addr = addr } end
  self.groups[name] = g
  -- the first registration: at every name server at once, each on its own
  -- (a stopped or slow one delays neither the answer nor the others'
  -- beacons); this returns once one took it, or every one failed
  g.timer = self:every(g.lease / 3, function() g:_beacon() end)
  for _, addr in ipairs(self.nslist) do g:_renew(g.ns[addr], self.timeout) end
  local function done()
    if self.closed then return true end
    local all = true
    for _, addr in ipairs(self.nslist) do
      local st = g.ns[addr]
      if st.ok then return true end
      if st.busy then all = false end
    end
    return all
  end
  -- (in steps: the renewals end in coroutines resumed at a loop turn's
  -- start, after which this wait would sleep until the next event)
  local deadline = now(self) + self.timeout + 1
  while not done() and now(self) < deadline do self:_wait(done, math.min(deadline, now(self) + 0.02)) end
  local errs, code = {}, nil
  for _, addr in ipairs(self.nslist) do
    local st = g.ns[addr]
    if st.ok then return g end
    errs[#errs + 1] = st.err or (addr .. ": no answer")
    if code == nil or code == "closed" or code == "timeout" then code = st.code end
  end
  g:leave()
  return nil, ("group '%s': no name server took it: %s"):format(name, table.concat(errs, "; ")), code or "timeout"
end

-- A gchange from name server `from`: applied to its view when it is the
-- next change of the run we know; a gap (or another run) is caught up by
-- a renewal now, which brings the whole list.
function Context:_on_gchange(from, msg)
  local g = self.groups and type(msg.group) == "string" and self.groups[msg.group]
  local st = g and g.ns[from]
  if not st or not g.watch then
    return self:_warn_limited("gchange", ("ignoring a gchange from %s: no such group here, or not from one of "
                                          .. "its name servers"):format(from))
  end
  local ver, joined, left = msg.ver, msg.joined or {}, msg.left or {}
  if type(ver) ~= "number" or type(msg.epoch) ~= "string" or type(joined) ~= "table" or type(left) ~= "table" then
    return self:_warn_limited("gchange", ("ignoring a malformed gchange from %s"):format(from))
  end
  for a, why in each(left) do
    if type(a) ~= "string" or #a > MAX_ADDR or type(why) ~= "string" then
      return self:_warn_limited("gchange", ("ignoring a malformed gchange from %s"):format(from))
    end
  end
  for a in each(joined) do
    if type(a) ~= "string" or a == "" or #a > MAX_ADDR then
      return self:_warn_limited("gchange", ("ignoring a malformed gchange from %s"):format(from))
    end
  end
  local n = 0
  for _ in each(joined) do n = n + 1 end
  if n > self.max_members then
    return self:_warn_limited("gchange", ("ignoring a gchange from %s: %d joined (limit %d)"):format(from, n,
                                                                                               self.max_members))
  end
  if st.view == nil or st.ver == nil or msg.epoch ~= st.epoch or ver > st.ver + 1 then
    st.view, st.ver = nil, nil
    if st.busy and (st.missed_ver == nil or msg.epoch ~= st.missed_epoch or ver > st.missed_ver) then
      st.missed_epoch, st.missed_ver = msg.epoch, ver     -- (for when the renewal on its way is answered)
    end
    return g:_renew(st)
  end
  if ver <= st.ver then return end         -- (a renewal's answer brought it already)
  st.ver = ver
  local leases = type(msg.lease) == "table" and msg.lease or {}
  local who = type(msg.who) == "table" and msg.who or {}
  local dvs = type(msg.dv) == "table" and msg.dv or {}
  for a, d in each(joined) do
    -- the member's lease from the notice (never the watcher's: F3 of the
    -- issue 12 attack, a dead member told gone a watcher's lease late)
    local l = leases[a]
    if type(l) ~= "number" or not (l > 0 and l <= 3600) then l = nil end
    local p = who[a]
    local v = dvs[a]
    st.view[a] = { data = d, lease = l, principal = type(p) == "string" and p or nil,
                   dv = type(v) == "number" and v == v and v or nil }
  end
  for a, why in each(left) do
    st.view[a] = nil
    g.why[a] = why
  end
  g:_recompute()
end

return Group
