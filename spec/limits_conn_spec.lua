-- Connections an attacker opens cost bounded memory, descriptors and CPU,
-- and each refusal is told to the peer (an ERROR with the reason) and
-- logged once per kind per 10 s (issue 11, README "Limits"):
--
--   * a frame declaring 1 GiB after a trivial handshake was buffered as it
--     came: max_frame is 256 MiB + 64 KiB by default, and max_buffered caps
--     the read buffers of all connections together;
--   * a finished 200 MiB frame's buffer was kept while the connection lived:
--     freed once drained;
--   * a 13-byte BIND with index 2^24 cost 128 MiB: indexes < max_peer_channels;
--   * idle sockets and 1-byte-per-second headers stayed open for ever:
--     handshake_timeout, and max_connections past which a socket is refused;
--   * out of file descriptors, accept() spun and flooded the log: it backs
--     off, refuses through a reserved descriptor, logs one line per window;
--   * HELLO took any address (NUL, newlines, %n, our own): validated.
--
-- The target is a context in a child process (its name server inside) that
-- consumes channel "flow"; a legitimate producer in another child sends it
-- a counted flow beside each attack, which must arrive whole.  The rogue:
-- spec/support/rogue.lua.
--
-- Run: make && LUA_PATH="$PWD/?.lua;$PWD/lua/?.lua;$PWD/lua/?/init.lua;;" \
--   LUA_CPATH="$PWD/lua/?.so;;" LECHO_ROOT=$PWD luajit /usr/bin/busted spec/limits_conn_spec.lua

local cjson = require "cjson"
local socket = require "socket"
local support = require "spec.support"
local R = require "spec.support.rogue"

-- The target: options from the JSON argument, log lines to o.log, "ev I"
-- per event of "flow", "ready ADDR" once listening.
local TARGET = [[
local cjson = require "cjson"
local lecho = require "lecho"
local o = cjson.decode(arg[1])
io.stdout:setvbuf("line")
local logf = assert(io.open(o.log, "w"))
logf:setvbuf("line")
o.opts.log = function(m) logf:write(m, "\n") end
local ctx = assert(lecho.context(o.opts))
assert(ctx:channel("flow"):consumer(function(ev) io.stdout:write("ev ", tostring(ev), "\n") end))
io.stdout:write("ready ", ctx.addr, "\n")
ctx:after(o.duration or 60, function() ctx:stop() end)
ctx:run()
ctx:close()
]]

-- A producer of n events 1..n on "flow" at the target's name server, 200
-- a second; "done" once all are submitted.
local PRODUCER = [[
local lecho = require "lecho"
local ns, n = arg[1], tonumber(arg[2])
io.stdout:setvbuf("line")
local ctx = assert(lecho.context{ nameserver = ns, quiet = true })
local p = assert(ctx:channel("flow"):producer())
local i = 0
ctx:every(0.005, function()
  if i < n then i = i + 1; p:submit(i) end
  if i == n then io.stdout:write("done\n"); i = n + 1; ctx:stop() end
end)
ctx:after(60, function() ctx:stop() end)
ctx:run()
ctx:close()
]]

local function target(opts, prefix)
  local log = support.tmpname("target-log")
  local arg = cjson.encode({ opts = opts or {}, log = log })
  local child = prefix and support.lua_with(prefix, TARGET, arg) or support.lua(TARGET, arg)
  local out = support.wait_file(child.out, "ready [^\n]+\n", 30)
  assert(out, "target did not start: " .. support.errors(child))
  child.addr = out:match("ready ([^\n]+)\n")
  child.log = log
  return child
end

local function events(child)
  local n = 0
  for _ in support.output(child):gmatch("ev %d+\n") do n = n + 1 end
  return n
end

local function log_lines(child, pattern)
  local n = 0
  for line in (support.read(child.log) or ""):gmatch("[^\n]+") do
    if not pattern or line:find(pattern) then n = n + 1 end
  end
  return n
end

local function rss_kib(pid)
  local f = io.open("/proc/" .. pid .. "/status")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return tonumber(s:match("VmRSS:%s*(%d+)"))
end

