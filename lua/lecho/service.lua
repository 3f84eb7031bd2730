-- lecho.service: serving services (doc/services.md): ctx:service and the
-- service object; calling them is lecho.call.
--
-- A service NAME is the channel "svc:NAME" at each name server of the
-- context: its servers are consumers of it (their join lists the versions
-- they serve), its callers producers.  A call is one sync event sent to ONE
-- server (ctx.c:call); the ACK of that event carries the reply as its value
-- (doc/wire-format.md "Calls").  Values on the wire:
--   request { v = version wanted, k = idempotency key, t = time left, r = largest reply taken, a = args }
--   reply   { n = N, ...results }  or  { e = error value, c = "code", tb = traceback }
-- The server runs each call in a coroutine of its own (a handler may wait);
-- its limits: `concurrency` running, `queue` waiting, past them "busy" at
-- once; `budget` CPU seconds of the handler's own Lua per call.  A served
-- call channel's events come here, not to consumer handlers: the context's
-- dispatch routes them (Context:_route), and a budgeted handler's waits are
-- not counted (Context:_on_wait); the scheduler knows no service.

local options = require "lecho.options"
local Context = require "lecho.context"
-- Loops over keys as `in each(t)`, never `in pairs(t)`: no ITERN loop, which
-- Debian's LuaJIT may never end in the close at the program's end (context.lua).
local each = pairs

