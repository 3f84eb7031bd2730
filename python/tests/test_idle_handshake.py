"""Issue 28, third outside review: a producer opened just before a long
idle (`p = ch.producer(); time.sleep(15); p.submit_sync(...)`) failed with
"handshake timeout (10 s) (closed)", and a first call after such an idle
failed.  The dial to the consumer's process was still in its handshake
when the script stopped calling into lecho; the answer came during the
sleep, but the first loop turn after it ran the handshake deadline before
the read.  Made deterministic here: the consumer's process is SIGSTOPped
while the producer is made, SIGCONTed at the start of the sleep, and the
sleep is longer than handshake_timeout (1 s).  spec/hs_idle_spec.lua is
the same in Lua."""
import os
import signal
import textwrap
import time

import lecho
from conftest import readline

CONSUMER = textwrap.dedent("""
    io.stdout:setvbuf("line")
    local lecho = require "lecho"
    local hb = tonumber(arg[2])
    local ctx = lecho.context{ nameserver = arg[1], quiet = true, heartbeat = hb,
                               heartbeat_misses = hb and 2 }
    local n = 0
    assert(ctx:channel("hsi.ch"):consumer(function() n = n + 1 end))
    ctx:service("hsi.svc", function(a) return a.x * 2 end)
    ctx:service("hsi.count", function() return n end)
    print("ready")
    ctx:after(60, function() ctx:stop() end)
    ctx:run()
""")


def consumer(procs, tmp_path, ns, hb=None):
    f = tmp_path / "consumer.lua"
    f.write_text(CONSUMER)
    c = procs.lua_script(str(f), ns, *([hb] if hb else []))
    readline(c, r"^ready")
    return c


def stop(c):
    os.kill(c.pid, signal.SIGSTOP)
    for _ in range(500):
        with open("/proc/%d/stat" % c.pid) as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "T":
                return
        time.sleep(0.01)
    raise AssertionError("the consumer did not stop")


def test_a_producer_opened_before_an_idle_delivers_after_it(nameserver, procs, tmp_path):
    c = consumer(procs, tmp_path, nameserver)
    with lecho.Context(nameserver=nameserver, quiet=True, handshake_timeout=1) as ctx:
        stop(c)
        p = ctx.channel("hsi.ch").producer()    # its dial's HELLO waits unanswered
        os.kill(c.pid, signal.SIGCONT)
        time.sleep(2)                           # no loop call: the answer comes and waits
        t0 = time.monotonic()
        assert p.submit_sync({"x": 1}, timeout=5) is True
        assert time.monotonic() - t0 < 1


def test_a_first_call_after_such_an_idle_is_answered(nameserver, procs, tmp_path):
    c = consumer(procs, tmp_path, nameserver)
    with lecho.Context(nameserver=nameserver, quiet=True, handshake_timeout=1) as ctx:
        stop(c)
        ctx.channel("hsi.ch").producer()
        os.kill(c.pid, signal.SIGCONT)
        time.sleep(2)
        t0 = time.monotonic()
        assert ctx.call("hsi.svc", {"x": 21}, timeout=5) == 42
        assert time.monotonic() - t0 < 1


def test_a_dial_its_peer_closed_during_the_idle_is_made_again_with_its_queue(nameserver, procs, tmp_path):
    # the consumer's process drops the silent dialler after 0.6 s
    c = consumer(procs, tmp_path, nameserver, hb="0.3")
    with lecho.Context(nameserver=nameserver, quiet=True, handshake_timeout=1, heartbeat=0.5) as ctx:
        stop(c)
        p = ctx.channel("hsi.ch").producer()
        for i in range(3):
            p.submit({"i": i})                  # queued behind the handshake
        os.kill(c.pid, signal.SIGCONT)
        time.sleep(2)
        t0 = time.monotonic()
        assert p.submit_sync({"x": 1}, timeout=5) is True
        assert time.monotonic() - t0 < 1
        assert ctx.call("hsi.count", {}, timeout=5) == 4
