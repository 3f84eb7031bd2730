-- submit_sync{ timeout = 0 }: a sync submit runs the consumers of its own
-- process before it returns (doc/semantics.md, Local delivery), even when its
-- deadline has passed before the first loop turn (attack nit, issue 9).
local lecho = require "lecho"

describe("sync submit with timeout 0", function()
  local c
  after_each(function()
    if c then c:close{ linger = 0 } end
    c = nil
  end)

  it("runs the local consumers, plain and modulated, before it returns", function()
    c = lecho.context{ quiet = true }
    local ch = c:channel("t0")
    local p = assert(ch:producer())
    local plain, modulated = {}, {}
    assert(ch:consumer(function(ev) plain[#plain + 1] = ev end))
    assert(ch:consumer(function(ev) modulated[#modulated + 1] = ev end,
                       { modulator = [[function enqueue(ev) return ev * 10 end]] }))
    for i = 1, 3 do
      local ok, errs, code = p:submit_sync(i, { timeout = 0 })
      assert(ok == true, ("step %d: %s (%s)"):format(i, tostring(errs), tostring(code)))
      assert.are.same({ i }, { plain[i] })
      assert.are.same({ i * 10 }, { modulated[i] })
    end
    assert.are.same({ 1, 2, 3 }, plain)
  end)

  it("still reports a handler's error", function()
    c = lecho.context{ quiet = true }
    local ch = c:channel("t0err")
    local p = assert(ch:producer())
    assert(ch:consumer(function(ev) if ev == 2 then error("bad two", 0) end end))
    assert(p:submit_sync(1, { timeout = 0 }))
    local ok, errs, code = p:submit_sync(2, { timeout = 0 })
    assert.is_nil(ok)
    assert.are.equal("failed", code)
    assert.matches("bad two", tostring(errs))
  end)
end)
