-- Proves the sync path of the core binding (lecho.core): the outcome of a
-- sync submit comes from one call, ctx:sync_result(ids[, timeout]), and a
-- sync event whose dispatch ends at once is acknowledged by C with what the
-- event hook returned (held, nran, errors), with no ctx:ack from Lua.  A
-- dispatch that waits (held) is acknowledged later by ctx:ack.  Local
-- consumers, and a consumer context over TCP on 127.0.0.1 (port from the OS).
--
-- Run: make && LUA_PATH="$PWD/lua/?.lua;$PWD/lua/?/init.lua;;" \
--   LUA_CPATH="$PWD/lua/?.so;;" LECHO_ROOT=$PWD luajit /usr/bin/busted spec/core_sync_spec.lua

local core = require "lecho.core"
local socket = require "socket"

local function drive(ctxs, done, seconds)
  local deadline = socket.gettime() + (seconds or 5)
  while not done() do
    assert(socket.gettime() < deadline, "timed out")
    for _, c in ipairs(ctxs) do c:run_once(0.01) end
  end
end

describe("the core's sync path", function()
  local c, ch, calls
  before_each(function()
    c = core.new()
    assert(c:listen("127.0.0.1:0"))
    ch = c:channel("127.0.0.1:1/sync")
    c:set_local(ch, true)
    calls = 0
  end)
  after_each(function() c:close() end)

  it("a dispatch that returns nran is acknowledged from C; sync_result says true once", function()
    c:hooks({ event = function(_, v, peer, _, _, sync)
      calls = calls + 1
      assert.equals("v", v)
      assert.equals(0, peer)
      assert.is_true(sync > 0)
      return false, 1, nil
    end })
    local sid = assert(c:submit(ch, 1, 1, "v", true, "block"))
    assert.equals(false, c:sync_result(sid))
    c:drain_local()
    assert.equals(1, calls)
    assert.equals(true, c:sync_result(sid))
  end)

  it("handler errors returned by the dispatch come back as nil, errors", function()
    c:hooks({ event = function() return false, 2, { { consumer = "c1", err = "boom" } } end })
    local sid = assert(c:submit(ch, 1, 1, "v", true, "block"))
    c:drain_local()
    local ok, errs = c:sync_result({ sid })
    assert.is_nil(ok)
    -- an entry without a code (what an ACK of a peer older than codes
    -- carries) is a handler's error: "failed"
    assert.same({ { context = "local", consumer = "c1", err = "boom", code = "failed" } }, errs)
  end)

  it("a held dispatch is not acknowledged until ctx:ack; the timeout names the silent context", function()
    local held
    c:hooks({ event = function(chid, _, peer, _, _, sync) held = { peer, sync }; return true, 1, nil end })
    local sid = assert(c:submit(ch, 1, 1, "v", true, "block"))
    c:drain_local()
    assert.truthy(held)
    assert.equals(false, c:sync_result(sid))
    local ok, errs = c:sync_result(sid, 2)
    assert.is_nil(ok)
    assert.same({ { context = "local", err = "consumer context local: no answer within 2 s", code = "timeout" } }, errs)
    -- the record is gone: a late answer changes nothing
    c:ack(held[1], held[2], 1, nil)
    assert.equals(true, c:sync_result(sid))
  end)

  it("an old-style hook (held only) leaves the ack to Lua", function()
    local held
    c:hooks({ event = function(_, _, peer, _, _, sync) held = { peer, sync }; return false end })
    local sid = assert(c:submit(ch, 1, 1, "v", true, "block"))
    c:drain_local()
    assert.equals(false, c:sync_result(sid))
    c:ack(held[1], held[2], 1, nil)
    assert.equals(true, c:sync_result(sid))
  end)

  it("a remote consumer context acknowledges from C over TCP", function()
    local r = core.new()
    assert(r:listen("127.0.0.1:0"))
    local rch = r:channel("127.0.0.1:1/sync")
    r:set_local(rch, true)
    local got = 0
    r:hooks({ event = function(_, v, peer, _, _, sync)
      got = got + 1
      assert.is_true(peer > 0)
      if v == "coded" then
        -- codes travel in the ACK; one outside errors.h's list, or not a
        -- string, is "failed"; the context is the reader's, never the peer's
        return false, 1, { { consumer = "r1", err = "timed out, refused, closed", code = "limit" },
                           { consumer = "r2", err = "x", code = "banana" },
                           { consumer = "r3", err = "y", code = 7, context = "elsewhere" } }
      end
      return false, 1, v == "bad" and { { consumer = "r1", err = "no" } } or nil
    end })
    c:set_local(ch, false)
    c:set_dests(ch, { r:addr() })
    local sid = assert(c:submit(ch, 1, 1, "ok", true, "block"))
    local ok, errs
    drive({ c, r }, function() ok, errs = c:sync_result(sid); return ok ~= false end)
    assert.equals(true, ok)
    sid = assert(c:submit(ch, 1, 2, "bad", true, "block"))
    drive({ c, r }, function() ok, errs = c:sync_result(sid); return ok ~= false end)
    assert.is_nil(ok)
    assert.same({ { context = r:addr(), consumer = "r1", err = "no", code = "failed" } }, errs)
    sid = assert(c:submit(ch, 1, 3, "coded", true, "block"))
    drive({ c, r }, function() ok, errs = c:sync_result(sid); return ok ~= false end)
    assert.is_nil(ok)
    assert.same({ { context = r:addr(), consumer = "r1", err = "timed out, refused, closed", code = "limit" },
                  { context = r:addr(), consumer = "r2", err = "x", code = "failed" },
                  { context = r:addr(), consumer = "r3", err = "y", code = "failed" } }, errs)
    assert.equals(3, got)
    r:close()
  end)
end)
