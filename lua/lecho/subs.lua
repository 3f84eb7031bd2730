-- lecho.subs: a consumer context's subscriptions to a channel as the
-- control plane carries them (doc/protocol.md `subs`), checked for shape
-- and size.  Shared by the channel manager (lecho.ns.membership: join,
-- subscribe) and a producer (lecho.modulator: a direct `install`), so both
-- hold a subscription to the same rules.  No I/O, no state.

-- Never compiled, as lecho.ns.* (Debian's LuaJIT and LuaJIT #827).
if jit then jit.off(true, true) end

local core = require "lecho.core"

local M = {}

-- A deterministic text of a value (sorted keys), so that equal params give
-- equal modulator keys in every process.  The value was checked encodable.
local function key_before(a, b)
  local ta, tb = type(a), type(b)
  if ta ~= tb then return ta < tb end
  if ta == "boolean" then return not a and b end
  return a < b
end
local function canon(v, out)
  local t = type(v)
  if t == "table" then
    local keys = {}
    for k in pairs(v) do keys[#keys + 1] = k end
    table.sort(keys, key_before)   -- (one function for every table: no closure per call)
    out[#out + 1] = "{"
    for _, k in ipairs(keys) do
      canon(k, out)
      out[#out + 1] = "="
      canon(v[k], out)
      out[#out + 1] = ";"
    end
    out[#out + 1] = "}"
  elseif t == "string" then
    out[#out + 1] = ("%q"):format(v)
  elseif t == "number" then
    out[#out + 1] = ("%.17g"):format(v)
  elseif t == "userdata" or t == "cdata" then
    -- an array (the only such value params may hold): its dtype, shape
    -- and elements, as encoded (tostring says only "lecho.array <f8 [2]":
    -- a change of its elements alone made no new key, so set_params was a
    -- no-op said true, and other arrays shared one instance)
    local e = core.encode(v)
    out[#out + 1] = "A" .. (e and core.hash(e) or tostring(v))
  else
    out[#out + 1] = tostring(v)
  end
  return out
end

-- For the hint when source does not compile: one line without the
-- punctuation every modulator has ("(", ")", "="):
-- a file name, not source text.
M.canon = canon

-- The key of a modulator: the hash (core.hash: BLAKE2b-256, 64 hex digits,
-- which no one can make collide) of its code (`base`, from M.base_of),
-- its params and `stream` (the stream an in-band params change keeps: the
-- key of the first params of it, doc/modulators.md "Ordering"): equal keys
-- are one instance on one stream.
-- core.stream_key makes the same key in C for the params whose text it is
-- certain of (most: strings, integers, booleans, tables of those; ~1-2 us
-- less per params change at each end); nil for the rest (arrays among
-- them), written here.
function M.lua_stream_key(base, params, stream)
  return core.hash(base .. table.concat(canon(params, {})) .. (stream and "|" .. stream or ""))
end
local lua_stream_key = M.lua_stream_key
function M.stream_key(base, params, stream)
  return core.stream_key(base, params, stream) or lua_stream_key(base, params, stream)
end

-- The hash of a modulator's code: its source, period and capabilities
-- (sorted).
function M.base_of(src, period, caps)
  local cl = {}
  for _, c in ipairs(type(caps) == "table" and caps or {}) do cl[#cl + 1] = c end
  table.sort(cl)
  return core.hash(table.concat(canon({ src, period or 0, cl }, {})))
end

-- Whether a running modulator (`a`: its src, period, caps, params) is the
-- one entry `b` asks for: the same code and params, compared as they are,
-- not by key (a key is believed where it was hashed; where a producer or
-- the manager finds an instance or an entry under a key, what it runs must
-- be what the key's asker sent, or a collision of keys would hand one
-- context's output to another).  Params are compared deeply, and when
-- that says no (an array is one only by identity there), by their
-- canonical text (an array's as the hash of its encoding).
local same = require("lecho.tables").same
local function caps_text(caps)
  local cl = {}
  for _, c in ipairs(type(caps) == "table" and caps or {}) do cl[#cl + 1] = tostring(c) end
  table.sort(cl)
  return table.concat(cl, ",")
end
function M.same_code(a, b)
  return a.src == b.src and (a.period or 0) == (b.period or 0) and caps_text(a.caps) == caps_text(b.caps)
end
function M.same_params(pa, pb)
  if pa == nil then pa = {} end
  if pb == nil then pb = {} end
  if same(pa, pb) then return true end
  return table.concat(canon(pa, {})) == table.concat(canon(pb, {}))
end
function M.same_mod(a, b) return M.same_code(a, b) and M.same_params(a.params, b.params) end

-- The most table entries (keys of every table, nested ones too) a
-- modulator's params may hold: its key is the hash of their canonical text
-- (a sort and a %q per entry, ~4 us each here), made where the params are
-- given and again by the manager and by each producer of a direct
-- install before anything charges the sender: 300,000 entries cost a
-- producer 1.2 s of CPU per message.  Bulk data goes in an array (hashed
-- as its encoding: linear).
M.MAX_PARAMS_ENTRIES = 16384

-- nil when the values of list `vs` hold at most M.MAX_PARAMS_ENTRIES
-- table entries together, each keyed by a string, a number or a boolean,
-- else why (the walk stops at the first fault).  Any other key (a table:
-- the codec encodes it) has no order, so no canonical text and no key:
-- refused here, where the params are given and where they are read (the
-- manager's join, a producer's install), with this reason, not as an
-- error of the sort inside canon (issue 7 of the s7 attack, item 11).
local KEY_TYPES = { string = true, number = true, boolean = true }
local function too_big(vs)
  local n, lim = 0, M.MAX_PARAMS_ENTRIES
  local function walk(t)
    for k, x in next, t do
      n = n + 1
      if n > lim then return "big" end
      if not KEY_TYPES[type(k)] then return type(k) end
      if type(x) == "table" then
        local why = walk(x)
        if why then return why end
      end
    end
    return nil
  end
  for _, v in ipairs(vs) do
    local why = type(v) == "table" and walk(v)
    if why == "big" then
      return ("params have more than %d table entries (an array holds bulk data)"):format(lim)
    elseif why then
      return ("params have a %s as a table key (keys: strings, numbers, booleans)"):format(why), "key"
    end
  end
  return nil
end

-- nil when params `v` hold at most M.MAX_PARAMS_ENTRIES table entries,
-- keyed by strings, numbers or booleans, else why.
function M.params_too_big(v) return too_big({ v }) end

-- Whether `key` is the key of entry `m` of a checked subscription (M.check)
-- (the hash of its code, params and stream: one key is one modulator,
-- whoever else uses it; a key of other code would let a consumer's own
-- modulator be joined to that code's instance): true and its base, or
-- false and why.
-- A member list's modulators (doc/protocol.md `members`): the entry of
-- key in mods (made from subscription m's fields the first time) lists
-- context a as a destination too.  The manager's list (membership.lua
-- members_of) and a producer's direct installs (modulator.lua) both build
-- it so.
function M.add_dest(mods, key, m, a)
  local e = mods[key]
  if not e then
    e = { src = m.src, params = m.params, period = m.period, caps = m.caps, base = m.base,
          stream = m.stream, pseq = m.pseq, dests = {} }
    mods[key] = e
  end
  e.dests[#e.dests + 1] = a
end

function M.key_ok(key, m)
  if m.params == nil or not core.encode(m.params) then return false, "params missing or not encodable" end
  local big = M.params_too_big(m.params)
  if big then return false, big end
  local base = M.base_of(m.src, m.period, m.caps)
  if M.stream_key(base, m.params, m.stream) ~= key then return false, "the key is not the hash of its code and params" end
  return true, base
end

-- A consumer context's subscriptions: { plain = bool, mods = { [key] = {
-- src, params, period, caps, base } } }.  Absent: the plain stream only.
local MAX_SOURCE = 1024 * 1024
function M.check(msg)
  local s = msg.subs
  if s == nil then return { plain = true, mods = {} } end
  local op = msg.op
  if type(s) ~= "table" then return nil, op .. ": field 'subs' must be a table" end
  if s.mods ~= nil and type(s.mods) ~= "table" then return nil, op .. ": 'subs.mods' must be a table" end
  local mods = {}
  for k, m in pairs(s.mods or {}) do
    if type(k) ~= "string" or #k == 0 or #k > 64 then
      return nil, op .. ": modulator keys must be strings of 1 to 64 bytes"
    end
    if type(m) ~= "table" or type(m.src) ~= "string" then
      return nil, ("%s: modulator '%s' needs a string 'src'"):format(op, k)
    end
    if #m.src > MAX_SOURCE then
      return nil, ("%s: modulator '%s' source longer than %d bytes"):format(op, k, MAX_SOURCE)
    end
    if m.period ~= nil and (type(m.period) ~= "number" or not (m.period >= 0.001 and m.period < math.huge)) then
      return nil, ("%s: modulator '%s': period must be a finite number >= 0.001"):format(op, k)
    end
    if m.caps ~= nil and type(m.caps) ~= "table" then
      return nil, ("%s: modulator '%s': caps must be a list of strings"):format(op, k)
    end
    for _, cap in ipairs(m.caps or {}) do
      if type(cap) ~= "string" then
        return nil, ("%s: modulator '%s': caps must be a list of strings"):format(op, k)
      end
    end
    if m.stream ~= nil and (type(m.stream) ~= "string" or #m.stream == 0 or #m.stream > 64) then
      return nil, ("%s: modulator '%s': stream must be a string of 1 to 64 bytes"):format(op, k)
    end
    if m.pseq ~= nil and (type(m.pseq) ~= "number" or m.pseq < 0 or m.pseq >= 2 ^ 53 or m.pseq % 1 ~= 0) then
      return nil, ("%s: modulator '%s': pseq must be an integer"):format(op, k)
    end
    mods[k] = { src = m.src, params = m.params, period = m.period, caps = m.caps,
                base = type(m.base) == "string" and m.base or nil, stream = m.stream, pseq = m.pseq }
  end
  -- the params of all its modulators together (each message's keys are
  -- hashed over them: 64 modulators of the limit each would be 64 times it)
  local plist = {}
  for _, m in pairs(mods) do plist[#plist + 1] = m.params end
  local big, kind = too_big(plist)
  if kind == "key" then return nil, ("%s: a modulator's %s"):format(op, big) end
  if big then return nil, ("%s: the modulators' %s together"):format(op, big) end
  -- a service's server (lecho.service): the versions it serves here
  local svc
  if s.svc ~= nil then
    local v = type(s.svc) == "table" and s.svc.versions
    if type(v) ~= "table" or #v == 0 or #v > 64 then
      return nil, op .. ": 'subs.svc.versions' must be a list of 1 to 64 integers"
    end
    local vs = {}
    for i = 1, #v do
      local x = v[i]
      if type(x) ~= "number" or x < 1 or x > 2 ^ 31 or x % 1 ~= 0 then
        return nil, op .. ": 'subs.svc.versions' must be a list of 1 to 64 integers"
      end
      vs[i] = x
    end
    svc = { versions = vs }
  end
  -- a late joiner's history wish (lecho.history): passed to the producers
  -- with the member list that takes it, so that they send it at once
  local histq
  if s.histq ~= nil then
    local h = s.histq
    if type(h) ~= "table" or type(h.n) ~= "number" or h.n < 1 or h.n > 1024 or h.n % 1 ~= 0
       or (h.key ~= nil and (type(h.key) ~= "string" or #h.key == 0 or #h.key > 64)) then
      return nil, op .. ": 'subs.histq' must be { n = 1..1024, key = nil or a modulator key }"
    end
    histq = { n = h.n, key = h.key }
  end
  -- the consumer's count of its subscription changes (a direct install
  -- names one above it: lecho.modulator _install_req)
  local sseq = s.sseq
  if sseq ~= nil and (type(sseq) ~= "number" or sseq < 0 or sseq >= 2 ^ 53 or sseq % 1 ~= 0) then
    return nil, op .. ": 'subs.sseq' must be an integer"
  end
  return { plain = s.plain ~= false, mods = mods, svc = svc, histq = histq, sseq = sseq }
end


return M
