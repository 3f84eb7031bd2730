-- The recorder in the producer's process (issue 29, lecho.recorder,
-- core/binding/lua_rec.c): `ch:producer{ record = FILE }` writes every event
-- the producer submits, in order, in the format `lecho record` writes
-- (doc/recording.md), from a writer thread; a SIGKILL mid-record leaves a
-- torn tail that --check reports and replay skips; a disk slower than the
-- producer meets the policy the user chose (block: nothing lost; drop:
-- counted, the gaps named by --check); a write error is counted and said;
-- the program's end writes what was submitted.
--
-- Real processes on 127.0.0.1 (producers in Lua, scripts/lecho, a slow
-- reader of a FIFO), busy loops where said; killed in after_each.

local cjson = require "cjson"
local S = require "spec.support"

-- A producer of `name` recording into `file` (ctx:recorder's options as
-- JSON in arg 4): n events { i = k, pad = size bytes, field = an array
-- every 10th }, a sync one every 1000th (to a consumer when there is one:
-- arg 6 "wait"), then the recorder's stats as a JSON line; "exit": ends
-- with os.exit(0), no close; "drain": 1.5 s after them, 10 more.
local PRODUCER = [[
local lecho = require "lecho"
local cjson = require "cjson"
local ns, name, file, opts, n, mode, size = arg[1], arg[2], arg[3], cjson.decode(arg[4]), tonumber(arg[5]),
                                             arg[6], tonumber(arg[7] or "100")
local ctx = lecho.context{ nameserver = ns ~= "-" and ns or nil, quiet = true }
local rec = assert(ctx:recorder(file, opts))
local ch = ctx:channel(name)
local p = assert(ch:producer{ record = rec })
if mode == "wait" then
  local deadline = ctx:now() + 20
  while ctx:now() < deadline and not next(ch.dests) do ctx:run_once(0.02) end
end
local a = lecho.array.new("<f8", { 4, 4 })
for k = 0, 15 do a:set(math.floor(k / 4), k % 4, k + 0.5) end
local pad = ("x"):rep(size)
local t0 = ctx:now()
for k = 1, n do
  local ev = { i = k, pad = pad, field = (k % 10 == 0) and a or nil }
  if mode == "wait" and k % 1000 == 0 then
    assert(p:submit_sync(ev, { timeout = 30 }))
  else
    assert(p:submit(ev))
  end
  if k % 200 == 0 then ctx:run_once(0) end
  if mode == "forever" and k == 2000 then io.stdout:write("going\n") io.stdout:flush() end
end
local dt = ctx:now() - t0
if mode == "drain" then
  -- the writer catches up, then 10 more: recorded after what was dropped
  ctx:sleep(1.5)
  for k = n + 1, n + 10 do assert(p:submit({ i = k, pad = pad })) end
end
if mode == "exit" then io.stdout:write("exiting\n") io.stdout:flush() os.exit(0) end
local st = rec:close()
st.submit_s = dt
io.stdout:write(cjson.encode(st), "\n")
ctx:close()
]]

-- The recording's events: { seq, sync, i, sum } each (decoded), and the scan.
local function events_of(file)
  local recording = require "lecho.recording"
  local lecho = require "lecho"
  local scan = assert(recording.scan(file))
  local out = {}
  for k = 1, #scan.events do   -- (an index of FFI structs: no ipairs)
    local e = scan.events[k]
    local ok, v = lecho.decode(e.data)
    assert(ok, "an event that does not decode")
    out[k] = { seq = tonumber(e.seq), sync = e.sync, i = v.i, sum = v.field and v.field:sum() or nil,
               producer = e.producer, channel = e.ch }
  end
  return out, scan
end

