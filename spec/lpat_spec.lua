-- The string pattern functions of a modulator (core/moe/lpat.c in every
-- modulator state) answer as LuaJIT's own on the seven kinds of input
-- where lecho.patterns (the Lua matcher they replace) did not (issue 11),
-- the CPU budget stops them inside one call, and they are fast enough that
-- a 10 KB gsub fits the default 5 ms budget.
local lecho = require "lecho"
local C = require "spec.support.lpat_cases"
local S = require "spec.support"

local run = assert(loadstring(C.RUN_SRC .. "\nreturn run", "=lpat_cases"))()
local ENQUEUE = C.RUN_SRC .. [[
function enqueue(cases)
  local out = {}
  for i, c in ipairs(cases) do out[i] = run(string, c) end
  return out
end
]]

-- A case (see spec/support/lpat_cases.lua) for fname(...).
local function K(fname, ...)
  local c = { fname, select("#", ...) }
  for i = 1, c[2] do
    local v = select(i, ...)
    local t = type(v)
    c[2 + i] = v == nil and { "nil" } or v ~= v and { "nan" } or
               { t == "string" and "str" or t == "number" and "num" or "bool", v }
  end
  return c
end

describe("a modulator's pattern functions", function()
  local c
  after_each(function() if c then c:close() end c = nil end)

  -- The outcomes of cases inside a modulator, checked against LuaJIT's
  -- here; returns LuaJIT's outcomes.
  local function same_as_luajit(cases)
    c = lecho.context{ quiet = true, modulator_budget = 0.5 }
    local ch = c:channel("lpat")
    local p = assert(ch:producer())
    local got, err
    assert(ch:consumer(function(ev) got = ev end, { modulator = ENQUEUE, on_error = function(e) err = e end }))
    assert(p:submit_sync(cases), "the modulator failed: " .. tostring(err))
    local want = {}
    for i, k in ipairs(cases) do
      want[i] = run(string, k)
      assert.are.equal(want[i], got[i], C.text(k))
    end
    return want
  end

  it("clamp an init past #s + 1 to #s + 1", function()
    local w = same_as_luajit{ K("find", "abc", "", 10), K("match", "abc", "()", 5), K("find", "abc", "c", 9),
                              K("find", "", "", 3), K("match", "abc", "$", 100) }
    assert.are.same({ "ok 4 3", "ok 4", "ok nil", "ok 1 0", 'ok ""' }, w)
  end)

  it("end a pattern at its first NUL byte, but find a NUL in a plain search", function()
    -- ("\0" as a pattern is the empty one: it matches everywhere)
    local w = same_as_luajit{ K("find", "a\0b", "a\0"), K("match", "a\0b", "(.)\0b"), K("find", "a\0b", "[\0]"),
                              K("find", "a\0b", "\0."), K("gsub", "a\0b", "\0", "-") }
    assert.are.same({ "ok 1 2", 'ok "a"', "err malformed pattern (missing ']')", "ok 1 0", 'ok "-a-\\0-b-" 4' }, w)
  end)

  it("cut a non-integer init and max_n as LuaJIT does", function()
    local w = same_as_luajit{ K("find", "abc", "b", 1.9), K("find", "abc", "b", -1.5), K("find", "abc", "b", 1e10),
                              K("find", "abc", "b", 0 / 0), K("find", "abc", "b", "2"),
                              K("gsub", "abc", "%w", "x", 1.7), K("gsub", "abc", "%w", "x", 0 / 0),
                              K("gsub", "abc", "%w", "x", 2 ^ 32 + 1), K("gsub", "abc", "%w", "x", "2") }
    assert.are.same({ "ok 2 2", "ok nil", "ok 2 2", "ok 2 2", "ok 2 2", 'ok "xbc" 1', 'ok "abc" 0',
                      'ok "xbc" 1', 'ok "xxc" 2' }, w)
  end)

  it("put a NUL for a '%' that ends a replacement", function()
    local w = same_as_luajit{ K("gsub", "abc", "b", "%"), K("gsub", "abc", "b", "x%"), K("gsub", "ab", "%w", "%%%"),
                              K("gsub", "abc", "b", "%x") }
    assert.are.same({ 'ok "a\\0c" 1', 'ok "ax\\0c" 1', 'ok "%\\0%\\0" 2', 'ok "axc" 1' }, w)
  end)

  it("know %g (printable, not space) and %G", function()
    local w = same_as_luajit{ K("find", "a b", "%g+"), K("match", " \t x!y \n", "%g+"), K("gsub", "a b\tc", "%G", ""),
                              K("match", "\127\128 z", "[%g]") }
    assert.are.same({ "ok 1 1", 'ok "x!y"', 'ok "abc" 2', 'ok "z"' }, w)
  end)

  it("never match a back-reference to a position capture: gmatch('xyz', '()%1') ends at once", function()
    local w = same_as_luajit{ K("gmatch", "xyz", "()%1"), K("find", "xyz", "()%1"), K("gsub", "xyz", "()%1", "-"),
                              K("match", "aa", "(a)()%2") }
    assert.are.same({ "", "ok nil", 'ok "xyz" 0', "ok nil" }, w)
  end)

  it("say 'pattern too complex' past 200 nested matches, as LuaJIT does", function()
    local a300 = ("a"):rep(300)
    local w = same_as_luajit{ K("find", a300, ("a?"):rep(199)), K("find", a300, ("a?"):rep(200)),
                              K("match", a300, ("a*"):rep(250)), K("match", a300, ("a-"):rep(199) .. "$") }
    assert.are.same({ "ok 1 199", "err pattern too complex", "err pattern too complex", "ok " .. ("%q"):format(a300) },
                    w)
  end)

  -- The budget stops a modulator stuck in one call of a pattern function
  -- (the Lua count hook cannot: no Lua instruction runs in it); it is
  -- unloaded with the reason and the producer's other consumers go on.
  local function stopped(src, want_err)
    c = lecho.context{ quiet = true }
    local ch = c:channel("stuck")
    local p = assert(ch:producer())
    local plain, err = 0, nil
    assert(ch:consumer(function() plain = plain + 1 end))
    local bad = assert(ch:consumer(function() error("must not run") end,
                                   { modulator = src, on_error = function(e) err = e end }))
    local ok = p:submit_sync(1)
    assert.is_nil(ok)
    assert(S.run_until(c, function() return err end, 5))
    assert.matches(want_err, err, 1, true)
    for i = 2, 50 do assert(p:submit(i)) end
    assert(S.run_until(c, function() return plain == 50 end, 5))
    for name in pairs(c:stats().modulators or {}) do
      assert.is_nil(name:match(bad.mod.key), "the stopped modulator is still loaded")
    end
  end

  it("are stopped by the budget on a 300 kB pattern that backtracks", function()
    stopped([[function enqueue(ev)
      local s, p = ("a"):rep(400000), ("a"):rep(300000) .. ".b"
      return (string.find(s, p))
    end]], "exceeded its CPU budget")
  end)

  it("are stopped by the budget in gmatch and gsub, as methods too", function()
    stopped([[function enqueue(ev)
      local n = 0
      for x in (("a"):rep(5000)):gmatch("a*a*a*a*b") do n = n + 1 end
      return n
    end]], "exceeded its CPU budget")
    c:close()
    stopped([[function enqueue(ev) return (("a"):rep(5000)):gsub(".-.-.-b", "") end]], "exceeded its CPU budget")
  end)

  it("search a 300 kB plain pattern in linear time, within the budget", function()
    -- The call takes 2-4 ms of CPU here, near the default budget of 5 ms:
    -- with every core busy it went over 1 time in 10-20 (the CPU a thread
    -- is charged grows with what shares its core).  20 ms is still far
    -- below a quadratic search's 700 ms.  (ASan: the instrumented matcher
    -- is several times slower, linear still.)
    c = lecho.context{ quiet = true, modulator_budget = S.asan and 0.05 or 0.02 }
    local ch = c:channel("plain")
    local p = assert(ch:producer())
    local got, err
    assert(ch:consumer(function(ev) got = ev end, { modulator = [[function enqueue(ev)
      local s, p = ("a"):rep(400000), ("a"):rep(300000) .. "b"
      return { (string.find(s, p, 1, true)) or false, string.find(s .. "b", p) }
    end]], on_error = function(e) err = e end }))
    local cpu0 = os.clock() -- the modulator runs in this process's thread
    local sok, serr = p:submit_sync(1)
    assert(sok, tostring(err) .. " " .. tostring(serr))
    local cpu = os.clock() - cpu0
    assert.are.same({ false, 100001, 400001 }, got)
    -- LuaJIT's memchr+memcmp takes 0.7 s here (quadratic); ours is linear
    assert.is_true(cpu < 0.25, ("%.3f s of CPU"):format(cpu))
  end)

  it("substitute %s+ in a 10 KB event within the default 5 ms budget", function()
    c = lecho.context{ quiet = true }
    local ch = c:channel("gsub")
    local p = assert(ch:producer())
    local got, n, err = nil, 0, nil
    assert(ch:consumer(function(ev) got, n = ev, n + 1 end,
                       { modulator = [[function enqueue(ev) return (ev:gsub("%s+", " ")) end]],
                         on_error = function(e) err = e end }))
    local words = {}
    for i = 1, 1400 do words[i] = ("w%d%s"):format(i, i % 3 == 0 and " \t\n " or " ") end
    local ev = table.concat(words):sub(1, 10 * 1024)
    for _ = 1, 20 do assert(p:submit_sync(ev), tostring(err)) end
    assert.are.equal(20, n)
    assert.are.equal((ev:gsub("%s+", " ")), got)
  end)
end)