local function cpu_s(pid)
  local f = assert(io.open("/proc/" .. pid .. "/stat"))
  local s = f:read("*a")
  f:close()
  local rest = s:match("%) (.*)$")
  local fields = {}
  for w in rest:gmatch("%S+") do fields[#fields + 1] = w end
  return (tonumber(fields[12]) + tonumber(fields[13])) / 100  -- utime, stime (ticks of 1/100 s)
end

-- Starts the legitimate flow of n events to t; flow_done(t, n, timeout)
-- checks every one of them arrived.
local function flow(t, n)
  return support.lua(PRODUCER, t.addr, tostring(n))
end

local function flow_done(t, n, timeout)
  local deadline = socket.gettime() + timeout
  while socket.gettime() < deadline do
    if events(t) >= n then break end
    support.sleep(0.05)
  end
  assert.equals(n, events(t), "the legitimate flow lost events: " .. support.errors(t))
end

local claims = 0
local function dial(t, claim)
  claims = claims + 1     -- one address per rogue connection: a live one keeps its address
  return R.dial(t.addr, { addr = claim or ("127.0.0.1:%d"):format(20000 + claims), timeout = 5 })
end

-- A raw TCP socket to t, no handshake.
local function raw(t)
  local host, port = t.addr:match("^(.-):(%d+)$")
  local s = assert(socket.tcp())
  s:settimeout(5)
  assert(s:connect(host, tonumber(port)))
  return s
end

-- What s receives within timeout: the bytes, and whether it was closed.
local function recv_all(s, timeout)
  local deadline, got = socket.gettime() + timeout, {}
  while socket.gettime() < deadline do
    s:settimeout(math.max(0.01, deadline - socket.gettime()))
    local data, err, partial = s:receive(4096)
    got[#got + 1] = data or partial or ""
    if err == "closed" then return table.concat(got), true end
  end
  return table.concat(got), false
end

-- The ERROR text in bytes received in the clear, or nil.
local function error_text(bytes)
  local ty, body = R.parse_frame(bytes)
  if ty == R.F.ERROR then return body end
end

describe("connection limits (issue 11)", function()
  after_each(function() support.cleanup() end)

  it("refuses a frame declaring 1 GiB on its header and caps what all connections buffer", function()
    local t = target()
    local prod = flow(t, 400)
    local rss0 = rss_kib(t.pid)
    -- 1 GiB declared: past max_frame (256 MiB + 64 KiB by default)
    local p = assert(dial(t))
    p:send(R.bind(0, "junk") .. R.u32le(1024 * 1024 * 1024) .. string.char(R.F.EVENT) .. "\0\0\0\0")
    local d = p:drain(5)
    assert.matches("frame length exceeds limit %(1073741824 bytes, limit 268500992%)", tostring(d.error))
    -- 3 connections x 200 MiB declared, 4 MiB of each sent: the third would
    -- take the buffers past max_buffered (512 MiB)
    local ps, errs = {}, {}
    -- (the third sends only the header: bytes it sent that the target did
    -- not read would reset the connection, and the ERROR with it)
    for i = 1, 3 do
      ps[i] = assert(dial(t))
      ps[i]:send(R.bind(0, "junk") .. R.u32le(200 * 1024 * 1024) .. string.char(R.F.EVENT) .. "\0\0\0\0")
      if i < 3 then ps[i]:send(string.rep("\0", 4 * 1024 * 1024)) end
      support.sleep(0.2)
    end
    for i = 1, 3 do errs[i] = ps[i]:drain(i == 3 and 5 or 0.5).error end
    assert.is_nil(errs[1])
    assert.is_nil(errs[2])
    assert.matches("frame of 209715204 bytes exceeds the read buffer budget %(limit 536870912%)",
                   tostring(errs[3]))
    local grew = (rss_kib(t.pid) - rss0) / 1024
    assert(grew < 64, ("the target grew by %.0f MiB"):format(grew))
    flow_done(t, 400, 20)
    for i = 1, 3 do ps[i]:close() end
    assert(support.wait(prod, 10))
    assert.equals(1, log_lines(t, "exceeds the read buffer budget"))
  end)

  it("frees a finished 200 MiB frame's buffer while the connection lives", function()
    local t = target()
    local p = assert(dial(t))
    local rss0 = rss_kib(t.pid)
    -- an EVENT of 200 MiB on a channel nobody consumes here: read, dropped
    local size = 200 * 1024 * 1024
    local hdr = R.varint(0) .. R.varint(1) .. R.varint(1) .. R.varint(0)
    assert(p:send(R.bind(0, "junk") .. R.u32le(1 + #hdr + size) .. string.char(R.F.EVENT) .. hdr))
    local chunk = string.rep("x", 1024 * 1024)
    for _ = 1, 200 do assert(p:send(chunk)) end
    -- a PING behind it: its HEARTBEAT says the frame was handled
    assert(p:send(R.frame(R.F.PING, "")))
    assert(p:expect(R.F.HEARTBEAT, 30), "no HEARTBEAT after the large frame")
    local grew = (rss_kib(t.pid) - rss0) / 1024
    assert(grew < 64, ("the target still holds %.0f MiB after the frame"):format(grew))
    assert.is_false(p.closed)
    p:close()
  end)

  it("refuses a BIND index past max_peer_channels (2^24 cost 128 MiB)", function()
    local t = target()
    local prod = flow(t, 200)
    local rss0 = rss_kib(t.pid)
    local p = assert(dial(t))
    p:send(R.bind(2 ^ 24, "junk"))
    local d = p:drain(5)
    assert.matches("channel index out of range %(0 bound, limit 65536%)", tostring(d.error))
    local grew = (rss_kib(t.pid) - rss0) / 1024
    assert(grew < 16, ("the target grew by %.0f MiB"):format(grew))
    -- the highest index allowed works
    local q = assert(dial(t))
    q:send(R.bind(65535, "junk") .. R.frame(R.F.PING, ""))
    assert(q:expect(R.F.HEARTBEAT, 5))
    q:close()
    flow_done(t, 200, 20)
    assert(support.wait(prod, 10))
  end)

  it("closes idle sockets and slow headers after handshake_timeout, refuses past max_connections", function()
    local t = target{ handshake_timeout = 0.5, max_connections = 16 }
    local prod = flow(t, 600)     -- 2 connections: producer to name server and to consumer
    support.sleep(0.5)
    local idle, slow = {}, raw(t)
    for i = 1, 8 do idle[i] = raw(t) end
    -- one byte of a HELLO header every 0.2 s
    local t0 = socket.gettime()
    local closed_slow = false
    for i = 1, 10 do
      slow:settimeout(0.2)
      if not slow:send(string.char(i)) then closed_slow = true; break end
      local _, err = slow:receive(1)
      if err == "closed" then closed_slow = true; break end
    end
    local bytes, closed = recv_all(idle[1], 2)
    assert(closed, "an idle socket was not closed")
    assert.equals("handshake timeout (0.5 s)", error_text(bytes))
    assert(closed_slow or select(2, recv_all(slow, 1)), "a 1-byte-per-0.2 s header was not closed")
    assert(socket.gettime() - t0 < 3)
    for i = 2, 8 do assert(select(2, recv_all(idle[i], 1))) end
    -- 20 sockets at once: those past 16 connections are told and closed at once
    local many, refused = {}, 0
    for i = 1, 20 do many[i] = raw(t) end
    for i = 1, 20 do
      local b, c = recv_all(many[i], 0.3)
      if c and error_text(b) == "too many connections (limit 16)" then refused = refused + 1 end
    end
    assert(refused >= 4, "only " .. refused .. " sockets were refused past max_connections")
    for i = 1, 20 do many[i]:close() end
    flow_done(t, 600, 20)
    assert(support.wait(prod, 10))
    -- one log line per kind per 10 s
    assert(log_lines(t, "handshake timeout") <= 2, "handshake timeouts flooded the log")
    assert(log_lines(t, "too many connections") <= 2, "refusals flooded the log")
  end)

  it("backs off when out of file descriptors, refuses with a reason, logs once, recovers", function()
    local t = target({}, "ulimit -n 40")
    local socks, told = {}, 0
    for i = 1, 60 do socks[i] = raw(t) end
    support.sleep(1)
    for i = 1, 60 do
      local b = recv_all(socks[i], 0.02)
      if error_text(b) == "too many connections (out of file descriptors)" then told = told + 1 end
    end
    local c0 = cpu_s(t.pid)
    support.sleep(2)
    local cpu = cpu_s(t.pid) - c0
    assert(cpu < 0.5, ("the target used %.2f s of CPU in 2 s while out of descriptors"):format(cpu))
    assert(told >= 1, "no socket was told why it was refused")
    assert(log_lines(t, "accept") <= 2, "accept errors flooded the log: " .. log_lines(t, "accept"))
    for i = 1, 60 do socks[i]:close() end
    local prod = flow(t, 200)
    flow_done(t, 200, 20)
    assert(support.wait(prod, 10))
  end)

  it("refuses HELLO addresses it could not dial back, with the reason", function()
    local t = target()
    local cases = {
      { "127.0.0.1:9\0junk", "a NUL byte" },
      { "127.0.0.1:9\n", "a control character" },
      { "unix:/tmp/x\ny", "a control character" },
      { "unix:/tmp/%n%n", nil },  -- a path may hold '%': taken
      { "0.0.0.0:9", "a wildcard address cannot be dialled" },
      { "127.0.0.1:0", "not an address in canonical form" },
      { t.addr, "this context's own address" },
    }
    for _, c in ipairs(cases) do
      local p, err = dial(t, c[1])
      if c[2] then
        assert.is_nil(p, ("%q was taken"):format(c[1]))
        assert.equals("ERROR: bad address in handshake: " .. c[2], err)
      else
        assert(p, ("%q was refused: %s"):format(c[1], tostring(err)))
        p:close()
      end
    end
  end)
end)
