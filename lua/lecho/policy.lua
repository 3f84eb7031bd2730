-- lecho.policy: who may do what to which channel, in keyed mode
-- (doc/security.md).  A policy is a list of rules; each grants principals
-- (names or `*` globs) actions on channels (names or globs):
--
--   { principal = "sim" or { "viewer-*", ... }, channel = "atmos/*" or {...},
--     allow = { "produce", "consume", "modulate", "manage", "list" },
--     caps = { "clock", "log" } }       -- what a granted modulator may ask for
--
-- What no rule grants is refused.  Channels are matched by their name
-- without the name server's address and without a derived stream's "@key"
-- ("atmos/ozone" for "127.0.0.1:7700/atmos/ozone@1f2e").  A policy comes
-- from a Lua file (returns the table; run in an empty environment) or a JSON
-- file (lua-cjson), and travels in control messages as its plain table
-- (the name server hands it to its managers).  Pure Lua; no I/O but the load.

local address = require "lecho.addr"
-- Loops over keys as `in each(t)`, never `in pairs(t)`: no ITERN loop, which
-- Debian's LuaJIT may never end in the close at the program's end (context.lua).
local each = pairs

local M = {}

-- The actions, in the order the documentation gives them.
-- (stats: reading a process's counters, lecho.stats; its "channel" is
-- the process's principal name)
M.ACTIONS = { "produce", "consume", "modulate", "manage", "list", "stats" }
local ACTION = {}
for _, a in ipairs(M.ACTIONS) do ACTION[a] = true end

-- Capabilities a rule may let modulators ask for (lecho.options.CAPS).
local CAPS = require("lecho.options").CAPS

local MAX_RULES = 10000
local MAX_PATTERN = 1024

local Policy = {}
Policy.__index = Policy

-- Does glob `p` (`*`: any run of bytes, every other byte itself) match all
-- of `s`?  Linear in #s * #p at worst (the last star is the only one
-- backtracked to), whatever the pattern.
local function glob(p, s)
  local pi, si, np, ns = 1, 1, #p, #s
  local star, mark = nil, 0
  while si <= ns do
    local c = p:byte(pi)
    if c == 42 then                                   -- '*'
      star, mark, pi = pi, si, pi + 1
    elseif c ~= nil and c == s:byte(si) then
      pi, si = pi + 1, si + 1
    elseif star then
      pi, mark = star + 1, mark + 1
      si = mark
    else
      return false
    end
  end
  while p:byte(pi) == 42 do pi = pi + 1 end
  return pi > np
end
M.glob = glob

-- A channel's name as rules see it: its base name (the protocol's rule,
-- lecho.addr.base: up to the first '@' after the last '/') without the
-- name server.  A short name (no name server) is taken as it is.
function M.base_name(ch)
  local base = address.base(ch)
  local ns, short = address.split(base)
  if ns == nil then short = base end
  return short
end

