-- ctx:close() after a remote that stopped running its loop (issue 28, the
-- seventh outside review, D): eight 2 MiB submit_sync all returned true, the
-- consumer then stopped; the producer's close raised timeout "1 connection
-- not closed by their remote within the linger time of 2s: what was sent
-- there may not have been read", though every event sent there had been
-- answered.  The last event written on a connection answered by its remote
-- (an ACK) says it read everything before it too: nothing can be unread
-- there, and close says so in the log, not as a failure.  An async event
-- after it is not answered: close still fails, in better grammar.
--
-- Run: make spec BUSTED_ARGS=spec/close_answered_spec.lua

local lecho = require "lecho"
local S = require "spec.support"

-- A consumer of `name` in another process that prints "got N" per event.
local CONSUMER = [[
local lecho = require "lecho"
local ctx = lecho.context{ nameserver = arg[1], quiet = true }
local n = 0
assert(ctx:channel(arg[2]):consumer(function() n = n + 1; io.stdout:write("got ", n, "\n"); io.stdout:flush() end))
io.stdout:write("ready\n"); io.stdout:flush()
ctx:after(60, function() ctx:stop() end)
ctx:run()
]]

describe("close after a remote stopped running its loop (issue 28, review 7, D)", function()
  local ns
  before_each(function()
    local _
    _, ns = S.nameserver("--quiet")
  end)
  after_each(function() S.cleanup() end)

  local function setup(name)
    local child = S.lua(CONSUMER, ns, name)
    assert(S.wait_file(child.out, "ready", 20), "consumer did not start: " .. S.errors(child))
    local logs = {}
    local ctx = lecho.context{ nameserver = ns, linger = 1, log = function(_, msg) logs[#logs + 1] = msg end }
    local p = assert(ctx:channel(name):producer())
    local big = string.rep("x", 2 * 1024 * 1024)
    for i = 1, 8 do
      local ok, err = p:submit_sync({ i = i, data = big }, { timeout = 20 })
      assert.is_true(ok, tostring(err))
    end
    return child, ctx, p, logs
  end

  it("is true when every event sent there was answered (8 x 2 MiB submit_sync), and says so in the log", function()
    local child, ctx, _, logs = setup("answered")
    S.kill(child, "STOP")       -- its loop runs no more: it never closes its side
    local ok, err, code = ctx:close()
    S.kill(child, "CONT")
    assert.is_true(ok, tostring(err) .. " " .. tostring(code))
    local said
    for _, l in ipairs(logs) do
      if l:find("1 connection not closed by its remote within the linger time of 1s (nothing of ours unread there",
                1, true) then said = l end
    end
    assert.truthy(said, "no log line of the open connection: " .. table.concat(logs, " | "))
  end)

  it("fails when an async event followed (not answered): 'connection not closed by its remote'", function()
    local child, ctx, p, _ = setup("unanswered")
    assert.truthy(p:submit("after"))
    ctx:flush()
    assert(S.wait_file(child.out, "got 9", 20), "the async event did not come")
    S.kill(child, "STOP")
    local ok, err, code = ctx:close()
    S.kill(child, "CONT")
    assert.is_nil(ok)
    assert.are.equal("timeout", code)
    -- (the child confirms reads: the count of what it did not confirm)
    assert.are.equal("1 connection not closed by its remote within the linger time of 1s: "
      .. "1 events (16 bytes) written there not confirmed read", err)
  end)
end)
