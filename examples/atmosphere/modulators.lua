-- examples/atmosphere/modulators.lua: the viewers' modulator/demodulator
-- pairs (see doc/modulators.md), pure Lua without I/O.
--
-- A modulator is Lua source that runs in the producing process (the
-- simulation), in lecho's sandbox: it sees `params`, `emit`, string, table,
-- math, bit and the basic functions, nothing else.  A demodulator is the
-- viewer's handler: it turns what the modulator sent back into a field.
--
--   local mods = dofile("examples/atmosphere/modulators.lua")
--   ch:consumer(mods.region_demodulator(), { modulator = mods.region, params = mods.region_params() })
--   ch:consumer(mods.diff_demodulator(),   { modulator = mods.diff,   params = mods.diff_params{ threshold = 0.5 } })
--
-- Both modulators pass anything that is not a field event (no `cells`
-- array) unchanged, and copy every other key of a field event (step, t, the
-- settings, final, ...) into what they send.

local M = {}

------------------------------------------------------------------------------
-- Region: keep a latitude/longitude box, down-sample it by block means.
--
-- params: lat_min, lat_max (degrees north), lon_min, lon_max (degrees east;
-- lon_min > lon_max crosses the 0 meridian), stride (cells per block side),
-- levels (list of level numbers, default all).
-- Sends: the header keys, region = { lat_min, lat_max, lon_min, lon_max,
-- stride }, nlev, nlat, nlon, lat0, dlat, lon0, dlon of the down-sampled
-- grid (a block's centre is the mean of its cells' centres), and cells:
-- each the mean of its block (a partial block at the box's edge averages
-- the cells it has).

