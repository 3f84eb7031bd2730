-- Covers doc/examples.md's Keiretsu output (not run by spec/doc_blocks_spec.lua).
-- examples/keiretsu (issue 12 point 7), a short run: four nodes, each in its
-- own network namespace when the machine allows it (else loopback
-- processes, which the output says), keyed; a user lists who is online,
-- sends another a message and sees one user leave and another (killed)
-- expire; blasters through 1..4 nodes; the first of two name servers and
-- two nodes killed and a third node silenced (link down, or SIGSTOP on
-- loopback) while blasting.  Asserts
-- that no acknowledged message was lost (every acknowledged id is among the
-- ids the speedometers received), that the service went on through the
-- last node, and that every process and namespace of the run is gone
-- afterwards, also when the driver itself is killed (its watchdog).  No
-- rate is asserted: the figures are printed.

local cjson = require "cjson"
local S = require "spec.support"

local RUN = S.root .. "/examples/keiretsu/run.lua"

-- What is left of a Keiretsu run (its namespaces, its processes): nil when
-- nothing.  Only what was not there before the run (`before`, a snapshot()):
-- namespaces another run left (a killed make asan) or another checkout's run
-- at the same time made are not this run's.
-- Without LD_PRELOAD: under `make asan` pgrep with ASan preloaded hangs in
-- a futex for good (that hung `make asan` at this spec).
local function snapshot()
  local _, out = S.sh("env -u LD_PRELOAD sh -c " .. S.sh_quote("ip netns list 2>/dev/null | grep keiretsu-; "
                      .. "pgrep -af 'examples/keiretsu/(node|blaster|speedometer|client)[.]lua'"))
  local set = {}
  for line in out:gmatch("[^\n]+") do set[line:match("^(%S+)")] = line end
  return set
end

