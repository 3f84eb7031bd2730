-- examples/field_viewer.lua: a viewer process of the demo.  It subscribes to
-- the "field" channel, keeps a running mean of the field, and reports its
-- counters once a second on the "viewers" channel.
--   luajit examples/field_viewer.lua NAMESERVER NAME
local lecho = require "lecho"
local ns, name = arg[1], arg[2] or "viewer"
local ctx = lecho.context{ nameserver = ns }
local n, bytes, mean = 0, 0, 0
local report = assert(ctx:channel("viewers"):producer())
ctx:channel("field"):consumer(function(ev)
  if ev == "stop" then ctx:stop() return end
  n = n + 1
  local sum, cells = 0, 0
  for _, row in ipairs(ev.rows) do
    for _, v in ipairs(row) do sum = sum + v; cells = cells + 1 end
  end
  bytes = bytes + cells * 8
  mean = sum / cells
end)
ctx:every(1.0, function()
  report:submit{ viewer = name, steps = n, cells_mb = bytes / 1e6, mean = mean }
end)
ctx:after(60, function() ctx:stop() end) -- bound: never outlive the demo
ctx:run()
report:submit_sync{ viewer = name, steps = n, cells_mb = bytes / 1e6, mean = mean, done = true }
ctx:close()
