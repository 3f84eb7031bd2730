-- lecho.push: code pushed to a running node (doc/services.md "Pushing code").
--
-- ctx:sandbox(src, name [, opts]) loads Lua source in a sandboxed state made
-- like a modulator's (core/moe/moe_svc.c: the same environment without emit, the
-- node's modulator_memory and modulator_budget, which opts may lower but not
-- raise, and the group caps modulators_memory and modulators_cpu).  The
-- chunk returns a function or a table of functions; sb:call(...) and
-- sb:invoke(fname, ...) run them with values and return true, results... or
-- nil, err, code [, traceback] (err is the raised value itself when the
-- function raised: code "failed"; "limit" for a budget or memory stop,
-- "invalid" for arguments or results that cannot travel).  A failed call
-- leaves the state serving; only the CPU share check ends it ("closed").

--
-- A node started with accept_code serves the built-in service lecho.code@1
-- (M.serve): { op = "load", name =, version =, src =, concurrency =, queue =,
-- budget =, memory = } loads src in a sandbox charged to the pusher and
-- serves it as service name@version (a table of at most MAX_FUNCTIONS
-- functions is still ONE service: calls name the function in args.fn);
-- { op = "unload", name =, version = } (no version: all of name's the
-- caller pushed); { op = "list" }.  Who may push: keyed mode, the
-- principals of the accept_code list (true: any principal the node trusts);
-- protected mode, callers on loopback or a Unix socket (what protected mode
-- accepts anyway: checked again here).  Which names: M.config (the node's
-- list, by default a namespace per pusher); never "lecho." (the library's),
-- never a name the node serves in a version another pushed or the node
-- registered.  Only the pusher (principal, or context address in protected
-- mode) or the node unloads.
-- ctx:push(node, name, src, opts), ctx:unload_pushed(node, name, version) and
-- ctx:pushed(node) call it at node ("host:port") alone.

local Context = require "lecho.context"
-- Loops over keys as `in each(t)`, never `in pairs(t)`: no ITERN loop, which
-- Debian's LuaJIT may never end in the close at the program's end (context.lua).
local each = pairs

local M = {}

M.SERVICE = "lecho.code"
M.MAX_SRC = 1024 * 1024 -- bytes of source one push may carry
M.MAX_LOADED = 64       -- name@version loaded at once on a node
M.MAX_FUNCTIONS = 256   -- functions of one pushed chunk's table (one service)
M.MAX_NAMES = 1024      -- distinct names pushed over the node's life (each keeps a channel record)
M.VERSION = 1           -- lecho.code's version: clients ask for it exactly

local function lower(want, cap)
  if want == nil then return cap end
  if type(want) ~= "number" or want ~= want or want <= 0 then return nil end
  return math.min(want, cap)
end

--- ctx:sandbox(src, name [, opts]) -> sandbox | nil, err, code
-- opts: budget (CPU seconds per call), memory (bytes), both at most the
-- node's modulator_budget / modulator_memory; principal (charged for its CPU
-- share); clock, log (granted to the code).
function Context:sandbox(src, name, opts)
  if type(src) ~= "string" then return nil, "sandbox: source must be a string", "invalid" end
  if type(name) ~= "string" or #name == 0 or #name > 90 then
    return nil, "sandbox: name must be a string of 1..90 bytes", "invalid"
  end
  opts = opts or {}
  local budget, memory = lower(opts.budget, self.mod_budget), lower(opts.memory, self.mod_memory)
  if not budget or not memory then
    return nil, "sandbox: budget and memory must be positive numbers", "invalid"
  end
  return self.c:sandbox(src, name, { budget = budget, memory = math.max(memory, 256 * 1024),
                                     clock = opts.clock and true or false, log = opts.log and true or false,
                                     pool_memory = self.mods_memory, cpu_share = self.mods_cpu,
                                     principal = opts.principal })
end


local function valid_name(n)
  return type(n) == "string" and #n >= 1 and #n <= 200 and not n:find("[^%w%._%-]")
end

