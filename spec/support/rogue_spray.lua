-- spec/support/rogue_spray.lua: the rogue of spec/support/rogue.lua as a
-- process of its own, for the specs on forged control replies
-- (spec/trust_replies_spec.lua): it must attack while the contexts it
-- attacks wait for their replies, so it cannot share the spec's process.
--
--   luajit spec/support/rogue_spray.lua JSON
--
-- JSON: { targets = { "host:port", ... }    contexts to dial (claiming our own listening address)
--         key = { pk, sk (hex), name }      keyed mode: the identity we authenticate as; nil: protected
--         reply = { ... }                   the forged reply (op "reply", ok true added); a string
--                                           "SELF" (value or key) becomes our address
--         hex = { field = hex }             fields of reply that are bytes (manager_key)
--         sweep = N                         each round: a reply for every rid 1..N ...
--         random = M                        ... and for M random rids in [1, 2^53)
--         bind = { name, ticket (hex) }     each round also a BIND of `name` (a new idx) with the
--                                           ticket, and one EVENT { i = "FORGED" } on it
--         duration = seconds, every = seconds between rounds (0.05) }
--
-- It also accepts whoever dials its listening address (a context told that
-- we are its manager or consumer) and does the handshake as `key`.  It
-- prints "ready ADDR" once it dialled every target ("dialled T" or "dial
-- failed T ERR" for each), "learnt FROM TYPE OP" for every frame it read
-- after a handshake (every one it could decrypt: the specs assert there is
-- none), "rounds N" and "end" when done.

local cjson = require "cjson"
local socket = require "socket"
local R = require "spec.support.rogue"

local o = cjson.decode(arg[1])
io.stdout:setvbuf("line")
math.randomseed(os.time() + math.floor(socket.gettime() * 1000) % 100000)

local key = o.key and { pk = R.unhex(o.key.pk), sk = R.unhex(o.key.sk), name = o.key.name } or nil
local srv = assert(R.listen())
local self_addr = srv.addr

local function subst(v)
  if v == "SELF" then return self_addr end
  if type(v) ~= "table" then return v end
  local out = {}
  for k, x in pairs(v) do out[subst(k)] = subst(x) end
  return out
end
local reply = subst(o.reply or {})
reply.op, reply.ok = "reply", true
for f, h in pairs(o.hex or {}) do reply[f] = R.unhex(h) end

local peers = {}
for _, t in ipairs(o.targets or {}) do
  local p, err = R.dial(t, { addr = self_addr, key = key, timeout = 5 })
  if p then
    p.name = t
    peers[#peers + 1] = p
    io.stdout:write("dialled ", t, "\n")
  else
    io.stdout:write("dial failed ", t, " ", tostring(err), "\n")
  end
end
io.stdout:write("ready ", self_addr, "\n")

-- Prints what p read since the last call (its log, spec/support/rogue.lua).
local skip = { HELLO = true, HELLO_OK = true, AUTH = true, AUTH_OK = true, ERROR = true, HEARTBEAT = true,
               PING = true }
local function report(p)
  for i = (p.reported or 0) + 1, #p.log do
    local e = p.log[i]
    if not skip[e.type] then
      local op = type(e.msg) == "table" and tostring(e.msg.op) or "-"
      io.stdout:write(("learnt %s %s %s\n"):format(p.name, e.type, op))
    end
  end
  p.reported = #p.log
end

-- Reads what p has (answering PINGs) for at most `t` seconds.
local function drain(p, t)
  local deadline = socket.gettime() + t
  while not p.closed and socket.gettime() < deadline do
    local ft = p:read(math.max(0.001, deadline - socket.gettime()))
    if not ft then break end
    if ft == R.F.PING then p:send(R.frame(R.F.HEARTBEAT)) end
  end
  report(p)
end

local deadline = socket.gettime() + (o.duration or 5)
local every = o.every or 0.05
local rounds, idx = 0, 0
while socket.gettime() < deadline do
  rounds = rounds + 1
  -- whoever dials us
  srv.s:settimeout(0)
  local s = srv.s:accept()
  if s then
    local p, err, raw = R.handshake_accepted(s, { addr = self_addr, key = key, timeout = 2 })
    if p then
      p.name = "accepted"
      peers[#peers + 1] = p
      io.stdout:write("accepted a connection\n")
    else
      io.stdout:write("accepting failed: ", tostring(err), "\n")
      if raw then raw.name = "accepted"; report(raw) end
    end
  end
  for _, p in ipairs(peers) do
    if not p.closed then
      local batch = {}
      for rid = 1, o.sweep or 0 do
        reply.rid = rid
        batch[#batch + 1] = R.ctrl(reply)
      end
      for _ = 1, o.random or 0 do
        reply.rid = math.floor(math.random() * (2 ^ 53 - 2)) + 1
        batch[#batch + 1] = R.ctrl(reply)
      end
      if o.bind and p.name ~= "accepted" then
        idx = idx + 1
        batch[#batch + 1] = R.bind(idx, o.bind.name, o.bind.ticket and R.unhex(o.bind.ticket) or nil)
        batch[#batch + 1] = R.event(idx, 1, rounds, 0, { i = "FORGED", t = 0 })
      end
      p:send(table.concat(batch))
      drain(p, 0.002)
    end
  end
  local pause = socket.gettime() + every
  for _, p in ipairs(peers) do drain(p, math.max(0, (pause - socket.gettime()) / #peers)) end
  if #peers == 0 then socket.sleep(every) end
end
for _, p in ipairs(peers) do drain(p, 0.05) end
io.stdout:write("rounds ", rounds, "\n")
io.stdout:write("end\n")
