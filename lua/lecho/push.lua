-- lecho.push: code pushed to a running node (README "Pushing code").
--
-- ctx:sandbox(src, name [, opts]) loads Lua source in a sandboxed state made
-- like a modulator's (core/moe_svc.c: the same environment without emit, the
-- node's modulator_memory and modulator_budget, which opts may lower but not
-- raise, and the group caps modulators_memory and modulators_cpu).  The
-- chunk returns a function or a table of functions; sb:call(...) and
-- sb:invoke(fname, ...) run them with values and return true, results... or
-- nil, err, code [, traceback] (err is the raised value itself when the
-- function raised: code "failed"; "limit" for a budget or memory stop,
-- "invalid" for arguments or results that cannot travel).  A failed call
-- leaves the state serving; only the CPU share check ends it ("closed").

local Context = require "lecho.context"

local M = {}

local function lower(want, cap)
  if want == nil then return cap end
  if type(want) ~= "number" or want ~= want or want <= 0 then return nil end
  return math.min(want, cap)
end

--- ctx:sandbox(src, name [, opts]) -> sandbox | nil, err, code
-- opts: budget (CPU seconds per call), memory (bytes), both at most the
-- node's modulator_budget / modulator_memory; principal (charged for its CPU
-- share); clock, log (granted to the code).
function Context:sandbox(src, name, opts)
  if type(src) ~= "string" then return nil, "sandbox: source must be a string", "invalid" end
  if type(name) ~= "string" or #name == 0 or #name > 90 then
    return nil, "sandbox: name must be a string of 1..90 bytes", "invalid"
  end
  opts = opts or {}
  local budget, memory = lower(opts.budget, self.mod_budget), lower(opts.memory, self.mod_memory)
  if not budget or not memory then
    return nil, "sandbox: budget and memory must be positive numbers", "invalid"
  end
  return self.c:sandbox(src, name, { budget = budget, memory = math.max(memory, 256 * 1024),
                                     clock = opts.clock and true or false, log = opts.log and true or false,
                                     pool_memory = self.mods_memory, cpu_share = self.mods_cpu,
                                     principal = opts.principal })
end

return M
