-- codec_spec.lua: the value codec roundtrips every Lua value it accepts,
-- keeps numbers exact, refuses what it cannot encode with exact messages, and
-- rejects hostile input without crashing.
-- Run: luajit /usr/bin/busted --lpath='lua/?.lua;lua/?/init.lua' --cpath='lua/?.so' spec/codec_spec.lua
local codec = require "lecho.core"

local function roundtrip(v, opts)
  local s, err = codec.encode(v, opts)
  assert(s, err)
  assert(codec.validate(s))
  local ok, r = codec.decode(s, opts)
  assert(ok, r)
  return r, s
end

-- string-building helpers for hand-made wire bytes
local function varint(n)
  local t = {}
  repeat
    local b = n % 128
    n = (n - b) / 128
    t[#t + 1] = string.char(n > 0 and b + 128 or b)
  until n == 0
  return table.concat(t)
end

local function is_negzero(x) return x == 0 and 1 / x < 0 end

describe("codec roundtrip", function()
  it("keeps nil and booleans", function()
    assert.is_nil(roundtrip(nil))
    assert.is_true(roundtrip(true))
    assert.is_false(roundtrip(false))
  end)

  it("keeps 0 and the sign of -0.0", function()
    local z, s = roundtrip(0)
    assert.equal(0, z)
    assert.is_false(is_negzero(z))
    assert.equal("\3\0", s)
    local nz, ns = roundtrip(-0.0)
    assert.is_true(is_negzero(nz))
    assert.equal(9, #ns)
  end)

  it("keeps integers up to 2^53 exact, in the integer form", function()
    for _, x in ipairs { 1, -1, 63, -64, 64, 2^31, -2^31, 2^32 + 1, 2^53, -2^53, 2^53 - 1 } do
      local r, s = roundtrip(x)
      assert.equal(x, r)
      assert.equal(3, s:byte(1))
    end
  end)

  it("keeps large, fractional and special doubles", function()
    for _, x in ipairs { 2^53 + 2, -(2^53 + 2), 1.5, -1.5, 0.1, 1e308, 5e-324, 2^63, math.huge, -math.huge } do
      local r, s = roundtrip(x)
      assert.equal(x, r)
      assert.equal(4, s:byte(1))
      assert.equal(9, #s)
    end
    local nan = roundtrip(0 / 0)
    assert.is_true(nan ~= nan)
  end)

  it("keeps strings binary safe", function()
    assert.equal("", roundtrip(""))
    assert.equal("a\0b\0", roundtrip("a\0b\0"))
    local all = {}
    for i = 0, 255 do all[#all + 1] = string.char(i) end
    all = table.concat(all)
    assert.equal(all, roundtrip(all))
  end)

  it("roundtrips a 16 MiB string, copied and pinned", function()
    local big = string.rep("0123456789abcdef", 1024 * 1024)
    assert.equal(big, roundtrip(big))
    local r, s = roundtrip({ big, x = big }, { pin_threshold = 4096 })
    assert.equal(big, r[1])
    assert.equal(big, r.x)
    assert.equal(2 * #big + 3 + 2 * 5 + 3, #s) -- header, tags+lengths, "x" key
  end)

  it("keeps nested arrays, maps and mixed tables", function()
    local v = {
      1, 2, "three", { 4, { 5, { 6 } } },
      name = "ev", nested = { deep = { deeper = { true, false } } },
      list = { { id = 1 }, { id = 2, tags = { "a", "b" } } },
      empty = {},
    }
    assert.same(v, roundtrip(v))
  end)

  it("keeps holes: t[1], t[3]", function()
    local r, s = roundtrip({ [1] = "a", [3] = "c" })
    assert.same({ [1] = "a", [3] = "c" }, r)
    assert.is_nil(r[2])
    assert.equal("\6\1\1", s:sub(1, 3)) -- narr = 1 ("a"), nhash = 1 ([3] = "c")
    -- a constructor hole: objlen may say 3, the array part stops at the nil
    local r2, s2 = roundtrip({ 1, nil, 3 })
    assert.same({ 1, nil, 3 }, r2)
    assert.equal("\6\1\1", s2:sub(1, 3))
    assert.same({ 1, 2, nil, nil, 5, x = 1 }, roundtrip({ 1, 2, nil, nil, 5, x = 1 }))
  end)

  it("keeps boolean, float and negative keys, and tables as keys", function()
    local v = { [true] = "t", [false] = "f", [1.5] = "x", [-1] = "m", [0] = "z", [2^60] = "big" }
    assert.same(v, roundtrip(v))
    local k = { 1 }
    local r = roundtrip({ [k] = "v" })
    local key, val = next(r)
    assert.same({ 1 }, key)
    assert.equal("v", val)
  end)

  it("encodes shared (non-cyclic) subtables twice", function()
    local shared = { 1, 2 }
    local r = roundtrip({ a = shared, b = shared })
    assert.same({ 1, 2 }, r.a)
    assert.same({ 1, 2 }, r.b)
  end)

  it("ignores metatables", function()
    local v = setmetatable({ 1 }, { __index = function() return "meta" end, __len = function() return 5 end })
    local r = roundtrip(v)
    assert.same({ 1 }, r)
    assert.is_nil(getmetatable(r))
  end)

  it("writes the documented bytes for a small table", function()
    local s = assert(codec.encode({ 10, "hi" }))
    assert.equal("\6\2\0\3\20\5\2hi", s)
  end)
end)

describe("codec encode errors", function()
  it("refuses functions with a location", function()
    assert.same({ nil, "cannot encode a function at ev", "invalid" }, { codec.encode(print) })
    assert.same({ nil, "cannot encode a function at ev.cb", "invalid" }, { codec.encode({ cb = print }) })
    assert.same({ nil, "cannot encode a function at ev[3].x", "invalid" },
      { codec.encode({ 1, 2, { x = print } }) })
    assert.same({ nil, 'cannot encode a function at ev["a b"][2.5]', "invalid" },
      { codec.encode({ ["a b"] = { [2.5] = print } }) })
    assert.same({ nil, "cannot encode a function at ev[<function key>]", "invalid" },
      { codec.encode({ [print] = 1 }) })
  end)

  it("refuses userdata, coroutines and lightuserdata-like values", function()
    assert.same({ nil, "cannot encode a userdata at ev.out", "invalid" }, { codec.encode({ out = io.stdout }) })
    assert.same({ nil, "cannot encode a thread at ev.co", "invalid" },
      { codec.encode({ co = coroutine.create(function() end) }) })
  end)

  it("refuses cycles", function()
    local t = {}
    t.self = t
    assert.same({ nil, "cannot encode a cycle at ev.self", "invalid" }, { codec.encode(t) })
    local a, b = {}, {}
    a[1] = { b }
    b.back = a
    assert.same({ nil, "cannot encode a cycle at ev[1][1].back", "invalid" }, { codec.encode(a) })
  end)

  it("limits depth to 100 nested tables by default", function()
    local function nest(n)
      local t = {}
      for _ = 2, n do t = { t } end
      return t
    end
    assert.truthy(codec.encode(nest(100)))
    assert.same({ nil, "nesting too deep (limit 100)", "limit" }, { codec.encode(nest(101)) })
    assert.same({ nil, "nesting too deep (limit 3)", "limit" }, { codec.encode(nest(4), { max_depth = 3 }) })
    assert.truthy(codec.encode(nest(500), { max_depth = 500 }))
    assert.same({ nil, "nesting too deep (limit 1000)", "limit" },
      { codec.encode(nest(1001), { max_depth = 1e9 }) }) -- clamped
  end)

  it("limits string length, inclusive", function()
    assert.truthy(codec.encode(("x"):rep(10), { max_string = 10 }))
    assert.same({ nil, "string too long (11 bytes, limit 10) at ev", "limit" },
      { codec.encode(("x"):rep(11), { max_string = 10 }) })
    assert.same({ nil, "string too long (11 bytes, limit 10) at ev.payload", "limit" },
      { codec.encode({ payload = ("x"):rep(11) }, { max_string = 10, pin_threshold = 4 }) })
  end)

  it("raises on bad options", function()
    assert.has_error(function() codec.encode(1, { max_depth = -1 }) end,
      "bad option 'max_depth' (non-negative number expected)")
    assert.has_error(function() codec.encode(1, { max_string = "x" }) end,
      "bad option 'max_string' (non-negative number expected)")
  end)

  it("releases pinned strings after an error", function()
    -- many failing encodes with pinning must not leak registry references
    local big = ("p"):rep(100)
    local reg = debug.getregistry()
    local before = #reg
    for _ = 1, 1000 do
      assert.is_nil(codec.encode({ big, big, print }, { pin_threshold = 10 }))
      assert.truthy(codec.encode({ big, big }, { pin_threshold = 10 }))
    end
    assert.is_true(#reg <= before + 2)
  end)
end)

describe("codec decode errors", function()
  local function derr(s, opts)
    local ok, err = codec.decode(s, opts)
    assert.is_nil(ok)
    return err
  end

  it("reports truncated input", function()
    assert.equal("truncated input", derr(""))
    assert.equal("truncated input", derr("\5\5abc"))
    assert.equal("truncated input", derr("\4\0\0\0"))
    assert.equal("truncated input", derr("\3\128"))
    assert.equal("truncated input", derr("\6\1"))
    local s = assert(codec.encode({ 1, 2, { a = "xyz" } }))
    for i = 0, #s - 1 do
      local e = derr(s:sub(1, i))
      assert.is_true(e == "truncated input" or e == "table count exceeds input", e)
    end
  end)

  it("reports trailing garbage with its size", function()
    assert.equal("trailing garbage after value (3 bytes)", derr("\0abc"))
    assert.equal("trailing garbage after value (1 bytes)", derr(assert(codec.encode({ 1 })) .. "\0"))
  end)

  it("reports unknown tags with their offset", function()
    assert.equal("unknown tag 0x08 at byte 0", derr("\8"))
    assert.equal("unknown tag 0xff at byte 3", derr("\6\1\0\255"))
  end)

  it("reports invalid varints", function()
    assert.equal("invalid varint", derr("\5" .. ("\255"):rep(9) .. "\2"))
    assert.equal("invalid varint", derr("\3" .. ("\128"):rep(10) .. "\0"))
  end)

  it("refuses absurd lengths and counts without allocating", function()
    assert.equal("string too long (18446744073709551615 bytes, limit 268435456)",
      derr("\5" .. ("\255"):rep(9) .. "\1"))
    assert.equal("truncated input", derr("\5" .. varint(1e6) .. "abc"))
    assert.equal("string too long (4 bytes, limit 3)", derr("\5\4abcd", { max_string = 3 }))
    assert.equal("table count exceeds input", derr("\6" .. ("\255"):rep(9) .. "\1\0"))
    assert.equal("table count exceeds input", derr("\6\0" .. varint(2^40)))
    assert.equal("table count exceeds input", derr("\6" .. varint(1e9) .. varint(1e9) .. ("\0"):rep(100)))
  end)

  it("refuses depth bombs", function()
    local bomb = ("\6\1\0"):rep(100000) .. "\0"
    assert.equal("nesting too deep (limit 100)", derr(bomb))
    assert.equal("nesting too deep (limit 1000)", derr(bomb, { max_depth = 5000 }))
    assert.equal("nesting too deep (limit 2)", derr("\6\1\0\6\1\0\6\0\0", { max_depth = 2 }))
  end)

  it("refuses nil and NaN keys", function()
    assert.equal("nil or NaN table key", derr("\6\0\1\0\2"))
    assert.equal("nil or NaN table key", derr("\6\0\1\4\0\0\0\0\0\0\248\127\2"))
  end)

  it("accepts what a C peer may write", function()
    -- nil inside the array part, an explicit integer key, duplicate keys
    local ok, v = codec.decode("\6\3\1\3\2\0\3\6\3\6\5\1x")
    assert.is_true(ok)
    assert.equal(1, v[1])
    assert.is_nil(v[2])
    assert.equal("x", v[3])
    -- non-minimal varint
    ok, v = codec.decode("\3\130\0")
    assert.is_true(ok)
    assert.equal(1, v)
    -- decode returns true, nil for an encoded nil
    assert.same({ true, nil }, { codec.decode("\0") })
  end)

  it("agrees with validate on mutated input and never crashes", function()
    local seed = assert(codec.encode({ 1, -2.5, "str", { a = true, b = { 1, 2 } }, [10] = false }))
    local rnd = 12345
    local function r(n) rnd = (rnd * 1103515245 + 12345) % 2147483648; return rnd % n end
    for _ = 1, 20000 do
      local b = { seed:byte(1, -1) }
      for _ = 1, 1 + r(3) do b[1 + r(#b)] = r(256) end
      local s = string.char(unpack(b))
      local ok = codec.decode(s)
      assert.equal(ok == true, codec.validate(s) == true)
    end
  end)

  it("validate reports static messages", function()
    assert.is_true(codec.validate("\0"))
    assert.same({ nil, "trailing garbage after value" }, { codec.validate("\0\0") })
    assert.same({ nil, "unknown tag" }, { codec.validate("\9") })
    assert.same({ nil, "nesting too deep" }, { codec.validate("\6\1\0\6\0\0", { max_depth = 1 }) })
  end)
end)
