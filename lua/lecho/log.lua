-- lecho.log: one line per event, with its time, level and component
-- (doc/operations.md "Logs"):
--
--   2026-12-04T21:50:43.123Z warn lecho[127.0.0.1:7700] control: cannot reach ...
--
-- The threshold is LECHO_LOG (debug, info, warn, error; default info), or
-- a context's `log_level` option.  A context's `log` option routes the
-- lines into the host program's logger instead of stderr:
-- `function(level, msg, component)` (two or more parameters) gets every
-- event at or above the threshold, unformatted; the older one-parameter
-- `function(msg)` gets the message only, as before (no level, no filter
-- but debug lines, which it never had).
--
-- Every file calls its context's logger as `ctx.log(msg [, level
-- [, component]])`: the level defaults to "error" for a message that
-- begins with "error", else "warn" (most of lecho's log lines are
-- problems); the component defaults to the calling file's name
-- ("control" for lua/lecho/control.lua).  Rate limits are the callers'
-- (lecho.control `_warn_limited`, core/transport/auth.c): this file drops nothing
-- but what the threshold filters.  Pure Lua and the FFI (the clock).

local ffi = require "ffi"

local M = {}

M.LEVELS = { "debug", "info", "warn", "error" }
local RANK = { debug = 1, info = 2, warn = 3, error = 4 }
M.RANK = RANK

pcall(ffi.cdef, [[
  struct lecho_log_timespec { long tv_sec; long tv_nsec; };
  int clock_gettime(int clk, void *ts);
]])
local ts = ffi.new("struct lecho_log_timespec")
local tsp = ffi.cast("void *", ts) -- (another module may have declared clock_gettime with its own struct)

--- The time now as ISO 8601 UTC with milliseconds ("...T21:50:43.123Z").
function M.timestamp()
  ffi.C.clock_gettime(0, tsp) -- CLOCK_REALTIME
  local sec = tonumber(ts.tv_sec)
  local ms = math.floor(tonumber(ts.tv_nsec) / 1e6)
  return os.date("!%Y-%m-%dT%H:%M:%S", sec) .. (".%03dZ"):format(ms)
end

--- The threshold's level: `given` (a context's log_level), else
-- $LECHO_LOG, else "info".  nil, why for a name that is not a level.
function M.threshold(given)
  local v = given or os.getenv("LECHO_LOG")
  if v == nil or v == "" then return "info" end
  v = tostring(v):lower()
  if not RANK[v] then
    return nil, ("LECHO_LOG must be debug, info, warn or error, not '%s'"):format(tostring(given or os.getenv("LECHO_LOG")))
  end
  return v
end

--- The level of a message logged without one.
function M.guess(msg)
  if type(msg) == "string" and msg:find("^error") then return "error" end
  return "warn"
end

-- The component: the name of the Lua file that called the logger (level 3
-- from here: the caller of the logger function).
local function caller_component()
  local info = debug.getinfo(3, "S")
  local src = info and info.source or ""
  return src:match("([%w_%-]+)%.lua$") or "lecho"
end

--- One formatted line (without the newline).  who: "lecho[ADDR]" or a
-- program's name.
function M.format(level, who, component, msg)
  msg = tostring(msg):gsub("\n", "\n    ")  -- a traceback stays one event
  return ("%s %s %s %s: %s"):format(M.timestamp(), level, who, component, msg)
end

--- Does fn take (level, msg): two or more declared parameters?
function M.leveled(fn)
  local info = debug.getinfo(fn, "u")
  return info ~= nil and (info.nparams or 0) >= 2
end

--- A context's logger, `log(msg [, level [, component]])`, from its options:
-- opts.log (routed, see the top), opts.quiet (nothing), opts.log_level;
-- who() names the process in a line ("lecho[ADDR]").  Raises on a bad level.
function M.logger(opts, who)
  local th, err = M.threshold(opts.log_level)
  if not th then error("lecho: " .. err, 3) end
  local min = RANK[th]
  local route = opts.log
  if route and not M.leveled(route) then
    -- the one-argument form of before: the message only, whatever the
    -- threshold, as it was: no debug lines, and the registry's warnings
    -- and errors prefixed by their level ("warn: ...")
    return function(msg, level, component)
      if level == "debug" then return end
      if component == "registry" then msg = ("%s: %s"):format(level, msg) end
      route(msg)
    end, th
  end
  if route then
    return function(msg, level, component)
      level = level or M.guess(msg)
      if (RANK[level] or 3) < min then return end
      route(level, msg, component or caller_component())
    end, th
  end
  if opts.quiet then return function() end, th end
  return function(msg, level, component)
    level = level or M.guess(msg)
    if (RANK[level] or 3) < min then return end
    io.stderr:write(M.format(level, who(), component or caller_component(), msg), "\n")
  end, th
end

return M
