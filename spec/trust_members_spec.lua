-- The attacks of issue 10 through forged `members` messages, played by a
-- rogue peer (spec/support/rogue.lua) against a world of a name server, a
-- producer and a consumer (spec/support/trust_world.lua), each in its own
-- process on 127.0.0.1.  In keyed mode the rogue is "mallory" (a key every
-- process trusts, to whom the policy allows nothing) or "stranger" (a key
-- nobody trusts); in protected mode it has no key.  Each case proves:
--
--   * the attack is refused with a reason: the ERROR of the handshake, or
--     the producer's log line saying why it ignored the message;
--   * it had no effect: the rogue receives no event, no modulator of its
--     runs, a consumer that joins afterwards still gets events;
--   * the legitimate flow is unaffected: the consumer's rate during the
--     attack is no more than 10% below its rate just before it (same run);
--   * everything is bounded in time (every wait has a deadline).
--
-- Run: make && LUA_PATH="$PWD/?.lua;$PWD/lua/?.lua;$PWD/lua/?/init.lua;;" \
--   LUA_CPATH="$PWD/lua/?.so;;" LECHO_ROOT=$PWD luajit /usr/bin/busted spec/trust_members_spec.lua

local support = require "spec.support"
local T = require "spec.support.trust_world"
local R = require "spec.support.rogue"
local P = require "spec.support.proc"

-- The rogue, connected to the producer as `who`, sends `members` with the
-- given fields (ch defaults to the world's channel, consumers to the
-- rogue's own address), then listens for what the producer sends it.
-- Returns { refused = ERROR text or nil, events = n, secrets = n }.
local function forge_members(w, who, fields)
  local p, err = T.dial(w, w.prod.addr, who)
  if not p then return { refused = err, events = 0, secrets = 0 } end
  local msg = { op = "members", ch = w.ns .. "/" .. T.CHANNEL, ver = 2 ^ 40, mid = 1,
                consumers = { w.rogue_srv.addr } }
  for k, v in pairs(fields or {}) do msg[k] = v end
  if msg.consumers == false then msg.consumers = {} end
  p:ctrl(msg)
  local out = { events = 0, secrets = 0 }
  -- The producer would dial the address the list names: ours.
  local q = w.rogue_srv:accept{ addr = w.rogue_srv.addr, key = T.key(w, who), timeout = 2 }
  local d = p:drain(1, 1)
  out.refused = d.error
  for _, src in ipairs{ d, q and q:drain(2, 1) or { events = {} } } do
    for _, e in ipairs(src.events) do
      out.events = out.events + 1
      if type(e.value) == "table" and tostring(e.value.secret or e.value.s):find("TOPSECRET", 1, true) then
        out.secrets = out.secrets + 1
      end
    end
  end
  return out
end

-- The reason the producer gives for ignoring the rogue's members: its log
-- line, waited for (a loaded machine may write it after the rogue's drain).
local function producer_said_why(w)
  local log
  local said = P.wait_until(function()
    log = support.errors(w.prod, 1e6)
    return log:find("ignoring a members message from " .. w.rogue_srv.addr, 1, true)
  end, 10)
  return said ~= nil, log
end

local function refused_with_reason(w, who, r)
  if w.mode == "keyed" and who == "stranger" then
    assert.matches("^ERROR: not trusted: stranger " .. R.hex(w.ids.stranger.pk), tostring(r.refused))
  else
    local said, log = producer_said_why(w)
    assert(said, "the producer did not say why it ignored the rogue's members; its log:\n" .. log)
  end
end

for _, mode in ipairs{ "keyed", "protected" } do
  describe("forged members (" .. mode .. " mode)", function()
    local w
    after_each(function() T.stop(w); w = nil end)
    local rogues = mode == "keyed" and { "mallory", "stranger" } or { "rogue" }

    for _, who in ipairs(rogues) do
      it(who .. ": members naming the rogue as a consumer sends it nothing", function()
        w = T.start{ mode = mode }
        local base, during, res = T.measure(w, function() return forge_members(w, who) end)
        local r = res[1]
        assert.equals(0, r.events, "the rogue received the channel's events")
        assert.equals(0, r.secrets)
        refused_with_reason(w, who, r)
        T.assert_unaffected(base, during, "forged members")
      end)
    end

    it("members with a modulator: the rogue's code does not run in the producer", function()
      w = T.start{ mode = mode }
      local who = rogues[1]
      local src = "function enqueue(ev) return { pwned = true, s = ev.secret } end"
      local base, during, res = T.measure(w, function()
        return forge_members(w, who, { consumers = false,
                                       mods = { k1 = { src = src, params = {}, caps = {}, base = "b1",
                                                       dests = { w.rogue_srv.addr } } } })
      end)
      local r = res[1]
      assert.equals(0, r.events, "the rogue's modulator ran and sent it events")
      refused_with_reason(w, who, r)
      T.assert_unaffected(base, during, "members with a modulator")
    end)

    it("members with ver = 1e300 and no consumer freezes nothing: a consumer that joins later gets events",
       function()
      w = T.start{ mode = mode }
      local who = rogues[1]
      local base, during, res = T.measure(w, function()
        return forge_members(w, who, { ver = 1e300, consumers = false })
      end)
      refused_with_reason(w, who, res[1])
      T.assert_unaffected(base, during, "members ver=1e300")
      local later = T.consumer(w, "cons2")
      assert.is_true(T.wait_events(later, 20, 10), "a consumer that joined after the attack got nothing")
      assert.is_true(T.wait_events(w.cons, #T.events(w.cons) + 20, 10), "the first consumer stopped")
    end)

    it("members with a modulator whose xpcall handler loops does not stop the producer", function()
      w = T.start{ mode = mode }
      local who = rogues[1]
      local src = "xpcall(function() error('x') end, function() while true do end end)"
      local base, during, res = T.measure(w, function()
        local r = forge_members(w, who, { consumers = false,
                                          mods = { k2 = { src = src, params = {}, caps = {}, base = "b2",
                                                          dests = { w.rogue_srv.addr } } } })
        support.sleep(2)     -- a producer stopped for good shows within the window
        return r
      end)
      refused_with_reason(w, who, res[1])
      T.assert_unaffected(base, during, "members with a looping xpcall modulator")
    end)
  end)
end
