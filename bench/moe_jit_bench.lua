-- bench/moe_jit_bench.lua: what a modulator's own code costs per call in the
-- MOE, in this process (issue 27 item 5: "measure first").  Three
-- modulators run as sandboxes (ctx:sandbox, core/moe/moe_svc.c: the same state,
-- sandbox environment, budget hook and CPU-time timer as a modulator), each
-- called with one event per call (encoded, decoded in the state, the call,
-- its result encoded and decoded back), beside the same two rounds of encode
-- and decode without the state (`codec_*`: lecho.encode, lecho.decode):
--   trivial  function(ev) return ev end, on a 5-key event
--   stats    min, max, mean, variance of a 1,000-number list (a Lua loop)
--   region   examples/atmosphere's region modulator on a 4x90x180 <f8 field
--            (its work is C: box views, one reduce)
-- us/call for each, REPS interleaved repetitions (bench/common.lua), and the
-- per-repetition ratios to the codec rounds (region: its input is 506 KiB, its
-- output 1/4 of it, so only its time).  The MOE runs its states with the JIT off
-- (core/moe/moe.c): run the same file against a build with the JIT on to see what
-- the compiler would give (the figures in the commit that added this file).
--
--   luajit bench/moe_jit_bench.lua [--quick] [--json FILE]

local dir = (arg and arg[0] or ""):match("^(.*)/[^/]*$") or "."
package.path = dir .. "/?.lua;" .. dir .. "/../?.lua;" .. package.path

local lecho = require "lecho"
local array = require "lecho.array"
local cjson = require "cjson"
local common = require "common"

local USAGE = [[
usage: luajit bench/moe_jit_bench.lua [--quick] [--json FILE]

Per-call cost of a trivial, a Lua-loop (stats) and a C-heavy (region)
modulator in the MOE, beside an encode/decode round with no modulator.
--quick (or QUICK=1): small counts; --json FILE: the results as JSON.
]]
local A = common.args(arg, USAGE)
local QUICK = A.quick
local N = QUICK and 2000 or 20000        -- calls per chunk (trivial, codec)
local N_HEAVY = QUICK and 200 or 2000    -- calls per chunk (stats, region)
local LIMIT = QUICK and 1 or 3           -- seconds per chunk at most
local REPS = QUICK and 3 or 5

local mods = dofile(dir .. "/../examples/atmosphere/modulators.lua")

-- no CPU share cap (the bench runs modulators back to back), a budget the
-- region call on a busy host stays under
local ctx = lecho.context{ quiet = true, modulators_cpu = 0, modulator_budget = 1 }

-- A sandbox's function: the modulator's enqueue, with params as an upvalue.
local function sandbox(src, params)
  local body = ("local params = %s\n%s\nreturn enqueue"):format(params, src)
  return assert(ctx:sandbox(body, "bench", { budget = 1 }))
end

local TRIVIAL = "function enqueue(ev) return ev end"
local STATS = [[
function enqueue(ev)
  local xs = ev.xs
  local n, lo, hi, s, s2 = #xs, math.huge, -math.huge, 0, 0
  for i = 1, n do
    local x = xs[i]
    if x < lo then lo = x end
    if x > hi then hi = x end
    s = s + x
    s2 = s2 + x * x
  end
  local mean = s / n
  return { step = ev.step, n = n, min = lo, max = hi, mean = mean, var = s2 / n - mean * mean }
end
]]
local REGION_PARAMS = "{ lat_min = 0, lat_max = 90, lon_min = 0, lon_max = 180, stride = 2 }"

local small = { step = 1, t = 0.5, name = "probe", ok = true, v = 42 }
local xs = {}
for i = 1, 1000 do xs[i] = math.sin(i) * 100 end
local numbers = { step = 1, xs = xs }
local rows = {}
for k = 1, 4 do
  rows[k] = {}
  for i = 1, 90 do
    local r = {}
    for j = 1, 180 do r[j] = ((k * 90 + i) * 180 + j) % 97 * 0.5 end
    rows[k][i] = r
  end
end
local field = array.from(rows, "<f8")
local region_ev = { step = 1, t = 0.5, nlev = 4, nlat = 90, nlon = 180,
                    lat0 = -89, dlat = 2, lon0 = 0, dlon = 2, field = field }

local sb = {
  trivial = sandbox(TRIVIAL, "nil"),
  stats = sandbox(STATS, "nil"),
  region = sandbox(mods.region, REGION_PARAMS),
}
-- what a call costs besides the state: its two encode/decode rounds (in, out)
local function codec_round(ev)
  local v = lecho.decode(assert(lecho.encode(ev)))
  return lecho.decode(assert(lecho.encode(v)))
end

local function chunk(s, ev, n)
  local call = s and function(e) return s:call(e) end or function(e) return codec_round(e) ~= nil end
  for _ = 1, 50 do assert(call(ev)) end   -- warm (and, with the JIT on, compiled)
  local t0, k = ctx:now(), 0
  while k < n and (k % 100 ~= 0 or ctx:now() - t0 < LIMIT) do
    local ok, err = call(ev)
    if not ok then error(err) end
    k = k + 1
  end
  return { us_per_op = (ctx:now() - t0) / k * 1e6, n = k }
end

local runs = {
  { "codec_small", function() return chunk(nil, small, N) end },
  { "trivial", function() return chunk(sb.trivial, small, N) end },
  { "codec_numbers", function() return chunk(nil, numbers, N_HEAVY) end },
  { "stats", function() return chunk(sb.stats, numbers, N_HEAVY) end },
  { "region", function() return chunk(sb.region, region_ev, N_HEAVY) end },
}
local iv = common.interleave{ reps = REPS, runs = runs }
local function us(r) return r.us_per_op end
local res = { quick = QUICK, reps = REPS, median = {}, ratio = {} }
for _, r in ipairs(runs) do res.median[r[1]] = common.median_of(iv, r[1], us) end
res.ratio.trivial = common.ratio(iv, "trivial", "codec_small", us)
res.ratio.stats = common.ratio(iv, "stats", "codec_numbers", us)
res.runs, res.order = iv.runs, iv.order
for _, r in ipairs(runs) do
  for _, x in ipairs(iv.runs[r[1]]) do
    if x.error then error(r[1] .. ": " .. x.error) end
  end
end
for _, k in ipairs{ "codec_small", "trivial", "codec_numbers", "stats", "region" } do
  io.stderr:write(("%-13s %9.2f us/call\n"):format(k, res.median[k]))
end
for _, k in ipairs{ "trivial", "stats" } do
  io.stderr:write(("%-13s %s x codec, %s\n"):format(k, ("%.2f"):format(res.ratio[k].median),
    common.spread_text(res.ratio[k], REPS)))
end
if A.json then
  local f = assert(io.open(A.json, "w"))
  f:write(cjson.encode(res))
  f:close()
end
ctx:close()
