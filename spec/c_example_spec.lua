-- Covers doc/c-api.md's install, cc and make examples-c commands (spec/doc_blocks_spec.lua does not run them).
-- examples/c: the C heat simulation, compiled against an installed lecho
-- (make install into a temporary PREFIX, then pkg-config from there), is a
-- peer of a Lua viewer: the viewer gets every step in order, its steering
-- changes the simulation's parameter from the next step on, and a steering
-- event with a bad key (misspelled, or not a string) comes back to the
-- viewer as the simulation's error, and changes nothing.
local S = require "spec.support"

local sh = S.sh

describe("the C example", function()
  local prefix, heat, env

  setup(function()
    prefix = S.tmpname("prefix")
    local ok, log = sh(("make -s -C %s install PREFIX=%s"):format(S.sh_quote(S.root), prefix))
    assert(ok, "make install failed: " .. log)
    heat = S.tmpname("heat")
    ok, log = sh(("cc -O2 -Wall -Wextra -Werror -o %s %s/examples/c/heat.c "
      .. "$(PKG_CONFIG_PATH=%s/lib/pkgconfig pkg-config --cflags --libs lecho) -Wl,-rpath,%s/lib -lm")
      :format(heat, S.sh_quote(S.root), prefix, prefix))
    assert(ok, "compiling examples/c/heat.c failed: " .. log)
    -- The viewer runs from the installed Lua tree.
    env = ("env -u LECHO_ROOT -u LUA_CPATH LUA_PATH='%s/share/lua/5.1/?.lua;%s/share/lua/5.1/?/init.lua;;' "
      .. "LUA_CPATH='%s/lib/lua/5.1/?.so;;'"):format(prefix, prefix, prefix)
  end)

  teardown(function() S.cleanup() end)

  it("doc/c-api.md's C snippet compiles warning-free (-Wall -Wextra -Werror)", function()
    local readme = assert(S.read(S.root .. "/doc/c-api.md"))
    local snip = assert(readme:match("## From C.-```c[^\n]*\n(.-)```"), "no C snippet under From C")
    -- The snippet is the part of a program: its functions, then main's body.
    local i = assert(snip:find("lecho_ctx *ctx;", 1, true), snip)
    local src = "#include <stdio.h>\n#include <stdlib.h>\n" .. snip:sub(1, i - 1)
      .. "static void compute(double *u, double a) { (void)u; (void)a; }\n"
      .. "int main(void) {\n  double alpha = 0.1, u[4] = { 0 };\n  int n = 2, step;\n  size_t cells = 4;\n"
      .. snip:sub(i) .. "  return 0;\n}\n"
    local c = S.tmpname("snip") .. ".c"
    local f = assert(io.open(c, "w"))
    f:write(src)
    f:close()
    local ok, log = sh(("cc -Wall -Wextra -Werror -c -o %s.o %s $(PKG_CONFIG_PATH=%s/lib/pkgconfig pkg-config --cflags lecho)")
      :format(c, c, prefix))
    assert(ok, "doc/c-api.md's C snippet: " .. log .. "\n" .. src)
  end)

  it("publishes every step to a Lua viewer and takes its steering", function()
    local sim = S.spawn(("env -u LUA_PATH -u LUA_CPATH %s --wait --steps 80 --interval 0.01"):format(heat))
    local first = S.wait_file(sim.out, "nameserver %d+%.%d+%.%d+%.%d+:%d+\n", 20)
    assert(first, "the simulation did not start: " .. S.errors(sim))
    local ns = first:match("nameserver (%S+)")
    local viewer = S.spawn(("%s %s %s/examples/c/viewer.lua --nameserver %s --steps 80 --steer-at 20 "
      .. "--alpha 0.4 --every 10 --bad --seconds 30"):format(env, S.luajit, S.sh_quote(S.root), ns))
    assert.is_true(S.wait(viewer, 40), "viewer still running")
    assert.is_true(S.wait(sim, 20), "simulation still running")
    local vout, sout = S.output(viewer), S.output(sim)
    assert.are.equal(0, viewer.rc, vout .. S.errors(viewer))
    assert.are.equal(0, sim.rc, sout .. S.errors(sim))
    -- The bad key is the simulation's error, forwarded to the steerer.
    assert.truthy(vout:find("steering { alpah = 1 } refused: 127.0.0.1:%d+/c%d+: "
      .. "unknown key 'alpah' %(known: alpha, source, run%)"), vout)
    -- Keys that are not strings are refused too (lecho_pairs sees them),
    -- and the event is refused whole: alpha stays 0.1 (checked below).
    assert.truthy(vout:find("steering { 0.4 } refused: 127.0.0.1:%d+/c%d+: "
      .. "a steering key must be a string, not a number"), vout)
    assert.truthy(vout:find("steering { alpha = 0.3, %[true%] = 1 } refused: 127.0.0.1:%d+/c%d+: "
      .. "a steering key must be a string, not a boolean"), vout)
    -- Every step, in order; alpha changed right after the step it was sent at.
    local at = tonumber(sout:match("steered at step (%d+): alpha 0.1 %-> 0.4\n"))
    assert(at and at >= 20, sout)
    assert.truthy(vout:find(("viewer: 80 steps in order, alpha 0.1 until step %d, 0.4 from step %d\n")
      :format(at, at + 1), 1, true), vout)
    assert.truthy(sout:find("done 80 steps, alpha 0.4, source 100", 1, true), sout)
    -- the field travels as a typed array (lecho_set_array), 64 doubles
    assert.truthy(vout:find("u <f8 [64]\n", 1, true), vout)
    -- The field shows it: the mean temperature rises faster after steering
    -- (diffusion slows down as the rod warms, unless alpha grows).
    local function mean(step)
      return tonumber(vout:match(("step %4d  alpha [%%d.]+  mean +([%%d.]+)"):format(step)))
    end
    local m10, m20, m40, m60 = mean(10), mean(20), mean(40), mean(60)
    assert(m10 and m20 and m40 and m60, vout)
    assert.is_true((m60 - m40) / 20 > 1.3 * (m20 - m10) / 10, vout)
  end)
end)