-- A value in an error text: never a heap address ("table: 0x...").
local function safe(v)
  local t = type(v)
  if t == "string" then return v:sub(1, 200) end
  if t == "number" or t == "boolean" or t == "nil" then return tostring(v) end
  return "a " .. t
end
M.safe = safe

local function loopback(addr)
  if type(addr) ~= "string" then return false end
  return addr:match("^127%.") ~= nil or addr:match("^%[::1%]:") ~= nil or addr:match("^unix:") ~= nil
end

--- The node's accept_code as { principals = true | { name, ... }, names =
-- { pattern, ... } }: true, a list of principals, or that table itself.  A
-- name pattern is a service name, or a prefix ending in "*"; "{principal}"
-- in it stands for the pusher's principal.  Default names: keyed mode
-- "{principal}.*" (a namespace per pusher), protected mode "pushed.*".
function M.config(accept, keyed)
  local principals, names = true, nil
  if type(accept) == "table" and (accept.principals ~= nil or accept.names ~= nil) then
    principals = accept.principals == nil and true or accept.principals
    names = accept.names
  elseif type(accept) == "table" then
    principals = accept
  end
  return { principals = principals, names = names or { keyed and "{principal}.*" or "pushed.*" } }
end

local function name_allowed(cfg, who, name)
  for _, p in ipairs(cfg.names) do
    p = p:gsub("{principal}", function() return who end)
    if p:sub(-1) == "*" then
      local pre = p:sub(1, -2)
      if #name > #pre and name:sub(1, #pre) == pre then return true end
    elseif p == name then
      return true
    end
  end
  return false
end

-- Who may push: the caller's principal (keyed) or address (protected).
local function allowed(ctx, cfg, meta)
  local accept = cfg.principals
  if ctx.keyed then
    local who = meta.caller -- keyed: the caller's principal (lecho.service)
    if type(who) ~= "string" then return nil, "not allowed: the caller has no principal" end
    if accept == true then return who end
    for _, p in ipairs(accept) do if p == who then return who end end
    return nil, ("not allowed: %s may not push code to %s"):format(safe(who), ctx.addr)
  end
  if not loopback(meta.caller) then
    return nil, ("not allowed: %s is not a local process (protected mode)"):format(safe(meta.caller))
  end
  return meta.caller
end

-- The node itself (its own calls of lecho.code): may unload anything.
local function is_node(ctx, who)
  return who == ctx.addr or (ctx.principal ~= nil and who == ctx.principal)
end

local function refuse(why, code) error({ code = code or "invalid", why = why }, 0) end

local function unload(ctx, key, why)
  local entry = ctx.code_loaded[key]
  if not entry then return false end
  ctx.code_loaded[key] = nil
  entry.service:close()
  entry.sb:close()
  if why then ctx.log(("pushed service %s unloaded: %s"):format(key, why)) end
  return true
end

local Service = require "lecho.service"

