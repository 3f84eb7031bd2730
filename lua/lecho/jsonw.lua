-- lecho.jsonw: the one writer of lecho values as JSON (issue 29 F2), used
-- by `lecho sub --json`, `lecho replay --json` and the other --json
-- outputs of the lecho tool, the REPL's --json mode (both through
-- lecho.repl.json) and the gateway's JSON-lines and WebSocket text
-- clients (lecho.gateway).  Every number is written so that it reads back
-- exactly:
--   * a double: an integral one below 1e21 as its integer digits (2^60 is
--     1152921504606846976), -0 as -0.0, any other as the shortest of
--     %.15g, %.16g, %.17g that reads back as the same double (1/3 is
--     0.3333333333333333, 0.1 + 0.2 is 0.30000000000000004);
--   * an array's elements (lecho.array, written {"dtype", "shape", "data"},
--     data flat and row-major, [] when empty): 64-bit integers as their
--     exact digits (9007199254740993, 18446744073709551615), "<f4" as the
--     shortest form that reads back as the same float (0.1, not
--     0.10000000149011612), other dtypes as doubles.
-- lua-cjson writes %.14g at most (Debian's 2.1: encode_number_precision
-- stops at 14), which changed 1/3 and every integer above 10^14.  A value
-- whose numbers cjson writes exactly (integers below 10^14, no -0, no
-- array) is still written by cjson (C, fast: the gateway's common case);
-- any other value by this module, in Lua.
--
-- encode(v, opts): v a Lua value of tables, strings, numbers, booleans,
-- lecho arrays and null (cjson.null, or opts.null); strings written as
-- they are (JSON-escaped: the caller makes them valid UTF-8).  A table is
-- a JSON array when its keys are 1..n (n > 0), else an object (keys that
-- are not strings written with tostring); opts.lists: field names whose
-- empty table is written [] (lua-cjson writes every empty table {});
-- a table marked by M.list(t) (metatable M.LIST) is a list: [] when empty.
-- opts.nonfinite: "null" (NaN and infinities as null) or, by default,
-- "string" ("nan", "inf", "-inf").  Errors (raises) on a value nested
-- deeper than 64, or a function, thread or other userdata.

local ffi = require "ffi"
local cjson = require "cjson"
local array = require "lecho.array"

local M = {}

-- The mark of a table that is a list, written [] when empty (review 5:
-- the gateway wrote an empty list result as {}).
M.LIST = {}
--- t (a new table when nil) marked as a list; returns it.
function M.list(t) return setmetatable(t or {}, M.LIST) end

local floor, huge, format, byte = math.floor, math.huge, string.format, string.byte
local concat = table.concat
local MAX_DEPTH = 64

local function nonfinite(v, opts)
  if opts and opts.nonfinite == "null" then return "null" end
  if v ~= v then return '"nan"' end
  return v > 0 and '"inf"' or '"-inf"'
end

--- The JSON text of number v (a double), exact.
local function number(v, opts)
  if v ~= v or v == huge or v == -huge then return nonfinite(v, opts) end
  if v == floor(v) and v < 1e21 and v > -1e21 then
    if v == 0 and 1 / v < 0 then return "-0.0" end
    return format("%.0f", v)
  end
  local s = format("%.15g", v)
  if tonumber(s) == v then return s end
  s = format("%.16g", v)
  if tonumber(s) == v then return s end
  return format("%.17g", v)
end
M.number = function(v, opts) return number(v, opts) end

local ESC = { ['"'] = '\\"', ["\\"] = "\\\\", ["\b"] = "\\b", ["\f"] = "\\f", ["\n"] = "\\n", ["\r"] = "\\r",
              ["\t"] = "\\t" }
local function str(s)
  return '"' .. s:gsub('[%c"\\]', function(c)
    return ESC[c] or format("\\u%04x", byte(c))
  end) .. '"'
end

ffi.cdef [[
int snprintf(char *s, size_t n, const char *fmt, ...);
double strtod(const char *s, char **end);
float strtof(const char *s, char **end);
]]
local C = ffi.C
local WIDTH = 32   -- bytes an element's text may take (%.17g: at most 24)
local FMT = { ["<i8"] = "%lld", ["<u8"] = "%llu" }
-- The text of a non-finite element, or -0.0, or nil for any other.
local function special(x, opts)
  if x ~= x or x == huge or x == -huge then return nonfinite(x, opts) end
  if x == 0 and 1 / x < 0 then return "-0.0" end
  return nil
end

-- The data of array a (its elements, flat, row-major), appended to buf:
-- written with snprintf into one C buffer (no Lua string per element),
-- each double the shortest of %.15g, %.16g, %.17g that strtod reads back
-- as it (a float: of %.6g to %.9g, by strtof), 64-bit integers by %lld
-- and %llu.  About 1 us an element for doubles (4x what cjson's 14 digits
-- took).
local function array_data(a, buf, opts)
  local c = a:contiguous() and a or a:copy()
  local p, n, dt = c:ptr(), #c, a:dtype()
  if n == 0 then buf[#buf + 1] = "[]" return end
  local out = ffi.new("char[?]", n * (WIDTH + 1) + 2)   -- (garbage collected)
  out[0] = 91   -- [
  local off = 1
  local fmt = FMT[dt]
  for i = 0, n - 1 do
    local q = out + off
    local k
    if fmt then
      k = C.snprintf(q, WIDTH, fmt, p[i])
    elseif dt == "<f8" or dt == "<f4" then
      local x = tonumber(p[i])
      local sp = special(x, opts)
      if sp then
        ffi.copy(q, sp, #sp)
        k = #sp
      elseif dt == "<f8" then
        k = C.snprintf(q, WIDTH, "%.15g", x)
        if C.strtod(q, nil) ~= x then
          k = C.snprintf(q, WIDTH, "%.16g", x)
          if C.strtod(q, nil) ~= x then k = C.snprintf(q, WIDTH, "%.17g", x) end
        end
      else
        for d = 6, 9 do
          k = C.snprintf(q, WIDTH, "%.*g", ffi.cast("int", d), x)
          if C.strtof(q, nil) == x then break end
        end
      end
    else   -- integers of 32 bits or fewer
      k = C.snprintf(q, WIDTH, "%d", ffi.cast("int", p[i]))
    end
    off = off + k
    out[off] = 44   -- ,
    off = off + 1
  end
  out[off - 1] = 93   -- ]
  buf[#buf + 1] = ffi.string(out, off)
end

local write
local function write_table(v, buf, opts, depth, key)
  local n, count = 0, 0
  while rawget(v, n + 1) ~= nil do n = n + 1 end
  for _ in next, v do count = count + 1 end
  if count == 0 then
    buf[#buf + 1] = (getmetatable(v) == M.LIST or (key and opts and opts.lists and opts.lists[key])) and "[]" or "{}"
    return
  end
  if n == count then
    buf[#buf + 1] = "["
    for i = 1, n do
      if i > 1 then buf[#buf + 1] = "," end
      write(rawget(v, i), buf, opts, depth + 1)
    end
    buf[#buf + 1] = "]"
    return
  end
  buf[#buf + 1] = "{"
  local first = true
  for k, x in next, v do
    if not first then buf[#buf + 1] = "," end
    first = false
    local ks = type(k) == "string" and k or (type(k) == "number" and number(k) or tostring(k))
    buf[#buf + 1] = str(ks)
    buf[#buf + 1] = ":"
    write(x, buf, opts, depth + 1, ks)
  end
  buf[#buf + 1] = "}"
end

write = function(v, buf, opts, depth, key)
  if depth > MAX_DEPTH then error("lecho.jsonw: nested deeper than " .. MAX_DEPTH, 0) end
  local t = type(v)
  if v == nil or v == cjson.null or (opts and opts.null ~= nil and v == opts.null) then
    buf[#buf + 1] = "null"
  elseif t == "boolean" then buf[#buf + 1] = v and "true" or "false"
  elseif t == "number" then buf[#buf + 1] = number(v, opts)
  elseif t == "string" then buf[#buf + 1] = str(v)
  elseif t == "table" then write_table(v, buf, opts, depth, key)
  elseif array.is(v) then
    buf[#buf + 1] = '{"dtype":' .. str(v:dtype()) .. ',"shape":'
    local shape = v:shape()
    buf[#buf + 1] = "[" .. concat(shape, ",") .. "]"
    buf[#buf + 1] = ',"data":'
    array_data(v, buf, opts)
    buf[#buf + 1] = "}"
  else
    error("lecho.jsonw: cannot write a " .. t .. " as JSON", 0)
  end
end

-- Whether cjson writes v exactly: no array, every number an integer below
-- 10^14 (and not -0), every table a list or an object of string keys,
-- no empty table where opts.lists or M.list wants [] (then it is ours).
local LIMIT = 1e14
local function plain(v, depth, opts, key)
  local t = type(v)
  if t == "number" then
    return v == floor(v) and v < LIMIT and v > -LIMIT and not (v == 0 and 1 / v < 0)
  end
  if t ~= "table" then return t ~= "userdata" or v == cjson.null end
  if depth > MAX_DEPTH then return false end
  local n, count = 0, 0
  while rawget(v, n + 1) ~= nil do n = n + 1 end
  for k, x in next, v do
    count = count + 1
    if not plain(x, depth + 1, opts, k) then return false end
  end
  if count == 0 then return not (getmetatable(v) == M.LIST or (key and opts and opts.lists and opts.lists[key])) end
  if n == count then return true end
  for k in next, v do if type(k) ~= "string" then return false end end
  return true
end
-- (Debian's LuaJIT bug #829: these walk every value with next)
jit.off(plain)
jit.off(write_table)

--- The JSON text of v (see the top of this file).
function M.encode(v, opts)
  if plain(v, 0, opts) then
    local ok, s = pcall(cjson.encode, v)
    if ok then return s end
  end
  local buf = {}
  write(v, buf, opts, 0)
  return concat(buf)
end

return M
