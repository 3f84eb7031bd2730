-- What a submit refuses: values lecho cannot encode are refused at the
-- call, with the reason, and nothing is sent.
local lecho = require "lecho"
local S = require "spec.support"

describe("a submit of a value lecho cannot encode", function()
  after_each(function() S.cleanup() end)

  it("refuses functions, userdata, cycles and deep nesting at submit, sending nothing", function()
    local ctx = lecho.context{ quiet = true, max_depth = 10 }
    local ch = ctx:channel("v")
    local n = 0
    ch:consumer(function() n = n + 1 end)
    local p = assert(ch:producer())
    local cyc = {}
    cyc.self = cyc
    local deep = {}
    local t = deep
    for _ = 1, 20 do t.x = {}; t = t.x end
    local cases = {
      { { f = print }, "cannot encode a function" },
      { io.stdout, "cannot encode a userdata" },
      { cyc, "cannot encode a cycle" },
      { deep, "nesting too deep" },
    }
    for _, case in ipairs(cases) do
      local ok, err = p:submit(case[1])
      assert.is_nil(ok)
      assert.truthy(err:find(case[2], 1, true), err)
      local ok2, err2 = p:submit_sync(case[1])
      assert.is_nil(ok2)
      assert.truthy(err2:find(case[2], 1, true), err2)
    end
    ctx:run_once(0)
    assert.are.equal(0, n)
    assert.are.equal(0, ctx:stats().channels[ctx.addr .. "/v"].events_out)
    ctx:close()
  end)
end)
