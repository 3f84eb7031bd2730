-- lecho.array: typed n-D numeric arrays, the array value of
-- doc/wire-format.md (tag 0x07).  An array is a userdata holding a header
-- (core/base/array.h, lei_array: data pointer, dtype, shape, strides in bytes)
-- read here through the FFI; its elements live after the header, in an
-- FFI cdata it wraps, or in a received payload (a view).  Indices start at
-- 0, as in C, NumPy and FFI arrays; shapes are row-major.
--
--   local array = require "lecho.array"   -- also lecho.array
--   local a = array.new("<f8", {256, 256}) -- zeroed
--   a:set(3, 4, 1.5); a:get(3, 4)        -- 1.5
--   local p = a:ptr()                    -- double *: p[i] at full speed
--   local w = array.wrap(ffi.new("double[?]", n), "<f8", {n}) -- no copy
--   local t = array.from({{1, 2}, {3, 4}}, "<i4"):totable()
--   local roi = a:box({10, 10}, {64, 64}, {2, 2}) -- a view, no copy
--
-- Submitted as (part of) an event value, an array's bytes are written
-- from its memory (64 KiB and more: no copy at all, the frame's iovec
-- points at them): do not change them until the event is written (a sync
-- submit has returned, or submit a:copy()).
local ffi = require "ffi"
local core = require "lecho.core"

ffi.cdef [[
typedef struct lei_array {
  uint8_t *data;
  int64_t shape[8];
  int64_t strides[8];
  int32_t dtype, ndim, flags, itemsize;
  int64_t count;
  int64_t reserved;
} lei_array;
]]

local M = {}

local hdr_t = ffi.typeof("lei_array *")
local u8p = ffi.typeof("uint8_t *")
local DTYPES = { "<u1", "<i1", "<u2", "<i2", "<u4", "<i4", "<u8", "<i8", "<f4", "<f8" }
local CTYPES = { "uint8_t", "int8_t", "uint16_t", "int16_t", "uint32_t", "int32_t",
                 "uint64_t", "int64_t", "float", "double" }
local PTR, CT, CODE = {}, {}, {}
for i, d in ipairs(DTYPES) do
  PTR[i - 1] = ffi.typeof(CTYPES[i] .. " *")
  CT[d] = ffi.typeof(CTYPES[i])
  CODE[d] = i - 1
end
CODE["|u1"], CODE["|i1"] = 0, 1
M.dtypes = DTYPES
local ENDED, READONLY = 2, 4
local bit = require "bit"
local mt = core.array_mt()

-- Every function that reads a header checks first that it was given an
-- array: a nil, a number or a cdata cast to a header pointer would read
-- whatever address it names (a segmentation fault: a handler doing
-- summary(ev.field) on an event without that field).
local function arg(a, level)
  if type(a) ~= "userdata" or getmetatable(a) ~= "lecho.array" then
    error(("lecho.array expected, got %s"):format(type(a) == "userdata" and "another userdata" or type(a)),
          level + 2)
  end
end

local function H(a) arg(a, 2) return ffi.cast(hdr_t, a) end

local GONE = "lecho.array: this array was a view into a received event whose handler has returned: "
  .. "its bytes are gone (call a:keep() or a:copy() inside the handler to hold it longer)"

-- The header of a, raising when a is an ended view: every method that
-- reads the layout or the elements goes through it, so a stored view
-- never reads freed memory nor passes for an empty array.
local function L(a, level)
  arg(a, (level or 1) + 1)
  local h = ffi.cast(hdr_t, a)
  if h.flags == ENDED then error(GONE, (level or 1) + 2) end
  return h
end

local function shape_of(shape)
  if type(shape) == "number" then return { shape } end
  if type(shape) ~= "table" then error("lecho.array: shape must be a number or a list of dims", 3) end
  return shape
end

local function check_dtype(d)
  if not CODE[d] then
    error(("lecho.array: unknown dtype %s (one of %s)"):format(tostring(d), table.concat(DTYPES, " ")), 3)
  end
  return d
end

--- A new array of dtype and shape, zeroed.
function M.new(dtype, shape)
  return core.array_new(check_dtype(dtype), shape_of(shape))
end

--- An array over an FFI cdata's memory, without copying: cdata is a
-- cdata array or pointer holding at least the shape's elements (checked
-- when its size is known); the array keeps it alive.  shape defaults to
-- the cdata's length (an array cdata).
function M.wrap(cdata, dtype, shape)
  check_dtype(dtype)
  if type(cdata) ~= "cdata" then error("lecho.array.wrap: cdata expected", 2) end
  local isz = ffi.sizeof(CT[dtype])
  local size = ffi.sizeof(cdata)
  if shape == nil then
    if not size then error("lecho.array.wrap: shape needed for a pointer", 2) end
    shape = { math.floor(size / isz) }
  end
  shape = shape_of(shape)
  local a = core.array_wrap(cdata, dtype, shape)
  local h = H(a)
  local need = tonumber(h.count) * isz
  -- a pointer's sizeof is the pointer's; an array's is its bytes
  local is_arr = tostring(ffi.typeof(cdata)):find("[", 1, true)
  if is_arr and size and size < need then
    error(("lecho.array.wrap: cdata holds %d bytes, the shape needs %d"):format(size, need), 2)
  end
  h.data = ffi.cast(u8p, cdata)
  return a
