-- spec/support/rogue.lua: a peer that lies, for the specs that attack lecho
-- (spec/trust_*_spec.lua) and for the one that checks doc/protocol.md
-- (spec/protocol_doc_spec.lua).  Written from doc/protocol.md alone: raw
-- TCP through luasocket, frames built and parsed here, values through the
-- codec of lecho.core, and for keyed mode libsodium through LuaJIT's FFI
-- (ffi.load "sodium", Debian libsodium23).  It speaks protocol version 3
-- (2's layouts; 3 added the array value, tag 0x07, which lecho.core's codec
-- reads and writes):
-- the protected-mode handshake (mode 0), the keyed one (mode 1) with its
-- own identity (a trusted key or not, a certificate or not), then records;
-- it can send any frame, and reads frames and ERRORs.  It can dial (the
-- usual case) and accept (a context dialled by it takes it for a consumer).
--
--   local R = require "spec.support.rogue"
--   local pk, sk = R.keypair()
--   local p, err = R.dial("127.0.0.1:7700", { addr = "127.0.0.1:9", key = { pk = pk, sk = sk,
--                          name = "mallory" } })      -- nil, "ERROR text" when refused
--   p:ctrl{ op = "lookup", ch = "x", rid = 1 }; local reply = p:reply(1, 5)
--   p:send(R.bind(1, "127.0.0.1:7700/x")); p:send(R.event(1, 1, 1, 0, "hi"))
--   p:close()

local ffi = require "ffi"
local socket = require "socket"
local core = require "lecho.core"

local M = {}

-- The version this build's core speaks (3 since issue 24's arrays; the v1
-- layouts have no mode byte in HELLO and no ticket byte in BIND).
M.VERSION = core.protocol_version or 2
M.F = { HELLO = 1, HELLO_OK = 2, ERROR = 3, CTRL = 4, BIND = 5, EVENT = 6, ACK = 7,
        HEARTBEAT = 8, PING = 9, AUTH = 10, AUTH_OK = 11, CONFIRM_ASK = 12, CONFIRM = 13 }
M.NAMES = {}
for k, v in pairs(M.F) do M.NAMES[v] = k end

------------------------------------------------------------------------------
-- Bytes

function M.u32le(n)
  return string.char(n % 256, math.floor(n / 2 ^ 8) % 256, math.floor(n / 2 ^ 16) % 256,
                     math.floor(n / 2 ^ 24) % 256)
end

function M.get_u32le(s, pos)
  local a, b, c, d = s:byte(pos, pos + 3)
  return a + b * 2 ^ 8 + c * 2 ^ 16 + d * 2 ^ 24
end

