-- examples/atmosphere/model.lua: the atmosphere simulation's model, pure Lua
-- without I/O (simulation.lua runs it; the spec tests it).
--
-- A layered latitude/longitude grid of ozone-like values (DU-like partial
-- columns).  Each cell is a slowly drifting background (a latitude profile
-- per level plus a planetary wave travelling eastwards) plus a tracer: a
-- plume emitted by a moving source, carried east by a zonal wind that
-- depends on latitude and level, and decaying with time constant `tau`.
-- From step to step most cells change by a few hundredths; the cells around
-- the plume change by whole units.  The model is deterministic: the same
-- settings (and the same steering, at the same steps) give the same fields.
--
--   local model = dofile("examples/atmosphere/model.lua")
--   local sim = model.new{ dt = 0.5, emission = 2 }      -- settings, optional
--   local ev = sim:step()   -- { step, t, dt, emission, ..., nlev, nlat, nlon, cells }
--   local applied, rejected = sim:steer{ emission = 3 }   -- all or nothing
--
-- Field layout: ev.cells is one flat array, level-major then latitude then
-- longitude: cell (k, i, j) is ev.cells[(k-1)*nlat*nlon + (i-1)*nlon + j].
-- Latitude of row i: ev.lat0 + (i-1)*ev.dlat (south to north); longitude of
-- column j: ev.lon0 + (j-1)*ev.dlon (degrees east, 0..360).

local M = {}

local exp, sin, cos, floor, pi = math.exp, math.sin, math.cos, math.floor, math.pi
local rad = pi / 180

-- Tunable settings: default, limits, meaning.  Steering may change any of
-- them between two steps.
M.settings = {
  { name = "dt",       default = 0.5,  min = 0.01, max = 6,    doc = "model hours per step" },
  { name = "emission", default = 2.0,  min = 0,    max = 100,  doc = "source strength, units per hour" },
  { name = "wind",     default = 1.0,  min = -5,   max = 5,    doc = "factor on the zonal wind" },
  { name = "tau",      default = 24,   min = 0.5,  max = 1000, doc = "tracer decay time, hours" },
  { name = "rate",     default = 10,   min = 0.1,  max = 100,  doc = "steps per second of wall time" },
}
M.by_name = {}
for _, s in ipairs(M.settings) do M.by_name[s.name] = s end

M.dims = { nlev = 3, nlat = 36, nlon = 72 }

-- Background per level: mean, equator-to-pole increase, wave amplitude.
local LEVELS = {
  { base = 30,  polar = 0.35, wave = 1.5, wind = 1.0, source = 1.0 },   -- troposphere
  { base = 120, polar = 0.50, wave = 3.0, wind = 1.6, source = 0.5 },   -- lower stratosphere
  { base = 150, polar = 0.25, wave = 2.0, wind = 2.2, source = 0.2 },   -- middle stratosphere
}
local WAVE_SPEED = 0.01          -- rad of phase per model hour
local BASE_WIND = 8              -- degrees per model hour at the equator (level 1)
local SIGMA = 6                  -- source footprint, degrees

--- Checks one setting: the number to use, or nil, why.
function M.check(name, value)
  local s = M.by_name[name]
  if not s then
    if type(name) ~= "string" then return nil, ("unknown key of type %s"):format(type(name)) end
    return nil, ("unknown setting '%s'"):format(name)
  end
  if type(value) ~= "number" or value ~= value then
    return nil, ("%s must be a number, not %s"):format(name, type(value) == "number" and "NaN" or type(value))
  end
  if value < s.min or value > s.max then
    return nil, ("%s = %s is outside [%g, %g]"):format(name, tostring(value), s.min, s.max)
  end
  return value
end

local Sim = {}
Sim.__index = Sim

