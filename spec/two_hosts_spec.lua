-- README "Keys across two hosts", run as written on two hosts (issue 25, item
-- 2): its four command lines are taken from README.md, the name server and
-- the simulation run in one network namespace, the viewer in another (a
-- veth pair between them); HOST is the name server's address on the veth
-- (its certificate lists HOST:7700), which it must print.  The
-- viewer must receive the simulation's events, its final one included, and
-- exit 0.  Then a consumer left on 127.0.0.1 must say why nothing comes.
--
-- Needs root and a working `ip netns`; skipped (pending) otherwise.  The
-- namespaces are deleted after the test, also when it fails.
local S = require "spec.support"

local H = require("spec.support.veth").hosts{ ns = { "lecho-ra-", "lecho-rb-" }, dev = { "lra", "lrb" },
                                              ip = { "10.232.0.1", "10.232.0.2" } }
local NS_A, NS_B, IP_A = H.ns_a, H.ns_b, H.ip_a
local sh = require("spec.support.veth").sh

-- The command lines of README's "Keys across two hosts" recipe (its ```sh block).
local function recipe()
  local readme = S.read(S.root .. "/README.md")
  local block = readme:match("give every process a key and the keys it trusts:\n\n```sh[^\n]*\n(.-)\n```\n")
  assert(block, "README.md: the keyed recipe is not where it was")
  local lines = {}
  for l in block:gmatch("[^\n]+") do lines[#lines + 1] = (l:gsub("^%s+", "")) end
  assert(#lines == 4, "README.md: the keyed recipe has " .. #lines .. " lines, not 4")
  return lines
end

describe("README's keyed recipe on two hosts", function()
  local ok_ns, why
  local dir

  setup(function()
    ok_ns, why = H:works()
    if ok_ns then H:make() end
    -- A directory standing for the checkout, where keys/ is made.
    dir = S.tmpdir() .. "/checkout"
    os.execute("mkdir -p " .. S.sh_quote(dir))
    for _, d in ipairs{ "scripts", "examples", "lua" } do
      os.execute(("ln -s %s %s"):format(S.sh_quote(S.root .. "/" .. d), S.sh_quote(dir .. "/" .. d)))
    end
  end)

  teardown(function()
    S.cleanup()
    if ok_ns then H:remove() end
  end)

  local spawned = {}
  after_each(function()     -- (a failed test leaves nothing listening on :7700)
    for _, c in ipairs(spawned) do S.kill(c, "KILL") S.wait(c, 5) end
    spawned = {}
  end)

  local function in_host(ns, cmd)
    spawned[#spawned + 1] = S.spawn(("ip netns exec %s sh -c %s"):format(ns, S.sh_quote(("cd %s && exec env %s")
      :format(S.sh_quote(dir), cmd))))
    return spawned[#spawned]
  end

  it("delivers the simulation's events to the viewer on the other host", function()
    if not ok_ns then pending("needs root and `ip netns` (" .. why .. "): skipped") return end
    local cmd = recipe()
    -- HOST: the name server's host's address as the other host reaches it
    -- (its certificate lists HOST:7700, and it advertises it)
    local function with_host(c) return (c:gsub("HOST:7700", IP_A .. ":7700")) end
    assert(sh(("cd %s && %s"):format(S.sh_quote(dir), with_host(cmd[1]))), "lecho-keygen failed: " .. cmd[1])
    local ns = in_host(NS_A, with_host(cmd[2]))
    local line = S.wait_file(ns.err, "listening on [%d%.]+:7700", 20)
    assert(line, "the name server did not start: " .. S.errors(ns))
    local host = line:match("listening on ([%d%.]+):7700")
    assert.are.equal(IP_A, host)
    local sim = in_host(NS_A, with_host(cmd[3]))
    assert(S.wait_file(sim.out, "simulating", 20), "the simulation did not start: " .. S.errors(sim))
    local viewer = in_host(NS_B, with_host(cmd[4]))
    local done, rc = S.wait(viewer, 90)
    assert.is_true(done, "the viewer did not end: " .. S.output(viewer) .. S.errors(viewer))
    local out = S.output(viewer)
    local events = tonumber(out:match("diff: (%d+) events[^\n]*%(final%)"))
    assert(events, "no final line from the viewer: " .. out .. S.errors(viewer) .. S.errors(sim))
    assert.is_true(events > 10, out)
    assert.are.equal(0, rc, out .. S.errors(viewer))
    assert.truthy(S.wait(sim, 30))
    S.kill(ns, "TERM")
    assert.truthy(S.wait(ns, 10))
  end)

  it("tells a consumer on 127.0.0.1 that a producer on another host cannot reach it", function()
    if not ok_ns then pending("needs root and `ip netns` (" .. why .. "): skipped") return end
    local cmd = recipe()
    local function with_host(c) return (c:gsub("HOST:7700", IP_A .. ":7700")) end
    local ns = in_host(NS_A, with_host(cmd[2]))
    local line = S.wait_file(ns.err, "listening on [%d%.]+:7700", 20)
    assert(line, "the name server did not start: " .. S.errors(ns))
    local sim = in_host(NS_A, with_host(cmd[3]) .. " --seconds 20")
    assert(S.wait_file(sim.out, "simulating", 20), "the simulation did not start: " .. S.errors(sim))
    -- the viewer as it was before the recipe said --listen
    local viewer = in_host(NS_B, with_host(cmd[4]):gsub(" %-%-listen 0%.0%.0%.0:0", "") .. " --seconds 5")
    S.wait(viewer, 30)
    assert.matches("producer " .. IP_A:gsub("%.", "%%.") .. ":%d+ is on another host and cannot "
      .. "connect to this context's address 127%.0%.0%.1:%d+", S.errors(viewer))
    S.kill(sim, "TERM")
    S.kill(ns, "TERM")
    S.wait(sim, 10)
    S.wait(ns, 10)
  end)
end)
