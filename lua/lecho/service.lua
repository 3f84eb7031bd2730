-- lecho.service: services and calls (doc/services.md).
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
-- once; `budget` CPU seconds of the handler's own Lua per call.  The caller
-- balances over the servers of a compatible version and retries on another
-- when the call surely did not run (busy, noservice, unreachable, refused),
-- and with a `key` also after a timeout or a lost connection.

local options = require "lecho.options"
local Context = require "lecho.context"

local jit_ok, jit = pcall(require, "jit")
local sethook, clock = debug.sethook, os.clock
local traceback = require("lecho.errors").traceback  -- (without lecho's own frames)
local unpack, select, type, pairs, ipairs = unpack, select, type, pairs, ipairs

local Service = {}
Service.__index = Service

-- Instructions between two looks at a budgeted handler's CPU time, and
-- between two raises once it is past its budget.
local HOOK_COUNT, HOOK_AGAIN = 10000, 1

local function check_name(name, where)
  if type(name) ~= "string" or #name < 1 or #name > 200 or not name:find("^[%w%._%-]+$") then
    error(("lecho: %s: a service name is 1 to 200 bytes of A-Z a-z 0-9 . _ - (got %s)")
          :format(where, type(name) == "string" and ("%q"):format(name:sub(1, 40)) or type(name)), 3)
  end
end

local function nslist(ctx) return ctx.nslist or { ctx.ns } end

local function sorted_versions(byver)
  local vs = {}
  for v in pairs(byver) do vs[#vs + 1] = v end
  table.sort(vs)
  return vs
end

-- ---- CPU budget -----------------------------------------------------------
-- LuaJIT's hooks are the VM's, not a coroutine's: the count hook is set
-- while a budgeted handler runs and cleared while it waits (ctx:_wait calls
-- _budget_pause/_budget_resume) and when it ends.  The handler's functions
-- run interpreted (jit.off) so that the hook sees their loops.

-- The clock is read from the hook's first call on (b.last false until
-- then): a handler that ends within HOOK_COUNT instructions costs no clock
-- read at all (the first HOOK_COUNT instructions of each run are not
-- counted: microseconds, against a budget of seconds).
function Context:_budget_pause(b)
  sethook()
  self.svc_cur = nil
  if b.last then b.used = b.used + (clock() - b.last) end
end

function Context:_budget_resume(b)
  b.last = false
  self.svc_cur = b
  sethook(self.svc_hook, "", b.over and HOOK_AGAIN or HOOK_COUNT)
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
local MAX_RESULTS = 4096
Service.MAX_RESULTS = MAX_RESULTS

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

on_error = function(e)
  sethook()  -- the handler is over (a budget's hook must not fire in here)
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
    b = { used = 0, last = false, limit = s.budget, s = s, over = false }
    ctx.svc_budgets[co] = b
    ctx:_budget_resume(b)
  end
  local reply = pack_reply(xpcall(s.handler, on_error, req.a, meta))
  if b then
    ctx:_budget_pause(b)
    ctx.svc_budgets[co] = nil
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

-- From Context:_dispatch: an event on a call channel served here.  Never
-- acknowledged from C (returns no count): each call is answered by ack().
function Context:_serve(entry, req, peer, sync, gen, nbytes)
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
  self.svc_chans = self.svc_chans or {}
  self.svc_budgets = self.svc_budgets or setmetatable({}, { __mode = "k" })
  self.svc_hook = self.svc_hook or budget_hook(self)
  local entry = self.svc_names[name]
  if not entry then
    entry = { name = name, byver = {}, versions = {}, chans = {} }
    for _, ns in ipairs(nslist(self)) do
      local ch, err, code = self:channel(ns .. "/svc:" .. name)
      if not ch then return nil, err, code end
      self.c:set_calls(ch.chid)
      entry.chans[#entry.chans + 1] = ch
      self.svc_chans[ch.chid] = entry
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

-- ---- caller side --------------------------------------------------------------

-- The caller's state of service `name`: one channel per name server,
-- joined as a producer at the first call that needs it.
local function caller_of(ctx, name)
  ctx.svc_callers = ctx.svc_callers or {}
  local cl = ctx.svc_callers[name]
  if cl then return cl end
  cl = { name = name, chans = {}, prods = {}, nprods = 0, joining = {}, down_until = {}, join_err = {},
         rr = 0 }
  for i, ns in ipairs(nslist(ctx)) do
    local ch, err, code = ctx:channel(ns .. "/svc:" .. name)
    if not ch then return nil, err, code end
    ctx.c:set_calls(ch.chid)
    cl.chans[i] = ch
  end
  ctx.svc_callers[name] = cl
  return cl
end

-- The producers of the name servers' channels are joined in the
-- background, all name servers at once (a coroutine each, bounded by the
-- context's control timeout), never inside one call's time: a call waits
-- for them only until its own deadline.  A name server whose join failed
-- is left alone for NS_RETRY seconds (calls do not wait for it), then
-- joined again in the background by the next call that needs it.
local NS_RETRY = 5
Service.NS_RETRY = NS_RETRY
local ORDER_WAIT = 1

local function start_join(ctx, cl, i)
  if cl.prods[i] or cl.joining[i] then return end
  if cl.down_until[i] and ctx.c:now() < cl.down_until[i] then return end
  cl.joining[i] = true
  ctx:_spawn(function()
    local p, err, code = cl.chans[i]:producer()
    cl.joining[i] = nil
    if p then
      cl.prods[i] = p
      cl.nprods = cl.nprods + 1
      cl.down_until[i], cl.join_err[i] = nil, nil
    else
      cl.join_err[i] = { err, code }
      cl.down_until[i] = ctx.c:now() + NS_RETRY
    end
  end)
end

-- Does name server i's channel list a server of the service?
local function has_servers(cl, i)
  local svc = cl.prods[i] and cl.chans[i].svc
  return svc ~= nil and next(svc) ~= nil
end

-- Can a call go on?  A joined channel lists servers (ordered: before any
-- earlier name server whose join is still in progress), or no join is in
-- progress any more.
local function joins_settled(cl, n, ordered)
  for i = 1, n do
    if has_servers(cl, i) then return true end
    if ordered and cl.joining[i] then return false end
  end
  for i = 1, n do
    if cl.joining[i] then return false end
  end
  return true
end

-- Starts the joins missing and waits, until deadline at most, until a
-- joined channel lists servers or no join is in progress.
local function join_all(ctx, cl, deadline)
  local n = #cl.chans
  for i = 1, n do start_join(ctx, cl, i) end
  -- In the order of nslist first: a name server whose join is still in
  -- progress is waited for before a later one with servers is taken (the
  -- doc/api.md's "the first that has servers"), but only for half the time
  -- left, at most ORDER_WAIT: a stalled name server's join must not eat a
  -- call's deadline (then any that lists servers does).
  local ordered_until = math.min(deadline, ctx.c:now() + math.min(ORDER_WAIT, (deadline - ctx.c:now()) / 2))
  ctx:_wait(function() return joins_settled(cl, n, true) end, ordered_until)
  ctx:_wait(function() return joins_settled(cl, n, false) end, deadline)
end

local function vlist(vs)
  local l = {}
  for v in pairs(vs) do l[#l + 1] = v end
  table.sort(l)
  return table.concat(l, ", ")
end

-- A server's entry in a member list's `svc`: its versions, or nil.
local function versions_of(info)
  local vs = type(info) == "table" and info.versions
  return type(vs) == "table" and vs or nil
end

local function serves(vs, want)
  for i = 1, #vs do
    if vs[i] == want then return true end
  end
  return false
end

-- The servers to try at channel ch: a list of addresses serving the
-- version chosen (exact, minimum or the highest), and that version; or nil,
-- err, code.
local function candidates(ctx, cl, ch, opts, tried)
  local svc = ch.svc
  local at = opts.at
  local addrs, all = {}, {}
  for addr, info in pairs(svc or {}) do
    local vs = versions_of(info)
    local t = tried[addr] -- true: tried; a table: those versions answered noservice
    if vs and t ~= true and (not at or at == addr) then
      for i = 1, #vs do
        if not (t and t[vs[i]]) then
          if addrs[#addrs] ~= addr then addrs[#addrs + 1] = addr end
          all[vs[i]] = true
        end
      end
    end
  end
  if not addrs[1] then return nil, "no service " .. cl.name, "noservice" end
  local want
  if opts.version then
    want = all[opts.version] and opts.version or nil
  else
    local floor = opts.min_version or 1
    for v in pairs(all) do
      if v >= floor and (want == nil or v > want) then want = v end
    end
  end
  if not want then
    return nil, ("no compatible version of %s: asked %s%d, servers have %s"):format(cl.name,
      opts.version and "" or ">= ", opts.version or opts.min_version, vlist(all)), "version"
  end
  local list = {}
  for i = 1, #addrs do
    local a = addrs[i]
    if serves(versions_of(svc[a]), want) and not (tried[a] and tried[a][want]) then list[#list + 1] = a end
  end
  table.sort(list)
  return list, want
end

-- LuaJIT 2.1.0-beta3 (Debian's) miscompiled this version matching once
-- hot (a server listing version 1 stopped matching 1 after ~50 calls):
-- it runs interpreted; it looks at a few servers per call.
if jit_ok then
  jit.off(serves)
  jit.off(candidates)
end

-- candidates() for a first try (nothing tried yet), kept per channel
-- while its member list (ch.svc: a new table on every update) and the
-- options asking are the same: a call's hot path makes no table for it and
-- runs no interpreted code (candidates is jit.off).  A server gone
-- meanwhile fails as "not a destination here" (surely not run), and the
-- retry looks again.
local NONE = {}
local function first_candidates(ctx, cl, ch, opts)
  local k = ch.svc_cand
  local svc = ch.svc
  if k and svc and k.svc == svc and k.v == opts.version and k.mv == opts.min_version and k.at == opts.at then
    return k.list, k.want
  end
  local list, want, code = candidates(ctx, cl, ch, opts, NONE)
  if list then
    ch.svc_cand = { svc = svc, v = opts.version, mv = opts.min_version, at = opts.at, list = list, want = want }
  end
  return list, want, code
end

-- The least loaded of the candidates (calls in flight from here), round
-- robin among equals.
local function choose(ctx, cl, list)
  local inflight = ctx.svc_inflight
  local n = #list
  cl.rr = cl.rr + 1
  local best, bestn
  for k = 0, n - 1 do
    local a = list[(cl.rr + k) % n + 1]
    local f = inflight[a] or 0
    if not bestn or f < bestn then best, bestn = a, f end
  end
  return best
end

-- Did the call surely not run?  Then another server may be tried.
local SURELY_NOT_RAN = { busy = true, noservice = true, refused = true }

local function malformed(cl, addr, why)
  return nil, ("malformed reply from %s: %s (service %s)"):format(addr, why, cl.name), "protocol"
end

-- Why results { n = N, ... } are not a valid reply, or nil: N an integer
-- in 0..MAX_RESULTS, and no result index outside 1..N.
local function results_bad(reply, n)
  if type(n) ~= "number" or n ~= n or n < 0 or n > MAX_RESULTS or n % 1 ~= 0 then
    return ("result count %s (an integer 0..%d is expected)"):format(tostring(n), MAX_RESULTS)
  end
  for k in pairs(reply) do
    if k ~= "n" and (type(k) ~= "number" or k < 1 or k > n or k % 1 ~= 0) then
      return ("a result at %s, outside 1..%d"):format(tostring(k), n)
    end
  end
  return nil
end

-- One try at server addr of channel ch: true, the reply { n =, ... } or nil, err,
-- code, tb, retry (retry: "safe" when it surely did not run, "key" when
-- it may have run).
local function try(ctx, cl, ch, addr, want, args, opts, timeout)
  local c = ctx.c
  local rlim = ctx.reply_limit
  if not rlim then rlim = c:reply_limit(); ctx.reply_limit = rlim end
  local req = { v = want, k = opts.key, t = timeout, r = rlim, a = args }
  local sid, err, code = c:call(ch.chid, addr ~= ctx.addr and addr, req)
  if not sid then
    if code == "notfound" then
      return nil, ("service %s: %s is not a destination here"):format(cl.name, addr), "noservice", nil, "safe"
    end
    -- the value's path in the caller's words (args.x), not the request's (ev.a.x)
    if type(err) == "string" then err = err:gsub(" at ev%.a([%.%[])", " at args%1"):gsub(" at ev%.a$", " at args") end
    return nil, err, code
  end
  local r1, r2, r3 = c:call_result(sid)
  if r1 == nil then return nil, r2, r3, nil, "safe" end -- unreachable: never sent
  local inflight = ctx.svc_inflight
  inflight[addr] = (inflight[addr] or 0) + 1
  local okw, werr = true, nil
  if r1 == false then
    okw, werr = pcall(ctx._wait_sync, ctx, sid, c:now() + timeout)
    if okw then r1, r2, r3 = c:call_result(sid) end
  end
  inflight[addr] = inflight[addr] - 1
  if not okw then
    c:call_result(sid, true) -- frees the record
    error(werr, 0)
  end
  if ctx.closed then return nil, "context closed while waiting for the reply", "closed" end
  if r1 == false then r1, r2, r3 = c:call_result(sid, true) end
  if r1 == nil then
    if r3 == "timeout" then
      r2 = ("service %s at %s: no reply within %.2g s"):format(cl.name, addr, timeout)
    end
    return nil, r2, r3, nil, "key"
  end
  local reply = r2
  if reply == nil then
    -- acknowledged without a value: no server of it there (any more)
    return nil, ("no service %s at %s"):format(cl.name, addr), "noservice", nil, "safe"
  end
  if type(reply) ~= "table" then return malformed(cl, addr, "not a table but a " .. type(reply)) end
  local n = reply.n
  if reply.e ~= nil or reply.c ~= nil then
    local ecode = reply.c
    if ecode ~= nil and type(ecode) ~= "string" then return malformed(cl, addr, "an error code that is no string") end
    ecode = ecode or "failed"
    local tb = reply.tb
    if tb ~= nil and type(tb) ~= "string" then tb = nil end
    return nil, reply.e, ecode, tb, SURELY_NOT_RAN[ecode] and "safe" or nil
  end
  if n ~= nil then
    local why = results_bad(reply, n)
    if why then return malformed(cl, addr, why) end
    return true, reply
  end
  if type(reply[1]) == "table" and reply[1].err ~= nil then
    -- the server's context refused the event (keyed mode: no valid ticket)
    return nil, ("service %s at %s: %s"):format(cl.name, addr, tostring(reply[1].err)), "refused", nil, "safe"
  end
  return malformed(cl, addr, "neither results nor an error")
end

-- ctx:call's work: true, results... or nil, err, code[, traceback].
local call_body

-- Releases the in-flight slot on every path: call_body raising (a bug, or
-- a value that could not be decoded) becomes an error result.
local function call_done(self, ok, ...)
  self.svc_ncalls = self.svc_ncalls - 1
  if ok then return ... end
  local e = ...
  self.log("ctx:call failed: " .. tostring(e))
  return nil, "call failed: " .. tostring(e), "failed"
end

function Context:_call(name, args, opts)
  if self.closed then return nil, "context is closed", "closed" end
  self.svc_inflight = self.svc_inflight or {}
  local n = self.svc_ncalls or 0
  if n >= self.max_calls then
    return nil, ("busy: %d calls in flight"):format(n), "busy"
  end
  self.svc_ncalls = n + 1
  return call_done(self, pcall(call_body, self, name, args, opts))
end

call_body = function(self, name, args, opts)
  local cl, err, code = caller_of(self, name)
  if not cl then return nil, err, code end
  -- timeout is the whole call's: the tries share what is left of it
  local timeout = opts.timeout or self.sync_timeout
  local deadline = self.c:now() + timeout
  local retries = opts.retries or options.CALL.retries
  local tried = nil -- (made at the first failure: the hot path makes none)
  local last = nil
  local attempts = 0
  local again = nil -- keyed: a server that timed out, which may be tried once more
  -- (all joined: the hot path, no closure)
  if cl.nprods < #cl.chans then join_all(self, cl, deadline) end
  for i = 1, #cl.chans do
    if self.c:now() >= deadline then break end
    local p = cl.prods[i]
    if p then
      local ch = cl.chans[i]
      while attempts <= retries do
        local left = deadline - self.c:now()
        if left <= 0 then break end
        local list, want
        if tried then
          list, want, code = candidates(self, cl, ch, opts, tried)
        else
          list, want, code = first_candidates(self, cl, ch, opts)
        end
        if not list and again and code == "noservice" then
          -- keyed, no other server left: the one that timed out, once more
          tried[again] = nil
          again = false
          list, want, code = candidates(self, cl, ch, opts, tried)
        end
        if not list then
          -- nothing (left) here: the next name server; a version refusal
          -- or an earlier failure is the answer if none has better
          if not last or code == "version" then last = { n = 3, nil, want, code } end
          break
        end
        local addr = choose(self, cl, list)
        attempts = attempts + 1
        -- (fixed results, no table or closure per call: the hot path)
        -- keyed: each try may be retried after a timeout, so the tries
        -- left share the time left; else one try has it all
        local share = left
        if opts.key then share = left / (retries - attempts + 2) end
        local ok, e, ecode, tb, retry = try(self, cl, ch, addr, want, args, opts, share)
        if ok then return true, unpack(e, 1, e.n) end
        if not (retry == "safe" or (retry == "key" and opts.key)) then return nil, e, ecode, tb end
        last = { n = 4, nil, e, ecode, tb }
        tried = tried or {}
        if ecode == "noservice" and tried[addr] ~= true then
          -- that version is gone there (unloaded): its others may serve
          tried[addr] = tried[addr] or {}
          tried[addr][want] = true
        else
          tried[addr] = true
        end
        if retry == "key" and again == nil then again = addr end
      end
      if attempts > retries then break end
    elseif not last and cl.join_err[i] then
      local je = cl.join_err[i]
      last = { n = 3, nil, tostring(je[1]) .. (" (name server %s: joined again in the background)")
                                               :format(nslist(self)[i]), je[2] }
    end
  end
  if not last then
    if self.c:now() >= deadline then
      return nil, ("service %s: no server found within %g s"):format(name, timeout), "timeout"
    end
    return nil, "no service " .. name, "noservice"
  end
  return nil, last[2], last[3], last[4]
end

--- Waits sec seconds (a finite number >= 0) while the loop serves
-- everything else: inside a callback or a service handler only that one
-- waits; on the main line the loop runs meanwhile.
function Context:sleep(sec)
  options.check_time(sec, "ctx:sleep", "sec", 2)
  local deadline = self.c:now() + sec
  self:_wait(function() return self.c:now() >= deadline end, deadline)
end

local function check_call(self, name, opts, where)
  check_name(name, where)
  if self.closed then error("lecho: context is closed", 3) end
  opts = options.check(opts, options.CALL, where, 3)
  if opts.version and opts.min_version then
    error(("lecho: %s: version and min_version exclude each other"):format(where), 3)
  end
  return opts
end

-- _call's results as ctx:call returns them: without the leading true.
local function strip(ok, ...)
  if ok then return ... end
  return nil, ...
end

--- Calls service `name` with args: the handler's results, or nil, err,
-- code (and the handler's traceback when it raised).  opts: timeout
-- (sync_timeout; the whole call's, tries included), version or min_version, key (idempotency key: retried
-- after a timeout or a lost connection too), at ("host:port": that server
-- only), retries (2).
function Context:call(name, args, opts)
  opts = check_call(self, name, opts, "ctx:call")
  return strip(self:_call(name, args, opts))
end

-- call_async's coroutine (no closure per call).
local function call_async_run(self, name, args, opts, cb)
  local ok, err = xpcall(cb, traceback, self:_call(name, args, opts))
  if not ok then self.log("error in call_async callback: " .. tostring(err)) end
end

--- The same call without waiting: cb(true, results...) or cb(nil, err,
-- code, traceback) runs later, in a coroutine of the context's.
function Context:call_async(name, args, opts, cb)
  if type(cb) ~= "function" then error("lecho: ctx:call_async needs a callback function", 2) end
  opts = check_call(self, name, opts, "ctx:call_async")
  self:_spawn(call_async_run, self, name, args, opts, cb)
end

return Service
