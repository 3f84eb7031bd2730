-- The C data plane's edges (issue 27 item 1), through core/lecho.h only
-- (spec/support/capi_sink.c):
--  - a C consumer's sink is pinned by a count while the core calls it
--    (core/binding/lua_sink.c), no longer through the Lua registry per
--    event: a handler that closes its own consumer and lets the Lua state
--    collect still returns into a whole sink (without the pin this run
--    segfaults: checked by disabling it);
--  - a value built in C is checked against the context's limits from the
--    bounds it has by construction (lb_bounds, lecho_value.c), the bytes
--    read only when a bound is past a limit: every limit still refuses
--    what it refused (LECHO_ELIMIT) and lets through what it let through.
local S = require "spec.support"

describe("the C data plane", function()
  local bin

  setup(function()
    local root = S.sh_quote(S.root)
    local ok, log = S.sh(("make -s -C %s build/liblecho.so lua/lecho/core.so"):format(root))
    assert(ok, "building liblecho failed: " .. log)
    bin = S.tmpname("capi_sink")
    ok, log = S.sh(("cc -O2 -Wall -Wextra -Werror -I%s/core -o %s %s/spec/support/capi_sink.c "
      .. "-L%s/build -llecho -Wl,-rpath,%s/build"):format(root, bin, root, root, root))
    assert(ok, "compiling spec/support/capi_sink.c failed: " .. log)
  end)

  teardown(function() S.cleanup() end)

  it("keeps a sink whose handler closed its consumer, through collections, till the call returns", function()
    local ok, out, code = S.sh(bin .. " selfclose 30")
    assert(ok, ("capi_sink selfclose exited %s: %s"):format(tostring(code), out))
    -- one event per consumer; the one sent after each close reached nobody
    assert.are.equal("handled 30\n", out)
  end)

  it("checks a C-built value against the limits from its bounds, refusing what is past them", function()
    local ok, out = S.sh(bin .. " limits")
    assert(ok, "capi_sink limits failed: " .. out)
    local want = {
      -- max_string 64, max_depth 1, max_value_bytes 4096: every bound of
      -- these is past a limit (a 64-byte string takes 66 bytes; a table is
      -- bounded at two deep), so each is read and judged exactly
      "small string64 ok", "small string65 limit", "small key65 limit", "small flat ok",
      "small nested limit", "small fields50 ok", "small fields100 limit",
      -- the default limits: decided from the bounds alone
      "default string64 ok", "default string65 ok", "default key65 ok", "default flat ok",
      "default nested ok", "default fields50 ok", "default fields100 ok",
    }
    assert.are.equal(table.concat(want, "\n") .. "\n", out)
  end)
end)
