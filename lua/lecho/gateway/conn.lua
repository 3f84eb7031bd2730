-- lecho.gateway.conn: the gateway's sockets on the context's loop, through
-- the FFI (Linux, IPv4 and IPv6): listening (loopback only unless keyed),
-- accepting (--max-clients, socket options, TCP keepalive), reading (an
-- HTTP head to lecho.gateway.http, WebSocket messages through lecho.ws, JSON
-- lines; each client's message to lecho.gateway.ops), writing the queues
-- at the end of a loop turn, the deadlines of incomplete messages, pings
-- of silent WebSocket clients, and ending a client (told why, logged once,
-- its subscriptions gone).  Its functions are methods of the Gateway
-- (listed in lecho.gateway's header, which mixes them in).

local ffi = require "ffi"
local bit = require "bit"
local buffer = require "string.buffer"
local addr = require "lecho.addr"
local Client = require("lecho.gateway.client").Client
local encode = require("lecho.gateway.wire").encode

local M = {}
-- seconds a client being closed has to take what was queued and the close
M.LINGER = 5

local Gateway = {}   -- this file's methods of lecho.gateway's Gateway
M.Gateway = Gateway

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

M.listen = listen

-- The size of a gateway's read buffer (Gateway.rbuf, made by lecho.gateway).
local rbuf_size = 65536
M.RBUF_SIZE = rbuf_size

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

return M
