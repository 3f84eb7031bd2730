-- bench/common.lua: what bench/run.lua and bench/worker.lua share: the
-- payloads of the workloads, and (from spec/support/proc.lua) a monotonic
-- clock comparable across processes, process liveness and small helpers.

-- The process side (clock, files, children) is spec/support/proc.lua's,
-- shared with the specs and the stress harness; the scripts put the tree's
-- root on package.path for it.
local P = require "spec.support.proc"

local M = {
  clock = P.clock, alive = P.alive, getpid = P.getpid,
  sh_quote = P.sh_quote, read = P.read, write = P.write,
}

------------------------------------------------------------------------------
-- Command line and trustworthy figures (issue 13: every ratio the median of
-- interleaved repetitions, with its spread, every repetition kept)

--- The command line every bench script takes: --quick (or QUICK=1 in the
-- environment), --json FILE, --help (prints usage, exits 0).  Anything else:
-- usage on stderr, exit 2.  Returns { quick = bool, json = path or nil }.
function M.args(argv, usage)
  local o = { quick = (os.getenv("QUICK") or "") ~= "" and os.getenv("QUICK") ~= "0" }
  local i = 1
  while argv and argv[i] do
    local a = argv[i]
    if a == "--quick" then o.quick = true
    elseif a == "--json" and argv[i + 1] then o.json = argv[i + 1]; i = i + 1
    elseif a == "--help" or a == "-h" then io.write(usage or "") os.exit(0)
    else
      io.stderr:write(("%s: unknown argument %s\n"):format(argv[0] or "bench", a), usage or "")
      os.exit(2)
    end
    i = i + 1
  end
  return o
end

--- The median of a list of numbers (nil when empty).
function M.median(xs)
  local t = {}
  for i, x in ipairs(xs) do t[i] = x end
  table.sort(t)
  local n = #t
  if n == 0 then return nil end
  return n % 2 == 1 and t[(n + 1) / 2] or (t[n / 2] + t[n / 2 + 1]) / 2
end

--- min and max of a list of numbers.
function M.spread(xs)
  local lo, hi = math.huge, -math.huge
  for _, x in ipairs(xs) do lo, hi = math.min(lo, x), math.max(hi, x) end
  return lo, hi
end

