-- An outside attack on issue 27's changes (the MOE batches, the direct
-- install, the data plane's reused messages): each case a way a careless
-- user or a rogue peer broke the contract on main 874af8a, run in a child
-- process where the break was a crash.
local S = require "spec.support"

-- A context of this process (its caller closes it) with a producer of
-- channel `name` whose last member list is `members` (addresses nobody
-- listens at), each at list sequence 1, with the modulators `mods` (none
-- when nil): for the cases that hand the producer an install as from one
-- of them (ch:_install_req).  Returns the context and the channel.
local function producer_listing(name, members, mods)
  local c = require("lecho").context{ quiet = true }
  local ch = c:channel(name)
  assert(ch:producer())
  local lsseq = {}
  for _, a in ipairs(members) do lsseq[a] = 1 end
  ch.last_members = { list = members, mods = mods or {} }
  ch.lsseq = lsseq
  return c, ch
end

-- A producer with a local modulated consumer whose modulator logs (the
-- `log` capability granted) and whose context's log hook runs arg[1]'s
-- action once, from inside the modulator's call (during a batch): the
-- hook's pcall result goes to stdout, then the script delivers what it can
-- and says "done".
local HOOKED = [[
local lecho = require "lecho"
local mode = arg[1]
local c = lecho.context{ quiet = true }
local ch = c:channel("re")
local p = assert(ch:producer{ grant = { "log" } })
local cons
local n, got, errs = 0, {}, {}
c.log = function(msg)
  if not msg:match("^modulator") then return end
  n = n + 1
  if n ~= 3 then return end
  local ok, err
  if mode == "close" then
    ok, err = pcall(c.close, c)
  elseif mode == "unload" then
    -- the consumer closed (its producer here unloads the modulator at the
    -- next loop turns), then turns of the loop: from inside the call
    ok, err = pcall(function()
      cons:close()
      for _ = 1, 6 do c:run_once(0.01) end
    end)
  end
  io.stdout:write("hook ", tostring(ok), " ", tostring(err), "\n"); io.stdout:flush()
end
cons = assert(ch:consumer(function(ev) got[#got + 1] = ev end,
  { capabilities = { "log" }, modulator = "function enqueue(ev) log('x', ev) return ev end",
    on_error = function(e) errs[#errs + 1] = tostring(e) end }))
for i = 1, 10 do assert(p:submit(i)) end
c:flush()
-- turns until the ten came (or 20 s), where the consumer stays: local
-- events run from the loop's idle watcher, which a turn with a timer due
-- skips, so one turn was a margin of this process's own work (under make
-- asan at load 13-18, asan7: "got 0 errs 0"; so with a timer due at once)
local deadline = c:now() + 20
repeat c:run_once(0.05) until mode ~= "close" or #got + #errs >= 10 or c:now() > deadline
io.stdout:write("got ", #got, " errs ", #errs, "\n")
c:close()
io.stdout:write("done\n"); io.stdout:flush()
]]

describe("issue 27 attacked: a log hook during a modulator's batch", function()
  after_each(function() S.cleanup() end)

  -- HOOKED with action mode: it ended (status 0), its hook's call was
  -- refused naming the modulator, it said "done"; its stdout.
  local function hooked(mode)
    local v = S.lua(HOOKED, mode)
    local ok, rc = S.wait(v, 30)
    assert.is_true(ok)
    assert.are.equal(0, rc, S.output(v) .. S.errors(v))
    local out = S.output(v)
    assert.matches("hook false [^\n]*modulator", out)
    assert.matches("done", out)
    return out
  end

  -- main 874af8a: segfault (the state closed under its own running call:
  -- ctx_close freed every modulator from inside moe.c's enq_one)
  it("closing the context there is refused, the process lives", function()
    assert.matches("got 10 errs 0", hooked("close"))
  end)

  -- main 874af8a: segfault (the nested turn ran the consumer's close: its
  -- install unloaded the modulator whose batch was running)
  it("a loop turn there is refused, the modulator is not freed under its call", function()
    hooked("unload")
  end)
end)

-- A producer of "field": events { i } every 5 ms for 30 s.
local FIELD = [[
local lecho = require "lecho"
local ctx = lecho.context{ nameserver = arg[1], quiet = true }
local p = assert(ctx:channel("field"):producer())
io.stdout:write("ready ", ctx.addr, "\n"); io.stdout:flush()
local i = 0
ctx:every(0.005, function() i = i + 1; p:submit{ i = i } end)
ctx:after(30, function() ctx:stop() end)
ctx:run()
ctx:close()
]]

describe("issue 27 attacked: a modulator key squatted through the manager", function()
  after_each(function() S.cleanup() end)

  -- main 874af8a: the victim's direct install (its key checked as the hash
  -- of its code) joined the instance the rogue's subscription had put
  -- under that key (neither the manager nor the producer hashes a member
  -- list's keys): the victim's handler got the rogue's code's events,
  -- {tag = "forged"}, as its own modulator's output.  Through the manager
  -- alone (no direct install) the victim's consumer is refused: the key is
  -- taken (a denial, never a forgery).
  it("never gives a consumer another context's code's output as its own modulator's", function()
    local lecho = require "lecho"
    local modulator = require "lecho.modulator"
    for _ = 1, 2 do S.spawn(("%s -e 'local t = os.time() + 60 while os.time() < t do end'"):format(S.luajit)) end
    local _, ns = S.nameserver("--quiet")
    local prod = S.lua(FIELD, ns)
    assert(S.wait_file(prod.out, "ready", 20), S.errors(prod))
    local TAG = "function enqueue(ev) ev.tag = params.tag return ev end"
    local EVIL = "function enqueue(ev) ev.tag = 'forged' return ev end"
    local key = modulator.spec(TAG, { tag = 1 }, nil, nil, 1).key  -- the victim's, from its code
    -- the rogue: a member (a plain consumer), then a subscription naming
    -- the victim's key with its own code
    local rogue = lecho.context{ nameserver = ns, quiet = true }
    local rch = rogue:channel("field")
    local rn = 0
    assert(rch:consumer(function() rn = rn + 1 end))
    assert(S.run_until(rogue, function() return rn > 3 end, 20), S.errors(prod))
    local r, err = rogue:request(rch.manager, { op = "subscribe", ch = rch.name,
      subs = { plain = true, sseq = 1e6, mods = { [key] = { src = EVIL, params = { tag = 1 }, caps = {} } } } }, 10)
    local squatted = r ~= nil
    -- the manager hashes the keys it is given: refused there
    assert.is_nil(r)
    assert.matches("is not the hash of its code", tostring(err))
    -- the victim: a member (a plain consumer), then the consumer with TAG
    local v = lecho.context{ nameserver = ns, quiet = true }
    local vch = v:channel("field")
    local vn = 0
    assert(vch:consumer(function() vn = vn + 1 end))
    local function serve(t)
      local deadline = v:now() + t
      while v:now() < deadline do v:run_once(0.005); rogue:run_once(0.005) end
    end
    assert(S.run_until(v, function() rogue:run_once(0) return vn > 3 end, 20))
    local tags = {}
    local con, cerr = vch:consumer(function(ev) tags[tostring(ev.tag)] = (tags[tostring(ev.tag)] or 0) + 1 end,
                                   { modulator = TAG, params = { tag = 1 } })
    -- (until the first events through it, forged or not: busy cores)
    S.run_until(v, function() rogue:run_once(0) return next(tags) ~= nil end, 15)
    serve(0.5)
    -- a refusal (the key taken) or the victim's own code: never the rogue's
    assert.is_nil(tags.forged, ("squatted %s (%s); consumer %s (%s): %s"):format(
      tostring(squatted), tostring(err), tostring(con), tostring(cerr), require("cjson").encode(tags)))
    if con then assert.is_true((tags["1"] or 0) > 0, require("cjson").encode(tags)) end
    v:close(); rogue:close()
  end)
end)

describe("issue 27 attacked: a producer whose list put other code under a key", function()
  -- a manager that did not hash its keys (874af8a's) put the rogue's code
  -- under the victim's key in its list: the producer takes the victim's
  -- install (its key is its code's hash) but does not join it to that
  -- instance.  On 874af8a: taken (true), the victim joined to it.
  it("refuses an install that would join an instance of other code", function()
    local modulator = require "lecho.modulator"
    local TAG = "function enqueue(ev) ev.tag = params.tag return ev end"
    local EVIL = "function enqueue(ev) ev.tag = 'forged' return ev end"
    local spec = modulator.spec(TAG, { tag = 1 }, nil, nil, 1)
    local key = spec.key
    local victim, rogue = "127.0.0.1:7", "127.0.0.1:9"
    -- the list as such a manager made it: both members, the rogue's code under key
    local mods = { [key] = { src = EVIL, params = { tag = 1 }, caps = {}, base = spec.base, dests = { rogue } } }
    local c, ch = producer_listing("sq", { victim, rogue }, mods)
    ch.mods[key] = { key = key, spec = mods[key], runs = mods[key], dests = { rogue } }  -- (runs: what it runs)
    local ok, why, code = ch:_install_req(victim, { op = "install", ch = ch.name, sseq = 2,
      mods = { [key] = { src = TAG, params = { tag = 1 }, caps = {} } } })
    ch.mods[key] = nil
    c:close()
    assert.is_nil(ok)
    assert.are.equal("refused", code)
    assert.matches("runs other code", why)
  end)
end)

-- A producer whose log hook turns the loop (a careless "keep serving while
-- logging"), a granted `log` modulator of a remote consumer logging each
-- event: the events go through its batches, and the hook runs inside them.
local LOOPY = [[
local lecho = require "lecho"
local ctx = lecho.context{ nameserver = arg[1], quiet = true }
local p = assert(ctx:channel("rt"):producer{ grant = { "log" } })
local refused = 0
ctx.log = function(msg)
  if not msg:match("^modulator") then return end
  for _ = 1, 60 do   -- (10 lines a second: the hook turns the loop most of the time)
    local ok, err = pcall(ctx.run_once, ctx, 0.002)
    if not ok then
      refused = refused + 1
      if refused == 1 then io.stdout:write("refused ", tostring(err), "\n"); io.stdout:flush() end
      break
    end
  end
end
io.stdout:write("ready\n"); io.stdout:flush()
local i = 0
ctx:every(0.002, function() for _ = 1, 5 do i = i + 1; p:submit(i) end end)
ctx:after(25, function() ctx:stop() end)
ctx:run()
io.stdout:write("alive\n"); io.stdout:flush()
ctx:close()
]]

describe("issue 27 attacked: a remote consumer's close while the producer's log hook turns the loop", function()
  after_each(function() S.cleanup() end)

  -- main 874af8a: the producer segfaulted (the close's install, read in
  -- the hook's turn, unloaded the modulator whose batch was running): a
  -- remote consumer's ordinary close cost the producing process
  it("costs the producer nothing", function()
    local lecho = require "lecho"
    local _, ns = S.nameserver("--quiet")
    local prod = S.lua(LOOPY, ns)
    assert(S.wait_file(prod.out, "ready", 20), S.errors(prod))
    local v = lecho.context{ nameserver = ns, quiet = true }
    local ch = v:channel("rt")
    local n, m = 0, 0
    assert(ch:consumer(function() n = n + 1 end))
    assert(S.run_until(v, function() return n > 10 end, 20), S.errors(prod))
    for round = 1, 3 do
      local con = assert(ch:consumer(function() m = m + 1 end,
        { capabilities = { "log" }, modulator = "function enqueue(ev) log('ev', ev) return ev end" }))
      local m0 = m
      assert(S.run_until(v, function() return m > m0 + 5 end, 20), "round " .. round .. ": " .. S.errors(prod))
      con:close()
      S.run_until(v, function() return false end, 0.5)
      assert.is_true(S.alive(prod), "round " .. round .. ": the producer died: " .. S.errors(prod))
    end
    local n0 = n
    assert(S.run_until(v, function() return n > n0 + 10 end, 20), "no more events: " .. S.errors(prod))
    v:close()
    S.kill(prod, "TERM")
  end)
end)

describe("issue 27 attacked: a key squatted through the manager, keyed", function()
  local T = require "spec.support.trust_world"
  local w
  after_each(function() T.stop(w); w = nil end)

  -- main 874af8a: cons2 (allowed consume and modulate, as cons) put its
  -- code under cons's key at the manager; cons's direct install joined it
  it("never gives cons another principal's code's output as its own modulator's", function()
    local lecho = require "lecho"
    local modulator = require "lecho.modulator"
    w = T.start{ mode = "keyed", duration = 40 }
    local TAG = "function enqueue(ev) if type(ev) == 'table' then ev.tag = params.tag end return ev end"
    local EVIL = "function enqueue(ev) if type(ev) == 'table' then ev.tag = 'forged' end return ev end"
    local key = modulator.spec(TAG, { tag = 1 }, nil, nil, 1).key
    local rogue = assert(lecho.context{ nameserver = w.ns, key = w.ids.cons2.key, trust = w.ids.trust, quiet = true })
    local v
    -- (closed whatever happens: a keyed context left open when busted
    -- closes its state segfaults it, hiding the failure's report)
    finally(function() if v then v:close() end rogue:close() end)
    local rch = rogue:channel(T.CHANNEL)
    local rn = 0
    assert(rch:consumer(function() rn = rn + 1 end))
    assert(S.run_until(rogue, function() return rn > 3 end, 20), S.errors(w.prod))
    local r, err = rogue:request(rch.manager, { op = "subscribe", ch = rch.name,
      subs = { plain = true, sseq = 1e6, mods = { [key] = { src = EVIL, params = { tag = 1 }, caps = {} } } } }, 10)
    v = assert(lecho.context{ nameserver = w.ns, key = w.ids.cons.key, trust = w.ids.trust, quiet = true })
    local vch = v:channel(T.CHANNEL)
    local vn = 0
    assert(vch:consumer(function() vn = vn + 1 end))
    assert(S.run_until(v, function() rogue:run_once(0) return vn > 3 end, 20))
    local tags = {}
    local con, cerr = vch:consumer(function(ev)
      local t = type(ev) == "table" and tostring(ev.tag) or "?"
      tags[t] = (tags[t] or 0) + 1
    end, { modulator = TAG, params = { tag = 1 } })
    S.run_until(v, function() rogue:run_once(0) return next(tags) ~= nil end, 15)
    local deadline = v:now() + 0.5
    while v:now() < deadline do v:run_once(0.005); rogue:run_once(0.005) end
    assert.is_nil(tags.forged, ("squatted %s (%s); consumer %s (%s): %s"):format(
      tostring(r ~= nil), tostring(err), tostring(con), tostring(cerr), require("cjson").encode(tags)))
    assert.is_nil(r)
    if con then assert.is_true((tags["1"] or 0) > 0, require("cjson").encode(tags)) end
  end)
end)

-- A keyed producer child (its key opts.key) of "temp", granting clock:
-- { i } every 20 ms.
local KPROD = [[
local cjson = require "cjson"
local lecho = require "lecho"
local opts = cjson.decode(arg[1])
local ctx = assert(lecho.context{ nameserver = opts.ns, key = opts.key, trust = opts.trust,
  listen = "127.0.0.1:0", timeout = 5, quiet = true })
local p = assert(ctx:channel("temp"):producer{ grant = { "clock" } })
io.stdout:write("ready ", ctx.addr, "\n"); io.stdout:flush()
local i = 0
ctx:every(0.02, function() i = i + 1; p:submit({ i = i }) end)
ctx:after(40, function() ctx:stop() end)
ctx:run()
ctx:close()
]]

-- A keyed name server child reading policy file opts.policy every 0.2 s:
-- "reloaded" on stdout each time it took a new one.
local KNS = [[
local cjson = require "cjson"
local lecho = require "lecho"
local opts = cjson.decode(arg[1])
local ctx = assert(lecho.context{ listen = "127.0.0.1:0", key = opts.key, trust = opts.trust,
  ticket_ttl = 9, policy_file = opts.policy, trust_poll = 0.2,
  log = function(m) if m:find("policy reloaded", 1, true) then io.stdout:write("reloaded\n"); io.stdout:flush() end end })
io.stdout:write("ready ", ctx.addr, "\n"); io.stdout:flush()
ctx:after(40, function() ctx:stop() end)
ctx:run()
ctx:close()
]]

describe("issue 27 attacked: a policy reload racing a direct install", function()
  local cjson = require "cjson"
  local lecho = require "lecho"
  local socket = require "socket"
  local v
  after_each(function()
    if v then pcall(v.close, v, { linger = 0 }) end
    v = nil
    S.cleanup()
  end)

  -- main 874af8a: the policy withdrew `modulate with clock` from cons
  -- between its direct install of a clock modulator and its subscription
  -- telling the manager (20 ms later): the manager, which knew of no such
  -- modulator, sent no list (the producer kept the old grants) and refused
  -- the subscription, which nobody heard of: the modulator ran on with the
  -- withdrawn capability, its events still coming 3 s after the reload,
  -- its consumer's on_error silent
  it("withdraws the capability from the directly installed modulator too, and says so", function()
    -- (two busy loops beside, as the users' machines have)
    for _ = 1, 2 do S.spawn(("%s -e 'local t = os.time() + 60 while os.time() < t do end'"):format(S.luajit)) end
    local dir = S.tmpname("atk-reload")
    S.certified_keys(dir, "nameserver prod cons")
    local trust, pol = { dir .. "/ca.pub" }, dir .. "/policy.json"
    local function policy(rules)
      S.write(pol .. ".tmp", cjson.encode{ lecho = "policy", version = 1, rules = rules })
      os.rename(pol .. ".tmp", pol)
    end
    local PROD = { principal = "prod", channel = "*", allow = { "produce" } }
    policy{ PROD, { principal = "cons", channel = "*", allow = { "consume", "modulate" }, caps = { "clock" } } }
    local nsc = S.lua(KNS, cjson.encode{ key = dir .. "/nameserver.key", trust = trust, policy = pol })
    local ns = assert(S.wait_file(nsc.out, "ready", 20), S.errors(nsc)):match("ready (%S+)")
    local prod = S.lua(KPROD, cjson.encode{ ns = ns, key = dir .. "/prod.key", trust = trust })
    assert(S.wait_file(prod.out, "ready", 20), S.errors(prod))
    v = assert(lecho.context{ nameserver = ns, key = dir .. "/cons.key", trust = trust, quiet = true })
    local ch = v:channel("temp")
    local n = 0
    assert(ch:consumer(function() n = n + 1 end))
    assert(S.run_until(v, function() return n > 3 end, 20), S.errors(prod))
    S.run_until(v, function() return false end, 1.1)  -- (a file time's second)
    local mev, errs = {}, {}
    local con = assert(ch:consumer(function() mev[#mev + 1] = v:now() end,
      { modulator = "function enqueue(ev) return ev.i end", capabilities = { "clock" },
        on_error = function(e) errs[#errs + 1] = tostring(e) end }))
    assert(con)
    -- the policy withdraws clock; the name server reloads it before this
    -- context turns again (its subscription goes 20 ms after the install)
    policy{ PROD, { principal = "cons", channel = "*", allow = { "consume", "modulate" } } }
    local t0 = socket.gettime()
    while not S.output(nsc):match("reloaded") and socket.gettime() - t0 < 5 do socket.sleep(0.02) end
    assert.matches("reloaded", S.output(nsc), "the policy was not reloaded")
    local at = v:now()
    local deadline = at + 5
    while v:now() < deadline do v:run_once(0.01) end
    local last = mev[#mev]
    assert.is_true(last == nil or last - at < 3.0,
      ("modulated events came %.2f s after the reload (%d of them); on_error: %s"):format(
        (last or at) - at, #mev, cjson.encode(errs)))
    assert.is_true(#errs > 0, "on_error heard nothing")
    assert.matches("clock", errs[1])
    assert.is_true(n > 10)
  end)
end)

describe("issue 27 attacked: params holding an array", function()
  local lecho = require "lecho"
  local c
  after_each(function() if c then c:close() end c = nil end)

  -- main 874af8a: a modulator's key hashed an array of its params as
  -- "lecho.array <f8 [2]", whatever its elements: a set_params changing
  -- only them returned true and changed nothing (the key was the same), and
  -- two consumers with other arrays shared one instance, the second given
  -- the first one's params' output
  it("are keyed by their elements: set_params applies, other arrays are other modulators", function()
    c = lecho.context{ quiet = true }
    local ch = c:channel("a")
    local p = assert(ch:producer())
    local src = "function enqueue(ev) return params.m:get(0) end"
    local a1, a2, a3 = lecho.array.new("<f8", { 2 }), lecho.array.new("<f8", { 2 }), lecho.array.new("<f8", { 2 })
    a1:set(0, 1.5); a2:set(0, 9.5); a3:set(0, 4.5)
    local got, other = {}, {}
    local con = assert(ch:consumer(function(ev) got[#got + 1] = ev end, { modulator = src, params = { m = a1 } }))
    assert(ch:consumer(function(ev) other[#other + 1] = ev end, { modulator = src, params = { m = a3 } }))
    assert(p:submit_sync(0))
    assert.is_true(con:set_params{ m = a2 })
    assert.are.equal(2, con:params_version())
    assert(p:submit_sync(0))
    c:run_once(0.05)
    assert.are.same({ 1.5, 9.5 }, got)
    assert.are.same({ 4.5, 4.5 }, other)
  end)
end)

describe("issue 27 attacked: huge params in an install", function()
  local modulator = require "lecho.modulator"
  local SRC = "function enqueue(ev) return ev end"
  local N = 300000
  local function huge()
    local t = {}
    for i = 1, N do t["k" .. i] = i end
    return t
  end

  -- main 874af8a: a member's install whose params hold 300,000 entries
  -- (3.9 MB, well inside a CTRL frame) cost the producer 1.2 s of CPU in
  -- its event loop, before any check that charges the sender (the key's
  -- canonical text: a sort and a %q per entry), however often sent; the
  -- same cost came to the manager with its key check
  it("costs the producer and the manager a bounded CPU time per message", function()
    local from = "127.0.0.1:7"
    local c, ch = producer_listing("hp", { from })
    local params = huge()
    local key = modulator.spec(SRC, { k = 1 }, nil, nil, 1).key  -- (any key: the cost is before the compare)
    local t0 = os.clock()
    local ok, why = ch:_install_req(from, { op = "install", ch = ch.name, sseq = 2,
      mods = { [key] = { src = SRC, params = params, caps = {} } } })
    local producer_cpu = os.clock() - t0
    c:close()
    assert.is_nil(ok)
    assert.matches("params", why)
    assert.is_true(producer_cpu < 0.3, ("the producer spent %.2f s of CPU on one install"):format(producer_cpu))
    -- the manager: a subscription with them
    local R = require "lecho.ns.registry"
    local reg = R.new{ addr = "127.0.0.1:7700", role = "manager", ack_timeout = 2.0 }
    local sent = {}
    local function send(to, msg) sent[#sent + 1] = msg end
    assert.is_true(reg:handle(from, { op = "join", ch = "hp", role = "consumer", rid = 1 }, send, 0))
    t0 = os.clock()
    assert.is_true(reg:handle(from, { op = "subscribe", ch = "hp", rid = 2,
      subs = { mods = { [key] = { src = SRC, params = params, caps = {} } } } }, send, 0))
    local manager_cpu = os.clock() - t0
    assert.is_false(sent[#sent].ok)
    assert.is_true(manager_cpu < 0.3, ("the manager spent %.2f s of CPU on one subscription"):format(manager_cpu))
  end)

  -- (each under the limit, 64 of them together over it: 64 keys hashed
  -- per message)
  it("bounds the CPU of an install of 64 modulators with params of 16000 entries each", function()
    local from = "127.0.0.1:7"
    local c, ch = producer_listing("hp", { from })
    local mods = {}
    for k = 1, 64 do
      local t = {}
      for i = 1, 16000 do t[i] = i end
      t.k = k
      -- (their true keys, which a member can make: every one is hashed)
      mods[modulator.spec(SRC, t, nil, nil, 1).key] = { src = SRC, params = t, caps = {} }
    end
    local t0 = os.clock()
    local ok, why = ch:_install_req(from, { op = "install", ch = ch.name, sseq = 2, mods = mods })
    local cpu = os.clock() - t0
    c:close()
    assert.is_true(cpu < 0.3, ("the producer spent %.2f s of CPU on one install"):format(cpu))
    assert.is_nil(ok)
    assert.matches("params", why)
  end)

  it("refuses them at the consumer's call, with the limit said", function()
    assert.has_error(function() modulator.spec(SRC, huge(), nil, nil, 1) end)
    local ok, err = pcall(modulator.spec, SRC, huge(), nil, nil, 1)
    assert.is_false(ok)
    assert.matches("more than %d+ table entries", err)
  end)
end)

describe("issue 27 attacked: a log hook's submit during a producer's submit, with history", function()
  local lecho = require "lecho"
  local core = require "lecho.core"
  local c
  after_each(function() if c then c:close() end c = nil end)

  -- main 874af8a: the producer's history copy of an event was taken from
  -- the context's encoder buffer after the core took the event; a submit
  -- from the log hook its modulator's call ran (on any producer of the
  -- context) had encoded into that buffer meanwhile: the history kept
  -- bytes of the other event cut at this one's length ("truncated input"),
  -- which a late joiner would get
  it("keeps the event's own bytes in the history", function()
    c = lecho.context{ quiet = true }
    local chA, chB = c:channel("A"), c:channel("B")
    local p1 = assert(chA:producer{ grant = { "log" }, history = 10 })
    local p2 = assert(chB:producer())
    local n = 0
    c.log = function(msg)
      if not msg:match("^modulator") then return end
      n = n + 1
      if n == 1 then assert(p2:submit({ inner = string.rep("X", 40) })) end
    end
    assert(chA:consumer(function() end, { capabilities = { "log" },
      modulator = "function enqueue(ev) log('x') return ev end" }))
    assert(p1:submit_sync({ outer = 1 }))   -- (sync: its call runs within the submit)
    assert(p1:submit_sync({ outer = 2 }))
    assert.are.equal(2, n)
    local got = {}
    for i = p1.hist.first, p1.hist.last do
      local ok, v = core.decode(p1.hist.data[i])
      got[#got + 1] = ok and v or tostring(v)
    end
    assert.are.same({ { outer = 1 }, { outer = 2 } }, got)
  end)

  -- main 874af8a: a submit on the same producer from the hook took the next
  -- sequence number and was added to the history first; the event whose
  -- call ran it was added after, under the hook's number (h:seq() read
  -- after the submit): seqs 2, 2, 3 for events 1, 2, 3, in the order 2, 1, 3
  it("keeps each event under its own sequence number, in order", function()
    c = lecho.context{ quiet = true }
    local ch = c:channel("A")
    local p = assert(ch:producer{ grant = { "log" }, history = 10 })
    local n = 0
    c.log = function(msg)
      if not msg:match("^modulator") then return end
      n = n + 1
      if n == 1 then assert(p:submit({ inner = 1 })) end
    end
    assert(ch:consumer(function() end, { capabilities = { "log" },
      modulator = "function enqueue(ev) log('x') return ev end" }))
    assert(p:submit_sync({ outer = 1 }))
    assert(p:submit_sync({ outer = 2 }))
    local got = {}
    for i = p.hist.first, p.hist.last do
      local ok, v = core.decode(p.hist.data[i])
      got[#got + 1] = { p.hist.seqs[i], ok and (v.outer or -v.inner) or tostring(v) }
    end
    assert.are.same({ { 1, 1 }, { 2, -1 }, { 3, 2 } }, got)
  end)
end)
