-- examples/atmosphere/run.lua (make demo): the simulation and three viewers,
-- each its own process, with live counters and a summary of the bytes each
-- viewer received.  `--help` says more.
local usage = [[
usage: luajit examples/atmosphere/run.lua [options]

Starts examples/atmosphere/simulation.lua (with a name server inside it,
unless one is given) and five viewers (full, region, diff, zfp, quant) as
separate processes.  The simulation publishes its field as a "<f8" array;
each view's modulator reduces it with the array operations, in C (a box and
block means, a delta, ZFP at an error bound, a 16-bit quantization).  Prints
what each viewer received once a second, then a summary: events and bytes
per viewer, the reduction against the full view, each process's CPU per
step (the simulation's with its modulators), and the checks:
  - the region view receives at least 85% fewer bytes than the full view,
  - the diff view receives fewer bytes than the region view,
  - the diff view's rebuilt field is within the threshold of the source
    (the full view's field at the same final step), cell by cell,
  - the zfp view's field is within --tolerance of the source, the quant
    view's within scale/2, each in fewer bytes than the full view,
  - the region view's cells are the block means of the source,
  - the steering event sent at the first live line past 40% of the run
    (about half-way) reached the simulation (its handler acknowledged
    it, and the next full field carries the settings;
    steering from the live page afterwards does not fail the check).
Exits 0 when every check passed.  Every process it started is stopped.

  --nameserver HOST:PORT  use this name server (default: $LECHO_NAMESERVER,
                          else the simulation runs one)
  --seconds S             how long the simulation steps (default:
                          $DEMO_SECONDS, else 10)
  --rate HZ               simulation steps per second (default 10)
  --threshold X           the diff view's threshold (default 0.5)
  --stride N              the region view's block side (default 2)
  --tolerance X           the zfp view's error bound (default 0.01)
  --scale X               the quant view's step (default 0.005)
  --steer LUA             a steering event sent at the first live line
                          past 40% of the run (about half-way)
                          (default "{ emission = 4 }"; "none": no steering;
                          runs shorter than 3 s are not steered)
  --http ADDRESS          where lecho-gateway serves the live view (default:
                          $DEMO_HTTP, else 127.0.0.1:0, a free port; its URL
                          is printed; "none": no gateway)
  --json FILE             also write the summary as JSON to FILE
  --verbose               show the lecho logs of every process
  --help                  this text
]]

local here = (arg and arg[0] or ""):match("^(.*)/[^/]*$") or "."
local proc = dofile(here .. "/proc.lua")

local A = dofile(here .. "/args.lua").new("run", usage)
local die = A.die

local opts = {
  nameserver = os.getenv("LECHO_NAMESERVER"),
  seconds = tonumber(os.getenv("DEMO_SECONDS") or "") or 10,
  rate = 10, threshold = 0.5, stride = 2, tolerance = 0.01, scale = 0.005, steer = "{ emission = 4 }",
  http = os.getenv("DEMO_HTTP") or "127.0.0.1:0",
}
if opts.http == "" then opts.http = "127.0.0.1:0" end
if opts.nameserver == "" then opts.nameserver = nil end
do
  A.parse(arg, {
    ["--nameserver"] = function(get) opts.nameserver = get.value() end,
    ["--seconds"] = function(get) opts.seconds = get.number() end,
    ["--rate"] = function(get) opts.rate = get.number() end,
    ["--threshold"] = function(get) opts.threshold = get.number() end,
    ["--stride"] = function(get) opts.stride = get.number() end,
    ["--tolerance"] = function(get) opts.tolerance = get.number() end,
    ["--scale"] = function(get) opts.scale = get.number() end,
    ["--json"] = function(get) opts.json = get.value() end,
    ["--http"] = function(get) opts.http = get.value() end,
    ["--steer"] = function(get) opts.steer = get.value() end,
    ["--verbose"] = function() opts.verbose = true end,
  })
  if opts.seconds <= 0 then die("--seconds must be positive") end
  if opts.steer == "none" or opts.seconds < 3 then
    opts.steer = nil   -- (a run shorter than 3 s could end before the steering arrives)
  else
    local chunk = loadstring("return " .. opts.steer)
    local ok, v = pcall(chunk or error)
    if not ok or type(v) ~= "table" then die("--steer wants a Lua table, e.g. \"{ emission = 4 }\"") end
    opts.steer_text, opts.steer = opts.steer, v
  end
end

local function out(fmt, ...)
  io.stdout:write(fmt:format(...), "\n")
  io.stdout:flush()
end

local function read(path)
  local f = io.open(path, "r")
  if not f then return "" end
  local s = f:read("*a")
  f:close()
  return s
end

local tmp
do
  local f = io.popen("mktemp -d /tmp/lecho-atmosphere.XXXXXX")
  tmp = f:read("*l")
  f:close()
  if not tmp or tmp == "" then die("mktemp failed", 1) end
end

local luajit = os.getenv("LUAJIT") or "luajit"
local children = {}
local quiet = not opts.verbose and "--quiet" or nil

local function start(name, script, args)
  local argv = { luajit, here .. "/" .. script }
  for _, a in ipairs(args) do argv[#argv + 1] = a end
  local child, err = proc.spawn(argv, { out = ("%s/%s.out"):format(tmp, name),
                                        err = ("%s/%s.err"):format(tmp, name) })
  if not child then return nil, err end
  child.name = name
  children[#children + 1] = child
  return child
end

-- Everything below ends in finish(): stop the children, print their
-- errors when something went wrong (said: the cause was said in one line
-- already, nothing more), remove the temporary files.
local function finish(ok, summary, said)
  local clean = proc.stop_all(children, 3)
  local all_gone = true
  for _, c in ipairs(children) do
    if not c.status then all_gone = false end
  end
  if (not ok and not said) or opts.verbose then
    for _, c in ipairs(children) do
      local e = read(c.err)
      if e ~= "" then out("--- %s (%s) stderr:\n%s", c.name, tostring(c.status), e) end
    end
  end
  if summary and opts.json then
    summary.pids = {}
    for _, c in ipairs(children) do summary.pids[#summary.pids + 1] = c.pid end
    summary.children_stopped = all_gone
    summary.children_killed = not clean
    local cjson = require "cjson"
    local f = io.open(opts.json, "w")
    if f then f:write(cjson.encode(summary), "\n") f:close() end
  end
  os.execute("rm -rf " .. proc.sh_quote(tmp))
  os.exit(ok and 0 or 1)
end

-- 1. The simulation; it waits for the five viewers before stepping.
local sim_args = { "--seconds", tostring(opts.seconds), "--rate", tostring(opts.rate), "--wait", "5" }
if opts.nameserver then
  sim_args[#sim_args + 1] = "--nameserver"
  sim_args[#sim_args + 1] = opts.nameserver
end
if quiet then sim_args[#sim_args + 1] = quiet end
local sim, serr = start("simulation", "simulation.lua", sim_args)
if not sim then die("cannot start the simulation: " .. tostring(serr), 1) end

local ns = opts.nameserver
if not ns then
  local t_end = os.time() + 20
  while not ns do
    ns = read(sim.out):match("nameserver (%d+%.%d+%.%d+%.%d+:%d+)")
    if ns then break end
    if proc.poll(sim) or os.time() > t_end then
      out("run: the simulation did not print its name server (%s)", tostring(sim.status or "still starting"))
      finish(false)
    end
    proc.sleep(0.05)
  end
end

-- 1b. The gateway beside them: the live view in a browser (doc/gateway.md),
-- started before this process's context (whose loop the wait below would stall).
if opts.http ~= "none" then
  local gw_script = here .. "/../../scripts/lecho-gateway"
  local gargs = { luajit, gw_script, "--nameserver", ns, "--http", opts.http, "--for", tostring(opts.seconds + 90) }
  local gw, gerr = proc.spawn(gargs, { out = tmp .. "/gateway.out", err = tmp .. "/gateway.err" })
  if not gw then out("run: cannot start the gateway: %s", tostring(gerr)) finish(false) end
  gw.name, gw.err = "gateway", tmp .. "/gateway.err"
  children[#children + 1] = gw
  local t_end = os.time() + 20
  local url
  -- (not --quiet: its first line is the URL)
  repeat
    url = read(gw.err):match("lecho%-gateway: (http://%S+/)")
    if not url then proc.sleep(0.05) end
  until url or proc.poll(gw) or os.time() > t_end
  if url then
    out("live view: %s (open it in a browser; the demo runs %g s%s)", url, opts.seconds,
        opts.seconds < 120 and ": DEMO_SECONDS=120 make demo for longer" or "")
  else
    -- one line with the cause (a busy --http/DEMO_HTTP port: "cannot
    -- listen on ...: Address already in use"), then stop: not a summary of
    -- viewers that never ran burying it
    local why = read(gw.err):match("lecho%-gateway: ([^\n]+)")
      or (proc.poll(gw) and ("exited (%s)"):format(tostring(gw.status))) or "no URL within 20 s"
    out("make demo: the live view's gateway did not start: %s%s", why,
        why:find("in use", 1, true) and (" (DEMO_HTTP=127.0.0.1:0 make demo takes a free port; "
          .. "DEMO_HTTP=none runs without the live view)") or "")
    finish(false, nil, true)
  end
end

-- 2. This process collects the viewers' reports.
local lecho = require "lecho"
local okc, ctx = pcall(lecho.context, {
  nameserver = ns,
  log = function(msg) if opts.verbose then io.stderr:write("run: lecho: ", msg, "\n") end end,
})
if not okc then out("run: %s", tostring(ctx)) finish(false) end

local latest, finals = {}, {}
-- The demo's own steering: acknowledged (submit_sync true: the simulation's
-- handler applied it) and then seen in a full field, the first after it
-- that has the settings.  Not "the last field has them": a user steering
-- from the live page (as the README invites) may change them afterwards.
local steer = { sent = nil, acked = nil, seen = nil, other = nil }
local function steer_watch(r)
  if not steer.acked or steer.seen or type(r.step) ~= "number" or r.step < steer.sent then return end
  local model = steer.model
  for k, v in pairs(opts.steer) do
    if model.check(k, v) and r[k] ~= v then
      steer.other = ("%s = %s"):format(tostring(k), tostring(r[k]))
      return
    end
  end
  steer.seen = r.step
end
local reports, rerr = ctx:channel("atmosphere.viewers"):consumer(function(r)
  if type(r) ~= "table" or type(r.viewer) ~= "string" then return end
  -- a received array is a view that ends with this handler: keep a copy
  if lecho.array.is(r.field) then r.field = r.field:copy() end
  latest[r.viewer] = r
  if r.done then finals[r.viewer] = r end
  if r.viewer == "full" then steer_watch(r) end
end)
if not reports then out("run: cannot consume atmosphere.viewers: %s", tostring(rerr)) finish(false) end

-- 3. The viewers.
local KINDS = { "full", "region", "diff", "zfp", "quant" }
for _, kind in ipairs(KINDS) do
  local a = { "--kind", kind, "--nameserver", ns, "--seconds", tostring(opts.seconds + 90) }
  if kind == "region" then a[#a + 1] = "--stride"; a[#a + 1] = tostring(opts.stride) end
  if kind == "diff" then a[#a + 1] = "--threshold"; a[#a + 1] = tostring(opts.threshold) end
  if kind == "zfp" then a[#a + 1] = "--tolerance"; a[#a + 1] = tostring(opts.tolerance) end
  if kind == "quant" then a[#a + 1] = "--scale"; a[#a + 1] = tostring(opts.scale) end
  if quiet then a[#a + 1] = quiet end
  local v, verr = start(kind, "viewer.lua", a)
  if not v then out("run: cannot start the %s viewer: %s", kind, tostring(verr)) finish(false) end
end

out("atmosphere: name server %s; simulation pid %d, viewers full/region/diff/zfp/quant; %g s at %g steps/s",
    ns, sim.pid, opts.seconds, opts.rate)

local function kb(n) return n and ("%.1f kB"):format(n / 1000) or "-" end
local function bytes_of(r) return r and (r.bytes or r.wire) end
local function per_event(r)
  local b = bytes_of(r)
  return b and r.events and r.events > 0 and b / r.events or nil
end
local function reduction(r, full)
  local a, b = per_event(r), per_event(full)
  if not a or not b or b == 0 then return nil end
  return 1 - a / b
end

-- 4. Live lines, until every viewer has sent its final report; about
-- at the first live line past 40% of the simulation (about half-way: lines come once a second), one steering event.
local steer_p
if opts.steer then
  local err
  steer_p, err = ctx:channel("atmosphere.steer"):producer()
  if not steer_p then out("run: cannot steer: %s", tostring(err)) finish(false) end
end
local steered_at
local t0 = ctx:now()
local live = ctx:every(1.0, function()
  local parts = { ("%5.1fs"):format(ctx:now() - t0) }
  local full = latest.full
  if full and full.dt then parts[#parts + 1] = ("dt %g emission %g"):format(full.dt, full.emission) end
  local steer_now = steer_p and not steered_at and full and full.step
                    and full.step >= opts.seconds * opts.rate * 0.4
  for _, kind in ipairs(KINDS) do
    local r = latest[kind]
    if r then
      local red = kind ~= "full" and reduction(r, full)
      parts[#parts + 1] = ("%s: step %s, %d ev, %s%s"):format(kind, tostring(r.step), r.events,
        kb(bytes_of(r)), red and (" (-%.1f%%)"):format(100 * red) or "")
    else
      parts[#parts + 1] = kind .. ": starting"
    end
  end
  out("%s", table.concat(parts, " | "))
  if steer_now then
    steered_at = full.step
    steer.sent, steer.model = full.step, dofile(here .. "/model.lua")
    local ok, err = steer_p:submit_sync(opts.steer, { timeout = 5 })
    steer.acked = ok and true or false
    out("        steering the simulation (its step %d or later): %s%s", full.step, opts.steer_text,
        ok and "" or (" failed: " .. tostring(err)))
  end
end)

local deadline = ctx:now() + opts.seconds + 60
local why
while true do
  local n = 0
  for _ in pairs(finals) do n = n + 1 end
  if n == #KINDS then break end
  if ctx:now() > deadline then why = "timed out waiting for the viewers' final reports" break end
  -- the simulation's last event is synchronous: once it exited, every
  -- viewer has handled it and is sending its final report
  if sim.code == 0 and deadline > ctx:now() + 15 then deadline = ctx:now() + 15 end
  local dead
  for _, c in ipairs(children) do
    if proc.poll(c) and not finals[c.name] and (c.name ~= "simulation" or c.code ~= 0) then
      dead = c
    end
  end
  if dead then
    -- a viewer may have exited right after its final report: serve the loop once more
    ctx:run_once(0.5)
    if not finals[dead.name] and (dead.name ~= "simulation" or dead.code ~= 0) then
      why = ("%s exited early (%s)"):format(dead.name, dead.status)
      break
    end
  end
  ctx:run_once(0.1)
end
live:stop()

-- 5. Summary and checks.
local summary = { viewers = {}, checks = {}, ok = true }
local function check(name, ok, detail)
  summary.checks[#summary.checks + 1] = { name = name, ok = ok and true or false, detail = detail }
  if not ok then summary.ok = false end
end
if why then check("every viewer sent its final report", false, why) end

local full, region, diff, zfp, quant = finals.full, finals.region, finals.diff, finals.zfp, finals.quant
out("")
out("%-8s %8s %14s %14s %12s %10s %12s", "viewer", "events", "bytes", "wire bytes", "per event", "vs full", "cpu/step")
local function cpu_step(cpu, steps) return cpu and steps and steps > 0 and ("%.2f ms"):format(1000 * cpu / steps) or "-" end
for _, kind in ipairs(KINDS) do
  local r = finals[kind] or latest[kind]
  if r then
    local red = kind ~= "full" and reduction(r, full or latest.full)
    out("%-8s %8d %14s %14s %12s %10s %12s", kind, r.events, tostring(r.bytes or "-"), tostring(r.wire or "-"),
        per_event(r) and ("%.0f"):format(per_event(r)) or "-", red and ("-%.1f%%"):format(100 * red) or "",
        cpu_step(r.cpu, r.events))
    summary.viewers[kind] = { events = r.events, bytes = r.bytes, wire = r.wire, step = r.step,
                              reduction = red or nil, final = r.final, modulator_error = r.modulator_error,
                              cpu = r.cpu, cpu_per_step = r.cpu and r.events > 0 and r.cpu / r.events or nil }
  else
    out("%-8s %8s", kind, "no report")
  end
end
-- the simulation's CPU, as its last field event said (its five modulators included)
if full and full.sim_cpu and full.step then
  out("%-8s %8d %14s %14s %12s %10s %12s", "sim", full.step, "", "", "", "", cpu_step(full.sim_cpu, full.step))
  summary.simulation_cpu, summary.simulation_cpu_per_step = full.sim_cpu, full.sim_cpu / full.step
end
out("")

local function all_there()
  for _, kind in ipairs(KINDS) do if not finals[kind] then return false end end
  return true
end

-- The largest |a - b| over two arrays of one shape, or nil and why.
local function max_error(a, b)
  if not (lecho.array.is(a) and lecho.array.is(b)) then return nil, "no field" end
  if table.concat(a:shape(), "x") ~= table.concat(b:shape(), "x") then
    return nil, ("shapes %s and %s"):format(table.concat(a:shape(), "x"), table.concat(b:shape(), "x"))
  end
  local x, y, m = a:ptr(), b:ptr(), 0
  for i = 0, #a - 1 do
    local e = math.abs(x[i] - y[i])
    if not (e <= m) then m = e end
  end
  return m
end

if all_there() then
  for _, kind in ipairs(KINDS) do
    local r = finals[kind]
    if not r.final then check(kind .. " view got the final event", false, r.timed_out and "timed out" or "no final event") end
    if r.modulator_error then check(kind .. " modulator ran", false, r.modulator_error) end
    if not r.bytes then check(kind .. " view has consumer byte counters (c:stats())", false, "c:stats() missing") end
  end
  local rr, dr = reduction(region, full), reduction(diff, full)
  check("region view receives >= 85% fewer bytes than the full view", rr and rr >= 0.85,
        rr and ("%.1f%% fewer (%s vs %s per event)"):format(100 * rr, kb(per_event(region)), kb(per_event(full))))
  check("diff view receives fewer bytes than the region view", dr and rr and dr > rr,
        dr and ("%.1f%% fewer than full (%s per event)"):format(100 * dr, kb(per_event(diff))))
  -- the wire counters (every byte from the simulation's process) agree
  local function wire_red(r) return r.wire and full.wire and r.events > 0 and full.events > 0
    and 1 - (r.wire / r.events) / (full.wire / full.events) end
  local rw, dw = wire_red(region), wire_red(diff)
  if rw and dw then
    check("on the wire too: region >= 85% fewer, diff fewer still", rw >= 0.85 and dw > rw,
          ("region -%.1f%%, diff -%.1f%%"):format(100 * rw, 100 * dw))
  end
  summary.region_reduction, summary.diff_reduction = rr, dr
  summary.region_wire_reduction, summary.diff_wire_reduction = rw or nil, dw or nil

  -- each rebuilt field against the source (the full view's), same step
  local src = full.field
  local function against_source(r, name, bound, what, slack)
    if full.step ~= r.step then
      check(("%s view's field is within %s (%g) of the source"):format(name, what, bound), false,
            ("cannot compare: full at step %s, %s at step %s"):format(tostring(full.step), name, tostring(r.step)))
      return
    end
    local e, why = max_error(src, r.field)
    local red = reduction(r, full)
    check(("%s view's field is within %s (%g) of the source"):format(name, what, bound), e and e <= bound + (slack or 0),
          e and ("max abs error %.6f over %d cells at step %d, %s per event (-%.1f%%)"):format(
            e, #src, full.step, kb(per_event(r)), 100 * (red or 0)) or why)
    return e, red
  end
  local th = diff.threshold or opts.threshold
  summary.max_error, summary.threshold, summary.final_step = against_source(diff, "diff", th, "the threshold"), th, full.step
  local ze, zr = against_source(zfp, "zfp", zfp.tolerance or opts.tolerance, "the tolerance")
  -- (a cell half-way between two steps is off by scale/2 and a rounding)
  local qe, qr = against_source(quant, "quant", (quant.scale or opts.scale) / 2, "scale/2", 1e-12)
  check("zfp and quant views receive fewer bytes than the full view", zr and qr and zr > 0 and qr > 0,
        zr and qr and ("zfp -%.1f%%, quant -%.1f%%"):format(100 * zr, 100 * qr))
  summary.zfp_error, summary.zfp_reduction, summary.quant_error, summary.quant_reduction = ze, zr, qe, qr

  -- the region view's cells against block means of the source, in plain loops
  if full.step == region.step and lecho.array.is(region.field) and region.region and lecho.array.is(src) then
    local model = dofile(here .. "/model.lua")
    local rg, s = region.region, region.region.stride
    local rows, cols = {}, {}
    for i = 1, full.nlat do
      local lat = full.lat0 + (i - 1) * full.dlat
      if lat >= rg.lat_min and lat <= rg.lat_max then rows[#rows + 1] = i end
    end
    for j = 1, full.nlon do
      local lon, w = full.lon0 + (j - 1) * full.dlon, (rg.lon_max - rg.lon_min) % 360
      if w == 0 and rg.lon_max ~= rg.lon_min then w = 360 end
      if (lon - rg.lon_min) % 360 <= w then cols[#cols + 1] = j end
    end
    table.sort(cols, function(a, b)
      return (full.lon0 + (a - 1) * full.dlon - rg.lon_min) % 360 < (full.lon0 + (b - 1) * full.dlon - rg.lon_min) % 360
    end)
    local want, flat = {}, src:ptr()
    for _, k in ipairs(region.levels or {}) do
      for r0 = 1, #rows, s do
        for c0 = 1, #cols, s do
          local sum, m = 0, 0
          for r = r0, math.min(r0 + s - 1, #rows) do
            for c = c0, math.min(c0 + s - 1, #cols) do
              sum = sum + flat[model.index(k, rows[r], cols[c], full.nlat, full.nlon) - 1]
              m = m + 1
            end
          end
          want[#want + 1] = sum / m
        end
      end
    end
    local got = region.field:ptr()
    local maxd = #want == #region.field and 0 or math.huge
    for i = 1, math.min(#want, #region.field) do
      maxd = math.max(maxd, math.abs(want[i] - got[i - 1]))
    end
    check("region view's cells are the block means of the source", maxd < 1e-9,
          ("%d cells, max difference %g"):format(#region.field, maxd))
  end

  if opts.steer then
    -- only valid settings are applied; the simulation logs and ignores the
    -- rest.  Applied: acknowledged by the simulation's handler (sync), and
    -- a later field had them (unless other steering, from the page,
    -- replaced them before a field showed them: the ack then says it)
    local ok = steered_at and steer.acked and (steer.seen or steer.other) and true or false
    local detail
    if not steered_at then detail = "never sent (the full view did not get 40% of the way)"
    elseif not steer.acked then detail = opts.steer_text .. " not acknowledged by the simulation"
    elseif steer.seen then
      detail = ("%s sent after step %d; the field of step %d has it"):format(opts.steer_text, steered_at, steer.seen)
    elseif steer.other then
      detail = ("%s sent after step %d, acknowledged; other steering (%s) replaced it before a field showed it"):format(
        opts.steer_text, steered_at, steer.other)
    else detail = ("%s acknowledged, but no field came after step %d"):format(opts.steer_text, steered_at) end
    check("the simulation applied the steering event", ok, detail)
  end
end

out("checks:")
for _, c in ipairs(summary.checks) do
  out("  %-4s %s%s", c.ok and "ok" or "FAIL", c.name, c.detail and (": " .. c.detail) or "")
end
reports:close()
ctx:close()
finish(summary.ok, summary)
