"""The findings of issue 28's outside review (a Python user, docs only):
Ctrl-C while callbacks run, a second thread, a process idle past its
peers' heartbeats, set_params on a subscription, close, stat."""
import os
import pty
import select
import signal
import sys
import textwrap
import threading
import time

import pytest

import lecho
from conftest import ROOT, LUA_ENV, readline

PYENV = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))

# A Lua producer at ~50k events/s (the review's flood), and a Lua caller
# flooding a service with call_async.
FLOOD = textwrap.dedent("""
    local lecho = require "lecho"
    local ctx = lecho.context{ nameserver = arg[1], quiet = true }
    if arg[2] == "events" then
      local p = assert(ctx:channel("flood.ch"):producer{ policy = "drop_oldest" })
      ctx:every(0.001, function() for _ = 1, 50 do p:submit({ pad = ("x"):rep(32) }) end end)
    else
      local inflight = 0
      ctx:every(0.001, function()
        for _ = 1, 20 do
          if inflight < 200 then
            inflight = inflight + 1
            ctx:call_async("flood.svc", { x = 1 }, { timeout = 5 }, function() inflight = inflight - 1 end)
          end
        end
      end)
    end
    print("flooding")
    io.stdout:flush()
    ctx:after(120, function() ctx:stop() end)
    ctx:run()
""")


class Tty:
    """A Python script on a pseudo-terminal, as in a real terminal: \\x03
    makes the terminal send SIGINT to it."""

    def __init__(self, script, *args):
        pid, fd = pty.fork()
        if pid == 0:
            try:
                signal.signal(signal.SIGINT, signal.SIG_DFL)   # as a terminal's shell leaves it
                os.execve(sys.executable, [sys.executable, str(script)] + [str(a) for a in args], PYENV)
            finally:
                os._exit(127)
        self.pid, self.fd, self.buf, self.all = pid, fd, b"", b""

    def expect(self, pattern, timeout=20):
        import re
        end = time.monotonic() + timeout
        while True:
            m = re.search(pattern.encode(), self.buf)
            if m:
                self.buf = self.buf[m.end():]
                return m
            left = end - time.monotonic()
            if left <= 0:
                raise AssertionError("no %r within %g s; got %r" % (pattern, timeout, self.buf[-2000:]))
            r, _, _ = select.select([self.fd], [], [], left)
            if r:
                try:
                    data = os.read(self.fd, 65536)
                except OSError:
                    data = b""
                if not data:
                    raise AssertionError("no %r: the script ended; got %r" % (pattern, self.buf[-2000:]))
                self.buf += data
                self.all += data

    def press_ctrl_c(self):
        os.write(self.fd, b"\x03")

    def close(self):
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(self.pid, 0)
        os.close(self.fd)


PRESSES = 10

CTRL_C_SCRIPT = textwrap.dedent("""
    import sys, lecho
    ctx = lecho.Context(nameserver=sys.argv[1], quiet=True)
    how = sys.argv[2]
    if how == "service":
        ctx.service("flood.svc", lambda args, meta: args["x"])
    else:
        ctx.channel("flood.ch").consumer(lambda ev, m: None)
    if how == "get":
        sub = ctx.channel("quiet.ch").subscribe()
    for i in range(%d):
        print("READY", i, flush=True)
        try:
            if how == "get":
                while True:
                    try:
                        sub.get(timeout=1)
                    except lecho.LechoError:
                        pass
            else:
                ctx.run(20)
            print("RETURNED normally, KI lost", i, flush=True)
        except KeyboardInterrupt:
            print("KI", i, flush=True)
    ctx.close(linger=0.5)
    print("CLOSED", flush=True)
""" % PRESSES)


