-- stress/keys.lua: the identities, trust list and policy of a keyed stress
-- scenario (stress/run.lua --mode keyed).  Every process of the scenario has a
-- key of its own named for its id ("p1", "c2", "mgr1", ...), every process
-- trusts all of them and "mallory", the attacker's (stress/attacker.lua), and
-- the name server's policy grants each role what it needs and mallory nothing.
-- The key and trust files are those of doc/security.md (JSON, hex).
local cjson = require "cjson"
local R = require "spec.support.rogue"

local M = {}

local function write_json(path, t)
  local f = assert(io.open(path, "w"))
  f:write(cjson.encode(t))
  f:close()
  os.execute("chmod 600 '" .. path .. "'")
  return path
end

-- The policy: producers (p*, f*, dp_*) produce, consumers (c*, dc_*) consume
-- and modulate, managers (mgr*) manage; nobody else (mallory) anything.
function M.policy()
  return {
    lecho = "policy", version = 1,
    rules = {
      { principal = { "p*", "f*", "dp_*" }, channel = "*", allow = { "produce" } },
      { principal = { "c*", "dc_*" }, channel = "*", allow = { "consume", "modulate", "list" } },
      { principal = "mgr*", channel = "*", allow = { "manage" } },
    },
  }
end

--- Makes dir/keys/NAME.key for every name of `names` (plus nameserver and
-- mallory), dir/keys/trust.json and dir/keys/policy.json.  Returns
-- { dir, trust, policy, key = { [name] = path }, mallory = { pk, sk, name } }.
function M.make(dir, names)
  local kd = dir .. "/keys"
  os.execute("mkdir -p '" .. kd .. "' && chmod 700 '" .. kd .. "'")
  local all = { "nameserver", "mallory" }
  for _, n in ipairs(names) do all[#all + 1] = n end
  local out = { dir = kd, key = {} }
  local trust = {}
  for _, name in ipairs(all) do
    local pk, sk = R.keypair()
    out.key[name] = write_json(("%s/%s.key"):format(kd, name),
      { lecho = "secret-key", version = 1, name = name, public = R.hex(pk), secret = R.hex(sk) })
    trust[#trust + 1] = { name = name, public = R.hex(pk) }
    if name == "mallory" then out.mallory = { pk = pk, sk = sk, name = name } end
  end
  out.trust = write_json(kd .. "/trust.json", { lecho = "trust", version = 1, keys = trust,
                                                 authorities = setmetatable({}, cjson.array_mt) })
  out.policy = write_json(kd .. "/policy.json", M.policy())
  return out
end

return M
