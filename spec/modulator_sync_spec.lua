-- A sync submit and a modulator that fails on that very event (issue 9,
-- attack finding 1): the sync on which a consumer's modulator fails, and
-- every later one, return nil, errors, "failed" with the entry "modulator
-- KEY not running at ADDR: why", whether or not a loop turn runs between
-- the syncs, for a local and a remote consumer, for every kind of failure.
local lecho = require "lecho"
local S = require "spec.support"

-- Each modulator passes step 1 and fails on step 2; `why` matches the reason.
local KINDS = {
  { name = "error", why = "fail on 2",
    src = [[function enqueue(ev) if ev.step == 2 then error("fail on 2") end return ev end]] },
  { name = "budget", why = "CPU budget",
    src = [[function enqueue(ev) if ev.step == 2 then while true do end end return ev end]] },
  { name = "memory", why = "memory cap",
    src = [[function enqueue(ev) if ev.step == 2 then return { s = ("x"):rep(8 * 1024 * 1024) } end return ev end]] },
  { name = "output", why = "cannot send what it produced",
    src = [[function enqueue(ev) if ev.step == 2 then return { f = function() end } end return ev end]] },
}

local function ctx()
  return lecho.context{ quiet = true, modulator_memory = 4 * 1024 * 1024, sync_timeout = 5 }
end

local function escape(s) return (s:gsub("%p", "%%%0")) end

-- Submits steps 1..4 on p (a loop turn between them when `turn`): step 1
-- reaches the consumer, steps 2..4 are each refused with the modulator's
-- failure, whatever runs between.
local function check_steps(c, p, kind, turn, got)
  local label = kind.name .. (turn and " (turns)" or " (no turn)")
  local ok, errs, code = p:submit_sync({ step = 1 }, { timeout = 5 })
  assert(ok == true, label .. ": step 1 " .. tostring(errs))
  for step = 2, 4 do
    ok, errs, code = p:submit_sync({ step = step }, { timeout = 5 })
    assert(ok == nil, ("%s: step %d returned %s"):format(label, step, tostring(ok)))
    assert.are.equal("failed", code, label)
    assert.are.equal(1, #errs, label .. ": " .. tostring(errs))
    assert.are.equal("failed", errs[1].code, label)
    assert.matches("^modulator %x+ not running at " .. escape(c.addr) .. ": .*" .. escape(kind.why),
                   errs[1].err, label)
    if turn then c:run_once(0.05) end
  end
  if got then assert.are.same({ 1 }, got, label) end
end

describe("sync submit through a modulator that fails on that event", function()
  local c
  after_each(function()
    if c then c:close{ linger = 0 } end
    c = nil
    S.cleanup()
  end)

  it("fails that sync and every later one, local consumer", function()
    c = ctx()
    for _, kind in ipairs(KINDS) do
      for _, turn in ipairs({ false, true }) do
        local ch = c:channel(("local-%s-%s"):format(kind.name, tostring(turn)))
        local p = assert(ch:producer())
        local got = {}
        assert(ch:consumer(function(ev) got[#got + 1] = ev.step end,
                           { modulator = kind.src, on_error = function() end }))
        check_steps(c, p, kind, turn, got)
      end
    end
  end)

  it("fails it beside a plain consumer that ran", function()
    c = ctx()
    local ch = c:channel("beside")
    local p = assert(ch:producer())
    local plain = {}
    assert(ch:consumer(function(ev) plain[#plain + 1] = ev.step end))
    assert(ch:consumer(function() end, { modulator = KINDS[1].src, on_error = function() end }))
    check_steps(c, p, KINDS[1], false)
    assert.are.same({ 1, 2, 3, 4 }, plain)
  end)

  it("fails that sync and every later one, remote consumer", function()
    c = ctx()
    local names, producers = {}, {}
    for _, kind in ipairs(KINDS) do
      for _, turn in ipairs({ false, true }) do
        local name = ("remote-%s-%s"):format(kind.name, tostring(turn))
        names[#names + 1] = { name = name, src = kind.src }
        producers[name] = assert(c:channel(name):producer())
      end
    end
    local child = S.lua([[
      local cjson = require "cjson"
      local lecho = require "lecho"
      local ctx = lecho.context{ nameserver = arg[1], quiet = true }
      for _, n in ipairs(cjson.decode(arg[2])) do
        assert(ctx:channel(n.name):consumer(function() end, { modulator = n.src, on_error = function() end }))
      end
      io.stdout:write("ready\n")
      io.stdout:flush()
      ctx:after(30, function() ctx:stop() end)
      ctx:run()
      ctx:close{ linger = 0 }
    ]], c.addr, require("cjson").encode(names))
    assert(S.run_until(c, function() return (S.read(child.out) or ""):find("ready") end, 20),
           "consumer did not start: " .. S.errors(child))
    for _, kind in ipairs(KINDS) do
      for _, turn in ipairs({ false, true }) do
        check_steps(c, producers[("remote-%s-%s"):format(kind.name, tostring(turn))], kind, turn)
      end
    end
  end)
end)

describe("sync submit through a modulator that fails after sending", function()
  it("waits for what it sent for the event before failing", function()
    local c = lecho.context{ quiet = true }
    local ch = c:channel("sent-then-failed")
    local p = assert(ch:producer())
    local got = {}
    -- enqueue sends a note at once and holds the event; dequeue (run at once
    -- by a sync submit) fails on step 2, after the note went out.
    assert(ch:consumer(function(ev) got[#got + 1] = ev end, { on_error = function() end, modulator = [[
      function enqueue(ev) emit("note " .. ev) return ev end
      function dequeue(ev) if ev == 2 then error("fail in dequeue") end return ev end ]] }))
    assert(p:submit_sync(1))
    assert.are.same({ "note 1", 1 }, got)
    local ok, errs, code = p:submit_sync(2)
    assert.is_nil(ok)
    assert.are.equal("failed", code)
    assert.matches("fail in dequeue", tostring(errs))
    assert.are.same({ "note 1", 1, "note 2" }, got)
    c:close{ linger = 0 }
  end)
end)
