-- examples/keiretsu/transport.lua: how a Keiretsu client reaches the "im"
-- service and how a node serves it.
--
--   local T = dofile(here .. "/transport.lua")
--   T.serve(ctx, "node-1", handle)         -- node: handle(msg, caller) raises or returns
--   local send = T.sender(ctx, { "node-1", ... })
--   local ok, err, code, tries = send(msg) -- acknowledged = handled by one node
--
-- Over lecho's channels: node NAME consumes channel "im.NAME"; a sender
-- produces on every node's channel, sends each message as a sync submit to
-- one node that has a consumer (round robin) and, when the submit fails (the
-- node died, its connection was lost, no answer in time), sends it again
-- with the same id to the next node: at least once, the reader deduplicates
-- by id.  A submit that returned true was handled, and the node's handler
-- returns only after the recipient's handler ran.

local im = dofile((debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or ".") .. "/im.lua")

local M = { kind = "channels" }

--- True when p's channel has a consumer somewhere (a sync submit to a
-- channel without one returns true at once: it must not count as delivered).
function M.has_consumer(p)
  local ch = p.ch
  return #ch.dests > 0 or #ch.consumers > 0
end

function M.serve(ctx, name, handle)
  return ctx:channel(im.SERVICE .. "." .. name):consumer(function(msg) handle(msg, nil) end)
end

function M.sender(ctx, nodes, opts)
  local timeout = opts and opts.timeout or 5
  local ps = {}
  for i, n in ipairs(nodes) do
    local p, err, code = ctx:channel(im.SERVICE .. "." .. n):producer()
    if not p then return nil, err, code end
    ps[i] = p
  end
  local next_i = 0
  return function(msg)
    local tries, last_err, last_code = 0, "no node serves " .. im.SERVICE, "noservice"
    for _ = 1, #ps do
      local p
      for _ = 1, #ps do
        next_i = next_i % #ps + 1
        if M.has_consumer(ps[next_i]) then p = ps[next_i] break end
      end
      if not p then break end
      tries = tries + 1
      local ok, err, code = p:submit_sync(msg, { timeout = timeout })
      if ok then return true, nil, nil, tries end
      last_err, last_code = tostring(err), code
      -- the node's handler ran and refused it (offline, bad message: the
      -- entry names the consumer): no other node would do better; the
      -- node unreachable, its connection lost, no answer: the next node
      if type(err) == "table" and err[1] and err[1].consumer then break end
    end
    return nil, last_err, last_code, tries
  end
end

return M
