-- Contexts on IPv6, on Unix-domain sockets and on a wildcard (issue 9, item
-- 7): a name server process, a producer process and a consumer (this
-- process) on each kind of address, events in order across each; a channel
-- of that name server referenced from a context with a name server of its
-- own ("[::1]:P/x", "unix:/p//x"); a wildcard listener advertises an
-- address peers can dial, not 0.0.0.0; unix socket files are removed at
-- exit, a stale one is replaced, a live one is not taken over.  Listening on
-- a wildcard takes keyed mode (protected mode refuses it, as it says).

local lecho = require "lecho"
local keys = require "lecho.keys"
local S = require "spec.support"
local socket = require "socket"

-- The secret key file of principal name, certified by an authority "ca",
-- and the trust file (ca.pub) every process of these specs trusts; made in
-- this spec's temporary directory (again after each cleanup).
local keydir
local function keyed(name)
  if not keydir or not S.read(keydir .. "/ca.pub") then
    keydir = S.tmpname("keys")
    os.execute("mkdir -p " .. S.sh_quote(keydir))
    local ca = keys.generate("ca")
    assert(keys.write_secret(keydir .. "/ca.key", ca))
    assert(keys.write_public(keydir .. "/ca.pub", ca, true))
  end
  local file = ("%s/%s.key"):format(keydir, name)
  if not S.read(file) then
    local ca = assert(keys.read_secret(keydir .. "/ca.key"))
    local k = keys.generate(name)
    k.cert, k.authority = keys.certify(ca, name, k.public), ca.public
    assert(keys.write_secret(file, k))
  end
  return file, keydir .. "/ca.pub"
end

-- The name server script's options for keyed mode.
local function keyed_args()
  local key, trust = keyed("nameserver")
  return ("--key %s --trust %s"):format(S.sh_quote(key), S.sh_quote(trust))
end

