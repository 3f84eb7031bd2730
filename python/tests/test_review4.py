"""The findings of issue 28's fourth outside review (a Python user):
Ctrl-C during a submit blocked under policy="block", on_error set after
the subscription opened."""
import os
import signal
import sys
import textwrap
import time

import pytest

import lecho
from conftest import ROOT, readline

PYENV = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))

STALLED = textwrap.dedent("""
    import sys, lecho
    ctx = lecho.Context(nameserver=sys.argv[1], quiet=True)
    sub = ctx.channel("stopme").subscribe(maxsize=100)
    print("subscribed", flush=True)
    ctx.run(60)
""")

BLOCKED = textwrap.dedent("""
    import sys, time, lecho
    ctx = lecho.Context(nameserver=sys.argv[1], quiet=True)
    p = ctx.channel("stopme").producer(policy="block")
    print("submitting", flush=True)
    t = None
    try:
        for i in range(10**7):
            t = time.monotonic()
            p.submit({"i": i, "pad": "z" * 1000})
        print("all submitted", flush=True)
    except KeyboardInterrupt:
        print("KBI %%.1f %%d" %% (time.monotonic() - t, i), flush=True)
        ctx.close(0)
        print("closed", flush=True)
""")


def test_ctrl_c_ends_a_submit_blocked_under_block(nameserver, procs, tmp_path):
    # Review 4 BLOCKER: the blocked submit spun at 100% CPU, deaf to SIGINT
    # (main_wait returned false at once on the interrupt, submit_wait retried).
    (tmp_path / "stalled.py").write_text(STALLED)
    (tmp_path / "blocked.py").write_text(BLOCKED.replace("%%", "%"))
    c = procs.start([sys.executable, str(tmp_path / "stalled.py"), nameserver], env=PYENV)
    readline(c, "^subscribed")
    time.sleep(0.5)
    os.kill(c.pid, signal.SIGSTOP)
    try:
        p = procs.start([sys.executable, str(tmp_path / "blocked.py"), nameserver], env=PYENV,
                        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        readline(p, "^submitting")
        time.sleep(4)       # the consumer's queue and the socket are full by then
        p.send_signal(signal.SIGINT)
        m = readline(p, r"^(KBI|all submitted)", timeout=10)
        assert m.group(1) == "KBI", m.group(0)
        readline(p, "^closed", timeout=10)
        assert p.wait(10) == 0
    finally:
        os.kill(c.pid, signal.SIGCONT)