-- The handler of a pushed service: the sandbox's results, or its error as
-- the sandbox raised it (a table stays a table) with the sandbox's code and
-- traceback (not this wrapper's: no frame of the node's files).  A chunk
-- that returned a table of functions is called by args.fn.
local function handler(ctx, key, sb, fnames)
  local known
  if fnames then
    known = {}
    for _, f in ipairs(fnames) do known[f] = true end
  end
  return function(args, meta)
    local r = { n = 0 }
    local function keep(...) r = { n = select("#", ...), ... } end
    if known then
      local fn = type(args) == "table" and args.fn or nil
      if not known[fn] then
        Service.fail(("%s has %d functions: args.fn must name one (got %s)"):format(key, #fnames, safe(fn)),
                     "invalid")
      end
      keep(sb:invoke(fn, args, meta))
    else
      keep(sb:call(args, meta))
    end
    if r[1] then return unpack(r, 2, r.n) end
    if r[3] == "closed" then unload(ctx, key, r[2]) end
    Service.fail(r[2], r[3] or "failed", r[4])
  end
end

local function load(ctx, cfg, req, who)
  if not valid_name(req.name) then refuse("name must be 1..200 bytes of [A-Za-z0-9._-]") end
  if req.name:sub(1, 6) == "lecho." then refuse("names beginning with lecho. are the library's", "refused") end
  if not name_allowed(cfg, tostring(who), req.name) then
    local ps = {}
    for i, p in ipairs(cfg.names) do ps[i] = p:gsub("{principal}", function() return tostring(who) end) end
    refuse(("%s may not push %s here: names allowed: %s"):format(safe(who), req.name, table.concat(ps, ", ")),
           "refused")
  end
  local version = req.version == nil and 1 or req.version
  if type(version) ~= "number" or version < 1 or version ~= math.floor(version) or version > 2 ^ 31 then
    refuse("version must be an integer >= 1")
  end
  if type(req.src) ~= "string" or #req.src > M.MAX_SRC then
    refuse(("src must be Lua source text of at most %d bytes"):format(M.MAX_SRC))
  end
  local key = ("%s@%d"):format(req.name, version)
  if ctx.code_loaded[key] or ctx.code_loading[key] then
    refuse(key .. " is loaded here: unload it first, or push another version")
  end
  -- a name the node serves already (any version) is the pusher's only if
  -- every version of it served here is one it pushed
  local served = ctx.svc_names and ctx.svc_names[req.name]
  for v in each(served and served.byver or {}) do
    local k = ("%s@%d"):format(req.name, v)
    local e = ctx.code_loaded[k] or ctx.code_loading[k] -- (a load under way is served already)
    if not e or e.by ~= who then
      refuse(("%s is served here (version %d) by %s"):format(req.name, v, e and "another pusher" or "the node"),
             "refused")
    end
  end
  -- (loads in progress count: the service's join waits)
  local n = ctx.code_nloading
  for _ in each(ctx.code_loaded) do n = n + 1 end
  if n >= M.MAX_LOADED then refuse(("%d pushed services are loaded here (the limit)"):format(n), "limit") end
  local sb, err, code = ctx:sandbox(req.src, key, { budget = req.budget, memory = req.memory, principal = who })
  if not sb then refuse(err, code) end
  local fnames = sb:names() or nil -- (false: the chunk returned one function)
  if fnames then
    if #fnames > M.MAX_FUNCTIONS then
      sb:close()
      refuse(("the chunk returned %d functions: at most %d"):format(#fnames, M.MAX_FUNCTIONS), "limit")
    end
    for _, f in ipairs(fnames) do
      if not valid_name(f) then
        sb:close()
        refuse(("the chunk's table has a key %s: function names are 1..200 bytes of [A-Za-z0-9._-]")
               :format(type(f) == "string" and ("%q"):format(f:sub(1, 40)) or "that is a " .. type(f)))
      end
    end
    table.sort(fnames)
  end
  if not ctx.code_names[req.name] then
    if ctx.code_nnames >= M.MAX_NAMES then
      sb:close()
      refuse(("%d names were pushed here (the limit over the node's life): push a version of one of them")
             :format(ctx.code_nnames), "limit")
    end
    ctx.code_names[req.name] = true
    ctx.code_nnames = ctx.code_nnames + 1
  end
  local sopts = { version = version, concurrency = req.concurrency, queue = req.queue }
  ctx.code_loading[key] = { by = who }
  ctx.code_nloading = ctx.code_nloading + 1
  -- (bad concurrency or queue values raise in ctx:service: a refusal here)
  local pok, s, serr, scode = pcall(ctx.service, ctx, req.name, handler(ctx, key, sb, fnames), sopts)
  ctx.code_loading[key] = nil
  ctx.code_nloading = ctx.code_nloading - 1
  if not pok then s, serr, scode = nil, s, "invalid" end
  if not s then
    sb:close()
    refuse(("%s: %s"):format(key, safe(serr)), scode)
  end
  ctx.code_loaded[key] = { name = req.name, version = version, by = who, sb = sb, service = s,
                           functions = fnames }
  ctx.log(("pushed service %s loaded from %s: %s"):format(key, safe(who),
          fnames and ("%d functions"):format(#fnames) or "one function"))
  return { loaded = key, services = { req.name }, functions = fnames }
end

--- Serves lecho.code on ctx (a context started with accept_code).
function M.serve(ctx, accept)
  ctx.code_loaded = ctx.code_loaded or {}
  ctx.code_loading, ctx.code_nloading = {}, 0
  ctx.code_names, ctx.code_nnames = {}, 0 -- names ever pushed (their channels stay: channel.lua)
  local cfg = M.config(accept, ctx.keyed)
  return ctx:service(M.SERVICE, function(req, meta)
    local who, why = allowed(ctx, cfg, meta or {})
    if not who and not is_node(ctx, (meta or {}).caller) then refuse(why, "refused") end
    who = who or meta.caller
    if type(req) ~= "table" then refuse("request must be a table { op = load|unload|list, ... }") end
    if req.op == "load" then return load(ctx, cfg, req, who) end
    if req.op == "unload" then
      if not valid_name(req.name) then refuse("name must be 1..200 bytes of [A-Za-z0-9._-]") end
      if req.version ~= nil and type(req.version) ~= "number" then refuse("version must be an integer >= 1") end
      local gone, others = {}, 0
      for key, e in each(ctx.code_loaded) do
        if e.name == req.name and (req.version == nil or e.version == req.version) then
          -- only by its pusher (keyed: principal; protected: context
          -- address) or the node itself
          if e.by == who or is_node(ctx, who) then gone[#gone + 1] = key else others = others + 1 end
        end
      end
      table.sort(gone)
      if #gone == 0 then
        if others > 0 then
          refuse(("%s%s was pushed by another: only its pusher or the node may unload it"):format(
                 req.name, req.version and "@" .. safe(req.version) or ""), "refused")
        end
        refuse(("%s%s is not loaded here"):format(req.name, req.version and "@" .. safe(req.version) or ""),
               "notfound")
      end
      for _, key in ipairs(gone) do unload(ctx, key) end
      return { unloaded = gone }
    end
    if req.op == "list" then
      local out = {}
      for key, e in each(ctx.code_loaded) do
        local st = e.sb:stats()
        out[key] = { name = e.name, version = e.version, by = e.by, functions = e.functions,
                     calls = st.calls, memory = st.memory, time = st.time }
      end
      return out
    end
    refuse("op must be load, unload or list")
  end, { concurrency = 4, queue = 16 }, Service.RESERVED)
end

-- lecho.code's refusals are raised as { code =, why = }: given back as
-- nil, why, code.
local function code_call(ctx, node, req, opts)
  if type(node) ~= "string" then return nil, "node must be an address string (host:port)", "invalid" end
  opts = opts or {}
  local r, err, code = ctx:call(M.SERVICE, req, { at = node, timeout = opts.timeout, version = M.VERSION })
  if r == nil and code == "failed" and type(err) == "table" and type(err.why) == "string" then
    return nil, err.why, type(err.code) == "string" and err.code or "failed"
  end
  return r, err, code
end

--- ctx:push(node, name, src [, opts]) -> { loaded = "name@v", services = {...} } | nil, err, code
-- opts: version (default 1), concurrency, queue (the service's), budget,
-- memory (lower than the node's modulator limits only), timeout.
function Context:push(node, name, src, opts)
  opts = opts or {}
  return code_call(self, node, { op = "load", name = name, version = opts.version, src = src,
                                 concurrency = opts.concurrency, queue = opts.queue,
                                 budget = opts.budget, memory = opts.memory }, opts)
end

--- ctx:unload_pushed(node, name [, version [, opts]]) -> { unloaded = {...} } | nil, err, code
function Context:unload_pushed(node, name, version, opts)
  return code_call(self, node, { op = "unload", name = name, version = version }, opts)
end

--- ctx:pushed(node [, opts]) -> { ["name@v"] = { name, version, by, functions, calls, memory, time } }
function Context:pushed(node, opts)
  return code_call(self, node, { op = "list" }, opts)
end

return M
