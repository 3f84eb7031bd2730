-- lecho: event channels between processes, the API people call.
--
--   local lecho = require "lecho"
--   local ctx = lecho.context{ nameserver = "127.0.0.1:7700" } -- omitted: embedded
--   local ch  = ctx:channel("ozone")
--   local p   = ch:producer()
--   p:submit(ev)                 p:submit_sync(ev, { timeout = 2 })
--   local c   = ch:consumer(function(ev, meta) end)
--   ctx:run()  ctx:run_once(t)  ctx:stop()  ctx:every(s, fn)  ctx:after(s, fn)
--
-- This file is the Lua half of a context: channels, endpoints, the dispatch
-- of events to consumer handlers, synchronous waits, and the client side of
-- the control plane (lookups and joins, answered by lecho.registry in the
-- name server and managers).  The C half (lecho.core) owns the loop, the
-- sockets, the queues and the codec.

local core = require "lecho.core"
local registry = require "lecho.registry"

local M = {
  _VERSION = "0.1.0",
  protocol_version = core.protocol_version,
  encode = core.encode,
  decode = core.decode,
}

local Context, Channel, Producer, Consumer = {}, {}, {}, {}
Context.__index, Channel.__index, Producer.__index, Consumer.__index =
  Context, Channel, Producer, Consumer

local function now(self) return self.c:now() end

-- "host:port" with host an IPv4 address ("localhost" is taken as 127.0.0.1).
local function parse_addr(s, what)
  if type(s) ~= "string" then
    error(("lecho: %s must be a \"host:port\" string"):format(what), 3)
  end
  local host, port = s:match("^([^:/]+):(%d+)$")
  if not host then error(("lecho: bad %s '%s' (want host:port)"):format(what, s), 3) end
  if host == "localhost" then host = "127.0.0.1" end
  return host, tonumber(port)
end

-- An error list (from submit_sync) prints as one line per failing consumer.
local ErrList = {
  __tostring = function(t)
    local out = {}
    for i, e in ipairs(t) do
      out[i] = e.consumer and ("%s: %s"):format(e.consumer, e.err) or e.err
    end
    return table.concat(out, "; ")
  end,
}

------------------------------------------------------------------------------
-- Context

--- Creates the context of this process.
-- opts: nameserver ("host:port"; omitted: a name server runs inside this
-- context), listen ("127.0.0.1:0"), manager (true: act as a channel manager
-- registered with opts.nameserver), timeout (control requests, 5 s),
-- sync_timeout (10 s), queue_limit, policy, batch_bytes, max_string,
-- max_depth, max_frame, pin_threshold (see README), log (fn(msg)), quiet.
function M.context(opts)
  opts = opts or {}
  local host, port = parse_addr(opts.listen or "127.0.0.1:0", "listen address")
  local c = core.new(opts)
  local addr, err = c:listen(host, port)
  if not addr then c:close(); error("lecho: " .. err, 2) end
  local self = setmetatable({
    c = c, addr = addr,
    byname = {}, bychid = {},
    peer_addrs = {},
    pending = {}, rid = 0,
    nextpid = 0, nextcid = 0,
    selfq = {}, draining = false,
    timeout = opts.timeout or 5,
    sync_timeout = opts.sync_timeout or 10,
    closed = false,
  }, Context)
  if opts.log then
    self.log = opts.log
  elseif opts.quiet then
    self.log = function() end
  else
    self.log = function(msg) io.stderr:write(("lecho[%s]: %s\n"):format(addr, msg)) end
  end
  self._send = function(to, msg) self:_send_ctrl(to, msg) end
  if opts.nameserver then
    local h, p = parse_addr(opts.nameserver, "nameserver")
    self.ns = h .. ":" .. p
  else
    self.ns = addr
  end
  if opts.manager or not opts.nameserver then
    self.reg = registry.new{
      addr = addr, role = opts.manager and opts.nameserver and "manager" or "nameserver",
      ack_timeout = opts.ack_timeout or 2.0,
      log = function(level, msg)
        if level == "warn" or level == "error" then self.log(("%s: %s"):format(level, msg)) end
      end,
    }
    self.tick = c:timer(0.1, 0.1, function() self.reg:tick(self._send, now(self)) end)
  end
  c:hooks{
    event = function(...) return self:_on_event(...) end,
    ctrl = function(from, msg) return self:_on_ctrl(from, msg) end,
    peer = function(idx, paddr, up, reason) return self:_on_peer(idx, paddr, up, reason) end,
    log = function(msg) self.log(msg) end,
  }
  if opts.manager and opts.nameserver then
    local ok, rerr = self:request(self.ns, { op = "register_manager" })
    if not ok then
      self:close()
      error("lecho: cannot register as a manager with " .. self.ns .. ": " .. tostring(rerr), 2)
    end
  end
  return self
