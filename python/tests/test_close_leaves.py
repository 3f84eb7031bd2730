"""c.close() and sub.close() tell the manager at once (issue 28): the
leave of a close waited for the next loop call, so a script that closed
its consumer and then slept (time.sleep, work without ctx.run) stayed
listed as a consumer of the channel ~10 s or longer, and every other
process's submit_sync on the channel waited for it and failed meanwhile.
A closer process with another real consumer beside it: within 2 s it is
no longer listed, and `lecho pub --sync` exits 0 in < 4 s."""
import os
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import LECHO, LUA_ENV, ROOT, consumers, readline

PYENV = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))

CLOSER = textwrap.dedent("""
    import sys, time, lecho
    ns, name, how = sys.argv[1:4]
    ctx = lecho.Context(nameserver=ns, quiet=True)
    ch = ctx.channel(name)
    if how == "consumer":
        c = ch.consumer(lambda ev, meta: None)
    else:
        c = ch.subscribe()
    print(ctx.address, flush=True)
    if how == "iterator":
        for ev in c:      # one event (the test's probe), then out of the loop
            break
    c.close()
    print("closed", flush=True)
    time.sleep(30)
""")


@pytest.mark.parametrize("how", ["consumer", "subscription", "iterator"])
def test_closed_then_sleeping_is_no_consumer(nameserver, procs, tmp_path, how):
    import lecho
    name = "pycl." + how
    real = procs.lua("consume", nameserver, name, 20)   # the real consumer, another process
    readline(real, "^ready$")
    (tmp_path / "closer.py").write_text(CLOSER)
    closer = procs.start([sys.executable, str(tmp_path / "closer.py"), nameserver, name, how], env=PYENV)
    addr = readline(closer, r"^\S+:\d+$").group(0)
    if how == "iterator":
        ctx = lecho.Context(nameserver=nameserver, quiet=True)
        # (async: a loop left by break does not count its event handled)
        p = ctx.channel(name).producer()
        p.submit({"k": 0, "text": "probe"})
        end = time.monotonic() + 20
        while True:     # this loop runs meanwhile (the dial to the closer)
            ctx.run_once(0.05)
            try:
                readline(closer, "^closed$", timeout=0.05)
                break
            except AssertionError:
                assert time.monotonic() < end, "the closer did not take the probe"
        try:
            ctx.close()
        except lecho.LechoError as e:
            # the closer sleeps without its loop: its read confirmation of
            # the probe may never come (doc/semantics.md "Read confirmation")
            assert e.code == "timeout", e
    else:
        readline(closer, "^closed$")
    end = time.monotonic() + 2
    while addr in consumers(nameserver, name) and time.monotonic() < end:
        time.sleep(0.1)
    listed = consumers(nameserver, name)
    assert addr not in listed, "%s still listed as a consumer 2 s after its close: %r" % (addr, listed)
    t0 = time.monotonic()
    pub = subprocess.run(LECHO + ["pub", name, '{ k = 1, text = "steer" }', "--sync", "--timeout", "8",
                                  "--nameserver", nameserver],
                         env=LUA_ENV, capture_output=True, text=True, timeout=30)
    secs = time.monotonic() - t0
    assert pub.returncode == 0, pub.stderr
    assert addr not in pub.stderr, pub.stderr
    assert secs < 4, "submit_sync took %.1f s" % secs
    assert closer.poll() is None, "the closer should still be sleeping"
