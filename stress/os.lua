-- stress/os.lua: the process handling of the stress driver, through the FFI:
-- fork/exec into one process group, a parent-death signal on every child,
-- SIGINT/SIGTERM/SIGHUP read from a signalfd so that an interrupted driver
-- kills the whole group before it exits.
local ffi = require "ffi"
require "stress.lib" -- getpid, poll
local C = ffi.C

ffi.cdef [[
typedef struct { unsigned long val[16]; } lst_sigset_t;
int fork(void);
int execvp(const char *file, char *const argv[]);
void _exit(int status);
int setpgid(int pid, int pgid);
int prctl(int option, unsigned long a2, unsigned long a3, unsigned long a4, unsigned long a5);
int getppid(void);
int kill(int pid, int sig);
int waitpid(int pid, int *status, int options);
int open(const char *path, int flags, int mode);
int close(int fd);
int dup2(int a, int b);
long read(int fd, void *buf, unsigned long n);
int sigemptyset(lst_sigset_t *set);
int sigaddset(lst_sigset_t *set, int sig);
int sigprocmask(int how, const lst_sigset_t *set, lst_sigset_t *old);
int signalfd(int fd, const lst_sigset_t *mask, int flags);
]]

local M = {}
local SIGS = { INT = 2, KILL = 9, TERM = 15, STOP = 19, CONT = 18, HUP = 1 }
M.SIGS = SIGS

local sfd = -1

--- Blocks the terminating signals and reads them from a signalfd instead.
function M.trap()
  local set = ffi.new("lst_sigset_t")
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

local O_WRONLY, O_CREAT, O_TRUNC, O_RDONLY = 1, 0x40, 0x200, 0

--- Starts argv (a list) with stdout/stderr to files, in process group pgid
-- (0: a new group led by the child).  Returns the pid.
function M.spawn(argv, out, err, pgid)
  local n = #argv
  local cargv = ffi.new("char *[?]", n + 1)
  local keep = {}
  for i, a in ipairs(argv) do
    local s = ffi.new("char[?]", #a + 1, a)
    keep[i] = s
    cargv[i - 1] = s
  end
  cargv[n] = nil
  local empty = ffi.new("lst_sigset_t")
  C.sigemptyset(empty)
  local parent = ffi.C.getpid()
  local pid = C.fork()
  if pid == 0 then
    C.setpgid(0, pgid or 0)
    C.prctl(1, SIGS.KILL, 0, 0, 0)        -- PR_SET_PDEATHSIG: dies with the driver
    if C.getppid() ~= parent then C._exit(1) end
    C.sigprocmask(2, empty, nil)          -- SIG_SETMASK: the child takes signals again
    local i = C.open("/dev/null", O_RDONLY, 0)
    C.dup2(i, 0)
    local o = C.open(out, O_WRONLY + O_CREAT + O_TRUNC, 420)
    C.dup2(o, 1)
    local e = C.open(err, O_WRONLY + O_CREAT + O_TRUNC, 420)
    C.dup2(e, 2)
    C.execvp(cargv[0], cargv)
    C._exit(127)
  end
  assert(pid > 0, "fork failed")
  C.setpgid(pid, pgid or pid)
  return pid
end

function M.kill(pid, sig)
  return C.kill(pid, SIGS[sig] or sig) == 0
end

--- Reaps one exited child: pid, { code = } or { signal = }; nil if none.
function M.reap()
  local st = ffi.new("int[1]")
  local pid = C.waitpid(-1, st, 1) -- WNOHANG
  if pid <= 0 then return nil end
  local s = st[0]
  local sig = bit.band(s, 0x7f)
  if sig == 0 then return pid, { code = bit.band(bit.rshift(s, 8), 0xff) } end
  if sig == 0x7f then return M.reap() end -- stopped, not exited
  return pid, { signal = sig, core = bit.band(s, 0x80) ~= 0 }
end

return M
