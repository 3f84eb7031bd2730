-- examples/keiretsu/run.lua (make keiretsu): instant messaging over four
-- nodes, messages per second for 1..4 nodes, then three of the four killed
-- while blasting.  `--help` says more.
local usage = [[
usage: luajit examples/keiretsu/run.lua [options]

Runs Keiretsu, instant messaging over replicated nodes, keyed (an authority
and a key per process are made in a temporary directory with
scripts/lecho-keygen, and a policy lets nodes serve and deliver, and each
user read only its own inbox):
  - each node in its own network namespace, joined to a "hub" namespace
    (two name servers and the clients) by a veth pair on a bridge, when the
    machine allows it (root, `ip netns`); else every process on 127.0.0.1,
    said in the output;
  - three users go online (examples/keiretsu/client.lua; presence group
    "im-users", 3 s lease): bob, watching who comes and goes, lists who is
    online and sends alice a message; alice leaves once she has it; carol
    is killed and bob is told when her lease runs out;
  - blasters (blaster.lua) send as fast as acknowledged to speedometers
    (speedometer.lua), through 1, then 2, 3 and 4 nodes: messages per
    second for each;
  - then, one every --kill-gap seconds while the blasters go on, the first
    of the two name servers is killed (SIGKILL: the channels' registry is
    gone; the service and the presence group go on at the second), nodes 1
    and 2 are killed and node 3 is silenced (its link cut; on loopback,
    SIGSTOP: no FIN, no RST, it just stops answering), and the run goes on
    --after seconds through the last node;
  - finally every acknowledged id is looked for among the ids the
    speedometers received: "lost" counts those missing.
Every node serves the service "im" (ctx:service); a send is ctx:call with
the message id as idempotency key: balanced over the nodes, sent again
through another node when one fails (at least once: readers drop a second
copy by id); a node answers once the recipient's client has handled the
message (acknowledged = delivered).
Exits 0 when no acknowledged message was lost, the service went on after
the kills, and bob's message, alice's leaving and carol's expiry arrived.
Every process and namespace it made is removed, also on failure (a
watchdog does it if the driver itself is killed).

  --phase SECONDS      how long each of the 1..4-node phases measures (default 5)
  --after SECONDS      blasting after the last kill (default 5)
  --kill-gap SECONDS   between two kills (default 0.5)
  --blasters N         blaster processes (default 2)
  --speedometers N     speedometer processes (default 2)
  --inflight N         sends waiting at once per blaster (default 8)
  --loopback           do not try network namespaces
  --json FILE          also write the summary as JSON to FILE
  --verbose            the lecho logs of every process on their stderr files (kept)
  --help               this text
]]

local here = (arg and arg[0] or ""):match("^(.*)/[^/]*$") or "."
local A = dofile(here .. "/../atmosphere/args.lua").new("keiretsu", usage)
local proc = dofile(here .. "/../atmosphere/proc.lua")
local NET = dofile(here .. "/net.lua")
local socket = require "socket"
local cjson = require "cjson"
local root = here .. "/../.."
local NNODES = 4

local o = { phase = 5, after = 5, kill_gap = 0.5, blasters = 2, speedometers = 2, inflight = 8 }
A.parse(arg, {
  ["--phase"] = function(get) o.phase = get.number() end,
  ["--after"] = function(get) o.after = get.number() end,
  ["--kill-gap"] = function(get) o.kill_gap = get.number() end,
  ["--blasters"] = function(get) o.blasters = get.number() end,
  ["--speedometers"] = function(get) o.speedometers = get.number() end,
  ["--inflight"] = function(get) o.inflight = get.number() end,
  ["--loopback"] = function() o.loopback = true end,
  ["--json"] = function(get) o.json = get.value() end,
  ["--verbose"] = function() o.verbose = true end,
})
if o.phase <= 0 or o.after <= 0 or o.kill_gap < 0 then A.die("--phase, --after must be > 0") end
if o.blasters < 1 or o.speedometers < 1 or o.inflight < 1 then A.die("--blasters, --speedometers, --inflight must be >= 1") end

local function out(fmt, ...)
  io.stdout:write(fmt:format(...), "\n")
  io.stdout:flush()
