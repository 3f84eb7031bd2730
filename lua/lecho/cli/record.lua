-- lua/lecho/cli/record.lua: `lecho record` (a channel's events to a file)
-- and `lecho replay` (published again: paced, or step by step from
-- commands on stdin), each an entry { opts, pos, usage, run } that
-- lecho.cli dispatches to (doc/recording.md).  Leans on lecho.cli.common,
-- lecho.recording (the file format) and lecho.replay (the player).

local server = require "lecho.server"
local C = require "lecho.cli.common"

local EXIT, COMMON = C.EXIT, C.COMMON
local die, emit = C.die, C.emit
local context, on_signals, signal_exit, finish, code_exit = C.context, C.on_signals, C.signal_exit, C.finish, C.code_exit
local wait_consumers = C.wait_consumers

local M = {}

M.record = {
  opts = { { "--out", "out", "string" }, { "--max-bytes", "max_bytes", "count" }, { "--keep", "keep", "count" },
           { "--append", "append", "flag" }, { "--for", "duration", "seconds" }, { "--count", "count", "count" },
           { "--history", "history", "string" }, { "--json", "json", "flag" } },
  pos = { { "CHANNEL" }, 1, many = true },
  usage = [[
usage: lecho record CHANNEL... --out FILE [--max-bytes BYTES] [--keep N] [--append]
                   [--for SECONDS] [--count N] [--history N|last|none] [--json]

Writes every event of the CHANNELs (values as they came on the wire, arrays
untouched; producer, sequence number, time) to FILE until Ctrl-C, in the
append-only format of doc/recording.md.  A record is written whole or
detected as torn: after a crash, replay (or --append) cuts the torn tail.
  --out FILE         the file (refused when it exists, unless --append)
  --append           go on after what FILE holds (its torn tail cut first)
  --max-bytes BYTES  rotate past this size: FILE -> FILE.1 -> ... -> FILE.KEEP
                     (>= 4096; a file larger only to hold one larger event)
  --keep N           rotated files kept (default 3; the oldest is dropped)
  --for SECONDS      stop after this long
  --count N          stop after N events (exactly N written)
  --history N|last|none  first record the last N values (N <= 1024; last: 1) each
                     producer kept (its history option), marked as history,
                     then the live events (default last; none: live only)
  --json             the summary at the end as one JSON object
]] .. COMMON,
}

M.replay = {
  opts = { { "--speed", "speed", "string" }, { "--step", "step", "flag" },
           { "--rename", "rename", "string", many = true }, { "--seek-time", "seek_time", "seconds0" },
           { "--seek-seq", "seek_seq", "count" }, { "--wait", "wait", "seconds0" }, { "--check", "check", "flag" },
           { "--json", "json", "flag" } },
  pos = { { "FILE" }, 1, many = true },
  usage = [[
usage: lecho replay FILE... [--speed X|max] [--step] [--rename OLD=NEW]...
                   [--seek-time SECONDS] [--seek-seq N] [--wait SECONDS] [--check] [--json]

Publishes the events of the recordings (in the order given) again on their
channels, at their recorded pace times --speed (default 1; "max": as fast
as the queues take them), files oldest first (FILE.2 FILE.1 FILE; out of
order: refused).  Consumers see meta.replay = true.  A torn tail is said on
stderr and ignored; a damaged record is said, skipped and counted
(damaged=N), and the whole records after it are replayed.
  --rename OLD=NEW   publish channel OLD's events on NEW (repeatable; an OLD
                     the files do not hold is refused, exit 2)
  --step             start paused and read commands from stdin, one a line:
                     step [N], play, pause, seek t=SECONDS, seek seq=N,
                     speed X, status, quit (each answered with a status line,
                     quit's the final one, after the queues drained;
                     a refused one with its reason; t is the played time;
                     read once the file is loaded: the first status line)
  --seek-time S      start S seconds into the recording
  --seek-seq N       start at the first event with sequence number N or later
  --wait SECONDS     first wait (at most this long, default 2; 0: do not) for a
                     consumer of each channel
Events sent while their channel had no consumer are said on stderr (per
channel) and counted (unreached=N in the summary).  Exits 1 when an event
could not be sent, none reached a consumer, or the files had damage; else 0.
  --check            only read the files: events, channels, duration, torn
                     tail, damage, each producer's sequence gaps (exit 1 on
                     damage, gaps or files out of order)
  --json             status and summary lines as JSON
]] .. COMMON,
}

