"""What a remote caller gets when a Python service fails: its message with
no Lua traceback of lecho's own wrapper ("[C]: in function 'error'"), and
for a Ctrl-C that stopped the handler, "interrupted: the service's program
got a signal", as from a Lua service (outside attack of session 8, nit 6:
the caller got "interrupted" and that traceback)."""
import signal
import sys

from conftest import LUA_ENV, ROOT, readline  # noqa: F401

PYENV = dict(LUA_ENV, PYTHONPATH="%s/python" % ROOT)

SERVER = r"""
import sys, lecho
ctx = lecho.Context(nameserver=sys.argv[1], quiet=True)
def h(args, meta):
    if args.get("loop"):
        print("looping", flush=True)
        while True:
            pass
    raise ValueError("bad arg %r" % args.get("x"))
ctx.service("pyfail", h)
print("ready", flush=True)
try:
    ctx.run(30)
except KeyboardInterrupt:
    print("server: KeyboardInterrupt", flush=True)
ctx.close()
"""

CALLER = r"""
local lecho = require "lecho"
local ctx = lecho.context{ nameserver = arg[1], quiet = true }
local r, err, code, e = ctx:call("pyfail", { x = 1, loop = arg[2] == "loop" }, { timeout = 20 })
print(("result %s | %s | %s | %s"):format(tostring(r), tostring(err), tostring(code),
  type(e) == "table" and tostring(e.traceback or e.tb) or tostring(e)):gsub("\n", "\\n"))
ctx:close()
"""


def call(procs, tmp_path, ns, *args):
    script = tmp_path / "caller.lua"
    script.write_text(CALLER)
    p = procs.lua_script(str(script), ns, *args)
    return readline(p, r"^result (.*)$", timeout=30).group(1)


def test_a_python_service_error_reaches_the_caller_without_a_lua_traceback(nameserver, procs, tmp_path):
    (tmp_path / "server.py").write_text(SERVER)
    procs.start([sys.executable, str(tmp_path / "server.py"), nameserver], env=PYENV)
    readline(procs.procs[-1], "^ready")
    got = call(procs, tmp_path, nameserver)
    assert got.startswith("nil | ValueError: bad arg 1 | failed"), got
    assert "stack traceback" not in got and "in function 'error'" not in got, got


def test_ctrl_c_in_a_python_service_tells_the_caller_the_program_got_a_signal(nameserver, procs, tmp_path):
    (tmp_path / "server.py").write_text(SERVER)
    srv = procs.start([sys.executable, str(tmp_path / "server.py"), nameserver], env=PYENV,
                      preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    readline(srv, "^ready")
    script = tmp_path / "caller.lua"
    script.write_text(CALLER)
    c = procs.lua_script(str(script), nameserver, "loop")
    readline(srv, "^looping")
    srv.send_signal(signal.SIGINT)
    got = readline(c, r"^result (.*)$", timeout=30).group(1)
    assert got.startswith("nil | pyfail@1: interrupted: the service's program got a signal | failed"), got
    assert "stack traceback" not in got, got
    readline(srv, "^server: KeyboardInterrupt")
    assert srv.wait(15) == 0
