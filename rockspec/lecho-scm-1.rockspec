rockspec_format = "3.0"
package = "lecho"
version = "scm-1"
-- The repository's head (`luarocks make` from a checkout needs no source).
-- The source URL is a placeholder until the project is published (it has
-- no public address yet): from a checkout, `make rock-pack` packs this
-- rockspec offline (doc/api.md "Install").
source = { url = "git+https://github.com/lecho/lecho.git", branch = "main" }
description = {
  summary = "Event channels between processes: a C core on libev, LuaJIT on top",
  detailed = [[
lecho carries Lua values over named event channels between processes:
producers submit events asynchronously (batched) or synchronously (returning
once every consumer ran its handler); a name server and channel managers keep
membership; one TCP connection per pair of processes carries every channel.
Consumers can ship Lua modulators (filters, down-samplers, differencers) that
run sandboxed in the producing processes; lecho-repl steers a running system.]],
  homepage = "https://github.com/lecho/lecho",
  license = "MIT",   -- LICENSE
}
-- LuaJIT 2.1 (LuaRocks provides "luajit" when its Lua is LuaJIT); lecho.check
-- says so at require time too.  lua-cjson: keyed mode's files, policies in
-- JSON, lecho-repl --json (Debian: lua-cjson; `--deps-mode=none` when it is
-- there).  The C libraries: Debian's libev-dev, libsodium-dev, libzstd-dev and libzfp-dev.
dependencies = { "lua ~> 5.1", "luajit >= 2.1.0-beta3", "lua-cjson >= 2.1" }
external_dependencies = {
  LIBEV = { header = "ev.h", library = "ev" },
  LIBSODIUM = { header = "sodium.h", library = "sodium" },
  -- the MOE's compression operators (core/base/array_zip.c)
  LIBZSTD = { header = "zstd.h", library = "zstd" },
  LIBZFP = { header = "zfp.h", library = "zfp" },
}
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
    WS_SO = "build/rock/ws.so",   -- lecho.ws, the gateway's WebSocket module
    -- the C API where a C user looks: the tree's include/lecho.h,
    -- lib/liblecho.so and lib/pkgconfig/lecho.pc (doc/c-api.md; outside
    -- the rock's own directory, so `luarocks remove` leaves them).  A
    -- rock-installed liblecho finds the Lua files in the tree's share/lua/5.1
    -- and lib/lua/5.1 (LECHO_LUA_DIR, LECHO_LUA_CDIR point it elsewhere).
    CAPI_IN_TREE = "yes",
  },
}
