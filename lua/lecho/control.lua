-- lecho.control: the client side of the control plane: control messages
-- (to ourselves through a trampoline, to others through the core),
-- requests and their replies, lookups and joins, the member lists a
-- producer gets from its channel's manager, and the rejoin after a manager
-- or name server was lost (soft state).  The other side is lecho.ns.registry,
-- run by the name server and the managers.

-- Never compiled, as lecho.ns.* (its other side): every function here runs
-- per control message (a request, a reply, a member list, a join), never
-- per event, and traces of it were recorded over and over and aborted (a
-- closure made in a loop, a loop left in a root trace: LuaJIT NYI): in the
-- modulator bench's installs (20 per chunk) the JIT's attempts were half
-- the CPU of an install.  Its `pairs` loops over member lists are also
-- what Debian's LuaJIT #827 could end early once blacklisted.
if jit then jit.off(true, true) end

local policy = require "lecho.policy"
local errors = require "lecho.errors"
local Context = require "lecho.context"
local Channel = require "lecho.channel"
local history = require "lecho.history"

local sorted_keys = require("lecho.tables").sorted_keys

local function now(self) return self.c:now() end

-- Control messages to ourselves never touch a socket: they are queued and
-- handled in order once the current handler has returned (a trampoline).
function Context:_send_ctrl(to, msg)
  if to == self.addr then
    local q = self.selfq
    q[#q + 1] = msg
    if not self.draining then
      self.draining = true
      local i = 1
      while q[i] do
        local m = q[i]
        q[i] = false
        i = i + 1
        local ok, err = pcall(self._on_ctrl, self, self.addr, m)
        if not ok then self.log("error handling a control message: " .. tostring(err)) end
      end
      self.selfq = {}
      self.draining = false
    end
    return true
  end
  local ok, err, code = self.c:send_ctrl(to, msg)
  if not ok then
    self:_warn_limited("send", ("cannot send to %s: %s"):format(to, err))
    self:_fail_pending(to, err, code)
  end
  return ok, err
end

-- The requests waiting on addr fail: why (text), code (lecho.errors: from
-- the core, where the connection failed: "refused" when the peer or the
-- handshake refused it, "closed" when it was lost, ...; never read from why).
local hex = require("lecho.core").hex
function Context:_fail_pending(addr, why, code)
  -- Keyed: the handshake refused a name server's address for the principal
  -- it showed (the pin of _add_nameserver; core/transport/secure.c
  -- identity_check, at the dial, and to the sends while the address is in
  -- backoff, with code "refused"): said as _check_nameserver says it, from
  -- what the core recorded of that loss (ctx:peer_loss: the principal and
  -- key shown), never from the words of why.
  if self.keyed and self.nameservers[addr] then
    local _, name, pk = self.c:peer_loss(addr)
    if name then
      why = ("refused: name server %s is %s (key %s), not %s"):format(addr, name, hex(pk), self.ns_principal)
      self:_warn_limited("nameserver " .. addr, why)
    end
  end
  for _, p in pairs(self.pending) do
    -- (the first failure stays: _check_nameserver's "refused" is not
    -- overwritten by the "closed" of the close that follows it)
    if p.to == addr and not p.reply and not p.failed then p.failed, p.failed_code = why, code or "closed" end
  end
end

-- A request to `to` waits for its reply in self.pending[rid] (`p`).  The
-- id is random (libsodium's randombytes through the core): no other
-- process can guess it, and none pending has it.  A reply is taken only
-- from the connection the request went out on (p.gen: the connection up
-- now, or, when none is, the next one to come up, set by _on_peer) and,
-- keyed, from the principal or key that address must have (p.principal:
-- a name server's; p.pk: the key it was pinned to, a manager's or a
-- member's).  Returns rid, p.
local lcore = require "lecho.core"
-- A fresh request id: from this context's pool, refilled 64 at a time (one
-- read of the system's randomness, not one per request).
local function fresh_id(self)
  local pool, n = self.rid_pool, self.rid_n or 0
  if n == 0 then
    pool, n = lcore.random_ids(64), 64
    self.rid_pool = pool
  end
  self.rid_n = n - 1
  return pool[n]
end
function Context:_pend(to)
  local pending = self.pending
  local rid
  repeat rid = fresh_id(self) until not pending[rid]
  local p = { to = to, gen = to ~= self.addr and self.c:peer_gen(to) or 0 }
  if self.keyed and to ~= self.addr then
    if self.nameservers[to] then p.principal = self.ns_principal end
    p.pk = self.expect_keys[to]
  end
  pending[rid] = p
  return rid, p
end

-- Why a reply from `from`, read on connection `gen` (nil: from this context
-- itself, through the trampoline), is not the answer to request p; nil
-- when it is.
function Context:_reply_wrong(p, from, gen)
  if p.failed or p.reply then return "its request is already settled" end
  if from ~= p.to then return ("the request went to %s"):format(p.to) end
  if from == self.addr then return gen ~= nil and "our own address, from a connection" or nil end
  if gen == nil or p.gen == 0 or gen ~= p.gen then
    return ("it came on connection %s, the request went out on %s"):format(tostring(gen),
      p.gen == 0 and "none yet" or tostring(p.gen))
  end
  if p.principal or p.pk then
    local name, pk = self.c:peer_identity(from)
    if p.principal and name ~= p.principal then
      return ("%s is principal %s, not %s"):format(from, tostring(name), p.principal)
    end
    if p.pk and pk ~= p.pk then return ("%s is not the key it was pinned to"):format(from) end
  end
  return nil
end

--- Sends a control request and waits (serving the loop) for its reply.
-- Returns the reply table, or nil, err, code (the code the reply carries,
-- else "failed"; "closed"/"refused" when the peer cannot be reached, then
-- with a fourth value true: unreachable, told by where it failed rather
-- than by the words; "timeout" without an answer).  also (optional, a
-- function): the wait also ends when it returns true: nil, "answered
-- otherwise", "done" then (the reply, if it comes, is dropped).
function Context:request(to, msg, timeout, also)
  local rid, p = self:_pend(to)
  msg.rid = rid
  self:_send_ctrl(to, msg)
  self:_wait(function() return p.reply or p.failed or self.closed or (also ~= nil and also()) end,
             now(self) + (timeout or self.timeout))
  self.pending[rid] = nil
  if not p.reply and not p.failed and not self.closed and also ~= nil and also() then
    return nil, "answered otherwise", "done"
  end
  if p.reply then
    if p.reply.ok then return p.reply end
    return nil, p.reply.err or "request failed", errors.peer_code(p.reply.code)
  end
  if p.failed then
    return nil, ("%s unreachable: %s"):format(to, p.failed), p.failed_code == "refused" and "refused" or "closed", true
  end
  if self.closed then return nil, "context closed while waiting", "closed" end
  return nil, ("no answer from %s within %gs"):format(to, timeout or self.timeout), "timeout"
end

-- A request whose reply nobody waits for (leave, subscribe without
-- waiting): its id is random too, and not pending, so its reply is dropped.
function Context:_notify(to, msg)
  local rid
  repeat rid = fresh_id(self) until not self.pending[rid]
  msg.rid = rid
  self:_send_ctrl(to, msg)
end

-- One log line per `kind` every WARN_EVERY seconds at most (a peer that
-- floods bad messages must not flood the log); the next line says how many
-- were left out.
local WARN_EVERY = 10
function Context:_warn_limited(kind, line)
  local w = self.warned
  if not w then w = {}; self.warned = w end
  local e = w[kind]
  if not e then e = { at = -math.huge, left = 0 }; w[kind] = e end
  local t = now(self)
  if t - e.at < WARN_EVERY then
    e.left = e.left + 1
    return
  end
  if e.left > 0 then line = ("%s (%d more in the last %d s)"):format(line, e.left, WARN_EVERY) end
  e.at, e.left = t, 0
  self.log(line)
end

-- A member list is a producer's only source of where its events go and
-- which code it runs: it is taken only from the channel's manager, as the
-- name server named it (a lookup), and only when well formed.
local MAX_LIST = 65536        -- consumer contexts in one list
local MAX_ADDR = 127          -- bytes of an advertised address (doc/wire-format.md)

local function addr_list(l, what)
  if type(l) ~= "table" then return nil, what .. " is not a list" end
  local n = #l
  if n > MAX_LIST then return nil, what .. " is too long" end
  local count = 0
  for k, a in pairs(l) do
    count = count + 1
    if type(k) ~= "number" or k < 1 or k > n or k ~= math.floor(k) then
      return nil, what .. " is not a list"
    end
    if type(a) ~= "string" or a == "" or #a > MAX_ADDR then
      return nil, what .. " holds something that is not an address"
    end
  end
  if count ~= n then return nil, what .. " is not a list" end
  return true
end

local function mods_ok(mods)
  if mods == nil then return true end
  if type(mods) ~= "table" then return nil, "'mods' is not a table" end
  for k, m in pairs(mods) do
    if type(k) ~= "string" or #k == 0 or #k > 64 then return nil, "a modulator key is not 1 to 64 bytes" end
    if type(m) ~= "table" or type(m.src) ~= "string" then
      return nil, ("modulator %s has no string 'src'"):format(k)
    end
    local per = m.period
    if per ~= nil and (type(per) ~= "number" or not (per >= 0.001 and per < math.huge)) then
      return nil, ("modulator %s: 'period' is not a finite number >= 0.001"):format(k)
    end
    if m.base ~= nil and type(m.base) ~= "string" then return nil, ("modulator %s: 'base' is not a string"):format(k) end
    if m.caps ~= nil then
      if type(m.caps) ~= "table" then return nil, ("modulator %s: 'caps' is not a list"):format(k) end
      for _, c in pairs(m.caps) do
        if type(c) ~= "string" then return nil, ("modulator %s: 'caps' holds a non-string"):format(k) end
      end
    end
    if m.dests ~= nil then
      local ok, err = addr_list(m.dests, ("modulator %s: 'dests'"):format(k))
      if not ok then return nil, err end
    end
  end
  return true
end

-- Keyed mode: pins addr to key pk in the core (its handshake refuses any
-- other key there, before anything queued is written) and here (a reply
-- from addr must come from that key: _reply_wrong).
function Context:_expect(addr, pk)
  local ok, err = self.c:expect(addr, pk)
  if ok then self.expect_keys[addr] = pk end
  return ok, err
end

-- Keyed mode: pins each address of `keys` ({ [addr] = pk }, from a member
-- list or a producer's join reply) to its key before anything is sent
-- there: a context that claims the address with another key is refused.
local function pin_all(ctx, keys)
  for addr, pk in pairs(keys or {}) do
    local ok, err = ctx:_expect(addr, pk)
    if not ok then ctx.log(("cannot pin %s to its key: %s"):format(addr, tostring(err))) end
    if ok then ctx.pinned_keys[addr] = pk end  -- whose modulators these are (lecho.modulator)
  end
end

-- A member list's `sseq` ({ [addr] = n }: the last subscription change of
-- each consumer context the manager took, which a direct install must be
-- above: modulator.lua _install_req) and, keyed with a policy, `grants`
-- ({ [addr] = { "caps,..."... } }: the capability sets each may modulate
-- with), checked for shape.
local MAX_GRANTS = 16
local function extras_ok(msg)
  if msg.sseq ~= nil then
    if type(msg.sseq) ~= "table" then return nil, "'sseq' is not a table" end
    for a, n in pairs(msg.sseq) do
      if type(a) ~= "string" or #a > MAX_ADDR or type(n) ~= "number" or not (n >= 0 and n < 2 ^ 53)
         or n % 1 ~= 0 then
        return nil, "'sseq' holds something that is not an address and an integer"
      end
    end
  end
  if msg.grants ~= nil then
    if type(msg.grants) ~= "table" then return nil, "'grants' is not a table" end
    for a, l in pairs(msg.grants) do
      if type(a) ~= "string" or #a > MAX_ADDR or type(l) ~= "table" or #l > MAX_GRANTS then
        return nil, "'grants' holds something that is not an address and a list of capability sets"
      end
      for _, g in pairs(l) do
        if type(g) ~= "string" or #g > 64 then return nil, "'grants' holds a capability set that is not a string" end
      end
    end
  end
  return true
end

-- What a member list's extras say, on channel ch (shapes checked).
local function take_extras(ch, msg)
  -- (nil: a manager that knows no direct install; none is taken then)
  ch.lsseq = type(msg.sseq) == "table" and msg.sseq or nil
  if type(msg.grants) == "table" then
    local g = {}
    for a, l in pairs(msg.grants) do
      local set = {}
      for _, x in ipairs(l) do set[x] = true end
      g[a] = set
    end
    ch.lgrants = g
  else
    ch.lgrants = nil
  end
end

-- The channel a `members` message from `from` may change, or nil, why.
local function members_channel(self, from, msg)
  local ch = type(msg.ch) == "string" and self.byname[msg.ch]
  if not ch then return nil, ("no channel '%s' here"):format(tostring(msg.ch)) end
  if ch.manager == nil and from == ch.left_manager then
    -- the last endpoint here left; the list the manager sent before it had
    -- our leave (a consumer's leave, say, told to the producers) is due
    return nil, nil
  end
  if ch.manager == nil or from ~= ch.manager then
    return nil, ("not the manager of '%s' (%s)"):format(ch.name, tostring(ch.manager or "none yet"))
  end
  local ver = msg.ver
  if type(ver) ~= "number" or not (ver >= 0 and ver < 2 ^ 53) or ver ~= math.floor(ver) then
    return nil, "'ver' is not an integer in [0, 2^53)"
  end
  local ok, err = addr_list(msg.consumers, "'consumers'")
  if ok then ok, err = mods_ok(msg.mods) end
  if not ok then return nil, err end
  local eok, eerr = extras_ok(msg)
  if not eok then return nil, eerr end
  if msg.keys ~= nil then
    if type(msg.keys) ~= "table" then return nil, "'keys' is not a table" end
    for a, k in pairs(msg.keys) do
      if type(a) ~= "string" or #a > MAX_ADDR or type(k) ~= "string" or #k ~= 32 then
        return nil, "'keys' holds something that is not an address and a 32-byte key"
      end
    end
  end
  return ch
end

-- The limits a well-formed member list must stay within (doc/limits.md):
-- at most max_members consumer contexts in the list and in each
-- modulator's dests, none twice (a context listed 20,000 times would get
-- every event 20,000 times), and no more than max_peers distinct remote
-- contexts as destinations over all the channels of this context with this
-- list in place of the channel's current one (each is a peer: a dial, a
-- connection, a queue).  Returns nil, or why the list is refused whole.
--
-- The count over all channels is not made per list (65,536 channels' joins
-- made it quadratic: the 65,536th join scanned 65,535 lists): the context
-- keeps every address the lists it took named (dest_seen, ndest_seen: a
-- superset of those its channels name now, stale ones included), and when
-- those with this list's are within max_peers, so is the exact count.  Only
-- past it are the channels' lists counted, and dest_seen made exact again.
local function remember_dests(self, l)
  local seen = self.dest_seen
  for _, a in ipairs(type(l) == "table" and l or {}) do
    if not seen[a] then seen[a], self.ndest_seen = true, self.ndest_seen + 1 end
  end
end

local function members_limits(self, ch, msg)
  local maxm, maxp = self.max_members, self.max_peers
  local need, nneed = {}, 0
  local function scan(l, what)
    if type(l) ~= "table" then return end      -- (shapes: addr_list, mods_ok)
    if #l > maxm then return ("%s%d consumers (limit %d)"):format(what, #l, maxm) end
    local seen = {}
    for _, a in ipairs(l) do
      if seen[a] then return ("%sduplicate consumer %s"):format(what, a) end
      seen[a] = true
      if a ~= self.addr and not need[a] then need[a], nneed = true, nneed + 1 end
    end
  end
  local why = scan(msg.consumers, "")
  if why then return why end
  local mods = type(msg.mods) == "table" and msg.mods or {}
  for _, k in ipairs(sorted_keys(mods)) do
    why = type(mods[k]) == "table" and scan(mods[k].dests, ("modulator %s: "):format(tostring(k)))
    if why then return why end
  end
  local function taken()   -- the list is within the limits: it will be applied
    remember_dests(self, msg.consumers)
    for _, m in pairs(mods) do if type(m) == "table" then remember_dests(self, m.dests) end end
  end
  if self.dest_seen then
    local n = self.ndest_seen
    for a in pairs(need) do if not self.dest_seen[a] then n = n + 1 end end
    if n <= maxp then return taken() end
  end
  local function add(l)
    for _, a in ipairs(l or {}) do
      if not need[a] then need[a], nneed = true, nneed + 1 end
    end
  end
  self.dest_seen, self.ndest_seen = {}, 0
  for _, other in pairs(self.byname) do
    if other ~= ch then
      add(other.dests)
      for _, inst in pairs(other.mods) do add(inst.dests) end
    end
    -- dest_seen: what every channel names now, this one's present lists
    -- and those kept after a manager's loss included
    remember_dests(self, other.dests)
    for _, inst in pairs(other.mods) do remember_dests(self, inst.dests) end
    if other.kept then
      remember_dests(self, other.kept.dests)
      for _, k in pairs(other.kept.mods) do remember_dests(self, k.dests) end
    end
  end
  if nneed > maxp then
    return ("they need %d peer contexts here (limit %d)"):format(nneed, maxp)
  end
  taken()
end

-- gen: the generation of the connection msg came on (nil: from this
-- context itself, through the trampoline of _send_ctrl).
function Context:_on_ctrl(from, msg, gen)
  if type(msg) ~= "table" or type(msg.op) ~= "string" then
    self:_warn_limited("noop", ("ignoring a control message without op from %s"):format(from))
    return
  end
  local op = msg.op
  if op == "reply" then
    -- An id with nothing pending is a late reply (its request timed out)
    -- or one to a notification: dropped without a word.  One pending but
    -- from elsewhere is a forgery or a confusion: dropped and logged.
    local p = self.pending[msg.rid]
    if not p then return end
    local why = self:_reply_wrong(p, from, gen)
    if why then
      return self:_warn_limited("reply", ("ignoring a reply from %s: %s"):format(from, why))
    end
    p.reply = msg
    if p.on_reply then p.on_reply(msg) end
  elseif op == "members" then
    local ch, why = members_channel(self, from, msg)
    if not ch then
      if why == nil then return end
      return self:_warn_limited("members", ("ignoring a members message from %s: %s"):format(from, why))
    end
    -- keyed: a renewed ticket, from the channel's manager (members_channel checked `from`)
    if msg.ticket ~= nil and self.keyed then ch:_take_ticket(msg.ticket) end
    if msg.ver > ch.ver then
      -- Refused whole, the list before it stays; the manager is told in
      -- the confirmation (it answers joins with it), the log says it once.
      local refused = members_limits(self, ch, msg)
      if refused then
        refused = ("members of %s refused: %s"):format(ch.name, refused)
        self:_warn_limited("members_limit", ("%s (from %s)"):format(refused, from))
        return self:_send_ctrl(from, { op = "members_ok", ch = msg.ch, ver = msg.ver, mid = msg.mid,
                                       refused = refused })
      end
      ch.ver = msg.ver
      pin_all(self, msg.keys)
      take_extras(ch, msg)
      ch.svc = type(msg.svc) == "table" and msg.svc or nil  -- a call channel's servers (lecho.call)
      ch:_apply_members(msg.consumers, msg.mods)
      -- a late joiner's history, sent now: before any event of this list
      -- (lecho.history; from the manager only, members_channel checked)
      if msg.hist ~= nil then history.push(ch, msg.hist) end
    end
    self:_send_ctrl(from, { op = "members_ok", ch = msg.ch, ver = msg.ver, mid = msg.mid,
                            errs = ch:_mod_errors(msg.mods) })
  -- A producer speaks of its own streams and modulators only: these name
  -- `from` (the connection's peer), never the `producer` the message claims.
  elseif op == "stream_end" then
    local ch = self.byname[msg.ch]
    if ch and type(msg.key) == "string" then
      ch:_stream_ended(msg.key, from, type(msg.ver) == "number" and msg.ver or -math.huge)
    end
  elseif op == "params" then
    -- a consumer's in-band params change (modulator.lua _params_req checks
    -- who may send it); the reply goes after the last event made with the
    -- old params, on the connection it came on
    local ch = type(msg.ch) == "string" and self.byname[msg.ch]
    local ok, why, code
    if not ch or ch.nprod == 0 then
      why, code = ("not a producer of '%s'"):format(tostring(msg.ch):sub(1, 300)), "notfound"
    else
      ok, why, code = ch:_params_req(from, msg)
    end
    if not ok then
      self:_warn_limited("params", ("refusing params from %s: %s"):format(from, why))
    end
    if msg.rid ~= nil then
      self:_send_ctrl(from, { op = "reply", rid = msg.rid, ok = ok or false, err = why, code = code })
      -- written now, not at the end of the turn: the consumer waits for it
      if from ~= self.addr then self.c:flush() end
    end
  elseif op == "install" then
    -- a consumer's direct install (modulator.lua _install_req checks who
    -- may send it); answered on the connection it came on
    local ch = type(msg.ch) == "string" and self.byname[msg.ch]
    local ok, why, code, errs, plan
    if not ch or ch.nprod == 0 then
      why, code = ("not a producer of '%s'"):format(tostring(msg.ch):sub(1, 300)), "notfound"
    else
      ok, why, code = ch:_install_req(from, msg)
      if ok then errs, why, plan, code = why, nil, code, nil end
    end
    if not ok then
      self:_warn_limited("install", ("refusing an install from %s: %s"):format(from, why))
    end
    if msg.rid ~= nil then
      self:_send_ctrl(from, { op = "reply", rid = msg.rid, ok = ok or false, err = why, code = code, errs = errs })
    end
    if plan then
      -- the answer written now, before the modulator's state is made (the
      -- consumer goes on meanwhile; what this process submits next runs
      -- through it: it cannot submit before this returns)
      if from ~= self.addr then self.c:flush() end
      ch:_install_apply(from, plan)
    end
  elseif op == "params_at" then
    -- a producer switched a stream of ours to other params here (in band):
    -- believed from a producer with that stream bound here only
    local ch = type(msg.ch) == "string" and self.byname[msg.ch]
    local st = ch and type(msg.stream) == "string" and ch.streams[msg.stream]
    if st and type(msg.key) == "string" and (from == self.addr or self.c:peer_binds(from, st.chid)) then
      ch:_params_at(st, from, msg.key)
    elseif st then
      self:_warn_limited("params_at", ("ignoring a params_at from %s: not a producer of '%s' here"):format(
        from, ch.name))
    end
  elseif op == "mod_error" then
    -- believed only from a producer of the channel for this context: one
    -- whose connection has the channel or the modulator's stream bound
    -- here (keyed: a BIND with its manager's ticket, not expired; the
    -- producer binds before it reports), else any peer that knows the key
    -- could fire our on_error with its text
    local ch = self.byname[msg.ch]
    if ch and type(msg.key) == "string" then
      local st = ch.streams and ch.streams[msg.key]
      if from == self.addr or self.c:peer_binds(from, ch.chid) or (st and self.c:peer_binds(from, st.chid)) then
        ch:_tell_mod_error(msg.key, ("modulator at %s: %s"):format(from, tostring(msg.err):sub(1, 1000)))
      else
        self:_warn_limited("mod_error", ("ignoring a mod_error from %s: not a producer of '%s' here"
                                         .. " (no channel bound)"):format(from, ch.name))
      end
    end
  elseif op == "unreached" then
    -- a producer of a channel consumed here could not connect to us: told
    -- by the channel's manager only (issue 25)
    local ch = type(msg.ch) == "string" and self.byname[msg.ch]
    if ch and ch.manager == from and ch.all[1] and type(msg.producer) == "string" then
      self:_warn_limited("unreached " .. ch.name .. " " .. msg.producer:sub(1, 300),
        ("consumer of '%s': producer %s cannot connect to this context's address %s (%s), so its "
         .. "events do not arrive; advertise an address it can reach (advertise = \"HOST:PORT\", "
         .. "the scripts' --advertise; listen = \"0.0.0.0:0\" or --listen to listen on it)")
          :format(ch.name, msg.producer:sub(1, 300), self.addr, tostring(msg.err):sub(1, 200)))
    end
  elseif op == "revoked" then
    -- the channel's manager withdrew this context's membership (a reloaded
    -- policy no longer grants it): believed from that manager only
    local ch = type(msg.ch) == "string" and self.byname[msg.ch]
    if ch and ch.manager ~= nil and ch.manager == from then ch:_revoked(msg) end
  elseif op == "revocations" then
    -- keyed: a name server's revocation lists (checked there: who sent
    -- them, who signed them, newer only; lecho.trustwatch)
    if self.keyed then self._trustwatch.received(self, from, msg) end
  elseif op == "policy" and self.reg and self.reg.role == "manager" then
    -- keyed: a name server's reloaded policy (lecho.trustwatch checks who sent it)
    (self._trustwatch or require("lecho.trustwatch")).policy_received(self, from, msg)
  elseif op == "gchange" then
    -- a group's change, from one of its name servers (lecho.group)
    self:_on_gchange(from, msg)
  elseif op == "history" then
    -- a late joiner asks for the last events (lecho.history checks it takes the stream)
    require("lecho.history").serve(self, from, msg)
  elseif op == "history_push" then
    -- a producer's history for a late joiner here (lecho.history keeps it
    -- only while one waits, and uses it only from a producer its join named)
    require("lecho.history").pushed(self, from, msg)
  elseif op == "stats" then
    -- another process reads our counters (lecho.stats; keyed: its policy)
    require("lecho.stats").serve(self, from, msg)
  elseif self.reg then
    self.reg:handle(from, msg, self._send, now(self))
  elseif msg.rid then
    self:_send_ctrl(from, { op = "reply", rid = msg.rid, ok = false, code = "invalid",
                            err = ("unknown op '%s' (this context is not a name server)"):format(op) })
  end
