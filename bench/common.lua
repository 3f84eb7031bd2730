-- bench/common.lua: what bench/run.lua and bench/worker.lua share: the
-- payloads of the workloads, and (from spec/support/proc.lua) a monotonic
-- clock comparable across processes, process liveness and small helpers.

-- The process side (clock, files, children) is spec/support/proc.lua's,
-- shared with the specs and the stress harness; the scripts put the tree's
-- root on package.path for it.
local P = require "spec.support.proc"

local M = {
  clock = P.clock, alive = P.alive, getpid = P.getpid,
  sh_quote = P.sh_quote, read = P.read, write = P.write,
}

--- The payloads of the suite, by name.  Encoded sizes come from
-- lecho.encode at run time (the baselines are run with those sizes).
function M.payload(name)
  if name == "null" then return nil end
  if name == "int100" then
    local t = {}
    for i = 1, 100 do t[i] = i * 7 - 300 end
    return t
  end
  if name == "str400" then return ("abcdefghij"):rep(40) end
  if name == "num100" then
    local t = {}
    for i = 1, 100 do t[i] = i * 0.37 + 1e-3 end
    return t
  end
  if name == "composite" then
    local items = {}
    for i = 1, 10 do
      items[i] = { id = i, x = i * 1.25, y = -i, ok = i % 2 == 0, label = "item-" .. i,
                   pos = { i, i + 0.5, -i } }
    end
    return { kind = "telemetry", source = "sim-42", unit = "K", seq = 123456,
             meta = { step = 7, t = 0.125, tags = { "a", "b", "c" } }, items = items }
  end
  local bytes = name:match("^bytes(%d+)$")
  if bytes then return ("x"):rep(tonumber(bytes)) end
  error("unknown payload " .. tostring(name))
end

return M
