"""python/lecho against real processes: a Lua name server, Lua producers,
consumers and servers (peer.lua), Python consumers and producers."""
import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import lecho
from conftest import ROOT, readline, rest

EVEN = "function enqueue(ev) if ev.k == nil or ev.k % 2 == 0 then return ev end end"


def test_values_round_trip_through_a_context():
    with lecho.Context(quiet=True) as ctx:
        ch = ctx.channel("values")
        got = []
        ch.consumer(lambda ev, meta: got.append((ev, meta)))
        p = ch.producer()
        ev = {"step": 3, "x": 0.25, "s": "héllo", "b": b"\xff\x00z", "none": None, "yes": True,
              "no": False, "list": [1, "two", [3.5]], "nested": {"a": {"b": {}}}, 7: "int key",
              "big": 2 ** 53}
        assert p.submit_sync(ev) is True
        (got_ev, meta), = got
        expect = dict(ev)
        del expect["none"]            # a nil field is no field, as in Lua
        assert got_ev == expect
        assert isinstance(got_ev["step"], int) and isinstance(got_ev["x"], float)
        assert meta.channel == "values" and meta.seq == 1 and meta.producer.endswith("#1")
        sub = ch.subscribe(meta=True)
        p.submit("plain")
        p.submit(None)
        ev, m = sub.get(timeout=5)
        assert ev == "plain" and m == lecho.Meta("values", meta.producer, 2)   # as a callback's meta
        ev, m = sub.get(timeout=5)
        assert ev is None and m.seq == 3         # a nil event keeps its place
        sub.close()
        with pytest.raises(ValueError, match="2\\*\\*53"):
            p.submit({"too_big": 2 ** 53 + 1})
        with pytest.raises(TypeError, match="object"):
            p.submit({"f": object()})


def test_an_empty_list_arrives_as_an_empty_dict():
    # doc/python.md "Values" (review 6 nit): lecho values have one table
    # type, as in Lua; an empty one comes back as {}
    with lecho.Context(quiet=True) as ctx:
        ch = ctx.channel("empty")
        got = []
        ch.consumer(lambda ev, meta: got.append(ev))
        p = ch.producer()
        assert p.submit_sync([]) is True
        assert p.submit_sync({"a": [], "b": {}, "c": [1]}) is True
        assert got == [{}, {"a": {}, "b": {}, "c": [1]}]


def test_errors_carry_the_shared_codes(nameserver):
    with pytest.raises(lecho.LechoError) as e:
        lecho.Context(nameserver=nameserver, namserver="typo")
    assert e.value.code == "invalid" and "namserver" in e.value.message
    assert e.value.errno == lecho.CODES["invalid"] == 6
    with lecho.Context(nameserver=nameserver, quiet=True) as ctx:
        p = ctx.channel("nobody").producer()
        with pytest.raises(lecho.SyncError) as e:
            p.submit_sync({"x": 1}, timeout=2)
        assert e.value.code == "noconsumer"
        with pytest.raises(lecho.CallError) as e:
            ctx.call("no.such.service", {"x": 1}, timeout=2)
        assert e.value.code == "noservice"
        with pytest.raises(lecho.LechoError) as e:
            ctx.channel("nobody").subscribe(modulator="this is not lua")
        assert e.value.code == "invalid"
    with pytest.raises(lecho.LechoError) as e:
        ctx.channel("x")
    assert e.value.code == "closed"


def test_python_consumer_of_a_lua_producer_with_a_modulator_at_the_producer(nameserver, procs):
    n = 200
    with lecho.Context(nameserver=nameserver, quiet=True) as ctx:
        ch = ctx.channel("py.mod")
        sub = ch.subscribe(modulator=EVEN)
        lua = procs.lua("produce", nameserver, "py.mod", n)
        ks = []
        with sub:                   # the final event, left by break, was handled
            for ev in sub:
                if ev.get("final"):
                    break
                if "k" in ev:
                    ks.append(ev["k"])
        assert ks == list(range(2, n + 1, 2))
        assert readline(lua, r"^sync\s+(\S+)").group(1) == "true"
        # Filtered where it was produced: only the even half crossed the wire.
        # (a modulated consumer's events come on the channel's "NAME@hash" row)
        events_in = sum(row["events_in"] for name, row in ctx.stats()["channels"].items()
                        if name.startswith(ch.name))
        assert n // 2 <= events_in < n, events_in


def test_sync_submit_handled_by_a_python_consumer(nameserver, procs):
    with lecho.Context(nameserver=nameserver, quiet=True) as ctx:
        ctx.on_handler_error = lambda where, exc: None
        alphas = []

        def steer(ev, meta):
            if ev.get("ping"):
                return None
            if not isinstance(ev.get("alpha"), float):
                return "alpha must be a number"   # the steerer's submit_sync gets it
            alphas.append(ev["alpha"])

        ctx.channel("py.steer").consumer(steer)
        lua = procs.lua("steer", nameserver, "py.steer")
        ctx.run(seconds=0.2)
        while lua.poll() is None:
            ctx.run_once(0.05)
        out = rest(lua)
        assert out[0] == "ok"
        assert out[1] == "failed\tfailed\talpha must be a number"
        assert alphas == [0.5]


def test_python_producer_to_a_lua_consumer(nameserver, procs):
    lua = procs.lua("consume", nameserver, "py.out", 3)
    with lecho.Context(nameserver=nameserver, quiet=True) as ctx:
        readline(lua, "^ready")
        p = ctx.channel("py.out").producer()
        for k in range(1, 4):
            p.submit({"k": k, "text": "from python"})
        assert p.submit_sync({"final": True}, timeout=10) is True
    out = rest(lua)
    assert out[:4] == ["1\tfrom python", "2\tfrom python", "3\tfrom python", "final"]


def test_calls_between_python_and_lua(nameserver, procs):
    srv = procs.lua("serve", nameserver, "py.double")
    readline(srv, "^ready")
    with lecho.Context(nameserver=nameserver, quiet=True) as ctx:
        assert ctx.call("py.double", {"x": 21}, timeout=5) == (42, "lua")
        with pytest.raises(lecho.CallError) as e:
            ctx.call("py.double", {"x": "no"}, timeout=5)
        assert e.value.code == "failed" and e.value.value == {"code": 400}
        s = ctx.service("py.upper", lambda args, meta: args["x"].upper())
        caller = procs.lua("call", nameserver, "py.upper", "abc")
        while caller.poll() is None:
            ctx.run_once(0.05)
        assert rest(caller) == ["ABC\tnil\tnil"]   # print(unpack(r, 1, 3)): one result
        s.close()


def test_asyncio_attach_and_async_for(nameserver, procs):
    async def main():
        ctx = lecho.Context(nameserver=nameserver, quiet=True).attach(interval=0.005)
        sub = ctx.channel("py.aio").subscribe()
        lua = procs.lua("produce", nameserver, "py.aio", 20)
        ks = []
        ticks = 0

        async def other():          # the event loop stays free meanwhile
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.001)
        t = asyncio.ensure_future(other())
        async with sub:
            async for ev in sub:
                if ev.get("final"):
                    break
                if "k" in ev:
                    ks.append(ev["k"])
        t.cancel()
        ctx.close()
        return ks, ticks, lua

    ks, ticks, lua = asyncio.run(asyncio.wait_for(main(), 30))
    assert ks == list(range(1, 21))
    assert ticks > 5
    assert readline(lua, r"^sync\s+(\S+)").group(1) == "true"


