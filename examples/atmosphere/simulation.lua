-- examples/atmosphere/simulation.lua: the atmosphere simulation as a process.
-- Publishes one field event per step on "atmosphere.field" and takes its
-- settings from steering events on "atmosphere.steer".  `--help` says more.
local usage = [[
usage: luajit examples/atmosphere/simulation.lua [options]

Publishes a layered latitude/longitude field of ozone-like values on the
channel "atmosphere.field", one event per step, and applies steering events
from "atmosphere.steer": a table with any subset of the settings below,
e.g. { dt = 0.5 } or { emission = 3.0, wind = -1 }.  An event with an
unknown key or a bad value changes nothing: the handler raises, so the
steering process gets the reason back (submit_sync returns nil and it).  Each field event carries the
settings it was computed with: ev.step, ev.t (model hours), ev.dt,
ev.emission, ev.wind, ev.tau, ev.rate, the grid (ev.nlev, ev.nlat, ev.nlon,
ev.lat0, ev.dlat, ev.lon0, ev.dlon), ev.source = { lat, lon }, ev.t_cpu (this
process's CPU seconds so far, its modulators' included) and ev.field, a
"<f8" array of shape { nlev, nlat, nlon } (lecho.array; cell (k,i,j) at
field:get(k-1, i-1, j-1)).
The last event of a bounded run has ev.final = true and is submitted
synchronously: when it returns, every consumer has had every event.

  --nameserver HOST:PORT  use this name server (default: run one inside this
                          process and print "nameserver 127.0.0.1:PORT" first)
  --listen ADDRESS        where this process listens (default 127.0.0.1:0;
                          0.0.0.0:0 to be reached from other hosts: needs keys)
  --advertise ADDRESS     the address peers are told (default: with a wildcard
                          --listen, this host's address toward the name server)
  --steps N               stop after N steps
  --seconds S             stop after S seconds of stepping (0: no bound;
                          default 30 unless --steps is given)
  --wait N                before stepping, wait (up to 30 s) until N processes
                          consume "atmosphere.field"
  --grid LxMxN            levels x latitudes x longitudes (default 3x36x72)
  --dt X                  model hours per step (default 0.5)
  --emission Y            source strength, units per hour (default 2)
  --wind W                factor on the zonal wind (default 1)
  --tau H                 tracer decay time, hours (default 24)
  --rate HZ               steps per second (default 10)
  --quiet                 no progress lines, no lecho log
  --help                  this text

Runs until its bound, or until SIGINT/SIGTERM.
]]

local here = (arg and arg[0] or ""):match("^(.*)/[^/]*$") or "."
local model = dofile(here .. "/model.lua")

local A = dofile(here .. "/args.lua").new("simulation", usage)
local die = A.die

-- Options.
local opts, settings = {}, {}
do
  A.parse(arg, {
    ["--nameserver"] = function(get) opts.nameserver = get.value() end,
    ["--listen"] = function(get) opts.listen = get.value() end,
    ["--advertise"] = function(get) opts.advertise = get.value() end,
    ["--steps"] = function(get) opts.steps = get.number() end,
    ["--seconds"] = function(get) opts.seconds = get.number() end,
    ["--wait"] = function(get) opts.wait = get.number() end,
    ["--quiet"] = function() opts.quiet = true end,
    ["--grid"] = function(get)
      local l, m, n = get.value():match("^(%d+)x(%d+)x(%d+)$")
      if not l then die("--grid wants LxMxN, e.g. 3x36x72") end
      opts.dims = { nlev = tonumber(l), nlat = tonumber(m), nlon = tonumber(n) }
    end,
  }, function(flag)
    -- every model setting is a flag: --dt, --emission, --wind, --tau, --rate
    local name = flag:match("^%-%-(%a+)$")
    if not (name and model.by_name[name]) then return nil end
    return function(get)
      local v, err = model.check(name, get.number())
      if not v then die(err) end
      settings[name] = v
    end
  end)
  if opts.seconds == nil and opts.steps == nil then opts.seconds = 30 end
  if opts.seconds == 0 then opts.seconds = nil end
end

local okm, sim = pcall(model.new, settings, opts.dims)
if not okm then die(tostring(sim)) end

local function say(fmt, ...)
  if not opts.quiet then
    io.stdout:write(fmt:format(...), "\n")
    io.stdout:flush()
  end
end
local function log(fmt, ...)
  io.stderr:write("simulation: ", fmt:format(...), "\n")
  io.stderr:flush()
end

local lecho = require "lecho"
local okc, ctx = pcall(lecho.context, {
  nameserver = opts.nameserver,
  listen = opts.listen, advertise = opts.advertise,
  quiet = opts.quiet,
  modulator_budget = 0.05,      -- a view's array operations over 7776 cells, with room
})
if not okc then die(tostring(ctx), 1) end
if not opts.nameserver then
  io.stdout:write("nameserver ", ctx.addr, "\n")
  io.stdout:flush()
end

local function fmt_value(v)
  return type(v) == "number" and ("%g"):format(v) or tostring(v)
end

local publish_settings   -- (below, once its producer is made)

-- The timer that steps; replaced when steering changes the rate.
local stepper
local function restart_stepper() end

-- Steering: all of an event or nothing.  A bad one raises, and lecho's error
-- forwarding takes the reason back to the steering process.
local steer_ch = ctx:channel("atmosphere.steer")
local steer, serr = steer_ch:consumer(function(ev, meta)
  local applied, rejected = sim:steer(ev)
  if #rejected > 0 then
    local why = table.concat(rejected, "; ")
    log("steering from %s rejected: %s", meta and meta.producer or "?", why)
    error(why, 0)
  end
  local changes = {}
  for name, ov in pairs(applied) do changes[#changes + 1] = ("%s %s -> %s"):format(name, fmt_value(ov[1]), fmt_value(ov[2])) end
  if #changes > 0 then
    table.sort(changes)
    if not opts.quiet then log("step %d: steered: %s", sim.step_no, table.concat(changes, ", ")) end
    if applied.rate then restart_stepper() end
    publish_settings()
  end
end)
if not steer then die("cannot consume atmosphere.steer: " .. tostring(serr), 1) end

local field_ch = ctx:channel("atmosphere.field")
-- history: a viewer that attaches late gets the current field at once,
-- through its own modulator, then the steps that follow
local p, perr = field_ch:producer{ grant = { "clock", "log" }, history = "last" }
if not p then die("cannot produce on atmosphere.field: " .. tostring(perr), 1) end

-- The current settings on atmosphere.settings, kept as its last value
-- (history): a viewer that attaches with { history = "last" } reads them at
-- once, then every change.
local settings_p, sperr = ctx:channel("atmosphere.settings"):producer{ history = "last" }
if not settings_p then die("cannot produce on atmosphere.settings: " .. tostring(sperr), 1) end
function publish_settings()
  local ok, err = settings_p:submit(sim:settings())
  if not ok then log("settings not published: %s", tostring(err)) end
end
publish_settings()

-- Consuming processes of a channel, asking its manager.
local function consumers_of(ch)
  local chans = ctx:list()
  local info = chans and chans[ch.name]
  if info and info.manager and not info.consumers then
    chans = ctx:list(info.manager)
    info = chans and chans[ch.name]
  end
  local n = 0
  for _ in pairs(info and info.consumers or {}) do n = n + 1 end
  return n
end

if opts.wait and opts.wait > 0 then
  local deadline = ctx:now() + 30
  local n = 0
  while ctx:now() < deadline do
    n = consumers_of(field_ch)
    if n >= opts.wait then break end
    ctx:run_once(0.1)
  end
  if n < opts.wait then log("only %d of %d consumers after 30 s; starting anyway", n, opts.wait) end
end

local t_start = ctx:now()
local done, failed = false, false

local array = lecho.array

-- The model's step as an event: its cells (a flat Lua list) become a new
-- "<f8" array each step (an async submit reads the array when its frame is
-- written: a fresh one is never changed before that).
local function step_event()
  local ev = model.publishable(sim:step(), array)
  ev.t_cpu = os.clock()
  return ev
end

local function step()
  if done then return end
  local ev = step_event()
  local last = (opts.steps and sim.step_no >= opts.steps)
            or (opts.seconds and ctx:now() - t_start >= opts.seconds)
  if last then
    done = true
    ev.final = true
    if stepper then stepper:stop() end
    local ok, err, code = p:submit_sync(ev, { timeout = 10 })
    -- (nobody watching: "noconsumer", nothing failed)
    if not ok and code ~= "noconsumer" then
      log("final step %d: %s", ev.step, tostring(err))
      failed = true
    end
    ctx:stop()
    return
  end
  local ok, err = p:submit(ev)
  if not ok then log("step %d not published: %s", ev.step, tostring(err)) end
end

function restart_stepper()
  if done then return end
  if stepper then stepper:stop() end
  stepper = ctx:every(1 / sim.rate, step)
end
restart_stepper()

-- What really went to the viewers of other processes: the field channel's
-- events_out and bytes_out (once per viewer), and those of its modulated
-- streams "name@key" (a viewer with a modulator gets its events there);
-- steps nobody consumed are events_no_dest (doc/semantics.md "Statistics").
local function sent()
  local ev, bytes, nowhere = 0, 0, 0
  for name, s in pairs(ctx:stats().channels) do
    if name == field_ch.name or name:sub(1, #field_ch.name + 1) == field_ch.name .. "@" then
      ev, bytes, nowhere = ev + s.events_out, bytes + s.bytes_out, nowhere + (s.events_no_dest or 0)
    end
  end
  return ev, bytes, nowhere
end

local progress = ctx:every(1.0, function()
  local ev, bytes, nowhere = sent()
  say("step %d t=%.1fh dt=%g emission=%g wind=%g tau=%g rate=%g | %d events out, %.2f MB, %d with no consumer",
      sim.step_no, sim.t, sim.dt, sim.emission, sim.wind, sim.tau, sim.rate, ev, bytes / 1e6, nowhere)
end)

say("simulating a %dx%dx%d grid at %g steps/s%s", sim.nlev, sim.nlat, sim.nlon, sim.rate,
    opts.steps and (" for %d steps"):format(opts.steps)
    or opts.seconds and (" for %g s"):format(opts.seconds) or " until stopped")
ctx:run()
progress:stop()
if stepper then stepper:stop() end
say("done: %d steps, t=%.1fh", sim.step_no, sim.t)
p:close()
steer:close()
ctx:close()
os.exit(failed and 1 or 0)
