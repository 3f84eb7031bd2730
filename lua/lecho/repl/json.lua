-- lua/lecho/repl/json.lua: the REPL's JSON output mode (--json), for piping:
-- every output line is one JSON object ({ "values": [...] }, { "error": ... },
-- { "event": ..., "sub": ..., "channel": ..., "seq": ... }, { "text": ... },
-- { "log": ... }), written by lecho.jsonw (numbers exact).  Lua values that JSON cannot hold
-- become strings: functions and other objects "<function>", cycles "<cycle>",
-- NaN and infinities "nan", "inf", "-inf"; a lecho array {"dtype", "shape",
-- "data"} (its elements flat, row-major, as the gateway sends them); keys of a table that is not a
-- sequence become strings.  The output is always valid JSON (UTF-8): a
-- string (value or key) that is not valid UTF-8 keeps its valid sequences,
-- and each byte that is not part of one is written as the character with
-- that code (U+0080..U+00FF, as in Latin-1): "\255x" becomes "\u00ffx".
local cjson = require "cjson"
local array = require "lecho.array"
local jsonw = require "lecho.jsonw"
local byte, char, sub = string.byte, string.char, string.sub

local M = {}

-- The length of the valid UTF-8 sequence at s[i] (lead byte b >= 0x80), or nil.
local function seq_len(s, i, b)
  local n, lo, hi = 0, 0x80, 0xBF
  if b >= 0xC2 and b <= 0xDF then n = 1
  elseif b >= 0xE0 and b <= 0xEF then
    n = 2
    if b == 0xE0 then lo = 0xA0 elseif b == 0xED then hi = 0x9F end
  elseif b >= 0xF0 and b <= 0xF4 then
    n = 3
    if b == 0xF0 then lo = 0x90 elseif b == 0xF4 then hi = 0x8F end
  else return nil end
  for k = 1, n do
    local c = byte(s, i + k)
    if not c or c < lo or c > hi then return nil end
    lo, hi = 0x80, 0xBF
  end
  return n + 1
end

--- s with every byte outside a valid UTF-8 sequence replaced by the UTF-8
-- of U+00XX (XX the byte); s itself when it is valid UTF-8.
function M.utf8(s)
  if not s:find("[\128-\255]") then return s end
  local out, i, n, last = {}, 1, #s, 1
  while i <= n do
    local b = byte(s, i)
    if b < 0x80 then i = i + 1
    else
      local l = seq_len(s, i, b)
      if l then i = i + l
      else
        out[#out + 1] = sub(s, last, i - 1)
        out[#out + 1] = char(0xC0 + math.floor(b / 64), 0x80 + b % 64)
        i = i + 1
        last = i
      end
    end
  end
  if last == 1 then return s end
  out[#out + 1] = sub(s, last)
  return table.concat(out)
end

local MAX_DEPTH = 100

local function convert(v, path, depth)
  local t = type(v)
  if t == "nil" or v == cjson.null then return cjson.null end
  if t == "boolean" then return v end
  if t == "string" then return M.utf8(v) end
  if t == "number" then
    if v ~= v then return "nan" end
    if v == math.huge then return "inf" elseif v == -math.huge then return "-inf" end
    return v
  end
  if t == "userdata" and array.is(v) then
    -- kept: lecho.jsonw writes it as the gateway does to JSON clients
    -- (doc/gateway.md): {dtype, shape, data}, the elements flat,
    -- row-major, each exact (64-bit integers as their digits)
    return v
  end
  if t ~= "table" then return "<" .. t .. ">" end
  if path[v] then return "<cycle>" end
  if depth >= MAX_DEPTH then return "<too deep>" end
  path[v] = true
  local n, count = 0, 0
  while rawget(v, n + 1) ~= nil do n = n + 1 end
  for _ in next, v do count = count + 1 end
  local out
  if n > 0 and n == count then
    out = {}
    for i = 1, n do out[i] = convert(rawget(v, i), path, depth + 1) end
  else
    out = {}
    for k, x in next, v do
      local key = type(k) == "string" and M.utf8(k) or tostring(convert(k, path, depth + 1))
      out[key] = convert(x, path, depth + 1)
    end
  end
  path[v] = nil
  return out
end

--- A copy of Lua value v that cjson can encode.
function M.value(v) return convert(v, {}, 0) end

--- The JSON text of obj (through M.value), written by lecho.jsonw: every
-- number exact (issue 29 F2: cjson wrote 14 digits).  opts: lecho.jsonw's
-- (lists: the fields written [] when empty).
function M.encode(obj, opts)
  return jsonw.encode(M.value(obj), opts)
end

--- Writes obj (whose values went through M.value, or are plain) as one line.
function M.emit(obj, opts)
  local ok, s = pcall(M.encode, obj, opts)
  if not ok then s = cjson.encode{ error = M.utf8("cannot encode as JSON: " .. tostring(s)) } end
  io.stdout:write(s, "\n")
  io.stdout:flush()
end

return M
