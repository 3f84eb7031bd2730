-- lecho.gateway: browsers and simple devices on lecho channels
-- (doc/gateway.md).  One listening port speaks HTTP: GET / is the live view
-- (lecho.gateway_page), an Upgrade to WebSocket (framing by wslay, through
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

local ffi = require "ffi"
local bit = require "bit"
local buffer = require "string.buffer"
local ws = require "lecho.ws"
local addr = require "lecho.addr"
local core = require "lecho.core"

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
-- bytes a client that has not authenticated (keyed mode) may have queued:
-- its hello and a few error replies; past it, closed (1008) like any client
-- that does not read
M.PREAUTH_QUEUED = 65536
-- seconds a client being closed has to take what was queued and the close
M.LINGER = 5

require "lecho.sockets"     -- the socket calls, declared once
local C = ffi.C
local AF_INET, SOCK_STREAM, SOCK_NONBLOCK, SOCK_CLOEXEC = 2, 1, 2048, 524288
local SOL_SOCKET, SO_REUSEADDR, SO_SNDBUF, MSG_NOSIGNAL = 1, 2, 7, 0x4000
-- a client socket's kernel send buffer: bytes a client that does not read
-- holds in the kernel, besides --max-queued in the gateway (loopback's
-- autotuning would let it grow to megabytes)
local SNDBUF = 262144
local IPPROTO_TCP, TCP_NODELAY = 6, 1
local SO_KEEPALIVE, TCP_KEEPIDLE, TCP_KEEPINTVL, TCP_KEEPCNT = 9, 4, 5, 6
local EAGAIN, EINTR = 11, 4

local function errstr() return ffi.string(C.strerror(ffi.errno())) end

-- JSON: an instance of our own (settings not shared with other modules).
local cj = require("cjson").new()
cj.encode_invalid_numbers("null")
cj.encode_sparse_array(true)
cj.decode_max_depth(32)
cj.encode_max_depth(64)
local null = cj.null

-- A decoded value with JSON nulls removed (lecho values have no null).
local function denull(v, depth)
  if v == null then return nil end
  if type(v) ~= "table" then return v end
  if depth > 32 then return nil end
  local t = {}
  for k, x in pairs(v) do
    if x ~= null then t[k] = denull(x, depth + 1) end
  end
  return t
end

-- A value whose strings are not all UTF-8: each such string becomes
-- { ["$hex"] = HEX } (a text frame must be UTF-8; doc/gateway.md).
local function hexify(v, depth)
  if type(v) == "string" then
    if ws.valid_utf8(v) then return v end
    return { ["$hex"] = (v:gsub(".", function(c) return ("%02x"):format(c:byte()) end)) }
  end
  if type(v) ~= "table" or depth > 64 then return v end
  local t = setmetatable({}, getmetatable(v))   -- (a jsonw.list stays one)
  for k, x in pairs(v) do t[type(k) == "string" and (ws.valid_utf8(k) and k or hexify(k, 99)["$hex"]) or k] = hexify(x, depth + 1) end
  return t
end

-- JSON text of values: lecho.jsonw (every number exact: issue 29 F2;
-- arrays as { dtype, shape, data }: data the elements, flat, row-major,
-- doc/gateway.md); NaN and infinities as null, as cjson was set to.
local array = require "lecho.array"
local jsonw = require "lecho.jsonw"
local JSONW = { nonfinite = "null", null = null }
local function jencode(v) return jsonw.encode(v, JSONW) end

local function has_array(v, depth)
  if array.is(v) then return true end
  if type(v) ~= "table" or depth > 64 then return false end
  for _, x in pairs(v) do if has_array(x, depth + 1) then return true end end
  return false
end

--- The JSON text of an event on channel `ch` for clients (encoded once,
-- whatever the number of clients).
function M.event_json(ch, ev)
  local ok, s = pcall(jencode, ev)
  if ok and not ws.valid_utf8(s) then ok, s = pcall(jencode, hexify(ev, 0)) end
  if not ok then
    return ('{"ch":%s,"error":%s}'):format(cj.encode(ch), cj.encode("event not representable in JSON: " .. tostring(s)))
  end
  return ('{"ch":%s,"ev":%s}'):format(cj.encode(ch), s)
end

-- The event without its arrays (nil where each was), and list filled with
-- { path, array } per array: path the keys from the top (doc/gateway.md);
-- hole: what is left where an array was (nil, or JSON null for a reply).
local function strip(v, path, list, depth, hole)
  if array.is(v) then
    list[#list + 1] = { path, v }
    return hole
  end
  if type(v) ~= "table" or depth > 64 then return v end
  local t = {}
  for k, x in pairs(v) do
    local p = { unpack(path) }
    p[#p + 1] = k
    t[k] = strip(x, p, list, depth + 1, hole)
  end
  return t
end

local U32 = ffi.new("uint8_t[4]")
local ZERO8 = ("\0"):rep(8)

--- The binary WebSocket message of an event holding arrays (lecho.array),
-- encoded once for every WebSocket client (doc/gateway.md "Arrays"): a
-- u32 little-endian length L, L bytes of a JSON header
-- {"ch":..,"ev":THE EVENT WITHOUT ITS ARRAYS,"arrays":[{"path":[..],
-- "dtype":"<f8","shape":[..],"offset":O,"bytes":B},..]}, zero bytes up to a
-- multiple of 8, then each array's elements (little-endian, row-major) at
-- O bytes past that point (O a multiple of 8): a browser views them in
-- place (new Float64Array(buf, base + O, B / 8)).  The elements are copied
-- once, from the read buffer into this message.  nil, the error text for
-- an event whose other fields JSON cannot represent.
-- Debian's LuaJIT (2.1.0~beta3+git20220320) has upstream issues #827 and
-- #829: a compiled or blacklisted pairs/next loop may stop early or crash.
-- These walk every event of every channel, recursively, with pairs: an early
-- stop in has_array would send an array event down the JSON path (an outside
-- review saw a long-running gateway do exactly that, never reproduced);
-- interpreted, they are exact.
for _, f in ipairs{ denull, hexify, has_array, strip } do jit.off(f) end

-- The binary message of list's arrays ({ path, array } each, from strip)
-- under a header: head(ARRAYS) is the header's JSON text given the JSON
-- list of the arrays' descriptions.  An array met twice (a service's first
-- result, also in results) is carried once, both paths at its offset.
local function pack(list, head)
  local parts, off, at = {}, 0, {}
  local function list_json(t) return #t == 0 and "[]" or cj.encode(t) end
  for i, pa in ipairs(list) do
    local a = pa[2]
    local n = a:count() * a:itemsize()
    local ok, path = pcall(list_json, pa[1])
    if ok and not ws.valid_utf8(path) then ok, path = pcall(list_json, hexify(pa[1], 0)) end
    if not ok then path = "[]" end
    local o = at[a]
    if not o then
      o = off
      at[a] = o
      pa[3] = n
      off = off + n + (-n) % 8
    end
    parts[i] = ('{"path":%s,"dtype":%s,"shape":%s,"offset":%d,"bytes":%d}'):format(
      path, cj.encode(a:dtype()), list_json(a:shape()), o, n)
  end
  local h = head("[" .. table.concat(parts, ",") .. "]")
  local L = #h
  U32[0], U32[1], U32[2], U32[3] = L % 256, math.floor(L / 256) % 256, math.floor(L / 65536) % 256,
    math.floor(L / 16777216) % 256
  local b = buffer.new(8 + L + off)
  b:putcdata(U32, 4):put(h, ZERO8:sub(1, (-(4 + L)) % 8))
  for _, pa in ipairs(list) do
    local n = pa[3]
    if n then
      local a = pa[2]
      if not a:contiguous() then a = a:copy() end
      if n > 0 then b:putcdata(a:ptr(), n) end
      b:put(ZERO8:sub(1, (-n) % 8))
    end
  end
  return b:tostring()
end

-- The JSON text of v (a table) with its strings made UTF-8, or nil, why.
local function json_of(v)
  local ok, e = pcall(jencode, v)
  if ok and not ws.valid_utf8(e) then ok, e = pcall(jencode, hexify(v, 0)) end
  if not ok then return nil, tostring(e) end
  return e
end

function M.event_binary(ch, ev)
  local list = {}
  local rest = strip(ev, {}, list, 0)
  local evj = ""
  if rest ~= nil then
    local e, why = json_of(rest)
    if not e then
      return nil, ('{"ch":%s,"error":%s}'):format(cj.encode(ch), cj.encode("event not representable in JSON: " .. why))
    end
    evj = ',"ev":' .. e
  end
  return pack(list, function(arrays) return ('{"ch":%s%s,"arrays":%s}'):format(cj.encode(ch), evj, arrays) end)
end

--- A reply (a table: id, ok, result, results...) holding arrays as one
-- binary message, laid out as an event's (doc/gateway.md "Arrays"): the
-- header is the reply without its arrays plus "arrays", each array's path
-- from the reply's top (["result","a"], ["results",1,"a"]).  nil when the
-- rest is not representable in JSON.
function M.reply_binary(t)
  local list = {}
  local rest = strip(t, {}, list, 0, null)
  local e = json_of(rest)
  if not e or e:sub(-1) ~= "}" or e == "{}" then return nil end
  return pack(list, function(arrays) return e:sub(1, -2) .. ',"arrays":' .. arrays .. "}" end)
end

--- What an event goes out as: (text for JSON-lines clients, message for
-- WebSocket clients, binary: whether that message is a binary one), each
-- made at most once (lazily: text only when asked), whatever the number of
-- clients.
function M.event_out(ch, ev)
  if not has_array(ev, 0) then
    local t = M.event_json(ch, ev)
    return function() return t end, t, false
  end
  local bin, errtext = M.event_binary(ch, ev)
  local text
  local function lines()
    if not text then text = M.event_json(ch, ev) end
    return text
  end
  if not bin then return lines, errtext, false end
  return lines, bin, true
end

local function encode(t)
  local ok, s = pcall(jencode, t)
  if ok and not ws.valid_utf8(s) then ok, s = pcall(jencode, hexify(t, 0)) end
  if not ok then
    return cj.encode{ id = t.id, error = "reply not representable in JSON: " .. tostring(s), code = "failed" }
  end
  return s
end

------------------------------------------------------------------------------
-- Listening.

local AF_INET6, IPPROTO_IPV6, IPV6_V6ONLY = 10, 41, 26

local function ntohs(p) return bit.band(p, 0xff) * 256 + bit.rshift(p, 8) end

-- "a.b.c.d:port" or "[v6]:port" of a socket address (struct lecho_sin6
-- big enough for both), as the rest of lecho writes addresses.
local function sa_text(sa)
  local txt = ffi.new("char[64]")
  if sa.family == AF_INET6 then
    local h = C.inet_ntop(AF_INET6, sa.addr, txt, 64)
    return ("[%s]:%d"):format(h ~= nil and ffi.string(h) or "?", ntohs(sa.port))
  end
  local h = C.inet_ntop(AF_INET, ffi.cast("char *", sa) + 4, txt, 64)
  return ("%s:%d"):format(h ~= nil and ffi.string(h) or "?", ntohs(sa.port))
end

-- A listening socket on `where` (IPv4 "a.b.c.d:port", "localhost:port" or
-- IPv6 "[v6]:port", "[v6%zone]:port"); beyond loopback (127.0.0.0/8, [::1])
-- only in keyed mode.
local function listen(where, keyed, what)
  local a, why = addr.parse(where, { listen = true })
  if not a then return nil, ("%s address %s: %s"):format(what, where, why) end
  local kind = addr.kind(a)
  if kind == "unix" then return nil, ("%s address %s: a TCP address (HOST:PORT or [V6]:PORT)"):format(what, a) end
  local host, port
  if kind == "ipv6" then host, port = a:match("^%[(.-)%]:(%d+)$") else host, port = a:match("^(.-):(%d+)$") end
  local loopback = kind == "ipv6" and host == "::1" or kind == "ipv4" and host:find("^127%.") ~= nil
  if not keyed and not loopback then
    return nil, ("refusing to listen on %s without client keys or tokens (protected mode: loopback only)"):format(a)
  end
  local sa = ffi.new("struct lecho_sin6")
  local salen = 16
  if kind == "ipv6" then
    local h, zone = host:match("^([^%%]*)%%?(.*)$")
    sa.family = AF_INET6
    C.inet_pton(AF_INET6, h, sa.addr)
    if zone ~= "" then sa.scope = tonumber(zone) or C.if_nametoindex(zone) end
    salen = 28
  else
    sa.family = AF_INET
    C.inet_pton(AF_INET, host, ffi.cast("char *", sa) + 4)
  end
  sa.port = C.htons(tonumber(port))
  local fd = C.socket(sa.family, SOCK_STREAM + SOCK_NONBLOCK + SOCK_CLOEXEC, 0)
  if fd < 0 then return nil, what .. ": socket: " .. errstr() end
  local one = ffi.new("int[1]", 1)
  C.setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, one, 4)
  -- [::]:port is IPv6 only: an IPv4 client comes to an IPv4 listener
  if kind == "ipv6" then C.setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, one, 4) end
  if C.bind(fd, sa, salen) ~= 0 or C.listen(fd, 128) ~= 0 then
    local e = errstr()
    C.close(fd)
    return nil, ("%s: cannot listen on %s: %s"):format(what, a, e)
  end
  local len = ffi.new("unsigned int[1]", 28)
  C.getsockname(fd, sa, len)
  return fd, sa_text(sa)
