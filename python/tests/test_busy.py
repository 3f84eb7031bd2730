"""The Python consumer when every core is busy (two spinning processes, as
the busted specs do): a Lua producer at full rate, Python consumers as a
callback and as an iterator, events in order and each once, the sync final
event answered only once its handler ran; large arrays keep their values."""
import time

import pytest

import lecho
from conftest import readline


@pytest.mark.parametrize("style", ["callback", "iterator"])
def test_full_rate_on_busy_cores_every_event_in_order_once(nameserver, procs, busy, style):
    n = 30000
    with lecho.Context(nameserver=nameserver, quiet=True) as ctx:
        ch = ctx.channel("py.busy." + style)
        ks = []
        final = []
        if style == "callback":
            def on(ev, meta):
                if ev.get("final"):
                    final.append(meta.seq)
                elif "k" in ev:
                    ks.append(ev["k"])
            ch.consumer(on)
            lua = procs.lua("produce", nameserver, ch.name, n)
            deadline = 120
            t0 = time.monotonic()
            while not final and time.monotonic() - t0 < deadline:
                ctx.run_once(0.05)
        else:
            sub = ch.subscribe(meta=True)
            lua = procs.lua("produce", nameserver, ch.name, n)
            with sub:
                for ev, meta in sub:
                    if ev.get("final"):
                        final.append(meta.seq)
                        break
                    if "k" in ev:
                        ks.append(ev["k"])
        assert final, "the final event never came"
        assert ks == list(range(1, n + 1))
        # the producer's sync final returned true: the handler ran
        assert readline(lua, r"^sync\s+(\S+)", timeout=60).group(1) == "true"


def test_large_arrays_on_busy_cores_keep_their_values(nameserver, procs, busy):
    n, nbytes = 20, 4 << 20
    with lecho.Context(nameserver=nameserver, quiet=True) as ctx:
        sub = ctx.channel("py.busy.big").subscribe()
        lua = procs.lua("big", nameserver, "py.busy.big", n, nbytes)
        held = []
        with sub:
            for ev in sub:
                if ev.get("final"):
                    break
                if "k" in ev:
                    held.append((ev["k"], ev["field"]))
        assert [k for k, _ in held] == list(range(1, n + 1))
        for k, a in held:      # every held array still has its own values
            assert a.nbytes == nbytes
            assert a[0] == k * 1e7 and a[-1] == k * 1e7 + (nbytes // 8 - 1)
        assert readline(lua, r"^sync\s+(\S+)", timeout=60).group(1) == "true"
