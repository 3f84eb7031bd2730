-- examples/atmosphere/proc.lua: child processes for run.lua, through LuaJIT's
-- FFI (posix_spawn, kill, waitpid), so that run.lua is their parent: it can
-- tell when one exits and reaps every one of them.
--
--   local proc = dofile("examples/atmosphere/proc.lua")
--   local child = proc.spawn({ "luajit", "viewer.lua", "--kind", "full" }, { out = f1, err = f2 })
--   proc.poll(child)           -- true once exited (child.status: "exit 0", "signal 15")
--   proc.stop_all({ child }, 3) -- SIGTERM, then SIGKILL after 3 s, every one reaped

local ffi = require "ffi"

ffi.cdef [[
typedef int pid_t;
int posix_spawnp(pid_t *pid, const char *file, const void *file_actions,
                 const void *attrp, char *const argv[], char *const envp[]);
pid_t waitpid(pid_t pid, int *status, int options);
int kill(pid_t pid, int sig);
extern char **environ;
char *strerror(int errnum);
]]

local C = ffi.C
local M = {}
local WNOHANG, SIGTERM, SIGKILL = 1, 15, 9

local function sh_quote(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end
M.sh_quote = sh_quote

--- Starts argv (a list of strings) with stdin from /dev/null and stdout and
-- stderr to the files io.out and io.err.  Returns a child { pid, argv, out,
-- err }, or nil, err.
function M.spawn(argv, io_)
  io_ = io_ or {}
  local words = {}
  for i, a in ipairs(argv) do words[i] = sh_quote(a) end
  -- exec: the shell becomes the program, so the pid is the program's.
  local cmd = ("exec %s <%s >%s 2>%s"):format(table.concat(words, " "), "/dev/null",
    sh_quote(io_.out or "/dev/null"), sh_quote(io_.err or "/dev/null"))
  local args = { "/bin/sh", "-c", cmd }
  local cargv = ffi.new("char *[?]", #args + 1)
  local keep = {}
  for i, a in ipairs(args) do
    keep[i] = ffi.new("char[?]", #a + 1, a)
    cargv[i - 1] = keep[i]
  end
  cargv[#args] = nil
  local pid = ffi.new("pid_t[1]")
  local rc = C.posix_spawnp(pid, "/bin/sh", nil, nil, cargv, C.environ)
  if rc ~= 0 then return nil, ffi.string(C.strerror(rc)) end
  return { pid = pid[0], argv = argv, out = io_.out, err = io_.err }
end

--- True once the child has exited (and was reaped); child.status then says
-- how ("exit N" or "signal N") and child.code is the exit code (nil if
-- killed by a signal).
function M.poll(child)
  if child.status then return true end
  local st = ffi.new("int[1]")
  local r = C.waitpid(child.pid, st, WNOHANG)
  if r == child.pid then
    local s = st[0]
    local sig = bit.band(s, 0x7f)
    if sig == 0 then
      child.code = bit.band(bit.rshift(s, 8), 0xff)
      child.status = "exit " .. child.code
    else
      child.status = "signal " .. sig
    end
    return true
  elseif r < 0 then
    child.status = "gone"   -- not our child any more (reaped elsewhere)
    return true
  end
  return false
end

function M.signal(child, sig)
  if not child.status then C.kill(child.pid, sig or SIGTERM) end
end

local function sleep(s) os.execute(("sleep %.2f"):format(s)) end
M.sleep = sleep

--- Waits up to timeout seconds for every child to exit.  serve(dt), when
-- given, is called instead of sleeping (to keep an event loop running).
function M.wait_all(children, timeout, serve)
  local t_end = os.time() + timeout
  repeat
    local all = true
    for _, c in ipairs(children) do
      if not M.poll(c) then all = false end
    end
    if all then return true end
    if serve then serve(0.1) else sleep(0.1) end
  until os.time() > t_end
  return false
end

--- SIGTERM to every child still running, SIGKILL to those still there after
-- grace seconds; every one is reaped.  Returns true if none needed SIGKILL.
function M.stop_all(children, grace)
  for _, c in ipairs(children) do M.signal(c, SIGTERM) end
  if M.wait_all(children, grace or 3) then return true end
  for _, c in ipairs(children) do M.signal(c, SIGKILL) end
  M.wait_all(children, 5)
  return false
end

--- True if a process with this pid exists (a zombie counts).
function M.exists(pid)
  return C.kill(pid, 0) == 0
end

return M
