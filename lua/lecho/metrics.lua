-- lecho.metrics: a context's counters over HTTP, in the Prometheus text
-- exposition format 0.0.4 (doc/operations.md "Metrics"):
--
--   lecho.context{ metrics = "127.0.0.1:9100" }    -- GET /metrics
--   lecho-nameserver --metrics 127.0.0.1:9100
--
-- Served on the context's own libev loop (ctx:on_readable, timers): the
-- listening socket and every connection are non-blocking, a request is
-- read as it comes and the answer written as the socket takes it.  Limits
-- (M.LIMITS): a request of at most 8 KiB (else 431), 16 connections at once
-- (past it: 503 and closed), 5 s for a whole exchange (a slow client is
-- closed).  IPv4 only; in protected mode loopback only, like every
-- listener of lecho.  Paths: /metrics (and /) the text format, /stats the
-- snapshot of lecho.stats as JSON; anything else 404, a method but GET 405.
--
-- M.render(snapshot) makes the text from lecho.stats.snapshot; it is pure
-- and what spec/metrics_spec.lua checks against its own parser.
-- Sockets through the FFI (Linux values); no global state: a server is a
-- table owned by its context (ctx.metrics), closed by ctx:close().

local ffi = require "ffi"
local bit = require "bit"
local addr = require "lecho.addr"
local stats = require "lecho.stats"
-- Loops over keys as `in each(t)`, never `in pairs(t)`: no ITERN loop, which
-- Debian's LuaJIT may never end in the close at the program's end (context.lua).
local each = pairs

local M = {}

M.LIMITS = { request_bytes = 8192, connections = 16, deadline = 5 }

require "lecho.sockets"     -- the socket calls, declared once
local C = ffi.C
local AF_INET, SOCK_STREAM, SOCK_NONBLOCK, SOCK_CLOEXEC = 2, 1, 2048, 524288
local SOL_SOCKET, SO_REUSEADDR, MSG_NOSIGNAL = 1, 2, 0x4000
local EAGAIN, EINTR = 11, 4

local function errstr() return ffi.string(C.strerror(ffi.errno())) end

------------------------------------------------------------------------------
-- The text format.

-- A label value escaped: backslash, double quote and newline.
function M.escape(v)
  return (tostring(v):gsub("[\\\"\n]", { ["\\"] = "\\\\", ['"'] = '\\"', ["\n"] = "\\n" }))
end
local escape = M.escape

local function num(v)
  if v ~= v then return "NaN" end
  if v == math.huge then return "+Inf" elseif v == -math.huge then return "-Inf" end
  if v == math.floor(v) and math.abs(v) < 2 ^ 53 then return ("%d"):format(v) end
  local s = ("%.15g"):format(v)       -- the shortest of these that reads back the same
  if tonumber(s) ~= v then s = ("%.17g"):format(v) end
  return s
end

