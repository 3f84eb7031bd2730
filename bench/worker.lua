-- bench/worker.lua: the child processes of the benchmark suite.
--
--   luajit bench/worker.lua '<json options>'
--
-- Options: ns (name server "host:port", the driver), id (worker id),
-- parent (driver pid: the worker exits when it is gone), bound (seconds:
-- the worker exits after this long whatever happens), subs: a list of
--   { group = "g", channels = { "a", "b" } }        -- or
--   { group = "g", prefix = "c_", n = 4096 }          -- channels c_1 .. c_4096
--   relay_to = "next"   (optional: forward every event to that channel)
--   buffer = true       (optional: the consumers' `buffer` option)
-- Every channel of a group shares one counter.  Events are counted with the
-- receive time of the first one and of the "end" control that follows the
-- last (CLOCK_MONOTONIC; one connection, in order: no clock per event).  Control
-- events are tables with a `bench_ctl` field:
--   reset   the group's counter starts again
--   end     the worker reports { id, group, count, t_first, t_last } on the
--           "report" channel (a relay forwards the control event with
--           submit_sync first, so the report comes from the last process of a
--           chain and the driver's submit_sync returns once it was sent).
-- Once every consumer exists the worker says { id, ready = true } on
-- "report" (sync) and serves its loop until killed, its driver is gone, or
-- its bound passes.

-- bench/ and the checkout's lua/ (found from arg[0]) first: it runs with no
-- LUA_PATH/LUA_CPATH set, from any directory.
local dir = (arg and arg[0] or ""):match("^(.*)/[^/]*$") or "."
package.path = dir .. "/?.lua;" .. dir .. "/../?.lua;" .. dir .. "/../lua/?.lua;"
  .. dir .. "/../lua/?/init.lua;" .. package.path
package.cpath = dir .. "/../lua/?.so;" .. package.cpath

local cjson = require "cjson"

local USAGE = [[
usage: luajit bench/worker.lua '<json options>'

One consumer process of the benchmark suite; bench/run.lua starts these with
their options as one JSON object: ns, id, parent, bound, subs (see the head
of bench/worker.lua).  Not meant to be run by hand.
]]
if arg[1] == "--help" or arg[1] == "-h" then io.write(USAGE) os.exit(0) end
local lecho = require "lecho"
local common = require "common"
local okj, opts = pcall(cjson.decode, arg[1] or "")
if not okj or type(opts) ~= "table" then
  io.stderr:write("bench/worker.lua: the options must be one JSON object",
                  arg[1] and (" (" .. tostring(opts) .. ")") or "", "\n", USAGE)
  os.exit(2)
end

local clock = common.clock
local ctx = lecho.context{ nameserver = opts.ns, quiet = not os.getenv("LECHO_BENCH_LOG"),
                           timeout = 20 }
local rep = assert(ctx:channel("report"):producer())
local id = opts.id

local DEBUG = os.getenv("LECHO_BENCH_LOG")
local function report(msg)
  msg.id = id
  local ok, err = rep:submit(msg)
  if not ok then io.stderr:write("worker ", id, ": cannot report: ", tostring(err), "\n") end
  rep:flush()
  if DEBUG then io.stderr:write("worker ", id, ": reported ", cjson.encode(msg), "\n") end
end

local keep = {}
for _, sub in ipairs(opts.subs or {}) do
  local st = { count = 0 }
  local group = sub.group
  local relay
  if sub.relay_to then relay = assert(ctx:channel(sub.relay_to):producer()) end
  local function handler(ev, meta)
    if type(ev) == "table" then
      local op = ev.bench_ctl
      if op then
        if DEBUG then
          io.stderr:write("worker ", id, ": ", group, " ", op, " ", tostring(ev.phase), " count ", st.count,
            relay and (" relay dests " .. cjson.encode(relay.ch.dests or {}) .. " ver " .. tostring(relay.ch.ver)) or "", "\n")
        end
        if relay then
          local ok, err = relay:submit_sync(ev, { timeout = 30 })
          if not ok then io.stderr:write("worker ", id, ": relay: ", tostring(err), "\n") end
        end
        if op == "reset" then
          st.count, st.t_first, st.t_last = 0, nil, nil
        elseif op == "end" and not relay then
          st.t_last = st.count > 0 and clock() or nil
          report{ group = group, count = st.count, t_first = st.t_first, t_last = st.t_last,
                  phase = ev.phase }
        end
        return
      end
    end
    -- no clock read per event (the ZeroMQ and TCP receivers read none: a
    -- clock read here was 4-10 % of this process's samples); the last
    -- event's time is the "end" control's, which comes after every event
    -- of the run on the same channel, in order
    local n = st.count + 1
    st.count = n
    if n == 1 then st.t_first = clock() end
    if relay then relay:submit(ev) end
  end
  local names = sub.channels
  if not names then
    names = {}
    for i = 1, sub.n do names[i] = sub.prefix .. i end
  end
  for _, name in ipairs(names) do
    keep[#keep + 1] = assert(ctx:channel(name):consumer(handler, { buffer = sub.buffer or nil }))
  end
end

local ok, err = rep:submit_sync({ id = id, ready = true, pid = common.getpid() }, { timeout = 20 })
if not ok then
  io.stderr:write("worker ", id, ": cannot say ready: ", tostring(err), "\n")
  os.exit(1)
end

ctx:every(0.2, function()
  if opts.parent and not common.alive(opts.parent) then ctx:stop() end
end)
ctx:after(opts.bound or 300, function()
  io.stderr:write("worker ", id, ": bound of ", opts.bound or 300, " s reached\n")
  ctx:stop()
end)
ctx:run()
ctx:close()
os.exit(0)
