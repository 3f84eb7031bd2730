-- lua/lecho/repl/pretty.lua: the REPL's pretty printer, bounded in depth,
-- items, string length and lines, for results (pretty) and for one-line
-- event fields (short).  Pure Lua, no I/O.

local M = {}

local pp_defaults = { depth = 4, items = 40, strlen = 200, width = 100, lines = 200 }

local keywords = {}
for w in ([[and break do else elseif end false for function goto if in local nil not
            or repeat return then true until while]]):gmatch("%a+") do keywords[w] = true end

local function valid_utf8(s)
  local i, n = 1, #s
  while i <= n do
    local c = s:byte(i)
    local len = c < 0x80 and 1 or (c >= 0xC2 and c < 0xE0) and 2
                or (c >= 0xE0 and c < 0xF0) and 3 or (c >= 0xF0 and c < 0xF5) and 4 or nil
    if not len then return false end
    for j = i + 1, i + len - 1 do
      local d = s:byte(j)
      if not d or d < 0x80 or d > 0xBF then return false end
    end
    i = i + len
  end
  return true
end

local esc = { ["\\"] = "\\\\", ['"'] = '\\"', ["\n"] = "\\n", ["\t"] = "\\t", ["\r"] = "\\r" }
local function quote(s, maxlen)
  local n = #s
  local t = n > maxlen and s:sub(1, maxlen) or s
  local utf = valid_utf8(t) or (n > maxlen and valid_utf8(t:sub(1, -4)))
  t = t:gsub('[%c"\\\128-\255]', function(ch)
    if esc[ch] then return esc[ch] end
    local b = ch:byte()
    if b >= 128 and utf then return ch end
    return ("\\%03d"):format(b)
  end)
  if n > maxlen then return ('"%s"... (%d bytes)'):format(t, n) end
  return '"' .. t .. '"'
end

local function safe_tostring(v)
  local ok, s = pcall(tostring, v)
  if ok and type(s) == "string" then return s end
  return ("<%s>"):format(type(v))
end

local function has_tostring(v)
  local mt = getmetatable(v)
  return type(mt) == "table" and rawget(mt, "__tostring") ~= nil
end

local function scalar(v, o)
  local t = type(v)
  if t == "string" then return quote(v, o.strlen) end
  if t == "number" then
    if v ~= v then return "nan" end
    if v == math.huge then return "inf" elseif v == -math.huge then return "-inf" end
    if v == math.floor(v) and math.abs(v) < 2^53 then return ("%d"):format(v) end
    return ((o.digits and ("%." .. o.digits .. "g") or "%.14g"):format(v))
  end
  if t == "function" then
    local info = debug.getinfo(v, "S")
    if info and info.what ~= "C" then
      return ("<function %s:%d>"):format(info.short_src, info.linedefined)
    end
    return "<function builtin>"
  end
  if t == "table" or t == "nil" or t == "boolean" then return tostring(v) end
  -- an array: dtype, shape, min/max/mean and the first values, never all
  if t == "userdata" and getmetatable(v) == "lecho.array" then
    return "<" .. require("lecho.array").summary(v) .. ">"
  end
  return "<" .. safe_tostring(v) .. ">"
end

