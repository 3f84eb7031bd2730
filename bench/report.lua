-- bench/report.lua: the output of bench/run.lua: the table of rows
-- ("workload | lecho | baseline | ratio | target"), its ratios and targets,
-- and the gnuplot plots of the results (bench/results/*.png).

local common = require "common"

local sh_quote = common.sh_quote

local M = {}

local function fmt_num(x)
  if type(x) ~= "number" then return "-" end
  if x >= 1e6 then return ("%.2fM"):format(x / 1e6) end
  if x >= 1e4 then return ("%.0fk"):format(x / 1e3) end
  if x >= 100 then return ("%.0f"):format(x) end
  if x >= 10 then return ("%.1f"):format(x) end
  return ("%.2f"):format(x)
end

--- Computes each row's ratio to its baseline (unless it brings its own:
-- the median of the per-repetition ratios), whether its target was met
-- (by the median, and in how many repetitions), and its flags: a spread
-- of the repetitions wider than common.TRUST.spread, a truncated run.
function M.finish_rows(rows, quick)
  for _, r in ipairs(rows) do
    r.flags = r.flags or {}
    if not r.ratio and type(r.lecho) == "number" and type(r.base_v) == "number" and r.base_v > 0 then
      r.ratio = r.lecho / r.base_v
    end
    if r.ratio and r.target then
      local op, lim = r.target[1], r.target[2]
      local function meets(x) return (op == "<=" and x <= lim) or (op == ">=" and x >= lim) end
      r.met = meets(r.ratio)
      if r.ratios then
        r.reps_met = 0
        for _, x in ipairs(r.ratios) do if meets(x) then r.reps_met = r.reps_met + 1 end end
      end
    end
    r.wide = common.wide(r.lo, r.hi)
    if r.wide then r.flags[#r.flags + 1] = ("spread %.1fx"):format(r.hi / r.lo) end
    if r.truncated then r.flags[#r.flags + 1] = "truncated" end
    if quick and r.reps then r.quick = true end
  end
end

--- Whether the run as a whole can be trusted: the machine's business over
-- the run (common.busy) and how many ratios spread wide.
-- { ok = bool, flags = { text... }, wide = n, ratios = n }.
function M.trust(busy, rows)
  local t = { flags = {}, wide = 0, ratios = 0 }
  for _, f in ipairs(busy.flags) do t.flags[#t.flags + 1] = f .. (f:match("^load") and " at the start" or " over the run") end
  for _, r in ipairs(rows) do
    if r.lo then
      t.ratios = t.ratios + 1
      if r.wide then t.wide = t.wide + 1 end
    end
  end
  if t.wide > 0 then
    t.flags[#t.flags + 1] = ("%d of %d ratios spread wider than %.1fx"):format(t.wide, t.ratios, common.TRUST.spread)
  end
  t.ok = #t.flags == 0
  return t
end

--- The lines above the table: when, where, how busy, how to read it, and
-- whether to trust it.
function M.header(o)
  local b = o.busy
  local l = {}
  l[#l + 1] = ("lecho bench, %s, %s, %d cores, %.0f s%s"):format(o.date, o.machine or "?", b.cores or 0,
    o.seconds, o.quick and " (QUICK: small counts, 3 repetitions)" or "")
  l[#l + 1] = ("machine: load average (1 min) %.2f at the start, %.2f at the end; steal %s of the CPU time over the run")
    :format(b.load1_before or -1, b.load1_after or -1, b.steal_pct and ("%.1f%%"):format(b.steal_pct) or "?")
  l[#l + 1] = ("ratio: lecho / baseline of the figure shown (us: lower is better; ev/s, MB/s: higher), the median of "
    .. "the per-repetition ratios of %d interleaved repetitions (lecho and baseline alternated, rotated order); "
    .. "spread: their min-max; lecho and baseline: the medians"):format(o.reps)
  l[#l + 1] = o.trust.ok and "TRUST: ok (load below the cores, steal <= 5%, every spread within 1.5x)"
    or ("TRUST: NOT TRUSTED: %s (flagged per row)"):format(table.concat(o.trust.flags, "; "))
  return table.concat(l, "\n")
end

--- Prints the rows as a Markdown table and returns its text.
function M.print_table(rows)
  local out = {}
  out[#out + 1] = "| workload | lecho | baseline | ratio | spread (reps) | target | flags |"
  out[#out + 1] = "|---|---:|---:|---:|---|---|---|"
  for _, r in ipairs(rows) do
    local target = ""
    if r.target then
      target = ("%s %.2fx%s: %s"):format(r.target[1], r.target[2],
        r.target_issue and (" (#%d)"):format(r.target_issue) or "",
        r.met == nil and (r.ratio and "?" or "not measured") or (r.met and "met" or "MISSED"))
      if r.reps_met and r.ratios then target = target .. (" (%d/%d reps)"):format(r.reps_met, #r.ratios) end
    end
    local spread = r.lo and ("%.2f-%.2fx (%d%s)"):format(r.lo, r.hi, r.reps or 0, r.quick and ", QUICK" or "")
      or (r.reps and ("(%d%s)"):format(r.reps, r.quick and ", QUICK" or "") or "-")
    out[#out + 1] = ("| %s | %s %s%s | %s %s | %s | %s | %s | %s |"):format(
      r.workload, fmt_num(r.lecho), r.metric, r.extra and (" (" .. r.extra .. ")") or "",
      r.base, fmt_num(r.base_v), r.ratio and ("%.2fx"):format(r.ratio) or "-", spread, target,
      table.concat(r.flags or {}, "; "))
  end
  local s = table.concat(out, "\n")
  print(s)
  return s
end

-- One plot a workload of the results: its name (R[name], name.dat,
-- name.png), the .dat header, a data line per result, the gnuplot commands.
local PLOTS = {
  { "latency", "# payload lecho tcp zmq (us per round trip)", function(r)
      return ('"%s (%dB)" %g %g %g'):format(r.label, r.size, r.lecho.us_per_op or 0,
        r.tcp.us_per_op or 0, r.zmq.us_per_op or 0)
    end, [[set output "latency.png"
set title "Sync round trip by payload (us, lower is better)"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set ylabel "us per round trip"
set xtics rotate by -20
plot "latency.dat" using 2:xtic(1) title "lecho (Lua)", "" using 3 title "raw TCP", "" using 4 title "ZeroMQ REQ/REP"
unset style
set style data linespoints
set xtics norotate
]] },
  { "sinks", "# sinks async_null async_composite sync_null sync_composite (us per event)", function(r)
      return ("%d %g %g %g %g"):format(r.sinks, r.async_null.us_per_op,
        r.async_composite.us_per_op, r.sync_null.us_per_op, r.sync_composite.us_per_op)
    end, [[set output "sinks.png"
set title "Sink scalability: time per event vs consumer processes"
set xlabel "consumer processes"; set ylabel "us per event"; set logscale y
plot "sinks.dat" u 1:2 w lp t "async null", "" u 1:3 w lp t "async composite", "" u 1:4 w lp t "sync null", "" u 1:5 w lp t "sync composite"
unset logscale y
]] },
  { "pipeline", "# length us_per_event", function(r)
      return ("%d %g"):format(r.length, r.async_null.us_per_op)
    end, [[set output "pipeline.png"
set title "Pipeline: time per event at the end of a chain of processes (async, null)"
set xlabel "processes in the chain"; set ylabel "us per event"; set yrange [0:*]
plot "pipeline.dat" u 1:2 w lp t "lecho"
set autoscale y
]] },
  { "channels", "# channels events_per_s", function(r)
      return ("%d %g"):format(r.channels, r.async_null.ops_per_s)
    end, [[set output "channels.png"
set title "Channels used round-robin over one connection (async null events)"
set xlabel "channels"; set ylabel "events/s"; set logscale x 2; set yrange [0:*]
plot "channels.dat" u 1:2 w lp t "lecho"
unset logscale x; set autoscale y
]] },
  { "throughput", "# size lecho tcp zmq (MB/s payload)", function(r)
      return ("%d %g %g %g"):format(r.size, r.lecho.mb_per_s, r.tcp.mb_per_s or 0, r.zmq.mb_per_s or 0)
    end, [[set output "throughput.png"
set title "Async throughput, one producer to one consumer process"
set xlabel "event size (bytes)"; set ylabel "MB/s"; set logscale xy
plot "throughput.dat" u 1:2 w lp t "lecho (Lua)", "" u 1:3 w lp t "raw TCP", "" u 1:4 w lp t "ZeroMQ PUB/SUB"
unset logscale xy
]] },
}

--- Writes dir/*.dat and plots.gp from the results R and runs gnuplot.
function M.plots(R, dir)
  local gp = { "set terminal pngcairo size 800,500\nset grid\nset key top left" }
  for _, plot in ipairs(PLOTS) do
    local name, header, line, commands = plot[1], plot[2], plot[3], plot[4]
    if R[name] then
      local l = { header }
      for _, r in ipairs(R[name]) do l[#l + 1] = line(r) end
      common.write(dir .. "/" .. name .. ".dat", table.concat(l, "\n") .. "\n")
      gp[#gp + 1] = commands
    end
  end
  common.write(dir .. "/plots.gp", table.concat(gp, "\n") .. "\n")
  local rc = os.execute(("cd %s && timeout 30 gnuplot plots.gp 2>gnuplot.err"):format(sh_quote(dir)))
  if rc ~= 0 and rc ~= true then io.stderr:write("bench: gnuplot failed, see " .. dir .. "/gnuplot.err\n") end
end

return M
