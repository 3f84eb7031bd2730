-- bench/common.lua: what bench/run.lua and bench/worker.lua share: a
-- monotonic clock comparable across processes (CLOCK_MONOTONIC), the
-- payloads of the workloads, process liveness and small helpers.

local ffi = require "ffi"

pcall(ffi.cdef, [[
typedef struct { long tv_sec; long tv_nsec; } lecho_bench_timespec;
int clock_gettime(int clk, lecho_bench_timespec *ts);
int kill(int pid, int sig);
int getpid(void);
]])

local M = {}

local ts = ffi.new("lecho_bench_timespec")
local C = ffi.C

--- Seconds on CLOCK_MONOTONIC: one clock for every process of the machine,
-- so a consumer's receive time can be compared with the producer's start.
function M.clock()
  C.clock_gettime(1, ts)
  return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end

function M.alive(pid)
  return pid and C.kill(pid, 0) == 0
end

function M.getpid() return C.getpid() end

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

function M.sh_quote(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

function M.read(path)
  local f = io.open(path, "r")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end

function M.write(path, text)
  local f = assert(io.open(path, "w"))
  f:write(text)
  f:close()
end

return M
