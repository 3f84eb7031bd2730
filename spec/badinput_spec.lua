-- Proves the bad-input contract over real TCP connections:
--
--   garbage, truncated frames, absurd lengths or a wrong protocol version,
--   sent to a context's port or to the name server, close that one
--   connection with a logged reason; the process and its other connections
--   carry on.  A mismatch of protocol version is refused with a clear
--   message on both sides.
--
-- Every case runs against (a) a context in this process, whose loop the spec
-- drives, with a well-behaved context in a child process connected to it the
-- whole time, and (b) a scripts/lecho-nameserver process, with a consumer
-- process attached to it the whole time.  After each case the spec checks
-- the logged reason, the bad-frame count, the ERROR frame the offender got,
-- that no huge buffer was allocated, and that events (async and sync) still
-- flow.  Raw frames are built by hand here (layout in core/transport/frame.h) and sent
-- with luasocket.
--
-- Run: make && LUA_PATH="$PWD/lua/?.lua;$PWD/lua/?/init.lua;;" \
--   LUA_CPATH="$PWD/lua/?.so;;" LECHO_ROOT=$PWD luajit /usr/bin/busted spec/badinput_spec.lua

local lecho = require "lecho"
local socket = require "socket"
local support = require "spec.support"

local F_HELLO, F_HELLO_OK, F_ERROR, F_CTRL, F_BIND, F_EVENT = 1, 2, 3, 4, 5, 6
-- max_string (256 MiB) + 64 KiB: what core.new makes of the default (issue 11)
local DEFAULT_MAX_FRAME = 2 ^ 28 + 65536
local WAIT = 5                          -- seconds any single wait may take

------------------------------------------------------------------------------
-- Hand-built frames

local W = require "spec.wire"
local u32le, varint, frame, bind = W.u32le, W.varint, W.frame, W.bind

-- A HELLO of the given version (or frame type) from addr.
local function hello(version, addr, ftype)
  return W.hello(addr, { version = version, ftype = ftype, incarnation = 12345 })
end

-- Each event its own sequence number: a repeated one is a duplicate, dropped
-- before its value is looked at.
local event_seq = 0
local function event(idx, value, sync)
  event_seq = event_seq + 1
  return frame(F_EVENT, varint(idx) .. varint(1) .. varint(event_seq) .. varint(sync or 0) .. value)
end

local parse_frames = W.frames

-- Deterministic garbage: the same bytes on every run.
local function garbage(n, seed)
  local x, out = seed, {}
  for i = 1, n do
    x = (x * 1103515245 + 12345) % 2147483648
    out[i] = string.char(math.floor(x / 65536) % 256)
  end
  return table.concat(out)
end

-- A listen address that no context uses, one per fake peer.
local fake_port = 60000
local function fake_addr()
  fake_port = fake_port + 1
  return "127.0.0.1:" .. fake_port
end

------------------------------------------------------------------------------
-- A raw TCP client

local Raw = {}
Raw.__index = Raw

local function raw_connect(target)
  local host, port = target.addr:match("^(.+):(%d+)$")
  local s = assert(socket.tcp())
  s:settimeout(WAIT)
  assert(s:connect(host, tonumber(port)))
  s:setoption("tcp-nodelay", true)
  s:settimeout(0)
  return setmetatable({ s = s, buf = "", closed = false,
                        mark = target:log_mark(), bad0 = target:bad_frames(),
                        vm0 = target:vm_peak_kb() }, Raw)
end

function Raw:send(bytes)
  self.s:settimeout(WAIT)
  local i = 1
  while i <= #bytes do
    local last, err, partial = self.s:send(bytes, i)
    if not last then
      if err == "closed" then return false end
      last = partial
    end
    i = last + 1
  end
  self.s:settimeout(0)
  return true
end

