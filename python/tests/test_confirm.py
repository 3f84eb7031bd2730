"""close() reports the async events written to a consumer that never read
them (issue 28, sixth review, its blocker): a consumer's process
SIGSTOPped after it read its first event, a Python producer writes 900
events of 1 KB into the connection (the kernel takes them), then the
liveness deadline ends the connection.  close() returned at once without a
word (it counted only events dropped from a queue); now the consumer
confirms what it read (doc/protocol.md, "Read confirmation") and close
raises LechoError code "closed", "900 events (...) not confirmed"; the
stats count them ("unconfirmed").  A consumer alive and reading: close
succeeds.  Two busy loops run beside."""
import os
import signal
import textwrap
import time

import pytest

import lecho
from conftest import readline

CONSUMER = textwrap.dedent("""
    local lecho = require "lecho"
    local ctx = lecho.context{ nameserver = arg[1], quiet = true }
    local n = 0
    assert(ctx:channel("pycf.ch"):consumer(function()
      n = n + 1
      if n == 1 then print("got") io.stdout:flush() end
    end))
    print("ready")
    io.stdout:flush()
    ctx:after(120, function() ctx:stop() end)
    ctx:run()
""")


@pytest.fixture
def consumer(nameserver, procs, busy, tmp_path):
    c = procs.lua_source(tmp_path / "consumer.lua", CONSUMER, nameserver)
    readline(c, "^ready")
    yield c
    try:
        os.kill(c.pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


def peer(ctx):
    for ps in ctx.stats()["peers"].values():
        if ps["events_out"] > 0:
            return ps


def first_read(ctx, p, c):
    """Submits until the consumer read an event and every event so far is
    confirmed (a core without read confirmation: a second)."""
    end = time.monotonic() + 30
    got = False
    while not got and time.monotonic() < end:
        p.submit({"i": 0})
        ctx.run(0.05)
        try:
            got = c.lines.get_nowait() == "got"
        except Exception:
            pass
    assert got, "the consumer did not read a first event"
    t0 = time.monotonic()
    while time.monotonic() < end:
        ps = peer(ctx)
        if ps.get("confirmed", 0 if time.monotonic() - t0 < 1 else float("inf")) >= ps["events_out"]:
            break
        ctx.run(0.05)
    return peer(ctx)


def test_close_raises_for_events_written_but_never_read(nameserver, consumer):
    ctx = lecho.Context(nameserver=nameserver, quiet=True, heartbeat=0.5, heartbeat_misses=2)
    p = ctx.channel("pycf.ch").producer()
    first_read(ctx, p, consumer)
    os.kill(consumer.pid, signal.SIGSTOP)
    for i in range(900):
        p.submit({"i": i, "pad": "x" * 1000})
    end = time.monotonic() + 30
    while peer(ctx)["connected"] and time.monotonic() < end:
        ctx.run(0.1)
    st = ctx.stats()
    assert not peer(ctx)["connected"]
    assert peer(ctx)["queue_events"] == 0   # all written: nothing dropped from a queue
    with pytest.raises(lecho.LechoError) as e:
        ctx.close()     # (returned at once on the base: nothing was queued)
    assert e.value.code == "closed"
    assert e.value.message.startswith("900 events ("), e.value.message
    assert "not confirmed" in e.value.message
    assert st["unconfirmed"] == 900
    assert st["undelivered"] == 0


def test_close_succeeds_for_a_consumer_alive_and_reading(nameserver, consumer):
    ctx = lecho.Context(nameserver=nameserver, quiet=True, linger=10)
    p = ctx.channel("pycf.ch").producer()
    ps = first_read(ctx, p, consumer)
    assert ps["confirms"] is True
    for i in range(900):
        p.submit({"i": i, "pad": "x" * 1000})
    t0 = time.monotonic()
    ctx.close()         # no exception
    assert time.monotonic() - t0 < 5
