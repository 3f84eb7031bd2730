-- Calls under attack (issue 12, the outside tester's findings): a reply
-- never reaches another process that took a dead caller's address, bad
-- replies are refused and never leak an in-flight slot, replies obey the
-- argument limits, and a main-line wait sees what a callback finished.
local S = require "spec.support"
local lecho = require "lecho"

-- A caller: listens at arg[2] ("127.0.0.1:0": the OS chooses), writes its
-- address to arg[5], calls service arg[3] with argument arg[4] and writes
-- what it got to its stdout.
local CALLER = [[
local lecho = require "lecho"
local ctx = lecho.context{ nameserver = arg[1], listen = arg[2], quiet = true }
local f = assert(io.open(arg[5] .. ".tmp", "w")) f:write(ctx.addr, "\n") f:close()
os.rename(arg[5] .. ".tmp", arg[5])
local r, e, c = ctx:call(arg[3], arg[4], { timeout = 20 })
io.stdout:write(("GOT %s %s %s\n"):format(tostring(r), tostring(e), tostring(c)))
io.stdout:flush()
ctx:close{ linger = 0 }
]]

describe("a caller killed and replaced on its address mid-call", function()
  local ns, ctx
  before_each(function() ns, ctx = S.world() end)
  after_each(function() S.end_world(ctx); ctx = nil end)

  it("never gets the dead caller's late reply: the new process gets its own", function()
    local old_started, new_started, old_done = false, false, false
    local function wait_for(cond)
      local n = 0
      while not cond() and n < 400 do ctx:sleep(0.05); n = n + 1 end
    end
    -- "old" answers only once the new process's call runs, so its reply
    -- comes while the new process waits for a reply of the same first id
    assert(ctx:service("old", function(a)
      old_started = true
      wait_for(function() return new_started end)
      old_done = true
      return "old reply for " .. a
    end, { budget = 0 }))
    assert(ctx:service("new", function(a)
      new_started = true
      wait_for(function() return old_done end)
      ctx:sleep(0.2)
      return "new reply for " .. a
    end, { budget = 0 }))
    local af = S.tmpname("addr")
    local c1 = S.lua(CALLER, ns, "127.0.0.1:0", "old", "C1", af)
    assert(S.run_until(ctx, function() return old_started end, 20), "C1 did not call: " .. S.errors(c1))
    local addr = assert(S.read(af)):match("%S+")
    S.kill(c1, "KILL")
    S.wait(c1, 10, ctx)
    local stale0 = ctx.c:stats().stale_acks
    local c2 = S.lua(CALLER, ns, addr, "new", "C2", af .. "2")
    assert(S.wait(c2, 30, ctx), "C2 did not end")
    assert.is_true(old_done)
    assert.are.equal("GOT new reply for C2 nil nil\n", S.output(c2))
    -- the old reply was dropped at the server, not sent to C2
    assert.is_true(ctx.c:stats().stale_acks >= stale0 + 1)
  end)

  it("starts each context's sync ids at a random value below 2^53", function()
    local ids = {}
    for i = 1, 2 do
      local c = lecho.context{ quiet = true }
      local chid = c:channel("svc:ids").chid
      c.c:set_calls(chid)
      assert(c:service("ids", function(a) return a end))
      ids[i] = assert(c.c:call(chid, false, 1))
      assert.is_true(ids[i] > 0 and ids[i] < 2 ^ 53 and ids[i] == math.floor(ids[i]))
      c:close()
    end
    assert.are_not.equal(ids[1], ids[2])
    assert.is_true(ids[1] > 1e6 or ids[2] > 1e6)  -- not counting from 1
  end)
end)
