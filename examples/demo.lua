-- examples/demo.lua (make demo): a simulation streams a layered field on the
-- "field" channel to two viewer processes, with live counters, and stops
-- them all after a few seconds.  The name server runs inside this process
-- unless LECHO_NAMESERVER=HOST:PORT names one.
local lecho = require "lecho"
local SECONDS = tonumber(os.getenv("DEMO_SECONDS")) or 6
local ROWS, COLS, RATE = 32, 64, 20 -- grid, steps per second

local ctx = lecho.context{ nameserver = os.getenv("LECHO_NAMESERVER") }
local ns = ctx.ns
print(("lecho demo: name server %s, field %dx%d at %d steps/s for %ds"):format(
  ns, ROWS, COLS, RATE, SECONDS))

-- Viewers report on "viewers"; the live table is printed once a second.
local seen, finished = {}, 0
ctx:channel("viewers"):consumer(function(r)
  seen[r.viewer] = r
  if r.done then finished = finished + 1 end
end)

local field = ctx:channel("field")
local p = assert(field:producer())

local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "examples"
local kids = {}
for i = 1, 2 do
  local cmd = ("luajit %s/field_viewer.lua %s viewer%d & echo $!"):format(here, ns, i)
  local f = io.popen(cmd)
  kids[i] = f:read("*l")
  f:close()
end

-- Wait until both viewers are subscribed: their consumers join the channel.
local deadline = ctx:now() + 20
while ctx:now() < deadline do
  local chans = ctx:list()
  local info = chans and chans[field.name]
  local n = 0
  for _ in pairs(info and info.consumers or {}) do n = n + 1 end
  if n >= 2 then break end
  ctx:run_once(0.1)
end

local step, t0 = 0, ctx:now()
local sim = ctx:every(1 / RATE, function()
  step = step + 1
  local rows = {}
  for r = 1, ROWS do
    local row = {}
    for c = 1, COLS do
      row[c] = 300 + 20 * math.sin(r / 5 + step / 10) * math.cos(c / 7)
    end
    rows[r] = row
  end
  p:submit{ step = step, rows = rows }
end)

local live = ctx:every(1.0, function()
  local st = ctx:stats()
  local fs = st.channels[field.name]
  local line = { ("t=%4.1fs steps=%d sent=%d (%.1f MB)"):format(
    ctx:now() - t0, step, fs.events_out, fs.bytes_out / 1e6) }
  for _, name in ipairs{ "viewer1", "viewer2" } do
    local r = seen[name]
    line[#line + 1] = r and ("%s: %d steps, mean %.2f"):format(name, r.steps, r.mean)
                      or (name .. ": starting")
  end
  print(table.concat(line, " | "))
end)

ctx:after(SECONDS, function() ctx:stop() end)
ctx:run()
sim:stop()
live:stop()

-- Stop the viewers and wait (bounded) for their final reports.
assert(p:submit_sync("stop", { timeout = 5 }))
deadline = ctx:now() + 10
while finished < 2 and ctx:now() < deadline do ctx:run_once(0.1) end
for _, name in ipairs{ "viewer1", "viewer2" } do
  local r = seen[name]
  print(("%s received %d of %d steps"):format(name, r and r.steps or 0, step))
end
for _, pid in ipairs(kids) do os.execute("kill " .. pid .. " 2>/dev/null") end
ctx:close()
if finished < 2 then os.exit(1) end
