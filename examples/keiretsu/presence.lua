-- examples/keiretsu/presence.lua: who is online.
--
--   local presence = dofile(here .. "/presence.lua")
--   local g = presence.join(ctx, "alice")   -- member of the group "im-users" (g:leave()), or nil, err, code
--   local users = presence.list(g)          -- sorted list of user names, or nil, err, code
--
-- A client joins the presence group "im-users" with a lease of im.LEASE
-- seconds and the data { user = NAME }, at every name server it knows; the
-- beacon (ctx:group) renews it every third of the lease.  A client that
-- leaves is gone at once, one that dies when its lease runs out.

local im = dofile((debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or ".") .. "/im.lua")

local M = {}

-- on_change (optional): on_change(user, "joined") or on_change(user,
-- "left", why) as the name servers tell of others (why: "left", "expired").
function M.join(ctx, user, on_change)
  local names = {}   -- addr -> user, of the members seen
  local watch = on_change and function(change)
    for addr, data in pairs(change.joined or {}) do
      local u = type(data) == "table" and data.user
      if im.valid_user(u) then
        names[addr] = u
        on_change(u, "joined")
      end
    end
    for addr, why in pairs(change.left or {}) do
      if names[addr] then on_change(names[addr], "left", tostring(why)) end
      names[addr] = nil
    end
  end
  return ctx:group(im.GROUP, { lease = im.LEASE, data = { user = user }, watch = watch })
end

function M.list(g)
  local members, err, code = g:members()
  if not members then return nil, err, code end
  local users, seen = {}, {}
  for _, data in pairs(members) do
    local u = type(data) == "table" and data.user
    if im.valid_user(u) and not seen[u] then
      seen[u] = true
      users[#users + 1] = u
    end
  end
  table.sort(users)
  return users
end

return M
