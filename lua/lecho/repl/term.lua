-- lua/lecho/repl/term.lua: the terminal of the REPL through LuaJIT's ffi:
-- raw mode and its restoration, the window width, reading and polling file
-- descriptors, and signals taken from a signalfd.  Knows nothing of lecho.
local ffi = require "ffi"
local bit = require "bit"

local M = {}

ffi.cdef [[
typedef unsigned int lr_tcflag_t;
struct lr_termios {
  lr_tcflag_t c_iflag, c_oflag, c_cflag, c_lflag;
  unsigned char c_line;
  unsigned char c_cc[32];
  unsigned int c_ispeed, c_ospeed;
};
struct lr_winsize { unsigned short ws_row, ws_col, ws_xpixel, ws_ypixel; };
struct lr_pollfd { int fd; short events; short revents; };
typedef struct { unsigned long val[16]; } lr_sigset_t;
struct lr_siginfo { uint32_t ssi_signo; uint8_t pad[124]; };
int tcgetattr(int fd, struct lr_termios *t);
int tcsetattr(int fd, int act, const struct lr_termios *t);
int isatty(int fd);
long read(int fd, void *buf, size_t n);
int ioctl(int fd, unsigned long req, ...);
int poll(struct lr_pollfd *fds, unsigned long n, int timeout);
int sigemptyset(lr_sigset_t *s);
int sigaddset(lr_sigset_t *s, int sig);
int sigprocmask(int how, const lr_sigset_t *s, lr_sigset_t *old);
int signalfd(int fd, const lr_sigset_t *s, int flags);
int raise(int sig);
int close(int fd);
]]
local C = ffi.C

local SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGTSTP = 1, 2, 3, 15, 20
local TCSADRAIN, TIOCGWINSZ = 1, 0x5413
-- termios bits (Linux)
local BRKINT, ICRNL, INPCK, ISTRIP, IXON = 0x2, 0x100, 0x10, 0x20, 0x400
local ISIG, ICANON, ECHO, IEXTEN = 0x1, 0x2, 0x8, 0x8000
local VTIME, VMIN = 5, 6

M.SIGHUP, M.SIGINT, M.SIGQUIT, M.SIGTERM, M.SIGTSTP = SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGTSTP

-- Both stdin and stdout are terminals: keys are edited, prompts shown.
M.interactive = C.isatty(0) == 1 and C.isatty(1) == 1

local term = { orig = nil, raw = false }

function term.enter_raw()
  if not M.interactive or term.raw then return end
  if not term.orig then
    local t = ffi.new("struct lr_termios")
    if C.tcgetattr(0, t) ~= 0 then M.interactive = false return end
    term.orig = t
  end
  local r = ffi.new("struct lr_termios")
  ffi.copy(r, term.orig, ffi.sizeof(r))
  -- Keys arrive one by one and unechoed; Ctrl-C/Ctrl-Z/Ctrl-S are bytes.
  -- Output processing (\n -> \r\n) stays on, so anything printed is fine.
  r.c_iflag = bit.band(r.c_iflag, bit.bnot(bit.bor(BRKINT, ICRNL, INPCK, ISTRIP, IXON)))
  r.c_lflag = bit.band(r.c_lflag, bit.bnot(bit.bor(ECHO, ICANON, IEXTEN, ISIG)))
  r.c_cc[VMIN] = 1
  r.c_cc[VTIME] = 0
  if C.tcsetattr(0, TCSADRAIN, r) == 0 then term.raw = true end
end

function term.restore()
  if term.raw and term.orig then
    C.tcsetattr(0, TCSADRAIN, term.orig)
    term.raw = false
  end
end

-- Restore the terminal even if the Lua state is torn down some other way.
term.guard = newproxy(true)
getmetatable(term.guard).__gc = function() term.restore() end

function term.cols()
  local ws = ffi.new("struct lr_winsize")
  if C.ioctl(1, TIOCGWINSZ, ws) == 0 and ws.ws_col > 0 then return ws.ws_col end
  return 80
end

local function write(s)
  io.stdout:write(s)
  io.stdout:flush()
end

-- Signals (terminal mode only): blocked and read from a signalfd on the
-- loop, so that SIGTERM/SIGHUP/SIGQUIT restore the terminal before exiting.
local sig = { fd = -1 }
function sig.setup()
  local set = ffi.new("lr_sigset_t")
  C.sigemptyset(set)
  for _, s in ipairs{ SIGHUP, SIGINT, SIGQUIT, SIGTERM } do C.sigaddset(set, s) end
  sig.set = set
  if C.sigprocmask(0, set, nil) ~= 0 then return end -- SIG_BLOCK
  sig.fd = C.signalfd(-1, set, 0x800 + 0x80000)      -- SFD_NONBLOCK | SFD_CLOEXEC
end
function sig.block(on)
  if sig.set then C.sigprocmask(on and 0 or 1, sig.set, nil) end
end
function sig.take()
  if sig.fd < 0 then return nil end
  local si = ffi.new("struct lr_siginfo")
  local n = C.read(sig.fd, si, ffi.sizeof(si))
  if n == ffi.sizeof(si) then return tonumber(si.ssi_signo) end
  return nil
end

local readbuf = ffi.new("char[4096]")
local function read_fd(fd)
  local n = tonumber(C.read(fd, readbuf, 4096))
  if n > 0 then return ffi.string(readbuf, n) end
  if n == 0 then return nil, "eof" end
  local e = ffi.errno()
  if e == 4 or e == 11 then return "" end -- EINTR, EAGAIN
  return nil, "read error " .. e
end

-- Is fd readable right now?
local pfd = ffi.new("struct lr_pollfd[1]")
local function readable(fd)
  if fd < 0 then return false end
  pfd[0].fd, pfd[0].events, pfd[0].revents = fd, 1, 0
  return C.poll(pfd, 1, 0) > 0
end

M.term, M.sig, M.write, M.read_fd, M.readable = term, sig, write, read_fd, readable

--- Raises sig in this process (SIGTSTP: stops until fg).
function M.raise(s) C.raise(s) end

return M
