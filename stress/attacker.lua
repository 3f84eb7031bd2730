-- stress/attacker.lua JSON: the attacker beside a stress scenario (stress/run.lua
-- starts one in every scenario).  A peer written from doc/protocol.md
-- (spec/support/rogue.lua) that, for the whole run, connects to every
-- process of the scenario it can find (the name server, the managers, every
-- producer and consumer: as any peer may) and sends what would take a channel
-- over if it were believed:
--   * control replies for request ids it sweeps (1, 2, 3, ...) and picks at
--     random, naming itself the manager of every channel (with its own key as
--     manager_key), granting everything as a registered manager's policy,
--     listing itself as the only consumer with a member list of version
--     2^53-1, handing out tickets;
--   * member lists for every channel of the scenario naming itself as a
--     consumer and a modulator's destination;
--   * keyed: BINDs with made-up tickets and events on every channel, whose ids
--     start with "mallory:" (a consumer that handles one took a forged event).
-- It listens too, so that a producer fooled into sending it events can: any
-- EVENT frame that reaches it is a stolen event.  In keyed mode it has a key
-- that every process trusts and the policy grants nothing ("mallory"); in
-- protected mode it speaks as itself (its own address).  JSON: { log, dir,
-- ns, t0, bound, stopfile, keyed, key = { pk, sk } (hex), channels }.
-- Log records (JSON lines): me {addr}, conn {to, ok, err}, accepted {from},
-- stolen {from, ch, n}, forged_bind {to, err}, sent {...} every second,
-- exit.
package.path = (os.getenv("LECHO_ROOT") or ".") .. "/?.lua;" .. package.path
local lib = require "stress.lib"
local R = require "spec.support.rogue"
local socket = require "socket"
local json = lib.json
local now = lib.now

local spec = json.decode(arg[1])
local L = lib.logger(spec.log)
local BOUND = spec.t0 + spec.bound
local key = spec.keyed and { pk = R.unhex(spec.key.pk), sk = R.unhex(spec.key.sk), name = "mallory" } or nil

local srv = R.listen()
local me = srv.addr
srv.s:settimeout(0)
L.w{ k = "me", addr = me }

local peers = {}      -- address -> peer (dialled or accepted)
local tried = {}      -- address -> when last dialled
local n = { replies = 0, members = 0, events = 0, conns = 0, refused = 0, accepted = 0, stolen = 0 }
local rid_sweep = 0
local seq = 0
local TOP = 2 ^ 53 - 1
local rnd = math.random
math.randomseed(tonumber(tostring(os.time()):reverse():sub(1, 6)) + lib.getpid())

