-- lecho.check: the first thing `require "lecho"` runs.  lecho needs LuaJIT
-- 2.1 (the FFI, the bit library and LuaJIT's C API, which lecho.core links
-- against); under another Lua it would fail later and obscurely ("undefined
-- symbol: luaopen_bit").  This says so at once, in words.
--
-- It reads only the globals `jit` and `_VERSION`, so that a spec can run it
-- in an environment that fakes them (spec/rockspec_spec.lua).

local found = type(jit) == "table" and tostring(jit.version) or tostring(_VERSION)
if not found:match("^LuaJIT 2%.1") then
  error(("lecho needs LuaJIT 2.1 (found %s)"):format(found), 0)
end
return true
