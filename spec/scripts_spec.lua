-- The commands people run (scripts/, examples/atmosphere/) from a checkout
-- with no LUA_PATH/LUA_CPATH set and from another working directory: each
-- finds the tree it is in from its own file (arg[0]).
local S = require "spec.support"

-- A shell command run from / with the module paths of the test run unset.
local function bare(cmd)
  return ("cd / && env -u LUA_PATH -u LUA_CPATH -u LECHO_ROOT %s"):format(cmd)
end

local function sh_out(cmd)
  local p = io.popen(cmd .. " 2>&1; echo rc=$?")
  local s = p:read("*a")
  p:close()
  return s
end

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

  it("the atmosphere simulation", function()
    local out = sh_out(bare(("%s %s/examples/atmosphere/simulation.lua --steps 3 --rate 50 --grid 1x4x8 --quiet")
      :format(S.luajit, S.root)))
    assert.matches("^nameserver 127%.0%.0%.1:%d+\nrc=0\n$", out)
  end)
end)