end

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
  local ok, err = self.c:send_ctrl(to, msg)
  if not ok then
    self.log(("cannot send to %s: %s"):format(to, err))
    self:_fail_pending(to, err)
  end
  return ok, err
end

function Context:_fail_pending(addr, why)
  for _, p in pairs(self.pending) do
    if p.to == addr and not p.reply then p.failed = why end
  end
end

--- Sends a control request and waits (serving the loop) for its reply.
-- Returns the reply table, or nil, err.
function Context:request(to, msg, timeout)
  self.rid = self.rid + 1
  local rid = self.rid
  msg.rid = rid
  local p = { to = to }
  self.pending[rid] = p
  self:_send_ctrl(to, msg)
  local deadline = now(self) + (timeout or self.timeout)
  while not p.reply and not p.failed and not self.closed do
    local left = deadline - now(self)
    if left <= 0 then break end
    self.c:run_once(left)
  end
  self.pending[rid] = nil
  if p.reply then
    if p.reply.ok then return p.reply end
    return nil, p.reply.err or "request failed", p.reply
  end
  if p.failed then return nil, ("%s unreachable: %s"):format(to, p.failed) end
  return nil, ("no answer from %s within %gs"):format(to, timeout or self.timeout)
end

function Context:_notify(to, msg)
  self.rid = self.rid + 1
  msg.rid = self.rid
  self:_send_ctrl(to, msg)
end

function Context:_on_ctrl(from, msg)
  if type(msg) ~= "table" or type(msg.op) ~= "string" then
    self.log(("ignoring a control message without op from %s"):format(from))
    return
  end
  local op = msg.op
  if op == "reply" then
    local p = self.pending[msg.rid]
    if p then p.reply = msg end
  elseif op == "members" then
    local ch = self.byname[msg.ch]
    if ch and type(msg.ver) == "number" and type(msg.consumers) == "table"
       and msg.ver > ch.ver then
      ch.ver = msg.ver
      ch:_set_consumers(msg.consumers)
    end
    self:_send_ctrl(from, { op = "members_ok", ch = msg.ch, ver = msg.ver, mid = msg.mid })
  elseif self.reg then
    self.reg:handle(from, msg, self._send, now(self))
  elseif msg.rid then
    self:_send_ctrl(from, { op = "reply", rid = msg.rid, ok = false,
                            err = ("unknown op '%s' (this context is not a name server)"):format(op) })
  end
end

function Context:_on_peer(idx, addr, up, reason)
  if up then
    self.peer_addrs[idx] = addr
    return
  end
  self:_fail_pending(addr, reason or "connection lost")
  if self.reg then self.reg:peer_down(addr, self._send, now(self)) end
  -- Soft state: channels managed by the lost context are joined again
  -- (lookup first: the name server may hand them to another manager).
  for _, ch in pairs(self.byname) do
    if ch.manager == addr or (ch.ns == addr and ch.manager ~= self.addr) then
      ch.manager = nil
      ch:_schedule_rejoin()
    end
  end
end

function Context:_peer_addr(idx)
  local a = self.peer_addrs[idx]
  if not a then
    a = self.c:peer_addr(idx) or "?"
    self.peer_addrs[idx] = a
  end
  return a
end