-- A string or a list of strings, each a valid pattern; a fresh list.
local function patterns(v, what, where, check)
  if type(v) == "string" then v = { v } end
  if type(v) ~= "table" or #v == 0 then
    return nil, ("%s: %s must be a string or a non-empty list of strings"):format(where, what)
  end
  local out = {}
  for i, p in each(v) do
    if type(i) ~= "number" or type(p) ~= "string" or p == "" or #p > MAX_PATTERN then
      return nil, ("%s: %s must be a string or a non-empty list of strings"):format(where, what)
    end
    local ok, err = check(p)
    if not ok then return nil, ("%s: %s '%s' %s"):format(where, what, p, err) end
    out[#out + 1] = p
  end
  return out
end

local function principal_pattern(p)
  if #p > 64 or p:find("[^%w%._%-%*]") then
    return nil, "is not a principal name or pattern (1 to 64 of A-Z a-z 0-9 . _ - and *)"
  end
  return true
end

local function channel_pattern(p)
  if p:find("\0", 1, true) then return nil, "contains a NUL byte" end
  return true
end

-- policy.new(t, where): checks table t (the shape above, or { rules = {...},
-- [lecho = "policy"], [version = 1] }) and returns a policy, or nil, err
-- (err starts with `where`, a file name say).
function M.new(t, where)
  where = where or "policy"
  if type(t) ~= "table" then return nil, where .. ": a policy is a table with 'rules'" end
  if t.lecho ~= nil and t.lecho ~= "policy" then
    return nil, ("%s: 'lecho' must be \"policy\", not %s"):format(where, tostring(t.lecho))
  end
  if t.version ~= nil and t.version ~= 1 then
    return nil, ("%s: version %s is not known (this lecho reads version 1)"):format(where, tostring(t.version))
  end
  for k in each(t) do
    if k ~= "lecho" and k ~= "version" and k ~= "rules" then
      return nil, ("%s: unknown field '%s' (known: lecho, version, rules)"):format(where, tostring(k))
    end
  end
  local rules = t.rules
  if type(rules) ~= "table" then return nil, where .. ": 'rules' must be a list of rules" end
  local n = 0
  for _ in each(rules) do n = n + 1 end
  if n ~= #rules then return nil, where .. ": 'rules' must be a list of rules" end
  if n > MAX_RULES then return nil, ("%s: more than %d rules"):format(where, MAX_RULES) end
  local out = {}
  for i, r in ipairs(rules) do
    local at = ("%s: rule %d"):format(where, i)
    if type(r) ~= "table" then return nil, at .. " is not a table" end
    for k in each(r) do
      if k ~= "principal" and k ~= "channel" and k ~= "allow" and k ~= "caps" then
        return nil, ("%s: unknown field '%s' (known: principal, channel, allow, caps)"):format(at, tostring(k))
      end
    end
    local ps, err = patterns(r.principal, "principal", at, principal_pattern)
    if not ps then return nil, err end
    local cs; cs, err = patterns(r.channel, "channel", at, channel_pattern)
    if not cs then return nil, err end
    local allow, al = {}, r.allow
    if type(al) == "string" then al = { al } end
    if type(al) ~= "table" or #al == 0 then
      return nil, ("%s: 'allow' must list actions (%s)"):format(at, table.concat(M.ACTIONS, ", "))
    end
    for _, a in each(al) do
      if not ACTION[a] then
        return nil, ("%s: unknown action '%s' (known: %s)"):format(at, tostring(a), table.concat(M.ACTIONS, ", "))
      end
      allow[a] = true
    end
    local caps = {}
    if r.caps ~= nil then
      if not allow.modulate then return nil, at .. ": 'caps' needs the action modulate" end
      if type(r.caps) ~= "table" then return nil, at .. ": 'caps' must be a list of capability names" end
      for _, c in each(r.caps) do
        if not CAPS[c] then
          return nil, ("%s: unknown capability '%s' in 'caps'"):format(at, tostring(c))
        end
        caps[c] = true
      end
    end
    out[i] = { principal = ps, channel = cs, allow = allow, caps = caps }
  end
  return setmetatable({ rules = out, source = t }, Policy)
end

-- policy.load(path): a policy from a file: JSON when its first non-blank
-- byte is '{', else Lua source returning the table (run in an empty
-- environment: no library, no global).  nil, err (with the path) when the
-- file cannot be read or holds no valid policy.
function M.load(path)
  local f, ferr = io.open(path, "rb")
  if not f then return nil, ("policy %s: %s"):format(path, ferr) end
  local text = f:read("*a")
  f:close()
  local t
  if text:match("^%s*{") then
    local ok, v = pcall(require("cjson").decode, text)
    if not ok then return nil, ("%s: not valid JSON: %s"):format(path, tostring(v)) end
    t = v
  else
    if text:byte(1) == 27 then return nil, path .. ": a policy must be source text, not bytecode" end
    -- (the chunk is named for the path: its errors start "path:line:")
    local chunk, err = loadstring(text, "=" .. path)
    if not chunk then return nil, err end
    setfenv(chunk, {})
    local ok, v = pcall(chunk)
    if not ok then return nil, tostring(v) end
    t = v
  end
  return M.new(t, path)
end

-- The rules as plain data (for a control message); policy.new takes it back.
function Policy:table()
  local rules = {}
  for i, r in ipairs(self.rules) do
    local allow, caps = {}, {}
    for _, a in ipairs(M.ACTIONS) do if r.allow[a] then allow[#allow + 1] = a end end
    for c in each(r.caps) do caps[#caps + 1] = c end
    table.sort(caps)
    rules[i] = { principal = r.principal, channel = r.channel, allow = allow, caps = caps[1] and caps or nil }
  end
  return { lecho = "policy", version = 1, rules = rules }
end

local function any(list, s)
  for _, p in ipairs(list) do
    if glob(p, s) then return true end
  end
  return false
end

-- The rules that name `principal` and channel `ch` (nil: any channel
-- pattern counts, as for "may it manage anything at all").
local function matching(self, principal, ch)
  local base = ch and M.base_name(ch)
  local i, rules = 0, self.rules
  return function()
    while true do
      i = i + 1
      local r = rules[i]
      if not r then return nil end
      if any(r.principal, principal) and (base == nil or any(r.channel, base)) then return r end
    end
  end
end

-- May `principal` do `action` on channel `ch` (a full or short name; nil:
-- on some channel)?  For modulate, `caps` (a list) must all be granted by
-- one rule.  Returns true, or nil, "not allowed: <principal> may not
-- <action> <channel>".
function Policy:check(principal, action, ch, caps)
  for r in matching(self, principal, ch) do
    if r.allow[action] then
      local ok = true
      for _, c in ipairs(caps or {}) do
        if not r.caps[c] then ok = false break end
      end
      if ok then return true end
    end
  end
  local what = action
  if caps and caps[1] then what = ("%s with %s"):format(action, table.concat(caps, ", ")) end
  return nil, ("not allowed: %s may not %s %s"):format(principal, what, ch and M.base_name(ch) or "any channel")
end

function Policy:allows(principal, action, ch, caps)
  return self:check(principal, action, ch, caps) == true
end

return M