end

------------------------------------------------------------------------------
-- Clients.

local Gateway = {}
Gateway.__index = Gateway

local Client = {}
Client.__index = Client

-- Bytes queued for the client, not yet taken by its socket.
function Client:queued()
  if self.ws then return self.ws:queued() end
  return #self.out
end

-- What the client may have queued before it is held not to read: the
-- --max-queued bound (M.PREAUTH_QUEUED before a keyed client authenticated),
-- plus the one event larger than it that was taken on an empty queue
-- (Client:deliver), while that one is not all sent.
function Client:bound()
  local gw = self.gw
  local b = (gw.keyed and not self.principal) and math.min(gw.lim.queued, M.PREAUTH_QUEUED) or gw.lim.queued
  return b + self.over
end

-- Queues one message (a JSON text) for the client; the socket is written
-- at the end of this loop turn (many events, few system calls).
function Client:_put(text, binary)
  if self.closed then return end
  if self.ws then
    local ok, why = self.ws:queue(text, binary)
    if not ok then return self.gw:_drop(self, nil, why) end
  else
    self.out:put(text, "\n")
  end
  self.gw:_dirty(self)
end

-- A reply: a client that sends requests but does not read the answers is
-- closed once they pass --max-queued (events are dropped instead, replies
-- cannot be).
-- A reply holding arrays (a service's result) goes out as events do: a
-- binary message to a WebSocket client, { dtype, shape, data } in JSON to
-- a lines one (doc/gateway.md "Arrays").
function Client:reply(t)
  if self.closed or self.closing then return end
  if self:queued() > self:bound() then
    return self.gw:_drop(self, 1008, ("client does not read its replies (%d bytes queued)"):format(self:queued()))
  end
  if has_array(t, 0) then
    if self.ws then
      local bin = M.reply_binary(t)
      if bin then return self:_put(bin, true) end
    end
  end
  self:_put(encode(t))
end

-- An event for this client under the slow-client policy: text (a JSON
-- text), or M.event_out's three values (the binary message to a WebSocket
-- client, the JSON text to a lines one).
function Client:deliver(text, msg, binary)
  if msg ~= nil then
    if self.ws then text = msg else text, binary = text(), false end
  end
  if self.closed or self.closing then return end
  local gw = self.gw
  local q = self:queued()
  -- an event larger than --max-queued is taken when the queue is empty
  -- (the client holds at most that one event then; the gateway takes no
  -- event larger than its context's decoded-size limit); the bound is
  -- back to --max-queued once it is sent (Gateway:_flush)
  if q == 0 and #text > gw.lim.queued then
    self.over = #text
  elseif q + #text > gw.lim.queued then
    if gw.slow == "disconnect" then
      return gw:_drop(self, 1008, ("slow client: more than %d bytes queued"):format(gw.lim.queued))
    end
    self.drops = self.drops + 1
    gw.drops = gw.drops + 1
    -- told as soon as the queue is empty: now, when nothing is queued
    if q == 0 then gw:_dirty(self) end
    return
  end
  if self.drops > self.told then
    -- Once dropping, the client's gap stays one gap until its queue is
    -- below half: what comes meanwhile is dropped too, so the notice always
    -- comes before the first event after the gap (never after events that
    -- followed it).
    if q > gw.lim.queued / 2 then
      self.drops = self.drops + 1
      gw.drops = gw.drops + 1
      return
    end
    self:_put(('{"dropped":%d,"total":%d}'):format(self.drops - self.told, self.drops))
    self.told = self.drops
  end
  self.events = self.events + 1
  self:_put(text, binary)
end

function Gateway:_dirty(cl)
  if cl.dirty then return end
  cl.dirty = true
  local d = self.dirty
  d[#d + 1] = cl
  if not self.flusher then
    self.flusher = self.ctx.c:timer(0, 0, function()
      self.flusher = nil
      local list = self.dirty
      self.dirty = {}
      for i = 1, #list do
        local c = list[i]
        c.dirty = false
        self:_flush(c)
      end
    end)
  end
end

-- Writes what the client's socket takes; a write watcher for the rest.
function Gateway:_flush(cl)
  if cl.closed then return end
  local done
  if cl.ws then
    local ok, why = cl.ws:send()
    if ok == nil then return self:_drop(cl, nil, why) end
    done = ok
    if done and cl.closing then return self:_drop(cl) end
  else
    local out = cl.out
    while #out > 0 do
      local p, n = out:ref()
      local r = tonumber(C.send(cl.fd, p, n, MSG_NOSIGNAL))
      if r > 0 then
        out:skip(r)
        cl.bytes = cl.bytes + r
      else
        local e = ffi.errno()
        if r < 0 and (e == EAGAIN or e == EINTR) then break end
        return self:_drop(cl, nil, "send: " .. errstr())
      end
    end
    done = #out == 0
    if done and cl.closing then return self:_drop(cl) end
  end
  if done then
    if cl.wwatch then cl.wwatch:stop(); cl.wwatch = nil end
    cl.over = 0
    if cl.drops > cl.told then cl:deliver_notice() end
  elseif not cl.wwatch then
    cl.wwatch = self.ctx.c:io(cl.fd, function() self:_flush(cl) end, "w")
  end
end

-- A drained queue tells the client what it missed at once.
function Client:deliver_notice()
  if self.drops > self.told then
    self:_put(('{"dropped":%d,"total":%d}'):format(self.drops - self.told, self.drops))
    self.told = self.drops
  end
end

-- Ends a client: told why (a WebSocket close code and reason, or an error
-- line), logged once, its subscriptions gone.
function Gateway:_drop(cl, code, why)
  if cl.closed then return end
  if code and not cl.closing then
    cl.closing = true
    if cl.ptimer then cl.ptimer:stop(); cl.ptimer = nil end
    if why then self.ctx.log(("gateway: client %d (%s) closed: %s"):format(cl.id, cl.peer or "?", why)) end
    -- (what is queued goes first if the socket takes it: a reply saying
    -- why; wslay sends a close frame before queued messages otherwise)
    -- (wslay reads nothing more: the watcher stops, else a client still
    -- sending would wake the loop for nothing until the end)
    if cl.ws then
      pcall(cl.ws.send, cl.ws); cl.ws:close(code, why or "")
      if cl.watch then cl.watch:stop(); cl.watch = nil end
    else cl.out:put(encode{ error = why, closed = true }, "\n") end
    if cl.dtimer then cl.dtimer:stop() end
    cl.dtimer = self.ctx.c:timer(M.LINGER, 0, function() self:_drop(cl) end)  -- bounded linger for the close
    return self:_flush(cl)
  end
  cl.closed = true
  for _, w in ipairs{ "watch", "wwatch", "dtimer", "ptimer", "again" } do
    if cl[w] then cl[w]:stop(); cl[w] = nil end
  end
  for name in pairs(cl.subs) do self:_unsub(cl, name) end
  self:_release(cl)
  if cl.ws then cl.ws:free() end
  C.close(cl.fd)
  self.clients[cl] = nil
  self.nclients = self.nclients - 1
  if why and not code then self.ctx.log(("gateway: client %d (%s) gone: %s"):format(cl.id, cl.peer or "?", why)) end
end

function Gateway:_accept(lfd, kind)
  while true do
    local sa, salen = ffi.new("struct lecho_sin6"), ffi.new("unsigned int[1]", 28)
    local fd = C.accept4(lfd, sa, salen, SOCK_NONBLOCK + SOCK_CLOEXEC)
    if fd < 0 then return end
    if self.nclients >= self.lim.clients then
      local msg = kind == "lines" and '{"error":"too many clients","closed":true}\n'
        or "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 17\r\nConnection: close\r\n\r\ntoo many clients\n"
      C.send(fd, msg, #msg, MSG_NOSIGNAL)
      C.close(fd)
      self.refused = self.refused + 1
      self.ctx:_warn_limited("gateway_clients", ("gateway: a client refused past the limit of %d"):format(self.lim.clients))
    else
      local one = ffi.new("int[1]", 1)
      C.setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, one, 4)
      C.setsockopt(fd, SOL_SOCKET, SO_SNDBUF, ffi.new("int[1]", SNDBUF), 4)
      if self.lim.ping > 0 then
        -- a client whose host vanished (no FIN, no RST: a cable, a suspended
        -- laptop) is found by the kernel: probes after lim.ping idle
        -- seconds, the read fails with ETIMEDOUT and the client is dropped
        local t = math.max(1, math.floor(self.lim.ping))
        C.setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, one, 4)
        C.setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, ffi.new("int[1]", t), 4)
        C.setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, ffi.new("int[1]", math.max(1, math.floor(t / 2))), 4)
        C.setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, ffi.new("int[1]", 3), 4)
      end
      self.nextid = self.nextid + 1
      local cl = setmetatable({ gw = self, fd = fd, id = self.nextid, kind = kind, head = "", out = buffer.new(),
                                peer = sa_text(sa),
                                subs = {}, nsubs = 0, used = {}, nused = 0, drops = 0, told = 0, over = 0, events = 0, bytes = 0, inflight = 0,
                                last_events = 0, last_bytes = 0, rate = 0, bps = 0, t0 = self.ctx.c:now() }, Client)
      self.clients[cl] = true
      self.nclients = self.nclients + 1
      cl.watch = self.ctx.c:io(fd, function() self:_read(cl) end)
      if kind == "lines" then
        cl.kind = "lines"
        self:_hello(cl)
      else
        cl.kind = "http"
        cl.dtimer = self.ctx.c:timer(self.lim.handshake, 0, function()
          self:_drop(cl, nil, "no complete request in time")
        end)
      end
    end
  end
