-- lecho.push: code pushed to a running node (README "Pushing code").
--
-- ctx:sandbox(src, name [, opts]) loads Lua source in a sandboxed state made
-- like a modulator's (core/moe_svc.c: the same environment without emit, the
-- node's modulator_memory and modulator_budget, which opts may lower but not
-- raise, and the group caps modulators_memory and modulators_cpu).  The
-- chunk returns a function or a table of functions; sb:call(...) and
-- sb:invoke(fname, ...) run them with values and return true, results... or
-- nil, err, code [, traceback] (err is the raised value itself when the
-- function raised: code "failed"; "limit" for a budget or memory stop,
-- "invalid" for arguments or results that cannot travel).  A failed call
-- leaves the state serving; only the CPU share check ends it ("closed").

--
-- A node started with accept_code serves the built-in service lecho.code
-- (M.serve): { op = "load", name =, version =, src =, concurrency =, queue =,
-- budget =, memory = } loads src in a sandbox charged to the pusher and
-- serves it as service name@version (a table of functions: one service
-- name.f per function f); { op = "unload", name =, version = } (no version:
-- all of name's); { op = "list" }.  Who may push: keyed mode, the principals
-- of the accept_code list (true: any principal the node trusts); protected
-- mode, accept_code = true only, and callers on loopback or a Unix socket
-- (what protected mode accepts anyway: checked again here).
-- ctx:push(node, name, src, opts), ctx:unload_pushed(node, name, version) and
-- ctx:pushed(node) call it at node ("host:port") alone.

local Context = require "lecho.context"

local M = {}

M.SERVICE = "lecho.code"
M.MAX_SRC = 1024 * 1024 -- bytes of source one push may carry
M.MAX_LOADED = 64       -- name@version loaded at once on a node

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

local function loopback(addr)
  if type(addr) ~= "string" then return false end
  return addr:match("^127%.") ~= nil or addr:match("^%[::1%]:") ~= nil or addr:match("^unix:") ~= nil
end

-- Who may push: the caller's principal (keyed) or address (protected).
local function allowed(ctx, accept, meta)
  if ctx.keyed then
    local who = meta.caller -- keyed: the caller's principal (lecho.service)
    if type(who) ~= "string" then return nil, "not allowed: the caller has no principal" end
    if accept == true then return who end
    for _, p in ipairs(accept) do if p == who then return who end end
    return nil, ("not allowed: %s may not push code to %s"):format(who, ctx.addr)
  end
  if not loopback(meta.caller) then
    return nil, ("not allowed: %s is not a local process (protected mode)"):format(tostring(meta.caller))
  end
  return meta.caller
end

local function refuse(why, code) error({ code = code or "invalid", why = why }, 0) end

local function unload(ctx, key, why)
  local entry = ctx.code_loaded[key]
  if not entry then return false end
  ctx.code_loaded[key] = nil
  for _, s in ipairs(entry.services) do s:close() end
  entry.sb:close()
  if why then ctx.log(("pushed service %s unloaded: %s"):format(key, why)) end
  return true
end

-- The handler of one pushed function: the sandbox's results, or its error
-- raised as a value (a table stays a table).  A budget stop raises its text
-- "budget exceeded: ...", which lecho.service answers with code "limit"; a
-- memory stop "memory: ..." (code "failed": a handler cannot name another).
-- The sandbox's own traceback is not carried: the reply's is this wrapper's.
local function handler(ctx, key, sb, fname)
  return function(args, meta)
    local r = { n = 0 }
    local function keep(...) r = { n = select("#", ...), ... } end
    if fname then keep(sb:invoke(fname, args, meta)) else keep(sb:call(args, meta)) end
    if r[1] then return unpack(r, 2, r.n) end
    if r[3] == "closed" then unload(ctx, key, r[2]) end
    -- a raised value goes as it is; a stop or a result that cannot travel
    -- as its text ("budget exceeded: ..." is code "limit" at the caller)
    error(r[2], 0)
  end
end

local function load(ctx, req, who)
  if not valid_name(req.name) then refuse("name must be 1..200 bytes of [A-Za-z0-9._-]") end
  local version = req.version == nil and 1 or req.version
  if type(version) ~= "number" or version < 1 or version ~= math.floor(version) or version > 2 ^ 31 then
    refuse("version must be an integer >= 1")
  end
  if type(req.src) ~= "string" or #req.src > M.MAX_SRC then
    refuse(("src must be Lua source text of at most %d bytes"):format(M.MAX_SRC))
  end
  local key = ("%s@%d"):format(req.name, version)
  if ctx.code_loaded[key] then refuse(key .. " is loaded here: unload it first, or push another version") end
  local n = 0
  for _ in pairs(ctx.code_loaded) do n = n + 1 end
  if n >= M.MAX_LOADED then refuse(("%d pushed services are loaded here (the limit)"):format(n), "limit") end
  local sb, err, code = ctx:sandbox(req.src, key, { budget = req.budget, memory = req.memory, principal = who })
  if not sb then refuse(err, code) end
  local fnames = sb:names()
  local entry = { name = req.name, version = version, by = who, sb = sb, services = {},
                  functions = fnames or nil }
  local sopts = { version = version, concurrency = req.concurrency, queue = req.queue }
  local list = fnames or { false }
  table.sort(list, function(a, b) return tostring(a) < tostring(b) end)
  local served = {}
  for _, f in ipairs(list) do
    local sname = f and (req.name .. "." .. f) or req.name
    if not valid_name(sname) then
      for _, s in ipairs(entry.services) do s:close() end
      sb:close()
      refuse(("function name %q makes service name %q: not 1..200 bytes of [A-Za-z0-9._-]"):format(f, sname))
    end
    -- (bad concurrency or queue values raise in ctx:service: a refusal here)
    local pok, s, serr, scode = pcall(ctx.service, ctx, sname, handler(ctx, key, sb, f or nil), sopts)
    if not pok then s, serr, scode = nil, s, "invalid" end
    if not s then
      for _, o in ipairs(entry.services) do o:close() end
      sb:close()
      refuse(("%s: %s"):format(sname, tostring(serr)), scode)
    end
    entry.services[#entry.services + 1] = s
    served[#served + 1] = sname
  end
  ctx.code_loaded[key] = entry
  ctx.log(("pushed service %s loaded from %s: %s"):format(key, tostring(who), table.concat(served, ", ")))
  return { loaded = key, services = served }
end

--- Serves lecho.code on ctx (a context started with accept_code).
function M.serve(ctx, accept)
  ctx.code_loaded = ctx.code_loaded or {}
  return ctx:service(M.SERVICE, function(req, meta)
    local who, why = allowed(ctx, accept, meta or {})
    if not who then refuse(why, "refused") end
    if type(req) ~= "table" then refuse("request must be a table { op = load|unload|list, ... }") end
    if req.op == "load" then return load(ctx, req, who) end
    if req.op == "unload" then
      if not valid_name(req.name) then refuse("name must be 1..200 bytes of [A-Za-z0-9._-]") end
      local gone = {}
      for key, e in pairs(ctx.code_loaded) do
        if e.name == req.name and (req.version == nil or e.version == req.version) then gone[#gone + 1] = key end
      end
      table.sort(gone)
      if #gone == 0 then
        refuse(("%s%s is not loaded here"):format(req.name, req.version and "@" .. tostring(req.version) or ""),
               "notfound")
      end
      for _, key in ipairs(gone) do unload(ctx, key) end
      return { unloaded = gone }
    end
    if req.op == "list" then
      local out = {}
      for key, e in pairs(ctx.code_loaded) do
        local st = e.sb:stats()
        out[key] = { name = e.name, version = e.version, by = e.by, functions = e.functions,
                     calls = st.calls, memory = st.memory, time = st.time }
      end
      return out
    end
    refuse("op must be load, unload or list")
  end, { concurrency = 4, queue = 16 })
end

-- lecho.code's refusals are raised as { code =, why = }: given back as
-- nil, why, code.
local function code_call(ctx, node, req, opts)
  if type(node) ~= "string" then return nil, "node must be an address string (host:port)", "invalid" end
  opts = opts or {}
  local r, err, code = ctx:call(M.SERVICE, req, { at = node, timeout = opts.timeout })
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
