-- lecho.trustwatch: a keyed context's trust files (and a name server's
-- policy file) read again while it runs (doc/security.md "Reloading"):
-- when one changes (its stamp: mtime, size, inode, polled every
-- M.POLL seconds, one statx per file) or on SIGHUP.
--
-- A reload that reads adds the keys and authorities new in the files,
-- sets the authorities' validity and replaces the revoked keys: the live
-- connections of a key revoked now are closed at once (the core does,
-- one log line each).  A key or authority removed from the files stays
-- trusted until the process restarts (the core has no "untrust"): revoke
-- it.  A reload that does not read (a half-written file, a bad signature)
-- changes nothing and is logged; the files are tried again at their next
-- change.  The policy file replaces the registry's policy the same way.

local keys = require "lecho.keys"
-- Loops over keys as `in each(t)`, never `in pairs(t)`: no ITERN loop, which
-- Debian's LuaJIT may never end in the close at the program's end (context.lua).
local each = pairs

local M = {}

M.POLL = 0.5

-- SIGHUP: caught only inside ctx:run() with signals (lecho.context's
-- `signals`, true by default), as SIGINT and SIGTERM are (core/binding/lua_loop.c
-- l_run): a host program's signal actions and mask are never changed
-- outside it, and a program that serves its loop otherwise relies on the
-- file poll.  A SIGHUP reloads every watching context of the process.
local hup = { ctxs = setmetatable({}, { __mode = "k" }) }

local function stamps(paths)
  local s = {}
  for i, p in ipairs(paths) do s[i] = keys.stamp(p) end
  return table.concat(s, "|")
end

