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
-- context owns them; closed with it).  At most MAX_INBOXES: past them every
-- one is closed and they are made again as messages come (a caller naming
-- ever new recipients costs a bounded amount).  false: being made (a
-- second call for the same recipient waits for the first's).
local MAX_INBOXES = 4096
local inboxes, ninboxes, delivered = {}, 0, 0
local function inbox(to)
  while inboxes[to] == false do ctx:sleep(0.01) end
  local p = inboxes[to]
  if p then return p end
  if ninboxes >= MAX_INBOXES then
    for _, q in pairs(inboxes) do if q then q:close() end end
    inboxes, ninboxes = {}, 0
  end
  inboxes[to], ninboxes = false, ninboxes + 1
  local err, code
  p, err, code = ctx:channel(im.inbox(to)):producer()
  inboxes[to] = p or nil
  if not p then
    ninboxes = ninboxes - 1
    error({ code = "undelivered", user = to, why = tostring(err) .. " (" .. tostring(code) .. ")" })
  end
  return p
end

-- The call's handler: runs in a coroutine of its own (up to
-- transport.CONCURRENCY at once); raises a table { code =, ... } to refuse,
-- which the caller gets as its error value.
local function handle(msg, caller)
  if type(msg) ~= "table" or not im.valid_user(msg.to) or type(msg.text) ~= "string"
     or #msg.text > 4096 or type(msg.id) ~= "string" or #msg.id > 200 then
    error({ code = "bad", why = "want { to = USER, text = STRING (<= 4096 bytes), id = STRING }" })
  end
  -- keyed, the caller is its key's name: the sender is who it proved to be
  -- (unkeyed, a "host:port": the sender is who it says)
  local from = im.valid_user(caller) and caller or msg.from
  if not im.valid_user(from) then error({ code = "bad", why = "no sender" }) end
  local p = inbox(msg.to)
  -- (4 s: the node answers "undelivered" before the caller's 5 s are up)
  local ok, err, code = p:submit_sync({ from = from, text = msg.text, id = msg.id }, { timeout = 4 })
  if not ok then
    if code == "noconsumer" then error({ code = "offline", user = msg.to }) end
    error({ code = "undelivered", user = msg.to, why = tostring(err) })
  end
  delivered = delivered + 1
  return true
end

local served, err = transport.serve(ctx, handle)
if not served then A.die(("cannot serve %s: %s"):format(im.SERVICE, tostring(err)), 1) end
im.out("ready %s", ctx.addr)
ctx:after(o.seconds or 600, function() ctx:stop() end)
ctx:run()
im.out("delivered %d", delivered)
ctx:close{ linger = 0.5 }
