-- lecho.gateway.wire: what the gateway sends its clients, each event
-- encoded once whatever the number of clients (doc/gateway.md): the JSON
-- text of events and replies (lecho.jsonw, every number exact; strings
-- that are not UTF-8 as { ["$hex"] = HEX }), and the binary WebSocket
-- message of an event or a reply holding arrays (a JSON header, then the
-- elements raw at offsets a multiple of 8: doc/gateway.md "Arrays"); and
-- the one cjson instance the gateway reads its clients' messages with
-- (M.json, M.decode, M.null, M.denull).  No sockets, no state: lecho.gateway.client
-- queues what this makes, lecho.gateway.ops hands it events.
-- Leans on lecho.jsonw, lecho.array, lecho.ws (its UTF-8 check).

local ffi = require "ffi"
local buffer = require "string.buffer"
local ws = require "lecho.ws"

local M = {}

-- JSON: an instance of our own (settings not shared with other modules).
local cj = require("cjson").new()
cj.encode_invalid_numbers("null")
cj.encode_sparse_array(true)
cj.decode_max_depth(32)
cj.decode_invalid_numbers(false)   -- Infinity, NaN, 0x10: refused (M.decode)
cj.encode_max_depth(64)
local null = cj.null

-- A decoded value with JSON nulls removed (lecho values have no null).
local function denull(v, depth)
  if v == null then return nil end
  if type(v) ~= "table" then return v end
  if depth > 32 then return nil end
  local t = {}
  for k, x in pairs(v) do
    if x ~= null then t[k] = denull(x, depth + 1) end
  end
  return t
end

-- A value whose strings are not all UTF-8: each such string becomes
-- { ["$hex"] = HEX } (a text frame must be UTF-8; doc/gateway.md).
local function hexify(v, depth)
  if type(v) == "string" then
    if ws.valid_utf8(v) then return v end
    return { ["$hex"] = (v:gsub(".", function(c) return ("%02x"):format(c:byte()) end)) }
  end
  if type(v) ~= "table" or depth > 64 then return v end
  local t = setmetatable({}, getmetatable(v))   -- (a jsonw.list stays one)
  for k, x in pairs(v) do t[type(k) == "string" and (ws.valid_utf8(k) and k or hexify(k, 99)["$hex"]) or k] = hexify(x, depth + 1) end
  return t
end

-- JSON text of values: lecho.jsonw (every number exact: issue 29 F2;
-- arrays as { dtype, shape, data }: data the elements, flat, row-major,
-- doc/gateway.md); NaN and infinities as null, as cjson was set to.
local array = require "lecho.array"
local jsonw = require "lecho.jsonw"
local JSONW = { nonfinite = "null", null = null }
local function jencode(v) return jsonw.encode(v, JSONW) end

local function has_array(v, depth)
  if array.is(v) then return true end
  if type(v) ~= "table" or depth > 64 then return false end
  for _, x in pairs(v) do if has_array(x, depth + 1) then return true end end
  return false
end

--- The JSON text of an event on channel `ch` for clients (encoded once,
-- whatever the number of clients).
function M.event_json(ch, ev)
  local ok, s = pcall(jencode, ev)
  if ok and not ws.valid_utf8(s) then ok, s = pcall(jencode, hexify(ev, 0)) end
  if not ok then
    return ('{"ch":%s,"error":%s}'):format(cj.encode(ch), cj.encode("event not representable in JSON: " .. tostring(s)))
  end
  return ('{"ch":%s,"ev":%s}'):format(cj.encode(ch), s)
end

