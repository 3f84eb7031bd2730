"""ctx.close() with a subscription still open (issue 28, eighth review,
finding 1): a consumer process takes a sync event with sub.get() and
closes its context without sub.close(); the producer's submit_sync got
SyncError "closed" ("connection closed by peer") for an event the consumer
had taken, while sub.close() first gave True.  Events handed out count as
handled when the context closes, as when the subscription closes."""
import os
import sys
import textwrap

import lecho
from conftest import ROOT, readline, rest

PYENV = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))

CONSUMER = textwrap.dedent("""
    import sys, lecho
    ctx = lecho.Context(nameserver=sys.argv[1], quiet=True)
    sub = ctx.channel("pycs.ch").subscribe()
    print("ready", flush=True)
    ev = sub.get(timeout=30)
    print("got", ev["i"], flush=True)
    ctx.close()
    print("closed", flush=True)
""")


def test_close_answers_the_events_a_subscription_handed_out(nameserver, procs, tmp_path):
    (tmp_path / "consumer.py").write_text(CONSUMER)
    c = procs.start([sys.executable, str(tmp_path / "consumer.py"), nameserver], env=PYENV)
    readline(c, "^ready")
    ctx = lecho.Context(nameserver=nameserver, quiet=True)
    try:
        p = ctx.channel("pycs.ch").producer()
        assert p.submit_sync({"i": 1}, timeout=15) is True
        readline(c, "^got 1")
        assert "closed" in rest(c)
        assert c.wait(10) == 0
    finally:
        ctx.close()
