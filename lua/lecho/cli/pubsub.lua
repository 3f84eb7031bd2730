-- lua/lecho/cli/pubsub.lua: `lecho ls`, `lecho sub`, `lecho pub` and
-- `lecho call`, the subcommands that list channels, print and submit their
-- events and call services; each an entry { opts, pos, usage, run } that
-- lecho.cli dispatches to.  Leans on lecho.cli.common (the command line,
-- the context, output, signals) and lecho (the public API).

local server = require "lecho.server"
local C = require "lecho.cli.common"

local EXIT, COMMON = C.EXIT, C.COMMON
local die, literal, emit, pretty, sorted = C.die, C.literal, C.emit, C.pretty, C.sorted
local context, on_signals, signal_exit, finish, code_exit = C.context, C.on_signals, C.signal_exit, C.finish, C.code_exit
local wait_consumers = C.wait_consumers

local M = {}

M.ls = {
  opts = { { "--json", "json", "flag" } },
  pos = { {}, 0 },
  usage = [[
usage: lecho ls [--json]

Lists the channels the name server (and its managers) know: for each, its
manager and the processes that produce and consume it.
  --json      one JSON object per channel: {"channel", "manager", "producers", "consumers", "modulators"}
]] .. COMMON,
}

M.sub = {
  opts = { { "--modulator", "modulator", "string" }, { "--params", "params", "string" },
           { "--history", "history", "string" },
           { "--json", "json", "flag" }, { "--count", "count", "count" }, { "--for", "duration", "seconds" } },
  pos = { { "CHANNEL" }, 1 },
  usage = [[
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
]] .. COMMON,
}

M.pub = {
  opts = { { "--sync", "sync", "flag" }, { "--json", "json", "flag" }, { "--string", "string", "flag" },
           { "--wait", "wait", "seconds0" } },
  pos = { { "CHANNEL", "VALUE" }, 2 },
  usage = [[
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
]] .. COMMON,
}

M.call = {
  opts = { { "--json", "json", "flag" }, { "--version", "version", "count" }, { "--at", "at", "address" } },
  pos = { { "SERVICE", "ARGS" }, 1 },
  usage = [[
usage: lecho call SERVICE [ARGS] [--json] [--version N] [--at ADDRESS]

Calls SERVICE (ctx:call) with ARGS, a Lua literal (default nil), and prints
its results, one per line (--json: {"results": [...]}).  A remote error
exits 1 with its message on stderr.
  --version N        that version of the service
  --at ADDRESS       that server only
]] .. COMMON,
}

------------------------------------------------------------------------------
-- ls

function M.ls.run(opts)
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

function M.sub.run(opts, pos)
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
    local ok, v = literal(opts.params)
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
  local ch = C.channel(ctx, "sub", name)
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

function M.pub.run(opts, pos)
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
      local ok, lv = literal(text)
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
  local ch = C.channel(ctx, "pub", name)
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
      -- (a sync wait the signal ended: no answer yet, not a failure to say)
      if not ok and interrupted then break end
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

function M.call.run(opts, pos)
  local name, args = pos[1], nil
  if pos[2] then
    local ok, v = literal(pos[2])
    if not ok then die("call", ("ARGS is not a Lua literal: %s"):format(v)) end
    args = v
  end
  local ctx = context("call", opts)
  local r = pack(ctx:call(name, args, { timeout = opts.timeout, version = opts.version, at = opts.at }))
  if ctx.cli_signal then
    -- (the call's wait ended by the signal: not the service's doing)
    io.stderr:write("lecho call: interrupted\n")
    finish(ctx, EXIT.failed)
  end
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

return M