@pytest.mark.parametrize("how", ["run", "get", "service"])
def test_every_ctrl_c_reaches_the_script_while_callbacks_run(nameserver, procs, tmp_path, how):
    # Review of issue 28 (BLOCKER 1): the SIGINT was delivered as a cffi
    # callback entered Python, before the trampoline's try: cffi printed
    # "Exception ignored from cffi callback" and run(20) ran its 20 s.
    flood = tmp_path / "flood.lua"
    flood.write_text(FLOOD)
    script = tmp_path / "ctrlc.py"
    script.write_text(CTRL_C_SCRIPT)
    t = Tty(script, nameserver, how)
    try:
        t.expect("READY 0")
        lua = procs.lua_script(str(flood), nameserver, "events" if how != "service" else "calls")
        readline(lua, "^flooding")
        time.sleep(1.0)             # the flood reaches the script's callbacks
        got = 0
        for i in range(PRESSES):
            if i:
                t.expect("READY %d" % i)
            time.sleep(0.5)
            t.press_ctrl_c()
            m = t.expect(r"(KI|RETURNED normally, KI lost) %d\r?\n" % i, timeout=25)
            got += m.group(1) == b"KI"
        t.expect("CLOSED")
        assert b"Exception ignored" not in t.all, t.all[-3000:]
        assert got == PRESSES, "%d of %d Ctrl-C reached the script" % (got, PRESSES)
    finally:
        t.close()


THREAD_SCRIPT = textwrap.dedent("""
    import sys, threading, time, lecho
    ctx = lecho.Context(quiet=True)
    ch = ctx.channel("thr2")
    sub = ch.subscribe()
    p = ch.producer()
    stop = [False]
    errors = []

    def other():
        tries = [lambda: p.submit({"x": 1}), lambda: p.submit_sync({"x": 1}, timeout=1),
                 lambda: sub.get(timeout=0.1), lambda: next(iter(sub)), lambda: ctx.run_once(0),
                 lambda: ctx.channel("thr3"), lambda: ch.producer(), lambda: ch.subscribe(),
                 lambda: ctx.call("x", timeout=1), lambda: ctx.stats(), lambda: p.flush(),
                 lambda: sub.close(), lambda: p.close(), lambda: ctx.close()]
        i = 0
        while not stop[0]:
            try:
                tries[i % len(tries)]()
                errors.append("no error from try %d" % (i % len(tries)))
            except lecho.LechoError as e:
                if e.code != "invalid" or "belongs to thread" not in e.message:
                    errors.append(repr(e))
            i += 1
        errors.append("tries %d" % i)

    t = threading.Thread(target=other, name="second")
    t.start()
    end = time.monotonic() + float(sys.argv[1])
    got = 0
    while time.monotonic() < end:
        try:
            sub.get(timeout=0.1)
            got += 1
        except lecho.LechoError as e:
            assert e.code == "timeout", e
    stop[0] = True
    t.join()
    p.submit({"x": 2})
    assert sub.get(timeout=2) == {"x": 2}
    ctx.close()
    print("errors", errors[:-1], errors[-1], "got", got, flush=True)
""")


def test_a_second_thread_gets_an_error_and_never_crashes_the_interpreter(procs, tmp_path):
    # Review of issue 28 (bug 3): a thread submitting while the main thread
    # waited in sub.get crashed the interpreter (exit 139, 3 of 3 runs).
    script = tmp_path / "threads.py"
    script.write_text(THREAD_SCRIPT)
    p = procs.start([sys.executable, str(script), "3"], env=PYENV)
    m = readline(p, r"^errors (.*) tries (\d+) got (\d+)", timeout=60)
    assert p.wait(20) == 0
    assert m.group(1) == "[]", m.group(1)
    assert int(m.group(2)) > 100 and m.group(3) == "0"


def test_the_thread_error_names_the_owner():
    ctx = lecho.Context(quiet=True)
    out = []
    t = threading.Thread(target=lambda: out.append(pytest.raises(lecho.LechoError, ctx.channel, "x")),
                         name="worker")
    t.start()
    t.join()
    e = out[0].value
    assert e.code == "invalid" and e.errno == lecho.CODES["invalid"]
    assert "belongs to thread %d (MainThread)" % threading.get_ident() in e.message
    assert "(worker)" in e.message
    ctx.close()


def test_a_subscription_changes_its_modulators_params(nameserver, procs):
    # Review of issue 28 (nit 9): Subscription had no set_params
    # (AttributeError): `for ev in ch.subscribe(modulator=...)` could not
    # change its modulator's params as the callback consumer can.
    mod = "function enqueue(ev) if ev.k == nil or ev.k % params.m == 0 then return ev end end"
    with lecho.Context(nameserver=nameserver, quiet=True) as ctx:
        sub = ctx.channel("py.params").subscribe(modulator=mod, params={"m": 1000})
        sub.set_params({"m": 3})
        lua = procs.lua("produce", nameserver, "py.params", 30)
        ks = []
        with sub:
            for ev in sub:
                if ev.get("final"):
                    break
                if "k" in ev:
                    ks.append(ev["k"])
        assert ks == list(range(3, 31, 3))
        assert readline(lua, r"^sync\s+(\S+)").group(1) == "true"
        with pytest.raises(lecho.LechoError) as e:
            sub.set_params({"m": 2})
        assert e.value.code == "closed"