def test_ctrl_c_closes_cleanly(nameserver, procs, tmp_path):
    script = tmp_path / "sub.py"
    script.write_text(textwrap.dedent("""
        import sys, lecho
        ctx = lecho.Context(nameserver=sys.argv[1], quiet=True)
        sub = ctx.channel("py.ctrlc").subscribe()
        try:
            print("subscribed", flush=True)
            for ev in sub:
                pass
        except KeyboardInterrupt:
            sub.close()
            ctx.close(1)
            print("closed cleanly", flush=True)
    """))
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    # (SIGINT at its default in the child, as from a terminal: a runner that
    # started the suite in the background passes it ignored, and Python then
    # never raises KeyboardInterrupt)
    p = procs.start([sys.executable, str(script), nameserver], env=env,
                    preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    readline(p, "^subscribed")
    p.send_signal(signal.SIGINT)
    readline(p, "^closed cleanly", timeout=10)
    assert p.wait(10) == 0
    # The name server forgot the consumer: a sync submit now finds nobody.
    with lecho.Context(nameserver=nameserver, quiet=True) as ctx:
        with pytest.raises(lecho.SyncError) as e:
            ctx.channel("py.ctrlc").producer().submit_sync({"x": 1}, timeout=2)
        assert e.value.code == "noconsumer"


def test_ctrl_c_in_a_looping_handler_reaches_the_script_and_the_queued_events_are_not_handled(procs, tmp_path):
    # Outside attack of sigfix, F2: each Ctrl-C interrupted one handler call
    # ("consumer ... failed: interrupted") and the next queued event ran the
    # handler again; after 4 Ctrl-C `except KeyboardInterrupt` had not run.
    # Now the first one ends the run: no handler runs after it, and the
    # close says what was not handled.  Two busy loops beside.
    for _ in range(2):
        procs.start([sys.executable, "-c", "while True: pass"])
    script = tmp_path / "loop.py"
    script.write_text(textwrap.dedent("""
        import sys, lecho
        ctx = lecho.Context(linger=1, quiet=False)
        ch = ctx.channel("py.loop")
        def h(ev, meta=None):
            print("handler start %d" % ev["i"], flush=True)
            while True:
                pass
        ch.consumer(h)
        p = ch.producer()
        for i in range(5):
            p.submit({"i": i})
        try:
            ctx.run(seconds=30)
            print("run returned", flush=True)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            ctx.close()
            print("closed", flush=True)
    """))
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    p = procs.start([sys.executable, str(script)], env=env,
                    preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    readline(p, "^handler start 0")
    time.sleep(0.3)
    p.send_signal(signal.SIGINT)
    lines = []
    end = time.monotonic() + 10
    while time.monotonic() < end and "closed" not in lines:
        try:
            ln = p.lines.get(timeout=0.2)
        except Exception:
            continue
        if ln is None:
            break
        lines.append(ln.strip())
    assert "interrupted" in lines, "one SIGINT did not reach the script: %r" % lines
    assert "closed" in lines, lines
    assert not any(ln.startswith("handler start 1") for ln in lines), lines
    assert any("4 events received not handled" in ln for ln in lines), lines
    assert p.wait(10) == 0


@pytest.mark.parametrize("what", ["submit_sync", "call"])
def test_ctrl_c_stops_a_blocking_wait_at_once_and_close_then_closes(nameserver, procs, tmp_path, what):
    # Issue 28: the KeyboardInterrupt came only when the 15 s timeout ran
    # out, then ctx.close() raised LechoError timeout ("1 connection not
    # closed"): the slow peer's handler holds its connection.
    procs.lua("slow", nameserver, "slow.sink")
    script = tmp_path / "blocked.py"
    script.write_text(textwrap.dedent("""
        import sys, time, lecho
        ctx = lecho.Context(nameserver=sys.argv[1], quiet=True)
        try:
            if sys.argv[2] == "submit_sync":
                p = ctx.channel("slow.sink").producer()
                print("waiting", flush=True)
                p.submit_sync({"a": 1}, timeout=15)
            else:
                print("waiting", flush=True)
                ctx.call("slow.sink", timeout=15)
            print("returned", flush=True)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            t = time.monotonic()
            ctx.close(1)
            e = ctx.close_error
            print("closed %.2f %s" % (time.monotonic() - t, e.code if e else "-"), flush=True)
    """))
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    readline(procs.procs[-1], "^ready")
    p = procs.start([sys.executable, str(script), nameserver, what], env=env,
                    preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    readline(p, "^waiting")
    time.sleep(1.5)                    # the event (the request) is at the slow peer
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    readline(p, "^interrupted", timeout=20)
    took = time.monotonic() - t0
    assert took < 3, "KeyboardInterrupt %.1f s after SIGINT" % took
    m = readline(p, r"^closed (\S+) (\S+)", timeout=10)
    assert float(m.group(1)) < 2.5        # the linger of 1 s, not the wait's 15 s
    # the slow consumer never closes its end (its handler sleeps, holding its
    # connection): kept in .close_error, not raised; a slow service's does
    assert m.group(2) == ("timeout" if what == "submit_sync" else "-")
    assert p.wait(10) == 0


def test_close_raises_when_nothing_is_being_handled_and_not_while_an_exception_is(nameserver, procs):
    procs.lua("slow", nameserver, "slow.close")
    readline(procs.procs[-1], "^ready")
    for handling in (False, True):
        ctx = lecho.Context(nameserver=nameserver, quiet=True)
        with pytest.raises(lecho.SyncError) as e:
            ctx.channel("slow.close").producer().submit_sync({"a": 1}, timeout=0.5)
        assert e.value.code == "timeout"
        if not handling:
            with pytest.raises(lecho.LechoError) as e:
                ctx.close(0.5)          # the slow peer holds its connection
            assert e.value.code == "timeout" and ctx._x is None
        else:
            with pytest.raises(RuntimeError):
                with ctx:
                    raise RuntimeError("the block's own exception, not replaced by close's")
            assert ctx._x is None and ctx.close_error.code == "timeout"


def test_a_same_process_call_answered_past_its_timeout_is_a_timeout():
    # Issue 28: a same-process handler runs to its end inside the loop turn
    # (it cannot be pre-empted); its late answer was returned as a result.
    with lecho.Context(quiet=True) as ctx:
        ctx.service("py.slow", lambda args, meta: time.sleep(args) or "late")
        assert ctx.call("py.slow", 0, timeout=2) == "late"
        t0 = time.monotonic()
        with pytest.raises(lecho.CallError) as e:
            ctx.call("py.slow", 1.0, timeout=0.3)
        assert e.value.code == "timeout" and "past the call's timeout" in e.value.message
        assert time.monotonic() - t0 >= 1.0

        async def late():
            with pytest.raises(lecho.CallError) as e:
                await ctx.call_async("py.slow", 0.8, timeout=0.3)
            assert e.value.code == "timeout"
            return await ctx.call_async("py.slow", 0, timeout=2)
        assert asyncio.run(asyncio.wait_for(late(), 20)) == "late"


def test_ctrl_c_inside_a_handler_is_raised_after_the_loop_call():
    with lecho.Context(quiet=True) as ctx:
        ch = ctx.channel("kbd")

        def handler(ev, meta):
            raise KeyboardInterrupt

        ch.consumer(handler)
        p = ch.producer()
        p.submit({"x": 1})
        with pytest.raises(KeyboardInterrupt):
            ctx.run(seconds=2)


def test_keyed_mode_with_key_and_trust_files(procs, tmp_path):
    keys = tmp_path / "keys"
    lecho.keygen("ca", dir=keys, authority=True)
    lecho.keygen("nameserver", "py", dir=keys, sign_with=keys / "ca.key")
    p = procs.start(["luajit", os.path.join(ROOT, "scripts", "lecho-nameserver"),
                     "--listen", "127.0.0.1:0", "--key", str(keys / "nameserver.key"),
                     "--trust", str(keys / "ca.pub")])
    ns = readline(p, r"^lecho-nameserver: listening on (\S+) \(keyed").group(1)
    with lecho.Context(nameserver=ns, key=str(keys / "py.key"), trust=[str(keys / "ca.pub")],
                       quiet=True) as ctx:
        ch = ctx.channel("keyed")
        got = []
        ch.consumer(lambda ev, meta: got.append(ev))
        assert ch.producer().submit_sync({"secret": "yes"}, timeout=5) is True
        assert got == [{"secret": "yes"}]
    # a context without keys is refused by the keyed name server
    with lecho.Context(nameserver=ns, key=False, trust=False, quiet=True, timeout=2) as ctx:
        with pytest.raises(lecho.LechoError) as e:
            ctx.channel("keyed").producer()
        assert e.value.code == "refused" and "mode mismatch" in e.value.message, e.value
    with pytest.raises(lecho.LechoError) as e:
        lecho.keygen("bad name!", dir=keys)
    assert e.value.code == "failed"


def test_ctrl_c_while_a_batch_is_converted_loses_no_event():
    with lecho.Context(quiet=True) as ctx:
        ch = ctx.channel("batch")
        sub = ch.subscribe()
        p = ch.producer()
        for k in range(11):
            p.submit({"k": k})
        real = ctx._read
        calls = []

        def interrupted(*a, **kw):          # Ctrl-C after the take, before the conversion
            calls.append(1)
            if len(calls) == 1:
                raise KeyboardInterrupt
            return real(*a, **kw)

        ctx._read = interrupted
        with pytest.raises(KeyboardInterrupt):
            next(sub)
        assert [sub.get(timeout=5)["k"] for _ in range(11)] == list(range(11))


def test_arrays_from_a_lua_producer_are_numpy_arrays_over_the_received_memory(nameserver, procs):
    import numpy as np
    n = 20
    with lecho.Context(nameserver=nameserver, quiet=True) as ctx:
        ch = ctx.channel("py.arrays")
        sub = ch.subscribe()
        kept = []
        ch.consumer(lambda ev, meta: kept.append(ev) if "field" in ev else None)
        lua = procs.lua("arrays", nameserver, "py.arrays", n)
        fields = []
        with sub:
            for ev in sub:
                if ev.get("final"):
                    break
                if "field" in ev:
                    fields.append(ev)
        assert readline(lua, r"^sync\s+(\S+)").group(1) == "true"
        want = np.arange(64 * 128, dtype="<f8").reshape(64, 128)
        for k, ev in enumerate(fields, 1):
            f = ev["field"]
            assert f.dtype == np.dtype("<f8") and f.shape == (64, 128)
            assert f.flags["OWNDATA"]                      # 64 KiB < 256 KiB: copied out
            assert not f.flags["WRITEABLE"]
            assert np.array_equal(f, want + k * 100000)
            assert ev["small"].tolist() == [k, -k, 7] and ev["small"].dtype == np.dtype("<i2")
        assert len(fields) == n
        # a callback's arrays outlive its handler, as the iterator's do
        assert [ev["field"][0, 1] for ev in kept] == [k * 100000 + 1 for k in range(1, n + 1)]
        # small arrays do not hold the context: it closes under them
        ctx.close()
        assert np.array_equal(fields[-1]["field"], want + n * 100000)
        fields = kept = f = ev = None


def _one_array_event(ctx, name, n):
    import numpy as np
    ch = ctx.channel(name)
    subs = [ch.subscribe(), ch.subscribe()]
    ch.producer().submit({"arr": np.arange(float(n))})
    return [s.get(timeout=5)["arr"] for s in subs]


@pytest.mark.parametrize("n", [4, 100000])
def test_received_arrays_are_read_only_for_every_consumer_of_the_process(n):
    import numpy as np
    with lecho.Context(quiet=True) as ctx:
        a, b = _one_array_event(ctx, "ro%d" % n, n)
        with pytest.raises(ValueError):
            a[0] = 99.0               # would change b too (one decoded value for both)
        assert b[0] == 0.0 and a.flags["WRITEABLE"] is False
        if n >= 100000:
            # over the context's memory, every consumer's: not even setflags
            # makes it writable (the buffer under it is read-only)
            with pytest.raises(ValueError):
                a.setflags(write=True)
            assert not a.flags["OWNDATA"] and b[1] == 1.0
        else:
            # a small array is each consumer's own copy: a write stays there
            a.setflags(write=True)
            a[1] = 42.0
            assert b[1] == 1.0
            a.setflags(write=False)
        c = a.copy()
        c[0] = 99.0                   # a copy is the caller's
        assert a[0] == 0.0


def test_a_context_closes_under_a_held_small_array():
    import numpy as np
    ctx = lecho.Context(quiet=True)
    a, _ = _one_array_event(ctx, "small", 4)    # 32 bytes, as /tmp/rpw/smallhold.py
    ctx.close()                                 # BufferError before
    assert a.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_a_with_block_closes_under_held_large_arrays_which_stay_valid():
    import numpy as np
    n = 100000                                  # 800 KB: over the context's memory
    with lecho.Context(quiet=True) as ctx:
        a, b = _one_array_event(ctx, "large", n)
        assert not a.flags["OWNDATA"]
    # left the with block without BufferError; the arrays hold the memory
    assert ctx._x is None
    junk = [np.ones(n) for _ in range(20)]      # allocations that would reuse freed memory
    assert np.array_equal(a, np.arange(float(n))) and np.array_equal(b, a)
    a = b = junk = None


def test_keyboard_interrupt_then_close_under_a_held_large_array():
    import numpy as np
    ctx = lecho.Context(quiet=True)
    try:
        a, _ = _one_array_event(ctx, "kbi", 100000)
        raise KeyboardInterrupt
    except KeyboardInterrupt:
        ctx.close()
    assert a.sum() == sum(range(100000))


def test_numpy_arrays_sent_are_lecho_arrays_at_a_lua_consumer(nameserver, procs):
    import numpy as np
    lua = procs.lua("consume", nameserver, "py.arrout", 1)
    with lecho.Context(nameserver=nameserver, quiet=True) as ctx:
        readline(lua, "^ready")
        p = ctx.channel("py.arrout").producer()
        u = np.arange(6, dtype=np.int32).reshape(2, 3)
        p.submit({"k": 1, "text": u})          # peer.lua prints ev.k, ev.text (the array's tostring)
        u[:] = -1                              # lent: the submit copied it already
        assert p.submit_sync({"final": True}, timeout=10) is True
        with pytest.raises(TypeError, match="inside a list"):
            p.submit({"k": 2, "list": [u]})
    out = rest(lua)
    assert out[0] == "1\t<i4 2x3 sum=15", out    # the elements as submitted, not the -1s written after


def _syncs(lua):
    """The "sync K ok|failed SECONDS [MESSAGE]" lines of a peer.lua syncs
    process: {k: (result, seconds, message)}."""
    out = {}
    for line in rest(lua):
        f = line.split("\t")
        if f[0] == "sync":
            out[int(f[1])] = (f[2], float(f[3]), f[4] if len(f) > 4 else None)
    return out


@contextlib.contextmanager
def lua_producer(nameserver, procs, kind, ch, *args):
    """A context subscribed to channel ch, then peer.lua's producer `kind`
    ("syncs", "big") of it (args: the rest of peer.lua's arguments):
    yields the context, the subscription and the producer's process."""
    with lecho.Context(nameserver=nameserver, quiet=True) as ctx:
        sub = ctx.channel(ch).subscribe()
        yield ctx, sub, procs.lua(kind, nameserver, ch, *args)


def test_sync_submit_to_an_iterator_returns_once_the_loop_body_ran(nameserver, procs):
    # "true from a sync call means it happened": the ack of a sync event
    # taken by a subscription is held until the body of the loop ran for it
    # (the iterator asks for the next event), not sent once it is queued.
    with lua_producer(nameserver, procs, "syncs", "py.syncit", 2) as (ctx, sub, lua):
        bodies = []
        with sub:
            for ev in sub:
                if ev.get("ping"):
                    continue
                time.sleep(0.6)         # the handling the producer waits for
                bodies.append(ev["k"])
                if ev["k"] == 2:
                    break               # left by break inside `with`: handled too
        while lua.poll() is None:       # the loop carries the acks out
            ctx.run_once(0.05)
        got = _syncs(lua)
        assert bodies == [1, 2]
        for k in (1, 2):
            result, seconds, _ = got[k]
            assert result == "ok", got
            assert seconds >= 0.55, got  # not before the body's 0.6 s


def test_sync_submit_to_an_iterator_whose_body_raises_fails(nameserver, procs):
    with lua_producer(nameserver, procs, "syncs", "py.syncraise", 2) as (ctx, sub, lua):
        with pytest.raises(RuntimeError, match="bad event"):
            for ev in sub:
                if ev.get("ping"):
                    continue
                if ev["k"] == 1:
                    time.sleep(0.3)
                    raise RuntimeError("bad event")
        # the loop is left; the context still answers (and takes k = 2 next)
        assert sub.get(timeout=10)["k"] == 2
        sub.close()                     # k = 2 was handed out, then closed: handled
        while lua.poll() is None:
            ctx.run_once(0.05)
        got = _syncs(lua)
        result, seconds, message = got[1]
        assert result == "failed", got
        assert message == "not handled: the subscription's iterator stopped", got
        assert seconds >= 0.25, got
        assert got[2][0] == "ok", got


def test_closing_a_subscription_fails_the_sync_events_it_did_not_hand_out(nameserver, procs):
    with lua_producer(nameserver, procs, "syncs", "py.syncclose", 1) as (ctx, sub, lua):
        for ev in sub:
            assert ev.get("ping")
            sub.done()                  # the ping handled: the producer goes on to k = 1
            break
        seen = ctx.stat("py.syncclose", "events_in")
        end = time.monotonic() + 10
        while ctx.stat("py.syncclose", "events_in") == seen and time.monotonic() < end:
            ctx.run_once(0.05)          # k = 1 arrives and waits in the context's queue
        sub.close()
        while lua.poll() is None:
            ctx.run_once(0.05)
        result, _, message = _syncs(lua)[1]
        assert (result, message) == ("failed", "not handled: the subscription closed")


def test_sync_events_that_come_after_the_subscription_closed_fail(nameserver, procs):
    # Found by an outside reviewer: sync events that reached this context
    # after sub.close() (the producer not told yet) came back true though no
    # handler ran.  The name server (the channel's manager) is stopped once
    # the subscription is known, so the producer is told only after all
    # three came: each fails, answered by this context, code noconsumer.
    ns_proc = procs.procs[0]            # the nameserver fixture's process
    with lua_producer(nameserver, procs, "syncs", "py.syncgone", 3) as (ctx, sub, lua):
        ev = sub.get(timeout=10)
        assert ev.get("ping")
        os.kill(ns_proc.pid, signal.SIGSTOP)
        try:
            sub.close()                 # the ping was handed out: handled
            end = time.monotonic() + 20
            while lua.poll() is None and time.monotonic() < end:
                ctx.run_once(0.05)
        finally:
            os.kill(ns_proc.pid, signal.SIGCONT)
        got = _syncs(lua)
        for k in (1, 2, 3):
            result, _, message = got[k]
            assert result == "failed", got
            assert re.match(r"^no consumer of \S+/py\.syncgone at \S+ any more: not handled$", message), got
        assert ctx.stat("py.syncgone", "events_in") == 4   # the ping and the three, none run


def test_a_held_ack_does_not_hold_the_producers_connection(nameserver, procs):
    # While a subscription's loop body holds the ack of a sync event on one
    # channel, the same producing process's events on another channel (the
    # same connection) still arrive and are answered.
    with lecho.Context(nameserver=nameserver, quiet=True) as ctx:
        sub = ctx.channel("py.held.a").subscribe()
        got_b = []
        ctx.channel("py.held.b").consumer(lambda ev, meta: got_b.append(ev.get("k")))
        lua = procs.lua("two", nameserver, "py.held.a", "py.held.b")
        for ev in sub:
            if ev.get("ping"):
                continue
            assert ev["k"] == 1
            end = time.monotonic() + 5  # the body of k = 1 runs until B's event came
            while 2 not in got_b and time.monotonic() < end:
                ctx.run_once(0.05)
            b = readline(lua, r"^B\t(\S+)\t(\S+)")
            sub.done()
            break
        assert 2 in got_b
        assert b.group(1) == "ok"       # answered while A's ack was held
        while lua.poll() is None:
            ctx.run_once(0.05)
        a = [line for line in rest(lua) if line.startswith("A")]
        assert a and a[0].split("\t")[1] == "ok", a
        assert float(a[0].split("\t")[2]) >= 0.2, a  # A returned only after the body


def test_async_for_whose_body_raises_fails_the_sync_event(nameserver, procs):
    async def main():
        ctx = lecho.Context(nameserver=nameserver, quiet=True).attach(interval=0.005)
        sub = ctx.channel("py.aioraise").subscribe()
        lua = procs.lua("syncs", nameserver, "py.aioraise", 2)
        with pytest.raises(RuntimeError):
            async for ev in sub:
                if ev.get("ping"):
                    continue
                await asyncio.sleep(0.3)
                raise RuntimeError("bad event")
        async with sub:             # k = 2: handled (left by break inside `async with`)
            async for ev in sub:
                assert ev["k"] == 2
                break
        while lua.poll() is None:
            await asyncio.sleep(0.05)
        ctx.close()
        return lua

    got = _syncs(asyncio.run(asyncio.wait_for(main(), 30)))
    assert got[1][0] == "failed" and got[1][2] == "not handled: the subscription's iterator stopped", got
    assert got[1][1] >= 0.25, got
    assert got[2][0] == "ok", got


def _iterate(sub, how, k_stop):
    """A for loop over sub that stops at event k_stop by `how`: "break",
    "raise" (its body raises), "with-break", "with-raise" (the same inside
    `with sub:`), "done-break" (sub.done() then break)."""
    def loop():
        for ev in sub:
            if ev.get("ping"):
                continue
            if ev["k"] == k_stop:
                if how.endswith("raise"):
                    raise RuntimeError("bad event")
                if how.startswith("done"):
                    sub.done()
                break
    try:
        if how.startswith("with"):
            with sub:
                loop()
        else:
            loop()
    except RuntimeError:
        pass


@pytest.mark.parametrize("how,want", [
    ("break", "failed"),        # outside `with`, break and an exception look alike: never a wrong true
    ("raise", "failed"),
    ("with-break", "ok"),       # `with sub:` tells them apart by how its block is left
    ("with-raise", "failed"),
    ("done-break", "ok"),       # sub.done() said it was handled
])
def test_how_a_loop_stops_decides_the_sync_event_it_stopped_at(nameserver, procs, how, want):
    with lua_producer(nameserver, procs, "syncs", "py.stop", 1) as (ctx, sub, lua):
        _iterate(sub, how, 1)
        sub.close()
        while lua.poll() is None:
            ctx.run_once(0.05)
        result, _, message = _syncs(lua)[1]
        assert result == want, (how, result, message)
        if want == "failed":
            assert message == "not handled: the subscription's iterator stopped"


def test_normal_iteration_acks_each_event_once_the_next_is_asked_for(nameserver, procs):
    # a loop that goes on: k = 1 and 2 are acked when the body asks for the
    # next one, k = 3's loop is left inside `with` by the subscription closing
    with lua_producer(nameserver, procs, "syncs", "py.normal", 3) as (ctx, sub, lua):
        seen = []
        with sub:
            for ev in sub:
                if ev.get("ping"):
                    continue
                seen.append(ev["k"])
                if ev["k"] == 3:
                    sub.close()         # the for loop ends normally (StopIteration)
        assert seen == [1, 2, 3]
        while lua.poll() is None:
            ctx.run_once(0.05)
        got = _syncs(lua)
        assert [got[k][0] for k in (1, 2, 3)] == ["ok", "ok", "ok"], got


def test_async_for_left_by_break_outside_async_with_fails_the_event(nameserver, procs):
    async def main():
        ctx = lecho.Context(nameserver=nameserver, quiet=True).attach(interval=0.005)
        sub = ctx.channel("py.aiobreak").subscribe()
        lua = procs.lua("syncs", nameserver, "py.aiobreak", 1)
        async for ev in sub:
            if ev.get("ping"):
                continue
            break
        sub.close()
        while lua.poll() is None:
            await asyncio.sleep(0.05)
        ctx.close()
        return lua

    got = _syncs(asyncio.run(asyncio.wait_for(main(), 30)))
    assert got[1][0] == "failed" and got[1][2] == "not handled: the subscription's iterator stopped", got


def _rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def test_large_arrays_held_past_later_events_keep_their_values(nameserver, procs):
    # 1 MiB arrays come without a copy (the read buffer handed over): one
    # held while 40 more arrive, and their buffers recycled, keeps its
    # elements; letting it go frees it (the context closes: no BufferError)
    import numpy as np
    m = 2 ** 20 // 8
    with lua_producer(nameserver, procs, "big", "py.big", 41, 2 ** 20) as (ctx, sub, lua):
        held = {}
        with sub:
            for ev in sub:
                if ev.get("final"):
                    break
                if "field" in ev and ev["k"] in (1, 2, 20):
                    held[ev["k"]] = ev["field"]
                ev = None
        assert readline(lua, r"^sync\s+(\S+)").group(1) == "true"
        # each 1 MiB array took its read buffer over: none was copied
        assert ctx.stats()["arrays_adopted"] == 41
        for k, a in held.items():
            assert a.shape == (m,) and not a.flags["OWNDATA"]
            assert np.array_equal(a, np.arange(m, dtype="<f8") + k * 1e7), k
        held = a = None
    # closed without BufferError: every array's memory was let go


def test_the_iterator_lets_go_of_the_event_it_handed_out_before_it_waits_for_the_next(nameserver, procs):
    # A `for ev in sub` loop that lets go of each event: the iterator let go
    # of it only once the next had come (its own reference, held through the
    # wait), so the read buffer of the one before could not be found let go
    # of and read into again (a fresh 8 MiB buffer, 2048 page faults).
    # Shown by when each event's array dies: before the next event's buffer
    # is adopted (arrays_adopted still k), not after (k + 1).
    import weakref
    n = 6
    died = {}
    with lua_producer(nameserver, procs, "big", "py.letgo", n, 2 ** 20, "paced") as (ctx, sub, lua):

        def dead(k):
            died[k] = ctx.stats()["arrays_adopted"]
        with sub:
            for ev in sub:
                if ev.get("final"):
                    break
                if "field" in ev:     # (not wait_consumer's pings)
                    weakref.finalize(ev["field"], dead, ev["k"])
                ev = None
        assert readline(lua, r"^sync\s+(\S+)").group(1) == "true"
        assert ctx.stats()["arrays_adopted"] == n
    assert died == {k: k for k in range(1, n + 1)}, died


def test_a_loop_that_lets_each_array_go_reads_every_frame_into_the_same_buffer(nameserver, procs):
    # The buffer of the event let go of comes back before the next frame
    # (collected when the iterator waits, ctx:reclaim), which is read into
    # it, still in the CPU's cache: not two or four buffers taking turns
    # (a Python consumer of 8 MiB arrays went at 0.8x or 0.5x raw TCP then).
    n = 10
    with lua_producer(nameserver, procs, "big", "py.same", n, 2 ** 20, "paced") as (ctx, sub, lua):
        where = []
        with sub:
            for ev in sub:
                if ev.get("final"):
                    break
                if "field" in ev:
                    where.append(ev["field"].ctypes.data)
                ev = None
        assert readline(lua, r"^sync\s+(\S+)").group(1) == "true"
        assert ctx.stats()["arrays_adopted"] == n
    assert len(where) == n
    assert len(set(where[2:])) == 1, [hex(w) for w in where]


def test_arrays_let_go_come_back_without_a_collection_of_the_library_state(nameserver, procs):
    # The buffer of an event let go of came back through a full collection
    # of liblecho's Lua state before each wait (ctx:reclaim): 17% of a
    # Python consumer of 8 MiB arrays.  The only subscription of its channel
    # gives it back when its handle on the event is freed instead (the last
    # array over it let go of): none, and every frame still read into the
    # same buffer, each array intact while it is held.
    import numpy as np
    n, m = 10, 2 ** 20 // 8
    with lua_producer(nameserver, procs, "big", "py.nocollect", n, 2 ** 20, "paced") as (ctx, sub, lua):
        where = []
        with sub:
            for ev in sub:
                if ev.get("final"):
                    break
                if "field" in ev:
                    a = ev["field"]
                    where.append(a.ctypes.data)
                    assert a[0] == ev["k"] * 1e7 and a[m - 1] == ev["k"] * 1e7 + m - 1
                    a = None
                ev = None
        assert readline(lua, r"^sync\s+(\S+)").group(1) == "true"
        st = ctx.stats()
        assert st["arrays_adopted"] == n
        assert st["array_collections"] == 0, st["array_collections"]
    assert len(where) == n and len(set(where[1:])) == 1, [hex(w) for w in where]


def test_two_subscriptions_of_a_channel_keep_the_arrays_they_share(nameserver, procs):
    # Two subscriptions of one channel in a context get the same arrays
    # (one decoded value): one letting go of an event gives nothing back
    # while the other holds it (no buffer read into again under it).
    import numpy as np
    n, m = 12, 2 ** 20 // 8
    with lecho.Context(nameserver=nameserver, quiet=True) as ctx:
        ch = ctx.channel("py.shared")
        keep, drop = ch.subscribe(), ch.subscribe()
        lua = procs.lua("big", nameserver, "py.shared", n, 2 ** 20)
        held, seen = {}, 0
        while True:
            ev = keep.get(timeout=30)
            keep.done()                    # (handled: the producer's syncs wait for both)
            if ev.get("final"):
                break
            if "field" in ev:
                held[ev["k"]] = ev["field"]
            ev = drop.get(timeout=30)      # the same event, let go of at once
            drop.done()
            ev = None
            seen += 1
        drop.get(timeout=30)
        drop.done()
        assert readline(lua, r"^sync\s+(\S+)").group(1) == "true"
        assert sorted(held) == list(range(1, n + 1))
        for k, a in held.items():
            assert np.array_equal(a, np.arange(m, dtype="<f8") + k * 1e7), k
        held = a = None
        keep.close()
        drop.close()


def test_a_field_handle_made_from_taken_events_keeps_their_arrays(nameserver, procs):
    # The C API: lecho_field on the handle lecho_consumer_take filled holds
    # its event (and arrays) past that handle's lecho_value_free: the
    # buffers are then not given back with the handle (they would be
    # another frame's under the field's array).
    import numpy as np
    from lecho._ffi import ffi, lib
    n, m = 6, 2 ** 20 // 8
    with lua_producer(nameserver, procs, "big", "py.field", n, 2 ** 20, "paced") as (ctx, sub, lua):
        fields = []
        c = ffi.new("size_t[2]")
        done = False
        while not done:
            ctx._loop_call(lib.lecho_consumer_wait(sub._h, 1.0))
            box = lib.lecho_value_new(ctx._x)
            assert lib.lecho_consumer_take(sub._h, box, 64, 0, c, c + 1) == 0
            for i in range(c[0]):
                f = lib.lecho_field(box, ffi.NULL, i)     # the i-th event of the batch (0-based)
                assert f != ffi.NULL
                nodes, cnt = ffi.new("const lecho_node **"), ffi.new("size_t *")
                assert lib.lecho_nodes(f, b"final", nodes, cnt) == 0
                if nodes[0][0].type == lib.LECHO_TBOOLEAN:
                    done = True
                assert lib.lecho_nodes(f, b"field", nodes, cnt) == 0
                if nodes[0][0].type == lib.LECHO_TARRAY:
                    fields.append(f)
                else:
                    lib.lecho_value_free(f)
            lib.lecho_consumer_settle(sub._h, c[0], ffi.NULL)
            lib.lecho_value_free(box)
        assert readline(lua, r"^sync\s+(\S+)").group(1) == "true"
        assert len(fields) == n
        nodes, cnt = ffi.new("const lecho_node **"), ffi.new("size_t *")
        for k, f in enumerate(fields, 1):
            assert lib.lecho_nodes(f, b"field", nodes, cnt) == 0
            nd = nodes[0][0]
            assert nd.type == lib.LECHO_TARRAY and nd.n == 2 ** 20, (k, nd.type, nd.n)
            a = np.frombuffer(ffi.buffer(nd.str, nd.n), dtype="<f8")
            assert np.array_equal(a, np.arange(m, dtype="<f8") + k * 1e7), k
            lib.lecho_value_free(f)
        sub.close()


def test_a_thousand_large_array_events_keep_memory_bounded(nameserver, procs):
    n, size = 1000, 2 ** 20
    with lua_producer(nameserver, procs, "big", "py.rss", n, size, "sparse") as (ctx, sub, lua):
        got, rss = 0, []
        with sub:
            for ev in sub:
                if ev.get("final"):
                    break
                if "field" in ev:
                    assert ev["field"][3] == ev["k"] * 1e7 + 3
                    got += 1
                    if got in (100, 1000):
                        rss.append(_rss_mib())
                ev = None
        assert readline(lua, r"^sync\s+(\S+)", timeout=120).group(1) == "true"
        assert got == n
        # 900 MiB went through between the two readings: what was let go was freed
        assert rss[1] - rss[0] < 64, rss


def test_submit_sync_and_call_as_awaitables_leave_the_asyncio_loop_free(nameserver, procs):
    # Inside a running loop (as in a Jupyter cell): the awaitables wait
    # without blocking it.  Shown with a same-process subscription, whose
    # loop body runs in another task: a blocking submit_sync could not
    # return before its own timeout there (doc/python.md).
    async def main():
        ctx = lecho.Context(nameserver=nameserver, quiet=True).attach(interval=0.005)
        ch = ctx.channel("py.await")
        sub = ch.subscribe()
        p = ch.producer()
        seen = []

        async def consumer():
            async with sub:
                async for ev in sub:
                    await asyncio.sleep(0.3)     # the handling the producer waits for
                    seen.append(ev["k"])
                    if ev["k"] == 2:
                        break
        t = asyncio.ensure_future(consumer())
        t0 = time.monotonic()
        r1 = await p.submit_sync_async({"k": 1}, timeout=5)
        t1 = time.monotonic() - t0
        r2 = await p.submit_sync_async({"k": 2}, timeout=5)
        t2 = time.monotonic() - t0
        await t
        lua = procs.lua("serve", nameserver, "py.await.double")
        readline(lua, "^ready")
        doubled = await ctx.call_async("py.await.double", {"x": 21}, timeout=5)
        with pytest.raises(lecho.CallError) as ce:
            await ctx.call_async("py.await.double", {"x": "no"}, timeout=5)
        with pytest.raises(lecho.SyncError) as se:
            await ctx.channel("py.await.nobody").producer().submit_sync_async({"k": 1}, timeout=1)
        ctx.close()
        return r1, r2, t1, t2, seen, doubled, ce.value, se.value

    r1, r2, t1, t2, seen, doubled, ce, se = asyncio.run(asyncio.wait_for(main(), 30))
    assert (r1, r2, seen) == (True, True, [1, 2])
    assert t1 >= 0.25 and t2 >= 0.55, (t1, t2)   # each returned once the loop body ran
    assert doubled == (42, "lua")
    assert ce.code == "failed" and ce.value == {"code": 400}, (ce.code, ce.value)
    assert se.code == "noconsumer"


def test_awaitables_without_attach_turn_the_loop_themselves(nameserver, procs):
    lua = procs.lua("serve", nameserver, "py.await.plain")

    async def main():
        ctx = lecho.Context(nameserver=nameserver, quiet=True)     # not attached
        readline(lua, "^ready")
        got = await ctx.call_async("py.await.plain", {"x": 4}, timeout=5)
        ctx.close()
        return got

    assert asyncio.run(asyncio.wait_for(main(), 30)) == (8, "lua")   # two results: a tuple, as call()


@pytest.mark.parametrize("raw", [False, True])
def test_a_batch_of_strings_comes_whole_with_nuls_and_non_ascii_among_them(raw):
    # A batch of string events is converted at once (the packed strings
    # split at their NULs): a string holding a NUL, an empty one, non-ASCII
    # and invalid UTF-8 among them come as they were sent.
    plain = ["s%03d" % i for i in range(200)]
    odd = list(plain)
    odd[50], odd[51], odd[120] = "a\0b", "", "\0"
    utf = list(plain)
    utf[7] = "caf\u00e9"
    bad = list(plain)
    bad[9] = b"\xff\xfe"
    with lecho.Context(quiet=True) as ctx:
        ch = ctx.channel("py.strings")
        sub = ch.subscribe(raw=raw)
        p = ch.producer()
        for batch in (plain, odd, utf, bad):
            for x in batch:
                p.submit(x)
            for _ in range(50):
                ctx.run_once(0.01)
                if sub._fill():
                    break
            got = [sub.get(timeout=5) for _ in batch]
            want = [x if isinstance(x, bytes) else x.encode() for x in batch] if raw else batch
            assert got == want
        sub.close()


def test_a_nil_event_at_the_end_of_a_batch_is_not_lost():
    # a nil event is a hole in the batch's list: its length missed the
    # last ones, and the subscription never saw them (nor settled them)
    with lecho.Context(quiet=True) as ctx:
        ch = ctx.channel("py.nil")
        sub = ch.subscribe()
        p = ch.producer()
        p.submit(1)
        p.submit(None)
        for _ in range(5):
            ctx.run_once(0.01)
        assert [sub.get(timeout=2), sub.get(timeout=2)] == [1, None]
        sub.close()


def test_large_arrays_over_a_keyed_connection_come_without_a_copy(procs, tmp_path):
    # the read buffer handed over holds the decrypted frame (keyed mode)
    import numpy as np
    keys = tmp_path / "keys"
    lecho.keygen("ca", dir=keys, authority=True)
    lecho.keygen("nameserver", "py", "pyprod", dir=keys, sign_with=keys / "ca.key")
    p = procs.start(["luajit", os.path.join(ROOT, "scripts", "lecho-nameserver"),
                     "--listen", "127.0.0.1:0", "--key", str(keys / "nameserver.key"),
                     "--trust", str(keys / "ca.pub")])
    ns = readline(p, r"^lecho-nameserver: listening on (\S+) \(keyed").group(1)
    code = textwrap.dedent("""
        import sys, numpy as np, lecho
        ctx = lecho.Context(nameserver=sys.argv[1], key=sys.argv[2], trust=[sys.argv[3]], quiet=True)
        p = ctx.channel("py.keyedbig").producer()
        for _ in range(200):
            try:
                p.submit_sync({"ping": True}, timeout=2); break
            except lecho.SyncError:
                ctx.run_once(0.05)
        for k in range(1, 6):
            p.submit({"k": k, "field": np.arange(2 ** 17, dtype="<f8") + k})
        print("sync", p.submit_sync({"final": True}, timeout=30), flush=True)
        ctx.close()
    """)
    with lecho.Context(nameserver=ns, key=str(keys / "py.key"), trust=[str(keys / "ca.pub")],
                       quiet=True) as ctx:
        sub = ctx.channel("py.keyedbig").subscribe()
        env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
        prod = procs.start([sys.executable, "-c", code, ns, str(keys / "pyprod.key"), str(keys / "ca.pub")],
                           env=env)
        fields = {}
        with sub:
            for ev in sub:
                if ev.get("final"):
                    break
                if "field" in ev:
                    fields[ev["k"]] = ev["field"]
        assert readline(prod, r"^sync\s+(\S+)", timeout=60).group(1) == "True"
        assert sorted(fields) == [1, 2, 3, 4, 5]
        for k, a in fields.items():
            assert np.array_equal(a, np.arange(2 ** 17, dtype="<f8") + k), k
        assert ctx.stats()["arrays_adopted"] == 5
        fields = a = None


RAISES = "function enqueue(ev) if ev.k == 3 then error('modulator says no to ' .. ev.k) end return ev end"


def test_on_error_hears_a_modulator_that_fails_at_a_lua_producer(nameserver, procs, tmp_path):
    # review N5: quiet=True, the modulator raises at the producer: the
    # Python consumer hears it (Lua's consumer on_error), not nothing
    prod = tmp_path / "producer.lua"
    prod.write_text(textwrap.dedent("""
        local lecho = require "lecho"
        local ctx = lecho.context{ nameserver = arg[1], quiet = true }
        local p = assert(ctx:channel("py.onerr"):producer())
        for _ = 1, 200 do if p:submit_sync({ ping = true }, { timeout = 2 }) then break end ctx:sleep(0.05) end
        for k = 1, 5 do assert(p:submit({ k = k })) end
        ctx:sleep(20)
    """))
    with lecho.Context(nameserver=nameserver, quiet=True) as ctx:
        ch = ctx.channel("py.onerr")
        errs, cerrs, got = [], [], []
        sub = ch.subscribe(modulator=RAISES, on_error=errs.append)
        ch.consumer(lambda ev, m: got.append(ev), modulator=RAISES, on_error=cerrs.append)
        procs.lua_script(str(prod), nameserver)
        end = time.monotonic() + 20
        ks = []
        while (not errs or not cerrs) and time.monotonic() < end:
            try:
                ks.append(sub.get(timeout=0.1).get("k"))
            except lecho.LechoError as e:
                assert e.code == "timeout"
        assert errs and "modulator says no to 3" in errs[0], errs
        assert cerrs and "modulator says no to 3" in cerrs[0], cerrs
        while len(ks) < 3:
            ks.append(sub.get(timeout=5).get("k"))
        with pytest.raises(lecho.LechoError):
            sub.get(timeout=0.5)
        assert ks == [None, 1, 2]   # the ping, then up to the failure (unloaded there)


def test_on_error_that_raises_goes_to_on_handler_error():
    with lecho.Context(quiet=True) as ctx:
        ch = ctx.channel("py.onerr.raises")
        seen = []
        ctx.on_handler_error = lambda where, exc: seen.append((where, str(exc)))

        def bad(msg):
            raise RuntimeError("on_error failed on " + msg[:0] + "purpose")
        sub = ch.subscribe(modulator=RAISES, on_error=bad)
        p = ch.producer()
        for k in range(1, 5):
            p.submit({"k": k})
        ks = []
        while len(ks) < 2:
            ks.append(sub.get(timeout=5)["k"])
        end = time.monotonic() + 5
        while not seen and time.monotonic() < end:
            ctx.run_once(0.05)
        assert ks == [1, 2]
        assert seen and seen[0][0].startswith("on_error of consumer on ") and "purpose" in seen[0][1], seen


def test_dropped_is_current_without_iterating():
    # review N3: sub.dropped counted only once the queue was iterated
    with lecho.Context(quiet=True) as ctx:
        ch = ctx.channel("py.dropped")
        sub = ch.subscribe(maxsize=2)
        p = ch.producer()
        for k in range(5):
            p.submit({"k": k})
        end = time.monotonic() + 5
        while sub.dropped < 3 and time.monotonic() < end:
            ctx.run_once(0.05)
        assert sub.dropped == 3
        assert [sub.get(timeout=5)["k"] for _ in range(2)] == [0, 1]
        assert sub.dropped == 3


def test_import_under_a_python_without_debians_packages_names_usr_bin_python3():
    # review N7: a python3 first on PATH (pyenv, a venv) without Debian's
    # cffi/NumPy: the error says which interpreter to run (here -S: no
    # dist-packages, as such an interpreter)
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    r = subprocess.run([sys.executable, "-S", "-c", "import lecho"], capture_output=True, text=True, env=env)
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert "/usr/bin/python3" in last and "python3-cffi" in last and sys.executable in last, r.stderr


# A Lua consumer of `channel` that counts its events until it has argv[3]
# of them or 40 s passed, then prints "got N".
COUNTER_LUA = """
local lecho = require "lecho"
local ctx = lecho.context{ nameserver = arg[1], quiet = true }
local n, want = 0, tonumber(arg[3])
assert(ctx:channel(arg[2]):consumer(function() n = n + 1 end))
io.stdout:write("ready\\n") io.stdout:flush()
local t = ctx:now() + 40
while n < want and ctx:now() < t do ctx:run_once(0.05) end
io.stdout:write("got ", n, "\\n") io.stdout:flush()
ctx:close()
"""

# A Python producer of argv[2] that submits argv[3] events of argv[4]
# bytes and simply ends: no close().
ENDS_WITHOUT_CLOSE_PY = """
import sys, lecho
ctx = lecho.Context(nameserver=sys.argv[1], quiet=True, linger=float(sys.argv[5]))
p = ctx.channel(sys.argv[2]).producer()
if sys.argv[6] == "connect":
    p.submit_sync({"i": 0}, timeout=20)
    print("connected", flush=True)
    sys.stdin.readline()
pad = "x" * int(sys.argv[4])
for i in range(int(sys.argv[3])):
    p.submit({"i": i, "pad": pad})
print("submitted", flush=True)
"""


def test_a_script_that_ends_without_close_delivers_what_it_submitted(nameserver, procs, tmp_path):
    # Before: the context was never closed at the interpreter's exit (its
    # __del__, if it ran at all, closed with linger 0 and said nothing):
    # a consumer got 0 of the 20000 events
    n = 20000
    cons_lua = tmp_path / "counter.lua"
    cons_lua.write_text(COUNTER_LUA)
    cons = procs.lua_script(str(cons_lua), nameserver, "py.atexit", n)
    readline(cons, "^ready")
    script = tmp_path / "prod.py"
    script.write_text(ENDS_WITHOUT_CLOSE_PY)
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    p = procs.start([sys.executable, str(script), nameserver, "py.atexit", str(n), "200", "2", "-"], env=env)
    out = rest(p, timeout=40)
    assert p.wait(10) == 0, out
    assert "submitted" in out
    assert readline(cons, r"^got (\d+)", timeout=45).group(1) == str(n)


def test_a_script_that_ends_without_close_says_what_it_could_not_deliver(nameserver, procs, tmp_path):
    # A consumer that does not read (SIGSTOP): the producer's exit is
    # bounded by its linger, and its stderr (even with quiet) names what
    # was not delivered
    n, linger = 20000, 1
    cons_lua = tmp_path / "counter.lua"
    cons_lua.write_text(COUNTER_LUA)
    cons = procs.lua_script(str(cons_lua), nameserver, "py.atexit.stopped", n + 1)
    readline(cons, "^ready")
    script = tmp_path / "prod.py"
    script.write_text(ENDS_WITHOUT_CLOSE_PY)
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    p = procs.start([sys.executable, str(script), nameserver, "py.atexit.stopped", str(n), "2000",
                     str(linger), "connect"], env=env, stdin=subprocess.PIPE)
    readline(p, "^connected")
    cons.send_signal(signal.SIGSTOP)
    try:
        p.stdin.write("go\n")
        p.stdin.flush()
        readline(p, "^submitted", timeout=30)
        t0 = time.monotonic()
        out = rest(p, timeout=30)
        took = time.monotonic() - t0
        assert p.wait(10) == 0, out
    finally:
        cons.send_signal(signal.SIGCONT)
    assert took < linger + 3, (took, out)
    said = [l for l in out if "not delivered within the linger time of 1s" in l]
    assert len(said) == 1, out
    assert "close() was not called" in said[0]


def test_a_producer_records_what_it_submits(tmp_path):
    # issue 29: Producer.record (lecho_producer_record): the file lecho
    # record writes, every event in order; None stops; an existing file refused
    path = str(tmp_path / "py.lecho")
    ctx = lecho.Context(quiet=True)
    p = ctx.channel("py.rec").producer()
    p.record(path)
    for i in range(1, 201):
        p.submit({"i": i})
    p.record(None)
    p.submit({"i": 201})
    with pytest.raises(lecho.LechoError):
        p.record(path)
    ctx.close()
    out = subprocess.run([os.environ.get("LUAJIT", "luajit"), os.path.join(ROOT, "scripts", "lecho"), "replay",
                          "--check", "--json", path], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert '"events":200' in out.stdout
