-- Channel managers started apart from the name server: the name server maps
-- each channel to one of them, data flows straight between the processes,
-- and the loss of a manager is repaired by joining again (soft state).
local cjson = require "cjson"
local lecho = require "lecho"
local S = require "spec.support"
local kids = require "spec.children"

local function manager(ns)
  local pf = S.tmpname("mgr")
  local child = S.spawn(("%s %s/scripts/lecho-manager --nameserver %s --port-file %s --for 60 --quiet")
    :format(S.luajit, S.root, ns, pf))
  local addr = S.wait_file(pf, "%d+:%d+", 20)
  assert(addr, "manager did not start: " .. S.errors(child))
  return child, addr:match("[^\n]+")
end

describe("separate channel managers", function()
  after_each(function() S.cleanup() end)

  it("take a new manager's member lists after losing the old one (its versions restart)", function()
    local ctx = lecho.context{ quiet = true }
    local ch = ctx:channel("v")
    ch.manager, ch.ver = "127.0.0.1:1", 57          -- as if managed there up to version 57
    ctx:_on_peer(99, "127.0.0.1:1", false, "gone")
    ch.manager = "127.0.0.1:2"    -- the rejoin's lookup named the next manager (lists come only from it)
    ctx:_on_ctrl("127.0.0.1:2", { op = "members", ch = ch.name, ver = 6, mid = 1,
                                  consumers = { "127.0.0.1:3" } })
    assert.are.same({ "127.0.0.1:3" }, ch.dests)
    ctx:close()
  end)

  it("spread channels over the managers, and survive the loss of one", function()
    local _, ns = S.nameserver("--quiet")
    local m1, a1 = manager(ns)
    local _, a2 = manager(ns)
    local ctx = lecho.context{ nameserver = ns, quiet = true }
    local cons = S.lua(kids.consumer, cjson.encode{ ns = ns, channels = { "a", "b", "c", "d" },
                                                    stop_on = "end", duration = 30 })
    assert(S.wait_file(cons.out, "ready", 20))
    local ps = {}
    for _, n in ipairs{ "a", "b", "c", "d" } do
      ps[n] = assert(ctx:channel(n):producer())
      assert.is_true(ps[n]:submit_sync(n, { timeout = 5 }))
    end
    -- Each channel went to a manager, both managers got some.
    local chans = assert(ctx:list())
    local by = {}
    for name, info in pairs(chans) do
      if name:match("/[abcd]$") then by[info.manager] = (by[info.manager] or 0) + 1 end
    end
    assert.are.equal(2, by[a1])
    assert.are.equal(2, by[a2])
    -- Kill the first manager: its channels are joined again through another.
    S.kill(m1, "KILL")
    assert.is_true(S.run_until(ctx, function()
      for _, n in ipairs{ "a", "b", "c", "d" } do
        -- (true with no destination at all proves nothing: the consumer
        -- must be known to the producer again)
        if #ps[n].ch.dests == 0 then return false end
        local ok = ps[n]:submit_sync("after", { timeout = 1 })
        if not ok then return false end
      end
      return ctx:channel("a").manager == a2 and ctx:channel("b").manager == a2
         and ctx:channel("c").manager == a2 and ctx:channel("d").manager == a2
    end, 20))
    assert.is_true(ps.a:submit_sync("end", { timeout = 5 }))
    assert.is_true(S.wait(cons, 20, ctx))
    local r = cjson.decode(S.output(cons):match("({.*})"))
    -- Events submitted while the consumer was between managers did not
    -- reach it (gaps), but what arrived is in order and without duplicates.
    assert.is_true(r.increasing_ok)
    for _, n in ipairs{ "a", "b", "c", "d" } do
      assert.is_true(r.by[n] >= 2)
    end
    ctx:close()
  end)
end)
