-- lecho record joins with history (issue 29, outside review F7): a
-- recording starts with the last values the producers kept (a settings
-- channel nobody steers during the recording), marked as history in the
-- file (E record flag bit 1, doc/recording.md), then the live events with
-- no gap and no duplicate at the seam; a replay of it gives a viewer the
-- settings first, as a live late joiner gets them.  --history none: live
-- only, as before.
--
-- Real processes on 127.0.0.1 (scripts/lecho, producers and a consumer in
-- Lua), killed in after_each by S.cleanup().

local S = require "spec.support"

local LECHO = S.root .. "/scripts/lecho"

-- A settings producer (history = "last"): submits { gain = 7 } once, with
-- nobody consuming, says "sent", and stays (its history with it).
local SETTINGS = [[
local lecho = require "lecho"
local ns, name = arg[1], arg[2]
local ctx = lecho.context{ nameserver = ns, quiet = true }
local p = assert(ctx:channel(name):producer{ history = "last" })
assert(p:submit({ gain = 7, mode = "steady" }))
ctx:run_once(0)
io.stdout:write("sent\n") io.stdout:flush()
ctx:after(60, function() ctx:stop() end)
ctx:run()
ctx:close()
]]

-- A producer (history = "last") that submits { i = k } every gap seconds,
-- k = 1, 2, ... for `secs` seconds, with or without consumers.
local STREAM = [[
local lecho = require "lecho"
local ns, name, gap, secs = arg[1], arg[2], tonumber(arg[3]), tonumber(arg[4])
local ctx = lecho.context{ nameserver = ns, quiet = true }
local p = assert(ctx:channel(name):producer{ history = "last" })
local k = 0
ctx:every(gap, function() k = k + 1 assert(p:submit({ i = k })) end)
io.stdout:write("started\n") io.stdout:flush()
ctx:after(secs, function() ctx:stop() end)
ctx:run()
ctx:close()
]]

-- A viewer: one JSON line per event { gain, seq, replay } until one came.
local VIEWER = [[
local lecho = require "lecho"
local ns, name, hist = arg[1], arg[2], arg[3]
local ctx = lecho.context{ nameserver = ns, quiet = true }
assert(ctx:channel(name):consumer(function(ev, meta)
  io.stdout:write(require("cjson").encode({ gain = ev.gain, seq = meta.seq, replay = meta.replay == true,
                                            history = meta.history == true }), "\n")
  io.stdout:flush()
  ctx:stop()
end, hist and { history = hist } or nil))
io.stdout:write("ready\n") io.stdout:flush()
ctx:after(30, function() ctx:stop() end)
ctx:run()
ctx:close()
]]

