-- Every options table rejects a key it does not know, naming it (a typo is
-- never its default), and every API error return carries a code from
-- lecho.errors as its third value.
local lecho = require "lecho"
local errors = require "lecho.errors"
local S = require "spec.support"

local function raises(msg, fn, ...)
  local ok, err = pcall(fn, ...)
  assert.is_false(ok)
  assert.are.equal(msg, tostring(err):gsub("^[^:]*:%d+: ", ""))
end

describe("unknown options", function()
  local ctx
  before_each(function() ctx = lecho.context{ quiet = true } end)
  after_each(function() if ctx then ctx:close() end ctx = nil end)

  it("are refused by lecho.context, with the key's name", function()
    raises("lecho.context: unknown option 'namserver'", lecho.context,
           { namserver = "127.0.0.1:7700", quiet = true })
    raises("lecho.context: options must be a table, not a string", lecho.context, "127.0.0.1:7700")
  end)

  it("are refused by ctx:channel, ch:producer, ch:consumer, p:submit_sync and ctx:close", function()
    raises("ctx:channel: unknown option 'creat'", ctx.channel, ctx, "a", { creat = false })
    local ch = ctx:channel("a")
    raises("ch:producer: unknown option 'polcy'", ch.producer, ch, { polcy = "block" })
    raises("ch:consumer: unknown option 'modulater'", ch.consumer, ch, function() end,
           { modulater = "function enqueue(ev) return ev end" })
    -- the values of the lists in lecho.options, too
    raises("lecho: unknown policy 'drop'", ch.producer, ch, { policy = "drop" })
    raises("lecho: unknown capability 'clok' (known: clock, log)", ch.producer, ch, { grant = { "clok" } })
    raises("lecho: unknown capability 'clok' (known: clock, log)", ch.consumer, ch, function() end,
           { modulator = "function enqueue(ev) return ev end", capabilities = { "clok" } })
    local p = assert(ch:producer())
    raises("p:submit_sync: unknown option 'timout'", p.submit_sync, p, 1, { timout = 1 })
    raises("ctx:close: unknown option 'lingr'", ctx.close, ctx, { lingr = 0 })
    -- nothing was made by the refused calls
    assert.are.equal(1, ctx:stats().channels[ctx.addr .. "/a"].producers)
    assert.are.equal(0, ctx:stats().channels[ctx.addr .. "/a"].consumers)
  end)

  it("take every option doc/api.md documents", function()
    ctx:close()
    ctx = lecho.context{ quiet = true, listen = "127.0.0.1:0", timeout = 5, sync_timeout = 10,
                         linger = 0, queue_limit = 1024 * 1024, policy = "block", batch_bytes = 65536,
                         max_string = 1024 * 1024, max_depth = 32, max_frame = 2 * 1024 * 1024,
                         pin_threshold = 65536, retry_interval = 0.1, retry_max = 1, heartbeat = 1,
                         heartbeat_misses = 3, modulator_budget = 0.005, modulator_memory = 16 * 1024 * 1024,
                         ack_timeout = 2, settle = 0, forget_after = 30, channel_quota = 100, peer_free_after = 30,
                         log_window = 10, max_groups = 100, group_quota = 10,
                         log = function() end, nameserver_principal = "nameserver" }
    local p = assert(ctx:channel("b"):producer{ policy = "drop_oldest", grant = { "clock" } })
    assert(ctx:channel("b"):consumer(function() end, { modulator = "function enqueue(ev) return ev end",
                                                       params = {}, period = 1, capabilities = { "clock" },
                                                       on_error = function() end }))
    assert.is_true(p:submit_sync(1, { timeout = 2 }))
  end)
end)

describe("error codes", function()
  local ctx
  after_each(function() if ctx then ctx:close() end ctx = nil end)

  it("are all listed in lecho.errors", function()
    for _, c in ipairs{ "timeout", "closed", "refused", "limit", "wouldblock", "invalid",
                        "notfound", "io", "protocol", "nomem", "failed" } do
      assert.is_string(errors.CODES[c], c)
    end
  end)

  it("come with submit and submit_sync failures", function()
    ctx = lecho.context{ quiet = true, max_string = 100 }
    local ch = ctx:channel("c")
    local p = assert(ch:producer())
    local r, err, code = p:submit(function() end)
    assert.are.same({ nil, "cannot encode a function at ev", "invalid" }, { r, err, code })
    r, err, code = p:submit(("x"):rep(200))
    assert.is_nil(r)
    assert.are.equal("limit", code, err)
    ch:consumer(function() error("boom", 0) end)
    r, err, code = p:submit_sync(1)
    assert.is_nil(r)
    assert.are.equal("failed", code)
    assert.are.equal("failed", err[1].code)
    assert.matches(": boom$", tostring(err))
    p:close()
    assert.are.same({ nil, "producer is closed", "closed" }, { p:submit(1) })
    assert.are.same({ nil, "producer is closed", "closed" }, { p:submit_sync(1) })
  end)

  it("come with the value codec", function()
    assert.are.same({ nil, "cannot encode a function at ev", "invalid" }, { lecho.encode(print) })
    local r, err, code = lecho.decode("\255\1")
    assert.is_nil(r)
    assert.is_string(err)
    assert.are.equal("invalid", code)
    assert.are.same({ true, { 1, "a" } }, { lecho.decode(lecho.encode({ 1, "a" })) })
  end)

  it("come with control requests: a name server that refuses the connection", function()
    ctx = lecho.context{ quiet = true, nameserver = S.refusing_addr(), timeout = 2, retry_max = 0.2 }
    local r, err, code = ctx:channel("d"):producer()
    assert.is_nil(r)
    assert.matches("unreachable", err)
    assert.are.equal("refused", code)
    r, err, code = ctx:channel("d"):consumer(function() end)
    assert.is_nil(r)
    assert.are.equal("refused", code, err)
  end)

  it("come with control requests: a name server that does not answer", function()
    -- A process that accepts the connection and never says a word.
    local child = S.lua([[
      local socket = require "socket"
      local s = assert(socket.bind("127.0.0.1", 0))
      print(select(2, s:getsockname())) io.stdout:flush()
      local c = s:accept()
      socket.sleep(20)
    ]])
    local port = S.wait_file(child.out, "%d+")
    assert(port, S.errors(child))
    ctx = lecho.context{ quiet = true, nameserver = "127.0.0.1:" .. port:match("%d+"), timeout = 0.5 }
    local r, err, code = ctx:channel("e"):producer()
    assert.is_nil(r)
    assert.are.equal("timeout", code, err)
    S.kill(child, "KILL")
  end)

  teardown(S.cleanup)
end)
