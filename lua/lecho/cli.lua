-- lecho.cli: what scripts/lecho does, the command-line tool for the daily
-- things (doc/operations.md "The lecho command"):
--
--   lecho ls                       channels of a name server, who produces, who consumes
--   lecho sub CHANNEL              print its events (Ctrl-C ends it)
--   lecho pub CHANNEL VALUE|-      submit a Lua literal, or JSON lines from stdin
--   lecho call SERVICE [ARGS]      call a service, print its reply
--   lecho stats [PROCESS]          one process's counters (default: the name server's)
--   lecho top                      live counters of every process of a name server
--   lecho bench                    a quick pub/sub and round-trip figure
--
-- JSON lines on stdout with --json (one object per line); messages on
-- stderr as "lecho SUB: ...".  Exit codes (M.EXIT): 0 done, 1 failed (a
-- name server or process unreachable, refused, a remote error, not
-- delivered), 2 usage, 3 timed out (sub --count not reached within --for,
-- a call or sync submit past its timeout), 130/143 ended by SIGINT/SIGTERM
-- (after closing the context: what was queued is delivered within its
-- linger).  Leans on lecho (the public API), lecho.stats (remote counters),
-- lecho.server (option kinds), lecho.repl.json and lecho.repl.pretty
-- (output) and lecho.repl.term (signals from a signalfd).

local server = require "lecho.server"

local M = {}

M.EXIT = { ok = 0, failed = 1, usage = 2, timeout = 3, sigint = 130, sigterm = 143 }
local EXIT = M.EXIT

local DEFAULT_NS = "127.0.0.1:7700"

local COMMON = [[
Common options (every subcommand):
  --nameserver ADDRESS  the name server (default $LECHO_NAMESERVER, else 127.0.0.1:7700)
  --key FILE            secret key file, keyed mode (default $LECHO_KEY)
  --trust FILE          trusted key or trust list (repeatable; default $LECHO_TRUST)
  --timeout SECONDS     control requests and calls (default 5)
  --help                the subcommand's help
Exit codes: 0 done, 1 failed, 2 usage, 3 timed out, 130/143 ended by SIGINT/SIGTERM.
Logs go to stderr (LECHO_LOG=debug|info|warn|error; default error here:
                      what failed is said by the tool itself).
]]

local USAGE = {}
USAGE.main = [[
usage: lecho SUBCOMMAND [OPTIONS] [ARGS]

  ls                      list the channels of a name server
  sub CHANNEL             print the events of a channel until Ctrl-C
  pub CHANNEL VALUE|-     submit a value (a Lua literal), or JSON lines from stdin
  call SERVICE [ARGS]     call a service (ARGS: a Lua literal) and print its reply
  stats [PROCESS]         a process's counters (default: the name server's)
  top                     live counters of every process of a name server
  bench                   a quick pub/sub throughput and round-trip latency figure
  record CHANNEL... --out FILE   write a channel's events to a file (doc/recording.md)
  replay FILE...          publish a recording again: 1x, Nx, max, or step by step

`lecho SUBCOMMAND --help` says more of each.
]] .. COMMON

USAGE.ls = [[
usage: lecho ls [--json]

Lists the channels the name server (and its managers) know: for each, its
manager and the processes that produce and consume it.
  --json      one JSON object per channel: {"channel", "manager", "producers", "consumers", "modulators"}
]] .. COMMON

USAGE.sub = [[
usage: lecho sub CHANNEL [--modulator FILE] [--params LUA] [--history N|last|key] [--json] [--count N] [--for SECONDS]

Prints each event of CHANNEL as it comes, one line each, until Ctrl-C (exit 130).
Says on stderr at once when CHANNEL has no producer yet (a misspelt name?), and waits.
  --modulator FILE   run this modulator at the producers (doc/modulators.md)
  --params LUA       its parameters, a Lua table literal ('{ stride = 4 }')
  --history N|last|key  first the last N events each producer keeps (doc/api.md
                     "History"), or what the modulator sent since its last key
                     frame when it marks them (doc/modulators.md), then the live ones
  --json             one JSON object per event: {"channel", "producer", "seq", "value"}
                     (an array as {"dtype", "shape", "data"}: its elements flat, row-major)
                     (and "history": true, "replay": true when meta says so)
  --count N          exit 0 after N events
  --for SECONDS      exit after this long: 0 if --count was reached or not given, else 3
]] .. COMMON

USAGE.pub = [[
usage: lecho pub CHANNEL VALUE [--sync] [--json]
       lecho pub CHANNEL - [--sync] [--json] < lines.json

Submits VALUE, a Lua literal ('42', '"text"', '{ x = 1, tags = { "a" } }'),
or, with -, every line of stdin as a JSON value (blank lines skipped), in
order.  Waits for the channel's consumers to be known first (none within
--wait: says "no consumer of CHANNEL", sends nothing, exits 1), and on exit
delivers what was queued (the context's linger).
  --string           VALUE is a plain string, not a Lua literal
  --sync             wait until every consumer handled each event (p:submit_sync);
                     exit 1 if one failed, 3 on a timeout
  --json             one JSON line per event: {"n", "ok", "error"?}
  --wait SECONDS     how long to wait for a consumer first (default 2; 0: do not)
]] .. COMMON

USAGE.call = [[
usage: lecho call SERVICE [ARGS] [--json] [--version N] [--at ADDRESS]

Calls SERVICE (ctx:call) with ARGS, a Lua literal (default nil), and prints
its results, one per line (--json: {"results": [...]}).  A remote error
exits 1 with its message on stderr.
  --version N        that version of the service
  --at ADDRESS       that server only
]] .. COMMON

USAGE.stats = [[
usage: lecho stats [PROCESS] [--json]

Prints the counters of the process at PROCESS (HOST:PORT; default the name
server): per peer and per channel events, bytes, drops, queues, and the sync
latencies.  Keyed mode: the process's name server's policy must allow the
action stats (doc/security.md).
  --json             the whole snapshot as one JSON object
]] .. COMMON

USAGE.top = [[
usage: lecho top [--interval SECONDS] [--once] [--count N] [--json]

Shows the counters of every process the name server knows (itself, its
managers, every producer and consumer), refreshed every --interval (1 s)
until Ctrl-C.  On a terminal the screen is redrawn; in a pipe each refresh
is printed after the last.
  --once             one refresh (rates over one interval), then exit
  --count N          N refreshes, then exit
  --json             one JSON object per process per refresh
]] .. COMMON

USAGE.bench = [[
usage: lecho bench [--count N] [--size BYTES] [--rtt N] [--for SECONDS] [--json]

Starts a consumer in a child process, then measures from this one: async
pub/sub throughput (--count events of --size bytes, then one sync event
that returns once all were handled) and the sync round trip (--rtt
submit_sync one after the other: median, p99).  Bounded by --for seconds
(default 10): a part cut short says so.
  --count N          events for the throughput (default 100000)
  --size BYTES       bytes of each event's string (default 128)
  --rtt N            round trips (default 1000)
  --channel NAME     the channel (default bench.PID)
  --json             one JSON object with the figures
]] .. COMMON

