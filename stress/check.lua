-- stress/check.lua: checks the logs of one stress scenario (a directory
-- written by stress/run.lua); also `luajit stress/check.lua DIR`.
--
-- Definitions (every time is CLOCK_MONOTONIC, one clock for all processes):
--
-- * A submit s of producer P is the interval [t0, t1] around its call to
--   p:submit / p:submit_sync (P logs both, and whether it returned true).
--   Only submits that returned true count as submitted.
-- * Consumer C joins at J = the time C logged right after
--   ch:consumer() returned ("join".t1).  C leaves at L = the earliest of: the
--   time C logged right before c:close() ("leave".T); the time the driver
--   logged right before it sent C SIGKILL; C's exit if it had neither.  L is
--   +inf for none.  SIGSTOP and SIGCONT do not end presence.
-- * C is present at s when J < s.t0 and L > s.t1.
-- * C stays to the end when it left with reason "end": it saw the stop file,
--   which the driver writes only once every producer exited and a drain of
--   scenario.drain seconds (3) passed with every process resumed.
-- * keep(C, s): C's modulator keeps s under every params version C had
--   (plain, pass-through: all; even: s % 2 == 0; param {m, r}: s % m == r;
--   switch: the modulators it switched between).  Only events kept under
--   every version are demanded; an event handled under a version whose
--   filter drops it is a violation of its own (filter).
--
-- Checks, each violation printed with the seed and what to debug with:
--   order      per (C, P) the seq handled only goes up (reorder otherwise)
--   duplicate  no (P, seq) handled twice by C; no two submits of P returned
--              true with the same seq
--   nested     no submit of P was called while another submit of P was
--              waiting (a wait that runs the caller's own timer re-enters it)
--   corrupt    the value is the one P submitted (ev.s == meta.seq, ev.id == P:seq)
--   filter     nothing handled that the version's modulator drops
--   loss       (block channels) for P not SIGKILLed, C staying to the end: every
--              submit s with J < s.t0 and keep(C, s) was handled by C
--   sync_true  a submit_sync that returned true at [t0, t1]: every C present at
--              it handled it (if keep), and (block channels) every earlier
--              submit s' of P with J < s'.t0 and keep(C, s') too
--   drops      (drop channels: one producer process, one consumer process that
--              joined before the producer started and stays to the end, P not
--              killed) received + dropped == submitted, with dropped = the
--              producer's channel drop counters (the channel and its derived
--              modulator channels) at its end, which must equal the peer's;
--              a submit_sync that returned an error may have been delivered
--              all the same (an event sent but not confirmed): up to that
--              many more may be received
--   stuck      an async submit took more than STEP seconds (5) beyond the time
--              any process of the scenario spent SIGSTOPped during it; a
--              submit_sync returned more than 1 s after its timeout
--   hang       a process was still running at its bound (the driver killed it)
--   memory     a producer's RSS (sampled by the driver every 0.2 s, up to the
--              process's own exit record: not its teardown) exceeded its
--              RSS when ready + (consumer processes + 1) * queue_limit + slack
--              (scenario.rss_slack, 32 MiB: LuaJIT garbage and buffers)
--   exit       every process exits 0, except: SIGKILLed by the driver (the
--              scenario's kills, busy loops), name server / managers ending on
--              the driver's SIGTERM
--   crash      stderr or a log holds an ASan/UBSan report, "stack overflow",
--              "not enough memory", a Lua error or traceback, a handler error
--   modulator  a modulator (trivial ones only here) was stopped: on_error called
--   forged     a consumer handled an event of the attacker (stress/attacker.lua:
--              its ids start with "mallory:")
--   stolen     an event of the scenario reached the attacker, or a request of a
--              process that took a forged reply for true; or (harness) the
--              attacker made no connection or sent no forged reply
local root = os.getenv("LECHO_ROOT") or "."
package.path = root .. "/?.lua;" .. package.path
local lib = require "stress.lib"

local M = {}
local STEP = 5

local MODKEEP = {
  pass = function() return true end,
  even = function(s) return s % 2 == 0 end,
}

local function fmt_list(t, n)
  local out = {}
  for i = 1, math.min(#t, n or 8) do out[i] = tostring(t[i]) end
  return table.concat(out, ",") .. (#t > (n or 8) and (",... (%d)"):format(#t) or "")
end

function M.run(dir)
  local V = {}
  local sc = lib.json.decode((assert(lib.read(dir .. "/scenario.json"), "no scenario.json")))
  local seed = sc.seed
  local function viol(kind, msg, ...)
    V[#V + 1] = { kind = kind, msg = msg:format(...) }
  end
  local drv = lib.read_jsonl(dir .. "/driver.jsonl")
  local byid = {}
  for _, p in ipairs(sc.procs) do byid[p.id] = p end

  -- driver records: kills, stops, exits, windows of trouble
  local killed, exits, stops, hung = {}, {}, {}, {}
  local windows = {}  -- { from, to, what }
  local open = {}
  local t_end = math.huge
  local sent = {}     -- id -> signals the driver sent
  for _, r in ipairs(drv) do
    local id = r.id
    if id then sent[id] = sent[id] or {} end
    if r.k == "kill" or r.k == "kill_hung" then
      killed[id] = killed[id] or r.T
      sent[id].KILL = true
    elseif r.k == "end_busy" or r.k == "kill_end" then sent[id].KILL = true
    elseif r.k == "term_end" then sent[id].TERM = true
    elseif r.k == "stop" then
      open["stop " .. id] = r.T
    elseif r.k == "cont" or r.k == "cont_end" then
      local t = open["stop " .. id]
      if t then
        stops[#stops + 1] = { from = t, to = r.T, id = id }
        windows[#windows + 1] = { from = t, to = r.T, what = "stop " .. id }
        open["stop " .. id] = nil
      end
    elseif r.k == "exit" then
      exits[id] = exits[id] or {}
      table.insert(exits[id], r)
    elseif r.k == "hang" then hung[id] = r
    elseif r.k == "stopfile" then t_end = r.T
    elseif r.k == "harness" then viol("harness", "%s", r.m)
    end
    if r.k == "kill" and (id or ""):match("^ns") then open.ns = r.T end
    if r.k == "spawn" and (id or ""):match("^ns%d") and open.ns then
      windows[#windows + 1] = { from = open.ns, to = r.T + 1, what = "name server down" }
      open.ns = nil
    end
    if r.k == "kill" and (id or ""):match("^m%d+$") then open["mgr"] = r.T end
    if r.k == "spawn" and (id or ""):match("^m%d+%.%d+") and open.mgr then
      windows[#windows + 1] = { from = open.mgr, to = r.T + 1, what = "manager down" }
      open.mgr = nil
    end
    if r.k == "spawn" and (id or ""):match("^busy") and not open.busy then open.busy = r.T end
    if r.k == "end_busy" and open.busy then
      windows[#windows + 1] = { from = open.busy, to = r.T, what = "cores busy" }
      open.busy = false
    end
  end
  for k, t in pairs(open) do
    if t then windows[#windows + 1] = { from = t, to = math.huge, what = k } end
  end
  local function during(t)
    local w = {}
    for _, x in ipairs(windows) do
      if t >= x.from and t <= x.to then w[#w + 1] = x.what end
    end
    return #w > 0 and table.concat(w, ", ") or "quiet"
  end
  local function stopped_during(a, b)
    local total = 0
    for _, s in ipairs(stops) do
      local lo, hi = math.max(a, s.from), math.min(b, s.to)
      if hi > lo then total = total + (hi - lo) end
    end
    return total
  end

  -- per-process logs
  local P, C = {}, {}       -- producers (incl. publishers), consumers, by id
  local byaddr = {}
  local nsub, nsync, nsyncfail, nev = 0, 0, 0, 0
  local notes = {}
  for _, sp in ipairs(sc.procs) do
    local recs, bad, found = lib.read_jsonl(dir .. "/" .. sp.id .. ".jsonl")
    if bad > 0 then viol("crash", "%s: %d unreadable log line(s)", sp.id, bad) end
    local x = { id = sp.id, spec = sp, recs = recs, found = found }
    for _, r in ipairs(recs) do
      if r.k == "ctx" then x.addr = r.addr; byaddr[r.addr] = x
      elseif r.k == "error" then viol("crash", "%s: Lua error: %s", sp.id, r.m)
      elseif r.k == "moderr" then viol("modulator", "%s: on_error: %s", sp.id, r.m)
      elseif r.k == "bound" then viol("hang", "%s gave up at its own bound", sp.id)
      elseif r.k == "log" then
        local m = r.m
        if m:match("stack overflow") or m:match("not enough memory") or m:match("error handling")
           or m:match("traceback") or m:match("failed: ") or m:match("%.lua:%d+:") then
          x.badlog = (x.badlog or 0) + 1
          x.badlog_first = x.badlog_first or m
        end
        if m:match("did not confirm in time") then x.late = (x.late or 0) + 1 end
        if m:match("duplicate connection") then notes.dupconn = (notes.dupconn or 0) + 1 end
      end
    end
    if x.badlog then
      viol("crash", "%s: %d error line(s) in its lecho log, first: %s", sp.id, x.badlog, x.badlog_first)
    end
    if sp.role == "consumer" then C[sp.id] = x else P[sp.id] = x end
  end

  -- producers
  for id, x in pairs(P) do
    x.sub = {}         -- seq -> record (ok submits)
    x.syncs = {}
    x.maxq = 0
    for _, r in ipairs(x.recs) do
      if r.k == "s" or r.k == "y" then
        if r.k == "y" and not r.ok then
          -- A sync submit that failed (its consumer's connection ended, say)
          -- may still have been delivered: its fate is unknown by design.
          x.unsure = (x.unsure or 0) + 1
        end
        if r.ok then
          if x.sub[r.q] then
            x.dupseq = (x.dupseq or 0) + 1
            x.dupseq_first = x.dupseq_first or r.q
          end
          x.sub[r.q] = x.sub[r.q] or r
          if r.q > x.maxq then x.maxq = r.q end
          nsub = nsub + 1
        end
        if r.depth then
          x.nested = (x.nested or 0) + 1
          x.maxdepth = math.max(x.maxdepth or 0, r.depth)
        end
        if r.seqerr and not r.inner then
          viol("corrupt", "%s: submit %d left p.seq at %s", id, r.q, tostring(r.seqerr))
        end
        if r.k == "y" then
          nsync = nsync + 1
          if r.ok then x.syncs[#x.syncs + 1] = r else nsyncfail = nsyncfail + 1 end
          local timeout = x.spec.sync_timeout or 10
          if r.t1 - r.t0 > timeout + 1 then
            viol("stuck", "%s: submit_sync of seq %d returned after %.2f s (timeout %g s)%s",
                 id, r.q, r.t1 - r.t0, timeout, r.err and ": " .. r.err or "")
          end
        else
          local d = r.t1 - r.t0
          if d > STEP then
            local eff = d - stopped_during(r.t0, r.t1)
            if eff > STEP then
              x.stuck = (x.stuck or 0) + 1
              x.stuck_first = x.stuck_first or ("seq %d: %.2f s (%.2f s beyond SIGSTOPs), during %s"):format(
                r.q, d, eff, during(r.t0))
            end
          end
        end
      elseif r.k == "ready" then x.rss0 = r.rss
      elseif r.k == "exit" then x.exit_T = r.T
      elseif r.k == "stats" then x.stats = r
      end
    end
    if x.nested then
      viol("nested", "%s (%s mode): %d submit(s) made inside another submit's wait (the loop re-entered the caller's timer), depth up to %d",
           id, x.spec.mode or "?", x.nested, x.maxdepth)
    end
    if x.dupseq then
      viol("duplicate", "%s: %d submit(s) returned true with a seq already used (first %d): two events, one seq",
           id, x.dupseq, x.dupseq_first)
    end
    if x.stuck then viol("stuck", "%s: %d submit(s) blocked beyond %g s, first %s", id, x.stuck, STEP, x.stuck_first) end
  end

  -- consumers
  for id, x in pairs(C) do
    local join, leave
    x.vers = { [1] = { params = nil } }
    for _, r in ipairs(x.recs) do
      if r.k == "join" then
        join = r
        x.vers[1] = { params = r.params, mod = r.mod }
      elseif r.k == "leave" then leave = r
      elseif r.k == "ver" and r.ok then
        -- A change that failed left the version (and its params) as they were.
        x.vers[r.v] = { params = r.params, mod = r.mod }
      end
    end
    x.J = join and join.t1
    local L = math.huge
    if leave then L = leave.T end
    if killed[id] and killed[id] < L then L = killed[id] end
    if not leave and not killed[id] then
      for _, e in ipairs(exits[id] or {}) do if e.T < L then L = e.T end end
    end
    x.L = L
    x.to_end = leave and leave.reason == "end" and not (killed[id] and killed[id] < leave.T)
    local kind = x.spec.kind
    local maxv = 1
    for v in pairs(x.vers) do if v > maxv then maxv = v end end
    local function keep_v(s, v)
      local ver = x.vers[v]
      if kind == "even" then return s % 2 == 0 end
      if kind == "param" then
        local p = ver and ver.params
        if not p then return nil end
        return s % p.m == p.r
      end
      if kind == "switch" then
        local f = ver and MODKEEP[ver.mod or "pass"]
        if not f then return nil end
        return f(s)
      end
      return true
    end
    x.keep_v = keep_v
    function x.keep(s)
      for v = 1, maxv do
        if x.vers[v] and keep_v(s, v) == false then return false end
      end
      return true
    end
    -- events
    x.got = {}        -- producer id -> { [seq] = count }
    local last, reorder, dups, corrupt, filt, forged = {}, {}, {}, {}, {}, {}
    for _, r in ipairs(x.recs) do
      if r.k == "e" then
        nev = nev + 1
        local addr = r.p and r.p:match("^(.-)#")
        local px = addr and byaddr[addr]
        local pid = px and px.id or ("?" .. tostring(r.p))
        local g = x.got[pid] or {}
        x.got[pid] = g
        local q = r.q
        g[q] = (g[q] or 0) + 1
        if g[q] == 2 then dups[pid] = dups[pid] or {}; table.insert(dups[pid], q) end
        if last[pid] and q < last[pid] then
          reorder[pid] = reorder[pid] or {}
          table.insert(reorder[pid], ("%d after %d"):format(q, last[pid]))
        end
        last[pid] = q
        if type(r.id) == "string" and r.id:match("^mallory:") then
          forged[#forged + 1] = ("from %s seq %s: id=%s"):format(pid, tostring(q), r.id)
        elseif r.bad or r.s ~= q or (px and r.id ~= px.id .. ":" .. q) then
          corrupt[#corrupt + 1] = ("from %s seq %s: s=%s id=%s"):format(pid, tostring(q), tostring(r.s), tostring(r.id))
        end
        if r.v and keep_v(q, r.v) == false then
          filt[#filt + 1] = ("%s seq %d under version %d"):format(pid, q, r.v)
        end
      end
    end
    for pid, l in pairs(dups) do viol("duplicate", "consumer %s (%s): %d duplicate(s) from %s: seqs %s", id, kind, #l, pid, fmt_list(l)) end
    for pid, l in pairs(reorder) do viol("order", "consumer %s (%s): %d reorder(s) from %s: %s", id, kind, #l, pid, fmt_list(l, 5)) end
    if #forged > 0 then viol("forged", "consumer %s handled %d event(s) of the attacker: %s", id, #forged, fmt_list(forged, 3)) end
    if #corrupt > 0 then viol("corrupt", "consumer %s: %d bad value(s): %s", id, #corrupt, fmt_list(corrupt, 3)) end
    if #filt > 0 then viol("filter", "consumer %s (%s): %d event(s) its modulator drops: %s", id, kind, #filt, fmt_list(filt, 5)) end
    if not join and x.found then
      local gave_up = false
      for _, r in ipairs(x.recs) do if r.k == "gave_up" then gave_up = true end end
      if not gave_up and not killed[id] then viol("hang", "consumer %s never joined", id) end
    end
  end

  -- loss, sync, drop accounting: pairs of (consumer, producer) of one channel
  for pid, px in pairs(P) do
    local sp = px.spec
    local drop = sp.policy ~= "block"
    for cid, cx in pairs(C) do
      if cx.spec.ch == sp.ch and cx.J then
        local g = cx.got[pid] or {}
        -- sync true implies handled
        local sync_bad, prefix_bad, first = 0, 0, nil
        local checked_prefix = 0
        for _, y in ipairs(px.syncs) do
          if cx.J < y.t0 and cx.L > y.t1 then
            if cx.keep(y.q) and not g[y.q] then
              sync_bad = sync_bad + 1
              first = first or ("seq %d at %.2f s (%s)"):format(y.q, y.t0 - sc.t0, during(y.t0))
            end
            if not drop then
              for q = checked_prefix + 1, y.q - 1 do
                local s = px.sub[q]
                if s and s.t0 > cx.J and cx.keep(q) and not g[q] then
                  prefix_bad = prefix_bad + 1
                  first = first or ("seq %d before sync %d"):format(q, y.q)
                end
              end
              checked_prefix = math.max(checked_prefix, y.q)
            end
          end
        end
        if sync_bad + prefix_bad > 0 then
          viol("sync_true", "producer %s -> consumer %s (%s): submit_sync returned true but %d sync event(s) and %d earlier event(s) were not handled; first %s",
               pid, cid, cx.spec.kind, sync_bad, prefix_bad, first)
        end
        -- loss under block
        if not drop and not killed[pid] and cx.to_end then
          local miss = {}
          local wins = {}
          for q = 1, px.maxq do
            local s = px.sub[q]
            if s and s.t0 > cx.J and cx.keep(q) and not g[q] then
              miss[#miss + 1] = q
              local w = during(s.t0)
              wins[w] = (wins[w] or 0) + 1
            end
          end
          if #miss > 0 then
            local wl = {}
            for w, n in pairs(wins) do wl[#wl + 1] = ("%d %s"):format(n, w) end
            table.sort(wl)
            local expected = 0
            for q = 1, px.maxq do
              local s = px.sub[q]
              if s and s.t0 > cx.J and cx.keep(q) then expected = expected + 1 end
            end
            viol("loss", "producer %s (%s) -> consumer %s (%s): %d of %d lost, seqs %s; submitted during: %s%s",
                 pid, sp.role == "ff" and "fire-and-forget" or sp.mode, cid, cx.spec.kind, #miss, expected,
                 fmt_list(miss), table.concat(wl, "; "),
                 cx.late and (" (its join logged %d late producer confirmation(s))"):format(cx.late) or "")
          end
        end
        -- drop accounting
        if drop and sp.drop_pair == cid then
          if killed[pid] or killed[cid] or not cx.to_end then
            notes.drop_skipped = (notes.drop_skipped or 0) + 1
          elseif not px.stats then
            viol("drops", "producer %s (%s): no final stats (it did not finish)", pid, sp.policy)
          else
            local submitted = 0
            for _ in pairs(px.sub) do submitted = submitted + 1 end
            local received = 0
            for _ in pairs(g) do received = received + 1 end
            local dch = 0
            for name, c in pairs(px.stats.channels) do
              local short = name:match("/([^/]+)$") or name
              if short == sp.ch or short:sub(1, #sp.ch + 1) == sp.ch .. "@" then dch = dch + (c.drops or 0) end
            end
            local dpeer = cx.addr and px.stats.peers[cx.addr] and px.stats.peers[cx.addr].drops
            local early = px.recs[1] and cx.J
            local first_sub
            for q = 1, px.maxq do if px.sub[q] then first_sub = px.sub[q]; break end end
            if first_sub and first_sub.t0 < cx.J then
              viol("harness", "drop pair %s/%s: consumer joined after the first submit", pid, cid)
            end
            local diff = received + dch - submitted
            if diff < 0 or diff > (px.unsure or 0) or dpeer ~= dch then
              viol("drops", "producer %s (%s, queue_limit %d) -> consumer %s (%s): submitted %d, received %d, dropped %d (channel) / %s (peer): received + dropped - submitted = %d",
                   pid, sp.policy, sp.queue_limit, cid, cx.spec.kind, submitted, received, dch,
                   tostring(dpeer), received + dch - submitted)
            end
            notes.drops = (notes.drops or 0) + dch
            local _ = early
          end
        end
      end
    end
    -- memory
    local ex = exits[pid] and exits[pid][#exits[pid]]
    -- its peak while it ran: the samples up to its own exit record (what
    -- follows is teardown: under make asan LeakSanitizer's scan and
    -- symbolizer, 12-42 MiB more for a second); without that record (killed)
    -- every sample
    local peak = ex and ex.max_rss
    if peak and px.exit_T and ex.rss_peaks then
      peak = px.rss0 or 0
      for _, s in ipairs(ex.rss_peaks) do if s[1] <= px.exit_T and s[2] > peak then peak = s[2] end end
    end
    if peak and px.rss0 then
      local ncons = 0
      for _, c in ipairs(sc.procs) do if c.role == "consumer" and c.ch == sp.ch then ncons = ncons + 1 end end
      local limit = px.rss0 + (ncons + 1) * (sp.queue_limit or 0) + sc.rss_slack
      if peak > limit then
        viol("memory", "producer %s: RSS %.1f MiB over its limit %.1f MiB (ready %.1f MiB, %d consumer(s), queue_limit %d)",
             pid, peak / 2^20, limit / 2^20, px.rss0 / 2^20, ncons, sp.queue_limit)
      end
    end
  end

  -- the attacker (stress/attacker.lua): nothing reached it, and it attacked
  local att, abad, afound = lib.read_jsonl(dir .. "/attacker.jsonl")
  if abad > 0 then viol("crash", "attacker: %d unreadable log line(s)", abad) end
  if afound then
    local stolen, sent, from = 0, nil, {}
    for _, r in ipairs(att) do
      if r.k == "stolen" then
        stolen = stolen + 1
        from[#from + 1] = ("%s on %s"):format(tostring(r.from), tostring(r.ch))
      elseif r.k == "believed" then
        stolen = stolen + 1
        from[#from + 1] = ("%s asked us '%s'%s"):format(tostring(r.from), tostring(r.op), r.ch and " on " .. r.ch or "")
      elseif r.k == "sent" then sent = r end
    end
    if stolen > 0 then
      viol("stolen", "the attacker received %d event(s) or request(s) of a process that believed it: %s",
           stolen, fmt_list(from, 3))
    end
    if not sent or (sent.replies or 0) == 0 or (sent.conns or 0) == 0 then
      viol("harness", "the attacker did not attack (%s)", sent and lib.json.encode(sent) or "no record")
    end
    notes.attack = sent
  elseif sc.attacker then
    viol("harness", "the attacker wrote no log")
  end

  -- hangs and exits
  for id, h in pairs(hung) do
    local x = P[id] or C[id]
    local lastrec = x and x.recs[#x.recs]
    viol("hang", "%s still running at its bound%s; its last record: %s", id,
         h.phase and " (did not stop after the stop file)" or (" of %g s"):format(h.bound or 0),
         lastrec and lib.json.encode(lastrec) or "none")
  end
  for _, r in ipairs(drv) do
    if r.k == "exit" then
      local id = r.id
      local s = sent[id] or {}
      local ok = r.code == 0
        or (r.signal == 9 and s.KILL)
        or (r.signal == 15 and s.TERM)
      if not ok and not hung[id] then
        local x = P[id] or C[id]
        local lastrec = x and x.recs[#x.recs]
        viol("exit", "%s (pid %d) exited with %s; last record: %s", id, r.pid,
             r.code and ("code " .. r.code) or ("signal " .. tostring(r.signal)),
             lastrec and lib.json.encode(lastrec) or "none")
      end
    end
  end
  -- stderr of every process
  local files = io.popen("ls '" .. dir .. "'"):read("*a")
  for f in files:gmatch("[^\n]+") do
    if f:match("%.err$") then
      local s = lib.read(dir .. "/" .. f) or ""
      for _, pat in ipairs{ "AddressSanitizer", "LeakSanitizer", "runtime error:", "stack overflow",
                            "not enough memory", "stack traceback", "Segmentation", "%.lua:%d+:",
                            "corrupted", "double free", "free%(%)", "malloc%(%)" } do
        local a = s:find(pat)
        if a then
          local line = s:sub(a, a + 200):match("[^\n]*")
          local lineStart = s:sub(1, a):match(".*\n()") or 1
          viol("crash", "%s: %s", f:gsub("%.err$", ""), s:sub(lineStart, a + 200):match("[^\n]*") or line)
          break
        end
      end
    end
  end

  local nproc = #sc.procs
  local summary = ("%s: %d processes, %d submits (%d sync, %d sync not true), %d events handled%s%s"):format(
    sc.name, nproc, nsub, nsync, nsyncfail, nev,
    notes.drops and (", %d dropped by policy"):format(notes.drops) or "",
    notes.dupconn and (", %d duplicate-connection log line(s)"):format(notes.dupconn) or "")
    .. (sc.keyed and ", keyed" or ", protected")
    .. (notes.attack and (", attacker: %d connections, %d forged replies, %d member lists, %d events sent"):format(
          notes.attack.conns or 0, notes.attack.replies or 0, notes.attack.members or 0, notes.attack.events or 0) or "")
  table.sort(V, function(a, b) if a.kind ~= b.kind then return a.kind < b.kind end return a.msg < b.msg end)
  return V, summary
end

if arg and arg[0] and arg[0]:match("check%.lua$") and arg[1] then
  local V, summary = M.run(arg[1])
  local sc = lib.json.decode(lib.read(arg[1] .. "/scenario.json"))
  for _, v in ipairs(V) do print(("VIOLATION seed %d %s: %s"):format(sc.seed, v.kind, v.msg)) end
  print(summary .. (", %d violation(s)"):format(#V))
  os.exit(#V > 0 and 1 or 0)
end

return M
