-- spec/support.lua: what the multi-process specs share.
-- Starts real processes (luajit children, the name server script) on
-- 127.0.0.1 with ports chosen by the OS, waits for them with a bound, and
-- kills every one still running at cleanup.  The process handling itself is
-- spec/support/proc.lua's, shared with bench/ and stress/.

local P = require "spec.support.proc"

local M = {}

M.root = os.getenv("LECHO_ROOT") or "."
M.luajit = os.getenv("LUAJIT") or "luajit"

local tmpdir, group

local sh_quote = P.sh_quote
M.sh_quote = sh_quote
M.read, M.write, M.sleep = P.read, P.write, P.sleep
M.output, M.errors, M.kill = P.output, P.errors, P.kill

-- Under `make asan` (the sanitizer preloaded) freed memory waits in ASan's
-- quarantine (16 MiB, set by the Makefile) before it is reused or returned:
-- specs that bound a process's growth add this much.
M.asan = (os.getenv("LD_PRELOAD") or ""):find("libasan", 1, true) ~= nil
M.MEM_SLACK_KIB = M.asan and 48 * 1024 or 0
-- How much slower than usual the processes run: the margin a spec gives a
-- process's own work (start-up, a redial, a handshake) beyond the times the
-- protocol sets is multiplied by this.  LECHO_SPEC_SLOW (make asan sets it:
-- ASan makes start-up and work 3-5x dearer), else 4 under ASan, else 1.
M.SLOW = tonumber(os.getenv("LECHO_SPEC_SLOW")) or (M.asan and 4 or 1)

function M.tmpdir()
  if not tmpdir then tmpdir = P.tmpdir("lecho-spec") end
  return tmpdir
end

local seq = 0
function M.tmpname(stem)
  seq = seq + 1
  return ("%s/%s-%d"):format(M.tmpdir(), stem or "f", seq)
end

--- Runs `cmd` (a shell command) to its end, stdout and stderr to a file:
-- true when it exited 0, the output (both streams), the exit code.
function M.sh(cmd)
  local log = M.tmpname("sh")
  local r1, _, r3 = os.execute(("%s >%s 2>&1"):format(cmd, sh_quote(log)))
  -- LuaJIT: the wait status; Lua 5.2+: true/nil, "exit", code.
  local code = type(r1) == "number" and math.floor(r1 / 256) or r3
  return code == 0, M.read(log) or "", code
end

