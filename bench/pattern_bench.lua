-- bench/pattern_bench.lua: the modulators' pattern functions (core/moe/lpat.c,
-- core.lpat()) against LuaJIT's own on the same inputs: typical modulator
-- patterns on short fields and on 10 KB events.
--
--   luajit bench/pattern_bench.lua [--quick] [--json]
--
-- Each case is one loop of method calls (s:find(p), as modulator code
-- writes them), run with the string table's functions LuaJIT's, then ours
-- (swapped in, as in a modulator state), REPS times interleaved (LuaJIT
-- first in odd repetitions, ours first in even ones: bench/common.lua's
-- interleave).  Per case: the median
-- time per call of each, the ratio of the medians and the spread of the
-- per-repetition ratios.  Both must give the same results (checked first).
local core = require "lecho.core"
local dir = (arg and arg[0] or ""):match("^(.*)/[^/]*$") or "."
package.path = dir .. "/?.lua;" .. dir .. "/../?.lua;" .. package.path
local common = require "common"

local QUICK, JSON = false, false
for i = 1, #arg do
  if arg[i] == "--quick" then QUICK = true end
  if arg[i] == "--json" then JSON = true end
end
local REPS = QUICK and 3 or 7
local TARGET_S = QUICK and 0.02 or 0.08 -- seconds per timed loop, about

local function event(n)
  local words, out, i = { "alpha", "beta", "gamma", "delta", "temp=21.5", "id=42", "ok", "x,y,z" }, {}, 0
  local len = 0
  while len < n do
    i = i + 1
    local w = words[(i * 7) % #words + 1] .. ((i % 5 == 0) and "  \t" or " ")
    out[#out + 1], len = w, len + #w
  end
  return table.concat(out):sub(1, n)
end
local EV = event(10 * 1024)
local CSV = ("12.5,abc,77,,x y,"):rep(600):sub(1, 10 * 1024)

-- { name, code (s, p, r: inputs; i: the iteration), s, p, r }.  A plain
-- find's init varies with i: LuaJIT's compiler would hoist an invariant one
-- out of the loop (ours it cannot).
local CASES = {
  { "match ^(%w+)%.(%w+)$ on a channel name", "local a, b = s:match(p)", "sensors.temp", "^(%w+)%.(%w+)$" },
  { "match trim ^%s*(.-)%s*$ on 20 B", "local a = s:match(p)", "   some value  ", "^%s*(.-)%s*$" },
  { "find %d+ on 30 B", "local a, b = s:find(p)", "reading number 4711 ok", "%d+" },
  { "match (%w+)=(%w+) on 30 B", "local a, b = s:match(p)", "id=42;name=probe", "(%w+)=(%w+)" },
  { "find plain 'ERROR' in a 10 KB event", "local a, b = s:find(p, 1 + i % 3, true)", EV, "ERROR" },
  { "find %d+%.%d+ in a 10 KB event", "local a, b = s:find(p)", EV, "%d+%.%d+x" },
  { "gsub %s+ -> ' ' on a 10 KB event", "local a, k = s:gsub(p, r)", EV, "%s+", " " },
  { "gmatch [^,]+ over 10 KB of CSV", "for f in s:gmatch(p) do end", CSV, "[^,]+" },
  { "gmatch (%w+)=([%w.]+) over a 10 KB event", "for k, v in s:gmatch(p) do end", EV, "(%w+)=([%w.]+)" },
  { "gsub %a+ with a function on a 10 KB event", "local a, k = s:gsub(p, r)", EV, "%a+", function(w) return #w end },
  { "match %f[%w]gamma%f[%W] in a 10 KB event", "local a = s:match(p)", EV, "%f[%w]gamm%a%f[%W]" },
}

local function loop_of(code)
  -- the results are used: LuaJIT's compiler drops a pure call whose are not
  local use = code:match("^local a") and " if a then acc = acc + 1 end" or ""
  return assert(loadstring(("local s, p, r, n = ...\nlocal acc = 0\nfor i = 1, n do %s%s end\nreturn acc")
    :format(code, use)))
end

local OURS = core.lpat()
local LJ = {}
for k in pairs(OURS) do LJ[k] = string[k] end
local function use(t) for k, f in pairs(t) do string[k] = f end end

local function pack(...) return { n = select("#", ...), ... } end

-- The same outcome from both (first call only).
local function check(c)
  local code = c[2]:gsub("^local ([%w, ]+) = ", "return "):gsub("1 %+ i %% 3", "2")
  if code:match("^for") then code = "local t = {} " .. code:gsub("do end", "do t[#t + 1] = f or k end") .. " return #t, t[1], t[#t]" end
  local f = assert(loadstring("local s, p, r = ...\n" .. code))
  use(LJ)
  local a = pack(f(c[3], c[4], c[5]))
  use(OURS)
  local b = pack(f(c[3], c[4], c[5]))
  use(LJ)
  assert(a.n == b.n, c[1])
  for i = 1, a.n do assert(a[i] == b[i], ("%s: result %d: %s vs %s"):format(c[1], i, tostring(a[i]), tostring(b[i]))) end
end

local function time(t, c, n)
  local f = loop_of(c[2])
  use(t)
  f(c[3], c[4], c[5], math.max(1, math.floor(n / 20))) -- warm up (and let the JIT compile what it can)
  local t0 = os.clock()
  f(c[3], c[4], c[5], n)
  local dt = os.clock() - t0
  use(LJ)
  return dt / n
end

local results = {}
for _, c in ipairs(CASES) do
  check(c)
  -- calls per timed loop: about TARGET_S seconds of LuaJIT's
  local n = 16
  while n < 1e8 do
    local dt = time(LJ, c, n) * n
    if dt > TARGET_S / 4 then n = math.floor(n * TARGET_S / dt) + 1 break end
    n = n * 4
  end
  local iv = common.interleave{
    reps = REPS, value = function(r) return r.t end,
    runs = { { "luajit", function() return { t = time(LJ, c, n) } end },
             { "ours", function() return { t = time(OURS, c, n) } end } },
    ratios = { { "ours", "luajit" } } }
  local r = iv.ratios["ours/luajit"]
  if not (iv.median.luajit and iv.median.ours) then
    error(c[1] .. ": " .. tostring(iv.runs.luajit[1].error or iv.runs.ours[1].error))
  end
  results[#results + 1] = { name = c[1], calls = n, reps = REPS, luajit_us = iv.median.luajit * 1e6,
                            ours_us = iv.median.ours * 1e6, ratio = iv.median.ours / iv.median.luajit,
                            ratio_median = r.median, ratio_lo = r.lo, ratio_hi = r.hi }
end

if JSON then
  local cjson = require "cjson"
  io.write(cjson.encode({ reps = REPS, quick = QUICK, cases = results }), "\n")
else
  print(("%-48s %10s %10s %7s  %s"):format("case", "LuaJIT us", "ours us", "ratio", ("spread (%d reps)"):format(REPS)))
  for _, r in ipairs(results) do
    print(("%-48s %10.3f %10.3f %6.2fx  %.2f-%.2fx"):format(r.name, r.luajit_us, r.ours_us, r.ratio, r.ratio_lo, r.ratio_hi))
  end
end
