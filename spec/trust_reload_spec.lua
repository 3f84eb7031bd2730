-- Issue 23, the outside attack's second round: a reloaded policy that
-- withdraws a right must withdraw it from the members that have it now,
-- not only refuse the next join.  doc/security.md promises that a
-- withdrawn permission takes effect within ticket_ttl; before, a consumer
-- whose consume was withdrawn kept its events for good (40 s after the
-- reload with ticket_ttl 9 s), and a producer whose produce was withdrawn
-- kept receiving member lists (new consumers' addresses, keys, modulator
-- sources and params).  Here, in real processes (a keyed name server in
-- this process, producer and consumer children, two busy loops beside):
--
--   * consume withdrawn: the consumer context is removed from the member
--     lists at once; its events stop within two seconds of the reload, and
--     its on_error says why;
--   * produce withdrawn: the producer is dropped from the channel (told
--     why) and is sent no member list again: a consumer that joins after
--     the reload is not named to it;
--   * a modulator whose caps are withdrawn is removed the same way (its
--     consumer's on_error says why), the consumer's plain stream goes on.
--
-- Run: make && LUA_PATH="$PWD/lua/?.lua;$PWD/lua/?/init.lua;;" \
--   LUA_CPATH="$PWD/lua/?.so;;" LECHO_ROOT=$PWD luajit /usr/bin/busted spec/trust_reload_spec.lua

local cjson = require "cjson"
local socket = require "socket"
local S = require "spec.support"
local R = require "spec.support.rogue"
local keys = require "lecho.keys"

local WAIT = 20

-- A child: a producer (submits { i } every 20 ms; "list A,B,..." each time
-- the member list it holds changes) or a consumer (prints "ev I TIME" per
-- event, "err TIME MSG" for its on_error; opts.mod: also a consumer with a
-- modulator asking for the clock capability, "mev I TIME") of
-- opts.channel; "log TIME MSG" per log line, "fail ERR" when refused,
-- "ready ADDR".
local CHILD = require("spec.children").prelude .. [[
local ctx = assert(lecho.context{ nameserver = opts.ns, key = opts.key, trust = opts.trust,
  listen = "127.0.0.1:0", timeout = 5,
  log = function(m) io.stdout:write(("log %.3f %s\n"):format(socket.gettime(), m)) end })
local ch = ctx:channel(opts.channel)
if opts.role == "producer" then
  local p, err = ch:producer{ grant = opts.grant or { "clock" } }
  if not p then io.stdout:write("fail ", tostring(err), "\n") ctx:close() return end
  local i, seen = 0, nil
  ctx:every(0.02, function()
    i = i + 1
    p:submit({ i = i })
    local l = ch.last_members
    local names = {}
    for _, a in ipairs(l and l.list or {}) do names[#names + 1] = a end
    for _, m in pairs(l and type(l.mods) == "table" and l.mods or {}) do
      for _, a in ipairs(m.dests or {}) do names[#names + 1] = a end
    end
    local s = table.concat(names, ",")
    if s ~= seen then seen = s io.stdout:write("list ", s, "\n") end
  end)
else
  local on_error = function(m) io.stdout:write(("err %.3f %s\n"):format(socket.gettime(), tostring(m))) end
  local c, err
  if opts.mod then
    c, err = ch:consumer(function(ev)
      io.stdout:write(("mev %s %.3f\n"):format(tostring(ev), socket.gettime()))
    end, { modulator = "function enqueue(ev) return ev.i end", capabilities = { "clock" },
           on_error = on_error })
    if not c then io.stdout:write("fail ", tostring(err), "\n") ctx:close() return end
    io.stdout:write("key ", c.mod.key, "\n")
  end
  c, err = ch:consumer(function(ev)
    io.stdout:write(("ev %s %.3f\n"):format(tostring(ev.i), socket.gettime()))
  end, { on_error = on_error })
  if not c then io.stdout:write("fail ", tostring(err), "\n") ctx:close() return end
end
io.stdout:write("ready ", ctx.addr, "\n")
ctx:after(opts.duration or 25, function() ctx:stop() end)
ctx:run()
ctx:close()
]]


local function out(c) return S.read(c.out) or "" end
local function said(c) return (out(c):gsub("m?ev [^\n]*\n", "")) .. S.errors(c) end

-- Waits (serving ctx) until child c's output matches pattern: the capture.
local function wait_out(ctx, c, pattern, timeout) return S.wait_output(ctx, c, pattern, timeout or WAIT) end

-- the time of child c's last event line of `kind` ("ev", "mev")
local function last_event(c, kind)
  local last
  for at in out(c):gmatch("\n" .. (kind or "ev") .. " %S+ ([%d.]+)") do last = tonumber(at) end
  return last
end

describe("issue 23: a reloaded policy withdraws rights from the members that hold them", function()
  local dir, trust, pol
  local reloaded = {}

  local function policy(rules)
    S.write(pol .. ".tmp", cjson.encode{ lecho = "policy", version = 1, rules = rules })
    os.rename(pol .. ".tmp", pol)
  end

  -- A keyed name server (and the channel's manager) in this process; the
  -- times of its "policy reloaded" lines go to `reloaded`.
  local function nameserver()
    return S.context{ listen = "127.0.0.1:0", key = dir .. "/nameserver.key", trust = trust,
                      ticket_ttl = 9, policy_file = pol, trust_poll = 0.2,
                      log = function(m)
                        if m:find("policy reloaded", 1, true) then reloaded[#reloaded + 1] = socket.gettime() end
                      end }
  end

  local function child(c, opts)
    opts.channel = opts.channel or "temp"
    opts.trust = trust
    opts.ns = c.addr
    opts.key = ("%s/%s.key"):format(dir, opts.who)
    return S.lua(CHILD, cjson.encode(opts))
  end

  -- Writes the policy (rules) and waits for the name server to reload it:
  -- the time it did.
  local function reload(c, rules)
    local n = #reloaded
    S.run_until(c, function() return false end, 1.1)  -- (a file's time may have a second's resolution)
    policy(rules)
    assert(S.run_until(c, function() return #reloaded > n end, 5), "the policy was not reloaded")
    return reloaded[#reloaded]
  end

  before_each(function()
    dir = S.tmpname("reload")
    S.certified_keys(dir, "nameserver prod cons")
    trust = { dir .. "/ca.pub" }
    pol = dir .. "/policy.json"
    reloaded = {}
    S.busy_loops(2)     -- (killed by S.cleanup)
  end)

  after_each(S.cleanup)     -- (the name servers' contexts too: S.context)

  it("consume withdrawn: the consumer's events stop within two seconds of the reload; its on_error says why",
  function()
    local all = {
      { principal = "prod", channel = "*", allow = { "produce" } },
      { principal = "cons", channel = "*", allow = { "consume" } },
    }
    policy(all)
    local c = nameserver()
    local cons = child(c, { role = "consumer", who = "cons" })
    assert(wait_out(c, cons, "ready ([^\n]+)\n"), said(cons))
    local prod = child(c, { role = "producer", who = "prod" })
    assert(wait_out(c, cons, "\nev (%d+) "), "no event before the reload: " .. said(cons) .. said(prod))
    local at = reload(c, { all[1] })
    S.run_until(c, function() return false end, 4)
    local last = last_event(cons)
    assert.truthy(last, said(cons))
    assert.is_true(last - at < 2.0, ("events reached the consumer %.2f s after the reload"):format(last - at))
    local why = out(cons):match("err [%d.]+ ([^\n]+)\n")
    assert.truthy(why and why:find("not allowed: cons may not consume temp", 1, true), said(cons))
    assert.is_true(S.alive(prod), said(prod))
  end)

  it("produce withdrawn: the producer is dropped and told, and learns nothing of a consumer that joins later",
  function()
    local all = {
      { principal = "prod", channel = "*", allow = { "produce" } },
      { principal = "cons", channel = "*", allow = { "consume", "modulate" }, caps = { "clock" } },
    }
    policy(all)
    local c = nameserver()
    local prod = child(c, { role = "producer", who = "prod" })
    assert(wait_out(c, prod, "list ([^\n]*)\n"), said(prod))
    reload(c, { all[2] })
    assert(wait_out(c, prod, "log ([%d.]+) [^\n]*not allowed: prod may not produce temp", 3),
           "the producer was not told: " .. said(prod))
    local cons = child(c, { role = "consumer", who = "cons", mod = true })
    local addr = wait_out(c, cons, "ready ([^\n]+)\n")
    assert(addr, said(cons))
    S.run_until(c, function() return false end, 1.5)
    assert.is_nil(out(prod):find(addr, 1, true), "the producer was sent the new consumer: " .. said(prod))
    assert.is_nil(out(cons):find("\nev %d"), "a dropped producer's events reached the consumer")
  end)

  it("a modulator whose caps are withdrawn is removed; its on_error says why, the plain stream goes on", function()
    local all = {
      { principal = "prod", channel = "*", allow = { "produce" } },
      { principal = "cons", channel = "*", allow = { "consume", "modulate" }, caps = { "clock" } },
    }
    policy(all)
    local c = nameserver()
    local cons = child(c, { role = "consumer", who = "cons", mod = true })
    assert(wait_out(c, cons, "ready ([^\n]+)\n"), said(cons))
    local prod = child(c, { role = "producer", who = "prod" })
    assert(wait_out(c, cons, "\nmev (%d+) "), "no modulated event before the reload: " .. said(cons) .. said(prod))
    local at = reload(c, { all[1], { principal = "cons", channel = "*", allow = { "consume", "modulate" } } })
    S.run_until(c, function() return false end, 4)
    local last = last_event(cons, "mev")
    assert.is_true(last - at < 2.0, ("modulated events came %.2f s after the reload"):format(last - at))
    assert.is_true(last_event(cons) - at > 3.0, "the plain stream stopped too: " .. said(cons))
    local why = out(cons):match("err [%d.]+ ([^\n]+)\n")
    assert.truthy(why and why:find("not allowed: cons may not modulate with clock temp", 1, true), said(cons))
  end)

  -- (the outside attack: a principal the policy grants nothing, knowing
  -- the modulator's key, fired the consumer's on_error with its own text)
  it("takes mod_error only from a producer of the channel: not from a certified peer granted nothing", function()
    policy{
      { principal = "prod", channel = "*", allow = { "produce" } },
      { principal = "cons", channel = "*", allow = { "consume", "modulate" }, caps = { "clock" } },
    }
    local c = nameserver()
    local cons = child(c, { role = "consumer", who = "cons", mod = true })
    local caddr = wait_out(c, cons, "ready ([^\n]+)\n")
    assert(caddr, said(cons))
    local key = out(cons):match("key (%x+)\n")
    assert(key, said(cons))
    -- mallory: a key the authority certified, a principal the policy names nowhere
    local ca = assert(keys.read_secret(dir .. "/ca.key"))
    local pk, sk = R.keypair()
    local now = os.time()
    local srv = assert(R.listen())
    local p, err = R.dial(caddr, { addr = srv.addr, key = { pk = pk, sk = sk, name = "mallory",
                                   cert = R.cert(ca.secret, "mallory", pk, now - 60, now + 3600) } })
    assert(p, tostring(err))
    p:ctrl{ op = "mod_error", ch = c.addr .. "/temp", key = key, err = "FORGED: call +1 555 0100",
            producer = "127.0.0.1:1" }
    S.run_until(c, function() return false end, 1.5)
    p:close()
    srv:close()
    assert.is_nil(out(cons):find("FORGED", 1, true), "a forged mod_error fired on_error: " .. said(cons))
    -- a real producer's report still comes, before it sent any event (its
    -- modulator is refused at install: it does not grant the clock)
    local prod = child(c, { role = "producer", who = "prod", grant = {} })
    local why = wait_out(c, cons, "err [%d.]+ (modulator at [^\n]+)\n", 10)
    assert.truthy(why and why:find("clock", 1, true), said(cons) .. said(prod))
  end)
end)
