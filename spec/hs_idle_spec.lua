-- A producer opened just before a long idle (issue 28, third review): its
-- dial to a consumer's process was still in its handshake when the program
-- stopped running the loop (the consumer's answer had not come yet); the
-- answer came during the idle, but on the first loop turn after it the
-- handshake deadline (handshake_timeout, wall time since the dial) closed
-- the connection before the answer waiting in the socket was read:
-- submit_sync failed with "handshake timeout (1 s) (closed)".  Made
-- deterministic here: the consumer's process is SIGSTOPped while the
-- producer is made (its HELLO waits unread), SIGCONTed at the start of the
-- idle (it answers during the idle), and the idle is longer than
-- handshake_timeout.  A peer that never answers is still cut at
-- handshake_timeout while the loop runs (last case; and
-- spec/limits_conn_spec.lua for the accepting side).
local S = require "spec.support"
local lecho = require "lecho"

-- A consumer of "hs.ch" (counts the events: service "hs.count") and a
-- service "hs.svc", with
-- its own name server elsewhere: the producer dials this process only
-- for the events.  Writes "ready" once joined.  arg[3]: a heartbeat (dead
-- after two), else the default.
local CONSUMER = [[
local lecho = require "lecho"
local hb = tonumber(arg[3])
local ctx = lecho.context{ nameserver = arg[1], quiet = true, heartbeat = hb, heartbeat_misses = hb and 2 }
local n = 0
assert(ctx:channel("hs.ch"):consumer(function(ev) n = n + 1 end))
ctx:service("hs.svc", function(a) return a.x * 2 end)
ctx:service("hs.count", function() return n end)
local f = assert(io.open(arg[2], "w")); f:write("ready\n"); f:close()
ctx:after(60, function() ctx:stop() end)
ctx:run()
]]

describe("a dial still in its handshake when the program stops running the loop", function()
  after_each(function() S.cleanup() end)

  local function world(hb)
    local _, ns = S.nameserver("--quiet")
    local file = S.tmpname("ready")
    local c = S.lua(CONSUMER, ns, file, hb)
    assert(S.wait_file(file, "ready", 20), "consumer did not start: " .. S.errors(c))
    return ns, c
  end

  it("completes with the answer that came during the idle: submit_sync delivers, at once", function()
    local ns, c = world()
    local ctx = lecho.context{ nameserver = ns, quiet = true, handshake_timeout = 1 }
    S.sigstop(c, "the consumer")
    local p = assert(ctx:channel("hs.ch"):producer())
    -- the dial to the consumer's process is out, its HELLO unanswered
    S.kill(c, "CONT")
    S.sleep(2) -- no loop turn: the answer arrives and waits; the deadline passes
    local t0 = ctx:now()
    local ok, errs, code = p:submit_sync({ x = 1 }, { timeout = 5 })
    local took = ctx:now() - t0
    assert.is_true(ok, ("%s %s"):format(tostring(errs), tostring(code)))
    assert.is_true(took < 1, ("took %.2f s"):format(took))
    assert(ctx:close())
  end)

  it("completes it for a call to that process after the idle: answered the first time, at once", function()
    local ns, c = world()
    local ctx = lecho.context{ nameserver = ns, quiet = true, handshake_timeout = 1 }
    S.sigstop(c, "the consumer")
    assert(ctx:channel("hs.ch"):producer())
    S.kill(c, "CONT")
    S.sleep(2)
    local t0 = ctx:now()
    local r, err, code = ctx:call("hs.svc", { x = 21 }, { timeout = 5 })
    local took = ctx:now() - t0
    assert.equals(42, r, ("%s %s"):format(tostring(err), tostring(code)))
    assert.is_true(took < 1, ("took %.2f s"):format(took))
    assert(ctx:close())
  end)

  it("redials at once, its queue whole, a dial whose remote closed it during the idle", function()
    -- the consumer's process cuts the silent dialler (our HELLO never went
    -- out: the connect completed during the idle) after 0.6 s: its ERROR
    -- and its close wait in the socket
    local ns, c = world(0.3)
    local ctx = lecho.context{ nameserver = ns, quiet = true, handshake_timeout = 1, heartbeat = 0.5 }
    S.sigstop(c, "the consumer")
    local p = assert(ctx:channel("hs.ch"):producer())
    for i = 1, 3 do assert(p:submit({ i = i })) end -- queued behind the handshake
    S.kill(c, "CONT")
    S.sleep(2)
    local t0 = ctx:now()
    local ok, errs, code = p:submit_sync({ x = 1 }, { timeout = 5 })
    local took = ctx:now() - t0
    assert.is_true(ok, ("%s %s"):format(tostring(errs), tostring(code)))
    assert.is_true(took < 1, ("took %.2f s"):format(took))
    -- nothing of the queue was written on the closed dial: it went whole on the new one
    assert.equals(4, ctx:call("hs.count", {}, { timeout = 5 }))
    assert(ctx:close())
  end)

  it("completes a keyed dial (connect, HELLO_OK and AUTH_OK waited) after the idle", function()
    local cjson = require "cjson"
    local T = require "spec.support.trust_world"
    local dir = S.tmpdir()
    local w = { mode = "keyed", duration = 40, dir = dir, ids = T.identities(dir) }
    local policy = S.write(dir .. "/policy.json", cjson.encode(T.policy_rules(T.CHANNEL)))
    os.execute("chmod 600 " .. S.sh_quote(policy))
    local _, ns = S.nameserver(("--quiet --key %s --trust %s --policy %s")
      :format(w.ids.nameserver.key, w.ids.trust, policy))
    w.ns = ns
    local c = T.consumer(w, "cons")
    local ctx = lecho.context{ nameserver = ns, quiet = true, key = w.ids.prod.key, trust = w.ids.trust,
                               handshake_timeout = 1 }
    S.sigstop(c, "the consumer")
    local p = assert(ctx:channel(T.CHANNEL):producer())
    S.kill(c, "CONT")
    S.sleep(2)
    local t0 = ctx:now()
    local ok, errs, code = p:submit_sync({ i = 1 }, { timeout = 5 })
    local took = ctx:now() - t0
    assert.is_true(ok, ("%s %s"):format(tostring(errs), tostring(code)))
    assert.is_true(took < 1, ("took %.2f s"):format(took))
    assert(ctx:close())
  end)

  it("still cuts a dial whose peer never answers at handshake_timeout while the loop runs", function()
    local ns, c = world()
    local ctx = lecho.context{ nameserver = ns, quiet = true, handshake_timeout = 1 }
    S.sigstop(c, "the consumer") -- for good: the kernel accepts the dial, nobody answers
    local t0 = ctx:now()
    local p = assert(ctx:channel("hs.ch"):producer())
    local ok, errs = p:submit_sync({ x = 1 }, { timeout = 5 })
    local took = ctx:now() - t0
    assert.is_nil(ok)
    assert.matches("handshake timeout (1 s)", tostring(errs), 1, true)
    assert.is_true(took >= 0.9 and took < 2, ("took %.2f s"):format(took))
    S.kill(c, "CONT")
    assert(ctx:close())
  end)

  it("cuts a dial whose connect completed during the idle but whose peer then never answers, one deadline later", function()
    local ns, c = world()
    local ctx = lecho.context{ nameserver = ns, quiet = true, handshake_timeout = 1 }
    S.sigstop(c, "the consumer") -- for good
    local p = assert(ctx:channel("hs.ch"):producer())
    S.sleep(2) -- the connect's answer waits: the deadline starts again once, our HELLO goes out, unanswered
    local t0 = ctx:now()
    local ok, errs = p:submit_sync({ x = 1 }, { timeout = 5 })
    local took = ctx:now() - t0
    assert.is_nil(ok)
    assert.matches("handshake timeout (1 s)", tostring(errs), 1, true)
    assert.is_true(took < 2.5, ("took %.2f s"):format(took))
    S.kill(c, "CONT")
    assert(ctx:close())
  end)
end)
