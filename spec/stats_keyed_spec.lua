-- The control plane's `stats` request in keyed mode (lecho.stats,
-- doc/security.md "stats"): a producer process answers only a principal the
-- name server's policy allows the action `stats` on it, checked in the
-- producer where the counters are read (it asks its name server, the one
-- that holds the policy); the name server answers by its own policy.
-- Driven through `lecho stats` with --key and --trust, as an operator would.
local S = require "spec.support"
local cjson = require "cjson"

local NAMES = { "nameserver", "sim", "ops", "eve" }
local POLICY = [[
return { rules = {
  { principal = "sim", channel = "atmos/*", allow = "produce" },
  { principal = "ops", channel = { "sim", "nameserver" }, allow = "stats" },
} }
]]

local KEYED = pcall(require, "lecho.keys") and (require("lecho.core").protocol_version or 1) >= 2

describe("stats in keyed mode", function()
  after_each(function() S.cleanup() end)

  local it_keyed = KEYED and it or pending
  it_keyed("are answered to a principal the policy allows, refused to another, at the producer and the name server", function()
    local dir = S.tmpdir() .. "/keys"
    assert(os.execute("mkdir -p " .. S.sh_quote(dir)))
    local ok, out = S.sh(("%s %s/scripts/lecho-keygen %s --dir %s"):format(S.luajit, S.root,
      table.concat(NAMES, " "), S.sh_quote(dir)))
    assert(ok, out)
    local trust = {}
    for i, n in ipairs(NAMES) do trust[i] = ("--trust %s/%s.pub"):format(dir, n) end
    trust = table.concat(trust, " ")
    local pol = S.write(dir .. "/policy.lua", POLICY)
    local _, ns = S.nameserver(("--quiet --key %s/nameserver.key --policy %s %s"):format(dir, pol, trust))
    -- the producer, principal sim
    local trustlist = {}
    for i, n in ipairs(NAMES) do trustlist[i] = ("%s/%s.pub"):format(dir, n) end
    local sim = S.lua_with(("export LECHO_KEY=%s/sim.key LECHO_TRUST=%s"):format(dir, table.concat(trustlist, ":")), [[
      local lecho = require "lecho"
      local ctx = lecho.context{ nameserver = arg[1], quiet = true }
      local p = assert(ctx:channel("atmos/t"):producer())
      print(ctx.addr) io.stdout:flush()
      ctx:every(0.1, function() p:submit(1) end)
      ctx:after(60, function() ctx:stop() end)
      ctx:run()
    ]], ns)
    local simaddr = S.wait_file(sim.out, "%d+:%d+", 20)
    assert(simaddr, "the producer did not start: " .. S.errors(sim))
    simaddr = simaddr:match("[^\n]+")
    local function stats_as(who, target)
      return S.sh_out(("%s %s/scripts/lecho stats %s --json --nameserver %s --key %s/%s.key %s"):format(
        S.luajit, S.root, target, ns, dir, who, trust))
    end
    -- ops may: the producer's counters, its principal, its channel
    local body, rc = stats_as("ops", simaddr):match("^(.-)rc=(%d+)\n$")
    assert.are.equal("0", rc, body)
    local st = cjson.decode(body)
    assert.are.equal("sim", st.principal)
    assert.are.equal(simaddr, st.addr)
    assert.is_table(st.channels[ns .. "/atmos/t"])
    -- and the name server's
    body, rc = stats_as("ops", ns):match("^(.-)rc=(%d+)\n$")
    assert.are.equal("0", rc, body)
    assert.are.equal("nameserver", cjson.decode(body).role)
    -- eve may not: refused where it is read, said, exit 1
    assert.are.equal("lecho stats: not allowed: eve may not stats sim\nrc=1\n", stats_as("eve", simaddr))
    assert.are.equal("lecho stats: not allowed: eve may not stats nameserver\nrc=1\n", stats_as("eve", ns))
    -- sim reads its own
    body, rc = stats_as("sim", simaddr):match("^(.-)rc=(%d+)\n$")
    assert.are.equal("0", rc, body)
  end)
end)
