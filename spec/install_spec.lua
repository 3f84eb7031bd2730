-- `make install PREFIX=... [DESTDIR=...]` installs the C API (lecho.h,
-- liblecho, lecho.pc) beside the Lua tree and the scripts; a C program
-- compiled with `pkg-config lecho` from there runs with nothing of the
-- source tree on its paths; LuaRocks' install (INST_* on the command line)
-- installs no C API unless told where.
local S = require "spec.support"

local sh = S.sh

-- Nothing of the checkout: no LUA_PATH, LUA_CPATH or LECHO_ROOT.
local CLEAN = "env -u LUA_PATH -u LUA_CPATH -u LECHO_ROOT -u LECHO_LUA_DIR -u LECHO_LUA_CDIR"

local PROGRAM = [[
#include <lecho.h>
#include <stdio.h>
#include <string.h>
static const char *h(const lecho_value *ev, const lecho_meta *m, void *ud) {
    (void)m;
    size_t len;
    const char *s = lecho_get_string(ev, "hello", &len);
    if (s) snprintf(ud, 64, "%.*s", (int)len, s);
    return NULL;
}
int main(void) {
    const char *opts[] = { "quiet", "true", NULL };
    char err[256], got[64] = "";
    lecho_ctx *ctx;
    if (lecho_open(opts, &ctx, err, sizeof err) != 0) { printf("open: %s\n", err); return 1; }
    lecho_channel *ch = lecho_channel_get(ctx, "installed");
    lecho_consumer *c;
    lecho_producer *p;
    if (lecho_consumer_open(ch, h, got, &c) || lecho_producer_open(ch, NULL, &p)) return 2;
    lecho_value *ev = lecho_value_new(ctx);
    lecho_set_string(ev, "hello", "tree", 4);
    int rc = lecho_submit_sync(p, ev, 5, NULL);
    printf("%s %s\n", lecho_strerror(rc), got);
    lecho_value_free(ev);
    return lecho_close(ctx, 0);
}
]]

