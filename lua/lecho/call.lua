-- lecho.call: calling services (doc/services.md): ctx:call and
-- ctx:call_async, the caller's half of lecho.service.
--
-- A call to service NAME is one sync event on the channel "svc:NAME" of a
-- name server (ctx.c:call), sent to ONE of the servers its member list
-- names; the ACK of that event carries the reply as its value
-- (doc/wire-format.md "Calls"; the values on the wire are in
-- lecho.service's header).  The caller is a producer of that channel at
-- every name server of the context, joined in the background; it picks
-- the version (exact, minimum or the highest) and the least loaded server
-- of it, and retries on another when the call surely did not run (busy,
-- noservice, unreachable, refused), and with a `key` also after a timeout
-- or a lost connection.  Leans on lecho.service for the names' rule and
-- the results' bound, on Context:_wait/_wait_sync (lecho.context) to wait.

local options = require "lecho.options"
local Context = require "lecho.context"
local svcname = require "lecho.svcname"
-- Loops over keys as `in each(t)`, never `in pairs(t)`: no ITERN loop, which
-- Debian's LuaJIT may never end in the close at the program's end (context.lua).
local each = pairs

local jit_ok, jit = pcall(require, "jit")
local traceback = require("lecho.errors").traceback  -- (without lecho's own frames)
local peer_code = require("lecho.errors").peer_code
local unpack, type, pairs = unpack, type, pairs
local check_name, nslist, MAX_RESULTS = svcname.check_name, svcname.nslist, svcname.MAX_RESULTS

local M = {}

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
    ch.calls = true   -- a call unanswered is no event unhandled (Context:_on_event)
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
M.NS_RETRY = NS_RETRY
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
  for v in each(vs) do l[#l + 1] = v end
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
  for addr, info in each(svc or {}) do
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
    for v in each(all) do
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
  for k in each(reply) do
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
    ecode = peer_code(ecode)    -- a server's code only if it is one of lecho.errors, else "failed"
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
  -- Ctrl-C on the main line (LuaJIT's "interrupted!", raised again by the
  -- wait: context.lua main_wait) or the REPL's "interrupted": the
  -- program's, not the call's failure (it was returned as one: the script
  -- went on)
  if type(e) == "string" and (e == "interrupted" or e:find("interrupted!$")) then error(e, 0) end
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
  self:_catch_up() -- (before check_call, which may start joins)
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
  self:_catch_up() -- (before check_call, which may start joins)
  opts = check_call(self, name, opts, "ctx:call_async")
  self:_spawn(call_async_run, self, name, args, opts, cb)
end

return M
