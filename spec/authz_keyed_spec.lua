-- Proves authorization end to end in keyed mode (issue 10, doc/security.md):
-- a name server process started with --key, --trust and --policy, contexts
-- with keys made by lecho-keygen.  A principal the policy grants produces
-- and consumes (the producer's ticket, signed by the channel's manager,
-- lets its BIND through at the consumer); one it does not is refused with
-- code "refused" and "not allowed: <principal> may not <action>
-- <channel>", whether it produces, consumes, installs a modulator with a
-- capability its rule does not grant, lists, or registers as a manager.
--
-- Run: make && LUA_PATH="$PWD/lua/?.lua;$PWD/lua/?/init.lua;;" \
--   LUA_CPATH="$PWD/lua/?.so;;" LECHO_ROOT=$PWD luajit /usr/bin/busted spec/authz_keyed_spec.lua

local lecho = require "lecho"
local cjson = require "cjson"
local S = require "spec.support"
local kids = require "spec.children"

local WAIT = 20
local NAMES = { "nameserver", "sim", "viewer", "eve", "mgr" }

local POLICY = [[
return {
  rules = {
    { principal = "sim", channel = "atmos/*", allow = { "produce" } },
    { principal = "viewer", channel = "atmos/*", allow = { "consume", "list", "modulate" }, caps = { "clock" } },
    { principal = "mgr", channel = "managed/*", allow = "manage" },
    { principal = "sim", channel = "managed/*", allow = "produce" },
    { principal = "viewer", channel = "managed/*", allow = "consume" },
  },
}
]]

local dir, trust, ns

