-- Proves that the name server's `list` reply is capped (issue 11, fix round
-- F3, finding 3 of the outside attack): with 20,480 channel entries of
-- 1000-byte names the reply outgrew the receiver's 16 MiB CTRL frame (the
-- asker closed its connection to the name server); with 65,536 the name
-- server failed to encode it ("value decodes to more than 67108864 bytes")
-- and the asker timed out.  Now one reply carries the first channels by name
-- (at most 4096, about 4 MiB) and `truncated = N`: the asker always gets
-- an answer.
--
-- Run: make && LUA_PATH="$PWD/lua/?.lua;$PWD/lua/?/init.lua;;" \
--   LUA_CPATH="$PWD/lua/?.so;;" LECHO_ROOT=$PWD luajit /usr/bin/busted spec/limits_list_spec.lua

local lecho = require "lecho"
local core = require "lecho.core"
local R = require "lecho.ns.registry"
local S = require "spec.support"

local N, LEN = 20480, 1000

describe("issue 11 F3: the name server's list reply is capped", function()
  it("a registry with 20,480 long-named channels answers list with 4096 of them and truncated", function()
    local reg, out = R.new{ addr = "127.0.0.1:7700", role = "nameserver", settle = 0, channel_quota = 1e6 }, {}
    local function send(to, msg) out[#out + 1] = msg end
    for i = 1, N do
      reg:handle("10.0.0.1:1", { op = "lookup", ch = ("c%06d-"):format(i) .. ("n"):rep(LEN), rid = i }, send, 0)
    end
    out = {}
    reg:handle("10.0.0.2:2", { op = "list", rid = 1 }, send, 0)
    local r = out[#out]
    assert.is_true(r.ok)
    local n = 0
    for name in pairs(r.channels) do n = n + 1 assert.truthy(name:find("^c%d+%-")) end
    assert.is_true(n >= 1000 and n <= 4096, "channels: " .. n)
    assert.are.equal(N - n, r.truncated)
    assert.truthy(r.channels[("c%06d-"):format(1) .. ("n"):rep(LEN)])   -- the first by name
    assert.is_true(#assert(core.encode(r)) < 8 * 1024 * 1024)
  end)

  it("ctx:list() against a name server holding 20,480 long-named entries gets an answer", function()
    local _, ns = S.nameserver("--quiet")
    -- five contexts, 4096 entries each (channel_quota): 20,480
    local cs = {}
    finally(function() for _, c in ipairs(cs) do c:close() end S.cleanup() end)
    for k = 1, 5 do
      local c = lecho.context{ nameserver = ns, quiet = true }
      cs[k] = c
      for i = 1, 4096 do
        local n = (k - 1) * 4096 + i
        c:_send_ctrl(ns, { op = "lookup", ch = ns .. ("/c%06d-"):format(n) .. ("n"):rep(LEN), rid = 1e6 + i })
        if i % 1024 == 0 then c:run_once(0) end
      end
      -- replies come in order: this one's says every lookup was handled
      assert(c:request(ns, { op = "lookup", ch = ns .. "/c000000", create = false }, 60) == nil)
    end
    local ctx = cs[1]
    local chans, managers, truncated = ctx:list()
    assert.are.equal("table", type(chans), tostring(managers))
    local n = 0
    for _ in pairs(chans) do n = n + 1 end
    assert.is_true(truncated ~= nil and n + truncated == N, ("%d listed, %s more"):format(n, tostring(truncated)))
    -- the REPL's ls says so
    local out = S.sh_out(("%s %s/scripts/lecho-repl --nameserver %s -e 'ls()' </dev/null 2>&1; echo rc=$?")
      :format(S.luajit, S.root, ns))
    assert.truthy(out:find(("... and %d more channels the name server did not list (its reply is capped)\nrc=0")
                           :format(truncated), 1, true), out:sub(-400))
  end)
end)
