-- Error codes set where the error happens (issue 26): a sync submit's
-- errors carry { context, consumer, err, code }, each code from where it
-- happened (a refused channel index at the consuming context, in the ACK;
-- a lost or silent context from the sync record), and no code is ever read
-- from a message's text: a message that mentions "limit", "budget exceeded"
-- or "timed out" keeps its real code.  And submit_sync waits on the core's
-- settled notice, as calls do, not a poll of ctx:sync_result every turn.
--
-- Run: make && LUA_PATH="$PWD/lua/?.lua;$PWD/lua/?/init.lua;;" \
--   LUA_CPATH="$PWD/lua/?.so;;" LECHO_ROOT=$PWD luajit /usr/bin/busted spec/sync_codes_spec.lua

local S = require "spec.support"
local core = require "lecho.core"
local socket = require "socket"

local function drive(ctxs, done, seconds)
  local deadline = socket.gettime() + (seconds or 5)
  while not done() do
    assert(socket.gettime() < deadline, "timed out")
    for _, c in ipairs(ctxs) do c:run_once(0.01) end
  end
end

describe("codes carried over the wire", function()
  it("a sync event on a channel the consuming context has not open: code refused, from its ACK", function()
    local c, r = core.new(), core.new()
    assert(c:listen("127.0.0.1:0"))
    assert(r:listen("127.0.0.1:0"))
    r:hooks({ event = function() error("never dispatched") end })
    local ch = c:channel("127.0.0.1:1/not_here")
    c:set_dests(ch, { r:addr() })
    local sid = assert(c:submit(ch, 1, 1, "v", true, "block"))
    local ok, errs
    drive({ c, r }, function() ok, errs = c:sync_result(sid); return ok ~= false end)
    assert.is_nil(ok)
    assert.same({ { context = r:addr(), consumer = r:addr(), code = "refused",
                    err = "no channel 127.0.0.1:1/not_here open here" } }, errs)
    c:close()
    r:close()
  end)
end)

describe("codes never read from a message's text", function()
  local ns, ctx
  before_each(function() ns, ctx = S.world() end)
  after_each(function() S.end_world(ctx); ctx = nil end)

  it("a value that cannot be encoded at ev.limit is invalid, not limit", function()
    local p = assert(ctx:channel("enc"):producer())
    local ok, err, code = p:submit({ limit = print })
    assert.is_nil(ok)
    assert.equals("cannot encode a function at ev.limit", err)
    assert.equals("invalid", code)
    local lecho = require "lecho"
    assert.same({ nil, "cannot encode a function at ev.limit", "invalid" }, { lecho.encode({ limit = print }) })
  end)

  it("a handler's error whose text says 'budget exceeded' is failed; a real budget stop is limit", function()
    assert(ctx:service("words", function(args)
      if args.spin then while true do end end
      error("budget exceeded: my own words about a CPU budget", 0)
    end, { budget = 0.2 }))
    local r, err, code = ctx:call("words", {}, { timeout = 5 })
    assert.is_nil(r)
    assert.equals("budget exceeded: my own words about a CPU budget", err)
    assert.equals("failed", code)
    r, err, code = ctx:call("words", { spin = true }, { timeout = 10 })
    assert.is_nil(r)
    assert.truthy(tostring(err):match("^budget exceeded: words@1 used"), err)
    assert.equals("limit", code)
  end)

  it("a consumer that never answers in time: code timeout, from the record", function()
    local ch = ctx:channel("slowc")
    assert(ch:consumer(function() ctx:sleep(1.5) end))
    local p = assert(ch:producer())
    local ok, errs, code = p:submit_sync("x", { timeout = 0.3 })
    assert.is_nil(ok)
    assert.equals("timeout", code)
    assert.equals("timeout", errs[1].code)
    assert.equals("local", errs[1].context)
  end)
end)

describe("submit_sync waits on the settled notice", function()
  local ns, ctx
  before_each(function() ns, ctx = S.world() end)
  after_each(function() S.end_world(ctx); ctx = nil end)

  it("asks the core for the outcome once, not every loop turn", function()
    local ch = ctx:channel("notice")
    assert(ch:consumer(function() ctx:sleep(0.3) end))
    local p = assert(ch:producer())
    -- many loop turns while the handler waits
    local ticks = 0
    local t = ctx:every(0.005, function() ticks = ticks + 1 end)
    local methods = getmetatable(ctx.c).__index
    local orig = methods.sync_result
    local calls = 0
    methods.sync_result = function(...) calls = calls + 1; return orig(...) end
    local ok, err, done
    ctx:after(0, function()
      ok, err = p:submit_sync("x", { timeout = 5 })
      done = true
    end)
    local good = pcall(function() assert.is_true(S.run_until(ctx, function() return done end, 10)) end)
    methods.sync_result = orig
    t:stop()
    assert.is_true(good)
    assert.is_true(ok, tostring(err))
    assert.is_true(ticks >= 10, "only " .. ticks .. " turns")
    assert.equals(1, calls)
  end)
end)
