-- lua/lecho/repl/subs.lua: the REPL's subscriptions: sub() and mod() print
-- the events of a channel (with a modulator, what the demodulator gets),
-- unsub(), subs(), params() and edit().  Each is a handle in R.handles, by
-- id; a subscription whose where/format failed, or whose modulator failed,
-- stays listed as failed, with the reason, until unsub().
local T = require "lecho.repl.term"
local P = require "lecho.repl.pretty"
local options = require "lecho.options"

local M = {}

--- Adds sub, unsub, subs, mod, params and edit to session R (through
-- R.command); R.serve, R.check_name, R.check_opts must exist.
function M.install(R)
  local ctx, handles = R.ctx, R.handles

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
    if h.failed then bits[#bits + 1] = "FAILED: " .. h.failed
    elseif h.closed then bits[#bits + 1] = "closed"
    else bits[#bits + 1] = "live" end
    if h.fields then bits[#bits + 1] = "fields " .. table.concat(h.fields, ",") end
    if h.where_src then bits[#bits + 1] = "where " .. h.where_src end
    if h.format_src then bits[#bits + 1] = "format " .. h.format_src end
    if h.every > 1 then bits[#bits + 1] = "every " .. h.every end
    if h.limit then bits[#bits + 1] = "limit " .. h.limit end
    if h.kind == "mod" then bits[#bits + 1] = "params " .. P.short(h.params, 60) end
    bits[#bits + 1] = ("%d received"):format(h.count)
    return ("<%s on %s: %s>"):format(h.id, h.channel, table.concat(bits, ", "))
  end

  function Handle:close()
    if self.closed and not handles[self.id] then return end
    self.closed = true
    handles[self.id] = nil
    if self.con then pcall(self.con.close, self.con) end
  end

  -- Stops the subscription for good but keeps it listed, failed.
  function Handle:fail(why)
    if self.failed then return end
    self.failed = why
    self.closed = true
    if self.con then pcall(self.con.close, self.con) end
    R.show_error(("%s: %s; stopped (subs() lists it, unsub(%s) forgets it)"):format(self.id, why, self.id))
  end

  --- Serves the loop until this subscription printed its limit (or timeout).
  function Handle:wait(timeout)
    if timeout ~= nil then options.check_time(timeout, "wait", "seconds", 2) end
    return R.serve(timeout or 10, function() return self.closed end)
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
        if not ok then return h:fail("where failed: " .. tostring(keep)) end
        if not keep then return end
      end
      local line
      if h.format then
        local width = math.max((R.interactive and T.term.cols() or 160) - #h.id - #h.channel - 12, 40)
        local ok, s = pcall(h.format, ev, meta)
        if not ok then return h:fail("format failed: " .. tostring(s)) end
        -- A string as it is; anything else (format = "ev") pretty-printed.
        line = type(s) == "string" and s or P.short(s, width)
      end
      if R.json then
        local shown = ev
        if h.fields and type(ev) == "table" then
          shown = {}
          for _, f in ipairs(h.fields) do shown[f] = ev[f] end
        end
        R.json.emit{ sub = h.id, channel = h.channel, seq = meta and meta.seq,
                     params_version = meta and meta.params_version, event = shown, line = line }
      else
        local tag = ("[%s %s #%s"):format(h.id, h.channel, tostring(meta and meta.seq or "?"))
        if meta and meta.params_version then tag = tag .. " p" .. tostring(meta.params_version) end
        if meta and meta.history then tag = tag .. " history" end   -- lecho.history
        if meta and meta.replay then tag = tag .. " replay" end     -- lecho.replay
        if not line then
          line = fields_line(ev, h.fields, math.max((R.interactive and T.term.cols() or 160) - #tag - 3, 40))
        end
        R.out(R.paint("36", tag .. "]") .. " " .. line)
      end
      h.printed = h.printed + 1
      if h.limit and h.printed >= h.limit then
        h:close()
        R.out(("%s: limit of %d reached, unsubscribed"):format(h.id, h.limit))
      end
    end
  end

  -- where= and format= are functions of (ev, meta), or Lua expressions in
  -- ev and meta (strings), compiled here: a string that does not compile
  -- fails the command, once.
  local function event_function(kind, what, v)
    if v == nil or type(v) == "function" then return v end
    if type(v) ~= "string" then
      error(("%s: %s must be a function(ev, meta) or a Lua expression in ev and meta, not a %s")
        :format(kind, what, type(v)), 4)
    end
    local f, err = loadstring("local ev, meta = ... return " .. v, "=" .. what)
    if not f then
      err = err:gsub("^" .. what .. ":1: ", "")
      error(("%s: %s does not compile: %s"):format(kind, what, err), 4)
    end
    setfenv(f, R.env)
    return f, v
  end

  local SUB_OPTS = { "fields", "every", "limit", "where", "format", "history" }
  local MOD_OPTS = { "fields", "every", "limit", "where", "format", "period", "capabilities", "history" }

  local function new_handle(kind, name, o)
    R.check_opts(o, kind, kind == "mod" and MOD_OPTS or SUB_OPTS, 4)
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
    local where, where_src = event_function(kind, "where", o.where)
    local format, format_src = event_function(kind, "format", o.format)
    nextid = nextid + 1
    return setmetatable({
      kind = kind, id = kind .. nextid, num = nextid, channel = name,
      fields = fields, every = math.floor(o.every or 1), limit = o.limit,
      where = where, format = format, where_src = where_src, format_src = format_src,
      count = 0, printed = 0, history = o.history,
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

  --- The handle of the modulator stream `key` of channel `full` (a name of
  -- ctx:stats()), if it is one of this REPL's mod()s.
  -- A stream of a key the handle had before params() or edit(): h, true.
  function R.handle_of_stream(full, key)
    for _, h in pairs(handles) do
      if h.kind == "mod" and h.con and h.full == full then
        -- a consumer whose params changed in band keeps a stream of its
        -- own (mod.stream): the derived channel is named by that
        local m = h.con.mod
        if type(m) == "table" and (m.key == key or m.stream == key) then return h end
        if h.old_keys and h.old_keys[key] then return h, true end
      end
    end
    return nil
  end

  -- Remembers h's modulator key before it changes (stats() labels its row).
  local function keep_key(h)
    local m = h.con.mod
    if type(m) == "table" and m.key then
      h.old_keys = h.old_keys or {}
      h.old_keys[m.stream or m.key] = true
    end
  end

  -- Subscribes h (a new handle) with handler and consumer options copts;
  -- says so when the channel has no producer (a misspelt name makes a new,
  -- empty channel).  Returns h; raises for the command when lecho refuses.
  local function start(h, handler, copts)
    local ch = ctx:channel(h.channel)
    h.full = ch.name
    local con, err = ch:consumer(handler, copts)
    if not con then error(h.kind .. ": " .. tostring(err), 3) end
    h.con = con
    handles[h.id] = h
    local chans = R.list_channels()
    local info = chans and chans[h.full]
    if chans and not (info and next(info.producers or {})) then
      R.out(("%s: no producer on '%s' yet (ls() lists the channels)"):format(h.id, h.channel))
    end
    return h
  end

  R.command("sub", "sub(ch, {fields=, every=, limit=, where=, format=, history=})",
    "print the events of a channel as they arrive", [[
Subscribes to channel ch and prints each event as `[sub1 ch #seq] k=v ...`.
Options:
  fields = { "a", "b" }   only these fields
  every = N               one event in N
  limit = N               unsubscribe after printing N
  where = "ev.step % 10 == 0"          print only the events for which this is
                                       true (a Lua expression in ev and meta,
                                       or a function(ev, meta))
  format = "ev.step .. ' ' .. ev.dt"   print this instead of the fields (same;
                                       not a string: pretty-printed, e.g. "ev")
  history = "last" | N    first the last N events each producer keeps (tagged
                          `history`), then the live ones
  Any other key is refused.
A where or format that does not compile fails here; one that raises stops the
subscription, which subs() then lists as failed with the reason.
Returns a handle: h.last (the last event), h:wait(seconds) (serve the loop
until the limit is reached), h:close().]], function(name, o)
    R.check_name(name, "sub")
    local h = new_handle("sub", name, o)
    start(h, make_handler(h), h.history and { history = h.history } or nil)  -- (not a tail call: its errors name the caller's line)
    return h
  end)

  R.command("unsub", "unsub([sub|id|ch])", "stop one subscription, those of a channel, or all", [[
unsub(h) or unsub(1) or unsub("sub1"): that subscription; unsub("ch"): those
of channel ch; unsub(): all.  Failed subscriptions are forgotten too.]], function(x)
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

  R.command("subs", "subs()", "the subscriptions and modulators, live or failed", [[
One line per sub() and mod(): live, or FAILED with the reason (a where or
format that raised, a modulator that failed or was refused at a producer),
the options, and how many events arrived.]], function()
    local l = {}
    for _, h in pairs(handles) do l[#l + 1] = h end
    table.sort(l, function(a, b) return a.num < b.num end)
    if #l == 0 then return R.out("no subscriptions") end
    local s = {}
    for i, h in ipairs(l) do s[i] = h.failed and R.paint("31", tostring(h)) or tostring(h) end
    R.out(table.concat(s, "\n"))
  end)

  -- A file's text (the rule of lecho.modulator: one line ending in .lua or
  -- naming something that exists), or src itself as source.
  local function read_source(src)
    if type(src) ~= "string" or src == "" then error("mod: the modulator must be Lua source or a file name", 3) end
    local text, file = require("lecho.modulator").source(src)
    if not text then error("mod: " .. tostring(file), 3) end
    return text, file
  end

  local function check_modulator(src, fn)
    local f, err = loadstring(src, "=modulator")
    if not f then error(fn .. ": the modulator does not compile: " .. err, 3) end
  end

  R.command("mod", "mod(ch, src|file, params [, opts])",
    "install a modulator; prints what the demodulator gets", [[
A consumer of ch whose modulator (Lua source, or the name of a file holding
it) runs in every producing process (doc/modulators.md), with params as its
shared `params`.  Prints what the demodulator gets, tagged with the params
version (p1, p2, ...).  opts: those of sub() (fields, every, limit, where,
format), and period, capabilities.  A modulator that fails or is refused at
a producer is printed once and subs() lists the handle as failed; edit() or
params() that succeed make it live again.]], function(name, src, params, o)
    R.check_name(name, "mod")
    local text, file = read_source(src)
    check_modulator(text, "mod")
    if params ~= nil and type(params) ~= "table" then error("mod: params must be a table", 2) end
    o = o or {}
    local h = new_handle("mod", name, o)
    h.src, h.file, h.params = text, file, params or {}
    h.handler = make_handler(h)
    local copts = {
      modulator = text, params = h.params, period = o.period, capabilities = o.capabilities,
      on_error = function(err)
        err = tostring(err)
        if h.mod_failed == err then return end     -- once per reason
        h.mod_failed, h.failed = err, "modulator error: " .. err
        R.show_error(("%s: modulator error: %s"):format(h.id, err))
      end,
    }
    start(h, h.handler, copts)
    return h
  end)

  R.command("params", "params(sub, tbl)", "change a modulator's params (set_params)", [[
params(h, { stride = 2 }): set_params on mod() handle h; returns once every
producer applied them.  The events printed after carry the new version.]], function(x, tbl)
    local h = find_handle(x, "params")
    if h.kind ~= "mod" then error("params: " .. h.id .. " has no modulator", 2) end
    if h.closed then error("params: " .. h.id .. " is closed", 2) end
    if type(tbl) ~= "table" then error("params: the params must be a table", 2) end
    keep_key(h)
    local ok, err = h.con:set_params(tbl)
    if not ok then error("params: " .. tostring(err), 2) end
    h.params = tbl
    h.failed, h.mod_failed = nil, nil
    R.out(("%s: params %s applied (version %d)"):format(h.id, P.short(tbl, 100), h.con:params_version()))
  end)

  local function sh_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

  R.command("edit", "edit(sub)", "edit the modulator in $EDITOR, then set_modulator", [[
Opens a copy of the source of mod() handle h in $VISUAL or $EDITOR (the file
it came from, if any, is never written); once the editor exits, the new
source replaces the old in every producer (set_modulator).]], function(x)
    local h = find_handle(x, "edit")
    if h.kind ~= "mod" then error("edit: " .. h.id .. " has no modulator", 2) end
    if h.closed then error("edit: " .. h.id .. " is closed", 2) end
    local editor = os.getenv("VISUAL")
    if not editor or editor == "" then editor = os.getenv("EDITOR") end
    if not editor or editor == "" then error("edit: set EDITOR (or VISUAL) to an editor", 2) end
    -- Always a copy of the source now installed, never the file it came
    -- from (a checkout's example, a file the user keeps): ours to remove.
    local tmp = os.tmpname()          -- created empty by tmpname: ours to remove
    os.remove(tmp)
    local file = tmp .. "-" .. (h.file and h.file:match("([^/]+)$") or "modulator.lua")
    do
      local f = assert(io.open(file, "w"))
      f:write(h.src)
      f:close()
    end
    if R.prompt_shown then T.write("\r\27[K") R.prompt_shown = false end
    T.term.restore()
    T.sig.block(false)
    local rc, how, code = os.execute(editor .. " " .. sh_quote(file))
    T.sig.block(true)
    T.term.enter_raw()
    local f = io.open(file, "r")
    local text = f and f:read("*a")
    if f then f:close() end
    os.remove(file)
    if rc ~= 0 and rc ~= true then
      -- LuaJIT gives the wait status (exit code * 256, or the signal), or
      -- with 5.2 compatibility nil, "exit"|"signal", code.
      if type(rc) == "number" then
        how, code = rc % 256 == 0 and "exit" or "signal", rc % 256 == 0 and rc / 256 or rc % 128
      end
      error(("edit: %s %s"):format(editor, how == "signal" and "was killed by signal " .. tostring(code)
        or "exited with status " .. tostring(code)), 2)
    end
    if not text then error("edit: cannot read " .. file, 2) end
    if text == h.src then R.out(h.id .. ": unchanged") return end
    check_modulator(text, "edit")
    keep_key(h)
    local ok, err = h.con:set_modulator(text, h.params, h.handler)
    if not ok then error("edit: set_modulator: " .. tostring(err), 2) end
    h.src = text
    h.failed, h.mod_failed = nil, nil
    R.out(("%s: modulator replaced (version %d)%s"):format(h.id, h.con:params_version(),
      h.file and "; " .. h.file .. " is unchanged" or ""))
  end)
end

return M
