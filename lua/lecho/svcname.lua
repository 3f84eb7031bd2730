-- lecho.svcname: what serving (lecho.service) and calling (lecho.call)
-- share: the rule for a service's name, the name servers a service's call
-- channel is joined on, and the bound on a call's results.
local M = {}

--- Raises (at the caller's caller, level 3) unless name is a service name:
-- 1 to 200 bytes of A-Z a-z 0-9 . _ -.
function M.check_name(name, where)
  if type(name) ~= "string" or #name < 1 or #name > 200 or not name:find("^[%w%._%-]+$") then
    error(("lecho: %s: a service name is 1 to 200 bytes of A-Z a-z 0-9 . _ - (got %s)")
          :format(where, type(name) == "string" and ("%q"):format(name:sub(1, 40)) or type(name)), 3)
  end
end

--- The name servers of ctx (its list, or its one).
function M.nslist(ctx) return ctx.nslist or { ctx.ns } end

--- A call returns at most this many results.
M.MAX_RESULTS = 4096

return M
