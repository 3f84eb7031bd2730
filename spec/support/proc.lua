-- spec/support/proc.lua: child processes and the files they leave, for the
-- specs (spec/support.lua), the benchmark suite (bench/) and the stress
-- harness (stress/): one place for starting, waiting, reading output and
-- killing.  No lecho here (the stress checker does not load it); it leans on
-- LuaJIT's FFI for a monotonic clock, sleeping, signals and fork/exec.
--
-- Two ways to start a child:
--   group:spawn(cmd)  a shell command in the background, wrapped by a shell
--                     that writes its pid and exit code to files: nothing to
--                     reap, any process may wait for it (specs, bench);
--   M.fork(argv)      fork/exec into a process group, dying with its parent,
--                     reaped with M.reap (the stress driver).
-- bench/ and stress/ load it by path: package.path gets the tree's root.

local ffi = require "ffi"
local bit = require "bit"
local C = ffi.C

-- One declaration at a time: a declaration another FFI user of the same
-- process made first is not an error here.
for _, decl in ipairs{
  "typedef struct { long tv_sec; long tv_nsec; } lecho_proc_timespec;",
  "typedef struct { unsigned long val[16]; } lecho_proc_sigset;",
  "int clock_gettime(int clk, lecho_proc_timespec *ts);",
  "int poll(void *fds, unsigned long nfds, int timeout);",
  "int getpid(void);",
  "int getppid(void);",
  "int kill(int pid, int sig);",
  "int fork(void);",
  "int execvp(const char *file, char *const argv[]);",
  "void _exit(int status);",
  "int setpgid(int pid, int pgid);",
  "int prctl(int option, unsigned long a2, unsigned long a3, unsigned long a4, unsigned long a5);",
  "int waitpid(int pid, int *status, int options);",
  "int open(const char *path, int flags, int mode);",
  "int dup2(int a, int b);",
  "int sigemptyset(lecho_proc_sigset *set);",
  "int sigaddset(lecho_proc_sigset *set, int sig);",
  "int sigprocmask(int how, const lecho_proc_sigset *set, lecho_proc_sigset *old);",
} do pcall(ffi.cdef, decl) end

local M = {}

M.SIGS = { HUP = 1, INT = 2, KILL = 9, TERM = 15, CONT = 18, STOP = 19 }

------------------------------------------------------------------------------
-- Time, files, shell words

local ts = ffi.new("lecho_proc_timespec")
--- Seconds on CLOCK_MONOTONIC: one clock for every process of the host, so
-- times stamped by different processes compare.
function M.clock()
  C.clock_gettime(1, ts)
  return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end

function M.sleep(s)
  if s > 0 then C.poll(nil, 0, math.floor(s * 1000 + 0.5)) end
end

function M.getpid() return C.getpid() end

