"""close() reports the async events a connection's end dropped (issue 28,
fifth review B): a consumer's process SIGSTOPped, a producer
(queue_limit 1 MiB, policy "block") queues 900 events of 1 KB for it, then
the connection goes (the handshake deadline) and takes the queue.  Lua's
close returned true then, Python's raised only when its close came before
the connection went; now both say so (code "closed"), and the stats count
them ("undelivered").  Two busy loops run beside."""
import os
import signal
import sys
import textwrap
import time

import pytest

import lecho
from conftest import ROOT, readline, rest

PYENV = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))

CONSUMER = textwrap.dedent("""
    local lecho = require "lecho"
    local ctx = lecho.context{ nameserver = arg[1], quiet = true }
    assert(ctx:channel("pycl.ch"):consumer(function() end))
    print("ready")
    io.stdout:flush()
    ctx:after(120, function() ctx:stop() end)
    ctx:run()
""")

# A script that queues the 900 events, waits for the connection to go and
# ends without close().
SCRIPT = textwrap.dedent("""
    import sys, time, lecho
    ctx = lecho.Context(nameserver=sys.argv[1], quiet=True, queue_limit=1048576, handshake_timeout=1)
    p = ctx.channel("pycl.ch").producer(policy="block")
    for i in range(900):
        p.submit({"i": i, "pad": "x" * 1000})
    end = time.monotonic() + 20
    while sum(p["drops"] for p in ctx.stats()["peers"].values()) < 900 and time.monotonic() < end:
        ctx.run(0.1)
    print("undelivered", ctx.stats().get("undelivered"), flush=True)
""")


@pytest.fixture
def stopped(nameserver, procs, busy, tmp_path):
    """The consumer's process, joined, then SIGSTOPped (SIGCONTed after)."""
    c = procs.lua_source(tmp_path / "consumer.lua", CONSUMER, nameserver)
    readline(c, "^ready")
    os.kill(c.pid, signal.SIGSTOP)
    yield c
    os.kill(c.pid, signal.SIGCONT)


def dropped(ctx):
    return sum(p["drops"] for p in ctx.stats()["peers"].values())


def test_close_raises_for_events_a_lost_connection_dropped(nameserver, stopped):
    ctx = lecho.Context(nameserver=nameserver, quiet=True, queue_limit=1048576, handshake_timeout=1)
    p = ctx.channel("pycl.ch").producer(policy="block")
    for i in range(900):
        p.submit({"i": i, "pad": "x" * 1000})
    end = time.monotonic() + 20
    while dropped(ctx) < 900 and time.monotonic() < end:
        ctx.run(0.1)
    st = ctx.stats()
    with pytest.raises(lecho.LechoError) as e:
        ctx.close()     # (returned at once on the base: nothing was queued any more)
    assert e.value.code == "closed"
    assert e.value.message.startswith("900 events (")
    assert "lost with a connection" in e.value.message
    assert st["undelivered"] == 900
    assert st["channels"]["%s/pycl.ch" % nameserver]["undelivered"] == 900


def test_a_script_that_ends_so_says_it_on_stderr(nameserver, procs, stopped, tmp_path):
    (tmp_path / "script.py").write_text(SCRIPT)
    p = procs.start([sys.executable, str(tmp_path / "script.py"), nameserver], env=PYENV)
    out = rest(p, timeout=60)
    assert "undelivered 900" in out, out
    assert any("900 events (" in l and "lost with a connection" in l for l in out), out
