rockspec_format = "3.0"
package = "lecho"
version = "scm-1"
source = { url = "git+file:///dev/null" }
description = {
  summary = "Event channels between processes: a C core on libev, LuaJIT on top",
  detailed = [[
lecho carries Lua values over named event channels between processes:
producers submit events asynchronously (batched) or synchronously (returning
once every consumer ran its handler); a name server and channel managers keep
membership; one TCP connection per pair of processes carries every channel.
Consumers can ship Lua modulators (filters, down-samplers, differencers) that
run sandboxed in the producing processes; lecho-repl steers a running system.]],
  license = "MIT",
}
-- LuaJIT 2.1 (LuaRocks provides "luajit" when its Lua is LuaJIT); lecho.check
-- says so at require time too.
dependencies = { "lua ~> 5.1", "luajit >= 2.1.0-beta3" }
external_dependencies = { LIBEV = { header = "ev.h" } }
build = {
  type = "make",
  makefile = "Makefile",
  -- "rock": the rock's own core.so (build/rock/), built afresh with the flags
  -- LuaRocks gives, never the tree's lua/lecho/core.so of an earlier `make`.
  build_target = "rock",
  build_variables = { CFLAGS = "$(CFLAGS)", LIBFLAG = "$(LIBFLAG)" },
  install_target = "install",
  install_variables = {
    INST_LIBDIR = "$(LIBDIR)",
    INST_LUADIR = "$(LUADIR)",
    INST_BINDIR = "$(BINDIR)",
    SO = "build/rock/core.so",
    -- the C API (lecho.h, liblecho, lecho.pc); clib, since LuaRocks takes a
    -- rock's lib/ for Lua modules.  A rock-installed liblecho finds the Lua
    -- files in the tree's share/lua/5.1 and lib/lua/5.1 (LECHO_LUA_DIR,
    -- LECHO_LUA_CDIR point it elsewhere).
    INST_INCDIR = "$(PREFIX)/include",
    INST_CLIBDIR = "$(PREFIX)/clib",
  },
}
