-- examples/atmosphere/viewer.lua: a viewer process of the atmosphere example.
local usage = [[
usage: luajit examples/atmosphere/viewer.lua --kind full|region|diff|zfp|quant --nameserver HOST:PORT [options]

Subscribes to "atmosphere.field" (its field a "<f8" array) and keeps the
latest field; each view's modulator works with the array operations in C:
  full    every event as the simulation published it
  region  a modulator in the simulation keeps a lat/lon box and sends 2x2
          block means of it (--box, --stride: a box view, a block reduce)
  diff    a modulator in the simulation sends only the cells that moved by
          more than --threshold since last sent (delta); this viewer
          rebuilds the whole field (patch), within the threshold of the source
  zfp     the whole field compressed by ZFP, every cell within --tolerance
  quant   the whole field as 16-bit integers (--scale, --offset), every cell
          within scale/2

Once a second it reports { viewer, kind, events, bytes, wire, step, ... } on
the channel given by --report (and prints a line unless --quiet).  On the
simulation's final event it sends a final report that includes its field,
then exits with status 0 (1: --seconds passed before a final event came).

  --kind K                full, region or diff
  --nameserver HOST:PORT  the name server (required)
  --name NAME             the name in reports (default: the kind)
  --listen ADDRESS        where this process listens (default 127.0.0.1:0;
                          0.0.0.0:0 to be reached from other hosts: needs keys)
  --advertise ADDRESS     the address peers are told (default: with a wildcard
                          --listen, this host's address toward the name server)
  --box A,B,C,D           region: lat_min,lat_max,lon_min,lon_max (default 0,90,0,180)
  --stride N              region: block side in cells (default 2)
  --threshold X           diff: threshold (default 0.5)
  --tolerance X           zfp: the absolute error bound (default 0.01)
  --scale X, --offset X   quant: value = offset + k * scale (default 0.005, 0)
  --report CHANNEL        where reports go (default atmosphere.viewers; "none": nowhere)
  --seconds S             exit after S seconds even without a final event
                          (default 120; 0: no bound)
  --quiet                 no lines on stdout, no lecho log
  --help                  this text
]]

local here = (arg and arg[0] or ""):match("^(.*)/[^/]*$") or "."
local mods = dofile(here .. "/modulators.lua")

local A = dofile(here .. "/args.lua").new("viewer", usage)
local die = A.die

local opts = { report = "atmosphere.viewers", seconds = 120, stride = 2, threshold = 0.5 }
do
  A.parse(arg, {
    ["--kind"] = function(get) opts.kind = get.value() end,
    ["--nameserver"] = function(get) opts.nameserver = get.value() end,
    ["--listen"] = function(get) opts.listen = get.value() end,
    ["--advertise"] = function(get) opts.advertise = get.value() end,
    ["--name"] = function(get) opts.name = get.value() end,
    ["--report"] = function(get) opts.report = get.value() end,
    ["--seconds"] = function(get) opts.seconds = get.number() end,
    ["--stride"] = function(get) opts.stride = get.number() end,
    ["--threshold"] = function(get) opts.threshold = get.number() end,
    ["--tolerance"] = function(get) opts.tolerance = get.number() end,
    ["--scale"] = function(get) opts.scale = get.number() end,
    ["--offset"] = function(get) opts.offset = get.number() end,
    ["--box"] = function(get)
      local b = {}
      for x in get.value():gmatch("[^,]+") do b[#b + 1] = tonumber(x) end
      if #b ~= 4 then die("--box wants four numbers: lat_min,lat_max,lon_min,lon_max") end
      opts.box = b
    end,
    ["--quiet"] = function() opts.quiet = true end,
  })
  local kinds = { full = true, region = true, diff = true, zfp = true, quant = true }
  if not kinds[opts.kind] then
    die("--kind must be full, region, diff, zfp or quant\n" .. usage)
  end
  if not opts.nameserver then die("--nameserver HOST:PORT is required\n" .. usage) end
  if opts.report == "none" then opts.report = nil end
  opts.name = opts.name or opts.kind
end

local lecho = require "lecho"
local okc, ctx = pcall(lecho.context, { nameserver = opts.nameserver, quiet = opts.quiet,
                                           listen = opts.listen, advertise = opts.advertise })
if not okc then die(tostring(ctx), 1) end

local report_p
if opts.report then
  local err
  report_p, err = ctx:channel(opts.report):producer()
  if not report_p then die("cannot report on " .. opts.report .. ": " .. tostring(err), 1) end
end

-- The handler (demodulator) and the modulator for each kind.
local final_ev, modulator_error
local function on_field(ev)
  if ev.final then
    final_ev = ev
    ctx:stop()
  end
end

local handler, state, copts
if opts.kind == "full" then
  state = { events = 0 }
  handler = function(ev, meta)
    state.events = state.events + 1
    if type(ev) == "table" and ev.field then
      -- a received array is a view that ends with this handler: keep a copy
      state.ev, state.meta, state.field = ev, meta, ev.field:copy()
      on_field(ev)
    end
  end
elseif opts.kind == "region" then
  local box = opts.box or {}
  local params = mods.region_params{ lat_min = box[1], lat_max = box[2],
                                     lon_min = box[3], lon_max = box[4], stride = opts.stride }
  handler, state = mods.region_demodulator(function(ev) on_field(ev) end)
  copts = { modulator = mods.region, params = params }
elseif opts.kind == "diff" then
  local okp, params = pcall(mods.diff_params, { threshold = opts.threshold })
  if not okp then die(tostring(params)) end
  -- Viewers asking for the same threshold share one modulator in the
  -- simulation; when one joins, receivers() makes the next step a key frame.
  handler, state = mods.diff_demodulator(function(ev) on_field(ev) end)
  copts = { modulator = mods.diff, params = params }
elseif opts.kind == "zfp" then
  local okp, params = pcall(mods.zfp_params, { tolerance = opts.tolerance })
  if not okp then die(tostring(params)) end
  handler, state = mods.zfp_demodulator(function(ev) on_field(ev) end)
  copts = { modulator = mods.zfp, params = params }
else
  local okp, params = pcall(mods.quant_params, { scale = opts.scale, offset = opts.offset })
  if not okp then die(tostring(params)) end
  handler, state = mods.quant_demodulator(function(ev) on_field(ev) end)
  copts = { modulator = mods.quant, params = params }
end
if copts then
  copts.on_error = function(err)
    modulator_error = tostring(err)
    io.stderr:write("viewer ", opts.name, ": modulator failed: ", modulator_error, "\n")
  end
end

local field_ch = ctx:channel("atmosphere.field")
local con, cerr = field_ch:consumer(handler, copts)
if not con then die("cannot consume atmosphere.field: " .. tostring(cerr), 1) end

-- What this consumer received: its own counters (modulator API), and the
-- wire bytes from the simulation's process (every byte on that connection).
local function counters()
  local r = { events = state.events }
  if con.stats then
    local s = con:stats()
    r.events_in, r.bytes = s.events, s.bytes
  end
  local meta = state.meta
  local from = meta and meta.producer and meta.producer:match("^(.-)#")
  local cs = ctx:stats()
  local peer = from and cs.peers[from]
  if peer then r.wire = peer.bytes_in end
  local ch = cs.channels[field_ch.name]
  if ch then r.value_bytes = ch.bytes_in end
  return r
end

local function report(extra)
  local c = counters()
  local ev = state.ev
  local r = {
    viewer = opts.name, kind = opts.kind, addr = ctx.addr,
    events = c.events, events_in = c.events_in, bytes = c.bytes, wire = c.wire,
    value_bytes = c.value_bytes,
    step = ev and ev.step, t = ev and ev.t, dt = ev and ev.dt, emission = ev and ev.emission,
    wind = ev and ev.wind, tau = ev and ev.tau, rate = ev and ev.rate,
    changed = state.changed, key_frames = state.key_frames, missing = state.missing,
    modulator_error = modulator_error,
  }
  for k, v in pairs(extra or {}) do r[k] = v end
  return r
end

local function line(r)
  return ("%s: %d events, step %s, %s bytes (wire %s)%s"):format(
    r.viewer, r.events, tostring(r.step), tostring(r.bytes), tostring(r.wire),
    r.changed and (", %d cells changed"):format(r.changed) or "")
end

local ticker = ctx:every(1.0, function()
  local r = report()
  if report_p then report_p:submit(r) end
  if not opts.quiet then print(line(r)) io.stdout:flush() end
end)

local timed_out = false
if opts.seconds and opts.seconds > 0 then
  ctx:after(opts.seconds, function() timed_out = true; ctx:stop() end)
end
ctx:run()
ticker:stop()

-- this process's CPU seconds (os.clock: all of its threads)
local final = report{ done = true, final = final_ev ~= nil, timed_out = timed_out, cpu = os.clock() }
if final_ev then
  final.field = state.field
  final.sim_cpu = final_ev.t_cpu
  final.nlev, final.nlat, final.nlon = final_ev.nlev, final_ev.nlat, final_ev.nlon
  final.lat0, final.dlat, final.lon0, final.dlon = final_ev.lat0, final_ev.dlat, final_ev.lon0, final_ev.dlon
  final.region, final.threshold = final_ev.region, final_ev.threshold
  final.tolerance, final.scale, final.offset = final_ev.tolerance, final_ev.scale, final_ev.offset
  final.levels = final_ev.levels
end
if report_p then
  local ok, err, code = report_p:submit_sync(final, { timeout = 10 })
  -- (nobody collecting reports, a viewer run on its own: nothing failed)
  if not ok and code ~= "noconsumer" then
    io.stderr:write("viewer ", opts.name, ": final report: ", tostring(err), "\n")
  end
end
if not opts.quiet then
  final.field = nil
  print(line(final) .. (final_ev and " (final)" or " (no final event)"))
end
con:close()
ctx:close()
os.exit(final_ev and 0 or 1)
