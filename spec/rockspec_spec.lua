-- Covers doc/api.md's luarocks command (spec/doc_blocks_spec.lua does not run it).
-- `luarocks make rockspec/lecho-scm-1.rockspec` installs a tree from which
-- `require "lecho"` and the name server script work, with nothing from the
-- source tree on the paths; the rock builds its own core.so with the flags
-- it is given; lecho says at require time that it needs LuaJIT.
local S = require "spec.support"

-- -frecord-gcc-switches leaves a .GCC.command.line section in the rock's
-- core.so: the proof that it was built for the rock, not copied from the
-- tree's lua/lecho/core.so (built by `make` without it).
-- -fno-omit-frame-pointer: under make asan (libasan preloaded, this core
-- not instrumented) LeakSanitizer's stacks of its allocations go past the
-- first frame, so that lsan.supp's entries match them (without it, the
-- codec's message box of the two `lecho bench` processes, which end by
-- os.exit, was reported with lei_msg_new alone: make asan on 874af8a).
local ROCK_CFLAGS = "-O2 -g -frecord-gcc-switches -fno-omit-frame-pointer"
local RECORD = ".GCC.command.line"

describe("the rockspec", function()
  local tree, tree_so, tree_so_before

  setup(function()
    tree = S.tmpname("tree")
    tree_so = S.root .. "/lua/lecho/core.so"
    tree_so_before = S.read(tree_so)
    local cmd = ("cd %s && luarocks --lua-version=5.1 make --deps-mode=none --tree %s rockspec/lecho-scm-1.rockspec "
      .. "LUA_INCDIR=/usr/include/luajit-2.1 CFLAGS=%s >%s/luarocks.log 2>&1")
      :format(S.sh_quote(S.root), S.sh_quote(tree), S.sh_quote(ROCK_CFLAGS), S.tmpdir())
    local ok = os.execute(cmd)
    assert(ok == 0 or ok == true, "luarocks make failed: " .. (S.read(S.tmpdir() .. "/luarocks.log") or ""))
  end)

  teardown(function() S.cleanup() end)

  -- Paths of the installed tree only.
  local function env()
    return ("env -u LECHO_ROOT LUA_PATH='%s/share/lua/5.1/?.lua;%s/share/lua/5.1/?/init.lua' "
      .. "LUA_CPATH='%s/lib/lua/5.1/?.so;/usr/lib/x86_64-linux-gnu/lua/5.1/?.so'")
      :format(tree, tree, tree)
  end

  it("installs the module, the core and the scripts", function()
    for _, f in ipairs{ "/share/lua/5.1/lecho/init.lua", "/share/lua/5.1/lecho/ns/registry.lua",
                        "/share/lua/5.1/lecho/check.lua",
                        "/lib/lua/5.1/lecho/core.so", "/bin/lecho-nameserver", "/bin/lecho-manager",
                        "/bin/lecho-keygen", "/share/lua/5.1/lecho/keys.lua" } do
      assert.truthy(S.read(tree .. f), f .. " missing")
    end
  end)

  it("installs the C API (lecho.h, liblecho, lecho.pc) where a C user looks: the tree's include/ and lib/", function()
    for _, f in ipairs{ "/include/lecho.h", "/lib/liblecho.so.0", "/lib/pkgconfig/lecho.pc" } do
      assert.truthy(S.read(tree .. f), tree .. f .. " missing")
    end
    local ok, out = S.sh(("PKG_CONFIG_PATH=%s/lib/pkgconfig pkg-config --cflags lecho"):format(tree))
    assert.is_true(ok, out)
    assert.are.equal("-I" .. tree .. "/include", (out:gsub("%s+$", "")))
  end)

  it("builds its own core with the flags it is given, leaving the tree's core.so alone", function()
    assert.truthy(tree_so_before, "the tree's core.so is built first (make)")
    local rock_so = assert(S.read(tree .. "/lib/lua/5.1/lecho/core.so"))
    assert.truthy(rock_so:find(RECORD, 1, true), "the rock's core.so was not built with " .. ROCK_CFLAGS)
    assert.falsy(tree_so_before:find(RECORD, 1, true))
    assert.are.equal(tree_so_before, S.read(tree_so))
  end)

  it("declares LuaJIT 2.1 as a dependency", function()
    local rs = {}
    setfenv(assert(loadfile(S.root .. "/rockspec/lecho-scm-1.rockspec")), rs)()
    local deps = table.concat(rs.dependencies, ",")
    assert.truthy(deps:match("luajit >= 2%.1"), deps)
  end)

  it("serves require 'lecho' and a name server from the installed tree", function()
    local help = io.popen(tree .. "/bin/lecho-nameserver --help")
    local text = help:read("*a")
    help:close()
    assert.truthy(text:match("usage: lecho%-nameserver"))
    local pf = S.tmpname("addr")
    S.spawn(("%s/bin/lecho-nameserver --listen 127.0.0.1:0 --port-file %s --for 20 --quiet"):format(tree, pf))
    local addr = assert(S.wait_file(pf, "%d+:%d+", 20)):match("[^\n]+")
    local script = S.write(S.tmpname("client") .. ".lua", [[
      local lecho = require "lecho"
      assert(package.searchpath("lecho", package.path):find(arg[2], 1, true), "not the installed lecho")
      local ctx = lecho.context{ nameserver = arg[1], quiet = true }
      local ch = ctx:channel("installed")
      local got
      ch:consumer(function(ev) got = ev end)
      assert(ch:producer():submit_sync({ hello = "tree" }))
      io.write(got.hello, "\n")
      ctx:close()
    ]])
    local child = S.spawn(("%s luajit %s %s %s"):format(env(), script, addr, tree))
    assert.is_true(S.wait(child, 20))
    assert.are.equal(0, child.rc, S.errors(child))
    assert.are.equal("tree\n", S.output(child))
  end)

  -- Issue 25: LuaRocks' wrapper runs `luajit -e 'LOADER' .../bin/lecho`;
  -- the bench's child process is started with that same command line.
  it("serves `lecho bench` from the installed tree (its consumer child started through the wrapper)", function()
    local wrapper = assert(S.read(tree .. "/bin/lecho"), "no bin/lecho")
    local _, ns = S.nameserver("--quiet")
    local ok, out = S.sh(("cd %s && %s %s/bin/lecho bench --count 200 --rtt 10 --for 20 --json --nameserver %s")
      :format(S.sh_quote(S.tmpdir()), env(), tree, ns))
    assert.is_true(ok, out .. "\n(bin/lecho: " .. wrapper .. ")")
    assert.matches('"events":200', out)
  end)

  it("serves lecho-keygen from the installed tree (its core signs the certificate)", function()
    local dir = S.tmpname("keys")
    os.execute("mkdir -p " .. S.sh_quote(dir))
    local kg = ("%s %s/bin/lecho-keygen --dir %s "):format(env(), tree, dir)
    assert(S.sh(kg .. "--authority ca"))
    local ok, out = S.sh(kg .. ("--sign-with %s/ca.key sim"):format(dir))
    assert.is_true(ok, out)
    assert.are.equal(("lecho-keygen: wrote %s/sim.key (secret, 0600) and %s/sim.pub, certified by ca\n")
                     :format(dir, dir), out)
  end)
end)

