"""Recording from Python as from Lua (issue 28, fourth and fifth reviews'
nit): ch.producer(record=...) was a TypeError (only p.record(path)), and
ctx:recorder's options (append, max_bytes, keep, policy, flush, stats)
had no Python form.  Each file is read back with `lecho replay --check`."""
import json
import os
import subprocess

import pytest

import lecho
from conftest import ROOT


def check(path):
    """`lecho replay --check --json path`: its summary (a dict)."""
    out = subprocess.run([os.environ.get("LUAJIT", "luajit"), os.path.join(ROOT, "scripts", "lecho"), "replay",
                          "--check", "--json", path], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_producer_record_option_a_file_of_its_own(tmp_path):
    path = str(tmp_path / "own.lecho")
    with lecho.Context(quiet=True) as ctx:
        p = ctx.channel("pyrec.own").producer(record=path)
        for i in range(1, 101):
            p.submit({"i": i})
        p.close()
    assert check(path)["events"] == 100


def test_producer_record_option_refused_closes_the_producer(tmp_path):
    path = tmp_path / "exists.lecho"
    path.write_bytes(b"x")
    with lecho.Context(quiet=True) as ctx:
        with pytest.raises(lecho.LechoError):
            ctx.channel("pyrec.refused").producer(record=str(path))
        with pytest.raises(TypeError):
            ctx.channel("pyrec.refused").producer(record=42)


def test_a_recorder_shared_flush_stats_close(tmp_path):
    path = str(tmp_path / "shared.lecho")
    with lecho.Context(quiet=True) as ctx:
        rec = ctx.recorder(path, policy="block", buffer_bytes=1 << 20, fsync=True)
        a = ctx.channel("pyrec.a").producer(record=rec)
        b = ctx.channel("pyrec.b").producer()
        b.record(rec)
        for i in range(1, 51):
            a.submit({"i": i})
            b.submit({"i": i})
        rec.flush(fsync=True)
        st = rec.stats()
        assert st["events"] == 100 and st["submitted"] == 100 and st["dropped"] == 0, st
        b.record(None)
        b.submit({"i": 51})
        last = rec.close()
        assert last["events"] == 100, last
        assert rec.stats()["events"] == 100
        with pytest.raises(lecho.LechoError) as e:
            rec.flush()
        assert e.value.code == "closed"
        with pytest.raises(lecho.LechoError):
            a.record(rec)
    assert check(path)["events"] == 100


def test_recorder_append_and_rotation(tmp_path):
    path = str(tmp_path / "app.lecho")
    with lecho.Context(quiet=True) as ctx:
        p = ctx.channel("pyrec.app").producer(record=ctx.recorder(path))
        for i in range(1, 11):
            p.submit({"i": i})
    with lecho.Context(quiet=True) as ctx:
        with pytest.raises(lecho.LechoError):
            ctx.recorder(path)                      # exists, no append
        rec = ctx.recorder(path, append=True)
        p = ctx.channel("pyrec.app").producer(record=rec)
        for i in range(11, 21):
            p.submit({"i": i})
    assert check(path)["events"] == 20
    rot = str(tmp_path / "rot.lecho")
    with lecho.Context(quiet=True) as ctx:
        rec = ctx.recorder(rot, max_bytes=20000, keep=2)
        p = ctx.channel("pyrec.rot").producer(record=rec)
        for i in range(1, 201):
            p.submit({"i": i, "pad": "r" * 500})
        rec.flush()
        assert rec.stats()["rotations"] >= 2, rec.stats()
    assert os.path.exists(rot + ".1")


def test_recorder_options_checked(tmp_path):
    with lecho.Context(quiet=True) as ctx:
        with pytest.raises(lecho.LechoError) as e:
            ctx.recorder(str(tmp_path / "bad.lecho"), policy="sometimes")
        assert "policy" in e.value.message
        with pytest.raises(lecho.LechoError):
            ctx.recorder(str(tmp_path / "bad.lecho"), buffer_bytes=10)
