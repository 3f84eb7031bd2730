-- core/fuzz/seeds.lua: writes the seed corpora of the libFuzzer harnesses
-- (core/fuzz/fuzz_<name>.c) into core/fuzz/<name>/: real values, frames and
-- control messages as lecho sends them, built with the core's own encoder.
-- The files are in git; run this again when a format changes:
--
--   make && LUA_PATH="$PWD/lua/?.lua;$PWD/?.lua;;" LUA_CPATH="$PWD/lua/?.so;;" \
--     luajit core/fuzz/seeds.lua
--
-- (the handshake harness records its seeds itself: real keyed handshakes.)

local core = require "lecho.core"
local R = require "spec.support.rogue"

local root = (arg and arg[1]) or "core/fuzz"

local function write(name, file, bytes)
  os.execute(("mkdir -p %s/%s"):format(root, name))
  local f = assert(io.open(("%s/%s/%s"):format(root, name, file), "wb"))
  f:write(bytes)
  f:close()
end

local function enc(v) return assert(core.encode(v)) end

-- Values: every tag, nesting, keys of each kind, a pinned-size string.
local VALUES = {
  scalars = { 1, -1.5, 2^53, -0.0, 1/0, true, false, "text" },
  event = { i = 42, secret = "TOPSECRET", t = 1764770000.25, list = { 1, 2, 3 } },
  nested = { a = { b = { c = { d = { "deep" } } } } },
  mixed = { 10, 20, nil, 40, [true] = "t", [1.5] = "f", ["with space"] = { {} } },
  strings = { ("x"):rep(300), "", "\0\1\2", "héllo" },
  members = { op = "members", ch = "ns/x", rid = 7, members = { { addr = "127.0.0.1:7001" },
              { addr = "127.0.0.1:7002", modulator = "function enqueue(ev) return ev end" } } },
}

-- codec: byte 0 chooses the limits (fuzz_codec.c), 0x0a = depth 100, 64 KiB
for name, v in pairs(VALUES) do write("codec", name, "\10" .. enc(v)) end
write("codec", "tight-limits", "\1" .. enc({ { { 1 } } }))

-- frame: a stream of the frames of a protected connection after its HELLO
local hello = R.hello{ addr = "127.0.0.1:7001", incarnation = 12345 }
write("frame", "protected-session", hello
  .. R.bind(0, "127.0.0.1:7000/ns/x") .. R.bind(1, "127.0.0.1:7000/ns/y")
  .. R.event(0, 1, 1, 0, VALUES.event) .. R.event(1, 1, 2, 9, VALUES.nested)
  .. R.ack(9, 1) .. R.ack(10, 0, { "handler failed" })
  .. R.ctrl(VALUES.members) .. R.frame(R.F.HEARTBEAT) .. R.frame(R.F.PING))
write("frame", "keyed-hello", R.hello{ addr = "127.0.0.1:7001", incarnation = 9, mode = 1, eph = ("\5"):rep(32),
                                       id = ("\6"):rep(32), name = "mallory", cert = ("\8"):rep(64) })
write("frame", "event-body", R.varint(3) .. R.varint(7) .. R.varint(100) .. R.varint(0) .. enc(VALUES.event))
write("frame", "bind-ticket", R.bind(2, "127.0.0.1:7000/ns/x", ("\7"):rep(64)))

-- conn: 4 hook actions, the cut, then what a producer sends after its HELLO
-- (fuzz_conn.c: 0 nothing, 1 close, 2 submit, 3 re-target, 4 stop
-- consuming, 5 suspend, 6 ack, 7 ctrl, 8 bad)
local session = R.bind(0, "ns/x") .. R.bind(1, "ns/y")
  .. R.event(0, 1, 1, 0, VALUES.event) .. R.event(1, 1, 2, 5, VALUES.nested)
  .. R.event(0, 1, 3, 6, "v") .. R.ack(1, 1) .. R.ctrl(VALUES.members) .. R.frame(R.F.HEARTBEAT)
  .. R.frame(R.F.PING) .. R.event(0, 1, 4, 0, VALUES.strings)
