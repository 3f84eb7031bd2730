-- lecho.patterns: Lua's string pattern functions (find, match, gmatch,
-- gsub) written in Lua, for modulator states.
--
-- The C versions cannot be interrupted: a pattern with a few `.-` over a
-- long subject can run for hours inside one C call, out of reach of the
-- modulator's CPU budget (a count hook).  These run as Lua code, so the
-- budget stops them like any loop.  Same semantics as Lua 5.1's (classes,
-- sets, anchors, the four quantifiers, captures and position captures,
-- back-references, %b and %f); spec/patterns_spec.lua compares them with
-- the C versions.  Slower, which is the price of being stoppable.
--
-- Loaded into each modulator state before the modulator's own source: it
-- returns a function that installs the four into a string table.

local sbyte, ssub, schar = string.byte, string.sub, string.char
local c_find = string.find -- the C one: only for plain (linear) searches
local tostring, type, error, select = tostring, type, error, select
local tconcat = table.concat

local L_ESC = 37 -- %
local MAXCAPTURES = 32
local CAP_UNFINISHED, CAP_POSITION = -1, -2

local function class_end(ms, p)
  local pat = ms.pat
  local c = sbyte(pat, p)
  if not c then error("malformed pattern (ends with '%')", 0) end
  p = p + 1
  if c == L_ESC then
    if p > ms.plen then error("malformed pattern (ends with '%')", 0) end
    return p + 1
  elseif c == 91 then -- [
    if sbyte(pat, p) == 94 then p = p + 1 end -- ^
    repeat -- look for a ]
      if p > ms.plen then error("malformed pattern (missing ']')", 0) end
      local cc = sbyte(pat, p)
      p = p + 1
      if cc == L_ESC then
        if p > ms.plen then error("malformed pattern (missing ']')", 0) end
        p = p + 1
      end
    until sbyte(pat, p) == 93
    return p + 1
  end
  return p
end

local function is_alpha(c) return (c >= 65 and c <= 90) or (c >= 97 and c <= 122) end
local function is_digit(c) return c >= 48 and c <= 57 end
local function is_lower(c) return c >= 97 and c <= 122 end
local function is_upper(c) return c >= 65 and c <= 90 end
local function is_space(c) return c == 32 or (c >= 9 and c <= 13) end
local function is_cntrl(c) return c < 32 or c == 127 end
local function is_punct(c)
  return (c >= 33 and c <= 47) or (c >= 58 and c <= 64) or (c >= 91 and c <= 96)
      or (c >= 123 and c <= 126)
end
local function is_xdigit(c)
  return is_digit(c) or (c >= 97 and c <= 102) or (c >= 65 and c <= 70)
end

-- Does character c belong to class cl (the letter after %)?
local function match_class(c, cl)
  local lower = cl
  if is_upper(cl) then lower = cl + 32 end
  local res
  if lower == 97 then res = is_alpha(c)                       -- a
  elseif lower == 99 then res = is_cntrl(c)                   -- c
  elseif lower == 100 then res = is_digit(c)                  -- d
  elseif lower == 108 then res = is_lower(c)                  -- l
  elseif lower == 112 then res = is_punct(c)                  -- p
  elseif lower == 115 then res = is_space(c)                  -- s
  elseif lower == 117 then res = is_upper(c)                  -- u
  elseif lower == 119 then res = is_alpha(c) or is_digit(c)   -- w
  elseif lower == 120 then res = is_xdigit(c)                 -- x
  elseif lower == 122 then res = c == 0                       -- z
  else return cl == c end
  if is_upper(cl) then return not res end
  return res
end

-- p at '[', ec at the closing ']'
local function match_bracket(ms, c, p, ec)
  local pat = ms.pat
  local sig = true
  if sbyte(pat, p + 1) == 94 then
    sig = false
    p = p + 1
  end
  p = p + 1
  while p < ec do
    local pc = sbyte(pat, p)
    if pc == L_ESC then
      p = p + 1
      if match_class(c, sbyte(pat, p)) then return sig end
    elseif sbyte(pat, p + 1) == 45 and p + 2 < ec then -- range a-z
      if sbyte(pat, p) <= c and c <= sbyte(pat, p + 2) then return sig end
      p = p + 2
    elseif pc == c then
      return sig
    end
    p = p + 1
  end
  return not sig
end

-- Does the character at s position si match the single item p..ep-1?
local function single_match(ms, si, p, ep)
  if si > ms.slen then return false end
  local c = sbyte(ms.src, si)
  local pc = sbyte(ms.pat, p)
  if pc == 46 then return true -- .
  elseif pc == L_ESC then return match_class(c, sbyte(ms.pat, p + 1))
  elseif pc == 91 then return match_bracket(ms, c, p, ep - 1)
  else return pc == c end
end

local do_match

local function match_balance(ms, si, p)
  if p + 1 > ms.plen then error("missing arguments to '%b'", 0) end
  if si > ms.slen or sbyte(ms.src, si) ~= sbyte(ms.pat, p) then return nil end
  local b, e = sbyte(ms.pat, p), sbyte(ms.pat, p + 1)
  local cont = 1
  local i = si + 1
  while i <= ms.slen do
    local c = sbyte(ms.src, i)
    if c == e then
      cont = cont - 1
      if cont == 0 then return i + 1 end
    elseif c == b then
      cont = cont + 1
    end
    i = i + 1
  end
  return nil
