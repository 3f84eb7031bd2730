-- examples/keiretsu/presence.lua: who is online.
--
--   local presence = dofile(here .. "/presence.lua")
--   local g = presence.join(ctx, "alice")   -- (g:leave())
--   local users = presence.list(g)          -- sorted list of user names, or nil, err, code
--
-- A user is online while its client consumes its inbox channel
-- "inbox.USER": the name server's list of channels with a consumer says who.

local im = dofile((debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or ".") .. "/im.lua")

local M = {}

function M.join(ctx, _)
  return { ctx = ctx, leave = function() return true end }
end

function M.list(g)
  local chans, err, code = g.ctx:list()
  if not chans then return nil, err, code end
  local users = {}
  local pre = "/" .. im.inbox("")
  for full, info in pairs(chans) do
    local s = full:find(pre, 1, true)
    local u = s and full:sub(s + #pre)
    if u and im.valid_user(u) and next(info.consumers or {}) then users[#users + 1] = u end
  end
  table.sort(users)
  return users
end

return M
