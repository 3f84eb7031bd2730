-- Logs (doc/operations.md "Logs"): one line per event with an ISO-8601 UTC
-- time, a level and the component, from real events of a real process
-- (a peer that refuses, a callback that raises); LECHO_LOG filters; the
-- `log` option routes into the host program's logger, the one-argument
-- form of before still works; the rate limits are kept.
local S = require "spec.support"
local lecho = require "lecho"

local LINE = "^(%d%d%d%d)%-(%d%d)%-(%d%d)T(%d%d):(%d%d):(%d%d)%.(%d%d%d)Z (%a+) (lecho%[[^%]]+%]) ([%w_%-]+): (.*)$"

-- A process that logs: the protected-mode line (info), a peer that refuses
-- (core, warn), a callback that raises (context, error, with a traceback).
local SRC = [[
  local lecho = require "lecho"
  local ctx = lecho.context{}
  ctx:request(arg[1], { op = "list" }, 1)
  ctx:after(0, function() error("boom") end)
  ctx:after(0.2, function() ctx:stop() end)
  ctx:run()
  ctx:close()
]]

local function logs_of(env, dead)
  local file = S.tmpname("logsrc") .. ".lua"
  S.write(file, SRC)
  local ok, out = S.sh(("env %s %s %s %s"):format(env, S.luajit, file, dead))
  assert(ok, out)
  -- events: a line that starts with a time; continuation lines (a
  -- traceback) are indented by four spaces
  local events = {}
  for line in out:gmatch("[^\n]+") do
    if line:sub(1, 4) == "    " then
      assert(#events > 0, "a continuation line first: " .. line)
      events[#events].rest[#events[#events].rest + 1] = line
    else
      local y, mo, d, h, mi, s, ms, level, who, comp, msg = line:match(LINE)
      assert(y, "not a log line: " .. line)
      events[#events + 1] = { time = os.time{ year = y, month = mo, day = d, hour = h, min = mi, sec = s },
                              ms = tonumber(ms), level = level, who = who, component = comp, msg = msg, rest = {} }
    end
  end
  return events
end

-- os.time of a UTC table is local time: the offset of this machine's zone
local function utc_now()
  local now = os.time()
  return os.time(os.date("!*t", now)), now
end

describe("logs", function()
  after_each(function() S.cleanup() end)

  it("one line per event: ISO-8601 UTC time, level, lecho[ADDR], component", function()
    local dead = S.refusing_addr()
    local ev = logs_of("", dead)
    assert.are.equal(3, #ev)
    local utc = utc_now()
    for _, e in ipairs(ev) do
      assert.is_true(math.abs(e.time - utc) < 120, "the time is UTC now")
      assert.matches("^lecho%[127%.0%.0%.1:%d+%]$", e.who)
    end
    assert.are.same({ "info", "context" }, { ev[1].level, ev[1].component })
    assert.matches("^protected mode: no key configured", ev[1].msg)
    assert.are.same({ "warn", "core" }, { ev[2].level, ev[2].component })
    assert.are.equal("cannot reach " .. dead .. ": connect: Connection refused", ev[2].msg)
    assert.are.same({ "error", "context" }, { ev[3].level, ev[3].component })
    assert.matches("^error in callback: .*boom$", ev[3].msg)
    assert.matches("^    stack traceback:", ev[3].rest[1])   -- the traceback stays one event
  end)

  it("LECHO_LOG filters: warn drops info, error keeps errors only, debug adds the registry's", function()
    local dead = S.refusing_addr()
    local function levels(env)
      local t = {}
      for _, e in ipairs(logs_of(env, dead)) do t[#t + 1] = e.level end
      return table.concat(t, " ")
    end
    assert.are.equal("info warn error", levels("LECHO_LOG=info"))
    assert.are.equal("warn error", levels("LECHO_LOG=warn"))
    assert.are.equal("error", levels("LECHO_LOG=error"))
    assert.are.equal("info warn error", levels(""))
    local ok, out = S.sh(("env LECHO_LOG=loud %s -e %s"):format(S.luajit,
      S.sh_quote([[require("lecho").context{}]])))
    assert.is_false(ok)
    assert.matches("lecho: LECHO_LOG must be debug, info, warn or error, not 'loud'", out, 1, true)
  end)

  it("log = function(level, msg, component) gets the events at or above the threshold", function()
    local got = {}
    local dead = S.refusing_addr()
    local ctx = lecho.context{ log = function(level, msg, component)
      got[#got + 1] = { level, component, msg }
    end }
    ctx:request(dead, { op = "list" }, 1)
    ctx:close()
    assert.are.same({ "info", "context" }, { got[1][1], got[1][2] })
    assert.are.same({ "warn", "core", "cannot reach " .. dead .. ": connect: Connection refused" }, got[2])
    -- log_level: warn and above only
    got = {}
    ctx = lecho.context{ log_level = "warn", log = function(level, msg) got[#got + 1] = level .. " " .. msg end }
    ctx:request(dead, { op = "list" }, 1)
    ctx:close()
    assert.are.same({ "warn cannot reach " .. dead .. ": connect: Connection refused" }, got)
    assert.has_error(function() lecho.context{ log_level = "loud" } end,
      "lecho.context: log_level must be \"debug\", \"info\", \"warn\" or \"error\"")
  end)

  it("the one-argument log = function(msg) of before gets the messages as before", function()
    local got = {}
    local dead = S.refusing_addr()
    local ctx = lecho.context{ log = function(msg) got[#got + 1] = msg end }
    ctx:request(dead, { op = "list" }, 1)
    ctx:close()
    assert.are.same({ "protected mode: no key configured; listening on loopback only, every local process is trusted",
                      "cannot reach " .. dead .. ": connect: Connection refused" }, got)
  end)

  it("rate limits stay: a flood of one kind is one line, then a count", function()
    local got = {}
    local ctx = lecho.context{ log = function(level, msg) got[#got + 1] = level .. " " .. msg end, quiet = true }
    got = {}
    for _ = 1, 50 do ctx:_on_ctrl("127.0.0.1:9", { nop = 1 }) end
    ctx:close()
    assert.are.same({ "warn ignoring a control message without op from 127.0.0.1:9" }, got)
  end)
end)
