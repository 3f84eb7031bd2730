-- examples/keiretsu/im.lua: what the Keiretsu programs share: their common
-- options, the context they open, the service's name and the message format.
--
--   local im = dofile(here .. "/im.lua")
--   local A, opts = im.args("node", usage, { ["--node"] = function(get, o) o.node = get.value() end })
--   local ctx = im.context(opts)          -- keyed when --key/--trust (or LECHO_KEY/LECHO_TRUST)
--
-- A message is { from = USER, to = USER, text = STRING, id = STRING }; the id
-- is the sender's, unique (USER:N), and is the call's idempotency key: a
-- node may deliver one message twice after a failover, so a reader keeps
-- the ids it saw (speedometer.lua, client.lua).

local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local ARGS = dofile(here .. "/../atmosphere/args.lua")   -- (also puts the tree's lecho on the path)
local lecho = require "lecho"

local M = {}

M.SERVICE = "im"            -- the replica group every node serves
M.GROUP = "im-users"        -- the presence group of the clients
M.LEASE = 3                 -- seconds of a client's presence lease

function M.inbox(user) return "inbox." .. user end

-- User names: what a principal may be (the key's name is the user's name).
function M.valid_user(u)
  return type(u) == "string" and #u >= 1 and #u <= 64 and not u:find("[^%w._-]")
end

M.common_usage = [[
  --nameserver ADDR    the name server, or several: ADDR,ADDR (required;
                       channels live at the first, the service and the
                       presence group at every one)
  --listen ADDR        this process's listen address (default 127.0.0.1:0;
                       off loopback a key is needed)
  --key FILE           its secret key (default: $LECHO_KEY)
  --trust FILE         the keys it trusts (default: $LECHO_TRUST)
  --verbose            the lecho log on stderr
  --help               this text
]]

--- Parses argv with the common options and the program's own; returns the
-- args object (A.die) and the options table.
function M.args(prog, usage, own)
  local A = ARGS.new(prog, usage)
  local o = { listen = "127.0.0.1:0" }
  local h = {
    ["--nameserver"] = function(get) o.nameserver = get.value() end,
    ["--listen"] = function(get) o.listen = get.value() end,
    ["--key"] = function(get) o.key = get.value() end,
    ["--trust"] = function(get) o.trust = get.value() end,
    ["--verbose"] = function() o.verbose = true end,
  }
  for k, f in pairs(own or {}) do h[k] = function(get) f(get, o) end end
  A.parse(arg, h)
  if not o.nameserver then A.die("--nameserver is required\n" .. usage) end
  return A, o
end

--- The process's context (dies with the reason when it cannot start).
function M.context(A, o, extra)
  local nslist = {}
  for a in o.nameserver:gmatch("[^,]+") do nslist[#nslist + 1] = a end
  local copts = { nameserver = #nslist > 1 and nslist or o.nameserver, listen = o.listen, quiet = not o.verbose,
                  key = o.key, trust = o.trust }
  for k, v in pairs(extra or {}) do copts[k] = v end
  local ok, ctx = pcall(lecho.context, copts)
  if not ok then A.die(ctx, 1) end
  return ctx
end

--- An error value as text: a node refuses with a table { code =, user =, why = }.
function M.errtext(e)
  if type(e) ~= "table" then return tostring(e) end
  local t = { tostring(e.code) }
  if e.user then t[#t + 1] = tostring(e.user) end
  if e.why then t[#t + 1] = tostring(e.why) end
  return table.concat(t, ": ")
end

function M.exists(path)
  local f = path and io.open(path, "r")
  if f then f:close() return true end
  return false
end

function M.out(fmt, ...)
  io.stdout:write(fmt:format(...), "\n")
  io.stdout:flush()
end

return M