end

-- A manager's registration was answered (reply `r`): the name server's
-- policy, if it has one, is what this manager enforces on the joins it
-- takes.  One that does not parse refuses everything (logged): a manager
-- must not be more lenient than its name server.
function Context:_registered(r)
  if r.policy == nil then
    self.reg.policy = nil
    return
  end
  local pol, err = policy.new(r.policy, "the policy from name server " .. self.ns)
  if not pol then
    self.log(err .. "; every request is refused until it registers again")
    pol = policy.new({ rules = {} })
  end
  -- the members of the channels managed here are checked against it again
  self.reg:set_policy(pol, self._send, now(self))
end

-- A dial to `addr` failed (connect: refused, no route, timed out): for
-- each channel produced here that sends there, its manager is told
-- (`unreachable`), which tells that consumer context (`unreached`): the
-- only one who can fix its address learns why nothing comes.  Once per
-- channel and address per WARN_EVERY seconds (dials are retried).
function Context:_tell_unreachable(addr, reason)
  local t = now(self)
  local sent = self.unreach_sent
  if not sent then sent = {}; self.unreach_sent = sent end
  for name, ch in pairs(self.byname) do
    local to_it = false
    for _, d in ipairs(ch.nprod > 0 and ch.dests or {}) do if d == addr then to_it = true break end end
    for _, inst in pairs(ch.nprod > 0 and ch.mods or {}) do
      for _, d in ipairs(inst.dests or {}) do if d == addr then to_it = true break end end
    end
    local key = name .. " " .. addr
    if to_it and ch.manager and not (sent[key] and t - sent[key] < WARN_EVERY) then
      sent[key] = t
      self:_send_ctrl(ch.manager, { op = "unreachable", ch = name, consumer = addr, err = reason })
    end
  end