function M.varint(n)
  assert(n >= 0 and n == math.floor(n), "varint: a non-negative integer")
  local out = {}
  repeat
    local b = n % 128
    n = math.floor(n / 128)
    out[#out + 1] = string.char(n > 0 and b + 128 or b)
  until n == 0
  return table.concat(out)
end

-- Reads a varint at pos: value, next pos; or nil, "invalid varint" /
-- "truncated".  Values above 2^53 lose precision (doubles): fine here.
function M.get_varint(s, pos)
  local n, mul = 0, 1
  for i = 0, 9 do
    local b = s:byte(pos + i)
    if not b then return nil, "truncated" end
    if i == 9 and b > 1 then return nil, "invalid varint" end
    n = n + (b % 128) * mul
    mul = mul * 128
    if b < 128 then return n, pos + i + 1 end
  end
  return nil, "invalid varint"
end

function M.hex(s)
  return (s:gsub(".", function(c) return ("%02x"):format(c:byte()) end))
end

-- Hex text (spaces and newlines allowed) to bytes.
function M.unhex(h)
  h = h:gsub("%s+", "")
  assert(#h % 2 == 0 and not h:find("[^0-9a-fA-F]"), "unhex: not hex: " .. h)
  return (h:gsub("..", function(x) return string.char(tonumber(x, 16)) end))
end

------------------------------------------------------------------------------
-- Frames: u32 LE length (type + body), u8 type, body

function M.frame(ftype, body)
  body = body or ""
  return M.u32le(#body + 1) .. string.char(ftype) .. body
end

-- One whole frame at pos of s: type, body, next pos; nil when s holds only
-- part of one; nil, err for a length of 0.
function M.parse_frame(s, pos)
  pos = pos or 1
  if #s - pos + 1 < 5 then return nil end
  local len = M.get_u32le(s, pos)
  if len == 0 then return nil, "frame length 0" end
  if #s - pos + 1 < 4 + len then return nil end
  return s:byte(pos + 4), s:sub(pos + 5, pos + 3 + len), pos + 4 + len
end

-- HELLO / HELLO_OK body: h = { version, incarnation, addr, mode (0/1/2),
-- eph (32), id (32), name, cert (a certificate, or nil), suites (mode 2:
-- the record ciphers offered or chosen, one byte each), sig (64, HELLO_OK
-- only) }.  A cert of 64 bytes goes as has_cert 1 (an old v1 one), any
-- other as has_cert 2, varint len, cert (doc/protocol.md section 3).
function M.hello_body(h, is_ok)
  local v = h.version or M.VERSION
  local b = { "LECH", string.char(math.floor(v / 256), v % 256), M.varint(h.incarnation or 1),
              M.varint(#h.addr), h.addr }
  if v >= 2 then
    b[#b + 1] = string.char(h.mode or 0)
    if (h.mode or 0) == 1 or h.mode == 2 then
      b[#b + 1] = h.eph
      b[#b + 1] = h.id
      b[#b + 1] = M.varint(#h.name) .. h.name
      b[#b + 1] = not h.cert and "\0" or #h.cert == 64 and ("\1" .. h.cert)
                  or ("\2" .. M.varint(#h.cert) .. h.cert)
      if h.mode == 2 then b[#b + 1] = string.char(#h.suites) .. h.suites end
      if is_ok and h.sig then b[#b + 1] = h.sig end
    end
  end
  return table.concat(b)
end

-- Parses a HELLO or HELLO_OK body (is_ok: a HELLO_OK, whose keyed form ends
-- with the acceptor's signature).  Returns the table of M.hello_body, or
-- nil, err.  Bytes left over are an error.
function M.parse_hello(body, is_ok)
  if body:sub(1, 4) ~= "LECH" then return nil, "bad magic" end
  if #body < 6 then return nil, "truncated" end
  local h = { version = body:byte(5) * 256 + body:byte(6) }
  local pos, alen = 7, nil
  h.incarnation, pos = M.get_varint(body, pos)
  if not h.incarnation then return nil, pos end
  alen, pos = M.get_varint(body, pos)
  if not alen then return nil, pos end
  h.addr = body:sub(pos, pos + alen - 1)
  if #h.addr ~= alen then return nil, "truncated" end
  pos = pos + alen
  if h.version >= 2 then
    h.mode = body:byte(pos)
    if not h.mode then return nil, "truncated" end
    pos = pos + 1
    if h.mode == 1 or h.mode == 2 then
      h.eph, h.id = body:sub(pos, pos + 31), body:sub(pos + 32, pos + 63)
      if #h.id ~= 32 then return nil, "truncated" end
      pos = pos + 64
      local nlen
      nlen, pos = M.get_varint(body, pos)
      if not nlen then return nil, pos end
      h.name = body:sub(pos, pos + nlen - 1)
      if #h.name ~= nlen then return nil, "truncated" end
      pos = pos + nlen
      local has = body:byte(pos)
      if has ~= 0 and has ~= 1 and has ~= 2 then return nil, "bad has_cert" end
      pos = pos + 1
      if has == 1 then
        h.cert = body:sub(pos, pos + 63)
        if #h.cert ~= 64 then return nil, "truncated" end
        pos = pos + 64
      elseif has == 2 then
        local clen
        clen, pos = M.get_varint(body, pos)
        if not clen then return nil, pos end
        h.cert = body:sub(pos, pos + clen - 1)
        if #h.cert ~= clen then return nil, "truncated" end
        pos = pos + clen
      end
      if h.mode == 2 then
        local n = body:byte(pos)
        if not n or n < 1 or n > 8 then return nil, "bad cipher list" end
        h.suites = body:sub(pos + 1, pos + n)
        if #h.suites ~= n then return nil, "truncated" end
        pos = pos + 1 + n
      end
      if is_ok then
        h.sig = body:sub(pos, pos + 63)
        if #h.sig ~= 64 then return nil, "truncated" end
        pos = pos + 64
      end
    elseif h.mode ~= 0 then
      return nil, "bad mode"
    end
  end
  if pos ~= #body + 1 then return nil, ("%d bytes left over"):format(#body + 1 - pos) end
  return h
end

function M.hello(h) return M.frame(M.F.HELLO, M.hello_body(h)) end

-- BIND: varint idx, varint len + name, [u8 has_ticket, ticket] (v2): a
-- ticket of 72 bytes (expiry, signature) goes as has_ticket 2, one of 64
-- (an old one) as 1.
function M.bind(idx, name, ticket, version)
  local b = M.varint(idx) .. M.varint(#name) .. name
  if (version or M.VERSION) >= 2 then
    b = b .. (not ticket and "\0" or #ticket == 64 and ("\1" .. ticket) or ("\2" .. ticket))
  end
  return M.frame(M.F.BIND, b)
end

function M.parse_bind(body)
  local idx, pos = M.get_varint(body, 1)
  if not idx then return nil, pos end
  local nlen
  nlen, pos = M.get_varint(body, pos)
  if not nlen then return nil, pos end
  local r = { idx = idx, name = body:sub(pos, pos + nlen - 1) }
  if #r.name ~= nlen then return nil, "truncated" end
  pos = pos + nlen
  local has = body:byte(pos)
  if has == nil and M.VERSION < 2 then return r end
  if has == 1 or has == 2 then
    local tl = has == 2 and 72 or 64
    r.ticket = body:sub(pos + 1, pos + tl)
    if #r.ticket ~= tl then return nil, "truncated" end
    pos = pos + 1 + tl
  elseif has == 0 then
    pos = pos + 1
  else
    return nil, "bad has_ticket"
  end
  if pos ~= #body + 1 then return nil, "bytes left over" end
  return r
end

-- EVENT: idx, producer id, seq, sync id (varints), then one value (a Lua
-- value, encoded here, or raw bytes with opts.raw).
function M.event(idx, producer, seq, sync, value, raw)
  local v = raw and value or assert(core.encode(value))
  return M.frame(M.F.EVENT, M.varint(idx) .. M.varint(producer) .. M.varint(seq) .. M.varint(sync)
                 .. v)
end

function M.parse_event(body)
  local e, pos = {}, 1
  for _, f in ipairs{ "idx", "producer", "seq", "sync" } do
    e[f], pos = M.get_varint(body, pos)
    if not e[f] then return nil, pos end
  end
  local ok, v = core.decode(body:sub(pos))
  if not ok then return nil, v end
  e.value = v
  return e
end

function M.ack(sync, nran, errs)
  return M.frame(M.F.ACK, M.varint(sync) .. M.varint(nran) .. (errs and assert(core.encode(errs)) or ""))
end

function M.parse_ack(body)
  local a, pos = {}, 1
  a.sync, pos = M.get_varint(body, pos)
  if not a.sync then return nil, pos end
  a.nran, pos = M.get_varint(body, pos)
  if not a.nran then return nil, pos end
  if pos <= #body then
    local ok, v = core.decode(body:sub(pos))
    if not ok then return nil, v end
    a.errs = v
  end
  return a
end

function M.ctrl(msg) return M.frame(M.F.CTRL, assert(core.encode(msg))) end

------------------------------------------------------------------------------
-- libsodium

local S
local function sodium()
  if S then return S end
  for _, decl in ipairs{
    "int sodium_init(void);",
    "int crypto_sign_keypair(unsigned char *pk, unsigned char *sk);",
    "int crypto_sign_detached(unsigned char *sig, unsigned long long *siglen, const unsigned char *m, unsigned long long mlen, const unsigned char *sk);",
    "int crypto_sign_verify_detached(const unsigned char *sig, const unsigned char *m, unsigned long long mlen, const unsigned char *pk);",
    "int crypto_sign_seed_keypair(unsigned char *pk, unsigned char *sk, const unsigned char *seed);",
    "int crypto_kx_keypair(unsigned char *pk, unsigned char *sk);",
    "int crypto_kx_seed_keypair(unsigned char *pk, unsigned char *sk, const unsigned char *seed);",
    "int crypto_kx_client_session_keys(unsigned char *rx, unsigned char *tx, const unsigned char *cpk, const unsigned char *csk, const unsigned char *spk);",
    "int crypto_kx_server_session_keys(unsigned char *rx, unsigned char *tx, const unsigned char *spk, const unsigned char *ssk, const unsigned char *cpk);",
    "int crypto_generichash(unsigned char *out, size_t outlen, const unsigned char *in, unsigned long long inlen, const unsigned char *key, size_t keylen);",
    "int crypto_aead_chacha20poly1305_ietf_encrypt(unsigned char *c, unsigned long long *clen, const unsigned char *m, unsigned long long mlen, const unsigned char *ad, unsigned long long adlen, const unsigned char *nsec, const unsigned char *npub, const unsigned char *k);",
    "int crypto_aead_chacha20poly1305_ietf_decrypt(unsigned char *m, unsigned long long *mlen, unsigned char *nsec, const unsigned char *c, unsigned long long clen, const unsigned char *ad, unsigned long long adlen, const unsigned char *npub, const unsigned char *k);",
    "int crypto_aead_aes256gcm_is_available(void);",
    "int crypto_aead_aes256gcm_encrypt(unsigned char *c, unsigned long long *clen, const unsigned char *m, unsigned long long mlen, const unsigned char *ad, unsigned long long adlen, const unsigned char *nsec, const unsigned char *npub, const unsigned char *k);",
    "int crypto_aead_aes256gcm_decrypt(unsigned char *m, unsigned long long *mlen, unsigned char *nsec, const unsigned char *c, unsigned long long clen, const unsigned char *ad, unsigned long long adlen, const unsigned char *npub, const unsigned char *k);",
  } do pcall(ffi.cdef, decl) end
  S = ffi.load("sodium")
  assert(S.sodium_init() >= 0, "sodium_init failed")
  return S
end

local function buf(n) return ffi.new("unsigned char[?]", n) end
local function str(b, n) return ffi.string(b, n) end

--- An Ed25519 identity: pk (32 bytes), sk (64 bytes).
function M.keypair()
  local s = sodium()
  local pk, sk = buf(32), buf(64)
  assert(s.crypto_sign_keypair(pk, sk) == 0)
  return str(pk, 32), str(sk, 64)
end

--- The identity made from a 32-byte seed (deterministic: for examples).
function M.seed_keypair(seed)
  local s = sodium()
  local pk, sk = buf(32), buf(64)
  assert(#seed == 32 and s.crypto_sign_seed_keypair(pk, sk, seed) == 0)
  return str(pk, 32), str(sk, 64)
end

--- An X25519 key exchange pair (ephemeral: one per connection) from a
-- 32-byte seed, or a random one without.
function M.kx_keypair(seed)
  local pk, sk = buf(32), buf(32)
  if seed then
    assert(#seed == 32 and sodium().crypto_kx_seed_keypair(pk, sk, seed) == 0)
  else
    assert(sodium().crypto_kx_keypair(pk, sk) == 0)
  end
  return str(pk, 32), str(sk, 32)
end

function M.sign(sk, msg)
  local s = sodium()
  local sig = buf(64)
  assert(s.crypto_sign_detached(sig, nil, msg, #msg, sk) == 0)
  return str(sig, 64)
end

function M.verify(pk, msg, sig)
  if #pk ~= 32 or #sig ~= 64 then return false end
  return sodium().crypto_sign_verify_detached(sig, msg, #msg, pk) == 0
end

-- u64 big-endian of integer t in [0, 2^53)
function M.u64be(t)
  local b = {}
  for i = 7, 0, -1 do b[#b + 1] = string.char(math.floor(t / 2 ^ (8 * i)) % 256) end
  return table.concat(b)
end

--- A certificate of `name` and `pk` by authority secret key ask (doc/security.md
-- "Certificates"): valid [not_before, not_after) (Unix seconds; default an
-- hour either side of now), for the addresses listed (nil: any).
function M.cert(ask, name, pk, not_before, not_after, addrs)
  local now = os.time()
  local body = { M.u64be(not_before or now - 3600), M.u64be(not_after or now + 3600),
                 string.char(#(addrs or {})) }
  for _, a in ipairs(addrs or {}) do body[#body + 1] = string.char(#a) .. a end
  body = table.concat(body)
  return body .. M.sign(ask, "lecho-cert-v2\0" .. name .. "\0" .. pk .. body)
end

--- An old (v1) certificate: no validity; refused by peers with its reason.
function M.cert_v1(ask, name, pk)
  return M.sign(ask, "lecho-cert-v1\0" .. name .. "\0" .. pk)
end

--- A producer ticket for channel base name `base` and producer pk, by the
-- manager's secret key msk, expiring at exp (Unix seconds; default an
-- hour from now): u64be exp || signature (doc/security.md "Tickets").
function M.ticket(msk, base, pk, exp)
  local e = M.u64be(exp or os.time() + 3600)
  return e .. M.sign(msk, "lecho-producer-v2\0" .. base .. "\0" .. pk .. e)
end

function M.blake2b32(msg)
  local out = buf(32)
  assert(sodium().crypto_generichash(out, 32, msg, #msg, nil, 0) == 0)
  return str(out, 32)
end

local kx_keypair = M.kx_keypair

-- Session keys: rx, tx (32 bytes each).  client: the dialler.
function M.session_keys(client, my_pk, my_sk, their_pk)
  local rx, tx = buf(32), buf(32)
  local f = client and sodium().crypto_kx_client_session_keys or sodium().crypto_kx_server_session_keys
  if f(rx, tx, my_pk, my_sk, their_pk) ~= 0 then return nil end
  return str(rx, 32), str(tx, 32)
end

local function nonce(counter)
  local lo = counter % 2 ^ 32
  local hi = math.floor(counter / 2 ^ 32)
  return "\0\0\0\0" .. M.u32le(lo) .. M.u32le(hi)
end

-- The record ciphers by their number in an offer (doc/protocol.md section 3).
M.CHACHA, M.AES = "\1", "\2"
local AEAD = { [M.CHACHA] = "chacha20poly1305_ietf", [M.AES] = "aes256gcm" }

--- Whether this CPU runs AES-256-GCM (libsodium: AES-NI and PCLMUL).
function M.aes_available() return sodium().crypto_aead_aes256gcm_is_available() == 1 end

-- One record: u32 LE clen, then the AEAD of plaintext with the length as
-- ad (suite: M.CHACHA, the default, or M.AES; AES-GCM's key of a direction
-- changes every 2^20 records, which no spec reaches).
function M.seal(key, counter, plain, suite)
  local clen = #plain + 16
  local hdr = M.u32le(clen)
  local c, cl = buf(clen), ffi.new("unsigned long long[1]")
  local f = sodium()["crypto_aead_" .. AEAD[suite or M.CHACHA] .. "_encrypt"]
  assert(f(c, cl, plain, #plain, hdr, 4, nil, nonce(counter), key) == 0)
  return hdr .. str(c, clen)
end

-- Opens the ciphertext `c` of a record whose length bytes were hdr: the
-- plaintext or nil.
function M.open(key, counter, hdr, c, suite)
  if #c < 16 then return nil end
  local m, ml = buf(#c), ffi.new("unsigned long long[1]")
  local f = sodium()["crypto_aead_" .. AEAD[suite or M.CHACHA] .. "_decrypt"]
  if f(m, ml, nil, c, #c, hdr, 4, nonce(counter), key) ~= 0 then
    return nil
  end
  return str(m, tonumber(ml[0]))
end

M.RECORD_MAX = 65536 + 16

------------------------------------------------------------------------------
-- A connection

local Peer = {}
Peer.__index = Peer
M.Peer = Peer

local function now() return socket.gettime() end

local function wrap(s, opts)
  s:setoption("tcp-nodelay", true)
  return setmetatable({ s = s, raw = "", plain = "", pos = 1, closed = false, keyed = false,
                        rx_n = 0, tx_n = 0, opts = opts, frames = {}, log = {} }, Peer)
end

-- Reads what the socket has until `deadline` or until at least one more
-- byte came: true, or nil, "timeout" / "closed".
function Peer:_fill(deadline)
  if self.closed then return nil, "closed" end
  local left = deadline - now()
  if left <= 0 then return nil, "timeout" end
  -- a receive with a timeout waits for all it asked: select, then take what is there
  if not self.s:dirty() then socket.select({ self.s }, nil, left) end
  self.s:settimeout(0)
  local data, err, partial = self.s:receive(65536)
  local got = data or partial
  if got and #got > 0 then
    if not self.keyed then self:_compact() end
    self.raw = self.raw .. got
    return true
  end
  if err == "closed" then
    self.closed = true
    return nil, "closed"
  end
  return nil, err or "timeout"
end

-- Drops what was read of the frame stream (self.pos is the next frame's
-- first byte): the buffer is cut once per arrival, not once per frame.
function Peer:_compact()
  local src = self.keyed and "plain" or "raw"
  if self.pos > 1 then
    self[src] = self[src]:sub(self.pos)
    self.pos = 1
  end
end

-- Moves whole records from raw to plain (keyed); false on a bad record.
-- Where the first record is due, a refusal may come in the clear instead
-- (an ERROR to a frame that was not AUTH): taken as such only when the
-- bytes do not open as a record (a record's first ciphertext byte is 3,
-- ERROR's type, once in 256).
function Peer:_decrypt()
  while #self.raw >= 4 do
    local clen = M.get_u32le(self.raw, 1)
    local size_ok = clen >= 17 and clen <= M.RECORD_MAX
    if size_ok and #self.raw < 4 + clen then break end
    local p = size_ok and M.open(self.rx, self.rx_n, self.raw:sub(1, 4), self.raw:sub(5, 4 + clen), self.suite)
    if p then
      self.rx_n = self.rx_n + 1
      self:_compact()
      self.plain = self.plain .. p
      self.raw = self.raw:sub(5 + clen)
    elseif self.rx_n == 0 and #self.raw >= 5 and self.raw:byte(5) == M.F.ERROR then
      local t, _, nxt = M.parse_frame(self.raw)
      if not t then break end                 -- the rest of it is on its way
      self:_compact()
      self.plain = self.plain .. self.raw:sub(1, nxt - 1)
      self.raw = self.raw:sub(nxt)
      return true
    elseif not size_ok then
      return false, "bad record length " .. clen
    else
      return false, "bad record"
    end
  end
  return true
end

-- Every frame this peer read (in the clear, or once a record decrypted:
-- all it could read) is logged in self.log: { type = "CTRL", body = bytes,
-- msg = the decoded CTRL value }.  A spec asks the log what the rogue
-- learnt (Peer:learnt), whichever function read the frame.
function Peer:_log(t, body)
  local e = { type = M.NAMES[t] or tostring(t), body = body }
  if t == M.F.CTRL then
    local ok, msg = core.decode(body)
    e.msg = ok and msg or nil
  end
  self.log[#self.log + 1] = e
end

--- What the log holds after the handshake: the frames of types other than
-- HELLO, HELLO_OK, AUTH, AUTH_OK, ERROR, HEARTBEAT and PING (a list of log
-- entries), and the CTRL ops among them (a list of strings).
function Peer:learnt()
  local skip = { HELLO = true, HELLO_OK = true, AUTH = true, AUTH_OK = true, ERROR = true,
                 HEARTBEAT = true, PING = true }
  local frames, ops = {}, {}
  for _, e in ipairs(self.log) do
    if not skip[e.type] then
      frames[#frames + 1] = e
      if e.type == "CTRL" then ops[#ops + 1] = type(e.msg) == "table" and tostring(e.msg.op) or "?" end
    end
  end
  return frames, ops
end

--- The next frame, waiting up to `timeout` seconds: type, body; or nil,
-- "timeout" / "closed" / "bad record".
function Peer:read(timeout)
  local deadline = now() + (timeout or 5)
  while true do
    local src = self.keyed and "plain" or "raw"
    if self.keyed then
      local ok, err = self:_decrypt()
      if not ok then
        self:close()
        return nil, err
      end
    end
    local t, body, nxt = M.parse_frame(self[src], self.pos)
    if t then
      self.pos = nxt
      self:_log(t, body)
      return t, body
    end
    if body then return nil, body end
    local ok, err = self:_fill(deadline)
    if not ok and (err ~= "timeout" or now() >= deadline) then return nil, err end
  end
end

--- Reads frames until one of type `ftype` (others are kept in self.frames):
-- its body, or nil, err ("ERROR: text" when an ERROR came).
function Peer:expect(ftype, timeout)
  local deadline = now() + (timeout or 5)
  while true do
    local t, body = self:read(deadline - now())
    if not t then return nil, body end
    if t == ftype then return body end
    if t == M.F.ERROR then return nil, "ERROR: " .. body end
    self.frames[#self.frames + 1] = { type = t, body = body }
  end
end

--- Sends bytes of frames (in records once keyed): true, or nil, err.
function Peer:send(bytes)
  if self.keyed then
    local out = {}
    for i = 1, #bytes, 65536 do
      out[#out + 1] = M.seal(self.tx, self.tx_n, bytes:sub(i, i + 65535), self.suite)
      self.tx_n = self.tx_n + 1
    end
    bytes = table.concat(out)
  end
  self.s:settimeout(5)
  local i = 1
  while i <= #bytes do
    local last, err, partial = self.s:send(bytes, i)
    if not last then
      if err ~= "timeout" then
        self.closed = true
        return nil, err
      end
      last = partial
    end
    i = last + 1
  end
  return true
end

function Peer:ctrl(msg) return self:send(M.ctrl(msg)) end

--- Waits for the reply to request `rid` (CTRL op=reply): the message, or
-- nil, err.  Other frames are kept in self.frames; PINGs are answered.
function Peer:reply(rid, timeout)
  local deadline = now() + (timeout or 5)
  while true do
    local t, body = self:read(deadline - now())
    if not t then return nil, body end
    if t == M.F.CTRL then
      local ok, msg = core.decode(body)
      if ok and type(msg) == "table" and msg.op == "reply" and msg.rid == rid then return msg end
      self.frames[#self.frames + 1] = { type = t, body = body, msg = ok and msg or nil }
    elseif t == M.F.ERROR then
      return nil, "ERROR: " .. body
    elseif t == M.F.PING then
      self:send(M.frame(M.F.HEARTBEAT))
    else
      self.frames[#self.frames + 1] = { type = t, body = body }
    end
  end
end

--- Reads (answering PINGs, acknowledging sync EVENTs with ack_handlers
-- handlers) for `seconds` or until the peer closes: counts by frame name,
-- the ERROR text if one came, and the EVENTs ({ idx, producer, seq, sync,
-- value }) and BINDs in order.
function Peer:drain(seconds, ack_handlers)
  local deadline = now() + seconds
  local r = { counts = {}, events = {}, binds = {} }
  for _, f in ipairs(self.frames) do r.counts[M.NAMES[f.type] or f.type] = (r.counts[M.NAMES[f.type] or f.type] or 0) + 1 end
  self.frames = {}
  while true do
    local t, body = self:read(math.max(0, deadline - now()))
    if not t then
      r.ended = body
      break
    end
    local name = M.NAMES[t] or tostring(t)
    r.counts[name] = (r.counts[name] or 0) + 1
    if t == M.F.ERROR then
      r.error = body
    elseif t == M.F.PING then
      self:send(M.frame(M.F.HEARTBEAT))
    elseif t == M.F.BIND then
      r.binds[#r.binds + 1] = M.parse_bind(body)
    elseif t == M.F.EVENT then
      local e = M.parse_event(body)
      if e then
        r.events[#r.events + 1] = e
        if e.sync ~= 0 and ack_handlers then self:send(M.ack(e.sync, ack_handlers)) end
      end
    end
  end
  return r
end

function Peer:close()
  if self.s then self.s:close() end
  self.closed = true
end

------------------------------------------------------------------------------
-- Handshakes

M.CTX_DIALLER, M.CTX_ACCEPTOR = "lecho-v2 dialler\0", "lecho-v2 acceptor\0"
local CTX_D, CTX_A = M.CTX_DIALLER, M.CTX_ACCEPTOR

-- Our HELLO fields for opts: addr (the address we claim), incarnation,
-- version, key = { pk, sk, name, cert } (keyed) or nil (protected);
-- mode overrides (e.g. 1 without a key to lie about it); offer (keyed: the
-- record ciphers to offer, e.g. M.AES .. M.CHACHA: mode 2; none: mode 1,
-- a peer of before the offer).
local function my_hello(opts)
  local key = opts.key
  local h = { version = opts.version or M.VERSION, incarnation = opts.incarnation or math.random(1, 2 ^ 31),
              addr = opts.addr, mode = opts.mode or (key and (opts.offer and 2 or 1) or 0),
              suites = opts.offer }
  if h.mode == 1 or h.mode == 2 then
    local epk, esk = kx_keypair()
    h.eph, h.id, h.name, h.cert = epk, key.pk, key.name, key.cert
    return h, esk
  end
  return h
end

--- Dials `target` ("host:port") and does the handshake.  opts: addr (the
-- listen address we claim, required), key (keyed mode: { pk, sk, name,
-- cert }), version, incarnation, mode, offer (record ciphers: mode 2),
-- timeout (5 s).  Returns the peer (p.remote: the acceptor's HELLO_OK
-- fields; p.suite: the record cipher), or nil, err ("ERROR: text" when
-- refused with a reason; "closed", "timeout", "bad signature", ...), and
-- the peer (for a look at what came).
function M.dial(target, opts)
  local host, port = target:match("^%[?(.-)%]?:(%d+)$")
  local s = assert(socket.tcp())
  s:settimeout(opts.timeout or 5)
  local ok, err = s:connect(host, tonumber(port))
  if not ok then return nil, err end
  local p = wrap(s, opts)
  local h, esk = my_hello(opts)
  local hello = M.hello_body(h)
  p:send(M.frame(M.F.HELLO, hello))
  if opts.hello_only then return p end
  local body
  body, err = p:expect(M.F.HELLO_OK, opts.timeout or 5)
  if not body then return nil, err, p end
  local r
  r, err = M.parse_hello(body, true)
  if not r then return nil, "bad HELLO_OK: " .. err, p end
  p.remote = r
  if (r.mode ~= 1 and r.mode ~= 2) or not opts.key then return p end
  if (r.mode == 2) ~= (h.mode == 2) or (r.mode == 2 and (#r.suites ~= 1 or not h.suites:find(r.suites, 1, true))) then
    return nil, "bad cipher choice", p
  end
  p.suite = r.suites
  -- Keyed: check the acceptor's signature over the transcript, AUTH, records.
  local T = M.blake2b32(hello .. body:sub(1, #body - 64))
  if not M.verify(r.id, CTX_A .. T, r.sig) then return nil, "bad signature", p end
  p:send(M.frame(M.F.AUTH, M.sign(opts.key.sk, CTX_D .. T)))
  p.rx, p.tx = M.session_keys(true, h.eph, esk, r.eph)
  if not p.rx then return nil, "bad key exchange", p end
  p:_compact()
  p.keyed = true
  body, err = p:expect(M.F.AUTH_OK, opts.timeout or 5)
  if not body then return nil, err, p end
  return p
end

--- A listening socket on 127.0.0.1 (port chosen by the OS, or `port`: an
-- impostor at a port another process left): the server; server.addr is
-- "127.0.0.1:PORT".  Returns nil, err when the port cannot be bound.
function M.listen(port)
  -- tcp4: the descriptor exists now (socket.tcp() makes it at bind), so
  -- that SO_REUSEADDR can be set before bind: a port left in TIME_WAIT
  local s = assert(socket.tcp4())
  assert(s:setoption("reuseaddr", true))
  local ok, err = s:bind("127.0.0.1", port or 0)
  if not ok then
    s:close()
    return nil, err
  end
  assert(s:listen(16))
  local ip, port = s:getsockname()
  return { s = s, addr = ("%s:%d"):format(ip, port),
           close = function(self) self.s:close() end,
           accept = M.accept }
end

--- server:accept(opts): waits (opts.timeout, 5 s) for a dialler and does
-- the acceptor's side of the handshake with opts as M.dial's (addr: ours;
-- offer: the ciphers this side has, in its preference, default M.CHACHA:
-- it chooses the first the dialler offered; old = true: a v3 acceptor of
-- before the offer, which refuses a mode 2 HELLO with ERROR "bad mode in
-- handshake" as lecho did).  Returns the peer (p.remote: the dialler's
-- HELLO) or nil, err.
function M.accept(server, opts)
  server.s:settimeout(opts.timeout or 5)
  local s, err = server.s:accept()
  if not s then return nil, err end
  return M.handshake_accepted(s, opts)
end

--- The acceptor's side of the handshake on socket s, accepted already
-- (opts as M.accept's): the peer, or nil, err, the peer.
function M.handshake_accepted(s, opts)
  local p = wrap(s, opts)
  local body, err
  body, err = p:expect(M.F.HELLO, opts.timeout or 5)
  if not body then return nil, err, p end
  local r
  if opts.old then
    local h0 = M.parse_hello(body, false)
    if h0 and h0.mode == 2 then
      p:send(M.frame(M.F.ERROR, "bad mode in handshake"))
      return nil, "refused the offer (old)", p
    end
  end
  r, err = M.parse_hello(body, false)
  if not r then return nil, "bad HELLO: " .. err, p end
  p.remote = r
  local my_offer = opts.offer
  opts.offer = nil
  local h, esk = my_hello(opts)
  opts.offer = my_offer
  if h.mode ~= 1 or (r.mode ~= 1 and r.mode ~= 2) then
    p:send(M.frame(M.F.HELLO_OK, M.hello_body(h)))
    return p
  end
  if r.mode == 2 and not opts.old then
    for i = 1, #(my_offer or M.CHACHA) do
      local c = (my_offer or M.CHACHA):sub(i, i)
      if r.suites:find(c, 1, true) then p.suite = c break end
    end
    if not p.suite then return nil, "no cipher in common", p end
    h.mode, h.suites = 2, p.suite
  end
  local ok_body = M.hello_body(h, true)
  local T = M.blake2b32(body .. ok_body)
  p:send(M.frame(M.F.HELLO_OK, ok_body .. M.sign(opts.key.sk, CTX_A .. T)))
  local sig
  sig, err = p:expect(M.F.AUTH, opts.timeout or 5)
  if not sig then return nil, err, p end
  if not M.verify(r.id, CTX_D .. T, sig) then return nil, "bad dialler signature", p end
  p.rx, p.tx = M.session_keys(false, h.eph, esk, r.eph)
  p:_compact()
  p.keyed = true
  -- opts.hold_auth_ok: seconds to wait before AUTH_OK (a peer that makes
  -- the handshake outlast its certificate)
  if opts.hold_auth_ok then socket.sleep(opts.hold_auth_ok) end
  p:send(M.frame(M.F.AUTH_OK))
  return p
end

return M
