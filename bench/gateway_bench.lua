-- bench/gateway_bench.lua: the gateway row of bench/README.md (issue 28):
-- WebSocket fan-out of 1 KiB events to 100 clients, lecho-gateway beside
-- nats-server's WebSocket listener on the same workload, interleaved.
--
--   make bench-gateway [QUICK=1]
--
-- lecho: this process is the name server and the producer (submit of a
-- 1024-byte string on "bench.ws"); scripts/lecho-gateway consumes it and
-- fans each event out as one JSON text frame to every client.  NATS:
-- nats-server with a `websocket { no_tls: true }` block in a config file
-- written here; this process publishes over plain TCP (PUB bench.ws 1024).
-- Clients: bench/ws_fanout (C, epoll, one process, K connections).
-- Per run: deliveries/s (events received by all clients / time from the
-- first to the last), per-client events/s, and the server's CPU time
-- (utime + stime from /proc) per delivered event per client.
-- Bounded: N events per run, a time bound per run, 1 (QUICK) or 3 reps.

local dir = (arg and arg[0] or ""):match("^(.*)/[^/]*$") or "."
package.path = dir .. "/?.lua;" .. dir .. "/../?.lua;" .. package.path
local cjson = require "cjson"
local socket = require "socket"
local lecho = require "lecho"
local proc = require "spec.support.proc"

local QUICK = (os.getenv("QUICK") or "") ~= "" and os.getenv("QUICK") ~= "0"
local ROOT = os.getenv("LECHO_ROOT") or (dir .. "/..")
local LUAJIT = os.getenv("LUAJIT") or "luajit"
local K = tonumber(os.getenv("GW_CLIENTS") or "") or 100
local N = QUICK and 1000 or 10000
local REPS = tonumber(os.getenv("GW_REPS") or "") or (QUICK and 1 or 3)   -- make bench: 3 always
local BOUND = QUICK and 30 or 60
local RESULTS = os.getenv("BENCH_RESULTS") or (ROOT .. "/bench/results")

local tmp = proc.tmpdir("lecho-gwbench")
local group = proc.group(tmp)
local PAYLOAD = ("x"):rep(1024)