end

-- The shape of a nested table (regular: every row as long as the first).
local function table_shape(t, shape, d)
  shape[d] = #t
  if type(t[1]) == "table" then table_shape(t[1], shape, d + 1) end
  return shape
end

--- An array from a (nested) Lua table of numbers; dtype defaults to "<f8".
function M.from(t, dtype)
  dtype = check_dtype(dtype or "<f8")
  local shape = table_shape(t, {}, 1)
  local a = core.array_new(dtype, shape)
  local h = H(a)
  local p = ffi.cast(PTR[h.dtype], h.data)
  local nd, k = #shape, 0
  local function fill(row, d)
    if #row ~= shape[d] then error("lecho.array.from: rows of unequal length", 3) end
    if d == nd then
      for i = 1, shape[d] do
        local x = row[i]
        if type(x) ~= "number" then error("lecho.array.from: numbers expected", 3) end
        p[k] = x
        k = k + 1
      end
    else
      for i = 1, shape[d] do fill(row[i], d + 1) end
    end
  end
  if nd > 0 and shape[1] > 0 then fill(t, 1) end
  return a
end

--- Is v an array?
function M.is(v)
  return type(v) == "userdata" and getmetatable(v) == "lecho.array"
end

local methods = {}

local function offset(h, n, ...)
  if n ~= h.ndim then error(("lecho.array: %d indices for %d dimensions"):format(n, h.ndim), 3) end
  local off = 0
  for d = 0, n - 1 do
    local i = select(d + 1, ...)
    if type(i) ~= "number" or i < 0 or i >= h.shape[d] or i % 1 ~= 0 then
      error(("lecho.array: index %s out of range [0, %d) in dimension %d"):format(tostring(i), tonumber(h.shape[d]), d + 1), 3)
    end
    off = off + i * h.strides[d]
  end
  return off
end

--- Element at indices (one per dimension, from 0), as a number.
function methods.get(a, ...)
  local h = L(a)
  local off = offset(h, select("#", ...), ...)
  return tonumber(ffi.cast(PTR[h.dtype], h.data + off)[0])
end

--- Sets the element at indices (one per dimension) to the last argument.
function methods.set(a, ...)
  local h = L(a)
  if bit.band(h.flags, READONLY) ~= 0 then error("lecho.array: read-only (a view into a string): a:copy() first", 2) end
  local n = select("#", ...)
  local off = offset(h, n - 1, ...)
  ffi.cast(PTR[h.dtype], h.data + off)[0] = (select(n, ...))
end

--- The dtype ("<f8"), the shape (a new list), the number of dimensions,
-- elements, bytes per element.
function methods.dtype(a) return DTYPES[L(a).dtype + 1] end
function methods.shape(a)
  local h, s = L(a), {}
  for d = 0, h.ndim - 1 do s[d + 1] = tonumber(h.shape[d]) end
  return s
end
function methods.strides(a)
  local h, s = L(a), {}
  for d = 0, h.ndim - 1 do s[d + 1] = tonumber(h.strides[d]) end
  return s
end
function methods.ndim(a) return L(a).ndim end
function methods.count(a) return tonumber(L(a).count) end
function methods.itemsize(a) return L(a).itemsize end

--- The first element as a typed pointer (double * for "<f8"), or nil
-- (no elements; an ended view raises).  Row-major without gaps unless the
-- array is a box or stride view (see a:strides(), in bytes).
function methods.ptr(a)
  local h = L(a)
  if h.data == nil then return nil end
  return ffi.cast(PTR[h.dtype], h.data)
end

--- Row-major without gaps?
function methods.contiguous(a)
  local h = L(a)
  if h.count == 0 then return true end
  local want = h.itemsize
  for d = h.ndim - 1, 0, -1 do
    if h.shape[d] ~= 1 and h.strides[d] ~= want then return false end
    want = want * h.shape[d]
  end
  return true
end

--- A new array holding a copy of the elements (contiguous).
function methods.copy(a) L(a) return core.array_copy(a) end

--- A received view kept past its handler: its bytes copied once (no-op
-- for any other array).  Returns a.
function methods.keep(a)
  L(a)
  core.array_keep(a)
  return a
end

local OPS = core.array_ops

--- A view of a box, without copying: per dimension, count[d] elements
-- from start[d] (from 0), every step[d]-th (default 1; count defaults to
-- all that fit).  A number instead of a list stands for every dimension.
function methods.box(a, start, count, step) return OPS.box(a, start, count, step) end

--- A view taking every step-th element along each dimension (a number:
-- the same step for all, or a list).
function methods.stride(a, step) return OPS.box(a, nil, nil, step) end