-- The entries of table t in display order, at most o.items of them:
-- returns list of { k, v } (k nil for the array part), total count.
local function entries(t, o)
  local list, total = {}, 0
  local n = 0
  while rawget(t, n + 1) ~= nil do
    n = n + 1
    if n <= o.items then list[#list + 1] = { nil, rawget(t, n) } end
    if n > 1e7 then break end
  end
  total = n
  local others, cap = {}, 2000
  local k = next(t)
  while k ~= nil do
    if not (type(k) == "number" and k >= 1 and k <= n and k == math.floor(k)) then
      total = total + 1
      if #others < cap then others[#others + 1] = k end
    end
    k = next(t, k)
  end
  local rank = { number = 1, string = 2, boolean = 3 }
  table.sort(others, function(a, b)
    local ta, tb = type(a), type(b)
    if ta ~= tb then return (rank[ta] or 9) < (rank[tb] or 9) end
    if ta == "number" or ta == "string" then return a < b end
    return safe_tostring(a) < safe_tostring(b)
  end)
  for _, key in ipairs(others) do
    if #list >= o.items then break end
    list[#list + 1] = { key, rawget(t, key) }
  end
  return list, total
end

local function keystr(k, o)
  if type(k) == "string" and k:match("^[%a_][%w_]*$") and not keywords[k] then return k end
  return "[" .. scalar(k, o) .. "]"
end

-- Renders v on one line; nil when it would exceed `budget` characters.
local function inline(v, o, depth, path, budget)
  if type(v) ~= "table" then
    local s = scalar(v, o)
    return #s <= budget and s or nil
  end
  if has_tostring(v) then
    local ok, s = pcall(tostring, v)
    if ok and type(s) == "string" then return #s <= budget and s or nil end
  end
  if path[v] then return "<cycle>" end
  local list, total = entries(v, o)
  if total == 0 then return "{}" end
  if depth >= o.depth then
    local s = ("{ ... %d %s }"):format(total, total == 1 and "entry" or "entries")
    return #s <= budget and s or nil
  end
  path[v] = true
  local parts, len = {}, 4
  for _, e in ipairs(list) do
    local prefix = e[1] ~= nil and (keystr(e[1], o) .. " = ") or ""
    local s = inline(e[2], o, depth + 1, path, budget - len - #prefix)
    if not s then path[v] = nil return nil end
    parts[#parts + 1] = prefix .. s
    len = len + #prefix + #s + 2
    if len > budget then path[v] = nil return nil end
  end
  path[v] = nil
  if total > #list then parts[#parts + 1] = ("... (%d more)"):format(total - #list) end
  local s = "{ " .. table.concat(parts, ", ") .. " }"
  return #s <= budget and s or nil
end

-- Renders v over several lines into `out` (a list of lines).
local function block(v, o, depth, path, indent, prefix, suffix, out)
  if #out >= o.lines then return end
  local room = math.max(o.width - #indent - #prefix - #suffix, 20)
  local s = inline(v, o, depth, path, room)
  if s then out[#out + 1] = indent .. prefix .. s .. suffix return end
  if type(v) ~= "table" or path[v] then
    out[#out + 1] = indent .. prefix .. scalar(v, o) .. suffix
    return
  end
  local list, total = entries(v, o)
  path[v] = true
  out[#out + 1] = indent .. prefix .. "{"
  -- Short array items share lines; anything else gets its own.
  local inner, line = indent .. "  ", nil
  local function flush()
    if line then out[#out + 1] = line line = nil end
  end
  for _, e in ipairs(list) do
    if #out >= o.lines then break end
    local s = e[1] == nil and inline(e[2], o, depth + 1, path, 30)
    if s then
      if line and #line + #s + 2 <= o.width then
        line = line .. " " .. s .. ","
      else
        flush()
        line = inner .. s .. ","
      end
    else
      flush()
      local p = e[1] ~= nil and (keystr(e[1], o) .. " = ") or ""
      block(e[2], o, depth + 1, path, inner, p, ",", out)
    end
  end
  flush()
  if total > #list and #out < o.lines then
    out[#out + 1] = indent .. ("  ... (%d more)"):format(total - #list)
  end
  out[#out + 1] = indent .. "}" .. suffix
  path[v] = nil
end

local function pretty(v, o)
  local oo = {}
  for k, d in pairs(pp_defaults) do oo[k] = (o and o[k]) or d end
  local out = {}
  block(v, oo, 0, {}, "", "", "", out)
  if #out >= oo.lines then out[#out + 1] = ("... (output cut at %d lines)"):format(oo.lines) end
  return table.concat(out, "\n")
end

-- One short line (for events and fields).
local function short(v, width)
  local o = {}
  for k, d in pairs(pp_defaults) do o[k] = d end
  o.items, o.strlen, o.depth, o.digits = 12, 60, 3, 6
  local s = inline(v, o, 0, {}, width or 160)
  if s then return s end
  o.items, o.depth = 4, 1
  s = inline(v, o, 0, {}, 100000) or scalar(v, o)
  if #s > (width or 160) then s = s:sub(1, (width or 160) - 3) .. "..." end
  return s
end

M.pretty, M.short, M.scalar, M.quote = pretty, short, scalar, quote
M.safe_tostring, M.has_tostring, M.inline, M.defaults = safe_tostring, has_tostring, inline, pp_defaults

return M
