-- examples/c/viewer.lua: a Lua viewer of the C heat simulation (heat.c).
local usage = [[
usage: luajit examples/c/viewer.lua --nameserver HOST:PORT [options]

Subscribes to "heat.field", prints a summary line every --every steps, and
steers the simulation on "heat.steer": { run = true } once subscribed (for
heat --wait), then { alpha = X } when it has seen step --steer-at.  With
--bad it first sends steering events with a misspelled key, a number key and
a boolean key, and prints the simulation's refusals.  On the last step (--steps) it prints
  viewer: N steps in order, alpha A1 until step S1, A2 from step S2
and exits 0 if every step arrived in order and the steering took effect.

  --nameserver HOST:PORT  the simulation's name server (required)
  --steps N               the simulation's step count (default 100)
  --steer-at N            steer after step N (default 30; 0: never)
  --alpha X               the new alpha (default 0.4)
  --every N               a summary line every N steps (default 10)
  --bad                   also send { alpah = 1 }, { 0.4 } and
                          { alpha = 0.3, [true] = 1 }; print the refusals
  --seconds S             give up after S seconds (default 30)
  --help                  this text
]]

-- From a checkout, find lecho in ../../lua when it is not on the paths.
local here = (arg and arg[0] or ""):match("^(.*)/[^/]*$") or "."
package.path = package.path .. (";%s/../../lua/?.lua;%s/../../lua/?/init.lua"):format(here, here)
package.cpath = package.cpath .. (";%s/../../lua/?.so"):format(here)
local lecho = require "lecho"

local function die(msg)
  io.stderr:write("viewer: ", msg, "\n")
  os.exit(2)
end

local opts = { steps = 100, steer_at = 30, alpha = 0.4, every = 10, seconds = 30 }
do
  local i = 1
  local function num(name)
    i = i + 1
    local v = tonumber(arg[i])
    if not v then die(name .. " wants a number") end
    return v
  end
  while i <= #arg do
    local a = arg[i]
    if a == "--help" then io.stdout:write(usage); os.exit(0)
    elseif a == "--nameserver" then i = i + 1; opts.nameserver = arg[i]
    elseif a == "--steps" then opts.steps = num(a)
    elseif a == "--steer-at" then opts.steer_at = num(a)
    elseif a == "--alpha" then opts.alpha = num(a)
    elseif a == "--every" then opts.every = num(a)
    elseif a == "--seconds" then opts.seconds = num(a)
    elseif a == "--bad" then opts.bad = true
    else die("unknown option " .. tostring(a) .. "\n" .. usage) end
    i = i + 1
  end
  if not opts.nameserver then die("--nameserver HOST:PORT is required\n" .. usage) end
end

local ctx = lecho.context{ nameserver = opts.nameserver, quiet = true }
local steer = ctx:channel("heat.steer"):producer()

local seen, in_order, last = 0, true, nil
local alphas = {}      -- { { alpha, first step } ... } as the events tell
local want_steer = false
local consumer = ctx:channel("heat.field"):consumer(function(ev)
  seen = seen + 1
  if ev.step ~= seen then in_order = false end
  if #alphas == 0 or alphas[#alphas][1] ~= ev.alpha then alphas[#alphas + 1] = { ev.alpha, ev.step } end
  if opts.every > 0 and ev.step % opts.every == 0 then
    -- u is a typed array (lecho.array): indices from 0
    print(("step %4d  alpha %.3g  mean %8.4f  max %8.4f  u[mid] %8.4f  u %s [%d]"):format(
      ev.step, ev.alpha, ev.mean, ev.max, ev.u:get(math.floor(#ev.u / 2)), ev.u:dtype(), #ev.u))
  end
  if ev.step == opts.steer_at then want_steer = true end
  last = ev
end)
assert(consumer, "cannot subscribe to heat.field")

-- A steering event: true, or prints what the simulation said.
local function send(ev, what)
  local ok, err = steer:submit_sync(ev, { timeout = 5 })
  if ok then
    print(("steered: %s"):format(what))
  else
    print(("steering %s refused: %s"):format(what, tostring(err)))
  end
  return ok
end

if opts.bad then
  send({ alpah = 1 }, "{ alpah = 1 }")
  send({ 0.4 }, "{ 0.4 }")
  send({ alpha = 0.3, [true] = 1 }, "{ alpha = 0.3, [true] = 1 }")
end
send({ run = true }, "{ run = true }")

local deadline = ctx:now() + opts.seconds
while not (last and last.step >= opts.steps) and ctx:now() < deadline do
  ctx:run_once(0.05)
  if want_steer then
    want_steer = false
    send({ alpha = opts.alpha }, ("{ alpha = %g }"):format(opts.alpha))
  end
end

local parts = {}
for i, a in ipairs(alphas) do
  parts[#parts + 1] = i == 1 and ("alpha %g until step %d"):format(a[1], (alphas[2] or { 0, seen + 1 })[2] - 1)
    or ("%g from step %d"):format(a[1], a[2])
end
print(("viewer: %d steps %s, %s"):format(seen, in_order and "in order" or "OUT OF ORDER",
  table.concat(parts, ", ")))
consumer:close()
steer:close()
ctx:close{ linger = 0.5 }
local steered = opts.steer_at == 0 or (#alphas == 2 and alphas[2][1] == opts.alpha
  and alphas[2][2] > opts.steer_at)
os.exit((seen == opts.steps and in_order and steered) and 0 or 1)
