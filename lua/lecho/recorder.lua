-- lecho.recorder: recording in the producer's own process, off its thread
-- (issue 29).  ctx:recorder(path, opts) opens a recording (the format of
-- doc/recording.md, the one `lecho record` writes); a producer made with
-- `ch:producer{ record = rec }` (or `record = "path"`: a recorder of its
-- own, closed with it) appends every event it submits, as the bytes the
-- wire gets.  The producer's thread puts each event's encoded bytes into a
-- chunk once, and the message the wire gets reads them there
-- (core/binding/lua_rec.c); a writer thread checksums and writes them.

local Context = require "lecho.context"
local options = require "lecho.options"
local recording = require "lecho.recording"
-- Loops over keys as `in each(t)`, never `in pairs(t)`: no ITERN loop, which
-- Debian's LuaJIT may never end in the close at the program's end (context.lua).
local each = pairs

local function sh_quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

local function u32(n)
  return string.char(n % 256, math.floor(n / 256) % 256, math.floor(n / 65536) % 256, math.floor(n / 16777216) % 256)
end

local Recorder = {}
Recorder.__index = Recorder

local OPTS = {
  max_bytes = true, keep = true, append = true, policy = true, buffer_bytes = true, fsync = true,
}

local function check(opts)
  if opts == nil then return {} end
  if type(opts) ~= "table" then error("ctx:recorder: options must be a table", 3) end
  for k, v in each(opts) do
    if not OPTS[k] then error(("ctx:recorder: unknown option '%s'"):format(tostring(k)), 3) end
    if (k == "max_bytes" or k == "keep" or k == "buffer_bytes")
       and (type(v) ~= "number" or v ~= math.floor(v) or v < (k == "keep" and 1 or 0)) then
      error(("ctx:recorder: %s must be a whole number"):format(k), 3)
    end
    if k == "policy" and v ~= "block" and v ~= "drop" then
      error('ctx:recorder: policy must be "block" or "drop"', 3)
    end
  end
  if opts.buffer_bytes and opts.buffer_bytes < 131072 then
    error("ctx:recorder: buffer_bytes must be 131072 or more", 3)
  end
  return opts
end

--- Opens a recording of this context's producers in path: opts.max_bytes,
-- opts.keep, opts.append as `lecho record`'s --max-bytes, --keep, --append;
-- opts.policy when the disk is slower than the producers and
-- opts.buffer_bytes (default 8 MiB) are held: "block" (default: the submit
-- waits for the writer, nothing is lost) or "drop" (the event is not
-- recorded, counted in stats().dropped: its sequence number is missing
-- from the file, `lecho replay --check` names the gap); opts.fsync: close
-- fsyncs the file.  Returns the recorder, or nil, err.
function Context:recorder(path, opts)
  opts = check(opts)
  if self.closed then error("lecho: context is closed", 2) end
  if type(path) ~= "string" or path == "" then error("ctx:recorder: path must be a file name", 2) end
  local header, created, initial, cut
  if os.execute("test -p " .. sh_quote(path)) == 0 then
    -- a FIFO (a pipe to another program: a compressor, a remote copy, a
    -- slow reader): the stream starts with the magic line and the header,
    -- written by the writer thread (opening it waits for its reader)
    if opts.max_bytes or opts.append then
      return nil, ("%s is a FIFO: max_bytes and append need a file"):format(path)
    end
    created = math.floor(recording.wall())
    local body = "H" .. assert(require("lecho.core").encode({
      format = recording.FORMAT, created = created, recorder = self.addr, fields = recording.FIELDS }))
    header = u32(#body) .. u32(recording.crc32(body)) .. body
    initial = recording.MAGIC .. header
  else
    local w, err = recording.writer(path, { max_bytes = opts.max_bytes, keep = opts.keep, append = opts.append,
                                            recorder = self.addr })
    if not w then return nil, err end
    -- Lua wrote the magic line and the header: the C writer appends from here
    w.f:close()
    w.f = nil
    header, created, cut = w.header, w.created, w.cut
  end
  local h, err = self.c:recorder_open(path, recording.MAGIC .. header, created, opts.max_bytes or 0,
                                      opts.keep or 3, opts.policy or "block", opts.buffer_bytes, initial)
  if not h then return nil, err end
  local r = setmetatable({ h = h, ctx = self, path = path, fsync = opts.fsync, cut = cut,
                           policy = opts.policy or "block" }, Recorder)
  -- what an idle producer submitted last is written within 50 ms; a write
  -- error is said once
  r.timer = self:every(0.05, function()
    h:tick()
    if not r.said then
      local st = h:stats()
      if st.error then
        r.said = true
        self.log(("recorder %s: %s: the events after it are not recorded (stats().lost)"):format(path, st.error))
      end
    end
  end)
  self.recorders = self.recorders or {}
  self.recorders[r] = true
  return r
end

-- p (a producer of this context) records every event it submits from now on.
function Recorder:_attach(p)
  local ch, ctx = p.ch, p.ch.ctx
  if self.closed then return nil, "recorder is closed", "closed" end
  return p[1]:set_record(self.h, ch.short, ("%s#%d"):format(ctx.addr, p.id))
end

--- Waits until every event its producers submitted is in the file
-- (opts.fsync: and on the disk).  true, or nil, err.
function Recorder:flush(opts)
  if self.closed then return nil, "recorder is closed", "closed" end
  return self.h:flush(opts and opts.fsync)
end

--- { events (written), submitted, queued, dropped, lost, bytes,
-- rotations, blocked, buffered, open, error }.
function Recorder:stats() return self.h:stats() end

--- Writes what is left (fsync'd with opts.fsync or the recorder's fsync
-- option), ends the writer thread, closes the file: its producers record
-- nothing more.  Returns its stats; events not recorded are said in the
-- log.
function Recorder:close(opts)
  if self.closed then return self.h:stats() end
  self.closed = true
  if self.timer then self.timer:stop() self.timer = nil end
  local ctx = self.ctx
  if ctx.recorders then ctx.recorders[self] = nil end
  self.h:close((opts and opts.fsync) or self.fsync)
  local st = self.h:stats()
  if st.dropped > 0 or st.lost > 0 or st.error then
    ctx.log(("recorder %s: %d of %d events recorded, %d dropped (disk slower than the producer, policy %s), "
             .. "%d lost%s"):format(self.path, st.events, st.submitted, st.dropped, self.policy, st.lost,
                                   st.error and (" (" .. st.error .. ")") or ""))
  end
  return st
end

options.RECORDER = Recorder
return Recorder
