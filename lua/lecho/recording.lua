-- lecho.recording: the recording file format (doc/recording.md) and a
-- recorder (issue 29).  A file is the magic line "LECHOREC1\n", then
-- records, each
--
--   u32le length of the body | u32le CRC-32 (zlib's) of the body | body
--
-- and the body's first byte says its kind:
--   'H' header: an encoded lecho value { format = 1, created, recorder,
--       fields } (`fields` describes the other kinds in words); every
--       segment starts with one, and it resets the channel and producer
--       tables below
--   'C' varint index, then a channel's short name (replay publishes there)
--   'P' varint index, then a producer's name ("host:port#id")
--   'E' an event: varint channel index, varint producer index, varint seq,
--       varint microseconds since the header's `created`, one flag byte
--       (bit 0: it was a sync event; bit 1: it came from its producer's
--       history, the last values it kept, when the recorder joined), then
--       the value's encoded bytes exactly
--       as they came on the wire (doc/wire-format.md; arrays untouched)
--
-- Append-only; a crash mid-write leaves at most a torn last record: its
-- length runs past the end (with no whole record after its header), or its
-- checksum fails.  A reader stops there and says where (`M.scan`); a bad
-- record with whole records after it is damage: skipped, said, and read on
-- from the next whole record; `M.cut` truncates a file to its good part
-- (record --append does it before it writes).

local ffi = require "ffi"

local M = {}

M.MAGIC = "LECHOREC1\n"
M.FORMAT = 1
M.MAX_RECORD = 256 * 1024 * 1024   -- a length past this is a torn or foreign file
-- the least --max-bytes: a file's magic line and header take about 300
-- bytes, and a file always holds at least one event (issue 29 F5:
-- --max-bytes 100 made a file per event, each of 366 bytes)
M.MIN_MAX_BYTES = 4096
-- E record flags (a reader ignores bits it does not know: format 1 still)
M.SYNC, M.HISTORY = 1, 2
M.FIELDS = "C: varint index, short channel name; P: varint index, producer name; "
        .. "E: varint channel, varint producer, varint seq, varint microseconds since created, "
        .. "u8 flags (1 sync, 2 history: a kept last value given when the recorder joined), encoded value as received"

ffi.cdef [[
unsigned long crc32(unsigned long crc, const unsigned char *buf, unsigned int len);
int truncate(const char *path, long length);
struct lecho_rec_timeval { long tv_sec; long tv_usec; };
int gettimeofday(struct lecho_rec_timeval *tv, void *tz);
]]
local zlib = ffi.load("z")

local tv = ffi.new("struct lecho_rec_timeval")
--- Seconds since the epoch, to the microsecond.
function M.wall()
  ffi.C.gettimeofday(tv, nil)
  return tonumber(tv.tv_sec) + tonumber(tv.tv_usec) / 1e6
end

function M.crc32(s, crc)
  return tonumber(zlib.crc32(crc or 0, ffi.cast("const unsigned char *", s), #s))
end

local char, byte, floor = string.char, string.byte, math.floor

local function u32(n)
  return char(n % 256, floor(n / 256) % 256, floor(n / 65536) % 256, floor(n / 16777216) % 256)
end
local function varint(n)
  if n < 128 then return char(n) end
  if n < 16384 then return char(n % 128 + 128, floor(n / 128)) end
  local t = {}
  repeat
    local b = n % 128
    n = floor(n / 128)
    t[#t + 1] = char(n > 0 and b + 128 or b)
  until n == 0
  return table.concat(t)
end
M.varint = varint

-- One record as bytes: header and body.
local function record(body)
  return u32(#body) .. u32(M.crc32(body)) .. body
end
M.record = record

---------------------------------------------------------------------------
-- Reading
---------------------------------------------------------------------------

-- The 0-based offset of the first whole record at or after 0-based offset
-- `from` of the file's n bytes at p, or nil, or -1 (not known, see below).  A record whose length
-- runs past the end of the file is a crash's torn tail only when nothing
-- whole follows it: a flipped bit in a length mid-file also runs it past
-- the end, and then the records after it are still there, whole (issue 29,
-- F1).  Every offset is tried (the flip hid where the next record starts),
-- cheap tests first: a length > 0 that fits, a kind that is a capital
-- letter, and from there a chain of such headers, each where the one before
-- it ends, reaching the end of the file (or a last header cut short, or a
-- last record that runs past the end: a torn tail after the damage).  Only
-- a candidate whose chain reaches the end has its body's CRC-32 computed
-- (zlib's, through the FFI).  Chains are remembered, so the search is
-- linear: a 15 MB file in a fraction of a second.  A file made to defeat
-- the cheap tests could still cost many checksums: past 1 GiB of
-- checksummed bytes the search gives up with -1, which the caller takes
-- for damage (the safe side: nothing is cut).
local CRC_BUDGET = 1024 * 1024 * 1024
local function capital(b) return b >= 65 and b <= 90 end
local function whole_record_after(p, n, from, memo)
  memo = memo or {}
  memo.budget = memo.budget or CRC_BUDGET
  local budget = memo.budget
  -- [offset] = whether the chain of headers from there reaches the end
  -- (kept in memo from one search to the next in a file: a file with many
  -- damages walks its chains once)
  memo.ends = memo.ends or {}
  local ends = memo.ends
  local path = {}
  local function reaches_end(k)
    local np = 0
    local ok
    while true do
      local known = ends[k]
      if known ~= nil then ok = known break end
      if k == n or n - k < 9 then ok = true break end
      local len = p[k] + p[k + 1] * 256 + p[k + 2] * 65536 + p[k + 3] * 16777216
      if len == 0 or len > M.MAX_RECORD or not capital(p[k + 8]) then ok = false break end
      np = np + 1
      path[np] = k
      if len > n - k - 8 then ok = true break end   -- a torn last record
      k = k + 8 + len
    end
    for q = 1, np do ends[path[q]] = ok end
    return ok
  end
  for j = from, n - 9 do
    local len = p[j] + p[j + 1] * 256 + p[j + 2] * 65536 + p[j + 3] * 16777216
    if len > 0 and len <= n - j - 8 and capital(p[j + 8]) and reaches_end(j + 8 + len) then
      budget = budget - len
      memo.budget = budget
      if budget < 0 then return -1 end
      local crc = p[j + 4] + p[j + 5] * 256 + p[j + 6] * 65536 + p[j + 7] * 16777216
      if tonumber(zlib.crc32(0, p + j + 8, len)) == crc then return j end
    end
  end
  return nil
end
--- (s: a string, from: a 0-based offset)
function M._whole_record_after(s, from, memo)
  return whole_record_after(ffi.cast("const uint8_t *", s), #s, from, memo)
end

-- value, next offset, reading p from offset i below lim; nil when it runs
-- past lim or past 2^53
local function rd_varint_p(p, i, lim)
  local n, mul = 0, 1
  while true do
    if i >= lim or mul > 2 ^ 49 then return nil end
    local b = p[i]
    n = n + (b % 128) * mul
    i = i + 1
    if b < 128 then return n, i end
    mul = mul * 128
  end
end

---------------------------------------------------------------------------
-- A file's events, loaded: the file's bytes in one malloc'd buffer (read
-- with fread, never a Lua string: LuaJIT's read("*a") held two or three
-- copies of the file at its peak) and a compact index of its events, one
-- 40-byte struct each in an array grown by doubling (issue 29, outside
-- review F4: a table and a copy of the value per event made a 99 MB file of
-- 2 million small events take 904 MB and 22 s to load).  A value's bytes
-- are copied out (`list:data(k)`) only when it is sent.  Both allocations
-- are owned by the list (a cdata with a __gc that frees them).
---------------------------------------------------------------------------

ffi.cdef [[
typedef struct {
  double wall;       /* seconds since the epoch */
  double seq;        /* sequence number (up to 2^53) */
  double off;        /* 0-based offset of the value's first byte in the file */
  uint32_t len;      /* the value's length */
  uint32_t ch;       /* 1-based index into the list's channel names */
  uint32_t prod;     /* 1-based index into the list's producer names */
  uint8_t sync;      /* 1: a sync event */
  uint8_t hist;      /* 1: a history event (flag bit 1: a kept value given when the recorder joined) */
} lecho_rec_ev;
typedef struct {
  uint8_t *buf;      /* the file's bytes (malloc'd, owned: freed by __gc) */
  double size;
  lecho_rec_ev *ev;  /* the events (malloc'd, owned: freed by __gc) */
  uint32_t n, cap;
  int32_t id;        /* key of its names in `names` below */
} lecho_rec_list;
]]
for _, d in ipairs { "void *malloc(size_t);", "void *realloc(void *, size_t);", "void free(void *);",
                     "void *fopen(const char *, const char *);", "int fclose(void *);",
                     "size_t fread(void *, size_t, size_t, void *);", "int fseek(void *, long, int);",
                     "long ftell(void *);" } do
  pcall(ffi.cdef, d)
end
local C = ffi.C
local EVSIZE = ffi.sizeof("lecho_rec_ev")

-- [list id] = { chans = { names }, prods = { names } }: what a cdata
-- cannot hold (dropped by the list's __gc).  Kept in the registry, with
-- the id counter and the list's ctype, so that this module loaded again
-- in the same state (busted runs each spec file with a fresh
-- package.loaded; the FFI's types and metatables outlive it) reads and
-- frees the same table the lists' metatable does: two tables made a list
-- of the second load unreadable ("nm" nil) after one of the first.
local shared = debug.getregistry()["lecho.recording"]
if not shared then
  shared = { names = {}, nextid = 0 }
  debug.getregistry()["lecho.recording"] = shared
end
local names = shared.names

local List = {}
local list_mt = {
  __len = function(l) return l.n end,
  __index = function(l, k)
    if type(k) == "number" then return List.event(l, k) end
    return List[k]
  end,
  __gc = function(l)
    if l.buf ~= nil then C.free(l.buf) end
    if l.ev ~= nil then C.free(l.ev) end
    l.buf, l.ev = nil, nil
    names[l.id] = nil
  end,
}
local okT, T = pcall(ffi.metatype, "lecho_rec_list", list_mt)
if okT then shared.ListT = T end
local ListT = shared.ListT

--- Event k (1-based) as a table { ch, producer, seq, wall, t (seconds
-- from the list's first event), sync, history (flag bit 1: a value its
-- producer kept, given when the recorder joined), data }, or nil.  Made afresh on each
-- call (a replay reads the fields it needs instead: List.ref, List.data).
function List.event(l, k)
  if k < 1 or k > l.n or k % 1 ~= 0 then return nil end
  local e = l.ev[k - 1]
  local nm = names[l.id]
  return { ch = nm.chans[e.ch], producer = nm.prods[e.prod], seq = e.seq, wall = e.wall,
           t = e.wall - l.ev[0].wall, sync = e.sync == 1, history = e.hist == 1,
           data = ffi.string(l.buf + e.off, e.len) }
end
--- The struct of event k (1-based; not checked): its fields without a table.
function List.ref(l, k) return l.ev[k - 1] end
--- Event k's value: its encoded bytes, copied out of the file's.
function List.data(l, k)
  local e = l.ev[k - 1]
  return ffi.string(l.buf + e.off, e.len)
end
--- How many of its events are history events (flag bit 1).
function List.history_count(l)
  local n = 0
  for k = 0, l.n - 1 do n = n + l.ev[k].hist end
  return n
end
function List.channel(l, i) return names[l.id].chans[i] end
function List.producer(l, i) return names[l.id].prods[i] end
--- Frees the file's bytes and the index now (else the GC does).
function List.free(l) list_mt.__gc(l) l.n = 0 end

-- Reads path whole into a malloc'd buffer: the list (n = 0), or nil, err.
local function load(path)
  local f = C.fopen(path, "rb")
  if f == nil then
    local h, err = io.open(path, "rb")   -- (the usual message)
    if h then h:close() end
    return nil, err or (path .. ": cannot open")
  end
  C.fseek(f, 0, 2)
  local size = tonumber(C.ftell(f))
  C.fseek(f, 0, 0)
  if size < 0 then C.fclose(f) return nil, path .. ": cannot read" end
  shared.nextid = shared.nextid + 1
  local l = ListT()
  l.id = shared.nextid
  names[l.id] = { chans = {}, prods = {} }
  l.buf = C.malloc(math.max(size, 1))
  if l.buf == nil then C.fclose(f) return nil, ("%s: no memory for its %d bytes"):format(path, size) end
  local got = tonumber(C.fread(l.buf, 1, size, f))
  C.fclose(f)
  l.size = got
  return l
end

-- Room for one more event in l (the array doubled when full); false when
-- out of memory.
local function grow(l)
  local cap = l.cap == 0 and 4096 or l.cap * 2
  local p = C.realloc(l.ev, cap * EVSIZE)
  if p == nil then return false end
  l.ev = ffi.cast("lecho_rec_ev *", p)
  l.cap = cap
  return true
end

--- Reads a whole file into an index of its events: { events = the list
-- (#events, events[k] a table { ch = short name, producer, seq, t
-- (seconds from the first event), wall (seconds since the epoch), sync,
-- data = encoded value }, events:ref(k) its struct, events:data(k) its
-- value), channels = { names }, producers = { names }, streams = { { ch,
-- producer, first_seq, first_wall, last_seq, last_wall } ... } (each
-- (channel, producer) in the order of its first event), sorted (the
-- events' times never go back), header, good (bytes up to the end of the
-- last whole record), size, damage = { { offset, bytes, why } ... } (bad
-- records with whole records after them: skipped, and read on from the
-- next whole record), unindexed (events after a damage whose header, channel or
-- producer record was in it: skipped, counted), torn (nil, or { offset,
-- bytes, why, damaged }: the tail that ends the file) }; or nil, err when
-- it is not a recording.  Memory: the file's size plus 40 bytes an event.
function M.scan(path)
  local l, err = load(path)
  if not l then return nil, err end
  local p, n = l.buf, l.size
  local magic_ok = n >= #M.MAGIC and ffi.string(p, #M.MAGIC) == M.MAGIC
  if not magic_ok then
    l:free()
    return nil, ("%s: not a lecho recording (no %q at its start)"):format(path, M.MAGIC:sub(1, -2))
  end
  local core = require "lecho.core"
  local nm = names[l.id]
  local out = { events = l, channels = nm.chans, producers = nm.prods, streams = {}, size = n, path = path,
                damage = {}, unindexed = 0, sorted = true, seq_sorted = true }
  local chan_id, prod_id = {}, {}   -- name -> index in out.channels / out.producers
  local stream_of = {}               -- ch * 2^24 + prod -> its entry in out.streams
  local chans, prods, created = {}, {}, nil   -- this segment's: varint index -> global index
  local o = #M.MAGIC                 -- 0-based offset of the record being read
  local why, short   -- short: the last record is cut short (set where that is found)
  local hidden       -- after a bad record: the 0-based offset of the next whole one (-1: not known)
  local memo = {}    -- the searches' chains and checksum budget, for the whole file
  local lastwall, lastseq = -math.huge, -1
  while o < n do
    why, short = nil, nil
    repeat   -- (a `break` out of this: the record at o is bad, `why`)
      if o + 8 > n then why, short = "a record header cut short", true break end
      local len = p[o] + p[o + 1] * 256 + p[o + 2] * 65536 + p[o + 3] * 16777216
      local crc = p[o + 4] + p[o + 5] * 256 + p[o + 6] * 65536 + p[o + 7] * 16777216
      if len == 0 or len > M.MAX_RECORD then why = ("a record length of %d"):format(len) break end
      if o + 8 + len > n then why, short = ("a record of %d bytes cut short"):format(len), true break end
      -- checked in place; nothing of an event is copied
      if tonumber(zlib.crc32(0, p + o + 8, len)) ~= crc then why = "a record whose checksum fails" break end
      local kind = p[o + 8]
      local lim = o + 8 + len
      if kind == 69 then   -- 'E'
        if not created then
          -- its segment's header was in a damage (third outside review #5:
          -- each event after a damaged file header was called damage, the
          -- last a torn tail): its time cannot be placed; counted with the
          -- events whose channel or producer record was lost, said once
          if #out.damage == 0 then why = "an event before any header" break end
          out.unindexed = out.unindexed + 1
          o = lim
          break
        end
        local c, pr, seq, us, j
        c, j = rd_varint_p(p, o + 9, lim)
        if c then pr, j = rd_varint_p(p, j, lim) end
        if pr then seq, j = rd_varint_p(p, j, lim) end
        if seq then us, j = rd_varint_p(p, j, lim) end
        if not us or j >= lim then why = "a bad event record" break end
        local gc, gp = chans[c], prods[pr]
        if not gc or not gp then
          -- its channel's or producer's record was lost in a damage: the
          -- event cannot be placed (counted); before any damage, the file
          -- is wrong here
          if #out.damage == 0 then why = "a bad event record" break end
          out.unindexed = out.unindexed + 1
        else
          if l.n == l.cap and not grow(l) then
            l:free()
            return nil, ("%s: no memory for the index of its events"):format(path)
          end
          local wall = created + us / 1e6
          local e = l.ev[l.n]
          e.wall, e.seq, e.off, e.len, e.ch, e.prod, e.sync = wall, seq, j + 1, lim - j - 1, gc, gp, p[j] % 2
          e.hist = math.floor(p[j] / 2) % 2
          l.n = l.n + 1
          if wall < lastwall then out.sorted = false end
          if seq < lastseq then out.seq_sorted = false end
          lastwall, lastseq = wall, seq
          local key = gc * 16777216 + gp
          local st = stream_of[key]
          if not st then
            st = { ch = nm.chans[gc], producer = nm.prods[gp], first_seq = seq, first_wall = wall }
            stream_of[key] = st
            out.streams[#out.streams + 1] = st
          end
          -- its history events (flag bit 1): the producer kept values
          -- (lecho.replay's producer of this stream keeps as many)
          if e.hist == 1 then st.history = (st.history or 0) + 1 end
          st.last_seq, st.last_wall = seq, wall
        end
      elseif kind == 72 then   -- 'H'
        local ok, h = core.decode(ffi.string(p + o + 9, len - 1))
        if not ok or type(h) ~= "table" or h.format ~= M.FORMAT or type(h.created) ~= "number" then
          why = "a header that is not format 1" break
        end
        out.header = out.header or h
        created, chans, prods = h.created, {}, {}
      elseif kind == 67 or kind == 80 then   -- 'C', 'P'
        local idx, j = rd_varint_p(p, o + 9, lim)
        if not idx then why = "a bad index" break end
        local t = kind == 67 and chans or prods
        -- an index given twice: a segment whose header was in a damage
        -- (a file never defines one twice in a segment): its own tables
        if t[idx] and #out.damage > 0 then chans, prods = {}, {} t = kind == 67 and chans or prods end
        local name = ffi.string(p + j, lim - j)
        local ids, list = kind == 67 and chan_id or prod_id, kind == 67 and nm.chans or nm.prods
        if not ids[name] then
          list[#list + 1] = name
          ids[name] = #list
        end
        t[idx] = ids[name]
      end
      -- other kinds: skipped (a later format's additions)
      o = lim
    until true
    if why then
      -- A bad record with a whole record after it (a length that fits, a
      -- capital kind, its checksum right, and headers chaining from it to
      -- the end of the file): damage, not a crash's doing.  It is skipped,
      -- said, and the reading goes on at that record (issue 29 F1: the
      -- intact records after a flipped byte were dropped).
      hidden = o + 9 <= n and whole_record_after(p, n, o + 1, memo) or nil
      if not hidden or hidden < 0 then break end
      out.damage[#out.damage + 1] = { offset = o, bytes = hidden - o, why = why }
      o = hidden
    end
  end
  out.good = o
  if o < n then
    out.torn = { offset = o, bytes = n - o, why = why }
    -- A crash leaves a last record cut short (or, after a power loss, a
    -- tail of zeros).  A whole record that is wrong with bytes after it is
    -- damage, not a torn tail: nothing cut it (M.cut refuses).
    local zeros = true
    for q = o, n - 1 do if p[q] ~= 0 then zeros = false break end end
    local len = o + 8 <= n and p[o] + p[o + 1] * 256 + p[o + 2] * 65536 + p[o + 3] * 16777216 or nil
    local sane = len and len > 0 and len <= M.MAX_RECORD
    local last = sane and o + 8 + len >= n  -- the bad record ends the file
    if hidden then   -- (-1: the search gave up)
      out.torn.why = out.torn.why .. ", and no telling whether whole records follow it"
    end
    out.torn.damaged = (hidden and true or not (short or zeros or last)) or nil
  end
  -- (kept apart from the list: `replay --check` frees each file's list once read)
  out.first_wall = l.n > 0 and l.ev[0].wall or nil
  out.last_wall = l.n > 0 and l.ev[l.n - 1].wall or nil
  out.duration = l.n > 0 and out.last_wall - out.first_wall or 0
  return out
end

--- { { ch, producer, after, next, missing, at } ... }: where the sequence
-- numbers of one (channel, producer) jump in events (a scan's list, or a
-- list of tables { ch, producer, seq, wall } in file order): events lost
-- between them (a record removed, or never recorded), at (the index in
-- events of the event after the gap), and { ... backwards = true } where
-- they go back in time too (files given in the wrong order; back in seq
-- only is a producer that restarted).  The first seq of each is not a gap
-- (a recorder may start late).  state (optional, a table): where each
-- (channel, producer) was, kept from one call to the next, so the events
-- of files given one after the other are checked across them.
function M.gaps(events, state)
  local last = state or {}
  local out = {}
  local function check(k, ch, producer, seq, wall, l)
    -- (a seq going back while time goes on: the producer restarted, on
    -- the same address, its seqs from 1 again; not a gap)
    if seq ~= l.seq + 1 and not (seq <= l.seq and wall >= l.wall) then
      out[#out + 1] = { ch = ch, producer = producer, after = l.seq, next = seq, at = k,
                        missing = seq > l.seq and seq - l.seq - 1 or 0, backwards = seq <= l.seq or nil }
    end
  end
  if type(events) == "table" then
    for k, e in ipairs(events) do
      local key = e.ch .. "\0" .. e.producer
      local l = last[key]
      if l then check(k, e.ch, e.producer, e.seq, e.wall, l) else l = {} last[key] = l end
      l.seq, l.wall = e.seq, e.wall
    end
    return out
  end
  -- a scan's list: its structs read in place, one state table per stream
  local local_of = {}
  local ev = events.ev
  for k = 1, events.n do
    local e = ev[k - 1]
    local nk = e.ch * 16777216 + e.prod
    local l = local_of[nk]
    if not l then
      local key = events:channel(e.ch) .. "\0" .. events:producer(e.prod)
      l = last[key]
      if not l then l = { first = true } last[key] = l end
      local_of[nk] = l
    end
    if l.first then l.first = nil
    elseif e.seq ~= l.seq + 1 then
      check(k, events:channel(e.ch), events:producer(e.prod), e.seq, e.wall, l)
    end
    l.seq, l.wall = e.seq, e.wall
  end
  return out
end

--- nil, or why files (scans, in the order given) are not in the order
-- they were written: a (channel, producer) whose sequence numbers go back
-- from one file to the next (issue 29 F8: `FILE FILE.1 FILE.2` replayed
-- newest first, its duration negative), or a file whose events all come
-- before the previous file's first one.  (From each scan's streams: the
-- first and last event of each (channel, producer).)
function M.order(scans)
  local last, lastwall = {}, nil
  for _, r in ipairs(scans) do
    for _, s in ipairs(r.streams) do
      local l = last[s.ch .. "\0" .. s.producer]
      -- (seqs back while time goes on: a producer restarted on the same
      -- address, its seqs from 1 again)
      if l and s.first_seq <= l.seq and s.first_wall < l.wall then
        return ("%s holds %s's events on %s from seq %d, and %s (given before it) up to seq %d: give a"
                .. " rotated set oldest first (FILE.2 FILE.1 FILE)"):format(r.path, s.producer, s.ch, s.first_seq,
                l.path, l.seq)
      end
    end
    for _, s in ipairs(r.streams) do
      last[s.ch .. "\0" .. s.producer] = { seq = s.last_seq, wall = s.last_wall, path = r.path }
    end
    if r.first_wall then
      local first, final = r.first_wall, r.last_wall
      if lastwall and final < lastwall.wall then
        return ("%s ends (%.3f) before %s (given before it) begins (%.3f): give a rotated set oldest first"
                .. " (FILE.2 FILE.1 FILE)"):format(r.path, final, lastwall.path, lastwall.wall)
      end
      lastwall = { wall = first, path = r.path }
    end
  end
  return nil
end

--- Truncates path to its whole records (a torn tail cut).  Returns the
-- scan, or nil, err.
function M.cut(path)
  local r, err = M.scan(path)
  if not r then return nil, err end
  local d = r.damage[1] or (r.torn and r.torn.damaged and r.torn)
  if d then
    r.events:free()
    return nil, ("%s: a damaged record at byte %d (%s) with %d bytes after it: not a torn tail, not cut"
                 .. " (the whole records replay; copy the file before changing it)")
                :format(path, d.offset, d.why, r.size - d.offset)
  end
  if r.torn then
    if ffi.C.truncate(path, r.good) ~= 0 then return nil, ("%s: cannot truncate"):format(path) end
  end
  return r
end

---------------------------------------------------------------------------
-- Writing
---------------------------------------------------------------------------

local Writer = {}
Writer.__index = Writer

local function exists(p)
  local f = io.open(p, "rb")
  if f then f:close() return true end
end

--- A writer of path: opts.max_bytes (>= MIN_MAX_BYTES; a file holds at
-- most that many bytes, or its header and one event when that event alone
-- takes it past; rotation past it: path -> path.1 ->
-- ... -> path.KEEP, the oldest dropped), opts.keep (default 3), opts.append
-- (go on after what a file holds, its torn tail cut; else an existing file
-- is refused), opts.recorder (a name for the header).
function M.writer(path, opts)
  opts = opts or {}
  if opts.max_bytes and opts.max_bytes < M.MIN_MAX_BYTES then
    return nil, ("--max-bytes %d is below %d: a file holds its header and at least one event")
                :format(opts.max_bytes, M.MIN_MAX_BYTES)
  end
  local w = setmetatable({ path = path, max = opts.max_bytes, keep = opts.keep or 3, recorder = opts.recorder,
                           events = 0, bytes = 0, rotations = 0 }, Writer)
  if exists(path) then
    if not opts.append then return nil, ("%s exists (--append goes on after it)"):format(path) end
    local r, err = M.cut(path)
    if not r then return nil, err end
    w.cut = r.torn
    -- the scan's events (the whole file's bytes and 40 bytes an event) are
    -- not needed past here: freed now, not whenever the GC comes (it does
    -- not count malloc'd memory: a recorder held a 40 MB file's scan for
    -- its whole run; make asan saw it at os.exit)
    r.events:free()
  end
  local ok, err = w:_open()
  if not ok then return nil, err end
  return w
end

function Writer:_open()
  local fresh = not exists(self.path)
  local f, err = io.open(self.path, "ab")
  if not f then return nil, err end
  f:setvbuf("full", 64 * 1024)
  self.f = f
  self.size = fresh and 0 or f:seek("end")
  if fresh then
    f:write(M.MAGIC)
    self.size = #M.MAGIC
    -- (counted: the summary's bytes are the files' bytes, as --check says
    -- them; third outside review #6 found them 10 short)
    self.bytes = self.bytes + #M.MAGIC
  end
  self:_segment()
  return true
end

-- A segment: header, then its own channel and producer tables (and no
-- event yet: an event larger than max_bytes goes into it, not into
-- another rotation, and another, for ever).
function Writer:_segment()
  self.chans, self.prods, self.nchan, self.nprod = {}, {}, 0, 0
  self.events_in_segment = nil
  self.created = floor(M.wall())
  local core = require "lecho.core"
  local h = assert(core.encode({ format = M.FORMAT, created = self.created, recorder = self.recorder,
                                 fields = M.FIELDS }))
  self.header = record("H" .. h)
  self:_put(self.header)
end

function Writer:_put(rec)
  self.f:write(rec)
  self.size = self.size + #rec
  self.bytes = self.bytes + #rec
end

function Writer:_rotate()
  self.f:close()
  for k = self.keep, 1, -1 do
    local from = k == 1 and self.path or (self.path .. "." .. (k - 1))
    if exists(from) then os.rename(from, self.path .. "." .. k) end
  end
  self.rotations = self.rotations + 1
  return self:_open()
end

--- Appends one event: short channel name, producer name, seq, wall time
-- (seconds since the epoch), sync, the encoded value as it came, hist (it
-- came from the producer's history: flag bit 1).
function Writer:event(ch, producer, seq, wall, sync, data, hist)
  local body = "E"
  local c = self.chans[ch]
  local pre = ""
  if not c then
    self.nchan = self.nchan + 1
    c = self.nchan
    self.chans[ch] = c
    pre = record("C" .. varint(c) .. ch)
  end
  local p = self.prods[producer]
  if not p then
    self.nprod = self.nprod + 1
    p = self.nprod
    self.prods[producer] = p
    pre = pre .. record("P" .. varint(p) .. producer)
  end
  local us = math.max(0, floor((wall - self.created) * 1e6 + 0.5))
  -- the value's bytes are written as they are: the checksum runs over the
  -- head, then on over them (no copy of the value)
  local head = body .. varint(c) .. varint(p) .. varint(seq) .. varint(us)
               .. char((sync and M.SYNC or 0) + (hist and M.HISTORY or 0))
  local len = #head + #data
  if self.max and self.size + #pre + 8 + len > self.max and self.events_in_segment then
    local ok, err = self:_rotate()
    if not ok then return nil, err end
    return self:event(ch, producer, seq, wall, sync, data, hist)
  end
  if pre ~= "" then self:_put(pre) end
  local f = self.f
  f:write(u32(len), u32(M.crc32(data, M.crc32(head))), head, data)
  self.size = self.size + 8 + len
  self.bytes = self.bytes + 8 + len
  self.events = self.events + 1
  self.events_in_segment = true
  return true
end

function Writer:flush() if self.f then self.f:flush() end end

function Writer:close()
  if self.f then
    self.f:close()
    self.f = nil
  end
end

---------------------------------------------------------------------------
-- Recording channels
---------------------------------------------------------------------------

--- Reads a --history value: "none" (or nil) nil, "last" "last", a count
-- N from 1 to lecho.history's MAX_N (1024, what ch:consumer takes) N;
-- else nil, why (checked before the file is made: issue 29, third outside
-- review #3, --history 2000 left a header-only file and a traceback).
function M.history_opt(v)
  if v == nil or v == "none" then return nil end
  if v == "last" then return "last" end
  local n = tonumber(v)
  local max = require("lecho.history").MAX_N
  if n and n >= 1 and n <= max and n % 1 == 0 then return n end
  return nil, ("--history needs N (1 to %d), last or none, not '%s'"):format(max, tostring(v))
end

--- Records channels `names` (short names or full ones) of ctx into writer
-- w: one consumer per channel in raw mode (ctx:raw: the bytes as they
-- came, not decoded; every consumer of those channels in ctx gets bytes,
-- so a recorder has its own context).  opts.limit: write no more than that
-- many events (those after are counted in r.refused; a sync one's producer
-- hears "not recorded").  opts.history ("last" | N, as ch:consumer takes
-- it; nil: none): each channel is joined with history, so the last values
-- its producers kept are recorded first (issue 29 F7: a recording held
-- no settings when nobody steered during it), with their own producer and
-- sequence numbers and flag bit 1 (M.HISTORY); the consumer's catch-up
-- (lecho.history) puts the seam between them and the live events, no gap,
-- no duplicate.  Returns the recorder { stop() } or nil, err.
function M.record(ctx, names, w, opts)
  opts = opts or {}
  if opts.direct then return M.record_direct(ctx, names, w, opts) end
  local r = { w = w, cons = {}, events = 0, limit = opts.limit, refused = 0 }
  local gettime = M.wall
  for _, name in ipairs(names) do
    local ch, err, code = ctx:channel(name)
    if not ch then return nil, err, code end
    ctx.c:raw(ch.chid, true)
    ch.raw_bytes = true   -- (history entries given as bytes too: lecho.history)
    local short = ch.short
    local con
    con, err, code = ch:consumer(function(data, meta)
      -- (handed to the C sink, M.record_direct: it takes the events, as
      -- the direct path's own empty handler never runs)
      if not w.f then return end
      -- past opts.limit (--count): not written, though the rest of the
      -- batch that brought the last one still comes; a sync producer is
      -- told its event was not recorded (the handler's error is its ack's)
      if r.limit and r.events >= r.limit then
        r.refused = r.refused + 1
        if meta.sync then error(("recorder stopped after %d events: not recorded"):format(r.limit), 0) end
        return
      end
      local ok, werr = w:event(short, meta.producer, meta.seq, gettime(), meta.sync == true, data,
                               meta.history == true)
      if not ok then
        if opts.on_error then opts.on_error(werr) end
        return
      end
      r.events = r.events + 1
      if opts.on_event then opts.on_event(r) end
    end, opts.history and { history = opts.history } or nil)
    if not con then
      for _, c in ipairs(r.cons) do c:close() end
      return nil, err, code
    end
    r.cons[#r.cons + 1] = con
  end
  -- written at least every 50 ms: a kill loses at most that much, a torn
  -- last record at worst
  r.timer = ctx:every(0.05, function() w:flush() end)
  function r.stop()
    if r.timer then r.timer:stop() r.timer = nil end
    for _, c in ipairs(r.cons) do c:close() end
    w:flush()
  end
  return r
end

-- Is any consumer of r still waiting for a producer's history (its answer
-- late: lecho.history M.late)?
local function catching_up(r)
  for _, c in ipairs(r.cons) do
    local st = c.hist_state
    if st and (not st.fetched or (st.late or 0) > 0) then return true end
  end
  return false
end

--- The same, written from C (core/binding/lua_rsink.c): the events never enter
-- Lua, so the recorder keeps up with a producer at full rate.  No
-- per-event callback (opts.on_event is not called); w's counts are set by
-- stop().  With opts.history the channels are joined by M.record (the
-- catch-up, its seam and the history entries in Lua, written by w), and
-- handed to the C sink once every history came (or was given up): the
-- sink then appends to the same file, after a fresh segment header when w
-- wrote events (the sink keeps its own channel and producer tables).
function M.record_direct(ctx, names, w, opts)
  local r = { w = w, cons = {} }
  local lua_r
  if opts.history then
    local err, code
    lua_r, err, code = M.record(ctx, names, w, { history = opts.history, on_error = opts.on_error })
    if not lua_r then return nil, err, code end
    r.cons = lua_r.cons
  end
  local reported
  local function tick()
    ctx.c:rsink_flush()
    local _, _, _, serr = ctx.c:rsink_stats()
    if serr and not reported then
      reported = true
      if opts.on_error then opts.on_error(serr) end
    end
  end
  -- the file to the C sink, and each channel's events with it (no loop
  -- turn between: nothing comes in between to be written by neither)
  local function handover()
    if lua_r then
      lua_r.timer:stop()
      lua_r.timer = nil
      if w.events_in_segment then w:_segment() end
    end
    w:flush()
    w.f:close()
    w.f = nil
    local ok, err = ctx.c:rsink_open(w.path, M.MAGIC .. w.header, w.created, w.max or 0, w.keep)
    if not ok then return nil, err end
    r.sink = true
    for _, c in ipairs(r.cons) do ctx.c:rsink_channel(c.ch.chid, c.ch.short) end
    r.timer = ctx:every(0.05, tick)
    return true
  end
  local function stop_all()
    for _, c in ipairs(r.cons) do c:close() end
    if r.sink then ctx.c:rsink_close() end
  end
  if not lua_r then
    local ok, err = handover()
    if not ok then return nil, err end
    for _, name in ipairs(names) do
      local ch, cerr, code = ctx:channel(name)
      if not ch then stop_all() return nil, cerr, code end
      ctx.c:rsink_channel(ch.chid, ch.short)
      ctx.c:raw(ch.chid, true)
      local con
      con, cerr, code = ch:consumer(function() end)   -- (never runs: the sink takes the events)
      if not con then stop_all() return nil, cerr, code end
      r.cons[#r.cons + 1] = con
    end
  elseif not catching_up(r) then
    local ok, err = handover()
    if not ok then lua_r.stop() return nil, err end
  else
    -- a producer's history is late: the Lua recorder writes on (holding
    -- that producer's events, as any consumer with history does) until it
    -- came or was given up
    r.wait = ctx:every(0.05, function()
      w:flush()
      if catching_up(r) then return end
      r.wait:stop()
      r.wait = nil
      local ok, err = handover()
      if not ok and opts.on_error then opts.on_error(err) end
    end)
  end
  function r.stop()
    if r.wait then r.wait:stop() r.wait = nil end
    if r.timer then r.timer:stop() r.timer = nil end
    if not r.sink then
      if lua_r then lua_r.stop() end
      return
    end
    for _, c in ipairs(r.cons) do c:close() end
    local ev, by, rot = ctx.c:rsink_stats()
    if ev then
      w.events, w.bytes, w.rotations = w.events + ev, w.bytes + by, w.rotations + rot
    end
    ctx.c:rsink_close()
  end
  return r
end

return M
