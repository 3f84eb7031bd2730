-- The commands people run (scripts/, examples/atmosphere/) from a checkout
-- with no LUA_PATH/LUA_CPATH set and from another working directory: each
-- finds the tree it is in from its own file (arg[0]).
local S = require "spec.support"

-- A shell command run from / with the module paths of the test run unset.
local function bare(cmd)
  return ("cd / && exec env -u LUA_PATH -u LUA_CPATH -u LECHO_ROOT %s"):format(cmd)
end

local sh_out = S.sh_out

describe("scripts and examples run from a checkout with no module paths set", function()
  after_each(function() S.cleanup() end)

  it("the name server, a manager and the REPL", function()
    local pf = S.tmpname("ns")
    local ns = S.spawn(bare(("%s %s/scripts/lecho-nameserver --listen 127.0.0.1:0 --port-file %s --for 30 --settle 0 --quiet")
      :format(S.luajit, S.root, pf)))
    local addr = S.wait_file(pf, "%d+:%d+", 20)
    assert(addr, "the name server did not start: " .. S.errors(ns))
    addr = addr:match("[^\n]+")
    local mpf = S.tmpname("mgr")
    local mgr = S.spawn(bare(("%s %s/scripts/lecho-manager --nameserver %s --port-file %s --for 30 --quiet")
      :format(S.luajit, S.root, addr, mpf)))
    assert(S.wait_file(mpf, "%d+:%d+", 20), "the manager did not start: " .. S.errors(mgr))
    local out = sh_out(bare(("%s %s/scripts/lecho-repl --nameserver %s --no-history -e 'print(6 * 7)' </dev/null")
      :format(S.luajit, S.root, addr)))
    assert.are.equal("42\nrc=0\n", out)
    -- Started through its #! line too.
    out = sh_out(bare(("%s/scripts/lecho-repl --nameserver %s --no-history -e 'print(type(ctx))' </dev/null")
      :format(S.root, addr)))
    assert.are.equal("table\nrc=0\n", out)
  end)

  it("the name server and the REPL installed by make install, with plain require", function()
    local tree = S.tmpname("tree")
    local log = S.tmpname("install-log")
    local ok = os.execute(("make -s -C %s install INST_LIBDIR=%s/lib INST_LUADIR=%s/share INST_BINDIR=%s/bin >%s 2>&1")
      :format(S.sh_quote(S.root), tree, tree, tree, log))
    assert(ok == 0 or ok == true, "make install failed: " .. tostring(S.read(log)))
    local env = ("cd / && exec env -u LECHO_ROOT LUA_PATH='%s/share/?.lua;%s/share/?/init.lua;;' LUA_CPATH='%s/lib/?.so;;' ")
      :format(tree, tree, tree)
    local pf = S.tmpname("ns")
    local ns = S.spawn(env .. ("%s/bin/lecho-nameserver --listen 127.0.0.1:0 --port-file %s --for 30 --settle 0 --quiet")
      :format(tree, pf))
    local addr = S.wait_file(pf, "%d+:%d+", 20)
    assert(addr, "the installed name server did not start: " .. S.errors(ns))
    local out = sh_out(env .. ("%s/bin/lecho-repl --nameserver %s --no-history -e %s </dev/null")
      :format(tree, addr:match("[^\n]+"), S.sh_quote("print(package.searchpath('lecho.repl', package.path))")))
    assert.are.equal(tree .. "/share/lecho/repl/init.lua\nrc=0\n", out)
  end)

  it("the scripts installed under a PREFIX off the default paths, with no module paths set", function()
    local tree = S.tmpname("prefix")
    local log = S.tmpname("install-log")
    local ok = os.execute(("make -s -C %s install PREFIX=%s >%s 2>&1"):format(S.sh_quote(S.root), tree, log))
    assert(ok == 0 or ok == true, "make install failed: " .. tostring(S.read(log)))
    local pf = S.tmpname("ns")
    local ns = S.spawn(bare(("%s/bin/lecho-nameserver --listen 127.0.0.1:0 --port-file %s --for 30 --settle 0 --quiet")
      :format(tree, pf)))
    local addr = S.wait_file(pf, "%d+:%d+", 20)
    assert(addr, "the installed name server did not start: " .. S.errors(ns))
    local out = sh_out(bare(("%s/bin/lecho-repl --nameserver %s --no-history -e %s </dev/null")
      :format(tree, addr:match("[^\n]+"), S.sh_quote("print(package.searchpath('lecho.repl', package.path))"))))
    assert.are.equal(tree .. "/share/lua/5.1/lecho/repl/init.lua\nrc=0\n", out)
    -- the lecho tool beside them (doc/operations.md), reading that name server
    out = sh_out(bare(("%s/bin/lecho ls --json --nameserver %s"):format(tree, addr:match("[^\n]+"))))
    assert.are.equal("rc=0\n", out)
    -- Moved elsewhere after installing: PREFIX/share/lua/5.1 next to its bin/.
    local moved = S.tmpname("moved")
    assert(os.execute(("mv %s %s"):format(tree, moved)) ~= false)
    out = sh_out(bare(("%s/bin/lecho-repl --help"):format(moved)))
    assert.matches("^usage: lecho%-repl", out)
    assert.matches("rc=0\n$", out)
  end)

  it("lecho.pc names the install's prefix when, as under LuaRocks, PREFIX is not given", function()
    local tree = S.tmpname("rockdir")
    local log = S.tmpname("install-log")
    local ok = os.execute(("make -s -C %s install-capi INST_LIBDIR=%s/lib INST_LUADIR=%s/lua "
      .. "INST_INCDIR=%s/include INST_CLIBDIR=%s/clib >%s 2>&1"):format(S.sh_quote(S.root), tree, tree, tree, tree, log))
    assert(ok == 0 or ok == true, "make install-capi failed: " .. tostring(S.read(log)))
    local pc = assert(S.read(tree .. "/clib/pkgconfig/lecho.pc"))
    assert.matches("^prefix=" .. tree:gsub("%p", "%%%0") .. "\n", pc)
  end)

  it("liblecho installed by LuaRocks looks where the rock's Lua files end up, not at the staging dir", function()
    local tree = S.tmpname("rocktree")
    local rock = tree .. "/lib/luarocks/rocks-5.1/lecho/scm-1"
    local log = S.tmpname("install-log")
    local ok = os.execute(("make -s -C %s install-capi INST_LIBDIR=%s/lib INST_LUADIR=%s/lua "
      .. "INST_INCDIR=%s/include INST_CLIBDIR=%s/clib >%s 2>&1"):format(S.sh_quote(S.root), rock, rock, rock, rock, log))
    assert(ok == 0 or ok == true, "make install-capi failed: " .. tostring(S.read(log)))
    local so = assert(S.read(rock .. "/clib/liblecho.so.0"))
    assert.truthy(so:find(tree .. "/share/lua/5.1\0", 1, true))
    assert.truthy(so:find(tree .. "/lib/lua/5.1\0", 1, true))
    assert.falsy(so:find(rock .. "/lua", 1, true))
  end)

  it("a checkout script reached through a symlink", function()
    local dir = S.tmpname("links")
    assert(os.execute("mkdir -p " .. dir) ~= false)
    assert(os.execute(("ln -s %s/scripts/lecho-repl %s/lecho-repl"):format(S.sh_quote(S.root), dir)) ~= false)
    assert(os.execute(("ln -s %s/lecho-repl %s/repl2"):format(dir, dir)) ~= false)
    local pf = S.tmpname("ns")
    local ns = S.spawn(bare(("%s/scripts/lecho-nameserver --listen 127.0.0.1:0 --port-file %s --for 30 --settle 0 --quiet")
      :format(S.root, pf)))
    local addr = S.wait_file(pf, "%d+:%d+", 20)
    assert(addr, "the name server did not start: " .. S.errors(ns))
    local out = sh_out(bare(("%s/repl2 --nameserver %s --no-history -e 'print(6 * 7)' </dev/null")
      :format(dir, addr:match("[^\n]+"))))
    assert.are.equal("42\nrc=0\n", out)
  end)

  it("the benchmark's worker", function()
    local out = sh_out(bare(("%s %s/bench/worker.lua --help"):format(S.luajit, S.root)))
    assert.matches("^usage: luajit bench/worker%.lua", out)
    assert.matches("\nrc=0\n$", out)
    -- and lecho is found: a bad option is told, not a missing module
    out = sh_out(bare(("%s %s/bench/worker.lua 'not json'"):format(S.luajit, S.root)))
    assert.matches("^bench/worker%.lua: the options must be one JSON object", out)
    assert.matches("\nrc=2\n$", out)
  end)

  it("the atmosphere simulation", function()
    local out = sh_out(bare(("%s %s/examples/atmosphere/simulation.lua --steps 3 --rate 50 --grid 1x4x8 --quiet")
      :format(S.luajit, S.root)))
    assert.matches("^nameserver 127%.0%.0%.1:%d+\nrc=0\n$", out)
  end)
end)

