-- lecho.gateway.ops: what a client asks, one JSON message each (doc/gateway.md
-- "Messages"): its decoding and dispatch (Gateway:_message: one coroutine
-- per request, at most lim.inflight per client, nothing but auth before
-- a keyed client authenticated), and the requests list, sub (one consumer
-- per channel for all plain subscribers; a consumer of its own for a
-- subscription with a modulator), unsub, pub (sync or not, through one
-- producer of the gateway's per channel), call and clients; each client's
-- distinct channels and services counted (--max-channels).  The request
-- auth is lecho.gateway.auth's (OPS.auth); every action is checked there
-- (Gateway:_may) before it is done.  Its Gateway functions are methods of
-- the Gateway (listed in lecho.gateway's header, which mixes them in).

local addr = require "lecho.addr"
local jsonw = require "lecho.jsonw"
local wire = require "lecho.gateway.wire"
local cj, null, denull = wire.json, wire.null, wire.denull

local M = {}

local Gateway = {}   -- this file's methods of lecho.gateway's Gateway
M.Gateway = Gateway

-- An error reply to request id of client cl (code: one of lecho.errors').
function M.err(cl, id, msg, code)
  cl:reply{ id = id, error = msg, code = code or "invalid" }
end

local err = M.err

-- The requests, by op (OPS.auth in lecho.gateway.auth).
local OPS = {}
M.OPS = OPS

function Gateway:_message(cl, text)
  local m, why, rid = wire.decode(text)
  -- refused (a number a double would change, Infinity, ...): the reply
  -- carries the request's id when it could be read (review 7: it had none,
  -- and the live view's form waited for it forever)
  if why then
    if type(rid) ~= "number" and type(rid) ~= "string" then rid = nil end
    return err(cl, rid, why, "invalid")
  end
  if type(m) ~= "table" then return err(cl, nil, "not a JSON object (a " .. (m == null and "null" or type(m)) .. ")", "invalid") end
  local op, id = m.op, m.id
  if id ~= nil and type(id) ~= "number" and type(id) ~= "string" then id = nil end
  if type(op) ~= "string" or not OPS[op] then return err(cl, id, "unknown op " .. tostring(op)) end
  if self.keyed and not cl.principal and op ~= "auth" then
    return err(cl, id, "authenticate first (op auth with a token or a key)", "auth")
  end
  if cl.inflight >= self.lim.inflight then
    return err(cl, id, ("limit: %d requests in flight"):format(self.lim.inflight), "limit")
  end
  cl.inflight = cl.inflight + 1
  self.ctx:_spawn(function()
    local okr, e = xpcall(OPS[op], debug.traceback, self, cl, m, id)
    cl.inflight = cl.inflight - 1
    if not okr then
      self.ctx.log("gateway: op " .. op .. " failed: " .. tostring(e))
      err(cl, id, "internal error", "internal")
    end
    if cl.release_owed and cl.inflight == 0 then self:_release(cl) end
  end)
end

-- A client's channel name: a plain name (of the gateway's name server), or
-- nil, why.  A name with a name server's address ("HOST:PORT/name") would
-- have the gateway dial that address for the client: only the gateway's
-- own name server's is taken (policies match names without it).
local function chan_name(m, gw)
  local ch = m.ch
  if type(ch) ~= "string" or ch == "" or #ch > 256 then return nil end
  if ch:find("/", 1, true) then
    local ns, name = addr.split(ch, gw.ctx.ns)
    if not ns or ns ~= gw.ctx.ns then
      return nil, ("channel %s: only names of this gateway's name server are served (give the name alone)"):format(ch:sub(1, 80))
    end
    return name
  end
  return ch
end

function OPS.list(self, cl, m, id)
  local ok, why = self:_may(cl, "list", nil)
  -- a principal that may consume but not list: what it can do instead
  if not ok then return err(cl, id, why .. " (a channel it may consume is subscribed by name: op sub, ch NAME)", "denied") end
  local chans, e2 = self.ctx:list()
  if not chans then return err(cl, id, tostring(e2), "failed") end
  local out = jsonw.list()   -- [] when empty (review 5: it was {})
  for name, e in pairs(chans) do
    local short = name:match("^[^/]*/(.*)$") or name
    if not self.keyed or self.policy:check(cl.principal, "list", short) == true then
      local np, nc = 0, 0
      for _ in pairs(e.producers or {}) do np = np + 1 end
      for _ in pairs(e.consumers or {}) do nc = nc + 1 end
      out[#out + 1] = { channel = short, producers = np, consumers = nc }
    end
  end
  table.sort(out, function(a, b) return a.channel < b.channel end)
  cl:reply{ id = id, ok = true, result = out }
end

function Gateway:_unsub(cl, name)
  local s = cl.subs[name]
  if not s then return end
  cl.subs[name] = nil
  cl.nsubs = cl.nsubs - 1
  if s == "pending" then return end   -- its consumer is being made: OPS.sub closes it when it comes
  if s ~= true then s:close() return end
  local e = self.chans[name]
  if not e then return end
  if e.clients[cl] then
    e.clients[cl] = nil
    e.n = e.n - 1
  end
  if e.n == 0 then
    self.chans[name] = nil
    if e.con then e.con:close() end
    e.gone = true
  end
end

function OPS.sub(self, cl, m, id)
  local ch, bad = chan_name(m, self)
  if not ch then return err(cl, id, bad or "sub needs ch, a channel name", bad and "denied" or "invalid") end
  if cl.subs[ch] then return err(cl, id, "already subscribed to " .. ch) end
  if cl.nsubs >= self.lim.subs then return err(cl, id, ("limit: %d subscriptions"):format(self.lim.subs), "limit") end
  local ok, why = self:_may(cl, "consume", ch)
  if not ok then return err(cl, id, why, "denied") end
  ok, why = self:_use(cl, ch, "sub")
  if not ok then return err(cl, id, why, "limit") end
  local src = m.modulator
  if src ~= nil and src ~= null then
    if type(src) ~= "string" then return err(cl, id, "modulator must be Lua source text") end
    ok, why = self:_may(cl, "modulate", ch)
    if not ok then return err(cl, id, why, "denied") end
    if not self.modulators then return err(cl, id, "this gateway takes no modulators (--no-modulators)", "denied") end
    cl.subs[ch] = "pending"
    cl.nsubs = cl.nsubs + 1
    -- (a modulator that does not compile raises here: caught, so the
    -- subscription is not left "pending", which leaked the client at its end)
    -- A failure notice ends the subscription: its consumer is closed and
    -- its slot freed (review 4: it stayed in `clients`, counted against
    -- --max-subs and a corrected sub got "already subscribed")
    local mine, failed
    local okc, con, e2, code = pcall(function()
      return self.ctx:channel(ch):consumer(function(ev)
        cl:deliver(wire.event_out(ch, ev))
      end, { modulator = src, params = denull(m.params, 0), on_error = function(msg)
        if failed or (mine and mine.closed) then return end
        failed = tostring(msg)
        -- before the sub's reply (its consumer still being made): the error
        -- reply below says it, no notice first (review 5 D)
        if not mine then return end
        cl:reply{ ch = ch, error = failed, code = "modulator", unsubscribed = true }
        if mine then
          if cl.subs[ch] == mine then self:_unsub(cl, ch) else mine:close() end
        end
      end })
    end)
    if not okc then con, e2, code = nil, con, "invalid" end
    if not con then
      cl.subs[ch] = nil
      cl.nsubs = cl.nsubs - 1
      return err(cl, id, tostring(e2), code or "failed")
    end
    mine = con
    if failed then
      con:close()
      if cl.subs[ch] == "pending" then cl.subs[ch] = nil; cl.nsubs = cl.nsubs - 1 end
      return err(cl, id, failed, "modulator")
    end
    if cl.closed or cl.subs[ch] ~= "pending" then con:close() return end
    cl.subs[ch] = con
    return cl:reply{ id = id, ok = true }
  end
  cl.subs[ch] = true
  cl.nsubs = cl.nsubs + 1
  local e = self.chans[ch]
  if not e then
    e = { clients = {}, n = 0 }
    self.chans[ch] = e
    local con, e2, code = self.ctx:channel(ch):consumer(function(ev)
      local lines, msg, binary = wire.event_out(ch, ev)
      self.events = self.events + 1
      for c in pairs(e.clients) do c:deliver(lines, msg, binary) end
    end)
    if not con then
      e.failed = { tostring(e2), code }
      if self.chans[ch] == e then self.chans[ch] = nil end
    elseif e.gone then
      con:close()
    else
      e.con = con
    end
  end
  while not e.con and not e.failed and not e.gone do self.ctx:sleep(0.01) end
  if e.failed then
    if cl.subs[ch] == true then cl.subs[ch] = nil; cl.nsubs = cl.nsubs - 1 end
    return err(cl, id, e.failed[1], e.failed[2] or "failed")
  end
  if cl.closed or cl.subs[ch] ~= true then return end
  e.clients[cl] = true
  e.n = e.n + 1
  cl:reply{ id = id, ok = true }
end

function OPS.unsub(self, cl, m, id)
  local ch = chan_name(m, self)
  if not ch or not cl.subs[ch] then return err(cl, id, "not subscribed to " .. tostring(m.ch)) end
  self:_unsub(cl, ch)
  cl:reply{ id = id, ok = true }
end

function Gateway:_producer(ch)
  local p = self.producers[ch]
  if p then return p end
  local e2, code
  p, e2, code = self.ctx:channel(ch):producer()
  if not p then return nil, e2, code end
  if self.producers[ch] then p:close() return self.producers[ch] end
  self.producers[ch] = p
  return p
end

-- Counts key (a channel cl subscribes or publishes to, "svc:NAME" a service
-- it calls; how: "sub", "pub", "call") against lim.channels, over the
-- client's life (an unsubscribe does not give it back): true, or nil, why.
-- Every name the gateway looks up is one its name server keeps for a
-- while, counted against the gateway (one requester for all its clients):
-- without this bound one client subscribing and unsubscribing to new names
-- used up that quota for every other client.  A channel's producer is the
-- gateway's, shared by its clients: closed (the channel left) when the last
-- client that published to it is gone (_release).
function Gateway:_use(cl, key, how)
  local had = cl.used[key]
  if had == "pub" or (had and how ~= "pub") then return true end
  if not had and cl.nused >= self.lim.channels then
    return nil, ("limit: %d distinct channels and services per client (--max-channels)"):format(self.lim.channels)
  end
  cl.used[key] = how
  if not had then cl.nused = cl.nused + 1 end
  if how == "pub" then
    self.pubusers = self.pubusers or {}
    self.pubusers[key] = (self.pubusers[key] or 0) + 1
  end
  return true
end

function Gateway:_release(cl)
  -- a request still being served may use the producers (a submit_sync in
  -- progress): released when the last one ends (_message), not skipped
  -- (a client that closed right after a pub left the gateway a producer
  -- of that channel for as long as it ran: review 8 of issue 28)
  if cl.inflight > 0 then
    cl.release_owed = true
    return
  end
  cl.release_owed = nil
  for key, how in pairs(cl.used) do
    if how == "pub" then
      local n = (self.pubusers[key] or 1) - 1
      self.pubusers[key] = n > 0 and n or nil
      local p = self.producers[key]
      if n <= 0 and p then
        self.producers[key] = nil
        p:close()
      end
    end
  end
  cl.used, cl.nused = {}, 0
end

function OPS.pub(self, cl, m, id)
  local ch, bad = chan_name(m, self)
  if not ch then return err(cl, id, bad or "pub needs ch, a channel name", bad and "denied" or "invalid") end
  local ok, why = self:_may(cl, "produce", ch)
  if not ok then return err(cl, id, why, "denied") end
  ok, why = self:_use(cl, ch, "pub")
  if not ok then return err(cl, id, why, "limit") end
  local p, e2, pcode = self:_producer(ch)
  if not p then return err(cl, id, tostring(e2), pcode or "failed") end
  local data = denull(m.data, 0)
  local r, e3, code
  if m.sync == true then
    local t = tonumber(m.timeout)
    r, e3, code = p:submit_sync(data, t and t > 0 and t <= 60 and { timeout = t } or nil)
  else
    r, e3, code = p:submit(data)
  end
  if r then
    if id ~= nil or m.sync then cl:reply{ id = id, ok = true } end
  else
    -- submit_sync's errors: one per consumer that failed ({ consumer, err, code, ... })
    if type(e3) == "table" then
      local texts = {}
      for _, x in ipairs(e3) do texts[#texts + 1] = type(x) == "table" and tostring(x.err) or tostring(x) end
      return cl:reply{ id = id, error = table.concat(texts, "; "), code = code or "failed", errors = jsonw.list(e3) }
    end
    err(cl, id, tostring(e3), code or "failed")
  end
end

function OPS.call(self, cl, m, id)
  local svc = m.svc
  if type(svc) ~= "string" or svc == "" or #svc > 256 then return err(cl, id, "call needs svc, a service name") end
  local ok, why = self:_may(cl, "produce", "svc:" .. svc)
  if not ok then return err(cl, id, why, "denied") end
  ok, why = self:_use(cl, "svc:" .. svc, "call")
  if not ok then return err(cl, id, why, "limit") end
  -- a service no process offers: said without a channel made for it (the
  -- caller's state of a name, ctx.call's, lives as long as the context)
  if not (self.ctx.svc_callers and self.ctx.svc_callers[svc]) then
    local any = false
    for _, ns in ipairs(self.ctx.nslist or { self.ctx.ns }) do
      local yes, _, code = self.ctx:_channel_exists(ns .. "/svc:" .. svc, ns, "svc:" .. svc)
      if yes then any = true break end
      if code ~= "notfound" then any = true break end   -- (unsure: let the call say)
    end
    if not any then return err(cl, id, "no service " .. svc, "noservice") end
  end
  local t, v = tonumber(m.timeout), tonumber(m.version)
  local copts = {}
  if t and t > 0 and t <= 60 then copts.timeout = t end
  if v and v >= 1 and v == math.floor(v) then copts.version = v end
  local r = { n = 0 }
  local function pack(ok, ...) r.n = select("#", ...); r.ok = ok; for i = 1, r.n do r[i] = select(i, ...) end end
  pack(pcall(self.ctx.call, self.ctx, svc, denull(m.args, 0), copts))
  if not r.ok then return err(cl, id, tostring(r[1]), "invalid") end
  if r[1] == nil and r[2] ~= nil then
    -- a handler's error: a string, or a table sent as a JSON object
    return cl:reply{ id = id, error = type(r[2]) == "table" and r[2] or tostring(r[2]), code = r[3] or "failed" }
  end
  local results = jsonw.list()
  for i = 1, r.n do results[i] = r[i] == nil and null or r[i] end
  cl:reply{ id = id, ok = true, result = r[1], results = results }
end

function OPS.clients(self, cl, m, id)
  -- keyed: the clients, their principals and channels are for a principal
  -- that may list, and each client's channels only those it may list
  -- (review 4: any authenticated principal got them all)
  local ok, why = self:_may(cl, "list", nil)
  if not ok then return err(cl, id, why, "denied") end
  local out = jsonw.list()
  for c in pairs(self.clients) do
    if c.kind == "ws" or c.kind == "lines" then
      local subs = jsonw.list()   -- [] when empty (review 5: it was {})
      for n in pairs(c.subs) do
        if not self.keyed or self.policy:check(cl.principal, "list", n) == true then subs[#subs + 1] = n end
      end
      table.sort(subs)
      out[#out + 1] = { id = c.id, kind = c.kind, principal = c.principal, events = c.events,
                        bytes = c.ws and c.ws:bytes_out() or c.bytes, rate = c.rate, bps = c.bps,
                        drops = c.drops, queued = c:queued(), subs = subs, you = c == cl or nil,
                        closing = c.closing or nil }
    end
  end
  table.sort(out, function(a, b) return a.id < b.id end)
  cl:reply{ id = id, ok = true, result = out }
end

return M