------------------------------------------------------------------------------
-- record

function M.record.run(opts, pos)
  if not opts.out then die("record", "--out FILE is required\n" .. M.record.usage) end
  local recording = require "lecho.recording"
  local hist, herr = recording.history_opt(opts.history or "last")
  if herr then die("record", herr) end
  local ctx = context("record", opts)
  local w, werr = recording.writer(opts.out, { max_bytes = opts.max_bytes, keep = opts.keep, append = opts.append,
                                               recorder = ctx.addr })
  if not w then
    io.stderr:write("lecho record: ", tostring(werr), "\n")
    finish(ctx, EXIT.failed)
  end
  if w.cut then
    io.stderr:write(("lecho record: %s: torn tail at byte %d (%d bytes) cut\n"):format(opts.out, w.cut.offset,
                                                                                      w.cut.bytes))
  end
  local code
  local r, err, ecode = recording.record(ctx, pos, w, {
    -- without --count the events are written from C, never entering Lua
    direct = not opts.count,
    limit = opts.count,   -- exact: the rest of the batch that brought the Nth is not written
    history = hist,       -- the kept last values first (issue 29 F7)
    on_error = function(e)
      io.stderr:write("lecho record: ", tostring(e), "\n")
      code = EXIT.failed
      ctx:stop()
    end,
    on_event = function(rec)
      if opts.count and rec.events >= opts.count then code = EXIT.ok; ctx:stop() end
    end,
  })
  if not r then
    io.stderr:write("lecho record: ", server.message(err), "\n")
    w:close()
    finish(ctx, code_exit(ecode))
  end
  io.stderr:write(("lecho record: recording %s to %s\n"):format(table.concat(pos, ", "), opts.out))
  on_signals(ctx, function(s) code = signal_exit(s); ctx:stop() end)
  if opts.duration then ctx:after(opts.duration, function() code = code or EXIT.ok; ctx:stop() end) end
  while code == nil and not ctx.closed do ctx:run() end
  r.stop()
  w:close()
  if (r.refused or 0) > 0 then
    io.stderr:write(("lecho record: %d events past --count %d not recorded\n"):format(r.refused, opts.count))
  end
  local summary = { file = opts.out, events = w.events, bytes = w.bytes, rotations = w.rotations }
  if opts.json then emit(summary)
  else
    io.stdout:write(("recorded %d events, %d bytes, to %s%s\n"):format(w.events, w.bytes, opts.out,
      w.rotations > 0 and (" (%d rotations)"):format(w.rotations) or ""))
  end
  finish(ctx, code or EXIT.ok)
end

------------------------------------------------------------------------------
-- replay

local function replay_status(opts, st)
  if opts.json then return emit(st) end
  io.stdout:write(("replay %d/%d sent=%d t=%.3f/%.3f %s%s%s\n"):format(st.pos, st.total, st.sent,
    st.t, st.duration, st.done and "done" or (st.paused and "paused" or "playing"),
    ((st.unreached or 0) > 0 and (" unreached=%d"):format(st.unreached) or "")
      .. (st.damaged and (" damaged=%d"):format(st.damaged) or ""),
    (st.err and (" error: " .. st.err) or "") .. (st.error and (" refused: " .. st.error) or "")))
  io.stdout:flush()
end

