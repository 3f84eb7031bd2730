-- lecho.ns.may: the name server's answer to `{ op = "may" }` (lecho.stats
-- asks it, in keyed mode, about a `stats` request it received): an op of
-- the registry's (lecho.ns.registry adds M.ops).  Leans on lecho.ns.outbox
-- (the replies) and the registry's policy (lecho.policy).

-- Never compiled, as lecho.ns.registry (Debian's LuaJIT and LuaJIT #827).
if jit then jit.off(true, true) end

local outbox = require "lecho.ns.outbox"

local M = {}

-- `may` answers whether principal P may do action A (only "stats") on the
-- process whose principal is `target`, by this name server's policy.  It
-- exists for a process asked for its stats (lecho.stats: M.serve, its
-- `may`): it asks about a request it received, on itself.  So in keyed mode the asker must be
-- `target` (rights on itself: who may read its own counters) or `principal`
-- (its own rights); anything else would make the name server an oracle of
-- its policy for any certified principal (refused, code "refused").
M.ops = {}
function M.ops.may(self, from, msg, io)
  if msg.action ~= "stats" or type(msg.principal) ~= "string" or type(msg.target) ~= "string" then
    return outbox.fail(self, io, from, msg.rid, "may: needs action \"stats\", string principal and target", "invalid")
  end
  if self.identity and from ~= self.addr then
    local asker = self.identity(from)
    if asker == nil or (asker ~= msg.target and asker ~= msg.principal) then
      return outbox.fail(self, io, from, msg.rid,
        ("not allowed: %s may ask only about its own process or its own rights (may %s stats %s?)")
          :format(tostring(asker or from), msg.principal:sub(1, 64), msg.target:sub(1, 64)), "refused")
    end
  end
  local ok, err = true, nil
  if self.identity and self.policy then ok, err = self.policy:check(msg.principal, "stats", msg.target) end
  outbox.reply(self, io, from, msg.rid, { allowed = ok and true or false, err = err })
end

return M