-- A consumer of channel arg[2] that takes arg[3] events { i = 1, 2, ... }
-- and says "got N bad B": B the events out of order (or, with arg[4]
-- "replay", not flagged meta.replay; with "pad", whose ev.pad is not the
-- letter 65 + i % 26 a thousand times, then i).
local IN_ORDER = [[
local lecho = require "lecho"
local ctx = lecho.context{ nameserver = arg[1], quiet = true }
local want_replay, want_pad = arg[4] == "replay", arg[4] == "pad"
local n, bad, last = 0, 0, 0
assert(ctx:channel(arg[2]):consumer(function(ev, meta)
  n = n + 1
  if ev.i ~= last + 1 or (want_replay and not meta.replay)
     or (want_pad and ev.pad ~= string.char(65 + ev.i % 26):rep(1000) .. ev.i) then
    bad = bad + 1
  end
  last = ev.i
  if n == tonumber(arg[3]) then ctx:stop() end
end))
io.stdout:write("ready\n") io.stdout:flush()
ctx:after(120, function() ctx:stop() end)
ctx:run()
io.stdout:write(("got %d bad %d\n"):format(n, bad))
ctx:close()
]]

describe("issue 29: recording in the producer's process", function()
  after_each(function() S.cleanup() end)

  it("records every event submitted, in order, values as sent, with every core busy", function()
    local _, ns = S.nameserver("--quiet")
    -- a consumer in another process: the wire goes on as without a recorder
    local cons = S.lua(IN_ORDER, ns, "rt.busy", "20000")
    assert(S.wait_file(cons.out, "ready", 20), S.errors(cons))
    S.busy_loops(2)
    local file = S.tmpname("busy") .. ".lecho"
    local prod = S.lua(PRODUCER, ns, "rt.busy", file, "{}", "20000", "wait")
    assert.are.equal(0, S.finish(prod, 120, "producer"), S.errors(prod))
    local st = S.json_lines(prod)[1]
    assert.are.same({ 20000, 20000, 0, 0 }, { st.submitted, st.events, st.dropped, st.lost })
    assert(S.finish(cons, 60, "consumer") == 0)
    assert.matches("got 20000 bad 0", S.output(cons))
    local evs, scan = events_of(file)
    assert.is_nil(scan.torn)
    assert.are.equal(20000, #evs)
    local pname = evs[1].producer
    assert.matches("^127%.0%.0%.1:%d+#%d+$", pname)
    for k, e in ipairs(evs) do
      assert(e.seq == k and e.i == k, ("event %d: seq %d i %s"):format(k, e.seq, tostring(e.i)))
      assert(e.sync == (k % 1000 == 0), "the sync flag of event " .. k)
      assert.are.equal("rt.busy", e.channel)
      assert.are.equal(pname, e.producer)
      if k % 10 == 0 then assert.are.equal(128, e.sum, "an array not as it was") end
    end
    -- the file is one `lecho replay --check` reads whole, no gap
    local chk = S.lecho("replay --check --json " .. file)
    assert.are.equal(0, S.finish(chk, 30, "check"), S.errors(chk))
    local c = S.json_lines(chk)[1]
    assert.are.equal(20000, c.events)
    -- bytes per event close to the wire's (a value of ~130 B: its frame
    -- header and the record's differ by a few bytes)
    local per = (scan.size - #require("lecho.recording").MAGIC) / 20000
    assert(per < 160, "a record takes " .. per .. " bytes")
  end)

  it("a SIGKILL mid-record leaves a torn tail at worst: --check reports it, replay sends the rest in order",
     function()
    local _, ns = S.nameserver("--quiet")
    local file = S.tmpname("kill") .. ".lecho"
    local prod = S.lua(PRODUCER, "-", "rt.kill", file, "{}", "100000000", "forever", "300")
    assert(S.wait_file(prod.out, "going", 30), S.errors(prod))
    -- killed while it records at full rate (the writer thread mid-write, or between two)
    S.sleep(0.5)
    S.kill(prod, "KILL")
    S.finish(prod, 10, "producer")
    local size = #assert(S.read(file))
    local chk = S.lecho("replay --check --json " .. file)
    assert.are.equal(0, S.finish(chk, 30, "check"), S.errors(chk))
    local c = S.json_lines(chk)[1]
    assert(c.events >= 1000, "recorded only " .. tostring(c.events) .. " events")
    -- a torn tail for sure: bytes of the last record changed, as a write cut short
    local f = io.open(file, "r+b")
    f:seek("set", size - 7)
    local b3 = f:read(3)
    f:seek("set", size - 7)
    f:write((b3:gsub(".", function(ch) return string.char(255 - ch:byte()) end)))
    f:close()
    chk = S.lecho("replay --check --json " .. file)
    assert.are.equal(0, S.finish(chk, 30, "check"), S.errors(chk))
    local c2 = S.json_lines(chk)[1]
    assert.is_table(c2.torn, "the torn tail was not reported")
    assert.are.equal(c.torn and c.events or c.events - 1, c2.events, "more than the torn record was lost")
    local evs = events_of(file)
    for k, e in ipairs(evs) do assert(e.seq == k and e.i == k, "a gap or disorder at " .. k) end
    -- replayed to a consumer: every whole record, in order
    local n = #evs
    local cons = S.lua(IN_ORDER, ns, "rt.kill", tostring(n), "replay")
    assert(S.wait_file(cons.out, "ready", 20), S.errors(cons))
    local rp = S.lecho(("replay %s --speed max --wait 10 --nameserver %s"):format(file, ns))
    assert.are.equal(0, S.finish(rp, 120, "replay"), S.output(rp) .. S.errors(rp))
    assert.matches("torn tail at byte %d+", S.errors(rp))
    S.finish(cons, 60, "consumer")
    assert.matches(("got %d bad 0"):format(n), S.output(cons))
  end)

  -- A FIFO read slowly: a disk slower than the producer.  The reader
  -- copies it to out at about 2 MB/s (8 KiB every 4 ms).
  local function slow_reader(fifo, out)
    return S.lua([[
      local socket_sleep = require("spec.support.proc").sleep
      local f = assert(io.open(arg[1], "rb"))
      local o = assert(io.open(arg[2], "wb"))
      while true do
        local b = f:read(8192)
        if not b then break end
        o:write(b)
        socket_sleep(0.004)
      end
      o:close()
    ]], fifo, out)
  end

  for _, policy in ipairs({ "block", "drop" }) do
    it(("a disk slower than the producer, policy %s: %s"):format(policy, policy == "block"
         and "the producer waits, every event recorded" or "events not recorded are counted, --check names the gaps"),
       function()
      local fifo = S.tmpname("fifo")
      assert(os.execute("mkfifo " .. fifo) == 0)
      local out = S.tmpname("slow") .. ".lecho"
      local reader = slow_reader(fifo, out)
      local n = 6000
      local prod = S.lua(PRODUCER, "-", "rt.slow", fifo, cjson.encode({ policy = policy, buffer_bytes = 131072 }),
                         tostring(n), "drain", "1000")
      n = n + 10
      assert.are.equal(0, S.finish(prod, 120, "producer"), S.errors(prod))
      assert.are.equal(0, S.finish(reader, 60, "reader"), S.errors(reader))
      local st = S.json_lines(prod)[1]
      assert.are.equal(n, st.submitted)
      assert.are.equal(0, st.lost)
      assert.are.equal(n, st.events + st.dropped, "events neither recorded nor counted")
      local evs = events_of(out)
      assert.are.equal(st.events, #evs)
      local chk = S.lecho("replay --check --json " .. out)
      local rc = S.finish(chk, 30, "check")
      local c = S.json_lines(chk)[1]
      if policy == "block" then
        assert.are.equal(0, st.dropped)
        assert(st.blocked > 0, "the producer never waited for the disk")
        -- ~6 MB at ~2 MB/s: the submits waited for the reader
        assert(st.submit_s > 1, "6 MB went through a 2 MB/s disk in " .. st.submit_s .. " s")
        for k, e in ipairs(evs) do assert(e.seq == k and e.i == k, "a gap or disorder at " .. k) end
        assert.are.equal(0, rc, S.errors(chk))
      else
        assert(st.dropped > 0, "nothing dropped: the disk was not slower")
        assert(st.submit_s < 5, "the producer waited for the disk under drop: " .. st.submit_s .. " s")
        local last = 0
        for _, e in ipairs(evs) do
          assert(e.seq > last, "out of order")
          last = e.seq
        end
        assert.are.equal(1, rc, "--check did not fail on the gaps")
        assert.are.equal(st.dropped - (n - evs[#evs].seq), c.missing, "--check's missing is not what was dropped")
      end
    end)
  end

  it("a write error (file size limit) is counted and said, the producer goes on", function()
    local file = S.tmpname("efbig") .. ".lecho"
    -- (SIGXFSZ not ignored by the program: the writer thread blocks it, so
    -- its write fails with EFBIG; an outside attack: the process was killed,
    -- exit 153, where this spec had ignored the signal itself)
    local prod = S.lua_with("ulimit -f 1024", [[
      local lecho = require "lecho"
      local cjson = require "cjson"
      local logs = {}
      local ctx = lecho.context{ log = function(m) logs[#logs + 1] = m end }
      local p = assert(ctx:channel("rt.big"):producer{ record = arg[1] })
      local pad = ("z"):rep(1000)
      for k = 1, 3000 do assert(p:submit({ i = k, pad = pad })) if k % 100 == 0 then ctx:run_once(0.001) end end
      ctx:sleep(0.2)
      local st = p.own_rec:stats()
      p:close()
      io.stdout:write(cjson.encode({ st = st, logs = logs }), "\n")
      ctx:close()
    ]], file)
    assert.are.equal(0, S.finish(prod, 60, "producer"), S.errors(prod))
    local r = S.json_lines(prod)[1]
    assert.matches("File too large", r.st.error or "")
    assert(r.st.lost > 0, "no event counted lost")
    assert.are.equal(3000, r.st.events + r.st.lost + r.st.queued)
    assert.matches("recorder .*File too large", table.concat(r.logs, "\n"))
    -- what was written is whole records of the first events, in order
    local evs = events_of(file)
    assert(#evs > 0 and #evs < 3000)
    for k, e in ipairs(evs) do assert(e.seq == k, "a gap or disorder at " .. k) end
  end)

  it("a FIFO whose reader goes: the write error is counted and said, the producer goes on (no SIGPIPE)", function()
    local fifo = S.tmpname("fifo")
    assert(os.execute("mkfifo " .. fifo) == 0 or true)
    -- the reader takes 200 KB and exits; the producer records 3000 x 1 KB into it
    local reader = S.spawn(("head -c 200000 %s > /dev/null"):format(fifo))
    local prod = S.lua([[
      local lecho = require "lecho"
      local cjson = require "cjson"
      local logs = {}
      local ctx = lecho.context{ log = function(m) logs[#logs + 1] = m end }
      local rec = assert(ctx:recorder(arg[1], { policy = arg[2] }))
      local p = assert(ctx:channel("rt.fifo"):producer{ record = rec })
      local pad = ("z"):rep(1000)
      for k = 1, 3000 do assert(p:submit({ i = k, pad = pad })) if k % 100 == 0 then ctx:run_once(0.001) end end
      ctx:sleep(0.3)
      local st = rec:stats()
      p:close()
      rec:close()
      io.stdout:write(cjson.encode({ st = st, logs = logs }), "\n")
      ctx:close()
    ]], fifo, "drop")
    assert.are.equal(0, S.finish(prod, 60, "producer"), S.output(prod) .. S.errors(prod))
    S.wait(reader, 10)
    local r = S.json_lines(prod)[1]
    assert.matches("Broken pipe", r.st.error or "")
    assert(r.st.lost > 0, "no event counted lost")
    assert.matches("recorder .*Broken pipe", table.concat(r.logs, "\n"))
  end)

  it("the program's end (os.exit without close) writes everything submitted", function()
    local file = S.tmpname("exit") .. ".lecho"
    local prod = S.lua(PRODUCER, "-", "rt.exit", file, "{}", "30000", "exit")
    assert.are.equal(0, S.finish(prod, 60, "producer"), S.errors(prod))
    assert.matches("exiting", S.output(prod))
    local evs, scan = events_of(file)
    assert.is_nil(scan.torn)
    assert.are.equal(30000, #evs)
    for k, e in ipairs(evs) do assert(e.seq == k, "a gap or disorder at " .. k) end
  end)

  it("a C producer records what it submits (lecho_producer_record), and stops on NULL", function()
    local bin = S.capi_program(S.root .. "/spec/support/capi_record.c")
    local file = S.tmpname("crec") .. ".lecho"
    local c = S.spawn(("%s %s"):format(bin, S.sh_quote(file)))
    assert.are.equal(0, S.finish(c, 60, "C producer"), S.output(c) .. S.errors(c))
    assert.matches("again %d+: .*exists", S.output(c))
    local evs = events_of(file)
    assert.are.equal(500, #evs)
    for k, e in ipairs(evs) do assert(e.seq == k and e.i == k, "a gap or disorder at " .. k) end
  end)

  it("flush returns once what was submitted is in the file; p:record(nil) stops, p:record(rec) goes on", function()
    local lecho = require "lecho"
    local ctx = lecho.context{ quiet = true }
    local file = S.tmpname("flush") .. ".lecho"
    local rec = assert(ctx:recorder(file))
    local p = assert(ctx:channel("rt.flush"):producer{ record = rec })
    for k = 1, 100 do assert(p:submit({ i = k })) end
    assert.is_true(rec:flush())
    assert.are.equal(100, #events_of(file))
    assert(p:record(nil))
    for k = 101, 110 do assert(p:submit({ i = k })) end
    assert(p:record(rec))
    for k = 111, 120 do assert(p:submit({ i = k })) end
    assert.is_true(rec:flush({ fsync = true }))
    local evs = events_of(file)
    assert.are.equal(110, #evs)
    assert.are.equal(111, evs[101].seq)
    local st = rec:close()
    assert.are.same({ 110, 110, 0, 0, 0 }, { st.submitted, st.events, st.dropped, st.lost, st.queued })
    -- closed: nothing more is recorded, nor raises
    assert(p:submit({ i = 121 }))
    assert.are.equal(110, #events_of(file))
    assert.has_error(function() ctx:recorder(file, { policy = "sometimes" }) end)
    assert.is_nil((ctx:recorder(file)))   -- exists: refused without append
    ctx:close()
  end)

  -- The bytes of an event staged by a recording producer go straight into
  -- the recorder's chunk and the message the core gets borrows them there
  -- (lua_rec.c lb_rec_stage): one copy on the producer's thread, not two.
  it("records a staged event in place: its bytes copied once, the queues reading them from the recording", function()
    local lecho = require "lecho"
    local ctx = lecho.context{ quiet = true }
    local file = S.tmpname("inplace") .. ".lecho"
    local rec = assert(ctx:recorder(file))
    local ch = ctx:channel("rt.inplace")
    local got, bad = 0, 0
    assert(ch:consumer(function(ev)   -- a local consumer: its queue holds the messages
      got = got + 1
      if ev.i ~= got or ev.pad ~= ("p"):rep(ev.i % 200 + 1) then bad = bad + 1 end
    end))
    local p = assert(ch:producer{ record = rec })
    for k = 1, 3000 do
      assert(p:submit({ i = k, pad = ("p"):rep(k % 200 + 1) }))
      if k % 500 == 0 then ctx:run_once(0) end
    end
    assert(p:submit_sync({ i = 3001, pad = ("p"):rep(3001 % 200 + 1) }))
    assert.are.same({ 3001, 0 }, { got, bad })
    local st = rec:close()
    assert.are.same({ 3001, 3001, 0, 0 }, { st.submitted, st.events, st.dropped, st.lost })
    assert.are.equal(3001, st.inplace, "events copied twice (not staged in place)")
    local evs = events_of(file)
    assert.are.equal(3001, #evs)
    for k, e in ipairs(evs) do
      assert(e.seq == k and e.i == k, ("event %d: seq %d i %s"):format(k, e.seq, tostring(e.i)))
    end
    assert.is_true(evs[3001].sync)
    ctx:close()
  end)

  -- What the wire still holds of a recording's chunks is never reused nor
  -- freed under it: a consumer stopped while events of 1000 B pile up in
  -- the queue toward it (more than the recorder's buffer_bytes of them,
  -- so some are copied, lb_rec_stage's held_bytes bound), a second
  -- producer of the same recorder submitting meanwhile (its events copied
  -- while the first one's staged record waits for room); then a recorder
  -- closed while the queue holds its chunks.  The consumer checks every
  -- byte of every event when it wakes.
  it("chunks the wire still holds are neither reused nor freed under it (a stopped consumer, a closed recorder)",
     function()
    local lecho = require "lecho"
    local _, ns = S.nameserver("--quiet")
    local N = 30000   -- 30 MB: more than the socket buffers hold, so the queue fills
    local cons = S.lua(IN_ORDER, ns, "rt.lend", tostring(N), "pad")
    assert(S.wait_file(cons.out, "ready", 20), S.errors(cons))
    local ctx = lecho.context{ nameserver = ns, quiet = true, queue_limit = 256 * 1024 }
    local ch = ctx:channel("rt.lend")
    local pa = assert(ch:producer{ policy = "block" })
    local deadline = ctx:now() + 20
    while ctx:now() < deadline and not next(ch.dests) do ctx:run_once(0.02) end
    assert(next(ch.dests), "the consumer did not join")
    local chb = ctx:channel("rt.lend.b")
    local nb = 0
    assert(chb:consumer(function() nb = nb + 1 end))
    local function ev(k) return { i = k, pad = string.char(65 + k % 26):rep(1000) .. k } end
    -- phase 1: the queue holds chunks while the recorder goes on
    local file1 = S.tmpname("lend1") .. ".lecho"
    local rec1 = assert(ctx:recorder(file1, { buffer_bytes = 131072 }))
    assert(pa:record(rec1))
    local pb = assert(chb:producer{ record = rec1 })
    local kb = 0
    local tb = ctx:every(0.002, function() kb = kb + 1 assert(pb:submit({ b = kb })) end)
    S.kill(cons, "STOP")
    ctx:after(1.0, function() S.kill(cons, "CONT") end)
    for k = 1, N / 2 do assert(pa:submit(ev(k))) end
    tb:stop()
    local st1 = rec1:close()
    assert.are.same({ 0, 0 }, { st1.dropped, st1.lost })
    assert.are.equal(N / 2 + kb, st1.events)
    assert(st1.inplace > 0 and st1.inplace < st1.events,
           ("in place %d of %d: both paths expected"):format(st1.inplace, st1.events))
    local evs = events_of(file1)
    local ka, kbb = 0, 0
    for _, e in ipairs(evs) do
      if e.channel == "rt.lend" then ka = ka + 1 assert(e.i == ka and e.seq == ka, "rt.lend event " .. ka)
      else kbb = kbb + 1 assert(e.seq == kbb, "rt.lend.b event " .. kbb) end
    end
    assert.are.same({ N / 2, kb }, { ka, kbb })
    -- phase 2: the recorder closed while the stopped consumer's queue holds its chunks
    local file2 = S.tmpname("lend2") .. ".lecho"
    local rec2 = assert(ctx:recorder(file2, { buffer_bytes = 131072 }))
    assert(pa:record(rec2))
    S.kill(cons, "STOP")
    local closed
    ctx:after(0.5, function() closed = rec2:close() end)
    ctx:after(1.0, function() S.kill(cons, "CONT") end)
    for k = N / 2 + 1, N do assert(pa:submit(ev(k))) end
    assert.is_table(closed, "the recorder was not closed while the queue was full")
    assert(closed.events > 0 and closed.inplace > 0)
    -- the queue drains as the loop turns
    local until_t = ctx:now() + 60
    while ctx:now() < until_t and not S.output(cons):find("got") do ctx:run_once(0.05) end
    assert.are.equal(0, S.finish(cons, 30, "consumer"))
    assert.matches("got " .. N .. " bad 0", S.output(cons))
    assert.are.equal(closed.events, #events_of(file2))
    ctx:close()
  end)
end)