describe("make install", function()
  local prefix, bin

  setup(function()
    prefix = S.tmpname("prefix")
    local ok, log = sh(("make -s -C %s install PREFIX=%s"):format(S.sh_quote(S.root), prefix))
    assert(ok, "make install failed: " .. log)
    local src = S.write(S.tmpname("prog") .. ".c", PROGRAM)
    bin = S.tmpname("prog")
    ok, log = sh(("cc -Wall -Werror -o %s %s $(PKG_CONFIG_PATH=%s/lib/pkgconfig pkg-config --cflags --libs lecho) "
      .. "-Wl,-rpath,%s/lib"):format(bin, src, prefix, prefix))
    assert(ok, "compiling against the installed lecho failed: " .. log)
  end)

  teardown(function() S.cleanup() end)

  it("installs the header, the library, lecho.pc, the Lua tree and the scripts", function()
    for _, f in ipairs{ "/include/lecho.h", "/lib/liblecho.so", "/lib/liblecho.so.0",
                        "/lib/pkgconfig/lecho.pc", "/share/lua/5.1/lecho/init.lua",
                        "/share/lua/5.1/lecho/capi.lua", "/lib/lua/5.1/lecho/core.so",
                        "/bin/lecho-nameserver", "/bin/lecho-keygen", "/share/lua/5.1/lecho/keys.lua" } do
      assert.truthy(S.read(prefix .. f), f .. " missing")
    end
    local pc = S.read(prefix .. "/lib/pkgconfig/lecho.pc")
    assert.truthy(pc:find("prefix=" .. prefix, 1, true))
    assert.truthy(pc:find("Libs: -L${libdir} -llecho", 1, true))
  end)

  it("gives a C program built with pkg-config a working lecho from the installed tree", function()
    local ok, out = sh(("%s %s"):format(CLEAN, bin))
    assert.is_true(ok, out)
    assert.are.equal("success tree\n", out)
  end)

  it("lets LECHO_LUA_DIR point the library at another Lua tree", function()
    local empty = S.tmpname("empty")
    os.execute("mkdir -p " .. empty)
    local ok, out = sh(("%s LECHO_LUA_DIR=%s %s"):format(CLEAN, empty, bin))
    assert.is_false(ok)
    assert.truthy(out:find("module 'lecho.capi' not found", 1, true), out)
    ok, out = sh(("%s LECHO_LUA_DIR=%s/lua %s"):format(CLEAN, S.sh_quote(S.root), bin))
    assert.is_true(ok, out)
    assert.are.equal("success tree\n", out)
  end)

  it("puts everything under DESTDIR, with paths of PREFIX inside", function()
    local dest = S.tmpname("dest")
    local ok, log = sh(("make -s -C %s install DESTDIR=%s PREFIX=/opt/lecho-test"):format(S.sh_quote(S.root), dest))
    assert(ok, log)
    assert.truthy(S.read(dest .. "/opt/lecho-test/include/lecho.h"))
    assert.truthy(S.read(dest .. "/opt/lecho-test/share/lua/5.1/lecho/init.lua"))
    local pc = S.read(dest .. "/opt/lecho-test/lib/pkgconfig/lecho.pc")
    assert.truthy(pc and pc:find("prefix=/opt/lecho-test\n", 1, true))
    local strings = io.popen("strings " .. dest .. "/opt/lecho-test/lib/liblecho.so.0"):read("*a")
    assert.truthy(strings:find("/opt/lecho-test/share/lua/5.1", 1, true))
  end)

  it("installs no C API when LuaRocks passes only the Lua directories", function()
    local tree = S.tmpname("rock")
    local prefix2 = S.tmpname("noprefix")
    local ok, log = sh(("make -s -C %s install PREFIX=%s INST_LIBDIR=%s/lib INST_LUADIR=%s/lua INST_BINDIR=%s/bin")
      :format(S.sh_quote(S.root), prefix2, tree, tree, tree))
    assert(ok, log)
    assert.truthy(S.read(tree .. "/lua/lecho/init.lua"))
    assert.truthy(S.read(tree .. "/lib/lecho/core.so"))
    assert.is_nil(S.read(prefix2 .. "/include/lecho.h"))
    ok, log = sh(("make -s -C %s install INST_LIBDIR=%s/lib INST_LUADIR=%s/lua INST_BINDIR=%s/bin "
      .. "INST_INCDIR=%s/include INST_CLIBDIR=%s/clib"):format(S.sh_quote(S.root), tree, tree, tree, tree, tree))
    assert(ok, log)
    assert.truthy(S.read(tree .. "/include/lecho.h"))
    assert.truthy(S.read(tree .. "/clib/pkgconfig/lecho.pc"))
  end)

  it("over an earlier install, leaves no file that shadows a module moved since (lecho.gateway)", function()
    -- lecho.gateway was lecho/gateway.lua, is lecho/gateway/init.lua: an
    -- old file left in place is found first by require
    local tree = S.tmpname("over")
    os.execute(("mkdir -p %s/lua/lecho"):format(tree))
    S.write(tree .. "/lua/lecho/gateway.lua", 'error("the gateway of an earlier install")\n')
    S.write(tree .. "/lua/lecho/gateway_page.lua", 'return "old page"\n')
    local ok, log = sh(("make -s -C %s install INST_LIBDIR=%s/lib INST_LUADIR=%s/lua INST_BINDIR=%s/bin")
      :format(S.sh_quote(S.root), tree, tree, tree))
    assert(ok, log)
    assert.is_nil(S.read(tree .. "/lua/lecho/gateway.lua"))
    assert.is_nil(S.read(tree .. "/lua/lecho/gateway_page.lua"))
    local out
    ok, out = sh(("%s LUA_PATH='%s/lua/?.lua;%s/lua/?/init.lua;;' LUA_CPATH='%s/lib/?.so;;' %s -e %s")
      :format(CLEAN, tree, tree, tree, S.luajit,
              S.sh_quote('io.write(type(require("lecho.gateway").new), " ", #require("lecho.gateway.page") > 1000 and "page" or "?")')))
    assert.is_true(ok, out)
    assert.are.equal("function page", out)
  end)

  it("puts the C API in the LuaRocks tree with CAPI_IN_TREE (the rockspecs), refuses it elsewhere", function()
    local tree = S.tmpname("lrtree")
    local rock = tree .. "/lib/luarocks/rocks-5.1/lecho/0.1.0-1"
    local ok, log = sh(("make -s -C %s install INST_LIBDIR=%s/lib INST_LUADIR=%s/lua INST_BINDIR=%s/bin CAPI_IN_TREE=yes")
      :format(S.sh_quote(S.root), rock, rock, rock))
    assert(ok, log)
    assert.truthy(S.read(tree .. "/include/lecho.h"))
    assert.truthy(S.read(tree .. "/lib/liblecho.so.0"))
    local pc = S.read(tree .. "/lib/pkgconfig/lecho.pc")
    assert.truthy(pc and pc:find("includedir=" .. tree .. "/include\n", 1, true), pc)
    assert.is_nil(S.read(rock .. "/include/lecho.h"))
    local other = S.tmpname("notatree")
    ok, log = sh(("make -s -C %s install INST_LIBDIR=%s/lib INST_LUADIR=%s/lua INST_BINDIR=%s/bin CAPI_IN_TREE=yes")
      :format(S.sh_quote(S.root), other, other, other))
    assert.is_false(ok)
    assert.truthy(log:find("is not inside a LuaRocks tree", 1, true), log)
  end)
end)
