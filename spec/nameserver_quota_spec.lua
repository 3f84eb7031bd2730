-- Proves the name server's bound on what lookups cost (issue 10): a lookup
-- that would make a channel entry is charged to its requester (a context's
-- address; its principal in keyed mode), at most channel_quota entries each
-- (4096 by default) until the channel is joined or forgotten; past that the requester gets
-- the error "lookup: too many channels created by ADDR (limit N per
-- requester)" with code "limit", and the others are unaffected.  So 65,536
-- junk lookups from one local process, which used to fill the table and make
-- every new channel fail, leave room for a legitimate channel.
--
-- Run: make && LUA_PATH="$PWD/lua/?.lua;$PWD/lua/?/init.lua;;" \
--   LUA_CPATH="$PWD/lua/?.so;;" LECHO_ROOT=$PWD luajit /usr/bin/busted spec/nameserver_quota_spec.lua

local lecho = require "lecho"
local socket = require "socket"
local R = require "lecho.ns.registry"
local S = require "spec.support"

local NS = "127.0.0.1:7700"
local A, B = "10.0.0.1:1", "10.0.0.2:2"

local function registry(extra)
  local o = { addr = NS, role = "nameserver", settle = 1 }
  for k, v in pairs(extra or {}) do o[k] = v end
  local reg, out = R.new(o), {}
  local function send(to, msg) out[#out + 1] = { to = to, msg = msg } end
  local rid = 0
  -- the reply `from` got to one request
  local function ask(from, msg, now)
    rid = rid + 1
    msg.rid = rid
    reg:handle(from, msg, send, now or 0)
    for i = #out, 1, -1 do
      local e = out[i]
      if e.to == from and e.msg.rid == rid then return e.msg end
    end
  end
  return reg, ask, send
end

describe("issue 10: the name server's per-requester quota", function()
  it("charges entries made by lookups to their requester until used or forgotten, not to the others", function()
    local reg, ask = registry{ channel_quota = 3, forget_after = 5 }
    for i = 1, 3 do assert.is_true(ask(A, { op = "lookup", ch = "a" .. i }).ok) end
    local r = ask(A, { op = "lookup", ch = "a4" })
    assert.are.same({ false, "limit", "lookup: too many channels created by " .. A .. " (limit 3 per requester)" },
                    { r.ok, r.code, r.err })
    -- what exists already costs nothing, to anyone
    assert.is_true(ask(A, { op = "lookup", ch = "a1" }).ok)
    assert.is_true(ask(B, { op = "lookup", ch = "a2" }).ok)
    for i = 1, 3 do assert.is_true(ask(B, { op = "lookup", ch = "b" .. i }).ok) end
    assert.are.equal(false, ask(B, { op = "lookup", ch = "b4" }).ok)
    -- a channel in use is no junk: joined (by anyone), its entry is room again
    assert.is_true(ask(B, { op = "join", ch = "a3", role = "consumer" }).ok)
    assert.is_true(ask(A, { op = "lookup", ch = "a4" }).ok)
    assert.are.equal(false, ask(A, { op = "lookup", ch = "a5" }).ok)
    -- (issue 11) a join that makes an entry is charged like a lookup
    r = ask(A, { op = "join", ch = "j1", role = "producer" })
    assert.are.same({ false, "limit", "join: too many channels created by " .. A .. " (limit 3 per requester)" },
                    { r.ok, r.code, r.err })
    -- a forgotten entry (unused for forget_after) is room again
    reg:tick(function() end, 1)
    reg:tick(function() end, 7)
    assert.is_true(ask(A, { op = "lookup", ch = "a5" }, 7).ok)
  end)

  it("charges joins that make entries like lookups, until another context joins (issue 11)", function()
    local reg, ask = registry{ channel_quota = 2 }
    -- looked up then joined by the same requester: still its own, charged
    for i = 1, 2 do
      assert.is_true(ask(A, { op = "lookup", ch = "c" .. i }).ok)
      assert.is_true(ask(A, { op = "join", ch = "c" .. i, role = "producer" }).ok)
    end
    local r = ask(A, { op = "join", ch = "c3", role = "producer" })
    assert.are.same({ false, "limit", "join: too many channels created by " .. A .. " (limit 2 per requester)" },
                    { r.ok, r.code, r.err })
    -- joins of what exists cost nothing; another context joining frees the entry
    assert.is_true(ask(A, { op = "join", ch = "c1", role = "producer" }).ok)
    assert.is_true(ask(B, { op = "join", ch = "c1", role = "producer" }).ok)
    assert.is_true(ask(A, { op = "join", ch = "c3", role = "producer" }).ok)
    assert.are.same({ [A] = 2 }, reg.created)
    -- 80,000 joins without lookups (the outside attack): the quota, not the table
    local ok = 0
    for i = 1, 1000 do if ask(B, { op = "join", ch = "j" .. i, role = "producer" }).ok then ok = ok + 1 end end
    assert.are.equal(2, ok)
    assert.is_true(ask("10.0.0.3:3", { op = "lookup", ch = "legit" }).ok)
  end)

  it("counts lookups held while the control plane recovers, and frees them when they run", function()
    local reg, ask, send = registry{ channel_quota = 2, recovering = true }
    assert.is_nil(ask(A, { op = "lookup", ch = "h1" }))     -- held (recovering)
    assert.is_nil(ask(A, { op = "lookup", ch = "h2" }))
    local r = ask(A, { op = "lookup", ch = "h3" })
    assert.are.same({ false, "limit" }, { r.ok, r.code })
    assert.are.equal(2, #reg.lwaits)
    reg:tick(send, 2)                                        -- the window closed: they run
    assert.are.same({}, reg.lheld)
    assert.are.same({ [A] = 2 }, reg.created)
  end)

  it("charges a principal in keyed mode, whatever address it comes from", function()
    local _, ask = registry{ channel_quota = 1, identity = function(addr) return addr == B and "alice" or nil end }
    assert.is_true(ask(B, { op = "lookup", ch = "x" }).ok)
    local r = ask(B, { op = "lookup", ch = "y" })
    assert.are.equal("lookup: too many channels created by alice (limit 1 per requester)", r.err)
    assert.is_true(ask(A, { op = "lookup", ch = "y" }).ok)
  end)

  it("is the context option channel_quota of a context that runs the name server", function()
    local ctx = lecho.context{ quiet = true, channel_quota = 1 }
    finally(function() ctx:close() end)
    assert(ctx:request(ctx.ns, { op = "lookup", ch = ctx.ns .. "/first" }))
    local r, err, code = ctx:request(ctx.ns, { op = "lookup", ch = ctx.ns .. "/second" })
    assert.are.same({ nil, "lookup: too many channels created by " .. ctx.addr .. " (limit 1 per requester)", "limit" },
                    { r, err, code })
  end)

  it("65,536 junk lookups from one process leave room for a new legitimate channel", function()
    local _, ns = S.nameserver("--quiet")
    local junk = lecho.context{ nameserver = ns, quiet = true }
    local ctx = lecho.context{ nameserver = ns, quiet = true }
    finally(function() junk:close(); ctx:close(); S.cleanup() end)
    local t0 = socket.gettime()
    local refused = 0
    local real = junk._on_ctrl
    junk._on_ctrl = function(self, from, msg, ...)  -- (...: the connection's generation)
      if msg.op == "reply" and msg.code == "limit" then refused = refused + 1 end
      return real(self, from, msg, ...)
    end
    for i = 1, 65536 do
      junk:_send_ctrl(ns, { op = "lookup", ch = "junk" .. i, rid = 1e6 + i })
      if i % 4096 == 0 then junk:run_once(0) end
    end
    -- replies come in order: this one's says every junk lookup was handled
    local r, err, code = junk:request(ns, { op = "lookup", ch = "one-more" }, 60)
    assert.are.same({ nil, "lookup: too many channels created by " .. junk.addr .. " (limit 4096 per requester)",
                      "limit" }, { r, err, code })
    assert(S.run_until(junk, function() return refused >= 65536 - 4096 end, 30),
           ("only %d junk lookups were refused"):format(refused))
    local elapsed = socket.gettime() - t0
    assert(elapsed < 40, ("65,536 lookups took %.1f s"):format(elapsed))
    -- another context makes a channel as before, and it works end to end
    local ch = ctx:channel("legit")
    local p = assert(ch:producer())
    local got = 0
    assert(ctx:channel("legit"):consumer(function() got = got + 1 end))
    assert(p:submit_sync("hello", { timeout = 5 }))
    assert.are.equal(1, got)
    local chans = assert(ctx:list())
    assert.is_table(chans[ns .. "/legit"])
  end)
end)
