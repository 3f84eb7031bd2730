-- examples/keiretsu/speedometer.lua: a Keiretsu client that only reads and
-- counts.  `--help` says more.
local usage = [[
usage: luajit examples/keiretsu/speedometer.lua --user NAME --nameserver ADDR [options]

Goes online as NAME (consumes its inbox "inbox.NAME", joins the presence
group "im-users") and counts the
messages it receives, each id once (after a failover a node may deliver a
message twice: the second copy is counted as a duplicate, not a message).
Prints "ready ADDR", then "count SECONDS MESSAGES DUPLICATES" every
--every seconds; when the file --stop exists (or after --for seconds) it
writes every id received to --ids, prints
"done MESSAGES DUPLICATES" and exits.

  --user NAME          who it is (with keys: the name of its key)
  --ids FILE           where to write the ids received, one a line
  --stop FILE          stop when this file exists
  --every SECONDS      how often to print the count (default 0.25)
  --for SECONDS        exit after this long (default 600)
]] .. "\nCommon options:\n"
local here = (arg and arg[0] or ""):match("^(.*)/[^/]*$") or "."
local im = dofile(here .. "/im.lua")
usage = usage .. im.common_usage
local socket = require "socket"

local A, o = im.args("speedometer", usage, {
  ["--user"] = function(get, o) o.user = get.value() end,
  ["--ids"] = function(get, o) o.ids = get.value() end,
  ["--stop"] = function(get, o) o.stop = get.value() end,
  ["--every"] = function(get, o) o.every = get.number() end,
  ["--for"] = function(get, o) o.seconds = get.number() end,
})
if not im.valid_user(o.user) then A.die("--user NAME is required (1-64 of A-Z a-z 0-9 . _ -)") end
local ctx = im.context(A, o)

local seen, count, dups = {}, 0, 0
local c, err = ctx:channel(im.inbox(o.user)):consumer(function(m)
  local id = type(m) == "table" and m.id
  if type(id) ~= "string" then return end
  if seen[id] then dups = dups + 1 return end
  seen[id] = true
  count = count + 1
end)
if not c then A.die("cannot go online: " .. tostring(err), 1) end
local online, why = dofile(here .. "/presence.lua").join(ctx, o.user)
if not online then A.die("cannot go online: " .. tostring(why), 1) end

local t0 = socket.gettime()
im.out("ready %s", ctx.addr)
ctx:every(o.every or 0.25, function()
  im.out("count %.3f %d %d", socket.gettime() - t0, count, dups)
  if im.exists(o.stop) then ctx:stop() end
end)
ctx:after(o.seconds or 600, function() ctx:stop() end)
ctx:run()
online:leave()
c:close()
if o.ids then
  local f = assert(io.open(o.ids, "w"))
  for id in pairs(seen) do f:write(id, "\n") end
  f:close()
end
im.out("done %d %d", count, dups)
ctx:close{ linger = 0.5 }
