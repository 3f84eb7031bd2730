-- stress/os.lua: the signal handling of the stress driver, through the FFI:
-- SIGINT/SIGTERM/SIGHUP read from a signalfd so that an interrupted driver
-- kills the whole process group of its children (started with
-- spec/support/proc.lua's fork: one group, a parent-death signal each)
-- before it exits.
local ffi = require "ffi"
local P = require "spec.support.proc" -- declares lecho_proc_sigset and sig*
local C = ffi.C

ffi.cdef [[
int signalfd(int fd, const lecho_proc_sigset *mask, int flags);
long read(int fd, void *buf, unsigned long n);
]]

local M = {}
local SIGS = P.SIGS
M.SIGS = SIGS

local sfd = -1

--- Blocks the terminating signals and reads them from a signalfd instead.
function M.trap()
  local set = ffi.new("lecho_proc_sigset")
  C.sigemptyset(set)
  for _, s in ipairs{ SIGS.INT, SIGS.TERM, SIGS.HUP } do C.sigaddset(set, s) end
  C.sigprocmask(0, set, nil) -- SIG_BLOCK
  sfd = C.signalfd(-1, set, 0x800) -- SFD_NONBLOCK
end

--- The number of a pending terminating signal, or nil.
function M.signalled()
  if sfd < 0 then return nil end
  local buf = ffi.new("uint32_t[32]")
  local n = C.read(sfd, buf, 128)
  if n == 128 then return buf[0] end
end

return M
