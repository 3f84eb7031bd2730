-- codec_bench.lua: our value codec (lecho.codec) against LuaJIT's
-- string.buffer serializer on typical event payloads. Reports ns/op for
-- encode and decode and the encoded size of each. Each case takes ~0.3 s.
-- Run: cd /work/main && luajit bench/codec_bench.lua [--quick] [--json]
-- (needs lua/lecho/core.so; part of `make bench`, through bench/run.lua)
package.cpath = "lua/?.so;" .. package.cpath
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
local codec = require "lecho.core"
local sbuf = require "string.buffer"

local JSON, QUICK = false, false
for _, a in ipairs(arg or {}) do
  if a == "--json" then JSON = true elseif a == "--quick" then QUICK = true end
end
-- seconds per measurement; 4 measurements per case (--quick: a tenth)
local BUDGET = (QUICK and 0.03 or 0.3) / 4

-- ns per call of f(arg): calibrate on a short run, then time one run sized
-- to last about BUDGET seconds
local function measure(f, arg)
  local clock = os.clock
  local n, dt = 1, 0
  while true do
    local t0 = clock()
    for _ = 1, n do f(arg) end
    dt = clock() - t0
    if dt >= BUDGET / 8 then break end
    n = n * 4
  end
  n = math.max(1, math.floor(n * BUDGET / dt))
  local t0 = clock()
  for _ = 1, n do f(arg) end
  return (clock() - t0) / n * 1e9
end

local cases = {}
local function case(name, v) cases[#cases + 1] = { name = name, v = v } end

case("nil", nil)
do
  local t = {}
  for i = 1, 100 do t[i] = i * 7 - 300 end
  case("100 integers", t)
end
case("400-byte string", ("abcdefghij"):rep(40))
do
  local t = {}
  for i = 1, 100 do t[i] = i * 0.37 + 1e-3 end
  case("100 floats", t)
end
do
  local items = {}
  for i = 1, 50 do
    items[i] = { id = i, x = i * 1.25, y = -i, ok = i % 2 == 0, label = "item-" .. i }
  end
  case("composite record", {
    kind = "telemetry", source = "sim-42", unit = "K", seq = 123456,
    items = items,
  })
end
case("1 MiB string", ("0123456789abcdef"):rep(65536))

local function ours_enc(v) return codec.encode(v) end
local function ours_dec(s) return codec.decode(s) end
local function sb_enc(v) return sbuf.encode(v) end
local function sb_dec(s) return sbuf.decode(s) end

local lines, results = {}, {}
local function out(s) lines[#lines + 1] = s; print(s) end
out(string.format("%s, %s", jit.version, jit.status() and "JIT on" or "JIT off"))
out("| case | lecho enc ns | sbuf enc ns | lecho dec ns | sbuf dec ns | lecho bytes | sbuf bytes |")
out("|---|---:|---:|---:|---:|---:|---:|")
for _, c in ipairs(cases) do
  local s1 = assert(codec.encode(c.v))
  local s2 = sbuf.encode(c.v)
  -- sanity: both decode back to the same shape
  local ok, back = codec.decode(s1)
  assert(ok and type(back) == type(c.v))
  assert(type(sbuf.decode(s2)) == type(c.v))
  local e1 = measure(ours_enc, c.v)
  local e2 = measure(sb_enc, c.v)
  local d1 = measure(ours_dec, s1)
  local d2 = measure(sb_dec, s2)
  out(string.format("| %s | %.0f | %.0f | %.0f | %.0f | %d | %d |",
    c.name, e1, e2, d1, d2, #s1, #s2))
  results[#results + 1] = { case = c.name, lecho_enc_ns = e1, sbuf_enc_ns = e2,
                            lecho_dec_ns = d1, sbuf_dec_ns = d2, lecho_bytes = #s1, sbuf_bytes = #s2 }
end
-- Issue 24: 1,000,000 doubles as an array (lecho.array, tag 0x07) against
-- the same as a table, encode + decode, in the same run, interleaved
-- (ABAB...), medians with their spread.  The array row is what an event
-- does: encode into a message whose iovec points at the array
-- (count_only: no flat copy, pin 64 KiB as a context does), decode in
-- place (views).  The "copying" row is lecho.encode/decode, which make a
-- string and copy the elements out of it.  Target: <= 2 ms and >= 35x the
-- table.
local array = require "lecho.array"
local N = 1000000
local tbl = {}
for i = 1, N do tbl[i] = i * 0.37 + 1e-3 end
local arr = array.from(tbl, "<f8")
local tstr = assert(codec.encode(tbl))
local astr = assert(codec.encode(arr))
local PIN = { pin_threshold = 65536, count_only = true }
local VIEWS = { views = true }
local function tbl_rt() codec.decode(codec.encode(tbl)) end
local function arr_rt()
  codec.encode(arr, PIN)
  codec.decode(astr, VIEWS)
end
local function arr_copy_rt() codec.decode(codec.encode(arr)) end
do -- sanity: the bytes and the values
  local ok, back = codec.decode(astr, VIEWS)
  assert(ok and back:get(N - 1) == tbl[N] and #astr == 8 * N + 13)
  assert(codec.encode(arr, PIN) == #astr)
end
local function once(f, reps)
  local t0 = os.clock()
  for _ = 1, reps do f() end
  return (os.clock() - t0) / reps * 1e3
end
local REPS = QUICK and 3 or 9
local ta, tt, tc = {}, {}, {}
for r = 1, REPS do
  collectgarbage()
  tt[r] = once(tbl_rt, 1)
  ta[r] = once(arr_rt, QUICK and 20 or 100)
  tc[r] = once(arr_copy_rt, QUICK and 3 or 10)
end
local function med(t)
  local c = { unpack(t) }
  table.sort(c)
  return c[math.floor((#c + 1) / 2)], c[1], c[#c]
end
local am, alo, ahi = med(ta)
local tm, tlo, thi = med(tt)
local cm, clo, chi = med(tc)
out("")
out(("1,000,000 f64, encode + decode, medians of %d interleaved repetitions [min..max]:"):format(REPS))
out("| form | ms | spread ms | x the table | bytes | target |")
out("|---|---:|---:|---:|---:|---|")
out(("| array, event path (pinned, decoded in place) | %.3f | %.3f..%.3f | %.0fx | %d | <= 2 ms, >= 35x: %s |"):format(
  am, alo, ahi, tm / am, #astr, (am <= 2 and tm / am >= 35) and "met" or "MISSED"))
out(("| array, lecho.encode/decode (string, copies) | %.3f | %.3f..%.3f | %.0fx | %d | |"):format(
  cm, clo, chi, tm / cm, #astr))
out(("| table of numbers | %.1f | %.1f..%.1f | 1x | %d | |"):format(tm, tlo, thi, #tstr))
local arrays = { case = "1e6 f64 array vs table", array_ms = am, array_copy_ms = cm, table_ms = tm,
                 ratio = tm / am, array_bytes = #astr, table_bytes = #tstr }

-- --json: one more line, for bench/run.lua
if JSON then
  print(require("cjson").encode({ cases = results, arrays = arrays, table = table.concat(lines, "\n") }))
end
