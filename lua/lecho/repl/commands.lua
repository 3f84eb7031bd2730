-- lua/lecho/repl/commands.lua: the REPL's commands, Lua functions in the
-- environment typed code runs in: help, ls, send, stats, wait, pp, history,
-- quit here; sub, unsub, subs, mod, params, edit in subs.lua.  Each command
-- has a usage line, a summary for help() and a text for help(cmd).
local P = require "lecho.repl.pretty"
local addr = require "lecho.addr"
local options = require "lecho.options"

local M = {}

-- The order of help().
local ORDER = { "help", "ls", "sub", "unsub", "subs", "send", "mod", "params", "edit",
                "stats", "wait", "pp", "history", "record", "replay", "quit" }

--- The sorted names of the functions reachable as obj.name (its fields,
-- then its metatables' __index tables; methods: only the latter), not
-- those beginning with "_".
function M.functions(obj, methods)
  local names, seen, t, depth = {}, {}, obj, 0
  if methods then
    local mt = getmetatable(obj)
    t = type(mt) == "table" and rawget(mt, "__index") or nil
  end
  while type(t) == "table" and depth < 10 do
    for k, v in pairs(t) do
      if type(k) == "string" and type(v) == "function" and not k:find("^_") and not seen[k] then
        seen[k] = true
        names[#names + 1] = k
      end
    end
    local mt = getmetatable(t)
    t = type(mt) == "table" and rawget(mt, "__index") or nil
    depth = depth + 1
  end
  table.sort(names)
  return names
end

--- Adds the commands to session R's environment (R.env), and R.command,
-- R.serve, R.check_name, R.check_opts, R.short_name, R.list_channels, R.channel_names;
-- R.ctx must exist.
function M.install(R)
  local ctx, producers = R.ctx, R.producers
  local commands, by_fn = {}, {}

  --- Defines command `name`: usage ("sub(ch, {...})"), a one-line summary,
  -- the text help(name) shows, and the function.
  function R.command(name, usage, summary, text, fn)
    local c = { name = name, usage = usage, summary = summary, text = text, fn = fn }
    commands[name] = c
    by_fn[fn] = c
    R.env[name] = fn
  end

  function R.short_name(full)
    local ns, name = addr.split(full)
    if ns and ns == ctx.ns then return name end
    return full
  end
  local short_name = R.short_name

  --- Blocks while serving the loop until pred() is true (true) or seconds
  -- pass (false); an error if Ctrl-C is pressed meanwhile.
  function R.serve(seconds, pred)
    local deadline = ctx:now() + seconds
    while true do
      if R.interrupted or R.exiting then R.interrupted = false error("interrupted", 0) end
      if pred and pred() then return true end
      local left = deadline - ctx:now()
      if left <= 0 then return false end
      ctx:run_once(math.min(left, 0.05))
      R.beat = os.clock()
    end
  end

  function R.check_name(name, fn)
    if type(name) ~= "string" or name == "" then
      error(fn .. ": first argument must be a channel name", 3)
    end
  end

  --- Raises (at the caller of command fn, `level` 3 by default) unless o is
  -- nil or a table whose keys are all in the list `known`.
  function R.check_opts(o, fn, known, level)
    level = level or 3
    if o == nil then return end
    if type(o) ~= "table" then error(fn .. ": options must be a table", level) end
    for k in pairs(o) do
      local ok = false
      for _, n in ipairs(known) do if k == n then ok = true break end end
      if not ok then
        error(("%s: unknown option %s (known: %s)"):format(fn,
          type(k) == "string" and "'" .. k .. "'" or tostring(k), table.concat(known, ", ")), level)
      end
    end
  end

  --- The name server's channels (ctx:list()), with the producers and
  -- consumers of those a separate manager keeps asked of that manager; nil,
  -- err when the name server does not answer.
  function R.list_channels()
    local chans, err, truncated = ctx:list()
    if not chans then return nil, err end
    local asked = {}
    for name, info in pairs(chans) do
      if not info.producers and info.manager and info.manager ~= ctx.ns then
        if asked[info.manager] == nil then
          asked[info.manager] = ctx:list(info.manager) or false
        end
        local m = asked[info.manager]
        if m and m[name] then chans[name] = m[name] end
      end
    end
    return chans, truncated
  end

  -- The name server's channel names (short where they are its own), asked
  -- again at most every 2 s: for Tab.
  local names_cache, names_at = nil, -math.huge
  function R.channel_names()
    if not names_cache or ctx:now() - names_at > 2 then
      local chans = ctx:list()
      names_at = ctx:now()
      if chans then
        names_cache = {}
        for full in pairs(chans) do names_cache[#names_cache + 1] = short_name(full) end
        table.sort(names_cache)
      end
    end
    return names_cache or {}
  end

  require("lecho.repl.subs").install(R)
  require("lecho.repl.recplay").install(R)

  R.command("help", "help([cmd])", "this list; help(cmd) or help(\"cmd\"): that command", [[
help() lists the commands; help(sub) or help("sub") tells more of one;
help(ctx) and help(lecho) list the context's methods, the module's functions.]], function(x)
    if x ~= nil then
      local obj = (x == "ctx" or x == ctx) and ctx or (x == "lecho" or x == R.env.lecho) and R.env.lecho
      if obj then
        local what = obj == ctx and "ctx: this REPL's lecho context; its methods (ctx:name(...)):"
                     or "lecho: the lecho module; its functions (lecho.name(...)):"
        return R.out(what .. "\n  " .. table.concat(M.functions(obj, obj == ctx), " ")
          .. "\ndoc/api.md tells what each does.")
      end
      local c = by_fn[x] or (type(x) == "string" and commands[x:match("^([%w_]+)")])
      if not c then error("help: no command " .. P.safe_tostring(x) .. " (help() lists them)", 2) end
      return R.out(c.usage .. "\n  " .. c.summary .. "\n" .. c.text)
    end
    local lines = { "Commands (Lua functions; any Lua works, globals persist, `local`s do not):" }
    local listed = {}
    local function line(c)
      listed[c.name] = true
      lines[#lines + 1] = ("  %-52s %s"):format(c.usage, c.summary)
    end
    for _, n in ipairs(ORDER) do if commands[n] then line(commands[n]) end end
    local rest = {}
    for n in pairs(commands) do if not listed[n] then rest[#rest + 1] = n end end
    table.sort(rest)
    for _, n in ipairs(rest) do line(commands[n]) end
    lines[#lines + 1] = ("  %-52s %s"):format("ctx, lecho", "the context and the module, for anything else")
    lines[#lines + 1] = "`=expr` or an expression prints its values (also kept in `_`); errors never end the REPL."
    if R.interactive then
      lines[#lines + 1] = "Keys: arrows, Home/End, Ctrl-A/E/K/U/W, Up/Down history, Ctrl-R searches it, Tab completes"
      lines[#lines + 1] = "      names and channel names, Ctrl-C cancels the input or interrupts running code,"
      lines[#lines + 1] = "      Ctrl-D on an empty line quits."
    end
    R.out(table.concat(lines, "\n"))
  end)

  R.command("ls", "ls([pattern])", "channels with their producers and consumers", [[
One line per channel of the name server (those whose name contains pattern):
the producing and consuming processes ("(me)": this REPL) and the manager.]], function(pattern)
    local chans, err = R.list_channels()
    if not chans then error("ls: " .. tostring(err), 2) end
    local truncated = err     -- (the second result, on success)
    local more = truncated and ("... and %d more channels the name server did not list (its reply is capped)")
                               :format(truncated)
    local names = {}
    for name in pairs(chans) do
      if not pattern or short_name(name):find(pattern, 1, true) then names[#names + 1] = name end
    end
    table.sort(names)
    if R.json then
      local sel = {}
      for _, n in ipairs(names) do sel[n] = chans[n] end
      return R.json.emit{ channels = sel, truncated = truncated }
    end
    if #names == 0 then
      R.out((pattern and ("no channel matching '" .. pattern .. "'") or "no channels") .. (more and ("\n" .. more) or ""))
      return
    end
    local function who(set)
      local l = {}
      for a, n in pairs(set or {}) do
        l[#l + 1] = a .. (n > 1 and ("x" .. n) or "") .. (a == ctx.addr and " (me)" or "")
      end
      table.sort(l)
      return #l > 0 and table.concat(l, ", ") or "-"
    end
    local rows = { { "channel", "producers", "consumers", "manager" } }
    for _, name in ipairs(names) do
      local i = chans[name]
      rows[#rows + 1] = { short_name(name), who(i.producers), who(i.consumers),
                          (i.manager or "?") .. (i.manager == ctx.ns and " (ns)" or "") }
    end
    local w = {}
    for _, r in ipairs(rows) do
      for c, s in ipairs(r) do w[c] = math.max(w[c] or 0, #s) end
    end
    local lines = {}
    for _, r in ipairs(rows) do
      -- (padded by hand: string.format takes no width above 99, names can be longer)
      local function pad(c) return r[c] .. (" "):rep(w[c] - #r[c]) end
      lines[#lines + 1] = pad(1) .. "  " .. pad(2) .. "  " .. pad(3) .. "  " .. r[4]
    end
    lines[#lines + 1] = more
    R.out(table.concat(lines, "\n"))
  end)

  R.command("send", "send(ch, ev [, {async=, timeout=}])", "produce an event (waits until consumed)", [[
Produces ev on channel ch and returns true once every consumer ran its
handler on it (submit_sync, timeout 5 s); an error raised by a consumer's
handler comes back as the error of send; false when nobody consumes ch
(said).  async = true: queue it and return.]], function(name, ev, o)
    R.check_name(name, "send")
    R.check_opts(o, "send", { "async", "timeout" })
    o = o or {}
    local p = producers[name]
    if not p or p.closed then
      local err
      p, err = ctx:channel(name):producer()
      if not p then error("send: " .. tostring(err), 2) end
      producers[name] = p
    end
    if not p.ch:_plain() then
      R.out(("send: no consumer on '%s' (nothing received it)"):format(name))
    end
    if o.async then
      local ok, err = p:submit(ev)
      if not ok then error("send: " .. tostring(err), 2) end
      ctx:flush()
      return true
    end
    local ok, err, code = p:submit_sync(ev, { timeout = o.timeout or 5 })
    if code == "noconsumer" then return false end   -- (said above)
    if not ok then error("send: " .. tostring(err), 2) end
    return true
  end)

  R.command("stats", "stats([ch])", "counters of this process, per channel and peer", [[
Counters of this REPL's context: per channel (events in, out, delivered in
this process, drops, consumers, producers), the streams of its modulators
under their channel (labelled with the mod() handle, "before" for a key it
had before params() or edit(), or the modulator key),
and per peer process.  stats("ch"): the channels whose name contains "ch".]], function(pattern)
    local s = ctx:stats()
    if R.json then return R.json.emit{ stats = s } end
    local lines = { ("context %s  encodes %d  bad frames %d  local queue %d events"):format(
      s.addr, s.encodes or 0, s.bad_frames or 0, s.local_queue_events or 0) }
    -- Streams of a modulator ("ch@key") go under their channel.
    local plain, derived = {}, {}
    for name in pairs(s.channels or {}) do
      local base, key = name:match("^(.*)@(%x+)$")
      if base then
        derived[base] = derived[base] or {}
        table.insert(derived[base], { name = name, key = key })
      elseif not pattern or short_name(name):find(pattern, 1, true) then
        plain[#plain + 1] = name
      end
    end
    for base in pairs(derived) do
      local seen = false
      for _, n in ipairs(plain) do if n == base then seen = true end end
      if not seen and (not pattern or short_name(base):find(pattern, 1, true)) then plain[#plain + 1] = base end
    end
    table.sort(plain)
    local rows = {}
    local function row(label, c)
      rows[#rows + 1] = { label, c.events_in or 0, c.events_out or 0, c.events_local or 0, c.drops or 0,
                          c.consumers or 0, c.producers or 0 }
    end
    for _, name in ipairs(plain) do
      row(short_name(name), s.channels[name] or {})
      local subs = derived[name] or {}
      table.sort(subs, function(a, b) return a.key < b.key end)
      for _, d in ipairs(subs) do
        local h, old = R.handle_of_stream(name, d.key)
        local label = "  modulated " .. (h and (h.id .. " (" .. d.key:sub(1, 8) .. (old and ", before" or "") .. ")")
                                         or d.key:sub(1, 8))
        row(label, s.channels[d.name])
      end
    end
    if #rows > 0 then
      local w = #"channel"
      for _, r in ipairs(rows) do w = math.max(w, #r[1]) end
      w = math.min(w, 99)   -- string.format's widest; longer names push their line
      local fmt = "%-" .. w .. "s %8s %8s %8s %6s %5s %5s"
      lines[#lines + 1] = fmt:format("channel", "in", "out", "local", "drops", "cons", "prod")
      for _, r in ipairs(rows) do lines[#lines + 1] = fmt:format(unpack(r)) end
    end
    local peers = {}
    for a in pairs(s.peers or {}) do peers[#peers + 1] = a end
    table.sort(peers)
    if #peers > 0 and not pattern then
      local w = #"peer"
      for _, a in ipairs(peers) do w = math.max(w, #a) end
      w = math.min(w, 99)
      local fmt = "%-" .. w .. "s %8s %8s %10s %10s %6s"
      lines[#lines + 1] = fmt:format("peer", "ev in", "ev out", "bytes in", "bytes out", "up")
      for _, a in ipairs(peers) do
        local p = s.peers[a]
        lines[#lines + 1] = fmt:format(a, p.events_in or 0, p.events_out or 0,
          p.bytes_in or 0, p.bytes_out or 0, tostring(p.connected))
      end
    end
    R.out(table.concat(lines, "\n"))
  end)

  R.command("wait", "wait(seconds [, pred])", "serve the loop for a while (or until pred() is true)", [[
Serves the event loop (subscriptions print) for seconds, or until pred()
returns true (then wait returns true; false on timeout).  Ctrl-C ends it.]], function(seconds, pred)
    options.check_time(seconds, "wait", "seconds", 2)
    if pred ~= nil and type(pred) ~= "function" then error("wait: pred must be a function", 2) end
    local ok = R.serve(seconds, pred)
    if pred then return ok end
  end)

  R.command("pp", "pp(v [, {depth=, items=, lines=}])", "pretty-print a value with other bounds", [[
Prints v like the results of an expression, with other bounds: depth (4),
items per table (40), strlen (200), width (100), lines (200).]], function(v, o)
    if R.json then return R.json.emit{ values = { R.json.value(v) } } end
    R.out(P.pretty(v, o))
  end)

  R.command("history", "history([n]) or history(ch [, n])", "the last n (20) lines typed; or a channel's last values", [[
history(n): the last n entries of the input history ($LECHO_HISTORY, default
~/.lecho_history), numbered.  Up/Down walk through it, Ctrl-R searches it.
history(ch [, n]): the last n (1) values each producer of channel ch keeps
(a producer made with { history = N }), printed now; returns them as a list
of { ev, meta }.  sub(ch, { history = n }) prints them and goes on live.]], function(n, m)
    if type(n) == "string" then return R.channel_history(n, m) end
    n = n or 20
    local l = {}
    for i = math.max(1, #R.history.list - n + 1), #R.history.list do
      l[#l + 1] = ("%5d  %s"):format(i, R.history.list[i])
    end
    R.out(#l > 0 and table.concat(l, "\n") or "no history")
  end)

  R.command("quit", "quit([code])", "leave (also exit(), Ctrl-D)", [[
Closes the subscriptions and the context and exits with code (0).]], function(code)
    R.request_exit(code or 0)
  end)

  R.env.exit = commands.quit.fn
  R.env.ctx, R.env.lecho = ctx, R.lecho
  R.env.print = function(...)
    local n = select("#", ...)
    local t = {}
    for i = 1, n do t[i] = P.safe_tostring((select(i, ...))) end
    R.out(table.concat(t, "\t"))
  end
end

return M