-- Reads whatever has arrived without blocking; notes when the peer closed.
function Raw:pump()
  if self.closed then return end
  repeat
    local data, err, partial = self.s:receive(65536)
    local got = data or partial
    if got and #got > 0 then self.buf = self.buf .. got end
    if err == "closed" or (err and err ~= "timeout") then self.closed = true end
  until not data or self.closed
end

function Raw:frames() return parse_frames(self.buf) end

function Raw:close()
  self.s:close()
  self.closed = true
end

------------------------------------------------------------------------------
-- Targets: what garbage is sent to, with a healthy neighbour attached

-- (a) A context in this process.  Its loop only turns inside target:wait.
-- A child process runs a well-behaved context with the reverse roles, so
-- that each side produces and consumes: "down" from here to the child, the
-- child echoes on "up".
local CHILD_PEER = [[
local lecho = require "lecho"
local ns, readyf = arg[1], arg[2]
local ctx = lecho.context{ nameserver = ns, quiet = true, timeout = 5 }
local up = assert(ctx:channel("up"):producer())
assert(ctx:channel("down"):consumer(function(ev)
  assert(up:submit({ echo = ev.n }))
end))
local f = assert(io.open(readyf, "w")) f:write("ready\n") f:close()
ctx:after(110, function() ctx:stop() end)
ctx:run()
ctx:close()
]]