for name, acts in pairs{ quiet = "\0\0\0\0", submit = "\2\6\2\0", suspend = "\5\0\5\6",
                         retarget = "\3\2\4\2", close = "\0\1\0\0", ctrl = "\7\8\7\2" } do
  write("conn", name, acts .. "\128" .. session)
end

-- ns: byte 0 (bit 0: keyed), then records: kind (0 name server, 1 manager,
-- 2 connection lost, 3 tick), sender (0..3 clients, 4 the other registry),
-- time step (1/16 s), u16le length, value (fuzz_ns.c)
local function rec(kind, who, dt, msg)
  local b = msg and enc(msg) or ""
  return string.char(kind, who, dt, #b % 256, math.floor(#b / 256)) .. b
end
local mods = { k1 = { src = "function enqueue(ev) return ev end", params = { n = 1 }, period = 0.5 } }
local flow = rec(0, 4, 1, { op = "register_manager", rid = 1 })
  .. rec(0, 0, 1, { op = "lookup", ch = "atmos/ozone", rid = 2 })
  .. rec(0, 1, 1, { op = "lookup", ch = "atmos/ozone", rid = 3, recovering = true })
  .. rec(1, 0, 1, { op = "join", ch = "atmos/ozone", role = "producer", rid = 4 })
  .. rec(1, 1, 2, { op = "join", ch = "atmos/ozone", role = "consumer", rid = 5, settle = 1,
                    subs = { plain = true, mods = mods } })
  .. rec(1, 0, 1, { op = "members_ok", ch = "atmos/ozone", ver = 2, mid = 1 })
  .. rec(1, 1, 1, { op = "subscribe", ch = "atmos/ozone", rid = 6, subs = { plain = false, mods = mods } })
  .. rec(1, 2, 1, { op = "info", ch = "atmos/ozone", rid = 7 })
  .. rec(0, 2, 1, { op = "list", rid = 8 })
  .. rec(3, 0, 20) .. rec(1, 1, 1, { op = "leave", ch = "atmos/ozone", role = "consumer" })
  .. rec(2, 0, 1) .. rec(3, 0, 40) .. rec(0, 4, 1, { op = "release", ch = "atmos/ozone" })
write("ns", "protected-flow", "\0" .. flow)
write("ns", "keyed-flow", "\1" .. flow)
write("ns", "bad-requests", "\0" .. rec(0, 0, 1, { op = "lookup", rid = "x" }) .. rec(0, 1, 1, { op = 7, rid = 1 })
  .. rec(1, 2, 1, { op = "join", ch = ("c"):rep(2000), role = "producer", rid = 2 })
  .. rec(1, 2, 1, { op = "join", ch = "x", role = "consumer", rid = 3, subs = { mods = { [1] = 2 } } }))
-- groups with leases (lecho.presence): joins, watches, renewals, a leave,
-- expiry by ticks, a lost connection
write("ns", "groups", "\0" .. rec(0, 0, 1, { op = "gjoin", group = "chat", lease = 1, data = { nick = "a" }, rid = 1 })
  .. rec(0, 1, 1, { op = "gwatch", group = "chat", on = true, lease = 2, rid = 2 })
  .. rec(0, 2, 1, { op = "gjoin", group = "chat", lease = 0.5, watch = true, ver = 1, epoch = "x", rid = 3 })
  .. rec(0, 0, 4, { op = "gjoin", group = "chat", lease = 1, data = { nick = "b" }, rid = 4 })
  .. rec(0, 3, 1, { op = "glist", group = "chat", rid = 5 }) .. rec(3, 0, 12) .. rec(2, 1, 1)
  .. rec(0, 0, 1, { op = "gleave", group = "chat", rid = 6 }) .. rec(3, 0, 40)
  .. rec(0, 2, 1, { op = "gwatch", group = "chat", on = false, rid = 7 }))

return { values = VALUES, write = write, enc = enc }
