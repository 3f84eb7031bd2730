-- What a principal every process trusts, but whom the policy allows
-- nothing ("mallory"), still could not do after the attacks of issue 10
-- were specs: the outside attack on that work found three ways.
--
--   * squat an address not yet in use: its first authenticated key was
--     pinned to it for the context's life, so the real owner, starting
--     later, was refused for good ("belongs to another identity");
--   * make a peer buffer a CTRL frame of up to max_frame (1 GiB): the name
--     server grew by ~300 MB per connection;
--   * make a consumer keep every refused BIND (its name, for the ACKs'
--     error text) for the connection's life: 50,000 took ~100 MB;
--   * run a name server of its own, with no policy, and be the control
--     plane (manager, member lists, modulators) of every channel whose
--     name points at it ("host:port/name"): only the configured name
--     server was checked to be the principal `nameserver`.
--
-- Also: a principal without `list` could not start the REPL ("cannot reach
-- the name server"), though it may consume.
--
-- World: spec/support/trust_world.lua (keyed name server, producer and
-- consumer in processes); the rogue: spec/support/rogue.lua.
--
-- Run: make && LUA_PATH="$PWD/?.lua;$PWD/lua/?.lua;$PWD/lua/?/init.lua;;" \
--   LUA_CPATH="$PWD/lua/?.so;;" LECHO_ROOT=$PWD luajit /usr/bin/busted spec/trust_limits_spec.lua

local lecho = require "lecho"
local support = require "spec.support"
local T = require "spec.support.trust_world"
local R = require "spec.support.rogue"

describe("a trusted principal the policy allows nothing (keyed mode)", function()
  local w
  after_each(function() T.stop(w); w = nil end)

  it("cannot squat an address not yet in use: once it hangs up, the address's owner gets in", function()
    w = T.start{ mode = "keyed" }
    local srv = R.listen()                    -- an address nobody uses yet
    local p, err = T.dial(w, w.cons.addr, "mallory", srv.addr)
    assert(p, "mallory's handshake: " .. tostring(err))
    p:close()
    support.sleep(0.5)                        -- the consumer saw it close
    local q
    q, err = R.dial(w.cons.addr, { addr = srv.addr, key = T.key(w, "cons2"), timeout = 5 })
    srv:close()
    assert(q, "the address's owner was refused after the squatter hung up: " .. tostring(err))
    q:close()
  end)

  it("cannot make the name server hold a huge control frame: refused on its header", function()
    w = T.start{ mode = "keyed" }
    local p, err = T.dial(w, w.ns, "mallory")
    assert(p, "mallory's handshake: " .. tostring(err))
    -- a 100 MiB CTRL announced, 64 KiB of it sent: the limit shows on the header
    p:send(R.u32le(100 * 1024 * 1024 + 1) .. string.char(R.F.CTRL) .. string.rep("\0", 65536))
    local d = p:drain(5)
    assert.matches("frame length exceeds limit %(104857601 bytes, limit 16777216%)", tostring(d.error))
    local base, during = T.measure(w, function() end)
    T.assert_unaffected(base, during, "a huge CTRL at the name server")
  end)

  it("cannot make a consumer keep refused BINDs without end: the connection ends at 256", function()
    w = T.start{ mode = "keyed" }
    local base, during, res = T.measure(w, function()
      local p, err = T.dial(w, w.cons.addr, "mallory")
      if not p then return nil, err end
      local name = w.ns .. "/" .. T.CHANNEL
      local binds = {}
      for i = 1, 300 do binds[i] = R.bind(i, name .. string.rep("x", 1000) .. i) end
      p:send(table.concat(binds))
      return p:drain(5)
    end)
    local d = assert(res[1], tostring(res[2]))
    -- 1 KB names: the 64 KiB cap on the names kept ends it before the 256th
    local e = tostring(d.error)
    assert(e:find("too many refused channel bindings (limit 256)", 1, true) or
           e == "refused channel bindings' names over 65536 bytes", e)
    T.assert_unaffected(base, during, "300 refused BINDs at the consumer")
  end)

  it("cannot be the name server of channels named at its address", function()
    w = T.start{ mode = "keyed" }
    local _, evil = support.nameserver(("--quiet --key %s --trust %s"):format(w.ids.mallory.key, w.ids.trust))
    local ctx = lecho.context{ nameserver = w.ns, key = w.ids.prod.key, trust = w.ids.trust, quiet = true,
                               timeout = 3 }
    local p, err, code = ctx:channel(evil .. "/" .. T.CHANNEL):producer()
    local c, cerr = ctx:channel(evil .. "/other"):consumer(function() end)
    -- the configured name server still serves this context
    local q, qerr = ctx:channel(T.CHANNEL):producer()
    ctx:close()
    assert(p == nil, "a producer joined with mallory's name server as its control plane")
    assert.equals("refused", code)
    assert.matches("name server " .. evil:gsub("%p", "%%%0") .. " is mallory %(key %x+%), not nameserver",
                   tostring(err))
    assert(c == nil and tostring(cerr):find("is mallory", 1, true), "consumer: " .. tostring(cerr))
    assert(q, "the real name server: " .. tostring(qerr))
  end)
end)

describe("a principal the policy lets consume but not list (keyed mode)", function()
  local w
  after_each(function() T.stop(w); w = nil end)

  it("may use the REPL: it starts, says ls() shows nothing, and consumes", function()
    w = T.start{ mode = "keyed" }
    local code = ("local n = 0; ctx:channel(%q):consumer(function() n = n + 1 end); "
                  .. "local t0 = ctx:now(); while n < 3 and ctx:now() - t0 < 10 do ctx:run_once(0.05) end; "
                  .. "print('got', n >= 3)"):format(T.CHANNEL)
    local out = support.sh_out(("timeout 30 %s %s/scripts/lecho-repl --nameserver %s --key %s --trust %s "
      .. "--no-history -e %s </dev/null"):format(support.luajit, support.root, w.ns, w.ids.cons.key,
      w.ids.trust, support.sh_quote(code)))
    assert.matches("not allowed: cons may not list", out, 1, true)
    assert.matches("got\ttrue\nrc=0\n$", out)
  end)
end)
