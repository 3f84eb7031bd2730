-- Params in band (issue 27 item 6, doc/modulators.md "Ordering",
-- doc/protocol.md section 5 `params`): set_params is one message to each
-- producer and its reply, on the stream the consumer already has; events
-- are neither lost nor doubled across the switch, each carries the version
-- of the params it was made with, those after the reply the new ones; a
-- producer that dies during the change does not hold it.  And the new
-- message is believed only from the one consumer of the instance: params
-- from a stranger, from another consumer, for a shared instance, replayed
-- after a newer one, with a made-up key: refused, one log line, no effect.

local S = require "spec.support"
local cjson = require "cjson"
local lecho = require "lecho"

-- A producer of "field" (spec/children.lua: events { i = 1..a.n }
-- every 2 ms in fives, then a sync { done } (so every event before it
-- reached the consumer), then it stays for a.linger seconds: the attacks
-- run meanwhile) and the modulator that tags events with params.tag.
local K = require "spec.children"
local PRODUCER, TAG = K.field_producer, K.tag_modulator

-- The consumer side in this process: per producer, every i once, tag ==
-- meta.params_version, versions never going down.
local function watcher(ctx, nprod)
  local w = { seen = {}, bad = {}, dups = 0, dones = 0, last = {}, n = 0 }
  w.handler = function(ev, meta)
    if ev.done then w.dones = w.dones + 1 return end
    w.n = w.n + 1
    local key = meta.producer .. ":" .. ev.i
    if w.seen[key] then w.dups = w.dups + 1 end
    w.seen[key] = true
    if ev.tag ~= meta.params_version then
      w.bad[#w.bad + 1] = ("%s i=%d tag=%s version=%s"):format(meta.producer, ev.i, tostring(ev.tag),
                                                            tostring(meta.params_version))
    end
    local l = w.last[meta.producer]
    if l and meta.params_version < l then w.bad[#w.bad + 1] = "version went down at " .. key end
    w.last[meta.producer] = meta.params_version
    if w.on_event then w.on_event(ev, meta) end
  end
  w.nprod = nprod
  return w
end

local function nstreams(ch)
  local n = 0
  for _ in pairs(ch.streams) do n = n + 1 end
  return n
end

describe("params in band", function()
  after_each(function() S.cleanup() end)

  it("switch on the same stream: none lost or doubled, each event tagged with its params, under busy cores",
     function()
    S.busy_loops(2)
    local _, ns = S.nameserver("--quiet")
    local ctx = lecho.context{ nameserver = ns, quiet = true }
    local ch = ctx:channel("field")
    local w = watcher(ctx)
    local con = assert(ch:consumer(w.handler, { modulator = TAG, params = { tag = 1 } }))
    local N = 1500
    local prod = S.lua(PRODUCER, cjson.encode{ ns = ns, n = N })
    assert(S.run_until(ctx, function() return w.n >= 50 end, 30), "no events: " .. S.errors(prod))
    -- twenty changes while events flow; after each reply, the next event
    -- of the producer is made with the new params
    local after = {}
    w.on_event = function(ev, meta)
      -- once set_params returned, nothing made with older params comes
      if after.want and ev.tag < after.want then after.wrong = (after.wrong or 0) + 1 end
      if after.want and not after.first then after.first = ev.tag end
    end
    -- the first change gives the consumer a stream of its own (through
    -- the manager); the next ones go in band on it
    assert.is_true(con:set_params{ tag = 2 })
    -- (what the first stream still brings goes to its demodulator until its end)
    assert(S.run_until(ctx, function() return nstreams(ch) == 1 end, 20), "the first stream did not end")
    local streams = {}
    for v = 3, 22 do
      local ok, err = con:set_params{ tag = v }
      assert.is_true(ok, err)
      assert.are.equal(v, con:params_version())
      after.want, after.first = v, nil
      assert(S.run_until(ctx, function() return after.first ~= nil end, 10), "no event after change " .. v)
      assert.is_true(after.first >= v)          -- the first event after the reply: the new params
      streams[#streams + 1] = nstreams(ch)
      if w.n >= N - 100 then break end
    end
    assert(S.run_until(ctx, function() return w.dones == 1 end, 60), "no end: " .. S.errors(prod))
    assert.are.equal(0, #w.bad, table.concat(w.bad, "\n"))
    assert.are.equal(0, w.dups)
    assert.are.equal(N, w.n)                     -- every event once
    assert.is_nil(after.wrong)
    -- one stream all along: no new stream per change (the manager's path
    -- made one each time)
    for _, n in ipairs(streams) do assert.are.equal(1, n) end
    ctx:close()
  end)

  it("a producer that dies during the change does not hold it; the live one switches", function()
    local _, ns = S.nameserver("--quiet")
    local ctx = lecho.context{ nameserver = ns, quiet = true, timeout = 3 }
    local ch = ctx:channel("field")
    local w = watcher(ctx)
    local con = assert(ch:consumer(w.handler, { modulator = TAG, params = { tag = 1 } }))
    local p1 = S.lua(PRODUCER, cjson.encode{ ns = ns, n = 100000 })
    local p2 = S.lua(PRODUCER, cjson.encode{ ns = ns, n = 3000 })
    local from = {}
    w.on_event = function(_, meta) from[meta.producer] = true end
    assert(S.run_until(ctx, function()
      local n = 0
      for _ in pairs(from) do n = n + 1 end
      return n == 2
    end, 30), "not both producers: " .. S.errors(p1) .. S.errors(p2))
    assert.is_true(con:set_params{ tag = 2 })    -- (to a stream of its own, both alive)
    S.sh("kill -9 " .. p1.pid)
    local t0 = ctx:now()
    local ok, err = con:set_params{ tag = 3 }
    local took = ctx:now() - t0
    assert.is_true(ok, err)
    assert.is_true(took < 7, "set_params took " .. took .. " s")
    local p2name
    for name in pairs(from) do
      if name:find(S.output(p2):match("ready (%S+)") or "?", 1, true) then p2name = name end
    end
    local newtag
    w.on_event = function(ev, meta) if meta.producer == p2name then newtag = ev.tag end end
    assert(S.run_until(ctx, function() return newtag ~= nil end, 20), "p2 sent nothing after the change")
    assert.are.equal(3, newtag)
    assert(S.run_until(ctx, function() return w.dones >= 1 end, 60), "p2 did not end: " .. S.errors(p2))
    assert.are.equal(0, #w.bad, table.concat(w.bad, "\n"))
    assert.are.equal(0, w.dups)
    local n2 = 0
    for k in pairs(w.seen) do if k:sub(1, #p2name + 1) == p2name .. ":" then n2 = n2 + 1 end end
    assert.are.equal(3000, n2)                   -- none of the live producer's lost
    ctx:close()
  end)
end)

describe("params in band, believed only from the instance's one consumer", function()
  after_each(function() S.cleanup() end)

  it("refuses a stranger, another consumer, a shared instance, a replay and a made-up key", function()
    local R = require "spec.support.rogue"
    local _, ns = S.nameserver("--quiet")
    local ctx = lecho.context{ nameserver = ns, quiet = true }
    local ctx2 = lecho.context{ nameserver = ns, quiet = true }
    local ch, ch2 = ctx:channel("field"), ctx2:channel("field")
    local w = watcher(ctx)
    local con = assert(ch:consumer(w.handler, { modulator = TAG, params = { tag = 1 } }))
    -- ctx2: a consumer of another modulator of the channel
    local other = assert(ch2:consumer(function() end, { modulator = TAG .. " -- other", params = { tag = 1 } }))
    local prod = S.lua(PRODUCER, cjson.encode{ ns = ns, n = 30000, linger = 1 })
    local paddr = assert(S.wait_file(prod.out, "ready", 20), S.errors(prod)):match("ready (%S+)")
    local function serve(t)
      local deadline = ctx:now() + t
      while ctx:now() < deadline do ctx:run_once(0.01); ctx2:run_once(0.01) end
    end
    assert(S.run_until(ctx, function() ctx2:run_once(0) return w.n >= 20 end, 30))
    assert.is_true(con:set_params{ tag = 7 })
    local m = con.mod
    local function msg(over)
      local t = { op = "params", ch = ch.name, stream = m.stream, key = m.key, pseq = m.pseq,
                  params = { tag = 7 } }
      for k, v in pairs(over or {}) do t[k] = v end
      return t
    end
    local stream_key = require("lecho.modulator").stream_key or function() return "x" end  -- (before: none)
    local function forged_key(params) return stream_key(m.base, params, m.stream) end
    local function ask(c, over)
      local r, err, code = c:request(paddr, msg(over), 5)
      return r, err, code
    end
    -- another consumer of the channel, naming our stream
    local r, err, code = ask(ctx2, { key = forged_key{ tag = 99 }, pseq = 1000, params = { tag = 99 } })
    assert.is_nil(r); assert.are.equal("refused", code, err)
    assert.matches("is not a consumer of the modulator on stream", err)
    -- a stranger (a rogue peer speaking the wire protocol)
    local p = assert(R.dial(paddr, { addr = "127.0.0.1:9" }))
    p:ctrl(msg{ rid = 77, key = forged_key{ tag = 66 }, pseq = 2000, params = { tag = 66 } })
    local rr = p:reply(77, 5)
    assert(rr and rr.ok == false, cjson.encode(rr or {}))
    assert.matches("127.0.0.1:9 is not a consumer", rr.err)
    -- params_at from the stranger: ignored here
    p:ctrl{ op = "params_at", ch = ch.name, stream = m.stream, key = m.key }
    p:close()
    -- a replay of an older change, from the consumer itself
    r, err, code = ask(ctx, { key = forged_key{ tag = 3 }, pseq = m.pseq - 1, params = { tag = 3 } })
    assert.is_nil(r); assert.are.equal("refused", code); assert.matches("an older change", err)
    -- a key that is not the hash of the code, these params and the stream
    r, err, code = ask(ctx, { key = forged_key{ tag = 8 }, pseq = m.pseq + 1, params = { tag = 5 } })
    assert.is_nil(r); assert.are.equal("refused", code); assert.matches("not the hash", err)
    -- none of them changed anything: the next events are still tag 7
    local tags = {}
    w.on_event = function(ev) tags[ev.tag] = (tags[ev.tag] or 0) + 1 end
    serve(0.5)
    assert.are.same({ [7] = tags[7] }, tags)
    -- shared: ctx2 and a second consumer here ask for one modulator (one
    -- instance at the producer): the in-band request is refused as busy,
    -- set_params goes through the manager (a stream of its own)
    local shared = {}
    assert(ch2:consumer(function(ev) shared[#shared + 1] = ev.tag end,
                        { modulator = TAG, params = { tag = 50 } }))
    local mine = {}
    local con_b = assert(ch:consumer(function(ev, meta) mine[#mine + 1] = { ev.tag, meta.params_version } end,
                                     { modulator = TAG, params = { tag = 50 } }))
    serve(0.3)
    m = con_b.mod
    r, err, code = ask(ctx, { key = forged_key{ tag = 4 }, pseq = 9999, params = { tag = 4 } })
    assert.is_nil(r); assert.are.equal("busy", code, err)
    assert.is_true(con_b:set_params{ tag = 51 })
    assert.are.equal(2, con_b:params_version())
    mine, shared = {}, {}
    serve(0.5)
    assert.is_true(#shared > 0 and #mine > 0)
    for _, t in ipairs(shared) do assert.are.equal(50, t) end   -- ctx2's stays as it was
    -- the params our consumer started with, asked for by ctx2 now: its own
    -- instance (our stream is no modulator's key), tag 1
    local first = {}
    assert(ch2:consumer(function(ev) first[#first + 1] = ev.tag end, { modulator = TAG, params = { tag = 1 } }))
    serve(0.5)
    assert.is_true(#first > 0, S.errors(prod))
    for _, t in ipairs(first) do assert.are.equal(1, t) end
    -- through the manager (the instance was shared): the old stream's last
    -- events may still come after set_params returned, each labelled with
    -- the params it was made with (version 1, tag 50); after the first
    -- event of the new params none of the old ones
    local new_seen = false
    for _, t in ipairs(mine) do
      if new_seen then assert.are.same({ 51, 2 }, t) end
      if t[2] == 2 then new_seen = true end
      assert.is_true((t[1] == 50 and t[2] == 1) or (t[1] == 51 and t[2] == 2), cjson.encode(t))
    end
    assert.is_true(new_seen, cjson.encode(mine))
    -- one log line per kind in the producer: "refusing params from ..."
    local log = S.errors(prod)
    local lines = S.count(log, "refusing params from")
    assert.is_true(lines >= 1 and lines <= 2, log)   -- one per 10 s (and the count of the others)
    assert.matches("refusing params from", log)
    ctx2:close(); ctx:close()
  end)
end)

describe("params in band, keyed", function()
  local T = require "spec.support.trust_world"
  local w
  after_each(function() T.stop(w); w = nil end)

  it("switch on the same stream; a trusted key that is no consumer, or claims the consumer's address, changes nothing",
     function()
    w = T.start{ mode = "keyed", duration = 30 }
    local ctx = assert(lecho.context{ nameserver = w.ns, key = w.ids.cons2.key, trust = w.ids.trust, quiet = true })
    local ch = ctx:channel(T.CHANNEL)
    local got = {}
    local con = assert(ch:consumer(function(ev, meta) got[#got + 1] = { ev.tag, meta.params_version } end,
                                   { modulator = TAG, params = { tag = 1 } }))
    assert(S.run_until(ctx, function() return #got >= 5 end, 20), "no events: " .. S.errors(w.prod))
    assert.is_true(con:set_params{ tag = 2 })    -- (to a stream of its own)
    assert(S.run_until(ctx, function() return nstreams(ch) == 1 end, 20))
    local _, st0 = next(ch.streams)
    assert.is_true(con:set_params{ tag = 3 })
    got = {}
    assert(S.run_until(ctx, function() return #got >= 5 end, 20))
    for _, g in ipairs(got) do assert.are.same({ 3, 3 }, g) end
    assert.are.equal(1, nstreams(ch))            -- in band: the same stream
    local _, st1 = next(ch.streams)
    assert.are.equal(st0.chid, st1.chid)
    local m = con.mod
    local key = require("lecho.modulator").stream_key or function() return "x" end
    local msg = { op = "params", rid = 5, ch = ch.name, stream = m.stream, pseq = m.pseq + 1,
                  key = key(m.base, { tag = 9 }, m.stream), params = { tag = 9 } }
    -- mallory: trusted, allowed nothing, at an address of its own
    local p = assert(T.dial(w, w.prod.addr, "mallory"))
    p:ctrl(msg)
    local r = p:reply(5, 5)
    assert(r and r.ok == false and r.code == "refused", cjson.encode(r or {}))
    -- mallory claiming our address: the member list pinned it to our key
    local p2 = T.dial(w, w.prod.addr, "mallory", ctx.addr)
    if p2 then
      p2:ctrl(msg)
      local r2 = p2:reply(5, 3)
      assert(not (r2 and r2.ok), cjson.encode(r2 or {}))
    end
    got = {}
    assert(S.run_until(ctx, function() return #got >= 5 end, 20))
    for _, g in ipairs(got) do assert.are.same({ 3, 3 }, g) end
    assert.matches("refusing params from", S.errors(w.prod))
    ctx:close()
  end)
end)