end

local function max_expand(ms, si, p, ep)
  local i = 0
  while single_match(ms, si + i, p, ep) do i = i + 1 end
  while i >= 0 do
    local res = do_match(ms, si + i, ep + 1)
    if res then return res end
    i = i - 1
  end
  return nil
end

local function min_expand(ms, si, p, ep)
  while true do
    local res = do_match(ms, si, ep + 1)
    if res then return res end
    if single_match(ms, si, p, ep) then
      si = si + 1
    else
      return nil
    end
  end
end

local function start_capture(ms, si, p, what)
  local level = ms.level + 1
  if level > MAXCAPTURES then error("too many captures", 0) end
  ms.cstart[level], ms.clen[level] = si, what
  ms.level = level
  local res = do_match(ms, si, p)
  if not res then ms.level = ms.level - 1 end
  return res
end

local function capture_to_close(ms)
  local level = ms.level
  while level > 0 do
    if ms.clen[level] == CAP_UNFINISHED then return level end
    level = level - 1
  end
  error("invalid pattern capture", 0)
end

local function end_capture(ms, si, p)
  local l = capture_to_close(ms)
  ms.clen[l] = si - ms.cstart[l]
  local res = do_match(ms, si, p)
  if not res then ms.clen[l] = CAP_UNFINISHED end
  return res
end

local function check_capture(ms, l)
  l = l - 48 -- '1' -> 1
  if l < 1 or l > ms.level or ms.clen[l] == CAP_UNFINISHED then
    error("invalid capture index", 0)
  end
  return l
end

local function match_capture(ms, si, l)
  l = check_capture(ms, l)
  local len = ms.clen[l]
  if ms.slen - si + 1 >= len
     and ssub(ms.src, ms.cstart[l], ms.cstart[l] + len - 1) == ssub(ms.src, si, si + len - 1) then
    return si + len
  end
  return nil
end

-- Matches pattern from position p at subject position si: the end of the
-- match (one past it), or nil.
do_match = function(ms, si, p)
  while true do
    if p > ms.plen then return si end
    local pc = sbyte(ms.pat, p)
    if pc == 40 then -- (
      if sbyte(ms.pat, p + 1) == 41 then
        return start_capture(ms, si, p + 2, CAP_POSITION)
      end
      return start_capture(ms, si, p + 1, CAP_UNFINISHED)
    elseif pc == 41 then -- )
      return end_capture(ms, si, p + 1)
    elseif pc == 36 and p == ms.plen then -- $ at the end
      if si == ms.slen + 1 then return si end
      return nil
    elseif pc == L_ESC and sbyte(ms.pat, p + 1) == 98 then -- %b
      si = match_balance(ms, si, p + 2)
      if not si then return nil end
      p = p + 4
    elseif pc == L_ESC and sbyte(ms.pat, p + 1) == 102 then -- %f
      p = p + 2
      if sbyte(ms.pat, p) ~= 91 then error("missing '[' after '%f' in pattern", 0) end
      local ep = class_end(ms, p)
      local prev = si == 1 and 0 or sbyte(ms.src, si - 1)
      local cur = si <= ms.slen and sbyte(ms.src, si) or 0
      if match_bracket(ms, prev, p, ep - 1) or not match_bracket(ms, cur, p, ep - 1) then
        return nil
      end
      p = ep
    elseif pc == L_ESC and is_digit(sbyte(ms.pat, p + 1) or 0) then -- %1..%9
      si = match_capture(ms, si, sbyte(ms.pat, p + 1))
      if not si then return nil end
      p = p + 2
    else
      local ep = class_end(ms, p)
      local m = single_match(ms, si, p, ep)
      local q = sbyte(ms.pat, ep)
      if q == 63 then -- ?
        if m then
          local res = do_match(ms, si + 1, ep + 1)
          if res then return res end
        end
        p = ep + 1
      elseif q == 42 then -- *
        return max_expand(ms, si, p, ep)
      elseif q == 43 then -- +
        if not m then return nil end
        return max_expand(ms, si + 1, p, ep)
      elseif q == 45 then -- -
        return min_expand(ms, si, p, ep)
      else
        if not m then return nil end
        si = si + 1
        p = ep
      end
    end
  end
end

local function get_capture(ms, i, si, e)
  if i > ms.level then
    if i == 1 then return ssub(ms.src, si, e - 1) end -- the whole match
    error("invalid capture index", 0)
  end
  local l = ms.clen[i]
  if l == CAP_UNFINISHED then error("unfinished capture", 0) end
  if l == CAP_POSITION then return ms.cstart[i] end
  return ssub(ms.src, ms.cstart[i], ms.cstart[i] + l - 1)
end

local function push_captures(ms, si, e, whole)
  local n = (ms.level == 0 and whole) and 1 or ms.level
  local out = {}
  for i = 1, n do out[i] = get_capture(ms, i, si, e) end
  return out, n