--- Interleaved repetitions of competing runs.  o.runs: a list of
-- { name, fn } (fn(rep) -> a result table, or nil and an error); o.reps:
-- how many; o.value(result, name) -> the number compared (default
-- result.us_per_op); o.ratios: a list of { a, b } names (a's value over b's,
-- per repetition).  Repetition k runs them in the list order rotated by
-- k - 1 (a, b, c; b, c, a; ...), so a drift of the machine's load hits
-- every run alike.  Returns
--   { reps = n, order = { {names}... }, runs = { name = { result... } },
--     values = { name = { number... } }, median = { name = m },
--     ratios = { ["a/b"] = { all = {...}, median =, lo =, hi = } } }
-- A run that fails is kept as { error = why } and leaves no value.
function M.interleave(o)
  local value = o.value or function(r) return r.us_per_op end
  local out = { reps = o.reps, order = {}, runs = {}, values = {}, median = {}, ratios = {} }
  for _, r in ipairs(o.runs) do out.runs[r[1]], out.values[r[1]] = {}, {} end
  local n = #o.runs
  for k = 1, o.reps do
    local order = {}
    for j = 1, n do
      local r = o.runs[(j + k - 2) % n + 1]
      order[j] = r[1]
      local ok, res, err = pcall(r[2], k)
      if not ok or type(res) ~= "table" then res = { error = tostring(ok and err or res) } end
      res.rep = k
      table.insert(out.runs[r[1]], res)
      local v = not res.error and value(res, r[1]) or nil
      out.values[r[1]][k] = type(v) == "number" and v or false
    end
    out.order[k] = order
  end
  for name, vs in pairs(out.values) do
    local ok = {}
    for _, v in ipairs(vs) do if v then ok[#ok + 1] = v end end
    out.median[name] = M.median(ok)
  end
  for _, p in ipairs(o.ratios or {}) do
    local all = {}
    for k = 1, o.reps do
      local a, b = out.values[p[1]][k], out.values[p[2]][k]
      if a and b and b ~= 0 then all[#all + 1] = a / b end
    end
    local lo, hi = M.spread(all)
    out.ratios[p[1] .. "/" .. p[2]] = { all = all, median = M.median(all), lo = #all > 0 and lo or nil,
                                       hi = #all > 0 and hi or nil }
  end
  return out
end

--- "N interleaved reps, ratios LO-HIx" for a ratio of M.interleave.
function M.spread_text(ratio, reps)
  if not ratio or not ratio.lo then return ("%d interleaved reps, no ratio"):format(reps or 0) end
  return ("%d interleaved reps, ratios %.2f-%.2fx"):format(#ratio.all, ratio.lo, ratio.hi)
end

--- The ratio a/b per repetition of an M.interleave result, of any figure:
-- value(result) -> number (repetition k of a against repetition k of b).
-- Returns { all = {...}, median =, lo =, hi = } (lo, hi nil when none).
function M.ratio(iv, a, b, value)
  local all = {}
  for k = 1, iv.reps do
    local ra, rb = iv.runs[a][k], iv.runs[b][k]
    local x = ra and not ra.error and value(ra)
    local y = rb and not rb.error and value(rb)
    if type(x) == "number" and type(y) == "number" and y ~= 0 then all[#all + 1] = x / y end
  end
  local lo, hi = M.spread(all)
  return { all = all, median = M.median(all), lo = #all > 0 and lo or nil, hi = #all > 0 and hi or nil }
end

--- The median over the repetitions of `name` in an M.interleave result of
-- any figure (value(result) -> number), and the repetition closest to it.
function M.median_of(iv, name, value)
  local xs = {}
  for _, r in ipairs(iv.runs[name] or {}) do
    local x = not r.error and value(r)
    if type(x) == "number" then xs[#xs + 1] = x end
  end
  local m = M.median(xs)
  local pick
  if m then
    for _, r in ipairs(iv.runs[name]) do
      local x = not r.error and value(r)
      if type(x) == "number" and (not pick or math.abs(x - m) < math.abs(value(pick) - m)) then pick = r end
    end
  end
  return m, pick
end

--- How busy the machine is: load averages and the CPU time stolen by the
-- hypervisor since boot (from /proc), to compare before and after a run.
function M.machine()
  local m = {}
  local la = M.read("/proc/loadavg")
  if la then
    local a, b, c = la:match("^(%S+) (%S+) (%S+)")
    m.load1, m.load5, m.load15 = tonumber(a), tonumber(b), tonumber(c)
  end
  local st = M.read("/proc/stat")
  local cpu = st and st:match("^cpu%s+([^\n]+)")
  if cpu then
    local f = {}
    for x in cpu:gmatch("%d+") do f[#f + 1] = tonumber(x) end
    local total = 0
    for _, x in ipairs(f) do total = total + x end
    m.steal_ticks, m.total_ticks = f[8] or 0, total
  end
  return m
end

--- Thresholds beyond which a figure is not to be trusted (issue 13):
-- the 1-minute load average above the cores at the start, more than 5 % of
-- the CPU time stolen by the hypervisor over the run, a ratio whose
-- repetitions spread wider than 1.5x (the highest over the lowest).
M.TRUST = { steal_pct = 5, spread = 1.5 }

--- The machine's business between two M.machine() readings:
-- { load1_before, load1_after, steal_pct (over the interval, nil when
-- /proc/stat did not move), cores, flags = { text... } }.
function M.busy(before, after, cores)
  local b = { load1_before = before.load1, load1_after = after.load1, cores = cores, flags = {} }
  local dt = (after.total_ticks or 0) - (before.total_ticks or 0)
  if dt > 0 then b.steal_pct = 100 * ((after.steal_ticks or 0) - (before.steal_ticks or 0)) / dt end
  if cores and before.load1 and before.load1 > cores then
    b.flags[#b.flags + 1] = ("load %.1f > %d cores"):format(before.load1, cores)
  end
  if b.steal_pct and b.steal_pct > M.TRUST.steal_pct then
    b.flags[#b.flags + 1] = ("steal %.1f%%"):format(b.steal_pct)
  end
  return b
end

--- Whether a ratio's repetitions spread wider than M.TRUST.spread.
function M.wide(lo, hi)
  return lo and hi and lo > 0 and hi / lo > M.TRUST.spread or false
end

--- The last line of out that is a JSON object, decoded (a C program's
-- result line), or nil.
function M.json_line(out)
  local last
  for line in out:gmatch("[^\n]+") do
    if line:match("^%s*{") then last = line end
  end
  local ok, v = pcall(require("cjson").decode, last or "")
  return ok and type(v) == "table" and v or nil
end

--- Serves ctx's loop until pred() is true (true) or bound seconds passed
-- (false).
function M.run_until(ctx, pred, bound)
  local deadline = M.clock() + bound
  while not pred() do
    if M.clock() > deadline then return false end
    ctx:run_once(0.02)
  end
  return true
end

--- The payloads of the suite, by name.  Encoded sizes come from
-- lecho.encode at run time (the baselines are run with those sizes).
function M.payload(name)
  if name == "null" then return nil end
  if name == "int100" then
    local t = {}
    for i = 1, 100 do t[i] = i * 7 - 300 end
    return t
  end
  if name == "str400" then return ("abcdefghij"):rep(40) end
  if name == "num100" then
    local t = {}
    for i = 1, 100 do t[i] = i * 0.37 + 1e-3 end
    return t
  end
  if name == "composite" then
    local items = {}
    for i = 1, 10 do
      items[i] = { id = i, x = i * 1.25, y = -i, ok = i % 2 == 0, label = "item-" .. i,
                   pos = { i, i + 0.5, -i } }
    end
    return { kind = "telemetry", source = "sim-42", unit = "K", seq = 123456,
             meta = { step = 7, t = 0.125, tags = { "a", "b", "c" } }, items = items }
  end
  local bytes = name:match("^bytes(%d+)$")
  if bytes then return ("x"):rep(tonumber(bytes)) end
  error("unknown payload " .. tostring(name))
end

return M
