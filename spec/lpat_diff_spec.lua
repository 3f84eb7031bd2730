-- The modulators' pattern functions (core/moe/lpat.c) against LuaJIT's own, on
-- random subjects, patterns, replacements, inits and counts: every result
-- and every error text the same.  Seeded (LPAT_SEED=n replays a run; the
-- seed is in every failure message), bounded in time.
local C = require "spec.support.lpat_cases"
local run = assert(loadstring(C.RUN_SRC .. "\nreturn run", "=lpat_cases"))()
local core = require "lecho.core"
local lecho = require "lecho"

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

  it("gives the same results and errors on random inputs, inside a modulator", function()
    local c = lecho.context{ quiet = true, modulator_budget = 0.5 }
    local ch = c:channel("lpat")
    local p = assert(ch:producer())
    local got, err
    assert(ch:consumer(function(ev) got = ev end, { on_error = function(e) err = e end, modulator = C.RUN_SRC .. [[
      function enqueue(cases)
        local out = {}
        for i, c in ipairs(cases) do out[i] = run(string, c) end
        return out
      end]] }))
    local r, t0, n = C.prng(SEED + 1), os.clock(), 0
    local ok, e = pcall(function()
      while n < 20000 and os.clock() - t0 < 6 do
        local batch = {}
        for i = 1, 100 do batch[i] = C.case(r, NAMES[r(4)]) end
        got = nil
        assert(p:submit_sync(batch), "the modulator failed: " .. tostring(err))
        for i, k in ipairs(batch) do
          local want = run(string, k)
          if want ~= got[i] then
            error(("seed %d, case %d: %s\n  LuaJIT: %s\n  modulator: %s"):format(SEED + 1, n + i, C.text(k), want,
                                                                              tostring(got[i])), 0)
          end
        end
        n = n + #batch
      end
    end)
    c:close()
    assert(ok, e)
    assert.is_true(n >= 2000, ("only %d cases in the time"):format(n))
  end)
end)
