-- lecho.errors: the error codes of the API.  An expected failure is
-- returned as `nil, message, code`, code one of the names below (the same
-- names as core/base/errors.h in C); misuse (a bad argument, an unknown option)
-- raises.  doc/api.md "Errors" has the table of codes and when they occur.

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
  noconsumer = "a sync submit to a channel that has no consumer anywhere, or none left where it came",
}

-- The code a peer's reply or ACK entry carries, as this side believes it:
-- one of CODES, else "failed" (an unknown name, a non-string, or none: a
-- peer of before codes).  A code is set where an error happens and carried;
-- none is ever read from a message's text.
function M.peer_code(code)
  if type(code) == "string" and M.CODES[code] then return code end
  return "failed"
end

-- The directory of lecho's own Lua files ("@/path/lua/lecho/").
local OWN = (debug.getinfo(1, "S").source or ""):match("^@(.*/)[^/]*$")

--- debug.traceback without lecho's own frames: a handler's or a callback's
-- error shows the user's frames, from where it was raised down to where
-- lecho called in (the frames below, lecho's and the [C] xpcall that ran
-- them, say nothing about the user's code).  co: a coroutine (optional, as
-- for debug.traceback), msg, level.
function M.traceback(co, msg, level)
  local tb
  if type(co) == "thread" then tb = debug.traceback(co, msg, level)
  else co, msg, level = nil, co, msg; tb = debug.traceback(msg, (level or 1) + 1) end
  if not OWN or type(tb) ~= "string" then return tb end
  local head, frames = tb:match("^(.-stack traceback:)(.*)$")
  if not head then return tb end
  local kept = {}
  for line in frames:gmatch("\n[^\n]*") do
    if line:find(OWN, 1, true) then break end
    kept[#kept + 1] = line
  end
  -- the [C] xpcall or pcall through which lecho called the user's code
  while kept[#kept] and kept[#kept]:match("^\n%s*%[C%]: in function '?x?pcall'?") do kept[#kept] = nil end
  while kept[#kept] and kept[#kept]:match("^\n%s*%(%.%.%.tail calls%.%.%.%)") do kept[#kept] = nil end
  return head .. table.concat(kept)
end

return M
