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

--- Computes each row's ratio to its baseline and whether its target was met.
function M.finish_rows(rows)
  for _, r in ipairs(rows) do
    if type(r.lecho) == "number" and type(r.base_v) == "number" and r.base_v > 0 then
      -- a row of interleaved repetitions brings its own: the median of the
      -- per-repetition ratios
      r.ratio = r.ratio or r.lecho / r.base_v
      if r.target then
        local op, lim = r.target[1], r.target[2]
        r.met = (op == "<=" and r.ratio <= lim) or (op == ">=" and r.ratio >= lim)
      end
    end
  end
end

--- Prints the rows as a Markdown table and returns its text.
function M.print_table(rows)
  local out = {}
  out[#out + 1] = "| workload | lecho | baseline | ratio | target |"
  out[#out + 1] = "|---|---:|---:|---:|---|"
  for _, r in ipairs(rows) do
    local target = r.target and ("%s %.2fx: %s"):format(r.target[1], r.target[2],
      r.met == nil and "?" or (r.met and "met" or "MISSED")) or ""
    out[#out + 1] = ("| %s | %s %s%s%s | %s %s | %s | %s |"):format(
      r.workload, fmt_num(r.lecho), r.metric, r.extra and (" (" .. r.extra .. ")") or "",
      r.truncated and " (truncated)" or "",
      r.base, fmt_num(r.base_v), r.ratio and ("%.2fx"):format(r.ratio) or "-", target)
  end
  local s = table.concat(out, "\n")
  print(s)
  return s
end

-- One plot a workload of the results: its name (R[name], name.dat,
-- name.png), the .dat header, a data line per result, the gnuplot commands.
local PLOTS = {
  { "latency", "# payload lecho tcp zmq (us per round trip)", function(r)
      return ('"%s (%dB)" %g %g %g'):format(r.label, r.size, r.lecho.us_per_op,
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
