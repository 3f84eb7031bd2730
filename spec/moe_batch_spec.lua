-- Async events through a modulator without dequeue are staged and run in
-- one entry into its state, a call and a budget each (issue 27 item 5,
-- doc/modulators.md "Costs"): the batch runs when full, before any other
-- call of the modulator, once per loop turn, and before a flush, a
-- pending count or a shutdown, so nothing submitted is lost or reordered.
local lecho = require "lecho"
local S = require "spec.support"

local function mstats(c)
  local n, st = 0, nil
  for _, ms in pairs(c:stats().modulators or {}) do n, st = n + 1, ms end
  assert.are.equal(1, n)
  return st
end

describe("modulator batches (issue 27)", function()
  local c
  after_each(function() if c then c:close() end c = nil S.cleanup() end)

  local function setup(src, opts)
    c = lecho.context(opts or { quiet = true })
    local ch = c:channel("b")
    local p = assert(ch:producer())
    local got, errs = {}, {}
    assert(ch:consumer(function(ev) got[#got + 1] = ev end,
                       { modulator = src, on_error = function(e) errs[#errs + 1] = tostring(e) end }))
    return p, got, errs
  end

  it("stages async events until the batch is full, a sync event, a flush or a loop turn", function()
    local p, got = setup("function enqueue(ev) return ev end")
    for i = 1, 10 do assert(p:submit(i)) end
    assert.are.equal(10, mstats(c).staged)
    assert.are.equal(0, mstats(c).events_in)
    c:flush()
    assert.are.equal(0, mstats(c).staged)
    assert.are.equal(10, mstats(c).events_in)
    for i = 11, 84 do assert(p:submit(i)) end -- 64 fill a batch and run, 10 stay
    assert.are.equal(10, mstats(c).staged)
    assert.are.equal(74, mstats(c).events_in)
    c:run_once(0)
    assert.are.equal(0, mstats(c).staged)
    for i = 85, 90 do assert(p:submit(i)) end
    assert(p:submit_sync(91)) -- runs the six first
    assert.are.equal(91, mstats(c).events_in)
    assert(S.run_until(c, function() return #got == 91 end, 5))
    for i = 1, 91 do assert.are.equal(i, got[i]) end
  end)

  it("delivers what the calls before a failing one returned, and fails the modulator", function()
    local p, got, errs = setup("function enqueue(ev) if ev == 5 then error('five') end return ev end")
    for i = 1, 10 do assert(p:submit(i)) end
    assert(S.run_until(c, function() return #errs > 0 and #got == 4 end, 5))
    assert.are.same({ 1, 2, 3, 4 }, got)
    assert.matches("five", errs[1])
    c:run_once(0.05)
    assert.are.same({ 1, 2, 3, 4 }, got)
  end)

  it("gives each call of a batch its own budget, and stops the one that overruns", function()
    local p, got, errs = setup([[function enqueue(ev)
      if ev == 5 then while true do end end
      local x = 0 for i = 1, 10000 do x = x + i end  -- 59 of them pass 5 ms together
      return ev
    end]], { quiet = true, modulator_budget = 0.005 })
    for i = 1, 4 do assert(p:submit(i)) end
    for i = 6, 60 do assert(p:submit(i)) end
    c:flush()
    assert.are.equal(0, mstats(c).staged)
    assert(S.run_until(c, function() return #got == 59 end, 5))
    assert.are.same({}, errs) -- 59 calls in one batch, none over its own budget
    for i = 1, 10 do assert(p:submit(i)) end
    assert(S.run_until(c, function() return #errs > 0 and #got == 59 + 4 end, 5))
    assert.matches("CPU budget", errs[1])
    for i = 1, 4 do assert.are.equal(i, got[59 + i]) end
  end)

  it("is not entered again from a log hook that flushes and submits during a batch", function()
    c = lecho.context{ quiet = true }
    local ch = c:channel("re")
    local p = assert(ch:producer{ grant = { "log" } })
    local got, n, sent, refused, hook_errs = {}, 0, {}, {}, {}
    c.log = function()
      n = n + 1
      local ok, err = pcall(function()
        c:flush()
        c.c:pending()   -- the core's (ctx.pending is the request table)
        if n % 3 == 0 then
          -- staged behind the batch running, or refused (the batch's
          -- stage full, a sync event): never a step inside the running one
          local sok, serr, code = p:submit(-n)
          if sok then sent[#sent + 1] = -n else refused[#refused + 1] = code .. ": " .. tostring(serr) end
          local yok, _, ycode = p:submit_sync(-n - 0.5, { timeout = 1 })
          if not yok then refused[#refused + 1] = tostring(ycode) end
        end
      end)
      if not ok then hook_errs[#hook_errs + 1] = tostring(err) end
    end
    assert(ch:consumer(function(ev) got[#got + 1] = ev end,
                       { capabilities = { "log" }, modulator = "function enqueue(ev) log('x') return ev end" }))
    for i = 1, 100 do assert(p:submit(i)) end
    c:flush()
    assert(S.run_until(c, function() return mstats(c).staged == 0 and #got >= 100 end, 5))
    c:run_once(0.05)
    local pos, seen = 0, {}
    for _, v in ipairs(got) do
      assert.is_nil(seen[v], "delivered twice: " .. v)
      seen[v] = true
      if v > 0 then assert.are.equal(pos + 1, v) pos = v end
    end
    assert.are.equal(100, pos)
    assert.are.same({}, hook_errs)
    for _, v in ipairs(sent) do assert.is_true(seen[v], "staged from the hook, not delivered: " .. v) end
    assert.is_true(#refused > 0) -- the sync submits from inside the call at least
    for _, r in ipairs(refused) do assert.matches("^invalid", r) end
  end)

  it("sends everything submitted before the producer's context closes, in order", function()
    local _, ns = S.nameserver("--quiet")
    local v = S.lua([[
      local lecho = require "lecho"
      local ctx = lecho.context{ nameserver = arg[1], quiet = true }
      local n, bad, started = 0, 0, false
      assert(ctx:channel("close"):consumer(function(ev)
        if ev == "start" then
          if not started then started = true io.stdout:write("started\n") io.stdout:flush() end
          return
        end
        if ev == "end" then io.stdout:write("got ", n, " bad ", bad, "\n") io.stdout:flush() ctx:stop() return end
        n = n + 1
        if ev ~= n then bad = bad + 1 end
      end, { modulator = "function enqueue(ev) return ev end" }))
      io.stdout:write("ready\n") io.stdout:flush()
      ctx:after(60, function() ctx:stop() end)
      ctx:run()
    ]], ns)
    c = lecho.context{ nameserver = ns, quiet = true }
    assert(S.run_until(c, function() return S.output(v):match("ready") end, 20))
    local p = assert(c:channel("close"):producer())
    assert(S.run_until(c, function()   -- until the consumer's modulator runs here
      assert(p:submit_sync("start"))
      return S.output(v):match("started")
    end, 20))
    for i = 1, 1000 do assert(p:submit(i)) end
    assert(p:submit("end"))
    c:close()
    c = nil
    assert(S.wait(v, 30))
    assert.matches("got 1000 bad 0", S.output(v))
  end)
  -- The stage holds a reference to each staged message until its batch
  -- runs, so the producer's spare message could not be reused: a calloc
  -- (and a realloc, two frees) per event.  The handle's pool reuses a
  -- message once nobody else holds it (lua_prod.c msg_take / msg_done).
  it("allocates no message per staged event, and delivers every event intact", function()
    -- under make asan, ASan's calloc comes first in the preload order: the
    -- events are checked, the count is not
    local pre = "true"
    if not S.asan then
      local so = S.tmpname("calloc_count") .. ".so"
      local ok, log = S.sh(("cc -O2 -Wall -Wextra -Werror -shared -fPIC -o %s %s/spec/support/calloc_count.c -ldl")
        :format(S.sh_quote(so), S.sh_quote(S.root)))
      assert(ok, log)
      pre = "export LD_PRELOAD=" .. S.sh_quote(so)
    end
    local v = S.lua_with(pre, [[
      local ffi = require "ffi"
      ffi.cdef "long shim_ncalloc(void);"
      local function ncalloc()
        local ok, n = pcall(function() return tonumber(ffi.C.shim_ncalloc()) end)
        return ok and n or 0
      end
      local lecho = require "lecho"
      local c = lecho.context{ quiet = true }
      local ch = c:channel("pool")
      local p = assert(ch:producer())
      local got, bad = 0, 0
      assert(ch:consumer(function(ev)
        got = got + 1
        if ev ~= "event " .. got then bad = bad + 1 end
      end, { modulator = "function enqueue(ev) return ev end" }))
      local k = 0
      local function round()
        for _ = 1, 64 do k = k + 1 assert(p:submit("event " .. k)) end
        c:run_once(0)
      end
      for _ = 1, 20 do round() end
      local n0 = ncalloc()
      for _ = 1, 50 do round() end
      local n1 = ncalloc()
      c:flush()
      local t = os.time() + 20
      while got < k and os.time() < t do c:run_once(0.01) end
      io.stdout:write(("got %d of %d bad %d callocs %.3f\n"):format(got, k, bad, (n1 - n0) / (50 * 64)))
      c:close()
    ]])
    assert(S.wait(v, 60))
    local out = S.output(v)
    local got, k, bad, per = out:match("got (%d+) of (%d+) bad (%d+) callocs ([%d.]+)")
    assert(got, out)
    assert.are.equal(k, got)
    assert.are.equal("0", bad)
    -- before: 2.0 per event (the message, and one of the local delivery's
    -- own that stays); with the pool 1.0
    if not S.asan then assert.is_true(tonumber(per) < 1.5, "callocs per event: " .. per) end
  end)
end)
