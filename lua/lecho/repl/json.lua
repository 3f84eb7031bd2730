-- lua/lecho/repl/json.lua: the REPL's JSON output mode (--json), for piping:
-- every output line is one JSON object ({ "values": [...] }, { "error": ... },
-- { "event": ..., "sub": ..., "channel": ..., "seq": ... }, { "text": ... },
-- { "log": ... }), written with lua-cjson.  Lua values that JSON cannot hold
-- become strings: functions and other objects "<function>", cycles "<cycle>",
-- NaN and infinities "nan", "inf", "-inf"; keys of a table that is not a
-- sequence become strings.
local cjson = require "cjson"

local M = {}

local MAX_DEPTH = 100

local function convert(v, path, depth)
  local t = type(v)
  if t == "nil" or v == cjson.null then return cjson.null end
  if t == "boolean" or t == "string" then return v end
  if t == "number" then
    if v ~= v then return "nan" end
    if v == math.huge then return "inf" elseif v == -math.huge then return "-inf" end
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
      local key = type(k) == "string" and k or tostring(convert(k, path, depth + 1))
      out[key] = convert(x, path, depth + 1)
    end
  end
  path[v] = nil
  return out
end

--- A copy of Lua value v that cjson can encode.
function M.value(v) return convert(v, {}, 0) end

--- Writes obj (whose values went through M.value, or are plain) as one line.
function M.emit(obj)
  local ok, s = pcall(cjson.encode, M.value(obj))
  if not ok then s = cjson.encode{ error = "cannot encode as JSON: " .. tostring(s) } end
  io.stdout:write(s, "\n")
  io.stdout:flush()
end

return M
