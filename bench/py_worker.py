#!/usr/bin/python3
"""bench/py_worker.py: bench/worker.lua's role for the Python package: one
consumer process that counts the events of its channels and reports on
"report", so that bench/run.lua compares a Python consumer with a Lua one
in the same run.

    python3 bench/py_worker.py '<json options>'     (PYTHONPATH: the checkout's python/)

Options as worker.lua's: ns, id, parent, bound, subs = [{ group, channels }]
(one sub; relay_to, prefix/n and buffer are not supported here).  Events
are taken with a Subscription (the iterator: batches, no Python call per
event in the library); control events { bench_ctl = "reset" | "end",
phase } as worker.lua.  Times: CLOCK_MONOTONIC (time.monotonic), the
clock of bench/common.lua."""
import json
import os
import sys
import time

import lecho


def is_ctl(ev):
    """A control event { bench_ctl = ... } (an event of the run: a string,
    or a dict of arrays)."""
    return ev.__class__ is dict and "bench_ctl" in ev


def main():
    opts = json.loads(sys.argv[1])
    ctx = lecho.Context(nameserver=opts["ns"], quiet=True, timeout=20)
    rep = ctx.channel("report").producer()
    wid = opts["id"]
    (sub_opts,) = opts.get("subs") or [None]
    if sub_opts is None or len(sub_opts.get("channels", [])) != 1:
        sys.exit("py_worker: one sub with one channel")
    group = sub_opts["group"]
    sub = ctx.channel(sub_opts["channels"][0]).subscribe(maxsize=1 << 20)
    rep.submit_sync({"id": wid, "ready": True, "pid": os.getpid()}, timeout=20)
    parent, end = opts.get("parent"), time.monotonic() + opts.get("bound", 300)
    count, t_first = 0, None
    next_check = time.monotonic() + 0.2
    while True:
        try:
            ev = sub.get(timeout=0.2)
        except lecho.LechoError as e:
            if e.code != "timeout":
                raise
            ev = None
        if ev is not None and not is_ctl(ev):
            count += 1
            if count == 1:
                t_first = time.monotonic()
            # a burst: take what is already queued without a clock read
            q = sub._q
            while q:
                ev = q.popleft()
                # is_ctl inline: a Lua worker's check is inline too
                if ev.__class__ is dict and "bench_ctl" in ev:
                    break
                count += 1
            else:
                ev = None   # let go of the last event (its arrays) before waiting
                continue
        if is_ctl(ev):
            op = ev["bench_ctl"]
            if op == "reset":
                count, t_first = 0, None
            elif op == "end":
                rep.submit({"id": wid, "group": group, "count": count, "t_first": t_first,
                            "t_last": time.monotonic() if count else None, "phase": ev.get("phase")})
                rep.flush()
        now = time.monotonic()
        if now > next_check:
            next_check = now + 0.2
            if now > end or (parent and not os.path.exists("/proc/%d" % parent)):
                break
    ctx.close(1)


if __name__ == "__main__":
    main()