-- The E records of a file, read as doc/recording.md describes them (not
-- with lecho.recording: the spec checks the documented format): { seq,
-- flags, value } in file order.
local function events_of(path)
  local core = require "lecho.core"
  local s = assert(S.read(path))
  local function varint(i)
    local n, mul = 0, 1
    while true do
      local b = s:byte(i)
      n = n + (b % 128) * mul
      i = i + 1
      if b < 128 then return n, i end
      mul = mul * 128
    end
  end
  assert.are.equal("LECHOREC1\n", s:sub(1, 10))
  local i, out = 11, {}
  while i + 8 <= #s do
    local a, b, c, d = s:byte(i, i + 3)
    local len = a + b * 256 + c * 65536 + d * 16777216
    local body = i + 8
    if s:sub(body, body) == "E" then
      local j = body + 1
      local seq
      _, j = varint(j)        -- channel
      _, j = varint(j)        -- producer
      seq, j = varint(j)
      _, j = varint(j)        -- microseconds
      local flags = s:byte(j)
      local ok, v = core.decode(s:sub(j + 1, body + len - 1))
      assert(ok, "an event value that does not decode")
      out[#out + 1] = { seq = seq, flags = flags, value = v }
    end
    i = body + len
  end
  return out
end

describe("issue 29 F7: a recording holds the current state", function()
  after_each(function() S.cleanup() end)

  it("a settings value kept as history is recorded first, marked; --history none does not; a replay gives it to a viewer",
     function()
    local _, ns = S.nameserver("--quiet")
    local prod = S.lua(SETTINGS, ns, "rh.settings")
    assert(S.wait_file(prod.out, "sent", 20), S.errors(prod))
    -- nobody steers while it records: the kept value is all there is
    local file = S.tmpname("rhist") .. ".lecho"
    local rec = S.lecho(("record rh.settings --out %s --for 1 --json --nameserver %s"):format(file, ns))
    assert.are.equal(0, S.finish(rec, 30, "recorder"), S.errors(rec))
    assert.are.equal(1, S.json_lines(rec)[1].events, "the summary: " .. S.output(rec) .. S.errors(rec))
    local ev = events_of(file)
    assert.are.equal(1, #ev, "events in the file")
    assert.are.equal(7, ev[1].value.gain)
    assert.are.equal("steady", ev[1].value.mode)
    assert.are.equal(1, ev[1].seq, "the producer's own sequence number")
    assert.are.equal(2, ev[1].flags, "flags: history (bit 1), not sync")
    -- readable by --check as any file (an old reader: bit 1 not known)
    local chk = S.lecho("replay --check --json " .. file)
    assert.are.equal(0, S.finish(chk, 20, "check"), S.output(chk) .. S.errors(chk))
    assert.are.equal(1, S.json_lines(chk)[1].events)
    -- the history flag shown where a user looks (issue 29 leftover): --check
    -- counts history events, recording.scan gives each event's flag
    assert.are.equal(1, S.json_lines(chk)[1].history, "--check --json does not count the history event")
    chk = S.lecho("replay --check " .. file)
    assert.are.equal(0, S.finish(chk, 20, "check"))
    assert.matches("1 events %(1 of them history%) on rh.settings", S.output(chk))
    local scanned = assert(require("lecho.recording").scan(file))
    assert.is_true(scanned.events[1].history)

    -- --history none: live events only (none came)
    local none = S.tmpname("rnone") .. ".lecho"
    rec = S.lecho(("record rh.settings --out %s --for 1 --history none --json --nameserver %s"):format(none, ns))
    assert.are.equal(0, S.finish(rec, 30, "recorder"), S.errors(rec))
    assert.are.equal(0, S.json_lines(rec)[1].events)
    assert.are.equal(0, #events_of(none))
    -- a bad value is refused, with why
    rec = S.lecho(("record rh.settings --out %s.x --history 0 --nameserver %s"):format(none, ns))
    assert.are_not.equal(0, S.finish(rec, 30, "recorder"))
    assert.matches("%-%-history needs N", S.errors(rec))
    -- past what ch:consumer takes (1024): the same clear refusal, exit 2,
    -- and no file made (third outside review #3: a traceback, exit 1, and a
    -- header-only file that made the corrected command fail "exists")
    for _, n in ipairs({ "0", "2000", "1025", "1.5" }) do
      rec = S.lecho(("record rh.settings --out %s.big --count 5 --history %s --nameserver %s"):format(none, n, ns))
      assert.are.equal(2, S.finish(rec, 30, "recorder"), S.errors(rec))
      assert.matches("%-%-history needs N %(1 to 1024%), last or none, not '" .. n:gsub("%.", "%%.") .. "'",
                     S.errors(rec))
      assert.is_nil(S.errors(rec):match("traceback"))
      assert.is_nil(io.open(none .. ".big"), "a file was left by --history " .. n)
    end

    -- the replay, to a viewer that joined the replay's channel: the
    -- settings value comes, flagged as a replay, with the replay's own seq
    S.kill(prod, "KILL")
    local viewer = S.lua(VIEWER, ns, "rh.replayed")
    assert(S.wait_file(viewer.out, "ready", 20), S.errors(viewer))
    local rp = S.lecho(("replay %s --rename rh.settings=rh.replayed --wait 10 --nameserver %s"):format(file, ns))
    assert.are.equal(0, S.finish(rp, 30, "replay"), S.output(rp) .. S.errors(rp))
    S.finish(viewer, 30, "viewer")
    local got = S.json_lines(viewer)
    assert.are.equal(1, #got, S.output(viewer) .. S.errors(viewer))
    assert.are.equal(7, got[1].gain)
    assert.is_true(got[1].replay)
  end)

  it("a viewer that joins a replay after it started gets the settings: the replay keeps what the recording kept",
     function()
    -- issue 29 leftover: a replay kept no history, so a viewer of the
    -- replay that joined after the settings were sent never got them
    local _, ns = S.nameserver("--quiet")
    local prod = S.lua(SETTINGS, ns, "rh.lset")
    assert(S.wait_file(prod.out, "sent", 20), S.errors(prod))
    local file = S.tmpname("rlate") .. ".lecho"
    local rec = S.lecho(("record rh.lset --out %s --for 1 --json --nameserver %s"):format(file, ns))
    assert.are.equal(0, S.finish(rec, 30, "recorder"), S.errors(rec))
    S.kill(prod, "KILL")
    -- the replay sends the settings (step 1) to nobody, then waits
    local rp = S.spawn(("sh -c %s"):format(S.sh_quote(("(echo 'step 1'; sleep 40; echo quit) | %s %s replay %s "
      .. "--step --json --rename rh.lset=rh.lview --wait 0 --nameserver %s"):format(S.luajit, LECHO, file, ns))))
    assert(S.wait_file(rp.out, '"sent":1', 30), S.output(rp) .. S.errors(rp))
    -- a viewer joins now, with history: it gets them, from the replay
    local viewer = S.lua(VIEWER, ns, "rh.lview", "last")
    S.finish(viewer, 40, "viewer")
    local got = S.json_lines(viewer)
    assert.are.equal(1, #got, "the late viewer got nothing: " .. S.output(viewer) .. S.errors(viewer))
    assert.are.equal(7, got[1].gain)
    assert.is_true(got[1].replay)
    assert.is_true(got[1].history)
    S.kill(rp, "KILL")
  end)

  it("the C writer with a producer in the recorder's own process: no duplicate, no gap after the handover",
     function()
    -- issue 29 leftover: the C path (lecho record without --count) takes
    -- over from the history catch-up without the seam's floor; a producer
    -- in the same process (its local queue) could, in principle, deliver
    -- an event at or below the seam after the handover.  Not seen: what
    -- this checks, under busy cores (doc/recording.md says when the C path
    -- runs: `lecho record`, a process of its own)
    for _ = 1, 2 do S.spawn(("%s -e 'while true do end'"):format(S.luajit)) end
    local file = S.tmpname("rlocal") .. ".lecho"
    local child = S.lua([[
      local lecho = require "lecho"
      local recording = require "lecho.recording"
      local file = arg[1]
      for round = 1, 3 do
        os.remove(file)
        local ctx = lecho.context{ quiet = true }
        local p = assert(ctx:channel("rx.local"):producer{ history = "last" })
        local k = 0
        local tm = ctx:every(0.001, function() for _ = 1, 50 do k = k + 1 p:submit({ i = k }) end end)
        ctx:sleep(0.1 * round)
        local w = assert(recording.writer(file, {}))
        local r = assert(recording.record(ctx, { "rx.local" }, w, { direct = true, history = "last" }))
        ctx:sleep(0.5)
        tm:stop()
        ctx:sleep(0.2)
        r.stop()
        w:close()
        local s = assert(recording.scan(file))
        local bad, prev = 0, nil
        for j = 1, #s.events do
          local e = s.events[j]
          if prev and e.seq ~= prev + 1 then bad = bad + 1 end
          prev = e.seq
        end
        io.stdout:write(("round %d events %d bad %d last %d sent %d\n"):format(round, #s.events, bad, prev or -1, k))
        ctx:close()
      end
    ]], file)
    assert.are.equal(0, S.finish(child, 120, "recorder"), S.errors(child))
    local out = S.output(child)
    local rounds = 0
    for n, bad, last, sent in out:gmatch("events (%d+) bad (%d+) last (%-?%d+) sent (%d+)") do
      rounds = rounds + 1
      assert(tonumber(n) > 100, out)
      assert.are.equal(0, tonumber(bad), out)
      assert.are.equal(tonumber(sent), tonumber(last), "the last events were not recorded: " .. out)
    end
    assert.are.equal(3, rounds, out)
  end)

  it("the REPL's record() records the kept value too, and not with history = 'none'", function()
    local _, ns = S.nameserver("--quiet")
    local prod = S.lua(SETTINGS, ns, "rh.repl")
    assert(S.wait_file(prod.out, "sent", 20), S.errors(prod))
    local with, without = S.tmpname("rrepl") .. ".lecho", S.tmpname("rrepl0") .. ".lecho"
    local code = ("h = record('rh.repl', %q); g = record('rh.repl', %q, { history = 'none' }); wait(1);"
                  .. " h:stop(); g:stop()"):format(with, without)
    local p = io.popen(("%s %s/scripts/lecho-repl --nameserver %s --no-history -e %s </dev/null 2>&1; echo rc=$?")
                       :format(S.luajit, S.root, ns, S.sh_quote(code)))
    local out = p:read("*a")
    p:close()
    assert.matches("rc=0", out)
    assert.matches("record: 1 events, %d+ bytes in " .. with:gsub("%p", "%%%0"), out)
    assert.matches("record: 0 events, %d+ bytes in " .. without:gsub("%p", "%%%0"), out)
    local ev = events_of(with)
    assert.are.equal(1, #ev)
    assert.are.equal(7, ev[1].value.gain)
    assert.are.equal(2, ev[1].flags)
    assert.are.equal(0, #events_of(without))
    -- a bad value: refused before any recorder starts
    p = io.popen(("%s %s/scripts/lecho-repl --nameserver %s --no-history -e %s </dev/null 2>&1; echo rc=$?")
                 :format(S.luajit, S.root, ns, S.sh_quote(("record('rh.repl', %q, { history = 'all' })"):format(
                   with .. ".x"))))
    out = p:read("*a")
    p:close()
    assert.matches("record: history needs N", out)
    assert.matches("rc=1", out)
  end)

  it("history then live: no duplicate, no gap at the seam (--check), in both recorder paths, every core busy",
     function()
    local _, ns = S.nameserver("--quiet")
    -- every core busy (2 here; the spinners are children, killed by cleanup)
    for _ = 1, 2 do S.spawn(("%s -e 'while true do end'"):format(S.luajit)) end
    local prod = S.lua(STREAM, ns, "rh.stream", "0.002", "40")
    assert(S.wait_file(prod.out, "started", 20), S.errors(prod))
    S.sleep(0.5)   -- a value kept, events flowing
    -- the C sink path (no --count) and the Lua one (--count)
    for _, extra in ipairs({ "--for 1", "--count 50" }) do
      local file = S.tmpname("rseam") .. ".lecho"
      local rec = S.lecho(("record rh.stream --out %s %s --json --nameserver %s"):format(file, extra, ns))
      assert.are.equal(0, S.finish(rec, 30, "recorder " .. extra), S.errors(rec))
      local ev = events_of(file)
      assert(#ev >= 10, extra .. ": only " .. #ev .. " events")
      assert.are.equal(2, ev[1].flags, extra .. ": the first is the kept value")
      for k = 2, #ev do
        assert.are.equal(0, ev[k].flags, extra .. ": only the first from history")
        assert.are.equal(ev[k - 1].seq + 1, ev[k].seq, extra .. ": a gap or a duplicate at " .. k)
        assert.are.equal(ev[k].seq, ev[k].value.i)
      end
      local chk = S.lecho("replay --check --json " .. file)
      assert.are.equal(0, S.finish(chk, 20, "check"), S.output(chk) .. S.errors(chk))
      local c = S.json_lines(chk)[1]
      assert.are.equal(#ev, c.events)
      assert.are.equal(0, c.missing)
    end
    S.kill(prod, "KILL")
  end)
end)
