-- lecho.replay: publishes a recording (lecho.recording) again on its
-- channels, or renamed ones, at its own pace times `speed`, as fast as the
-- queues take ("max"), or step by step; pause, resume, seek to a time or a
-- sequence number (issue 29).  One producer per recorded (channel,
-- producer), so each producer's order is kept; the events go out as the
-- bytes that were recorded (no decoding), and their producer ids are
-- 2^40 and up, which consumers see as meta.replay = true (context.lua):
-- nothing else tells a replay from the live run.  Runs on the context's
-- loop (a timer), so a REPL or a script goes on meanwhile.

local recording = require "lecho.recording"
local Context = require "lecho.context"

local M = {}

local Replay = {}
Replay.__index = Replay

--- ctx, files (a path or a list of paths, replayed in that order), opts:
-- speed (number > 0 or "max"; default 1), rename ({ old = new }),
-- paused (start paused: step or resume), on_end(rp) when the last event
-- went, on_event(rp, e) after each.  Returns the replay, or nil, err (and
-- "usage" when opts.rename names a channel the files do not hold).
function M.new(ctx, files, opts)
  opts = opts or {}
  if type(files) == "string" then files = { files } end
  -- torn: the lines to say about the files (a torn tail, damage, files
  -- out of order); damaged: bad records skipped (the replay is not whole).
  -- lists: each file's events, as recording.scan loaded them (the file's
  -- bytes and a 40-byte struct an event: issue 29 F4), one after the other
  local torn, scans, lists, streams, seen = {}, {}, {}, {}, {}
  local damaged, unindexed, total = 0, 0, 0
  -- refused: the files' bytes freed now, not whenever the GC comes (it
  -- does not see malloc'd memory: a REPL's refused replays would pile up)
  local function refused(...)
    for _, r in ipairs(scans) do r.events:free() end
    return nil, ...
  end
  for _, f in ipairs(files) do
    local r, err = recording.scan(f)
    if not r then return refused(err) end
    scans[#scans + 1] = r
    for _, d in ipairs(r.damage) do
      torn[#torn + 1] = ("%s: DAMAGED record at byte %d (%s): %d bytes skipped, read on from byte %d")
                        :format(f, d.offset, d.why, d.bytes, d.offset + d.bytes)
    end
    damaged = damaged + #r.damage
    if r.unindexed > 0 then
      torn[#torn + 1] = ("%s: %d events skipped (their header, channel or producer record was damaged)")
                        :format(f, r.unindexed)
      unindexed = unindexed + r.unindexed
    end
    if r.torn then
      if r.torn.damaged then damaged = damaged + 1 end
      torn[#torn + 1] = ("%s: %s at byte %d (%d bytes: %s) ignored"):format(f,
        r.torn.damaged and "DAMAGED record" or "torn tail", r.torn.offset, r.torn.bytes, r.torn.why)
    end
    if r.events.n > 0 then
      lists[#lists + 1] = { list = r.events, start = total, n = r.events.n, sorted = r.sorted,
                            seq_sorted = r.seq_sorted, first = r.first_wall, last = r.last_wall,
                            first_seq = r.events:ref(1).seq, last_seq = r.events:ref(r.events.n).seq,
                            producers = r.producers }
      total = total + r.events.n
    else
      r.events:free()   -- (no event: nothing of its bytes is read again)
    end
    for _, s in ipairs(r.streams) do
      local key = s.ch .. "\0" .. s.producer
      if not seen[key] then
        seen[key] = { ch = s.ch, producer = s.producer }
        streams[#streams + 1] = seen[key]
      end
      -- the producer kept history in the recorded run (its values marked
      -- history in the file): the replay's keeps the most any file gave
      if s.history then seen[key].history = math.max(seen[key].history or 0, s.history) end
    end
  end
  local oerr = recording.order(scans)
  if oerr then return refused(oerr) end
  -- a rename of a channel the files do not hold is a typo: refused, else
  -- the replay goes to the recorded (live) channel (issue 29, third
  -- outside review #2); code "usage"
  local held, hold = {}, {}
  for _, s in ipairs(streams) do
    if not held[s.ch] then held[s.ch] = true hold[#hold + 1] = s.ch end
  end
  local olds = {}
  for old in pairs(opts.rename or {}) do olds[#olds + 1] = old end
  table.sort(olds)
  for _, old in ipairs(olds) do
    if not held[old] then
      return refused(("--rename %s=%s: the recording holds no channel '%s' (its channels: %s)"):format(old,
        opts.rename[old], old, #hold > 0 and table.concat(hold, ", ") or "none"), "usage")
    end
  end
  -- the times go forward all along (each file's, and from one to the
  -- next): a seek to a time is a binary search
  local sorted, seq_sorted = true, true
  for k, x in ipairs(lists) do
    if not x.sorted or (k > 1 and x.first < lists[k - 1].last) then sorted = false end
    if not x.seq_sorted or (k > 1 and x.first_seq < lists[k - 1].last_seq) then seq_sorted = false end
  end
  local speed = opts.speed or 1
  if speed ~= "max" and (type(speed) ~= "number" or not (speed > 0)) then
    return refused("speed must be a number > 0 or \"max\"")
  end
  local t0 = lists[1] and lists[1].first or 0
  local rp = setmetatable({ ctx = ctx, lists = lists, cur = lists[1], total = total, t0 = t0, sorted = sorted,
                            seq_sorted = seq_sorted,
                            streams = streams, torn = torn, damaged = damaged, unindexed = unindexed,
                            rename = opts.rename or {}, speed = speed,
                            pos = 1, sent = 0, paused = opts.paused or false, producers = {},
                            on_end = opts.on_end, on_event = opts.on_event,
                            duration = total > 0 and lists[#lists].last - t0 or 0 }, Replay)
  -- every producer joined now, from the caller's line: the timer that
  -- sends must not wait for a manager
  for _, s in ipairs(streams) do
    local p, err = rp:_producer(s)
    if not p then
      rp:close()
      return nil, ("replaying on '%s': %s"):format(rp.rename[s.ch] or s.ch, tostring(err))
    end
  end
  -- what the channels counted as sent to nobody so far (Replay:unreached)
  rp.nodest0 = rp:_nodest()
  rp:_rebase(0)
  if not rp.paused then rp:_schedule(0) end
  return rp
end

-- Event pos (1 to total) of the files: its list and number in that list.
function Replay:_locate(pos)
  local L = self.cur
  if not (L and pos > L.start and pos <= L.start + L.n) then
    for _, x in ipairs(self.lists) do
      if pos > x.start and pos <= x.start + x.n then L = x break end
    end
    self.cur = L
  end
  return L.list, pos - L.start
end

-- The time of event pos, seconds from the first event; nil past the end.
function Replay:_t(pos)
  if self.closed or pos < 1 or pos > self.total then return nil end
  local list, k = self:_locate(pos)
  return list.ev[k - 1].wall - self.t0
end

--- Event pos (1 to total) as a table { ch, producer, seq, wall, t, sync,
-- data }, or nil: made when asked (a replay keeps none).
function Replay:event(pos)
  if self.closed or pos < 1 or pos > self.total or pos % 1 ~= 0 then return nil end
  local list, k = self:_locate(pos)
  local e = list[k]
  e.t = e.wall - self.t0
  return e
end

-- The producer of recorded (channel, producer): made on first use.
function Replay:_producer(e)
  local key = e.ch .. "\0" .. e.producer
  local p = self.producers[key]
  if p then return p end
  local name = self.rename[e.ch] or e.ch
  local ch, err, code = self.ctx:channel(name)
  if not ch then return nil, err, code end
  -- a recorded producer that kept history (the file holds values marked
  -- history): the replay's keeps its last values too, so a viewer that
  -- joins the replay after its start gets the current settings, as a late
  -- joiner of the live run did (issue 29)
  local hist = e.history
  if hist == nil then
    for _, s in ipairs(self.streams) do
      if s.ch == e.ch and s.producer == e.producer then hist = s.history end
    end
  end
  p, err, code = ch:producer(hist and { history = hist == 1 and "last" or math.min(hist, 1024) } or nil)
  if not p then return nil, err, code end
  local ctx = self.ctx
  ctx.nextreplay = (ctx.nextreplay or 0) + 1
  p:_set_pid(Context.REPLAY_PID + ctx.nextreplay)
  self.producers[key] = p
  return p
end

-- The played time: seconds into the recording the replay is at (between
-- the last event sent and the next one, as time goes by while playing;
-- frozen while paused).  Issue 29 F6: a pause in the middle of a gap kept
-- no trace of it, and play sent the next event at once.
function Replay:_played()
  if self.closed then return self.closed_t end
  local et = self:_t(self.pos)
  if not et then return self.duration end
  if self.paused or self.speed == "max" then return self.base_t end
  local t = self.base_t + (self.ctx:now() - self.base_now) * self.speed
  return math.max(self.base_t, math.min(et, t))
end

-- From now, played time t (default: the played time now): event pos is
-- due at now + (its t - t) / speed.
function Replay:_rebase(t)
  self.base_t = t or self:_played()
  self.base_now = self.ctx:now()
end

function Replay:_schedule(delay)
  if self.timer then self.timer:stop() end
  self.timer = self.ctx:after(math.max(0, delay), function()
    self.timer = nil
    self:_run()
  end)
end

-- Sends event pos; true, or nil, err.  Its value's bytes are copied out
-- of the file's now, and only now.
function Replay:_send(pos)
  local list, k = self:_locate(pos)
  local ev = list.ev[k - 1]
  local key = ev.ch * 16777216 + ev.prod
  -- (the producer of each stream of a list, found once by its names)
  local byk = self.byk and self.byk[list.id]
  if not byk then
    self.byk = self.byk or {}
    byk = {}
    self.byk[list.id] = byk
  end
  local p = byk[key]
  if not p then
    local err
    p, err = self:_producer{ ch = list:channel(ev.ch), producer = list:producer(ev.prod) }
    if not p then return nil, err end
    byk[key] = p
  end
  local ok, serr = p:_submit_encoded(list:data(k))
  if not ok then return nil, serr end
  self.sent = self.sent + 1
  self.last = pos
  if self.on_event then self.on_event(self, self:event(pos)) end
  return true
end

function Replay:_run()
  if self.paused or self.closed then return end
  local ctx = self.ctx
  local n = 0
  while self.pos <= self.total do
    local pos = self.pos
    local et = self:_t(pos)
    if self.speed ~= "max" then
      local due = self.base_now + (et - self.base_t) / self.speed
      local now = ctx:now()
      if due > now then return self:_schedule(due - now) end
    end
    self.pos = pos + 1
    if self.speed == "max" then self.base_t = et end
    local ok, err = self:_send(pos)
    if not ok then self.err = err end
    n = n + 1
    -- "max": let the loop write and take requests every 1000 events
    if self.speed == "max" and n >= 1000 then return self:_schedule(0) end
    if self.paused or self.closed then return end
  end
  self.done = true
  if self.on_end then self.on_end(self) end
end

--- Stops sending; resume() goes on from the same point (in the middle of a
-- gap: what was left of it), at the same pace.
function Replay:pause()
  if not self.paused then self:_rebase() end
  self.paused = true
  if self.timer then self.timer:stop() self.timer = nil end
  return self:status()
end

function Replay:resume()
  if self.closed then return nil, "replay is closed" end
  self.paused = false
  self:_rebase(self.base_t)
  self:_schedule(0)
  return self:status()
end

--- Sends the next n events (default 1) now, paused or not (it pauses).
function Replay:step(n)
  if self.closed then return nil, "replay is closed" end
  self:pause()
  for _ = 1, n or 1 do
    local pos = self.pos
    local et = self:_t(pos)
    if not et then break end
    self.pos = pos + 1
    self.base_t = et
    local ok, err = self:_send(pos)
    if not ok then return nil, err end
  end
  if self.pos > self.total then
    self.done = true
    if self.on_end then self.on_end(self) end
  end
  return self:status()
end

--- Goes to a time ({ t = seconds from the recording's first event }) or a
-- sequence number ({ seq = N [, producer = name] }: the first event of
-- that producer, or of any, with that seq or later).  Paused stays paused.
function Replay:seek(to)
  if type(to) == "number" then to = { t = to } end
  if type(to) ~= "table" then error("lecho: seek takes { t = seconds } or { seq = n }", 2) end
  if self.closed then return nil, "replay is closed" end
  local k
  if (to.t and self.sorted) or (to.seq and not to.t and to.producer == nil and self.seq_sorted) then
    -- the times (or the sequence numbers, of every event) go forward: the
    -- first event at or after the one sought, by halves
    local lo, hi = 1, self.total + 1
    while lo < hi do
      local mid = math.floor((lo + hi) / 2)
      local list, i = self:_locate(mid)
      local at
      if to.t then at = list.ev[i - 1].wall - self.t0 >= to.t else at = list.ev[i - 1].seq >= to.seq end
      if at then hi = mid else lo = mid + 1 end
    end
    k = lo <= self.total and lo or nil
  else
    -- in file order, reading the structs in place (no table an event)
    for _, x in ipairs(self.lists) do
      local list, ev, t0 = x.list, x.list.ev, self.t0
      local prod
      if to.producer ~= nil then
        for i, name in ipairs(x.producers) do if name == to.producer then prod = i end end
      end
      for i = 0, x.n - 1 do
        local e = ev[i]
        if to.t and e.wall - t0 >= to.t then k = x.start + i + 1 break end
        if to.seq and e.seq >= to.seq and (to.producer == nil or e.prod == prod) then k = x.start + i + 1 break end
      end
      if k then break end
    end
  end
  self.pos = k or (self.total + 1)
  self.done = self.pos > self.total
  -- played time: the time sought (up to the event found), or that event's
  local et = self:_t(self.pos)
  self:_rebase(not et and self.duration or (to.t and math.max(0, math.min(to.t, et))) or et)
  if not self.paused then self:_schedule(0) end
  return self:status()
end

--- Changes the pace (a number > 0, or "max") from the current event on.
function Replay:set_speed(x)
  if x ~= "max" and (type(x) ~= "number" or not (x > 0)) then
    error("lecho: speed must be a number > 0 or \"max\"", 2)
  end
  self:_rebase()
  self.speed = x
  if not self.paused then self:_schedule(0) end
  return self:status()
end

-- { [short channel name] = events submitted with no consumer at all }:
-- the core's events_no_dest of each replayed channel and of its
-- modulators' streams ("name@key"; a channel whose consumers all use
-- modulators sends nothing on its plain stream)
function Replay:_nodest()
  local names = {}
  for _, p in pairs(self.producers) do names[p.ch.name] = p.ch.short or p.ch.name end
  local out = {}
  for n, st in pairs(self.ctx:stats().channels) do
    local base = n:match("^(.*)@[^@/]*$") or n
    local short = names[base] or names[n]
    if short then out[short] = (out[short] or 0) + (st.events_no_dest or 0) end
  end
  return out
end

--- Events this replay sent while their channel had no consumer (none
-- reached anyone): total, { [channel] = count } (only those above 0).
function Replay:unreached()
  local now, total, by = self:_nodest(), 0, {}
  for name, n in pairs(now) do
    local d = n - ((self.nodest0 or {})[name] or 0)
    if d > 0 then by[name], total = d, total + d end
  end
  return total, by
end

--- { pos, total, sent, unreached, t (the played time: seconds into the
-- recording, between the last event sent and the next), duration, paused,
-- done, speed, err (the last send's), damaged (bad records the files had,
-- skipped; nil when none) }.  pos: the next event's number, 1 to total; once done,
-- total (the text and --json status lines say the same, 5663/5663).
function Replay:status()
  local e = self.pos <= self.total
  return { pos = math.min(self.pos, self.total), total = self.total, sent = self.sent, unreached = (self:unreached()),
           t = e and self:_played() or self.duration, duration = self.duration, paused = self.paused,
           done = self.pos > self.total, speed = self.speed, err = self.err,
           damaged = self.damaged > 0 and self.damaged or nil }
end

--- Serves the loop until what was sent left this process (the queues are
-- empty), at most timeout seconds (default 60): true, or false.
function Replay:drain(timeout)
  local ctx = self.ctx
  local deadline = ctx:now() + (timeout or 60)
  while ctx:now() < deadline do
    ctx.c:flush()
    local _, ev = ctx.c:pending()
    if ev == 0 then return true end
    ctx:run_once(0.02)
  end
  return false
end

--- Runs one command of `lecho replay --step` (doc/recording.md): "step
-- [N]", "play", "pause", "seek t=SECONDS", "seek seq=N", "speed X|max",
-- "status", "quit".  Returns the status after it, with `error` set (the
-- status unchanged) when the command is refused, so every command is
-- answered (issue 29 F3: a refused one was answered on stderr only, and a
-- driver reading a line per command hung); "quit" for quit; nil for an
-- empty line.
function Replay:command(line)
  local w = {}
  for x in line:gmatch("%S+") do w[#w + 1] = x end
  local c, arg = w[1], w[2]
  if c == nil then return nil end
  local function refuse(why)
    local st = self:status()
    st.error = why
    return st
  end
  if #w > 2 or (arg and c ~= "step" and c ~= "seek" and c ~= "speed") then
    return refuse(("'%s' takes %s"):format(c, (c == "step" or c == "seek" or c == "speed") and "one argument"
                                                   or "no argument"))
  end
  if c == "step" then
    local n = arg == nil and 1 or tonumber(arg)
    if not n or n < 1 or n % 1 ~= 0 or n > 2 ^ 31 then return refuse("step N: N a whole number >= 1") end
    return self:step(n)
  elseif c == "play" then return self:resume()
  elseif c == "pause" then return self:pause()
  elseif c == "status" then return self:status()
  elseif c == "speed" then
    local x = arg == "max" and "max" or tonumber(arg or "")
    if not x or (x ~= "max" and not (x > 0 and x < math.huge)) then
      return refuse("speed X: a number > 0, or max")
    end
    return self:set_speed(x)
  elseif c == "seek" then
    local k, v = (arg or ""):match("^(%a+)=(.+)$")
    local n = v and tonumber(v)
    if k == "t" and n and n >= 0 and n < math.huge then return self:seek{ t = n } end
    if k == "seq" and n and n >= 0 and n % 1 == 0 and n < 2 ^ 53 then return self:seek{ seq = n } end
    return refuse("seek t=SECONDS (>= 0) or seek seq=N (a whole number >= 0)")
  elseif c == "quit" then return "quit"
  end
  return refuse(("unknown command '%s' (step [N], play, pause, seek t=S, seek seq=N, speed X, status, quit)")
                :format(c))
end

--- Stops it for good: its producers closed (what they queued delivered
-- as a close does), and the files' bytes and index freed now (malloc'd:
-- the GC does not count them, and a process that ends by os.exit never
-- runs their finalizer).  Then status() says where it stopped; step, seek
-- and resume are refused; event() is nil.
function Replay:close()
  if self.closed then return end
  self.closed_t = self.base_now and self:_played() or 0   -- (closed by new(), before its start: 0)
  self.closed = true
  if self.timer then self.timer:stop() self.timer = nil end
  for _, p in pairs(self.producers) do p:close() end
  for _, x in ipairs(self.lists) do x.list:free() end
  self.cur = nil
end

return M
