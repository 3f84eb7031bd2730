-- Random calls of find, match, gmatch and gsub for the differential test
-- (spec/lpat_diff_spec.lua), and how to run and print them.  RUN_SRC is Lua
-- text that works both here and inside a modulator's sandbox (no upvalues
-- from this file): it turns an encoded case into a call and its outcome
-- into one string, so the outcomes of LuaJIT's functions and ours compare
-- as strings.
local M = {}

M.RUN_SRC = [==[
local REPL_FN = {
  function(a) return a end,
  function(a, b) return b end,
  function() return nil end,
  function() return false end,
  function() return {} end,
  function(a) return type(a) == "string" and #a or a end,
  function(...) return select("#", ...) .. "" end,
}
local REPL_TAB = { a = "A", b = false, x = 1, ["("] = {}, [""] = "E", ab = 2.5 }

local function arg_of(a)
  local k, v = a[1], a[2]
  if k == "nil" then return nil end
  if k == "fn" then return REPL_FN[v] end
  if k == "tab" then return REPL_TAB end
  if k == "nan" then return 0 / 0 end
  return v
end

local function show(v)
  local t = type(v)
  if t == "string" then return ("%q"):format(v) end
  if t == "number" then return v ~= v and "nan" or ("%.17g"):format(v) end
  return t == "boolean" and tostring(v) or t
end

-- An error's text without the chunk and line (they differ between a spec
-- and a modulator).
local function errtext(e) return (tostring(e):gsub("^[^\n]-:%d+: ", "")) end

local function outcome(ok, ...)
  local out = { ok and "ok" or "err" }
  if not ok then out[2] = errtext((...)) return table.concat(out, " ") end
  for i = 1, select("#", ...) do out[#out + 1] = show((select(i, ...))) end
  return table.concat(out, " ")
end

-- run(S, case): case = { fname, n, a1, ..., an } (each ai = { kind, value }),
-- S a table holding find, match, gmatch, gsub.
local function run(S, c)
  local f, n = S[c[1]], c[2]
  local args = {}
  for i = 1, n do args[i] = arg_of(c[2 + i]) end
  if c[1] ~= "gmatch" then return outcome(pcall(f, unpack(args, 1, n))) end
  local ok, it = pcall(f, unpack(args, 1, n))
  if not ok then return outcome(ok, it) end
  local all = {}
  for _ = 1, 40 do
    local r = { pcall(it) }
    if r[1] and r[2] == nil then break end
    all[#all + 1] = outcome(unpack(r, 1, table.maxn(r)))
    if not r[1] then break end
  end
  return table.concat(all, "; ")
end
]==]

local SUBJ = { "a", "a", "b", "c", "x", "(", ")", "[", "]", "%", ".", "-", " ", "\0", "\n", "1", "9",
               "_", "^", "$", "A", "Z", "\200", "\127", "\t" }
local ITEMS = { "a", "b", "x", ".", "%a", "%d", "%s", "%w", "%g", "%p", "%x", "%c", "%u", "%l", "%z",
                "%A", "%S", "%W", "%G", "%.", "%%", "%(", "[ab]", "[^a]", "[a-c]", "[%a_]", "[]]",
                "[^]a]", "[a-]", "[%]]", "[\0a]", "%b()", "%bab", "%f[%w]", "%f[%W]", "%f[%z]", "()",
                "%1", "%2", "%0", "\0", " ", "\200", "$", "-", "^", ")" }
local QUANT = { "", "", "", "*", "+", "-", "?" }
local BROKEN = { "%", "[", "[^", "(", ")", "%b", "%bx", "%f", "%fx", "[a", "[%", "%9" }
local REPLS = { "%0", "%1", "%2", "%%", "%", "x", "-%1-", "%a", "", "<%0>", "%1%1", "a%", "%9", "\0%0" }

local function pick(r, t) return t[r(#t)] end

local function subject(r)
  local out = {}
  for i = 1, r(21) - 1 do out[i] = pick(r, SUBJ) end
  return table.concat(out)
end

local function pattern(r, depth)
  local out = {}
  if depth == 0 and r(5) == 1 then out[1] = "^" end
  for _ = 1, r(6) - 1 do
    local k = r(20)
    if k == 1 and depth < 3 then
      out[#out + 1] = "(" .. pattern(r, depth + 1) .. ")"
    elseif k == 2 then
      out[#out + 1] = pick(r, BROKEN)
    else
      out[#out + 1] = pick(r, ITEMS) .. pick(r, QUANT)
    end
  end
  if depth == 0 and r(6) == 1 then out[#out + 1] = "$" end
  return table.concat(out)
end

local NUMS = { { "num", 1 }, { "num", 2 }, { "num", 0 }, { "num", -1 }, { "num", -3 }, { "num", 1.5 },
               { "num", -2.5 }, { "num", 2 ^ 31 }, { "num", 1e10 }, { "num", -1e10 }, { "num", 2 ^ 32 + 1 },
               { "nan" }, { "str", "2" }, { "str", "x" }, { "num", 40 }, { "nil" }, { "bool", true } }

local function num(r)
  if r(3) == 1 then return pick(r, NUMS) end
  return { "num", r(27) - 14 }
end

-- A case for fname with the PRNG r (r(n): an integer in 1..n).
function M.case(r, fname)
  local s = r(30) == 1 and { "num", r(100) } or { "str", subject(r) }
  local p = r(30) == 1 and { "num", r(10) } or { "str", pattern(r, 0) }
  if r(40) == 1 then -- near the depth and capture limits
    local unit = pick(r, { "a?", "()", "(a)", "a*", "a-", "(a?)", "%1" })
    s = { "str", ("a"):rep(r(260) - 1) }
    p = { "str", unit:rep(r(230)) }
  end
  if r(60) == 1 then s = { "nil" } end
  if r(60) == 1 then p = { "bool", true } end
  if fname == "find" or fname == "match" then
    local c = { fname, 2, s, p }
    if r(2) == 1 then c[2] = 3; c[5] = num(r) end
    if fname == "find" and r(4) == 1 then
      c[2] = 4
      c[5] = c[5] or { "nil" }
      c[6] = pick(r, { { "bool", true }, { "bool", false }, { "nil" }, { "num", 1 } })
    end
    return c
  elseif fname == "gmatch" then
    return { fname, 2, s, p }
  end
  local k, repl = r(10)
  if k <= 5 then
    repl = { "str", pick(r, REPLS) .. (r(2) == 1 and pick(r, REPLS) or "") }
  elseif k <= 7 then
    repl = { "fn", r(7) }
  elseif k <= 8 then
    repl = { "tab" }
  elseif k == 9 then
    repl = { "num", 7 }
  else
    repl = pick(r, { { "nil" }, { "bool", true } })
  end
  local c = { fname, 3, s, p, repl }
  if r(3) == 1 then c[2] = 4; c[6] = num(r) end
  return c
end

-- A PRNG of our own (xorshift32), so a seed replays the same cases anywhere.
function M.prng(seed)
  local bit = require "bit"
  local x = bit.tobit(seed ~= 0 and seed or 1)
  return function(n)
    x = bit.bxor(x, bit.lshift(x, 13))
    x = bit.bxor(x, bit.rshift(x, 17))
    x = bit.bxor(x, bit.lshift(x, 5))
    return (x % n) + 1
  end
end

-- The case as Lua text, for a failure message.
function M.text(c)
  local out = {}
  for i = 1, c[2] do
    local a = c[2 + i]
    out[i] = a[1] == "str" and ("%q"):format(a[2]):gsub("\\\n", "\\n") or
             (a[1] == "num" or a[1] == "bool") and tostring(a[2]) or
             a[1] == "fn" and ("REPL_FN[%d]"):format(a[2]) or a[1] == "tab" and "REPL_TAB" or a[1]
  end
  return ("%s(%s)"):format(c[1], table.concat(out, ", "))
end

return M