--- min, max, sum, mean over the elements, as doubles (NaN skipped by min
-- and max; an empty array: inf, -inf, 0, 0).  One pass in C.
function methods.stats(a) return OPS.stats(a) end
function methods.min(a) return OPS.min(a) end
function methods.max(a) return OPS.max(a) end
function methods.sum(a) return OPS.sum(a) end
function methods.mean(a) return OPS.mean(a) end

--- A new "<f8" array: op ("mean", the default, "min", "max" or "sum")
-- over blocks of k elements per dimension (a number: every dimension; a
-- trailing partial block counts).  In C, one pass.
function methods.reduce(a, k, op) return OPS.reduce(a, k, op) end

--- Quantization (in C): q = round((x - offset) / scale) as dtype (an
-- integer dtype is clamped, NaN -> 0; a:quantize("<f4") is f64 -> f32),
-- and back: q:dequantize(scale, offset [, dtype "<f8"]) = q * scale + offset.
function methods.quantize(a, dtype, scale, offset) return OPS.quantize(a, dtype, scale, offset) end
function methods.dequantize(q, scale, offset, dtype) return OPS.dequantize(q, scale, offset, dtype) end

--- Delta (in C): idx, vals of the elements of a that moved by more than
-- threshold from ref, which takes them (ref then is what a receiver that
-- applied every delta has); ref:patch(idx, vals) is the inverse.
function methods.delta(a, ref, threshold) return OPS.delta(a, ref, threshold) end
function methods.patch(ref, idx, vals) return OPS.patch(ref, idx, vals) end

--- Compression (in C; doc/modulators.md "Compression"): a:zstd([level])
-- (lossless, level 1-9, default 3) and a:zfp(tolerance) (ZFP, "<f4"/"<f8",
-- every element within tolerance) return a "<u1" array holding a
-- self-describing stream (dtype, shape, codec); array.unzstd(z),
-- array.unzfp(z) or array.unzip(z) (either) give the array back.  z may
-- also be a Lua string.  Hostile input raises with the reason.
function methods.zstd(a, level) return OPS.zstd(a, level) end
function methods.zfp(a, tolerance) return OPS.zfp(a, tolerance) end
function methods.unzstd(z) return OPS.unzstd(z) end
function methods.unzfp(z) return OPS.unzfp(z) end
function methods.unzip(z) return OPS.unzip(z) end
M.unzstd, M.unzfp, M.unzip = OPS.unzstd, OPS.unzfp, OPS.unzip

--- A new array: the arrays of list (same dtype, ndim and dims but dim)
-- one after another along dimension dim (from 1, default 1), in C.
M.cat = OPS.cat

--- The elements as a nested Lua table (1-based, as Lua tables are).
function methods.totable(a)
  local h = L(a)
  local nd = h.ndim
  if nd == 0 then return methods.get(a) end
  local idx = {}
  local function build(d, off)
    local t, n = {}, tonumber(h.shape[d])
    for i = 0, n - 1 do
      local o = off + i * h.strides[d]
      if d == nd - 1 then
        t[i + 1] = tonumber(ffi.cast(PTR[h.dtype], h.data + o)[0])
      else
        t[i + 1] = build(d + 1, o)
      end
    end
    return t
  end
  local _ = idx
  if h.data == nil then
    local t = {}
    return t
  end
  return build(0, 0)
end

local function describe(a)
  local h = H(a)
  local s = {}
  for d = 0, h.ndim - 1 do s[#s + 1] = tostring(tonumber(h.shape[d])) end
  return ("lecho.array %s [%s]%s"):format(DTYPES[h.dtype + 1], table.concat(s, ","),
    h.flags == ENDED and " (ended view)" or "")
end

--- One line: dtype, shape, min/max/mean and the first values (at most n,
-- default 8), never a million numbers (the REPL's printer).
function M.summary(a, n)
  n = n or 8
  local h = H(a)
  if h.flags == ENDED then return describe(a) end
  local mn, mx, _, mean = methods.stats(a)
  local first = {}
  if h.data ~= nil and h.count > 0 then
    local flat = methods.contiguous(a) and a or methods.copy(a)
    local p = methods.ptr(flat)
    for i = 0, math.min(n, tonumber(h.count)) - 1 do first[#first + 1] = ("%.6g"):format(tonumber(p[i])) end
  end
  return ("%s min=%.6g max=%.6g mean=%.6g {%s%s}"):format(describe(a), mn, mx, mean,
    table.concat(first, ", "), h.count > n and ", ..." or "")
end

-- a.dtype etc. are methods; numbers index the flat row-major order of a
-- 1-D array (a[0], a[1] = x).
mt.__index = function(a, k)
  local m = methods[k]
  if m then return m end
  if type(k) == "number" then return methods.get(a, k) end
  return nil
end
mt.__newindex = function(a, k, v)
  if type(k) == "number" then return methods.set(a, k, v) end
  error("lecho.array: cannot set field " .. tostring(k), 2)
end
mt.__len = function(a) return tonumber(L(a).count) end
mt.__tostring = describe
mt.__metatable = "lecho.array"

M.methods = methods
return M
