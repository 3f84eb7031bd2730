-- examples/keiretsu/blaster.lua: a Keiretsu client that sends as fast as it
-- is allowed.  `--help` says more.
local usage = [[
usage: luajit examples/keiretsu/blaster.lua --user NAME --to A,B,... --nameserver ADDR [options]

Sends messages to the users --to, in turn, as fast as the service
acknowledges them, with --inflight sends waiting at once.  Each message has
the id NAME:N and is sent through the "im" service with that id as its
idempotency key: a send that fails on one node (killed, connection lost, no
answer, busy) is sent again through another.  An acknowledged message was
delivered: its id goes to --acked.  Prints "ready ADDR", then
"count SECONDS ACKED FAILED" every --every seconds; when the file --stop
exists (or after --for seconds) it lets the sends in flight end, prints
"error N CODE: WHY" for each kind of failed send, "done ACKED FAILED" and
exits.

  --user NAME          who it is (with keys: the name of its key)
  --to LIST            the recipients, comma-separated
  --inflight N         sends waiting at once (default 8)
  --acked FILE         where to write the ids acknowledged, one a line
  --stop FILE          stop when this file exists
  --timeout SECONDS    a send's wait for its answer (default 5)
  --every SECONDS      how often to print the count (default 0.25)
  --for SECONDS        exit after this long (default 600)
]] .. "\nCommon options:\n"
local here = (arg and arg[0] or ""):match("^(.*)/[^/]*$") or "."
local im = dofile(here .. "/im.lua")
usage = usage .. im.common_usage
local socket = require "socket"

local function list(s)
  local t = {}
  for w in s:gmatch("[^,]+") do t[#t + 1] = w end
  return t
end

local A, o = im.args("blaster", usage, {
  ["--user"] = function(get, o) o.user = get.value() end,
  ["--to"] = function(get, o) o.to = list(get.value()) end,
  ["--inflight"] = function(get, o) o.inflight = get.number() end,
  ["--acked"] = function(get, o) o.acked = get.value() end,
  ["--stop"] = function(get, o) o.stop = get.value() end,
  ["--timeout"] = function(get, o) o.timeout = get.number() end,
  ["--every"] = function(get, o) o.every = get.number() end,
  ["--for"] = function(get, o) o.seconds = get.number() end,
})
if not im.valid_user(o.user) then A.die("--user NAME is required (1-64 of A-Z a-z 0-9 . _ -)") end
if not o.to or #o.to == 0 then A.die("--to is required") end
local ctx = im.context(A, o)
local transport = dofile(here .. "/transport.lua")
local send = transport.sender(ctx, { timeout = o.timeout or 5 })

local acked_f = o.acked and assert(io.open(o.acked, "w"))
local n, acked, failed, running = 0, 0, 0, 0
local stopping = false
local errs = {}
local function worker()
  running = running + 1
  while not stopping do
    n = n + 1
    local id = o.user .. ":" .. n
    local ok, e, code = send({ from = o.user, to = o.to[n % #o.to + 1], text = "m" .. n, id = id })
    if ok then
      acked = acked + 1
      if acked_f then acked_f:write(id, "\n") end
    else
      failed = failed + 1
      local k = tostring(code) .. ": " .. im.errtext(e):sub(1, 120)
      errs[k] = (errs[k] or 0) + 1
      -- nothing serves now: wait a little (not spinning)
      if code == "noservice" then ctx:sleep(0.05) end
    end
  end
  running = running - 1
end

local t0 = socket.gettime()
im.out("ready %s", ctx.addr)
for _ = 1, o.inflight or 8 do ctx:after(0, worker) end
ctx:every(o.every or 0.25, function()
  im.out("count %.3f %d %d", socket.gettime() - t0, acked, failed)
  if acked_f then acked_f:flush() end
  if im.exists(o.stop) then stopping = true end
  if stopping and running == 0 then ctx:stop() end
end)
ctx:after(o.seconds or 600, function() stopping = true end)
ctx:run()
if acked_f then acked_f:close() end
for k, v in pairs(errs) do im.out("error %d %s", v, k) end
im.out("done %d %d", acked, failed)
ctx:close{ linger = 0.5 }