STAT_SCRIPT = textwrap.dedent("""
    import sys, lecho
    ctx = lecho.Context(quiet=sys.argv[1] == "quiet")
    ch = ctx.channel("st")
    p = ch.producer()
    sub = ch.subscribe(maxsize=1)
    for k in range(3):
        p.submit(k)
    ctx.run_once(0.2)
    print("dropped", sub.dropped, flush=True)
    ctx.close()
""")


@pytest.mark.parametrize("quiet", ["quiet", "loud"])
def test_stat_raises_for_what_does_not_exist_and_counts_in_ints_and_quiet_is_quiet(procs, tmp_path, quiet):
    # Review of issue 28 (nit 13): stat(ch, "nope") returned -1.0, counters
    # came back as floats, and "queue full" was printed with quiet=True.
    with lecho.Context(quiet=True) as ctx:
        ch = ctx.channel("st")
        p = ch.producer()
        sub = ch.subscribe()
        p.submit(1)
        assert sub.get(timeout=5) == 1
        v = ctx.stat("st", "events_local")
        assert v == 1 and isinstance(v, int)
        assert ctx.stat(ch.name, "events_local") == 1      # the full name too
        with pytest.raises(lecho.LechoError) as e:
            ctx.stat("st", "nope")
        assert e.value.code == "notfound" and "events_local" in e.value.message
        with pytest.raises(lecho.LechoError) as e:
            ctx.stat("never.used", "events_out")
        assert e.value.code == "notfound" and "never.used" in e.value.message
    script = tmp_path / "stat.py"
    script.write_text(STAT_SCRIPT)
    p = procs.start([sys.executable, str(script), quiet], env=PYENV)
    out = []
    while True:
        line = p.lines.get(timeout=30)
        if line is None:
            break
        out.append(line)
    assert p.wait(10) == 0
    assert "dropped 2" in out, out
    assert any("queue full" in line for line in out) == (quiet == "loud"), out


STALLED_PRODUCER = textwrap.dedent("""
    local lecho = require "lecho"
    local ctx = lecho.context{ nameserver = arg[1], quiet = true }
    local p = assert(ctx:channel("stalled.ch"):producer())
    for _ = 1, 400 do
      if p:submit_sync({ ping = true }, { timeout = 2 }) then break end
      ctx:sleep(0.05)
    end
    for k = 1, 5 do p:submit({ k = k }) end
    assert(p:submit_sync({ k = 6 }, { timeout = 5 }))
    print("stalling")
    io.stdout:flush()
    os.execute("sleep 15")     -- not running its loop: it does not close its side
""")


def test_close_of_a_context_that_only_consumed_does_not_fail_for_a_stalled_producer(nameserver, procs, tmp_path):
    # Review of issue 28 (nit 11): ctx.close() raised "1 connection not
    # closed by their remote within the linger time" whenever the producer
    # was not running its loop, though this context had nothing to deliver.
    lua_file = tmp_path / "stalled.lua"
    lua_file.write_text(STALLED_PRODUCER)
    ctx = lecho.Context(nameserver=nameserver, quiet=True)
    sub = ctx.channel("stalled.ch").subscribe()
    lua = procs.lua_script(str(lua_file), nameserver)
    ks = []
    while len(ks) < 6:
        ev = sub.get(timeout=30)
        if "k" in ev:
            ks.append(ev["k"])
    sub.done()
    readline(lua, "^stalling")
    t0 = time.monotonic()
    ctx.close(0.5)                      # no exception: nothing of ours was undelivered
    assert time.monotonic() - t0 < 5
    assert ks == [1, 2, 3, 4, 5, 6] and ctx.close_error is None


