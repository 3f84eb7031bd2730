-- examples/atmosphere/modulators.lua: the viewers' modulator/demodulator
-- pairs (see doc/modulators.md), pure Lua without I/O.
--
-- A modulator is Lua source that runs in the producing process (the
-- simulation), in lecho's sandbox: it sees `params`, `emit`, `array` (the
-- array operations, in C), string, table, math, bit and the basic
-- functions, nothing else.  A demodulator is the viewer's handler: it turns
-- what the modulator sent back into a field.
--
-- The simulation publishes its field as ev.field, a "<f8" array of shape
-- { nlev, nlat, nlon } (doc/modulators.md "Arrays"); every view works on it
-- with the array operations, never element by element in Lua:
--   region  a lat/lon box (a box view), 2x2 block means (reduce)
--   diff    the cells that moved past a threshold (delta; patch back)
--   zfp     the field compressed by ZFP within an error bound (zfp; unzfp)
--   quant   the field as 16-bit integers (quantize; dequantize)
--
--   local mods = dofile("examples/atmosphere/modulators.lua")
--   ch:consumer(mods.region_demodulator(), { modulator = mods.region, params = mods.region_params() })
--   ch:consumer(mods.diff_demodulator(),   { modulator = mods.diff,   params = mods.diff_params{ threshold = 0.5 } })
--
-- Every modulator passes anything that is not a field event (no `field`
-- array) unchanged, and copies every other key of a field event (step, t,
-- the settings, final, ...) into what it sends.

local M = {}

