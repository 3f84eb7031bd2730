-- How a close ends (outside attack s8, atksig): the events a context
-- submitted to its own consumers are handled by close (D: they were freed
-- unseen, close true); a Ctrl-C during close's linger ends the linger, the
-- close is finished and says what it did not deliver (A: the close was left
-- half done, a second close waited for ever; H: the message said "within
-- the linger time of 10s" after 1 s); and a Ctrl-C during the close at a
-- script's end says what was not delivered and ends the process by the
-- signal (B: killed at once, nothing said).
local S = require "spec.support"
local clock = require("spec.support.proc").clock

-- D: local delivery is on a loop turn; a close before any turn delivers.
describe("close of a context with events for its own consumers", function()
  it("runs their handlers before it returns true", function()
    local lecho = require "lecho"
    local ctx = assert(lecho.context{ quiet = true })
    local got = {}
    assert(ctx:channel("own.a"):consumer(function(v) got[#got + 1] = v end))
    local p = assert(ctx:channel("own.a"):producer())
    for i = 1, 5 do assert(p:submit(i)) end
    local ok, err = ctx:close()
    assert.is_true(ok, tostring(err))
    assert.are.same({ 1, 2, 3, 4, 5 }, got)
  end)

  it("with linger 0 (no wait) says they were not handled", function()
    local lecho = require "lecho"
    local ctx = assert(lecho.context{ quiet = true })
    local got = 0
    assert(ctx:channel("own.b"):consumer(function() got = got + 1 end))
    local p = assert(ctx:channel("own.b"):producer())
    for i = 1, 5 do assert(p:submit(i)) end
    local ok, err, code = ctx:close{ linger = 0 }
    assert.is_nil(ok)
    assert.are.equal(0, got)
    assert.matches("^5 events %(%d+ bytes%) to this context's own consumers not handled within the linger time of 0s",
                   err)
    assert.are.equal("timeout", code)
  end)

  it("inside a handler says those queued behind it, which cannot run before it returns", function()
    local lecho = require "lecho"
    local ctx = assert(lecho.context{ quiet = true })
    local p = assert(ctx:channel("own.d"):producer())
    local got, res = 0, nil
    assert(ctx:channel("own.d"):consumer(function(v)
      got = got + 1
      if v == 1 then
        for i = 10, 12 do p:submit(i) end
        res = { ctx:close() }
      end
    end))
    assert(p:submit(1))
    for _ = 1, 20 do
      if ctx.closed then break end
      ctx:run_once(0.05)
    end
    assert.is_true(ctx.closed)
    assert.are.equal(1, got)
    assert.is_nil(res[1])
    assert.matches("^3 events %(%d+ bytes%) to this context's own consumers not handled %(queued behind the handler "
                   .. "that called close%)", res[2])
  end)

  it("from the C API (lecho_close) runs the C handlers too", function()
    local src = S.write(S.tmpname("own_close") .. ".c", [[
#include <stdio.h>
#include "lecho.h"
static int got;
static const char *h(const lecho_value *ev, const lecho_meta *m, void *ud) {
    (void)ev; (void)m; (void)ud; got++; return NULL;
}
int main(void) {
    const char *opts[] = { "quiet", "true", NULL };
    lecho_ctx *x;
    char err[256];
    if (lecho_open(opts, &x, err, sizeof err) != 0) { fprintf(stderr, "open: %s\n", err); return 2; }
    lecho_consumer *c;
    if (lecho_consumer_open(lecho_channel_get(x, "own.c"), h, NULL, &c) != 0) return 3;
    lecho_producer *p;
    if (lecho_producer_open(lecho_channel_get(x, "own.c"), NULL, &p) != 0) return 4;
    lecho_value *v = lecho_value_new(x);
    for (int i = 0; i < 5; i++) {
        lecho_set_number(v, "i", i);
        if (lecho_submit(p, v) != 0) return 5;
    }
    lecho_value_free(v);
    int rc = lecho_close_err(x, -1, err, sizeof err);
    printf("close %d got %d %s\n", rc, got, err);
    return 0;
}
]])
    local bin = S.capi_program(src)
    local ok, out = S.sh(bin)
    assert(ok, out)
    assert.matches("close 0 got 5", out)
  end)
end)

-- A producer with ~20 MB queued to a consumer it stopped (SIGSTOP): its
-- close lingers; MODE "close": ctx:close{ linger = 10 } under pcall, then
-- a second close; "end": the script ends without close (linger 10).
local LINGER = [[
local lecho = require "lecho"
local now = os.time   -- (ctx:now() once closed raises)
local ns, chan, cons, mode = arg[1], arg[2], arg[3], arg[4]
local ctx = assert(lecho.context{ nameserver = ns, linger = 10 })
local p = assert(ctx:channel(chan):producer())
assert(p:submit_sync(0))                 -- connected
os.execute("kill -STOP " .. cons)
local big = string.rep("x", 200000)
for i = 1, 100 do assert(p:submit({ i = i, b = big })) end
if mode == "end" then
  io.stderr:write("CLOSING\n")
  return
end
io.stderr:write("CLOSING\n")
local t0 = now()
local ok, e = pcall(ctx.close, ctx, { linger = 10 })
io.stderr:write(("first close: %s %s after %.1fs\n"):format(tostring(ok), tostring(e), now() - t0))
local ok2, err2 = ctx:close{ linger = 1 }
io.stderr:write(("second close: %s %s\n"):format(tostring(ok2), tostring(err2)))
io.stderr:write("END OF SCRIPT\n")
]]

describe("a Ctrl-C during close's linger", function()
  local ns
  setup(function() local _; _, ns = S.nameserver("--quiet") end)
  teardown(function() S.cleanup() end)

  local k = 0
  local function run(mode)
    k = k + 1
    local chan = "ci." .. mode .. k
    local cons = S.lua([[
local lecho = require "lecho"
local ctx = lecho.context{ nameserver = arg[1], quiet = true }
assert(ctx:channel(arg[2]):consumer(function() end))
print("ready") io.stdout:flush()
ctx:after(120, function() ctx:stop() end)
ctx:run()
]], ns, chan)
    assert(S.wait_file(cons.out, "ready", 20), S.errors(cons))
    local child = S.terminal_lua(LINGER, ns, chan, tostring(cons.pid), mode)
    assert(S.wait_file(child.err, "CLOSING", 30), S.errors(child))
    S.sleep(1)
    local done, rc = S.ctrl_c_wait(child, { "INT" }, 15)
    S.kill(cons, "CONT")
    S.kill(cons, "TERM")
    return child, done, rc
  end

  it("ends the linger, finishes the close, and a second close returns its result", function()
    local child, done, rc = run("close")
    local err = S.errors(child)
    assert.is_true(done, "the program did not end (a second close hung): " .. err)
    assert.are.equal(0, rc, err)
    assert.matches("first close: false [^\n]*interrupted! after %d", err)
    local secs = tonumber(err:match("first close: false [^\n]*interrupted! after ([%d.]+)s"))
    assert.is_true(secs < 9, "the close ran its linger out: " .. err)
    -- said, with the time it had, and returned by the second close
    assert.matches("close: %d+ events %(%d+ bytes%) not delivered when a signal interrupted the close after "
                   .. "[%d.]+s of its linger time of 10s", err)
    assert.matches("second close: nil %d+ events %(%d+ bytes%) not delivered when a signal interrupted", err)
    assert.matches("END OF SCRIPT", err, 1, true)
    assert.not_matches("freed without close", err)
  end)

  it("at the script's end stops the handlers of events another context sent, and says so", function()
    -- (outside attack s8 F3: one read of 30 events ran all their handlers
    -- of 0.2 s before the close saw the signal, 8.4 s after it)
    local child = S.terminal_lua([[
local lecho = require "lecho"
local A = lecho.context{ nameserver = arg[1], quiet = true }
local B = lecho.context{ nameserver = arg[1], quiet = true }
local got = 0
assert(A:channel("ci.many"):consumer(function()
  got = got + 1
  if got == 2 then io.stderr:write("CLOSING\n") end
  local e = os.clock() + 0.2 while os.clock() < e do end
end))
local p = assert(B:channel("ci.many"):producer())
for _ = 1, 30 do A:run_once(0.01); B:run_once(0.01) end
for i = 1, 40 do p:submit({ n = i }) end
]], ns)
    assert(S.wait_file(child.err, "CLOSING", 30), S.errors(child))
    S.sleep(0.3)
    local t0 = clock()
    local done, rc = S.ctrl_c_wait(child, { "INT" }, 20)
    local took = clock() - t0
    local err = S.errors(child)
    assert.is_true(done, err)
    assert.are.equal(130, rc, err)
    assert.is_true(took < 4, ("ended %.1fs after the Ctrl-C: %s"):format(took, err))
    assert.matches("close: %d+ events received not handled: the program was interrupted", err)
  end)

  it("at the script's end says what was not delivered and ends by the signal", function()
    local child, done, rc = run("end")
    local err = S.errors(child)
    assert.is_true(done, err)
    assert.are.equal(130, rc, err)
    assert.matches("close: %d+ events %(%d+ bytes%) not delivered when a signal interrupted the close after "
                   .. "[%d.]+s of its linger time of 10s %(at the program's end: ctx:close%(%) was not called%)", err)
  end)
end)

-- The handlers of events for the context's own consumers that close runs
-- are bounded by its linger and end at a signal (outside attack s8, F4, F3,
-- F2: a loop turn ran all 30 queued handlers of 0.2 s, 9.8 s for a linger
-- of 2, close true; a Ctrl-C waited for all of them at the script's end,
-- and in ctx:close() the other 26 were dropped with no word, a second close
-- true).
describe("close's own-consumer handlers", function()
  it("start no more once the linger has passed; the rest are reported", function()
    local lecho = require "lecho"
    local ctx = assert(lecho.context{ quiet = true })
    local got = 0
    assert(ctx:channel("own.slow"):consumer(function() got = got + 1; S.sleep(0.15) end))
    local p = assert(ctx:channel("own.slow"):producer())
    for i = 1, 20 do assert(p:submit(i)) end
    local t0 = clock()
    local ok, err, code = ctx:close{ linger = 0.5 }
    local took = clock() - t0
    assert.is_nil(ok, "all 20 handled in " .. took .. "s")
    assert.is_true(took < 1.6, took)
    assert.is_true(got < 20, got)
    assert.matches("^" .. (20 - got) .. " events %(%d+ bytes%) to this context's own consumers not handled "
                   .. "within the linger time of 0.5s", err)
    assert.are.equal("timeout", code)
    -- a second close: the same result
    local ok2, err2, code2 = ctx:close()
    assert.is_nil(ok2)
    assert.are.equal(err, err2)
    assert.are.equal("timeout", code2)
  end)

  it("called again from one of those handlers, returns at once and the close goes on", function()
    -- (outside attack s8 F5: the inner close waited for the outer, which
    -- waited for the handler: it never returned)
    local lecho = require "lecho"
    local ctx = assert(lecho.context{ quiet = true })
    local got, inner = 0, nil
    assert(ctx:channel("own.inner"):consumer(function()
      got = got + 1
      if got == 2 then inner = { ctx:close() } end
    end))
    local p = assert(ctx:channel("own.inner"):producer())
    for i = 1, 5 do assert(p:submit(i)) end
    local ok, err = ctx:close{ linger = 1 }
    assert.is_true(ok, tostring(err))
    assert.are.equal(5, got)
    assert.is_table(inner, "the inner close did not return")
    assert.is_nil(inner[1])
    assert.matches("in a handler that the close of this context runs", inner[2], 1, true)
    assert.are.equal("busy", inner[3])
  end)

  local OWN = [[
local lecho = require "lecho"
local ctx = assert(lecho.context{ quiet = true })
local got = 0
assert(ctx:channel("own.int"):consumer(function()
  got = got + 1
  if got == 2 then io.stderr:write("CLOSING\n") end
  local e = os.clock() + 0.2 while os.clock() < e do end
end))
local p = assert(ctx:channel("own.int"):producer())
for i = 1, 60 do assert(p:submit(i)) end
if arg[1] == "end" then return end
local ok, e = pcall(ctx.close, ctx, { linger = 30 })
io.stderr:write(("first close: %s %s handled %d\n"):format(tostring(ok), tostring(e), got))
local ok2, err2, code2 = ctx:close()
io.stderr:write(("second close: %s %s %s\n"):format(tostring(ok2), tostring(err2), tostring(code2)))
]]

  -- OWN run in a terminal (mode: "close" or "end"), a Ctrl-C half a second
  -- into its close: ended within 4 s of it with exit code rc; its stderr.
  local function ctrl_c_in_close(mode, rc)
    local child = S.terminal_lua(OWN, mode)
    assert(S.wait_file(child.err, "CLOSING", 30), S.errors(child))
    S.sleep(0.5)
    local t0 = clock()
    local done, code = S.ctrl_c_wait(child, { "INT" }, 20)
    local took = clock() - t0
    local err = S.errors(child)
    assert.is_true(done, err)
    assert.are.equal(rc, code, err)
    assert.is_true(took < 4, ("ended %.1fs after the Ctrl-C: %s"):format(took, err))
    return err
  end

  it("end at a Ctrl-C in ctx:close(): said with the time, even with quiet, and the second close returns it", function()
    local err = ctrl_c_in_close("close", 0)
    assert.matches("first close: false interrupted! handled %d", err)
    local said = "close: %d+ events %(%d+ bytes%) to this context's own consumers not handled when a signal "
      .. "interrupted the close after [%d.]+s of its linger time of 30s"
    assert.matches(said, err)
    assert.matches("second close: nil %d+ events %(%d+ bytes%) to this context's own consumers not handled when a "
                   .. "signal interrupted [^\n]* timeout", err)
  end)

  it("end at a Ctrl-C in the close at the script's end, which says it was interrupted", function()
    local err = ctrl_c_in_close("end", 130)
    assert.matches("close: %d+ events %(%d+ bytes%) to this context's own consumers not handled when a signal "
                   .. "interrupted the close after [%d.]+s of its linger time of 2s %(at the program's end", err)
  end)
end)