end

function Gateway:_hello(cl)
  if self.keyed and not cl.principal then
    cl.nonce = ("%.0f%.0f"):format(core.random_id(), core.random_id())
    if cl.dtimer then cl.dtimer:stop() end
    cl.dtimer = self.ctx.c:timer(self.lim.handshake, 0, function()
      cl.dtimer = nil
      if not cl.principal then self:_drop(cl, 1008, "not authenticated in time") end
    end)
  elseif cl.dtimer then
    cl.dtimer:stop(); cl.dtimer = nil
  end
  cl:reply{ hello = "lecho-gateway", version = 1, auth = (self.keyed and not cl.principal) and "required" or nil,
            principal = cl.principal, nonce = cl.nonce, slow = self.slow,
            limits = { message = self.lim.message, subs = self.lim.subs, queued = self.lim.queued,
                       channels = self.lim.channels } }
end

local rbuf_size = 65536

-- A client that leaves a message incomplete (a frame header with its
-- payload not all sent, a fragmented message unfinished, a JSON line without
-- its newline) for lim.partial seconds is closed: such a connection held
-- open forever, 256 of them, would fill --max-clients.
function Gateway:_deadline(cl, partial)
  if cl.closed or cl.closing then return end
  if not partial then
    if cl.ptimer then cl.ptimer:stop(); cl.ptimer = nil end
  elseif not cl.ptimer then
    cl.ptimer = self.ctx.c:timer(self.lim.partial, 0, function()
      cl.ptimer = nil
      self:_drop(cl, 1008, ("a message left incomplete for %g s"):format(self.lim.partial))
    end)
  end
