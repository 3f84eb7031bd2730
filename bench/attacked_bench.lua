-- bench/attacked_bench.lua: a legitimate flow's rate with and without an
-- attacker beside it (issue 11: "the legitimate flow unaffected").
--
--   luajit bench/attacked_bench.lua [--quick] [--json FILE]
--
-- Processes on 127.0.0.1: a name server (scripts/lecho-nameserver), a
-- consumer (a child), this process as the producer, and, for the attacked
-- runs, an attacker (a child speaking the wire through spec/support/rogue.lua)
-- that against the name server and the consumer keeps open idle sockets
-- (no handshake), sends partial HELLO headers a byte at a time, floods the
-- consumer with BINDs of channels it does not have (reconnecting when
-- closed for them) and the name server with lookups of made-up names.
-- A run: N async events of about 100 bytes, timed from the first submit
-- here to the last event at the consumer (the wall clock of this host).  Runs are interleaved (clean, attacked, attacked,
-- clean, ...: a drift of the machine's load hits both); figures: the median
-- rate of each, the ratio of the medians, the spread of per-pair ratios.
-- Every wait is bounded.

local dir = (arg and arg[0] or ""):match("^(.*)/[^/]*$") or "."
package.path = dir .. "/?.lua;" .. dir .. "/../?.lua;" .. package.path

local lecho = require "lecho"
local cjson = require "cjson"
local proc = require "spec.support.proc"

local USAGE = [[
usage: luajit bench/attacked_bench.lua [--quick] [--json FILE]

A legitimate flow's rate alone and beside an attacker, interleaved runs
(make bench runs it as the workload attacked).  --quick (or QUICK=1): fewer
events and runs; --json FILE: the results as JSON.
]]
local A = require("common").args(arg, USAGE)   -- bench/common.lua: --quick, --json FILE, --help
local QUICK, json_out = A.quick, A.json
local N = QUICK and 50000 or 300000
local REPS = QUICK and 3 or 5        -- pairs (clean + attacked)
local LIMIT = QUICK and 10 or 30     -- seconds per run at most
local ROOT = os.getenv("LECHO_ROOT") or (dir .. "/..")
local LUAJIT = os.getenv("LUAJIT") or "luajit"

-- The consumer: counts the events of channel "flow"; at each "end" prints
-- { count, t_last } (the wall clock at the last event of the run) and
-- starts over.
local CONSUMER = [[
local cjson = require "cjson"
local lecho = require "lecho"
local opts = cjson.decode(arg[1])
io.stdout:setvbuf("line")
local ctx = lecho.context{ nameserver = opts.ns, quiet = true }
local clock = require("socket").gettime
local n, t1 = 0, 0
assert(ctx:channel("flow"):consumer(function(ev)
  if ev == "end" then
    io.stdout:write(cjson.encode{ count = n, t_last = t1 }, "\n")
    n = 0
    return
  end
  t1 = clock()
  n = n + 1
end))
io.stdout:write("ready ", ctx.addr, "\n")
ctx:after(opts.bound, function() ctx:stop() end)
ctx:run()
ctx:close()
]]

-- The attacker, until killed (or opts.bound seconds).
local ATTACKER = [[
package.path = os.getenv("LECHO_ROOT") .. "/?.lua;" .. package.path
local cjson = require "cjson"
local socket = require "socket"
local R = require "spec.support.rogue"
local opts = cjson.decode(arg[1])
local port = 21000                    -- claimed addresses, below the ephemeral range
local function claim() port = port + 1; if port > 29000 then port = 21001 end; return "127.0.0.1:" .. port end
local function raw(target)
  local host, p = target:match("^(.+):(%d+)$")
  local s = socket.tcp()
  s:settimeout(1)
  if not s:connect(host, tonumber(p)) then s:close() return nil end
  s:settimeout(0)
  return s
end
local idle, partial = {}, {}
local binder, looker
local nb, nl = 0, 0
local t_end = socket.gettime() + opts.bound
local t_refresh = 0
while socket.gettime() < t_end do
  local now = socket.gettime()
  if now >= t_refresh then           -- idle sockets and partial headers, renewed every 2 s
    for _, s in ipairs(idle) do s:close() end
    for _, x in ipairs(partial) do x.s:close() end
    idle, partial = {}, {}
    for _, target in ipairs{ opts.ns, opts.consumer } do
      for _ = 1, opts.idle do idle[#idle + 1] = raw(target) end
      for _ = 1, opts.partial do
        local s = raw(target)
        if s then
          partial[#partial + 1] = { s = s, bytes = R.hello{ version = R.VERSION, incarnation = 1,
                                                           addr = claim(), mode = 0 }, pos = 1 }
        end
      end
    end
    t_refresh = now + 2
  end
  for _, x in ipairs(partial) do    -- one byte each, about once a second
    if x.pos < #x.bytes and math.random() < 0.05 then
      x.s:send(x.bytes, x.pos, x.pos)
      x.pos = x.pos + 1
    end
  end
  if not binder or binder.closed then
    if binder then binder:close() end
    binder = R.dial(opts.consumer, { addr = claim(), timeout = 2 })
    nb = 0
  end
  if binder then
    local out = {}
    for i = 1, 50 do out[i] = R.bind(nb + i - 1, ("junk/%d/%d"):format(port, nb + i)) end
    nb = nb + 50
    if not binder:send(table.concat(out)) then binder.closed = true end
    binder:drain(0)
  end
  if not looker or looker.closed then
    if looker then looker:close() end
    looker = R.dial(opts.ns, { addr = claim(), timeout = 2 })
  end
  if looker then
    local out = {}
    for i = 1, 50 do
      nl = nl + 1
      out[i] = R.ctrl{ op = "lookup", ch = ("junk%d"):format(nl), rid = nl }
    end
    if not looker:send(table.concat(out)) then looker.closed = true end
    looker:drain(0)
  end
  socket.sleep(0.02)
end
]]

local clock = require("socket").gettime
local tmpdir = proc.tmpdir("lecho-attacked")
local children = proc.group(tmpdir)

local function median(xs)
  local t = {}
  for i, x in ipairs(xs) do t[i] = x end
  table.sort(t)
  local n = #t
  return n % 2 == 1 and t[(n + 1) / 2] or (t[n / 2] + t[n / 2 + 1]) / 2
end

local function lua_child(src, opts, tag)
  local file = tmpdir .. "/" .. tag .. ".lua"
  local f = assert(io.open(file, "w"))
  f:write(src)
  f:close()
  return children:spawn(("LECHO_ROOT=%s %s %s %s"):format(proc.sh_quote(ROOT), LUAJIT, file,
                                                          proc.sh_quote(cjson.encode(opts))), tag)
end

local function main()
  local bound = LIMIT * REPS * 2 + 60
  local port_file = tmpdir .. "/ns-addr"
  children:spawn(("%s %s/scripts/lecho-nameserver --listen 127.0.0.1:0 --port-file %s --settle 0 --quiet --for %d")
                 :format(LUAJIT, ROOT, port_file, bound), "ns")
  local ns = proc.wait_file(port_file, "%S", 20)
  assert(ns, "the name server did not start")
  ns = ns:match("%S+")
  local ctx = lecho.context{ nameserver = ns, quiet = true }
  local con = lua_child(CONSUMER, { ns = ns, bound = bound }, "consumer")
  local function run_until(pred, secs)
    local deadline = clock() + secs
    while not pred() do
      if clock() > deadline then return false end
      ctx:run_once(0.02)
    end
    return true
  end
  local caddr
  assert(run_until(function()
    caddr = (proc.read(con.out) or ""):match("ready (%S+)")
    return caddr
  end, 20), "the consumer did not start: " .. proc.errors(con, 2000))
  local p = assert(ctx:channel("flow"):producer())
  assert(run_until(function() return ctx:channel("flow").dests[1] == caddr end, 20), "the consumer never joined")
  local v = { i = 0, pad = ("x"):rep(80) }
  local lines = 0
  local function run_once()
    local t0 = clock()
    for i = 1, N do
      v.i = i
      assert(p:submit(v))
    end
    assert(p:submit("end"))
    local res
    assert(run_until(function()
      local k = 0
      for line in (proc.read(con.out) or ""):gmatch("{[^\n]*}") do
        k = k + 1
        if k == lines + 1 then res = cjson.decode(line) end
      end
      return res ~= nil
    end, LIMIT + 20), "the consumer did not report: " .. proc.errors(con, 2000))
    lines = lines + 1
    return res.count / (res.t_last - t0), res.count
  end
  run_once()                          -- warm
  local rates = { clean = {}, attacked = {} }
  local ratios, lost = {}, 0
  for rep = 1, REPS do
    local order = rep % 2 == 1 and { "clean", "attacked" } or { "attacked", "clean" }
    local got = {}
    for _, mode in ipairs(order) do
      local atk
      if mode == "attacked" then
        atk = lua_child(ATTACKER, { ns = ns, consumer = caddr, bound = LIMIT + 30,
                                    idle = QUICK and 50 or 200, partial = QUICK and 10 or 50 }, "attacker" .. rep)
        run_until(function() return false end, 1.5)   -- the attack under way
      end
      local rate, count = run_once()
      if count < N then lost = lost + (N - count) end
      got[mode] = rate
      table.insert(rates[mode], rate)
      if atk then
        if proc.exit_code(atk) then error("the attacker stopped: " .. proc.errors(atk, 2000)) end
        proc.stop(atk)
      end
    end
    ratios[rep] = got.attacked / got.clean
  end
  local lo, hi = math.huge, -math.huge
  for _, x in ipairs(ratios) do lo, hi = math.min(lo, x), math.max(hi, x) end
  local out = {
    n = N, reps = REPS, clean = median(rates.clean), attacked = median(rates.attacked),
    clean_runs = rates.clean, attacked_runs = rates.attacked, ratios = ratios,
    ratio_lo = lo, ratio_hi = hi, lost = lost,
  }
  out.ratio = out.attacked / out.clean
  p:close()
  ctx:close()
  return out
end

local ok, res = xpcall(main, debug.traceback)
children:kill_all()
proc.remove(tmpdir)
if not ok then
  io.stderr:write("attacked_bench: ", tostring(res), "\n")
  os.exit(1)
end
local line = cjson.encode(res)
if json_out then
  local f = assert(io.open(json_out, "w"))
  f:write(line, "\n")
  f:close()
end
print(line)
print(("legitimate flow: %.0f ev/s clean, %.0f ev/s attacked (ratio %.2f, %d pairs %.2f-%.2f), %d lost")
      :format(res.clean, res.attacked, res.ratio, res.reps, res.ratio_lo, res.ratio_hi, res.lost))
