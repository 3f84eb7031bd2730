-- lecho.fastenc must write exactly the bytes of the C encoder, or decline.
local core = require "lecho.core"
local fastenc = require "lecho.fastenc"

-- A deterministic generator (no dependence on math.random's state).
local function rng(seed)
  local x = seed
  return function(n)
    x = (x * 1103515245 + 12345) % 2147483648
    return x % n
  end
end

local NUMS = { 0, 1, -1, 63, 64, -64, -65, 127, 128, 300, -300, 2^31, -2^31, 2^32 + 1,
               2^49, -2^49, 2^50 - 1, -(2^50 - 1), 2^53, -2^53, 2^53 + 2, 1e300, -1e300,
               0.5, -0.25, 1 / 3, math.huge, -math.huge, 0 / 0, -0.0, 5e-324 }

local function gen(r, depth)
  local k = r(depth > 3 and 6 or 8)
  if k == 0 then return nil
  elseif k == 1 then return r(2) == 0
  elseif k == 2 then return NUMS[r(#NUMS) + 1]
  elseif k == 3 then return r(100000) - 50000
  elseif k == 4 then
    local n = r(20)
    local t = {}
    for i = 1, n do t[i] = string.char(r(256)) end
    return table.concat(t)
  elseif k == 5 then return ("s"):rep(r(300))
  else
    local t = {}
    local n = r(12)
    for i = 1, n do t[i] = gen(r, depth + 1) end   -- may leave holes (nil)
    for _ = 1, r(6) do
      local kk = r(4)
      local key = kk == 0 and ("k" .. r(50)) or kk == 1 and r(30) + 1 or kk == 2 and r(1000) / 7
                  or (r(2) == 0)
      t[key] = gen(r, depth + 1)
    end
    if r(5) == 0 then t[n + 2] = 1 end             -- a key past a hole
    return t
  end
end

describe("lecho.fastenc", function()
  local enc = fastenc.new{}

  it("is available here (LuaJIT 2.1 with string.buffer)", function()
    assert.is_true(fastenc.available and true or false)
  end)

  it("writes the C encoder's bytes for 20000 random values, declining few", function()
    local r = rng(42)
    local declined = 0
    for i = 1, 20000 do
      local v = gen(r, 0)
      local want = assert(core.encode(v))
      local got = enc(v)
      if got == nil then
        declined = declined + 1
      elseif got ~= want then
        error(("value %d: fastenc and the C encoder differ (%d vs %d bytes)"):format(i, #got, #want))
      end
    end
    assert.is_true(declined < 200, "declined " .. declined)   -- only 2^50..2^53 integers
  end)

  it("declines what the C encoder must handle: pins, limits, cycles, bad types", function()
    local small = fastenc.new{ max_depth = 3, max_string = 10, pin = 8 }
    assert.is_nil(small(("x"):rep(8)))                      -- to pin
    assert.is_nil(fastenc.new{ max_string = 10, pin = 0 }(("x"):rep(11)))  -- over max_string
    assert.is_nil(small({ { { { 1 } } } }))                -- too deep
    local cyc = {}
    cyc[1] = cyc
    assert.is_nil(enc(cyc))
    assert.is_nil(enc({ 1, function() end }))
    assert.is_nil(enc(2^52))                                 -- integer the C side writes as int
    assert.are.equal(core.encode(2^53 + 2), enc(2^53 + 2))  -- beyond: a double on both sides
    assert.are.equal(core.encode({ 1, 2, 3 }), small({ 1, 2, 3 }))
  end)

  -- fastenc counts keys with this C function (a compiled Lua loop over
  -- `next` is not trusted, an interpreted one kept the encoder from compiling)
  it("counts keys with lecho.core's count_keys as a Lua loop does", function()
    local function lua_count(t, len)
      local nkeys, nin = 0, 0
      for k in next, t do
        nkeys = nkeys + 1
        if type(k) == "number" and k >= 1 and k <= len and k == math.floor(k) then nin = nin + 1 end
      end
      return nkeys, nin
    end
    if jit then jit.off(lua_count) end -- the reference stays interpreted
    local r = rng(7)
    local cases = { {}, { 1, 2, 3 }, { 1, nil, 3 }, { a = 1, [2.5] = 2, [true] = 3, [4] = 4 },
                    setmetatable({ 1 }, { __index = function() return 1 end, __pairs = error }) }
    for _ = 1, 300 do cases[#cases + 1] = gen(r, 2) end
    for i, t in ipairs(cases) do
      if type(t) == "table" then
        for _, len in ipairs{ #t, 0, 3, 2^40 } do
          local a, b = core.count_keys(t, len)
          local c, d = lua_count(t, len)
          assert(a == c and b == d, ("case %d len %s: %s %s, want %s %s"):format(i, len, a, b, c, d))
        end
      end
    end
    assert.has_error(function() core.count_keys("x", 1) end)
  end)

  it("round-trips through the decoder", function()
    local v = { kind = "x", n = { 1, 2.5, -3 }, ok = true, nested = { a = { b = { "c" } } } }
    local ok, back = core.decode(enc(v))
    assert.is_true(ok)
    assert.are.same(v, back)
  end)

  -- Found by review: once LuaJIT compiled a timer that submits, the first
  -- event of many ticks arrived as {} (its keys counted as none), with a
  -- valid seq and submit true.  The encoder now checks what it writes.
  it("never sends a table without its entries once the submitting code is compiled", function()
    -- In a process of its own, as a program runs (under busted the traces differ).
    local S = require "spec.support"
    local child = S.lua([[
local lecho = require "lecho"
local ctx = lecho.context{ quiet = true }
local ch = ctx:channel("x")
local got, empty, first = 0, 0, nil
ch:consumer(function(ev, meta)
  got = got + 1
  if ev.s ~= meta.seq then empty = empty + 1; first = first or ("seq %d arrived with s=%s next(ev)=%s"):format(meta.seq, tostring(ev.s), tostring(next(ev))) end
end)
local p = ch:producer()
local n, last, maxlag = 0, ctx:now(), 0
local tm = ctx:every(0.01, function()
  local lag = ctx:now() - last; if lag > maxlag then maxlag = lag end; last = ctx:now()
  for _ = 1, 20 do
    if p:submit({ s = n + 1, from = "p1", pad = ("p"):rep(100) }) then n = n + 1 end
  end
end)
local t0 = ctx:now()
while ctx:now() - t0 < 3 do ctx:run_once(0.1) end
tm:stop()
local ok = p:submit_sync({ s = n + 1, from = "p1" })
print(("submitted %d sync %s got %d bad %d first %s"):format(n + 1, tostring(ok), got, empty, tostring(first)))
ctx:close()
]])
    assert(S.wait(child, 30), "child did not finish: " .. S.errors(child))
    local out = S.output(child)
    local n, ok, got, bad = out:match("submitted (%d+) sync (%a+) got (%d+) bad (%d+)")
    assert(n, out .. S.errors(child))
    S.cleanup()
    assert.are.equal("true", ok)
    assert.is_true(tonumber(n) > 1000)
    assert.are.equal(n, got)
    assert.are.equal("0", bad, out)
  end)
end)
