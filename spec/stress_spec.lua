-- The stress harness (stress/run.lua, issue 8) on a short fixed-seed set:
-- each scenario runs 6 s of real processes (name server, managers,
-- producers, consumers plain and modulated, busy loops on every core) and
-- its logs are checked by stress/check.lua.  Scenarios that show violations
-- on the current core are pending, each with the violations it shows; with
-- STRESS_SPEC_ALL=1 in the environment they run (and fail) too.
local root = os.getenv("LECHO_ROOT") or "."
local luajit = os.getenv("LUAJIT") or "luajit"

local function run(seed, scenario, seconds)
  local cmd = ("%s %s/stress/run.lua --seed %d --seconds %d%s 2>&1"):format(
    luajit, root, seed, seconds, scenario and " --scenario " .. scenario or "")
  local p = io.popen(cmd)
  local out = p:read("*a")
  p:close()
  return out
end

local SECONDS = 6
-- { seed, scenario (nil: chosen by the seed), what it shows on the current core }
local SET = {
  { 7, "drops" },                              -- drop_oldest, drop_newest, disconnect: exact counts
  { 19, "churn" },                             -- modulated consumers join, leave, are killed
  { 1, "block", "nested, duplicate, order: a blocking submit from a timer re-enters the timer (issue 8 items 3, 8)" },
  { 15, "ff", "loss: fire-and-forget publishers lose every event (issue 8 item 1)" },
  { 3, "control", "nested, duplicate, exit (heap corruption: 'corrupted double-linked list') under a timer producer with managers and name server restarted" },
  { 2, "mixed", "hang (a block producer stuck in submit, issue 8 item 2), loss and sync_true across a name server restart" },
}

describe("stress harness, fixed seeds", function()
  for _, t in ipairs(SET) do
    local seed, scenario, known = t[1], t[2], t[3]
    local name = ("seed %d (%s, %d s) has no violation"):format(seed, scenario or "by seed", SECONDS)
    if known and not os.getenv("STRESS_SPEC_ALL") then
      pending(name .. " -- on the current core: " .. known)
    else
      it(name, function()
        local out = run(seed, scenario, SECONDS)
        local n = tonumber(out:match("stress: %d+ scenario%(s%) run, (%d+) violation"))
        assert(n, "the harness did not finish:\n" .. out)
        assert(n == 0, out)
      end)
    end
  end
end)