end

local unpack = unpack

local function new_state(s, p)
  return { src = s, slen = #s, pat = p, plen = #p, level = 0, cstart = {}, clen = {} }
end

local function check_str(v, n, fname)
  local t = type(v)
  if t == "string" then return v end
  if t == "number" then return tostring(v) end
  error(("bad argument #%d to '%s' (string expected, got %s)"):format(n, fname, t), 3)
end

local function posrelat(pos, len)
  if pos < 0 then pos = len + pos + 1 end
  return pos >= 0 and pos or 0
end

-- what makes a pattern (as in the C version: ')' and ']' alone do not)
local SPECIALS = "[%^%$%*%+%?%.%(%[%%%-]"

local function str_find_aux(find, s, p, init, plain)
  local fname = find and "find" or "match"
  s = check_str(s, 1, fname)
  p = check_str(p, 2, fname)
  init = posrelat(init == nil and 1 or (tonumber(init) or error("bad argument #3 to '" .. fname .. "' (number expected)", 2)), #s)
  if init < 1 then init = 1 end
  if init > #s + 1 then return nil end
  if find and (plain or not c_find(p, SPECIALS)) then
    -- no specials: a plain search (linear)
    return c_find(s, p, init, true)
  end
  local anchor = sbyte(p, 1) == 94
  local pstart = anchor and 2 or 1
  local si = init
  repeat
    local ms = new_state(s, p)
    ms.plen = #p
    local e = do_match(ms, si, pstart)
    if e then
      if find then
        local caps, n = push_captures(ms, nil, 0, false)
        return si, e - 1, unpack(caps, 1, n)
      end
      local caps, n = push_captures(ms, si, e, true)
      return unpack(caps, 1, n)
    end
    si = si + 1
  until anchor or si > #s + 1
  return nil
end

local function find(s, p, init, plain) return str_find_aux(true, s, p, init, plain) end
local function match(s, p, init) return str_find_aux(false, s, p, init) end

local function gmatch(s, p)
  s = check_str(s, 1, "gmatch")
  p = check_str(p, 2, "gmatch")
  local si = 1
  return function()
    while si <= #s + 1 do
      local ms = new_state(s, p)
      local e = do_match(ms, si, 1)
      if e then
        local start = si
        si = (e == si) and si + 1 or e
        local caps, n = push_captures(ms, start, e, true)
        return unpack(caps, 1, n)
      end
      si = si + 1
    end
    return nil
  end
end

local function add_value(ms, b, si, e, repl, tr)
  local value
  if tr == "string" then
    local out, i, n = {}, 1, #repl
    while i <= n do
      local c = sbyte(repl, i)
      if c == L_ESC then
        i = i + 1
        local d = sbyte(repl, i)
        if d and is_digit(d) then
          if d == 48 then
            out[#out + 1] = ssub(ms.src, si, e - 1)
          else
            local v = get_capture(ms, d - 48, si, e)
            out[#out + 1] = tostring(v)
          end
        else
          out[#out + 1] = d and schar(d) or ""
        end
      else
        out[#out + 1] = schar(c)
      end
      i = i + 1
    end
    b[#b + 1] = tconcat(out)
    return
  end
  local cap = get_capture(ms, 1, si, e)
  if tr == "table" then
    value = repl[cap]
  else
    local caps, n = push_captures(ms, si, e, true)
    value = repl(unpack(caps, 1, n))
  end
  if not value then
    b[#b + 1] = ssub(ms.src, si, e - 1) -- keep the original
  elseif type(value) == "string" or type(value) == "number" then
    b[#b + 1] = tostring(value)
  else
    error("invalid replacement value (a " .. type(value) .. ")", 0)
  end
end

local function gsub(s, p, repl, max_n)
  s = check_str(s, 1, "gsub")
  p = check_str(p, 2, "gsub")
  local tr = type(repl)
  if tr == "number" then repl, tr = tostring(repl), "string" end
  if tr ~= "string" and tr ~= "table" and tr ~= "function" then
    error("bad argument #3 to 'gsub' (string/function/table expected)", 2)
  end
  max_n = max_n == nil and #s + 1 or tonumber(max_n)
  local anchor = sbyte(p, 1) == 94
  local pstart = anchor and 2 or 1
  local si, n, b = 1, 0, {}
  while n < max_n do
    local ms = new_state(s, p)
    local e = do_match(ms, si, pstart)
    if e then
      n = n + 1
      add_value(ms, b, si, e, repl, tr)
    end
    if e and e > si then
      si = e
    elseif si <= #s then
      b[#b + 1] = ssub(s, si, si)
      si = si + 1
    else
      break
    end
    if anchor then break end
  end
  if si <= #s then b[#b + 1] = ssub(s, si) end
  return tconcat(b), n
end

-- Installs the four into the string table str (the real one of the state,
-- which is also what method calls on strings reach) and returns them.
return function(str)
  str.find, str.match, str.gmatch, str.gsub = find, match, gmatch, gsub
  return { find = find, match = match, gmatch = gmatch, gsub = gsub }
end