end

function Gateway:_read(cl)
  if cl.closed then return end
  if cl.ws then
    -- what this read may make the gateway queue (pongs) is bounded: wslay
    -- reads nothing more once the queue is past the client's bound
    local bound = cl:bound()
    local q0 = cl:queued()
    local msgs, why, wcode = cl.ws:recv(math.max(bound, q0))
    if msgs then
      for i = 1, #msgs, 2 do
        if cl.closed or cl.closing then break end
        if msgs[i] == 1 then self:_message(cl, msgs[i + 1])
        else cl:reply{ error = "binary messages are not taken from clients", code = "invalid" } end
      end
    end
    -- a message may have ended the client (a failed auth): its connection is gone
    if cl.closed then return end
    -- wslay answers every ping with a pong by itself: a client that pings
    -- and does not read is held to its bound like one that asks and does
    -- not read its replies (each pong counted with its frame header and
    -- wslay's bookkeeping: lua_ws.c WS_MSG_COST)
    -- (the bound after the read: an auth in it raised it)
    if not cl.closing and cl:queued() > math.max(bound, cl:bound(), q0) then
      return self:_drop(cl, 1008, ("client does not read (%d bytes queued, its pongs among them)"):format(cl:queued()))
    end
    if why then
      if why:find("^closed") then pcall(cl.ws.send, cl.ws) end   -- wslay's answering close frame
      if why == "eof" or why:find("^closed") then return self:_drop(cl, nil, nil) end
      return self:_drop(cl, wcode, why)   -- wcode 1009: a frame declared more than lim.message
    end
    self:_deadline(cl, cl.ws:partial())
    if not cl.ws:want_read() then
      -- wslay refused the input (a protocol error, a message past the size
      -- limit): its close frame is queued; the connection ends once sent
      cl.closing = true
      if cl.watch then cl.watch:stop(); cl.watch = nil end
      if cl.ptimer then cl.ptimer:stop(); cl.ptimer = nil end
      self.ctx.log(("gateway: client %d (%s) closed by the WebSocket layer (bad frame or message over %d bytes)"):format(
        cl.id, cl.peer or "?", self.lim.message))
      if not cl.dtimer then cl.dtimer = self.ctx.c:timer(M.LINGER, 0, function() self:_drop(cl) end) end
      self:_flush(cl)
    elseif cl.ws:want_write() then
      self:_dirty(cl)  -- pongs and close replies wslay queued
    end
    return
  end
  -- JSON lines not yet taken (past one turn's LINE_BATCH) go first: nothing
  -- more is read from the client until they are
  if cl.kind == "lines" and not cl.closing and cl.head:find("\n", 1, true) then return self:_lines(cl) end
  -- at most 4 reads (256 KiB) of an HTTP head per loop turn, one (64 KiB)
  -- of JSON lines: a client that sends without pause cannot hold the loop
  -- from the others (the watcher fires again)
  for _ = 1, 4 do
    if cl.closed then return end
    local r = tonumber(C.recv(cl.fd, self.rbuf, rbuf_size, 0))
    if r == 0 then return self:_drop(cl) end
    if r < 0 then
      local e = ffi.errno()
      if e == EAGAIN or e == EINTR then return end
      return self:_drop(cl, nil, "recv: " .. errstr())
    end
    local s = ffi.string(self.rbuf, r)
    if cl.kind == "http" then
      cl.head = cl.head .. s
      local e = cl.head:find("\r\n\r\n", 1, true)
      -- the limit holds for a whole head that came in one read too
      if (e and e + 3 or #cl.head) > self.lim.head then
        return self:_http_error(cl, 431, "request head too large")
      end
      if e then
        local rest = cl.head:sub(e + 4)
        cl.head = cl.head:sub(1, e + 3)
        return self:_http(cl, rest)
      end
    elseif not cl.closing then
      cl.head = cl.head .. s
      return self:_lines(cl)
    end
  end
end

-- JSON lines: whole lines to _message, at most LINE_BATCH per loop turn
-- (a read of 64 KiB may hold 32768 of them: the rest waits in cl.head, a
-- timer takes it next turn); a line longer than the limit ends the client.
local LINE_BATCH = 256
function Gateway:_lines(cl)
  if cl.again then cl.again:stop(); cl.again = nil end
  if cl.closed or cl.closing then return end
  local acc, pos = cl.head, 1
  for _ = 1, LINE_BATCH do
    local nl = acc:find("\n", pos, true)
    if not nl then break end
    local line = acc:sub(pos, nl - 1)
    pos = nl + 1
    if #line > self.lim.message then
      return self:_drop(cl, 1009, ("message over %d bytes"):format(self.lim.message))
    end
    if line:find("%S") then self:_message(cl, line) end
    if cl.closed or cl.closing then return end
  end
  cl.head = acc:sub(pos)
  if cl.head:find("\n", 1, true) then
    cl.again = self.ctx.c:timer(0, 0, function() cl.again = nil; self:_lines(cl) end)
    return
  end
  if #cl.head > self.lim.message then
    return self:_drop(cl, 1009, ("message over %d bytes"):format(self.lim.message))
  end
  self:_deadline(cl, cl.head:find("%S") ~= nil)
end

------------------------------------------------------------------------------
-- HTTP: the page, and the WebSocket handshake.

local REASON = { [200] = "OK", [400] = "Bad Request", [401] = "Unauthorized", [403] = "Forbidden",
                 [404] = "Not Found", [405] = "Method Not Allowed", [426] = "Upgrade Required",
                 [431] = "Request Header Fields Too Large", [503] = "Service Unavailable" }

-- The live view's icon (the page names /favicon.svg; browsers ask for
-- /favicon.ico whatever the page says): a trace on the page's colours.
local ICON = '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16">'
  .. '<rect width="16" height="16" rx="3" fill="#182028"/>'
  .. '<path d="M2 9h3l2-5 2 8 2-5h3" fill="none" stroke="#4fb3ff" stroke-width="1.6" stroke-linejoin="round"/></svg>\n'

function Gateway:_http_error(cl, code, why, extra)
  self:_http_send(cl, code, "text/plain; charset=utf-8", why .. "\n", extra)
  if code ~= 404 then
    self.ctx.log(("gateway: client %d (%s) refused: %d %s"):format(cl.id, cl.peer or "?", code, why))
  end
end

function Gateway:_http_send(cl, code, ctype, body, extra)
  cl.kind = "done"
  if cl.watch then cl.watch:stop(); cl.watch = nil end
  cl.out:put(("HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nCache-Control: no-store\r\n%sConnection: close\r\n\r\n"):format(
    code, REASON[code] or "Error", ctype, #body, extra or ""), cl.head_only and "" or body) -- HEAD: no body (RFC 9110 9.3.2)
  cl.closing = true
  self:_flush(cl)
end

local function unquery(s)
  return (s:gsub("+", " "):gsub("%%(%x%x)", function(h) return string.char(tonumber(h, 16)) end))
end

function Gateway:_http(cl, rest)
  if cl.dtimer then cl.dtimer:stop(); cl.dtimer = nil end
  local head = cl.head
  cl.head = ""
  local method, target, ver = head:match("^(%u+) (%S+) HTTP/(%d%.%d)\r\n")
  if not method then return self:_http_error(cl, 400, "not an HTTP/1.x request") end
  cl.head_only = method == "HEAD"
  local h = {}
  for k, v in head:gmatch("\r\n([^:\r\n]+):[ \t]*([^\r\n]*)") do
    k = k:lower()
    h[k] = h[k] and (h[k] .. ", " .. v) or v
  end
  local path, query = target:match("^([^?]*)%??(.*)$")
  local q = {}
  for k, v in query:gmatch("([^&=]+)=([^&]*)") do q[unquery(k)] = unquery(v) end
  if (h.upgrade or ""):lower() ~= "websocket" then
    if method ~= "GET" and method ~= "HEAD" then return self:_http_error(cl, 405, "only GET and HEAD", "Allow: GET, HEAD\r\n") end
    if path == "/" or path == "/index.html" then
      return self:_http_send(cl, 200, "text/html; charset=utf-8", self.page)
    end
    if path == "/favicon.ico" or path == "/favicon.svg" then
      return self:_http_send(cl, 200, "image/svg+xml", ICON)
    end
    return self:_http_error(cl, 404, "no such page")
  end
  -- RFC 6455 4.2.1
  if method ~= "GET" or ver ~= "1.1" then return self:_http_error(cl, 400, "a WebSocket handshake is GET HTTP/1.1") end
  if not (h.connection or ""):lower():find("upgrade", 1, true) then
    return self:_http_error(cl, 400, "Connection: Upgrade missing")
  end
  if h["sec-websocket-version"] ~= "13" then
    return self:_http_send(cl, 426, "text/plain", "WebSocket version 13 only\n", "Sec-WebSocket-Version: 13\r\n")
  end
  local key = h["sec-websocket-key"] or ""
  if not key:match("^[%w+/]+=*$") or #key ~= 24 then return self:_http_error(cl, 400, "bad Sec-WebSocket-Key") end
  if path ~= "/ws" and path ~= "/" then return self:_http_error(cl, 404, "WebSocket endpoint is /ws") end
  -- a browser page of another site must not drive a loopback gateway
  local origin = h.origin
  if origin and not self.origins[origin] then
    local host = h.host or ""
    if origin ~= "http://" .. host then return self:_http_error(cl, 403, "origin " .. origin .. " not allowed") end
  end
  local token = q.token or (h.authorization or ""):match("^[Bb]earer%s+(%S+)$")
  if token then
    local p = self.tokens[token]
    if not p then return self:_http_error(cl, 401, "unknown token") end
    cl.principal = p
  end
  cl.out:put("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ",
    ws.accept(key), "\r\n\r\n")
  self:_flush(cl)
  if cl.closed then return end
  cl.kind = "ws"
  cl.ws = ws.server(cl.fd, self.lim.message)
  if #rest > 0 then cl.ws:feed(rest) end
  -- what the out buffer still holds of the 101 goes first: wait for it
  if #cl.out > 0 then return self:_drop(cl, nil, "socket full during the handshake") end
  self:_hello(cl)
  if #rest > 0 then return self:_read(cl) end
end

------------------------------------------------------------------------------
-- Messages.

local function err(cl, id, msg, code)
  cl:reply{ id = id, error = msg, code = code or "invalid" }
end

-- May cl's principal do action on ch?  Protected mode: every local client may.
function Gateway:_may(cl, action, ch)
  if not self.keyed then return true end
  if not self.policy then return nil, "not allowed: the gateway has no policy" end
  return self.policy:check(cl.principal, action, ch)
end

local OPS = {}

function Gateway:_message(cl, text)
  local ok, m = pcall(cj.decode, text)
  if not ok then return err(cl, nil, "not a JSON object: " .. tostring(m), "invalid") end
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

function OPS.auth(self, cl, m, id)
  if cl.principal then
    return err(cl, id, ("already authenticated as %s (a connection keeps its principal)"):format(cl.principal), "invalid")
  end
  local p
  if type(m.token) == "string" then
    p = self.tokens[m.token]
  elseif type(m.key) == "string" and type(m.sig) == "string" and cl.nonce then
    local pk, sig = core.unhex(m.key), core.unhex(m.sig)
    local name = pk and self.keys[pk]
    if name and sig and core.verify(pk, M.auth_message(cl.nonce), sig) then p = name end
  end
  if not p then
    err(cl, id, "authentication failed", "auth")
    return self:_drop(cl, 1008, "authentication failed")
  end
  cl.principal = p
  if cl.dtimer and not cl.closing then cl.dtimer:stop(); cl.dtimer = nil end
  self.ctx.log(("gateway: client %d authenticated as %s"):format(cl.id, p), "info")
  cl:reply{ id = id, ok = true, principal = p }
end

--- What a key signs to authenticate: the nonce of the gateway's hello.
function M.auth_message(nonce) return "lecho-gateway auth " .. nonce end

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
        cl:deliver(M.event_out(ch, ev))
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
      local lines, msg, binary = M.event_out(ch, ev)
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
  for key, how in pairs(cl.used) do
    if how == "pub" then
      local n = (self.pubusers[key] or 1) - 1
      self.pubusers[key] = n > 0 and n or nil
      local p = self.producers[key]
      if n <= 0 and p and cl.inflight == 0 then
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

------------------------------------------------------------------------------

--- A gateway on ctx: opts.listen (HTTP and WebSocket, default
-- "127.0.0.1:8080"), opts.lines (JSON lines, optional), opts.tokens
-- ({ token = principal }), opts.keys ({ {name, public}... }: client keys),
-- opts.policy (a lecho.policy; needed in keyed mode), opts.limits (over
-- M.LIMITS), opts.slow ("drop" or "disconnect"), opts.origins (more
-- allowed Origin values), opts.modulators (false: none taken).
-- The gateway (its addr, lines_addr), or nil, why.
-- (for spec/gateway_spec.lua: the requests and the gateway's methods)
M._OPS, M._Gateway = OPS, Gateway

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
  local tokens, keys = {}, {}
  local keyed = false
  for t, p in pairs(opts.tokens or {}) do
    if type(t) ~= "string" or #t < 16 or type(p) ~= "string" then
      return nil, "tokens: each token a string of at least 16 bytes mapped to a principal name"
    end
    tokens[t] = p
    keyed = true
  end
  for _, k in ipairs(opts.keys or {}) do
    keys[k.public] = k.name
    keyed = true
  end
  if keyed and not opts.policy then return nil, "keyed mode (tokens or client keys) needs a policy" end
  local origins = {}
  for _, o in ipairs(opts.origins or {}) do origins[o] = true end
  local self = setmetatable({ ctx = ctx, lim = lim, slow = slow, tokens = tokens, keys = keys, keyed = keyed,
                              policy = opts.policy, origins = origins, modulators = opts.modulators ~= false,
                              clients = {}, nclients = 0, chans = {}, producers = {}, dirty = {}, nextid = 0,
                              refused = 0, drops = 0, events = 0, rbuf = ffi.new("uint8_t[?]", rbuf_size),
                              page = opts.page or require("lecho.gateway_page") }, Gateway)
  local fd, a = listen(opts.listen or "127.0.0.1:8080", keyed, "gateway")
  if not fd then return nil, a end
  self.fd, self.addr = fd, a
  self.watch = ctx.c:io(fd, function() self:_accept(fd, "http") end)
  if opts.lines then
    local lfd, la = listen(opts.lines, keyed, "gateway lines")
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

-- Every lim.ping seconds: a WebSocket client from which nothing came since
-- the last round is pinged (a browser answers with a pong by itself); one
-- still silent a round later is closed (1001, said and logged), its
-- subscriptions and queue freed.  JSON-lines clients may be silent
-- listeners: TCP keepalive (set at accept) finds their dead hosts.
function Gateway:_pings()
  for cl in pairs(self.clients) do
    if cl.ws and not cl.closing and not cl.closed then
      local n = cl.ws:bytes_in()
      if n ~= cl.ping_in then
        cl.ping_in, cl.pinged = n, false
      elseif not cl.pinged then
        cl.pinged = true
        cl.ws:ping()
        self:_dirty(cl)
      else
        self:_drop(cl, 1001, ("no answer to a ping in %g s"):format(self.lim.ping))
      end
    end
  end
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
