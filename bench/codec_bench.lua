-- codec_bench.lua: our value codec (lecho.codec) against LuaJIT's
-- string.buffer serializer on typical event payloads. Reports ns/op for
-- encode and decode and the encoded size of each. Each case takes ~0.3 s.
-- Run: cd /work/main && luajit bench/codec_bench.lua [--quick] [--json]
-- (needs lua/lecho/core.so; part of `make bench`, through bench/run.lua)
package.cpath = "lua/?.so;" .. package.cpath
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
-- --json: one more line, for bench/run.lua
if JSON then
  print(require("cjson").encode({ cases = results, table = table.concat(lines, "\n") }))
end