-- The families: { name, type, help, field }.  Counters end in _total.
local CTX = {
  { "lecho_encodes_total", "counter", "Values encoded.", "encodes" },
  { "lecho_bad_frames_total", "counter", "Frames refused as malformed.", "bad_frames" },
  { "lecho_stale_acks_total", "counter", "Answers dropped: the connection their event came on had ended.", "stale_acks" },
  { "lecho_connections", "gauge", "Open connections (what max_connections counts).", "connections" },
  { "lecho_read_buffer_bytes", "gauge", "Bytes in the read buffers of all connections (max_buffered).", "read_buffer_bytes" },
  { "lecho_local_queue_events", "gauge", "Events queued for local consumers.", "local_queue_events" },
  { "lecho_local_queue_bytes", "gauge", "Bytes queued for local consumers.", "local_queue_bytes" },
  { "lecho_undelivered_total", "counter", "Events of ours lost with a connection (not a queue policy): ctx:close() reports them.", "undelivered" },
  { "lecho_unconfirmed_total", "counter", "Events of ours written to a consumer context whose connection ended abnormally before it confirmed reading them: ctx:close() reports them.", "unconfirmed" },
}
local PEER = {
  { "lecho_peer_events_in_total", "counter", "Events received from the peer.", "events_in" },
  { "lecho_peer_events_out_total", "counter", "Events sent to the peer.", "events_out" },
  { "lecho_peer_bytes_in_total", "counter", "Wire bytes received from the peer.", "bytes_in" },
  { "lecho_peer_bytes_out_total", "counter", "Wire bytes sent to the peer.", "bytes_out" },
  { "lecho_peer_batches_total", "counter", "Writes (writev calls) to the peer.", "batches" },
  { "lecho_peer_drops_total", "counter", "Events dropped for the peer: its queue policy, or lost with its connection.", "drops" },
  { "lecho_peer_undelivered_total", "counter", "Of drops: events lost with the peer's connection, not a queue policy.", "undelivered" },
  { "lecho_peer_confirmed_total", "counter", "Events of ours the peer confirmed reading (read confirmation).", "confirmed" },
  { "lecho_peer_unconfirmed_total", "counter", "Events of ours written to the peer, never confirmed read: its connection ended abnormally first.", "unconfirmed" },
  { "lecho_peer_ctrl_in_total", "counter", "Control messages received from the peer.", "ctrl_in" },
  { "lecho_peer_ctrl_out_total", "counter", "Control messages sent to the peer.", "ctrl_out" },
  { "lecho_peer_dials_total", "counter", "Connections this context started to the peer.", "dials" },
  { "lecho_peer_heartbeats_in_total", "counter", "HEARTBEAT and PING frames received.", "heartbeats_in" },
  { "lecho_peer_heartbeats_out_total", "counter", "HEARTBEAT and PING frames sent.", "heartbeats_out" },
  { "lecho_peer_heartbeat_timeouts_total", "counter", "Times the peer was declared dead.", "heartbeat_timeouts" },
  { "lecho_peer_gaps_total", "counter", "Sequence gaps seen from the peer's producers.", "gaps" },
  { "lecho_peer_lost_total", "counter", "Events known lost from the peer's producers.", "lost" },
  { "lecho_peer_duplicates_total", "counter", "Duplicate events from the peer's producers.", "duplicates" },
  { "lecho_peer_refused_total", "counter", "Events from the peer refused (unlisted producer, unbound channel).", "refused" },
  { "lecho_peer_queue_events", "gauge", "Events queued for the peer.", "queue_events" },
  { "lecho_peer_queue_bytes", "gauge", "Bytes queued for the peer.", "queue_bytes" },
  { "lecho_peer_connected", "gauge", "1 while the connection to the peer is up.", "connected" },
}
local CHAN = {
  { "lecho_channel_events_in_total", "counter", "Events received on the channel.", "events_in" },
  { "lecho_channel_events_out_total", "counter", "Events queued toward consuming contexts of other processes, once per destination.", "events_out" },
  { "lecho_channel_bytes_in_total", "counter", "Encoded value bytes received on the channel.", "bytes_in" },
  { "lecho_channel_bytes_out_total", "counter", "Encoded value bytes queued toward consuming contexts of other processes, once per destination.", "bytes_out" },
  { "lecho_channel_events_local_total", "counter", "Events delivered to consumers in this process.", "events_local" },
  { "lecho_channel_events_no_dest_total", "counter", "Events submitted while the channel had no consumer, remote or local.", "events_no_dest" },
  { "lecho_channel_encodes_total", "counter", "Values of the channel encoded.", "encodes" },
  { "lecho_channel_drops_total", "counter", "Events of the channel dropped: a queue policy, or lost with a connection.", "drops" },
  { "lecho_channel_undelivered_total", "counter", "Of drops: events of the channel lost with a connection, not a queue policy.", "undelivered" },
  { "lecho_channel_gaps_total", "counter", "Sequence gaps on the channel.", "gaps" },
  { "lecho_channel_lost_total", "counter", "Events of the channel known lost.", "lost" },
  { "lecho_channel_duplicates_total", "counter", "Duplicate events on the channel.", "duplicates" },
  { "lecho_channel_refused_total", "counter", "Events of the channel refused.", "refused" },
  { "lecho_channel_destinations", "gauge", "Consumer contexts this process sends the channel to.", "destinations" },
  { "lecho_channel_producers", "gauge", "Producers of the channel in this process.", "producers" },
  { "lecho_channel_consumers", "gauge", "Consumers of the channel in this process.", "consumers" },
}

