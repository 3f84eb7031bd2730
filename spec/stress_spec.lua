-- The stress harness (stress/run.lua, issue 8) on a short fixed-seed set:
-- each scenario runs 6 s of real processes (name server, managers,
-- producers, consumers plain and modulated, busy loops on every core) and
-- its logs are checked by stress/check.lua.  Each seed here showed
-- violations before issue 8's fixes (nested waits, duplicates, heap
-- corruption, hangs, loss across control-plane restarts).
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
-- { seed, scenario (nil: chosen by the seed) }
local SET = {
  { 7, "drops" },     -- drop_oldest, drop_newest, disconnect: exact counts
  { 19, "churn" },    -- modulated consumers join, leave, are killed
  { 1, "block" },     -- a blocking submit from a timer to stopped consumers (items 2, 3, 8)
  { 15, "ff" },       -- fire-and-forget publishers (item 1)
  { 3, "control" },   -- name server and managers killed and restarted
  { 2, "mixed" },     -- all of it, name server restart included
}

describe("stress harness, fixed seeds", function()
  for _, t in ipairs(SET) do
    local seed, scenario = t[1], t[2]
    it(("seed %d (%s, %d s) has no violation"):format(seed, scenario or "by seed", SECONDS), function()
      local out = run(seed, scenario, SECONDS)
      local n = tonumber(out:match("stress: %d+ scenario%(s%) run, (%d+) violation"))
      assert(n, "the harness did not finish:\n" .. out)
      assert(n == 0, out)
    end)
  end
end)
