-- A busy host (issue 8): the observations about modulators under load as specs.
--
--   obs. 4  every core saturated: a filter's consumer loses nothing, submit_sync
--           says which modulators failed and returns only once the filter's
--           consumer handled the event
--   obs. 5  the modulator budget is CPU time: a starved producer does not stop
--           a modest modulator, and still stops one that loops for ever
--
-- Real processes on 127.0.0.1 with ports chosen by the OS (children in
-- spec/children.lua); the busy loops are children too, killed in after_each
-- by S.cleanup() whatever happened.
--
-- Run: make && LUA_PATH="$PWD/lua/?.lua;$PWD/lua/?/init.lua;;" \
--   LUA_CPATH="$PWD/lua/?.so;;" LECHO_ROOT=$PWD luajit /usr/bin/busted spec/busy_host_spec.lua

local cjson = require "cjson"
local socket = require "socket"
local S = require "spec.support"
local kids = require "spec.children"

-- The last JSON line a child printed.
local function result(child)
  local line
  for l in S.output(child):gmatch("[^\n]+") do
    if l:sub(1, 1) == "{" then line = l end
  end
  assert(line, ("no result line from the child; stdout: %s; stderr: %s")
    :format(S.output(child):sub(1, 500), S.errors(child):sub(1, 2000)))
  return cjson.decode(line)
end

-- Waits for child with a bound; a child still running then is killed and
-- the spec fails saying what it printed.
local function finish(child, timeout, what)
  local done, rc = S.wait(child, timeout)
  if not done then
    S.kill(child, "KILL")
    error(("%s still running after %d s; stdout: %s; stderr: %s")
      :format(what, timeout, S.output(child):sub(-800), S.errors(child):sub(-1500)), 0)
  end
  assert(rc == 0, ("%s exited with status %s; stdout: %s; stderr: %s")
    :format(what, tostring(rc), S.output(child):sub(-800), S.errors(child):sub(-1500)))
  return result(child)
end