IDLE_PEER = textwrap.dedent("""
    io.stdout:setvbuf("line")
    local lecho = require "lecho"
    local ctx = lecho.context{ quiet = true, heartbeat = 0.3, heartbeat_misses = 2 }
    local n = 0
    ctx:channel("idle.ch"):consumer(function(ev) if ev.x then n = n + 1; print("got", ev.x) end end)
    ctx:channel("idle.other"):consumer(function() end)
    ctx:service("idle.svc", function(a) return a.x * 2 end)
    print("ns", ctx.ns)
    io.stdout:flush()
    ctx:after(60, function() ctx:stop() end)
    ctx:run()
""")


def test_requests_after_an_idle_longer_than_the_peers_heartbeats_succeed(procs, tmp_path):
    # Review of issue 28 (bug 4): after 15 s without a loop call, the peers
    # had declared the process dead and closed; submit_sync, call and
    # producer() failed ("write: Broken pipe", then "unreachable") though
    # the peers were alive.  Here the peer's heartbeats make it drop us
    # after 0.6 s.
    peer_file = tmp_path / "peer.lua"
    peer_file.write_text(IDLE_PEER)
    peer = procs.lua_script(str(peer_file))
    ns = readline(peer, r"^ns\s+(\S+)").group(1)
    with lecho.Context(nameserver=ns, quiet=True, heartbeat=0.3, heartbeat_misses=2) as ctx:
        p = ctx.channel("idle.ch").producer()
        for _ in range(200):
            try:
                if p.submit_sync({"ping": 1}, timeout=2):
                    break
            except lecho.SyncError:
                time.sleep(0.05)
        for rnd in (1, 2):
            time.sleep(2)                   # no loop call: dropped by the peer
            t0 = time.monotonic()
            assert p.submit_sync({"x": rnd}, timeout=3) is True
            assert time.monotonic() - t0 < 2
            time.sleep(2)
            assert ctx.call("idle.svc", {"x": rnd}, timeout=3) == 2 * rnd
            time.sleep(2)
            p2 = ctx.channel("idle.other").producer()
            assert p2.submit_sync({"y": rnd}, timeout=3) is True
            p2.close()
            time.sleep(2)
            sub = ctx.channel("idle.back").subscribe()     # a join after the idle too
            sub.close()
    assert readline(peer, r"^got\s+2")


CLOSE_SCRIPT = textwrap.dedent("""
    import sys, time, lecho
    ctx = lecho.Context(nameserver=sys.argv[1], quiet=True)
    what = sys.argv[2]
    if what == "close":
        p = ctx.channel("slow.close2").producer()
        try:
            p.submit_sync({"a": 1}, timeout=0.5)    # at the slow consumer, which holds its connection
        except lecho.SyncError:
            pass
        print("closing", flush=True)
        t = time.monotonic()
        try:
            ctx.close(linger=20)
            print("closed normally %.1f" % (time.monotonic() - t), flush=True)
        except KeyboardInterrupt:
            print("KI %.1f" % (time.monotonic() - t), ctx._x is None, flush=True)
    else:   # opening a producer while the name server does not answer
        print("closing", flush=True)
        t = time.monotonic()
        try:
            ctx.channel("x").producer()
            print("opened normally %.1f" % (time.monotonic() - t), flush=True)
        except KeyboardInterrupt:
            print("KI %.1f" % (time.monotonic() - t), flush=True)
        ctx.close(0)
""")


@pytest.mark.parametrize("what", ["close", "open"])
def test_ctrl_c_interrupts_close_and_an_opening(nameserver, procs, tmp_path, what):
    # Review of issue 28 (nit 12): Ctrl-C during ctx.close(linger=20) came
    # only when close returned (18.5 s).
    script = tmp_path / "close.py"
    script.write_text(CLOSE_SCRIPT)
    if what == "close":
        procs.lua("slow", nameserver, "slow.close2")
        readline(procs.procs[-1], "^ready")
        ns = nameserver
    else:   # a name server that never answers: a listening socket nobody reads
        import socket
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen(5)
        ns = "127.0.0.1:%d" % s.getsockname()[1]
    p = procs.start([sys.executable, str(script), ns, what], env=PYENV,
                    preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    readline(p, "^closing")
    time.sleep(1.0)
    p.send_signal(signal.SIGINT)
    m = readline(p, r"^(KI|closed normally|opened normally) (\S+)", timeout=30)
    assert m.group(1) == "KI", m.group(0)
    assert float(m.group(2)) < 2.5     # SIGINT 1 s in; 4.6-5 s before the fix
    assert p.wait(10) == 0