local function context_target()
  local T = { kind = "context", logs = {} }
  local logs = T.logs
  T.ctx = lecho.context{ log = function(m) logs[#logs + 1] = m end }
  T.addr = T.ctx.addr
  T.echoes = {}
  assert(T.ctx:channel("up"):consumer(function(ev) T.echoes[ev.echo] = true end))
  T.down = assert(T.ctx:channel("down"):producer())
  -- A channel this context consumes, for events whose value it must decode.
  T.consumed = T.ctx.addr .. "/values"
  T.values = {}
  assert(T.ctx:channel("values"):consumer(function(ev) T.values[#T.values + 1] = ev end))
  local readyf = support.tmpname("ready")
  T.child = support.lua(CHILD_PEER, T.addr, readyf)
  assert(support.run_until(T.ctx, function() return support.read(readyf) end, 15),
         "child context did not start: " .. support.errors(T.child))
  -- The child is a consumer of "down" once our producer knows about it.
  assert(support.run_until(T.ctx, function() return T.down.ch.dests and #T.down.ch.dests == 1 end,
                           WAIT))

  function T:wait(pred, timeout) return support.run_until(self.ctx, pred, timeout or WAIT) end
  function T:log() return table.concat(self.logs, "\n") end
  function T:log_mark() return #self.logs end
  function T:log_since(mark) return table.concat(self.logs, "\n", mark + 1) end
  function T:bad_frames() return self.ctx:stats().bad_frames end
  function T:vm_peak_kb()
    local s = support.read("/proc/self/status") or ""
    return tonumber(s:match("VmPeak:%s*(%d+)")) or 0
  end
  function T:running() return true end -- we are it
  local n = 0
  -- Events both ways and a sync submit, over the connection that was up all along.
  function T:works()
    n = n + 1
    local a, s = "async" .. n, "sync" .. n
    assert(self.down:submit({ n = a }))
    local ok, err = self.down:submit_sync({ n = s }, { timeout = WAIT })
    assert(ok, "sync submit failed: " .. tostring(err))
    return self:wait(function() return self.echoes[a] and self.echoes[s] end)
  end
  function T:close() self.ctx:close() end
  return T
end

-- (b) A name server process, with a consumer process attached to it; after
-- each case a fresh producer process looks the channel up there and submits.
local CHILD_CONSUMER = [[
local lecho = require "lecho"
local ns, readyf = arg[1], arg[2]
local ctx = lecho.context{ nameserver = ns, quiet = true, timeout = 5 }
io.stdout:setvbuf("no")
assert(ctx:channel("feed"):consumer(function(ev) io.stdout:write("got ", ev.n, "\n") end))
local f = assert(io.open(readyf, "w")) f:write("ready\n") f:close()
ctx:after(110, function() ctx:stop() end)
ctx:run()
ctx:close()
]]

local CHILD_PRODUCER = [[
local lecho = require "lecho"
local ns, n = arg[1], arg[2]
local ctx = lecho.context{ nameserver = ns, quiet = true, timeout = 5 }
local p = assert(ctx:channel("feed"):producer())
assert(p:submit({ n = "async" .. n }))
local ok, err = p:submit_sync({ n = "sync" .. n }, { timeout = 5 })
if not ok then io.stderr:write("sync failed: ", tostring(err), "\n") os.exit(1) end
ctx:close()
print("ok")
]]

local function nameserver_target()
  local T = { kind = "nameserver" }
  T.ns, T.addr = support.nameserver()
  local readyf = support.tmpname("ready")
  T.consumer = support.lua(CHILD_CONSUMER, T.addr, readyf)
  assert(support.wait_file(readyf, "ready", 15),
         "consumer did not start: " .. support.errors(T.consumer))

  function T:wait(pred, timeout)
    local deadline = socket.gettime() + (timeout or WAIT)
    while not pred() do
      if socket.gettime() > deadline then return false end
      socket.sleep(0.02)
    end
    return true
  end
  function T:log() return support.errors(self.ns) end
  function T:log_mark() return #self:log() end
  function T:log_since(mark) return self:log():sub(mark + 1) end
  -- The process's own counter is not reachable from here: its log has one
  -- "closing connection from" line per connection closed for bad input.
  function T:bad_frames()
    local k = 0
    for _ in self:log():gmatch("closing connection from") do k = k + 1 end
    return k
  end
  function T:vm_peak_kb()
    local s = support.read(("/proc/%d/status"):format(self.ns.pid)) or ""
    return tonumber(s:match("VmPeak:%s*(%d+)")) or 0
  end
  function T:running()
    return os.execute(("kill -0 %d 2>/dev/null"):format(self.ns.pid)) == 0
  end
  local n = 0
  function T:works()
    n = n + 1
    local p = support.lua(CHILD_PRODUCER, self.addr, tostring(n))
    local done, rc = support.wait(p, 20)
    assert(done, "producer process hung")
    assert(rc == 0, "producer process failed: " .. support.errors(p))
    local out = support.output(self.consumer)
    return self:wait(function()
      out = support.output(self.consumer)
      return out:find("got async" .. n .. "\n", 1, true) and out:find("got sync" .. n .. "\n", 1, true)
    end)
  end
  function T:close() end
  return T
end

------------------------------------------------------------------------------
-- The checks every case shares

-- The offender's connection is closed with `reason` in the log, counted as a
-- bad frame, told so in an ERROR frame; nothing huge was allocated; the
-- target and its other connections carry on.
local function assert_refused(T, c, reason)
  local logged
  local function told()
    local frames = c:frames()
    local last = frames[#frames]
    return last and last.type == F_ERROR and last.body:find(reason, 1, true)
  end
  local ok = T:wait(function()
    c:pump()
    logged = T:log_since(c.mark)
    return c.closed and (logged:find(reason, 1, true) or told())
  end)
  assert(ok, ("not refused with '%s' (closed: %s); log since: %s"):format(
    reason, tostring(c.closed), T:log_since(c.mark)))
  if not logged:find(reason, 1, true) then
    -- Bad input before the handshake is logged once per 10 s (issue 11: an
    -- unidentified peer must not flood the log): this one was counted
    -- behind the window's first line, an earlier case's.
    T:wait(function() return false end, 0.2)
    logged = T:log_since(c.mark)
    assert.falsy(logged:find(reason, 1, true) == nil and
                 not T:log():find("closing connection from unidentified peer", 1, true),
                 "neither logged nor rate-limited: " .. reason)
  end
  if T.kind == "context" or logged:find(reason, 1, true) then
    assert.are.equal(c.bad0 + 1, T:bad_frames())
  end
  local frames = c:frames()
  local last = frames[#frames]
  assert.truthy(last, "no frame received")
  assert.are.equal(F_ERROR, last.type)
  assert.truthy(last.body:find(reason, 1, true))
  assert.is_true(T:vm_peak_kb() - c.vm0 < 256 * 1024, "the target's address space grew by 256 MiB or more")
  c:close()
  assert.is_true(T:running())
  assert.truthy(T:works(), "events no longer flow after the bad input")
  return logged, last.body
end

-- A valid handshake from a fake context; returns the open connection.
local function handshaken(T)
  local c = raw_connect(T)
  c.peer = fake_addr()
  assert(c:send(hello(3, c.peer)))
  assert(T:wait(function() c:pump() return #c:frames() >= 1 or c.closed end), "no HELLO_OK")
  local f = c:frames()[1]
  assert.are.equal(F_HELLO_OK, f.type)
  assert.are.equal("LECH\0\3", f.body:sub(1, 6))
  return c
end

------------------------------------------------------------------------------

for _, kind in ipairs({ "context", "nameserver" }) do
  describe("bad input sent to a " .. kind, function()
    local T

    setup(function()
      T = kind == "context" and context_target() or nameserver_target()
      assert.truthy(T:works(), "events do not flow even before any bad input")
    end)

    teardown(function()
      if T then T:close() end
      support.cleanup()
    end)

    it("refuses random garbage bytes before the handshake, and carries on", function()
      local junk = garbage(4096, 7)
      local b1, b2, b3, b4 = junk:byte(1, 4)
      local len = b1 + b2 * 2 ^ 8 + b3 * 2 ^ 16 + b4 * 2 ^ 24
      local c = raw_connect(T)
      c:send(junk)
      -- Before the handshake only small frames are taken (HANDSHAKE_FRAME_MAX
      -- in core/transport/conn_io.c): a longer one is refused at once, not waited for.
      assert_refused(T, c, ("frame length exceeds limit (%d bytes, limit 4096)"):format(len))
    end)

    it("refuses garbage that frames as a small non-HELLO frame: expected a handshake", function()
      local c = raw_connect(T)
      c:send(frame(0x9c, garbage(40, 11)))
      assert_refused(T, c, "expected a handshake (HELLO) first")
    end)

    it("refuses garbage in a HELLO frame: bad magic", function()
      local c = raw_connect(T)
      c:send(frame(F_HELLO, garbage(40, 13)))
      assert_refused(T, c, "bad magic in handshake (not a lecho peer)")
    end)

    it("refuses an HTTP request line at once instead of waiting for 542 MB", function()
      local c = raw_connect(T)
      c:send("GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
      -- "GET " read as a little-endian length is 542393671.
      assert_refused(T, c, "frame length exceeds limit (542393671 bytes, limit 4096)")
    end)

    it("refuses a length prefix of 0x7fffffff after the handshake without allocating it", function()
      local c = handshaken(T)
      c:send(u32le(0x7fffffff) .. string.char(F_EVENT) .. "\0\0\0\0")
      assert_refused(T, c, ("frame length exceeds limit (2147483647 bytes, limit %d)")
        :format(DEFAULT_MAX_FRAME))
    end)

    it("refuses a length prefix of 0x7fffffff as the very first bytes", function()
      local c = raw_connect(T)
      c:send(u32le(0x7fffffff) .. string.char(F_HELLO))
      assert_refused(T, c, "frame length exceeds limit (2147483647 bytes, limit 4096)")
    end)

    it("refuses a frame of length 0", function()
      local c = handshaken(T)
      c:send(u32le(0) .. string.char(F_EVENT))
      assert_refused(T, c, "frame of length 0")
    end)

    it("cleans up a truncated frame followed by a close, without counting it as bad", function()
      local mark, bad0 = T:log_mark(), T:bad_frames()
      -- half a HELLO, then gone
      local c1 = raw_connect(T)
      c1:send(hello(3, fake_addr()):sub(1, 9))
      c1:close()
      -- a handshake, then half an EVENT (the length promises more), then gone
      local c2 = handshaken(T)
      c2:send(event(0, lecho.encode({ x = 1 })):sub(1, 7))
      c2:close()
      if T.kind == "context" then
        assert.truthy(T:wait(function()
          local p = T.ctx:stats().peers[c2.peer]
          return p and not p.connected
        end), "the half-read connection was not cleaned up")
        assert.are.equal("connection closed by peer", T.ctx:stats().peers[c2.peer].last_error)
      else
        T:wait(function() return false end, 0.3) -- no stats from outside: give it time to see both
      end
      assert.are.equal(bad0, T:bad_frames())
      assert.falsy(T:log_since(mark):find("closing connection from", 1, true))
      assert.is_true(T:running())
      assert.truthy(T:works())
    end)

    it("refuses a HELLO of protocol version 1 with an ERROR frame naming both versions", function()
      local c = raw_connect(T)
      c:send(hello(1, fake_addr()))
      local _, text = assert_refused(T, c, "protocol version mismatch: peer speaks 1, this side speaks 3")
      assert.are.equal("protocol version mismatch: peer speaks 1, this side speaks 3", text)
    end)

    it("refuses a HELLO of version 1 whose body would not parse as version 3", function()
      local c = raw_connect(T)
      c:send(frame(F_HELLO, "LECH\0\1" .. garbage(30, 17)))
      assert_refused(T, c, "protocol version mismatch: peer speaks 1, this side speaks 3")
    end)

    it("refuses a keyed HELLO: this side has no keys (protected mode)", function()
      local c = raw_connect(T)
      local a = fake_addr()
      -- mode 1, ephemeral and identity keys, principal "x", no certificate
      c:send(frame(F_HELLO, "LECH\0\3" .. varint(1) .. varint(#a) .. a .. "\1" .. ("k"):rep(64)
                            .. varint(1) .. "x" .. "\0"))
      assert_refused(T, c, "mode mismatch: this side has no keys (protected mode) and refuses a keyed peer")
    end)

    it("refuses a HELLO with an impossible address length", function()
      local c = raw_connect(T)
      c:send(frame(F_HELLO, "LECH\0\3" .. varint(1) .. varint(200) .. "127.0.0.1:1\0"))
      assert_refused(T, c, "bad address in handshake")
    end)

    it("refuses a HELLO whose address is not one, or not in its canonical spelling", function()
      -- a second spelling of one address would make a second peer for it
      for _, a in ipairs{ "localhost:1", "[0::1]:1", "127.0.0.1:01", "unix:rel", "x", "1.2.3.4:0" } do
        local c = raw_connect(T)
        c:send(hello(3, a))
        assert_refused(T, c, "bad address in handshake")
      end
    end)

    it("refuses an EVENT on a channel that was never bound", function()
      local c = handshaken(T)
      c:send(event(5, lecho.encode({ x = 1 })))
      assert_refused(T, c, "event on a channel that was never bound")
    end)

    it("refuses a BIND with an empty channel name", function()
      local c = handshaken(T)
      c:send(bind(0, ""))
      assert_refused(T, c, "bad channel name in bind")
    end)

    it("refuses an unknown frame type after the handshake", function()
      local c = handshaken(T)
      c:send(frame(0x63, "whatever"))
      assert_refused(T, c, "unknown frame type 99")
    end)

    it("refuses a control message that is not a valid value", function()
      local c = handshaken(T)
      c:send(frame(F_CTRL, "\8\8\8"))
      local logged = assert_refused(T, c, "malformed control message")
      assert.truthy(logged:find("unknown tag 0x08", 1, true))
    end)

    if kind == "context" then
      it("refuses a bound EVENT whose value has an unknown tag, after delivering the good one before it", function()
        local before = #T.values
        local c = handshaken(T)
        c:send(bind(0, T.consumed) .. event(0, lecho.encode({ ok = 1 }))
               .. event(0, "\8garbage"))
        local logged = assert_refused(T, c, "malformed event value")
        assert.truthy(logged:find("bad event value from " .. c.peer .. ": unknown tag 0x08", 1, true))
        assert.are.equal(before + 1, #T.values) -- the good one before it was delivered
        assert.are.equal(1, T.values[#T.values].ok)
      end)

      it("refuses a bound EVENT whose value is truncated, delivering nothing", function()
        local before = #T.values
        local c = handshaken(T)
        c:send(bind(3, T.consumed) .. event(3, "\5\20short"))
        local logged = assert_refused(T, c, "malformed event value")
        assert.truthy(logged:find("truncated", 1, true))
        assert.are.equal(before, #T.values)
      end)

      -- Issue 24: the array tag from a rogue peer.  Each costs that
      -- connection, with the reason, before anything is allocated for it.
      local function arr(dtype, dims, nbytes, bytes)
        local h = "\7" .. varint(#dtype) .. dtype .. varint(#dims)
        for _, d in ipairs(dims) do h = h .. varint(d) end
        return h .. varint(nbytes) .. (bytes or "")
      end
      local ARRAY_CASES = {
        { "a shape whose product overflows", arr("<f8", { 2 ^ 32, 2 ^ 32 }, 0),
          "array shape does not match its bytes" },
        { "a shape whose product does not match its bytes", arr("<f8", { 3, 4 }, 95, ("x"):rep(95)),
          "array shape does not match its bytes" },
        { "a short payload", arr("<f8", { 1000 }, 8000, ("x"):rep(100)), "truncated input" },
        { "an unknown dtype", arr("<c16", { 1 }, 16, ("x"):rep(16)), "unknown array dtype" },
        { "nine dimensions", arr("<u1", { 1, 1, 1, 1, 1, 1, 1, 1, 1 }, 1, "x"), "array has too many dimensions" },
        { "an array inside a table 10,000 deep", ("\6\1\0"):rep(10000) .. arr("<u1", { 1 }, 1, "x"),
          "nesting too deep (limit 100)" },
        { "350,000 empty arrays (2.4 MB) that decode past max_value_bytes",
          "\6" .. varint(350000) .. "\0" .. arr("<u1", { 0 }, 0):rep(350000), "value decodes to more than" },
        { "one array of 65 MiB, past max_value_bytes", arr("<u1", { 65 * 2 ^ 20 }, 65 * 2 ^ 20, ("\0"):rep(65 * 2 ^ 20)),
          "value decodes to more than 67108864 bytes" },
      }
      for _, case in ipairs(ARRAY_CASES) do
        it("refuses a bound EVENT holding " .. case[1] .. ", delivering nothing", function()
          local before = #T.values
          -- made before the connection: the address space it takes is not
          -- what the target allocated for the bad input
          local bytes = bind(4, T.consumed) .. event(4, case[2])
          local c = handshaken(T)
          -- sent while the target's loop runs (it reads as it goes)
          local i = 1
          assert.is_true(T:wait(function()
            local last, err, partial = c.s:send(bytes, i)
            if err == "closed" then return true end
            i = (last or partial or i - 1) + 1
            return i > #bytes
          end, 60))
          local logged = assert_refused(T, c, "malformed event value")
          assert.truthy(logged:find(case[3], 1, true), logged)
          assert.are.equal(before, #T.values)
        end)
      end

      it("delivers a well-formed array from a hand-built frame (the cases above fail for their one fault)", function()
        local before = #T.values
        local c = handshaken(T)
        local bytes = "\1\0\2\0\3\0\4\0\5\0\6\0"
        c:send(bind(5, T.consumed) .. event(5, "\6\0\1\5\1f" .. arr("<i2", { 2, 3 }, 12, bytes)))
        assert.is_true(T:wait(function() c:pump() return #T.values > before end))
        local v = T.values[#T.values].f
        assert.are.same({ { 1, 2, 3 }, { 4, 5, 6 } }, v:totable())
        assert.are.equal("<i2", v:dtype())
        c:close()
      end)
    else
      -- The name server consumes no channel: an event reaching it is counted
      -- and dropped without being decoded, so a bad value there goes unseen.
      it("drops a bound EVENT with a garbage value unread (it consumes nothing) and stays up", function()
        local c = handshaken(T)
        local mark, bad0 = T:log_mark(), T:bad_frames()
        c:send(bind(0, T.addr .. "/feed") .. event(0, "\8garbage") .. event(0, "\5\20short"))
        T:wait(function() c:pump() return c.closed end, 0.5)
        assert.is_false(c.closed)
        assert.are.equal(bad0, T:bad_frames())
        assert.falsy(T:log_since(mark):find("closing connection from", 1, true))
        -- the same connection is still read: garbage on it is refused next
        c:send(frame(0x63, ""))
        assert_refused(T, c, "unknown frame type 99")
      end)
    end
  end)
end

------------------------------------------------------------------------------
-- The other side of a version mismatch: our context dials a server that
-- answers the handshake with version 1.

local FAKE_V1_SERVER = [[
local socket = require "socket"
local addrf = arg[1]
local srv = assert(socket.bind("127.0.0.1", 0))
local _, port = srv:getsockname()
local f = assert(io.open(addrf .. ".tmp", "w")) f:write("127.0.0.1:", port, "\n") f:close()
os.rename(addrf .. ".tmp", addrf)
srv:settimeout(30)
local c = assert(srv:accept())
c:settimeout(10)
local function frame()
  local h = assert(c:receive(4))
  local b1, b2, b3, b4 = h:byte(1, 4)
  local body = assert(c:receive(b1 + b2 * 256 + b3 * 65536 + b4 * 16777216))
  return body:byte(1), body:sub(2)
end
local t, body = frame()
io.stdout:setvbuf("no")
io.stdout:write("got type ", t, " version ", body:byte(5) * 256 + body:byte(6), "\n")
local addr = "127.0.0.1:" .. port
local reply = "LECH\0\1" .. string.char(1, #addr) .. addr
c:send(string.char(#reply + 1, 0, 0, 0, 2) .. reply)
t, body = frame()
io.stdout:write("got type ", t, ": ", body, "\n")
]]

describe("a context dialling a peer of another protocol version", function()
  teardown(function() support.cleanup() end)

  it("logs the mismatch, tells the peer, and fails the request with the reason", function()
    local addrf = support.tmpname("fake-addr")
    local fake = support.lua(FAKE_V1_SERVER, addrf)
    local addr = support.wait_file(addrf, "%d+\n", 10)
    assert(addr, "fake server did not start: " .. support.errors(fake))
    addr = addr:match("[^\n]+")
    local logs = {}
    local ctx = lecho.context{ nameserver = addr, timeout = 3,
                               log = function(m) logs[#logs + 1] = m end }
    local p, err = ctx:channel("x"):producer()
    local stats = ctx:stats()
    ctx:close()
    assert.is_nil(p)
    assert.truthy(err:find("protocol version mismatch: peer speaks 1, this side speaks 3", 1, true), err)
    local log = table.concat(logs, "\n")
    assert.truthy(log:find("closing connection from " .. addr
      .. ": protocol version mismatch: peer speaks 1, this side speaks 3", 1, true), log)
    assert.are.equal(1, stats.bad_frames)
    assert.is_false(stats.peers[addr].connected)
    -- the fake server heard our HELLO (version 3) and then our ERROR
    assert.truthy(support.wait(fake, 10), "fake server hung")
    local out = support.output(fake)
    assert.truthy(out:find("got type 1 version 3\n", 1, true), out)
    assert.truthy(out:find("got type 3: protocol version mismatch: peer speaks 1, this side speaks 3",
                           1, true), out)
  end)
end)
