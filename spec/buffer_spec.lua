-- Buffer consumers (issue 13, bulk values): a consumer with `buffer = true`
-- gets string values as LuaJIT string.buffers; a long one points at the
-- bytes where they were read (no copy).  These specs hold the guarantees
-- that make that safe: the same bytes as a string consumer gets, still
-- the right bytes after the handler waited, ran the loop itself or closed
-- the connection they came on, an empty buffer once the handler returned.
local S = require "spec.support"
local lecho = require "lecho"
local cjson = require "cjson"
local ffi = require "ffi"

-- The i-th long value: 200 KiB (above the 64 KiB where views start) whose
-- every byte depends on i, so a buffer showing another value's bytes, or
-- freed memory, cannot pass.  Source text: the child scripts start with it.
local LONG = [[
  local function long(i)
    local unit = ("%07d:"):format(i) .. string.char(65 + i % 26):rep(24)
    return unit:rep(math.ceil(200 * 1024 / #unit)):sub(1, 200 * 1024 - (i % 7))
  end
]]
local long = assert(loadstring(LONG .. " return long"))()

-- A child producing on `chan` of the name server ns: the values listed in
-- the JSON plan ({ "long", i } / { "short", s } / { "table", x }), then a
-- sync "end"; writes "sent" and exits at once (a short-lived publisher).
local PRODUCER = LONG .. [[
  local lecho = require "lecho"
  local cjson = require "cjson"
  local ns, chan, plan = arg[1], arg[2], cjson.decode(arg[3])
  local ctx = lecho.context{ nameserver = ns, quiet = true }
  local p = assert(ctx:channel(chan):producer())
  for _, v in ipairs(plan) do
    local val = v[1] == "long" and long(v[2]) or v[2]
    if v[3] == "sync" then
      local ok, err = p:submit_sync(val, { timeout = 10 })
      io.write("sync ", tostring(ok), " ", tostring(err), "\n")
    else
      assert(p:submit(val))
    end
  end
  local ok = p:submit_sync("end", { timeout = 10 })
  io.write("sent ", tostring(ok), "\n")
  io.flush()
  ctx:close()
]]

describe("a buffer consumer", function()
  local ns, ctx
  before_each(function() ns, ctx = S.world() end)
  after_each(function() S.end_world(ctx); ctx = nil end)

  it("gets every string value as a string.buffer with the bytes a string consumer gets, other values as they were", function()
    local plan, want = {}, {}
    for i = 1, 40 do
      if i % 5 == 0 then
        plan[#plan + 1] = { "short", "s" .. i }
        want[#want + 1] = "s" .. i
      elseif i % 5 == 1 then
        plan[#plan + 1] = { "table", { n = i, s = "x" } }
        want[#want + 1] = { n = i, s = "x" }
      else
        plan[#plan + 1] = { "long", i }
        want[#want + 1] = long(i)
      end
    end
    local ch = ctx:channel("bulk")
    local got_b, got_s, kept = {}, {}, nil
    local ended = 0
    assert(ch:consumer(function(ev)
      if type(ev) == "userdata" then
        assert.is_true(ev ~= nil and ev.ref ~= nil, "a string.buffer")
        local s = ev:tostring()
        if s == "end" then ended = ended + 1 return end
        got_b[#got_b + 1] = s
        kept = ev
      else
        got_b[#got_b + 1] = ev
      end
    end, { buffer = true }))
    assert(ch:consumer(function(ev)
      if ev == "end" then ended = ended + 1 return end
      got_s[#got_s + 1] = ev
    end))
    -- two busy loops: the reads split the values at other places
    local busy = {}
    for i = 1, 2 do busy[i] = S.lua("local t = os.time() + 20 while os.time() < t do end") end
    local prod = S.lua(PRODUCER, ns, "bulk", cjson.encode(plan))
    assert.is_true(S.run_until(ctx, function() return ended == 2 end, 30), S.errors(prod))
    for _, b in ipairs(busy) do S.kill(b, "KILL") end
    assert.are.equal(#want, #got_b)
    for i = 1, #want do
      assert.are.same(want[i], got_b[i], "buffer consumer, value " .. i)
      assert.are.same(want[i], got_s[i], "string consumer, value " .. i)
    end
    assert.are.equal(0, #kept, "a buffer is emptied when its handler returns")
    assert.are.equal("", kept:tostring())
  end)

  it("still holds the right bytes after its handler waited, ran the loop itself, or closed the connection they came on", function()
    local ch = ctx:channel("hold")
    local checked, bad = {}, {}
    local function check(tag, b, i)
      local s = b:tostring()
      if s == long(i) then checked[#checked + 1] = tag else bad[#bad + 1] = ("%s %d: %d bytes"):format(tag, i, #s) end
    end
    local n = 0
    local closed = false
    assert(ch:consumer(function(b, meta)
      n = n + 1
      local ptr = b:ref() -- a peek at the first bytes, b untouched
      local i = tonumber(ffi.string(ptr, 8):match("^(%d+):"))
      if n == 2 then
        ctx:sleep(0.05) -- a lecho wait: the dispatch is suspended, others are read meanwhile
        check("wait", b, i)
      elseif n == 4 then
        for _ = 1, 5 do ctx:run_once(0.01) end -- the loop runs inside this handler
        check("nested", b, i)
      elseif n == 12 then
        local addr = meta.producer:match("^(.*)#%d+$")
        ctx.c:close_peer(addr, "closed by the spec's handler")
        check("closed", b, i)
        closed = true
      else
        check("plain", b, i)
      end
    end, { buffer = true }))
    local plan = {}
    for i = 1, 12 do plan[i] = { "long", i } end
    plan[12][3] = "sync" -- the last one's handler closes the connection: its ack fails
    local prod = S.lua(PRODUCER, ns, "hold", cjson.encode(plan))
    S.run_until(ctx, function() return closed end, 30)
    S.run_until(ctx, function() return S.output(prod):find("sync nil", 1, true) ~= nil end, 10)
    assert.are.same({}, bad)
    local tags = {}
    for _, t in ipairs(checked) do tags[t] = (tags[t] or 0) + 1 end
    assert.are.equal(1, tags.wait)
    assert.are.equal(1, tags.nested)
    assert.are.equal(1, tags.closed)
    assert.is_true((tags.plain or 0) >= 1)
  end)

  it("acknowledges a sync event once its handler ran; a service in the same context gets a long argument as a string", function()
    local ch = ctx:channel("sy")
    local seen = {}
    assert(ch:consumer(function(b) seen[#seen + 1] = #b end, { buffer = true }))
    local p = assert(ch:producer())
    assert.is_true(p:submit_sync(long(3), { timeout = 5 }))
    assert.is_true(p:submit_sync("x", { timeout = 5 }))
    assert.are.same({ #long(3), 1 }, seen)
    assert(ctx:service("len", function(args) return type(args), #args end))
    local other = S.lua(LONG .. [[
      local lecho = require "lecho"
      local ctx = lecho.context{ nameserver = arg[1], quiet = true }
      local t, n = ctx:call("len", long(9), { timeout = 10 })
      io.write("call ", tostring(t), " ", tostring(n), "\n")
      ctx:close()
    ]], ns)
    assert.is_true(S.wait(other, 20, ctx))
    assert.truthy(S.output(other):match("call string " .. #long(9)), S.output(other) .. S.errors(other))
  end)

  it("gets its modulator's string results as buffers", function()
    local ch = ctx:channel("mod")
    local got = {}
    assert(ch:consumer(function(b) got[#got + 1] = { type(b), b:tostring():sub(1, 3), #b } end,
      { buffer = true, modulator = "function enqueue(ev) return ev .. '!' end" }))
    local p = assert(ch:producer())
    assert.is_true(p:submit_sync(long(5), { timeout = 5 }))
    assert.is_true(p:submit_sync("ab", { timeout = 5 }))
    assert.are.same({ { "userdata", long(5):sub(1, 3), #long(5) + 1 }, { "userdata", "ab!", 3 } }, got)
  end)
end)

-- Found by the outside attack of the change: when the copy made before a
-- handler's wait could not be made (out of memory), the view stayed listed
-- with its pointer while C freed the bytes, and the next loop turn copied
-- from freed memory: SIGSEGV.  Now it is that handler's error, and the
-- process goes on.  (Not under ASan: an address-space limit cannot hold its
-- shadow memory.)
describe("a buffer consumer out of memory", function()
  local ns, ctx
  before_each(function() ns, ctx = S.world() end)
  after_each(function() S.end_world(ctx); ctx = nil end)

  it("turns a copy that cannot be made before a wait into its handler's error, and the process goes on", function()
    if S.asan then return end
    local kid = S.lua([=[
      local lecho = require "lecho"
      local ffi = require "ffi"
      io.stdout:setvbuf("no")
      local ctx = lecho.context{ nameserver = arg[1], quiet = true, log = function(m) print("LOG " .. m:sub(1, 160)) end }
      assert(ctx:channel("oom"):consumer(function(b)
        if #b > 100 then
          print("big " .. #b)
          ctx:sleep(0.01)
          print("after the wait " .. #b)
        else
          print("small " .. b:tostring())
        end
      end, { buffer = true }))
      -- room for the 40 MiB read buffer, not for a second copy of it
      ffi.cdef[[ struct lrl { unsigned long cur, max; }; int setrlimit(int, const struct lrl *); ]]
      local f = io.open("/proc/self/status"); local st = f:read("*a"); f:close()
      local vm = tonumber(st:match("VmSize:%s*(%d+)")) * 1024
      local rl = ffi.new("struct lrl", vm + 60 * 1024 * 1024, vm + 60 * 1024 * 1024)
      assert(ffi.C.setrlimit(9, rl) == 0) -- RLIMIT_AS
      print("ready")
      local t = ctx:now() + 20
      while ctx:now() < t do ctx:run_once(0.1) end
      ctx:close()
    ]=], ns)
    assert(S.wait_file(kid.out, "ready", 20), S.errors(kid))
    local p = assert(ctx:channel("oom"):producer())
    local big = ("z"):rep(40 * 1024 * 1024)
    local ok, errs = p:submit_sync(big, { timeout = 15 })
    big = nil
    collectgarbage()
    assert.is_nil(ok, "the handler could not keep its value")
    assert.truthy(tostring(errs):match("memory"), tostring(errs))
    assert.is_true(p:submit_sync("after", { timeout = 10 }))
    assert.truthy(S.output(kid):match("small after"), S.output(kid) .. S.errors(kid))
    assert.is_true(S.alive(kid))
  end)
end)

-- Found by the second outside attack: a dispatch that raised between
-- listing its view and unlisting it (out of memory making a dispatch
-- coroutine while another handler waits: simulated here) left the view
-- listed; the next loop turn copied its bytes after they were freed.
describe("a buffer consumer's dispatch that fails", function()
  it("leaves no view behind, and the next events arrive", function()
    local ctx = lecho.context{ quiet = true, listen = "127.0.0.1:0" }
    local got = {}
    assert(ctx:channel("slow"):consumer(function(b)
      got[#got + 1] = "slow " .. #b
      ctx:sleep(0.3) -- holds the dispatch coroutine: the next dispatch makes one
    end, { buffer = true }))
    assert(ctx:channel("other"):consumer(function(b) got[#got + 1] = "other " .. #b end, { buffer = true }))
    local ps, po = assert(ctx:channel("slow"):producer()), assert(ctx:channel("other"):producer())
    local real, armed = coroutine.create, false
    coroutine.create = function(f)
      if armed then armed = false error("not enough memory", 0) end
      return real(f)
    end
    local ok, err = pcall(function()
      assert(ps:submit(long(1)))
      S.run_until(ctx, function() return got[1] ~= nil end, 5)
      armed = true
      assert(po:submit(long(2))) -- its dispatch fails
      S.run_until(ctx, function() return not armed end, 5)
      assert.are.same({}, ctx.views)
      assert(po:submit(long(3)))
      assert.is_true(po:submit_sync("x", { timeout = 5 }))
    end)
    coroutine.create = real
    ctx:close()
    assert(ok, err)
    assert.are.same({ "slow " .. #long(1), "other " .. #long(3), "other 1" }, got)
  end)
end)