describe("lecho-nameserver, lecho-manager and the other commands", function()
  after_each(function() S.cleanup() end)

  local function script(name, args)
    return sh_out(("%s %s/scripts/%s %s"):format(S.luajit, S.root, name, args))
  end

  it("reject bad numbers with one clear message", function()
    assert.are.equal("lecho-nameserver: --for needs a number of seconds > 0, not 'abc'\nrc=2\n",
      script("lecho-nameserver", "--listen 127.0.0.1:0 --for abc"))
    assert.are.equal("lecho-nameserver: --for needs a number of seconds > 0, not '0'\nrc=2\n",
      script("lecho-nameserver", "--listen 127.0.0.1:0 --for 0"))
    assert.are.equal("lecho-nameserver: --settle needs a number of seconds >= 0, not '-1'\nrc=2\n",
      script("lecho-nameserver", "--settle=-1"))
    assert.are.equal("lecho-manager: --for needs a number of seconds > 0, not '1x'\nrc=2\n",
      script("lecho-manager", "--nameserver 127.0.0.1:1 --for 1x"))
    assert.matches("^lecho%-manager: %-%-nameserver ADDRESS is required\nusage: lecho%-manager",
      script("lecho-manager", "--for 1"))
    assert.matches("^lecho%-nameserver: unknown option '%-%-fro'\nusage:", script("lecho-nameserver", "--fro 1"))
    assert.matches("^lecho%-nameserver: %-%-listen needs a value\n", script("lecho-nameserver", "--listen"))
  end)

  it("print nothing with --quiet, where they listen without it", function()
    local pf = S.tmpname("ns")
    local ns = S.spawn(("%s %s/scripts/lecho-nameserver --listen 127.0.0.1:0 --port-file %s --for 1 --settle 0 --quiet")
      :format(S.luajit, S.root, pf))
    assert.is_true(S.wait(ns, 20))
    assert.are.equal(0, ns.rc)
    local addr = S.read(pf):match("[^\n]+")
    assert.are.equal("", S.errors(ns) .. S.output(ns))
    local out = script("lecho-nameserver", "--listen 127.0.0.1:0 --for 0.5 --settle 0")
    -- the library's log line (lecho.log), then the script's own message
    local TS = "%d%d%d%d%-%d%d%-%d%dT%d%d:%d%d:%d%d%.%d%d%dZ"
    assert.matches("^" .. TS .. " info lecho%[127%.0%.0%.1:%d+%] context: protected mode: no key configured; listening on loopback only, "
      .. "every local process is trusted\nlecho%-nameserver: listening on 127%.0%.0%.1:%d+\nrc=0\n$", out)
    -- A manager with --quiet and without.
    local ns2
    ns2, addr = S.nameserver("--quiet")
    assert.are.equal("rc=0\n", script("lecho-manager", ("--nameserver %s --for 0.5 --quiet"):format(addr)))
    assert.matches("^" .. TS .. " info lecho%[127%.0%.0%.1:%d+%] context: protected mode: no key configured; listening on loopback only, "
      .. "every local process is trusted\nlecho%-manager: 127%.0%.0%.1:%d+ managing channels for "
      .. addr:gsub("%p", "%%%0") .. "\nrc=0\n$",
      script("lecho-manager", ("--nameserver %s --for 0.5"):format(addr)))
    S.kill(ns2)
  end)

  it("say what failed with one prefix", function()
    local _, addr = S.nameserver("--quiet")
    assert.are.equal(("lecho-nameserver: cannot listen on %s: bind: Address already in use\nrc=1\n"):format(addr),
      script("lecho-nameserver", "--quiet --listen " .. addr))
    -- a malformed address is a usage error, told by the option reader
    local out = script("lecho-nameserver", "--quiet --listen nonsense")
    assert.are.equal("lecho-nameserver: --listen needs HOST:PORT, [V6]:PORT or unix:/PATH "
      .. "(missing port (want host:port)), not 'nonsense'\nrc=2\n", out)
    assert.not_matches("lecho: ", out)
    out = sh_out(("%s %s/examples/atmosphere/simulation.lua --nameserver nonsense --steps 1")
      :format(S.luajit, S.root))
    assert.matches("^simulation: [^\n]*'nonsense'[^\n]*\nrc=1\n$", out)
    assert.not_matches("lecho: ", out)
    out = sh_out(("%s %s/scripts/lecho-repl --nameserver %s --no-history </dev/null")
      :format(S.luajit, S.root, "127.0.0.1:1"))
    assert.matches("^lecho%-repl: cannot reach the name server 127%.0%.0%.1:1: [^\n]*\nrc=1\n$", out)
    assert.not_matches("lecho: ", out)
    -- a bad $LECHO_NAMESERVER is named as such, not as --nameserver
    out = sh_out(("LECHO_NAMESERVER=bogus %s %s/scripts/lecho-repl --no-history </dev/null")
      :format(S.luajit, S.root))
    assert.matches("^lecho%-repl: bad %$LECHO_NAMESERVER 'bogus': [^\n]*\nrc=2\n$", out)
    -- the simulation's model says what is wrong with a grid, not where
    out = sh_out(("%s %s/examples/atmosphere/simulation.lua --grid 1000x1000x1000 --steps 1")
      :format(S.luajit, S.root))
    assert.are.equal("simulation: bad grid dimensions 1000x1000x1000: want 1..3 levels, "
      .. ">= 2 latitudes and longitudes\nrc=2\n", out)
  end)
end)
