-- lua/lecho/cli/stats.lua: `lecho stats` (one process's counters) and
-- `lecho top` (every process of a name server, refreshed), each an entry
-- { opts, pos, usage, run } that lecho.cli dispatches to; the table of
-- counters (M.print_stats) and a histogram's quantile (M.quantile).  Leans
-- on lecho.cli.common and lecho.stats (remote counters).

local C = require "lecho.cli.common"

local EXIT, COMMON = C.EXIT, C.COMMON
local die, emit, sorted, fmt_num = C.die, C.emit, C.sorted, C.fmt_num
local context, on_signals, signal_exit, finish, code_exit = C.context, C.on_signals, C.signal_exit, C.finish, C.code_exit

local M = {}

M.stats = {
  opts = { { "--json", "json", "flag" } },
  pos = { { "PROCESS" }, 0 },
  usage = [[
usage: lecho stats [PROCESS] [--json]

Prints the counters of the process at PROCESS (HOST:PORT; default the name
server): per peer and per channel events, bytes, drops, queues, and the sync
latencies.  Keyed mode: the process's name server's policy must allow the
action stats (doc/security.md).
  --json             the whole snapshot as one JSON object
]] .. COMMON,
}

M.top = {
  opts = { { "--interval", "interval", "seconds" }, { "--once", "once", "flag" },
           { "--count", "count", "count" }, { "--json", "json", "flag" } },
  pos = { {}, 0 },
  usage = [[
usage: lecho top [--interval SECONDS] [--once] [--count N] [--json]

Shows the counters of every process the name server knows (itself, its
managers, every producer and consumer), refreshed every --interval (1 s)
until Ctrl-C.  On a terminal the screen is redrawn; in a pipe each refresh
is printed after the last.
  --once             one refresh (rates over one interval), then exit
  --count N          N refreshes, then exit
  --json             one JSON object per process per refresh
]] .. COMMON,
}

------------------------------------------------------------------------------
-- stats

-- A histogram's quantile q (0..1) from its buckets (upper bound of the
-- bucket the q-th observation falls in; "+Inf" past the last).
local function quantile(h, bounds, q)
  if not h or (h.count or 0) == 0 then return nil end
  local want, acc = q * h.count, 0
  for i, c in ipairs(h.buckets) do
    acc = acc + c
    if acc >= want then return bounds[i] end
  end
  return math.huge
end
M.quantile = quantile

