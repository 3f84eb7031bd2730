-- spec/children.lua: the child processes the multi-process specs start.
-- Each is Lua source run under luajit by spec/support.lua; options travel
-- as one JSON argument and results come back as one JSON line on stdout.

local M = {}

-- The deterministic event generator shared by producers and checkers.
M.gen = [[
local function gen(i)
  local k = i % 6
  if k == 0 then return i end
  if k == 1 then return { i = i, f = i + 0.25, s = "e" .. i } end
  if k == 2 then return ("\0bin%d\255"):format(i) end
  if k == 3 then return { i, -i, 2^53 - i, { deep = { i } }, n = "x" } end
  if k == 4 then return i % 2 == 0 end
  return { i = i, list = { 1.5, -2^53, 1/0, -1/0 } }
end
local function same(a, b)
  if type(a) ~= type(b) then return false end
  if type(a) ~= "table" then return a == b end
  for k, v in pairs(a) do if not same(v, b[k]) then return false end end
  for k in pairs(b) do if a[k] == nil then return false end end
  return true
end
]]

-- A consuming process.  opts: ns, channels (list), consumers (per channel,
-- default 1), fail (error text raised by one extra consumer when ev == 7),
-- check (verify values against gen), expect (stop after this many events
-- per consumer), stop_on (stop after this event value), duration (seconds bound), slow (seconds per event).
M.consumer = M.gen .. [[
local cjson = require "cjson"
local lecho = require "lecho"
local opts = cjson.decode(arg[1])
-- LECHO_SPEC_LOG=1 in the environment shows the child's lecho log on its stderr.
local ctx = lecho.context{ nameserver = opts.ns, quiet = not os.getenv("LECHO_SPEC_LOG") }
-- order_ok: every producer's seq went up by exactly one (no gap, no
-- duplicate); increasing_ok: it only went up (gaps allowed).
local res = { count = 0, ran = 0, order_ok = true, increasing_ok = true, values_ok = true, by = {} }
local ffi = require "ffi"
ffi.cdef "int poll(void *fds, unsigned long nfds, int timeout);"
local last = {}
local cons = {}
for _, name in ipairs(opts.channels) do
  local ch = ctx:channel(name)
  for j = 1, opts.consumers or 1 do
    local c = assert(ch:consumer(function(ev, meta)
      res.ran = res.ran + 1
      if j > 1 then return end
      res.count = res.count + 1
      res.by[name] = (res.by[name] or 0) + 1
      local key = name .. meta.producer
      if last[key] and meta.seq <= last[key] then res.increasing_ok = false end
      if last[key] and meta.seq ~= last[key] + 1 then
        res.order_ok = false
        res.bad_order = res.bad_order or { last[key], meta.seq }
      end
      last[key] = meta.seq
      res.first = res.first or meta.seq
      res.last = meta.seq
      if opts.check and not same(ev, gen(meta.seq)) then
        res.values_ok = false
        res.bad_value = res.bad_value or meta.seq
      end
      -- (a sleep without a fork: under `make asan` every forked sh and sleep
      -- loads the sanitizer runtime and took ~50 ms instead of 5)
      if opts.slow then ffi.C.poll(nil, 0, math.floor(opts.slow * 1000 + 0.5)) end
      if (opts.expect and res.count >= opts.expect) or (opts.stop_on and ev == opts.stop_on) then
        ctx:stop()
      end
    end))
    cons[#cons + 1] = c
  end
  if opts.fail then
    assert(ch:consumer(function(ev) if ev == 7 then error(opts.fail, 0) end end))
  end
end
io.stdout:write("ready\n")
io.stdout:flush()
ctx:after(opts.duration or 20, function() res.timeout = true; ctx:stop() end)
ctx:run()
local s = ctx:stats()
res.peers = {}
for addr, p in pairs(s.peers) do res.peers[addr] = p end
res.channels = s.channels
res.addr = ctx.addr
io.stdout:write(cjson.encode(res), "\n")
io.stdout:flush()
ctx:close()
]]

return M
