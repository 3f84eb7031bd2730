-- examples/keiretsu/node.lua: one Keiretsu node, a replica of the "im"
-- service.  `--help` says more.
local usage = [[
usage: luajit examples/keiretsu/node.lua --name NAME --nameserver ADDR [options]

A Keiretsu node: serves the replica group "im" (every node serves the same
name; callers balance over them and fail over).  A call is a message
{ to = USER, text = STRING, id = STRING }; the node delivers it to the
recipient's inbox channel "inbox.USER" with a sync submit, and answers only
once the recipient's client has handled it: an acknowledged message is a
delivered one.  A recipient that is not online is refused ("offline").
Prints "ready ADDR" once it serves, then runs until killed or --for.

  --name NAME          this node's name (node-1 ...)
  --for SECONDS        exit after this long (default 600)
]] .. "\n" .. [[
Common options:
]]
local here = (arg and arg[0] or ""):match("^(.*)/[^/]*$") or "."
local im = dofile(here .. "/im.lua")
usage = usage .. im.common_usage

local A, o = im.args("node", usage, {
  ["--name"] = function(get, o) o.name = get.value() end,
  ["--for"] = function(get, o) o.seconds = get.number() end,
})
if not o.name then A.die("--name is required\n" .. usage) end
local ctx = im.context(A, o)
local transport = dofile(here .. "/transport.lua")

-- The inbox producers, one per recipient, made at its first message (the
-- context owns them; closed with it).
local inboxes, delivered = {}, 0
local function inbox(to)
  local p = inboxes[to]
  if p == nil then
    local err, code
    p, err, code = ctx:channel(im.inbox(to)):producer()
    if not p then error(("cannot deliver to %s: %s (%s)"):format(to, tostring(err), tostring(code)), 0) end
    inboxes[to] = p
  end
  return p
end

local function handle(msg, caller)
  if type(msg) ~= "table" or not im.valid_user(msg.to) or type(msg.text) ~= "string"
     or #msg.text > 4096 or type(msg.id) ~= "string" or #msg.id > 200 then
    error("bad message: want { to = USER, text = STRING (<= 4096 bytes), id = STRING }", 0)
  end
  local from = caller or msg.from
  if not im.valid_user(from) then error("bad message: no sender", 0) end
  local p = inbox(msg.to)
  if not transport.has_consumer(p) then error("offline: " .. msg.to .. " is not online", 0) end
  local ok, err = p:submit_sync({ from = from, text = msg.text, id = msg.id }, { timeout = 5 })
  if not ok then error(("not delivered to %s: %s"):format(msg.to, tostring(err)), 0) end
  delivered = delivered + 1
  return true
end

local served, err = transport.serve(ctx, o.name, handle)
if not served then A.die(("cannot serve %s: %s"):format(im.SERVICE, tostring(err)), 1) end
im.out("ready %s %s", ctx.addr, transport.kind)
ctx:after(o.seconds or 600, function() ctx:stop() end)
ctx:run()
im.out("delivered %d", delivered)
ctx:close{ linger = 0.5 }
