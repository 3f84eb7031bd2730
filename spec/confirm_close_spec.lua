-- Read confirmation at a close (the relay's pattern; spec/capi_interop_spec
-- failed 2/2 since 3e68dd1): a relay consumes "a" and sends each event on
-- to "b", whose consumer is this spec's context (also the relay's name
-- server: its manager answers, and asks, while the relay closes); on "end"
-- the relay closes its consumer, its producer, then its context.  Its close
-- asks for confirmation and sends its FIN; our side reads on, confirms, and
-- closes its end when it sees the FIN, while a reply of the relay's (to a
-- frame of ours that came after its FIN) was queued: written after its own
-- shutdown(SHUT_WR), it failed with EPIPE, the connection ended as broken
-- before our CONFIRM and orderly close were read, and the relay's close
-- reported "N events (B bytes) not confirmed" though this side had read
-- every one of them: a false report fails the relay's close and its exit
-- status.  Now nothing is written after our FIN.  A few rounds, each with
-- a new relay, every one's close must succeed.
local S = require "spec.support"
local lecho = require "lecho"

-- The relay: arg[1] the name server.  Exits 0 when its close succeeded,
-- else says why on stderr and exits 1.
local RELAY = [[
local lecho = require "lecho"
local ctx = lecho.context{ nameserver = arg[1], quiet = true, key = arg[2], trust = arg[3] }
local p = assert(ctx:channel("b"):producer())
local done = false
local c = assert(ctx:channel("a"):consumer(function(ev)
  assert(p:submit(ev))
  if ev == "end" then done = true; ctx:stop() end
end))
io.stdout:write("ready\n"); io.stdout:flush()
local deadline = ctx:now() + 60
while not done and ctx:now() < deadline do ctx:run_once(0.05) end
c:close()
p:close()
local ok, err = ctx:close{ linger = 5 }
if not ok then io.stderr:write("relay: close: ", tostring(err), "\n"); os.exit(1) end
os.exit(done and 0 or 2)
]]

describe("read confirmation at a close", function()
  after_each(function() S.cleanup() end)

  -- keyed: each context's key (a, the relay's b) and the other's public key
  local function keyed()
    local keys = require "lecho.keys"
    local dir = S.tmpname("keys")
    os.execute("mkdir -p " .. dir)
    local a, b = keys.generate("nameserver"), keys.generate("b") -- (the name server's principal)
    assert(keys.write_secret(dir .. "/a.key", a))
    assert(keys.write_public(dir .. "/a.pub", a))
    assert(keys.write_secret(dir .. "/b.key", b))
    assert(keys.write_public(dir .. "/b.pub", b))
    return { key = dir .. "/a.key", trust = dir .. "/b.pub" }, { dir .. "/b.key", dir .. "/a.pub" }
  end

  local function rounds(n, opts, rargs)
      local pad = ("x"):rep(3600)
      for round = 1, n do
        local o = { quiet = true }
        for k, v in pairs(opts or {}) do o[k] = v end
        local ctx = assert(lecho.context(o))
        local relay = S.lua(RELAY, ctx.addr, unpack(rargs or {}))
        assert(S.run_until(ctx, function() return (S.read(relay.out) or ""):find("ready") end, 30),
               "the relay did not start: " .. S.errors(relay))
        local got = 0
        assert(ctx:channel("b"):consumer(function() got = got + 1 end))
        local p = assert(ctx:channel("a"):producer())
        local n = 0
        for i = 1, 24 do
          if i % 3 == 0 then
            assert.is_true(p:submit_sync({ i = i, pad = pad }))
          else
            assert.is_true(p:submit({ i = i, pad = pad }))
          end
          n = n + 1
        end
        assert.is_true(p:submit("end"))
        n = n + 1
        assert(S.run_until(ctx, function() return got >= n end, 30),
               ("round %d: %d of %d came back; relay: %s"):format(round, got, n, S.errors(relay)))
        assert.is_true(S.wait(relay, 20, ctx), "the relay did not exit")
        assert.are.equal(0, relay.rc, ("round %d: %s"):format(round, S.errors(relay)))
        local ok, err = ctx:close()
        assert.is_true(ok, err)
      end
  end

  it("a consumer that read everything, closing as the producer's context closes: close true (5 rounds)",
    function() rounds(5) end)

  it("the same over keyed connections (records): close true (3 rounds)", function()
    rounds(3, keyed())
  end)
end)
