-- The direct install (issue 27 item 6, doc/protocol.md section 5
-- `install`): where the manager already admitted a consumer context (it is
-- in the channel's member list), a modulator install is one message from
-- the consumer to each producer it knows and one reply each, the manager
-- told after; a close is one message.  Events a producer submits after the
-- install returned go through the new modulator.  And the new message is
-- believed only from a member, for itself, newer than what it said before,
-- with keys that are the hash of their code, no other context's stream and,
-- keyed with a policy, only with the capabilities the manager's list
-- grants: a stranger's install, a replayed one, a consumer installing for
-- another or on another's stream, a made-up key, a modulator the policy
-- forbids: refused, logged, nothing changed.

local S = require "spec.support"
local cjson = require "cjson"
local lecho = require "lecho"

-- A producer of "field" (spec/children.lua: events { i } every 2 ms
-- in fives for a.secs seconds, then a sync { done }) and the modulator
-- that tags events with params.tag.
local K = require "spec.children"
local PRODUCER, TAG = K.field_producer, K.tag_modulator

-- The control messages ctx sends (their ops, in order) while f runs.
local function ops_during(ctx, f)
  local ops, msgs = {}, {}
  ctx._send_ctrl = function(self, to, msg)
    ops[#ops + 1] = msg.op
    msgs[#msgs + 1] = { to = to, msg = msg }
    return getmetatable(self).__index._send_ctrl(self, to, msg)
  end
  local r = { f() }
  ctx._send_ctrl = nil
  return ops, msgs, unpack(r)
end

-- The modulator keys the channel's manager lists for channel `name`.
local function listed_keys(ctx, name)
  local chans = assert(ctx:list())
  local c = chans[name] or {}
  local keys = {}
  for k in pairs(c.modulators or {}) do keys[#keys + 1] = k end
  table.sort(keys)
  return keys
end

describe("direct install", function()
  after_each(function() S.cleanup() end)

  it("is one message to the producer and its reply; events after it go through the modulator;"
     .. " the manager learns it after; a close is one message", function()
    local _, ns = S.nameserver("--quiet")
    local ctx = lecho.context{ nameserver = ns, quiet = true }
    local ch = ctx:channel("field")
    local plain = {}
    assert(ch:consumer(function(ev) if not ev.done then plain[#plain + 1] = ev.i end end))
    local prod = S.lua(PRODUCER, cjson.encode{ ns = ns, secs = 6, linger = 0.5 })
    local paddr = assert(S.wait_file(prod.out, "ready", 20), S.errors(prod)):match("ready (%S+)")
    assert(S.run_until(ctx, function() return #plain >= 50 end, 30), "no events: " .. S.errors(prod))
    local got = {}
    local ops, msgs, con = ops_during(ctx, function()
      return ch:consumer(function(ev) if not ev.done then got[ev.i] = ev.tag end end,
                         { modulator = TAG, params = { tag = 5 } })
    end)
    assert(con, "install failed")
    local at = #plain
    -- one install to the one producer, nothing to the manager meanwhile
    assert.are.same({ "install" }, ops)
    assert.are.equal(paddr, msgs[1].to)
    -- every plain event delivered after the install returned was submitted
    -- after the producer took it: each came modulated too
    assert(S.run_until(ctx, function() return #plain >= at + 200 end, 30))
    S.run_until(ctx, function() return false end, 0.3)
    local missing = {}
    for k = at + 1, #plain do
      if got[plain[k]] ~= 5 then missing[#missing + 1] = plain[k] end
    end
    assert.are.same({}, missing)
    -- the manager is told after (its list names the modulator)
    local key = con.mod.key
    assert(S.run_until(ctx, function()
      local ks = listed_keys(ctx, ch.name)
      return #ks == 1 and ks[1] == key
    end, 10), "the manager never learnt of the install")
    -- a close: one message after this turn (or with the next install),
    -- the producer unloads; the manager learns it
    local cops = ops_during(ctx, function() con:close() end)
    assert.are.same({}, cops)
    cops = ops_during(ctx, function() S.run_until(ctx, function() return false end, 0.2) end)
    assert.are.equal("install", cops[1])
    assert(S.run_until(ctx, function() return #listed_keys(ctx, ch.name) == 0 end, 10),
           "the manager still lists the closed modulator")
    -- a modulated consumer again after the manager's list: still direct
    local got2 = {}
    local ops2, _, con2 = ops_during(ctx, function()
      return ch:consumer(function(ev) if not ev.done then got2[#got2 + 1] = ev.tag end end,
                         { modulator = TAG, params = { tag = 6 } })
    end)
    assert(con2)
    assert.are.same({ "install" }, ops2)
    assert(S.run_until(ctx, function() return #got2 >= 20 end, 20), S.errors(prod))
    for _, t in ipairs(got2) do assert.are.equal(6, t) end
    ctx:close()
  end)

  it("a close carried by the next install: the new consumer's modulator is a fresh state", function()
    local _, ns = S.nameserver("--quiet")
    local ctx = lecho.context{ nameserver = ns, quiet = true }
    local ch = ctx:channel("field")
    local n = 0
    assert(ch:consumer(function() n = n + 1 end))
    local prod = S.lua(PRODUCER, cjson.encode{ ns = ns, secs = 6, linger = 0.5 })
    assert(S.run_until(ctx, function() return n >= 20 end, 30), "no events: " .. S.errors(prod))
    local COUNT = "local k = 0 function enqueue(ev) k = k + 1 ev.k = k ev.tag = params.tag return ev end"
    local a = {}
    local ca = assert(ch:consumer(function(ev) if not ev.done then a[#a + 1] = ev.k end end,
                                  { modulator = COUNT, params = { tag = 1 } }))
    assert(S.run_until(ctx, function() return #a >= 300 end, 30), S.errors(prod))
    local b = {}
    local ops = ops_during(ctx, function()
      ca:close()
      return ch:consumer(function(ev) if not ev.done then b[#b + 1] = { ev.k, ev.tag } end end,
                         { modulator = COUNT, params = { tag = 2 } })
    end)
    assert.are.same({ "install" }, ops)     -- the close went with the install
    assert(S.run_until(ctx, function() return #b >= 5 end, 20), S.errors(prod))
    -- a fresh state: its count starts again (the old one's was past 300)
    assert.are.equal(2, b[1][2])
    assert.is_true(b[1][1] < 50, "the new modulator went on from the old one's state: k = " .. b[1][1])
    ctx:close()
  end)

  it("refuses a stranger, a replay, a consumer installing for another or on another's stream,"
     .. " and a made-up key; nothing changes", function()
    local R = require "spec.support.rogue"
    local _, ns = S.nameserver("--quiet")
    local ctx = lecho.context{ nameserver = ns, quiet = true }
    local ctx2 = lecho.context{ nameserver = ns, quiet = true }
    local ch, ch2 = ctx:channel("field"), ctx2:channel("field")
    local function serve(t)
      local deadline = ctx:now() + t
      while ctx:now() < deadline do ctx:run_once(0.01); ctx2:run_once(0.01) end
    end
    local tags = {}
    local con = assert(ch:consumer(function(ev) if not ev.done then tags[ev.tag] = (tags[ev.tag] or 0) + 1 end end,
                                   { modulator = TAG, params = { tag = 1 } }))
    assert(ch2:consumer(function() end))
    local prod = S.lua(PRODUCER, cjson.encode{ ns = ns, secs = 20, linger = 0.5 })
    local paddr = assert(S.wait_file(prod.out, "ready", 20), S.errors(prod)):match("ready (%S+)")
    assert(S.run_until(ctx, function() ctx2:run_once(0) return (tags[1] or 0) >= 20 end, 30), S.errors(prod))
    -- a stream of con's own (the first params change), then a direct
    -- install of a second modulated consumer here, whose message we keep
    assert.is_true(con:set_params{ tag = 2 })
    local ops, msgs, con2 = ops_during(ctx, function()
      return ch:consumer(function() end, { modulator = TAG, params = { tag = 3 } })
    end)
    assert(con2)
    assert.are.same({ "install" }, ops)
    local sent = msgs[1].msg
    serve(0.3)
    local stream_key = require("lecho.modulator").stream_key
    local base = con.mod.base
    local function install(c, over, mods)
      local m = { op = "install", ch = ch.name, sseq = 1e9, mods = mods or {} }
      for k, v in pairs(over or {}) do m[k] = v end
      return c:request(paddr, m, 5)
    end
    -- a stranger (a rogue peer speaking the wire protocol): no member
    local p = assert(R.dial(paddr, { addr = "127.0.0.1:9" }))
    local k9 = stream_key(base, { tag = 9 })
    p:ctrl{ op = "install", rid = 77, ch = ch.name, sseq = 1e9,
            mods = { [k9] = { src = TAG, params = { tag = 9 }, caps = {} } } }
    local rr = p:reply(77, 5)
    assert(rr and rr.ok == false and rr.code == "refused", cjson.encode(rr or {}))
    assert.matches("127.0.0.1:9 is not a consumer", rr.err)
    p:close()
    -- a replay of ctx's own install (the same sseq): an older change
    local replay = {}
    for k, v in pairs(sent) do replay[k] = v end
    replay.rid = nil
    local r, err, code = ctx:request(paddr, replay, 5)
    assert.is_nil(r); assert.are.equal("refused", code, err); assert.matches("an older change", err)
    -- ctx2, a member, installing for ctx: refused (an install is for its sender)
    r, err, code = install(ctx2, { dests = { ctx.addr } },
                           { [k9] = { src = TAG, params = { tag = 9 }, caps = {} } })
    assert.is_nil(r); assert.are.equal("refused", code, err); assert.matches("for its sender only", err)
    -- ctx2 naming con's stream (kept through in-band changes): ctx's
    local s = con.mod.stream
    local ks = stream_key(base, { tag = 9 }, s)
    r, err, code = install(ctx2, nil, { [ks] = { src = TAG, params = { tag = 9 }, caps = {}, stream = s, pseq = 99 } })
    assert.is_nil(r); assert.are.equal("refused", code, err)
    assert.matches("stream %x+ is " .. ctx.addr:gsub("%p", "%%%0") .. "'s", err)
    -- a key that is not the hash of the code and params
    r, err, code = install(ctx2, nil, { [k9] = { src = TAG, params = { tag = 8 }, caps = {} } })
    assert.is_nil(r); assert.are.equal("refused", code, err); assert.matches("not the hash", err)
    -- nothing changed: con's events are still tag 2, ctx2 got no stream
    tags = {}
    serve(0.5)
    assert.are.same({ [2] = tags[2] }, tags)
    assert.is_nil(next(ch2.streams))
    local log = S.errors(prod)
    assert.matches("refusing an install from", log)
    assert.is_true(S.count(log, "refusing an install from") <= 2, log)     -- one per 10 s (and the count of the others)
    ctx2:close(); ctx:close()
  end)
end)

describe("direct install, keyed", function()
  local T = require "spec.support.trust_world"
  local w
  after_each(function() T.stop(w); w = nil end)

  it("within the policy: direct; a modulator the policy forbids or a non-member: refused", function()
    w = T.start{ mode = "keyed", duration = 40 }
    local ctx = assert(lecho.context{ nameserver = w.ns, key = w.ids.cons2.key, trust = w.ids.trust, quiet = true })
    local ch = ctx:channel(T.CHANNEL)
    local n = 0
    assert(ch:consumer(function() n = n + 1 end))
    assert(S.run_until(ctx, function() return n >= 5 end, 20), "no events: " .. S.errors(w.prod))
    -- cons2 may modulate without capabilities: direct
    local got = {}
    local ops, _, con = ops_during(ctx, function()
      return ch:consumer(function(ev) got[#got + 1] = ev.tag end, { modulator = TAG, params = { tag = 4 } })
    end)
    assert(con)
    assert.are.same({ "install" }, ops)
    assert(S.run_until(ctx, function() return #got >= 5 end, 20), S.errors(w.prod))
    for _, t in ipairs(got) do assert.are.equal(4, t) end
    -- with the capability clock, which no rule grants it: the producer
    -- refuses the install, the manager the subscription
    local ops2, _, c2, err, code = ops_during(ctx, function()
      return ch:consumer(function() end, { modulator = TAG, params = { tag = 5 }, capabilities = { "clock" } })
    end)
    assert.is_nil(c2)
    assert.are.equal("refused", code, err)
    assert.matches("not allowed", err)
    assert.are.equal("install", ops2[1])
    -- the same asked straight, with a made-up sseq: refused by the producer
    local key = require("lecho.modulator").spec(TAG, { tag = 5 }, nil, { "clock" }, 1).key
    local r, ierr, icode = ctx:request(w.prod.addr, { op = "install", ch = ch.name, sseq = 1e9,
      mods = { [key] = { src = TAG, params = { tag = 5 }, caps = { "clock" } } } }, 5)
    assert.is_nil(r); assert.are.equal("refused", icode, ierr)
    assert.matches("does not grant it modulate with caps {clock}", ierr)
    -- mallory: trusted, allowed nothing, no member
    local p = assert(T.dial(w, w.prod.addr, "mallory"))
    local k2 = require("lecho.modulator").spec(TAG, { tag = 66 }, nil, nil, 1).key
    p:ctrl{ op = "install", rid = 5, ch = ch.name, sseq = 1e9,
            mods = { [k2] = { src = TAG, params = { tag = 66 }, caps = {} } } }
    local rr = p:reply(5, 5)
    assert(rr and rr.ok == false and rr.code == "refused", cjson.encode(rr or {}))
    assert.matches("is not a consumer", rr.err)
    -- none of it changed what con gets
    got = {}
    assert(S.run_until(ctx, function() return #got >= 5 end, 20))
    for _, t in ipairs(got) do assert.are.equal(4, t) end
    ctx:close()
  end)
end)