-- The header keys of a field event, in a new table (a modulator's prelude).
local COPY = [==[
local function header(ev)
  local out = {}
  for k, v in pairs(ev) do
    if k ~= "field" then out[k] = v end
  end
  return out
end
local function is_field(ev) return type(ev) == "table" and type(ev.field) == "userdata" end
]==]

------------------------------------------------------------------------------
-- Region: keep a latitude/longitude box, down-sample it by block means.
--
-- params: lat_min, lat_max (degrees north), lon_min, lon_max (degrees east;
-- lon_min > lon_max crosses the 0 meridian), stride (cells per block side),
-- levels (list of level numbers, default all).
-- Sends: the header keys, region = { lat_min, lat_max, lon_min, lon_max,
-- stride }, nlev, nlat, nlon, lat0, dlat, lon0, dlon of the down-sampled
-- grid (a block's centre is the mean of its cells' centres), and field:
-- each cell the mean of its block (a partial block at the box's edge
-- averages the cells it has).  The box is one box view of the field (no
-- copy) or, across the 0 meridian or for levels that are not one run, the
-- views' concatenation (array.cat); the means one reduce, in C.

M.region = COPY .. [==[
local plan, plan_key, plan_params -- the box, worked out once per grid shape and params
                                  -- (params is a new table after each set_params)

local function in_lon(lon, a, b)
  local w = (b - a) % 360
  if w == 0 and b ~= a then w = 360 end
  return (lon - a) % 360 <= w
end

-- Runs of consecutive numbers of list (in its order): { {first, count}, ... }
local function runs(list)
  local r = {}
  for _, x in ipairs(list) do
    local last = r[#r]
    if last and x == last[1] + last[2] then last[2] = last[2] + 1 else r[#r + 1] = { x, 1 } end
  end
  return r
end

local function make_plan(ev)
  local p = params
  local s = p.stride or 1
  local rows, cols = {}, {}
  for i = 0, ev.nlat - 1 do
    local lat = ev.lat0 + i * ev.dlat
    if lat >= p.lat_min and lat <= p.lat_max then rows[#rows + 1] = i end
  end
  for j = 0, ev.nlon - 1 do
    if in_lon(ev.lon0 + j * ev.dlon, p.lon_min, p.lon_max) then cols[#cols + 1] = j end
  end
  -- columns in box order (west to east from lon_min, across 0 if needed)
  table.sort(cols, function(a, b)
    return (ev.lon0 + a * ev.dlon - p.lon_min) % 360 < (ev.lon0 + b * ev.dlon - p.lon_min) % 360
  end)
  local levels = p.levels
  if not levels then
    levels = {}
    for k = 1, ev.nlev do levels[k] = k end
  end
  local lv = {}
  for i, k in ipairs(levels) do lv[i] = k - 1 end
  return { row0 = rows[1] or 0, nrows = #rows, cols = runs(cols), ncols = #cols, levels = levels,
           lruns = runs(lv), s = s, first_lat = rows[1], first_col = cols[1],
           region = { lat_min = p.lat_min, lat_max = p.lat_max, lon_min = p.lon_min, lon_max = p.lon_max, stride = s } }
end

function enqueue(ev)
  if not is_field(ev) then return ev end
  local f = ev.field
  local key = ev.nlev .. "x" .. ev.nlat .. "x" .. ev.nlon
  if plan_key ~= key or plan_params ~= params then plan, plan_key, plan_params = make_plan(ev), key, params end
  local out = header(ev)
  local by_level = {}
  for _, lr in ipairs(plan.lruns) do
    local segs = {}
    for _, cr in ipairs(plan.cols) do
      segs[#segs + 1] = f:box({ lr[1], plan.row0, cr[1] }, { lr[2], plan.nrows, cr[2] })
    end
    if #segs == 0 then segs[1] = f:box({ lr[1], plan.row0, 0 }, { lr[2], plan.nrows, 0 }) end
    by_level[#by_level + 1] = #segs == 1 and segs[1] or array.cat(segs, 3)
  end
  local box = #by_level == 1 and by_level[1] or array.cat(by_level, 1)
  out.field = box:reduce({ 1, plan.s, plan.s }, "mean")
  local shape = out.field:shape()
  out.nlev, out.nlat, out.nlon = shape[1], shape[2], shape[3]
  out.levels = plan.levels
  out.region = plan.region   -- the box this field is (the params it was made with)
  if plan.first_lat then
    out.lat0 = ev.lat0 + plan.first_lat * ev.dlat + (plan.s - 1) * ev.dlat / 2
    out.lon0 = (ev.lon0 + plan.first_col * ev.dlon + (plan.s - 1) * ev.dlon / 2) % 360
  end
  out.dlat, out.dlon = ev.dlat * plan.s, ev.dlon * plan.s
  out.source_nlat, out.source_nlon = ev.nlat, ev.nlon
  return out
end
]==]

--- The region view's params: a box of the northern hemisphere's eastern
-- half, 2x2 blocks.
function M.region_params(o)
  o = o or {}
  return {
    lat_min = o.lat_min or 0, lat_max = o.lat_max or 90,
    lon_min = o.lon_min or 0, lon_max = o.lon_max or 180,
    stride = o.stride or 2, levels = o.levels,
  }
end

-- A demodulator that keeps ev[key] turned into a field by make (default:
-- a copy: a received array is a view that ends with the handler).
local function keeper(key, make, on_field)
  local state = { events = 0 }
  return function(ev, meta)
    state.events = state.events + 1
    if type(ev) == "table" and ev[key] ~= nil then
      state.field = make and make(ev) or ev[key]:copy()
      state.ev, state.meta = ev, meta
      if on_field then on_field(ev, meta, state) end
    end
  end, state
end

--- The region demodulator: keeps the last down-sampled field (state.field).
-- Returns the handler and a state table { field, ev, meta, events }.
function M.region_demodulator(on_field) return keeper("field", nil, on_field) end

------------------------------------------------------------------------------
-- Differencing: send only the cells that moved by more than a threshold
-- since they were last sent.
--
-- params: threshold (> 0).
-- Sends: the header keys plus, for the first event of a grid (a key frame),
-- key = the whole field; afterwards idx ("<u4" flat indices) and vals (the
-- "<f8" values) of the cells that moved (a:delta).  The modulator keeps ref,
-- the field as the demodulator has rebuilt it (delta updates it), and sends
-- a cell when |value - ref| > threshold: so the rebuilt field is within
-- threshold of the source at every step, cell by cell.

M.diff = COPY .. [==[
local ref, ref_key   -- the demodulator's picture of the field

-- Another viewer joined this (shared) modulator: it has no picture yet, so
-- the next step goes out as a key frame, to every viewer.
function receivers(n)
  ref_key = nil
end

function enqueue(ev)
  if not is_field(ev) then return ev end
  local out = header(ev)
  out.threshold = params.threshold
  local f = ev.field
  local key = table.concat(f:shape(), "x")
  if ref_key ~= key then
    ref, ref_key = f:copy(), key
    out.key = ref
    return out
  end
  out.idx, out.vals = f:delta(ref, params.threshold)
  return out
end
]==]

--- The differencing view's params.
function M.diff_params(o)
  o = o or {}
  local th = o.threshold or 0.5
  assert(type(th) == "number" and th > 0, "threshold must be a positive number")
  return { threshold = th }
end

--- The diff demodulator: rebuilds the full field from key frames and
-- differences (ref:patch).  Returns the handler and its state { field (the
-- rebuilt field), ev (the last event, header keys), meta, events, changed
-- (cells in the last event), key_frames, missing (events that came before
-- any key frame) }.  A new producer (meta.producer) must start with a key
-- frame.
function M.diff_demodulator(on_field)
  local state = { events = 0, key_frames = 0, missing = 0, changed = 0 }
  return function(ev, meta)
    state.events = state.events + 1
    if type(ev) ~= "table" then return end
    if ev.key then
      state.field, state.producer = ev.key:copy(), meta and meta.producer
      state.key_frames = state.key_frames + 1
      state.changed = #ev.key
    elseif ev.idx then
      if not state.field or (meta and state.producer ~= meta.producer) then
        state.missing = state.missing + 1
        return
      end
      state.field:patch(ev.idx, ev.vals)
      state.changed = #ev.idx
    else
      return
    end
    state.ev, state.meta = ev, meta
    if on_field then on_field(ev, meta, state) end
  end, state
end

------------------------------------------------------------------------------
-- ZFP: the whole field, compressed with every cell within params.tolerance.
-- Sends the header keys, tolerance and z (a "<u1" array: a:zfp's stream).

M.zfp = COPY .. [==[
function enqueue(ev)
  if not is_field(ev) then return ev end
  local out = header(ev)
  out.tolerance = params.tolerance
  out.z = ev.field:zfp(params.tolerance)
  return out
end
]==]

function M.zfp_params(o)
  o = o or {}
  local tol = o.tolerance or 0.01
  assert(type(tol) == "number" and tol > 0, "tolerance must be a positive number")
  return { tolerance = tol }
end

--- The ZFP demodulator: state.field = array.unzfp(ev.z).
function M.zfp_demodulator(on_field)
  local array = require "lecho.array"
  return keeper("z", function(ev) return array.unzfp(ev.z) end, on_field)
end

------------------------------------------------------------------------------
-- Quantized: the whole field as "<u2", k = round((x - offset) / scale);
-- each cell within scale / 2 while the values stay in [offset, offset +
-- 65535 * scale].  Sends the header keys, scale, offset and q.

M.quant = COPY .. [==[
function enqueue(ev)
  if not is_field(ev) then return ev end
  local out = header(ev)
  out.scale, out.offset = params.scale, params.offset
  out.q = ev.field:quantize("<u2", params.scale, params.offset)
  return out
end
]==]

function M.quant_params(o)
  o = o or {}
  local scale, offset = o.scale or 0.005, o.offset or 0
  assert(type(scale) == "number" and scale > 0, "scale must be a positive number")
  assert(type(offset) == "number", "offset must be a number")
  return { scale = scale, offset = offset }
end

--- The quantized demodulator: state.field = ev.q:dequantize(scale, offset).
function M.quant_demodulator(on_field)
  return keeper("q", function(ev) return ev.q:dequantize(ev.scale, ev.offset) end, on_field)
end

------------------------------------------------------------------------------
-- Running a modulator outside lecho (the spec's unit tests, and a check
-- that the sources use nothing the sandbox lacks).

--- The globals doc/modulators.md promises a modulator, in a fresh table.
function M.sandbox(params, emit)
  local str = {}
  for k, v in pairs(string) do if k ~= "dump" then str[k] = v end end
  local array = require "lecho.array"
  local env = {
    params = params, emit = emit or function() end,
    -- the MOE's `array`: the operations as functions (array.box(a, ...))
    array = setmetatable({}, { __index = function(_, k) return array[k] or array.methods[k] end }),
    string = str, table = table, math = math, bit = bit,
    assert = assert, error = error, ipairs = ipairs, next = next, pairs = pairs,
    pcall = pcall, select = select, rawequal = rawequal, rawget = rawget,
    rawlen = rawlen, rawset = rawset, setmetatable = setmetatable,
    getmetatable = getmetatable, tonumber = tonumber, tostring = tostring,
    type = type, unpack = unpack, xpcall = xpcall,
  }
  return env
end

--- Loads modulator source in a sandbox-like table; returns the env (with
-- env.enqueue etc. defined by the source).  An event passed through
-- M.roundtrip first, like lecho does, is a decoded copy.
function M.load(src, params, emit)
  local env = M.sandbox(params, emit)
  local chunk = assert(loadstring(src, "=modulator"))
  setfenv(chunk, env)
  chunk()
  return env
end

return M