local function print_stats(s)
  local out = {}
  local function w(...) out[#out + 1] = table.concat({ ... }) end
  w(("%s  role %s%s  pid %s"):format(s.addr, s.role, s.principal and ("  principal " .. s.principal) or "",
                                     tostring(s.pid)))
  w(("connections %d  read buffers %s B  local queue %d events  encodes %s  bad frames %d  stale acks %d"):format(
    s.connections or 0, fmt_num(s.read_buffer_bytes), s.local_queue_events or 0, fmt_num(s.encodes),
    s.bad_frames or 0, s.stale_acks or 0))
  w("")
  -- the first column as wide as its longest entry (a modulator's stream,
  -- NAME@KEY, or an IPv6 address), so that the columns stay aligned
  local function width(t, least)
    for k in pairs(t or {}) do least = math.max(least, #tostring(k)) end
    return least
  end
  local pw, cw = width(s.peers, 28), width(s.channels, 36)
  local prow = "%-" .. pw .. "s %9s %9s %9s %9s %7s %9s %s"
  local crow = "%-" .. cw .. "s %9s %9s %9s %7s %5s %5s %s"
  w((prow):format("PEER", "EV_IN", "EV_OUT", "B_IN", "B_OUT", "DROPS", "QUEUE", "STATE"))
  for _, a in ipairs(sorted(s.peers)) do
    local p = s.peers[a]
    w((prow):format(a, fmt_num(p.events_in), fmt_num(p.events_out),
      fmt_num(p.bytes_in), fmt_num(p.bytes_out), fmt_num(p.drops), fmt_num(p.queue_events),
      p.connected and "up" or ("down" .. (p.last_error and (": " .. tostring(p.last_error)) or ""))))
  end
  w("")
  w((crow):format("CHANNEL", "EV_IN", "EV_OUT", "LOCAL", "DROPS", "PROD", "CONS",
                                                 "SYNC p50/p99"))
  local bounds = s.bounds or require("lecho.stats").BUCKETS
  for _, n in ipairs(sorted(s.channels)) do
    local c = s.channels[n]
    local h = s.sync_latency and s.sync_latency[n]
    local lat = ""
    if h and h.count > 0 then
      lat = ("<=%gms/<=%gms (%d)"):format(quantile(h, bounds, 0.5) * 1e3, quantile(h, bounds, 0.99) * 1e3, h.count)
    end
    w((crow):format(n, fmt_num(c.events_in), fmt_num(c.events_out),
      fmt_num(c.events_local), fmt_num(c.drops), tostring(c.producers or 0), tostring(c.consumers or 0), lat))
  end
  if s.truncated then w(("(%d entries left out)"):format(s.truncated)) end
  io.write(table.concat(out, "\n"), "\n")
end

M.print_stats = print_stats

function M.stats.run(opts, pos)
  local ctx = context("stats", opts)
  local target = ctx.ns
  if pos[1] then
    local a, why = require("lecho.addr").parse(pos[1])
    if not a then die("stats", ("PROCESS needs HOST:PORT, [V6]:PORT or unix:/PATH (%s), not '%s'"):format(why, pos[1])) end
    target = a
  end
  local s, err, code = require("lecho.stats").fetch(ctx, target, opts.timeout)
  if not s then
    io.stderr:write("lecho stats: ", tostring(err), "\n")
    finish(ctx, code_exit(code))
  end
  if opts.json then emit(s) else print_stats(s) end
  finish(ctx, EXIT.ok)
end

------------------------------------------------------------------------------
-- top

-- Every process the name server knows: itself, its managers, the
-- producers and consumers of its channels (and of its managers').
local function processes(ctx)
  local chans, managers, _ = ctx:list()
  if not chans then return nil, managers, _ end
  local set = { [ctx.ns] = true }
  for _, m in ipairs(managers or {}) do
    set[m] = true
    local more = ctx:list(m)
    for n, e in pairs(more or {}) do chans[n] = e end
  end
  for _, e in pairs(chans) do
    if e.manager then set[e.manager] = true end
    for a in pairs(e.producers or {}) do set[a] = true end
    for a in pairs(e.consumers or {}) do set[a] = true end
  end
  set[ctx.addr] = nil -- not this tool itself
  return sorted(set)
end

-- Fetches the stats of every address at once (a coroutine each), waits for
-- all: { [addr] = stats or { error = why } }.
local function fetch_all(ctx, addrs, timeout)
  local st = require "lecho.stats"
  local got, left = {}, #addrs
  for _, a in ipairs(addrs) do
    ctx:_spawn(function()
      local s, err = st.fetch(ctx, a, timeout)
      got[a] = s or { error = tostring(err) }
      left = left - 1
    end)
  end
  ctx:_wait(function() return left == 0 end, ctx:now() + timeout + 1)
  return got
end

local function totals(s)
  local t = { ev_in = 0, ev_out = 0, b_in = 0, b_out = 0, drops = 0, queue = 0, chans = 0 }
  for _, p in pairs(s.peers or {}) do
    t.ev_in, t.ev_out = t.ev_in + (p.events_in or 0), t.ev_out + (p.events_out or 0)
    t.b_in, t.b_out = t.b_in + (p.bytes_in or 0), t.b_out + (p.bytes_out or 0)
    t.drops, t.queue = t.drops + (p.drops or 0), t.queue + (p.queue_events or 0)
  end
  for _, c in pairs(s.channels or {}) do
    t.chans = t.chans + 1
    t.ev_local = (t.ev_local or 0) + (c.events_local or 0)
  end
  t.ev_local = t.ev_local or 0
  return t
end

function M.top.run(opts)
  local interval = opts.interval or 1
  local ctx = context("top", opts)
  local tty = require("lecho.repl.term").interactive and not opts.once and not opts.json
  local code
  on_signals(ctx, function(s) code = signal_exit(s); ctx:stop() end)
  local timeout = math.min(opts.timeout or 2, interval * 2)
  local prev, prev_t = {}, nil
  local rounds = 0
  local want = opts.once and 2 or (opts.count and opts.count + 1) or math.huge
  while code == nil do
    local addrs, err, ecode = processes(ctx)
    if not addrs then
      io.stderr:write("lecho top: ", tostring(err), "\n")
      finish(ctx, code_exit(ecode))
    end
    local got = fetch_all(ctx, addrs, timeout)
    local t = ctx:now()
    rounds = rounds + 1
    if rounds > 1 or want == 1 then
      local dt = prev_t and t - prev_t or nil
      local rows = {}
      for _, a in ipairs(addrs) do
        local s = got[a]
        local row = { process = a }
        if s.error then
          row.error = s.error
        else
          local tt = totals(s)
          local p = prev[a]
          row.role, row.principal, row.pid = s.role, s.principal, s.pid
          row.connections, row.channels = s.connections, tt.chans
          row.events_in, row.events_out, row.events_local = tt.ev_in, tt.ev_out, tt.ev_local
          row.bytes_in, row.bytes_out, row.drops, row.queue_events = tt.b_in, tt.b_out, tt.drops, tt.queue
          if p and dt and dt > 0 then
            row.in_per_s = math.max(0, (tt.ev_in - p.ev_in) / dt)
            row.out_per_s = math.max(0, (tt.ev_out - p.ev_out) / dt)
            row.local_per_s = math.max(0, (tt.ev_local - p.ev_local) / dt)
          end
        end
        rows[#rows + 1] = row
      end
      if opts.json then
        for _, row in ipairs(rows) do emit(row) end
      else
        local out = {}
        if tty then out[1] = "\27[H\27[2J" end
        out[#out + 1] = ("lecho top: %s, %d process%s, every %gs (Ctrl-C ends)\n"):format(ctx.ns, #rows,
          #rows == 1 and "" or "es", interval)
        out[#out + 1] = ("%-24s %-10s %5s %5s %9s %9s %9s %8s %8s %8s %6s %6s\n"):format("PROCESS", "ROLE", "CONNS",
          "CHANS", "EV_IN", "EV_OUT", "LOCAL", "IN/s", "OUT/s", "LOCAL/s", "DROPS", "QUEUE")
        for _, r in ipairs(rows) do
          if r.error then
            out[#out + 1] = ("%-24s %s\n"):format(r.process, r.error)
          else
            out[#out + 1] = ("%-24s %-10s %5d %5d %9s %9s %9s %8s %8s %8s %6s %6s\n"):format(r.process,
              r.principal or r.role, r.connections or 0, r.channels, fmt_num(r.events_in), fmt_num(r.events_out),
              fmt_num(r.events_local), fmt_num(r.in_per_s or 0), fmt_num(r.out_per_s or 0),
              fmt_num(r.local_per_s or 0), fmt_num(r.drops), fmt_num(r.queue_events))
          end
        end
        io.write(table.concat(out))
        if not tty then io.write("\n") end
        io.stdout:flush()
      end
    end
    prev, prev_t = {}, t
    for a, s in pairs(got) do if not s.error then prev[a] = totals(s) end end
    if rounds >= want then break end
    local wake = t + interval
    while code == nil and ctx:now() < wake do ctx:run_once(wake - ctx:now()) end
  end
  finish(ctx, code or EXIT.ok)
end

return M
