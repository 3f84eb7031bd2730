-- Proves what the control plane and a modulator let out (issue 10, "Leaks"):
--
--   `list` (the name server's and a manager's, so also the REPL's `ls`)
--   names each modulator by key with its consumers, period and capabilities,
--   never its source or its params (an API token in params, say), while a
--   producer's join reply still carries both (producers run them); and
--   inside a modulator, tostring, string.format("%s") and log show a
--   function, table, userdata or thread as "table: 1" (stable per object),
--   never a heap address, and "%p" is refused.
--
-- Run: make && LUA_PATH="$PWD/lua/?.lua;$PWD/lua/?/init.lua;;" \
--   LUA_CPATH="$PWD/lua/?.so;;" LECHO_ROOT=$PWD luajit /usr/bin/busted spec/leaks_spec.lua

local lecho = require "lecho"
local R = require "lecho.ns.registry"
local S = require "spec.support"

local NS = "127.0.0.1:7700"
local P1, C1, X = "10.0.0.1:1", "10.0.0.3:3", "10.0.0.9:9"
local TOKEN = "api-token-5f1e2d"
local SRC = "-- secret-filter\nfunction enqueue(ev) if ev.k == params.k then return ev end end"
-- its key: the hash of its code and params (the manager checks it)
local subs = require "lecho.subs"
local K1 = subs.stream_key(subs.base_of(SRC, 0.5, { "clock" }), { k = TOKEN })

-- Does value v hold string s anywhere (keys included)?
local function holds(v, s, seen)
  if type(v) == "string" then return v:find(s, 1, true) ~= nil end
  if type(v) ~= "table" then return false end
  seen = seen or {}
  if seen[v] then return false end
  seen[v] = true
  for k, x in pairs(v) do
    if holds(k, s, seen) or holds(x, s, seen) then return true end
  end
  return false
end

describe("issue 10: list shows no modulator source or params", function()
  it("in the registry: list and snapshot name the modulator, a producer's join reply carries it", function()
    for _, role in ipairs{ "nameserver", "manager" } do
      local reg = R.new{ addr = NS, role = role }
      local out = {}
      local function send(to, msg) out[#out + 1] = { to = to, msg = msg } end
      local function replies(to)
        local l = {}
        for _, e in ipairs(out) do
          if e.to == to and e.msg.op == "reply" then l[#l + 1] = e.msg end
        end
        return l
      end
      reg:handle(C1, { op = "join", ch = "c", role = "consumer", rid = 1,
                       subs = { plain = false, mods = { [K1] = { src = SRC, params = { k = TOKEN },
                                                               period = 0.5, caps = { "clock" } } } } },
                 send, 0)
      reg:handle(X, { op = "list", rid = 2 }, send, 0)
      local l = replies(X)[1]
      assert.is_true(l.ok)
      assert.are.same({ [K1] = { consumers = { C1 }, period = 0.5, caps = { "clock" } } },
                      l.channels.c.modulators)
      assert.is_false(holds(l, TOKEN), role .. ": list carries the params")
      assert.is_false(holds(l, "secret-filter"), role .. ": list carries the source")
      assert.is_false(holds(reg:snapshot(), TOKEN))
      reg:handle(P1, { op = "join", ch = "c", role = "producer", rid = 3 }, send, 0)
      local j = replies(P1)[1]
      assert.is_true(j.ok)
      assert.are.equal(SRC, j.mods[K1].src)
      assert.are.same({ k = TOKEN }, j.mods[K1].params)
    end
  end)

  it("over the wire: ctx:list() of a name server process", function()
    local _, ns = S.nameserver("--quiet")
    local ctx = lecho.context{ nameserver = ns, quiet = true }
    local other = lecho.context{ nameserver = ns, quiet = true }
    finally(function() other:close(); ctx:close(); S.cleanup() end)
    assert(ctx:channel("feed"):consumer(function() end, { modulator = SRC, params = { k = TOKEN } }))
    local chans = assert(other:list())
    local info = chans[ns .. "/feed"]
    assert.is_table(info, "the channel is not listed")
    local key, m = next(info.modulators)
    assert.is_string(key)
    assert.are.same({ consumers = { ctx.addr }, caps = {} }, m)
    assert.is_false(holds(chans, TOKEN), "list carries the params")
    assert.is_false(holds(chans, "secret-filter"), "list carries the source")
  end)
end)

describe("issue 10: a modulator sees no heap address", function()
  local c
  after_each(function() if c then c:close() end c = nil end)

  it("tostring, string.format %s and log show an object number; %p is refused", function()
    local logs = {}
    c = lecho.context{ log = function(m) logs[#logs + 1] = m end }
    local ch = c:channel("addr")
    local p = assert(ch:producer{ grant = { "log" } })
    local got
    assert(ch:consumer(function(ev) got = ev end, { capabilities = { "log" }, modulator = [[
      local t, f = {}, function() end
      local named = setmetatable({}, { __tostring = function() return "named" end })
      function enqueue(ev)
        log(t, emit)
        return { tostring(emit), tostring(t), tostring(f), tostring(t), string.format("%s|%5s", t, f),
                 ("%s"):format(emit), tostring(named), tostring(1.5), tostring(nil), tostring("s"),
                 string.format("%d%%s", 3), pcall(string.format, "%p", "x") }
      end ]] }))
    assert(p:submit_sync({}))
    assert.is_table(got)
    for i = 1, 7 do
      assert.is_nil(got[i]:find("0x", 1, true), "an address: " .. got[i])
      assert.is_nil(got[i]:find("builtin", 1, true), got[i])
    end
    local emit_s, t_s, f_s = got[1], got[2], got[3]
    assert.matches("^function: %d+$", emit_s)
    assert.matches("^table: %d+$", t_s)
    assert.matches("^function: %d+$", f_s)
    assert.are_not.equal(emit_s, f_s)
    assert.are.equal(t_s, got[4])                       -- stable per object
    assert.are.equal(t_s .. "|" .. f_s, got[5])
    assert.are.equal(emit_s, got[6])                    -- string methods too
    assert.are.same({ "named", "1.5", "nil", "s", "3%s", false }, { unpack(got, 7, 12) })
    assert.matches("%%p is not available in a modulator", got[13])
    local line
    for _, l in ipairs(logs) do if l:find("modulator", 1, true) and l:find("table", 1, true) then line = l end end
    assert.is_string(line, table.concat(logs, "\n"))
    assert.is_nil(line:find("0x", 1, true), line)
    assert.truthy(line:find(t_s .. " " .. emit_s, 1, true), line)
  end)
end)
