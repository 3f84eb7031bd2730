-- examples/keiretsu/net.lua: the hosts of the Keiretsu run.  With root and a
-- working `ip netns`: a namespace "hub" holding a bridge (the name server
-- and the clients run there, at 10.233.0.254) and one namespace per node
-- (node K at 10.233.0.K), each joined to the bridge by a veth pair; nothing
-- changes in the namespace the driver runs in.  Otherwise every process runs
-- here on 127.0.0.1 ("loopback").
--
--   local net = dofile(here .. "/net.lua").new(nnodes, tag)
--   net.kind                  -- "netns" or "loopback"; net.why: why loopback
--   net.prefix("hub")         -- argv prefix that runs a program there ({} on loopback)
--   net.ip("hub"), net.ip(2)  -- the listen IP of each host
--   net.silence(k, child)     -- node k goes silent (link down, or SIGSTOP on loopback)
--   net.names()               -- the namespaces made
--   M.names(nnodes, tag)      -- every namespace new() may make (for the
--                             -- watchdog, started before: the driver may
--                             -- be killed while they are made)
--   net.teardown()            -- deletes them (every process in them stopped first)

local M = {}

local function sh(cmd)
  local ok = os.execute(cmd .. " >/dev/null 2>&1")
  return ok == 0 or ok == true
end

local function sleep(s) os.execute(("sleep %.2f"):format(s)) end

function M.names(nnodes, tag)
  local l = { "keiretsu-hub-" .. tag }
  for k = 1, nnodes do l[k + 1] = ("keiretsu-n%d-%s"):format(k, tag) end
  return l
end

function M.new(nnodes, tag, force_loopback)
  local N = { kind = "loopback" }
  local names = M.names(nnodes, tag)
  local hub, bridge = names[1], "kb" .. tag
  local nss = {}
  for k = 1, nnodes do nss[k] = names[k + 1] end
  local made = {}

  function N.names() return made end

  function N.teardown()
    for i = #made, 1, -1 do sh("ip netns del " .. made[i]) end
    made = {}
  end

  function N.prefix(host)
    if N.kind ~= "netns" then return {} end
    return { "ip", "netns", "exec", host == "hub" and hub or nss[host] }
  end

  --- Makes node k silent as a dead host is (no FIN, no RST: what it sent
  -- is not answered): its link set down, or on loopback its process
  -- stopped (SIGSTOP; child: proc.lua's).  Returns what it did.
  function N.silence(k, child)
    if N.kind == "netns" and sh(("ip -n %s link set kn%s%d down"):format(nss[k], tag, k)) then
      return "its link is down"
    end
    if not child.status then require("ffi").C.kill(child.pid, 19) end
    return "its process stopped (SIGSTOP)"
  end

  function N.ip(host)
    if N.kind ~= "netns" then return "127.0.0.1" end
    return host == "hub" and "10.233.0.254" or ("10.233.0.%d"):format(host)
  end

  local function try()
    local p = io.popen("id -u")
    local uid = p:read("*l")
    p:close()
    if uid ~= "0" then return nil, "not root" end
    if not sh("ip netns add " .. hub) then return nil, "`ip netns add` failed" end
    made[#made + 1] = hub
    local cmds = {
      ("ip -n %s link set lo up"):format(hub),
      ("ip -n %s link add %s type bridge"):format(hub, bridge),
      ("ip -n %s addr add 10.233.0.254/24 dev %s"):format(hub, bridge),
      ("ip -n %s link set %s up"):format(hub, bridge),
    }
    for _, c in ipairs(cmds) do
      if not sh(c) then return nil, "failed: " .. c end
    end
    for k = 1, nnodes do
      local ns, dn, dh = nss[k], ("kn%s%d"):format(tag, k), ("kh%s%d"):format(tag, k)
      if not sh("ip netns add " .. ns) then return nil, "`ip netns add` failed" end
      made[#made + 1] = ns
      cmds = {
        -- made inside the node's namespace, its peer moved into the hub
        ("ip -n %s link add %s type veth peer name %s"):format(ns, dn, dh),
        ("ip -n %s link set %s netns %s"):format(ns, dh, hub),
        ("ip -n %s link set %s master %s"):format(hub, dh, bridge),
        ("ip -n %s addr add 10.233.0.%d/24 dev %s"):format(ns, k, dn),
        ("ip -n %s link set lo up"):format(ns),
        ("ip -n %s link set %s up"):format(ns, dn),
        ("ip -n %s link set %s up"):format(hub, dh),
      }
      for _, c in ipairs(cmds) do
        if not sh(c) then return nil, "failed: " .. c end
      end
    end
    -- every link up (carrier) before anything starts
    local deadline = os.time() + 10
    for k = 1, nnodes do
      while not sh(("ip -n %s link show kn%s%d | grep -q LOWER_UP"):format(nss[k], tag, k)) do
        if os.time() > deadline then return nil, "the veth pairs did not come up" end
        sleep(0.05)
      end
    end
    return true
  end

  if force_loopback then
    N.why = "--loopback"
  else
    local ok, why = try()
    if ok then
      N.kind = "netns"
    else
      N.teardown()
      N.why = why
    end
  end
  return N
end

return M
