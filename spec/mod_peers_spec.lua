-- Issue 25 (review): `lecho stats` of a producer kept the peers of consumers
-- that had died for minutes, despite peer_free_after: the stream of a
-- consumer's modulator (channel NAME@KEY) kept its destinations when the
-- modulator was unloaded, and a destination holds its peer.  A real consumer
-- process with a modulator, killed with SIGKILL; the producer's peer of it
-- must be freed within peer_free_after (1 s here) of its leaving.
local S = require "spec.support"
local lecho = require "lecho"

describe("a producer whose modulating consumer died", function()
  teardown(function() S.cleanup() end)

  it("frees the consumer's peer after peer_free_after and leaves its stream no destination", function()
    local ctx = assert(lecho.context{ quiet = true, listen = "127.0.0.1:0", peer_free_after = 1 })
    local ch = ctx:channel("y")
    local p = assert(ch:producer())
    local tick = ctx:every(0.05, function() p:submit({ step = 1 }) end)
    local sub = S.spawn(("%s %s/scripts/lecho sub y --modulator %s/examples/atmosphere/stride.lua "
      .. "--params '{ stride = 2 }' --nameserver %s"):format(S.luajit, S.root, S.root, ctx.ns))
    -- its modulator's stream has the consumer as destination
    local stream, peer
    local deadline = ctx:now() + 20
    while not stream and ctx:now() < deadline do
      ctx:run_once(0.05)
      for n, c in pairs(ctx:stats().channels) do
        if n:find("/y@", 1, true) and (c.destinations or 0) > 0 then stream = n end
      end
    end
    assert(stream, "the modulator never ran here: " .. S.errors(sub))
    for a, q in pairs(ctx:stats().peers) do
      if q.connected and a ~= ctx.ns and a ~= ctx.addr then peer = a end
    end
    assert(peer, "no peer of the consumer")
    S.kill(sub, "KILL")
    S.wait(sub, 20)
    local gone_at, left
    deadline = ctx:now() + 15
    while ctx:now() < deadline do
      ctx:run_once(0.1)
      if not ctx:stats().peers[peer] then gone_at = ctx:now(); break end
    end
    left = ctx:stats()
    tick:stop()
    ctx:close()
    assert.truthy(gone_at, ("the dead consumer's peer %s still there 15 s later (%s: %d destinations)")
      :format(peer, stream, left.channels[stream].destinations or 0))
    assert.are.equal(0, left.channels[stream] and left.channels[stream].destinations or 0)
  end)
end)