function M.sh_quote(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

--- A shell command of a list of words, each quoted.
function M.sh_join(argv)
  local q = {}
  for i, a in ipairs(argv) do q[i] = M.sh_quote(a) end
  return table.concat(q, " ")
end

--- The whole content of path, or nil if it cannot be opened.
function M.read(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end

--- Writes text to path whole (through path.tmp and a rename, so a reader
-- never sees half of it); returns path.
function M.write(path, text)
  local f = assert(io.open(path .. ".tmp", "wb"))
  f:write(text)
  f:close()
  assert(os.rename(path .. ".tmp", path))
  return path
end

--- A new directory /tmp/STEM.XXXXXX (the caller removes it: M.remove).
function M.tmpdir(stem)
  local p = io.popen(("mktemp -d /tmp/%s.XXXXXX"):format(stem or "lecho"))
  local dir = p:read("*l")
  p:close()
  assert(dir and dir ~= "", "mktemp -d failed")
  return dir
end

-- (Once more after a moment: a child killed just before may still be
-- writing its last file there, and rm then says "Directory not empty".)
function M.remove(dir)
  local q = M.sh_quote(dir)
  os.execute(("rm -rf %s 2>/dev/null || { sleep 0.2; rm -rf %s; }"):format(q, q))
end

--- Calls pred() until it returns a true value, which is returned, or
-- timeout seconds (20) pass (nil): at once, then after 2, 4, 8 ... ms, every
-- 50 ms from then on (a child's pid file or "ready" line comes within a few
-- ms: a fixed 50 ms step cost every spawn and wait 25 ms on average, most of
-- a minute over the suite).  poll(step), if given, is called instead of
-- sleeping (a context's run_once, a reaper); it returning true gives up at
-- once.
function M.wait_until(pred, timeout, poll)
  local deadline = M.clock() + (timeout or 20)
  local step = 0.002
  repeat
    local v = pred()
    if v then return v end
    if poll then
      if poll(step) then return nil end
    else
      M.sleep(step)
    end
    step = math.min(step * 2, 0.05)
  until M.clock() > deadline
  return nil
end

--- Waits until path exists with content matching pattern (default: any);
-- returns the content, or nil (M.wait_until's timeout and poll).
function M.wait_file(path, pattern, timeout, poll)
  return M.wait_until(function()
    local s = M.read(path)
    return s and s:match(pattern or ".") and s
  end, timeout, poll)
end

------------------------------------------------------------------------------
-- Signals

--- Sends sig (a name of M.SIGS or a number) to pid (negative: a process
-- group); true if it was delivered.
function M.signal(pid, sig)
  return C.kill(pid, M.SIGS[sig or "TERM"] or sig) == 0
end

--- True while pid exists (a stopped process included).
function M.alive(pid)
  return pid ~= nil and C.kill(pid, 0) == 0
end

------------------------------------------------------------------------------
-- Shell-wrapped children: group:spawn

local Group = {}
Group.__index = Group

--- A set of children whose files (TAG-N.out, .err, .pid, .rc) go to dir.
function M.group(dir)
  return setmetatable({ dir = dir, children = {}, n = 0 }, Group)
end

--- Starts cmd (a shell command) in the background, stdin from /dev/null,
-- stdout and stderr to files.  Returns the child: { pid, out, err, rcfile,
-- cmd }; child.rc is set once it is seen to have exited.
function Group:spawn(cmd, tag)
  self.n = self.n + 1
  local base = ("%s/%s-%d"):format(self.dir, tag or "child", self.n)
  local child = { out = base .. ".out", err = base .. ".err", rcfile = base .. ".rc", cmd = cmd }
  local inner = ("%s >%s 2>%s </dev/null & echo $! >%s.pid; wait $!; echo $? >%s")
    :format(cmd, child.out, child.err, base, child.rcfile)
  os.execute(("sh -c %s >/dev/null 2>&1 &"):format(M.sh_quote(inner)))
  local pid = M.wait_file(base .. ".pid", "%d+", 10)
  child.pid = assert(tonumber(pid and pid:match("%d+")), "could not start: " .. cmd)
  self.children[#self.children + 1] = child
  return child
end

--- child's exit code once it exited, else nil.
function M.exit_code(child)
  if child.rc then return child.rc end
  local rc = M.read(child.rcfile)
  if rc and rc:match("%d") then child.rc = tonumber(rc:match("%d+")) end
  return child.rc
end

--- Waits until child exits (true, exit code) or timeout seconds (30) pass
-- (false).  poll as for M.wait_until.
function M.wait(child, timeout, poll)
  if M.wait_until(function() return M.exit_code(child) end, timeout or 30, poll) then
    return true, child.rc
  end
  return false
end

function M.kill(child, sig)
  if child.pid then M.signal(child.pid, sig or "TERM") end
end

--- TERM, then KILL if child is still there after grace seconds (2); waits
-- for its wrapping shell to record the exit.
function M.stop(child, grace)
  if not child.pid or M.exit_code(child) then return end
  M.kill(child, "TERM")
  if not M.wait(child, grace or 2) then
    M.kill(child, "KILL")
    M.wait(child, 2)
  end
end

function M.output(child) return M.read(child.out) or "" end

--- child's stderr, its first max bytes if max is given.
function M.errors(child, max)
  local s = M.read(child.err) or ""
  return max and s:sub(1, max) or s
end

--- Kills every child of the group still running: with sig at once (the
-- specs' KILL), or without it politely (M.stop); forgets them all.
function Group:kill_all(sig)
  for _, c in ipairs(self.children) do
    if sig then
      if M.alive(c.pid) then M.kill(c, sig) end
    else
      M.stop(c)
    end
  end
  self.children = {}
end

------------------------------------------------------------------------------
-- Forked children: M.fork and M.reap

local O_WRONLY, O_CREAT, O_TRUNC, O_RDONLY = 1, 0x40, 0x200, 0

--- Starts argv (a list) with stdout/stderr to the files out and err, in the
-- process group pgid (0 or nil: a new group led by the child); the child
-- gets SIGKILL when this process dies (PR_SET_PDEATHSIG) and takes signals
-- again even if they were blocked here.  Returns the pid; reap with M.reap.
function M.fork(argv, out, err, pgid)
  local n = #argv
  local cargv = ffi.new("char *[?]", n + 1)
  local keep = {}
  for i, a in ipairs(argv) do
    local s = ffi.new("char[?]", #a + 1, a)
    keep[i] = s
    cargv[i - 1] = s
  end
  cargv[n] = nil
  local empty = ffi.new("lecho_proc_sigset")
  C.sigemptyset(empty)
  local parent = C.getpid()
  local pid = C.fork()
  if pid == 0 then
    C.setpgid(0, pgid or 0)
    C.prctl(1, M.SIGS.KILL, 0, 0, 0)      -- PR_SET_PDEATHSIG
    if C.getppid() ~= parent then C._exit(1) end
    C.sigprocmask(2, empty, nil)          -- SIG_SETMASK
    C.dup2(C.open("/dev/null", O_RDONLY, 0), 0)
    C.dup2(C.open(out, O_WRONLY + O_CREAT + O_TRUNC, 420), 1)
    C.dup2(C.open(err, O_WRONLY + O_CREAT + O_TRUNC, 420), 2)
    C.execvp(cargv[0], cargv)
    C._exit(127)
  end
  assert(pid > 0, "fork failed")
  C.setpgid(pid, pgid or pid)
  return pid
end

--- Reaps one exited forked child: pid, { code = } or { signal =, core = };
-- nil if none has exited.
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

------------------------------------------------------------------------------
-- The name server

--- The command line of a name server for M.nameserver's options (o.root,
-- o.luajit, o.listen, o.port_file, o.args), its port file removed first:
-- for a caller that starts it and reads the port file itself.
function M.nameserver_argv(o)
  os.remove(o.port_file)
  local argv = { o.luajit or "luajit", o.root .. "/scripts/lecho-nameserver",
                 "--listen", o.listen or "127.0.0.1:0", "--port-file", o.port_file }
  for _, a in ipairs(o.args or {}) do argv[#argv + 1] = a end
  return argv
end

--- Starts scripts/lecho-nameserver listening on a port the OS chooses and
-- waits for the address it writes to its port file.  o: root (the tree),
-- luajit, port_file (a path; removed first), listen (default
-- "127.0.0.1:0"), args (more of the script's options, a list), timeout and
-- poll (as M.wait_until's), start(argv) -> child (how the caller starts
-- processes: argv is a list of words, M.sh_join makes a shell command of
-- it).  Returns the child and the address, or the child and nil when none
-- came in time.  The address is the file's whole first line, any form.
function M.nameserver(o)
  local child = o.start(M.nameserver_argv(o))
  -- Written whole (a rename), ending with a newline.
  local s = M.wait_file(o.port_file, "[^\n]+\n", o.timeout, o.poll)
  return child, s and s:match("[^\n]+")
end

return M
