-- A producer that takes a member list while its join still waits (keyed):
-- the list names a consumer's stream whose params changed in band, so the
-- producer's new instance runs the consumer's newest params and says so in
-- band (params_at, doc/modulators.md "Ordering").  The consumer believes a
-- params_at only from a producer with that stream bound on the connection;
-- keyed, a BIND needs the producer's ticket, which comes with the join's
-- reply.  When the list is handled before the reply is taken (it came in
-- the same read, as in CI's stress seed 19 churn, or the reply is late),
-- the params_at went out before any BIND and was ignored ("ignoring a
-- params_at ... not a producer"): every event after it carried the version
-- the stream started with while made with the newer params (stress check
-- `filter`: "203 event(s) its modulator drops ... under version 2").
--
-- Here the interleaving is made deterministic: the producer's context
-- (this process) holds its join's reply until it handled the next member
-- list, which the consumer (a child) causes with an in-band change made
-- while no producer is known to it (so it goes through the manager).
-- Every event must carry the params version it was made with.

local lecho = require "lecho"
local cjson = require "cjson"
local S = require "spec.support"
local kids = require "spec.children"

local NAMES = { "nameserver", "sim", "viewer" }
local POLICY = [[
return { rules = {
  { principal = "sim", channel = "*", allow = { "produce" } },
  { principal = "viewer", channel = "*", allow = { "consume", "modulate", "list" } },
} }
]]

-- The consumer: params { tag = 1 }, a first change (a stream of its own,
-- through the manager), "ready", then on the go file an in-band change
-- with no producer known here; each event's tag against its version.
local CONSUMER = kids.prelude .. [[
local ctx = lecho.context{ nameserver = opts.ns, quiet = true }
local ch = ctx:channel("field")
local n, bad, tags = 0, {}, {}
local con
con = assert(ch:consumer(function(ev, meta)
  if type(ev) == "table" and ev.done then
    io.stdout:write(cjson.encode{ n = n, bad = bad, tags = tags, version = con:params_version() }, "\n")
    ctx:stop()
    return
  end
  n = n + 1
  tags[tostring(ev.tag)] = (tags[tostring(ev.tag)] or 0) + 1
  if ev.tag ~= meta.params_version and #bad < 5 then
    bad[#bad + 1] = ("i=%d tag=%s version=%s"):format(ev.i, tostring(ev.tag), tostring(meta.params_version))
  end
end, { modulator = opts.mod, params = { tag = 1 } }))
assert(con:set_params{ tag = 2 })
io.stdout:write("ready\n")
local deadline = ctx:now() + 30
while ctx:now() < deadline do
  local f = io.open(opts.go)
  if f then f:close() break end
  ctx:run_once(0.005)
end
local ok, err = con:set_params{ tag = 3 }
io.stderr:write("v3 ", tostring(ok), " ", tostring(err), " ", con:params_version(), "\n")
ctx:after(30, function() ctx:stop() end)
ctx:run()
ctx:close()
]]

describe("in-band params_at of a producer whose join still waits (keyed)", function()
  after_each(function() S.cleanup() end)

  local KEYED = pcall(require, "lecho.keys") and (require("lecho.core").protocol_version or 1) >= 2

  it("events made with the newest params carry its version, not the stream's first", function()
    if not KEYED then pending("keyed mode not in this tree") return end
    local ns, dir, trust = S.keyed_nameserver(NAMES, POLICY)
    local go = S.tmpname("go")
    local env = ("export LECHO_KEY=%s LECHO_TRUST=%s"):format(S.sh_quote(dir .. "/viewer.key"),
                                                             S.sh_quote(table.concat(trust, ":")))
    local con = S.lua_with(env, CONSUMER, cjson.encode{ ns = ns, mod = kids.tag_modulator, go = go })
    assert(S.wait_file(con.out, "ready", 30), S.errors(con))

    local ctx = lecho.context{ nameserver = ns, key = dir .. "/sim.key", trust = trust, quiet = true }
    -- The join's reply (the one with the ticket) is held until the next
    -- member list was handled; the consumer changes its params when the
    -- reply is here (the manager has admitted this producer by then).
    local held, lists = nil, 0
    local on_ctrl = ctx._on_ctrl
    ctx._on_ctrl = function(self, from, msg, gen)
      if type(msg) == "table" and msg.op == "reply" and msg.ticket ~= nil and lists == 0 and not held then
        held = { from, msg, gen }
        S.write(go, "go")
        return
      end
      local r = on_ctrl(self, from, msg, gen)
      if type(msg) == "table" and msg.op == "members" then
        lists = lists + 1
        if held then
          local h = held
          held = nil
          on_ctrl(self, h[1], h[2], h[3])
        end
      end
      return r
    end
    local p = assert(ctx:channel("field"):producer())
    ctx._on_ctrl = nil                                     -- (the class's again)
    assert.is_true(lists > 0, "no member list came while the join waited")
    for i = 1, 40 do assert(p:submit{ i = i }) end
    assert(p:submit_sync({ done = true }, { timeout = 20 }))
    local line = assert(S.wait_file(con.out, "\n{.*}\n", 30), S.errors(con))
    local res = cjson.decode(line:match("\n({.*})\n"))
    ctx:close()
    assert.are.equal(40, res.n, line)
    assert.are.equal(3, res.version, line)
    assert.are.same({ ["3"] = 40 }, res.tags, line)
    assert.are.same({}, res.bad, line)
  end)
end)
