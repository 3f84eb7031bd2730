-- A modulator is checked where it is given: ch:consumer (and set_params,
-- set_modulator) compile its text (never run it) and fail at the call when
-- it does not compile; lecho.modulator reads one from a file, and says "no
-- such file" rather than compiling the name as source.
local lecho = require "lecho"
local S = require "spec.support"

local function raises(pattern, fn, ...)
  local ok, err = pcall(fn, ...)
  assert.is_false(ok)
  assert.matches(pattern, tostring(err))
end

describe("a modulator that does not compile", function()
  local ctx
  before_each(function() ctx = lecho.context{ quiet = true } end)
  after_each(function() ctx:close() end)

  it("fails ch:consumer at the call, and no consumer is made", function()
    local ch = ctx:channel("m")
    local errs = {}
    raises("lecho: the modulator does not compile: modulator:1: 'end' expected near '<eof>'",
           ch.consumer, ch, function() end,
           { modulator = "function enqueue(ev) return ev", on_error = function(e) errs[#errs + 1] = e end })
    raises("lecho: modulator must be Lua source text, not bytecode", ch.consumer, ch, function() end,
           { modulator = string.dump(function() end) })
    -- a file name given as source says so
    raises("'stride.lua' looks like a file name: lecho.modulator%(file%) reads one", ch.consumer, ch,
           function() end, { modulator = "stride.lua" })
    assert.are.equal(0, ctx:stats().channels[ctx.addr .. "/m"] and
                          ctx:stats().channels[ctx.addr .. "/m"].consumers or 0)
    -- and a producer that comes later hears of none (nobody consumes)
    local p = assert(ch:producer())
    assert.are.equal("noconsumer", select(3, p:submit_sync({ step = 1 })))
    assert.are.same({}, errs)
  end)

  it("is never run to be checked", function()
    local ch = ctx:channel("m2")
    _G.MODULATOR_RAN = nil
    local c = assert(ch:consumer(function() end,
      { modulator = "MODULATOR_RAN = true function enqueue(ev) return ev end" }))
    assert.is_nil(_G.MODULATOR_RAN)
    raises("does not compile", c.set_modulator, c, "function enqueue(ev) return ev en")
    assert.are.equal(1, c:params_version())
  end)
end)

describe("lecho.modulator", function()
  it("says 'no such file' for a file name that does not exist", function()
    assert.are.same({ nil, "no such file: stride.lua", "notfound" }, { lecho.modulator("stride.lua") })
    assert.are.same({ nil, "no such file: /nonexistent/dir/mod.lua", "notfound" },
                    { lecho.modulator("/nonexistent/dir/mod.lua") })
  end)

  it("reads a file, and takes source text as it is", function()
    local path = S.write(S.tmpname("mod") .. ".lua", "function enqueue(ev) return ev end\n")
    assert.are.same({ "function enqueue(ev) return ev end\n", path }, { lecho.modulator(path) })
    assert.are.same({ "function enqueue(ev) return ev end" },
                    { lecho.modulator("function enqueue(ev) return ev end") })
    S.cleanup()
  end)

  it("reads any existing file, whatever its name; a directory is an io error", function()
    local dir = S.tmpname("mods")
    assert(os.execute("mkdir -p " .. dir) ~= false)
    local odd = S.write(dir .. "/a=b(1)", "function enqueue(ev) return ev end\n")
    assert.are.same({ "function enqueue(ev) return ev end\n", odd }, { lecho.modulator(odd) })
    assert.are.same({ nil, dir .. ": Is a directory", "io" }, { lecho.modulator(dir) })
    assert.are.same({ "return 1" }, { lecho.modulator("return 1") })
    S.cleanup()
  end)

  it("gives a file's modulator that runs as the source would", function()
    local path = S.write(S.tmpname("stride") .. ".lua",
      "function enqueue(ev) if ev.step % params.stride == 0 then return ev end end\n")
    local src = assert(lecho.modulator(path))
    local ctx = lecho.context{ quiet = true }
    local ch = ctx:channel("atmosphere.field")
    local got = {}
    local c = assert(ch:consumer(function(ev) got[#got + 1] = ev.step end,
                                 { modulator = src, params = { stride = 4 } }))
    local p = assert(ch:producer())
    for step = 1, 9 do assert(p:submit({ step = step })) end
    assert.is_true(p:submit_sync({ step = 12 }))
    assert.are.same({ 4, 8, 12 }, got)
    assert.is_true(c:set_params{ stride = 2 })
    got = {}
    for step = 13, 15 do assert(p:submit({ step = step })) end
    assert.is_true(p:submit_sync({ step = 16 }))
    assert.are.same({ 14, 16 }, got)
    ctx:close()
    S.cleanup()
  end)
end)