end

-- The peer hook's (init.lua): up, or down with the loss's reason, its code
-- and unreached (a dial of ours did not connect), set where it happened.
function Context:_on_peer(idx, addr, up, reason, gen, code, unreached)
  if up then
    self.peer_addrs[idx] = addr
    -- requests queued for addr while it was down go out on this connection
    for _, p in pairs(self.pending) do
      if p.to == addr and p.gen == 0 and not p.failed then p.gen = gen end
    end
    return
  end
  -- a peer that went down may be freed, and its idx name another later:
  -- what was cached under it goes (it is found again from the core)
  self.peer_addrs[idx], self.pnames[idx] = nil, nil
  self:_fail_pending(addr, reason or "connection lost", code)
  history.peer_lost(self, addr)  -- a restarted producer's events are new
  if unreached then self:_tell_unreachable(addr, reason) end
  if self.reg then self.reg:peer_down(addr, self._send, now(self)) end
  -- A group's name server lost: renewed there at once (and again every
  -- 0.5 s while it does not answer), so that a restarted one is told the
  -- member or watch, and tells what it lists, soon after it is back.
  for _, g in pairs(self.groups or {}) do
    local st = g.ns[addr]
    if st and not g.closed then g:_renew(st) end
  end
  -- A manager that lost its name server registers again, with the channels
  -- it manages (a restarted name server has forgotten who manages what).
  if self.reg and self.reg.role == "manager" and addr == self.ns and not self.reregister then
    self.reregister = self:every(0.5, function(t)
      local r = self:request(self.ns, { op = "register_manager",
                                        channels = sorted_keys(self.reg.channels) })
      if r then
        t:stop()
        self.reregister = nil
        self:_registered(r)
        for _, ch in ipairs(r.taken or {}) do
          self.log(("channel '%s' is now managed by another manager"):format(ch))
        end
      end
    end)
  end
  -- Soft state: channels managed by the lost context are joined again
  -- (lookup first: the name server may hand them to another manager).
  for _, ch in pairs(self.byname) do
    for key in pairs(ch.streams) do ch:_stream_ended(key, addr) end
    ch:_forget_kept(addr)
    if ch.cmanager == addr then ch.cmanager = nil end   -- it dropped our membership with the connection
    if ch.manager == addr or (ch.ns == addr and ch.manager ~= self.addr) then
      ch.manager = nil
      -- Versions are the lost manager's: the next one counts from its own
      -- start, and its member lists must not look older than what we had.
      ch.ver = -1
      ch.regrace = true
      ch.recovering = true
      ch:_schedule_rejoin()
    end
  end