local jit_ok, jit = pcall(require, "jit")
local sethook, clock = debug.sethook, os.clock
local traceback = require("lecho.errors").traceback  -- (without lecho's own frames)
local unpack, select, type, pairs, ipairs = unpack, select, type, pairs, ipairs

local Service = {}
Service.__index = Service

-- Instructions between two looks at a budgeted handler's CPU time, and
-- between two raises once it is past its budget.
local HOOK_COUNT, HOOK_AGAIN = 10000, 1

-- (shared with lecho.call)
local svcname = require "lecho.svcname"
local check_name, nslist = svcname.check_name, svcname.nslist

local function sorted_versions(byver)
  local vs = {}
  for v in each(byver) do vs[#vs + 1] = v end
  table.sort(vs)
  return vs
end

-- ---- CPU budget -----------------------------------------------------------
-- LuaJIT's hooks are the VM's, not a coroutine's: the count hook is set
-- while a budgeted handler runs and cleared while it waits (the context
-- calls the budget's pause and resume around each wait: Context:_on_wait)
-- and when it ends.  The handler's functions run interpreted (jit.off) so
-- that the hook sees their loops.

-- The clock is read from the hook's first call on (b.last false until
-- then): a handler that ends within HOOK_COUNT instructions costs no clock
-- read at all (the first HOOK_COUNT instructions of each run are not
-- counted: microseconds, against a budget of seconds).
-- A budget: { ctx, used, last, limit, s (the service), over }.
local Budget = {}
Budget.__index = Budget

function Budget:pause()
  sethook()
  self.ctx.svc_cur = nil
  if self.last then self.used = self.used + (clock() - self.last) end
end

function Budget:resume()
  local ctx = self.ctx
  self.last = false
  ctx.svc_cur = self
  sethook(ctx.svc_hook, "", self.over and HOOK_AGAIN or HOOK_COUNT)
end

local on_error

-- A budget stop is raised as this object (code limit), never a string whose
-- words would say so: a handler's own error that happens to read "budget
-- exceeded: ..." is its error, code failed.  It prints as its message.
local BUDGET = { __tostring = function(b) return b.e end }

local function budget_hook(ctx)
  return function()
    local b = ctx.svc_cur
    if not b then return end
    -- (past the budget: not in the handler's error handler itself)
    if b.over and debug.getinfo(2, "f").func == on_error then return end
    local t = clock()
    if b.last then b.used = b.used + (t - b.last) end
    b.last = t
    if b.used > b.limit then
      -- from now on at every instruction: a handler that catches the
      -- error (pcall in a loop) meets it again as soon as it is outside
      if not b.over then
        b.over = true
        sethook(ctx.svc_hook, "", HOOK_AGAIN)
      end
      error(setmetatable({ e = ("budget exceeded: %s@%d used %.2f s of CPU (budget %g s)"):format(
        b.s.name, b.s.version, b.used, b.limit) }, BUDGET), 0)
    end
  end
end

-- ---- server side ------------------------------------------------------------

-- gen: the generation of the connection the call came on; the reply goes
-- to that connection only (another process that took the caller's address
-- must never get it: dropped, counted in ctx.c:stats().stale_acks).
-- rlim: the largest reply the caller takes (request field r); a larger
-- one becomes an error reply here, code limit, never a cut connection.
local function ack(ctx, peer, gen, sync, reply, rlim)
  local ok, err, code = ctx.c:ack(peer, sync, 1, reply, true, gen, rlim)
  if not ok then
    local e = tostring(err)
    -- (the results' path in the handler's words: result 1, not ev[1])
    e = e:gsub(" at ev%[(%d+)%]", " at result %1"):gsub(" at ev%.(%d+)", " at result %1")
    if code ~= "limit" then e = "reply cannot be sent: " .. e
    elseif not e:find("^result of") then e = "result exceeds the limit: " .. e end
    ctx.c:ack(peer, sync, 1, { e = e,
                               c = code == "limit" and "limit" or "invalid" }, true, gen)
  end
end

-- The service of `entry` a request asks for: version v exactly, else the
-- highest >= mv (1).  (lecho's caller names the version it chose.)
local function pick(entry, v, mv)
  if v ~= nil then return entry.byver[v] end
  local vs = entry.versions
  local top = vs[#vs]
  return top and top >= (mv or 1) and entry.byver[top] or nil
end

local function err_value(e)
  -- a value that cannot travel (a function, a coroutine) goes as its type
  -- (never its address)
  local t = type(e)
  if t == "function" or t == "thread" or t == "userdata" then return ("error object is a %s value"):format(t) end
  return e
end

-- Service.fail(e, code, tb): raised by a handler that answers with its own
-- code and traceback (lecho.push: a sandbox's, without the node's frames).
local FAIL = {}
function Service.fail(e, code, tb) error(setmetatable({ e = e, c = code, tb = tb }, FAIL), 0) end
-- At most this many results travel in a reply (the caller unpacks them
-- onto its Lua stack: LuaJIT takes fewer than 8000).
local MAX_RESULTS = svcname.MAX_RESULTS

local function pack_reply(ok, ...)
  local n = select("#", ...)
  if ok then
    if n > MAX_RESULTS then
      return { e = ("too many results: %d (at most %d)"):format(n, MAX_RESULTS), c = "limit" }
    end
    return { n = n, ... }
  end
  local w = ...
  return { e = err_value(w.e), c = w.c or "failed", tb = w.tb }
end

-- set by on_error when the handler's error was a SIGINT's "interrupted!"
-- (read at once by run_call: nothing runs in between)
local intr_seen = false

on_error = function(e)
  sethook()  -- the handler is over (a budget's hook must not fire in here)
  if type(e) == "string" and (e:find("interrupted!$") or e:find("interrupted!\n", 1, true)) then
    intr_seen = true
  end
  if getmetatable(e) == FAIL then return { e = e.e, c = e.c, tb = e.tb } end
  if getmetatable(e) == BUDGET then return { e = e.e, c = "limit", tb = traceback(e.e, 2) } end
  -- (a value that is no string: the traceback alone, "stack traceback:...")
  return { e = e, c = "failed", tb = type(e) == "string" and traceback(e, 2)
                                     or (traceback("", 2):gsub("^\n", "")) }
end

local start

-- Queued calls whose caller's deadline passed (request t) are answered
-- "timeout" without running: nobody may wait for them any more, and they
-- hold memory.  Queue entry: { peer, sync, req, caller, gen, bytes, deadline }.
local function expire(ctx, s)
  local q = s.q
  if not q[1] then return end
  local t = ctx.c:now()
  local keep = {}
  for i = 1, #q do
    local w = q[i]
    if w[7] and w[7] <= t then
      s.qbytes = s.qbytes - w[6]
      s.expired = (s.expired or 0) + 1
      ack(ctx, w[1], w[5], w[2], { e = ("timeout: the call waited in %s@%d's queue past its caller's deadline")
                                   :format(s.name, s.version), c = "timeout" })
    else
      keep[#keep + 1] = w
    end
  end
  if #keep < #q then s.q = keep end
end

-- One call, in a coroutine of its own.
local function run_call(ctx, s, peer, gen, sync, req, caller)
  local meta = { service = s.name, version = s.version, caller = caller, key = req.k,
                 deadline = type(req.t) == "number" and ctx.c:now() + req.t or nil }
  local co = coroutine.running()
  local b
  if s.budget > 0 then
    b = setmetatable({ ctx = ctx, used = 0, last = false, limit = s.budget, s = s, over = false }, Budget)
    ctx:_on_wait(co, b)
    b:resume()
  end
  intr_seen = false
  local reply = pack_reply(xpcall(s.handler, on_error, req.a, meta))
  if intr_seen then
    -- A SIGINT's "interrupted!" (outside attack F4: a main-line call of
    -- this service returned it as the call's failure and the script went
    -- on): the signal, raised again on the main line by its wait (or ctx:run
    -- closes), as a callback's (Context:_sigint_in_callback); the caller, if
    -- it is another process, is told the call was not done.
    intr_seen = false
    ctx:_sigint_in_callback("interrupted!")
    reply = { e = ("%s@%d: interrupted: the service's program got a signal"):format(s.name, s.version),
              c = "failed" }
  end
  if b then
    b:pause()
    ctx:_on_wait(co, nil)
  end
  s.running = s.running - 1
  if not ctx.closed then ack(ctx, peer, gen, sync, reply, req.r) end
  -- the next waiting calls, now that there is room (those whose caller's
  -- deadline passed in the queue are answered "timeout", not run)
  if not ctx.closed then expire(ctx, s) end
  local q = s.q
  while q[1] and s.running < s.concurrency and not s.closed and not ctx.closed do
    local w = table.remove(q, 1)
    s.qbytes = s.qbytes - w[6]
    start(ctx, s, w[1], w[5], w[2], w[3], w[4])
  end
  if not q[1] and s.qtimer then s.qtimer:stop(); s.qtimer = nil end
end

start = function(ctx, s, peer, gen, sync, req, caller)
  s.running = s.running + 1
  ctx:_spawn(run_call, ctx, s, peer, gen, sync, req, caller)
end

-- An event on a call channel served here, from Context:_dispatch through
-- the route the service set (Context:_route).  Never acknowledged from C
-- (returns no count): each call is answered by ack().
local function serve(self, entry, req, peer, sync, gen, nbytes)
  if sync == 0 then return false end -- not a call (no sync id): nothing to answer
  if type(req) ~= "table" or (req.v ~= nil and type(req.v) ~= "number")
     or (req.mv ~= nil and type(req.mv) ~= "number")
     or (req.k ~= nil and type(req.k) ~= "string") or (req.t ~= nil and type(req.t) ~= "number")
     or (req.r ~= nil and type(req.r) ~= "number") then
    ack(self, peer, gen, sync, { e = ("bad request to service %s: not a request table"):format(entry.name),
                            c = "invalid" })
    return false
  end
  local s = pick(entry, req.v, req.mv)
  if not s then
    ack(self, peer, gen, sync, { e = ("no service %s%s here"):format(entry.name,
                            req.v and "@" .. req.v or req.mv and "@>=" .. req.mv or ""), c = "noservice" })
    return false
  end
  local caller = peer == 0 and self.addr or self:_peer_addr(peer)
  if self.keyed then caller = self.c:peer_identity(caller) or caller end
  if s.running < s.concurrency then
    start(self, s, peer, gen, sync, req, caller)
    return false
  end
  expire(self, s)
  nbytes = nbytes or 0
  if #s.q < s.queue and (not s.q[1] or s.qbytes + nbytes <= s.queue_bytes) then
    s.q[#s.q + 1] = { peer, sync, req, caller, gen, nbytes, req.t and self.c:now() + req.t or nil }
    s.qbytes = s.qbytes + nbytes
    if not s.qtimer then
      -- while calls wait: those past their deadline go, even when no
      -- running call ends
      s.qtimer = self.c:timer(0.25, 0.25, function()
        if self.closed or s.closed then return end
        expire(self, s)
        if not s.q[1] and s.qtimer then s.qtimer:stop(); s.qtimer = nil end
      end)
    end
  elseif #s.q >= s.queue then
    ack(self, peer, gen, sync, { e = ("busy: %s@%d has %d running and %d queued"):format(
      s.name, s.version, s.running, #s.q), c = "busy" })
    if nbytes > 65536 then collectgarbage("step", math.floor(nbytes / 1024)) end
  else
    ack(self, peer, gen, sync, { e = ("busy: %s@%d has %d bytes of calls queued (queue_bytes %d)"):format(
      s.name, s.version, s.qbytes, s.queue_bytes), c = "busy" })
    -- the refused request was decoded already: collect it now rather than
    -- let refused large requests pile up as garbage
    if nbytes > 65536 then collectgarbage("step", math.floor(nbytes / 1024)) end
  end
  return false
end

local function noop() end

--- Serves `name` with handler(args, meta) -> results.  opts: version (1),
-- concurrency (16), queue (64), queue_bytes (64 MiB), budget (5 CPU seconds per call; 0: none).
-- Returns the service object (s:close() unloads it), or nil, err, code.
-- Names beginning with "lecho." are the library's (lecho.code): served
-- only with this token as the 4th argument.
Service.RESERVED = setmetatable({}, { __tostring = function() return "lecho.service.RESERVED" end })

function Context:service(name, handler, opts, reserved)
  check_name(name, "ctx:service")
  if name:sub(1, 6) == "lecho." and reserved ~= Service.RESERVED then
    error(("lecho: ctx:service: names beginning with lecho. are the library's (got %q)"):format(name:sub(1, 40)), 2)
  end
  local source = type(handler) == "table" and handler.source
  if type(handler) ~= "function" and type(source) ~= "string" then
    error("lecho: ctx:service needs a handler function or { source = LUA_SOURCE }", 2)
  end
  if self.closed then error("lecho: context is closed", 2) end
  opts = options.check(opts, options.SERVICE, "ctx:service", 2)
  local D = options.SERVICE
  local version = opts.version or D.version
  local sb
  if source then
    -- The source form: the handler runs in a sandbox (lecho.push's, made
    -- like a modulator's state with the JIT off: the budget stops all of
    -- its Lua, helpers included; its memory is capped).  The native
    -- wrapper below only passes values.
    local budget = opts.budget or D.budget
    if budget <= 0 then
      return nil, "a service given as source needs a budget > 0", "invalid"
    end
    local err, code
    sb, err, code = self.c:sandbox(source, ("%s@%d"):format(name, version), {
      budget = budget, memory = math.max(self.mod_memory, 256 * 1024), pool_memory = self.mods_memory,
      cpu_share = 0, clock = true })
    if not sb then return nil, err, code end
    handler = function(args, meta)
      local r = { n = 0 }
      local function keep(...) r = { n = select("#", ...), ... } end
      keep(sb:call(args, meta))
      if r[1] then return unpack(r, 2, r.n) end
      -- a stop (budget, memory: limit; an ended sandbox: closed) keeps the
      -- sandbox's code; a raise is the handler's error (failed)
      if r[3] ~= "failed" then error(setmetatable({ e = r[2], c = r[3], tb = traceback(tostring(r[2]), 2) }, FAIL), 0) end
      error(r[2], 0)
    end
  end
  self.svc_names = self.svc_names or {}
  self.svc_hook = self.svc_hook or budget_hook(self)
  local entry = self.svc_names[name]
  if not entry then
    entry = { name = name, byver = {}, versions = {}, chans = {} }
    for _, ns in ipairs(nslist(self)) do
      local ch, err, code = self:channel(ns .. "/svc:" .. name)
      if not ch then return nil, err, code end
      self.c:set_calls(ch.chid)
      ch.calls = true   -- a call unanswered is no event unhandled (Context:_on_event)
      entry.chans[#entry.chans + 1] = ch
      self:_route(ch.chid, function(req, peer, sync, gen, nbytes)
        return serve(self, entry, req, peer, sync, gen, nbytes)
      end)
    end
    self.svc_names[name] = entry
  end
  if entry.byver[version] then
    if sb then sb:close() end
    return nil, ("service %s@%d is served here already"):format(name, version), "invalid"
  end
  local budget = opts.budget or D.budget
  if source then budget = 0 end -- (the sandbox counts it)
  if budget > 0 and jit_ok then jit.off(handler, true) end
  local s = setmetatable({ ctx = self, name = name, version = version, handler = handler,
                           concurrency = opts.concurrency or D.concurrency,
                           queue = opts.queue or D.queue, budget = budget,
                           queue_bytes = opts.queue_bytes or D.queue_bytes, qbytes = 0,
                           running = 0, q = {}, cons = {}, entry = entry, sb = sb }, Service)
  entry.byver[version] = s
  entry.versions = sorted_versions(entry.byver)
  -- joined at every name server; one that fails is logged, all failing is
  -- the error
  local ok_any, err, code = false, nil, nil
  for i, ch in ipairs(entry.chans) do
    ch.svc_versions = entry.versions
    local con, e, c = ch:consumer(noop)
    if con then
      s.cons[i] = con
      ok_any = true
    else
      err, code = e, c
      self.log(("service %s@%d: %s"):format(name, version, tostring(e)))
    end
  end
  if not ok_any then
    s.closed = true
    if sb then sb:close(); s.sb = nil end
    entry.byver[version] = nil
    entry.versions = sorted_versions(entry.byver)
    for _, ch in ipairs(entry.chans) do ch.svc_versions = entry.versions end
    return nil, err, code
  end
  return s
end

--- Unloads the service: calls running finish and reply; those queued, and
-- any arriving later, are answered "noservice" at once.
function Service:close()
  if self.closed then return end
  self.closed = true
  if self.sb then self.sb:close(); self.sb = nil end
  local ctx, entry = self.ctx, self.entry
  entry.byver[self.version] = nil
  entry.versions = sorted_versions(entry.byver)
  local q = self.q
  self.q = {}
  self.qbytes = 0
  if self.qtimer then self.qtimer:stop(); self.qtimer = nil end
  for _, w in ipairs(q) do
    ack(ctx, w[1], w[5], w[2], { e = ("no service %s@%d here (unloaded)"):format(self.name, self.version),
                           c = "noservice" })
  end
  if ctx.closed then return end
  for i, ch in ipairs(entry.chans) do
    ch.svc_versions = entry.versions
    if self.cons[i] then self.cons[i]:close() end
  end
end

return Service
