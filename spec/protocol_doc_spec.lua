-- Covers doc/wire-format.md's frame notation too (not run by spec/doc_blocks_spec.lua).
-- doc/protocol.md cannot say what the code does not: every hex example of
-- the page (a fenced block marked `hex NAME`) is read from the page and
-- checked here, so that a wrong byte fails this spec.
--
--   * each example has a check, and each frame type of the page's table one
--     example at least;
--   * frames are parsed with the parser of spec/support/rogue.lua (the peer
--     the attack specs use, written from the page) and values decoded with
--     the codec of lecho.core;
--   * the protected-mode examples are played to a live lecho.core context
--     (127.0.0.1, port from the OS): it must take the HELLO, answer with a
--     HELLO_OK of the documented layout, deliver the BIND + EVENT example to
--     its event hook, send the read confirmation offer example after that
--     first BIND and then the ACK example byte for byte, answer the PING
--     with the HEARTBEAT example, the CONFIRM_ASK example with the CONFIRM
--     example, hand the CTRL example to its control
--     hook, and refuse the version-1 HELLO with the ERROR example;
--   * the keyed examples are recomputed with libsodium from the seeds the
--     page gives (transcript hash, both signatures, records, certificate,
--     ticket), and the keyed HELLO example is played to a keyed context
--     (identity "nameserver", trusting "alice"): the handshake must end
--     with AUTH_OK in a record.
--
-- Run: make && LUA_PATH="$PWD/lua/?.lua;$PWD/lua/?/init.lua;;" \
--   LUA_CPATH="$PWD/lua/?.so;;" LECHO_ROOT=$PWD luajit /usr/bin/busted spec/protocol_doc_spec.lua

local core = require "lecho.core"
local socket = require "socket"
local R = require "spec.support.rogue"

local root = os.getenv("LECHO_ROOT") or "."

