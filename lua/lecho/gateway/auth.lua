-- lecho.gateway.auth: the gateway's keyed mode (doc/gateway.md
-- "Protected and keyed mode"): its tokens and client keys read from the
-- options (M.config), the hello each client gets first (with a nonce to
-- sign when it must authenticate, and the deadline to do it in), the
-- request auth (a bearer token, or an Ed25519 signature of the nonce by a
-- client key: the connection's principal, kept for its life) and the
-- policy's check of every action where the client's message is read
-- (Gateway:_may).  Without keys (protected mode) every local client may
-- do everything.  Its Gateway functions are methods of the Gateway
-- (listed in lecho.gateway's header, which mixes them in).

local core = require "lecho.core"
local ops = require "lecho.gateway.ops"
local OPS, err = ops.OPS, ops.err

local M = {}

local Gateway = {}   -- this file's methods of lecho.gateway's Gateway
M.Gateway = Gateway

--- The tokens ({ token = principal }) and client keys ({ public = name })
-- of the gateway's options opts.tokens and opts.keys, and whether they make
-- it keyed; or nil, why.
function M.config(opts)
  local tokens, keys = {}, {}
  local keyed = false
  for t, p in pairs(opts.tokens or {}) do
    if type(t) ~= "string" or #t < 16 or type(p) ~= "string" then
      return nil, "tokens: each token a string of at least 16 bytes mapped to a principal name"
    end
    tokens[t] = p
    keyed = true
  end
  for _, k in ipairs(opts.keys or {}) do
    keys[k.public] = k.name
    keyed = true
  end
  if keyed and not opts.policy then return nil, "keyed mode (tokens or client keys) needs a policy" end
  return tokens, keys, keyed
end

function Gateway:_hello(cl)
  if self.keyed and not cl.principal then
    cl.nonce = ("%.0f%.0f"):format(core.random_id(), core.random_id())
    if cl.dtimer then cl.dtimer:stop() end
    cl.dtimer = self.ctx.c:timer(self.lim.handshake, 0, function()
      cl.dtimer = nil
      if not cl.principal then self:_drop(cl, 1008, "not authenticated in time") end
    end)
  elseif cl.dtimer then
    cl.dtimer:stop(); cl.dtimer = nil
  end
  cl:reply{ hello = "lecho-gateway", version = 1, auth = (self.keyed and not cl.principal) and "required" or nil,
            principal = cl.principal, nonce = cl.nonce, slow = self.slow,
            limits = { message = self.lim.message, subs = self.lim.subs, queued = self.lim.queued,
                       channels = self.lim.channels } }
end

-- May cl's principal do action on ch?  Protected mode: every local client may.
function Gateway:_may(cl, action, ch)
  if not self.keyed then return true end
  if not self.policy then return nil, "not allowed: the gateway has no policy" end
  return self.policy:check(cl.principal, action, ch)
end

function OPS.auth(self, cl, m, id)
  if cl.principal then
    return err(cl, id, ("already authenticated as %s (a connection keeps its principal)"):format(cl.principal), "invalid")
  end
  local p
  if type(m.token) == "string" then
    p = self.tokens[m.token]
  elseif type(m.key) == "string" and type(m.sig) == "string" and cl.nonce then
    local pk, sig = core.unhex(m.key), core.unhex(m.sig)
    local name = pk and self.keys[pk]
    if name and sig and core.verify(pk, M.auth_message(cl.nonce), sig) then p = name end
  end
  if not p then
    err(cl, id, "authentication failed", "auth")
    return self:_drop(cl, 1008, "authentication failed")
  end
  cl.principal = p
  if cl.dtimer and not cl.closing then cl.dtimer:stop(); cl.dtimer = nil end
  self.ctx.log(("gateway: client %d authenticated as %s"):format(cl.id, p), "info")
  cl:reply{ id = id, ok = true, principal = p }
end

--- What a key signs to authenticate: the nonce of the gateway's hello.
function M.auth_message(nonce) return "lecho-gateway auth " .. nonce end
return M
