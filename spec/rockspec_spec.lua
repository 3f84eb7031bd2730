-- `luarocks make rockspec/lecho-scm-1.rockspec` installs a tree from which
-- `require "lecho"` and the name server script work, with nothing from the
-- source tree on the paths.
local S = require "spec.support"

describe("the rockspec", function()
  local tree

  setup(function()
    tree = S.tmpname("tree")
    local cmd = ("cd %s && luarocks --lua-version=5.1 make --tree %s rockspec/lecho-scm-1.rockspec "
      .. "LUA_INCDIR=/usr/include/luajit-2.1 >%s/luarocks.log 2>&1")
      :format(S.sh_quote(S.root), S.sh_quote(tree), S.tmpdir())
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
    for _, f in ipairs{ "/share/lua/5.1/lecho/init.lua", "/share/lua/5.1/lecho/registry.lua",
                        "/lib/lua/5.1/lecho/core.so", "/bin/lecho-nameserver", "/bin/lecho-manager" } do
      assert.truthy(S.read(tree .. f), f .. " missing")
    end
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
end)
