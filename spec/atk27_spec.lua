-- An outside attack on issue 27's changes (the MOE batches, the direct
-- install, the data plane's reused messages): each case a way a careless
-- user or a rogue peer broke the contract on main 874af8a, run in a child
-- process where the break was a crash.
local S = require "spec.support"

-- A producer with a local modulated consumer whose modulator logs (the
-- `log` capability granted) and whose context's log hook runs arg[1]'s
-- action once, from inside the modulator's call (during a batch): the
-- hook's pcall result goes to stdout, then the script delivers what it can
-- and says "done".
local HOOKED = [[
local lecho = require "lecho"
local mode = arg[1]
local c = lecho.context{ quiet = true }
local ch = c:channel("re")
local p = assert(ch:producer{ grant = { "log" } })
local cons
local n, got, errs = 0, {}, {}
c.log = function(msg)
  if not msg:match("^modulator") then return end
  n = n + 1
  if n ~= 3 then return end
  local ok, err
  if mode == "close" then
    ok, err = pcall(c.close, c)
  elseif mode == "unload" then
    -- the consumer closed (its producer here unloads the modulator at the
    -- next loop turns), then turns of the loop: from inside the call
    ok, err = pcall(function()
      cons:close()
      for _ = 1, 6 do c:run_once(0.01) end
    end)
  end
  io.stdout:write("hook ", tostring(ok), " ", tostring(err), "\n"); io.stdout:flush()
end
cons = assert(ch:consumer(function(ev) got[#got + 1] = ev end,
  { capabilities = { "log" }, modulator = "function enqueue(ev) log('x', ev) return ev end",
    on_error = function(e) errs[#errs + 1] = tostring(e) end }))
for i = 1, 10 do assert(p:submit(i)) end
c:flush()
c:run_once(0.05)
io.stdout:write("got ", #got, " errs ", #errs, "\n")
c:close()
io.stdout:write("done\n"); io.stdout:flush()
]]

describe("issue 27 attacked: a log hook during a modulator's batch", function()
  after_each(function() S.cleanup() end)

  -- main 874af8a: segfault (the state closed under its own running call:
  -- ctx_close freed every modulator from inside moe.c's enq_one)
  it("closing the context there is refused, the process lives", function()
    local v = S.lua(HOOKED, "close")
    local ok, rc = S.wait(v, 30)
    assert.is_true(ok)
    assert.are.equal(0, rc, S.output(v) .. S.errors(v))
    local out = S.output(v)
    assert.matches("hook false [^\n]*modulator", out)
    assert.matches("got 10 errs 0", out)
    assert.matches("done", out)
  end)

  -- main 874af8a: segfault (the nested turn ran the consumer's close: its
  -- install unloaded the modulator whose batch was running)
  it("a loop turn there is refused, the modulator is not freed under its call", function()
    local v = S.lua(HOOKED, "unload")
    local ok, rc = S.wait(v, 30)
    assert.is_true(ok)
    assert.are.equal(0, rc, S.output(v) .. S.errors(v))
    local out = S.output(v)
    assert.matches("hook false [^\n]*modulator", out)
    assert.matches("done", out)
  end)
end)