M.region = [==[
local plan, plan_key     -- the blocks, worked out once per grid shape and params

local function in_lon(lon, a, b)
  local w = (b - a) % 360
  if w == 0 and b ~= a then w = 360 end
  return (lon - a) % 360 <= w
end

local function make_plan(ev)
  local p = params
  local s = p.stride or 1
  local rows, cols = {}, {}
  for i = 1, ev.nlat do
    local lat = ev.lat0 + (i - 1) * ev.dlat
    if lat >= p.lat_min and lat <= p.lat_max then rows[#rows + 1] = i end
  end
  for j = 1, ev.nlon do
    if in_lon(ev.lon0 + (j - 1) * ev.dlon, p.lon_min, p.lon_max) then cols[#cols + 1] = j end
  end
  -- columns in box order (west to east from lon_min, across 0 if needed)
  table.sort(cols, function(a, b)
    return (ev.lon0 + (a - 1) * ev.dlon - p.lon_min) % 360 < (ev.lon0 + (b - 1) * ev.dlon - p.lon_min) % 360
  end)
  local brow, bcol = {}, {}
  for r = 1, #rows, s do
    local b = {}
    for q = r, math.min(r + s - 1, #rows) do b[#b + 1] = rows[q] end
    brow[#brow + 1] = b
  end
  for c = 1, #cols, s do
    local b = {}
    for q = c, math.min(c + s - 1, #cols) do b[#b + 1] = cols[q] end
    bcol[#bcol + 1] = b
  end
  local levels = p.levels
  if not levels then
    levels = {}
    for k = 1, ev.nlev do levels[k] = k end
  end
  return { rows = brow, cols = bcol, levels = levels, s = s,
           first_lat = rows[1], first_col = cols[1] }
end

function enqueue(ev)
  if type(ev) ~= "table" or type(ev.cells) ~= "table" then return ev end
  local key = ev.nlev .. "x" .. ev.nlat .. "x" .. ev.nlon
  if plan_key ~= key then plan, plan_key = make_plan(ev), key end
  local out = {}
  for k, v in pairs(ev) do
    if k ~= "cells" then out[k] = v end
  end
  local cells, src = {}, ev.cells
  local nlat, nlon = ev.nlat, ev.nlon
  local n = 0
  for _, k in ipairs(plan.levels) do
    local off = (k - 1) * nlat * nlon
    for _, br in ipairs(plan.rows) do
      for _, bc in ipairs(plan.cols) do
        local sum, m = 0, 0
        for _, i in ipairs(br) do
          local row = off + (i - 1) * nlon
          for _, j in ipairs(bc) do
            sum = sum + src[row + j]
            m = m + 1
          end
        end
        n = n + 1
        cells[n] = sum / m
      end
    end
  end
  out.cells = cells
  out.nlev, out.nlat, out.nlon = #plan.levels, #plan.rows, #plan.cols
  out.levels = plan.levels
  out.region = { lat_min = params.lat_min, lat_max = params.lat_max,
                 lon_min = params.lon_min, lon_max = params.lon_max, stride = plan.s }
  if plan.first_lat then
    out.lat0 = ev.lat0 + (plan.first_lat - 1) * ev.dlat + (plan.s - 1) * ev.dlat / 2
    out.lon0 = (ev.lon0 + (plan.first_col - 1) * ev.dlon + (plan.s - 1) * ev.dlon / 2) % 360
  end
  out.dlat, out.dlon = ev.dlat * plan.s, ev.dlon * plan.s
  out.source_nlat, out.source_nlon = nlat, nlon
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

--- The region demodulator: keeps the last down-sampled field.  Returns the
-- handler and a state table { ev, meta, events }.
function M.region_demodulator(on_field)
  local state = { events = 0 }
  return function(ev, meta)
    state.events = state.events + 1
    if type(ev) == "table" and ev.cells then
      state.ev, state.meta = ev, meta
      if on_field then on_field(ev, meta, state) end
    end
  end, state
end

------------------------------------------------------------------------------
-- Differencing: send only the cells that moved by more than a threshold
-- since they were last sent.
--
-- params: threshold (> 0), quantum (optional, >= 0: values are sent as
-- integers k meaning k * quantum, rounded to nearest; 0 or absent: exact
-- doubles; must be <= 2 * threshold for the guarantee below).
-- Sends: the header keys plus, for the first event of a grid (a key frame),
-- key = every cell; afterwards gap (index differences: the first is the
-- index itself) and val (the values) of the cells that moved.  `q` is the
-- quantum in use (0: exact).
-- The modulator keeps `last`, the field as the demodulator has rebuilt it,
-- and sends a cell when |value - last| > threshold: so the rebuilt field is
-- within threshold of the source at every step, cell by cell.

M.diff = [==[
local last, last_key   -- the demodulator's picture of the field
local floor = math.floor

-- Another viewer joined this (shared) modulator: it has no picture yet, so
-- the next step goes out as a key frame, to every viewer.
function receivers(n)
  last_key = nil
end

function enqueue(ev)
  if type(ev) ~= "table" or type(ev.cells) ~= "table" then return ev end
  local th = params.threshold
  local q = params.quantum or 0
  local out = {}
  for k, v in pairs(ev) do
    if k ~= "cells" then out[k] = v end
  end
  out.q = q
  out.threshold = th
  local cells = ev.cells
  local n = #cells
  local key = tostring(ev.nlev) .. "x" .. tostring(ev.nlat) .. "x" .. tostring(ev.nlon) .. "/" .. n
  if last_key ~= key then
    -- key frame: everything
    last, last_key = {}, key
    local kf = {}
    for i = 1, n do
      local v = cells[i]
      if q > 0 then
        local k = floor(v / q + 0.5)
        kf[i] = k
        last[i] = k * q
      else
        kf[i] = v
        last[i] = v
      end
    end
    out.key = kf
    return out
  end
  local gap, val, m, prev = {}, {}, 0, 0
  for i = 1, n do
    local v = cells[i]
    local d = v - last[i]
    if d > th or d < -th then
      m = m + 1
      gap[m] = i - prev
      prev = i
      if q > 0 then
        local k = floor(v / q + 0.5)
        val[m] = k
        last[i] = k * q
      else
        val[m] = v
        last[i] = v
      end
    end
  end
  out.gap, out.val = gap, val
  return out
end
]==]

--- The differencing view's params.  A quarter of the threshold as quantum
-- keeps 7/8 of the threshold as headroom after each send.
function M.diff_params(o)
  o = o or {}
  local th = o.threshold or 0.5
  local q = o.quantum
  if q == nil then q = th / 4 end
  assert(type(th) == "number" and th > 0, "threshold must be a positive number")
  assert(type(q) == "number" and q >= 0 and q <= 2 * th, "quantum must be in [0, 2 * threshold]")
  return { threshold = th, quantum = q }
end

--- The diff demodulator: rebuilds the full field from key frames and
-- differences.  Returns the handler and its state { cells (the rebuilt
-- field), ev (the last event, header keys), meta, events, changed (cells in
-- the last event), key_frames, missing (events that came before any key
-- frame) }.  A new producer (meta.producer) must start with a key frame.
function M.diff_demodulator(on_field)
  local state = { events = 0, key_frames = 0, missing = 0, changed = 0 }
  return function(ev, meta)
    state.events = state.events + 1
    if type(ev) ~= "table" then return end
    local q = ev.q or 0
    if ev.key then
      local cells, key = {}, ev.key
      if q > 0 then
        for i = 1, #key do cells[i] = key[i] * q end
      else
        for i = 1, #key do cells[i] = key[i] end
      end
      state.cells, state.producer = cells, meta and meta.producer
      state.key_frames = state.key_frames + 1
      state.changed = #key
    elseif ev.gap then
      local cells = state.cells
      if not cells or (meta and state.producer ~= meta.producer) then
        state.missing = state.missing + 1
        return
      end
      local gap, val = ev.gap, ev.val
      local i = 0
      for m = 1, #gap do
        i = i + gap[m]
        cells[i] = q > 0 and val[m] * q or val[m]
      end
      state.changed = #gap
    else
      return
    end
    state.ev, state.meta = ev, meta
    if on_field then on_field(ev, meta, state) end
  end, state
end

------------------------------------------------------------------------------
-- Running a modulator outside lecho (the spec's unit tests, and a check
-- that the sources use nothing the sandbox lacks).

--- The globals doc/modulators.md promises a modulator, in a fresh table.
function M.sandbox(params, emit)
  local str = {}
  for k, v in pairs(string) do if k ~= "dump" then str[k] = v end end
  local env = {
    params = params, emit = emit or function() end,
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
