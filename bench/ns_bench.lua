-- bench/ns_bench.lua: the name server's CPU per producer join, and its idle
-- CPU, as the number of channels it manages grows (issue 13).
--
--   luajit bench/ns_bench.lua [--reps N] [--points 2048,8192,32768] [--idle S]
--                             [--other ROOT]
--
-- Starts scripts/lecho-nameserver (--settle 0, a channel quota above the
-- last point) on 127.0.0.1, port chosen by the OS, and makes producers one
-- at a time, each on a channel of its own, from one context here.  At each
-- point P it times the name server's CPU (utime + stime from /proc) over the
-- next W = 2048 joins (CPU per join at P channels), then, at the last
-- point, over S seconds (default 3) of idling (CPU %).  --other ROOT: a
-- second tree (e.g. a build of main) whose name server runs interleaved
-- with this tree's (bench/common.lua `interleave`, rotated order; ratios
-- this / other).  NS_LUAJIT: the name servers' interpreter command (e.g.
-- "luajit -jp=Fl2,FILE" to profile them).  All its processes are killed at the end.
local dir = (arg and arg[0] or ""):match("^(.*)/[^/]*$") or "."
package.path = dir .. "/?.lua;" .. dir .. "/../lua/?.lua;" .. dir .. "/../lua/?/init.lua;" .. package.path
package.cpath = dir .. "/../lua/?.so;" .. package.cpath
local common = require "common"
local lecho = require "lecho"

local o = { reps = 5, points = "2048,8192,32768", idle = 3, W = 2048 }
local i = 1
while arg[i] do
  local k, v = arg[i]:match("^%-%-(%w+)$"), arg[i + 1]
  if not k or v == nil then io.stderr:write("usage: see the header of bench/ns_bench.lua\n") os.exit(2) end
  o[k] = tonumber(v) or v
  i = i + 2
end
local points = {}
for p in tostring(o.points):gmatch("%d+") do points[#points + 1] = tonumber(p) end
local ROOT = dir .. "/.."

local function sh(cmd)
  local f = io.popen(cmd)
  local s = f:read("*a")
  f:close()
  return s
end
local function cpu_of(pid)
  local f = io.open("/proc/" .. pid .. "/stat")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  local rest = s:match("%) (.*)$")
  local fields = {}
  for w in rest:gmatch("%S+") do fields[#fields + 1] = w end
  return (tonumber(fields[12]) + tonumber(fields[13])) / 100   -- utime, stime (fields 14, 15)
end
local function sleep(s) os.execute(("sleep %g"):format(s)) end

local function run(root, tag)
  local last = points[#points]
  local pf = os.tmpname()
  os.remove(pf)
  local pid = tonumber(sh(("%s %s/scripts/lecho-nameserver --listen 127.0.0.1:0 --port-file %s --settle 0 "
    .. "--quiet --for 900 --channel-quota %d >/dev/null 2>&1 & echo $!"):format(os.getenv("NS_LUAJIT") or "luajit", root, pf, last + o.W + 100)))
  local addr
  for _ = 1, 200 do
    local f = io.open(pf)
    if f then addr = f:read("*l") f:close() end
    if addr and addr ~= "" then break end
    sleep(0.05)
  end
  os.remove(pf)
  assert(addr, "name server did not start")
  local ctx = lecho.context{ nameserver = addr, quiet = true, timeout = 60 }
  local res, ps, n = { tag = tag }, {}, 0
  local ok, err = pcall(function()
    for _, p in ipairs(points) do
      while n < p do n = n + 1; ps[n] = assert(ctx:channel("c" .. n):producer()) end
      local c0, t0 = cpu_of(pid), common.clock()
      for _ = 1, o.W do n = n + 1; ps[n] = assert(ctx:channel("c" .. n):producer()) end
      res["ms_per_join_" .. p] = (cpu_of(pid) - c0) * 1000 / o.W
      res["wall_ms_per_join_" .. p] = (common.clock() - t0) * 1000 / o.W
    end
    local c0, t0 = cpu_of(pid), common.clock()
    local stop = t0 + o.idle
    while common.clock() < stop do ctx:run_once(0.05) end
    res.idle_pct = (cpu_of(pid) - c0) * 100 / (common.clock() - t0)
  end)
  pcall(ctx.close, ctx, { linger = 0 })
  os.execute("kill " .. pid .. " 2>/dev/null")
  if not ok then error(err) end
  return res
end

local runs = { { "this", function() return run(ROOT, "this") end } }
if o.other then runs[2] = { "other", function() return run(o.other, "other") end } end
local function load() return (sh("cat /proc/loadavg"):match("^(%S+)")) end
print(("load before %s"):format(load()))
local keys = {}
for _, p in ipairs(points) do keys[#keys + 1] = "ms_per_join_" .. p end
keys[#keys + 1] = "idle_pct"
local iv = {}
for _, k in ipairs(keys) do iv[k] = true end
local all = common.interleave{ reps = o.reps, runs = runs, value = function(r) return r end }
for _, name in ipairs{ "this", "other" } do
  for k, r in ipairs(all.runs[name] or {}) do
    local t = {}
    for _, key in ipairs(keys) do t[#t + 1] = ("%s=%s"):format(key, r[key] and ("%.3f"):format(r[key]) or "?") end
    print(("%s rep %d: %s%s"):format(name, k, table.concat(t, " "), r.error and (" ERROR " .. r.error) or ""))
  end
end
for _, key in ipairs(keys) do
  local line = {}
  for _, name in ipairs{ "this", "other" } do
    local vs = {}
    for _, r in ipairs(all.runs[name] or {}) do if r[key] then vs[#vs + 1] = r[key] end end
    if #vs > 0 then line[#line + 1] = ("%s median %.3f"):format(name, common.median(vs)) end
  end
  if o.other then
    local rs = {}
    for k, r in ipairs(all.runs.this) do
      local b = all.runs.other[k]
      if r[key] and b and b[key] and b[key] > 0 then rs[#rs + 1] = r[key] / b[key] end
    end
    if #rs > 0 then
      local lo, hi = common.spread(rs)
      line[#line + 1] = ("this/other %.3f (%.3f-%.3f, %d reps)"):format(common.median(rs), lo, hi, #rs)
    end
  end
  print(key .. ": " .. table.concat(line, "; "))
end
print(("load after %s"):format(load()))
