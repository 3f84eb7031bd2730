-- lecho-gateway (doc/gateway.md; README.md's "In a browser" commands) against real processes: a name server, the
-- atmosphere simulation and gateways, each its own process.  The clients are
-- this spec's own: a WebSocket client written from RFC 6455 over luasocket
-- and a JSON-lines client (spec/support/wsclient.lua).  Hostile clients (a
-- huge frame, a bad handshake, a slow reader, one that never reads) must
-- cost one connection only; keyed mode refuses what it must.
local cjson = require "cjson"
local socket = require "socket"
local S = require "spec.support"
local P = require "spec.support.proc"
package.path = S.root .. "/spec/support/?.lua;" .. package.path
local W = require "wsclient"

-- (for 120 s times S.SLOW, a bound for a stray one, S.cleanup ends it
-- before: under make asan at load 13-18, asan7, this file ran 166 s and its
-- last cases found the gateway gone: "attempt to index local 'r' (a nil
-- value)" for a reply, no WebSocket connection)
local function gateway(ns, args)
  local child = S.spawn(("%s %s/scripts/lecho-gateway --nameserver %s --http 127.0.0.1:0 --lines 127.0.0.1:0 --for %d %s")
    :format(S.luajit, S.root, ns, 120 * S.SLOW, args or ""))
  local line = P.wait_file(child.err, "lecho%-gateway: http://[%d.]+:%d+/.-JSON lines on [%d.]+:%d+", 20)
  assert(line, "gateway did not start: " .. S.errors(child))
  local hp = line:match("lecho%-gateway: http://[%d.]+:(%d+)/")
  local lp = line:match("JSON lines on [%d.]+:(%d+)")
  return child, tonumber(hp), tonumber(lp)
end

local function sim(ns, args)
  local c = S.spawn(("%s %s/examples/atmosphere/simulation.lua --nameserver %s --quiet %s")
    :format(S.luajit, S.root, ns, args))
  return c
end

-- The next event of channel ch on client c (replies and notices skipped).
local function next_event(c, ch, timeout)
  local deadline = socket.gettime() + (timeout or 10)
  while socket.gettime() < deadline do
    local m, e = c:json(math.max(0.05, deadline - socket.gettime()))
    if not m then return nil, e end
    if m.ch == ch and m.ev ~= nil then return m.ev, m end
  end
  return nil, "timeout"
end

-- The reply with id on client c (events skipped).
local function reply(c, id, timeout)
  local deadline = socket.gettime() + (timeout or 10)
  while socket.gettime() < deadline do
    local m, e, code, reason = c:json(math.max(0.05, deadline - socket.gettime()), true)
    if not m then return nil, e, code, reason end
    if m.id == id then return m end
  end
  return nil, "timeout"
end

-- pred() until true or timeout seconds pass (polled every `step` s).
local function until_(pred, timeout, step)
  local deadline = socket.gettime() + timeout
  repeat
    local v = pred()
    if v then return v end
    if step and step > 0 then socket.sleep(step) end
  until socket.gettime() > deadline
  return nil
end

local function ws(port, opts)
  local c, e, head = W.connect("127.0.0.1", port, opts)
  if not c then return nil, e, head end
  local hello = assert(c:json(5))
  return c, hello
end

-- A WebSocket client of the gateway (http port hp) subscribed to channel
-- ch, and a JSON-lines client (port lp), its greeting read: returns both.
local function sub_and_lines(hp, lp, ch)
  local c = assert(ws(hp))
  c:send_json{ op = "sub", id = 1, ch = ch }
  assert.is_true(reply(c, 1).ok)
  local l = assert(W.lines("127.0.0.1", lp))
  assert(l:json())
  return c, l
end

-- Sends the request text req over JSON lines (l), then over WebSocket (c),
-- and calls check(r) on the reply each one gets (within 5 s).
local function ask_both(l, c, req, check)
  l:send_raw(req .. "\n")
  check(assert(l:json(5, true)))
  c:send_text(req)
  check(assert(c:json(5, true)))
end

describe("lecho-gateway", function()
  local ns, gw, hp, lp
  lazy_setup(function()
    local _
    _, ns = S.nameserver("--quiet")
    sim(ns, ("--seconds %d --rate 20 --grid 2x18x36"):format(200 * S.SLOW))
    gw, hp, lp = gateway(ns, "--max-queued 200000 --max-message 4096 --max-subs 3")
  end)
  lazy_teardown(function() S.cleanup() end)

  it("serves a WebSocket client: hello, list, sub, events, sync pub applied by the simulation, unsub", function()
    local c, hello = ws(hp)
    assert.truthy(c, hello)
    assert.are.equal("lecho-gateway", hello.hello)
    assert.are.equal(4096, hello.limits.message)
    local names
    assert.truthy(until_(function()
      c:send_json{ op = "list", id = 1 }
      local r = reply(c, 1)
      names = {}
      for _, x in ipairs(r.result) do names[x.channel] = x end
      return names["atmosphere.field"] and names["atmosphere.steer"]
    end, 20, 0.2))
    assert.are.equal(1, names["atmosphere.field"].producers)
    c:send_json{ op = "sub", id = 2, ch = "atmosphere.field" }
    assert.is_true(reply(c, 2).ok)
    local ev, msg = next_event(c, "atmosphere.field")
    assert.truthy(ev, msg)
    -- the field, a <f8 array, in a binary frame (doc/gateway.md "Arrays"):
    -- dtype, shape, the elements raw at an offset a multiple of 8
    assert.is_true(msg.binary)
    assert.are.equal("<f8", ev.field.dtype)
    assert.are.same({ 2, 18, 36 }, ev.field.shape)
    assert.are.equal(2 * 18 * 36, #ev.field.data)
    assert.are.equal(2 * 18 * 36 * 8, #ev.field.raw)
    assert.truthy(ev.field.data[1] > 0 and ev.field.data[1] == ev.field.data[1])
    assert.are.equal(18, ev.nlat)
    -- steering: true only once the simulation's handler ran, and applied
    c:send_json{ op = "pub", id = 3, ch = "atmosphere.steer", data = { emission = 7.25 }, sync = true }
    local r = reply(c, 3)
    assert.is_true(r.ok, cjson.encode(r))
    assert.truthy(until_(function()
      local e = next_event(c, "atmosphere.field", 5)
      return e and e.emission == 7.25
    end, 10, 0))
    -- the simulation's handler raises on a bad setting: the error comes back
    c:send_json{ op = "pub", id = 4, ch = "atmosphere.steer", data = { nosuch = 1 }, sync = true }
    r = reply(c, 4)
    assert.is_nil(r.ok)
    assert.matches("unknown setting 'nosuch'", r.error)
    c:send_json{ op = "unsub", id = 5, ch = "atmosphere.field" }
    assert.is_true(reply(c, 5).ok)
    c:send_json{ op = "clients", id = 6 }
    r = reply(c, 6)
    local me
    for _, x in ipairs(r.result) do if x.you then me = x end end
    assert.truthy(me.events > 0 and me.bytes > 0)
    -- after the unsub's reply, no more events
    local m = c:json(0.5)
    assert.is_true(m == nil or m.ev == nil)
    c:close()
  end)

  it("serves a JSON-lines client: sub with a modulator runs at the producer, pub reaches a WebSocket subscriber", function()
    local l = assert(W.lines("127.0.0.1", lp))
    assert.are.equal("lecho-gateway", l:json().hello)
    l:send_json{ op = "sub", id = 1, ch = "atmosphere.field",
                 modulator = "function enqueue(ev) emit{ step = ev.step, n = #ev.field } end" }
    assert.is_true(reply(l, 1, 20).ok)
    local ev = assert(next_event(l, "atmosphere.field"))
    assert.are.same({ "n", "step" }, (function() local k = {} for n in pairs(ev) do k[#k + 1] = n end table.sort(k) return k end)())
    assert.are.equal(2 * 18 * 36, ev.n)
    -- an array to a lines client (no binary there): JSON { dtype, shape, data },
    -- the same event a WebSocket client of the channel gets in a binary frame
    local l2 = assert(W.lines("127.0.0.1", lp))
    l2:json()
    l2:send_json{ op = "sub", id = 1, ch = "atmosphere.field" }
    assert.is_true(reply(l2, 1, 20).ok)
    local fe = assert(next_event(l2, "atmosphere.field"))
    assert.are.equal("<f8", fe.field.dtype)
    assert.are.same({ 2, 18, 36 }, fe.field.shape)
    assert.are.equal(2 * 18 * 36, #fe.field.data)
    l2:close()
    -- a lines client publishes, a WebSocket client receives
    local c = ws(hp)
    c:send_json{ op = "sub", id = 1, ch = "gw.test" }
    assert.is_true(reply(c, 1).ok)
    l:send_json{ op = "pub", id = 2, ch = "gw.test", data = { hello = "from a device", n = 3 }, sync = true }
    local r = reply(l, 2)
    assert.is_true(r.ok, cjson.encode(r))
    local got = assert(next_event(c, "gw.test"))
    assert.are.same({ hello = "from a device", n = 3 }, got)
    -- unknown op, not JSON: an error reply, the connection goes on
    l:send_raw("this is not json\n")
    assert.matches("not a JSON object", l:json(5, true).error)
    l:send_json{ op = "frobnicate", id = 9 }
    assert.matches("unknown op", reply(l, 9).error)
    l:close()
    c:close()
  end)

  -- review 4: a subscription whose modulator failed kept its slot (listed by
  -- clients, counted against --max-subs, a corrected sub "already subscribed")
  it("a failed modulator's subscription frees its slot: a corrected sub works", function()
    local l = assert(W.lines("127.0.0.1", lp))
    l:json()
    l:send_json{ op = "sub", id = 1, ch = "atmosphere.field",
                 modulator = "function enqueue(ev) error('broken on purpose ' .. tostring(ev.step)) end" }
    local r = reply(l, 1, 20)
    local notice = r and r.error and r or nil
    if not notice then
      assert.is_true(r and r.ok, cjson.encode(r))
      local deadline = socket.gettime() + 15
      while not notice and socket.gettime() < deadline do
        local m = l:json(1, true)
        if m and m.ch == "atmosphere.field" and m.code == "modulator" then notice = m end
      end
    end
    assert(notice, "no failure notice")
    assert.matches("broken on purpose", notice.error)
    l:send_json{ op = "clients", id = 2 }
    local cr = assert(reply(l, 2))
    for _, c in ipairs(cr.result) do
      if c.you then assert.are.same({}, c.subs) end
    end
    l:send_json{ op = "sub", id = 3, ch = "atmosphere.field",
                 modulator = "function enqueue(ev) emit{ step = ev.step, fixed = true } end" }
    r = reply(l, 3, 20)
    assert.is_true(r and r.ok, cjson.encode(r or {}))
    local ev = assert(next_event(l, "atmosphere.field", 20))
    assert.is_true(ev.fixed)
    l:close()
  end)

  -- review 4 (blocker): after one client's modulator F failed, every later
  -- client subscribing with F got {"ok":true} and then nothing
  it("a client subscribing with the source of a modulator that failed gets its events", function()
    local F = "-- review4-shared\nlocal n = 0\nfunction enqueue(ev) n = n + 1 if n == 2 then error('second event') end emit{ step = ev.step, n = n } end"
    local a = assert(W.lines("127.0.0.1", lp)); a:json()
    local b = assert(W.lines("127.0.0.1", lp)); b:json()
    a:send_json{ op = "sub", id = 1, ch = "atmosphere.field", modulator = F }
    assert.is_true(reply(a, 1, 20).ok)
    local notice
    local deadline = socket.gettime() + 15
    while not notice and socket.gettime() < deadline do
      local m = a:json(1, true)
      if m and m.code == "modulator" then notice = m end
    end
    assert(notice, "a's modulator did not fail")
    b:send_json{ op = "sub", id = 1, ch = "atmosphere.field", modulator = F }
    local r = reply(b, 1, 20)
    assert.is_true(r and r.ok, cjson.encode(r or {}))
    -- (10 s times S.SLOW: the gateway's install of b's modulator and the
    -- producer's are their own work; under make asan at load 13-18, asan7,
    -- 10 s ended first.  What else b was told is said: a notice of a's
    -- failure would be the review 4 bug back, not a margin)
    local ev, told = nil, {}
    local deadline = socket.gettime() + 10 * S.SLOW
    while not ev and socket.gettime() < deadline do
      local m = b:json(math.max(0.05, deadline - socket.gettime()))
      if not m then break end
      if m.ch == "atmosphere.field" and m.ev ~= nil then ev = m.ev else told[#told + 1] = cjson.encode(m) end
    end
    assert(ev, "b: ok, then nothing; told: " .. table.concat(told, " "))
    assert.are.equal(1, ev.n)       -- a fresh instance
    a:close(); b:close()
  end)

  it("a huge frame, a too long line and bad handshakes cost their connection only", function()
    local good = ws(hp)
    good:send_json{ op = "sub", id = 1, ch = "atmosphere.field" }
    assert.is_true(reply(good, 1).ok)
    -- a frame claiming 1 GiB: closed with 1009 (message too big) before it is read
    local c = ws(hp)
    c.s:send(c:frame(true, 1, "", { len = 2 ^ 30 }) .. ("z"):rep(1000))
    local op, code = c:recv(5)
    assert.are.equal(8, op)
    assert.are.equal(1009, code)
    -- a text message over --max-message (4096) in two fragments
    c = ws(hp)
    c:send_frame(false, 1, ("x"):rep(3000))
    c:send_frame(true, 0, ("x"):rep(3000))
    local reason
    op, code, reason = c:recv(5)
    assert.are.equal(8, op)
    assert.are.equal(1009, code)
    assert.matches("message over 4096 bytes", reason)   -- a reason, as doc/gateway.md says (review N1)
    -- an unmasked client frame: a protocol error (1002), and why
    c = ws(hp)
    c:send_frame(true, 1, '{"op":"list"}', { mask = false })
    op, code, reason = c:recv(5)
    assert.are.equal(8, op)
    assert.are.equal(1002, code)
    assert.matches("must be masked", reason)
    -- a continuation frame with no message begun: 1002, and why
    c = ws(hp)
    c:send_frame(true, 0, "x")
    op, code, reason = c:recv(5)
    assert.are.equal(1002, code)
    assert.matches("continuation frame outside", reason)
    -- a JSON line past the limit: told, closed
    local l = assert(W.lines("127.0.0.1", lp))
    l:json()
    l:send_raw(("y"):rep(10000))
    local m = l:json(5)
    assert.matches("over 4096 bytes", m.error)
    assert.is_nil(l:json(2))
    -- bad handshakes: each its HTTP refusal
    local _, status = W.connect("127.0.0.1", hp, { raw_request = "GARBAGE\r\n\r\n" })
    assert.matches("^HTTP/1.1 400", status)
    _, status = W.connect("127.0.0.1", hp, { raw_request = "GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n\r\n" })
    assert.matches("^HTTP/1.1 400", status)
    _, status = W.connect("127.0.0.1", hp, { raw_request = "GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 8\r\n\r\n" })
    assert.matches("^HTTP/1.1 426", status)
    _, status = W.connect("127.0.0.1", hp, { headers = { "Origin: http://evil.example" } })
    assert.matches("^HTTP/1.1 403", status)
    _, status = W.connect("127.0.0.1", hp, { raw_request = "GET / HTTP/1.1\r\nHost: x\r\n" .. ("X-Pad: " .. ("p"):rep(100) .. "\r\n"):rep(100) })
    assert.matches("^HTTP/1.1 431", status)
    -- a whole head over 8 KiB that comes in one read (review 4): 431 too
    _, status = W.connect("127.0.0.1", hp, { raw_request = "GET / HTTP/1.1\r\nHost: x\r\n" .. ("X-Pad: " .. ("p"):rep(100) .. "\r\n"):rep(90) .. "\r\n" })
    assert.matches("^HTTP/1.1 431", status)
    -- HEAD: the head GET would get, no body (RFC 9110 9.3.2; review 4);
    -- another method: 405 with Allow
    local function raw(req)
      local t = socket.tcp()
      t:settimeout(5)
      assert(t:connect("127.0.0.1", hp))
      t:send(req)
      local d, _, part = t:receive("*a")
      t:close()
      return d or part
    end
    for _, target in ipairs{ "/", "/favicon.svg", "/nothing" } do
      local get = raw("GET " .. target .. " HTTP/1.1\r\nHost: x\r\n\r\n")
      local head = raw("HEAD " .. target .. " HTTP/1.1\r\nHost: x\r\n\r\n")
      local ghead, gbody = get:match("^(.-\r\n\r\n)(.*)$")
      assert.truthy(#gbody > 0)
      assert.are.equal(tonumber(ghead:match("Content%-Length: (%d+)")), #gbody)
      assert.are.equal(ghead, head, target)      -- the same head, nothing after it
    end
    local post = raw("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
    assert.matches("^HTTP/1.1 405", post)
    assert.matches("\r\nAllow: GET, HEAD\r\n", post)
    -- a head that never ends: closed at the handshake deadline (5 s)
    local s = socket.tcp()
    s:settimeout(8)
    assert(s:connect("127.0.0.1", hp))
    s:send("GET /ws HTTP/1.1\r\n")
    local t0 = socket.gettime()
    local d, e = s:receive("*a")
    assert.are.equal("", d or "")
    assert.truthy(socket.gettime() - t0 < 7.5, tostring(e))
    s:close()
    -- the good client saw none of it
    local e1 = assert(next_event(good, "atmosphere.field"))
    local e2 = assert(next_event(good, "atmosphere.field"))
    assert.truthy(e2.step > e1.step)
    assert.truthy(S.alive(gw))
    good:close()
  end)

  it("a frame header with no payload: over the limit 1009 at once, under it closed at --partial-timeout, logged", function()
    -- outside review of issue 28 (B5): a header declaring 100000 bytes or
    -- 2^40 and nothing after it held the connection forever, unlogged
    local g2, hp2, lp2 = gateway(ns, "--max-message 200000 --partial-timeout 1.5")
    for _, len in ipairs{ 2 ^ 40, 300000 } do
      local c = ws(hp2)
      c.s:send(c:frame(true, 1, "", { len = len }))
      local t0 = socket.gettime()
      local op, code = c:recv(5)
      assert.are.equal(8, op, "declared " .. len)
      assert.are.equal(1009, code)
      assert.truthy(socket.gettime() - t0 < 1, "1009 at once, not at the deadline")
      c:close()
    end
    -- under the limit: closed (1008, a reason) at the deadline
    local c = ws(hp2)
    c.s:send(c:frame(true, 2, "", { len = 100000 }) .. ("z"):rep(1000))
    local t0 = socket.gettime()
    local op, code, reason = c:recv(6)
    assert.are.equal(8, op)
    assert.are.equal(1008, code)
    assert.matches("incomplete", reason)
    local dt = socket.gettime() - t0
    assert.truthy(dt > 1 and dt < 4, dt)
    -- a JSON line without its newline, the same
    local l = assert(W.lines("127.0.0.1", lp2))
    l:json()
    l:send_raw('{"op":"li')
    local m = l:json(5)
    assert.matches("incomplete", m.error)
    -- a client that only listens (no message begun) stays
    local quiet = ws(hp2)
    socket.sleep(2.5)
    quiet:send_json{ op = "list", id = 1 }
    assert.truthy(reply(quiet, 1).result)
    quiet:close()
    local function log()   -- the gateway's stderr
      local f = io.open(g2.err)
      local t = f:read("*a")
      f:close()
      return t
    end
    local _, n = log():gsub("message over 200000 bytes", "")
    assert.are.equal(2, n)     -- one line per client
    _, n = log():gsub("left incomplete for 1.5 s", "")
    assert.are.equal(2, n)
    P.stop(g2)
  end)

  it("a client may publish to and call at most --max-channels distinct names; its channels go when it leaves", function()
    -- outside review of issue 28 (B4): pub to 2000 distinct names made
    -- 2000 channels that stayed after the client left, listed to everyone
    local g2, hp2 = gateway(ns, "--max-channels 3")
    local c, hello = ws(hp2)
    assert.are.equal(3, hello.limits.channels)
    for i = 1, 3 do
      c:send_json{ op = "pub", id = i, ch = "flood.c" .. i, data = i }
      assert.is_true(reply(c, i).ok)
    end
    c:send_json{ op = "pub", id = 4, ch = "flood.c1", data = 9 }   -- one it has already: fine
    assert.is_true(reply(c, 4).ok)
    c:send_json{ op = "pub", id = 5, ch = "flood.c4", data = 4 }
    local r = reply(c, 5)
    assert.are.equal("limit", r.code)
    assert.matches("3 distinct channels", r.error)
    c:send_json{ op = "call", id = 6, svc = "no.such.service", args = {}, timeout = 1 }
    assert.are.equal("limit", reply(c, 6).code)
    -- the flood channels with a producer (the gateway's, for this client)
    local function listed()
      local v = ws(hp2)
      v:send_json{ op = "list", id = 1 }
      local names = {}
      for _, x in ipairs(reply(v, 1).result) do
        if x.channel:find("^flood%.") and x.producers > 0 then names[#names + 1] = x.channel end
      end
      v:close()
      return names
    end
    assert.truthy(until_(function() return #listed() == 3 end, 10, 0.2))
    c:close()
    -- left with the client that made them (the name server forgets them
    -- after its forget_after, 30 s)
    assert.truthy(until_(function() return #listed() == 0 end, 10, 0.3), table.concat(listed(), " "))
    -- a call to a service no process offers: told so, no channel made for it
    local c2 = ws(hp2)
    c2:send_json{ op = "call", id = 1, svc = "no.such.service", args = {}, timeout = 2 }
    r = reply(c2, 1)
    assert.are.equal("noservice", r.code)
    assert.matches("no service no.such.service", r.error)
    c2:send_json{ op = "list", id = 2 }
    for _, x in ipairs(reply(c2, 2).result) do assert.is_nil(x.channel:find("no.such", 1, true), x.channel) end
    c2:close()
    P.stop(g2)
  end)

  it("a client that never reads is bounded by --max-queued and dropped events are counted to it; others go on", function()
    local lazy = ws(hp, { rcvbuf = 4096 })
    lazy:send_json{ op = "sub", id = 1, ch = "atmosphere.field" }
    local good = ws(hp)
    good:send_json{ op = "sub", id = 1, ch = "atmosphere.field" }
    assert.is_true(reply(good, 1).ok)
    -- ~25 kB per event at 20 steps/s: the kernel's buffers and 200000 bytes fill in seconds
    local drops, queued
    assert.truthy(until_(function()
      good:send_json{ op = "clients", id = 2 }
      local r = reply(good, 2)
      for _, x in ipairs(r.result) do
        if not x.you then drops, queued = x.drops, x.queued end
      end
      return drops and drops > 5
    end, 30, 0.3), "the lazy client's events were not dropped: " .. tostring(drops))
    assert.truthy(queued <= 200000)
    -- the good client still gets every step in order meanwhile
    local a = assert(next_event(good, "atmosphere.field"))
    local b = assert(next_event(good, "atmosphere.field"))
    assert.are.equal(a.step + 1, b.step)
    -- the lazy client reads at last: the notice of what it missed
    local told
    assert.truthy(until_(function()
      local m = lazy:json(1)
      if m and m.dropped then told = m end
      return told
    end, 30, 0))
    assert.truthy(told.dropped > 0 and told.total >= told.dropped)
    lazy:close()
    good:close()
  end)

  it("with --slow disconnect, a client that never reads is closed with a reason; others go on", function()
    local _, hp2 = gateway(ns, "--slow disconnect --max-queued 100000")
    local lazy = ws(hp2, { rcvbuf = 4096 })
    lazy:send_json{ op = "sub", id = 1, ch = "atmosphere.field" }
    local good = ws(hp2)
    good:send_json{ op = "sub", id = 1, ch = "atmosphere.field" }
    assert.is_true(reply(good, 1).ok)
    local gone
    assert.truthy(until_(function()
      good:send_json{ op = "clients", id = 2 }
      local r = reply(good, 2)
      -- closing (its close frame queued) or already gone (frame handed to the kernel)
      gone = #r.result == 1
      for _, x in ipairs(r.result) do
        if not x.you and x.closing then gone = true end
      end
      return gone
    end, 30, 0.05))
    -- what it had queued, then the close frame with the reason
    local code, reason, ended
    assert.truthy(until_(function()
      local op, c, why = lazy:recv(5)
      if op == 8 then code, reason = c, why end
      ended = op == nil and c
      return op == 8 or op == nil
    end, 30, 0))
    assert.are.equal(1008, code, "the connection ended without a close frame: " .. tostring(ended))
    assert.matches("slow client", reason)
    assert.truthy(next_event(good, "atmosphere.field"))
    good:close()
  end)

  -- Every core busy (two spinning processes), a producer at full rate and
  -- four WebSocket clients read by this one process, one of which reads
  -- nothing until the producer is done: each client gets the events in
  -- order, every one it does not get was told to it as dropped
  -- (--max-queued), never lost without a word, and the notice of a gap
  -- comes before the first event after it.
  it("busy cores, a producer at full rate, four clients: in order, every missing event told as dropped", function()
    local spin = {}
    for i = 1, 2 do spin[i] = S.spawn(("%s -e 'while true do end'"):format(S.luajit)) end
    local N = 20000
    local cs = {}
    for i = 1, 4 do
      cs[i] = assert(ws(hp, i == 4 and { rcvbuf = 4096 } or nil))
      cs[i]:send_json{ op = "sub", id = 1, ch = "gwbusy" }
      assert.is_true(reply(cs[i], 1).ok)
    end
    local prod = S.lua([[
local lecho = require "lecho"
local a = require("cjson").decode(arg[1])
local ctx = lecho.context{ nameserver = a.ns, quiet = true }
local ch = ctx:channel("gwbusy")
local p = assert(ch:producer())
local PAD = ("x"):rep(300)
local deadline = ctx:now() + 20
repeat
  ctx:run_once(0.02)
  local d = (ctx:stats().channels.gwbusy or {}).destinations or 0
until d > 0 or ctx:now() > deadline
for i = 1, a.n do
  assert(p:submit({ i = i, pad = PAD }))
  if i % 200 == 0 then ctx:run_once(0) end
end
assert(p:submit_sync({ i = a.n + 1, final = true }, { timeout = 60 }))
io.stdout:write("sent\n") io.stdout:flush()
ctx:close()
]], cjson.encode{ ns = ns, n = N })
    local st = {}
    for i = 1, 4 do st[i] = { last = 0, got = 0, dropped = 0, bad = nil, done = false } end
    local deadline = socket.gettime() + 90
    local open = 4
    while open > 0 and socket.gettime() < deadline do
      for i = 1, 4 do
        local t = st[i]
        if not t.done and (i < 4 or S.output(prod):match("sent")) then
          for _ = 1, 200 do
            local m = cs[i]:json(0.01)
            if not m then break end
            if m.dropped then t.dropped = t.dropped + m.dropped end
            if m.ch == "gwbusy" and m.ev then
              local k = m.ev.i
              -- in order; a gap only where a notice came before it
              if k ~= t.last + 1 + (t.dropped - (t.seen_dropped or 0)) and not t.bad then
                t.bad = ("event %d after %d with %d told dropped between"):format(k, t.last,
                  t.dropped - (t.seen_dropped or 0))
              end
              t.seen_dropped = t.dropped
              t.got = t.got + 1
              t.last = k
            end
            -- every event came or was told dropped (the last notice may
            -- come after the last event the client got)
            if t.got + t.dropped == N + 1 then t.done = true open = open - 1 break end
          end
        end
      end
    end
    for i = 1, 2 do P.kill(spin[i]) end
    assert(S.wait(prod, 60), "producer: " .. S.errors(prod))
    -- the client that did not read lost events to --max-queued, all told
    assert.truthy(st[4].dropped > 0, "the idle client dropped nothing: the case did not happen")
    for i = 1, 4 do
      local t = st[i]
      assert.is_nil(t.bad)
      -- every event 1..N+1 either came or was counted as dropped
      assert.are.equal(N + 1, t.got + t.dropped, ("client %d: got %d, told %d dropped"):format(i, t.got, t.dropped))
      cs[i]:close()
    end
  end)

  -- A client that vanished without closing (here: one that stopped reading
  -- and writing after its handshake, as a dead host looks) is pinged and
  -- closed; a silent client that answers pings (any browser), or a JSON-lines
  -- listener that never writes, stays.
  it("--ping: a WebSocket client that answers no ping is closed and logged; listeners that answer stay", function()
    local g2, hp2, lp2 = gateway(ns, "--ping 0.5")
    local dead = ws(hp2)
    dead:send_json{ op = "sub", id = 1, ch = "atmosphere.field" }
    local live = ws(hp2)
    local lines = assert(W.lines("127.0.0.1", lp2))
    assert.are.equal("lecho-gateway", lines:json().hello)
    -- 3 s: six ping rounds; `live` only reads (its client answers pings)
    local t_end = socket.gettime() + 3
    while socket.gettime() < t_end do live:json(0.1) end
    live:send_json{ op = "clients", id = 2 }
    local r = assert(reply(live, 2))
    assert.are.equal(2, #r.result, "the dead client is still there, or a listener was closed: " .. cjson.encode(r.result))
    assert.matches("no answer to a ping in 0.5 s", S.errors(g2))
    -- the listeners are still served
    lines:send_json{ op = "list", id = 3 }
    assert.truthy(lines:json(5, true))
    live:close(); lines:close(); dead:close()
  end)

  it("listens on IPv6 loopback too, and logs a client by its address", function()
    local child = S.spawn(("%s %s/scripts/lecho-gateway --nameserver %s --http '[::1]:0' --lines '[::1]:0' --for 60 --ping 0.5")
      :format(S.luajit, S.root, ns))
    local line = P.wait_file(child.err, "lecho%-gateway: http://%[::1%]:%d+/.-JSON lines on %[::1%]:%d+", 20)
    assert(line, "gateway did not start on [::1]: " .. S.errors(child))
    local hp6 = tonumber(line:match("http://%[::1%]:(%d+)/"))
    local lp6 = tonumber(line:match("JSON lines on %[::1%]:(%d+)"))
    local function ws6() local c = assert(W.connect("::1", hp6)); assert(c:json(5)); return c end
    local c = ws6()
    c:send_json{ op = "list", id = 1 }
    assert.truthy(reply(c, 1))
    local l = assert(W.lines("::1", lp6))
    assert.are.equal("lecho-gateway", l:json().hello)
    l:close()
    -- a client that answers no ping is closed; the log names its address
    local dead = ws6()
    assert.truthy(until_(function() return S.errors(child):match("client %d+ %(%[::1%]:%d+%) closed: no answer to a ping") end, 10, 0.1),
      S.errors(child))
    c:close(); dead:close()
    -- beyond loopback only with client keys or tokens
    local bad = S.spawn(("%s %s/scripts/lecho-gateway --nameserver %s --http '[::]:0' --for 5")
      :format(S.luajit, S.root, ns))
    assert(S.wait(bad, 20))
    assert.matches("refusing to listen on %[::%]:0 without client keys or tokens", S.errors(bad))
  end)

  -- wslay answers each ping with a pong: a client that floods pings and
  -- reads nothing made the gateway queue pongs without bound (1 GB in 10 s);
  -- it is held to --max-queued like any client that does not read (and
  -- closed there, not at the end of a read that answered every ping in it).
  it("a client that floods pings and reads nothing is closed at --max-queued; others go on", function()
    local g2, hp2 = gateway(ns, "--max-queued 100000")
    local good = ws(hp2)
    good:send_json{ op = "sub", id = 1, ch = "atmosphere.field" }
    assert.is_true(reply(good, 1).ok)
    local flood = assert(W.connect("127.0.0.1", hp2, { rcvbuf = 4096 }))
    local ping = flood:frame(true, 9, ("p"):rep(125))
    local blob = ping:rep(500)
    flood.s:settimeout(0.05)
    local sent, closed = 0, false
    local t_end = socket.gettime() + 20
    while socket.gettime() < t_end and sent < 400000 do
      local n, e = flood.s:send(blob)
      if n then sent = sent + 500 elseif e == "closed" then closed = true break end
      good:json(0.001)
      if S.errors(g2):find("client does not read", 1, true) then break end
    end
    assert.truthy(until_(function() return S.errors(g2):match("closed: client does not read %(%d+ bytes queued, its pongs") end, 10, 0.1),
      "the ping flood was not closed after " .. sent .. " pings: " .. S.errors(g2))
    -- at --max-queued, not past it (the review of issue 28 saw 90x): one
    -- read buffer's pings (4096 bytes, 131 each) may answer past the bound,
    -- each pong 125 bytes and 96 counted for its frame and bookkeeping
    local q = tonumber(S.errors(g2):match("closed: client does not read %((%d+) bytes queued, its pongs"))
    assert.truthy(q <= 100000 + 32 * (125 + 96), "closed at " .. q .. " bytes queued")
    -- the gateway's memory stayed near --max-queued plus the kernel's buffers
    local st = S.read("/proc/" .. g2.pid .. "/status") or ""
    local rss = tonumber(st:match("VmRSS:%s*(%d+)")) or 0
    assert.truthy(rss < 150 * 1024, "gateway RSS " .. rss .. " KiB")
    assert.truthy(next_event(good, "atmosphere.field", 10))
    good:close()
    flood.s:close()
  end)

  it("--max-channels counts subscribed names too: one client churning names cannot use up the gateway's", function()
    local _, hp2 = gateway(ns, "--max-channels 5")
    local churn = ws(hp2)
    local codes = {}
    for i = 1, 8 do
      churn:send_json{ op = "sub", id = i, ch = "junk." .. i }
      local r = reply(churn, i)
      codes[i] = r.ok and "ok" or r.code
      if r.ok then
        churn:send_json{ op = "unsub", id = 100 + i, ch = "junk." .. i }
        reply(churn, 100 + i)
      end
    end
    assert.are.same({ "ok", "ok", "ok", "ok", "ok", "limit", "limit", "limit" }, codes)
    -- a name it had already is not a new one
    churn:send_json{ op = "sub", id = 20, ch = "junk.1" }
    assert.is_true(reply(churn, 20).ok)
    -- another client is not affected
    local other = ws(hp2)
    other:send_json{ op = "sub", id = 1, ch = "atmosphere.field" }
    assert.is_true(reply(other, 1).ok)
    other:close(); churn:close()
  end)

  -- A modulator that does not compile raised inside the sub: the client got
  -- "internal error", its subscription stayed "pending", and at its end the
  -- gateway failed half way through dropping it: its slot and socket leaked.
  it("a modulator that does not compile is refused, and its client leaves without a trace", function()
    local watcher = ws(hp)
    local function count()
      watcher:send_json{ op = "clients", id = 99 }
      local r = reply(watcher, 99)
      return #r.result
    end
    local before = count()
    for i = 1, 3 do
      local c = ws(hp)
      c:send_json{ op = "sub", id = 1, ch = "atmosphere.field", modulator = "this is not lua" }
      local r = reply(c, 1)
      assert.are.equal("invalid", r.code, cjson.encode(r))
      c:close()
    end
    assert.truthy(until_(function() return count() == before end, 10, 0.1), "clients left behind")
    watcher:close()
  end)

  it("says what a request that is not a JSON object was", function()
    local l = assert(W.lines("127.0.0.1", lp))
    assert(l:json())
    l:send_raw('"str"\nnull\n{bad\n')
    local a, b, c = l:json(5), l:json(5), l:json(5)
    assert.matches("not a JSON object %(a string%)", a.error)
    assert.matches("not a JSON object %(a null%)", b.error)
    assert.matches("not a JSON object: .+", c.error)
    -- any other refusal keeps the request's id (the top-level one, not
    -- the data's): a lone surrogate escape, a missing comma
    l:send_raw('{"op":"pub","id":21,"ch":"gw.x","data":{"id":99,"s":"\\ud800"}}\n')
    l:send_raw('{"op":"pub","data":{"id":99},"id":"r22" "ch":"gw.x"}\n')
    local d, e = l:json(5, true), l:json(5, true)
    assert.matches("not a JSON object: .+", d.error)
    assert.are.equal(21, d.id)
    assert.are.equal("invalid", d.code)
    assert.are.equal("r22", e.id)
    l:close()
  end)

  -- review 6: 9007199254740993 was acknowledged and delivered as ...992,
  -- Infinity and NaN as null; a request holding either is refused (code
  -- invalid, nothing published) wherever the number is: pub data, call args,
  -- sub params; over JSON lines and WebSocket alike
  it("refuses integers that would be rounded and numbers JSON has not (Infinity, NaN)", function()
    local c, l = sub_and_lines(hp, lp, "gw.numbers")
    local bad = {
      { '{"op":"pub","id":2,"ch":"gw.numbers","data":9007199254740993,"sync":true}', "integer 9007199254740993 is not exactly representable" },
      { '{"op":"pub","id":3,"ch":"gw.numbers","data":{"a":[1,-12345678901234567891]}}', "integer %-12345678901234567891 is not exactly representable" },
      { '{"op":"call","id":4,"ch":"gw.svc","args":[9007199254740995]}', "integer 9007199254740995 is not exactly representable" },
      { '{"op":"sub","id":5,"ch":"gw.x","params":{"n":90071992547409931}}', "integer 90071992547409931 is not exactly representable" },
      { '{"op":"pub","id":6,"ch":"gw.numbers","data":Infinity}', "not a JSON number: Infinity" },
      { '{"op":"pub","id":7,"ch":"gw.numbers","data":-Infinity}', "not a JSON number: %-Infinity" },
      { '{"op":"pub","id":8,"ch":"gw.numbers","data":[NaN]}', "not a JSON number: NaN" },
      { '{"op":"pub","id":9,"ch":"gw.numbers","data":0x10}', "not a JSON number: 0x10" },
    }
    for _, b in ipairs(bad) do
      ask_both(l, c, b[1], function(r)
        assert.matches(b[2], r.error or "", 1, false)
        assert.are.equal("invalid", r.code)
      end)
    end
    -- exact numbers pass: 2^53, 2^60 (a double exactly), the digits in a
    -- string (one that looks like a number token inside it too), a long
    -- fraction (a double's nearest, as JSON means)
    l:send_raw('{"op":"pub","id":10,"ch":"gw.numbers","sync":true,"data":{"a":9007199254740992,"b":1152921504606846976,"s":"9007199254740993","t":"x, 9007199254740993]","f":0.30000000000000004}}\n')
    local r = reply(l, 10)
    assert.is_true(r.ok, cjson.encode(r))
    local ev, m = assert(next_event(c, "gw.numbers"))
    assert.are.same({ a = 9007199254740992, b = 1152921504606846976, s = "9007199254740993", t = "x, 9007199254740993]", f = 0.30000000000000004 }, ev)
    -- none of the refused ones was published: the next event is this one
    l:send_json{ op = "pub", id = 11, ch = "gw.numbers", data = "after", sync = true }
    assert.is_true(reply(l, 11).ok)
    assert.are.equal("after", (next_event(c, "gw.numbers")))
    -- (nit 3) one table type: a published [] comes back {} (doc/gateway.md "Values")
    l:send_raw('{"op":"pub","id":12,"ch":"gw.numbers","sync":true,"data":{"a":[],"b":[1]}}\n')
    assert.is_true(reply(l, 12).ok)
    local raw
    assert.truthy(until_(function()
      local op, d = c:recv(5)
      raw = d
      return op == 1 and d:find('"ch":"gw.numbers"', 1, true)
    end, 10))
    assert.matches('"a":{}', raw, 1, true)
    assert.matches('"b":[1]', raw, 1, true)
    l:close(); c:close()
  end)

  -- review 7 (C): 1e400 (-1e400, 1E+400) was acknowledged and arrived as
  -- inf (Python) or null (JSON lines); 9.007199254740993e15, an integer
  -- past 2^53 with an exponent, arrived rounded; a long number went whole
  -- into the error text.  (B) Every such refusal's reply lost the
  -- request's id, so a client waiting on it (the live view's form) waited
  -- forever.  Each is refused, code invalid, its id kept; nothing published.
  it("refuses numbers a double would make infinite or round, with the request's id; a long one cut", function()
    local c, l = sub_and_lines(hp, lp, "gw.numbers2")
    local long = "1" .. ("0"):rep(3000)   -- (under --max-message 4096)
    local bad = {
      { '{"op":"pub","id":2,"ch":"gw.numbers2","data":{"n":1e400},"sync":true}', "number 1e400 is beyond a double's range (it would be Infinity)", 2 },
      { '{"op":"pub","id":"m3","ch":"gw.numbers2","data":{"n":-1e400}}', "number -1e400 is beyond a double's range", "m3" },
      { '{"op":"pub","id":4,"ch":"gw.numbers2","data":[1E+400]}', "number 1E+400 is beyond a double's range", 4 },
      { '{"op":"pub","id":5,"ch":"gw.numbers2","data":9.007199254740993e15,"sync":true}', "integer 9.007199254740993e15 is not exactly representable (|n| > 2^53)", 5 },
      { '{"op":"pub","id":6,"ch":"gw.numbers2","data":9007199254740993.0}', "integer 9007199254740993.0 is not exactly representable", 6 },
      { '{"op":"call","id":7,"svc":"gw.svc","args":[90071992.54740993e8]}', "integer 90071992.54740993e8 is not exactly representable", 7 },
      { '{"op":"pub","id":8,"ch":"gw.numbers2","data":' .. long .. '}', "number 100000000000000000000000...00000000 (3001 characters) is beyond a double's range", 8 },
      { '{"op":"pub","id":9,"ch":"gw.numbers2","data":9007199254740993,"sync":true}', "integer 9007199254740993 is not exactly representable", 9 },
      { '{"op":"pub","id":10,"ch":"gw.numbers2","data":{"n":Infinity},"sync":true}', "not a JSON number: Infinity", 10 },
      { '{"op":"pub","ch":"gw.numbers2","data":[NaN,-Infinity],"id":11}', "not a JSON number: NaN", 11 },
    }
    for _, b in ipairs(bad) do
      ask_both(l, c, b[1], function(r)
        assert.are.equal(b[2], (r.error or ""):sub(1, #b[2]), b[1]:sub(1, 80))
        assert.truthy(#r.error < 200, "error text of " .. #r.error .. " bytes")
        assert.are.equal("invalid", r.code)
        assert.are.equal(b[3], r.id, "the reply to " .. b[1]:sub(1, 80) .. " has no id")
      end)
    end
    -- kept: 6.022e23 and 9.9999999999999992e22 (their digits are the
    -- double's), 9.007199254740992e15 (2^53), 1e-400 (0), a fraction
    l:send_raw('{"op":"pub","id":12,"ch":"gw.numbers2","sync":true,"data":{"a":6.022e23,"b":9.9999999999999992e22,"c":9.007199254740992e15,"d":1e-400,"e":9007199254740993.5}}\n')
    local r = reply(l, 12)
    assert.is_true(r.ok, cjson.encode(r))
    local ev = assert(next_event(c, "gw.numbers2"))
    assert.are.same({ a = 6.022e23, b = 9.9999999999999992e22, c = 2 ^ 53, d = 0, e = 9007199254740993.5 }, ev)
    l:close(); c:close()
  end)

  -- review 7 (H): README's JSON-lines example piped into nc, which make
  -- deps does not install (nor does Debian by default): the example's
  -- client line, run as written (the spec's port, 3 s, not 10), needs
  -- nothing but bash and coreutils, and prints the hello and events
  it("README's JSON-lines example runs as written with what make deps installs", function()
    local readme = assert(S.read(S.root .. "/README.md"))
    local block = assert(readme:match("\n## In a browser.-```sh[^\n]*\n(.-)```"), "no sh block in README's In a browser")
    local line
    for l in block:gmatch("[^\n]+") do
      if l:find("8081", 1, true) and not l:find("lecho-gateway --", 1, true) then line = l end
    end
    assert.truthy(line, "no client line in:\n" .. block)
    local cmd, n = line:gsub("8081", tostring(lp)):gsub("%f[%w]10%f[^%w]", "3")
    assert.truthy(n >= 1, line)
    local _, text, code = S.sh("bash -c " .. S.sh_quote(cmd))
    -- (timeout ends the reader: status 124)
    assert.truthy(code == 0 or code == 124, tostring(code) .. ": " .. text:sub(1, 300))
    local first = text:match("^[^\n]*")
    assert.matches('"hello":"lecho-gateway"', first, 1, true)
    local events = 0
    for l in text:gmatch("[^\n]+") do
      if l:find('"ch":"atmosphere.field"', 1, true) and l:find('"ev":', 1, true) then events = events + 1 end
    end
    assert.truthy(events >= 2, "events: " .. events .. "; output: " .. text:sub(1, 300))
  end)

  -- review 8 of issue 28 (rev28i, finding 2): a client that closed while
  -- its pub was being served left the gateway a producer of that channel
  -- for as long as it ran (_release skipped it, and nothing came back to it)
  it("closes the producer of a client that left while its pub was being served", function()
    for i = 1, 3 do
      local l = assert(W.lines("127.0.0.1", lp))
      l:send_json{ op = "pub", id = 2, ch = "gw.leak" .. i, data = { a = 1 }, sync = true, timeout = 5 }
      l:close()
    end
    local function listed()
      local v = assert(ws(hp))
      v:send_json{ op = "list", id = 1 }
      local names = {}
      for _, x in ipairs(reply(v, 1).result) do
        if x.channel:find("^gw%.leak") and x.producers > 0 then names[#names + 1] = x.channel end
      end
      v:close()
      return names
    end
    assert.truthy(until_(function() return #listed() == 0 end, 10 * S.SLOW, 0.3),
                  "still a producer of: " .. table.concat(listed(), " "))
  end)

  it("holds a client to --max-subs subscriptions and tells it so", function()
    local l = assert(W.lines("127.0.0.1", lp))
    assert.are.equal(3, l:json().limits.subs)
    for i = 1, 3 do
      l:send_json{ op = "sub", id = i, ch = "gw.many." .. i }
      assert.is_true(reply(l, i).ok)
    end
    l:send_json{ op = "sub", id = 4, ch = "gw.many.4" }
    local r = reply(l, 4)
    assert.are.equal("limit", r.code)
    assert.matches("3 subscriptions", r.error)
    l:send_json{ op = "unsub", id = 5, ch = "gw.many.1" }
    assert.is_true(reply(l, 5).ok)
    l:send_json{ op = "sub", id = 6, ch = "gw.many.4" }
    assert.is_true(reply(l, 6).ok)
    l:close()
  end)

  it("calls a service in another process: results, a version, the handler's error", function()
    S.spawn(("%s %s/examples/services/echo.lua --serve %s"):format(S.luajit, S.root, ns))
    local l = assert(W.lines("127.0.0.1", lp))
    l:json()
    local r
    assert.truthy(until_(function()
      l:send_json{ op = "call", id = 1, svc = "echo", args = { x = 21 }, version = 2 }
      r = reply(l, 1)
      return r.ok
    end, 20, 0.2), r and r.error)
    assert.are.equal(42, r.result)
    assert.matches("^echo@2 at ", r.results[2])
    l:send_json{ op = "call", id = 2, svc = "echo", args = { x = 21 }, version = 1 }
    assert.are.equal(21, reply(l, 2).result)
    l:send_json{ op = "call", id = 3, svc = "echo", args = { fail = "table" }, version = 1 }
    r = reply(l, 3)
    assert.are.same({ code = 400, why = "no x" }, r.error)
    l:close()
  end)

  -- Outside review of issue 28 (BUG 6): an event larger than --max-queued
  -- never reached a client, and the drop notice waited for the next event.
  -- Now one such event is taken on an empty queue; what comes while it is
  -- being sent is dropped and told as soon as the queue is empty.
  it("an event larger than --max-queued reaches a client whose queue is empty; the drop notice follows at once", function()
    local c = assert(ws(hp, { rcvbuf = 4096 }))   -- reads nothing until the three are published
    c:send_json{ op = "sub", id = 1, ch = "big.ch" }
    assert.is_true(reply(c, 1).ok)
    local done = S.tmpname("big-done")
    S.lua([[
      local lecho = require "lecho"
      local ns, done = arg[1], arg[2]
      local ctx = lecho.context{ nameserver = ns, quiet = true }
      local p = assert(ctx:channel("big.ch"):producer())
      local function big(k)   -- 600 kB, 3x --max-queued
        local a = lecho.array.new("<f8", { 75000 })
        local d = a:ptr()
        for i = 0, 74999 do d[i] = k + i end
        return { k = k, a = a }
      end
      local t_end = ctx:now() + 20
      while not p:submit_sync(big(1), { timeout = 2 }) and ctx:now() < t_end do ctx:sleep(0.1) end
      assert(p:submit(big(2)))
      assert(p:submit(big(3)))
      assert(p:submit_sync({ k = 4 }, { timeout = 5 }))   -- all are through the gateway's handler
      io.open(done, "w"):close()
      for k = 5, 300 do ctx:sleep(0.1); p:submit({ k = k }) end
    ]], ns, done)
    assert.truthy(P.wait_file(done, "", 30), "the producer did not publish")
    local ev, msg = next_event(c, "big.ch", 10)
    assert.truthy(ev, msg)
    assert.is_true(msg.binary)
    assert.are.equal(1, ev.k)
    assert.are.equal(75000, #ev.a.data)
    assert.are.equal(1 + 74999, ev.a.data[75000])
    -- 2, 3 and 4 came while it was queued (one gap: dropped until the
    -- queue is below half): told as soon as the queue is empty
    local t0 = socket.gettime()
    local m = assert(c:json(3))
    assert.are.same({ dropped = 3, total = 3 }, m)
    assert.truthy(socket.gettime() - t0 < 2)
    -- then the small ones again
    assert.truthy((next_event(c, "big.ch", 5) or {}).k >= 5)
    c:close()
  end)

  -- Outside review of issue 28 (BUG 7): a call whose result held an array
  -- was answered {"error":"reply not representable in JSON","code":"invalid"}.
  it("a call's result holding arrays: a binary reply over WebSocket, {dtype, shape, data} over JSON lines", function()
    S.lua([[
      local lecho = require "lecho"
      local ctx = lecho.context{ nameserver = arg[1], quiet = true }
      assert(ctx:service("arrsvc", function(args)
        return { a = lecho.array.from({ { 1, 2, 3 }, { 4, 5, 6 } }, "<i4") }, "second"
      end))
      ctx:sleep(100)
    ]], ns)
    local c = assert(ws(hp))
    local r
    assert.truthy(until_(function()
      c:send_json{ op = "call", id = 4, svc = "arrsvc", args = { arr = 1 } }
      r = reply(c, 4)
      return r and r.code ~= "noservice"
    end, 20, 0.2))
    assert.is_true(r.ok, cjson.encode(r))
    assert.is_true(r.binary)
    assert.are.same({ dtype = "<i4", shape = { 2, 3 }, data = { 1, 2, 3, 4, 5, 6 } },
      { dtype = r.result.a.dtype, shape = r.result.a.shape, data = r.result.a.data })
    assert.are.same({ 1, 2, 3, 4, 5, 6 }, r.results[1].a.data)
    assert.are.equal(r.result.a.offset, r.results[1].a.offset)   -- carried once
    assert.are.equal("second", r.results[2])
    c:close()
    local l = assert(W.lines("127.0.0.1", lp))
    l:json()
    l:send_json{ op = "call", id = 5, svc = "arrsvc", args = { arr = 1 } }
    r = reply(l, 5)
    assert.is_true(r.ok, cjson.encode(r))
    assert.are.same({ dtype = "<i4", shape = { 2, 3 }, data = { 1, 2, 3, 4, 5, 6 } }, r.result.a)
    assert.are.same(r.result, r.results[1])
    l:close()
  end)

  it("a client that floods requests and reads no replies is closed; others go on", function()
    local good = ws(hp)
    good:send_json{ op = "sub", id = 1, ch = "atmosphere.field" }
    assert.is_true(reply(good, 1).ok)
    local flood = assert(W.lines("127.0.0.1", lp))
    flood.s:setoption("recv-buffer-size", 4096)
    flood.s:settimeout(0.5)
    local chunk = ("x\n"):rep(50000)   -- each line an error reply of ~60 bytes
    local sent = 0
    for _ = 1, 40 do
      local n = flood.s:send(chunk)
      if not n then break end
      sent = sent + n
    end
    local gone
    assert.truthy(until_(function()
      good:send_json{ op = "clients", id = 2 }
      local r = reply(good, 2)   -- (a busy gateway's may take longer: asked again)
      gone = r ~= nil and #r.result == 1
      return gone
    end, 90, 0.2), "the flooding client is still served")   -- (30 s: failed twice in CI at load 7-15:
    -- its replies fill the kernel's autotuned send buffer, MBs, before --max-queued, 256 lines a turn)
    local a = assert(next_event(good, "atmosphere.field"))
    local b = assert(next_event(good, "atmosphere.field"))
    assert.are.equal(a.step + 1, b.step)
    flood:close()
    good:close()
  end)

  -- a JSON-lines client's read was taken whole, and the socket read until
  -- it was empty: one that sends without pause held the loop from others
  it("a JSON-lines client sending without pause does not hold the loop: a viewer's events keep coming", function()
    local good = ws(hp)
    good:send_json{ op = "sub", id = 1, ch = "atmosphere.field" }
    assert.is_true(reply(good, 1).ok)
    assert.truthy(next_event(good, "atmosphere.field"))
    local flood = assert(W.lines("127.0.0.1", lp))
    flood:json()
    flood.s:settimeout(0)
    local blob = ('{"op":"nosuch"}\n'):rep(4096)   -- 64 KiB, each line an error reply
    local gap, last, got = 0, socket.gettime(), 0
    local t_end = socket.gettime() + 6
    while socket.gettime() < t_end do
      flood.s:send(blob)
      repeat   -- it reads its replies: it is not a slow client
        local d, _, part = flood.s:receive(65536)
        d = d or part
        got = got + #d
      until #d == 0
      while good.s:dirty() or socket.select({ good.s }, nil, 0)[1] do
        local m = good:json(0.05)
        if not m then break end
        if m.ev ~= nil then
          local now = socket.gettime()
          gap, last = math.max(gap, now - last), now
        end
      end
    end
    gap = math.max(gap, socket.gettime() - last)
    -- (one read answered whole made more replies than --max-queued at once:
    -- the base closed this client, which reads them, as one that does not)
    assert.truthy(got > 1000000, "the flooder got only " .. got .. " bytes of replies")
    assert.truthy(gap < 1, "the viewer got no event for " .. gap .. " s")
    flood:close()
    good:close()
  end)

  it("refuses to listen beyond loopback without client keys or tokens", function()
    local ok, out = S.sh(("%s %s/scripts/lecho-gateway --nameserver %s --http 0.0.0.0:0 --for 5"):format(S.luajit, S.root, ns))
    assert.is_false(ok)
    assert.matches("protected mode: loopback only", out)
  end)
end)

describe("lecho-gateway keyed", function()
  local ns, hp, lp, pk, sk, gwk
  lazy_setup(function()
    local _
    _, ns = S.nameserver("--quiet")
    sim(ns, "--seconds 100 --rate 10 --grid 1x6x6")
    local tokens = S.write(S.tmpname("tokens") .. ".json",
      cjson.encode{ ["viewer-token-0123456789"] = "viewer", ["steerer-token-0123456789"] = "steerer",
                    ["watcher-token-0123456789"] = "watcher" })
    local policy = S.write(S.tmpname("policy") .. ".lua", [[
return { rules = {
  { principal = "*", channel = "*", allow = { "consume" } },
  { principal = "viewer", channel = "*", allow = { "list" } },
  { principal = "steerer", channel = "atmosphere.steer", allow = { "list" } },
  { principal = "device", channel = "*", allow = { "list" } },
  { principal = "steerer", channel = "atmosphere.steer", allow = { "produce" } },
  { principal = "device", channel = "atmosphere.steer", allow = { "produce" } },
} }]])
    local core = require "lecho.core"
    pk, sk = core.keypair()
    local pub = S.tmpname("device") .. ".pub"
    assert(require("lecho.keys").write_public(pub, { name = "device", public = pk }))
    gwk, hp, lp = gateway(ns, ("--tokens %s --policy %s --client-trust %s"):format(tokens, policy, pub))
  end)
  lazy_teardown(function() S.cleanup() end)

  it("refuses an unknown bearer token at the handshake and anything before auth", function()
    local c, status = W.connect("127.0.0.1", hp, { headers = { "Authorization: Bearer wrong-token-0123456789" } })
    assert.is_nil(c)
    assert.matches("^HTTP/1.1 401", status)
    local _
    _, status = W.connect("127.0.0.1", hp, { path = "/ws?token=nope" })
    assert.matches("^HTTP/1.1 401", status)
    local hello
    c, hello = ws(hp)
    assert.are.equal("required", hello.auth)
    c:send_json{ op = "list", id = 1 }
    assert.are.equal("auth", reply(c, 1).code)
    c:send_json{ op = "auth", id = 2, token = "guess-guess-guess-guess" }
    assert.are.equal("auth", reply(c, 2).code)
    local m, e, code = reply(c, 3, 3)
    assert.is_nil(m)
    assert.are.equal("closed", e)
    assert.are.equal(1008, code)
    -- a failed auth ends the client cleanly: no error with a traceback in the log
    -- (the connection was used after the message that freed it)
    for _ = 1, 5 do
      local d = ws(hp)
      d:send_json{ op = "auth", id = 1, token = "guess-guess-guess-guess" }
      reply(d, 1)
      d:close()
    end
    socket.sleep(0.3)
    assert.is_nil(S.errors(gwk):find("connection is freed", 1, true), S.errors(gwk))
  end)

  it("maps a token to its principal and checks the policy for each action", function()
    local c, hello = ws(hp, { headers = { "Authorization: Bearer viewer-token-0123456789" } })
    assert.are.equal("viewer", hello.principal)
    c:send_json{ op = "sub", id = 1, ch = "atmosphere.field" }
    assert.is_true(reply(c, 1).ok)
    assert.truthy(next_event(c, "atmosphere.field"))
    c:send_json{ op = "pub", id = 2, ch = "atmosphere.steer", data = { emission = 3 }, sync = true }
    local r = reply(c, 2)
    assert.are.equal("denied", r.code)
    assert.matches("viewer may not produce", r.error)
    c:send_json{ op = "sub", id = 3, ch = "atmosphere.field.x", modulator = "function enqueue(ev) emit(1) end" }
    assert.are.equal("denied", reply(c, 3).code)
    -- a connection keeps its principal: a second auth is refused, not "ok"
    c:send_json{ op = "auth", id = 4, token = "steerer-token-0123456789" }
    r = reply(c, 4)
    assert.are.equal("invalid", r.code)
    assert.matches("already authenticated as viewer", r.error)
    -- the gateway never dials an address a client names: a channel of
    -- another name server is refused before any lookup
    c:send_json{ op = "sub", id = 5, ch = "127.0.0.1:9/atmosphere.settings" }
    r = reply(c, 5)
    assert.are.equal("denied", r.code)
    assert.matches("only names of this gateway's name server", r.error)
    -- ...and the gateway's own name server written out is the plain name
    c:send_json{ op = "sub", id = 6, ch = ns .. "/atmosphere.settings" }
    assert.is_true(reply(c, 6).ok)
    socket.sleep(0.2)
    assert.is_nil(S.errors(gwk):find("127.0.0.1:9", 1, true), S.errors(gwk))
    c:close()
    local s = ws(hp, { path = "/ws?token=steerer-token-0123456789" })
    s:send_json{ op = "pub", id = 1, ch = "atmosphere.steer", data = { emission = 3 }, sync = true }
    assert.is_true(reply(s, 1).ok)
    s:close()
  end)

  -- review 4: clients gave every client's principal and channels to any
  -- authenticated principal, one whose policy denies list too
  it("clients is for a principal that may list, and shows only the channels it may list", function()
    local v = ws(hp, { headers = { "Authorization: Bearer viewer-token-0123456789" } })
    v:send_json{ op = "sub", id = 1, ch = "atmosphere.field" }
    assert.is_true(reply(v, 1).ok)
    local w = ws(hp, { headers = { "Authorization: Bearer watcher-token-0123456789" } })
    w:send_json{ op = "clients", id = 2 }
    local r = reply(w, 2)
    assert.are.equal("denied", r.code, cjson.encode(r))
    assert.is_nil(r.result)
    v:send_json{ op = "clients", id = 3 }
    r = reply(v, 3)
    assert.is_true(r.ok)
    local mine
    for _, c in ipairs(r.result) do if c.you then mine = c end end
    assert.are.same({ "atmosphere.field" }, mine.subs)
    -- a principal that may list atmosphere.steer only does not see the
    -- viewer's atmosphere.field
    local s = ws(hp, { headers = { "Authorization: Bearer steerer-token-0123456789" } })
    s:send_json{ op = "clients", id = 4 }
    r = reply(s, 4)
    assert.is_true(r.ok, cjson.encode(r))
    local seen = 0
    for _, c in ipairs(r.result) do
      seen = seen + 1
      assert.are.same({}, c.subs)
    end
    assert.is_true(seen >= 2)
    v:close(); w:close(); s:close()
  end)

  -- Outside review of issue 28 (BLOCKER 2): wslay answered every ping of
  -- one read before the bound was checked, and an empty pong counted 0
  -- bytes: 3,000,000 empty pings from a client that never authenticated
  -- grew the gateway from 10 to 238 MB, never closed, and a viewer got no
  -- event for 3.8 s.  Each pong now counts its frame and wslay's
  -- bookkeeping, one read stops at the client's bound (64 KiB before auth),
  -- the flooder is closed with 1008 there, other clients are served.
  it("an unauthenticated client flooding empty pings is closed at a small bound; memory bounded, viewers served", function()
    local function rss()
      local st = S.read("/proc/" .. gwk.pid .. "/status") or ""
      return (tonumber(st:match("VmRSS:%s*(%d+)")) or 0) * 1024
    end
    local good = ws(hp, { headers = { "Authorization: Bearer viewer-token-0123456789" } })
    good:send_json{ op = "sub", id = 1, ch = "atmosphere.field" }
    assert.is_true(reply(good, 1).ok)
    assert.truthy(next_event(good, "atmosphere.field"))
    local rss0 = rss()
    local flood = assert(W.connect("127.0.0.1", hp, { rcvbuf = 4096 }))
    local blob = string.char(0x89, 0x80, 0, 0, 0, 0):rep(1000)
    flood.s:settimeout(0)
    local sent, closed, gap, last = 0, false, 0, socket.gettime()
    local t_end, i = socket.gettime() + 20, 0
    for _ = 1, 3000 do
      if socket.gettime() > t_end then break end
      local n, e, part = flood.s:send(blob)
      sent = sent + (n or part or 0)
      if e == "closed" then closed = true break end
      -- the viewer's events meanwhile (10 a second): the largest gap
      while good.s:dirty() or socket.select({ good.s }, nil, 0)[1] do
        local m = good:json(0.05)
        if not m then break end
        if m.ev ~= nil then
          local now = socket.gettime()
          gap, last = math.max(gap, now - last), now
        end
      end
      i = i + 1
      if i % 100 == 0 and S.errors(gwk):find("client does not read", 1, true) then break end
    end
    local peak = rss()
    gap = math.max(gap, socket.gettime() - last)
    assert.truthy(until_(function() return S.errors(gwk):match("closed: client does not read %((%d+) bytes queued, its pongs") end, 10, 0.1),
      "the ping flood was not closed after " .. math.floor(sent / 6) .. " pings")
    local q = tonumber(S.errors(gwk):match("closed: client does not read %((%d+) bytes queued, its pongs"))
    -- closed at its bound (64 KiB before auth, plus at most one read buffer of pongs), not far past it
    assert.truthy(q <= 65536 + 4096 / 6 * 98, "closed at " .. q .. " bytes queued")
    -- with 1008: the close frame after the pongs queued before it
    local op, code
    repeat op, code = flood:recv(5) until op == nil or op == 8
    assert.are.equal(8, op, code)
    assert.are.equal(1008, code)
    -- the gateway's memory: the client's kernel buffers and its bound, plus a margin
    assert.truthy(peak - rss0 < 16 * 1024 * 1024, ("gateway RSS %d -> %d bytes"):format(rss0, peak))
    -- the viewer was served all along
    assert.truthy(gap < 1, "the viewer got no event for " .. gap .. " s")
    for _ = 1, 3 do
      local t0 = socket.gettime()
      assert.truthy(next_event(good, "atmosphere.field", 1))
      assert.truthy(socket.gettime() - t0 < 1)
    end
    flood.s:close()
    good:close()
  end)

  -- the same flood from a client that reads its pongs is never past its
  -- bound: it is served, a turn at a time, and the viewer's events keep
  -- coming (the review saw none for 3.8 s: wslay read every ping the
  -- socket held in one go)
  it("a client flooding empty pings and reading its pongs does not hold the loop: a viewer's events keep coming", function()
    local good = ws(hp, { headers = { "Authorization: Bearer viewer-token-0123456789" } })
    good:send_json{ op = "sub", id = 1, ch = "atmosphere.field" }
    assert.is_true(reply(good, 1).ok)
    assert.truthy(next_event(good, "atmosphere.field"))
    -- the flooder, its own process: sends without pause, reads what comes
    local done = S.tmpname("flood-done")
    S.lua([[
      package.path = arg[3] .. "/spec/support/?.lua;" .. package.path
      local W = require "wsclient"
      local socket = require "socket"
      local c = assert(W.connect("127.0.0.1", tonumber(arg[1]), { headers = { "Authorization: Bearer viewer-token-0123456789" } }))
      local blob = string.char(0x89, 0x80, 0, 0, 0, 0):rep(1000)
      local t_end, sent, got = socket.gettime() + 4, 0, 0
      c.s:settimeout(0)
      while socket.gettime() < t_end do
        local n, e, part = c.s:send(blob)
        sent = sent + (n or part or 0)
        if e == "closed" then break end
        repeat
          local d, e2, p2 = c.s:receive(65536)
          d = d or p2
          got = got + #d
        until #d == 0 or e2 == "closed"
      end
      local f = io.open(arg[2], "w"); f:write(sent, " ", got, "\n"); f:close()
    ]], tostring(hp), done, S.root)
    local gap, last = 0, socket.gettime()
    local t_end = socket.gettime() + 4
    while socket.gettime() < t_end do
      local m = good:json(0.2)
      if m and m.ev ~= nil then
        local now = socket.gettime()
        gap, last = math.max(gap, now - last), now
      end
    end
    gap = math.max(gap, socket.gettime() - last)
    local res = assert(P.wait_file(done, "%d+ %d+", 10), "the flooder did not finish")
    local sent, got = res:match("(%d+) (%d+)")
    sent, got = tonumber(sent), tonumber(got)
    assert.truthy(sent > 600000, "the flooder sent only " .. sent .. " bytes")
    assert.truthy(got > 0, "the flooder got no pong")
    assert.truthy(gap < 1, ("the viewer got no event for %.2f s (the flooder sent %d pings)"):format(gap, sent / 6))
    good:close()
  end)

  it("authenticates a JSON-lines device by a signature of the hello's nonce with its key", function()
    local core = require "lecho.core"
    local gwm = require "lecho.gateway"
    local l = assert(W.lines("127.0.0.1", lp))
    local hello = l:json()
    assert.are.equal("required", hello.auth)
    -- a signature of another nonce: refused, closed
    l:send_json{ op = "auth", id = 1, key = core.hex(pk), sig = core.hex(core.sign(sk, gwm.auth_message("1234"))) }
    assert.are.equal("auth", reply(l, 1).code)
    assert.is_true(l:json(2).closed)
    assert.is_nil(l:json(2))
    l = assert(W.lines("127.0.0.1", lp))
    hello = l:json()
    l:send_json{ op = "auth", id = 1, key = core.hex(pk), sig = core.hex(core.sign(sk, gwm.auth_message(hello.nonce))) }
    local r = reply(l, 1)
    assert.are.equal("device", r.principal)
    l:send_json{ op = "pub", id = 2, ch = "atmosphere.steer", data = { wind = 0.5 }, sync = true }
    assert.is_true(reply(l, 2).ok)
    l:close()
  end)
end)

-- review 5: an empty list went out as {} (lua-cjson writes every empty
-- table so): a page iterating `list`'s result threw and never subscribed
describe("lecho-gateway empty lists", function()
  local ns, lp
  lazy_setup(function()
    local _
    _, ns = S.nameserver("--quiet")
    _, _, lp = gateway(ns)
  end)
  lazy_teardown(function() S.cleanup() end)

  -- the next line of lines client l that is not an event, as text
  local function raw_line(l)
    l.s:settimeout(10)
    while true do
      local line = assert(l.s:receive("*l"))
      if not line:find('"ev":', 1, true) then return line end
    end
  end

  it("list on an empty name server and clients with no subs give [], not {}", function()
    local l = assert(W.lines("127.0.0.1", lp))
    raw_line(l)   -- hello
    l.s:send('{"op":"list"}\n')
    local line = raw_line(l)
    assert.matches('"result":%[%]', line)
    assert.is_nil(line:find("{}", 1, true), line)
    l.s:send('{"op":"clients","id":2}\n')
    line = raw_line(l)
    assert.matches('"subs":%[%]', line)
    assert.is_nil(line:find("{}", 1, true), line)
    l:close()
  end)
end)

-- review 5 D: a sub whose modulator failed while its consumer was being
-- made (a producer's refusal heard before the open returned) got an
-- unsolicited {"unsubscribed":true} notice, then its error reply
describe("lecho-gateway sub refused before its reply", function()
  it("gets the error reply only", function()
    local gwm = require "lecho.gateway"
    local closed = 0
    local ctx = { ns = "test", channel = function(_, name)
      return { consumer = function(_, fn, opts)
        opts.on_error("producer p: modulator refused on purpose")
        return { close = function() closed = closed + 1 end }
      end }
    end }
    local gw = setmetatable({ ctx = ctx, keyed = false, modulators = true, chans = {},
                              lim = { subs = 4, channels = 8 } }, gwm._Gateway)
    local got = {}
    local cl = { subs = {}, nsubs = 0, used = {}, nused = 0, reply = function(_, t) got[#got + 1] = t end }
    gwm._OPS.sub(gw, cl, { op = "sub", ch = "x", modulator = "function enqueue(ev) end" }, 1)
    assert.are.equal(1, #got, cjson.encode(got))
    assert.are.equal(1, got[1].id)
    assert.are.equal("modulator", got[1].code)
    assert.matches("refused on purpose", got[1].error)
    assert.is_nil(got[1].unsubscribed)
    assert.are.equal(1, closed)
    assert.are.equal(0, cl.nsubs)
    assert.is_nil(cl.subs.x)
  end)
end)
