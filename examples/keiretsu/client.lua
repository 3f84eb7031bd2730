-- examples/keiretsu/client.lua: a Keiretsu user.  `--help` says more.
local usage = [[
usage: luajit examples/keiretsu/client.lua --user NAME --nameserver ADDR [--who] [--send USER --text TEXT] [--wait SECONDS] [options]

Goes online as NAME (with keys, NAME is the name of its key: that is how a
user identifies itself) and prints "online as NAME", then, in this order:
  --who                prints "who is online: USER USER ..."
  --send USER          sends --text to USER through the "im" service and
  --text TEXT          prints "sent ID to USER: acknowledged" once USER's
                       client has it, or "not sent to USER: WHY (CODE)"
  --wait SECONDS       prints "from USER: TEXT" for each message received
                       during that long (each id once)
  --count N            with --wait: stop once N messages were received
  --watch              with --wait: also prints "joined USER" and
                       "left USER (WHY)" as others come and go (WHY:
                       "left", or "expired" when its lease ran out)
Exits 0, or 1 when a send was not acknowledged.
]] .. "\nCommon options:\n"
local here = (arg and arg[0] or ""):match("^(.*)/[^/]*$") or "."
local im = dofile(here .. "/im.lua")
usage = usage .. im.common_usage

local A, o = im.args("client", usage, {
  ["--user"] = function(get, o) o.user = get.value() end,
  ["--who"] = function(_, o) o.who = true end,
  ["--send"] = function(get, o) o.send = get.value() end,
  ["--text"] = function(get, o) o.text = get.value() end,
  ["--wait"] = function(get, o) o.listen_s = get.number() end,
  ["--count"] = function(get, o) o.count = get.number() end,
  ["--watch"] = function(_, o) o.watch = true end,
})
if not im.valid_user(o.user) then A.die("--user NAME is required (1-64 of A-Z a-z 0-9 . _ -)") end
if o.send and not o.text then A.die("--send needs --text") end
local ctx = im.context(A, o)
local transport = dofile(here .. "/transport.lua")
local presence = dofile(here .. "/presence.lua")

local seen, got = {}, 0
local c, err = ctx:channel(im.inbox(o.user)):consumer(function(m)
  if type(m) ~= "table" or type(m.id) ~= "string" or seen[m.id] then return end
  seen[m.id] = true
  got = got + 1
  im.out("from %s: %s", tostring(m.from), tostring(m.text))
  if o.count and got >= o.count then ctx:stop() end
end)
if not c then A.die("cannot go online: " .. tostring(err), 1) end
local online, why = presence.join(ctx, o.user, o.watch and function(user, what, how)
  if user == o.user then return end
  if what == "joined" then im.out("joined %s", user) else im.out("left %s (%s)", user, how) end
end)
if not online then A.die("cannot go online: " .. tostring(why), 1) end
im.out("online as %s", o.user)

local rc = 0
if o.who then
  local users
  users, why = presence.list(online)
  if not users then A.die("cannot list who is online: " .. tostring(why), 1) end
  im.out("who is online: %s", table.concat(users, " "))
end
if o.send then
  local send = transport.sender(ctx)
  local id = ("%s:%.6f"):format(o.user, require("socket").gettime())
  local ok, e, code = send({ from = o.user, to = o.send, text = o.text, id = id })
  if ok then
    im.out("sent %s to %s: acknowledged", id, o.send)
  else
    im.out("not sent to %s: %s (%s)", o.send, im.errtext(e), tostring(code))
    rc = 1
  end
end
if o.listen_s and o.listen_s > 0 and not (o.count and got >= o.count) then
  ctx:after(o.listen_s, function() ctx:stop() end)
  ctx:run()
end
online:leave()
c:close()
ctx:close{ linger = 0.5 }
os.exit(rc)
