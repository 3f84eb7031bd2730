-- The attacks of issue 10 on connections, played by a rogue peer
-- (spec/support/rogue.lua) against a world of a name server, a producer and
-- a consumer in their own processes (spec/support/trust_world.lua):
--
--   * a HELLO claiming the consumer's address, at the producer: it took
--     over the consumer's connection and its events;
--   * the same at the name server every 0.5 s: the consumer was dropped
--     from the member list again and again;
--   * BIND + EVENT from a peer that is not a producer of the channel: the
--     consumer delivered them.
--
-- Each is refused with a reason (the ERROR of the handshake, or the ACK's
-- error of a refused BIND), has no effect (no event to the rogue, no forged
-- event delivered), leaves the legitimate flow no more than 10% below its rate just
-- before the attack, and is bounded in time.  Keyed mode: the rogue is
-- "mallory" (trusted key, allowed nothing) or "stranger" (untrusted key).
-- Protected mode (no keys) refuses the takeovers too: no HELLO replaces a
-- live connection; it lets any local process BIND (as documented).
--
-- Run: make && LUA_PATH="$PWD/lua/?.lua;$PWD/lua/?/init.lua;;" \
--   LUA_CPATH="$PWD/lua/?.so;;" LECHO_ROOT=$PWD luajit /usr/bin/busted spec/trust_peers_spec.lua

local support = require "spec.support"
local socket = require "socket"
local T = require "spec.support.trust_world"
local R = require "spec.support.rogue"

-- The reason a handshake of `who` claiming `addr` must be refused with.
local function takeover_reason(w, who, addr)
  if w.mode == "keyed" and who == "stranger" then
    return "^ERROR: not trusted: stranger " .. R.hex(w.ids.stranger.pk)
  elseif w.mode == "keyed" then
    return "^ERROR: address " .. addr:gsub("%p", "%%%0") .. " belongs to another identity"
  end
  return "^ERROR: address " .. addr:gsub("%p", "%%%0") .. " already has a live connection"
end

-- Forged events carry a negative i: the consumer must print none.
local function forged_delivered(w)
  local n = 0
  for _, e in ipairs(T.events(w.cons)) do
    if type(e.i) == "number" and e.i < 0 then n = n + 1 end
  end
  return n
end

for _, mode in ipairs{ "keyed", "protected" } do
  describe("impersonation (" .. mode .. " mode)", function()
    local w
    after_each(function() T.stop(w); w = nil end)
    local rogues = mode == "keyed" and { "mallory", "stranger" } or { "rogue" }

    for _, who in ipairs(rogues) do
      it(who .. ": a HELLO claiming the consumer's address does not take its connection at the producer",
         function()
        w = T.start{ mode = mode }
        local base, during, res = T.measure(w, function()
          local p, err, half = T.dial(w, w.prod.addr, who, w.cons.addr)
          local got = 0
          if p then
            got = #p:drain(2, 1).events
          elseif half then
            got = #half:drain(0.5, 1).events
          end
          return p, err, got
        end)
        local p, err, got = res[1], res[2], res[3]
        assert(p == nil, ("the producer took the rogue for its consumer (%d events to the rogue)"):format(got))
        assert.matches(takeover_reason(w, who, w.cons.addr), tostring(err))
        assert.equals(0, got, "the rogue received events")
        T.assert_unaffected(base, during, "HELLO takeover at the producer")
      end)
    end

    it("a HELLO claiming the consumer's address at the name server every 0.5 s is refused each time",
       function()
      w = T.start{ mode = mode }
      local who = rogues[1]
      local base, during, res = T.measure(w, function()
        local errs = {}
        for i = 1, 8 do
          local t = socket.gettime()
          local p, err = T.dial(w, w.ns, who, w.cons.addr)
          if p then
            errs[i] = "accepted"
            p:close()
          else
            errs[i] = tostring(err)
          end
          support.sleep(math.max(0, 0.5 - (socket.gettime() - t)))
        end
        return errs
      end)
      for i, e in ipairs(res[1]) do
        assert.matches(takeover_reason(w, who, w.cons.addr), e, nil, "attempt " .. i)
      end
      T.assert_unaffected(base, during, "HELLO takeover at the name server")
    end)
  end)
end

describe("injection (keyed mode)", function()
  local w
  after_each(function() T.stop(w); w = nil end)

  it("mallory: BIND + 50 EVENTs to the consumer are dropped; a sync one is answered with the reason",
     function()
    w = T.start{ mode = "keyed" }
    local name = w.ns .. "/" .. T.CHANNEL
    local base, during, res = T.measure(w, function()
      local p, err = T.dial(w, w.cons.addr, "mallory")
      if not p then return nil, err end
      local frames = { R.bind(1, name) }
      for k = 1, 50 do
        frames[#frames + 1] = R.event(1, 1, k, 0, { i = -k, secret = "FORGED" })
      end
      frames[#frames + 1] = R.event(1, 1, 51, 1, { i = -51, secret = "FORGED" })
      p:send(table.concat(frames))
      local ack, aerr = p:expect(R.F.ACK, 5)
      return ack and R.parse_ack(ack), aerr
    end)
    local ack = res[1]
    assert.truthy(ack, "no ACK for the forged sync event: " .. tostring(res[2]))
    assert.equals(0, ack.nran)
    assert.same({ { consumer = w.cons.addr, err = "not an authorized producer of " .. name, code = "refused" } },
                ack.errs)
    support.sleep(0.5)
    assert.equals(0, forged_delivered(w), "the consumer delivered forged events")
    T.assert_unaffected(base, during, "BIND + EVENT injection")
  end)

  it("stranger: the consumer refuses the connection before any BIND", function()
    w = T.start{ mode = "keyed" }
    local p, err = T.dial(w, w.cons.addr, "stranger")
    assert.is_nil(p)
    assert.matches("^ERROR: not trusted: stranger " .. R.hex(w.ids.stranger.pk), tostring(err))
  end)
end)
