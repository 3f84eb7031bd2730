-- lecho.options: the lists the API checks against, in one place: queue
-- policies, modulator capabilities, and address parsing.

local M = {}

-- Capabilities a producer may grant to modulators (doc/modulators.md).
M.CAPS = { clock = true, log = true }

-- Queue policies when a queue is full (README "Bounded memory").
M.POLICIES = { block = true, drop_oldest = true, drop_newest = true, disconnect = true }

-- "host:port" with host an IPv4 address ("localhost" is taken as 127.0.0.1).
function M.parse_addr(s, what)
  if type(s) ~= "string" then
    error(("lecho: %s must be a \"host:port\" string"):format(what), 3)
  end
  local host, port = s:match("^([^:/]+):(%d+)$")
  if not host then error(("lecho: bad %s '%s' (want host:port)"):format(what, s), 3) end
  if host == "localhost" then host = "127.0.0.1" end
  return host, tonumber(port)
end

return M