function M.replay.run(opts, pos)
  local recording = require "lecho.recording"
  local started = recording.wall()
  if opts.check then
    local code = EXIT.ok
    local scans, seqs = {}, {}
    for _, f in ipairs(pos) do
      local r, err = recording.scan(f)
      if not r then
        io.stderr:write("lecho replay: ", tostring(err), "\n")
        code = EXIT.failed
      else
        scans[#scans + 1] = r
        local e = r.events
        -- sequence gaps of each producer (issue 29 F13), across the files
        -- given (seqs: where each was), said at the file where the gap
        -- ends; `at`: the event's number in that file
        local gaps, missing = recording.gaps(e, seqs), 0
        for _, g in ipairs(gaps) do missing = missing + g.missing end
        -- history events (flag bit 1: the values the producers kept, given
        -- when the recorder joined; issue 29 F7), counted apart
        local hist = e:history_count()
        local s = { file = f, events = #e, history = hist, channels = r.channels, duration = r.duration,
                    bytes = r.size, torn = r.torn, damage = r.damage, unindexed = r.unindexed, gaps = gaps,
                    missing = missing }
        local what = r.torn and (r.torn.damaged and "DAMAGED record" or "torn tail")
        if opts.json then emit(s) else
          io.stdout:write(("%s: %d events%s on %s, %.3f s%s\n"):format(f, #e,
            hist > 0 and (" (%d of them history)"):format(hist) or "", table.concat(r.channels, ", "),
            s.duration, r.torn and (", %s at byte %d (%d bytes: %s)"):format(what, r.torn.offset, r.torn.bytes,
                                                                              r.torn.why) or ""))
          for _, d in ipairs(r.damage) do
            io.stdout:write(("%s: DAMAGED record at byte %d (%s): %d bytes skipped%s\n"):format(f, d.offset, d.why,
              d.bytes, r.unindexed > 0 and (", %d events after it unplaceable"):format(r.unindexed) or ""))
          end
          for k, g in ipairs(gaps) do
            if k > 10 then io.stdout:write(("%s: ... %d more gaps\n"):format(f, #gaps - 10)) break end
            io.stdout:write(("%s: %s on %s: seq %d then %d (%s)\n"):format(f, g.producer, g.ch, g.after, g.next,
              g.backwards and "backwards" or (g.missing .. " missing")))
          end
        end
        -- damage past a crash's torn tail, or events missing between
        -- others: the file is not what was written
        if (r.torn and r.torn.damaged) or #r.damage > 0 or #gaps > 0 then code = EXIT.failed end
        r.events:free()   -- (a rotated set: one file's bytes in memory at a time)
      end
    end
    local oerr = recording.order(scans)
    if oerr then
      io.stderr:write("lecho replay: ", oerr, "\n")
      code = EXIT.failed
    end
    os.exit(code)
  end
  local speed = 1
  if opts.speed then
    speed = opts.speed == "max" and "max" or tonumber(opts.speed)
    if not speed or (speed ~= "max" and not (speed > 0)) then
      die("replay", ("--speed needs a number > 0 or max, not '%s'"):format(opts.speed))
    end
  end
  local rename = {}
  for _, r in ipairs(opts.rename) do
    local a, b = r:match("^([^=]+)=([^=]+)$")
    if not a then die("replay", ("--rename needs OLD=NEW, not '%s'"):format(r)) end
    rename[a] = b
  end
  local ctx = context("replay", opts)
  local code
  local rp, err, ecode = require("lecho.replay").new(ctx, pos, {
    speed = speed, rename = rename, paused = true,
    on_end = function(r) if not opts.step then code = code or (r.err and EXIT.failed or EXIT.ok); ctx:stop() end end,
  })
  if not rp then
    io.stderr:write("lecho replay: ", tostring(err), "\n")
    -- (a --rename of a channel not recorded: a usage error, exit 2)
    finish(ctx, ecode == "usage" and EXIT.usage or EXIT.failed)
  end
  for _, t in ipairs(rp.torn) do io.stderr:write("lecho replay: ", t, "\n") end
  -- the channels, each waited for (at most --wait) to have a consumer
  local seen = {}
  for _, s in ipairs(rp.streams) do
    local name = rename[s.ch] or s.ch
    if not seen[name] then
      seen[name] = true
      local ch = ctx:channel(name)
      -- as lecho pub: a consumer waited for first (default 2 s); a replay
      -- is long, so one may still come: said, and the replay goes on
      local wait = opts.wait == nil and 2 or opts.wait
      if ch and wait > 0 and not wait_consumers(ctx, ch, wait) and not ctx.cli_signal then
        io.stderr:write(("lecho replay: no consumer of %s yet (what goes to it before one joins is lost)\n")
                        :format(name))
      end
    end
  end
  -- (a signal while it waited for consumers: nothing played; the
  -- recording's index freed, as at the end: make asan's leak check saw it)
  if ctx.cli_signal then rp:close() finish(ctx, signal_exit(ctx.cli_signal)) end
  if opts.seek_time then rp:seek{ t = opts.seek_time } end
  if opts.seek_seq then rp:seek{ seq = opts.seek_seq } end
  on_signals(ctx, function(s) code = signal_exit(s); ctx:stop() end)
  local quitted
  if opts.step then
    -- commands from stdin, a line each, answered with a status line
    local buf = ""
    local function command(line)
      -- every command answered with a status line; a refused one with its
      -- reason (also on stderr) and the status unchanged (issue 29 F3)
      local st = rp:command(line)
      if st == nil then return end
      -- quit: answered too, by the final status line (after the queues
      -- drained: sent and unreached as the summary says them; third
      -- outside review #4)
      if st == "quit" then quitted = true; code = EXIT.ok; ctx:stop() return end
      if st.error then io.stderr:write("lecho replay: ", st.error, "\n") end
      ctx.c:flush()
      replay_status(opts, st)
    end
    -- stdin read on the loop; the commands run here, on the main line (a
    -- seek or a step may wait for room)
    local term = require "lecho.repl.term"
    local eof = false
    if io.stdin:seek("cur") then
      -- a file (epoll does not watch those): its commands are all there
      buf, eof = io.stdin:read("*a") or "", true
    else
      -- commands typed (or piped) while the file loaded run now, back to
      -- back: said, since a `play` then `status` then says sent=0 (issue 29)
      if term.readable(0) then
        io.stderr:write(("lecho replay: commands came while the recording loaded (%.1f s): they run now,"
          .. " one after the other (wait for the first status line)\n"):format(recording.wall() - started))
      end
      ctx:on_readable(0, function(wt)
        local r = term.read_fd(0)
        if r == nil then eof = true; wt:stop() else buf = buf .. r end
      end)
    end
    replay_status(opts, rp:status())
    while code == nil and not ctx.closed do
      local line, rest = buf:match("^([^\n]*)\n(.*)$")
      if line then
        buf = rest
        command(line)
      elseif eof then
        if buf ~= "" then command(buf) buf = "" end
        code = code or EXIT.ok
      else
        ctx:run_once(0.5)
      end
    end
  else
    rp:resume()
  end
  while code == nil and not ctx.closed do ctx:run() end
  local st = rp:status()
  if not rp:drain(60) then
    io.stderr:write("lecho replay: events still queued after 60 s (a consumer too slow)\n")
    code = EXIT.failed
  end
  -- a replay that reached nobody says so, with an exit code to script on
  local unreached, by = rp:unreached()
  st.unreached = unreached
  if unreached > 0 then
    local parts = {}
    for name, n in pairs(by) do parts[#parts + 1] = ("%s: %d"):format(name, n) end
    table.sort(parts)
    io.stderr:write(("lecho replay: %d of %d events sent reached no consumer (%s)\n")
                    :format(unreached, rp.sent, table.concat(parts, ", ")))
    -- none reached anyone: a failure; some channels without a consumer
    -- while others had theirs: said (and counted), not a failure
    if unreached >= rp.sent and (code == nil or code == EXIT.ok) then code = EXIT.failed end
  end
  -- damaged records skipped: the replay is not the whole recording (F1)
  if rp.damaged > 0 then
    io.stderr:write(("lecho replay: %d damaged records skipped%s: the replay is not whole\n"):format(rp.damaged,
      rp.unindexed > 0 and (", and %d events after them"):format(rp.unindexed) or ""))
    if code == nil or code == EXIT.ok then code = EXIT.failed end
  end
  rp:close()
  if not opts.step or quitted then replay_status(opts, st) end
  finish(ctx, code or EXIT.ok)
end


return M
