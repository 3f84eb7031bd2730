-- python/tests/peer.lua: the Lua side of the Python package's tests, one
-- process per role (run with the checkout's LUA_PATH/LUA_CPATH):
--   luajit peer.lua produce NS CHANNEL N      waits for a consumer (sync pings),
--       submits { k = 1..N, pad = 48 bytes }, then a sync { final = true };
--       prints "sync true" or "sync nil MSG CODE" for each sync submit it makes
--   luajit peer.lua arrays NS CHANNEL N       as produce, with arrays: field (<f8 64x128,
--       element i = k * 100000 + i) and small (<i2 { k, -k, 7 })
--   luajit peer.lua big NS CHANNEL N BYTES [sparse|paced]   as produce, with { k, field = <f8
--       array of BYTES bytes, element i = k * 1e7 + i (sparse: the first 16 only, the rest 0) } (a
--       read buffer of its own at the consumer: adopted); paced: each event by submit_sync, the
--       next one sent once it was handled
--   luajit peer.lua steer NS CHANNEL          submit_sync { alpha = 0.5 }, then
--       { alpha = "bad" }: prints each result, "ok" or "failed CODE MSG"
--   luajit peer.lua syncs NS CHANNEL N        waits for a consumer, then submit_sync { k = k }
--       for k = 1..N one after the other: prints "sync K ok SECONDS" or
--       "sync K failed SECONDS MESSAGE" (SECONDS: how long the call took)
--   luajit peer.lua two NS A B                 waits for consumers of A and B; submit_sync { k = 1 }
--       on A in a coroutine, then 0.2 s later { k = 2 } on B: prints "B ok|failed SECONDS",
--       then "A ok|failed SECONDS" (or "A waiting" after 10 s)
--   luajit peer.lua consume NS CHANNEL N      prints each event's k and text (an array:
--       "DTYPE AxB sum=S"), "final" at
--       { final = true } (answering its sync), then exits after N events or final
--   luajit peer.lua serve NS NAME             serves NAME: returns args.x * 2,
--       raises { code = 400 } when args.x is not a number; prints "ready"
--   luajit peer.lua slow NS NAME              consumes NAME and serves NAME, each handler sleeping
--       200 s (never answering in a test's time); prints "ready"
--   luajit peer.lua call NS NAME X            prints the call's results or its error
io.stdout:setvbuf("line")
local lecho = require "lecho"
local role, ns, name = arg[1], arg[2], arg[3]
local ctx = lecho.context{ nameserver = ns, quiet = true }

local function wait_consumer(p)
  for _ = 1, 200 do
    if p:submit_sync({ ping = true }, { timeout = 2 }) then return true end
    ctx:sleep(0.05) -- "noconsumer" until the test's consumer joined
  end
  error("no consumer came")
end

if role == "produce" then
  local p = assert(ctx:channel(name):producer())
  wait_consumer(p)
  for k = 1, tonumber(arg[4]) do
    assert(p:submit({ k = k, pad = ("x"):rep(48) }))
  end
  print("sync", p:submit_sync({ final = true }, { timeout = 10 }))
elseif role == "arrays" then
  -- { k, field = <f8 array 64x128 (64 KiB: a view at the receiver), small = <i2 {3} } each
  local p = assert(ctx:channel(name):producer())
  wait_consumer(p)
  for k = 1, tonumber(arg[4]) do
    local a = lecho.array.new("<f8", { 64, 128 })
    local ptr = a:ptr()
    for i = 0, 64 * 128 - 1 do ptr[i] = k * 100000 + i end
    assert(p:submit({ k = k, field = a, small = lecho.array.from({ k, -k, 7 }, "<i2") }))
  end
  print("sync", p:submit_sync({ final = true }, { timeout = 10 }))
elseif role == "big" then
  local p = assert(ctx:channel(name):producer())
  wait_consumer(p)
  local m = tonumber(arg[5]) / 8
  local sparse = arg[6] == "sparse"
  local pool = {} -- sparse: 32 arrays reused (a fresh one's page faults made the producer the bottleneck)
  for k = 1, tonumber(arg[4]) do
    local a = sparse and pool[k % 32] or lecho.array.new("<f8", { m })
    if sparse then pool[k % 32] = a end
    local ptr = a:ptr()
    for i = 0, (sparse and 16 or m) - 1 do ptr[i] = k * 1e7 + i end
    if arg[6] == "paced" then
      assert(p:submit_sync({ k = k, field = a }, { timeout = 30 }))
    else
      assert(p:submit({ k = k, field = a }))
    end
    -- lent until written (the submit rule): a sync ping after every 32, then they may change
    if sparse and k % 32 == 0 then assert(p:submit_sync({ ping = true }, { timeout = 30 })) end
  end
  print("sync", p:submit_sync({ final = true }, { timeout = 60 }))
elseif role == "steer" then
  local p = assert(ctx:channel(name):producer())
  wait_consumer(p)
  for _, v in ipairs{ 0.5, "bad" } do
    local ok, errs, code = p:submit_sync({ alpha = v }, { timeout = 5 })
    if ok then print("ok") else print("failed", code, errs[1] and errs[1].err or tostring(errs)) end
  end
elseif role == "syncs" then
  local p = assert(ctx:channel(name):producer())
  wait_consumer(p)
  for k = 1, tonumber(arg[4]) do
    local t0 = ctx:now()
    local ok, errs = p:submit_sync({ k = k }, { timeout = 10 })
    local dt = ("%.3f"):format(ctx:now() - t0)
    if ok then print("sync", k, "ok", dt)
    else print("sync", k, "failed", dt, type(errs) == "table" and errs[1] and errs[1].err or tostring(errs)) end
  end
elseif role == "two" then
  local pa = assert(ctx:channel(name):producer())
  local pb = assert(ctx:channel(arg[4]):producer())
  wait_consumer(pa)
  wait_consumer(pb)
  local a_done = false
  ctx:after(0, function()
    local t0 = ctx:now()
    local ok = pa:submit_sync({ k = 1 }, { timeout = 10 })
    print("A", ok and "ok" or "failed", ("%.3f"):format(ctx:now() - t0))
    a_done = true
  end)
  ctx:sleep(0.2)
  local t0 = ctx:now()
  local ok = pb:submit_sync({ k = 2 }, { timeout = 5 })
  print("B", ok and "ok" or "failed", ("%.3f"):format(ctx:now() - t0))
  for _ = 1, 200 do
    if a_done then break end
    ctx:sleep(0.05)
  end
  if not a_done then print("A", "waiting") end
elseif role == "consume" then
  local n, want = 0, tonumber(arg[4])
  ctx:channel(name):consumer(function(ev)
    if ev.final then print("final"); ctx:stop(); return end
    if ev.ping then return end
    n = n + 1
    local text = ev.text
    if lecho.array.is(text) then
      text = ("%s %s sum=%g"):format(text:dtype(), table.concat(text:shape(), "x"), text:sum())
    end
    print(ev.k, text)
    if n >= want then ctx:stop() end
  end)
  print("ready")
  ctx:after(20, function() print("timeout"); ctx:stop() end)
  ctx:run()
elseif role == "serve" then
  ctx:service(name, function(args)
    if type(args) ~= "table" or type(args.x) ~= "number" then error({ code = 400 }) end
    return args.x * 2, "lua"
  end)
  print("ready")
  ctx:after(30, function() ctx:stop() end)
  ctx:run()
elseif role == "slow" then
  ctx:channel(name):consumer(function() ctx:sleep(200) end)
  ctx:service(name, function() ctx:sleep(200) end)
  print("ready")
  ctx:after(60, function() ctx:stop() end)
  ctx:run()
elseif role == "call" then
  local r = { ctx:call(name, { x = tonumber(arg[4]) or arg[4] }, { timeout = 5 }) }
  print(unpack(r, 1, 3))
end
ctx:close()
