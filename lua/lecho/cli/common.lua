-- lua/lecho/cli/common.lua: what the subcommands of `lecho` share
-- (lecho.cli is their home): the exit codes, the common options and their
-- help, reading a command line (M.parse over a subcommand's table of
-- options and positionals), Lua literals, the output (JSON lines, the
-- pretty printer, counts), the tool's context, signals, finishing, and
-- waiting for a channel's consumers.  Leans on lecho (the public API),
-- lecho.server (option kinds, messages), lecho.repl.json and
-- lecho.repl.pretty (output) and lecho.repl.term (signals from a signalfd).

local server = require "lecho.server"

local M = {}

M.EXIT = { ok = 0, failed = 1, usage = 2, timeout = 3, sigint = 130, sigterm = 143 }
local EXIT = M.EXIT

local DEFAULT_NS = "127.0.0.1:7700"

-- The end of every subcommand's help.
M.COMMON = [[
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

-- The options of every subcommand: { flag, key, kind }; kinds of
-- lecho.server, "flag", "lua" (a literal), "int0" (>= 0); many = true: a
-- list; internal = true: not in the help (one the tool passes itself).
local COMMON_OPTS = {
  { "--nameserver", "nameserver", "address" }, { "--key", "key", "string" },
  { "--trust", "trust", "string", many = true }, { "--timeout", "timeout", "seconds" },
}

-- (the signal that came, M.on_signals: a failure after it, a wait it cut
-- short, is its doing: the exit is the signal's)
local signalled
local function die(cmd, msg, code)
  if signalled then
    msg, code = "interrupted (" .. msg .. ")", signalled == 2 and EXIT.sigint
      or (signalled == 15 and EXIT.sigterm or 128 + signalled)
  end
  io.stderr:write("lecho", cmd and (" " .. cmd) or "", ": ", msg, "\n")
  os.exit(code or EXIT.usage)
end
M.die = die

--- Reads argv for subcommand cmd, whose table (a family module's entry,
-- lecho.cli) gives `usage` (its help), `opts` (its options, as COMMON_OPTS)
-- and `pos` ({ names }, how many at least, many = a list): options
-- (anywhere; `--` ends them), positionals; --help prints its usage and
-- exits 0; anything wrong exits 2.
function M.parse(cmd, spec, argv)
  local by = {}
  for _, o in ipairs(COMMON_OPTS) do by[o[1]] = o end
  for _, o in ipairs(spec.opts) do by[o[1]] = o end
  local opts, pos = { trust = {}, rename = {} }, {}
  local i, rest = 1, false
  while argv[i] do
    local a = argv[i]
    if rest or a == "-" or a:sub(1, 1) ~= "-" or (a:match("^%-%d") and not by[a]) then
      pos[#pos + 1] = a
    elseif a == "--" then
      rest = true
    elseif a == "--help" or a == "-h" then
      io.write(spec.usage)
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
  local names, least = spec.pos[1], spec.pos[2]
  if #pos < least then
    die(cmd, ("%s is required\n%s"):format(names[#pos + 1], spec.usage))
  end
  if #pos > #names and not spec.pos.many then die(cmd, ("unexpected argument '%s' (lecho %s --help)"):format(pos[#names + 1], cmd)) end
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
function M.emit(obj)
  json = json or require "lecho.repl.json"
  json.emit(obj, JSON_OPTS)
end
function M.pretty(v)
  return require("lecho.repl.pretty").pretty(v)
end

-- The keys of t, sorted.
function M.sorted(t)
  local k = {}
  for n in pairs(t or {}) do k[#k + 1] = n end
  table.sort(k)
  return k
end

-- A count in 5 characters or so: 12345 -> 12.3k.
function M.fmt_num(n)
  n = tonumber(n) or 0
  if n >= 1e9 then return ("%.1fG"):format(n / 1e9) end
  if n >= 1e6 then return ("%.1fM"):format(n / 1e6) end
  if n >= 1e4 then return ("%.1fk"):format(n / 1e3) end
  return ("%d"):format(n)
end

-- The context of the tool: protected mode or keyed (--key/--trust, or
-- the environment), logs at error unless LECHO_LOG says otherwise.
function M.context(cmd, opts, extra)
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
  M.on_signals(ctx)
  return ctx
end

-- SIGINT and SIGTERM (and SIGHUP, SIGQUIT) from a signalfd on the loop
-- (lecho.repl.term), from the context's making on, for every command: the
-- signal is kept (ctx.cli_signal: M.finish exits with it, 130 or 143), a
-- wait on the main line it came during (a call, a sync submit, a lookup)
-- ends at once (ctx.interrupt, as Python's Ctrl-C; not a later one: the
-- close still delivers within linger), and the command's fn(sig), if it
-- set one with on_signals(ctx, fn), runs in the callback (at once when the
-- signal came before).  (A SIGINT before the signalfd is LuaJIT's
-- "interrupted!": M.main ends with 130 on it.)
function M.on_signals(ctx, fn)
  local st = ctx.cli_sigs
  if st then
    st.fn = fn
    if fn and ctx.cli_signal then fn(ctx.cli_signal) end
    return st.w
  end
  st = { fn = fn }
  ctx.cli_sigs = st
  local term = require "lecho.repl.term"
  local sig = term.sig
  sig.setup()
  if sig.fd < 0 then return nil end
  ctx.interrupt = function()
    if not st.cut then return false end
    st.cut = false
    return true
  end
  st.w = ctx:on_readable(sig.fd, function()
    local s = sig.take()
    if not s then return end
    ctx.cli_signal = ctx.cli_signal or s
    signalled = signalled or s
    if (ctx.main_waits or 0) > 0 then st.cut = true end
    if st.fn then st.fn(s) end
  end)
  return st.w
end
function M.signal_exit(s) return s == 2 and EXIT.sigint or (s == 15 and EXIT.sigterm or 128 + s) end

-- Finishing: close the context (delivering what was queued), flush, exit
-- (with the signal's code when one came: M.on_signals).
function M.finish(ctx, code)
  if ctx and ctx.cli_signal then code = M.signal_exit(ctx.cli_signal) end
  if ctx and ctx.cli_sigs then ctx.cli_sigs.cut = false end
  if ctx and not ctx.closed then ctx:close() end
  io.stdout:flush()
  os.exit(code)
end

-- The exit code of a failure's code: 3 for a timeout, else 1.
function M.code_exit(code)
  return code == "timeout" and EXIT.timeout or EXIT.failed
end

-- ctx:channel(name), or why not said on stderr and the tool ended (exit 1,
-- 3 on a timeout).  sub, pub.
function M.channel(ctx, cmd, name)
  local ch, err, ecode = ctx:channel(name)
  if not ch then
    io.stderr:write("lecho ", cmd, ": ", tostring(err), "\n")
    M.finish(ctx, M.code_exit(ecode))
  end
  return ch
end

-- Waits (serving the loop) until the channel has a consumer somewhere, at
-- most `wait` seconds: what a fresh producer submits before its member
-- list arrived goes nowhere (nobody consumes yet).  pub, bench, replay.
function M.wait_consumers(ctx, ch, wait)
  if not wait or wait <= 0 then return end
  local deadline = ctx:now() + wait
  while ctx:now() < deadline do
    -- the channel, or a modulator's stream of it ("name@key")
    for n, s in pairs(ctx:stats().channels) do
      if (n == ch.name or n:sub(1, #ch.name + 1) == ch.name .. "@") and (s.destinations or 0) > 0 then
        return true
      end
    end
    if ctx.cli_signal then return false end
    ctx:run_once(0.02)
  end
  return false
end

return M