-- Runs every consumer of the channel on one decoded event (one copy per
-- context, however many consumers), then acknowledges a sync event.
function Context:_on_event(chid, value, peer, producer, seq, sync)
  local ch = self.bychid[chid]
  local list = ch and ch.consumers
  local nran, errs = 0, nil
  if list and list[1] then
    local from = peer == 0 and self.addr or self:_peer_addr(peer)
    local meta = { channel = ch.short, producer = from .. "#" .. producer, seq = seq }
    local n = #list
    local snap = list
    if n > 1 then snap = { unpack(list, 1, n) } end
    for i = 1, n do
      local con = snap[i]
      if not con.closed then
        nran = nran + 1
        local ok, err = pcall(con.handler, value, meta)
        if not ok then
          err = tostring(err)
          con.errors = con.errors + 1
          if sync > 0 then
            errs = errs or {}
            errs[#errs + 1] = { consumer = con.id, err = err }
          else
            self.log(("consumer %s on '%s' failed: %s"):format(con.id, ch.short, err))
          end
        end
      end
    end
  end
  if sync > 0 then self.c:ack(peer, sync, nran, errs) end
end

function Context:_fullname(name)
  if type(name) ~= "string" or name == "" then
    error("lecho: a channel name must be a non-empty string", 3)
  end
  local ns, short = name:match("^([^/]+:%d+)/(.+)$")
  if ns then
    local h, p = parse_addr(ns, "name server of the channel")
    ns = h .. ":" .. p
  else
    ns, short = self.ns, name
  end
  return ns .. "/" .. short, ns, short
end

--- Returns the channel object for name ("ozone" or "host:port/ozone").
function Context:channel(name)
  if self.closed then error("lecho: context is closed", 2) end
  local full, ns, short = self:_fullname(name)
  local ch = self.byname[full]
  if ch then return ch end
  ch = setmetatable({
    ctx = self, name = full, ns = ns, short = short,
    chid = self.c:channel(full),
    consumers = {}, producers = {}, nprod = 0,
    ver = -1, manager = nil,
  }, Channel)
  self.byname[full] = ch
  self.bychid[ch.chid] = ch
  return ch
end

function Context:every(sec, fn)
  return self.c:timer(sec, sec, function() fn() end)
end

function Context:after(sec, fn)
  return self.c:timer(sec, 0, function() fn() end)
end

function Context:run() return self.c:run() end
function Context:run_once(timeout) return self.c:run_once(timeout) end
function Context:stop() return self.c:stop() end
function Context:flush() return self.c:flush() end
function Context:now() return self.c:now() end

--- Counters per channel and per peer (see README "Statistics").
function Context:stats()
  local s = self.c:stats()
  s.addr = self.addr
  for name, ch in pairs(self.byname) do
    local cs = s.channels[name]
    if cs then
      cs.consumers = #ch.consumers
      cs.producers = ch.nprod
    end
  end
  return s
end

--- Snapshot of the name server's (or a manager's) view: channels with their
-- producing and consuming contexts.
function Context:list(addr)
  local r, err = self:request(addr or self.ns, { op = "list" })
  if not r then return nil, err end
  return r.channels, r.managers
end

function Context:close()
  if self.closed then return end
  for _, ch in pairs(self.byname) do
    for _, con in ipairs({ unpack(ch.consumers) }) do con:close() end
    for p in pairs(ch.producers) do p:close() end
    if ch.rejoin then ch.rejoin:stop() end
  end
  if self.tick then self.tick:stop() end
  self.closed = true
  self.c:flush()
  self.c:close()
end

------------------------------------------------------------------------------
-- Channel membership (client side of the control plane)

function Channel:_manager()
  if self.manager then return self.manager end
  local ctx = self.ctx
  local r, err = ctx:request(self.ns, { op = "lookup", ch = self.name })
  if not r then return nil, ("name server %s: %s"):format(self.ns, err) end
  self.manager = r.manager
  return r.manager
end

function Channel:_join(role)
  local mgr, err = self:_manager()
  if not mgr then return nil, err end
  local r
  r, err = self.ctx:request(mgr, { op = "join", ch = self.name, role = role })
  if not r then
    self.manager = nil
    return nil, ("joining '%s' as %s: %s"):format(self.name, role, err)
  end
  if role == "producer" then
    self.ver = r.ver or self.ver
    self:_set_consumers(r.consumers or {})
  end
  return r
end

function Channel:_leave(role)
  if self.manager and not self.ctx.closed then
    self.ctx:_notify(self.manager, { op = "leave", ch = self.name, role = role })
  end
end

