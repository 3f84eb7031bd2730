-- stress/lib.lua: what the stress driver, its child processes and the
-- checker share: the clock every process stamps its records with, JSON-line
-- logs, the seeded PRNG, /proc readings.  No lecho here (the driver and the
-- checker do not load it).
local cjson = require "cjson"
local P = require "spec.support.proc"

local M = {}

-- CLOCK_MONOTONIC: one clock for every process on this host, so records of
-- different processes compare.  It, sleeping and the files are
-- spec/support/proc.lua's (the tree's root is on package.path).
M.now, M.sleep, M.getpid = P.clock, P.sleep, P.getpid
M.read, M.write = P.read, P.write

-- A JSON-lines log, line-buffered: each record reaches the kernel when it is
-- written, so it survives a SIGKILL right after (a handler's record is
-- written before the handler returns, hence before its ack).
function M.logger(path)
  local f = assert(io.open(path, "a"))
  f:setvbuf("line")
  local L = {}
  function L.w(rec)
    if not rec.t0 and not rec.T then rec.T = M.now() end
    f:write(cjson.encode(rec), "\n")
  end
  function L.close() f:close() end
  return L
end

function M.read_jsonl(path)
  local out, bad = {}, 0
  local f = io.open(path, "r")
  if not f then return out, 0, false end
  for line in f:lines() do
    if line ~= "" then
      local ok, rec = pcall(cjson.decode, line)
      if ok and type(rec) == "table" then out[#out + 1] = rec else bad = bad + 1 end
    end
  end
  f:close()
  return out, bad, true
end

-- Resident set size of pid (or this process) in bytes, from /proc; nil if gone.
function M.rss(pid)
  local s = M.read(("/proc/%s/status"):format(pid or "self"))
  local kb = s and s:match("VmRSS:%s*(%d+)")
  return kb and tonumber(kb) * 1024
end

-- The PRNG every random choice of a scenario comes from: Park-Miller
-- (16807 * x mod 2^31-1), exact in doubles, so a seed replays on any build.
function M.rng(seed)
  local x = math.floor(seed) % 2147483646 + 1
  local R = {}
  local function step()
    x = (16807 * x) % 2147483647
    return x
  end
  for _ = 1, 8 do step() end
  function R.float() return (step() - 1) / 2147483646 end          -- [0, 1)
  function R.int(a, b) return a + math.floor(R.float() * (b - a + 1)) end
  function R.range(a, b) return a + R.float() * (b - a) end
  function R.chance(p) return R.float() < p end
  function R.pick(t) return t[R.int(1, #t)] end
  return R
end

function M.hex(s) return (s:gsub(".", function(c) return ("%02x"):format(c:byte()) end)) end

M.json = cjson
return M
