-- lua/lecho/repl/recplay.lua: the REPL's record(), replay() and the
-- channel form of history() (issue 29).  record() runs `lecho record` as a
-- child process (a recorder takes its channels' bytes raw: a context of
-- its own); replay() runs lecho.replay on the REPL's context, so that it
-- can be paused, stepped and sought while the prompt stays live.

local P = require "lecho.repl.pretty"

local M = {}

function M.install(R)
  local ctx = R.ctx

  -- history(ch, n): the last values, now
  function R.channel_history(name, n)
    R.check_name(name, "history")
    n = n or 1
    local got = {}
    local ch = assert(ctx:channel(name))
    local con, err = ch:consumer(function(ev, meta)
      if meta.history then got[#got + 1] = { ev = ev, meta = meta } end
    end, { history = n })
    if not con then error("history: " .. tostring(err), 3) end
    con:close()
    if #got == 0 then R.out(("no history on '%s' (its producers keep none, or there are none)"):format(name)) end
    for _, e in ipairs(got) do
      R.out(("[%s %s #%s history] %s"):format(name, e.meta.producer, tostring(e.meta.seq), P.short(e.ev, 200)))
    end
    return got
  end

  -- the directory of this REPL's scripts (lecho is beside lecho-repl)
  local function lecho_script()
    local self = arg and arg[0] or "scripts/lecho-repl"
    local dir = self:match("^(.*)/[^/]*$") or "."
    return dir .. "/lecho"
  end

  -- The child's pid is running (not gone, not a zombie nobody reaped yet).
  local function alive(pid)
    local f = io.open(("/proc/%d/stat"):format(pid))
    if not f then return false end
    local st = f:read("*a") or ""
    f:close()
    local state = st:match("^%d+ %b() (%a)")
    return state ~= nil and state ~= "Z" and state ~= "X"
  end
  local function slurp(path)
    local f = io.open(path)
    if not f then return "" end
    local s = f:read("*a") or ""
    f:close()
    return s
  end
  -- What the child said that is not its JSON summary (its errors), one line.
  local function said(out)
    local t = {}
    for l in out:gmatch("[^\n]+") do
      if l:sub(1, 1) ~= "{" and not l:match("^lecho record: recording ") then t[#t + 1] = l end
    end
    return table.concat(t, "; ")
  end

  local Rec = {}
  Rec.__index = Rec
  function Rec:stop()
    if self.stopped then return self.summary end
    self.stopped = true
    os.execute(("kill -INT %d 2>/dev/null"):format(self.pid))
    local s = ""
    for _ = 1, 100 do
      s = slurp(self.outfile)
      if s:find("}") then
        self.summary = require("cjson").decode(s:match("({.*})"))
        break
      end
      if not alive(self.pid) then s = slurp(self.outfile) break end
      R.serve(0.05)
    end
    os.remove(self.outfile)
    local err = said(s)
    if self.summary then
      R.out(("record: %d events, %d bytes in %s%s"):format(self.summary.events, self.summary.bytes, self.file,
        err ~= "" and (" (" .. err .. ")") or ""))
    else
      R.out(("record: stopped, nothing written%s"):format(err ~= "" and (": " .. err)
        or (alive(self.pid) and (" (pid %d still running, its output lost)"):format(self.pid) or " (no summary)")))
    end
    return self.summary
  end
  function Rec:__tostring() return ("record %s -> %s (pid %d)"):format(table.concat(self.channels, ", "), self.file, self.pid) end

  R.command("record", "record(ch | {ch, ...}, file [, {max_bytes=, keep=, append=, history=}])",
    "record channels to a file (lecho record, in the background)", [[
Starts `lecho record` on the channels, writing to file (doc/recording.md):
every event as it came, with producer, seq and time, after the last value
each producer kept (history = "last" by default, N, or "none": as
`lecho record --history`).  Returns a handle once
the recorder says it records; a recorder that ends first (the file exists:
append = true goes on after it) is an error with its words.  h:stop() ends
it and prints what was written, or the recorder's error.  replay(file)
plays it back.]], function(chs, file, o)
    if type(chs) == "string" then chs = { chs } end
    if type(chs) ~= "table" or not chs[1] then error("record: the channels: a name or a list of names", 2) end
    if type(file) ~= "string" then error("record: the file name is missing", 2) end
    o = o or {}
    local q = R.sh_quote or function(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end
    local args = {}
    for _, c in ipairs(chs) do args[#args + 1] = q(c) end
    local outfile = os.tmpname()
    if o.history ~= nil then
      local _, herr = require("lecho.recording").history_opt(tostring(o.history))
      if herr then error("record: " .. herr:gsub("^%-%-history", "history"), 2) end
    end
    local cmd = ("%s %s record %s --out %s --json --nameserver %s%s%s%s%s >%s 2>&1 & echo $!"):format(
      "luajit", q(lecho_script()), table.concat(args, " "), q(file), q(ctx.ns),
      o.max_bytes and (" --max-bytes " .. math.floor(o.max_bytes)) or "",
      o.keep and (" --keep " .. math.floor(o.keep)) or "", o.append and " --append" or "",
      o.history ~= nil and (" --history " .. q(tostring(o.history))) or "", q(outfile))
    local pipe = assert(io.popen(cmd))
    local pid = tonumber(pipe:read("*l"))
    pipe:close()
    if not pid then os.remove(outfile) error("record: could not start lecho record", 2) end
    -- started once it says "recording"; one that exits first (the file
    -- exists, a channel refused, no name server) is an error, its words
    local function settled()
      return slurp(outfile):find("lecho record: recording ", 1, true) ~= nil or not alive(pid)
    end
    local up = R.serve(10, settled)
    local out = slurp(outfile)
    if not out:find("lecho record: recording ", 1, true) and not alive(pid) then
      os.remove(outfile)
      local err = said(out)
      error("record: lecho record did not start: " .. (err ~= "" and err or "it exited saying nothing"), 2)
    end
    local h = setmetatable({ pid = pid, file = file, channels = chs, outfile = outfile }, Rec)
    R.out(tostring(h) .. (up and "" or " (not recording yet after 10 s)"))
    return h
  end)

  R.command("replay", "replay(file | {files}, {speed=, rename=, paused=})",
    "publish a recording again, under your control", [[
Publishes the recording's events again on their channels (rename = { old =
"new" } for others), at the recorded pace times speed (1; "max": as fast as
the queues take them).  Consumers see meta.replay = true.  Returns a handle:
r:pause(), r:resume(), r:step([n]), r:seek{ t = seconds } or r:seek{ seq = n },
r:set_speed(x), r:status(), r:close().  paused = true starts paused.]], function(files, o)
    o = o or {}
    local rp, err = require("lecho.replay").new(ctx, files, {
      speed = o.speed, rename = o.rename, paused = o.paused,
      -- as lecho replay says it (issue 29 F11): what reached nobody, per
      -- channel (counted when sent), and damaged records skipped
      on_end = function(r)
        local unreached, by = r:unreached()
        local parts = {}
        for name, n in pairs(by) do parts[#parts + 1] = ("%s: %d"):format(name, n) end
        table.sort(parts)
        R.out(("replay: done, %d events sent%s%s"):format(r.sent,
          unreached > 0 and (", %d of them reached no consumer (%s)"):format(unreached, table.concat(parts, ", ")) or "",
          r.damaged > 0 and (", %d damaged records skipped"):format(r.damaged) or ""))
      end,
    })
    if not rp then error("replay: " .. tostring(err), 2) end
    R.replays[rp] = true    -- closed at the session's end (R.close_replays)
    for _, t in ipairs(rp.torn) do R.out("replay: " .. t) end
    local st = rp:status()
    R.out(("replay: %d events over %.3f s%s"):format(st.total, st.duration, rp.paused and ", paused" or ""))
    return rp
  end)
end

return M
