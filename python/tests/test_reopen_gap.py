"""A consumer closed and opened again at once from Python sees no false gap
(issue 28; spec/reopen_gap_spec.lua does it from Lua): 30 times, while a
producer process submits fast, c.close() then ch.consumer(...) at once.
Before, the events the producer had sent before it handled the leave became
the sequence's baseline after the reopen, and the first event it sent after
it took this context back was counted as a gap of the events submitted while
it was no member: "gap from ..." logged and stats()["channels"][...]["lost"]
> 0.  After: 0 lost, no gap line, and in each cycle every event submitted after
the open returned arrives, in order (those sent before the producer handled
the leave may come first: delivered, not counted)."""
import textwrap
import time

from conftest import readline

PRODUCER = textwrap.dedent("""
    io.stdout:setvbuf("line")
    local lecho = require "lecho"
    local socket = require "socket"
    local ns, name, secs = arg[1], arg[2], tonumber(arg[3])
    local ctx = lecho.context{ nameserver = ns, quiet = true }
    local p = assert(ctx:channel(name):producer())
    print("ready")
    local n, tp, t_end = 0, 0, socket.gettime() + secs
    while socket.gettime() < t_end do
      for _ = 1, 20 do
        n = n + 1
        local t = socket.gettime()
        p:submit({ n = n, t = t, tp = tp })
        tp = t
      end
      ctx:run_once(0)
    end
    print("done", n)
    ctx:close()
""")


def test_close_and_reopen_counts_no_false_gap(nameserver, procs, tmp_path, capfd):
    import lecho
    name = "pyreopen"
    (tmp_path / "producer.lua").write_text(PRODUCER)
    prod = procs.lua_script(str(tmp_path / "producer.lua"), nameserver, name, 30)
    readline(prod, "^ready$")
    ctx = lecho.Context(nameserver=nameserver)     # its log on stderr (capfd)
    ch = ctx.channel(name)
    received, holes, late = 0, [], []
    for k in range(30):
        got = []
        c = ch.consumer(lambda ev, meta: got.append(ev))
        t_open = time.time()       # (the producer's socket.gettime(): the same clock)
        end = time.monotonic() + 0.05
        while time.monotonic() < end:
            ctx.run_once(0.01)
        c.close()                  # the main line: the leave goes now
        received += len(got)
        # from the first event submitted after the open returned (the one
        # before it submitted before), each number once, none skipped
        after = [e for e in got if e["t"] > t_open]
        if after:
            if after[0]["tp"] > t_open:
                late.append((k, after[0]["n"]))
            holes += [(k, a["n"], b["n"]) for a, b in zip(after, after[1:]) if b["n"] != a["n"] + 1]
    st = ctx.stats()["channels"]["%s/%s" % (nameserver, name)]
    ctx.close()
    gaps = [m for m in capfd.readouterr().err.splitlines() if "gap from" in m]
    assert received > 500, received
    assert st["lost"] == 0, (st, gaps[:3])
    assert st["gaps"] == 0, (st, gaps[:3])
    assert gaps == []
    assert holes == [], holes[:3]
    assert late == [], late[:3]