local function cpu(pid)
  local s = proc.read(("/proc/%d/stat"):format(pid))
  if not s then return nil end
  local rest = s:match("%) (.*)$")
  local f = {}
  for w in rest:gmatch("%S+") do f[#f + 1] = w end
  -- fields 14, 15 of stat (utime, stime) are 12, 13 after "pid (comm)"
  return (tonumber(f[12]) + tonumber(f[13])) / 100
end

local function free_port()
  local s = assert(socket.bind("127.0.0.1", 0))
  local _, port = s:getsockname()
  s:close()
  return tonumber(port)
end

local ctx = lecho.context{ quiet = true }   -- the name server and the producer
local prod = assert(ctx:channel("bench.ws"):producer())

local function serve(pred, bound)
  local deadline = socket.gettime() + bound
  while socket.gettime() < deadline do
    if pred() then return true end
    ctx:run_once(0.01)
  end
  return false
end

local function fanout(kind, port)
  local c = group:spawn(("%s/bench/ws_fanout %s %d %d %d %d"):format(ROOT, kind, port, K, N, BOUND), "fanout-" .. kind)
  assert(serve(function() return proc.output(c):find("ready") or proc.exit_code(c) end, 60),
    kind .. ": clients did not subscribe")
  assert(not proc.exit_code(c), kind .. " clients: " .. proc.errors(c))
  return c
end

local function result(c, server_pid, cpu0)
  assert(serve(function() return proc.exit_code(c) end, BOUND + 30), "clients did not finish")
  local used = cpu(server_pid) - cpu0
  local line = proc.output(c):match("(%b{})")
  assert(line, "clients: " .. proc.errors(c))
  local r = cjson.decode(line)
  r.cpu = used
  r.deliveries_per_s = r.events / r.seconds
  r.per_client_per_s = r.min / r.seconds
  r.cpu_us_per_delivery = used / r.events * 1e6
  return r
end

-- lecho: the gateway (on a port picked here), its clients, then N submits
local gw_port = free_port()
local gw = group:spawn(("%s %s/scripts/lecho-gateway --nameserver %s --http 127.0.0.1:%d --max-clients %d --max-queued %d --for 600")
  :format(LUAJIT, ROOT, ctx.addr, gw_port, K + 10, 64 * 1024 * 1024), "gateway")
assert(serve(function() return (proc.read(gw.err) or ""):find("lecho%-gateway: http") end, 20),
  "gateway did not start: " .. tostring(proc.read(gw.err)))

local function run_lecho()
  local c = fanout("gateway", gw_port)
  assert(serve(function() return #(prod.ch.dests or {}) > 0 end, 20), "the gateway's consumer did not join")
  local cpu0 = cpu(gw.pid)
  for _ = 1, N do
    local ok, e = prod:submit(PAYLOAD)
    assert(ok, e)
  end
  ctx:flush()
  return result(c, gw.pid, cpu0)
end

-- NATS
local nats_port, ws_port = free_port(), free_port()
local conf = tmp .. "/nats.conf"
proc.write(conf, ("listen: 127.0.0.1:%d\nmax_pending: 268435456\nwebsocket {\n  listen: \"127.0.0.1:%d\"\n  no_tls: true\n}\n")
  :format(nats_port, ws_port))
local nats = group:spawn("nats-server -c " .. conf, "nats")
assert(serve(function()
  local s = socket.tcp()
  s:settimeout(0.2)
  local ok = s:connect("127.0.0.1", ws_port)
  s:close()
  return ok
end, 20), "nats-server did not start: " .. tostring(proc.read(nats.err)))

local function run_nats()
  local c = fanout("nats", ws_port)
  local s = socket.tcp()
  s:settimeout(10)
  assert(s:connect("127.0.0.1", nats_port))
  s:receive("*l")   -- INFO
  s:send('CONNECT {"verbose":false,"pedantic":false}\r\n')
  local cpu0 = cpu(nats.pid)
  local msg = "PUB bench.ws 1024\r\n" .. PAYLOAD .. "\r\n"
  local chunk = msg:rep(64)
  for _ = 1, N / 64 do assert(s:send(chunk)) end
  for _ = 1, N % 64 do assert(s:send(msg)) end
  s:send("PING\r\n")
  local l
  repeat   -- (the server's own PINGs answered on the way)
    l = s:receive("*l")
    if l and l:find("^PING") then s:send("PONG\r\n") end
  until not l or l:find("^PONG") or l:find("^%-ERR")
  assert(l and l:find("PONG"), "nats: " .. tostring(l))
  local r = result(c, nats.pid, cpu0)
  s:close()
  return r
end

local runs = { lecho = {}, nats = {} }
for rep = 1, REPS do
  local order = rep % 2 == 1 and { "lecho", "nats" } or { "nats", "lecho" }
  for _, who in ipairs(order) do
    local r = (who == "lecho" and run_lecho or run_nats)()
    runs[who][#runs[who] + 1] = r
    io.stderr:write(("gateway bench: rep %d %s: %d clients, %d deliveries in %.2f s, %.0f/s, min %d per client, %d drops, %.2f us CPU per delivery\n")
      :format(rep, who, r.clients, r.events, r.seconds, r.deliveries_per_s, r.min, r.drops or 0, r.cpu_us_per_delivery))
  end
end

local function median(list, f)
  local xs = {}
  for i, r in ipairs(list) do xs[i] = f(r) end
  table.sort(xs)
  return xs[math.floor((#xs + 1) / 2)]
end
local out = { clients = K, events = N, reps = REPS, quick = QUICK, runs = runs }
local lines = { "| row | lecho-gateway | nats-server (WebSocket) | ratio |", "|---|---:|---:|---:|" }
local function row(name, f, fmt, lower)
  local a, b = median(runs.lecho, f), median(runs.nats, f)
  lines[#lines + 1] = ("| %s | " .. fmt .. " | " .. fmt .. " | %.2fx%s |"):format(name, a, b, a / b, lower and " (lower is better)" or "")
  out[name] = { lecho = a, nats = b }
end
row(("deliveries/s, %d clients, 1 KiB"):format(K), function(r) return r.deliveries_per_s end, "%.0f")
row("events/s per client", function(r) return r.per_client_per_s end, "%.0f")
row("server CPU per event per client (us)", function(r) return r.cpu_us_per_delivery end, "%.2f", true)
print(table.concat(lines, "\n"))
os.execute("mkdir -p " .. RESULTS)
proc.write(RESULTS .. "/gateway.json", cjson.encode(out) .. "\n")
group:kill_all("TERM")
ctx:close()
proc.remove(tmp)