local PRODUCER = [[
local lecho = require "lecho"
local listen, ns, name, n = arg[1], arg[2], arg[3], tonumber(arg[4])
local key, trust = arg[6] ~= "" and arg[6] or nil, arg[7] ~= "" and arg[7] or nil
local ctx = lecho.context{ listen = listen, nameserver = ns, quiet = true, key = key, trust = trust }
local f = io.open(arg[5], "w") f:write(ctx.addr, "\n") f:close()
local ch = ctx:channel(name)
local p = assert(ch:producer())
local t0 = ctx:now()
while ctx:stats().channels[ch.name].destinations == 0 do
  ctx:run_once(0.05)
  if ctx:now() - t0 > 20 then error("no consumer joined") end
end
for i = 1, n - 1 do assert(p:submit(i)) end
assert(p:submit_sync(n, { timeout = 10 }))
local peers = {}
for a in pairs(ctx:stats().peers) do peers[#peers + 1] = a end
table.sort(peers)
f = io.open(arg[5], "a") f:write(table.concat(peers, " "), "\n") f:close()
ctx:close()
]]

-- Starts a name server on listen (more options: extra); returns its
-- advertised address.
local function nameserver(listen, extra)
  local pf = S.tmpname("ns-addr")
  local child = S.spawn(("%s %s/scripts/lecho-nameserver --listen %s --port-file %s --for 60 --settle 0 --quiet %s")
    :format(S.luajit, S.root, S.sh_quote(listen), pf, extra or ""))
  local addr = S.wait_file(pf, "%S+\n")
  assert(addr, "name server did not start: " .. S.errors(child))
  return addr:match("%S+"), child
end

-- A consumer here on clisten, a producer process on plisten, name server ns:
-- 100 events arrive in order.  With ref, the consumer's context runs a name
-- server of its own and names the channel by ref (of ns).  Returns the two
-- contexts' addresses, the channel's full name and the peers the producer
-- saw (a list).  keyed: both contexts in keyed mode.
local function flow(ns, clisten, plisten, name, advertise, ref, keyed_mode)
  local ckey, trust, pkey = "", "", ""
  if keyed_mode then
    ckey, trust = keyed("consumer")
    pkey = keyed("producer")
  end
  local ctx = lecho.context{ listen = clisten, advertise = advertise,
                             nameserver = not ref and ns or nil, quiet = true,
                             key = keyed_mode and ckey or nil, trust = keyed_mode and trust or nil }
  local got = {}
  local ch = ctx:channel(ref or name)
  ch:consumer(function(ev) got[#got + 1] = ev end)
  local af = S.tmpname("p-addr")
  local prod = S.lua(PRODUCER, plisten, ns, name, "100", af, pkey, trust)
  assert.is_true(S.run_until(ctx, function() return #got == 100 end, 30),
    ("%d of 100 events; producer: %s"):format(#got, S.errors(prod)))
  for i = 1, 100 do assert.are.equal(i, got[i]) end
  assert.is_true((S.wait(prod, 20, ctx)))
  assert.are.equal(0, prod.rc, S.errors(prod))
  local paddr, seen = S.read(af):match("^(%S+)\n([^\n]*)\n$")
  local caddr, full = ctx.addr, ch.name
  ctx:close()
  local peers = {}
  for a in (seen or ""):gmatch("%S+") do peers[#peers + 1] = a end
  return caddr, paddr, full, peers
end

local function has(list, x)
  for _, v in ipairs(list) do if v == x then return true end end
  return false
end

-- io.open cannot open a socket: ask test(1).
local function exists(path)
  local rc = os.execute("test -e " .. S.sh_quote(path))
  return rc == 0 or rc == true
end

-- Asked of the host, not of lecho (which may be what cannot do it).
local function has_ipv6()
  local s = socket.tcp6 and socket.tcp6()
  if not s then return false end
  local ok = s:bind("::1", 0)
  s:close()
  return ok ~= nil
end

describe("transports", function()
  after_each(S.cleanup)

  it("carries events between contexts on IPv6 loopback", function()
    if not has_ipv6() then pending("no IPv6 loopback on this host") return end
    local ns = nameserver("[::1]:0")
    assert.truthy(ns:match("^%[::1%]:%d+$"), ns)
    local c, p, full, seen = flow(ns, "[::1]:0", "[::1]:0", "six")
    assert.truthy(c:match("^%[::1%]:%d+$"), c)
    assert.truthy(p:match("^%[::1%]:%d+$"), p)
    assert.are.equal(ns .. "/six", full)
    assert.is_true(has(seen, c), table.concat(seen, " "))
    -- the same channel from a context whose default name server is itself
    c, p, full = flow(ns, "[::1]:0", "[::1]:0", "six2", nil, ns .. "/six2")
    assert.are.equal(ns .. "/six2", full)
  end)

  it("carries events between contexts on Unix-domain sockets and removes their files", function()
    local dir = S.tmpdir()
    local ns, nsproc = nameserver("unix:" .. dir .. "/ns.sock")
    assert.are.equal("unix:" .. dir .. "/ns.sock", ns)
    local c, p, full = flow(ns, "unix:" .. dir .. "/c.sock", "unix:" .. dir .. "/p.sock", "a/b")
    assert.are.equal("unix:" .. dir .. "/c.sock", c)
    assert.are.equal("unix:" .. dir .. "/p.sock", p)
    assert.are.equal(ns .. "//a/b", full)
    assert.is_false(exists(dir .. "/c.sock"), "consumer's socket file left behind")
    assert.is_false(exists(dir .. "/p.sock"), "producer's socket file left behind")
    assert.is_true(exists(dir .. "/ns.sock"))
    -- a channel of that name server from a context with a name server of its own
    c, p, full = flow(ns, "unix:" .. dir .. "/c2.sock", "unix:" .. dir .. "/p2.sock", "x//y", nil,
      ns .. "//x//y")
    assert.are.equal(ns .. "//x//y", full)
    assert.is_false(exists(dir .. "/c2.sock"))
    -- Linux abstract sockets (no file), named after this run's directory
    local tag = dir:match("([^/]+)$")
    c, p = flow(ns, "unix:@" .. tag .. "-c", "unix:@" .. tag .. "-p", "abstract")
    assert.are.equal("unix:@" .. tag .. "-c", c)
    assert.are.equal("unix:@" .. tag .. "-p", p)
    S.kill(nsproc, "TERM")
    S.wait(nsproc, 10)
  end)

  it("mixes IPv4, IPv6 and unix peers under one name server", function()
    local ns = nameserver("127.0.0.1:0")
    local six = has_ipv6() and "[::1]:0" or "127.0.0.1:0"
    flow(ns, "unix:" .. S.tmpdir() .. "/mix.sock", six, "mixed")
  end)

  it("replaces a stale socket file, refuses a live one and leaves other files alone", function()
    local dir = S.tmpdir()
    local path = dir .. "/s.sock"
    -- a process killed while listening leaves its file behind
    local dead = S.lua(([[
      local lecho = require "lecho"
      local ctx = lecho.context{ listen = "unix:%s", quiet = true }
      io.stdout:write("up\n") io.stdout:flush()
      ctx:run()
    ]]):format(path))
    assert.truthy(S.wait_file(dead.out, "up"))
    local ok, err = pcall(lecho.context, { listen = "unix:" .. path, quiet = true })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("cannot listen on unix:" .. path .. ": " .. path
      .. ": a live process listens there", 1, true), tostring(err))
    S.kill(dead, "KILL")
    S.wait(dead, 10)
    assert.is_true(exists(path), "the killed process's file is gone already")
    local ctx = lecho.context{ listen = "unix:" .. path, quiet = true }
    assert.are.equal("unix:" .. path, ctx.addr)
    ctx:close()
    assert.is_false(exists(path))
    S.write(path, "not a socket")
    ok, err = pcall(lecho.context, { listen = "unix:" .. path, quiet = true })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("exists and is not a socket (not removed)", 1, true), tostring(err))
    assert.are.equal("not a socket", S.read(path))
  end)

  it("advertises a reachable address when listening on a wildcard", function()
    local ns = nameserver("127.0.0.1:0", keyed_args())
    local c, p, _, seen = flow(ns, "0.0.0.0:0", "0.0.0.0:0", "wild", nil, nil, true)
    -- the route toward the name server at 127.0.0.1 starts at 127.0.0.1
    assert.truthy(c:match("^127%.0%.0%.1:%d+$"), c)
    assert.truthy(p:match("^127%.0%.0%.1:%d+$"), p)
    assert.is_true(has(seen, c), table.concat(seen, " "))
    -- an explicit address wins, with the bound port for port 0, and is
    -- what the producer dials
    c, _, _, seen = flow(ns, "0.0.0.0:0", "127.0.0.1:0", "wild2", "127.0.0.2:0", nil, true)
    assert.truthy(c:match("^127%.0%.0%.2:%d+$"), c)
    assert.is_true(has(seen, c), table.concat(seen, " "))
  end)

  it("lets the scripts listen on, advertise and join the new address forms", function()
    local function sh_out(cmd) return S.sh_out("timeout 20 " .. cmd .. " </dev/null") end
    local dir = S.tmpdir()
    local ns = nameserver("unix:" .. dir .. "/ns.sock")
    local out = sh_out(("%s %s/scripts/lecho-repl --nameserver %s --listen %s --no-history -e %s -e 'ls()'")
      :format(S.luajit, S.root, S.sh_quote(ns), S.sh_quote("unix:" .. dir .. "/r.sock"),
        S.sh_quote("send('a//b', 1)")))
    -- the channel's short name, though its full one is ns .. "//a//b"
    local function lit(x) return (x:gsub("%p", "%%%0")) end
    assert.truthy(out:find("\na//b +" .. lit("unix:" .. dir .. "/r.sock") .. " %(me%) +%- +" .. lit(ns)
      .. " %(ns%)\n"), out)
    assert.truthy(out:find("rc=0\n", 1, true), out)
    assert.is_false(exists(dir .. "/r.sock"))
    out = sh_out(("%s %s/scripts/lecho-repl --nameserver unix:rel"):format(S.luajit, S.root))
    assert.are.equal("lecho-repl: --nameserver needs HOST:PORT, [V6]:PORT or unix:/PATH (unix socket "
      .. "path must be absolute (unix:/path) or abstract (unix:@name)), not 'unix:rel'\nrc=2\n", out)
    local wild = nameserver("0.0.0.0:0", "--advertise 127.0.0.2:0 " .. keyed_args())
    assert.truthy(wild:match("^127%.0%.0%.2:%d+$"), wild)
    -- without a key, a wildcard is refused (protected mode)
    out = sh_out(("%s %s/scripts/lecho-nameserver --listen 0.0.0.0:0 --for 5"):format(S.luajit, S.root))
    assert.are.equal("lecho-nameserver: cannot listen on 0.0.0.0:0: refusing to listen on 0.0.0.0:0 without keys "
      .. "(protected mode): set key= and trust=, or listen on 127.0.0.1\nrc=1\n", out)
  end)

  it("says what is wrong with a bad address", function()
    local function bad(opts, msg)
      opts.quiet = true
      local ok, err = pcall(lecho.context, opts)
      assert.is_false(ok)
      assert.truthy(tostring(err):find(msg, 1, true), tostring(err))
    end
    bad({ listen = "1.2.3.4" }, "lecho: bad listen address '1.2.3.4': missing port (want host:port)")
    bad({ nameserver = "[::1]:0" }, "lecho: bad nameserver '[::1]:0': port 0 is only for listening")
    bad({ advertise = "x" }, "lecho: bad advertise address 'x': missing port (want host:port)")
    local key, trust = keyed("consumer")
    bad({ listen = "0.0.0.0:0", advertise = "0.0.0.0:0", key = key, trust = trust },
      "lecho: cannot listen on 0.0.0.0:0: advertise address '0.0.0.0:0': a wildcard cannot be reached")
    -- protected mode: loopback and unix only
    for _, a in ipairs{ "0.0.0.0:0", "[::]:0", "10.1.2.3:0" } do
      bad({ listen = a }, ("lecho: cannot listen on %s: refusing to listen on %s without keys (protected mode): "
        .. "set key= and trust=, or listen on 127.0.0.1"):format(a, a))
    end
    bad({ listen = "unix:rel.sock" },
      "unix socket path must be absolute (unix:/path) or abstract (unix:@name)")
    local ctx = lecho.context{ quiet = true }
    local ok, err = pcall(ctx.channel, ctx, "unix:/x/ozone")
    assert.is_false(ok)
    assert.truthy(tostring(err):find("a unix name server address ends with '//'", 1, true), tostring(err))
    ctx:close()
  end)
end)
