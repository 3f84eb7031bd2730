-- lecho.gateway.wire: what the gateway sends its clients, each event
-- encoded once whatever the number of clients (doc/gateway.md): the JSON
-- text of events and replies (lecho.jsonw, every number exact; strings
-- that are not UTF-8 as { ["$hex"] = HEX }), and the binary WebSocket
-- message of an event or a reply holding arrays (a JSON header, then the
-- elements raw at offsets a multiple of 8: doc/gateway.md "Arrays"); and
-- the one cjson instance the gateway reads its clients' messages with
-- (M.json, M.null, M.denull).  No sockets, no state: lecho.gateway.client
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

M.json, M.null = cj, null
M.denull, M.has_array, M.encode = denull, has_array, encode

return M
