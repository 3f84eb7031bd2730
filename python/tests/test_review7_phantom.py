"""Issue 28's seventh outside review (a Python user), the BLOCKER: a context
that consumed and produced a channel, closed consumer then producer with no
loop turn between, stayed a consumer at the manager for as long as it ran
(`lecho ls` listed it) and every other process's submit_sync on the channel
failed with noconsumer from it.  Every order, with and without a loop turn
between the closes."""
import os
import signal
import subprocess
import time

import pytest

import lecho
from conftest import LECHO, LUA_ENV, ROOT, consumers, readline



def serve_until(ctx, proc, timeout=30):
    """Runs ctx's loop until proc exits: its exit code and output."""
    end = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < end:
        ctx.run_once(0.05)
    out, err = proc.communicate(timeout=5)
    return proc.returncode, out + err


@pytest.mark.parametrize("first,turn", [("consumer", False), ("consumer", True),
                                        ("producer", False), ("producer", True)])
def test_closed_consumer_and_producer_leave_no_phantom(nameserver, procs, first, turn):
    name = "py7.steer.%s.%s" % (first, "turn" if turn else "same")
    real = procs.lua("consume", nameserver, name, 10)   # the real consumer, another process
    readline(real, "^ready$")
    with lecho.Context(nameserver=nameserver, quiet=True) as ctx:
        ran = []
        ch = ctx.channel(name)
        c = ch.consumer(lambda ev, meta: ran.append(ev))
        p = ch.producer()
        assert p.submit_sync({"k": 0, "text": "probe"}, timeout=5) is True
        assert len(ran) == 1
        ends = [c, p] if first == "consumer" else [p, c]
        ends[0].close()
        if turn:
            ctx.run_once(0)
        ends[1].close()
        end = time.monotonic() + 5
        while ctx.address in consumers(nameserver, name) and time.monotonic() < end:
            ctx.run(0.2)
        listed = consumers(nameserver, name)
        # another process's submit_sync: the real consumer runs it, and no
        # error comes from this context, which consumes nothing any more
        pub = subprocess.Popen(LECHO + ["pub", name, '{ k = 1, text = "steer" }', "--sync", "--timeout", "5",
                                        "--nameserver", nameserver],
                               env=LUA_ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        rc, out = serve_until(ctx, pub)
        assert rc == 0, out
        assert ctx.address not in out and "no consumer" not in out, out
        assert ctx.address not in listed, "%s still listed as a consumer: %r" % (ctx.address, listed)
        assert len(ran) == 1
    readline(real, r"^1\s+steer$")


def test_close_after_answered_syncs_to_a_stopped_consumer_does_not_fail(nameserver, procs):
    # D of the same review: eight 2 MiB submit_sync, all True; the consumer
    # then stopped running its loop; ctx.close() raised timeout "1 connection
    # not closed by their remote ... may not have been read", though the last
    # event written there was answered (so was everything before it).
    real = procs.lua("consume", nameserver, "py7.big", 100)
    readline(real, "^ready$")
    ctx = lecho.Context(nameserver=nameserver, quiet=True, linger=1)
    p = ctx.channel("py7.big").producer()
    pad = b"x" * (2 * 1024 * 1024)
    for k in range(1, 9):
        assert p.submit_sync({"k": k, "pad": pad}, timeout=20) is True
    readline(real, r"^8\b")
    real.send_signal(signal.SIGSTOP)
    try:
        ctx.close()                     # no exception: nothing of ours can be unread there
        assert ctx.close_error is None
    finally:
        real.send_signal(signal.SIGCONT)