local function sorted(t)
  local k = {}
  for n in each(t or {}) do k[#k + 1] = n end
  table.sort(k)
  return k
end

local function value_of(v)
  if v == true then return 1 elseif v == false or v == nil then return 0 end
  return tonumber(v) or 0
end

--- The exposition text of a lecho.stats snapshot.
function M.render(s)
  local out = {}
  local function w(line) out[#out + 1] = line end
  w("# HELP lecho_info The process: its address, role and principal (keyed mode).")
  w("# TYPE lecho_info gauge")
  w(('lecho_info{addr="%s",role="%s",principal="%s"} 1'):format(escape(s.addr or ""), escape(s.role or ""),
    escape(s.principal or "")))
  for _, f in ipairs(CTX) do
    w(("# HELP %s %s"):format(f[1], f[3]))
    w(("# TYPE %s %s"):format(f[1], f[2]))
    w(("%s %s"):format(f[1], num(value_of(s[f[4]]))))
  end
  local function family(list, t, label)
    local keys = sorted(t)
    for _, f in ipairs(list) do
      w(("# HELP %s %s"):format(f[1], f[3]))
      w(("# TYPE %s %s"):format(f[1], f[2]))
      for _, k in ipairs(keys) do
        w(('%s{%s="%s"} %s'):format(f[1], label, escape(k), num(value_of(t[k][f[4]]))))
      end
    end
  end
  family(PEER, s.peers or {}, "peer")
  family(CHAN, s.channels or {}, "channel")
  -- sync latencies: cumulative buckets ending in +Inf, which equals _count
  local hs, bounds = s.sync_latency or {}, s.bounds or stats.BUCKETS
  local names = sorted(hs)
  w("# HELP lecho_sync_latency_seconds Time p:submit_sync waited for every consumer's answer.")
  w("# TYPE lecho_sync_latency_seconds histogram")
  for _, n in ipairs(names) do
    local h, acc, ch = hs[n], 0, escape(n)
    for i, b in ipairs(bounds) do
      acc = acc + (h.buckets[i] or 0)
      w(('lecho_sync_latency_seconds_bucket{channel="%s",le="%s"} %s'):format(ch, num(b), num(acc)))
    end
    w(('lecho_sync_latency_seconds_bucket{channel="%s",le="+Inf"} %s'):format(ch, num(h.count)))
    w(('lecho_sync_latency_seconds_sum{channel="%s"} %s'):format(ch, num(h.sum)))
    w(('lecho_sync_latency_seconds_count{channel="%s"} %s'):format(ch, num(h.count)))
  end
  w("# HELP lecho_sync_failed_total Submits with submit_sync that did not return true.")
  w("# TYPE lecho_sync_failed_total counter")
  for _, n in ipairs(names) do
    w(('lecho_sync_failed_total{channel="%s"} %s'):format(escape(n), num(hs[n].failed or 0)))
  end
  w("# HELP lecho_stats_truncated Entries (channels, peers) left out of this page past 4096 each.")
  w("# TYPE lecho_stats_truncated gauge")
  w(("lecho_stats_truncated %s"):format(num(s.truncated or 0)))
  return table.concat(out, "\n") .. "\n"
end

------------------------------------------------------------------------------
-- The HTTP side.

local Server = {}
Server.__index = Server


local REASON = { [200] = "OK", [404] = "Not Found", [405] = "Method Not Allowed",
                 [431] = "Request Header Fields Too Large", [400] = "Bad Request",
                 [503] = "Service Unavailable", [500] = "Internal Server Error" }

local function response(code, ctype, body)
  return ("HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"):format(
    code, REASON[code], ctype, #body, body)
end

-- Ends connection cn: its watcher, timers and descriptor.
function Server:_drop(cn)
  if cn.closed then return end
  cn.closed = true
  if cn.watch then cn.watch:stop() end
  if cn.deadline then cn.deadline:stop() end
  if cn.poll then cn.poll:stop() end
  C.close(cn.fd)
  self.conns[cn] = nil
  self.nconns = self.nconns - 1
end

-- Writes what is left of cn.out; on EAGAIN polls every 10 ms (the loop's
-- descriptor watchers are for reading only) until done or the deadline.
-- Then closes at once when nothing more came from the client (the usual
-- GET); else ends our side and reads (discarding) until the client closes
-- or the deadline: closed with unread bytes, the socket would send a
-- reset, which can destroy the answer before the client read it.
function Server:_write(cn)
  while cn.off < #cn.out do
    local n = tonumber(C.send(cn.fd, ffi.cast("const char *", cn.out) + cn.off, #cn.out - cn.off, MSG_NOSIGNAL))
    if n > 0 then
      cn.off = cn.off + n
    else
      local e = ffi.errno()
      if n < 0 and (e == EAGAIN or e == EINTR) then
        if not cn.poll then cn.poll = self.ctx.c:timer(0.01, 0.01, function() self:_write(cn) end) end
        return
      end
      return self:_drop(cn)
    end
  end
  if cn.poll then cn.poll:stop(); cn.poll = nil end
  local n = tonumber(C.recv(cn.fd, self.rbuf, 4096, 0))
  if n == 0 or (n < 0 and ffi.errno() == EAGAIN) then return self:_drop(cn) end
  C.shutdown(cn.fd, 1) -- SHUT_WR
  cn.draining = true
  cn.watch = self.ctx.c:io(cn.fd, function() self:_read(cn) end)
  self:_read(cn)
end

function Server:_answer(cn, code, ctype, body)
  if cn.watch then cn.watch:stop(); cn.watch = nil end
  cn.out, cn.off = response(code, ctype, body), 0
  self.requests = self.requests + 1
  self:_write(cn)
end

-- The request so far: answered once its head is complete.
function Server:_read(cn)
  if cn.closed then return end
  if cn.draining then
    while true do
      local n = tonumber(C.recv(cn.fd, self.rbuf, 4096, 0))
      if n == 0 or (n < 0 and ffi.errno() ~= EAGAIN and ffi.errno() ~= EINTR) then return self:_drop(cn) end
      if n < 0 then return end
    end
  end
  if cn.out then return end
  while true do
    local n = tonumber(C.recv(cn.fd, self.rbuf, 4096, 0))
    if n > 0 then
      cn.req = cn.req .. ffi.string(self.rbuf, n)
      if #cn.req > M.LIMITS.request_bytes then
        return self:_answer(cn, 431, "text/plain", "request too large\n")
      end
    elseif n == 0 then
      return self:_drop(cn)         -- closed before a whole request
    else
      local e = ffi.errno()
      if e == EAGAIN then break end
      if e ~= EINTR then return self:_drop(cn) end
    end
  end
  if not cn.req:find("\r?\n\r?\n") then return end
  local method, path = cn.req:match("^(%u+) (%S+) HTTP/1%.[01]\r?\n")
  if not method then return self:_answer(cn, 400, "text/plain", "bad request\n") end
  if method ~= "GET" then return self:_answer(cn, 405, "text/plain", "only GET\n") end
  path = path:match("^[^?]*")
  local ok, body
  if path == "/metrics" or path == "/" then
    ok, body = pcall(function() return M.render(stats.snapshot(self.ctx)) end)
    if ok then return self:_answer(cn, 200, "text/plain; version=0.0.4; charset=utf-8", body) end
  elseif path == "/stats" then
    ok, body = pcall(function() return require("cjson").encode(require("lecho.repl.json").value(stats.snapshot(self.ctx))) end)
    if ok then return self:_answer(cn, 200, "application/json", body .. "\n") end
  else
    return self:_answer(cn, 404, "text/plain", "not found: /metrics or /stats\n")
  end
  self.ctx.log("metrics: " .. tostring(body), "error", "metrics")
  return self:_answer(cn, 500, "text/plain", "internal error\n")
end

function Server:_accept()
  while not self.closed do
    local fd = C.accept4(self.fd, nil, nil, SOCK_NONBLOCK + SOCK_CLOEXEC)
    if fd < 0 then return end      -- EAGAIN, or out of descriptors: next time
    if self.nconns >= M.LIMITS.connections then
      local r = response(503, "text/plain", "too many connections\n")
      C.recv(fd, self.rbuf, 4096, 0) -- what came already: not left to make a reset
      C.send(fd, r, #r, MSG_NOSIGNAL)
      C.close(fd)
      self.refused = self.refused + 1
      self.ctx:_warn_limited("metrics_conns", ("metrics: a connection refused past the limit of %d"):format(
        M.LIMITS.connections))
    else
      local cn = { fd = fd, req = "" }
      self.conns[cn] = true
      self.nconns = self.nconns + 1
      cn.deadline = self.ctx.c:timer(M.LIMITS.deadline, 0, function() self:_drop(cn) end)
      cn.watch = self.ctx.c:io(fd, function() self:_read(cn) end)
    end
  end
end

--- Stops serving: the listening socket and every connection.
function Server:close()
  if self.closed then return end
  self.closed = true
  self.watch:stop()
  for cn in each(self.conns) do self:_drop(cn) end
  C.close(self.fd)
end

--- Serves ctx's metrics on `where` (an IPv4 HOST:PORT, port 0: any): the
-- server (its `addr` the bound address), or nil, why.
function M.serve(ctx, where)
  local a, why = addr.parse(where, { listen = true })
  if not a then return nil, ("metrics address %s: %s"):format(where, why) end
  local host, port = a:match("^(%d+%.%d+%.%d+%.%d+):(%d+)$")
  if not host then return nil, ("metrics address %s: only IPv4 HOST:PORT"):format(a) end
  if not ctx.keyed and not host:find("^127%.") then
    return nil, ("refusing to serve metrics on %s without keys (protected mode: loopback only)"):format(a)
  end
  local fd = C.socket(AF_INET, SOCK_STREAM + SOCK_NONBLOCK + SOCK_CLOEXEC, 0)
  if fd < 0 then return nil, "metrics: socket: " .. errstr() end
  local one = ffi.new("int[1]", 1)
  C.setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, one, 4)
  local sin = ffi.new("struct lecho_metrics_sin")
  sin.family = AF_INET
  sin.port = C.htons(tonumber(port))
  C.inet_pton(AF_INET, host, ffi.cast("void *", ffi.cast("char *", sin) + 4))
  -- (worded as the context's own listen address in use: "cannot listen on
  -- ADDR: bind: ...", which lecho.context raises the same way)
  local call = C.bind(fd, sin, 16) ~= 0 and "bind" or C.listen(fd, 64) ~= 0 and "listen"
  if call then
    local e = errstr()
    C.close(fd)
    return nil, ("metrics: cannot listen on %s: %s: %s"):format(a, call, e)
  end
  local len = ffi.new("unsigned int[1]", 16)
  C.getsockname(fd, sin, len)
  local bound = ("%s:%d"):format(host, bit.rshift(bit.band(sin.port, 0xff), 0) * 256 + bit.rshift(sin.port, 8))
  local self = setmetatable({ ctx = ctx, fd = fd, addr = bound, conns = {}, nconns = 0, requests = 0,
                              refused = 0, rbuf = ffi.new("char[4096]") }, Server)  -- rbuf: what recv reads into
  self.watch = ctx.c:io(fd, function() self:_accept() end)
  return self
end

return M