end

--- Snapshot of the name server's (or a manager's) view: channels with their
-- producing and consuming contexts; returns channels, managers, and the
-- number of channels left out when the reply is capped (4096 channels or
-- 4 MiB: lecho.ns.registry LIST_MAX, LIST_BYTES), else nil.
function Context:list(addr)
  local r, err, code = self:request(addr or self.ns, { op = "list" })
  if not r then return nil, err, code end
  return r.channels, r.managers, r.truncated
end

local function is_key(k, n) return type(k) == "string" and #k == n end

-- ctx:channel(name, { create = false }): does channel `full` (at name
-- server `ns`) have a producer or a consumer?  Asks the name server, and the
-- channel's manager when that is another context.  Returns true, or nil,
-- err, code ("notfound": no such channel).
function Context:_channel_exists(full, ns, name)
  local r, err, code = self:request(ns, { op = "lookup", ch = full, create = false })
  if r and r.manager ~= ns then
    if type(r.manager) ~= "string" then return nil, ("name server %s: a lookup reply without a manager"):format(ns), "protocol" end
    -- keyed: the manager is pinned to the key the name server gave before
    -- anything is sent there (the info request and its reply, _reply_wrong)
    if self.keyed then
      local ok, perr = is_key(r.manager_key, 32) and self:_expect(r.manager, r.manager_key)
      if not ok then
        return nil, ("name server %s: manager %s: %s"):format(ns, r.manager,
          tostring(perr or "a lookup reply without the manager's key")), "refused"
      end
    end
    r, err, code = self:request(r.manager, { op = "info", ch = full })
  end
  if r then return true end
  if code == "notfound" then return nil, "no such channel: " .. name, code end
  return nil, err, code
