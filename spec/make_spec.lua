-- The Makefile explains itself: `make help` names every target it declares
-- phony and every variable people may set (`?=`), and `make deps` says what
-- it checks, what is missing and what it installs, or that all is present.
local S = require "spec.support"

local function make(args)
  local _, out, code = S.sh(("cd %s && env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -s --no-print-directory %s")
    :format(S.sh_quote(S.root), args))
  return code, out
end

describe("make help", function()
  teardown(function() S.cleanup() end)

  it("lists every phony target and every variable the Makefile lets people set", function()
    local rc, help = make("help")
    assert.are.equal(0, rc, help)
    local mk = assert(S.read(S.root .. "/Makefile"))
    local targets, vars = 0, 0
    for line in mk:gmatch("[^\n]+") do
      local phony = line:match("^%.PHONY:(.*)")
      for t in (phony or ""):gmatch("%S+") do
        targets = targets + 1
        assert.truthy(help:find("make " .. t .. " ", 1, true) or (t == "all" and help:find("make  ", 1, true)),
                      "make help omits target " .. t)
      end
      local var = line:match("^([%u_]+)%s*%?=")
      if var then
        vars = vars + 1
        assert.truthy(help:find(var, 1, true), "make help omits variable " .. var)
      end
    end
    assert.is_true(targets >= 10 and vars >= 5)
    for _, v in ipairs{ "QUICK", "SEED", "BUSTED_ARGS", "STRESS_SECONDS" } do
      assert.truthy(help:find(v, 1, true), "make help omits variable " .. v)
    end
  end)
end)

describe("make deps", function()
  teardown(function() S.cleanup() end)

  it("says what it checks and that all is present", function()
    local rc, out = make("deps")
    assert.are.equal(0, rc, out)
    assert.truthy(out:match("^make deps: checking %d+ Debian packages: luajit libluajit%-5%.1%-dev "), out)
    assert.truthy(out:match("\nmake deps: all present\n$"), out)
  end)

  it("says which package is missing and what it installs (APT=true installs nothing)", function()
    local rc, out = make("deps DEPS='/nonexistent/lecho-spec:lecho-spec-pkg /bin/sh:dash' APT=true")
    assert.truthy(out:match("^make deps: checking 2 Debian packages: lecho%-spec%-pkg dash\n"), out)
    assert.truthy(out:find("make deps: lecho-spec-pkg missing (no /nonexistent/lecho-spec)\n", 1, true), out)
    assert.falsy(out:find("dash missing", 1, true), out)
    if S.read("/proc/self/status"):match("\nUid:%s+0%s") then
      assert.are.equal(0, rc, out)
      assert.truthy(out:find("make deps: installing lecho-spec-pkg (true update, true install)\n", 1, true), out)
      assert.truthy(out:find("make deps: installed lecho-spec-pkg\n", 1, true), out)
    else
      assert.are.equal(1, rc, out)
      assert.truthy(out:find("make deps: need root to apt-get install lecho-spec-pkg", 1, true), out)
    end
  end)
end)

describe("make, the README's first build step", function()
  -- issue 28, third review: `make` alone did not build liblecho, which the
  -- Python package loads (doc/python.md said `make liblecho`)
  it("builds liblecho (the C API the Python package loads) beside the core", function()
    local rc, dry = make("-n -B")
    assert.are.equal(0, rc, dry)
    assert.truthy(dry:find("-o lua/lecho/core.so", 1, true), dry)
    assert.truthy(dry:find("-o build/liblecho.so", 1, true), dry)
    -- (make rock builds only the rock's own modules)
    local _, rock = make("-n -B all SO=build/rock/core.so WS_SO=build/rock/ws.so OBJ_DIR=build/rock/obj LIBLECHO_ALL=")
    assert.falsy(rock:find("build/liblecho.so", 1, true), rock)
  end)
end)

describe("make env and make run-deps (issue 25)", function()
  teardown(function() S.cleanup() end)

  it("prints the exports that run one's own script from a checkout, from any directory", function()
    local rc, env = make("env")
    assert.are.equal(0, rc, env)
    assert.matches("^export LUA_PATH=\"[^\n]*\"\nexport LUA_CPATH=\"[^\n]*\"\n$", env)
    local dir = S.tmpdir() .. "/mine"
    os.execute("mkdir -p " .. S.sh_quote(dir))
    S.write(dir .. "/my_program.lua", [[
local lecho = require "lecho"
local ctx = assert(lecho.context{ quiet = true })
local got
assert(ctx:channel("mine"):consumer(function(ev) got = ev ctx:stop() end))
assert(assert(ctx:channel("mine"):producer()):submit("hello"))
ctx:run()
print("got " .. got)
ctx:close()
]])
    -- (a shell without the specs' paths, as a user's)
    local _, out, code = S.sh(("cd %s && env -u LUA_PATH -u LUA_CPATH sh -c %s"):format(S.sh_quote(dir),
      S.sh_quote(("eval \"$(make -s --no-print-directory -C %s env)\" && %s my_program.lua")
        :format(S.sh_quote(S.root), S.luajit))))
    assert.are.equal(0, code, out)
    assert.matches("got hello\n", out)
  end)

  it("checks for make demo only the packages that build and run lecho", function()
    local rc, out = make("run-deps APT=true")
    assert.are.equal(0, rc, out)
    local list = out:match("^make run%-deps: checking %d+ Debian packages: ([^\n]*)")
    assert.truthy(list, out)
    -- every line names the target the user ran (make demo runs make run-deps)
    assert.falsy(out:find("make deps:", 1, true), out)
    assert.truthy(out:find("\nmake run-deps: all present\n", 1, true) or out:find("make run-deps: install", 1, true), out)
    for _, pkg in ipairs{ "luajit", "libev-dev", "libsodium-dev", "lua-cjson", "gcc" } do
      assert.truthy((" " .. list .. " "):find(" " .. pkg .. " ", 1, true), pkg .. " not checked: " .. list)
    end
    for _, pkg in ipairs{ "lua-busted", "tmux", "libzmq3-dev", "gnuplot-nox", "iproute2", "lua-socket" } do
      assert.falsy((" " .. list .. " "):find(" " .. pkg .. " ", 1, true), pkg .. " checked for make demo: " .. list)
    end
    local _, dry = make("-n demo")
    assert.truthy(dry:find("run-deps", 1, true) or dry:find("DEPS=", 1, true), dry)
  end)
end)
