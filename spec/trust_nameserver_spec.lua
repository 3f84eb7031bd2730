-- The attacks of issue 10 on the name server and the leaks, played by a
-- rogue peer (spec/support/rogue.lua) against a world of a name server, a
-- producer and a consumer in their own processes
-- (spec/support/trust_world.lua):
--
--   * register_manager by anyone made new channels fail;
--   * 65,536 junk lookups filled the channel table: every new channel then
--     failed with "too many channels";
--   * `list` and a `join` as producer returned other consumers' modulator
--     source and params (an API token in params);
--   * tostring(emit) inside a modulator showed heap addresses.
--
-- Each is refused with a reason (a reply with ok = false, code and err
-- "[op: ]not allowed: mallory may not ACTION ..."), has no
-- effect (new channels still work, nothing of the consumer's modulator
-- reaches the rogue, no address in a modulator's output), leaves the
-- legitimate flow no more than 10% below its rate just before the attack, and is
-- bounded in time.  The rogue is "mallory": a key every process trusts, to
-- whom the policy allows nothing.  Protected mode (every local process is
-- trusted) keeps the two that do not need identities: `list` shows no
-- source or params, and modulators see no address.
--
-- Run: make && LUA_PATH="$PWD/lua/?.lua;$PWD/lua/?/init.lua;;" \
--   LUA_CPATH="$PWD/lua/?.so;;" LECHO_ROOT=$PWD luajit /usr/bin/busted spec/trust_nameserver_spec.lua

local support = require "spec.support"
local socket = require "socket"
local T = require "spec.support.trust_world"
local R = require "spec.support.rogue"

local TOKEN = "API-TOKEN-5b9e01"
local MARKER = "MODSRC-MARKER-c4d2"
local MODULATOR = ("-- %s\nfunction enqueue(ev) return ev end"):format(MARKER)

-- A new channel (a fresh producer and consumer on it) carries events.
local function fresh_channel_works(w, name)
  local c = T.consumer(w, "cons", { channel = name })
  T.producer(w, "prod", { channel = name })
  return T.wait_events(c, 20, 15), c
end

describe("the name server (keyed mode)", function()
  local w
  after_each(function() T.stop(w); w = nil end)

  it("mallory's register_manager is refused; new channels still work", function()
    w = T.start{ mode = "keyed" }
    local base, during, res = T.measure(w, function()
      local p, err = T.dial(w, w.ns, "mallory")
      if not p then return nil, err end
      p:ctrl{ op = "register_manager", rid = 1, channels = { w.ns .. "/fresh-a", w.ns .. "/" .. T.CHANNEL } }
      return p:reply(1, 5)
    end)
    local r = res[1]
    assert.truthy(r, "no reply to register_manager: " .. tostring(res[2]))
    assert.is_false(r.ok)
    assert.equals("refused", r.code)
    assert.matches("^[%w_]*:? ?not allowed: mallory may not manage", r.err)
    T.assert_unaffected(base, during, "register_manager")
    assert.is_true((fresh_channel_works(w, "fresh-a")), "a new channel failed after the attack")
  end)

  it("mallory's join as a producer is refused and carries no modulator source or params", function()
    w = T.start{ mode = "keyed", consumer = { modulator = MODULATOR, params = { token = TOKEN } } }
    local base, during, res = T.measure(w, function()
      local p, err = T.dial(w, w.ns, "mallory")
      if not p then return nil, err end
      p:ctrl{ op = "join", rid = 1, ch = w.ns .. "/" .. T.CHANNEL, role = "producer" }
      local r, rerr = p:reply(1, 5)
      return r, rerr, p
    end)
    local r = res[1]
    assert.truthy(r, "no reply to join: " .. tostring(res[2]))
    local bytes = assert(require("lecho.core").encode(r))
    assert.is_nil(bytes:find(TOKEN, 1, true), "the join reply leaks the consumer's params")
    assert.is_nil(bytes:find(MARKER, 1, true), "the join reply leaks the consumer's modulator source")
    assert.is_false(r.ok)
    assert.equals("refused", r.code)
    assert.matches("^[%w_]*:? ?not allowed: mallory may not produce", r.err)
    T.assert_unaffected(base, during, "join as producer")
  end)
end)

for _, mode in ipairs{ "keyed", "protected" } do
  describe("name server quotas and leaks (" .. mode .. " mode)", function()
    local w
    after_each(function() T.stop(w); w = nil end)

    it("65,536 junk lookups are refused and cost the sender only: new channels still work", function()
      w = T.start{ mode = mode }
      local N, BATCH = 65536, 4096
      local base, during, res = T.measure(w, function()
        local p, err = T.dial(w, w.ns, "mallory")
        if not p then return nil, err end
        local refused, accepted, errs = 0, 0, {}
        local deadline = socket.gettime() + 120
        for first = 1, N, BATCH do
          local frames = {}
          for rid = first, first + BATCH - 1 do
            frames[#frames + 1] = R.ctrl{ op = "lookup", rid = rid, ch = ("%s/junk-%d"):format(w.ns, rid) }
          end
          assert(p:send(table.concat(frames)), "the name server closed the rogue's connection")
          for rid = first, first + BATCH - 1 do
            local r, rerr = p:reply(rid, math.max(1, deadline - socket.gettime()))
            if not r then return nil, ("lookup %d: %s"):format(rid, tostring(rerr)) end
            if r.ok then
              accepted = accepted + 1
            else
              refused = refused + 1
              errs[r.code .. " " .. r.err] = (errs[r.code .. " " .. r.err] or 0) + 1
            end
          end
        end
        return { refused = refused, accepted = accepted, errs = errs }
      end)
      local r = res[1]
      assert.truthy(r, tostring(res[2]))
      assert.equals(N, r.refused + r.accepted)
      assert.is_true(r.refused > 0, "no junk lookup was refused")
      -- refused by the policy (keyed: mallory may create nothing) or by the
      -- requester's quota (both modes)
      for e in pairs(r.errs) do
        assert.is_truthy(e:match("^refused [%w_]*:? ?not allowed: mallory may not") or e:match("^limit "), e)
      end
      assert.is_true((fresh_channel_works(w, "fresh-b")), "a new channel failed after the junk lookups")
      T.assert_unaffected(base, during, "65,536 junk lookups")
    end)

    it("list shows no modulator source or params", function()
      w = T.start{ mode = mode, consumer = { modulator = MODULATOR, params = { token = TOKEN } } }
      local base, during, res = T.measure(w, function()
        local p, err = T.dial(w, w.ns, "mallory")
        if not p then return nil, err end
        p:ctrl{ op = "list", rid = 1 }
        return p:reply(1, 5)
      end)
      local r = res[1]
      assert.truthy(r, "no reply to list: " .. tostring(res[2]))
      local bytes = assert(require("lecho.core").encode(r))
      assert.is_nil(bytes:find(TOKEN, 1, true), "list leaks the consumer's params")
      assert.is_nil(bytes:find(MARKER, 1, true), "list leaks the consumer's modulator source")
      if mode == "keyed" and not r.ok then
        -- mallory may not list: refused, with the reason
        assert.matches("^[%w_]*:? ?not allowed: mallory may not list", r.err)
      elseif mode == "keyed" then
        -- or the answer leaves out what mallory may not see
        assert.is_nil((r.channels or {})[w.ns .. "/" .. T.CHANNEL], "mallory sees the channel in list")
      else
        assert.is_true(r.ok)
        assert.truthy(r.channels[w.ns .. "/" .. T.CHANNEL], "the channel is not in list")
      end
      T.assert_unaffected(base, during, "list")
    end)

    it("a modulator sees no heap address in tostring of functions and tables", function()
      local src = [[
        function enqueue(ev)
          return { i = ev.i, e = tostring(emit), t = tostring({}), f = tostring(enqueue),
                   p = tostring(print), s = tostring(string), m = ("%s"):format(emit) }
        end
      ]]
      w = T.start{ mode = mode, consumer = { modulator = src, dump = true } }
      local vals = {}
      for line in support.output(w.cons):gmatch("val ([^\n]+)\n") do vals[#vals + 1] = line end
      assert.is_true(#vals > 0, "the modulated consumer got nothing")
      for _, v in ipairs(vals) do
        assert.is_nil(v:find("0x%x%x%x%x"), "a modulator's output shows an address: " .. v)
      end
      assert.matches('"e":"function', vals[1])
    end)
  end)
end
