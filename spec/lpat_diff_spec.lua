-- The modulators' pattern functions (core/lpat.c) against LuaJIT's own, on
-- random subjects, patterns, replacements, inits and counts: every result
-- and every error text the same.  Seeded (LPAT_SEED=n replays a run; the
-- seed is in every failure message), bounded in time.
local C = require "spec.support.lpat_cases"
local run = assert(loadstring(C.RUN_SRC .. "\nreturn run", "=lpat_cases"))()
local core = require "lecho.core"

local SEED = tonumber(os.getenv("LPAT_SEED")) or (os.time() % 1000000)
local NAMES = { "find", "match", "gmatch", "gsub" }

-- Compares n random cases (or until `seconds` passed), fails on the first
-- difference with the case and the seed.
local function compare(r, n, seconds, ours)
  local t0, done = os.clock(), 0
  for i = 1, n do
    local c = C.case(r, NAMES[r(4)])
    local want, got = run(string, c), ours(c)
    if want ~= got then
      error(("seed %d, case %d: %s\n  LuaJIT: %s\n  ours:   %s"):format(SEED, i, C.text(c), want, got), 0)
    end
    done = i
    if os.clock() - t0 > seconds then break end
  end
  return done
end

describe("lecho's pattern matcher against LuaJIT's", function()
  it("gives the same results and errors on random inputs, through core.lpat", function()
    local P = core.lpat()
    local done = compare(C.prng(SEED), 60000, 8, function(c) return run(P, c) end)
    assert.is_true(done >= 5000, ("only %d cases in the time"):format(done))
  end)
end)
