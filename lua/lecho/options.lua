-- lecho.options: the lists the API checks against, in one place: queue
-- policies, modulator capabilities, and address parsing.

local addr = require "lecho.addr"

local M = {}

-- Capabilities a producer may grant to modulators (doc/modulators.md).
M.CAPS = { clock = true, log = true }

-- Raises "lecho: unknown capability 'X' (known: clock, log)" unless every
-- entry of list (nil: none) is a capability.
function M.check_caps(list, level)
  for _, cap in ipairs(list or {}) do
    if not M.CAPS[cap] then
      local known = {}
      for k in pairs(M.CAPS) do known[#known + 1] = k end
      table.sort(known)
      error(("lecho: unknown capability '%s' (known: %s)"):format(tostring(cap),
            table.concat(known, ", ")), level + 1)
    end
  end
end

-- Queue policies when a queue is full (README "Bounded memory").
M.POLICIES = { block = true, drop_oldest = true, drop_newest = true, disconnect = true }

-- The names each options table takes (README "Using it" says what they
-- do), with the default where the Lua side applies one (`true`: the C core
-- or lecho.registry applies it, or there is none).  A key not listed is a
-- mistake (`namserver`) and raises at the call with its name: an unknown
-- option never silently means its default.
M.CONTEXT = {
  nameserver = true, listen = "127.0.0.1:0", advertise = true, manager = true, log = true, quiet = true,
  timeout = 5, sync_timeout = 10, linger = 2,
  queue_limit = true, policy = true, batch_bytes = true,
  max_string = true, max_depth = true, max_frame = true, pin_threshold = true,
  retry_interval = true, retry_max = true, heartbeat = true, heartbeat_misses = true,
  modulator_budget = 0.005, modulator_memory = 32 * 1024 * 1024,
  -- the registry of a name server or manager run inside the context
  ack_timeout = 2.0, settle = true, recovering = true, forget_after = true,
}
M.CHANNEL = { create = true }
M.PRODUCER = { policy = true, grant = true }
M.CONSUMER = { modulator = true, params = true, period = true, capabilities = true, on_error = true }
M.SUBMIT_SYNC = { timeout = true }
M.CLOSE = { linger = true }

-- Raises "WHERE: unknown option 'KEY'" for a key of opts not in `known`
-- (level: as error's, for the caller of the API function).  Returns opts,
-- or an empty table for nil.
function M.check(opts, known, where, level)
  if opts == nil then return {} end
  if type(opts) ~= "table" then
    error(("%s: options must be a table, not a %s"):format(where, type(opts)), level + 1)
  end
  for k in pairs(opts) do
    if not known[k] then
      error(("%s: unknown option '%s'"):format(where, tostring(k)), level + 1)
    end
  end
  return opts
end

-- The canonical text of address s (lecho.addr: "a.b.c.d:port",
-- "localhost:port", "[v6]:port", "unix:/path"; port 0 only when listen is
-- true); raises "lecho: bad WHAT 'S': why" for the caller of the API
-- function (level as error's).
function M.parse_addr(s, what, listen, level)
  if type(s) ~= "string" then
    error(("lecho: %s must be an address string (host:port, [v6]:port or unix:/path)")
      :format(what), (level or 2) + 1)
  end
  local a, why = addr.parse(s, { listen = listen })
  if not a then error(("lecho: bad %s '%s': %s"):format(what, s, why), (level or 2) + 1) end
  return a
end

return M
