-- Proves the name server's and managers' enforcement of a policy
-- (doc/security.md) in lecho.ns.registry, with identities and signatures
-- injected as the context does in keyed mode: join (produce, consume,
-- modulate with capabilities), subscribe, a lookup that makes an entry,
-- any lookup and info (produce, consume or list), register_manager (manage, and which channels go to which manager) and
-- list are refused with code "refused" and "not allowed: P may not A C",
-- before anything is made; lookup replies carry the manager's key, a
-- producer's join reply its ticket, member lists the consumers' keys.  In
-- protected mode (no identity) nothing of this applies.
--
-- Run: LUA_PATH="$PWD/lua/?.lua;$PWD/lua/?/init.lua;;" LUA_CPATH="$PWD/lua/?.so;;" \
--   luajit /usr/bin/busted spec/authz_registry_spec.lua

local R = require "lecho.ns.registry"
local policy = require "lecho.policy"

local NS = "127.0.0.1:7700"
local CH = NS .. "/atmos/ozone"
local SIM, VIEW, EVE, MGR, MGR2 = "127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3", "127.0.0.1:4", "127.0.0.1:5"
local NAMES = { [SIM] = "sim", [VIEW] = "viewer-1", [EVE] = "eve", [MGR] = "mgr-1", [MGR2] = "mgr-2",
                [NS] = "nameserver" }
local function pk(addr) return ("K"):rep(31) .. addr:sub(-1) end   -- 32 bytes each

local POLICY = assert(policy.new({ rules = {
  { principal = "sim", channel = "atmos/*", allow = { "produce" } },
  { principal = "viewer-*", channel = "atmos/*", allow = { "consume", "list", "modulate" }, caps = { "clock" } },
  { principal = "mgr-1", channel = "atmos/*", allow = "manage" },
  { principal = "mgr-2", channel = "other/*", allow = "manage" },
} }, "test"))

local function identity(addr)
  local n = NAMES[addr]
  if n then return n, pk(addr) end
end
local function sign(m) return "SIG<" .. m .. ">" end