end

-- Keyed mode: what the control plane said of this channel's keys, applied
-- to one of its core channels (the channel or a derived stream "name@key"):
-- the manager's key, against which a consumer checks a producer's ticket on
-- BIND, and this producer's own ticket.
function Channel:_secure(chid)
  local c = self.ctx.c
  if self.manager_key then c:chan_manager_key(chid, self.manager_key) end
  if self.ticket then c:chan_ticket(chid, self.ticket) end
end

-- A producer ticket (72 bytes: expiry, signature) from the channel's
-- manager: a join reply's, or a renewed one in `members`.  A new one goes
-- into the core, which BINDs the channel again with it before its next
-- event (a consumer checks a ticket at BIND).
function Channel:_take_ticket(t)
  if type(t) ~= "string" or #t ~= 72 or self.ticket == t then return end
  self.ticket = t
  self:_secure_all()
  -- in-band params_at tells that waited for a BIND (modulator.lua)
  self:_tell_owed()
end

function Channel:_secure_all()
  self:_secure(self.chid)
  for _, inst in pairs(self.mods) do self:_secure(inst.dchid) end
  for _, st in pairs(self.streams) do self:_secure(st.chid) end
end


function Channel:_manager()
  if self.manager then return self.manager end
  local ctx = self.ctx
  -- a name server already connected as another principal (a channel name
  -- may point anywhere): refused now rather than its reply dropped
  local why = ctx.keyed and ctx.c:peer_identity(self.ns) and ctx:_check_nameserver(self.ns)
  if why then return nil, why, "refused" end
  local r, err, code = ctx:request(self.ns, { op = "lookup", ch = self.name,
                                              recovering = self.recovering or nil })
  if not r then return nil, ("name server %s: %s"):format(self.ns, err), code end
  if type(r.manager) ~= "string" or (r.manager_key ~= nil and not is_key(r.manager_key, 32)) then
    return nil, ("name server %s: a lookup reply without a manager address and key"):format(self.ns), "protocol"
  end
  -- keyed: nothing goes to a manager whose key the name server did not give
  -- (its address would be anyone's who claims it first)
  if ctx.keyed and r.manager ~= ctx.addr and not r.manager_key then
    return nil, ("name server %s: a lookup reply without the key of manager %s"):format(self.ns, r.manager), "protocol"
  end
  if r.manager_key then
    -- the manager is who the name server says it is: its address is pinned
    -- to that key, and its producers' tickets are checked against it
    local ok, perr = ctx:_expect(r.manager, r.manager_key)
    if not ok then
      return nil, ("name server %s: manager %s: %s"):format(self.ns, r.manager, tostring(perr)), "refused"
    end
    if self.manager_key ~= r.manager_key then
      self.manager_key = r.manager_key
      self:_secure_all()
    end
  end
  self.manager, self.left_manager = r.manager, nil
  -- a peer's number: finite, positive, bounded, or none (a NaN or a string
  -- from a broken name server must not become the join's wait)
  local s = r.settle
  self.settle = type(s) == "number" and s > 0 and s <= 3600 and s or nil
  return r.manager
end

-- rejoin: joined again after losing the name server or the manager
-- (_schedule_rejoin): a manager that still lists this context in `role`
-- (only the name server was lost) keeps its one membership, not one more
-- (one more, and the one leave at the close left a phantom member).
function Channel:_join(role, rejoin)
  local mgr, err, code = self:_manager()
  if not mgr then return nil, err, code end
  local r
  local ver_before = self.ver
  local settle = self.settle
  r, err, code = self.ctx:request(mgr, { op = "join", ch = self.name, role = role, settle = settle,
                                         subs = role == "consumer" and self:_subs() or nil,
                                         rejoin = rejoin or nil },
                                  self.ctx.timeout + (settle or 0))
  if not r then
    -- A first join not answered in time may still have reached the manager
    -- (a busy or stopped one answers later): taken back, or that manager
    -- lists a member this context does not know it is, for as long as it
    -- runs (a leave after no join is refused there, harmlessly).  A rejoin
    -- is not: it does not add to a membership the manager holds.
    if code == "timeout" and not rejoin and not self.ctx.closed then
      self.ctx:_notify(mgr, { op = "leave", ch = self.name, role = role })
    end
    self.manager = nil
    return nil, ("joining '%s' as %s: %s"):format(self.name, role, err), code
  end
  if role == "producer" then
    if r.ticket ~= nil then
      if not is_key(r.ticket, 72) then
        return nil, ("joining '%s' as producer: a ticket that is not 72 bytes"):format(self.name), "protocol"
      end
      self:_take_ticket(r.ticket)
    end
    -- A `members` update handled while we waited (it can come in the same
    -- read as this reply, and was already confirmed) is newer: keep it.
    if self.ver == ver_before or (r.ver or -1) > self.ver then
      -- the list a join reply carries is held to the limits of `members`
      local refused = members_limits(self.ctx, self, { consumers = r.consumers or {}, mods = r.mods })
      if refused then
        self.ctx:_warn_limited("members_limit", ("members of %s refused: %s (from %s)")
                                                 :format(self.name, refused, mgr))
      else
        self.ver = r.ver or self.ver
        pin_all(self.ctx, type(r.keys) == "table" and r.keys or nil)
        if extras_ok(r) then take_extras(self, r) else take_extras(self, {}) end
        self.svc = type(r.svc) == "table" and r.svc or nil
        self:_apply_members(r.consumers or {}, r.mods)
      end
    end
  elseif #self.all == 0 then
    -- Every consumer here closed while this join waited (a rejoin after a
    -- lost connection, answered after the last close's leave went out):
    -- not a consumer.  Marked joined, the next consumer's subscription
    -- went to a manager that no longer listed this context ("subscribe:
    -- not a consumer", its open failed).  A consumer closed while its own
    -- first join waited sent no leave (not joined yet): the manager lists
    -- us by this join, so a leave now (where the leave went out after
    -- this join, the manager refuses this one, harmlessly: not listed).
    if not self.ctx.closed then self.ctx:_notify(mgr, { op = "leave", ch = self.name, role = role }) end
  else
    self.cjoined, self.cmanager = true, mgr
    self.producers_seen = type(r.producers) == "table" and r.producers or nil
    self:_check_reach(r.producers)
  end
  return r
end

-- The manager says this context may no longer be a `msg.role` of the
-- channel (or, msg.key, that one modulator is no longer granted): told to
-- the endpoints concerned (their on_error; else the log).  A producer
-- stops sending at once (an empty list; the manager sends none again).
local MAX_WHY = 300
function Channel:_revoked(msg)
  local why = ("'%s': %s (manager %s)"):format(self.name,
    type(msg.err) == "string" and msg.err:sub(1, MAX_WHY) or "membership withdrawn", self.manager)
  local ctx = self.ctx
  if msg.role == "producer" then
    if self.nprod > 0 then
      ctx.log("producer on " .. why, "warn")
      self:_apply_members({}, nil)
    end
    return
  end
  if msg.role ~= "consumer" then return end
  if type(msg.key) == "string" then return self:_tell_mod_error(msg.key, why) end
  for _, con in ipairs({ unpack(self.all) }) do
    if not con.closed then
      if con.on_error then
        local ok, err = pcall(con.on_error, why)
        if not ok then ctx.log("on_error handler failed: " .. tostring(err)) end
      else
        ctx.log(("consumer %s on %s"):format(tostring(con.id), why), "warn")
      end
    end
  end
end

function Channel:_leave(role)
  local to = self.manager
  if role == "consumer" then
    -- the manager this context joined as a consumer, should the channel's
    -- have been forgotten since (a producer's failed join): the leave must
    -- reach the manager that lists us, or we stay a phantom consumer there
    -- whose sync events fail with noconsumer for everyone (issue 28, review 7)
    to = self.cmanager or to
    self.cjoined, self.cmanager = false, nil
  end
  if to and not self.ctx.closed then
    self.ctx:_notify(to, { op = "leave", ch = self.name, role = role })
  end
  -- Joined in no role here any more: the next endpoint looks the manager up
  -- again (an unused channel is forgotten by the name server after
  -- forget_after, and may then go to another manager).  Not while the
  -- consumer's leave is still to be sent (its last consumer closed in this
  -- turn, the leave waits for the next: _update_subs): c:close() then
  -- p:close() in one turn forgot the manager here, the consumer's leave then
  -- had nowhere to go, and the manager listed this context as a consumer for
  -- as long as it ran (issue 28, review 7).
  if self.nprod == 0 and #self.all == 0 and not self.cjoined then
    self.manager, self.left_manager = nil, self.manager
  end
end

-- How long a producer that lost its manager keeps sending to the consumers
-- it had, beside those the next manager lists: the consumers join that
-- manager again too, and until they have, its lists lack them.  A consumer
-- context that the manager lists, or whose connection closes, stops being
-- kept at once; the time only bounds the others (it is sync_timeout's).
local REJOIN_GRACE = 10

local function union(a, b)
  local out, seen = {}, {}
  for _, l in ipairs({ a or {}, b or {} }) do
    for _, x in ipairs(l) do
      if not seen[x] then seen[x] = true; out[#out + 1] = x end
    end
  end
  return out
end

-- A member list from the manager.  After a manager was lost, the first
-- lists of the next one may lack consumers that have not joined it yet: for
-- REJOIN_GRACE seconds the consumers (and modulators) this producer already
-- had are kept beside them, so that a restart of the control plane costs no
-- event to a consumer present before and after it.
function Channel:_apply_members(list, mods)
  local ctx = self.ctx
  history.snapshot(self)        -- the seam for late joiners (lecho.history)
  self.last_members = { list = list, mods = mods }
  if self.regrace then
    self.regrace = nil
    local kmods = {}
    -- (with what the instance runs: an entry found under its key names it)
    for key, inst in pairs(self.mods) do
      local r = inst.runs
      kmods[key] = { base = inst.base, dests = inst.dests, src = r.src, period = r.period, caps = r.caps,
                     params = r.params }
    end
    self.kept = { dests = self.dests, mods = kmods }
    if self.kept_timer then self.kept_timer:stop() end
    self.kept_timer = ctx:after(REJOIN_GRACE, function()
      self.kept, self.kept_timer = nil, nil
      local last = self.last_members
      if last and not ctx.closed then self:_set_consumers(last.list, last.mods) end
    end)
  end
  local kept = self.kept
  if not kept then return self:_set_consumers(list, mods) end
  -- A context the manager lists in any way has joined it again: what the
  -- manager says of it is whole.  Only the others are kept.
  mods = type(mods) == "table" and mods or {}
  local known = {}
  for _, a in ipairs(list) do known[a] = true end
  for _, m in pairs(mods) do
    for _, a in ipairs(m.dests or {}) do known[a] = true end
  end
  local function missing(l)
    local out = {}
    for _, a in ipairs(l or {}) do
      if not known[a] then out[#out + 1] = a end
    end
    return out
  end
  local mlist = union(list, missing(kept.dests))
  local mmods = {}
  for key, m in pairs(mods) do mmods[key] = m end
  for key, k in pairs(kept.mods) do
    local extra = missing(k.dests)
    if #extra > 0 then
      local m = mmods[key]
      local c = {}
      for f, v in pairs(m or k) do c[f] = v end
      c.dests = union(m and m.dests, extra)
      mmods[key] = c
    end
  end
  return self:_set_consumers(mlist, mmods)
end

-- A consumer context kept after a manager loss went away: not kept any more.
function Channel:_forget_kept(addr)
  local kept, last = self.kept, self.last_members
  if not kept then return end
  kept.dests = Channel.without(kept.dests, addr)
  for _, k in pairs(kept.mods) do k.dests = Channel.without(k.dests, addr) end
  if last and not self.ctx.closed then self:_apply_members(last.list, last.mods) end
end

-- After losing the manager (or the name server), join again every second
-- until it works: the control plane is soft state.
function Channel:_schedule_rejoin()
  if self.rejoin or self.ctx.closed then return end
  self.rejoin = self.ctx:every(0.5, function(t)
    if self.nprod > 0 and not self:_join("producer", true) then return end
    if #self.all > 0 and not self:_join("consumer", true) then return end
    t:stop()
    self.rejoin = nil
    self.recovering = nil
  end)
end

-- Consuming side: what this context asks of the producers.
function Channel:_subs()
  local mods = {}
  for _, con in ipairs(self.all) do
    local m = con.mod
    if m then
      mods[m.key] = { src = m.src, params = m.params, period = m.period, caps = m.caps, base = m.base,
                      stream = m.stream ~= m.key and m.stream or nil, pseq = m.pseq }
    end
  end
  -- a call channel served here: the versions (lecho.service)
  local svc = self.svc_versions
  -- sseq: this change's number (a direct install's is above every one
  -- sent before, so a member list made from an older one never undoes it)
  self.sseq = (self.sseq or 0) + 1
  return { plain = #self.consumers > 0, mods = mods, svc = svc and svc[1] and { versions = svc } or nil,
           sseq = self.sseq,
           hist = self.hist_gen,  -- a new history consumer: subscribed again (lecho.history)
           histq = self.hist_want }  -- ... and what it wants, sent by the producers with the list
end

local function subs_sig(subs)
  return tostring(subs.plain) .. ":" .. table.concat(sorted_keys(subs.mods), ",")
    .. (subs.svc and ":" .. table.concat(subs.svc.versions, ",") or "")
    .. (subs.hist and ":h" .. subs.hist or "")
end

-- The leave a close in a loop turn put off (_update_subs), now: at the
-- next turn, or when the loop call (ctx:run, run_once) returns to the
-- main line before it (a handler that closed and stopped the loop), unless
-- a consumer came since.
function Channel:_leave_due()
  local ctx = self.ctx
  if self.leave_timer then self.leave_timer:stop() self.leave_timer = nil end
  if ctx.leaves_due then ctx.leaves_due[self] = nil end
  if #self.all == 0 and self.cjoined and not ctx.closed then
    self.subs_sig = nil
    self:_leave("consumer")
  end
end

-- Joins, re-subscribes or leaves to match the consumers; waits for the
-- producers' confirmations.  Returns the reply (or true), or nil, err.
function Channel:_update_subs(nowait)
  local ctx = self.ctx
  if #self.all == 0 then
    if nowait and self.cjoined and not ctx.closing and not ctx.closed
       and (ctx.c:depth() > 0 or ctx.c:moe_busy()) then
      -- The last consumer closed inside a loop turn (a handler, a timer):
      -- leave at the next turn, unless another consumer comes first
      -- (closed and opened at once: the producers never stop sending here,
      -- and no gap is seen where they did).  On the main line (no loop turn
      -- running, none may come: a script that closes and then sleeps or
      -- computes) the leave goes out now, or the manager listed this
      -- context as a consumer until its liveness ended (~10 s) or longer,
      -- and every other process's submit_sync on the channel failed
      -- meanwhile (issue 28: phantom consumer).  Nor while a modulator of
      -- this context is in a call up the stack (a close from its log hook,
      -- on the main line: a submit's enqueue): a leave handled here (this
      -- context the manager) unloads it under its own call (atk27_spec).
      if not self.leave_timer then
        self.leave_timer = ctx:after(0, function() self:_leave_due() end)
        -- (and when the loop call returns first: lecho.context leaves_due)
        local due = ctx.leaves_due
        if not due then due = {}; ctx.leaves_due = due end
        due[self] = true
      end
      return true
    end
    self.subs_sig = nil
    if self.cjoined then self:_leave("consumer") end
    return true
  end
  if self.leave_timer then
    self.leave_timer:stop()
    self.leave_timer = nil
    if ctx.leaves_due then ctx.leaves_due[self] = nil end
  end
  local subs = self:_subs()
  local sig = subs_sig(subs)
  if self.cjoined and sig == self.subs_sig then return true end
  if not self.cjoined then
    local r, err, code = self:_join("consumer")
    if r then self.subs_sig = sig end
    return r, err, code
  end
  local mgr, err, code = self:_manager()
  if not mgr then return nil, err, code end
  self.subs_sig, self.cmanager = sig, mgr
  local msg = { op = "subscribe", ch = self.name, subs = subs }
  if nowait then return self.ctx:_notify(mgr, msg) end
  local r
  r, err, code = self.ctx:request(mgr, msg)
  if not r then
    self.subs_sig = nil
    return nil, ("updating the subscription to '%s': %s"):format(self.name, err), code
  end
  if type(r) == "table" and type(r.producers) == "table" then self.producers_seen = r.producers end
  return r
end

return true
