-- examples/services/echo.lua: services and calls (doc/services.md).
--
--   luajit examples/services/echo.lua                 the whole tour in one process
--   luajit examples/services/echo.lua --serve NS      serve echo@1 and echo@2 at name server NS
--   luajit examples/services/echo.lua --call NS       the caller's half of the tour, against NS
--
-- It serves "echo" in two versions, calls it (results, an error that is a
-- table, a string error with its traceback, versions exact and minimum, a
-- refusal naming the versions, "no service" at once), then calls many at
-- once without waiting.  Every line it prints says what happened.

do
  -- from a checkout: the tree two folders up (no LUA_PATH needed)
  local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
  local root = here .. "/../.."
  local f = io.open(root .. "/lua/lecho/init.lua", "r")
  if f then
    f:close()
    package.path = root .. "/lua/?.lua;" .. root .. "/lua/?/init.lua;" .. package.path
    package.cpath = root .. "/lua/?.so;" .. package.cpath
  end
end

local lecho = require "lecho"
io.stdout:setvbuf("line")

local mode, ns = arg[1], arg[2]
if mode == "--help" or mode == "-h" or (mode and mode ~= "--serve" and mode ~= "--call") or (mode and not ns) then
  io.stderr:write("usage: echo.lua [--serve NAMESERVER | --call NAMESERVER]\n")
  os.exit(mode == "--help" or mode == "-h" and 0 or 2)
end

-- no name server given: this context is its own
local ctx = lecho.context{ nameserver = ns, quiet = true }

local function serve()
  assert(ctx:service("echo", function(args, meta)
    if args.fail == "table" then error({ code = 400, why = "no x" }) end
    if args.fail == "string" then error("x must be a number") end
    return args.x, ("echo@1 at %s, called by %s"):format(ctx.addr, meta.caller)
  end, { version = 1 }))
  assert(ctx:service("echo", function(args, meta)
    ctx:sleep(args.wait or 0)       -- a handler may wait: only this call does
    return args.x * 2, ("echo@2 at %s"):format(ctx.addr)
  end, { version = 2, concurrency = 8, queue = 8 }))
end

local function show(what, ...)
  local out = {}
  for i = 1, select("#", ...) do
    local v = select(i, ...)
    out[i] = type(v) == "table" and ("{ code = %s, why = %s }"):format(tostring(v.code), tostring(v.why))
             or (i == 4 and v ~= nil) and "(its traceback)" or tostring(v)
  end
  print(("%-34s -> %s"):format(what, table.concat(out, ", ")))
end

local function tour()
  show("call echo {x=21} (highest: 2)", ctx:call("echo", { x = 21 }))
  show("call echo {x=21} version=1", ctx:call("echo", { x = 21 }, { version = 1 }))
  show("call echo min_version=2", ctx:call("echo", { x = 5 }, { min_version = 2 }))
  show("an error that is a table", ctx:call("echo", { fail = "table" }, { version = 1 }))
  show("a string error", ctx:call("echo", { fail = "string" }, { version = 1 }))
  show("version=3", ctx:call("echo", { x = 1 }, { version = 3 }))
  local t0 = ctx:now()
  local r = { ctx:call("nosuch", {}, { timeout = 5 }) }
  show(("no such service (%.2f s)"):format(ctx:now() - t0), unpack(r, 1, 3))
  -- 32 calls at once, 16 of them past echo@2's concurrency + queue: busy at once
  local ok, busy, n = 0, 0, 0
  for i = 1, 32 do
    ctx:call_async("echo", { x = i, wait = 0.2 }, { version = 2 }, function(r1, _, code)
      n = n + 1
      if r1 then ok = ok + 1 elseif code == "busy" then busy = busy + 1 end
    end)
  end
  while n < 32 do ctx:run_once(0.05) end
  print(("32 calls at once                   -> %d answered, %d refused busy at once"):format(ok, busy))
end

if mode == "--serve" then
  serve()
  print("serving echo@1 and echo@2 at " .. ctx.addr)
  ctx:run()
elseif mode == "--call" then
  tour()
else
  serve()
  tour()
end
ctx:close()