-- The event without its arrays (nil where each was), and list filled with
-- { path, array } per array: path the keys from the top (doc/gateway.md);
-- hole: what is left where an array was (nil, or JSON null for a reply).
local function strip(v, path, list, depth, hole)
  if array.is(v) then
    list[#list + 1] = { path, v }
    return hole
  end
  if type(v) ~= "table" or depth > 64 then return v end
  local t = {}
  for k, x in pairs(v) do
    local p = { unpack(path) }
    p[#p + 1] = k
    t[k] = strip(x, p, list, depth + 1, hole)
  end
  return t
end

local U32 = ffi.new("uint8_t[4]")
local ZERO8 = ("\0"):rep(8)

-- Debian's LuaJIT (2.1.0~beta3+git20220320) has upstream issues #827 and
-- #829: a compiled or blacklisted pairs/next loop may stop early or crash.
-- These walk every event of every channel, recursively, with pairs: an early
-- stop in has_array would send an array event down the JSON path (an outside
-- review saw a long-running gateway do exactly that, never reproduced);
-- interpreted, they are exact.
for _, f in ipairs{ denull, hexify, has_array, strip } do jit.off(f) end

-- The binary message of list's arrays ({ path, array } each, from strip)
-- under a header: head(ARRAYS) is the header's JSON text given the JSON
-- list of the arrays' descriptions.  An array met twice (a service's first
-- result, also in results) is carried once, both paths at its offset.
local function pack(list, head)
  local parts, off, at = {}, 0, {}
  local function list_json(t) return #t == 0 and "[]" or cj.encode(t) end
  for i, pa in ipairs(list) do
    local a = pa[2]
    local n = a:count() * a:itemsize()
    local ok, path = pcall(list_json, pa[1])
    if ok and not ws.valid_utf8(path) then ok, path = pcall(list_json, hexify(pa[1], 0)) end
    if not ok then path = "[]" end
    local o = at[a]
    if not o then
      o = off
      at[a] = o
      pa[3] = n
      off = off + n + (-n) % 8
    end
    parts[i] = ('{"path":%s,"dtype":%s,"shape":%s,"offset":%d,"bytes":%d}'):format(
      path, cj.encode(a:dtype()), list_json(a:shape()), o, n)
  end
  local h = head("[" .. table.concat(parts, ",") .. "]")
  local L = #h
  U32[0], U32[1], U32[2], U32[3] = L % 256, math.floor(L / 256) % 256, math.floor(L / 65536) % 256,
    math.floor(L / 16777216) % 256
  local b = buffer.new(8 + L + off)
  b:putcdata(U32, 4):put(h, ZERO8:sub(1, (-(4 + L)) % 8))
  for _, pa in ipairs(list) do
    local n = pa[3]
    if n then
      local a = pa[2]
      if not a:contiguous() then a = a:copy() end
      if n > 0 then b:putcdata(a:ptr(), n) end
      b:put(ZERO8:sub(1, (-n) % 8))
    end
  end
  return b:tostring()
end

-- The JSON text of v (a table) with its strings made UTF-8, or nil, why.
local function json_of(v)
  local ok, e = pcall(jencode, v)
  if ok and not ws.valid_utf8(e) then ok, e = pcall(jencode, hexify(v, 0)) end
  if not ok then return nil, tostring(e) end
  return e
end

--- The binary WebSocket message of an event holding arrays (lecho.array),
-- encoded once for every WebSocket client (doc/gateway.md "Arrays"): a
-- u32 little-endian length L, L bytes of a JSON header
-- {"ch":..,"ev":THE EVENT WITHOUT ITS ARRAYS,"arrays":[{"path":[..],
-- "dtype":"<f8","shape":[..],"offset":O,"bytes":B},..]}, zero bytes up to a
-- multiple of 8, then each array's elements (little-endian, row-major) at
-- O bytes past that point (O a multiple of 8): a browser views them in
-- place (new Float64Array(buf, base + O, B / 8)).  The elements are copied
-- once, from the read buffer into this message.  nil, the error text for
-- an event whose other fields JSON cannot represent.
function M.event_binary(ch, ev)
  local list = {}
  local rest = strip(ev, {}, list, 0)
  local evj = ""
  if rest ~= nil then
    local e, why = json_of(rest)
    if not e then
      return nil, ('{"ch":%s,"error":%s}'):format(cj.encode(ch), cj.encode("event not representable in JSON: " .. why))
    end
    evj = ',"ev":' .. e
  end
  return pack(list, function(arrays) return ('{"ch":%s%s,"arrays":%s}'):format(cj.encode(ch), evj, arrays) end)
end

--- A reply (a table: id, ok, result, results...) holding arrays as one
-- binary message, laid out as an event's (doc/gateway.md "Arrays"): the
-- header is the reply without its arrays plus "arrays", each array's path
-- from the reply's top (["result","a"], ["results",1,"a"]).  nil when the
-- rest is not representable in JSON.
function M.reply_binary(t)
  local list = {}
  local rest = strip(t, {}, list, 0, null)
  local e = json_of(rest)
  if not e or e:sub(-1) ~= "}" or e == "{}" then return nil end
  return pack(list, function(arrays) return e:sub(1, -2) .. ',"arrays":' .. arrays .. "}" end)
end

--- What an event goes out as: (text for JSON-lines clients, message for
-- WebSocket clients, binary: whether that message is a binary one), each
-- made at most once (lazily: text only when asked), whatever the number of
-- clients.
function M.event_out(ch, ev)
  if not has_array(ev, 0) then
    local t = M.event_json(ch, ev)
    return function() return t end, t, false
  end
  local bin, errtext = M.event_binary(ch, ev)
  local text
  local function lines()
    if not text then text = M.event_json(ch, ev) end
    return text
  end
  if not bin then return lines, errtext, false end
  return lines, bin, true
end

-- The JSON text of a reply (a table), or an error reply saying why it
-- cannot be one.
local function encode(t)
  local ok, s = pcall(jencode, t)
  if ok and not ws.valid_utf8(s) then ok, s = pcall(jencode, hexify(t, 0)) end
  if not ok then
    return cj.encode{ id = t.id, error = "reply not representable in JSON: " .. tostring(s), code = "failed" }
  end
  return s
end

-- Client JSON: a number token must be a JSON number, must not overflow a
-- double (1e400 would arrive as inf: a JSON reader's null), and a whole
-- number past 2^53 must not arrive rounded (lecho numbers are doubles:
-- 9007199254740993 would arrive as ...992, nothing said): written as
-- digits, every digit counts and it must be a double exactly (2^60 is);
-- written with a fraction or an exponent (9.007199254740993e15), its
-- significant digits must be kept (the double printed to as many digits
-- gives them back: 6.022e23, 9.9999999999999992e22 do, and 15 digits or
-- fewer always do; a number that is not whole is a float, rounded to the
-- nearest double as JSON means).  Only a run of 16 digits or
-- a digit before an e/E can make a number refused: a run of 16 holds an
-- aligned 8-byte block of digits, and one 64-bit load per 8 bytes finds
-- those (high nibbles 3, and still 3 after adding 6 to each byte:
-- 0x30-0x39), and a block holding an e or E (its bytes OR 0x20 compared
-- with 'e') is looked at byte by byte; a pattern find of 16 %d took 8 us a
-- KiB, a byte loop 4 us.  A suspect text then costs the exact scan, which
-- skips strings (refused: the token, why).
-- The request path: +0.1-0.3 us per message of 80 B-1 KiB (cjson.decode
-- 0.5-6 us), +2.5 us for 60 floats of 17 digits.
local u64p = ffi.typeof("const uint64_t *")
local bit = require "bit"
local band, bor, bxor, bnot, lshift, rshift = bit.band, bit.bor, bit.bxor, bit.bnot, bit.lshift, bit.rshift
local M30, MF0, M0F, P06 = 0x3030303030303030ULL, 0xF0F0F0F0F0F0F0F0ULL, 0x0F0F0F0F0F0F0F0FULL, 0x0606060606060606ULL
local M20, M65, M7F, M80 = 0x2020202020202020ULL, 0x6565656565656565ULL, 0x7F7F7F7F7F7F7F7FULL, 0x8080808080808080ULL
local function isdigit(c) return c and c >= 48 and c <= 57 end
local NUM_BEFORE = { [91] = true, [58] = true, [44] = true, [32] = true, [9] = true, [10] = true, [13] = true }   -- [ : , and space
local NUM_AFTER = { [93] = true, [125] = true, [44] = true, [32] = true, [9] = true, [10] = true, [13] = true }   -- ] } , and space
-- The high bit of each zero byte of v (exact: no borrow between bytes).
local function zeros(v) return band(bnot(bor(band(v, M7F) + M7F, v)), M80) end
-- Is there a run of 16 or more digits that stands as an integer token (not
-- in a fraction, an exponent or a string's start: 0.30000000000000004 and
-- "9007199254740993" are not) and changes when printed back, or one
-- followed by a fraction or an exponent, or a digit followed by an e or E
-- anywhere (an exponent)?  Then the exact scan below decides (the run, the
-- e, may still be inside a string).  Per 8-byte block: all digits (high
-- nibbles 3, still 3 after adding 6 to each byte), else E marks its e and
-- E bytes (OR 0x20, compared with 'e'), and only a block holding one has
-- D, its digits, made (high nibble 3, low nibble + 6 no carry): a digit
-- before an e is D shifted by one byte (little-endian) AND E, or the
-- previous block's last byte before an e in byte 0.
local function suspect(text)
  local n = #text
  local p = ffi.cast(u64p, text)
  local i, nb = 0, rshift(n, 3)
  while i < nb do
    local x = p[i]
    if band(x, MF0) == M30 and band(x + P06, MF0) == M30 then
      local a, b = i * 8 + 1, i * 8 + 8   -- the run around block i (1-based)
      while isdigit(text:byte(a - 1)) do a = a - 1 end
      while isdigit(text:byte(b + 1)) do b = b + 1 end
      local after = text:byte(b + 1)
      if after == 101 or after == 69 then return true end   -- e E: an exponent
      if b - a + 1 >= 16 then
        if after == 46 then return true end   -- a fraction
        local c = text:byte(a - 1)
        if c == 45 then c = text:byte(a - 2) end   -- a sign
        if (a == 1 or NUM_BEFORE[c]) and (b == n or NUM_AFTER[after]) then
          local digits = text:sub(a, b):gsub("^0+", "")
          if #digits > 15 and ("%.0f"):format(tonumber(digits)) ~= digits then return true end
        end
      end
      i = rshift(b, 3)   -- the block of the byte after the run (not all digits: looked at for an e)
    else
      local E = zeros(bxor(bor(x, M20), M65))
      if E ~= 0ULL then
        local D = zeros(bor(bxor(band(x, MF0), M30), band(band(x, M0F) + P06, MF0)))
        if band(lshift(D, 8), E) ~= 0ULL or (band(E, 0x80ULL) ~= 0ULL and isdigit(text:byte(i * 8))) then return true end
      end
      i = i + 1
    end
  end
  for k = nb * 8 + 1, n do   -- the last bytes, past the 8-byte blocks
    local c = text:byte(k)
    if (c == 101 or c == 69) and isdigit(text:byte(k - 1)) then return true end
  end
  return false
end

local TWO53 = 2 ^ 53
-- Significant digits and the power of ten of a number's text (no sign):
-- "9.007199254740993e15" is "9007199254740993", 0; "6.022e23" "6022", 20;
-- zero is "", 0.
local function decimal(s)
  local int, frac, ex = s:match("^(%d*)%.?(%d*)[eE]?([%+%-]?%d*)$")
  local d, e = (int or "") .. (frac or ""), (tonumber(ex) or 0) - #(frac or "")
  d = d:gsub("^0+", "")
  local z = #d:match("0*$")
  if z > 0 then d, e = d:sub(1, -z - 1), e + z end
  if d == "" then e = 0 end
  return d, e
end

-- Why the number token tok may not be taken, or nil.
local function refused(tok)
  local v = tonumber(tok)
  if not v then return nil end
  local a = math.abs(v)
  if a == math.huge then return "overflow" end
  if a < TWO53 then return nil end   -- a whole number below 2^53 is a double exactly
  if not tok:find("[%.eE]") then   -- digits: a double exactly (2^60 is)
    local digits = tok:gsub("^%-", ""):gsub("^0+", "")
    if ("%.0f"):format(a) ~= digits then return "inexact" end
    return nil
  end
  local d, e = decimal(tok:gsub("^%-", ""))
  if e < 0 or #d <= 15 then return nil end   -- not whole (a float), or 15 digits: a double keeps them
  if #d > 780 then return "inexact" end      -- more digits than a double's exact expansion has
  -- the double printed to as many significant digits as were written
  local sd, se = decimal((("%." .. (#d - 1) .. "e"):format(a)))
  if sd == d and se == e then return nil end
  return "inexact"
end

local function inexact(text)
  if not suspect(text) then return nil end
  local pos = 1
  while true do
    local s = text:find('["%-%d]', pos)
    if not s then return nil end
    if text:byte(s) == 34 then   -- a string: to its closing quote
      local p = s + 1
      while true do
        local q = text:find('["\\]', p)
        if not q then return nil end
        if text:byte(q) == 92 then p = q + 2 else pos = q + 1; break end
      end
    else                         -- a number (outside strings, only numbers hold digits)
      local _, e = text:find("^%-?%d+%.?%d*", s)
      if not e then pos = s + 1
      else
        local _, e2 = text:find("^[eE][%+%-]?%d+", e + 1)
        e = e2 or e
        local tok = text:sub(s, e)
        local why = refused(tok)
        if why then return tok, why end
        pos = e + 1
      end
    end
  end
end

-- A token for an error text: a long one cut (a client's 10,000 digits are
-- not sent back whole).
local function cut(tok)
  if #tok <= 40 then return tok end
  return ("%s...%s (%d characters)"):format(tok:sub(1, 24), tok:sub(-8), #tok)
end

-- The id of a request that cjson refused at character `at` (a token such
-- as Infinity, NaN or 0x10): each bad token read as null, at most 8, then
-- the object's id if it has one now.
local function id_of(text, at)
  for _ = 1, 8 do
    local tok = text:match("^[%w%.%+%-]+", at)
    if not tok then return nil end
    text = text:sub(1, at - 1) .. "null" .. text:sub(at + #tok)
    local ok, m = pcall(cj.decode, text)
    if ok then return type(m) == "table" and m.id or nil end
    at = tonumber(tostring(m):match("invalid %a+ at character (%d+)"))
    if not at then return nil end
  end
end

-- The id of a request cjson refused for any other reason (a bad escape
-- such as \ud800, a missing comma): the value of the key "id" of the
-- top-level object, read before the fault, if it is a number or a string
-- without escapes; a scan that skips strings and counts depth, so an "id"
-- inside the data is not taken.  Only on a refused request (bounded by the
-- message limit).
local function top_id(text)
  if not text:find("^%s*{") then return nil end
  local depth, pos, expect_key = 0, 1, false
  while true do
    local s = text:find('[{}%[%]",]', pos)
    if not s then return nil end
    local c = text:byte(s)
    if c == 34 then                           -- a string: to its closing quote
      local p, q = s + 1, nil
      while true do
        q = text:find('["\\]', p)
        if not q then return nil end
        if text:byte(q) == 92 then p = q + 2 else break end
      end
      if depth == 1 and expect_key and text:sub(s + 1, q - 1) == "id" then
        local v = text:match("^%s*:%s*(%-?%d+%.?%d*[eE]?[%+%-]?%d*)%s*[,}]", q + 1)
        if v then return tonumber(v) end
        v = text:match('^%s*:%s*"([^"\\]*)"', q + 1)
        return v
      end
      expect_key, pos = false, q + 1
    else
      if c == 123 or c == 91 then depth = depth + 1
      elseif c == 125 or c == 93 then depth = depth - 1
        if depth <= 0 then return nil end
      end
      expect_key, pos = depth == 1 and (c == 123 or c == 44), s + 1
    end
  end
end

--- A client's JSON text decoded, or nil, why (for an error reply, code
-- invalid), the request's id when it could be read (the reply carries it):
-- cjson's reason, "not a JSON number: Infinity", "number 1e400 is beyond a
-- double's range (it would be Infinity)" or "integer N is not exactly
-- representable (|n| > 2^53)" (a long N cut).
function M.decode(text)
  local ok, m = pcall(cj.decode, text)
  if not ok then
    local at = tostring(m):match("invalid %a+ at character (%d+)")
    local tok = at and text:match("^[%w%.%+%-]+", tonumber(at))
    if tok and (tok:find("^[%+%-]?[Ii][Nn][Ff]") or tok:find("^[%+%-]?[Nn][Aa][Nn]") or tok:find("^[%+%-]?0[xX]")) then
      return nil, "not a JSON number: " .. cut(tok), id_of(text, tonumber(at)) or top_id(text)
    end
    return nil, "not a JSON object: " .. tostring(m), top_id(text)
  end
  local big, why = inexact(text)
  if big then
    local id = type(m) == "table" and m.id or nil
    if why == "overflow" then
      return nil, ("number %s is beyond a double's range (it would be Infinity)"):format(cut(big)), id
    end
    return nil, ("integer %s is not exactly representable (|n| > 2^53)"):format(cut(big)), id
  end
  return m
end

M.json, M.null = cj, null
M.denull, M.has_array, M.encode = denull, has_array, encode

return M
