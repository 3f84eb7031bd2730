-- Arrays (issue 24): typed n-D arrays travel between processes as raw
-- bytes (doc/wire-format.md, tag 0x07).  Real processes, busy loops
-- beside them: a Lua producer's arrays of every dtype inside tables reach a
-- Lua consumer with every element right, small ones copied and large ones
-- as views into the read buffer that end with their handler (unless kept)
-- and survive a handler's wait; an FFI array is submitted without a copy
-- (its memory is what the frame's iovec reads, and the array keeps it
-- alive); an old peer (protocol version 2) is refused at the handshake.
local S = require "spec.support"
local lecho = require "lecho"
local array = lecho.array
local ffi = require "ffi"
local cjson = require "cjson"

-- The value of element k (0-based, row-major) of an array of dtype d and
-- element count n: exact in that dtype, both ends of its range included.
local GEN = [[
  local RANGE = { ["<u1"] = { 0, 255 }, ["<i1"] = { -128, 127 }, ["<u2"] = { 0, 65535 },
                  ["<i2"] = { -32768, 32767 }, ["<u4"] = { 0, 2 ^ 32 - 1 }, ["<i4"] = { -2 ^ 31, 2 ^ 31 - 1 },
                  ["<u8"] = { 0, 2 ^ 52 }, ["<i8"] = { -2 ^ 52, 2 ^ 52 }, ["<f4"] = { -2 ^ 100, 2 ^ 100 },
                  ["<f8"] = { -1e300, 1e300 } }
  local function elem(d, k, n, seed)
    local lo, hi = RANGE[d][1], RANGE[d][2]
    if k == 0 then return lo elseif k == n - 1 then return hi end
    local x = (k * 7919 + seed * 104729) % 1000
    if d == "<f4" then return (x - 500) * 0.25 end -- exact in a float
    if d == "<f8" then return (x - 500) / 3 end
    return lo + (x % (math.min(hi - lo, 999) + 1))
  end
  local function shape_of(i) -- small (copied) and large (views) in turn, 1 to 3 dims
    local shapes = { { 3 }, { 64, 80 }, { 2, 3, 4 }, { 9000 }, { 0, 5 }, { 20, 30, 16 } }
    return shapes[i % #shapes + 1]
  end
]]
local elem, shape_of = assert(loadstring(GEN .. " return elem, shape_of"))()

local function count_of(shape)
  local n = 1
  for _, d in ipairs(shape) do n = n * d end
  return n
end

-- Every element of a (a lecho.array) is what GEN says: nil, or a message.
local function check(a, d, shape, seed)
  if a:dtype() ~= d then return "dtype " .. a:dtype() end
  if table.concat(a:shape(), "x") ~= table.concat(shape, "x") then return "shape " .. table.concat(a:shape(), "x") end
  local n = count_of(shape)
  local p = a:ptr()
  for k = 0, n - 1 do
    local want = elem(d, k, n, seed)
    if tonumber(p[k]) ~= want then return ("element %d: %s, want %s"):format(k, tostring(p[k]), want) end
  end
end

-- A child producing on `chan`: for i = 1..n, for each dtype, the event
-- { step = i, dt = d, field = ARRAY, note = "x" } (then a sync "end").
local PRODUCER = GEN .. [[
  local lecho = require "lecho"
  local array = lecho.array
  local ns, chan, n = arg[1], arg[2], tonumber(arg[3])
  local ctx = lecho.context{ nameserver = ns, quiet = true }
  local p = assert(ctx:channel(chan):producer())
  for i = 1, n do
    for _, d in ipairs(array.dtypes) do
      local shape = shape_of(i)
      local a = array.new(d, shape)
      local cnt = 1
      for _, x in ipairs(shape) do cnt = cnt * x end
      local ptr = a:ptr()
      for k = 0, cnt - 1 do ptr[k] = elem(d, k, cnt, i) end
      assert(p:submit({ step = i, dt = d, field = a, note = "x" }))
    end
  end
  io.write("sent ", tostring(p:submit_sync("end", { timeout = 20 })), "\n")
  io.flush()
  ctx:close()
]]

describe("arrays between processes", function()
  local ns, ctx
  before_each(function() ns, ctx = S.world() end)
  after_each(function() S.end_world(ctx); ctx = nil end)

  it("reach a consumer in another process with every element of every dtype, inside tables, beside busy loops", function()
    local ch = ctx:channel("fields")
    local bad, got, kept, copies, stored = {}, 0, {}, {}, {}
    local ended = false
    local waited = 0
    assert(ch:consumer(function(ev)
      if ev == "end" then ended = true return end
      got = got + 1
      local shape = shape_of(ev.step)
      if ev.note ~= "x" then bad[#bad + 1] = "note" end
      -- one event in 25 waits before it looks: the view must be kept
      if got % 25 == 0 then
        ctx:sleep(0.01)
        waited = waited + 1
      end
      local why = check(ev.field, ev.dt, shape, ev.step)
      if why then bad[#bad + 1] = ("step %d %s: %s"):format(ev.step, ev.dt, why) end
      if ev.dt == "<f8" then
        stored[#stored + 1] = { a = ev.field, n = count_of(shape), waited = got % 25 == 0 }
        copies[#copies + 1] = { a = ev.field:copy(), step = ev.step }
        kept[#kept + 1] = { a = ev.field:keep(), step = ev.step, sub = ev.field:box({ 1 }) }
      end
    end))
    local busy = {}
    for i = 1, 2 do busy[i] = S.lua("local t = os.time() + 30 while os.time() < t do end") end
    local N = 12
    local prod = S.lua(PRODUCER, ns, "fields", N)
    assert.is_true(S.run_until(ctx, function() return ended end, 60), S.errors(prod))
    for _, b in ipairs(busy) do S.kill(b, "KILL") end
    assert.are.same({}, bad)
    assert.are.equal(N * #array.dtypes, got)
    assert.is_true(waited >= 1)
    -- keep() and copy() hold the elements after the handler returned
    for _, c in ipairs(copies) do
      assert.is_nil(check(c.a, "<f8", shape_of(c.step), c.step))
    end
    for _, k in ipairs(kept) do
      assert.is_nil(check(k.a, "<f8", shape_of(k.step), k.step))
    end
  end)

  it("a large received array is a view that ends with its handler unless kept; a small one is a copy", function()
    local ch = ctx:channel("views")
    local stored, sub, small, kept
    local done = false
    assert(ch:consumer(function(ev)
      if ev == "end" then done = true return end
      if ev.dt ~= "<f8" then return end
      if ev.step == 1 then -- 64x80 doubles: a view
        stored = ev.field
        sub = ev.field:box({ 1, 1 }, { 2, 2 })
        assert.are.equal(elem("<f8", 81, 64 * 80, 1), sub:get(0, 0))
      elseif ev.step == 2 then -- 2x3x4 doubles: copied as decoded
        small = ev.field
      elseif ev.step == 3 then -- 9000 doubles, kept
        kept = ev.field:keep()
      end
    end))
    local prod = S.lua(PRODUCER, ns, "views", 3)
    assert.is_true(S.run_until(ctx, function() return done end, 30), S.errors(prod))
    -- ended: every touch raises, naming the cause (never freed memory,
    -- never an empty array passing for the data); a submit refuses it
    local GONE = "lecho.array: this array was a view into a received event whose handler has returned: "
      .. "its bytes are gone (call a:keep() or a:copy() inside the handler to hold it longer)"
    for name, touch in pairs({
      len = function() return #stored end, sublen = function() return #sub end,
      ptr = function() return stored:ptr() end, get = function() return stored:get(0, 0) end,
      index = function() return sub[0] end, set = function() stored:set(0, 0, 1) end,
      shape = function() return stored:shape() end, count = function() return sub:count() end,
      dtype = function() return stored:dtype() end, strides = function() return stored:strides() end,
      ndim = function() return stored:ndim() end, totable = function() return stored:totable() end,
      copy = function() return stored:copy() end, keep = function() return sub:keep() end,
      contiguous = function() return stored:contiguous() end, box = function() return stored:box(0) end,
      stats = function() return stored:stats() end, reduce = function() return sub:reduce(2) end,
      zstd = function() return stored:zstd() end, view = function() return array.summary(stored) end,
    }) do
      local ok, err = pcall(touch)
      if name == "view" then -- the printer says what it is
        assert.truthy(ok and err:find("(ended view)", 1, true), name)
      else
        assert.is_false(ok, name)
        assert.truthy(tostring(err):find(GONE, 1, true), name .. ": " .. tostring(err))
      end
    end
    local p = assert(ctx:channel("loop"):producer())
    local ok, err = p:submit({ f = stored })
    assert.is_nil(ok)
    assert.truthy(err:find("handler returned", 1, true), err)
    assert.is_nil(check(small, "<f8", { 2, 3, 4 }, 2))
    assert.is_nil(check(kept, "<f8", { 9000 }, 3))
  end)

  it("reads 8 MiB frames a few bytes larger each time into the buffer of the last one: no page faults per event", function()
    -- The drained buffer of a large frame (or an adopted one given back) is
    -- the next large frame's; one byte more than it had room for made that
    -- frame grow a fresh buffer from 512 KiB by copies: 2048+ page faults
    -- per event.  Arrays kept by a handler that waits too (their read
    -- buffers adopted, given back when let go of).
    local N = 14
    local cons = S.lua([[
      local ffi = require "ffi"
      ffi.cdef[[
        struct lecho_tv { long s, us; };
        struct lecho_ru { struct lecho_tv u, s; long maxrss, ixrss, idrss, isrss, minflt, rest[9]; };
        int getrusage(int who, struct lecho_ru *r);
      ]] .. "]]" .. [[
      local function minflt()
        local r = ffi.new("struct lecho_ru")
        ffi.C.getrusage(0, r)
        return tonumber(r.minflt)
      end
      local lecho = require "lecho"
      local ctx = lecho.context{ nameserver = arg[1], quiet = true }
      local flt, bad, held, last = {}, 0, nil, minflt()
      assert(ctx:channel("grow"):consumer(function(ev)
        if ev == "end" then
          io.write("bad ", bad, " faults ", table.concat(flt, " "), "\n")
          io.flush()
          ctx:stop()
          return
        end
        local f = ev.field
        if f:get(0) ~= ev.step or f:get(#f - 1) ~= ev.step + #f - 1 or #ev.note ~= ev.step then bad = bad + 1 end
        -- a handler that waits keeps its views: the read buffer is handed
        -- over (adopted, no copy), and given back once let go of
        if ev.keep then ctx:sleep(0); held = f end   -- the one before is let go of
        local now = minflt()
        flt[#flt + 1] = now - last
        last = now
      end))
      io.write("ready\n")
      io.flush()
      ctx:run()
      ctx:close()
    ]], ns)
    assert(S.wait_file(cons.out, "ready", 30), S.errors(cons))
    local p = assert(ctx:channel("grow"):producer())
    local f = array.new("<f8", { 1024 * 1024 })
    local fp = f:ptr()
    for step = 1, N do
      for i = 0, #f - 1 do fp[i] = step + i end
      -- one byte longer each time; sync: f is written again only after
      assert(p:submit_sync({ step = step, note = ("x"):rep(step), keep = step > 7 or nil, field = f },
                           { timeout = 20 }))
    end
    assert(p:submit_sync("end", { timeout = 20 }))
    assert(S.wait(cons, 20, ctx), S.output(cons) .. S.errors(cons))
    local out = S.output(cons)
    local bad, faults = out:match("bad (%d+) faults ([%d ]+)")
    assert(bad, out .. S.errors(cons))
    assert.are.equal("0", bad)
    local flt = {}
    for x in faults:gmatch("%d+") do flt[#flt + 1] = tonumber(x) end
    assert.are.equal(N, #flt, out)
    -- steps 3..7 read into the buffer of the one before (not kept), steps
    -- 11..14 into one given back (kept, the one before let go of; the
    -- first kept ones take buffers of their own)
    local per = {}
    for i = 3, 7 do per[#per + 1] = flt[i] end
    for i = 11, N do per[#per + 1] = flt[i] end
    -- a fresh 8 MiB buffer is 2048 pages of 4 KiB; allow some faults of
    -- the Lua heap and the like
    table.sort(per)
    assert.is_true(per[#per] < 256, "page faults per event: " .. faults)
  end)

  it("an event its handlers let go of is not held until the next one comes (its read buffer can come back)", function()
    -- The dispatcher's coroutine kept the last event in its locals while it
    -- waited for the next: a kept array its program let go of (an adopted
    -- read buffer) could not be collected before the next event's frame
    -- needed a buffer, which was then read into another one.
    local seen = setmetatable({}, { __mode = "k" })
    local n = 0
    assert(ctx:channel("letgo"):consumer(function(ev)
      seen[ev] = true
      seen[ev.field] = true
      n = n + 1
    end))
    local prod = S.lua([[
      local lecho = require "lecho"
      local ctx = lecho.context{ nameserver = arg[1], quiet = true }
      local p = assert(ctx:channel("letgo"):producer())
      local f = lecho.array.new("<f8", { 65536 })  -- 512 KiB: a view, adopted when kept
      for step = 1, 2 do assert(p:submit_sync({ step = step, field = f }, { timeout = 20 })) end
      io.write("sent\n")
      io.flush()
      ctx:sleep(30)
    ]], ns)
    assert.is_true(S.run_until(ctx, function() return n == 2 end, 30), S.errors(prod))
    for _ = 1, 3 do ctx:run_once(0.01) end
    collectgarbage()
    collectgarbage()
    local left = 0
    for _ in pairs(seen) do left = left + 1 end
    assert.are.equal(0, left)
  end)

  it("sends an FFI array without copying it: the frame reads the array's memory, which the array keeps alive", function()
    local N = 4 * 1024 * 1024 -- 32 MiB: more than a socket takes at once
    local got = S.lua([[
      local lecho = require "lecho"
      io.stdout:setvbuf("no")
      local ctx = lecho.context{ nameserver = arg[1], quiet = true }
      local n, N = 0, tonumber(arg[2])
      assert(ctx:channel("ffi"):consumer(function(ev)
        n = n + 1
        local p = ev.a:ptr()
        local ok = ev.a:dtype() == "<f8" and #ev.a == N
        for k = 0, N - 2 do if p[k] ~= k * 0.5 then ok = false break end end
        print(("got %d last %s ok %s"):format(n, tostring(p[N - 1]), tostring(ok)))
        if n == 2 then ctx:stop() end
      end))
      print("ready")
      ctx:after(40, function() ctx:stop() end)
      ctx:run()
      ctx:close()
    ]], ns, N)
    assert(S.wait_file(got.out, "ready", 20), S.errors(got))
    local p = assert(ctx:channel("ffi"):producer())
    local c = ffi.new("double[?]", N)
    for k = 0, N - 1 do c[k] = k * 0.5 end
    local a = array.wrap(c, "<f8")
    assert.are.same({ N }, a:shape())
    -- up and running: the first sync submit that the consumer acknowledges
    assert.is_true(S.run_until(ctx, function() return p:submit_sync({ a = a }, { timeout = 10 }) == true end, 30))
    -- 1: the last element changed after the async submit, before the loop
    -- wrote the rest of the frame, arrives changed: the bytes were not
    -- copied at the submit (what the socket did not take is still queued)
    assert(p:submit({ a = a }))
    local _, _, queued = ctx.c:pending()
    assert.is_true(queued > 0, "the socket took the whole frame at once: nothing left to show")
    c[N - 1] = 42
    -- 2: nothing else holds the memory now: the queued event's array does
    a, c = nil, nil
    collectgarbage()
    collectgarbage()
    assert.is_true(S.wait(got, 40, ctx), S.errors(got))
    local out = S.output(got)
    assert.truthy(out:find(("got 1 last %s ok true"):format(tostring((N - 1) * 0.5)), 1, true), out .. S.errors(got))
    assert.truthy(out:find("got 2 last 42 ok true", 1, true), out .. S.errors(got))
  end)
end)

describe("a peer of protocol version 2 (no arrays)", function()
  it("is refused at the handshake with the versions named", function()
    local R = require "spec.support.rogue"
    local ctx = lecho.context{ quiet = true }
    local logs = {}
    ctx.log = function(m) logs[#logs + 1] = m end
    local socket = require "socket"
    local host, port = ctx.addr:match("^(.+):(%d+)$")
    local s = assert(socket.tcp())
    s:settimeout(5)
    assert(s:connect(host, tonumber(port)))
    local peer = S.refusing_addr()
    s:send(R.frame(R.F.HELLO, R.hello_body({ version = 2, incarnation = 7, addr = peer, mode = 0 })))
    local buf = ""
    S.run_until(ctx, function()
      s:settimeout(0)
      local d, err, part = s:receive(4096)
      buf = buf .. (d or part or "")
      return err == "closed"
    end, 5)
    s:close()
    ctx:close()
    local t, body = R.parse_frame(buf, 1)
    assert.are.equal(R.F.ERROR, t)
    assert.are.equal("protocol version mismatch: peer speaks 2, this side speaks 3", body)
  end)
end)

-- Issue 24, item 4: the array operations in C, in modulators (under their
-- budget and memory cap) and at the consumer (the same code).
describe("array operations in a modulator", function()
  local ctx
  before_each(function() ctx = lecho.context{ quiet = true, modulator_budget = 0.02, modulators_cpu = 0 } end)
  after_each(function() ctx:close{ linger = 0 } S.cleanup() end)

  it("select a box, block-reduce and summarize a field, with the results a consumer computes itself", function()
    local ch = ctx:channel("field")
    local got = {}
    assert(ch:consumer(function(ev) got[#got + 1] = ev end, { modulator = [[
      function enqueue(ev)
        local f = ev.field
        local mn, mx, sum, mean = f:stats()
        return { step = ev.step, roi = f:box({ 8, 16 }, { 4, 5 }, { 2, 3 }):copy(),
                 means = f:reduce(4, "mean"), maxes = array.reduce(f, { 3, 5 }, "max"),
                 sums = f:reduce({ 64, 1 }, "sum"), mins = f:reduce(8, "min"),
                 stats = { mn, mx, sum, mean }, n = #f, dt = f:dtype(), shape = f:shape(),
                 one = f:get(10, 20), view = tostring(f:box(1)) }
      end]] }))
    local p = assert(ch:producer())
    local f = array.new("<f8", { 64, 48 })
    for i = 0, 63 do for j = 0, 47 do f:set(i, j, ((i * 31 + j * 17) % 101) - 50.5) end end
    assert.is_true(p:submit_sync({ step = 1, field = f }, { timeout = 5 }))
    local r = got[1]
    assert.are.equal(64 * 48, r.n)
    assert.are.equal("<f8", r.dt)
    assert.are.same({ 64, 48 }, r.shape)
    assert.are.equal(f:get(10, 20), r.one)
    assert.are.equal("lecho.array <f8 [63,47]", r.view)
    -- the box
    assert.are.same({ 4, 5 }, r.roi:shape())
    for i = 0, 3 do for j = 0, 4 do assert.are.equal(f:get(8 + 2 * i, 16 + 3 * j), r.roi:get(i, j)) end end
    -- the reductions, against loops here
    local function block(k1, k2, op)
      local out = {}
      for bi = 0, math.ceil(64 / k1) - 1 do
        out[bi + 1] = {}
        for bj = 0, math.ceil(48 / k2) - 1 do
          local acc, n = op == "min" and math.huge or op == "max" and -math.huge or 0, 0
          for i = bi * k1, math.min(64, (bi + 1) * k1) - 1 do
            for j = bj * k2, math.min(48, (bj + 1) * k2) - 1 do
              local x = f:get(i, j)
              n = n + 1
              if op == "min" then acc = math.min(acc, x) elseif op == "max" then acc = math.max(acc, x) else acc = acc + x end
            end
          end
          out[bi + 1][bj + 1] = op == "mean" and acc / n or acc
        end
      end
      return out
    end
    local function near(want, got_t)
      for i = 1, #want do for j = 1, #want[i] do
        assert.is_true(math.abs(want[i][j] - got_t[i][j]) < 1e-9, ("[%d][%d] %s vs %s"):format(i, j, want[i][j], got_t[i][j]))
      end end
      assert.are.equal(#want, #got_t)
    end
    near(block(4, 4, "mean"), r.means:totable())
    near(block(3, 5, "max"), r.maxes:totable())
    near(block(64, 1, "sum"), r.sums:totable())
    near(block(8, 8, "min"), r.mins:totable())
    local mn, mx, sum, mean = f:stats()
    assert.are.same({ mn, mx, sum, mean }, r.stats)
    local s = 0
    for i = 0, 63 do for j = 0, 47 do s = s + f:get(i, j) end end
    assert.is_true(math.abs(s - sum) < 1e-6)
  end)

  it("send only what moved (delta against what the stream sent, patched back by the demodulator) and quantized fields", function()
    local ch = ctx:channel("diff")
    local have, worst, qworst, steps, bytes_delta = nil, 0, 0, 0, 0
    local sent = {}
    local TH, SCALE, OFF = 0.05, 0.01, -100
    assert(ch:consumer(function(ev, meta)
      if ev.key then have = ev.key:copy() else have:patch(ev.idx, ev.vals) bytes_delta = bytes_delta + #ev.idx * 12 end
      local src = sent[ev.step]
      local q = ev.q:dequantize(SCALE, OFF)
      for i = 0, #src - 1 do
        worst = math.max(worst, math.abs(have[i] - src[i]))
        qworst = math.max(qworst, math.abs(q[i] - src[i]))
      end
      assert.are.equal("<u2", ev.q:dtype())
      steps = steps + 1
    end, { params = { th = TH, scale = SCALE, offset = OFF }, modulator = [[
      local ref
      function enqueue(ev)
        local q = ev.field:quantize("<u2", params.scale, params.offset)
        if not ref then ref = ev.field:copy() return { step = ev.step, key = ref, q = q } end
        local idx, vals = ev.field:delta(ref, params.th)
        return { step = ev.step, idx = idx, vals = vals, q = q }
      end]] }))
    local p = assert(ch:producer())
    local N = 4096
    local f = array.new("<f8", { N })
    for step = 1, 20 do
      local ptr = f:ptr()
      for i = 0, N - 1 do -- a slow drift, and a bump that moves
        ptr[i] = math.sin(i / 200 + step * 0.0005) * 10 + (math.abs(i - step * 150) < 40 and 5 or 0)
      end
      sent[step] = f:copy()
      assert.is_true(p:submit_sync({ step = step, field = f }, { timeout = 5 }))
    end
    assert.are.equal(20, steps)
    assert.is_true(worst <= TH, "delta error " .. worst)
    assert.is_true(qworst <= SCALE / 2 + 1e-12, "quantization error " .. qworst)
    -- what moved is far less than the whole field each step
    assert.is_true(bytes_delta < 19 * N * 8 / 2, "delta bytes " .. bytes_delta)
  end)

  it("refuse a patch from a hostile stream: an index out of range changes nothing", function()
    local ref = array.from({ 1, 2, 3 })
    assert.has_error(function() ref:patch(array.from({ 1, 3 }, "<u4"), array.from({ 9, 9 })) end)
    assert.has_error(function() ref:patch(array.from({ 1 }, "<u4"), array.from({ 9 }, "<f4")) end)
    assert.has_error(function() ref:patch(array.from({ 0.5 }, "<f8"), array.from({ 9 })) end)
    assert.are.same({ 1, 2, 3 }, ref:totable())
  end)

  it("end a loop of operations when the budget runs out", function()
    local ch = ctx:channel("hog")
    local errs = {}
    assert(ch:consumer(function() end, { modulator = [[
      local a   -- made in the first call: its 4 MiB under make asan took more than the
                -- 20 ms budget of the install (asan10: the error came before the submit)
      function enqueue(ev) a = a or array.new("<f8", { 2 ^ 19 }) for i = 1, 5000 do a:stats() end return ev end]],
      on_error = function(e) errs[#errs + 1] = e end }))
    local p = assert(ch:producer())
    S.run_until(ctx, function() return false end, 0.3) -- installed
    assert.are.same({}, errs)
    -- CPU time of this process from the submit to the modulator's end
    local t0 = os.clock()
    p:submit(1)
    S.run_until(ctx, function() return #errs > 0 end, 20)
    local spent = os.clock() - t0
    assert.matches("CPU budget", errs[1] or "none")
    -- 5,000 passes over 4 MiB take 2 s, and the count hook alone would stop
    -- the loop after some 1,600 of them (0.6 s): the budget (20 ms) ended it
    assert.is_true(spent < 0.3, ("the modulator ran %.3f s of CPU"):format(spent))
  end)
end)

describe("the REPL's printer", function()
  it("shows an array as dtype, shape, min/max/mean and the first values, never a million numbers", function()
    local P = require "lecho.repl.pretty"
    local a = array.new("<f8", { 1000, 1000 })
    local p = a:ptr()
    for i = 0, 999999 do p[i] = i end
    local s = P.pretty({ step = 3, field = a })
    assert.truthy(s:find("<lecho.array <f8 [1000,1000] min=0 max=999999 mean=500000 {0, 1, 2, 3, 4, 5, 6, 7, ...}>", 1, true), s)
    assert.is_true(#s < 300, s)
  end)
end)

describe("array operations against plain loops", function()
  it("agree on random shapes, dtypes, boxes and strides (views of views included)", function()
    math.randomseed(24)
    local ops = { "mean", "min", "max", "sum" }
    for trial = 1, 150 do
      local nd = math.random(1, 3)
      local shape = {}
      for d = 1, nd do shape[d] = math.random(1, 9) end
      local dt = array.dtypes[math.random(1, #array.dtypes)]
      local a = array.new(dt, shape)
      local n = #a
      local p = a:ptr()
      for k = 0, n - 1 do p[k] = math.random(0, 100) end
      -- a random box with steps, then maybe a box of that
      local start, count, step = {}, {}, {}
      for d = 1, nd do
        start[d] = math.random(0, shape[d] - 1)
        step[d] = math.random(1, 3)
        count[d] = math.random(1, math.floor((shape[d] - 1 - start[d]) / step[d]) + 1)
      end
      local v = a:box(start, count, step)
      if math.random() < 0.5 then v = v:box(nil, nil, 1) end
      -- element (i...) of v is a's (start + i*step ...)
      local function at(idx)
        local t = {}
        for d = 1, nd do t[d] = start[d] + idx[d] * step[d] end
        return a:get(unpack(t))
      end
      local vals, idxs = {}, {}
      local function walk(d, idx)
        if d > nd then
          local x = at(idx)
          vals[#vals + 1] = x
          idxs[#idxs + 1] = { unpack(idx) }
          assert.are.equal(x, v:get(unpack(idx)))
          return
        end
        for i = 0, count[d] - 1 do idx[d] = i walk(d + 1, idx) end
      end
      walk(1, {})
      local mn, mx, sum = math.huge, -math.huge, 0
      for _, x in ipairs(vals) do mn = math.min(mn, x) mx = math.max(mx, x) sum = sum + x end
      local smn, smx, ssum, smean = v:stats()
      assert.are.same({ mn, mx, sum, sum / #vals }, { smn, smx, ssum, smean })
      -- copy keeps the order
      local c = v:copy()
      local cp = c:ptr()
      for i, x in ipairs(vals) do assert.are.equal(x, tonumber(cp[i - 1])) end
      -- block reduce of the view by random k
      local k = {}
      for d = 1, nd do k[d] = math.random(1, 4) end
      local op = ops[math.random(1, 4)]
      local r = v:reduce(k, op)
      local acc, cnt = {}, {}
      for i, idx in ipairs(idxs) do
        local key = {}
        for d = 1, nd do key[d] = math.floor(idx[d] / k[d]) end
        local s = table.concat(key, ",")
        local x = vals[i]
        if acc[s] == nil then acc[s], cnt[s] = x, 1
        else
          cnt[s] = cnt[s] + 1
          if op == "min" then acc[s] = math.min(acc[s], x) elseif op == "max" then acc[s] = math.max(acc[s], x)
          else acc[s] = acc[s] + x end
        end
      end
      for s, x in pairs(acc) do
        local key = {}
        for w in s:gmatch("%d+") do key[#key + 1] = tonumber(w) end
        local want = op == "mean" and x / cnt[s] or x
        assert.is_true(math.abs(r:get(unpack(key)) - want) < 1e-9, ("trial %d %s %s"):format(trial, op, s))
      end
    end
  end)
end)

-- C consumers (lecho.h) of a Lua producer's arrays, and the C side sending
-- them back: a C program built against build/liblecho.so.
local C_CONSUMER = [[
#include <lecho.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
static long n, bad, misaligned;
static lecho_producer *back;
static const char *handler(const lecho_value *ev, const lecho_meta *meta, void *ud) {
    lecho_array_info ai;
    double step;
    (void)meta;
    if (lecho_type(ev, NULL) == LECHO_TSTRING) { lecho_stop(ud); return NULL; }
    if (lecho_get_number(ev, "step", &step) != 0 || lecho_get_array(ev, "field", &ai) != 0) { bad++; return "no field"; }
    if ((uintptr_t)ai.data % ai.itemsize) misaligned++;
    if (strcmp(ai.dtype, "<f8") != 0 || ai.ndim != 2) { bad++; return "dtype"; }
    const double *d = ai.data;
    for (size_t i = 0; i < ai.count; i++) if (d[i] != step * 1000 + (double)i) { bad++; break; }
    n++;
    /* and back: the same field, lent (the submit copies it) */
    lecho_value *out = lecho_value_new(ud);
    lecho_set_number(out, "step", step);
    lecho_set_array(out, "field", "<f8", ai.ndim, ai.shape, ai.data, NULL, NULL);
    if (lecho_submit(back, out) != 0) bad++;
    lecho_value_free(out);
    return NULL;
}
int main(int argc, char **argv) {
    const char *opts[] = { "nameserver", argv[1], "quiet", "true", NULL };
    lecho_ctx *ctx;
    lecho_consumer *c;
    char err[256];
    (void)argc;
    if (lecho_open(opts, &ctx, err, sizeof err) != 0) { fprintf(stderr, "%s\n", err); return 1; }
    /* from inside a handler only a producer that never waits may submit */
    if (lecho_producer_open(lecho_channel_get(ctx, "back"), "drop_newest", &back) != 0 ||
        lecho_consumer_open(lecho_channel_get(ctx, "tocee"), handler, ctx, &c) != 0) {
        fprintf(stderr, "%s\n", lecho_errmsg(ctx));
        return 1;
    }
    printf("ready\n");
    fflush(stdout);
    lecho_run(ctx);
    printf("got %ld bad %ld misaligned %ld\n", n, bad, misaligned);
    lecho_close(ctx, 5);
    return 0;
}
]]

-- A C consumer of large arrays sent async: they come through the C sink
-- (lua_sink.c), read in place in the read buffer; one stored past its
-- handler (lecho_set_value, lecho_field) keeps its elements.  Page faults
-- per event tell a copy (an 8 MiB array copied into fresh memory: ~2048
-- faults each) from a view.
local C_BIG = [[
#include <lecho.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
static long n, bad, first_flt, last_flt;
static lecho_value *kept, *kept_field;
static long minflt(void) { struct rusage ru; getrusage(RUSAGE_SELF, &ru); return ru.ru_minflt; }
static const char *handler(const lecho_value *ev, const lecho_meta *meta, void *ud) {
    lecho_array_info ai;
    double step;
    (void)meta;
    if (lecho_type(ev, NULL) == LECHO_TSTRING) { lecho_stop(ud); return NULL; }
    if (lecho_type(ev, NULL) == LECHO_TNIL) return NULL; /* the producer's pace */
    if (lecho_get_number(ev, "step", &step) != 0 || lecho_get_array(ev, "field", &ai) != 0) { bad++; return "no field"; }
    const double *d = ai.data;
    if (d[0] != step || d[ai.count - 1] != step + (double)(ai.count - 1)) bad++;
    if (++n == 4) first_flt = minflt(); /* after step 3's keep (one copy) */
    last_flt = minflt();
    /* stored past the handler: its arrays get memory of their own */
    if (step == 3) { lecho_set_value(kept, NULL, ev); kept_field = lecho_field(ev, "field", 0); }
    return NULL;
}
int main(int argc, char **argv) {
    const char *opts[] = { "nameserver", argv[1], "quiet", "true", NULL };
    lecho_ctx *ctx;
    lecho_consumer *c;
    char err[256];
    (void)argc;
    if (lecho_open(opts, &ctx, err, sizeof err) != 0) { fprintf(stderr, "%s\n", err); return 1; }
    kept = lecho_value_new(ctx);
    if (lecho_consumer_open(lecho_channel_get(ctx, "big"), handler, ctx, &c) != 0) {
        fprintf(stderr, "%s\n", lecho_errmsg(ctx));
        return 1;
    }
    printf("ready\n");
    fflush(stdout);
    lecho_run(ctx);
    lecho_array_info a1, a2;
    int k1 = lecho_get_array(kept, "field", &a1) == 0 && a1.count > 0 && ((const double *)a1.data)[a1.count - 1] == 3 + (double)(a1.count - 1);
    int k2 = lecho_get_array(kept_field, NULL, &a2) == 0 && a2.count > 0 && ((const double *)a2.data)[7] == 10;
    printf("got %ld bad %ld kept %d %d faults per event %ld\n", n, bad, k1, k2, n > 4 ? (last_flt - first_flt) / (n - 4) : -1);
    lecho_close(ctx, 5);
    return 0;
}
]]

describe("arrays and the C API between processes", function()
  local ns, ctx
  before_each(function() ns, ctx = S.world() end)
  after_each(function() S.end_world(ctx); ctx = nil end)

  it("a C consumer reads a Lua producer's arrays (in place or moved once to align them) and sends them back", function()
    local bin = S.capi_program(S.write(S.tmpname("ccons") .. ".c", C_CONSUMER))
    local cc = S.spawn(("LECHO_LUA_DIR=%s/lua %s %s"):format(S.root, bin, ns))
    assert(S.wait_file(cc.out, "ready", 30), S.errors(cc))
    local back, bad = {}, {}
    assert(ctx:channel("back"):consumer(function(ev)
      local f = ev.field
      for i = 0, #f - 1 do
        if f:ptr()[i] ~= ev.step * 1000 + i then bad[#bad + 1] = ev.step break end
      end
      back[#back + 1] = ev.step
    end))
    local p = assert(ctx:channel("tocee"):producer())
    -- odd-sized strings before the field shift its bytes to any offset
    for step = 1, 12 do
      local f = array.new("<f8", { 16, 40 + step }) -- 5 KiB and more: views at the consumer
      local fp = f:ptr()
      for i = 0, #f - 1 do fp[i] = step * 1000 + i end
      assert(p:submit_sync({ a = ("x"):rep(step), step = step, field = f }, { timeout = 10 }))
    end
    assert(p:submit_sync("end", { timeout = 10 }))
    local done = S.wait(cc, 20, ctx)
    assert(done, "C consumer still running: " .. S.output(cc) .. S.errors(cc))
    assert.truthy(S.output(cc):find("got 12 bad 0 misaligned 0", 1, true), S.output(cc) .. S.errors(cc))
    assert.is_true(S.run_until(ctx, function() return #back == 12 end, 10))
    assert.are.same({}, bad)
  end)

  it("a C consumer reads async 8 MiB arrays in place, and keeps the one it stores", function()
    local bin = S.capi_program(S.write(S.tmpname("cbig") .. ".c", C_BIG))
    local cc = S.spawn(("LECHO_LUA_DIR=%s/lua %s %s"):format(S.root, bin, ns))
    assert(S.wait_file(cc.out, "ready", 30), S.errors(cc))
    local p = assert(ctx:channel("big"):producer())
    local N = 8
    local f = array.new("<f8", { 1024 * 1024 }) -- 8 MiB
    local fp = f:ptr()
    for step = 1, N do
      for i = 0, #f - 1 do fp[i] = step + i end
      -- sync: the next step's elements are written only once this one is
      -- handled; async: the C sink's path
      assert(p:submit({ step = step, field = f }))
      assert(p:submit_sync(nil, { timeout = 20 }))
    end
    assert(p:submit_sync("end", { timeout = 20 }))
    local done = S.wait(cc, 30, ctx)
    assert(done, "C consumer still running: " .. S.output(cc) .. S.errors(cc))
    local out = S.output(cc)
    local got, bad, k1, k2, flt = out:match("got (%d+) bad (%d+) kept (%d) (%d) faults per event (%-?%d+)")
    assert(got, out .. S.errors(cc))
    assert.are.same({ N, 0, 1, 1 }, { tonumber(got), tonumber(bad), tonumber(k1), tonumber(k2) })
    -- a copy per event faults in its 2048 pages (4 KiB); a view none
    assert.is_true(tonumber(flt) < 512, out)
  end)

  it("an array function given a non-array raises, never crashes the process", function()
    -- (outside review: summary(nil), get(5, 0), totable(cdata) and the like
    -- read the address their argument named: exit 139, pcall no help)
    local out = S.sh_out(("%s -e %s"):format(S.luajit, S.sh_quote([[
local A = require "lecho".array
local ffi = require "ffi"
local n = 0
for _, f in ipairs{ "summary", "get", "set", "shape", "dtype", "ndim", "ptr", "strides", "contiguous", "copy",
                    "keep", "totable", "count", "box", "stride", "stats" } do
  for _, v in ipairs{ false, 5, "x", {}, ffi.new("int[4]") } do
    local ok, err = pcall(A.methods[f] or A[f], v, 0)
    assert(not ok, f)
    n = n + 1
  end
  local ok, err = pcall(A.methods[f] or A[f], nil, 0)
  assert(not ok and tostring(err):find("expected", 1, true), f .. ": " .. tostring(err))
  n = n + 1
end
print("raised " .. n)
]])))
    assert.matches("raised 96\nrc=0\n$", out)
  end)
end)
