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


TICKER = textwrap.dedent("""
    local lecho = require "lecho"
    local ctx = lecho.context{ nameserver = arg[1], quiet = true,
                               max_members = arg[2] == "one" and 1 or nil }
    local p = assert(ctx:channel(arg[3] or "boom.ch"):producer())
    local i = 0
    ctx:every(0.01, function() i = i + 1 p:submit({ i = i }) end)
    print("ticking")
    io.stdout:flush()
    ctx:after(120, function() ctx:stop() end)
    ctx:run()
""")

BOOM = 'function enqueue(ev) error("boom") end'


@pytest.mark.parametrize("kind", ["subscribe", "consumer"])
def test_on_error_hears_a_modulator_that_raises_at_a_producer(nameserver, procs, tmp_path, kind):
    # Review 4 BUG, the reviewer's steps: a modulator raising at a producer
    # submitting every 10 ms.  Here the failure came after the open in every
    # run on 8cf3d95 too (this passes there): it checks that the errors now
    # held during the open (opts on_error = true) leave the later ones to
    # on_error.  The certain case of the bug is the next test.
    (tmp_path / "ticker.lua").write_text(TICKER)
    readline(procs.lua_script(str(tmp_path / "ticker.lua"), nameserver), "^ticking")
    ctx = lecho.Context(nameserver=nameserver, quiet=True)
    try:
        ch = ctx.channel("boom.ch")
        for run in range(6):
            errors = []
            # a new source each run: a producer tells a modulator's failure
            # once (the same one again is "not running here", silently)
            mod = BOOM + " -- %s %d" % (kind, run)
            if kind == "subscribe":
                c = ch.subscribe(modulator=mod, on_error=errors.append)
            else:
                c = ch.consumer(lambda ev, m: None, modulator=mod, on_error=errors.append)
            end = time.monotonic() + 3
            while not errors and time.monotonic() < end:
                ctx.run_once(0.05)
            c.close()
            assert errors, "run %d: on_error never called" % run
            assert "boom" in errors[0]
    finally:
        ctx.close(0)


@pytest.mark.parametrize("kind", ["subscribe", "consumer"])
def test_on_error_hears_a_refusal_answered_in_the_open(nameserver, procs, tmp_path, kind):
    # Review 4 BUG, made certain: a producer whose max_members (1) refuses
    # the member list naming a second consumer context says so in its
    # answer to the join, inside the open: before the fix on_error was not
    # set yet and the refusal was logged (nothing, quiet), every time.
    (tmp_path / "ticker.lua").write_text(TICKER)
    readline(procs.lua_script(str(tmp_path / "ticker.lua"), nameserver, "one", "one.ch"), "^ticking")
    first = lecho.Context(nameserver=nameserver, quiet=True)
    ctx = lecho.Context(nameserver=nameserver, quiet=True)
    try:
        first.channel("one.ch").subscribe()
        errors = []
        ch = ctx.channel("one.ch")
        if kind == "subscribe":
            ch.subscribe(on_error=errors.append)
        else:
            ch.consumer(lambda ev, m: None, on_error=errors.append)
        end = time.monotonic() + 3
        while not errors and time.monotonic() < end:
            ctx.run_once(0.05)
        assert errors, "on_error never called"
        assert "max_members" in errors[0] or "member" in errors[0], errors[0]
    finally:
        ctx.close(0)
        first.close(0)


def test_meta_is_str_for_a_raw_subscription_as_for_a_raw_consumer():
    # Review 4 nit: subscribe(meta=True, raw=True) gave Meta's channel and
    # producer as bytes, consumer(fn, raw=True) as str.
    with lecho.Context(quiet=True) as ctx:
        ch = ctx.channel("raw.meta")
        got = []
        ch.consumer(lambda ev, m: got.append(m), raw=True)
        sub = ch.subscribe(meta=True, raw=True)
        p = ch.producer()
        p.submit({"x": b"y"})
        ev, m = sub.get(timeout=5)
        end = time.monotonic() + 5
        while not got and time.monotonic() < end:
            ctx.run_once(0.05)
        assert ev == {b"x": b"y"} or ev == {"x": b"y"}, ev
        assert got, "the consumer got nothing"
        assert m == got[0]
        assert type(m.channel) is str and type(m.producer) is str, m
        assert m.channel == "raw.meta"


def test_the_jupyter_fragment_steers_settings_the_simulation_has():
    # Review 4 nit: doc/python.md's Jupyter fragment sent {"alpha": 0.5} to
    # atmosphere.steer, which examples/atmosphere refuses ("unknown setting").
    import ast
    import re
    doc = open(os.path.join(ROOT, "doc", "python.md")).read()
    sim = open(os.path.join(ROOT, "examples", "atmosphere", "simulation.lua")).read()
    steered = re.findall(r'steer\.submit_sync_async\((\{[^}]*\})', doc)
    assert steered, "no steer.submit_sync_async in doc/python.md"
    for d in steered:
        for key in ast.literal_eval(d):
            assert re.search(r"--%s\b" % re.escape(key), sim), \
                "doc/python.md steers %r, which examples/atmosphere/simulation.lua has no setting for" % key
