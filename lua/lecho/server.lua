-- lua/lecho/server.lua: what the scripts share, so that each says only
-- what is its own: reading the command line (M.parse, M.kinds, M.die, every
-- script's and lecho.cli's, lecho.keygen's), lecho's errors without their
-- prefix (M.message), and running a server script (M.main: the context,
-- the port file, the first line; scripts/lecho-nameserver, lecho-manager
-- and lecho-gateway) with the name server's run mark.  Not part of the
-- name server's side (lua/lecho/ns/): every script uses it.  Leans on
-- lecho.context.
--
--   require("lecho.server").main{
--     prog = "lecho-manager", usage = usage,
--     options = { { "--nameserver", "nameserver", "address", required = true },
--                 { "--key", "key", "string" }, { "--trust", "trust", "string", many = true },
--                 { "--listen", "listen", "listen" }, { "--advertise", "advertise", "listen" }, ... },
--     defaults = { listen = "127.0.0.1:0" },
--     context = function(opts) return { manager = true, ... } end,  -- lecho.context options
--     started = function(ctx, opts) return "managing channels for " .. opts.nameserver end,
--   }

local addr = require "lecho.addr"
-- Loops over keys as `in each(t)`, never `in pairs(t)`: no ITERN loop, which
-- Debian's LuaJIT may never end in the close at the program's end (context.lua).
local each = pairs

local M = {}

-- What an address option takes, for the messages.
local FORMS = "HOST:PORT, [V6]:PORT or unix:/PATH"

-- What each kind of option value must be; nil, why when it is not.
-- Addresses come back in their canonical text (lecho.addr).
local kinds = {
  address = function(v)                     -- one to dial: port 1-65535
    if v == "" then return nil, "needs " .. FORMS end
    local a, why = addr.parse(v)
    if not a then return nil, ("needs %s (%s)"):format(FORMS, why) end
    return a
  end,
  listen = function(v)                      -- one to listen on or advertise: port 0 too
    if v == "" then return nil, "needs " .. FORMS end
    local a, why = addr.parse(v, { listen = true })
    if not a then return nil, ("needs %s (%s)"):format(FORMS, why) end
    return a
  end,
  string = function(v)
    if v == "" then return nil, "needs a value" end
    return v
  end,
  seconds = function(v)                     -- a duration > 0
    local n = tonumber(v)
    if not n or n ~= n or n <= 0 or n == math.huge then return nil, "needs a number of seconds > 0" end
    return n
  end,
  count = function(v)                       -- a whole number >= 1
    local n = tonumber(v)
    if not n or not (n >= 1 and n <= 2 ^ 53) or n ~= math.floor(n) then
      return nil, "needs a whole number >= 1"
    end
    return n
  end,
  ttl = function(v)                         -- a producer ticket's life: 1 s to 366 days
    local n = tonumber(v)
    if not n or not (n >= 1 and n <= 366 * 86400) then
      return nil, "needs a number of seconds from 1 to 31622400 (366 days)"
    end
    return n
  end,
  seconds0 = function(v)                    -- a duration >= 0
    local n = tonumber(v)
    if not n or n ~= n or n < 0 or n == math.huge then return nil, "needs a number of seconds >= 0" end
    return n
  end,
}
M.kinds = kinds

--- Writes "prog: msg" on stderr and exits with code (2: a usage error).
function M.die(prog, msg, code)
  io.stderr:write(prog, ": ", msg, "\n")
  os.exit(code or 2)
end

--- An error from lecho, once prefixed by the script's name: without lecho's
-- own "lecho: " prefix or a source position.
function M.message(err)
  local s = tostring(err)
  s = s:gsub("^[^%s:]+%.lua:%d+: ", "")
  s = s:gsub("^lecho: ", "")
  return s
end

--- Reads argv by spec.options, a list of { flag, key, kind [, alias =,
-- many =, required =] }: kind is a key of M.kinds, or "flag" for an option
-- without a value; many: the values go into a list; required: true, or what
-- the value looks like ("ADDRESS").  `--flag=value` works too.
-- --help/-h print spec.usage and exit 0; anything wrong exits 2 with one
-- message.  Returns the options table (spec.defaults filled in first).
function M.parse(argv, spec)
  local prog, usage = spec.prog, spec.usage
  local opts, by = {}, {}
  for k, v in each(spec.defaults or {}) do opts[k] = v end
  if spec.positional then opts[spec.positional] = {} end
  for _, o in ipairs(spec.options) do
    by[o[1]] = o
    if o.alias then by[o.alias] = o end
    if o.many then opts[o[2]] = opts[o[2]] or {} end
  end
  local i = 1
  while argv[i] do
    local a = argv[i]
    if a == "--help" or a == "-h" then io.write(usage) os.exit(0) end
    local flag, inline = a:match("^(%-%-[%w-]+)=(.*)$")
    flag = flag or a
    local o = by[flag]
    if not o and spec.positional and a:sub(1, 1) ~= "-" then
      table.insert(opts[spec.positional], a)
    elseif not o then
      M.die(prog, ("unknown option '%s'\n%s"):format(a, usage))
    elseif o[3] == "flag" then
      if inline then M.die(prog, flag .. " takes no value") end
      opts[o[2]] = true
    else
      local v = inline
      if v == nil then
        v = argv[i + 1]
        if v == nil then M.die(prog, ("%s needs a value\n%s"):format(flag, usage)) end
        i = i + 1
      end
      local ok, why = kinds[o[3]](v)
      if ok == nil then M.die(prog, ("%s %s, not '%s'"):format(flag, why, v)) end
      if o.many then table.insert(opts[o[2]], ok) else opts[o[2]] = ok end
    end
    i = i + 1
  end
  for _, o in ipairs(spec.options) do
    if o.required and opts[o[2]] == nil then
      local what = o[1] .. (type(o.required) == "string" and (" " .. o.required) or "")
      M.die(prog, ("%s is required\n%s"):format(what, usage))
    end
  end
  return opts
end

-- Writes the address to file through a rename, so that a reader never sees
-- half of it.
local function write_port_file(file, addr)
  local f, err = io.open(file .. ".tmp", "w")
  if not f then return nil, err end
  f:write(addr, "\n")
  f:close()
  return os.rename(file .. ".tmp", file)
end

-- A name server's run mark: a file per listen address (in $LECHO_RUN_DIR,
-- else $XDG_RUNTIME_DIR/lecho-UID or /tmp/lecho-UID) saying that a name
-- server of this user listened there and may have had clients that still
-- hold channels it knew.  Only then does a new one settle (hold lookups
-- until producers joined again): one that never ran there has no state to
-- recover.  The mark is made at start and removed at a close that finds no
-- connection open (no client left to remember it); a crash leaves it.
local ffi = require "ffi"
pcall(ffi.cdef, "int mkdir(const char *path, unsigned int mode);")
pcall(ffi.cdef, "unsigned int getuid(void);")