USAGE.record = [[
usage: lecho record CHANNEL... --out FILE [--max-bytes BYTES] [--keep N] [--append]
                   [--for SECONDS] [--count N] [--json]

Writes every event of the CHANNELs (values as they came on the wire, arrays
untouched; producer, sequence number, time) to FILE until Ctrl-C, in the
append-only format of doc/recording.md.  A record is written whole or
detected as torn: after a crash, replay (or --append) cuts the torn tail.
  --out FILE         the file (refused when it exists, unless --append)
  --append           go on after what FILE holds (its torn tail cut first)
  --max-bytes BYTES  rotate past this size: FILE -> FILE.1 -> ... -> FILE.KEEP
                     (>= 4096; a file larger only to hold one larger event)
  --keep N           rotated files kept (default 3; the oldest is dropped)
  --for SECONDS      stop after this long
  --count N          stop after N events (exactly N written)
  --json             the summary at the end as one JSON object
]] .. COMMON

USAGE.replay = [[
usage: lecho replay FILE... [--speed X|max] [--step] [--rename OLD=NEW]...
                   [--seek-time SECONDS] [--seek-seq N] [--wait SECONDS] [--check] [--json]

Publishes the events of the recordings (in the order given) again on their
channels, at their recorded pace times --speed (default 1; "max": as fast
as the queues take them), files oldest first (FILE.2 FILE.1 FILE; out of
order: refused).  Consumers see meta.replay = true.  A torn tail is said on
stderr and ignored; a damaged record is said, skipped and counted
(damaged=N), and the whole records after it are replayed.
  --rename OLD=NEW   publish channel OLD's events on NEW (repeatable)
  --step             start paused and read commands from stdin, one a line:
                     step [N], play, pause, seek t=SECONDS, seek seq=N,
                     speed X, status, quit (each answered with a status line,
                     a refused one with its reason; t is the played time;
                     read once the file is loaded: the first status line)
  --seek-time S      start S seconds into the recording
  --seek-seq N       start at the first event with sequence number N or later
  --wait SECONDS     first wait (at most this long, default 2; 0: do not) for a
                     consumer of each channel
Events sent while their channel had no consumer are said on stderr (per
channel) and counted (unreached=N in the summary).  Exits 1 when an event
could not be sent, none reached a consumer, or the files had damage; else 0.
  --check            only read the files: events, channels, duration, torn
                     tail, damage, each producer's sequence gaps (exit 1 on
                     damage, gaps or files out of order)
  --json             status and summary lines as JSON
]] .. COMMON

-- The options of each subcommand: { flag, key, kind }; kinds of
-- lecho.server, "flag", "lua" (a literal), "int0" (>= 0).
local COMMON_OPTS = {
  { "--nameserver", "nameserver", "address" }, { "--key", "key", "string" },
  { "--trust", "trust", "string", many = true }, { "--timeout", "timeout", "seconds" },
}
local OPTS = {
  ls = { { "--json", "json", "flag" } },
  sub = { { "--modulator", "modulator", "string" }, { "--params", "params", "string" },
          { "--history", "history", "string" },
          { "--json", "json", "flag" }, { "--count", "count", "count" }, { "--for", "duration", "seconds" } },
  pub = { { "--sync", "sync", "flag" }, { "--json", "json", "flag" }, { "--string", "string", "flag" },
          { "--wait", "wait", "seconds0" } },
  call = { { "--json", "json", "flag" }, { "--version", "version", "count" }, { "--at", "at", "address" } },
  stats = { { "--json", "json", "flag" } },
  top = { { "--interval", "interval", "seconds" }, { "--once", "once", "flag" },
          { "--count", "count", "count" }, { "--json", "json", "flag" } },
  bench = { { "--count", "count", "count" }, { "--size", "size", "count" }, { "--rtt", "rtt", "count" },
            { "--for", "duration", "seconds" }, { "--channel", "channel", "string" },
            { "--json", "json", "flag" }, { "--sink", "sink", "string" } },
  record = { { "--out", "out", "string" }, { "--max-bytes", "max_bytes", "count" }, { "--keep", "keep", "count" },
             { "--append", "append", "flag" }, { "--for", "duration", "seconds" }, { "--count", "count", "count" },
             { "--json", "json", "flag" } },
  replay = { { "--speed", "speed", "string" }, { "--step", "step", "flag" },
             { "--rename", "rename", "string", many = true }, { "--seek-time", "seek_time", "seconds0" },
             { "--seek-seq", "seek_seq", "count" }, { "--wait", "wait", "seconds0" }, { "--check", "check", "flag" },
             { "--json", "json", "flag" } },
}
-- positional arguments: { names }, how many at least
local POS = { ls = { {}, 0 }, sub = { { "CHANNEL" }, 1 }, pub = { { "CHANNEL", "VALUE" }, 2 },
              call = { { "SERVICE", "ARGS" }, 1 }, stats = { { "PROCESS" }, 0 }, top = { {}, 0 },
              bench = { {}, 0 }, record = { { "CHANNEL" }, 1, many = true }, replay = { { "FILE" }, 1, many = true } }

local function die(cmd, msg, code)
  io.stderr:write("lecho", cmd and (" " .. cmd) or "", ": ", msg, "\n")
  os.exit(code or EXIT.usage)
end
M.die = die

