-- lecho.fastenc: the value encoder of doc/wire-format.md written in Lua for
-- LuaJIT's compiler, used by submit for the common case.
--
--   local fastenc = require "lecho.fastenc"
--   local enc = fastenc.new{ max_depth = 100, max_string = 2^28, pin = 65536,
--                            max_value_bytes = 2^26 }
--   local s = enc(value)     -- the encoded bytes, or nil: use the C encoder
--   local ref = fastenc.new(opts, true)
--   local p, n = ref(value)   -- the same bytes in the encoder's buffer (a
--                             -- uint8_t * and a length, valid until its next
--                             -- call), or nil: no Lua string is made
--
-- The C encoder (core/base/codec_lua.c) goes through the Lua C API for every
-- element (~50 ns each); this one runs compiled (a few ns).  It produces the
-- same bytes (spec/fastenc_spec.lua checks that on random values) and
-- declines, returning nil, whatever is not the plain case: strings to pin
-- (>= pin bytes, sent without a copy by the C side) or over max_string,
-- nesting at max_depth (cycles end there too), a value past
-- max_value_bytes once decoded (as the reader charges), integers beyond 2^50, and
-- values that cannot be encoded.  The C encoder then does the work and
-- reports the exact error.

local ffi = require "ffi"
local ok_buf, buffer = pcall(require, "string.buffer")
local ok_core, core = pcall(require, "lecho.core")

local M = {}

-- Needs string.buffer (LuaJIT 2.1) and a little-endian host (doubles are
-- written in host order).
M.available = ok_buf and ffi.abi("le")

local floor, type, next, rawget = math.floor, type, next, rawget
local T_NIL, T_FALSE, T_TRUE, T_INT, T_DOUBLE, T_STRING, T_TABLE = 0, 1, 2, 3, 4, 5, 6
local INT_FAST = 2 ^ 50 -- zigzag of |x| below this is exact in a double

function M.new(opts, ref)
  if not M.available then return nil end
  local max_depth = math.min(opts.max_depth or 100, 1000) -- the C ceiling
  local max_string = opts.max_string or 256 * 1024 * 1024
  local pin = opts.pin or 64 * 1024
  -- what the receiver's reader charges (core/base/codec.h, LEI_DEC_*): past it, declined
  local max_value = opts.max_value_bytes or 64 * 1024 * 1024
  local size = 0
  if pin == 0 then pin = math.huge end
  local buf = buffer.new(256)
  local dptr = ffi.typeof("double *")

  -- Unsigned LEB128 of v (an exact non-negative integer below 2^53).
  local function varint(v)
    local p = buf:reserve(10)
    local n = 0
    while v >= 128 do
      p[n] = v % 128 + 128
      v = floor(v / 128)
      n = n + 1
    end
    p[n] = v
    buf:commit(n + 1)
  end

  local function byte(b)
    local p = buf:reserve(1)
    p[0] = b
    buf:commit(1)
  end

  -- Returns true, or false to decline.
  local enc

  local function number(x)
    if x == floor(x) and x > -INT_FAST and x < INT_FAST and not (x == 0 and 1 / x < 0) then
      local v = x >= 0 and 2 * x or -2 * x - 1   -- zigzag
      local p = buf:reserve(11)
      p[0] = T_INT
      -- one and two bytes without a loop (an inner loop here keeps the
      -- compiler from compiling the array loop around it)
      if v < 128 then
        p[1] = v
        buf:commit(2)
      elseif v < 16384 then
        p[1] = v % 128 + 128
        p[2] = floor(v / 128)
        buf:commit(3)
      else
        buf:commit(1)
        varint(v)
      end
    else
      -- NaN and +-inf land here too, as doubles (as the C encoder does)
      local p = buf:reserve(9)
      p[0] = T_DOUBLE
      ffi.cast(dptr, p + 1)[0] = x
      buf:commit(9)
    end
    return true
  end

  -- narr: t[1..narr] non-nil and (as in the C encoder) either every key
  -- 1..#t is present, or narr stops at the first nil below #t.
  local function is_arr_key(k, n)
    return type(k) == "number" and k >= 1 and k <= n and k == floor(k)
  end

  -- Entries of t, and how many are array keys 1..len.  Never compiled: the
  -- installed LuaJIT (2.1.0-beta3, Debian) sometimes runs a compiled
  -- `for k in next, t` over a non-empty table as if it were empty, and the
  -- encoder checks what it writes against this count.
  local function count_keys(t, len)
    local nkeys, nin = 0, 0
    for k in next, t do
      nkeys = nkeys + 1
      if is_arr_key(k, len) then nin = nin + 1 end
    end
    return nkeys, nin
  end
  if jit then jit.off(count_keys) end
  -- A trace that reaches a function the JIT is off for aborts, so every
  -- table made the whole encoder run interpreted (the composite record took
  -- longer than the C encoder); the same loop in C (lecho.core's
  -- count_keys) is a plain C call, which LuaJIT stitches around.
  if ok_core and type(core.count_keys) == "function" then count_keys = core.count_keys end

  local function tbl(t, depth)
    if depth >= max_depth then return false end
    local len = #t
    local nkeys, nin = count_keys(t, len)
    local narr = len
    if nin ~= len then
      narr = 0
      while narr < len and rawget(t, narr + 1) ~= nil do narr = narr + 1 end
    end
    if nkeys < narr or (nkeys == 0 and next(t) ~= nil) then return false end
    size = size + 64 + 16 * narr + 32 * (nkeys - narr)
    if size > max_value then return false end
    byte(T_TABLE)
    varint(narr)
    varint(nkeys - narr)
    for i = 1, narr do
      local x = rawget(t, i)
      -- numbers inline: arrays of them are the common bulk of a value
      if type(x) == "number" and x > -INT_FAST and x < INT_FAST then
        number(x)
      elseif not enc(x, depth + 1) then
        return false
      end
    end
    -- What was written must match the count: a value it does not is
    -- declined (the C encoder takes it), never sent with entries missing.
    if nkeys > narr then
      local written = 0
      for k, v in next, t do
        if not is_arr_key(k, narr) then
          written = written + 1
          if not enc(k, depth + 1) or not enc(v, depth + 1) then return false end
        end
      end
      if written ~= nkeys - narr then return false end
    end
    return true
  end

  enc = function(v, depth)
    local tv = type(v)
    if tv == "number" then
      if v >= INT_FAST or v <= -INT_FAST then
        if v == floor(v) and v >= -2 ^ 53 and v <= 2 ^ 53 then return false end
      end
      return number(v)
    elseif tv == "string" then
      local n = #v
      if n >= pin or n > max_string then return false end
      size = size + 24 + n
      if size > max_value then return false end
      byte(T_STRING)
      varint(n)
      buf:put(v)
      return true
    elseif tv == "table" then
      return tbl(v, depth)
    elseif tv == "boolean" then
      byte(v and T_TRUE or T_FALSE)
      return true
    elseif v == nil then
      byte(T_NIL)
      return true
    end
    return false
  end

  if ref then
    return function(v)
      buf:reset()
      size = 0
      if enc(v, 0) then return buf:ref() end
      return nil
    end
  end
  return function(v)
    buf:reset()
    size = 0
    if enc(v, 0) then return buf:tostring() end
    return nil
  end
end

return M