local function read(path)
  local f = assert(io.open(root .. "/" .. path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

-- The examples of the page: name -> bytes, in the page's order.
local page = read("doc/protocol.md")
local EX, ORDER = {}, {}
for name, body in page:gmatch("```hex ([%w_]+)\n(.-)```") do
  assert(not EX[name], "two examples named " .. name)
  EX[name] = R.unhex(body)
  ORDER[#ORDER + 1] = name
end

local function frame_of(name, want_type)
  local t, body, nxt = R.parse_frame(EX[name])
  assert.equals(want_type, t, name .. ": frame type")
  assert.equals(#EX[name] + 1, nxt, name .. ": one whole frame, nothing after it")
  return body
end

local function deep_same(a, b) assert.same(a, b) end

local CTX_A, CTX_D = "lecho-v2 acceptor\0", "lecho-v2 dialler\0"
local SEED = function(b) return string.char(b):rep(32) end

-- Checks of each example, by name.  A check that is missing, or an example
-- the page lost, fails the first test.
local CHECK = {}

function CHECK.hello()
  local h = assert(R.parse_hello(frame_of("hello", R.F.HELLO), false))
  deep_same({ version = 3, incarnation = 1234, addr = "127.0.0.1:7701", mode = 0 }, h)
end

function CHECK.hello_ok()
  local h = assert(R.parse_hello(frame_of("hello_ok", R.F.HELLO_OK), true))
  deep_same({ version = 3, incarnation = 5678, addr = "127.0.0.1:7700", mode = 0 }, h)
end

function CHECK.hello_v1()
  local h = assert(R.parse_hello(frame_of("hello_v1", R.F.HELLO), false))
  deep_same({ version = 1, incarnation = 1234, addr = "127.0.0.1:7701" }, h)
end

function CHECK.error()
  assert.equals("protocol version mismatch: peer speaks 1, this side speaks 3",
                frame_of("error", R.F.ERROR))
end

function CHECK.bind()
  deep_same({ idx = 1, name = "127.0.0.1:7700/temp" }, assert(R.parse_bind(frame_of("bind", R.F.BIND))))
end

function CHECK.event()
  local e = assert(R.parse_event(frame_of("event", R.F.EVENT)))
  deep_same({ idx = 1, producer = 1, seq = 1, sync = 7, value = 21.5 }, e)
end

function CHECK.ack()
  deep_same({ sync = 7, nran = 1 }, assert(R.parse_ack(frame_of("ack", R.F.ACK))))
end

function CHECK.ack_errors()
  deep_same({ sync = 8, nran = 1, errs = { { consumer = "127.0.0.1:7701", err = "boom" } } },
            assert(R.parse_ack(frame_of("ack_errors", R.F.ACK))))
end

function CHECK.ack_errors_code()
  deep_same({ sync = 8, nran = 1, errs = { { consumer = "127.0.0.1:7701", err = "boom", code = "failed" } } },
            assert(R.parse_ack(frame_of("ack_errors_code", R.F.ACK))))
end

function CHECK.heartbeat() assert.equals("", frame_of("heartbeat", R.F.HEARTBEAT)) end
function CHECK.ping() assert.equals("", frame_of("ping", R.F.PING)) end

function CHECK.confirm_offer()
  local ok, v = core.decode(frame_of("confirm_offer", R.F.CTRL))
  assert.is_true(ok, v)
  deep_same({ op = "reply", rid = 0, confirm = 1 }, v)
end

function CHECK.confirm_ask()
  assert.same({ 1, 2 }, { R.get_varint(frame_of("confirm_ask", R.F.CONFIRM_ASK), 1) })
end

function CHECK.confirm()
  assert.same({ 1, 2 }, { R.get_varint(frame_of("confirm", R.F.CONFIRM), 1) })
end

function CHECK.ctrl_lookup()
  local ok, v = core.decode(frame_of("ctrl_lookup", R.F.CTRL))
  assert.is_true(ok, v)
  deep_same({ op = "lookup", ch = "127.0.0.1:7700/temp", rid = 1 }, v)
end

function CHECK.key_alice() assert.equals(R.seed_keypair(SEED(1)), EX.key_alice) end
function CHECK.key_nameserver() assert.equals(R.seed_keypair(SEED(3)), EX.key_nameserver) end

function CHECK.hello_keyed()
  local h = assert(R.parse_hello(frame_of("hello_keyed", R.F.HELLO), false))
  deep_same({ version = 3, incarnation = 1234, addr = "127.0.0.1:7701", mode = 1,
              eph = (R.kx_keypair(SEED(2))), id = EX.key_alice, name = "alice" }, h)
end

local function transcript()
  local hb = frame_of("hello_keyed", R.F.HELLO)
  local okb = frame_of("hello_ok_keyed", R.F.HELLO_OK)
  return R.blake2b32(hb .. okb:sub(1, #okb - 64)), okb
end

function CHECK.hello_ok_keyed()
  local T, okb = transcript()
  local h = assert(R.parse_hello(okb, true))
  local sig = h.sig
  h.sig = nil
  deep_same({ version = 3, incarnation = 5678, addr = "127.0.0.1:7700", mode = 1,
              eph = (R.kx_keypair(SEED(4))), id = EX.key_nameserver, name = "nameserver" }, h)
  assert.is_true(R.verify(EX.key_nameserver, CTX_A .. T, sig), "sig_acceptor")
end

function CHECK.transcript() assert.equals(EX.transcript, (transcript())) end

function CHECK.auth()
  local sig = frame_of("auth", R.F.AUTH)
  assert.equals(64, #sig)
  assert.is_true(R.verify(EX.key_alice, CTX_D .. transcript(), sig), "sig_dialler")
end

-- The session keys of the example connection, from the page's seeds.
local function session()
  local dpk, dsk = R.kx_keypair(SEED(2))
  local apk, ask = R.kx_keypair(SEED(4))
  local drx, dtx = R.session_keys(true, dpk, dsk, apk)
  local arx, atx = R.session_keys(false, apk, ask, dpk)
  assert.equals(drx, atx)
  assert.equals(dtx, arx)
  return dtx, atx
end

local function open_record(bytes, key)
  local clen = R.get_u32le(bytes, 1)
  assert.equals(#bytes, 4 + clen, "one whole record")
  return R.open(key, 0, bytes:sub(1, 4), bytes:sub(5))
end

function CHECK.record_auth_ok()
  local _, atx = session()
  assert.equals(R.frame(R.F.AUTH_OK), open_record(EX.record_auth_ok, atx))
end

function CHECK.record_lookup()
  local dtx = session()
  assert.equals(EX.ctrl_lookup, open_record(EX.record_lookup, dtx))
end

function CHECK.cert_alice()
  local apk = R.seed_keypair(SEED(5))
  assert.truthy(page:find(R.hex(apk), 1, true), "the page names the authority's key")
  local c = EX.cert_alice
  local body, sig = c:sub(1, -65), c:sub(-64)
  assert.is_true(R.verify(apk, "lecho-cert-v2\0alice\0" .. EX.key_alice .. body, sig))
  -- the fields the page names: validity 2027-01-01 .. 2028-01-01, one address
  assert.equals(R.u64be(1798761600) .. R.u64be(1830297600) .. "\1\014" .. "127.0.0.1:7701", body)
  assert.truthy(page:find("`02 60`", 1, true))
  assert.equals(96, #c)
  -- and the core takes it: a keyed context whose identity carries it
  -- sends it in its HELLO (has_cert 2, varint 96, the certificate)
  local h = R.hello_body{ addr = "127.0.0.1:7701", mode = 1, eph = ("\0"):rep(32), id = EX.key_alice,
                          name = "alice", cert = c }
  assert.truthy(h:find("\2\96" .. c, 1, true))
  assert.same(c, assert(R.parse_hello(h)).cert)
end

function CHECK.ticket_alice()
  local exp = EX.ticket_alice:sub(1, 8)
  assert.equals(R.u64be(1798761600), exp)
  assert.is_true(R.verify(EX.key_nameserver, "lecho-producer-v2\0" .. "127.0.0.1:7700/temp\0" .. EX.key_alice
                          .. exp, EX.ticket_alice:sub(9)))
end

------------------------------------------------------------------------------
-- A raw connection to an in-process core context whose loop this spec runs.

local function connect(c)
  local host, port = c:addr():match("^(.+):(%d+)$")
  local s = assert(socket.tcp())
  s:settimeout(2)
  assert(s:connect(host, tonumber(port)))
  s:settimeout(0)
  return { s = s, buf = "" }
end

local function send(conn, bytes) assert(conn.s:send(bytes) == #bytes) end

-- Runs c's loop until `want(conn)` is true (5 s at most), reading into conn.buf.
local function pump(c, conn, want)
  local deadline = socket.gettime() + 5
  while not want(conn) do
    assert(socket.gettime() < deadline, "no answer from the context; got " .. R.hex(conn.buf))
    c:run_once(0.01)
    local data, err, partial = conn.s:receive(65536)
    local got = data or partial
    if got and #got > 0 then conn.buf = conn.buf .. got end
    if err == "closed" then conn.closed = true end
  end
end

-- The next whole frame of conn.buf, waiting for it: type, body, its bytes.
local function next_frame(c, conn)
  pump(c, conn, function(k) return R.parse_frame(k.buf) ~= nil or k.closed end)
  local t, body, nxt = R.parse_frame(conn.buf)
  assert(t, "connection closed before a frame came")
  local bytes = conn.buf:sub(1, nxt - 1)
  conn.buf = conn.buf:sub(nxt)
  return t, body, bytes
end

describe("doc/protocol.md", function()
  it("has a check for every example and an example of every frame type", function()
    assert.is_true(#ORDER >= 20, "the page's examples were not found")
    for _, name in ipairs(ORDER) do assert.is_function(CHECK[name], "no check for example " .. name) end
    for name in pairs(CHECK) do assert.truthy(EX[name], "the page lost example " .. name) end
    local seen = {}
    for _, name in ipairs(ORDER) do
      local t = R.parse_frame(EX[name])
      if t and #EX[name] >= 5 and R.get_u32le(EX[name], 1) + 4 == #EX[name] then seen[t] = true end
    end
    seen[R.F.AUTH_OK] = seen[R.F.AUTH_OK] or open_record(EX.record_auth_ok, select(2, session())) ~= nil
    for t = 1, 13 do assert.is_true(seen[t] == true, "no example of frame type " .. t) end
  end)

  for _, name in ipairs(ORDER) do
    it("example " .. name .. " says what the page says it does", function()
      assert.is_function(CHECK[name], "no check for example " .. name)
      CHECK[name]()
    end)
  end
end)

-- (live) The examples played to lecho's own code.
describe("doc/protocol.md played to lecho", function()
  describe("a live context in protected mode", function()
    local c, events, ctrls
    before_each(function()
      c = core.new()
      assert(c:listen("127.0.0.1:0"))
      local chid = c:channel("127.0.0.1:7700/temp")
      c:set_local(chid, true)
      events, ctrls = {}, {}
      c:hooks({
        event = function(ch, v, _, producer, seq, sync)
          events[#events + 1] = { chid = ch, value = v, producer = producer, seq = seq, sync = sync,
                                  want = chid }
          return false, 1, nil
        end,
        ctrl = function(from, msg) ctrls[#ctrls + 1] = { from = from, msg = msg } end,
        log = function() end,
      })
    end)
    after_each(function() c:close() end)

    it("HELLO is answered by a HELLO_OK of the documented layout; BIND, EVENT, ACK, PING and CTRL as the examples say",
       function()
      local k = connect(c)
      send(k, EX.hello)
      local t, body, bytes = next_frame(c, k)
      assert.equals(R.F.HELLO_OK, t, "answer to the HELLO example: " .. body)
      local h = assert(R.parse_hello(body, true))
      assert.equals(c:addr(), h.addr)
      -- the example's layout with this context's own address and incarnation
      -- (its varint bytes as they came: a 64-bit number is no double)
      local _, after = R.get_varint(body, 7)
      assert.equals(R.frame(R.F.HELLO_OK, "LECH\0\3" .. body:sub(7, after - 1) .. R.varint(#h.addr)
                                          .. h.addr .. "\0"), bytes)
      send(k, EX.bind .. EX.event)
      -- the first BIND accepted: the read confirmation offer (section 8), then the ACK
      t, body, bytes = next_frame(c, k)
      assert.equals(EX.confirm_offer, bytes, "the read confirmation offer after the first BIND")
      t, body, bytes = next_frame(c, k)
      assert.equals(1, #events)
      local e = events[1]
      assert.same({ 21.5, 1, 1, 7 }, { e.value, e.producer, e.seq, e.sync })
      assert.equals(e.want, e.chid)
      assert.equals(EX.ack, bytes, "the ACK of the EVENT example")
      send(k, EX.ping)
      repeat t, body, bytes = next_frame(c, k) until t ~= R.F.ACK
      assert.equals(EX.heartbeat, bytes, "the answer to the PING example")
      send(k, EX.confirm_ask)
      t, body, bytes = next_frame(c, k)
      assert.equals(EX.confirm, bytes, "the answer to the CONFIRM_ASK example")
      send(k, EX.ctrl_lookup)
      pump(c, k, function() return #ctrls > 0 end)
      assert.same({ from = "127.0.0.1:7701", msg = { op = "lookup", ch = "127.0.0.1:7700/temp", rid = 1 } },
                  ctrls[1])
      k.s:close()
    end)

    it("the version-1 HELLO example gets the ERROR example", function()
      local k = connect(c)
      send(k, EX.hello_v1)
      local t, body, bytes = next_frame(c, k)
      assert.equals(R.F.ERROR, t, body)
      assert.equals(EX.error, bytes)
      k.s:close()
    end)
  end)

  it("the keyed HELLO example completes a handshake with a keyed context", function()
    local c = core.new()
    local ok, err = pcall(function()
      local _, ns_sk = R.seed_keypair(SEED(3))
      local alice_pk, alice_sk = R.seed_keypair(SEED(1))
      assert(c:set_identity(ns_sk, "nameserver"))
      assert(c:trust_key(alice_pk, "alice"))
      c:hooks({ log = function() end })
      assert(c:listen("127.0.0.1:0"))
      local k = connect(c)
      send(k, EX.hello_keyed)
      local t, body = next_frame(c, k)
      assert.equals(R.F.HELLO_OK, t, body)
      local h = assert(R.parse_hello(body, true))
      assert.equals(EX.key_nameserver, h.id)
      assert.equals("nameserver", h.name)
      local T = R.blake2b32(frame_of("hello_keyed", R.F.HELLO) .. body:sub(1, #body - 64))
      assert.is_true(R.verify(h.id, CTX_A .. T, h.sig), "sig_acceptor of the live HELLO_OK")
      send(k, R.frame(R.F.AUTH, R.sign(alice_sk, CTX_D .. T)))
      local epk, esk = R.kx_keypair(SEED(2))
      local rx = R.session_keys(true, epk, esk, h.eph)
      pump(c, k, function(kk) return #kk.buf >= 4 and #kk.buf >= 4 + R.get_u32le(kk.buf, 1) end)
      local clen = R.get_u32le(k.buf, 1)
      local plain = R.open(rx, 0, k.buf:sub(1, 4), k.buf:sub(5, 4 + clen))
      assert.truthy(plain, "the first record decrypts with the dialler's rx key")
      assert.equals(R.frame(R.F.AUTH_OK), plain:sub(1, 5))
      k.s:close()
    end)
    c:close()
    assert(ok, err)
  end)
end)