--- Runs `cmd` (a shell command) to its end: its stdout and stderr as they
-- came, then a line "rc=N" with its exit code (for specs that compare a
-- command's whole output, status included).
function M.sh_out(cmd)
  local f = io.popen("(" .. cmd .. ") 2>&1; echo rc=$?")
  local s = f:read("*a")
  f:close()
  return s
end

--- Starts `cmd` (a shell command) in the background; stdout and stderr go
-- to files.  Returns a child { pid, out, err } (spec/support/proc.lua).
function M.spawn(cmd)
  group = group or P.group(M.tmpdir())
  return group:spawn(cmd)
end

--- Starts a Lua script (source text) under luajit with the tree's paths.
function M.lua(src, ...)
  local file = M.write(M.tmpname("script") .. ".lua", src)
  local args = {}
  for i, a in ipairs({ ... }) do args[i] = sh_quote(a) end
  return M.spawn(("%s %s %s"):format(M.luajit, file, table.concat(args, " ")))
end

--- Like M.lua, with the shell command `prefix` run first in the child's
-- shell (e.g. "ulimit -v 400000"); the child's pid is luajit's (exec).
function M.lua_with(prefix, src, ...)
  local file = M.write(M.tmpname("script") .. ".lua", src)
  local args = {}
  for i, a in ipairs({ ... }) do args[i] = sh_quote(a) end
  return M.spawn(("sh -c %s"):format(sh_quote(("%s; exec %s %s %s")
    :format(prefix, M.luajit, file, table.concat(args, " ")))))
end

--- True while child's process exists (a stopped one included).
function M.alive(child) return P.alive(child.pid) end

--- Waits until child exits (true, exit code) or timeout seconds pass (false).
-- With ctx given, its loop is served meanwhile (queued events get written).
function M.wait(child, timeout, ctx)
  return P.wait(child, timeout, ctx and function(dt) ctx:run_once(dt) end)
end

--- Waits until path exists with content matching pattern; returns content.
function M.wait_file(path, pattern, timeout)
  return P.wait_file(path, pattern, timeout)
end

--- Waits until child exits and returns its exit code; past timeout seconds
-- kills it and raises, naming it `what`, with the ends of its stdout and
-- stderr.
function M.finish(child, timeout, what)
  local done, rc = M.wait(child, timeout)
  if not done then
    M.kill(child, "KILL")
    error(("%s still running; stdout %s; stderr %s"):format(what, M.output(child):sub(-600),
                                                            M.errors(child):sub(-1200)), 0)
  end
  return rc
end

--- The lines of child's stdout that are JSON objects, decoded, in order.
function M.json_lines(child)
  local cjson = require "cjson"
  local t = {}
  for l in M.output(child):gmatch("[^\n]+") do
    if l:sub(1, 1) == "{" then t[#t + 1] = cjson.decode(l) end
  end
  return t
end

--- scripts/lecho with the arguments `args` (a shell command line's words)
-- as a child.
function M.lecho(args)
  return M.spawn(("%s %s/scripts/lecho %s"):format(M.luajit, M.root, args))
end

--- A C program built against the tree's liblecho (made first): src the
-- path of its source; the binary's path.  Raises with the build's output
-- when liblecho or the program does not build.
function M.capi_program(src)
  local root = sh_quote(M.root)
  local ok, log = M.sh(("make -s -C %s build/liblecho.so"):format(root))
  assert(ok, "building liblecho failed: " .. log)
  local bin = M.tmpname((src:match("([^/]+)%.c$")))
  ok, log = M.sh(("cc -O2 -Wall -Wextra -Werror -I%s/core -o %s %s -L%s/build -llecho -Wl,-rpath,%s/build")
    :format(root, bin, sh_quote(src), root, root))
  assert(ok, "compiling " .. src .. " failed: " .. log)
  return bin
end

--- How many times text (plain) occurs in log (a spec bounds the lines a
-- rate-limited log wrote).
function M.count(log, text)
  local n, at = 0, 1
  while true do
    local i = log:find(text, at, true)
    if not i then return n end
    n, at = n + 1, i + #text
  end
end

--- The fraction of a core a spinning process of normal priority gets now,
-- measured over `seconds` (0.5): 1 on a quiet host, 0.04-0.08 at load
-- 15-25 on 2 cores.  A case whose own CPU work must fit a wall-clock bound
-- scales that work by it (as by 1/M.SLOW under ASan); never a bound.
function M.core_fraction(seconds)
  local probe = M.lua(([[
    local ffi = require "ffi"
    ffi.cdef"typedef struct { long s, ns; } cf_ts; int clock_gettime(int, cf_ts *);"
    local function now(clk) local t = ffi.new("cf_ts") ffi.C.clock_gettime(clk, t) return tonumber(t.s) + tonumber(t.ns) * 1e-9 end
    local w0, c0 = now(1), now(2)  -- CLOCK_MONOTONIC, CLOCK_PROCESS_CPUTIME_ID
    while now(1) - w0 < %g do end
    print((now(2) - c0) / (now(1) - w0))
  ]]):format(seconds or 0.5))
  assert(M.wait(probe, 60), "the probe did not end")
  local f = tonumber(M.output(probe):match("[%d.e-]+"))
  assert(f, "no fraction from the probe: " .. M.output(probe) .. M.errors(probe))
  return math.max(0.02, math.min(1, f))
end

--- Starts argv (a list of words, shell-quoted here) as a terminal starts a
-- foreground job: in a process group of its own, SIGINT and SIGTERM at
-- their default actions (a background job of a shell, M.spawn's, starts
-- with SIGINT ignored).  M.ctrl_c(child) then signals the group, as a
-- terminal's Ctrl-C does.  Returns a child as M.spawn.
function M.terminal_job(argv)
  local q = {}
  for i, a in ipairs(argv) do q[i] = sh_quote(a) end
  local wrap = [[
local ffi = require "ffi"
ffi.cdef "int setpgid(int, int); void (*signal(int, void (*)(int)))(int); int execvp(const char *, char *const *);"
ffi.C.setpgid(0, 0)
ffi.C.signal(2, nil) ffi.C.signal(15, nil)
local argv = ffi.new("char *[?]", #arg + 1)
local keep = {}
for i = 1, #arg do keep[i] = ffi.new("char[?]", #arg[i] + 1, arg[i]) argv[i - 1] = keep[i] end
ffi.C.execvp(argv[0], argv)
io.stderr:write("exec failed\n") os.exit(127)
]]
  local file = M.write(M.tmpname("fgjob") .. ".lua", wrap)
  return M.spawn(("exec %s %s %s"):format(M.luajit, file, table.concat(q, " ")))
end

--- A Lua script (source text) under luajit as M.terminal_job starts it.
function M.terminal_lua(src, ...)
  local file = M.write(M.tmpname("script") .. ".lua", src)
  return M.terminal_job({ M.luajit, file, ... })
end

--- sig ("INT") to child's process group, as a terminal sends Ctrl-C.
function M.ctrl_c(child, sig)
  return P.signal(-child.pid, sig or "INT")
end

--- Each signal of sigs (a list, 0.5 s apart) to child's group as M.ctrl_c
-- sends it, then at most `within` s (10) for it to end; a child still
-- running then is killed.  Returns done, rc as M.wait.
function M.ctrl_c_wait(child, sigs, within)
  for i, sig in ipairs(sigs) do
    if i > 1 then M.sleep(0.5) end
    M.ctrl_c(child, sig)
  end
  local done, rc = M.wait(child, within or 10)
  if not done then M.ctrl_c(child, "KILL") end
  return done, rc
end

--- Runs scripts/lecho-keygen with the shell words `args`: its output;
-- raises with that output unless it exited 0.
function M.keygen(args)
  local out = M.sh_out(("%s %s/scripts/lecho-keygen %s"):format(M.luajit, M.root, args))
  assert(out:find("rc=0\n", 1, true), out)
  return out
end

--- Makes in `dir` (lecho-keygen) an authority "ca", valid 2 days, and the
-- keys of `names` (principals, one string) it certified for a day.
function M.certified_keys(dir, names)
  M.keygen(("--dir %s --authority ca --valid-for 2d"):format(dir))
  M.keygen(("--dir %s --sign-with %s/ca.key %s --valid-for 1d"):format(dir, dir, names))
end

--- A keyed name server process: keys for the principals `names` (a list,
-- "nameserver" among them; lecho-keygen, none certified) in a new
-- directory, the policy file of Lua source `policy` there, and a name
-- server (M.nameserver) with the key of "nameserver", that policy, and
-- every one of those public keys trusted.  Returns its address, the
-- directory and the trust list (the .pub files, in the order of names).
function M.keyed_nameserver(names, policy)
  local dir = M.tmpname("keys")
  assert(os.execute("mkdir -p " .. sh_quote(dir)))
  local ok, out = M.sh(("%s %s/scripts/lecho-keygen %s --dir %s"):format(M.luajit, M.root,
                                                                         table.concat(names, " "), sh_quote(dir)))
  assert(ok, out)
  local trust = {}
  for i, n in ipairs(names) do trust[i] = ("%s/%s.pub"):format(dir, n) end
  local pol = M.write(dir .. "/policy.lua", policy)
  local args = { "--quiet", "--key", dir .. "/nameserver.key", "--policy", pol }
  for _, t in ipairs(trust) do args[#args + 1] = "--trust " .. t end
  local _, ns = M.nameserver(table.concat(args, " "))
  return ns, dir, trust
end

--- Waits (serving ctx's loop, `timeout` seconds at most) until child's
-- stdout matches `pattern` or child exited: the capture, or nil.
function M.wait_output(ctx, child, pattern, timeout)
  local got
  M.run_until(ctx, function()
    got = (M.read(child.out) or ""):match(pattern)
    return got ~= nil or not M.alive(child)
  end, timeout)
  return got or (M.read(child.out) or ""):match(pattern)
end

--- n processes spinning for ever (cores kept busy; killed by M.cleanup),
-- each started with the shell words `prefix` when given ("nice -n -5 ",
-- "taskset -c 0 ") and checked to be running: a list of children.
function M.busy_loops(n, prefix)
  local t = {}
  for i = 1, n do t[i] = M.spawn(("%s%s -e 'while true do end'"):format(prefix or "", M.luajit)) end
  M.sleep(0.2)
  for i = 1, n do assert(M.alive(t[i]), "busy loop did not start: " .. M.errors(t[i])) end
  return t
end

--- The state letter of process pid from /proc (T: stopped), or nil.
function M.proc_state(pid)
  local s = M.read(("/proc/%d/stat"):format(pid)) or ""
  return s:match("^%d+ %b() (%a)")
end

--- SIGSTOPs child and waits (5 s at most, else raises "WHAT did not stop";
-- what: "the process" unless given) until it is stopped.
function M.sigstop(child, what)
  M.kill(child, "STOP")
  assert(P.wait_until(function() return M.proc_state(child.pid) == "T" end, 5),
         (what or "the process") .. " did not stop")
end

--- Starts scripts/lecho-nameserver on a port chosen by the OS (for at most
-- 600 s: a bound for a stray one, M.cleanup kills it before; a spec file's
-- setup may start one for all its cases, and under make asan on a loaded
-- machine exit_close_spec's took more than the 120 s it had: its last case
-- found "connection refused"; times M.SLOW: under make asan at load 13-18
-- (asan7) repl_spec's ran 1084 s and every case after the 600th second
-- found "cannot reach the name server ... Connection refused"); extra: more
-- of its options, one string ("--quiet").  Returns the child and its address.
function M.nameserver(extra)
  local args = { "--for", tostring(600 * M.SLOW), "--settle", "0" }
  for w in (extra or ""):gmatch("%S+") do args[#args + 1] = w end
  local child, addr = P.nameserver{ root = M.root, luajit = M.luajit, port_file = M.tmpname("ns-addr"),
                                    args = args, start = function(argv) return M.spawn(P.sh_join(argv)) end }
  assert(addr, "name server did not start: " .. M.errors(child))
  return child, addr
end

-- Contexts of this process opened by M.context, closed by M.cleanup.
local ctxs = {}

--- lecho.context(opts), closed by M.cleanup (linger 0: the peers' ends
-- not waited for) before it kills the children: a describe block whose
-- cases open their contexts here needs no after_each but M.cleanup.
function M.context(opts)
  local ctx = require("lecho").context(opts)
  ctxs[#ctxs + 1] = ctx
  return ctx
end

--- A name server process (M.nameserver(extra), extra "--quiet" when nil)
-- and a quiet context of this process using it, closed by M.cleanup (the
-- options in `opts` beside): returns the context, the name server's
-- address and its child.
function M.ns_context(opts, extra)
  local child, ns = M.nameserver(extra or "--quiet")
  local o = { quiet = true, nameserver = ns }
  for k, v in pairs(opts or {}) do o[k] = v end
  return M.context(o), ns, child
end

-- Sockets held by M.refusing_addr until M.cleanup.
local held = {}

--- "127.0.0.1:PORT" where nobody listens, and kept so: a socket bound there
-- without listen (a connection is refused) until M.cleanup.  Bound, then
-- closed, the port could be given to another socket meanwhile (spec files
-- run beside, or this process's own context listening on port 0: a context
-- that dialled itself).
function M.refusing_addr()
  local s = assert(require("socket").tcp())
  assert(s:bind("127.0.0.1", 0))
  local _, port = s:getsockname()
  held[#held + 1] = s
  return "127.0.0.1:" .. port, tonumber(port)
end

--- Closes the contexts M.context opened (latest first), kills every child
-- still running and removes the temporary files.
function M.cleanup()
  local open = ctxs
  ctxs = {}
  for i = #open, 1, -1 do open[i]:close{ linger = 0 } end
  for _, s in ipairs(held) do s:close() end
  held = {}
  if group then group:kill_all("KILL") end
  group = nil
  if tmpdir then
    P.remove(tmpdir)
    tmpdir = nil
  end
end

--- A name server process and a context of this process using it, for the
-- specs that put consumers in other processes: returns its address and the
-- context.  end_world closes the context and every child (after_each).
function M.world()
  local lecho = require "lecho"
  local _, ns = M.nameserver("--quiet")
  return ns, lecho.context{ nameserver = ns, quiet = true }
end

function M.end_world(ctx)
  if ctx then ctx:close() end
  M.cleanup()
end

--- Starts spec/children.lua's consumer with opts (JSON) and waits until it
-- said ready.
function M.consumer(opts)
  local child = M.lua(require("spec.children").consumer, require("cjson").encode(opts))
  assert(M.wait_file(child.out, "ready", 20), "consumer did not start: " .. M.errors(child))
  return child
end

--- Waits for child to exit (serving ctx's loop) and decodes the one JSON
-- line of its output.
function M.result(child, timeout, ctx)
  local done = M.wait(child, timeout or 30, ctx)
  assert(done, "child did not finish: " .. M.errors(child))
  local line = M.output(child):match("({.*})")
  assert(line, "no result from child: " .. M.output(child) .. M.errors(child))
  return require("cjson").decode(line)
end

--- A consumer of channel `name` in ctx whose events are 1, 2, 3 ... (from
-- any start): returns its tally { n =, first =, last =, gap = } (gap: the
-- first pair of events that did not follow each other).
function M.ordered_tally(ctx, name)
  local t = { n = 0 }
  assert(ctx:channel(name):consumer(function(ev)
    t.first = t.first or ev
    if t.last and ev ~= t.last + 1 then t.gap = t.gap or { t.last, ev } end
    t.last = ev
    t.n = t.n + 1
  end))
  return t
end

--- The tally reaches event `sent` (within 10 s of ctx's loop), with no gap
-- and no event twice; `what` names the flow in the messages.
function M.assert_complete(ctx, t, sent, what)
  local luassert = require "luassert"
  luassert(M.run_until(ctx, function() return t.last == sent end, 10),
         ("%s got up to %s of %d"):format(what, tostring(t.last), sent))
  luassert.is_nil(t.gap, what .. " lost events")
  luassert.are.equal(t.last - t.first + 1, t.n)
end

--- Runs ctx's loop until pred() is true or timeout seconds pass.
function M.run_until(ctx, pred, timeout)
  local deadline = ctx:now() + (timeout or 10)
  while not pred() do
    local left = deadline - ctx:now()
    if left <= 0 then return false end
    ctx:run_once(math.min(left, 0.05))
  end
  return true
end

return M
