-- README's first example (the first ```lua block of "A first program"), run as
-- written against a standalone name server (issue 25, item 5):
--   * against a name server that never ran on its address before it runs
--     without the ~3 s stall of a restart's recovery window (`settle`);
--     a restarted one (killed: its clients may hold channels) still
--     settles, one that ended with no client does not;
--   * it logs nothing but the protected-mode line (no "ignoring a members
--     message ... none yet" from the leave racing the last member list);
--   * with the name server down it stops with the reason, not with
--     "attempt to index local 'p' (a nil value)".
local S = require "spec.support"
local P = require "spec.support.proc"

local function example(ns)
  local readme = S.read(S.root .. "/README.md")
  local using = readme:match("\n## A first program\n(.*)")
  local src = assert(using and using:match("```lua[^\n]*\n(.-)\n```"), "README.md: no example under A first program")
  assert(src:find('nameserver = "127.0.0.1:7700"', 1, true), "the example's name server is not 127.0.0.1:7700")
  return (src:gsub("127%.0%.0%.1:7700", ns))
end

describe("README's first example", function()
  local rundir, port_file, ns_child

  setup(function()
    rundir = S.tmpdir() .. "/run"
    port_file = S.tmpname("ns-port")
  end)
  teardown(function() S.cleanup() end)

  local function start_ns(listen, settle)
    os.remove(port_file)
    ns_child = S.spawn(("LECHO_RUN_DIR=%s %s %s/scripts/lecho-nameserver --listen %s --port-file %s --settle %g")
      :format(S.sh_quote(rundir), S.luajit, S.root, listen, S.sh_quote(port_file), settle))
    local addr = S.wait_file(port_file, "\n", 20)
    assert(addr, "the name server did not start: " .. S.errors(ns_child))
    return (addr:gsub("%s+$", ""))
  end

  -- Runs the example: its exit code, output, log, how long it took, and
  -- how long from its first line to its first print (the first event: a
  -- settling name server holds the joins before it for its window), timed
  -- inside the example's process, so without what the process costs to
  -- start and to end (make asan at load 11: 5.2 s in all for the 3 s
  -- example, LeakSanitizer's check and its symbolizer at exit among it).
  local FIRST = "do local now = require('socket').gettime; local t0, print0 = now(), print; "
    .. "print = function(...) if t0 then io.stderr:write(('first event after %.2f s\\n'):format(now() - t0)) "
    .. "t0 = nil end return print0(...) end end "
  local function run(ns)
    local t0 = P.clock()
    local child = S.lua(FIRST .. example(ns))
    local done, rc = S.wait(child, 30)
    assert.is_true(done, "the example did not end: " .. S.errors(child))
    local err = S.errors(child)
    return rc, S.output(child), err, P.clock() - t0, tonumber(err:match("first event after ([%d.]+) s"))
  end

  it("runs at once against a fresh name server, and says nothing odd", function()
    local ns = start_ns("127.0.0.1:0", 3)
    local rc, out, err, took, first = run(ns)
    assert.are.equal(0, rc, out .. err)
    assert.matches("^1\t1\n2\t2\n", out)
    assert.not_matches("ignoring", err)
    assert.not_matches("error", err)
    -- 3 s of ctx:every; a settling name server adds its 3 s before the
    -- first event
    assert.is_true(first < 2.5, ("the first event came %s s after the start"):format(tostring(first)))
    assert.is_true(took < 3 + 2 * S.SLOW, ("the example took %.1f s (3 s expected)"):format(took))
  end)

  it("settles after a name server was killed, not after one that ended without clients", function()
    local ns = start_ns("127.0.0.1:0", 3)
    S.kill(ns_child, "KILL")
    S.wait(ns_child, 10)
    -- restarted on its address: its clients may be back, it waits for them
    start_ns(ns, 4)
    local rc, out, err, took, first = run(ns)
    assert.are.equal(0, rc, out .. err)
    assert.is_true(took > 6, ("the example took %.1f s: the restarted name server did not settle"):format(took))
    assert.is_true(first > 3, ("the first event came %.2f s after the start: no settling"):format(first))
    -- ended cleanly with no client: the next one has nothing to recover
    S.kill(ns_child, "TERM")
    assert.truthy(S.wait(ns_child, 10))
    start_ns(ns, 3)
    rc, out, err, took, first = run(ns)
    assert.are.equal(0, rc, out .. err)
    assert.is_true(first < 2.5, ("the first event came %s s after the start, after a clean stop"):format(tostring(first)))
    assert.is_true(took < 3 + 2 * S.SLOW, ("the example took %.1f s after a clean stop"):format(took))
    S.kill(ns_child, "TERM")
    S.wait(ns_child, 10)
  end)

  it("stops with the reason when the name server is down", function()
    local rc, out, err = run(S.refusing_addr())
    assert.are_not.equal(0, rc)
    assert.not_matches("attempt to index", err)
    assert.matches("name server 127%.0%.0%.1:%d+: [^\n]*refused", err, nil, out)
  end)
end)
