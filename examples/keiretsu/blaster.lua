-- examples/keiretsu/blaster.lua: a Keiretsu client that sends as fast as it
-- is allowed.  `--help` says more.
local usage = [[
usage: luajit examples/keiretsu/blaster.lua --user NAME --to A,B,... --nodes N1,N2,... --nameserver ADDR [options]

Sends messages to the users --to, in turn, as fast as the service
acknowledges them, with --inflight sends waiting at once.  Each message has
the id NAME:N and is sent through the "im" service with that id as its
idempotency key: a send that fails on one node (killed, connection lost, no
answer) is sent again through another.  An acknowledged message was
delivered: its id goes to --acked.  Prints "ready ADDR", then
"count SECONDS ACKED FAILED RETRIED" every --every seconds; when the file
--stop exists (or after --for seconds) it lets the sends in flight end,
prints "done ACKED FAILED RETRIED" and exits.

  --user NAME          who it is (with keys: the name of its key)
  --to LIST            the recipients, comma-separated
  --nodes LIST         the nodes' names, comma-separated (node-1,...)
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
  ["--nodes"] = function(get, o) o.nodes = list(get.value()) end,
  ["--inflight"] = function(get, o) o.inflight = get.number() end,
  ["--acked"] = function(get, o) o.acked = get.value() end,
  ["--stop"] = function(get, o) o.stop = get.value() end,
  ["--timeout"] = function(get, o) o.timeout = get.number() end,
  ["--every"] = function(get, o) o.every = get.number() end,
  ["--for"] = function(get, o) o.seconds = get.number() end,
})
if not im.valid_user(o.user) then A.die("--user NAME is required (1-64 of A-Z a-z 0-9 . _ -)") end
if not o.to or #o.to == 0 then A.die("--to is required") end
if not o.nodes or #o.nodes == 0 then A.die("--nodes is required") end
local ctx = im.context(A, o)
local transport = dofile(here .. "/transport.lua")
local send, err = transport.sender(ctx, o.nodes, { timeout = o.timeout or 5 })
if not send then A.die("cannot reach the service: " .. tostring(err), 1) end

local acked_f = o.acked and assert(io.open(o.acked, "w"))
local n, acked, failed, retried, running = 0, 0, 0, 0, 0
local stopping = false
local errs = {}
local worker
worker = function()
  running = running + 1
  while not stopping do
    n = n + 1
    local id = o.user .. ":" .. n
    local ok, e, code, tries = send({ from = o.user, to = o.to[n % #o.to + 1], text = "m" .. n, id = id })
    if tries and tries > 1 then retried = retried + 1 end
    if ok then
      acked = acked + 1
      if acked_f then acked_f:write(id, "\n") end
    else
      failed = failed + 1
      local k = tostring(code) .. ": " .. tostring(e):sub(1, 120)
      errs[k] = (errs[k] or 0) + 1
      -- nothing serves now: this sender tries again in 50 ms (not spinning)
      if code == "noservice" then
        running = running - 1
        ctx:after(0.05, worker)
        return
      end
    end
  end
  running = running - 1
end

local t0 = socket.gettime()
im.out("ready %s", ctx.addr)
for _ = 1, o.inflight or 8 do ctx:after(0, worker) end
ctx:every(o.every or 0.25, function()
  im.out("count %.3f %d %d %d", socket.gettime() - t0, acked, failed, retried)
  if acked_f then acked_f:flush() end
  if im.exists(o.stop) then stopping = true end
  if stopping and running == 0 then ctx:stop() end
end)
ctx:after(o.seconds or 600, function() stopping = true end)
ctx:run()
if acked_f then acked_f:close() end
for k, v in pairs(errs) do im.out("error %d %s", v, k) end
im.out("done %d %d %d", acked, failed, retried)
ctx:close{ linger = 0.5 }
