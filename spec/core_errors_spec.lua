-- Proves that the core binding (lecho.core) reports every expected failure
-- as nil, message, code, with a code from the one list of core/base/errors.h
-- ("timeout", "closed", "refused", "limit", "wouldblock", "invalid",
-- "notfound", "io", "protocol", "nomem", "failed"), and the message worded
-- as before.  Real sockets on 127.0.0.1, ports chosen by the OS.
--
-- Run: make && LUA_PATH="$PWD/lua/?.lua;$PWD/lua/?/init.lua;;" \
--   LUA_CPATH="$PWD/lua/?.so;;" LECHO_ROOT=$PWD luajit /usr/bin/busted spec/core_errors_spec.lua

local core = require "lecho.core"
local socket = require "socket"
local S = require "spec.support"

describe("core errors carry a code", function()
  local c
  before_each(function()
    c = core.new({ retry_interval = 60 })
    c:hooks({ log = function() end })
  end)
  after_each(function() c:close() end)
  teardown(function() S.cleanup() end)

  it("listen: a bad address is invalid, a taken port io", function()
    local ok, err, code = c:listen("not-an-address")
    assert.is_nil(ok)
    assert.equals("cannot listen on not-an-address: missing port (want host:port)", err)
    assert.equals("invalid", code)
    local s = assert(socket.bind("127.0.0.1", 0))
    local _, port = s:getsockname()
    ok, err, code = c:listen("127.0.0.1:" .. port)
    s:close()
    assert.is_nil(ok)
    assert.matches("^cannot listen on 127.0.0.1:%d+: ", err)
    assert.equals("io", code)
  end)

  it("submit: a value that cannot be encoded is invalid, one over the limit is limit", function()
    assert(c:listen("127.0.0.1:0"))
    local ch = c:channel("errors")
    local ok, err, code = c:submit(ch, 1, 1, function() end, false, "drop_newest")
    assert.is_nil(ok)
    assert.equals("cannot encode a function at ev", err)
    assert.equals("invalid", code)
    local small = core.new({ max_frame = 1024 })
    local sch = small:channel("errors")
    ok, err, code = small:submit(sch, 1, 1, string.rep("x", 4096), false, "drop_newest")
    small:close()
    assert.is_nil(ok)
    assert.equals("limit", code)
    assert.truthy(err)
  end)

  it("send_ctrl: an unreachable peer gives the code of why (refused: nobody listens there)", function()
    assert(c:listen("127.0.0.1:0"))
    local addr = S.refusing_addr() -- a port nobody listens on
    local deadline = socket.gettime() + 5
    local ok, err, code
    repeat
      ok, err, code = c:send_ctrl(addr, { hello = 1 })
      if ok then c:run_once(0.05) end
    until not ok or socket.gettime() > deadline
    assert.is_nil(ok)
    assert.equals("refused", code)   -- set where the dial failed (ECONNREFUSED), not "closed" for every cause
    assert.matches("connect", err)
  end)

  it("modulator errors are failed or invalid", function()
    assert(c:listen("127.0.0.1:0"))
    local ch = c:channel("errors")
    local m, err, code = c:moe(1, ch, "bad", "this is not lua", {}, {})
    assert.is_nil(m)
    assert.truthy(err)
    assert.equals("invalid", code)
  end)
end)
