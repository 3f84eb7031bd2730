-- lua/lecho/repl/commands.lua: the REPL's commands (ls, sub, send, mod,
-- stats, ...), Lua functions in the environment typed code runs in.
local T = require "lecho.repl.term"
local P = require "lecho.repl.pretty"

local M = {}

--- Adds the commands to session R's environment (R.env); R.ctx must exist.
function M.install(R)
  local ctx, handles, producers = R.ctx, R.handles, R.producers

  local function short_name(full)
    local ns, name = full:match("^([^/]+)/(.+)$")
    if ns == ctx.ns then return name end
    return full
  end

  -- Blocks while serving the loop; an error if Ctrl-C is pressed meanwhile.
  local function serve(seconds, pred)
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

  local function check_name(name, fn)
    if type(name) ~= "string" or name == "" then
      error(fn .. ": first argument must be a channel name", 3)
    end
  end

  -- One line for an event: the chosen fields, or else (a table of named
  -- fields) every scalar field then the sizes of the table fields.
  local function fields_line(ev, fields, width)
    width = width or 160
    if type(ev) ~= "table" or P.has_tostring(ev) then return P.short(ev, width) end
    local parts = {}
    if fields then
      for _, f in ipairs(fields) do parts[#parts + 1] = f .. "=" .. P.short(ev[f], 60) end
      return table.concat(parts, " ")
    end
    if rawget(ev, 1) ~= nil then return P.short(ev, width) end
    local keys, tabs = {}, {}
    for k, v in next, ev do
      if type(k) ~= "string" then return P.short(ev, width) end
      if type(v) == "table" then tabs[#tabs + 1] = k else keys[#keys + 1] = k end
      if #keys + #tabs > 200 then return P.short(ev, width) end
    end
    table.sort(keys)
    table.sort(tabs)
    for _, k in ipairs(keys) do parts[#parts + 1] = k .. "=" .. P.short(ev[k], 40) end
    for _, k in ipairs(tabs) do
      local t, n = ev[k], 0
      for _ in next, t do n = n + 1 if n > 1e6 then break end end
      local s = P.short(t, 40)
      if #s > 39 then s = ("{%d}"):format(n) end
      parts[#parts + 1] = k .. "=" .. s
    end
    local line = table.concat(parts, " ")
    if #line > width then line = line:sub(1, width - 3) .. "..." end
    return line
  end

  local Handle = {}
  Handle.__index = Handle
  Handle.__tostring = function(h)
    local bits = {}
    if h.fields then bits[#bits + 1] = "fields " .. table.concat(h.fields, ",") end
    if h.every > 1 then bits[#bits + 1] = "every " .. h.every end
    if h.limit then bits[#bits + 1] = "limit " .. h.limit end
    if h.kind == "mod" then bits[#bits + 1] = "params " .. P.short(h.params, 60) end
    bits[#bits + 1] = ("%d received"):format(h.count)
    if h.closed then bits[#bits + 1] = "closed" end
    return ("<%s on %s: %s>"):format(h.id, h.channel, table.concat(bits, ", "))
  end

  function Handle:close()
    if self.closed then return end
    self.closed = true
    handles[self.id] = nil
    pcall(self.con.close, self.con)
  end

  --- Serves the loop until this subscription printed its limit (or timeout).
  function Handle:wait(timeout)
    return serve(timeout or 10, function() return self.closed end)
  end

  local nextid = 0

  local function make_handler(h)
    return function(ev, meta)
      if h.closed then return end
      h.count = h.count + 1
      h.last, h.meta = ev, meta
      if (h.count - 1) % h.every ~= 0 then return end
      if h.where then
        local ok, keep = pcall(h.where, ev, meta)
        if not ok then R.out(("%s: where() failed: %s"):format(h.id, tostring(keep))) return end
        if not keep then return end
      end
      local line
      if h.format then
        local ok, s = pcall(h.format, ev, meta)
        line = ok and tostring(s) or ("format() failed: " .. tostring(s))
      else
      end
      local tag = ("[%s %s #%s"):format(h.id, h.channel, tostring(meta and meta.seq or "?"))
      if meta and meta.params_version then tag = tag .. " p" .. tostring(meta.params_version) end
      if not line then
        line = fields_line(ev, h.fields, math.max((R.interactive and T.term.cols() or 160) - #tag - 3, 40))
      end
      R.out(R.paint("36", tag .. "]") .. " " .. line)
      h.printed = h.printed + 1
      if h.limit and h.printed >= h.limit then
        h:close()
        R.out(("%s: limit of %d reached, unsubscribed"):format(h.id, h.limit))
      end
    end
  end

  local function new_handle(kind, name, o)
    if o ~= nil and type(o) ~= "table" then error(kind .. ": options must be a table", 3) end
    o = o or {}
    local fields = o.fields
    if type(fields) == "string" then fields = { fields } end
    if fields ~= nil and type(fields) ~= "table" then error(kind .. ": fields must be a list of names", 3) end
    if o.every ~= nil and (type(o.every) ~= "number" or o.every < 1) then
      error(kind .. ": every must be a number >= 1", 3)
    end
    if o.limit ~= nil and (type(o.limit) ~= "number" or o.limit < 1) then
      error(kind .. ": limit must be a number >= 1", 3)
    end
    nextid = nextid + 1
    return setmetatable({
      kind = kind, id = kind .. nextid, num = nextid, channel = name,
      fields = fields, every = math.floor(o.every or 1), limit = o.limit,
      where = o.where, format = o.format,
      count = 0, printed = 0,
    }, Handle)
  end

  local function find_handle(x, fn)
    if getmetatable(x) == Handle then return x end
    if type(x) == "number" then
      for _, h in pairs(handles) do if h.num == x then return h end end
    elseif type(x) == "string" then
      if handles[x] then return handles[x] end
    end
    error(("%s: no subscription %s (see subs())"):format(fn, tostring(x)), 3)
  end

  local commands, help_lines = {}, {}
  local function command(name, summary, fn)
    commands[name] = fn
    help_lines[#help_lines + 1] = { name, summary }
  end

  command("help()", "this list", function()
    local lines = { "Commands (Lua functions; any Lua works, globals persist, `local`s do not):" }
    for _, h in ipairs(help_lines) do
      lines[#lines + 1] = ("  %-38s %s"):format(h[1], h[2])
    end
    lines[#lines + 1] = ("  %-38s %s"):format("ctx, lecho", "the context and the module, for anything else")
    lines[#lines + 1] = "`=expr` or an expression prints its values (also kept in `_`); errors never end the REPL."
    if R.interactive then
      lines[#lines + 1] = "Keys: arrows, Home/End, Ctrl-A/E/K/U/W, Up/Down history, Tab completes,"
      lines[#lines + 1] = "      Ctrl-C cancels the input or interrupts running code, Ctrl-D on an empty line quits."
    end
    R.out(table.concat(lines, "\n"))
  end)

  command("ls([pattern])", "channels with their producers and consumers", function(pattern)
    local chans, err = ctx:list()
    if not chans then error("ls: " .. tostring(err), 2) end
    -- Channels assigned to a separate manager: ask that manager.
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
    local names = {}
    for name in pairs(chans) do
      if not pattern or short_name(name):find(pattern, 1, true) then names[#names + 1] = name end
    end
    table.sort(names)
    if #names == 0 then
      R.out(pattern and ("no channel matching '" .. pattern .. "'") or "no channels")
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
      lines[#lines + 1] = ("%-" .. w[1] .. "s  %-" .. w[2] .. "s  %-" .. w[3] .. "s  %s")
        :format(r[1], r[2], r[3], r[4])
    end
    R.out(table.concat(lines, "\n"))
  end)

  command("sub(ch, {fields=, every=, limit=})", "print the events of a channel as they arrive", function(name, o)
    check_name(name, "sub")
    local h = new_handle("sub", name, o)
    local con, err = ctx:channel(name):consumer(make_handler(h))
    if not con then error("sub: " .. tostring(err), 2) end
    h.con = con
    handles[h.id] = h
    return h
  end)

  command("unsub([sub|id|ch])", "stop one subscription, those of a channel, or all", function(x)
    local n = 0
    for id, h in pairs(handles) do
      if x == nil or x == h or x == h.num or x == id or x == h.channel then
        h:close()
        n = n + 1
      end
    end
    if n == 0 and x ~= nil then error("unsub: no subscription " .. tostring(x) .. " (see subs())", 2) end
    R.out(("%d subscription%s closed"):format(n, n == 1 and "" or "s"))
  end)

  command("subs()", "the active subscriptions and modulators", function()
    local l = {}
    for _, h in pairs(handles) do l[#l + 1] = h end
    table.sort(l, function(a, b) return a.num < b.num end)
    if #l == 0 then return R.out("no subscriptions") end
    local s = {}
    for i, h in ipairs(l) do s[i] = tostring(h) end
    R.out(table.concat(s, "\n"))
  end)

  command("send(ch, ev [, {async=, timeout=}])", "produce an event (waits until consumed)", function(name, ev, o)
    check_name(name, "send")
    o = o or {}
    local p = producers[name]
    if not p or p.closed then
      local err
      p, err = ctx:channel(name):producer()
      if not p then error("send: " .. tostring(err), 2) end
      producers[name] = p
    end
    local ch = p.ch
    if #(ch.dests or {}) == 0 and #ch.consumers == 0 then
      R.out(("send: no consumer on '%s' (nothing received it)"):format(name))
    end
    if o.async then
      local ok, err = p:submit(ev)
      if not ok then error("send: " .. tostring(err), 2) end
      ctx:flush()
      return true
    end
    local ok, err = p:submit_sync(ev, { timeout = o.timeout or 5 })
    if not ok then error("send: " .. tostring(err), 2) end
    return true
  end)

  local function read_source(src)
    if type(src) ~= "string" then error("mod: the modulator must be Lua source or a file name", 3) end
    if not src:find("\n") and not src:find("[%(%)=]") then
      local f = io.open(src, "r")
      if f then
        local text = f:read("*a")
        f:close()
        return text, src
      end
    end
    return src, nil
  end

  local function check_modulator(src, fn)
    local f, err = loadstring(src, "=modulator")
    if not f then error(fn .. ": the modulator does not compile: " .. err, 3) end
  end

  command("mod(ch, src|file, params [, opts])", "install a modulator; prints what the demodulator gets", function(name, src, params, o)
    check_name(name, "mod")
    local text, file = read_source(src)
    check_modulator(text, "mod")
    if params ~= nil and type(params) ~= "table" then error("mod: params must be a table", 2) end
    o = o or {}
    local h = new_handle("mod", name, o)
    h.src, h.file, h.params = text, file, params or {}
    h.handler = make_handler(h)
    local copts = {
      modulator = text, params = h.params, period = o.period, capabilities = o.capabilities,
      on_error = function(err) R.out(R.paint("31", ("%s: modulator error: %s"):format(h.id, tostring(err)))) end,
    }
    local con, err = ctx:channel(name):consumer(h.handler, copts)
    if not con then error("mod: " .. tostring(err), 2) end
    h.con = con
    handles[h.id] = h
    return h
  end)

  command("params(sub, tbl)", "change a modulator's params (set_params)", function(x, tbl)
    local h = find_handle(x, "params")
    if h.kind ~= "mod" then error("params: " .. h.id .. " has no modulator", 2) end
    if h.closed then error("params: " .. h.id .. " is closed", 2) end
    if type(tbl) ~= "table" then error("params: the params must be a table", 2) end
    local ok, err = h.con:set_params(tbl)
    if not ok then error("params: " .. tostring(err), 2) end
    h.params = tbl
    local v = h.con.params_version and h.con:params_version()
    R.out(("%s: params %s applied%s"):format(h.id, P.short(tbl, 100), v and (" (version " .. v .. ")") or ""))
  end)

  local function sh_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

  command("edit(sub)", "edit the modulator in $EDITOR, then set_modulator", function(x)
    local h = find_handle(x, "edit")
    if h.kind ~= "mod" then error("edit: " .. h.id .. " has no modulator", 2) end
    if h.closed then error("edit: " .. h.id .. " is closed", 2) end
    local editor = os.getenv("VISUAL") or os.getenv("EDITOR")
    if not editor or editor == "" then error("edit: set EDITOR (or VISUAL) to an editor", 2) end
    local file = h.file
    if not file then
      file = os.tmpname() .. ".lua"
      local f = assert(io.open(file, "w"))
      f:write(h.src)
      f:close()
    end
    if R.prompt_shown then T.write("\r\27[K") R.prompt_shown = false end
    T.term.restore()
    T.sig.block(false)
    local rc = os.execute(editor .. " " .. sh_quote(file))
    T.sig.block(true)
    T.term.enter_raw()
    local f = io.open(file, "r")
    local text = f and f:read("*a")
    if f then f:close() end
    if not h.file then os.remove(file) end
    if rc ~= 0 and rc ~= true then error(("edit: %s exited with %s"):format(editor, tostring(rc)), 2) end
    if not text then error("edit: cannot read " .. file, 2) end
    if text == h.src then R.out(h.id .. ": unchanged") return end
    check_modulator(text, "edit")
    local ok, err = h.con:set_modulator(text, h.params, h.handler)
    if not ok then error("edit: set_modulator: " .. tostring(err), 2) end
    h.src = text
    local v = h.con.params_version and h.con:params_version()
    R.out(("%s: modulator replaced%s"):format(h.id, v and (" (version " .. v .. ")") or ""))
  end)

  command("stats([ch])", "counters of this process, per channel and peer", function(pattern)
    local s = ctx:stats()
    local lines = { ("context %s  encodes %d  bad frames %d  local queue %d events"):format(
      s.addr, s.encodes or 0, s.bad_frames or 0, s.local_queue_events or 0) }
    local names = {}
    for name in pairs(s.channels or {}) do
      if not pattern or short_name(name):find(pattern, 1, true) then names[#names + 1] = name end
    end
    table.sort(names)
    if #names > 0 then
      lines[#lines + 1] = ("%-24s %8s %8s %8s %6s %5s %5s"):format("channel", "in", "out", "local", "drops", "cons", "prod")
      for _, n in ipairs(names) do
        local c = s.channels[n]
        lines[#lines + 1] = ("%-24s %8d %8d %8d %6d %5d %5d"):format(short_name(n), c.events_in or 0,
          c.events_out or 0, c.events_local or 0, c.drops or 0, c.consumers or 0, c.producers or 0)
      end
    end
    local peers = {}
    for a in pairs(s.peers or {}) do peers[#peers + 1] = a end
    table.sort(peers)
    if #peers > 0 and not pattern then
      lines[#lines + 1] = ("%-24s %8s %8s %10s %10s %6s"):format("peer", "ev in", "ev out", "bytes in", "bytes out", "up")
      for _, a in ipairs(peers) do
        local p = s.peers[a]
        lines[#lines + 1] = ("%-24s %8d %8d %10d %10d %6s"):format(a, p.events_in or 0, p.events_out or 0,
          p.bytes_in or 0, p.bytes_out or 0, tostring(p.connected))
      end
    end
    R.out(table.concat(lines, "\n"))
  end)

  command("wait(seconds [, pred])", "serve the loop for a while (or until pred() is true)", function(seconds, pred)
    if type(seconds) ~= "number" or seconds < 0 then error("wait: seconds must be a number >= 0", 2) end
    local ok = serve(seconds, pred)
    if pred then return ok end
  end)

  command("pp(v [, {depth=, items=, lines=}])", "pretty-print a value with other bounds", function(v, o)
    R.out(P.pretty(v, o))
  end)

  command("history([n])", "the last n (20) history entries", function(n)
    n = n or 20
    local l = {}
    for i = math.max(1, #R.history.list - n + 1), #R.history.list do
      l[#l + 1] = ("%5d  %s"):format(i, R.history.list[i])
    end
    R.out(#l > 0 and table.concat(l, "\n") or "no history")
  end)

  command("quit()", "leave (also exit(), Ctrl-D)", function(code) R.request_exit(code or 0) end)

  for full, fn in pairs(commands) do R.env[full:match("^[%w_]+")] = fn end
  R.env.exit = commands["quit()"]
  R.env.ctx, R.env.lecho = ctx, R.lecho
  R.env.print = function(...)
    local n = select("#", ...)
    local t = {}
    for i = 1, n do t[i] = P.safe_tostring((select(i, ...))) end
    R.out(table.concat(t, "\t"))
  end
end

return M
