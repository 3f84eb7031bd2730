-- examples/keiretsu/transport.lua: how a node serves the "im" service and
-- how a client calls it (lecho's services, doc/services.md).
--
--   local T = dofile(here .. "/transport.lua")
--   T.serve(ctx, handle)               -- node: handle(msg, caller) raises or returns true
--   local send = T.sender(ctx)
--   local ok, err, code = send(msg)    -- true: one node handled it (acknowledged)
--
-- Every node serves the same name: the caller's stub balances the calls
-- over the nodes it knows (from the name server's member lists) and, when a
-- call fails on one (killed, connection lost, no answer, busy), sends it
-- again to another.  The message's id is the call's idempotency key, which
-- is what lets the stub retry after a timeout or a lost connection: at
-- least once, so a reader drops a second copy by id.  A call refused by the
-- node's handler (offline, bad message) is not retried.

local im = dofile((debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or ".") .. "/im.lua")

local M = {}

-- A node runs up to CONCURRENCY calls at once (each waits for its
-- delivery), QUEUE more wait; past them a call is refused "busy" at once
-- and the stub tries another node.
M.CONCURRENCY, M.QUEUE = 64, 1024

function M.serve(ctx, handle)
  return ctx:service(im.SERVICE, function(msg, meta) return handle(msg, meta.caller) end,
                     { concurrency = M.CONCURRENCY, queue = M.QUEUE })
end

function M.sender(ctx, opts)
  local timeout, retries = opts and opts.timeout or 5, opts and opts.retries or 3
  return function(msg)
    local ok, err, code = ctx:call(im.SERVICE, msg, { key = msg.id, timeout = timeout, retries = retries })
    if ok == nil then return nil, err, code end
    return true
  end
end

return M
