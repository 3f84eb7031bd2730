-- spec/support/veth.lua: two hosts for the specs that need them, two
-- network namespaces joined by a veth pair, each end with its address on
-- one /24.  Needs root and a working `ip netns`: works() says whether it
-- has them (a spec skips, pending, when not); remove() deletes the
-- namespaces (and with them the veth pair), also after a failed make().

local S = require "spec.support"

local M = {}

--- Runs the shell command `cmd`, its output discarded: true when it exited 0.
function M.sh(cmd)
  local ok = os.execute(cmd .. " >/dev/null 2>&1")
  return ok == 0 or ok == true
end
local sh = M.sh

local Hosts = {}
Hosts.__index = Hosts

--- Two hosts: o.ns = { namespace a, b }, o.dev = { its veth end a, b }
-- (names, a tag of this run added: a device name is at most 15
-- characters), o.ip = { address of a, of b } (on one /24).  Returns a
-- table with the names as fields ns_a, ns_b, dev_a, dev_b, ip_a, ip_b.
function M.hosts(o)
  local tag = tostring(math.random(1000, 9999)) .. tostring(os.time() % 1000)
  return setmetatable({ ns_a = o.ns[1] .. tag, ns_b = o.ns[2] .. tag, dev_a = o.dev[1] .. tag,
                        dev_b = o.dev[2] .. tag, ip_a = o.ip[1], ip_b = o.ip[2] }, Hosts)
end

--- true when this process is root and `ip netns` works (it makes the first
-- namespace), else false and why not.
function Hosts:works()
  local p = io.popen("id -u")
  local uid = p:read("*l")
  p:close()
  if uid ~= "0" then return false, "not root" end
  if not sh("ip netns add " .. self.ns_a) then return false, "`ip netns add` failed" end
  return true
end

--- Makes the second namespace and the veth pair between them (after
-- works()), and waits (10 s at most) until both ends are up (carrier), so
-- that processes start on a link that carries: no ping here, it may not
-- be installed.
function Hosts:make()
  local h = self
  for _, c in ipairs{
    "ip netns add " .. h.ns_b,
    ("ip link add %s type veth peer name %s"):format(h.dev_a, h.dev_b),
    ("ip link set %s netns %s"):format(h.dev_a, h.ns_a),
    ("ip link set %s netns %s"):format(h.dev_b, h.ns_b),
    ("ip -n %s addr add %s/24 dev %s"):format(h.ns_a, h.ip_a, h.dev_a),
    ("ip -n %s addr add %s/24 dev %s"):format(h.ns_b, h.ip_b, h.dev_b),
    ("ip -n %s link set lo up"):format(h.ns_a), ("ip -n %s link set lo up"):format(h.ns_b),
    ("ip -n %s link set %s up"):format(h.ns_a, h.dev_a), ("ip -n %s link set %s up"):format(h.ns_b, h.dev_b),
  } do assert(sh(c), "setup failed: " .. c) end
  local deadline = os.time() + 10
  while not (sh(("ip -n %s link show %s | grep -q LOWER_UP"):format(h.ns_a, h.dev_a))
             and sh(("ip -n %s link show %s | grep -q LOWER_UP"):format(h.ns_b, h.dev_b))) do
    assert(os.time() < deadline, "the veth pair did not come up")
    S.sleep(0.05)
  end
end

--- Deletes both namespaces, and the veth pair if a step failed before it
-- was moved into one.
function Hosts:remove()
  sh("ip netns del " .. self.ns_a)
  sh("ip netns del " .. self.ns_b)
  sh("ip link del " .. self.dev_a)
end

return M
