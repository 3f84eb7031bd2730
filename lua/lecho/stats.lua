-- lecho.stats: what a context counts beyond the core's counters, and how
-- another process reads them (doc/operations.md "Metrics"):
--
--   * sync latencies: each p:submit_sync is timed into a histogram per
--     channel (`M.observe`, from lecho.producer), with fixed buckets;
--   * the control-plane request { op = "stats" }: any context answers it
--     with `M.snapshot` (ctx:stats(), the histograms, who it is), which is
--     what `lecho stats` and `lecho top` print.  In keyed mode the asker
--     must be allowed the action `stats` on this process by the name
--     server's policy (doc/security.md): checked here, where the counters
--     are read; a name server or manager checks its own policy, any other
--     context asks its name server (`{ op = "may" }`, answered by
--     lecho.ns.may) and keeps the answer for MAY_TTL seconds.

local M = {}

-- Upper bounds of the sync-latency buckets, in seconds (the last, +Inf, is
-- the count).
M.BUCKETS = { 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10 }
local BUCKETS, NB = M.BUCKETS, #M.BUCKETS

-- What a snapshot carries at most: channels (the first by name) and peers;
-- the rest is counted in `truncated`, so a reply always fits a CTRL frame.
M.MAX_ENTRIES = 4096

-- Snapshots a context makes for others per second at most (each costs
-- O(channels + peers)); past it the request is answered "busy".
M.MAX_PER_SECOND = 20

-- How long a context keeps its name server's answer to "may P read my
-- stats" (seconds): `lecho top` asks every second.
local MAY_TTL = 5

--- Times one submit_sync of channel `name` (full name): dt seconds, ok
-- whether it returned true.  Memory: one histogram per channel this
-- context produced on with submit_sync (bounded by its channels).
function M.observe(ctx, name, dt, ok)
  local hs = ctx.sync_hist
  if not hs then hs = {}; ctx.sync_hist = hs end
  local h = hs[name]
  if not h then
    h = { buckets = {}, sum = 0, count = 0, failed = 0 }
    for i = 1, NB do h.buckets[i] = 0 end
    hs[name] = h
  end
  for i = 1, NB do
    if dt <= BUCKETS[i] then h.buckets[i] = h.buckets[i] + 1 break end
  end
  h.sum, h.count = h.sum + dt, h.count + 1
  if not ok then h.failed = h.failed + 1 end
end

local started = {}   -- ctx -> when M.snapshot first saw it (weak)
setmetatable(started, { __mode = "k" })

local ffi = require "ffi"
-- Loops over keys as `in each(t)`, never `in pairs(t)`: no ITERN loop, which
-- Debian's LuaJIT may never end in the close at the program's end (context.lua).
local each = pairs
pcall(ffi.cdef, "int getpid(void);")

--- Everything a remote asker gets: ctx:stats() plus `role` (nameserver,
-- manager, context), `principal` (keyed), `pid`, `time` (Unix seconds),
-- `sync_latency[channel]` = { buckets = { counts per bucket of M.BUCKETS,
-- not cumulative }, bounds = M.BUCKETS, sum, count, failed }, and
-- `truncated` (entries left out past MAX_ENTRIES) when something was.
function M.snapshot(ctx)
  local s = ctx:stats()
  s.role = ctx.reg and ctx.reg.role or "context"
  s.principal = ctx.principal
  s.pid = ffi.C.getpid()
  s.time = os.time()
  s.sync_latency = ctx.sync_hist or {}
  s.bounds = BUCKETS
  -- bounded: a context with many channels or peers still answers
  local cut = 0
  for _, k in ipairs{ "channels", "peers", "sync_latency" } do
    local t = s[k]
    if t then
      local names = {}
      for n in each(t) do names[#names + 1] = n end
      if #names > M.MAX_ENTRIES then
        table.sort(names)
        local kept = {}
        for i = 1, M.MAX_ENTRIES do kept[names[i]] = t[names[i]] end
        cut = cut + #names - M.MAX_ENTRIES
        s[k] = kept
      end
    end
  end
  if cut > 0 then s.truncated = cut end
  return s
end

-- Keyed mode: may the peer at `from` read this context's stats?  true, or
-- nil, why.  May wait (a request to the name server): run in a coroutine.
local function may(ctx, from)
  if not ctx.keyed or from == ctx.addr then return true end
  local who = ctx.c:peer_identity(from)
  if not who then return nil, ("not allowed: %s has no authenticated identity"):format(from) end
  if who == ctx.principal then return true end
  local reg = ctx.reg
  if reg and reg.role == "nameserver" then
    if not reg.policy then return true end -- keyed without a policy: every trusted principal
    return reg.policy:check(who, "stats", ctx.principal)
  end
  -- a manager or any other context: its name server's policy decides
  local cache = ctx.may_cache
  if not cache then cache = {}; ctx.may_cache = cache end
  local e = cache[who]
  local t = ctx:now()
  if e and t - e.at < MAY_TTL then return e.ok, e.err end
  local r, err = ctx:request(ctx.ns, { op = "may", action = "stats", principal = who, target = ctx.principal })
  if not r then return nil, "not allowed: the name server could not be asked: " .. tostring(err) end
  local ok, why = r.allowed == true or nil, r.err
  if not ok then why = type(why) == "string" and why or ("not allowed: %s may not stats %s"):format(who, ctx.principal) end
  cache[who] = { at = t, ok = ok, err = why }
  return ok, why
end

--- The `stats` request, from lecho.control: answered with M.snapshot, or
-- refused (keyed mode, see the top) with code "refused".
function M.serve(ctx, from, msg)
  if type(msg.rid) ~= "number" then return end
  local t = math.floor(ctx:now())
  local rate = ctx.stats_rate
  if not rate or rate.t ~= t then rate = { t = t, n = 0 }; ctx.stats_rate = rate end
  rate.n = rate.n + 1
  if rate.n > M.MAX_PER_SECOND then
    return ctx:_send_ctrl(from, { op = "reply", rid = msg.rid, ok = false, code = "busy",
                                  err = ("busy: more than %d stats requests this second"):format(M.MAX_PER_SECOND) })
  end
  ctx:_spawn(function()
    local ok, why = may(ctx, from)
    if ctx.closed then return end
    if not ok then
      ctx:_warn_limited("stats_refused", ("stats of this process refused to %s: %s"):format(from, why))
      return ctx:_send_ctrl(from, { op = "reply", rid = msg.rid, ok = false, err = why, code = "refused" })
    end
    ctx:_send_ctrl(from, { op = "reply", rid = msg.rid, ok = true, stats = M.snapshot(ctx) })
  end)
end

--- The stats of the process at addr (M.snapshot's table), or nil, err, code.
function M.fetch(ctx, addr, timeout)
  if addr == ctx.addr then return M.snapshot(ctx) end
  local r, err, code = ctx:request(addr, { op = "stats" }, timeout)
  if not r then return nil, err, code end
  if type(r.stats) ~= "table" then return nil, ("%s answered stats without a table"):format(addr), "protocol" end
  return r.stats
end

return M