-- The entries of a submit_sync error list that name modulator key.
local function entries_for(errs, key)
  local t = {}
  for _, e in ipairs(errs) do
    if tostring(e.err):find(key, 1, true) then t[#t + 1] = e end
  end
  return t
end

------------------------------------------------------------------------------
describe("issue 8, obs. 4: three modulated consumers with every core busy", function()
  after_each(function() S.cleanup() end)

  local N = 20000

  -- One round: a producer and a consuming process that adds its three
  -- consumers while the producer probes; returns a line of figures.
  local function round(ns, r)
    local tag = "busy" .. r
    local o = { ns = ns, channel = tag, n = N, chunk = 200, duration = 30,
                probe_file = S.tmpname("probe"), final_file = S.tmpname("final"), flag = S.tmpname("escaped"),
                added_file = S.tmpname("added"), done_file = S.tmpname("done") }
    local prod = S.lua(kids.busy_producer, cjson.encode(o))
    local cons = S.lua(kids.busy_consumers, cjson.encode(o))
    local ok_p, p = pcall(finish, prod, 40, "round " .. r .. ": the producer")
    S.write(o.done_file, "done\n")
    if not ok_p then error(p, 0) end
    local c = finish(cons, 15, "round " .. r .. ": the consuming process")
    local what = ("round %d: producer %s; consumers %s"):format(r, cjson.encode(p), cjson.encode(c):sub(1, 1500))

    -- The filter's consumer: exactly the even ones, in order, then the final
    -- event, and nothing after it.
    assert(not c.timeout, "the consuming process hit its time bound; " .. what)
    assert.are.equal(N / 2, c.count, "events the filter's consumer handled; " .. what)
    assert(c.order_ok, "the filter's consumer saw the even events out of order or with gaps; " .. what)
    assert.are.equal(0, c.after_final, what)
    assert.are.same({}, c.errors.filter, what)
    -- submit_sync returned only after that consumer had handled the final
    -- event: its file was there when the call returned, with the full count,
    -- written before the return.
    assert.is_string(p.final_at_return,
      "submit_sync returned before the filter's consumer handled the final event; " .. what)
    local fcount, forder, ft = p.final_at_return:match("^final (%d+) (%a+) ([%d.]+)")
    assert.are.equal(N / 2, tonumber(fcount), what)
    assert.are.equal("true", forder, what)
    assert(tonumber(ft) <= p.t_return, "the final event was handled after submit_sync returned; " .. what)

    -- submit_sync is not true: the looping and the escaping modulators
    -- failed, each is one entry of its error list; the filter is none.
    assert.is_false(p.ok, "submit_sync returned true although two modulators failed; " .. what)
    assert.are.equal(2, #p.errs, what)
    local loop_e, esc_e = entries_for(p.errs, c.keys.loop), entries_for(p.errs, c.keys.escape)
    assert.are.equal(1, #loop_e, what)
    assert.are.equal(1, #esc_e, what)
    assert.are.equal(0, #entries_for(p.errs, c.keys.filter), what)
    assert.matches("CPU budget", loop_e[1].err, 1, true)
    assert.matches("attempt to index global 'os'", esc_e[1].err, 1, true)

    -- Each failing modulator's consumer was told why.
    assert.are.equal(1, #c.errors.loop, what)
    assert.matches("CPU budget", c.errors.loop[1], 1, true)
    assert.are.equal(1, #c.errors.escape, what)
    assert.matches("attempt to index global 'os'", c.errors.escape[1], 1, true)
    -- No escape worked, and nothing got through either failed modulator.
    assert.are.same({}, c.escaped, what)
    assert.is_nil(S.read(o.flag), "the escaping modulator wrote a file")
    assert.are.same({ loop = 0, escape = 0 }, c.others, what)

    return ("round %d: %d probes, burst of %d submitted in %.2f s, submit_sync %.2f s"):format(
      r, p.probes, N, p.burst, p.t_return - p.t_sync)
  end

  it("the filter gets the 10,000 even events and the final one, the failed modulators are reported,"
     .. " and submit_sync returns after the filter's consumer handled it (3 rounds)", function()
    local t0 = socket.gettime()
    S.busy_loops(3, "nice -n -5 ")
    local _, ns = S.nameserver("--quiet")
    local lines = {}
    for r = 1, 3 do
      lines[#lines + 1] = round(ns, r)
      -- keep the whole spec bounded: later rounds only if they fit
      if socket.gettime() - t0 > 25 then break end
    end
    print(("\nobs. 4 (%.1f s): %s"):format(socket.gettime() - t0, table.concat(lines, "; ")))
  end)

  -- What the rounds above avoid by keeping the consuming process up for a
  -- second after the final event: a consumer whose modulator failed here
  -- before the sync submit, whose process then goes away while the sync
  -- waits for the others.  It was present at the submit and never handled
  -- the event, so true is wrong (doc/semantics.md: a consuming process that dies is an
  -- entry of the list).  No busy loops needed: a slow plain consumer
  -- keeps the sync waiting.
  it("keeps a consumer whose modulator failed in submit_sync's error list when its process exits during the wait", function()
    local _, ns = S.nameserver("--quiet")
    local slow = S.lua(kids.consumer, cjson.encode{ ns = ns, channels = { "gone" }, slow = 1.5, stop_on = "end",
                                                    duration = 20 })
    local failing = S.lua(kids.sink, cjson.encode{ ns = ns, channel = "gone", duration = 20,
                                                   modulator = "function enqueue(ev) error('boom') end" })
    assert(S.wait_file(slow.out, "ready", 15), "consumer did not start: " .. S.errors(slow))
    assert(S.wait_file(failing.out, "ready", 15), "consumer did not start: " .. S.errors(failing))
    local prod = S.lua(kids.sync_after_failure, cjson.encode{ ns = ns, channel = "gone", first = 1, last = "end",
                                                              settle = 0.5 })
    assert(S.wait_file(prod.out, "submitting", 15), "producer did not start: " .. S.errors(prod))
    -- The sync is waiting for the slow consumer (1.5 s); the process of the
    -- consumer whose modulator failed exits meanwhile.
    S.sleep(0.3)
    S.kill(failing, "TERM")
    local p = finish(prod, 15, "the producer")
    local what = ("submit_sync took %.2f s; result %s"):format(p.t_return - p.t_submit, cjson.encode(p))
    assert.is_false(p.ok, "submit_sync returned true although a consumer present at the submit, whose modulator"
      .. " had failed, never handled the event; " .. what)
    assert.are.equal(1, #p.errs, what)
    assert.matches("boom", p.errtext, 1, true)
  end)
end)

------------------------------------------------------------------------------
describe("issue 8, obs. 5: a producer starved of CPU", function()
  after_each(function() S.cleanup() end)

  local N = tonumber(os.getenv("BUSY_OBS5_N")) or 1000
  -- (ASan: its allocator makes the same work several times dearer)
  local ITERS = tonumber(os.getenv("BUSY_OBS5_ITERS")) or (S.asan and 3000 or 10000)

  it("does not stop a modest modulator for its budget, and does stop one that loops for ever", function()
    local t0 = socket.gettime()
    -- Two busy loops at normal priority on core 0, the producer on core 0 at
    -- nice 19: it gets under 1% of that core, in slices far apart.
    S.busy_loops(2, "taskset -c 0 ")
    local _, ns = S.nameserver("--quiet")
    -- (at under 1% of a core the producer's own start-up bounds the case:
    -- make asan's is S.SLOW times dearer, and printed nothing in 50 s)
    local o = { ns = ns, channel = "starved", n = N, iters = ITERS, budget = 0.005, duration = 50 * S.SLOW,
                sync_timeout = 40 * S.SLOW, done_file = S.tmpname("done") }
    local cons = S.lua(kids.starved_consumers, cjson.encode(o))
    assert(S.wait_file(cons.out, "ready", 15), "the consuming process did not start: " .. S.errors(cons))
    local file = S.write(S.tmpname("starved") .. ".lua", kids.starved_producer)
    -- (make asan: the leak check at its exit runs the symbolizer, ~0.3 s of
    -- CPU and a child, which at under 1% of a core took past the 50 s: the
    -- producer printed its result at 5.5 s and was "still running after
    -- 50 s".  Its memory errors are still checked, its leaks not)
    local noleak = S.asan and 'ASAN_OPTIONS="$ASAN_OPTIONS:detect_leaks=0" ' or ""
    local prod = S.spawn(("%staskset -c 0 nice -n 19 %s %s %s")
      :format(noleak, S.luajit, file, S.sh_quote(cjson.encode(o))))
    local ok_p, p = pcall(finish, prod, 50 * S.SLOW, "the starved producer")
    S.write(o.done_file, "done\n")
    if not ok_p then error(p, 0) end
    local c = finish(cons, 10, "the consuming process")
    local summary = ("%d events in %.1f s, producer CPU %.2f s; modulator calls' wall time: max %.1f ms, %d of %d"
      .. " over the %g ms budget; modulator errors: %s; submit_sync: %s")
      :format(N, p.elapsed, p.cpu, c.wall_max * 1e3, c.wall_over, #c.seqs, o.budget * 1e3,
              cjson.encode(c.errors), tostring(p.errtext or p.ok))
    print("\nobs. 5 (" .. ("%.1f s"):format(socket.gettime() - t0) .. "): " .. summary)

    -- The modest modulator was never stopped and every event went through it.
    assert.are.same({}, c.errors.modest, summary)
    assert.are.equal(0, #entries_for(p.errs, c.keys.modest), summary)
    assert(c.got_end, "the final event did not reach the modest modulator's consumer; " .. summary)
    local holes, prev = {}, 0
    for _, i in ipairs(c.seqs) do
      if i ~= prev + 1 then holes[#holes + 1] = ("%d..%d"):format(prev + 1, i - 1) end
      prev = i
    end
    if prev ~= N then holes[#holes + 1] = ("%d..%d"):format(prev + 1, N) end
    assert(#c.seqs == N and #holes == 0, ("the modest modulator's consumer got %d of %d events; missing or out of"
      .. " order: %s; %s; producer's log: %s; consumer's log: %s"):format(#c.seqs, N, table.concat(holes, ", "),
      summary, S.errors(prod):sub(-1500), S.errors(cons):sub(-1500)))
    -- The premise: calls really were preempted for longer than the budget.
    assert(c.wall_over > 0, "no modulator call took longer than the budget in wall time: the producer was not starved; "
      .. summary)

    -- The converse: the modulator that loops for ever was stopped for its budget.
    assert.is_false(p.ok, summary)
    assert.are.equal(1, #p.errs, summary)
    assert.are.equal(1, #entries_for(p.errs, c.keys.looping), summary)
    assert.matches("CPU budget", p.errs[1].err, 1, true)
    assert.are.equal(1, #c.errors.looping, summary)
    assert.matches("CPU budget", c.errors.looping[1], 1, true)
    assert.are.equal(0, c.looping_events, summary)
  end)
end)