local function trust_args()
  local a = {}
  for _, t in ipairs(trust) do a[#a + 1] = "--trust " .. S.sh_quote(t) end
  return table.concat(a, " ")
end

-- Key files for every principal (lecho-keygen), a trust list of all of
-- them, the policy, and a name server that uses them.
local function keyed_world()
  ns, dir, trust = S.keyed_nameserver(NAMES, POLICY)
end

local function as(name, extra)
  local o = { nameserver = ns, key = ("%s/%s.key"):format(dir, name), trust = trust, quiet = true }
  for k, v in pairs(extra or {}) do o[k] = v end
  return lecho.context(o)
end

-- A spec/children.lua child run as principal `name`.
local function child_as(name, src, opts)
  local env = ("export LECHO_KEY=%s LECHO_TRUST=%s"):format(S.sh_quote(("%s/%s.key"):format(dir, name)),
                                                           S.sh_quote(table.concat(trust, ":")))
  return S.lua_with(env, src, cjson.encode(opts))
end

local function received(sink)
  local n = 0
  for _ in (S.read(sink.out) or ""):gmatch("\nev ") do n = n + 1 end
  return n
end

-- Keyed mode needs lecho.keys (key files, lecho-keygen) and the core's
-- protocol 2 (authenticated connections): helpers build them beside this
-- work; until both are in the tree these cases are pending, not passed.
local KEYED = pcall(require, "lecho.keys") and (require("lecho.core").protocol_version or 1) >= 2

describe("issue 10: authorization in keyed mode", function()
  local ctxs
  before_each(function()
    ctxs = {}
    if KEYED then keyed_world() end
  end)
  after_each(function()
    for _, c in ipairs(ctxs) do c:close() end
    S.cleanup()
  end)
  local function ctx_as(name, extra)
    local c = as(name, extra)
    ctxs[#ctxs + 1] = c
    return c
  end

  it("a granted producer's events reach a granted consumer through the manager's ticket", function()
    if not KEYED then pending("keyed mode (lecho.keys, protocol 2) is not in this build") return end
    local sim = ctx_as("sim")
    local ch = sim:channel("atmos/ozone")
    local p = assert(ch:producer())
    assert.are.equal(72, #ch.ticket)          -- u64 expiry, signature
    assert.are.equal(32, #ch.manager_key)
    local sink = child_as("viewer", kids.sink, { ns = ns, channel = "atmos/ozone", stop_on = "end", duration = 25 })
    assert(S.run_until(sim, function() return (S.read(sink.out) or ""):find("ready", 1, true) end, WAIT),
           "the viewer did not start: " .. S.errors(sink))
    for i = 1, 20 do assert(p:submit({ i = i })) end
    assert(p:submit_sync("end", { timeout = 5 }))
    assert(S.run_until(sim, function() return (S.read(sink.out) or ""):find("\ndone") end, WAIT),
           "the viewer did not get the events: " .. S.errors(sink))
    assert.are.equal(21, received(sink))
  end)

  it("refuses what the policy does not grant, with the principal, the action and the channel", function()
    if not KEYED then pending("keyed mode (lecho.keys, protocol 2) is not in this build") return end
    local viewer = ctx_as("viewer")
    local eve = ctx_as("eve")
    assert(viewer:channel("atmos/ozone"):consumer(function() end))
    -- the channel exists, and eve, allowed nothing there, does not learn
    -- even that: the name server refuses its lookup (its manager would
    -- refuse its join too: below, and in the next case)
    local p, err, code = eve:channel("atmos/ozone"):producer()
    assert.is_nil(p)
    assert.are.equal("refused", code)
    assert.are.equal("name server " .. ns .. ": not allowed: eve may not produce, consume or list atmos/ozone", err)
    local c
    c, err, code = eve:channel("atmos/ozone"):consumer(function() end)
    assert.is_nil(c)
    assert.are.equal("refused", code)
    assert.truthy(err:find("not allowed: eve may not produce, consume or list atmos/ozone", 1, true), err)
    c, err, code = eve:channel("atmos/ozone", { create = false })
    assert.are.same({ nil, "refused" }, { c, code })
    assert.truthy(tostring(err):find("not allowed: eve may not produce, consume or list atmos/ozone", 1, true),
                  tostring(err))
    assert(viewer:channel("atmos/ozone", { create = false }))
    -- a new channel: the name server refuses to make its entry
    p, err, code = eve:channel("atmos/new"):producer()
    assert.are.same({ nil, "refused" }, { p, code })
    assert.truthy(err:find("not allowed: eve may not produce or consume atmos/new", 1, true), err)
    -- sim may produce, not consume
    local sim = ctx_as("sim")
    c, err, code = sim:channel("atmos/ozone"):consumer(function() end)
    assert.are.same({ nil, "refused" }, { c, code })
    assert.truthy(err:find("not allowed: sim may not consume atmos/ozone", 1, true), err)
  end)

  it("refuses a modulator asking for a capability its rule does not grant", function()
    if not KEYED then pending("keyed mode (lecho.keys, protocol 2) is not in this build") return end
    local viewer = ctx_as("viewer")
    local src = "function enqueue(ev) return ev end"
    local c, err, code = viewer:channel("atmos/mod"):consumer(function() end,
                                                              { modulator = src, capabilities = { "log" } })
    assert.are.same({ nil, "refused" }, { c, code })
    assert.truthy(err:find("not allowed: viewer may not modulate with log atmos/mod", 1, true), err)
    assert(viewer:channel("atmos/mod"):consumer(function() end, { modulator = src, capabilities = { "clock" } }))
  end)

  it("lists only what a principal may list, and refuses a manager without manage", function()
    if not KEYED then pending("keyed mode (lecho.keys, protocol 2) is not in this build") return end
    local viewer = ctx_as("viewer")
    local sim = ctx_as("sim")
    assert(sim:channel("atmos/a"):producer())
    local chans = assert(viewer:list())
    assert.is_table(chans[ns .. "/atmos/a"])
    local r, err, code = sim:list()
    assert.are.same({ nil, "not allowed: sim may not list any channel", "refused" }, { r, err, code })
    local ok, merr = pcall(as, "eve", { manager = true })
    assert.is_false(ok)
    assert.truthy(tostring(merr):find("not allowed: eve may not manage any channel", 1, true),
                  tostring(merr))
  end)

  it("a manager enforces its name server's policy on the joins it takes; its tickets let events through", function()
    if not KEYED then pending("keyed mode (lecho.keys, protocol 2) is not in this build") return end
    local pf = S.tmpname("mgr")
    local mgr = S.spawn(("%s %s/scripts/lecho-manager --nameserver %s --port-file %s --for 60 --quiet --key %s %s")
      :format(S.luajit, S.root, ns, pf, S.sh_quote(dir .. "/mgr.key"), trust_args()))
    local maddr = S.wait_file(pf, "%d+:%d+", WAIT)
    assert(maddr, "the manager did not start: " .. S.errors(mgr))
    maddr = maddr:match("[^\n]+")
    local sim = ctx_as("sim")
    local ch = sim:channel("managed/m")
    local p = assert(ch:producer())
    assert.are.equal(maddr, ch.manager)
    -- viewer may consume there, so it learns where: the manager refuses its production
    local x, err, code = ctx_as("viewer"):channel("managed/m"):producer()
    assert.are.same({ nil, "refused" }, { x, code })
    assert.are.equal("joining '" .. ns .. "/managed/m' as producer: not allowed: viewer may not produce managed/m",
                     err)
    -- eve, allowed nothing there, is refused where it is
    x, err, code = ctx_as("eve"):channel("managed/m"):producer()
    assert.are.same({ nil, "refused" }, { x, code })
    assert.are.equal("name server " .. ns .. ": not allowed: eve may not produce, consume or list managed/m", err)
    local sink = child_as("viewer", kids.sink, { ns = ns, channel = "managed/m", stop_on = "end", duration = 25 })
    assert(S.run_until(sim, function() return (S.read(sink.out) or ""):find("ready", 1, true) end, WAIT),
           "the viewer did not start: " .. S.errors(sink))
    for i = 1, 5 do assert(p:submit({ i = i })) end
    assert(p:submit_sync("end", { timeout = 5 }))
    assert(S.run_until(sim, function() return (S.read(sink.out) or ""):find("\ndone") end, WAIT),
           "the viewer did not get the events: " .. S.errors(sink))
    assert.are.equal(6, received(sink))
  end)
end)