-- Every address the scenario's processes wrote ("ctx" records), the name
-- server's and the managers' (their port files).
local function targets()
  local out = { spec.ns }
  local p = io.popen("ls '" .. spec.dir .. "'")
  for f in p:lines() do
    if f:match("%.jsonl$") and f ~= "attacker.jsonl" and f ~= "driver.jsonl" then
      local s = lib.read(spec.dir .. "/" .. f) or ""
      for a in s:gmatch('"k":"ctx"[^\n]-"addr":"([^"]+)"') do out[#out + 1] = a end
      for a in s:gmatch('"addr":"([^"]+)"[^\n]-"k":"ctx"') do out[#out + 1] = a end
    elseif f:match("^m%d+%.%d+%.addr$") then
      local s = lib.read(spec.dir .. "/" .. f)
      local a = s and s:match("[^\n]+")
      if a then out[#out + 1] = a end
    end
  end
  p:close()
  return out
end

local function full(ch) return spec.ns .. "/" .. ch end

-- One forged reply for rid: every field a lookup, join, register_manager,
-- gjoin/glist or service reply could carry, pointing at us.
local function forged_reply(rid)
  local mods = { steal = { src = "function enqueue(ev) return ev end", dests = { me } } }
  return { op = "reply", rid = rid, ok = true, manager = me, manager_key = key and key.pk or ("\1"):rep(32),
           ver = TOP, consumers = { me }, mods = mods, keys = { [me] = key and key.pk or ("\1"):rep(32) },
           ticket = ("\7"):rep(64), policy = { rules = { { principal = "*", channel = "*",
             allow = { "produce", "consume", "modulate", "manage", "list" } } } },
           members = { { addr = me, data = "forged" } }, servers = { me }, channels = {} }
end

-- The replies for the low request ids every tick (a process counting its
-- ids from 1 has made fewer than LOW requests for most of a run: those
-- pending during a name server's settle are among them), encoded once.
local LOW = 200
local low_burst
local function attack(p)
  if not low_burst then
    local t = {}
    for rid = 1, LOW do t[rid] = R.ctrl(forged_reply(rid)) end
    low_burst = table.concat(t)
  end
  if not p:send(low_burst) then return false end
  n.replies = n.replies + LOW
  -- then 20 of a sweep above, 10 at random
  for _ = 1, 20 do
    rid_sweep = rid_sweep % 20000 + 1
    if not p:ctrl(forged_reply(LOW + rid_sweep)) then return false end
    n.replies = n.replies + 1
  end
  for _ = 1, 10 do
    if not p:ctrl(forged_reply(rnd(1, 2 ^ 31) * 2 ^ 21 + rnd(0, 2 ^ 21 - 1))) then return false end
    n.replies = n.replies + 1
  end
  for _, ch in ipairs(spec.channels) do
    if not p:ctrl{ op = "members", ch = full(ch), ver = TOP - rnd(0, 10), mid = rnd(1, 1000),
                   consumers = { me }, keys = { [me] = key and key.pk or ("\1"):rep(32) },
                   mods = { steal = { src = "function enqueue(ev) return ev end", dests = { me } } } } then
      return false
    end
    n.members = n.members + 1
  end
  -- keyed: events on every channel, after a BIND with a made-up ticket (in
  -- protected mode any local process may produce: not an attack there)
  if not key then return true end
  p.idx = p.idx or {}
  for i, ch in ipairs(spec.channels) do
    if not p.idx[ch] then
      p.idx[ch] = i
      if not p:send(R.bind(i, full(ch), ("\9"):rep(64))) then return false end
    end
    seq = seq + 1
    local s = seq
    if not p:send(R.event(i, 777, s, 0, { s = s, id = "mallory:" .. s, pad = "forged" })) then return false end
    n.events = n.events + 1
  end
  return true
end

-- Reads what p has (no wait): answers PINGs, counts EVENTs (stolen).
local function drain(p, addr)
  p.binds = p.binds or {}
  while true do
    local t, body = p:read(0.001)  -- (0 would not look at the socket at all)
    if not t then return body ~= "closed" and body ~= "bad record" end
    if t == R.F.PING then
      p:send(R.frame(R.F.HEARTBEAT))
    elseif t == R.F.BIND then
      local b = R.parse_bind(body)
      if b then p.binds[b.idx] = b.name end
    elseif t == R.F.EVENT then
      local e = R.parse_event(body)
      n.stolen = n.stolen + 1
      L.w{ k = "stolen", from = addr, ch = e and p.binds[e.idx] or "?", q = e and e.seq }
    elseif t == R.F.CTRL then
      -- a request to us: its sender believed one of our replies (we are
      -- nobody's name server or manager); answered as one would, to go on
      local ok, msg = pcall(require("lecho.core").decode, body)
      if ok and type(msg) == "table" and msg.rid and msg.op ~= "reply" then
        n.believed = (n.believed or 0) + 1
        L.w{ k = "believed", from = addr, op = tostring(msg.op), ch = type(msg.ch) == "string" and msg.ch or nil }
        p:ctrl(forged_reply(msg.rid))
      end
    elseif t == R.F.ERROR then
      L.w{ k = "error_from", from = addr, m = body }
      return false
    end
  end
end

local last_scan, last_log = 0, now()
while now() < BOUND do
  if lib.read(spec.stopfile) then break end
  local t = now()
  if t - last_scan > 0.5 then
    last_scan = t
    for _, a in ipairs(targets()) do
      if a ~= me and not peers[a] and (not tried[a] or t - tried[a] > 1) then
        tried[a] = t
        local p, err = R.dial(a, { addr = me, key = key, timeout = 1 })
        L.w{ k = "conn", to = a, ok = p and true or false, err = err and tostring(err) or nil }
        if p then peers[a], n.conns = p, n.conns + 1 else n.refused = n.refused + 1 end
      end
    end
  end
  -- whoever dials us (a producer fooled into it) is accepted
  local readable = socket.select({ srv.s }, nil, 0)
  if readable and readable[1] then
    local p, err = R.accept(srv, { addr = me, key = key, timeout = 1 })
    if p then
      n.accepted = n.accepted + 1
      local from = p.remote and p.remote.addr or "?"
      L.w{ k = "accepted", from = from }
      peers["in:" .. n.accepted .. ":" .. from] = p
    else
      L.w{ k = "accept_failed", err = tostring(err) }
    end
  end
  for a, p in pairs(peers) do
    if not drain(p, a) or not attack(p) then
      p:close()
      peers[a] = nil
    end
  end
  if t - last_log >= 1 then
    last_log = t
    L.w{ k = "sent", believed = n.believed, replies = n.replies, members = n.members, events = n.events, conns = n.conns,
         refused = n.refused, stolen = n.stolen, peers = (function() local c = 0; for _ in pairs(peers) do c = c + 1 end; return c end)() }
  end
  socket.sleep(0.1)
end
L.w{ k = "exit", stolen = n.stolen }
L.close()
os.exit(0)
