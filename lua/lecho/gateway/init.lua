-- lecho.gateway: browsers and simple devices on lecho channels
-- (doc/gateway.md).  One listening port speaks HTTP: GET / is the live view
-- (lecho.gateway.page), an Upgrade to WebSocket (framing by wslay, through
-- lecho.ws) a client; a second, optional port takes plain JSON lines over
-- TCP.  Both carry the same JSON messages: list, sub (with a modulator when
-- the principal may), unsub, pub (sync or not), call, clients, auth.
--
--   local gw = require("lecho.gateway").new(ctx, { listen = "127.0.0.1:8080",
--     lines = "127.0.0.1:8081", tokens = { secret = "viewer" }, policy = pol })
--
-- Served on the context's own libev loop; sockets through the FFI (Linux,
-- IPv4 and IPv6).  Events of a channel are encoded to JSON once and queued to every
-- subscribed client; every client has limits (message size, subscriptions,
-- queued bytes, requests in flight) and the slow-client policy ("drop":
-- events past the queue limit are dropped and the client told how many;
-- "disconnect": the client is closed).  Keyed mode (tokens or client keys
-- given): nothing but auth is served before a client proved a principal,
-- and every action is checked against the policy here, where the client's
-- message is read.  Without keys: loopback only, and WebSocket handshakes
-- only from the gateway's own page (Origin) or non-browser clients.
--
-- This file holds the options, the limits and the gateway's life (M.new,
-- close, stats); each other concept is a file of lecho.gateway.*:
--   lecho.gateway.wire    what clients are sent: JSON texts, binary messages of arrays
--   lecho.gateway.client  a client's queue, replies, the slow-client policy (Client)
--   lecho.gateway.conn    sockets: listen, accept, read, write, deadlines, pings, drop
--   lecho.gateway.http    the page and the WebSocket handshake
--   lecho.gateway.ops     the requests (list, sub, unsub, pub, call, clients)
--   lecho.gateway.auth    keyed mode: tokens, keys, hello, auth, the policy's check
--   lecho.gateway.page    the live view's HTML
-- This is the home of Gateway: its methods not defined here are defined in
-- these modules, and mixed in below (spec/lua_layout_spec.lua checks this
-- list against the code):
--   lecho.gateway.conn:  _dirty, _flush, _drop, _accept, _deadline, _read, _lines, _pings
--   lecho.gateway.http:  _http_error, _http_send, _http
--   lecho.gateway.ops:   _message, _unsub, _producer, _use, _release
--   lecho.gateway.auth:  _hello, _may

local ffi = require "ffi"
local wire = require "lecho.gateway.wire"
local client = require "lecho.gateway.client"
local conn = require "lecho.gateway.conn"
local ops = require "lecho.gateway.ops"
local auth = require "lecho.gateway.auth"

require "lecho.sockets"     -- the socket calls, declared once
local C = ffi.C

local M = {}

M.LIMITS = {
  message = 65536,         -- bytes of one client message (WebSocket message or JSON line)
  subs = 32,               -- subscriptions per client
  queued = 4 * 1024 * 1024, -- bytes queued for one client before the slow-client policy acts
  clients = 256,           -- clients at once (WebSocket, JSON lines and HTTP requests)
  inflight = 8,            -- requests of one client being served at once
  head = 8192,             -- bytes of an HTTP request head
  handshake = 5,           -- seconds for the HTTP head, and in keyed mode for auth
  partial = 10,            -- seconds a client may leave a message (frame, fragments, line) incomplete
  channels = 64,           -- distinct channels one client may publish to, and services it may call
  ping = 30,               -- seconds: a WebSocket client silent this long is pinged, and closed when
                           -- still silent this long after (0: never); TCP keepalive for every client
}
M.SLOW = { drop = true, disconnect = true }
M.PREAUTH_QUEUED, M.LINGER = client.PREAUTH_QUEUED, conn.LINGER
-- what clients are sent, and what a key signs to authenticate
M.event_json, M.event_binary, M.reply_binary, M.event_out = wire.event_json, wire.event_binary,
  wire.reply_binary, wire.event_out
M.auth_message = auth.auth_message

