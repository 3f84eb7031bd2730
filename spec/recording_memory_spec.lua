-- A recording's scan (the file's bytes and 40 bytes an event, malloc'd by
-- lecho.recording through the FFI) is freed as soon as its owner is done
-- with it, not whenever the GC comes: the GC does not count malloc'd
-- memory, and a process that ends by os.exit never runs the finalizer.
-- make asan on 874af8a: 25 LeakSanitizer reports of `lecho replay`, `lecho
-- record --append` and the REPL's replay() at exit, 13 KB to 59 MB each
-- (the scan of the file appended to was held for the recorder's whole run).
-- The scans alive are counted in lecho.recording's registry table (an
-- entry a list, dropped when it is freed), with the GC stopped.
local S = require "spec.support"
local lecho = require "lecho"
local recording = require "lecho.recording"
local replay = require "lecho.replay"

local function live()
  local n = 0
  for _ in pairs(debug.getregistry()["lecho.recording"].names) do n = n + 1 end
  return n
end

local function recorded(n)
  local file = S.tmpname("mem") .. ".lecho"
  local w = assert(recording.writer(file, {}))
  local t = recording.wall()
  for i = 1, n do
    assert(w:event("mem", "127.0.0.1:1#1", i, t + i / 1000, false, assert(lecho.encode({ i = i }))))
  end
  w:close()
  return file
end

describe("a recording's scan", function()
  local ctx
  setup(function() ctx = lecho.context{ quiet = true } end)
  teardown(function()
    collectgarbage("restart")
    ctx:close()
    S.cleanup()
  end)
  before_each(function() collectgarbage("collect") collectgarbage("stop") end)
  after_each(function() collectgarbage("restart") end)

  it("is freed by the writer that goes on after a file (record --append) once it has cut the file", function()
    local file = recorded(200)
    local before = live()
    local w = assert(recording.writer(file, { append = true }))
    assert.are.equal(before, live(), "the scan of the file appended to is still held")
    w:close()
  end)

  it("is freed when a replay is closed; the closed replay then refuses step and seek, and says its status",
     function()
    local file = recorded(200)
    local before = live()
    local rp = assert(replay.new(ctx, file, { paused = true, rename = { mem = "mem.none" } }))
    assert.are.equal(before + 1, live())
    assert(rp:step(3))
    rp:close()
    assert.are.equal(before, live(), "a closed replay still holds its files' bytes")
    assert.is_nil(rp:event(1))
    local ok, err = rp:step()
    assert.is_nil(ok)
    assert.are.equal("replay is closed", err)
    ok, err = rp:seek{ t = 0 }
    assert.is_nil(ok)
    assert.are.equal("replay is closed", err)
    local st = rp:status()
    assert.are.equal(200, st.total)
    assert.are.equal(4, st.pos)
    assert.are.equal(3, st.sent)
  end)

  it("is freed at once when a file holds no event (a header alone)", function()
    local file = recorded(0)
    local before = live()
    local rp = assert(replay.new(ctx, file, { paused = true }))
    assert.are.equal(before, live(), "the scan of an empty file is held")
    assert.are.equal(0, rp:status().total)
    rp:close()
  end)

  it("is freed when a replay is refused (files out of order, a rename of a channel not recorded)", function()
    local file = recorded(50)
    local before = live()
    local rp, err = replay.new(ctx, { file, file }, { paused = true })
    assert.is_nil(rp)
    assert.truthy(err)
    assert.are.equal(before, live(), "refused (" .. tostring(err) .. "): its scans still held")
    rp, err = replay.new(ctx, file, { paused = true, rename = { nosuch = "x" } })
    assert.is_nil(rp)
    assert.matches("no channel 'nosuch'", err)
    assert.are.equal(before, live())
  end)
end)