local function world(role, opts)
  opts = opts or {}
  local reg = R.new{ addr = opts.addr or NS, role = role or "nameserver",
                     identity = opts.identity == nil and identity or opts.identity or nil,
                     policy = opts.policy == nil and POLICY or opts.policy or nil, sign = sign }
  local out = {}
  local rid = 0
  local w = {}
  function w.send(to, msg) out[#out + 1] = { to = to, msg = msg } end
  function w.ask(from, msg)
    rid = rid + 1
    msg.rid = rid
    reg:handle(from, msg, w.send, 0)
    for i = #out, 1, -1 do
      if out[i].to == from and out[i].msg.rid == rid then return out[i].msg end
    end
  end
  function w.members(to)
    local l = {}
    for _, e in ipairs(out) do if e.to == to and e.msg.op == "members" then l[#l + 1] = e.msg end end
    return l
  end
  return reg, w
end

local function refused(r) return { r.ok, r.code, r.err } end

-- A modulator key: the hash of its code and params (the manager checks it).
local subs_mod = require "lecho.subs"
local function key_of(src, params, caps)
  return subs_mod.stream_key(subs_mod.base_of(src, nil, caps), params)
end

describe("issue 10: the registry enforces the policy in keyed mode", function()
  it("joins: produce, consume, modulate with capabilities; refused before anything is made", function()
    local reg, w = world()
    assert.are.same({ false, "refused", "not allowed: eve may not produce atmos/ozone" },
                    refused(w.ask(EVE, { op = "join", ch = CH, role = "producer" })))
    assert.are.same({ false, "refused", "not allowed: sim may not consume atmos/ozone" },
                    refused(w.ask(SIM, { op = "join", ch = CH, role = "consumer" })))
    assert.is_nil(reg:snapshot().channels[CH])
    assert.are.same({}, reg.created)
    local src = "function enqueue(ev) return ev end"
    assert.are.same({ false, "refused", "not allowed: viewer-1 may not modulate with clock, log atmos/ozone" },
                    refused(w.ask(VIEW, { op = "join", ch = CH, role = "consumer",
                                          subs = { mods = { [key_of(src, {}, { "clock", "log" })] = { src = src, params = {}, caps = { "clock", "log" } } } } })))
    assert.is_true(w.ask(VIEW, { op = "join", ch = CH, role = "consumer",
                                 subs = { mods = { [key_of(src, {}, { "clock" })] = { src = src, params = {}, caps = { "clock" } } } } }).ok)
    assert.are.same({ false, "refused", "not allowed: viewer-1 may not modulate with log atmos/ozone" },
                    refused(w.ask(VIEW, { op = "subscribe", ch = CH,
                                          subs = { mods = { [key_of(src, {}, { "log" })] = { src = src, params = {}, caps = { "log" } } } } })))
    assert.are.same({ false, "refused", "not allowed: eve may not consume atmos/ozone" },
                    refused(w.ask(EVE, { op = "subscribe", ch = CH, subs = {} })))
  end)

  it("a producer's join reply carries its ticket and the consumers' keys; so do member lists", function()
    local _, w = world()
    assert.is_true(w.ask(VIEW, { op = "join", ch = CH, role = "consumer" }).ok)
    local r = w.ask(SIM, { op = "join", ch = CH, role = "producer" })
    assert.is_true(r.ok)
    assert.are.same({ VIEW }, r.consumers)
    -- u64be expiry (an hour from now), then the signature over the channel, key and expiry
    local exp = r.ticket:sub(1, 8)
    local t = 0
    for i = 1, 8 do t = t * 256 + exp:byte(i) end
    assert.is_true(math.abs(t - (os.time() + 3600)) <= 2)
    assert.are.equal(exp .. "SIG<lecho-producer-v2\0" .. CH .. "\0" .. pk(SIM) .. exp .. ">", r.ticket)
    assert.are.same({ [VIEW] = pk(VIEW) }, r.keys)
    w.ask(VIEW, { op = "subscribe", ch = CH, subs = { plain = false,
                   mods = { [key_of("function enqueue(ev) return ev end", {})] = { src = "function enqueue(ev) return ev end", params = {} } } } })
    local m = w.members(SIM)
    assert.are.equal(1, #m)
    assert.are.same({ [VIEW] = pk(VIEW) }, m[1].keys)
    assert.are.same({ VIEW }, m[1].mods[key_of("function enqueue(ev) return ev end", {})].dests)
  end)

  it("lookups: making an entry needs produce or consume; replies carry the manager's key", function()
    local reg, w = world()
    assert.are.same({ false, "refused", "not allowed: eve may not produce or consume atmos/ozone" },
                    refused(w.ask(EVE, { op = "lookup", ch = CH })))
    assert.are.same({}, reg.assign)
    local r = w.ask(VIEW, { op = "lookup", ch = CH })
    assert.are.same({ true, NS, pk(NS) }, { r.ok, r.manager, r.manager_key })
    -- the entry exists: who may produce, consume or list it may ask where it is (below)
    r = w.ask(SIM, { op = "lookup", ch = CH })
    assert.are.same({ true, NS }, { r.ok, r.manager })
  end)

  it("lookup and info: learning of a channel needs produce, consume or list on it, refused before notfound", function()
    local _, w = world()
    assert.is_true(w.ask(VIEW, { op = "lookup", ch = CH }).ok)
    assert.is_true(w.ask(VIEW, { op = "join", ch = CH, role = "consumer" }).ok)
    assert.is_true(w.ask(SIM, { op = "join", ch = CH, role = "producer" }).ok)
    local NONE = NS .. "/atmos/none"
    for _, who in ipairs{ { EVE, "eve" }, { MGR, "mgr-1" } } do         -- allowed nothing / only manage
      for _, m in ipairs{ { op = "lookup", ch = CH }, { op = "lookup", ch = CH, create = false },
                          { op = "info", ch = CH }, { op = "lookup", ch = NONE, create = false },
                          { op = "info", ch = NONE } } do
        assert.are.same({ false, "refused", ("not allowed: %s may not produce, consume or list %s")
                                             :format(who[2], m.ch:sub(#NS + 2)) }, refused(w.ask(who[1], m)))
      end
    end
    local r = w.ask(SIM, { op = "info", ch = CH })
    assert.are.same({ true, 1, 1 }, { r.ok, r.producers, r.consumers })
    r = w.ask(VIEW, { op = "lookup", ch = CH, create = false })
    assert.are.same({ true, NS, pk(NS) }, { r.ok, r.manager, r.manager_key })
    assert.are.equal("notfound", w.ask(VIEW, { op = "info", ch = NONE }).code)
    assert.are.equal("notfound", w.ask(SIM, { op = "lookup", ch = NONE, create = false }).code)
    -- list alone lets one see an existing channel, not make one
    local _, w2 = world("nameserver", { policy = assert(policy.new({ rules = {
      { principal = "eve", channel = "atmos/*", allow = "list" } } }, "test")) })
    assert.is_true(w2.ask(NS, { op = "lookup", ch = CH }).ok)
    r = w2.ask(EVE, { op = "lookup", ch = CH })
    assert.are.same({ true, NS }, { r.ok, r.manager })
    assert.are.equal("notfound", w2.ask(EVE, { op = "info", ch = CH }).code)
    assert.are.same({ false, "refused", "not allowed: eve may not produce or consume atmos/new" },
                    refused(w2.ask(EVE, { op = "lookup", ch = NS .. "/atmos/new" })))
    assert.are.same({ false, "refused", "not allowed: eve may not produce, consume or list other/x" },
                    refused(w2.ask(EVE, { op = "info", ch = NS .. "/other/x" })))
  end)

  it("managers: registering needs manage; channels go only to a manager that may manage them", function()
    local reg, w = world()
    assert.are.same({ false, "refused", "not allowed: eve may not manage any channel" },
                    refused(w.ask(EVE, { op = "register_manager" })))
    assert.is_nil(reg.managers[EVE])
    local r = w.ask(MGR2, { op = "register_manager", channels = { NS .. "/other/a", CH } })
    assert.is_true(r.ok)
    assert.are.same({ CH }, r.taken)                      -- not its to manage
    assert.are.equal(MGR2, reg.assign[NS .. "/other/a"])
    assert.is_nil(reg.assign[CH])
    assert.are.same(POLICY:table(), r.policy)             -- the manager enforces the same rules
    -- mgr-2 is the least loaded manager of none: atmos/* stays with the name server
    r = w.ask(SIM, { op = "lookup", ch = CH })
    assert.are.same({ true, NS, pk(NS) }, { r.ok, r.manager, r.manager_key })
    assert.is_true(w.ask(MGR, { op = "register_manager" }).ok)
    r = w.ask(SIM, { op = "lookup", ch = NS .. "/atmos/b" })
    assert.are.same({ true, MGR, pk(MGR) }, { r.ok, r.manager, r.manager_key })
    -- a manager without an authenticated identity (its connection went) gets nothing
    NAMES[MGR] = nil
    r = w.ask(SIM, { op = "lookup", ch = NS .. "/atmos/c" })
    NAMES[MGR] = "mgr-1"
    assert.are.same({ true, NS }, { r.ok, r.manager })
  end)

  it("a manager takes its name server's policy: joins refused there as at the name server", function()
    local mreg, w = world("manager", { addr = MGR, policy = false })
    mreg.policy = assert(policy.new(POLICY:table(), "from " .. NS))
    assert.are.same({ false, "refused", "not allowed: eve may not produce atmos/ozone" },
                    refused(w.ask(EVE, { op = "join", ch = CH, role = "producer" })))
    assert.is_true(w.ask(SIM, { op = "join", ch = CH, role = "producer" }).ok)
  end)

  it("list: only the channels the asker may list; refused when it may list none", function()
    local _, w = world()
    assert.is_true(w.ask(SIM, { op = "join", ch = CH, role = "producer" }).ok)
    w.ask(NS, { op = "join", ch = NS .. "/secret", role = "producer" })
    local r = w.ask(VIEW, { op = "list" })
    assert.is_true(r.ok)
    assert.is_table(r.channels[CH])
    assert.is_nil(r.channels[NS .. "/secret"])
    assert.are.same({ false, "refused", "not allowed: sim may not list any channel" },
                    refused(w.ask(SIM, { op = "list" })))
  end)

  it("takes its policy as a lecho.policy, a rules table or a file name; a malformed file raises with its path", function()
    local S = require "spec.support"
    finally(S.cleanup)
    local good = S.write(S.tmpname("pol") .. ".lua",
      "return { rules = { { principal = 'sim', channel = 'atmos/*', allow = { 'produce' } } } }")
    for _, p in ipairs{ good, POLICY:table() } do
      local reg = R.new{ addr = NS, role = "nameserver", identity = identity, policy = p }
      assert.is_true(reg.policy:allows("sim", "produce", CH))
      assert.is_false(reg.policy:allows("eve", "produce", CH))
    end
    local bad = S.write(S.tmpname("pol") .. ".lua", "return { rules = { { principal = 'a', channel = '*', allow = 'fly' } } }")
    local ok, err = pcall(R.new, { addr = NS, role = "nameserver", policy = bad })
    assert.is_false(ok)
    assert.truthy(tostring(err):find(bad .. ": rule 1: unknown action 'fly'", 1, true), tostring(err))
  end)

  it("applies nothing in protected mode, and lets every trusted principal do everything without a policy", function()
    local _, w = world("nameserver", { identity = false })
    assert.is_true(w.ask(EVE, { op = "join", ch = CH, role = "producer" }).ok)
    assert.is_true(w.ask(EVE, { op = "list" }).ok)
    local r = w.ask(EVE, { op = "lookup", ch = CH })
    assert.is_nil(r.manager_key)
    r = w.ask(EVE, { op = "info", ch = CH })
    assert.are.same({ true, 1 }, { r.ok, r.producers })
    assert.is_true(w.ask(EVE, { op = "lookup", ch = CH, create = false }).ok)
    local _, w2 = world("nameserver", { policy = false })
    assert.is_true(w2.ask(EVE, { op = "join", ch = CH, role = "producer" }).ok)
    assert.is_true(w2.ask(MGR, { op = "lookup", ch = CH, create = false }).ok)
    r = w2.ask(MGR, { op = "info", ch = CH })
    assert.are.same({ true, 1, 0 }, { r.ok, r.producers, r.consumers })
    assert.is_true(w2.ask(EVE, { op = "register_manager" }).ok)
    -- which the name server says once, at the first request of another principal
    local said = {}
    local reg = R.new{ addr = NS, role = "nameserver", identity = identity,
                       log = function(l, m) if l == "warn" then said[#said + 1] = l .. ": " .. m end end }
    assert.are.same({}, said)
    for i = 1, 3 do reg:handle(EVE, { op = "lookup", ch = CH, rid = i }, function() end, 0) end
    assert.are.same({ "warn: keyed mode without a policy: every trusted principal may produce, consume, "
                      .. "modulate, manage and list every channel (doc/security.md)" }, said)
  end)

  -- (the outside attack of issue 23: `may` answered any principal about
  -- anyone's rights: an oracle of the policy)
  it("may: answers only about the asker's own process or its own rights", function()
    local pol = assert(policy.new({ rules = {
      { principal = "viewer-*", channel = "sim", allow = "stats" },
    } }, "test"))
    local _, w = world("nameserver", { policy = pol })
    -- eve asks whether viewer-1 may read sim's counters: not hers to know
    local r = w.ask(EVE, { op = "may", action = "stats", principal = "viewer-1", target = "sim" })
    assert.are.same({ false, "refused" }, { r.ok, r.code })
    assert.truthy(r.err:find("not allowed: eve may ask only about its own process or its own rights", 1, true), r.err)
    assert.is_nil(r.allowed)
    -- sim asks about a request it received (viewer-1 wants its counters)
    r = w.ask(SIM, { op = "may", action = "stats", principal = "viewer-1", target = "sim" })
    assert.are.same({ true, true }, { r.ok ~= false, r.allowed })
    r = w.ask(SIM, { op = "may", action = "stats", principal = "eve", target = "sim" })
    assert.are.same({ true, false }, { r.ok ~= false, r.allowed })
    -- viewer-1 about its own rights
    r = w.ask(VIEW, { op = "may", action = "stats", principal = "viewer-1", target = "sim" })
    assert.is_true(r.allowed)
  end)

  -- (the outside attack of issue 23: a producer whose produce a reload
  -- withdrew kept receiving member lists: new consumers' addresses, keys,
  -- modulator sources and params)
  it("never sends a member list to a producer whose produce is withdrawn; set_policy drops it and tells it", function()
    local no_sim = assert(policy.new({ rules = { POLICY:table().rules[2] } }, "test"))
    -- the policy replaced behind the registry's back: the next list still skips sim
    local reg, w = world()
    assert.is_true(w.ask(SIM, { op = "join", ch = CH, role = "producer" }).ok ~= false)
    reg.policy = no_sim
    w.ask(VIEW, { op = "join", ch = CH, role = "consumer", subs = { mods = {
      [key_of("SECRET SOURCE", { token = "T0K3N" }, { "clock" })] = { src = "SECRET SOURCE",
      params = { token = "T0K3N" }, caps = { "clock" } } } } })
    assert.are.same({}, w.members(SIM))
    assert.is_nil(reg:snapshot().channels[CH].producers[SIM])
    -- set_policy: checked at once; sim told why
    local reg2, w2 = world()
    assert.is_true(w2.ask(SIM, { op = "join", ch = CH, role = "producer" }).ok ~= false)
    local sent = {}
    assert.is_true(reg2:set_policy(no_sim, function(to, msg) sent[#sent + 1] = { to = to, msg = msg } end, 1))
    assert.are.equal(1, #sent)
    assert.are.same({ SIM, "revoked", "producer", "not allowed: sim may not produce atmos/ozone" },
                    { sent[1].to, sent[1].msg.op, sent[1].msg.role, sent[1].msg.err })
    local e = reg2:snapshot().channels[CH]
    assert.is_nil(e.producers and e.producers[SIM])
  end)
end)
