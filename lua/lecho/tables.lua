-- lecho.tables: the helpers on plain Lua tables that the client side and
-- the name server's side (lecho.ns.*) both use, in one place: the sorted
-- keys of a table (member lists, replies and logs in a stable order) and
-- the deep equality of two decoded values.  Leans on nothing.
--
-- Never compiled, as lecho.ns.registry: Debian's LuaJIT (2.1.0-beta3, git
-- 2022-03-20) predates the upstream fix of a JIT bug that ends a `pairs`
-- loop early once it is blacklisted and patched (LuaJIT issue #827), and
-- both functions here are `pairs` loops whose every key counts (a member
-- list must not skip a consumer).  None of them is on a per-event path.
if jit then jit.off(true, true) end

local pairs, type = pairs, type

local M = {}

--- The keys of t, sorted (all of one type: strings, or numbers).
function M.sorted_keys(t)
  local ks = {}
  for k in pairs(t) do ks[#ks + 1] = k end
  table.sort(ks)
  return ks
end

-- Deeper than this, two tables are told apart (a bound on the recursion
-- whatever the caller hands in; the codec decodes 100 levels by default).
local MAX_DEPTH = 100
M.SAME_DEPTH = MAX_DEPTH

local function same(a, b, depth)
  if a == b then return true end
  if type(a) ~= "table" or type(b) ~= "table" then return a ~= a and b ~= b end -- NaN is NaN
  if depth >= MAX_DEPTH then return false end
  for k, v in pairs(a) do
    if not same(v, b[k], depth + 1) then return false end
  end
  for k in pairs(b) do
    if a[k] == nil then return false end
  end
  return true
end

--- Are a and b the same value: equal, both NaN, or tables with the same
-- keys whose values are the same (by content, at most SAME_DEPTH levels of
-- tables; a table's metatable and identity do not count)?  Used for a
-- group member's data (lecho.group, lecho.ns.presence: unchanged data is no
-- news) and a modulator's params and capabilities (lecho.ns.membership: one
-- key, one modulator).
function M.same(a, b)
  return same(a, b, 0)
end

return M