--- A new simulation.  settings: any subset of M.settings (checked: raises
-- on a bad one); dims: { nlev, nlat, nlon } (nlev <= 3).
function M.new(settings, dims)
  dims = dims or M.dims
  local nlev, nlat, nlon = dims.nlev or M.dims.nlev, dims.nlat or M.dims.nlat, dims.nlon or M.dims.nlon
  if not (nlev >= 1 and nlev <= #LEVELS and nlat >= 2 and nlon >= 2) then
    error(("bad grid dimensions %sx%sx%s: want 1..%d levels, >= 2 latitudes and longitudes")
      :format(nlev, nlat, nlon, #LEVELS), 0)
  end
  local self = setmetatable({
    step_no = 0, t = 0,
    nlev = nlev, nlat = nlat, nlon = nlon,
    dlat = 180 / nlat, dlon = 360 / nlon,
    tracer = {}, scratch = {},
  }, Sim)
  self.lat0 = -90 + self.dlat / 2
  self.lon0 = 0
  for _, s in ipairs(M.settings) do self[s.name] = s.default end
  for k, v in pairs(settings or {}) do
    local ok, err = M.check(k, v)
    if not ok then error(err, 2) end
    self[k] = ok
  end
  local n = nlev * nlat * nlon
  for c = 1, n do self.tracer[c] = 0; self.scratch[c] = 0 end
  return self
end

--- Applies a steering event, all or nothing: when every key of ev is a
-- setting with a valid value, applies them all and returns applied
-- { name = { old, new } }, {}; otherwise changes nothing and returns {},
-- rejected { "why", ... }.
function Sim:steer(ev)
  local applied, rejected = {}, {}
  if type(ev) ~= "table" then
    rejected[1] = ("a steering event must be a table of settings, not %s"):format(type(ev))
    return applied, rejected
  end
  local keys = {}
  for k in pairs(ev) do keys[#keys + 1] = k end
  table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
  local values = {}
  for _, k in ipairs(keys) do
    local v, err = M.check(k, ev[k])
    if v then values[k] = v else rejected[#rejected + 1] = err end
  end
  if #rejected > 0 then return applied, rejected end
  for k, v in pairs(values) do
    applied[k] = { self[k], v }
    self[k] = v
  end
  return applied, rejected
end

--- The current settings as a table (name -> value).
function Sim:settings()
  local s = {}
  for _, d in ipairs(M.settings) do s[d.name] = self[d.name] end
  return s
end

--- Where the source is at model time t: latitude, longitude (degrees).
function M.source_at(t)
  return 40 + 15 * sin(2 * pi * t / 36), (30 + 6 * t) % 360
end

--- Advances one step and returns the event to publish.
function Sim:step()
  local nlev, nlat, nlon = self.nlev, self.nlat, self.nlon
  local dt = self.dt
  self.step_no = self.step_no + 1
  self.t = self.t + dt
  local t = self.t
  local tr, new = self.tracer, self.scratch
  local decay = exp(-dt / self.tau)
  local slat, slon = M.source_at(t)
  local cells = {}
  local plane = nlat * nlon
  for k = 1, nlev do
    local L = LEVELS[k]
    local off = (k - 1) * plane
    for i = 1, nlat do
      local lat = self.lat0 + (i - 1) * self.dlat
      local clat = cos(lat * rad)
      local row = off + (i - 1) * nlon
      -- Semi-Lagrangian zonal advection: the value comes from upstream,
      -- linearly interpolated between the two nearest columns.
      local u = self.wind * BASE_WIND * L.wind * (0.4 + clat)     -- degrees / hour
      local shift = u * dt / self.dlon                            -- columns / step
      local s0 = floor(shift)
      local f = shift - s0
      local bg_lat = L.base * (1 + L.polar * (1 - clat * clat))
      local wave_amp = L.wave * clat
      local dlat2 = (lat - slat) ^ 2
      for j = 1, nlon do
        local ja = (j - 1 - s0) % nlon + 1
        local jb = (j - 2 - s0) % nlon + 1
        local c = (1 - f) * tr[row + ja] + f * tr[row + jb]
        -- the source: a Gaussian footprint, weaker aloft
        local lon = self.lon0 + (j - 1) * self.dlon
        local dl = (lon - slon + 180) % 360 - 180
        local d2 = dlat2 + (dl * clat) ^ 2
        if d2 < 16 * SIGMA * SIGMA then
          c = c + dt * self.emission * L.source * exp(-d2 / (2 * SIGMA * SIGMA))
        end
        c = c * decay
        new[row + j] = c
        cells[row + j] = bg_lat + wave_amp * sin(2 * lon * rad - WAVE_SPEED * t) + c
      end
    end
  end
  self.tracer, self.scratch = new, tr
  return {
    step = self.step_no, t = t,
    dt = dt, emission = self.emission, wind = self.wind, tau = self.tau, rate = self.rate,
    nlev = nlev, nlat = nlat, nlon = nlon,
    lat0 = self.lat0, dlat = self.dlat, lon0 = self.lon0, dlon = self.dlon,
    source = { lat = slat, lon = slon },
    cells = cells,
  }
end

--- The event the simulation publishes for a step's ev: its cells (a flat
-- Lua list) become ev.field, a new "<f8" array of shape { nlev, nlat, nlon }
-- (array: lecho.array, passed in so that the model needs nothing).
function M.publishable(ev, array)
  local f = array.new("<f8", { ev.nlev, ev.nlat, ev.nlon })
  local ptr, cells = f:ptr(), ev.cells
  for i = 1, #cells do ptr[i - 1] = cells[i] end
  ev.cells, ev.field = nil, f
  return ev
end

--- Index of cell (k, i, j) in a flat field of dims (nlat, nlon).
function M.index(k, i, j, nlat, nlon)
  return (k - 1) * nlat * nlon + (i - 1) * nlon + j
end

return M