-- Issue 25: a versioned rockspec that `luarocks pack` makes a source rock
-- of, which installs with no network and --deps-mode=none where the Debian
-- packages are.  The rockspec's repository (its git URL, a placeholder) is
-- this checkout, cloned and tagged v0.1.0, through git's url.<base>.insteadOf:
-- no network (`make rock-pack` for the release, by hand here for scm).
describe("the versioned rockspec", function()
  local ROCKSPEC = "rockspec/lecho-0.1.0-1.rockspec"
  local rs

  setup(function()
    rs = {}
    setfenv(assert(loadfile(S.root .. "/" .. ROCKSPEC)), rs)()
  end)
  teardown(function() S.cleanup() end)

  it("says what a registry shows: version, homepage, licence (with its LICENSE file), dependencies", function()
    assert.are.equal("0.1.0-1", rs.version)
    assert.matches("^https://", rs.description.homepage)
    assert.are.equal("MIT", rs.description.license)
    local license = assert(S.read(S.root .. "/LICENSE"), "no LICENSE file")
    assert.matches("^MIT License\n\nCopyright %(c%) 2026 the lecho authors\n", license)
    local deps = table.concat(rs.dependencies, ",")
    assert.matches("lua%-cjson", deps)
    assert.matches("luajit >= 2%.1", deps)
    assert.are.equal("sodium.h", rs.external_dependencies.LIBSODIUM.header)
    assert.are.equal("ev.h", rs.external_dependencies.LIBEV.header)
    -- the scm rockspec says the same
    local scm = {}
    setfenv(assert(loadfile(S.root .. "/rockspec/lecho-scm-1.rockspec")), scm)()
    assert.are.same(rs.dependencies, scm.dependencies)
    assert.are.same(rs.external_dependencies, scm.external_dependencies)
    assert.are.equal(rs.description.homepage, scm.description.homepage)
  end)

  it("packs into a source rock that installs offline, C API included", function()
    local dir = S.tmpdir() .. "/pack"
    local repo = dir .. "/repo"
    assert(S.sh(("mkdir -p %s && git clone -q %s %s && git -C %s tag v0.1.0")
      :format(S.sh_quote(dir), S.sh_quote(S.root), S.sh_quote(repo), S.sh_quote(repo))))
    local git_env = ("GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=%s GIT_CONFIG_VALUE_0=%s")
      :format(S.sh_quote("url.file://" .. repo .. ".insteadOf"), S.sh_quote(rs.source.url:gsub("^git%+", "")))
    -- doc/api.md's `make rock-pack` (from any directory; the rock where ROCK_OUT says)
    local ok, out = S.sh(("cd %s && make -s --no-print-directory -C %s rock-pack ROCK_OUT=%s")
      :format(S.sh_quote(S.tmpdir()), S.sh_quote(S.root), S.sh_quote(dir)))
    assert.is_true(ok, out)
    local rock = dir .. "/lecho-0.1.0-1.src.rock"
    assert.truthy(S.read(rock), out)
    assert.matches("make rock%-pack: " .. rock:gsub("%p", "%%%0") .. " %(HEAD %x+%)\n$", out)
    -- the scm rockspec packs too (its branch main: this checkout's HEAD)
    -- (update-ref: `branch -f` refuses when the clone has main checked out,
    -- as a clone of a checkout on main has)
    assert(S.sh(("git -C %s update-ref refs/heads/main HEAD"):format(S.sh_quote(repo))))
    ok, out = S.sh(("cd %s && %s luarocks --lua-version=5.1 pack %s/rockspec/lecho-scm-1.rockspec")
      :format(S.sh_quote(dir), git_env, S.sh_quote(S.root)))
    assert.is_true(ok, out)
    assert.truthy(S.read(dir .. "/lecho-scm-1.src.rock"), out)
    -- installed from the rock alone: no git, no rockspec of the checkout
    local tree = dir .. "/tree"
    ok, out = S.sh(("cd %s && luarocks --lua-version=5.1 install --deps-mode=none --tree %s %s "
      .. "LUA_INCDIR=/usr/include/luajit-2.1"):format(S.sh_quote(S.tmpdir()), S.sh_quote(tree), S.sh_quote(rock)))
    assert.is_true(ok, out)
    for _, f in ipairs{ "/include/lecho.h", "/lib/liblecho.so.0", "/lib/pkgconfig/lecho.pc",
                        "/lib/lua/5.1/lecho/core.so", "/share/lua/5.1/lecho/init.lua", "/bin/lecho-nameserver" } do
      assert.truthy(S.read(tree .. f), f .. " missing")
    end
    -- a C program built with pkg-config from the tree runs against it
    local src = S.write(dir .. "/prog.c", [[
#include <lecho.h>
#include <stdio.h>
int main(void) {
    const char *opts[] = { "quiet", "true", NULL };
    char err[256];
    lecho_ctx *ctx;
    if (lecho_open(opts, &ctx, err, sizeof err) != 0) { printf("open: %s\n", err); return 1; }
    printf("opened\n");
    return lecho_close(ctx, 0);
}
]])
    ok, out = S.sh(("cc -o %s/prog %s $(PKG_CONFIG_PATH=%s/lib/pkgconfig pkg-config --cflags --libs lecho) "
      .. "-Wl,-rpath,%s/lib && env -u LUA_PATH -u LUA_CPATH -u LECHO_ROOT %s/prog")
      :format(dir, src, tree, tree, dir))
    assert.is_true(ok, out)
    assert.are.equal("opened\n", out)
  end)
end)

describe("require 'lecho' under another Lua", function()
  -- lua/lecho/check.lua run with the globals it reads faked.
  local function check(env)
    local chunk = assert(loadfile(S.root .. "/lua/lecho/check.lua"))
    env.type, env.tostring, env.error = type, tostring, error
    return pcall(setfenv(chunk, env))
  end

  it("says that lecho needs LuaJIT 2.1 and what it found", function()
    assert.are.same({ false, "lecho needs LuaJIT 2.1 (found Lua 5.2)" }, { check{ _VERSION = "Lua 5.2" } })
    assert.are.same({ false, "lecho needs LuaJIT 2.1 (found Lua 5.3)" }, { check{ _VERSION = "Lua 5.3" } })
    assert.are.same({ false, "lecho needs LuaJIT 2.1 (found LuaJIT 2.0.5)" },
                    { check{ _VERSION = "Lua 5.1", jit = { version = "LuaJIT 2.0.5" } } })
    assert.are.same({ true, true }, { check{ _VERSION = "Lua 5.1", jit = { version = jit.version } } })
  end)

  it("fails at require with that message under a real Lua 5.2", function()
    if os.execute("command -v lua5.2 >/dev/null 2>&1") ~= 0 then
      pending("lua5.2 is not installed; the faked check above covers the logic")
      return
    end
    local p = io.popen(("env -u LUA_PATH_5_2 -u LUA_CPATH_5_2 LUA_PATH='%s/lua/?.lua;%s/lua/?/init.lua' "
      .. "LUA_CPATH='%s/lua/?.so' lua5.2 -e 'require \"lecho\"' 2>&1"):format(S.root, S.root, S.root))
    local out = p:read("*a")
    p:close()
    assert.truthy(out:find("lecho needs LuaJIT 2.1 (found Lua 5.2)", 1, true), out)
  end)
end)
