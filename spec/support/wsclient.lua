-- spec/support/wsclient.lua: a WebSocket TEST client for the gateway specs
-- and bench, written from RFC 6455 with luasocket (the gateway itself uses
-- wslay; this is the independent other side).  Also a JSON-lines client.
--
--   local c = wsc.connect(host, port, { path = "/ws", headers = {...} })
--   c:send_text(s); local op, data = c:recv(timeout); c:json(timeout)
--   c:send_frame(fin, opcode, payload, { mask = true, len = N })  -- raw, for hostile tests
local socket = require "socket"
local bit = require "bit"
local cjson = require "cjson"

local M = {}

local B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
local function b64(s)
  return ((s:gsub(".", function(x)
    local r, b = "", x:byte()
    for i = 8, 1, -1 do r = r .. (b % 2 ^ i - b % 2 ^ (i - 1) > 0 and "1" or "0") end
    return r
  end) .. "0000"):gsub("%d%d%d?%d?%d?%d?", function(x)
    if #x < 6 then return "" end
    local c = 0
    for i = 1, 6 do c = c + (x:sub(i, i) == "1" and 2 ^ (6 - i) or 0) end
    return B64:sub(c + 1, c + 1)
  end) .. ({ "", "==", "=" })[#s % 3 + 1])
end
M.b64 = b64

local Client = {}
Client.__index = Client

--- Opens a TCP connection and does the opening handshake; the client, or
-- nil, why (the HTTP status line when refused), plus the response head.
function M.connect(host, port, opts)
  opts = opts or {}
  local s = socket.tcp()
  s:settimeout(opts.timeout or 5)
  if opts.rcvbuf then s:setoption("recv-buffer-size", opts.rcvbuf) end  -- a small one: a slow reader fills sooner
  local ok, e = s:connect(host, port)
  if not ok then return nil, e end
  local key = b64(("%016d"):format(math.random(1, 1e9)))
  local req = opts.raw_request or table.concat({
    ("GET %s HTTP/1.1"):format(opts.path or "/ws"),
    ("Host: %s:%d"):format(host:find(":", 1, true) and "[" .. host .. "]" or host, port),
    "Upgrade: websocket", "Connection: Upgrade",
    "Sec-WebSocket-Key: " .. key, "Sec-WebSocket-Version: 13",
  }, "\r\n") .. "\r\n" .. table.concat(opts.headers or {}, "\r\n") .. (opts.headers and "\r\n" or "") .. "\r\n"
  s:send(req)
  local head = {}
  while true do
    local line, err = s:receive("*l")
    if not line then s:close() return nil, "handshake: " .. tostring(err), table.concat(head, "\n") end
    if line == "" then break end
    head[#head + 1] = line
  end
  local status = head[1] or ""
  if not status:find("^HTTP/1.1 101") then s:close() return nil, status, table.concat(head, "\n") end
  return setmetatable({ s = s, buf = "", pos = 1 }, Client), nil, table.concat(head, "\n")
end

local function mask(payload, key)
  local out = {}
  for i = 1, #payload do
    out[i] = string.char(bit.bxor(payload:byte(i), key:byte((i - 1) % 4 + 1)))
  end
  return table.concat(out)
end

--- One frame as a client sends it (masked unless opts.mask == false);
-- opts.len: the length to claim instead of the payload's.
function Client:frame(fin, opcode, payload, opts)
  opts = opts or {}
  local len = opts.len or #payload
  local b1 = (fin and 0x80 or 0) + opcode
  local m = opts.mask == false and 0 or 0x80
  local hdr
  if len < 126 then
    hdr = string.char(b1, m + len)
  elseif len < 65536 then
    hdr = string.char(b1, m + 126, bit.rshift(len, 8), bit.band(len, 255))
  else
    local t = {}
    local n = len
    for i = 8, 1, -1 do t[i] = n % 256; n = math.floor(n / 256) end
    hdr = string.char(b1, m + 127, unpack(t))
  end
  if m == 0 then return hdr .. payload end
  local key = string.char(math.random(0, 255), math.random(0, 255), math.random(0, 255), math.random(0, 255))
  return hdr .. key .. mask(payload, key)
end

function Client:send_frame(fin, opcode, payload, opts)
  self.s:settimeout(5)
  return self.s:send(self:frame(fin, opcode, payload, opts))
end

function Client:send_text(s) return self:send_frame(true, 1, s) end
function Client:send_json(t) return self:send_text(cjson.encode(t)) end

-- Reads more into the buffer (self.buf from self.pos); nil, why on timeout or close.
-- (receive(n) waits for all n bytes: select first, then take what is there)
local function more(self)
  local s = self.s
  if not s:dirty() then
    local r = socket.select({ s }, nil, math.max(0, self.deadline - socket.gettime()))
    if not r[1] then return nil, "timeout" end
  end
  s:settimeout(0)
  local d, e, part = s:receive(65536)
  d = d or part
  if e == "timeout" then e = nil end
  if d and #d > 0 then
    if self.pos > 65536 then self.buf, self.pos = self.buf:sub(self.pos), 1 end
    self.buf = self.buf .. d
    return true
  end
  if e then return nil, e end
  return true
end

-- One whole frame at self.pos, consumed: fin, opcode, payload; or nil when
-- the buffer does not hold one yet (nothing consumed).
local function frame_at(self)
  local b, p = self.buf, self.pos
  if #b - p + 1 < 2 then return nil end
  local b1, b2 = b:byte(p, p + 1)
  local len, off = bit.band(b2, 0x7f), p + 2
  if len == 126 then
    if #b < off + 1 then return nil end
    len = b:byte(off) * 256 + b:byte(off + 1)
    off = off + 2
  elseif len == 127 then
    if #b < off + 7 then return nil end
    len = 0
    for i = 0, 7 do len = len * 256 + b:byte(off + i) end
    off = off + 8
  end
  if #b < off + len - 1 then return nil end
  self.pos = off + len
  return bit.band(b1, 0x80) ~= 0, bit.band(b1, 0x0f), b:sub(off, off + len - 1)
end

--- The next whole message: opcode (1 text, 2 binary, 8 close), payload; or
-- nil, "timeout"/"closed" (a timeout loses nothing: the next call goes on).
-- A close frame: 8, code, reason.
function Client:recv(timeout)
  self.deadline = socket.gettime() + (timeout or 5)
  while true do
    local fin, op, p = frame_at(self)
    if fin == nil then
      local ok, e = more(self)
      if not ok then return nil, e end
    elseif op == 8 then
      local code = #p >= 2 and p:byte(1) * 256 + p:byte(2) or nil
      return 8, code, p:sub(3)
    elseif op == 9 then
      self:send_frame(true, 10, p)
    elseif op ~= 10 then
      if op ~= 0 then self.op0 = op end
      local parts = self.parts or {}
      self.parts = parts
      parts[#parts + 1] = p
      if fin then
        self.parts = nil
        return self.op0, table.concat(parts)
      end
    end
  end
end

--- The next text message decoded (skipping events when opts.skip_events).
function Client:json(timeout, skip_events)
  local deadline = socket.gettime() + (timeout or 5)
  while true do
    local op, p, reason = self:recv(math.max(0.01, deadline - socket.gettime()))
    if not op then return nil, p end
    if op == 8 then return nil, "closed", p, reason end
    local t = op == 2 and M.binary_event(p) or cjson.decode(p)
    if not (skip_events and t.ev ~= nil) then return t end
  end
end

function Client:close() self.s:close() end

--- A binary event message as doc/gateway.md "Arrays" lays it out: a u32
-- little-endian header length L, the JSON header { ch, ev, arrays }, zero
-- bytes to a multiple of 8, the elements; the event with each array put
-- back at its path as { dtype, shape, data (the elements, numbers), raw
-- (their bytes), offset }; binary = true.  Written from the page, not
-- from the gateway's code.
local ffi = require "ffi"
local CT = { ["<u1"] = "uint8_t", ["<i1"] = "int8_t", ["<u2"] = "uint16_t", ["<i2"] = "int16_t",
             ["<u4"] = "uint32_t", ["<i4"] = "int32_t", ["<u8"] = "uint64_t", ["<i8"] = "int64_t",
             ["<f4"] = "float", ["<f8"] = "double" }
function M.binary_event(p)
  assert(#p >= 4, "binary message shorter than its length field")
  local L = p:byte(1) + p:byte(2) * 256 + p:byte(3) * 65536 + p:byte(4) * 16777216
  local head = cjson.decode(p:sub(5, 4 + L))
  local base = 4 + L + (-(4 + L)) % 8
  assert(p:sub(5 + L, base) == ("\0"):rep(base - 4 - L), "padding not zero")
  -- a reply (a service's result holding arrays): no ch, the arrays' paths
  -- from the reply's top, JSON null where each was
  local is_reply = head.ch == nil
  local ev = head.ev
  if is_reply then ev = head; head.arrays = nil end
  for _, a in ipairs(is_reply and cjson.decode(p:sub(5, 4 + L)).arrays or head.arrays) do
    assert(a.offset % 8 == 0, "array offset not a multiple of 8")
    local raw = p:sub(base + a.offset + 1, base + a.offset + a.bytes)
    assert(#raw == a.bytes, "array past the message's end")
    local ct = assert(CT[a.dtype], a.dtype)
    local n = a.bytes / ffi.sizeof(ct)
    local ptr = ffi.cast("const " .. ct .. " *", raw)
    local data = {}
    for i = 0, n - 1 do data[i + 1] = tonumber(ptr[i]) end
    local val = { dtype = a.dtype, shape = a.shape, data = data, raw = raw, offset = a.offset }
    if #a.path == 0 then ev = val else
      ev = type(ev) == "table" and ev or {}
      local t = ev
      for i = 1, #a.path - 1 do
        if t[a.path[i]] == nil or t[a.path[i]] == cjson.null then t[a.path[i]] = {} end
        t = t[a.path[i]]
      end
      t[a.path[#a.path]] = val
    end
  end
  if is_reply then ev.binary = true return ev end
  return { ch = head.ch, ev = ev, binary = true, header_length = L }
end

--- A JSON-lines client (the same messages, one per line).
local Lines = {}
Lines.__index = Lines

function M.lines(host, port)
  local s = socket.tcp()
  s:settimeout(5)
  local ok, e = s:connect(host, port)
  if not ok then return nil, e end
  return setmetatable({ s = s }, Lines)
end
function Lines:send_json(t) return self.s:send(cjson.encode(t) .. "\n") end
function Lines:send_raw(s) return self.s:send(s) end
function Lines:json(timeout, skip_events)
  self.s:settimeout(timeout or 5)
  while true do
    local line, e = self.s:receive("*l")
    if not line then return nil, e end
    local t = cjson.decode(line)
    if not (skip_events and t.ev ~= nil) then return t end
  end
end
function Lines:close() self.s:close() end

return M