end
local function sq(s) return proc.sh_quote(s) end
local function read(path)
  local f = io.open(path, "r")
  if not f then return "" end
  local s = f:read("*a")
  f:close()
  return s
end
local function write(path, s)
  local f = assert(io.open(path, "w"))
  f:write(s)
  f:close()
end
local function now() return socket.gettime() end

local tmp = io.popen("mktemp -d /tmp/keiretsu-XXXXXX"):read("*l")
assert(tmp and tmp ~= "", "mktemp failed")
local tag = tmp:match("keiretsu%-(%w+)$"):lower():gsub("[^%w]", ""):sub(1, 6)
local children, pidfile = {}, tmp .. "/pids"
local net

-- Every child is started here: its pid goes to the watchdog's list.
local function start(name, host, argv)
  local full = {}
  for _, a in ipairs(net.prefix(host)) do full[#full + 1] = a end
  full[#full + 1] = "luajit"
  for _, a in ipairs(argv) do full[#full + 1] = a end
  local c = assert(proc.spawn(full, { out = ("%s/%s.out"):format(tmp, name), err = ("%s/%s.err"):format(tmp, name) }))
  c.name = name
  children[#children + 1] = c
  local f = assert(io.open(pidfile, "a"))
  f:write(c.pid, "\n")
  f:close()
  return c
end

local function wait_line(c, pat, timeout)
  local deadline = now() + (timeout or 20)
  while now() < deadline do
    local m = read(c.out):match(pat)
    if m then return m end
    if proc.poll(c) then break end
    proc.sleep(0.05)
  end
  error(("%s did not say %q (%s): %s%s"):format(c.name, pat, c.status or "running", read(c.out), read(c.err)), 0)
end

local function last_count(c)
  local last
  for l in read(c.out):gmatch("count [^\n]+") do last = l end
  local t = {}
  for w in (last or ""):gmatch("[%d.]+") do t[#t + 1] = tonumber(w) end
  return t   -- { seconds, a, b, c }
end

local function received_total(speedos)
  local n = 0
  for _, s in ipairs(speedos) do n = n + (last_count(s)[2] or 0) end
  return n
end
local function acked_total(blasters)
  local n = 0
  for _, b in ipairs(blasters) do n = n + (last_count(b)[2] or 0) end
  return n
end

-- CPU seconds (user + system) the processes of list have used so far.
local function cpu(list)
  local t = 0
  for _, c in ipairs(list) do
    local st = read(("/proc/%d/stat"):format(c.pid)):match("%) (.*)")
    if st then
      local f = {}
      for w in st:gmatch("%S+") do f[#f + 1] = w end
      t = t + ((tonumber(f[12]) or 0) + (tonumber(f[13]) or 0)) / 100   -- utime, stime (USER_HZ 100)
    end
  end
  return t
end

local result = { ok = false }
local function main()
  -- The watchdog: when this driver is gone (killed, even), it kills what it
  -- started and deletes the namespaces (every one this run may make: it
  -- starts before them, make asan killed a driver while it made them).
  -- (and every luajit whose command line names this run's directory: a
  -- child started as the driver died never reached the list; "[l]uajit"
  -- keeps the pattern from matching this shell's own command line).  It
  -- runs without LD_PRELOAD: under make asan (libasan preloaded in every
  -- process) pkill hangs in a futex at its start, for good, and the
  -- namespaces stayed.
  local wd = ("while kill -0 %d 2>/dev/null; do sleep 1; done; for p in $(cat %s 2>/dev/null); do grep -qs keiretsu /proc/$p/cmdline && kill -9 $p; done; "
              .. "pkill -9 -f %s 2>/dev/null; for n in %s; do ip netns del $n 2>/dev/null; done; %s")
    :format(tonumber(read("/proc/self/stat"):match("^(%d+)")), sq(pidfile), sq("[l]uajit .*" .. tmp .. "/"),
            table.concat(NET.names(NNODES, tag), " "), o.verbose and "true" or ("rm -rf " .. sq(tmp)))
  os.execute(("env -u LD_PRELOAD setsid sh -c %s >/dev/null 2>&1 </dev/null &"):format(sq(wd)))
  net = NET.new(NNODES, tag, o.loopback)
  if net.kind == "netns" then
    out("hosts: %d network namespaces (nodes 10.233.0.1-%d, hub 10.233.0.254 with the name servers and the clients), veth pairs on a bridge",
        NNODES + 1, NNODES)
  else
    out("hosts: loopback processes on 127.0.0.1 (no network namespaces: %s)", net.why)
  end
  result.hosts = net.kind
  local np = io.popen("nproc 2>/dev/null")
  result.cores = tonumber(np:read("*l") or "")
  np:close()
  if result.cores then
    out("this machine has %d cores: messages/s stop growing with nodes once the processes use them all", result.cores)
  end

  -- keys and policy
  local keys = tmp .. "/keys"
  local users = { "alice", "bob", "carol" }
  for i = 1, o.blasters do users[#users + 1] = "blaster-" .. i end
  local speedo_names = {}
  for i = 1, o.speedometers do speedo_names[i] = "speedo-" .. i; users[#users + 1] = speedo_names[i] end
  local nodes = {}
  for k = 1, NNODES do nodes[k] = "node-" .. k end
  local kg = root .. "/scripts/lecho-keygen"
  assert(os.execute(("luajit %s ca --dir %s --authority >/dev/null"):format(sq(kg), sq(keys))) == 0, "lecho-keygen failed")
  assert(os.execute(("luajit %s nameserver %s %s --dir %s --sign-with %s >/dev/null")
    :format(sq(kg), table.concat(nodes, " "), table.concat(users, " "), sq(keys), sq(keys .. "/ca.key"))) == 0,
    "lecho-keygen failed")
  local trust = keys .. "/ca.pub"
  local rules = {
    { principal = "node-*", channel = "svc:im", allow = "consume" },
    { principal = "node-*", channel = "inbox.*", allow = "produce" },
  }
  for _, u in ipairs(users) do
    rules[#rules + 1] = { principal = u, channel = "inbox." .. u, allow = "consume" }
    -- a user calls the service (never serves it: only nodes consume svc:im)
    -- and joins and watches the presence group
    rules[#rules + 1] = { principal = u, channel = "svc:im", allow = "produce" }
    rules[#rules + 1] = { principal = u, channel = "im-users", allow = { "produce", "consume" } }
    rules[#rules + 1] = { principal = u, channel = "inbox.*", allow = "list" }
  end
  local policy = tmp .. "/policy.json"
  write(policy, cjson.encode({ lecho = "policy", version = 1, rules = rules }))
  local function common(name, host)
    local t = { "--key", ("%s/%s.key"):format(keys, name), "--trust", trust,
                "--listen", net.ip(host) .. ":0" }
    if o.verbose then t[#t + 1] = "--verbose" end
    return t
  end
  local function args(list, more)
    for _, a in ipairs(more) do list[#list + 1] = a end
    return list
  end

  -- the name server
  local nss, nsaddrs = {}, {}
  for i = 1, 2 do
    local nsfile = ("%s/ns-%d.addr"):format(tmp, i)
    nss[i] = start("nameserver-" .. i, "hub", { root .. "/scripts/lecho-nameserver", "--listen", net.ip("hub") .. ":0",
      "--port-file", nsfile, "--key", keys .. "/nameserver.key", "--trust", trust, "--policy", policy,
      "--for", "900", "--settle", "0", o.verbose and "--for" or "--quiet", o.verbose and "900" or nil })
    local deadline = now() + 20
    repeat
      nsaddrs[i] = read(nsfile):match("[^\n]+")
      if not nsaddrs[i] then
        if proc.poll(nss[i]) then error("name server exited: " .. read(nss[i].err), 0) end
        proc.sleep(0.05)
      end
    until nsaddrs[i] or now() > deadline
    assert(nsaddrs[i], "name server did not start: " .. read(nss[i].err))
  end
  local nsaddr = table.concat(nsaddrs, ",")
  out("name servers %s (channels at the first; the service and presence at both)", table.concat(nsaddrs, " and "))

  local function node(k)
    local c = start(nodes[k], k, args({ here .. "/node.lua", "--name", nodes[k], "--nameserver", nsaddr, "--for", "900" },
                                      common(nodes[k], k)))
    local line = wait_line(c, "ready ([^\n]+)")
    out("%s ready at %s", nodes[k], line)
    return c
  end
  local node_c = { node(1) }

  -- three users: alice and carol go online; bob, watching who comes and
  -- goes, lists who is online and sends alice a message; alice leaves once
  -- she has it; carol is killed (SIGKILL): her lease runs out
  local function client(user, more)
    local c = start(user, "hub", args(args({ here .. "/client.lua", "--user", user, "--nameserver", nsaddr }, more),
                                      common(user, "hub")))
    wait_line(c, "online as")
    return c
  end
  local alice = client("alice", { "--wait", "10", "--count", "1" })
  local carol = client("carol", { "--wait", "60" })
  local bob = client("bob", { "--watch", "--who", "--send", "alice", "--text", "hello from bob", "--wait", "15" })
  proc.wait_all({ alice }, 20)
  wait_line(bob, "\nleft alice [^\n]*")
  local t_kill = now()
  proc.signal(carol, 9)
  local gone = wait_line(bob, "\n(left carol [^\n]*)", 15)
  local t_gone = now() - t_kill
  local who = read(bob.out):match("who is online: [^\n]*") or ("(bob: " .. read(bob.err) .. ")")
  local sent = read(bob.out):match("sent [^\n]*") or read(bob.out):match("not sent [^\n]*") or read(bob.err)
  local got = read(alice.out):match("from bob: [^\n]*")
  local left = read(bob.out):match("left alice [^\n]*")
  out("bob: %s", who)
  out("bob: %s", sent)
  out("alice: %s", got or ("nothing received " .. read(alice.err)))
  out("bob: %s", left)
  out("carol killed (SIGKILL); %.1f s later bob: %s (her lease: %g s)", t_gone, gone, 3)
  result.client = { who = who, sent = sent, got = got, left = left, gone = gone, gone_after = t_gone }
  result.client_ok = got == "from bob: hello from bob" and who:find("alice", 1, true) ~= nil
                     and who:find("carol", 1, true) ~= nil
                     and (sent or ""):find("acknowledged", 1, true) ~= nil
                     and left == "left alice (left)" and gone == "left carol (expired)"

  -- speedometers, then blasters
  local stop_s, stop_b = tmp .. "/stop-speedometers", tmp .. "/stop-blasters"
  local speedos, blasters = {}, {}
  for i, u in ipairs(speedo_names) do
    speedos[i] = start(u, "hub", args({ here .. "/speedometer.lua", "--user", u, "--nameserver", nsaddr, "--ids",
                                        ("%s/%s.ids"):format(tmp, u), "--stop", stop_s, "--for", "900" }, common(u, "hub")))
  end
  for _, s in ipairs(speedos) do wait_line(s, "ready") end
  for i = 1, o.blasters do
    local u = "blaster-" .. i
    blasters[i] = start(u, "hub", args({ here .. "/blaster.lua", "--user", u, "--to", table.concat(speedo_names, ","),
      "--nameserver", nsaddr, "--inflight", tostring(o.inflight),
      "--acked", ("%s/%s.acked"):format(tmp, u), "--stop", stop_b, "--for", "900" }, common(u, "hub")))
  end
  for _, b in ipairs(blasters) do wait_line(b, "ready") end

  -- messages per second through 1, 2, 3, 4 nodes
  result.rates = {}
  for k = 1, NNODES do
    if k > 1 then node_c[k] = node(k) end
    proc.sleep(1)     -- the senders learn of the new node; warm up
    local clients = {}
    for _, c in ipairs(blasters) do clients[#clients + 1] = c end
    for _, c in ipairs(speedos) do clients[#clients + 1] = c end
    local n0, t0, cn0, cc0 = received_total(speedos), now(), cpu(node_c), cpu(clients)
    proc.sleep(o.phase)
    local n1, t1, cn1, cc1 = received_total(speedos), now(), cpu(node_c), cpu(clients)
    local rate = (n1 - n0) / (t1 - t0)
    result.rates[k] = rate
    result.cpu = result.cpu or {}
    result.cpu[k] = { nodes = (cn1 - cn0) / (t1 - t0), clients = (cc1 - cc0) / (t1 - t0) }
    result.cpu[k].load = tonumber(read("/proc/loadavg"):match("^%S+"))
    out("%d node%s: %8.0f messages/s (%d in %.1f s; CPU in use: nodes %.2f, blasters and speedometers %.2f; load average %s)",
        k, k > 1 and "s" or " ", rate, n1 - n0, t1 - t0, result.cpu[k].nodes, result.cpu[k].clients,
        result.cpu[k].load or "?")
  end

  -- kill three of the four while blasting
  local before = acked_total(blasters)
  proc.signal(nss[1], 9)
  out("killed the first name server (SIGKILL)")
  proc.sleep(o.kill_gap)
  -- (the last of them dies as a host does: silent, no FIN, no RST; its
  -- calls end in their timeout and are sent again elsewhere)
  for k = 1, NNODES - 1 do
    if k == NNODES - 1 then
      out("%s silenced: %s", nodes[k], net.silence(k, node_c[k]))
    else
      proc.signal(node_c[k], 9)
      out("killed %s (SIGKILL)", nodes[k])
    end
    proc.sleep(o.kill_gap)
  end
  local a0 = acked_total(blasters)
  local n0, t0 = received_total(speedos), now()
  proc.sleep(o.after)
  local a1, n1, t1 = acked_total(blasters), received_total(speedos), now()
  result.after_kills = { acked = a1 - a0, received = n1 - n0, rate = (n1 - n0) / (t1 - t0),
                         acked_during_kills = a0 - before }
  out("after the kills, through %s: %8.0f messages/s (%d acknowledged in %.1f s)",
      nodes[NNODES], result.after_kills.rate, a1 - a0, t1 - t0)

  -- stop the blasters (their sends in flight end), then the speedometers
  write(stop_b, "stop")
  assert(proc.wait_all(blasters, 30), "blasters did not stop")
  proc.sleep(0.5)
  write(stop_s, "stop")
  assert(proc.wait_all(speedos, 30), "speedometers did not stop")
  local received, dups = {}, 0
  for i, s in ipairs(speedos) do
    for id in read(("%s/%s.ids"):format(tmp, speedo_names[i])):gmatch("[^\n]+") do received[id] = true end
    dups = dups + (tonumber(read(s.out):match("done %d+ (%d+)")) or 0)
  end
  local acked, lost, failed, examples = 0, 0, 0, {}
  for i, b in ipairs(blasters) do
    for id in read(("%s/blaster-%d.acked"):format(tmp, i)):gmatch("[^\n]+") do
      acked = acked + 1
      if not received[id] then
        lost = lost + 1
        if #examples < 5 then examples[#examples + 1] = id end
      end
    end
    local a, f = read(b.out):match("done (%d+) (%d+)")
    assert(a, "blaster-" .. i .. " did not finish: " .. read(b.out) .. read(b.err))
    failed = failed + tonumber(f)
    for l in read(b.out):gmatch("error [^\n]+") do out("blaster-%d: %s", i, l) end
  end
  local nrecv = 0
  for _ in pairs(received) do nrecv = nrecv + 1 end
  result.acked, result.lost, result.failed = acked, lost, failed
  result.received, result.duplicates = nrecv, dups
  out("acknowledged %d, received %d (and %d second copies dropped by id), sends not acknowledged %d",
      acked, nrecv, dups, failed)
  out("lost (acknowledged, never received): %d%s", lost,
      #examples > 0 and (" e.g. " .. table.concat(examples, " ")) or "")
  local went_on = result.after_kills.acked > 0 and result.after_kills.received > 0
  result.service_went_on = went_on
  result.ok = lost == 0 and went_on and acked > 0 and result.client_ok
  out("%s", result.ok and "OK: no acknowledged message lost; the service went on through the last node"
      or "FAILED")
end

local ok, err = xpcall(main, debug.traceback)
if not ok then
  result.error = tostring(err)
  out("FAILED: %s", tostring(err))
  for _, c in ipairs(children) do
    local e = read(c.err)
    if e ~= "" then io.stderr:write(("--- %s stderr:\n%s\n"):format(c.name, e:sub(-2000))) end
  end
end
proc.stop_all(children, 3)
os.remove(pidfile)   -- (all reaped: the watchdog has nothing to kill, not even a reused pid)
if net then net.teardown() end
if o.json then write(o.json, cjson.encode(result)) end
if not o.verbose then os.execute("rm -rf " .. sq(tmp)) else out("logs kept in %s", tmp) end
os.exit(result.ok and 0 or 1)
