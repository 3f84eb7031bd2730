-- lecho.errors: the error codes of the API.  An expected failure is
-- returned as `nil, message, code`, code one of the names below (the same
-- names as core/errors.h in C); misuse (a bad argument, an unknown option)
-- raises.  README "Errors" has the table of codes and when they occur.

local M = {}

-- Every code, with when it occurs.
M.CODES = {
  timeout    = "no answer in time (a control request, a sync submit's consumers)",
  closed     = "the producer, consumer, context or connection is closed",
  refused    = "the peer refused the request or the connection",
  limit      = "a limit was reached (queue, frame, string length, depth, channels)",
  wouldblock = "no room in a queue now (internal: a blocking submit waits)",
  invalid    = "a value or a modulator that cannot be used (not encodable, does not compile)",
  notfound   = "no such channel, file or peer",
  io         = "a system call failed",
  protocol   = "a peer sent something that breaks the protocol",
  nomem      = "out of memory",
  failed     = "a remote handler or modulator failed, or another error",
  noservice  = "no server of the service called is known (ctx:call, at once)",
  version    = "servers of the service exist, none with a compatible version (ctx:call, at once)",
  busy       = "refused at once: a service's concurrency + queue, or max_calls_in_flight",
  noconsumer = "a sync submit to a channel that has no consumer anywhere",
}

-- The code of a message from the C core that came without one (until the
-- binding returns its codes as a third value); `default` when none fits
-- ("failed" if nil).
function M.code_of(msg, default)
  msg = tostring(msg)
  if msg:find("out of memory", 1, true) then return "nomem" end
  if msg:find("no answer", 1, true) or msg:find("timed out", 1, true) then return "timeout" end
  if msg:find("refused", 1, true) then return "refused" end
  if msg:find("closed", 1, true) or msg:find("connection lost", 1, true)
     or msg:find("reset", 1, true) or msg:find("no heartbeat", 1, true) then return "closed" end
  if msg:find("limit", 1, true) or msg:find("too long", 1, true) or msg:find("too deep", 1, true)
     or msg:find("queue full", 1, true) then return "limit" end
  if msg:find("cannot encode", 1, true) then return "invalid" end
  if msg:find("no such", 1, true) then return "notfound" end
  return default or "failed"
end

return M
