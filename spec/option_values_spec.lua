-- Every option value and every time argument is checked where it is given:
-- a NaN, an infinity, a negative time, an out-of-range size or a value of
-- the wrong type raises at the call with the option's name; it never aborts
-- the process (libev asserts), blocks forever, or reaches the C core as an
-- undefined conversion.  The checks that could abort or hang run in a child
-- process, bounded in time.
local lecho = require "lecho"
local core = require "lecho.core"
local S = require "spec.support"

local NAN, INF = 0 / 0, math.huge

-- The message fn(...) raises, without its position.
local function raised(fn, ...)
  local ok, err = pcall(fn, ...)
  assert.is_false(ok, "did not raise")
  return (tostring(err):gsub("^[^:]*:%d+: ", ""))
end

-- option -> values it must refuse (a good value of each is in
-- options_spec's "take every option doc/api.md documents").
local CONTEXT_BAD = {
  timeout = { NAN, INF, -1, 0, "5" },
  sync_timeout = { NAN, INF, -1, "10" },
  linger = { NAN, INF, -0.5 },
  retry_interval = { NAN, -1 }, retry_max = { NAN, INF, -1 }, heartbeat = { NAN, INF, -1, "5", 1e-300, 0.001 },
  heartbeat_misses = { NAN, 1, 0.5 },
  ack_timeout = { NAN, -1 }, settle = { NAN, -1 }, forget_after = { NAN, INF, -30 },
  peer_free_after = { NAN, INF, -1, "30" }, log_window = { NAN, INF, -1, "10" },
  channel_quota = { NAN, 0, 1.5, "4" }, group_quota = { 0, 1.5, "4" }, max_groups = { 0, -1, NAN },
  modulator_budget = { NAN, 0, -1 },
  modulator_memory = { NAN, 1.5, 1024, 1e300 },
  queue_limit = { -5, 0, 1.5, NAN, INF, 1e300, "big" },
  batch_bytes = { -1, 0.5, 1e300 }, max_string = { -1, NAN }, max_frame = { -1, 1e300 },
  max_depth = { 0, 1e300, -1, 2.5 }, pin_threshold = { -1, NAN },
  log = { "x", true }, quiet = { "no", 1 }, manager = { "yes" }, recovering = { 1 },
  nameserver = { 7700, {}, { 1 }, { "127.0.0.1:1", x = "b" }, setmetatable({ "127.0.0.1:1" }, {}) },
  listen = { 0 }, advertise = { true },
  key = { 1, true, "" }, trust = { 1, true, "", {}, { 1 }, { "a", x = "b" }, { "" } },
  nameserver_principal = { "", "name server", ("n"):rep(65), 5, "ns/1" }, policy_file = { 1 },
}

describe("option values", function()
  local ctx
  after_each(function() if ctx then ctx:close{ linger = 0 } end ctx = nil end)

  it("of lecho.context are refused with the option's name", function()
    for k, bad in pairs(CONTEXT_BAD) do
      for _, v in ipairs(bad) do
        local o = { quiet = true }
        o[k] = v
        local msg = raised(lecho.context, o)
        assert.matches("^lecho%.context: " .. k .. " must be ", msg, nil, k .. " = " .. tostring(v))
      end
    end
    assert.are.equal("lecho: unknown policy 'blok'", raised(lecho.context, { policy = "blok" }))
    assert.are.equal("lecho.context: manager needs a nameserver (the name server it registers with)",
                     raised(lecho.context, { manager = true, quiet = true }))
  end)

  it("say which range a time or a size takes", function()
    assert.are.equal("lecho.context: sync_timeout must be a finite number >= 0",
                     raised(lecho.context, { sync_timeout = NAN }))
    assert.are.equal("lecho.context: timeout must be a finite number > 0",
                     raised(lecho.context, { timeout = -1 }))
    assert.are.equal("lecho.context: queue_limit must be an integer from 1 to 2^53",
                     raised(lecho.context, { queue_limit = 0 }))
    assert.are.equal("lecho.context: heartbeat must be 0 (off) or a finite number >= 0.01",
                     raised(lecho.context, { heartbeat = 1e-300 }))
  end)

  it("of capability lists are lists of known names, nothing else", function()
    ctx = lecho.context{ quiet = true }
    local ch = ctx:channel("caps")
    for _, g in ipairs{ { net = true }, { "clock", nil, "net" }, { "clock", x = 1 } } do
      assert.matches("grant must be a list of capability names", raised(ch.producer, ch, { grant = g }))
    end
    assert.matches("unknown capability 'net'", raised(ch.producer, ch, { grant = { "clock", "net" } }))
  end)

  it("behind a metatable are refused, since they would not be checked", function()
    assert.are.equal("lecho.context: options must be a plain table (no metatable)",
      raised(lecho.context, setmetatable({ quiet = true }, { __index = { queue_limit = -5 } })))
    ctx = lecho.context{ quiet = true }
    local p = ctx:channel("m"):producer()
    assert.are.equal("p:submit_sync: options must be a plain table (no metatable)",
      raised(p.submit_sync, p, {}, setmetatable({}, { __index = { timeout = NAN } })))
  end)

  it("of channels, producers, consumers, submit_sync and close are refused", function()
    ctx = lecho.context{ quiet = true }
    local ch = ctx:channel("v")
    local src = "function enqueue(ev) return ev end"
    local nop = function() end
    assert.are.equal("ctx:channel: create must be a boolean", raised(ctx.channel, ctx, "v", { create = "no" }))
    assert.are.equal("ch:producer: grant must be a list of capability names (clock, log)",
                     raised(ch.producer, ch, { grant = "clock" }))
    assert.are.equal("ch:consumer: params must be a table",
                     raised(ch.consumer, ch, nop, { modulator = src, params = 5 }))
    assert.are.equal("ch:consumer: period must be a finite number >= 0.001",
                     raised(ch.consumer, ch, nop, { modulator = src, period = INF }))
    assert.are.equal("ch:consumer: on_error must be a function", raised(ch.consumer, ch, nop, { on_error = "x" }))
    for _, k in ipairs{ "params", "period", "capabilities" } do
      local o = { params = {}, period = 1, capabilities = { "clock" } }
      assert.are.equal("ch:consumer: " .. k .. " needs a modulator",
                       raised(ch.consumer, ch, nop, { [k] = o[k] }))
    end
    local p = assert(ch:producer())
    for _, v in ipairs{ NAN, INF, -1, "1" } do
      assert.are.equal("p:submit_sync: timeout must be a finite number >= 0",
                       raised(p.submit_sync, p, 1, { timeout = v }))
    end
    assert.are.equal("ctx:close: linger must be a finite number >= 0", raised(ctx.close, ctx, { linger = NAN }))
    -- nothing was made by the refused calls
    assert.are.equal(0, ctx:stats().channels[ctx.addr .. "/v"].consumers)
  end)

  it("that reach the C core out of range are refused there too", function()
    for _, o in ipairs{ { queue_limit = -5 }, { max_depth = 1e300 }, { batch_bytes = 0.5 },
                        { max_string = NAN }, { pin_threshold = INF }, { heartbeat = NAN },
                        { retry_interval = NAN }, { retry_max = INF }, { heartbeat_misses = NAN } } do
      local k = next(o)
      assert.matches("^lecho: " .. k .. " must be ", raised(core.new, o), nil, k)
    end
    local c = core.new{}
    assert.matches("must be a finite number >= 0", raised(c.timer, c, NAN, 0, function() end))
    assert.matches("must be a finite number >= 0", raised(c.timer, c, 1, -1, function() end))
    c:close()
  end)
end)

describe("time arguments and descriptors", function()
  after_each(S.cleanup)

  -- Before the checks: every(NaN) aborted in libev, run_once(NaN) blocked
  -- forever, on_readable(9999) aborted in epoll_ctl.
  it("raise instead of aborting or blocking the process", function()
    local child = S.lua([[
      io.stdout:setvbuf("no")
      local lecho = require "lecho"
      local ctx = lecho.context{ quiet = true }
      local function try(name, f, ...)
        local ok, err = pcall(f, ...)
        print(name, ok and "accepted" or tostring(err):gsub("^[^:]*:%d+: ", ""))
      end
      local nop = function() end
      try("every nan", ctx.every, ctx, 0/0, nop)
      try("every 0", ctx.every, ctx, 0, nop)
      try("every -1", ctx.every, ctx, -1, nop)
      try("after nan", ctx.after, ctx, 0/0, nop)
      try("after inf", ctx.after, ctx, math.huge, nop)
      try("after -1", ctx.after, ctx, -1, nop)
      try("run_once nan", ctx.run_once, ctx, 0/0)
      try("run_once inf", ctx.run_once, ctx, math.huge)
      try("fd 9999", ctx.on_readable, ctx, 9999, nop)
      try("fd 1e8", ctx.on_readable, ctx, 100000000, nop)
      try("fd -1", ctx.on_readable, ctx, -1, nop)
      try("fd 1.5", ctx.on_readable, ctx, 1.5, nop)
      local w = ctx:on_readable(0, nop)   -- an open descriptor still works
      w:stop()
      ctx:run_once(0)
      ctx:close()
      print("survived")
    ]])
    assert.is_true((S.wait(child, 20)), "child did not finish")
    local out = S.output(child)
    assert.matches("survived", out, nil, true, out .. S.errors(child))
    local want = {
      ["every nan"] = "ctx:every: sec must be a finite number > 0",
      ["every 0"] = "ctx:every: sec must be a finite number > 0",
      ["every -1"] = "ctx:every: sec must be a finite number > 0",
      ["after nan"] = "ctx:after: sec must be a finite number >= 0",
      ["after inf"] = "ctx:after: sec must be a finite number >= 0",
      ["after -1"] = "ctx:after: sec must be a finite number >= 0",
      ["run_once nan"] = "ctx:run_once: timeout must be a finite number >= 0",
      ["run_once inf"] = "ctx:run_once: timeout must be a finite number >= 0",
      ["fd 9999"] = "ctx:on_readable: fd 9999 is not open",
    }
    local got = {}
    for name, msg in out:gmatch("([^\t\n]+)\t([^\n]*)") do got[name] = msg end
    for name, msg in pairs(want) do assert.are.equal(msg, got[name], name) end
    for _, name in ipairs{ "fd 1e8", "fd -1", "fd 1.5" } do
      assert.matches("^ctx:on_readable: fd .* is not a descriptor", got[name], nil, name)
    end
  end)
end)

describe("the REPL's wait", function()
  after_each(S.cleanup)

  it("refuses a NaN or infinite time instead of hanging", function()
    local _, ns = S.nameserver("--quiet")
    for _, t in ipairs{ "0/0", "math.huge", "-1" } do
      local child = S.spawn(("%s %s/scripts/lecho-repl --nameserver %s --no-history -e %s </dev/null")
        :format(S.luajit, S.root, ns, S.sh_quote("wait(" .. t .. ")")))
      assert.is_true((S.wait(child, 20)), "lecho-repl hung on wait(" .. t .. ")")
      assert.matches("wait: seconds must be a finite number >= 0", S.errors(child) .. S.output(child), nil, true)
    end
  end)
end)

describe("channel names", function()
  it("refuse a NUL byte and a name server port out of range", function()
    local ctx = lecho.context{ quiet = true }
    assert.are.equal("lecho: a channel name must not contain a NUL byte", raised(ctx.channel, ctx, "a\0b"))
    assert.matches("bad port", raised(ctx.channel, ctx, "127.0.0.1:99999/x"))
    assert.matches("bad port", raised(lecho.context, { listen = "127.0.0.1:70000" }))
    ctx:close()
  end)
end)