local Gateway = {}
Gateway.__index = Gateway
for _, part in ipairs{ conn, require "lecho.gateway.http", ops, auth } do
  for name, f in pairs(part.Gateway) do
    assert(Gateway[name] == nil, "lecho.gateway: Gateway:" .. name .. " defined twice")
    Gateway[name] = f
  end
end

-- (for spec/gateway_spec.lua: the requests and the gateway's methods)
M._OPS, M._Gateway = ops.OPS, Gateway

--- A gateway on ctx: opts.listen (HTTP and WebSocket, default
-- "127.0.0.1:8080"), opts.lines (JSON lines, optional), opts.tokens
-- ({ token = principal }), opts.keys ({ {name, public}... }: client keys),
-- opts.policy (a lecho.policy; needed in keyed mode), opts.limits (over
-- M.LIMITS), opts.slow ("drop" or "disconnect"), opts.origins (more
-- allowed Origin values), opts.modulators (false: none taken).
-- The gateway (its addr, lines_addr), or nil, why.
function M.new(ctx, opts)
  opts = opts or {}
  local lim = {}
  for k, v in pairs(M.LIMITS) do lim[k] = v end
  for k, v in pairs(opts.limits or {}) do
    if M.LIMITS[k] == nil then return nil, "unknown gateway limit " .. tostring(k) end
    if type(v) ~= "number" or v <= 0 then return nil, ("gateway limit %s must be a positive number"):format(k) end
    lim[k] = v
  end
  local slow = opts.slow or "drop"
  if not M.SLOW[slow] then return nil, "slow-client policy must be drop or disconnect" end
  local tokens, keys, keyed = auth.config(opts)
  if not tokens then return nil, keys end
  local origins = {}
  for _, o in ipairs(opts.origins or {}) do origins[o] = true end
  local self = setmetatable({ ctx = ctx, lim = lim, slow = slow, tokens = tokens, keys = keys, keyed = keyed,
                              policy = opts.policy, origins = origins, modulators = opts.modulators ~= false,
                              clients = {}, nclients = 0, chans = {}, producers = {}, dirty = {}, nextid = 0,
                              refused = 0, drops = 0, events = 0, rbuf = ffi.new("uint8_t[?]", conn.RBUF_SIZE),
                              page = opts.page or require("lecho.gateway.page") }, Gateway)
  local fd, a = conn.listen(opts.listen or "127.0.0.1:8080", keyed, "gateway")
  if not fd then return nil, a end
  self.fd, self.addr = fd, a
  self.watch = ctx.c:io(fd, function() self:_accept(fd, "http") end)
  if opts.lines then
    local lfd, la = conn.listen(opts.lines, keyed, "gateway lines")
    if not lfd then self:close() return nil, la end
    self.lfd, self.lines_addr = lfd, la
    self.lwatch = ctx.c:io(lfd, function() self:_accept(lfd, "lines") end)
  end
  -- each client's events and bytes per second, for op clients and the page
  self.ticker = ctx.c:timer(1, 1, function()
    for c in pairs(self.clients) do
      local b = c.ws and c.ws:bytes_out() or c.bytes
      c.rate, c.bps = c.events - c.last_events, b - c.last_bytes
      c.last_events, c.last_bytes = c.events, b
    end
  end)
  if self.lim.ping > 0 then
    self.pinger = ctx.c:timer(self.lim.ping, self.lim.ping, function() self:_pings() end)
  end
  return self
end

--- Stops serving: listeners, clients (told with a close), subscriptions.
function Gateway:close()
  if self.closed then return end
  self.closed = true
  for _, w in ipairs{ "watch", "lwatch", "ticker", "pinger", "flusher" } do
    if self[w] then self[w]:stop(); self[w] = nil end
  end
  for cl in pairs(self.clients) do
    if cl.ws and not cl.closing then pcall(cl.ws.close, cl.ws, 1001, "gateway closing"); pcall(cl.ws.send, cl.ws) end
    self:_drop(cl)
  end
  if self.fd then C.close(self.fd) end
  if self.lfd then C.close(self.lfd) end
  for _, p in pairs(self.producers) do p:close() end
end

--- Counters: clients, events (from channels), drops, refused.
function Gateway:stats()
  return { clients = self.nclients, events = self.events, drops = self.drops, refused = self.refused }
end

return M