function Channel:_set_consumers(list)
  local dests = {}
  for _, a in ipairs(list) do
    if a ~= self.ctx.addr then dests[#dests + 1] = a end
  end
  self.dests = dests
  self.ctx.c:set_dests(self.chid, dests)
end

-- After losing the manager (or the name server), join again every second
-- until it works: the control plane is soft state.
function Channel:_schedule_rejoin()
  if self.rejoin or self.ctx.closed then return end
  self.rejoin = self.ctx.c:timer(0.2, 1.0, function(t)
    if self.nprod > 0 and not self:_join("producer") then return end
    if #self.consumers > 0 and not self:_join("consumer") then return end
    t:stop()
    self.rejoin = nil
  end)
end

--- Creates a producer.  opts.policy overrides the context's queue policy.
-- Returns once the manager told this context where the consumers are.
function Channel:producer(opts)
  opts = opts or {}
  local ctx = self.ctx
  if ctx.closed then error("lecho: context is closed", 2) end
  if opts.policy and opts.policy ~= "block" and opts.policy ~= "drop_oldest"
     and opts.policy ~= "drop_newest" and opts.policy ~= "disconnect" then
    error("lecho: unknown policy '" .. tostring(opts.policy) .. "'", 2)
  end
  if self.nprod == 0 then
    local ok, err = self:_join("producer")
    if not ok then return nil, err end
  end
  self.nprod = self.nprod + 1
  ctx.nextpid = ctx.nextpid + 1
  local p = setmetatable({ ch = self, id = ctx.nextpid, seq = 0, policy = opts.policy }, Producer)
  self.producers[p] = true
  return p
end

--- Creates a consumer; handler(ev, meta) with meta = { channel, producer, seq }.
-- Returns once every producing context knows of it: it receives every event
-- submitted after this call returns.
function Channel:consumer(handler, opts)
  if type(handler) ~= "function" then error("lecho: consumer needs a handler function", 2) end
  local ctx = self.ctx
  if ctx.closed then error("lecho: context is closed", 2) end
  ctx.nextcid = ctx.nextcid + 1
  local con = setmetatable({
    ch = self, handler = handler, id = ("%s/c%d"):format(ctx.addr, ctx.nextcid),
    errors = 0, opts = opts,
  }, Consumer)
  local list = self.consumers
  list[#list + 1] = con
  if #list == 1 then
    ctx.c:set_local(self.chid, true)
    local r, err = self:_join("consumer")
    if not r then
      list[1] = nil
      ctx.c:set_local(self.chid, false)
      return nil, err
    end
    if r.late and #r.late > 0 then
      ctx.log(("consumer on '%s': producers %s did not confirm in time"):format(
        self.short, table.concat(r.late, ", ")))
    end
  end
  return con
end

------------------------------------------------------------------------------
-- Producer

--- Queues ev for every consumer and returns at once: true, or nil, err
-- (nothing was sent: the value cannot be encoded, or the producer is closed).
function Producer:submit(ev)
  if self.closed then return nil, "producer is closed" end
  local seq = self.seq + 1
  local ok, err = self.ch.ctx.c:submit(self.ch.chid, self.id, seq, ev, false, self.policy)
  if ok then self.seq = seq end
  return ok, err
end

--- Submits ev and waits until every consumer ran its handler.
-- Returns true, or nil, errors: a list of { context, consumer, err } (it
-- prints as one line) with each failing or silent consumer.
function Producer:submit_sync(ev, opts)
  if self.closed then return nil, "producer is closed" end
  local ctx = self.ch.ctx
  local c = ctx.c
  local timeout = opts and opts.timeout or ctx.sync_timeout
  local seq = self.seq + 1
  local id, err = c:submit(self.ch.chid, self.id, seq, ev, true, self.policy)
  if not id then return nil, err end
  self.seq = seq
  local deadline = c:now() + timeout
  while not c:sync_done(id) do
    local left = deadline - c:now()
    if left <= 0 or ctx.closed then break end
    c:run_once(left)
  end
  if ctx.closed then return nil, "context closed while waiting" end
  local _, errs = c:sync_take(id, ("no answer within %gs"):format(timeout))
  if #errs > 0 then return nil, setmetatable(errs, ErrList) end
  return true
end

--- Writes whatever this context has queued, now.
function Producer:flush() self.ch.ctx.c:flush() end

function Producer:close()
  if self.closed then return end
  self.closed = true
  local ch = self.ch
  ch.producers[self] = nil
  ch.nprod = ch.nprod - 1
  if ch.nprod == 0 then
    ch.ctx.c:flush()
    ch:_leave("producer")
  end
end

------------------------------------------------------------------------------
-- Consumer

--- Stops the handler at once: nothing is delivered to it after close().
function Consumer:close()
  if self.closed then return end
  self.closed = true
  local ch = self.ch
  local list = ch.consumers
  for i = #list, 1, -1 do
    if list[i] == self then table.remove(list, i) end
  end
  if #list == 0 then
    if not ch.ctx.closed then ch.ctx.c:set_local(ch.chid, false) end
    ch:_leave("consumer")
  end
end

return M