--- Reads argv for subcommand cmd: options (anywhere; `--` ends them),
-- positionals; --help prints its usage and exits 0; anything wrong exits 2.
function M.parse(cmd, argv)
  local by = {}
  for _, o in ipairs(COMMON_OPTS) do by[o[1]] = o end
  for _, o in ipairs(OPTS[cmd]) do by[o[1]] = o end
  local opts, pos = { trust = {}, rename = {} }, {}
  local i, rest = 1, false
  while argv[i] do
    local a = argv[i]
    if rest or a == "-" or a:sub(1, 1) ~= "-" or (a:match("^%-%d") and not by[a]) then
      pos[#pos + 1] = a
    elseif a == "--" then
      rest = true
    elseif a == "--help" or a == "-h" then
      io.write(USAGE[cmd])
      os.exit(EXIT.ok)
    else
      local flag, inline = a:match("^(%-%-[%w-]+)=(.*)$")
      flag = flag or a
      local o = by[flag]
      if not o then die(cmd, ("unknown option '%s' (lecho %s --help)"):format(a, cmd)) end
      if o[3] == "flag" then
        if inline then die(cmd, flag .. " takes no value") end
        opts[o[2]] = true
      else
        local v = inline
        if v == nil then
          i = i + 1
          v = argv[i]
          if v == nil then die(cmd, flag .. " needs a value") end
        end
        local ok, why = server.kinds[o[3]](v)
        if ok == nil then die(cmd, ("%s %s, not '%s'"):format(flag, why, v)) end
        if o.many then table.insert(opts[o[2]], ok) else opts[o[2]] = ok end
      end
    end
    i = i + 1
  end
  local names, least = POS[cmd][1], POS[cmd][2]
  if #pos < least then
    die(cmd, ("%s is required\n%s"):format(names[#pos + 1], USAGE[cmd]))
  end
  if #pos > #names and not POS[cmd].many then die(cmd, ("unexpected argument '%s' (lecho %s --help)"):format(pos[#names + 1], cmd)) end
  return opts, pos
end

-- A Lua literal: a constant expression (numbers, strings, booleans, nil,
-- tables of them); no names, no calls.  value, or nil, why.
function M.literal(s)
  local f, err = loadstring("return " .. s, "=value")
  if not f then return nil, (tostring(err):gsub("^value:%d+: ", "")) end
  setfenv(f, setmetatable({}, { __index = function(_, k)
    error(("'%s' is a name, not a literal (a string needs quotes: '\"%s\"')"):format(tostring(k), tostring(k)), 0)
  end }))
  local ok, v = pcall(f)
  if not ok then return nil, tostring(v) end
  return true, v
end

local json -- lecho.repl.json, loaded on first use (lecho.jsonw: numbers exact)
-- One JSON line; the fields that are lists are written [] when empty.
local JSON_OPTS = { lists = { producers = true, consumers = true, modulators = true, results = true,
                              damage = true, gaps = true, channels = true } }
local function emit(obj)
  json = json or require "lecho.repl.json"
  json.emit(obj, JSON_OPTS)
end
local function pretty(v)
  return require("lecho.repl.pretty").pretty(v)
end

-- The context of the tool: protected mode or keyed (--key/--trust, or
-- the environment), logs at error unless LECHO_LOG says otherwise.
local function context(cmd, opts, extra)
  local lecho = require "lecho"
  local copts = {
    nameserver = opts.nameserver or os.getenv("LECHO_NAMESERVER") or DEFAULT_NS,
    key = opts.key, trust = #opts.trust > 0 and opts.trust or nil,
    timeout = opts.timeout, log_level = os.getenv("LECHO_LOG") == nil and "error" or nil,
  }
  for k, v in pairs(extra or {}) do copts[k] = v end
  if type(copts.nameserver) == "string" then
    local a, why = require("lecho.addr").parse(copts.nameserver)
    if not a then die(cmd, ("the name server address %s: %s"):format(copts.nameserver, why)) end
  end
  local ok, ctx = pcall(lecho.context, copts)
  if not ok then die(cmd, server.message(ctx), EXIT.failed) end
  return ctx
end

-- SIGINT and SIGTERM from a signalfd on the loop (lecho.repl.term): fn(sig)
-- runs in a callback; the default ends the program cleanly.
local function on_signals(ctx, fn)
  local term = require "lecho.repl.term"
  local sig = term.sig
  sig.setup()
  if sig.fd < 0 then return nil end
  return ctx:on_readable(sig.fd, function()
    local s = sig.take()
    if s then fn(s) end
  end)
end
local function signal_exit(s) return s == 2 and EXIT.sigint or (s == 15 and EXIT.sigterm or 128 + s) end

-- Finishing: close the context (delivering what was queued), flush, exit.
local function finish(ctx, code)
  if ctx and not ctx.closed then ctx:close() end
  io.stdout:flush()
  os.exit(code)
end

local function code_exit(code)
  return code == "timeout" and EXIT.timeout or EXIT.failed
end

------------------------------------------------------------------------------
-- ls

local function sorted(t)
  local k = {}
  for n in pairs(t or {}) do k[#k + 1] = n end
  table.sort(k)
  return k
end

local cmds = {}

function cmds.ls(opts)
  local ctx = context("ls", opts)
  local chans, managers, truncated = ctx:list()
  if not chans then
    io.stderr:write("lecho ls: ", tostring(managers), "\n")
    finish(ctx, code_exit(truncated))
  end
  -- channels held by another manager: asked there
  local asked = {}
  for _, name in ipairs(sorted(chans)) do
    local e = chans[name]
    if e.manager and e.manager ~= ctx.ns and not e.producers and not asked[e.manager] then
      asked[e.manager] = true
      local more = ctx:list(e.manager)
      for n, m in pairs(more or {}) do chans[n] = m end
    end
  end
  local n = 0
  for _, name in ipairs(sorted(chans)) do
    local e = chans[name]
    n = n + 1
    if opts.json then
      emit{ channel = name, manager = e.manager, producers = sorted(e.producers), consumers = sorted(e.consumers),
            modulators = sorted(e.modulators) }
    else
      io.write(("%s\n  manager   %s\n  producers %s\n  consumers %s\n"):format(name, tostring(e.manager),
        table.concat(sorted(e.producers), " "), table.concat(sorted(e.consumers), " ")))
      local mods = sorted(e.modulators)
      if #mods > 0 then io.write("  modulators ", table.concat(mods, " "), "\n") end
    end
  end
  if not opts.json and n == 0 then io.write("(no channels at ", ctx.ns, ")\n") end
  if truncated then io.stderr:write(("lecho ls: %d more channels left out by the name server\n"):format(truncated)) end
  finish(ctx, EXIT.ok)
end

------------------------------------------------------------------------------
-- sub

function cmds.sub(opts, pos)
  local name = pos[1]
  local lecho = require "lecho"
  local src, params
  if opts.modulator then
    local ok, s, merr = pcall(lecho.modulator, opts.modulator)
    if not ok or not s then
      die("sub", ("--modulator %s: %s"):format(opts.modulator, server.message(ok and merr or s)))
    end
    src = s
  end
  if opts.params then
    local ok, v = M.literal(opts.params)
    if not ok or type(v) ~= "table" then
      die("sub", ("--params needs a Lua table literal, not '%s'%s"):format(opts.params, ok and "" or (": " .. v)))
    end
    params = v
  end
  local ctx = context("sub", opts)
  local seen, code = 0, nil
  local function handler(v, meta)
    -- past --count (a history and the events held behind it come in one go)
    if opts.count and seen >= opts.count then return end
    seen = seen + 1
    if opts.json then
      emit{ channel = meta.channel, producer = meta.producer, seq = meta.seq, value = v,
            history = meta.history, replay = meta.replay }
    else
      io.stdout:write(("%s %s #%d%s: %s\n"):format(meta.channel, meta.producer, meta.seq,
        (meta.history and " history" or "") .. (meta.replay and " replay" or ""),
        require("lecho.repl.pretty").short(v, 1000)))
      io.stdout:flush()
    end
    if opts.count and seen >= opts.count then code = EXIT.ok; ctx:stop() end
  end
  local ch, err, ecode = ctx:channel(name)
  if not ch then
    io.stderr:write("lecho sub: ", tostring(err), "\n")
    finish(ctx, code_exit(ecode))
  end
  local copts = src and { modulator = src, params = params } or nil
  if opts.history then
    local n = (opts.history == "last" or opts.history == "key") and opts.history or tonumber(opts.history)
    if not n then die("sub", ("--history needs a count, last or key, not '%s'"):format(opts.history)) end
    copts = copts or {}
    copts.history = n
  end
  -- what the consumer is told went wrong (a producer that refused the
  -- member list, or our key; a history that did not come): said here, the
  -- log being quiet by default (issue 29 F10)
  copts = copts or {}
  copts.on_error = function(msg) io.stderr:write("lecho sub: ", tostring(msg), "\n") end
  local ok, con, cerr, ccode = pcall(ch.consumer, ch, handler, copts)
  if not ok or not con then
    io.stderr:write("lecho sub: ", server.message(ok and cerr or con), "\n")
    finish(ctx, ok and code_exit(ccode) or EXIT.failed)
  end
  -- a misspelt name makes a new, empty channel: said at once (as the REPL's
  -- sub does), and the wait goes on (its producer may be yet to start)
  local chans = ctx:list()
  local info = chans and chans[ch.name]
  if info and not info.producers and info.manager and info.manager ~= ctx.ns then
    local m = ctx:list(info.manager)
    info = m and m[ch.name] or info
  end
  if chans and not (info and next(info.producers or {})) then
    io.stderr:write(("lecho sub: no producer on '%s' yet (lecho ls lists the channels); waiting\n"):format(name))
  end
  on_signals(ctx, function(s) code = signal_exit(s); ctx:stop() end)
  if opts.duration then
    ctx:after(opts.duration, function()
      code = code or ((opts.count and seen < opts.count) and EXIT.timeout or EXIT.ok)
      ctx:stop()
    end)
  end
  while code == nil and not ctx.closed do ctx:run() end
  finish(ctx, code or EXIT.ok)
end

------------------------------------------------------------------------------
-- pub

-- Waits (serving the loop) until the channel has a consumer somewhere, at
-- most `wait` seconds: what a fresh producer submits before its member
-- list arrived goes nowhere (nobody consumes yet).
local function wait_consumers(ctx, ch, wait)
  if not wait or wait <= 0 then return end
  local deadline = ctx:now() + wait
  while ctx:now() < deadline do
    -- the channel, or a modulator's stream of it ("name@key")
    for n, s in pairs(ctx:stats().channels) do
      if (n == ch.name or n:sub(1, #ch.name + 1) == ch.name .. "@") and (s.destinations or 0) > 0 then
        return true
      end
    end
    ctx:run_once(0.02)
  end
  return false
end

function cmds.pub(opts, pos)
  local name, text = pos[1], pos[2]
  local values -- an iterator of { ok, value | why }
  local ctx, interrupted
  local lines -- stdin's lines, read on the loop (made once the context is)
  if text == "-" then
    local cjson = require "cjson"
    local n = 0
    values = function()
      while true do
        local line = lines()
        if line == nil then return nil end
        n = n + 1
        if line:find("%S") then
          local ok, v = pcall(cjson.decode, line)
          if not ok then return { false, ("stdin line %d is not JSON: %s"):format(n, tostring(v)) } end
          if v == cjson.null then v = nil end
          return { true, v }
        end
      end
    end
  else
    local v
    if opts.string then
      v = text
    else
      local ok, lv = M.literal(text)
      if not ok then die("pub", ("VALUE is not a Lua literal: %s (or use --string)"):format(lv)) end
      v = lv
    end
    local done = false
    values = function()
      if done then return nil end
      done = true
      return { true, v }
    end
  end
  ctx = context("pub", opts)
  if text == "-" then
    -- stdin read on the loop, so that a signal is seen while it waits
    local term = require "lecho.repl.term"
    local buf, eof = "", false
    local w = ctx:on_readable(0, function(wt)
      local s = term.read_fd(0)
      if s == nil then eof = true; wt:stop() else buf = buf .. s end
    end)
    local up = values
    lines = function()
      while true do
        local line, rest = buf:match("^([^\n]*)\n(.*)$")
        if line then buf = rest return line end
        if eof or interrupted then
          if interrupted or buf == "" then return nil end
          line, buf = buf, ""
          return line
        end
        ctx:run_once(0.5)
      end
    end
    values = function() local v = up() if v == nil then w:stop() end return v end
  end
  local ch, err, ecode = ctx:channel(name)
  if not ch then
    io.stderr:write("lecho pub: ", tostring(err), "\n")
    finish(ctx, code_exit(ecode))
  end
  local okp, p, perr, pcode = pcall(ch.producer, ch)
  if not okp or not p then
    io.stderr:write("lecho pub: ", server.message(okp and perr or p), "\n")
    finish(ctx, okp and code_exit(pcode) or EXIT.failed)
  end
  on_signals(ctx, function(s) interrupted = s end)
  local wait = opts.wait == nil and 2 or opts.wait
  if wait_consumers(ctx, ch, wait) == false and not opts.sync and not interrupted then
    -- (--sync says it per event: submit_sync fails with noconsumer)
    io.stderr:write(("lecho pub: no consumer of %s within %g s: nothing delivered\n"):format(name, wait))
    p:close()
    ctx:close()
    finish(nil, EXIT.failed)
  end
  local n, code = 0, EXIT.ok
  for item in values do
    if interrupted then break end
    n = n + 1
    if not item[1] then
      io.stderr:write("lecho pub: ", item[2], "\n")
      code = EXIT.failed
      if opts.json then emit{ n = n, ok = false, error = item[2] } end
    else
      local ok, serr, scode
      if opts.sync then ok, serr, scode = p:submit_sync(item[2]) else ok, serr, scode = p:submit(item[2]) end
      if opts.json then emit{ n = n, ok = ok and true or false, error = not ok and tostring(serr) or nil,
                              code = not ok and scode or nil } end
      if not ok then
        io.stderr:write(("lecho pub: event %d: %s\n"):format(n, tostring(serr)))
        code = scode == "timeout" and EXIT.timeout or EXIT.failed
      end
    end
  end
  p:close()
  local cok, cerr = ctx:close()
  if not cok then
    io.stderr:write("lecho pub: ", tostring(cerr), "\n")
    if code == EXIT.ok then code = EXIT.failed end
  end
  if interrupted then code = signal_exit(interrupted) end
  finish(nil, code)
end

------------------------------------------------------------------------------
-- call

local function pack(...) return { n = select("#", ...), ... } end

function cmds.call(opts, pos)
  local name, args = pos[1], nil
  if pos[2] then
    local ok, v = M.literal(pos[2])
    if not ok then die("call", ("ARGS is not a Lua literal: %s"):format(v)) end
    args = v
  end
  local ctx = context("call", opts)
  local r = pack(ctx:call(name, args, { timeout = opts.timeout, version = opts.version, at = opts.at }))
  if r[1] == nil and r.n >= 2 then
    io.stderr:write(("lecho call: %s\n"):format(tostring(r[2])))
    if opts.json then emit{ error = tostring(r[2]), code = r[3] } end
    finish(ctx, code_exit(r[3]))
  end
  if opts.json then
    local list = {}
    for i = 1, r.n do list[i] = r[i] == nil and require("cjson").null or r[i] end
    emit{ results = list }
  else
    for i = 1, r.n do io.write(pretty(r[i]), "\n") end
  end
  finish(ctx, EXIT.ok)
end

------------------------------------------------------------------------------
-- stats

local function fmt_num(n)
  n = tonumber(n) or 0
  if n >= 1e9 then return ("%.1fG"):format(n / 1e9) end
  if n >= 1e6 then return ("%.1fM"):format(n / 1e6) end
  if n >= 1e4 then return ("%.1fk"):format(n / 1e3) end
  return ("%d"):format(n)
end

-- A histogram's quantile q (0..1) from its buckets (upper bound of the
-- bucket the q-th observation falls in; "+Inf" past the last).
local function quantile(h, bounds, q)
  if not h or (h.count or 0) == 0 then return nil end
  local want, acc = q * h.count, 0
  for i, c in ipairs(h.buckets) do
    acc = acc + c
    if acc >= want then return bounds[i] end
  end
  return math.huge
end
M.quantile = quantile

local function print_stats(s)
  local out = {}
  local function w(...) out[#out + 1] = table.concat({ ... }) end
  w(("%s  role %s%s  pid %s"):format(s.addr, s.role, s.principal and ("  principal " .. s.principal) or "",
                                     tostring(s.pid)))
  w(("connections %d  read buffers %s B  local queue %d events  encodes %s  bad frames %d  stale acks %d"):format(
    s.connections or 0, fmt_num(s.read_buffer_bytes), s.local_queue_events or 0, fmt_num(s.encodes),
    s.bad_frames or 0, s.stale_acks or 0))
  w("")
  -- the first column as wide as its longest entry (a modulator's stream,
  -- NAME@KEY, or an IPv6 address), so that the columns stay aligned
  local function width(t, least)
    for k in pairs(t or {}) do least = math.max(least, #tostring(k)) end
    return least
  end
  local pw, cw = width(s.peers, 28), width(s.channels, 36)
  local prow = "%-" .. pw .. "s %9s %9s %9s %9s %7s %9s %s"
  local crow = "%-" .. cw .. "s %9s %9s %9s %7s %5s %5s %s"
  w((prow):format("PEER", "EV_IN", "EV_OUT", "B_IN", "B_OUT", "DROPS", "QUEUE", "STATE"))
  for _, a in ipairs(sorted(s.peers)) do
    local p = s.peers[a]
    w((prow):format(a, fmt_num(p.events_in), fmt_num(p.events_out),
      fmt_num(p.bytes_in), fmt_num(p.bytes_out), fmt_num(p.drops), fmt_num(p.queue_events),
      p.connected and "up" or ("down" .. (p.last_error and (": " .. tostring(p.last_error)) or ""))))
  end
  w("")
  w((crow):format("CHANNEL", "EV_IN", "EV_OUT", "LOCAL", "DROPS", "PROD", "CONS",
                                                 "SYNC p50/p99"))
  local bounds = s.bounds or require("lecho.stats").BUCKETS
  for _, n in ipairs(sorted(s.channels)) do
    local c = s.channels[n]
    local h = s.sync_latency and s.sync_latency[n]
    local lat = ""
    if h and h.count > 0 then
      lat = ("<=%gms/<=%gms (%d)"):format(quantile(h, bounds, 0.5) * 1e3, quantile(h, bounds, 0.99) * 1e3, h.count)
    end
    w((crow):format(n, fmt_num(c.events_in), fmt_num(c.events_out),
      fmt_num(c.events_local), fmt_num(c.drops), tostring(c.producers or 0), tostring(c.consumers or 0), lat))
  end
  if s.truncated then w(("(%d entries left out)"):format(s.truncated)) end
  io.write(table.concat(out, "\n"), "\n")
end

M.print_stats = print_stats

function cmds.stats(opts, pos)
  local ctx = context("stats", opts)
  local target = ctx.ns
  if pos[1] then
    local a, why = require("lecho.addr").parse(pos[1])
    if not a then die("stats", ("PROCESS needs HOST:PORT, [V6]:PORT or unix:/PATH (%s), not '%s'"):format(why, pos[1])) end
    target = a
  end
  local s, err, code = require("lecho.stats").fetch(ctx, target, opts.timeout)
  if not s then
    io.stderr:write("lecho stats: ", tostring(err), "\n")
    finish(ctx, code_exit(code))
  end
  if opts.json then emit(s) else print_stats(s) end
  finish(ctx, EXIT.ok)
end

------------------------------------------------------------------------------
-- top

-- Every process the name server knows: itself, its managers, the
-- producers and consumers of its channels (and of its managers').
local function processes(ctx)
  local chans, managers, _ = ctx:list()
  if not chans then return nil, managers, _ end
  local set = { [ctx.ns] = true }
  for _, m in ipairs(managers or {}) do
    set[m] = true
    local more = ctx:list(m)
    for n, e in pairs(more or {}) do chans[n] = e end
  end
  for _, e in pairs(chans) do
    if e.manager then set[e.manager] = true end
    for a in pairs(e.producers or {}) do set[a] = true end
    for a in pairs(e.consumers or {}) do set[a] = true end
  end
  set[ctx.addr] = nil -- not this tool itself
  return sorted(set)
end

-- Fetches the stats of every address at once (a coroutine each), waits for
-- all: { [addr] = stats or { error = why } }.
local function fetch_all(ctx, addrs, timeout)
  local st = require "lecho.stats"
  local got, left = {}, #addrs
  for _, a in ipairs(addrs) do
    ctx:_spawn(function()
      local s, err = st.fetch(ctx, a, timeout)
      got[a] = s or { error = tostring(err) }
      left = left - 1
    end)
  end
  ctx:_wait(function() return left == 0 end, ctx:now() + timeout + 1)
  return got
end

local function totals(s)
  local t = { ev_in = 0, ev_out = 0, b_in = 0, b_out = 0, drops = 0, queue = 0, chans = 0 }
  for _, p in pairs(s.peers or {}) do
    t.ev_in, t.ev_out = t.ev_in + (p.events_in or 0), t.ev_out + (p.events_out or 0)
    t.b_in, t.b_out = t.b_in + (p.bytes_in or 0), t.b_out + (p.bytes_out or 0)
    t.drops, t.queue = t.drops + (p.drops or 0), t.queue + (p.queue_events or 0)
  end
  for _, c in pairs(s.channels or {}) do
    t.chans = t.chans + 1
    t.ev_local = (t.ev_local or 0) + (c.events_local or 0)
  end
  t.ev_local = t.ev_local or 0
  return t
end

function cmds.top(opts)
  local interval = opts.interval or 1
  local ctx = context("top", opts)
  local tty = require("lecho.repl.term").interactive and not opts.once and not opts.json
  local code
  on_signals(ctx, function(s) code = signal_exit(s); ctx:stop() end)
  local timeout = math.min(opts.timeout or 2, interval * 2)
  local prev, prev_t = {}, nil
  local rounds = 0
  local want = opts.once and 2 or (opts.count and opts.count + 1) or math.huge
  while code == nil do
    local addrs, err, ecode = processes(ctx)
    if not addrs then
      io.stderr:write("lecho top: ", tostring(err), "\n")
      finish(ctx, code_exit(ecode))
    end
    local got = fetch_all(ctx, addrs, timeout)
    local t = ctx:now()
    rounds = rounds + 1
    if rounds > 1 or want == 1 then
      local dt = prev_t and t - prev_t or nil
      local rows = {}
      for _, a in ipairs(addrs) do
        local s = got[a]
        local row = { process = a }
        if s.error then
          row.error = s.error
        else
          local tt = totals(s)
          local p = prev[a]
          row.role, row.principal, row.pid = s.role, s.principal, s.pid
          row.connections, row.channels = s.connections, tt.chans
          row.events_in, row.events_out, row.events_local = tt.ev_in, tt.ev_out, tt.ev_local
          row.bytes_in, row.bytes_out, row.drops, row.queue_events = tt.b_in, tt.b_out, tt.drops, tt.queue
          if p and dt and dt > 0 then
            row.in_per_s = math.max(0, (tt.ev_in - p.ev_in) / dt)
            row.out_per_s = math.max(0, (tt.ev_out - p.ev_out) / dt)
            row.local_per_s = math.max(0, (tt.ev_local - p.ev_local) / dt)
          end
        end
        rows[#rows + 1] = row
      end
      if opts.json then
        for _, row in ipairs(rows) do emit(row) end
      else
        local out = {}
        if tty then out[1] = "\27[H\27[2J" end
        out[#out + 1] = ("lecho top: %s, %d process%s, every %gs (Ctrl-C ends)\n"):format(ctx.ns, #rows,
          #rows == 1 and "" or "es", interval)
        out[#out + 1] = ("%-24s %-10s %5s %5s %9s %9s %9s %8s %8s %8s %6s %6s\n"):format("PROCESS", "ROLE", "CONNS",
          "CHANS", "EV_IN", "EV_OUT", "LOCAL", "IN/s", "OUT/s", "LOCAL/s", "DROPS", "QUEUE")
        for _, r in ipairs(rows) do
          if r.error then
            out[#out + 1] = ("%-24s %s\n"):format(r.process, r.error)
          else
            out[#out + 1] = ("%-24s %-10s %5d %5d %9s %9s %9s %8s %8s %8s %6s %6s\n"):format(r.process,
              r.principal or r.role, r.connections or 0, r.channels, fmt_num(r.events_in), fmt_num(r.events_out),
              fmt_num(r.events_local), fmt_num(r.in_per_s or 0), fmt_num(r.out_per_s or 0),
              fmt_num(r.local_per_s or 0), fmt_num(r.drops), fmt_num(r.queue_events))
          end
        end
        io.write(table.concat(out))
        if not tty then io.write("\n") end
        io.stdout:flush()
      end
    end
    prev, prev_t = {}, t
    for a, s in pairs(got) do if not s.error then prev[a] = totals(s) end end
    if rounds >= want then break end
    local wake = t + interval
    while code == nil and ctx:now() < wake do ctx:run_once(wake - ctx:now()) end
  end
  finish(ctx, code or EXIT.ok)
end

------------------------------------------------------------------------------
-- bench

-- The child: consumes the channel until its stdin closes.
local function bench_sink(opts)
  local ctx = context("bench", opts)
  local ch = ctx:channel(opts.sink)
  local n = 0
  local con = ch:consumer(function() n = n + 1 end)
  if not con then os.exit(EXIT.failed) end
  ctx:on_readable(0, function()
    local s = io.stdin:read(1)
    if s == nil then ctx:stop() end
  end)
  ctx:run()
  finish(ctx, EXIT.ok)
end

local function q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

-- This process's command line up to its script: the interpreter is arg's
-- lowest index, and what lies between it and the script (arg[0]) are its
-- options, passed along: LuaRocks' wrapper runs `luajit -e 'LOADER' SCRIPT`,
-- whose -e chunk sets the paths the child needs too.
local function self_command()
  if not arg or not arg[0] then return "luajit lecho" end
  local lo = 0
  while arg[lo - 1] ~= nil do lo = lo - 1 end
  local words = {}
  if lo == 0 then   -- no interpreter in arg (an embedding host): the running executable
    local ffi = require "ffi"
    pcall(ffi.cdef, "long readlink(const char *, char *, size_t);")
    local buf = ffi.new("char[4096]")
    local n = tonumber(ffi.C.readlink("/proc/self/exe", buf, 4096))
    words[1] = q(n > 0 and ffi.string(buf, n) or "luajit")
  end
  for i = lo, 0 do words[#words + 1] = q(arg[i]) end
  return table.concat(words, " ")
end

function cmds.bench(opts)
  if opts.sink then return bench_sink(opts) end
  local count, size, rtt = opts.count or 100000, opts.size or 128, opts.rtt or 1000
  local budget = opts.duration or 10
  local ctx = context("bench", opts)
  local t_end = ctx:now() + budget
  local name = opts.channel or ("bench." .. require("lecho.stats").snapshot(ctx).pid)
  local ch = ctx:channel(name)
  local p, perr = ch:producer()
  if not p then die("bench", tostring(perr), EXIT.failed) end
  local cmd = ("%s bench --sink %s --nameserver %s"):format(self_command(), q(name), q(ctx.ns))
  if opts.key then cmd = cmd .. " --key " .. q(opts.key) end
  for _, t in ipairs(opts.trust) do cmd = cmd .. " --trust " .. q(t) end
  local child = io.popen(cmd, "w")
  local interrupted
  on_signals(ctx, function(s) interrupted = s end)
  if not wait_consumers(ctx, ch, math.min(10, budget)) then
    child:close()
    io.stderr:write("lecho bench: the consumer process did not join within ", math.min(10, budget), " s\n")
    finish(ctx, EXIT.failed)
  end
  local payload = ("x"):rep(size)
  local res = { channel = name, size = size }
  -- throughput: count async events, then one sync event: all handled
  local t0 = ctx:now()
  local sent = 0
  for i = 1, count do
    if interrupted or (i % 1024 == 0 and ctx:now() > t_end) then break end
    local ok, err = p:submit(payload)
    if not ok then io.stderr:write("lecho bench: submit: ", tostring(err), "\n") break end
    sent = i
  end
  local ok, err = p:submit_sync("end", { timeout = math.max(1, t_end - ctx:now()) })
  local t1 = ctx:now()
  res.events, res.seconds = sent, t1 - t0
  res.events_per_s = sent / math.max(t1 - t0, 1e-9)
  res.mbytes_per_s = res.events_per_s * size / 1e6
  res.truncated = (sent < count) or nil
  if not ok then res.throughput_error = tostring(err) end
  -- round trips, one after the other
  local lat = {}
  for _ = 1, rtt do
    if interrupted or ctx:now() > t_end then res.truncated = true break end
    local a = ctx:now()
    local sok, serr = p:submit_sync(payload, { timeout = 5 })
    if not sok then res.rtt_error = tostring(serr) break end
    lat[#lat + 1] = ctx:now() - a
  end
  table.sort(lat)
  res.round_trips = #lat
  if #lat > 0 then
    res.rtt_median_us = lat[math.max(1, math.ceil(#lat * 0.5))] * 1e6
    res.rtt_p99_us = lat[math.max(1, math.ceil(#lat * 0.99))] * 1e6
  end
  p:close()
  -- ours first: the child's close waits until we closed our side
  ctx:close()
  child:close()
  if opts.json then
    emit(res)
  else
    io.write(("pub/sub   %d events of %d B in %.3f s: %s events/s, %.1f MB/s%s\n"):format(res.events, size,
      res.seconds, fmt_num(res.events_per_s), res.mbytes_per_s, res.throughput_error and (" (" .. res.throughput_error .. ")") or ""))
    if res.round_trips > 0 then
      io.write(("round trip %d sync submits: median %.0f us, p99 %.0f us%s\n"):format(res.round_trips,
        res.rtt_median_us, res.rtt_p99_us, res.rtt_error and (" (" .. res.rtt_error .. ")") or ""))
    end
    if res.truncated then io.write("(cut short by --for or a signal)\n") end
  end
  local code = (res.throughput_error or res.rtt_error) and EXIT.failed or EXIT.ok
  if interrupted then code = signal_exit(interrupted) end
  finish(ctx, code)
end

------------------------------------------------------------------------------
-- record and replay (lecho.recording, lecho.replay; doc/recording.md)

function cmds.record(opts, pos)
  if not opts.out then die("record", "--out FILE is required\n" .. USAGE.record) end
  local recording = require "lecho.recording"
  local ctx = context("record", opts)
  local w, werr = recording.writer(opts.out, { max_bytes = opts.max_bytes, keep = opts.keep, append = opts.append,
                                               recorder = ctx.addr })
  if not w then
    io.stderr:write("lecho record: ", tostring(werr), "\n")
    finish(ctx, EXIT.failed)
  end
  if w.cut then
    io.stderr:write(("lecho record: %s: torn tail at byte %d (%d bytes) cut\n"):format(opts.out, w.cut.offset,
                                                                                      w.cut.bytes))
  end
  local code
  local r, err, ecode = recording.record(ctx, pos, w, {
    -- without --count the events are written from C, never entering Lua
    direct = not opts.count,
    limit = opts.count,   -- exact: the rest of the batch that brought the Nth is not written
    on_error = function(e)
      io.stderr:write("lecho record: ", tostring(e), "\n")
      code = EXIT.failed
      ctx:stop()
    end,
    on_event = function(rec)
      if opts.count and rec.events >= opts.count then code = EXIT.ok; ctx:stop() end
    end,
  })
  if not r then
    io.stderr:write("lecho record: ", server.message(err), "\n")
    w:close()
    finish(ctx, code_exit(ecode))
  end
  io.stderr:write(("lecho record: recording %s to %s\n"):format(table.concat(pos, ", "), opts.out))
  on_signals(ctx, function(s) code = signal_exit(s); ctx:stop() end)
  if opts.duration then ctx:after(opts.duration, function() code = code or EXIT.ok; ctx:stop() end) end
  while code == nil and not ctx.closed do ctx:run() end
  r.stop()
  w:close()
  if (r.refused or 0) > 0 then
    io.stderr:write(("lecho record: %d events past --count %d not recorded\n"):format(r.refused, opts.count))
  end
  local summary = { file = opts.out, events = w.events, bytes = w.bytes, rotations = w.rotations }
  if opts.json then emit(summary)
  else
    io.stdout:write(("recorded %d events, %d bytes, to %s%s\n"):format(w.events, w.bytes, opts.out,
      w.rotations > 0 and (" (%d rotations)"):format(w.rotations) or ""))
  end
  finish(ctx, code or EXIT.ok)
end

local function replay_status(opts, st)
  if opts.json then return emit(st) end
  io.stdout:write(("replay %d/%d sent=%d t=%.3f/%.3f %s%s%s\n"):format(st.pos, st.total, st.sent,
    st.t, st.duration, st.done and "done" or (st.paused and "paused" or "playing"),
    ((st.unreached or 0) > 0 and (" unreached=%d"):format(st.unreached) or "")
      .. (st.damaged and (" damaged=%d"):format(st.damaged) or ""),
    (st.err and (" error: " .. st.err) or "") .. (st.error and (" refused: " .. st.error) or "")))
  io.stdout:flush()
end

function cmds.replay(opts, pos)
  local recording = require "lecho.recording"
  local started = recording.wall()
  if opts.check then
    local code = EXIT.ok
    local scans, all = {}, {}
    for _, f in ipairs(pos) do
      local r, err = recording.scan(f)
      if not r then
        io.stderr:write("lecho replay: ", tostring(err), "\n")
        code = EXIT.failed
      else
        scans[#scans + 1] = r
        local e = r.events
        -- sequence gaps of each producer (issue 29 F13), across the files
        -- given, said at the file where the gap ends
        local from = #all
        for _, x in ipairs(e) do all[#all + 1] = x end
        local gaps, missing = {}, 0
        for _, g in ipairs(recording.gaps(all)) do
          if g.at > from then gaps[#gaps + 1] = g missing = missing + g.missing end
        end
        local s = { file = f, events = #e, channels = r.channels, duration = e[1] and e[#e].t or 0,
                    bytes = r.size, torn = r.torn, damage = r.damage, unindexed = r.unindexed, gaps = gaps,
                    missing = missing }
        local what = r.torn and (r.torn.damaged and "DAMAGED record" or "torn tail")
        if opts.json then emit(s) else
          io.stdout:write(("%s: %d events on %s, %.3f s%s\n"):format(f, #e, table.concat(r.channels, ", "),
            s.duration, r.torn and (", %s at byte %d (%d bytes: %s)"):format(what, r.torn.offset, r.torn.bytes,
                                                                              r.torn.why) or ""))
          for _, d in ipairs(r.damage) do
            io.stdout:write(("%s: DAMAGED record at byte %d (%s): %d bytes skipped%s\n"):format(f, d.offset, d.why,
              d.bytes, r.unindexed > 0 and (", %d events after it unplaceable"):format(r.unindexed) or ""))
          end
          for k, g in ipairs(gaps) do
            if k > 10 then io.stdout:write(("%s: ... %d more gaps\n"):format(f, #gaps - 10)) break end
            io.stdout:write(("%s: %s on %s: seq %d then %d (%s)\n"):format(f, g.producer, g.ch, g.after, g.next,
              g.backwards and "backwards" or (g.missing .. " missing")))
          end
        end
        -- damage past a crash's torn tail, or events missing between
        -- others: the file is not what was written
        if (r.torn and r.torn.damaged) or #r.damage > 0 or #gaps > 0 then code = EXIT.failed end
      end
    end
    local oerr = recording.order(scans)
    if oerr then
      io.stderr:write("lecho replay: ", oerr, "\n")
      code = EXIT.failed
    end
    os.exit(code)
  end
  local speed = 1
  if opts.speed then
    speed = opts.speed == "max" and "max" or tonumber(opts.speed)
    if not speed or (speed ~= "max" and not (speed > 0)) then
      die("replay", ("--speed needs a number > 0 or max, not '%s'"):format(opts.speed))
    end
  end
  local rename = {}
  for _, r in ipairs(opts.rename) do
    local a, b = r:match("^([^=]+)=([^=]+)$")
    if not a then die("replay", ("--rename needs OLD=NEW, not '%s'"):format(r)) end
    rename[a] = b
  end
  local ctx = context("replay", opts)
  local code
  local rp, err = require("lecho.replay").new(ctx, pos, {
    speed = speed, rename = rename, paused = true,
    on_end = function(r) if not opts.step then code = code or (r.err and EXIT.failed or EXIT.ok); ctx:stop() end end,
  })
  if not rp then
    io.stderr:write("lecho replay: ", tostring(err), "\n")
    finish(ctx, EXIT.failed)
  end
  for _, t in ipairs(rp.torn) do io.stderr:write("lecho replay: ", t, "\n") end
  -- the channels, each waited for (at most --wait) to have a consumer
  local seen = {}
  for _, e in ipairs(rp.events) do
    local name = rename[e.ch] or e.ch
    if not seen[name] then
      seen[name] = true
      local ch = ctx:channel(name)
      -- as lecho pub: a consumer waited for first (default 2 s); a replay
      -- is long, so one may still come: said, and the replay goes on
      local wait = opts.wait == nil and 2 or opts.wait
      if ch and wait > 0 and not wait_consumers(ctx, ch, wait) then
        io.stderr:write(("lecho replay: no consumer of %s yet (what goes to it before one joins is lost)\n")
                        :format(name))
      end
    end
  end
  if opts.seek_time then rp:seek{ t = opts.seek_time } end
  if opts.seek_seq then rp:seek{ seq = opts.seek_seq } end
  on_signals(ctx, function(s) code = signal_exit(s); ctx:stop() end)
  if opts.step then
    -- commands from stdin, a line each, answered with a status line
    local buf = ""
    local function command(line)
      -- every command answered with a status line; a refused one with its
      -- reason (also on stderr) and the status unchanged (issue 29 F3)
      local st = rp:command(line)
      if st == nil then return end
      if st == "quit" then code = EXIT.ok; ctx:stop() return end
      if st.error then io.stderr:write("lecho replay: ", st.error, "\n") end
      ctx.c:flush()
      replay_status(opts, st)
    end
    -- stdin read on the loop; the commands run here, on the main line (a
    -- seek or a step may wait for room)
    local term = require "lecho.repl.term"
    local eof = false
    if io.stdin:seek("cur") then
      -- a file (epoll does not watch those): its commands are all there
      buf, eof = io.stdin:read("*a") or "", true
    else
      -- commands typed (or piped) while the file loaded run now, back to
      -- back: said, since a `play` then `status` then says sent=0 (issue 29)
      if term.readable(0) then
        io.stderr:write(("lecho replay: commands came while the recording loaded (%.1f s): they run now,"
          .. " one after the other (wait for the first status line)\n"):format(recording.wall() - started))
      end
      ctx:on_readable(0, function(wt)
        local r = term.read_fd(0)
        if r == nil then eof = true; wt:stop() else buf = buf .. r end
      end)
    end
    replay_status(opts, rp:status())
    while code == nil and not ctx.closed do
      local line, rest = buf:match("^([^\n]*)\n(.*)$")
      if line then
        buf = rest
        command(line)
      elseif eof then
        if buf ~= "" then command(buf) buf = "" end
        code = code or EXIT.ok
      else
        ctx:run_once(0.5)
      end
    end
  else
    rp:resume()
  end
  while code == nil and not ctx.closed do ctx:run() end
  local st = rp:status()
  if not rp:drain(60) then
    io.stderr:write("lecho replay: events still queued after 60 s (a consumer too slow)\n")
    code = EXIT.failed
  end
  -- a replay that reached nobody says so, with an exit code to script on
  local unreached, by = rp:unreached()
  st.unreached = unreached
  if unreached > 0 then
    local parts = {}
    for name, n in pairs(by) do parts[#parts + 1] = ("%s: %d"):format(name, n) end
    table.sort(parts)
    io.stderr:write(("lecho replay: %d of %d events sent reached no consumer (%s)\n")
                    :format(unreached, rp.sent, table.concat(parts, ", ")))
    -- none reached anyone: a failure; some channels without a consumer
    -- while others had theirs: said (and counted), not a failure
    if unreached >= rp.sent and (code == nil or code == EXIT.ok) then code = EXIT.failed end
  end
  -- damaged records skipped: the replay is not the whole recording (F1)
  if rp.damaged > 0 then
    io.stderr:write(("lecho replay: %d damaged records skipped%s: the replay is not whole\n"):format(rp.damaged,
      rp.unindexed > 0 and (", and %d events after them"):format(rp.unindexed) or ""))
    if code == nil or code == EXIT.ok then code = EXIT.failed end
  end
  rp:close()
  if not opts.step then replay_status(opts, st) end
  finish(ctx, code or EXIT.ok)
end

------------------------------------------------------------------------------

--- Runs the tool on argv (a list of strings); exits the process.
function M.main(argv)
  local cmd = argv[1]
  if cmd == nil or cmd == "--help" or cmd == "-h" or cmd == "help" then
    io.write(USAGE.main)
    os.exit(cmd == nil and EXIT.usage or EXIT.ok)
  end
  if not cmds[cmd] then die(nil, ("unknown subcommand '%s' (lecho --help)"):format(cmd)) end
  local rest = {}
  for i = 2, #argv do rest[#rest + 1] = argv[i] end
  local opts, pos = M.parse(cmd, rest)
  local ok, err = xpcall(cmds[cmd], debug.traceback, opts, pos)
  if not ok then die(cmd, "internal error: " .. tostring(err), EXIT.failed) end
  os.exit(EXIT.ok)
end

return M