local function leftovers(before)
  local left = {}
  for k, line in pairs(snapshot()) do
    if not before[k] then left[#left + 1] = line end
  end
  table.sort(left)
  return left[1] and table.concat(left, "\n") or nil
end

describe("examples/keiretsu", function()
  after_each(function() S.cleanup() end)

  it("loses no acknowledged message while three of four nodes are killed, and the service goes on", function()
    local before = snapshot()
    local json = S.tmpname("keiretsu") .. ".json"
    local ok, out = S.sh(("%s %s --phase 1 --after 2 --kill-gap 0.3 --json %s")
      :format(S.luajit, RUN, S.sh_quote(json)))
    print("\n" .. out)
    local r = cjson.decode((assert(S.read(json), "no summary: " .. out)))
    assert.is_true(ok, out)
    assert.is_nil(r.error)
    -- the hosts: namespaces when allowed, else said
    if r.hosts == "netns" then
      assert.truthy(out:find("network namespaces", 1, true))
    else
      assert.truthy(out:find("loopback processes on 127.0.0.1 (no network namespaces: ", 1, true))
    end
    -- the users: who is online, a message acknowledged and received
    assert.truthy(r.client.who:find("alice", 1, true), r.client.who)
    assert.truthy(r.client.sent:find("^sent .* to alice: acknowledged"), r.client.sent)
    assert.are.equal("from bob: hello from bob", r.client.got)
    -- presence: a watcher is told who leaves, and who dies (lease expired)
    assert.truthy(r.client.who:find("carol", 1, true), r.client.who)
    assert.are.equal("left alice (left)", r.client.left)
    assert.are.equal("left carol (expired)", r.client.gone)
    -- blasting: something acknowledged at each node count, nothing lost
    for k = 1, 4 do assert.is_true(r.rates[k] > 0, "no message through " .. k .. " nodes") end
    assert.is_true(r.acked > 0)
    assert.are.equal(0, r.lost)
    assert.is_true(r.received >= r.acked)
    -- after the first name server and three nodes went down, the service
    -- went on through the last node
    assert.truthy(out:find("killed the first name server (SIGKILL)", 1, true), out)
    assert.truthy(out:find("node-3 silenced: ", 1, true), out)
    assert.is_true(r.service_went_on)
    assert.is_true(r.after_kills.acked > 0 and r.after_kills.received > 0)
    assert.is_true(r.ok)
    assert.is_nil(leftovers(before))
  end)

  it("runs its programs from anywhere without LUA_PATH, says how to use them, and refuses a message for a user who is not online", function()
    local dir = S.root .. "/examples/keiretsu"
    local bare = "cd / && env -u LUA_PATH -u LUA_CPATH " .. S.luajit .. " " .. dir
    for _, prog in ipairs({ "run", "node", "client", "blaster", "speedometer" }) do
      local ok, out = S.sh(("%s/%s.lua --help"):format(bare, prog))
      assert.is_true(ok, prog .. ": " .. out)
      assert.truthy(out:find("usage: luajit examples/keiretsu/" .. prog .. ".lua", 1, true), out)
    end
    local ok, out, code = S.sh(bare .. "/node.lua --nameserver 127.0.0.1:1 --frobnicate")
    assert.is_false(ok)
    assert.are.equal(2, code)
    assert.truthy(out:find("node: unknown option '--frobnicate'", 1, true), out)
    ok, out = S.sh(bare .. "/client.lua --user bob")
    assert.is_false(ok)
    assert.truthy(out:find("--nameserver is required", 1, true), out)
    -- unkeyed on loopback: a node, then bob sends to carol (not online)
    -- and to himself
    local _, ns = S.nameserver("--quiet")
    local node = S.spawn(("%s/node.lua --name node-1 --nameserver %s --for 30"):format(bare, ns))
    assert(S.wait_file(node.out, "ready", 20), "node did not start: " .. S.errors(node))
    ok, out = S.sh(("%s/client.lua --user bob --nameserver %s --who --send carol --text hi"):format(bare, ns))
    assert.is_false(ok)
    assert.truthy(out:find("who is online: bob\n"), out)
    assert.truthy(out:find("not sent to carol: offline: carol (failed)", 1, true), out)
    ok, out = S.sh(("%s/client.lua --user bob --nameserver %s --send bob --text self --wait 5 --count 1"):format(bare, ns))
    assert.is_true(ok, out)
    assert.truthy(out:find("from bob: self", 1, true), out)
    assert.truthy(out:find("sent bob:[%d.]+ to bob: acknowledged"), out)
  end)

  it("removes its processes and namespaces when the driver itself is killed", function()
    local before = snapshot()
    local drv = S.spawn(("%s %s --phase 30"):format(S.luajit, RUN))
    -- (make asan: every `ip` the driver runs to make the namespaces has
    -- LeakSanitizer and its symbolizer at exit: nothing printed in 30 s at
    -- load 11)
    assert(S.wait_file(drv.out, "node%-1 ready", 30 * S.SLOW), "did not start: " .. S.output(drv) .. S.errors(drv))
    assert.is_truthy(S.alive(drv))
    S.kill(drv, "KILL")
    -- the watchdog looks once a second (then runs `ip netns del`s: make asan)
    local deadline = os.time() + 10 * S.SLOW
    while leftovers(before) and os.time() < deadline do S.sleep(0.2) end
    assert.is_nil(leftovers(before))
  end)
  it("removes the namespaces when the driver is killed while it makes them", function()
    -- (make asan: a driver killed before "node-1 ready" left three of its
    -- namespaces for good: its watchdog started only once they were all
    -- made)
    local ok = S.sh("env -u LD_PRELOAD sh -c 'test \"$(id -u)\" = 0 && ip netns list >/dev/null'")
    if not ok then
      pending("needs root and `ip netns`: skipped")
      return
    end
    local before = snapshot()
    local function new_ns()
      local _, list = S.sh("env -u LD_PRELOAD ip netns list")
      for name in list:gmatch("(keiretsu%-%S+)") do
        if not before[name] then return name end
      end
    end
    local drv = S.spawn(("%s %s --phase 30"):format(S.luajit, RUN))
    finally(function()
      -- (what a failing run left: deleted, for the next)
      for name in pairs(snapshot()) do
        if not before[name] and name:match("^keiretsu%-") then S.sh("env -u LD_PRELOAD ip netns del " .. name) end
      end
    end)
    local deadline = os.time() + 30 * S.SLOW
    while not new_ns() and S.alive(drv) and os.time() < deadline do S.sleep(0.01) end
    assert(new_ns(), "the driver made no namespace: " .. S.output(drv) .. S.errors(drv))
    S.kill(drv, "KILL")
    local made = S.output(drv)
    deadline = os.time() + 10 * S.SLOW
    while leftovers(before) and os.time() < deadline do S.sleep(0.2) end
    assert.is_nil(leftovers(before), "killed after: " .. (made ~= "" and made or "(nothing printed yet)"))
  end)
end)