local function run_mark(listen)
  if not listen or listen:match(":0$") then return nil end   -- a new port each run: none
  local dir = os.getenv("LECHO_RUN_DIR")
  if not dir or dir == "" then
    dir = (os.getenv("XDG_RUNTIME_DIR") or "/tmp") .. "/lecho-" .. tostring(ffi.C.getuid())
  end
  ffi.C.mkdir(dir, tonumber("700", 8))        -- (there already: fine; unusable: no mark)
  return dir .. "/nameserver-" .. listen:gsub("[^%w%.%-]", "_")
end

M.run_mark = run_mark

--- Runs a name server or manager script (see the top of the file): parses
-- arg, starts the context, writes --port-file, says where it listens unless
-- --quiet, serves until --for seconds pass or a signal ends the process.
function M.main(spec)
  local prog = spec.prog
  local opts = M.parse(arg, spec)
  local lecho = require "lecho"
  local mark = spec.run_mark and run_mark(opts.listen)
  if spec.run_mark then
    local f = mark and io.open(mark, "r")
    opts.ran_before = f ~= nil
    if f then f:close() end
  end
  local copts = spec.context(opts)
  copts.listen = opts.listen
  copts.advertise = opts.advertise
  copts.metrics = opts.metrics          -- --metrics ADDRESS (lecho.metrics)
  copts.key = opts.key                                      -- nil: $LECHO_KEY
  if opts.trust and #opts.trust > 0 then copts.trust = opts.trust end  -- else $LECHO_TRUST
  -- logs: lecho.log's lines on stderr (doc/operations.md "Logs"); --quiet: errors only
  if opts.quiet then copts.log_level = "error" end
  local ok, ctx, err = pcall(lecho.context, copts)   -- (raises, or returns nil, err)
  if not ok or not ctx then M.die(prog, M.message(ok and err or ctx), 1) end
  if opts.port_file then
    local wok, werr = write_port_file(opts.port_file, ctx.addr)
    if not wok then
      ctx:close()
      M.die(prog, ("cannot write --port-file %s: %s"):format(opts.port_file, tostring(werr)), 1)
    end
  end
  local said = spec.started(ctx, opts)   -- (a script may start more here: the gateway)
  if not opts.quiet then
    local mode = ctx.principal and (" (keyed: principal %s)"):format(ctx.principal) or ""
    local metrics = ctx.metrics and ("; metrics on http://%s/metrics"):format(ctx.metrics.addr) or ""
    io.stderr:write(prog, ": ", said, mode, metrics, "\n")
  end
  -- listening on port 0: marked by the port it got (a restart may ask for it)
  if spec.run_mark and not mark then mark = run_mark(ctx.addr) end
  if mark then
    local f = io.open(mark, "w")
    if f then f:write(ctx.addr, "\n") f:close() end
    -- (ctx:close also runs from ctx:run() on SIGINT/SIGTERM)
    local close = ctx.close
    ctx.close = function(self, ...)
      if not self.closed and self.c:pending() == 0 then os.remove(mark) end
      return close(self, ...)
    end
  end
  if opts.duration then ctx:after(opts.duration, function() ctx:stop() end) end
  ctx:run()
  ctx:close()
end

return M
