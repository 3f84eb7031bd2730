-- lecho-gateway after a bounded soak of varied use (an outside review: a
-- gateway that had run ~15 minutes of hostile and normal clients sent every
-- event holding an array as {"ch":..,"error":"event not representable in
-- JSON: Cannot serialise userdata"} instead of a binary frame).  One
-- gateway, the atmosphere simulation, two busy loops; for SOAK seconds
-- (LECHO_SOAK_SECONDS, 25 by default: make test stays under 10 minutes; 240 s were run) a loop of: WebSocket clients that
-- subscribe and read, subscribe and never read (4 KiB receive buffer) then
-- vanish, send junk bytes, every kind of bad frame, ping floods, floods of
-- list/pub/clients requests, auth with bad tokens, modulators that emit
-- arrays or fail; JSON-lines clients; a producer of arrays killed in the
-- middle of its run.  A monitor client subscribed from the start must get
-- every atmosphere.field event it gets as a binary frame (never the error
-- text), a JSON-lines monitor each as JSON with the field as
-- {dtype, shape, data}, and a fresh client after the soak the same.
-- The gateway is keyed (tokens and a policy), as the review's was.
-- LECHO_SOAK_JIT: options for the gateway's luajit (e.g. "-Omaxtrace=40
-- -Ohotloop=1 -Omaxrecord=80": traces flushed and aborted far more often,
-- to stress LuaJIT's blacklisting); LECHO_SOAK_LOG=1 prints the rounds and
-- the gateway's log.  The cause of the review's failure is not known: this
-- spec has not reproduced it (a guard, not a regression test of a fix).
local cjson = require "cjson"
local socket = require "socket"
local S = require "spec.support"
local P = require "spec.support.proc"
package.path = S.root .. "/spec/support/?.lua;" .. package.path
local W = require "wsclient"

local SOAK = tonumber(os.getenv("LECHO_SOAK_SECONDS")) or 25

local function gateway(ns, args)
  local child = S.spawn(("%s %s %s/scripts/lecho-gateway --nameserver %s --http 127.0.0.1:0 --lines 127.0.0.1:0 --for %d %s")
    :format(S.luajit, os.getenv("LECHO_SOAK_JIT") or "", S.root, ns, SOAK + 120, args or ""))
  local line = P.wait_file(child.err, "lecho%-gateway: http://[%d.]+:%d+/.-JSON lines on [%d.]+:%d+", 20)
  assert(line, "gateway did not start: " .. S.errors(child))
  return child, tonumber(line:match("lecho%-gateway: http://[%d.]+:(%d+)/")),
    tonumber(line:match("JSON lines on [%d.]+:(%d+)"))
end

-- A WebSocket client of the keyed gateway, authenticated as "soak"
-- unless opts.headers says otherwise.
local AUTH = { "Authorization: Bearer soak-token-0123456789abc" }
local function ws(port, opts)
  opts = opts or {}
  if not opts.headers then opts.headers = AUTH end
  local c, e = W.connect("127.0.0.1", port, opts)
  if not c then return nil, e end
  local hello = c:json(5)
  if not hello then c:close() return nil, "no hello" end
  return c
end

-- Whatever is waiting on a client, read for at most t seconds; every
-- atmosphere.field message is checked by check(msg).
local function drain(c, t, check)
  local deadline = socket.gettime() + t
  while socket.gettime() < deadline do
    local ok, m = pcall(c.json, c, 0.01)
    if not ok or not m then return end
    if m.ch == "atmosphere.field" then check(m) end
  end
end

local MODS = {
  "function enqueue(ev) emit{ step = ev.step, f = ev.field } end",
  "function enqueue(ev) emit(ev.field) end",
  "function enqueue(ev) emit{ a = { ev.field, { b = ev.field } } } end",
  "function enqueue(ev) error('no') end",
  "function enqueue(ev) emit{ x = 1 } end",
  "this is not Lua",
}

describe("lecho-gateway soak", function()
  local ns, gw, hp, lp
  lazy_setup(function()
    local _
    _, ns = S.nameserver("--quiet")
    S.spawn(("%s %s/examples/atmosphere/simulation.lua --nameserver %s --quiet --seconds %d --rate 20 --grid 2x18x36")
      :format(S.luajit, S.root, ns, SOAK + 120))
    -- keyed, as the review's gateway was (it saw failed auths)
    local tokens = S.write(S.tmpname("tokens") .. ".json", cjson.encode{
      ["soak-token-0123456789abc"] = "soak", ["viewer-token-0123456789"] = "viewer" })
    local policy = S.write(S.tmpname("policy") .. ".lua", [[
return { rules = {
  { principal = "*", channel = "*", allow = { "list", "consume" } },
  { principal = "soak", channel = "*", allow = { "produce", "modulate" } },
} }]])
    gw, hp, lp = gateway(ns, ("--tokens %s --policy %s --max-queued 200000 --max-message 65536 --max-subs 8 --ping 1")
      :format(tokens, policy))
  end)
  lazy_teardown(function() S.cleanup() end)

  it(("after %d s of hostile and normal clients under busy cores, arrays still go out as binary frames"):format(SOAK), function()
    for _ = 1, 2 do S.spawn(("%s -e 'local t = os.time() + %d while os.time() < t do end'"):format(S.luajit, SOAK + 60)) end
    local bad, seen, own = {}, 0, 0
    -- the flood round's own pub ({"step":-1}, no array: allowed to the soak
    -- principal, so every subscriber of the channel gets it, as JSON text;
    -- it reaches the gateway only when the round's 8 requests in flight
    -- have room for it, which is timing)
    local function own_pub(m)
      if not m.binary and type(m.ev) == "table" and m.ev.step == -1 and next(m.ev, next(m.ev)) == nil then
        own = own + 1
        return true
      end
    end
    local function ws_check(m)
      if m.binary and type(m.ev) == "table" and type(m.ev.field) == "table" and m.ev.field.dtype == "<f8" then
        seen = seen + 1
      elseif own_pub(m) then
      elseif m.ev ~= nil or m.error then
        bad[#bad + 1] = cjson.encode(m):sub(1, 200)
      end
    end
    local lseen = 0
    local function lines_check(m)
      if type(m.ev) == "table" and type(m.ev.field) == "table" and m.ev.field.dtype == "<f8" then
        lseen = lseen + 1
      elseif own_pub(m) then
      elseif m.ev ~= nil or m.error then
        bad[#bad + 1] = "lines: " .. cjson.encode(m):sub(1, 200)
      end
    end
    local mon = assert(ws(hp))
    mon:send_json{ op = "sub", id = 1, ch = "atmosphere.field" }
    local lmon = assert(W.lines("127.0.0.1", lp))
    lmon:send_json{ op = "auth", id = 0, token = "soak-token-0123456789abc" }
    lmon:send_json{ op = "sub", id = 1, ch = "atmosphere.field" }
    local held, prod = {}, nil
    local rng = 0
    local deadline = socket.gettime() + SOAK
    local round = 0
    while socket.gettime() < deadline do
      round = round + 1
      rng = rng + 1
      local k = round % 12
      pcall(function()
        if k == 0 then
          -- subscribe, read a little, go
          local c = ws(hp)
          if c then
            c:send_json{ op = "sub", id = 1, ch = "atmosphere.field" }
            drain(c, 0.2, ws_check)
            c:close()
          end
        elseif k == 1 then
          -- a slow client with a 4 KiB receive buffer that never reads, left
          -- for a few rounds then dropped without a word
          local c = ws(hp, { rcvbuf = 4096 })
          if c then
            c:send_json{ op = "sub", id = 1, ch = "atmosphere.field" }
            held[#held + 1] = c
            if #held > 3 then table.remove(held, 1):close() end
          end
        elseif k == 2 then
          -- bad frames of every kind, each on its own connection
          local frames = {
            function(c) c:send_frame(true, 1, "{}", { mask = false }) end,
            function(c) c.s:send(string.char(0xF1, 0x80, 0, 0, 0, 0)) end,
            function(c) c:send_frame(true, 3, "x") end,
            function(c) c:send_frame(false, 9, "p") end,
            function(c) c:send_frame(true, 0, "orphan") end,
            function(c) c:send_frame(true, 1, "x", { len = 1e9 }) end,
            function(c) c:send_frame(true, 8, "\3\232\255\254") end,
            function(c) c:send_frame(true, 1, "\255\254\253") end,
            function(c) c:send_frame(false, 1, "{\"op\":"); c:send_frame(true, 2, "\"list\"}") end,
            function(c) c.s:send(("\0\1\2\3\4\5\6\7"):rep(37):sub(3)) end,
          }
          for _, f in ipairs(frames) do
            local c = ws(hp)
            if c then
              c:send_json{ op = "sub", id = 1, ch = "atmosphere.field" }
              f(c)
              drain(c, 0.02, function() end)
              c:close()
            end
          end
        elseif k == 3 then
          -- a ping flood, with pings of every size a control frame may have
          local c = ws(hp)
          if c then
            c:send_json{ op = "sub", id = 1, ch = "atmosphere.field" }
            for i = 1, 300 do c:send_frame(true, 9, ("p"):rep(i % 126)) end
            drain(c, 0.1, ws_check)
            c:close()
          end
        elseif k == 4 then
          -- floods of requests: list, clients, pub of all kinds of values
          local c = ws(hp)
          if c then
            for i = 1, 100 do
              c:send_json{ op = "list", id = i }
              c:send_json{ op = "clients", id = -i }
              c:send_json{ op = "pub", ch = "soak.junk" .. i % 5,
                           data = { i = i, s = ("x"):rep(i), t = { 1, { 2, { 3 } } }, f = 0.5, b = true } }
            end
            c:send_json{ op = "pub", id = 7, ch = "atmosphere.steer", data = { nosuch = 1 }, sync = true }
            c:send_json{ op = "pub", ch = "atmosphere.field", data = { step = -1 } }
            drain(c, 0.1, function() end)
            c:close()
          end
        elseif k == 5 then
          -- modulators: arrays emitted at the producer, failures, nonsense
          local c = ws(hp)
          if c then
            for i, src in ipairs(MODS) do
              c:send_json{ op = "sub", id = i, ch = i % 2 == 0 and "atmosphere.field" or "soak.junk1", modulator = src }
            end
            drain(c, 0.5, function() end)
            c:close()
          end
        elseif k == 6 then
          -- JSON lines: junk, a sub, requests, a half line, gone
          local l = W.lines("127.0.0.1", lp)
          if l then
            l:send_raw("not json\n{\"op\":\"nosuch\"}\n\0\1\2\n")
            l:send_json{ op = "auth", token = "soak-token-0123456789abc" }
            l:send_json{ op = "sub", id = 1, ch = "atmosphere.field" }
            l:send_json{ op = "list", id = 2 }
            l:send_raw("{\"op\":\"li")
            socket.sleep(0.05)
            l:close()
          end
        elseif k == 7 then
          -- auth with bad tokens and signatures, a bad bearer token, a viewer
          -- that may not produce
          W.connect("127.0.0.1", hp, { headers = { "Authorization: Bearer wrong-token-0123456789" } })
          local v = ws(hp, { headers = { "Authorization: Bearer viewer-token-0123456789" } })
          if v then
            v:send_json{ op = "sub", id = 1, ch = "atmosphere.field" }
            v:send_json{ op = "pub", id = 2, ch = "atmosphere.steer", data = { emission = 1 } }
            v:send_json{ op = "sub", id = 3, ch = "atmosphere.field", modulator = MODS[1] }
            drain(v, 0.1, ws_check)
            v:close()
          end
          local c = ws(hp, { headers = {} })
          if c then
            c:send_json{ op = "auth", token = "nope" }
            c:send_json{ op = "auth", key = ("0"):rep(64), sig = ("f"):rep(128) }
            c:send_json{ op = "auth", token = "guess-guess-guess-guess" }
            c:send_json{ op = "sub", id = 1, ch = "atmosphere.field" }
            drain(c, 0.1, function() end)
            c:close()
          end
        elseif k == 8 then
          -- a producer of arrays on the field's channel, killed mid-run
          if prod then P.kill(prod, "KILL") prod = nil
          else
            prod = S.lua([[
local lecho = require "lecho"
local ctx = lecho.context{ nameserver = arg[1], quiet = true }
local p = assert(ctx:channel("atmosphere.field"):producer())
local arr = lecho.array
local i = 0
while true do
  i = i + 1
  p:submit{ step = -i, field = arr.new("<f8", { 2, 18, 36 }), big = (i % 5 == 0) and arr.new("<u1", { 300000 }) or nil,
            list = { arr.new("<i4", { 3 }), "s" } }
  ctx:sleep(0.02)
end]], ns)
          end
        elseif k == 9 then
          -- HTTP requests that are not a WebSocket handshake, the page
          for _, req in ipairs({ "GET / HTTP/1.1\r\nHost: x\r\n\r\n", "GET /nosuch HTTP/1.1\r\n\r\n",
                                 "POST /ws HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello", ("A"):rep(9000) }) do
            local s = socket.tcp()
            s:settimeout(1)
            if s:connect("127.0.0.1", hp) then s:send(req); s:receive(10) end
            s:close()
          end
        elseif k == 10 then
          -- sub/unsub churn on one connection
          local c = ws(hp)
          if c then
            for i = 1, 20 do
              c:send_json{ op = i % 2 == 1 and "sub" or "unsub", id = i, ch = "atmosphere.field" }
            end
            drain(c, 0.1, ws_check)
            c:close()
          end
        else
          -- a message over the size limit
          local c = ws(hp)
          if c then
            c:send_frame(true, 1, ("x"):rep(70000))
            drain(c, 0.05, function() end)
            c:close()
          end
        end
      end)
      drain(mon, 0.05, ws_check)
      drain(lmon, 0.05, lines_check)
      assert.truthy(S.alive(gw), "the gateway exited: " .. S.errors(gw))
    end
    for _, c in ipairs(held) do c:close() end
    if prod then P.kill(prod, "KILL") end
    -- a fresh client after the soak
    local c = assert(ws(hp))
    c:send_json{ op = "sub", id = 1, ch = "atmosphere.field" }
    local fresh
    local until_t = socket.gettime() + 10
    while not fresh and socket.gettime() < until_t do
      local m = c:json(1)
      if m and m.ch == "atmosphere.field" then fresh = m end
    end
    if os.getenv("LECHO_SOAK_LOG") then
      io.stderr:write(("soak: %d rounds, monitors saw %d and %d fields, %d of the flood's own pubs\n"):format(round, seen, lseen, own))
      io.stderr:write(S.errors(gw):sub(-6000), "\n")
    end
    assert.truthy(fresh, "no atmosphere.field event after the soak")
    assert.is_true(fresh.binary, cjson.encode(fresh):sub(1, 300))
    assert.are.same({ 2, 18, 36 }, fresh.ev.field.shape)
    assert.are.same({}, bad)
    assert.truthy(seen > 0 and lseen > 0, ("monitors saw %d and %d fields"):format(seen, lseen))
    c:close()
  end)
end)