-- The revocation lists ctx holds, by authority: the newer (higher seq) of
-- its trust files' and the name server's; the revoked keys are their union.
-- Lists: { [authority pk] = { authority, seq, issued, keys, sig } }.
-- Returns how many lists changed, and how many connections closed.
local function merge_lists(ctx, lists)
  ctx.revocation_lists = ctx.revocation_lists or {}
  local changed = 0
  for apk, l in each(lists) do
    local cur = ctx.revocation_lists[apk]
    if not cur or l.seq > cur.seq then        -- never an older one over a newer
      ctx.revocation_lists[apk] = l
      changed = changed + 1
    end
  end
  if changed == 0 then return 0, 0 end
  local seen, revoked = {}, {}
  for _, l in each(ctx.revocation_lists) do
    for _, pk in ipairs(l.keys) do
      if not seen[pk] then seen[pk] = true; revoked[#revoked + 1] = pk end
    end
  end
  table.sort(revoked)
  ctx.revoked = revoked
  return changed, ctx.c:set_revoked(table.concat(revoked)) or 0
end
M.merge_lists = merge_lists

-- A name server's lists, as a control message (byte strings as they are).
local function lists_msg(ctx)
  local out = {}
  for _, l in each(ctx.revocation_lists or {}) do
    out[#out + 1] = { authority = l.authority, seq = l.seq, issued = l.issued, keys = l.keys, sig = l.sig }
  end
  return #out > 0 and { op = "revocations", lists = out } or nil
end

local function is_nameserver(ctx) return ctx.reg and ctx.reg.role == "nameserver" end

--- A name server tells a context that came up the revocation lists it
-- holds (the context checks them: M.received).
function M.peer_up(ctx, addr)
  if not is_nameserver(ctx) then return end
  local msg = lists_msg(ctx)
  if msg then ctx:_send_ctrl(addr, msg) end
end

--- A `revocations` message from `from`: taken only from a name server this
-- context uses, authenticated as nameserver_principal, and of each list
-- only one an authority this context trusts signed, newer than the one it
-- holds.  Returns how many lists it took (a refused message is logged,
-- rate-limited).
function M.received(ctx, from, msg)
  if not (ctx.keyed and ctx.nameservers[from] and from ~= ctx.addr
          and ctx.c:peer_identity(from) == ctx.ns_principal) then
    ctx:_warn_limited("revocations", ("ignoring revocation lists from %s: not a name server of this context")
                                     :format(from))
    return 0
  end
  if type(msg.lists) ~= "table" or #msg.lists > 64 then
    ctx:_warn_limited("revocations", ("ignoring revocation lists from %s: malformed"):format(from))
    return 0
  end
  local take = {}
  for _, l in ipairs(msg.lists) do
    local ok = type(l) == "table" and type(l.authority) == "string" and ctx.authorities
               and ctx.authorities[l.authority] and type(l.seq) == "number" and type(l.issued) == "number"
               and type(l.keys) == "table" and #l.keys <= 65536 and type(l.sig) == "string"
    if ok then
      for _, pk in ipairs(l.keys) do if type(pk) ~= "string" or #pk ~= 32 then ok = false break end end
    end
    local list = ok and { authority = l.authority, seq = l.seq, issued = l.issued, keys = l.keys, sig = l.sig }
    if list and keys.check_revocations(list) then
      local cur = take[list.authority]
      if not cur or list.seq > cur.seq then take[list.authority] = list end
    else
      ctx:_warn_limited("revocations", ("ignoring a revocation list from %s: not signed by an authority "
        .. "this context trusts"):format(from))
    end
  end
  local changed, closed = merge_lists(ctx, take)
  if changed > 0 then
    ctx.log(("revocation lists from name server %s: %d taken, %d revoked keys%s"):format(from, changed,
      #ctx.revoked, closed > 0 and (", %d connections closed"):format(closed) or ""))
  end
  return changed
end

--- A `policy` message from `from`: a manager takes it only from its own
-- name server (authenticated as nameserver_principal), as it takes the
-- policy in the reply to register_manager.
function M.policy_received(ctx, from, msg)
  if not (ctx.keyed and ctx.reg and ctx.reg.role == "manager" and from == ctx.ns
          and ctx.c:peer_identity(from) == ctx.ns_principal) then
    ctx:_warn_limited("policy", ("ignoring a policy from %s: not this manager's name server"):format(from))
    return false
  end
  ctx:_registered({ policy = msg.policy })
  ctx.log(("policy from name server %s taken"):format(from))
  return true
end

--- Reloads ctx's trust files (identity: lecho.keys.identity's) and its
-- policy file now; only = "trust" or "policy": only those (what changed:
-- the log says what was reloaded).  Returns true, or nil, why (logged).
function M.reload(ctx, w, only)
  local ok, why = true, nil
  if w.trust_paths and only ~= "policy" then
    local t, err = keys.read_trust(w.trust_paths)
    if not t then
      ok, why = nil, err
      ctx.log(("trust files not reloaded: %s (the ones before stay)"):format(err))
    else
      local c = ctx.c
      for _, e in ipairs(t.keys) do
        c:trust_key(e.public, e.name)
        ctx.trust_names[e.public] = e.name
      end
      for _, e in ipairs(t.authorities) do
        c:trust_authority(e.public, e.not_before or 0, e.not_after or 0)
        ctx.authorities[e.public] = true
      end
      local changed, n = merge_lists(ctx, t.lists)
      ctx.log(("trust files reloaded: %d keys, %d authorities, %d revoked%s"):format(#t.keys, #t.authorities,
        #(ctx.revoked or {}), n > 0 and (", %d connections closed"):format(n) or ""))
      -- a name server hands newer lists on to every context connected
      if changed > 0 and is_nameserver(ctx) then
        local msg = lists_msg(ctx)
        for addr, st in each(ctx.c:stats().peers or {}) do
          if st.connected and addr ~= ctx.addr then ctx:_send_ctrl(addr, msg) end
        end
      end
    end
  end
  if w.policy_path and ctx.reg and only ~= "trust" then
    local pol, err = require("lecho.policy").load(w.policy_path)
    if not pol then
      ok, why = nil, err
      ctx.log(("policy not reloaded: %s (the one before stays)"):format(err))
    else
      ctx.log(("policy reloaded from %s"):format(w.policy_path))
      -- what it no longer grants is withdrawn from the members here now
      ctx.reg:set_policy(pol, ctx._send, ctx.c:now())
      -- the managers registered here enforce it too: told now (as in the
      -- reply to their register_manager)
      for addr in each(ctx.reg.managers or {}) do
        if addr ~= ctx.addr then ctx:_send_ctrl(addr, { op = "policy", policy = pol:table() }) end
      end
    end
  end
  return ok, why
end

--- Watches ctx's trust files (identity.trust_paths) and policy file
-- (policy_path, or nil): a timer of poll seconds (default M.POLL; 0: none)
-- and SIGHUP.
function M.start(ctx, identity, policy_path, poll)
  local w = { trust_paths = identity and identity.trust_paths, policy_path = policy_path }
  local paths = {}
  for _, p in ipairs(w.trust_paths or {}) do paths[#paths + 1] = p end
  if policy_path then paths[#paths + 1] = policy_path end
  if #paths == 0 then return nil end
  w.paths = paths
  -- the trust files' stamps and the policy file's apart: a reload reads
  -- (and logs) only what changed
  local tpaths, ppaths = w.trust_paths or {}, { policy_path }
  w.stamp = stamps(paths)
  w.tstamp, w.pstamp = stamps(tpaths), policy_path and stamps(ppaths)
  ctx.trustwatch = w
  poll = poll or M.POLL
  if poll > 0 then
    w.timer = ctx.c:timer(poll, poll, function()
      local ts, ps = stamps(tpaths), policy_path and stamps(ppaths)
      local tch, pch = ts ~= w.tstamp, ps ~= w.pstamp
      if tch or pch then
        w.tstamp, w.pstamp, w.stamp = ts, ps, stamps(paths)
        M.reload(ctx, w, not pch and "trust" or not tch and "policy" or nil)
      end
    end)
  end
  hup.ctxs[ctx] = w
  return w
end

--- On SIGHUP (ctx:run, core/binding/lua_loop.c): every watching context of the
-- process reads its files again.
function M.hup()
  for x, xw in each(hup.ctxs) do
    if not x.closed then
      xw.stamp = stamps(xw.paths)
      xw.tstamp = stamps(xw.trust_paths or {})
      xw.pstamp = xw.policy_path and stamps({ xw.policy_path })
      M.reload(x, xw)
    end
  end
end

--- Stops watching (ctx:close).
function M.stop(ctx)
  local w = ctx.trustwatch
  if not w then return end
  hup.ctxs[ctx] = nil
  if w.timer then w.timer:stop() end
  ctx.trustwatch = nil
end

return M
