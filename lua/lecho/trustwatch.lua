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
local ffi = require "ffi"
local bit = require "bit"

local M = {}

M.POLL = 0.5

-- SIGHUP, through a signalfd read by the loop of every context watching:
-- blocked for the thread, so it never interrupts Lua.
-- (own names for the libc symbols: other modules declare them with their
-- own sigset types)
pcall(ffi.cdef, [[
typedef struct { unsigned long val[16]; } lecho_tw_sigset_t;
int lecho_tw_sigemptyset(lecho_tw_sigset_t *set) __asm__("sigemptyset");
int lecho_tw_sigaddset(lecho_tw_sigset_t *set, int signum) __asm__("sigaddset");
int lecho_tw_sigprocmask(int how, const lecho_tw_sigset_t *set, lecho_tw_sigset_t *old) __asm__("sigprocmask");
int lecho_tw_signalfd(int fd, const lecho_tw_sigset_t *mask, int flags) __asm__("signalfd");
]])
pcall(ffi.cdef, "long read(int fd, void *buf, size_t n);")
local SIGHUP, SIG_BLOCK, SFD_NONBLOCK, SFD_CLOEXEC = 1, 0, 2048, 524288
local hup = { fd = nil, ctxs = setmetatable({}, { __mode = "k" }) }

local function hup_fd()
  if hup.fd then return hup.fd end
  local set = ffi.new("lecho_tw_sigset_t")
  ffi.C.lecho_tw_sigemptyset(set)
  ffi.C.lecho_tw_sigaddset(set, SIGHUP)
  if ffi.C.lecho_tw_sigprocmask(SIG_BLOCK, set, nil) ~= 0 then return nil end
  local fd = ffi.C.lecho_tw_signalfd(-1, set, bit.bor(SFD_NONBLOCK, SFD_CLOEXEC))
  if fd < 0 then return nil end
  hup.fd = fd
  return fd
end

local function stamps(paths)
  local s = {}
  for i, p in ipairs(paths) do s[i] = keys.stamp(p) end
  return table.concat(s, "|")
end

--- Reloads ctx's trust files (identity: lecho.keys.identity's) and its
-- policy file now.  Returns true, or nil, why (logged).
function M.reload(ctx, w)
  local ok, why = true, nil
  if w.trust_paths then
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
      for _, e in ipairs(t.authorities) do c:trust_authority(e.public, e.not_before or 0, e.not_after or 0) end
      local n = c:set_revoked(table.concat(t.revoked))
      ctx.revoked = t.revoked
      ctx.revocation_lists = t.lists
      ctx.log(("trust files reloaded: %d keys, %d authorities, %d revoked%s"):format(#t.keys, #t.authorities,
        #t.revoked, (n or 0) > 0 and (", %d connections closed"):format(n) or ""))
    end
  end
  if w.policy_path and ctx.reg then
    local pol, err = require("lecho.policy").load(w.policy_path)
    if not pol then
      ok, why = nil, err
      ctx.log(("policy not reloaded: %s (the one before stays)"):format(err))
    else
      ctx.reg.policy = pol
      ctx.log(("policy reloaded from %s"):format(w.policy_path))
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
  w.stamp = stamps(paths)
  ctx.trustwatch = w
  poll = poll or M.POLL
  if poll > 0 then
    w.timer = ctx.c:timer(poll, poll, function()
      local s = stamps(paths)
      if s ~= w.stamp then
        w.stamp = s
        M.reload(ctx, w)
      end
    end)
  end
  local fd = hup_fd()
  if fd then
    hup.ctxs[ctx] = w
    -- each context's loop reads the signalfd: the first to read it reloads
    -- every watching context of the process
    w.io = ctx.c:io(fd, function()
      local buf = ffi.new("uint8_t[128]")
      local got = false
      while ffi.C.read(fd, buf, 128) == 128 do got = true end
      if got then
        for x, xw in pairs(hup.ctxs) do
          if not x.closed then
            xw.stamp = stamps(xw.paths)
            M.reload(x, xw)
          end
        end
      end
    end)
  end
  return w
end

--- Stops watching (ctx:close).
function M.stop(ctx)
  local w = ctx.trustwatch
  if not w then return end
  hup.ctxs[ctx] = nil
  if w.timer then w.timer:stop() end
  if w.io then w.io:stop() end
  ctx.trustwatch = nil
end

return M
