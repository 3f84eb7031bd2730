-- A misspelled channel name: ctx:channel(name, { create = false }) says
-- when a channel has no producer and no consumer in any process, and the
-- name server forgets channels nobody has used for `forget_after` seconds,
-- so that a typo does not stay in ls() for the name server's life.
local lecho = require "lecho"
local S = require "spec.support"

-- A child process: joins `ch` at name server `ns` as a consumer (or as a
-- channel manager with ch = "-", forgetting after 0.5 s), prints "ready",
-- then closes it when the file `stop` appears, prints "left" and stays
-- until killed.
local CHILD = [[
  local lecho = require "lecho"
  local ns, ch, stop = ...
  local ctx = lecho.context{ nameserver = ns, quiet = true, manager = ch == "-" or nil,
                             forget_after = ch == "-" and 0.5 or nil }
  local c = ch ~= "-" and assert(ctx:channel(ch):consumer(function() end))
  print("ready") io.stdout:flush()
  local t = ctx:every(0.05, function(t)
    local f = io.open(stop)
    if f and c then f:close(); c:close(); c = nil; print("left") io.stdout:flush() end
  end)
  ctx:after(30, function() ctx:stop() end)
  ctx:run()
  ctx:close()
]]

local function names(ctx)
  local out = {}
  for name in pairs(assert(ctx:list())) do out[#out + 1] = name:match("/(.*)$") end
  table.sort(out)
  return table.concat(out, " ")
end

-- Starts CHILD on `ch` with ctx as its name server (serving ctx's loop
-- meanwhile); leave(ctx, c) makes it close its consumer.
local function child(ctx, ch)
  local stop = S.tmpname("stop")
  local c = S.lua(CHILD, ctx.addr, ch, stop)
  c.stop = stop
  assert(S.run_until(ctx, function() return S.output(c):find("ready") end, 20), S.errors(c))
  return c
end

local function leave(ctx, c)
  S.write(c.stop, "")
  assert(S.run_until(ctx, function() return S.output(c):find("left") end, 10), S.errors(c))
end

describe("a misspelled channel name", function()
  local ctx
  after_each(function()
    if ctx then ctx:close{ linger = 0 } end
    ctx = nil
    S.cleanup()
  end)

  describe("ctx:channel(name, { create = false })", function()
    it("returns nil, 'no such channel: NAME', 'notfound' for a channel nobody uses", function()
      ctx = lecho.context{ quiet = true }
      assert.are.same({ nil, "no such channel: ozon", "notfound" },
                      { ctx:channel("ozon", { create = false }) })
      -- created by the default, not by the refused lookup
      assert.are.equal("", names(ctx))
      local p = assert(ctx:channel("ozone"):producer())
      assert.are.equal(ctx:channel("ozone"), ctx:channel("ozone", { create = false }))
      p:close()
      assert.are.same({ nil, "no such channel: ozone", "notfound" },
                      { ctx:channel("ozone", { create = false }) })
    end)

    it("finds a channel whose only member is in another process", function()
      ctx = lecho.context{ quiet = true }
      local c = child(ctx, "ozone")
      assert.is_table(ctx:channel("ozone", { create = false }))
      leave(ctx, c)
      assert.are.same({ nil, "no such channel: ozone", "notfound" },
                      { ctx:channel("ozone", { create = false }) })
    end)

    it("asks the channel's manager when another process manages it", function()
      ctx = lecho.context{ quiet = true }
      child(ctx, "-")   -- a channel manager: channels are assigned to it from now on
      assert(S.run_until(ctx, function() return #select(2, ctx:list()) == 1 end, 10))
      local c = child(ctx, "ozone")
      local _, managers = ctx:list()
      assert.are.equal(managers[1], ctx:list()[ctx.addr .. "/ozone"].manager)
      assert.is_table(ctx:channel("ozone", { create = false }))
      leave(ctx, c)
      assert.are.same({ nil, "no such channel: ozone", "notfound" },
                      { ctx:channel("ozone", { create = false }) })
    end)
  end)

  describe("the name server", function()

    it("forgets a channel without producer and consumer after forget_after seconds", function()
      ctx = lecho.context{ quiet = true, forget_after = 0.5 }
      local c = child(ctx, "ozon")
      local kept = assert(ctx:channel("kept"):consumer(function() end))
      assert.are.equal("kept ozon", names(ctx))
      leave(ctx, c)
      -- still listed for a while after its last member left...
      assert.are.equal("kept ozon", names(ctx))
      -- ...then forgotten; a channel in use is kept however long
      assert(S.run_until(ctx, function() return names(ctx) == "kept" end, 5), names(ctx))
      S.run_until(ctx, function() return false end, 1)
      assert.are.equal("kept", names(ctx))
      kept:close()
    end)

    it("forgets a channel its manager has not used for forget_after seconds", function()
      ctx = lecho.context{ quiet = true, forget_after = 0.5 }
      child(ctx, "-")
      assert(S.run_until(ctx, function() return #select(2, ctx:list()) == 1 end, 10))
      local c = child(ctx, "ozon")
      local manager = select(2, ctx:list())[1]
      assert.are.equal(manager, ctx:list()[ctx.addr .. "/ozon"].manager)
      leave(ctx, c)
      assert.are.equal("ozon", names(ctx))
      assert(S.run_until(ctx, function() return names(ctx) == "" end, 5), names(ctx))
      -- and a channel of that name works again, at its manager
      c = child(ctx, "ozon")
      assert.are.equal(manager, ctx:list()[ctx.addr .. "/ozon"].manager)
      assert.is_table(ctx:channel("ozon", { create = false }))
    end)
  end)
end)
