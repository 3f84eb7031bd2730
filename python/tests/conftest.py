"""Fixtures of the Python package's tests: real processes (a Lua name
server, Lua producers, consumers and servers: peer.lua) on 127.0.0.1."""
import json
import os
import queue
import re
import subprocess
import sys
import threading
import time

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))
LUA_ENV = dict(os.environ,
               LUA_PATH="%s/lua/?.lua;%s/lua/?/init.lua;;" % (ROOT, ROOT),
               LUA_CPATH="%s/lua/?.so;;" % ROOT, LECHO_ROOT=ROOT)
PEER = os.path.join(ROOT, "python", "tests", "peer.lua")
LECHO = [os.environ.get("LUAJIT", "luajit"), os.path.join(ROOT, "scripts", "lecho")]


class Procs:
    """Child processes, killed at the end of the test (none left running).
    A thread per child reads its output into p.lines (a queue)."""

    def __init__(self):
        self.procs = []

    def start(self, argv, **kw):
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=kw.pop("env", LUA_ENV), **kw)
        p.lines = queue.Queue()

        def pump():
            for line in p.stdout:
                p.lines.put(line.rstrip("\n"))
            p.lines.put(None)
        threading.Thread(target=pump, daemon=True).start()
        self.procs.append(p)
        return p

    def lua(self, *args):
        return self.start(["luajit", PEER] + [str(a) for a in args])

    def lua_script(self, path, *args):
        return self.start(["luajit", path] + [str(a) for a in args])

    def lua_source(self, path, src, *args):
        """Writes the Lua source src to path (a pathlib.Path) and starts it."""
        path.write_text(src)
        return self.lua_script(str(path), *args)

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()


def readline(p, pattern, timeout=20):
    """The first line of p's output matching pattern (a regex): its match."""
    end = time.monotonic() + timeout
    seen = []
    while True:
        try:
            line = p.lines.get(timeout=max(0.01, end - time.monotonic()))
        except queue.Empty:
            line = None
        if line is None:
            break
        seen.append(line)
        m = re.search(pattern, line)
        if m:
            return m
    raise AssertionError("no line matching %r; got: %r" % (pattern, seen))


def rest(p, timeout=20):
    """The lines p prints until it exits."""
    out = []
    end = time.monotonic() + timeout
    while True:
        line = p.lines.get(timeout=max(0.01, end - time.monotonic()))
        if line is None:
            return out
        out.append(line)


@pytest.fixture
def procs():
    ps = Procs()
    yield ps
    ps.close()


@pytest.fixture
def busy():
    """Two processes spinning for the test's length (the cores busy, as a
    user's may be), killed after it."""
    spin = [subprocess.Popen(["luajit", "-e", "while true do end"]) for _ in range(2)]
    yield spin
    for p in spin:
        p.kill()
        p.wait()


@pytest.fixture
def nameserver(procs):
    """A Lua name server process: its address."""
    p = procs.start(["luajit", os.path.join(ROOT, "scripts", "lecho-nameserver"),
                     "--listen", "127.0.0.1:0"])
    return readline(p, r"^lecho-nameserver: listening on (\S+)$").group(1)


def consumers(ns, name):
    """The consumers `lecho ls --json` lists for channel name."""
    out = subprocess.run(LECHO + ["ls", "--json", "--nameserver", ns], env=LUA_ENV,
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    for line in out.stdout.splitlines():
        e = json.loads(line)
        if e["channel"] == "%s/%s" % (ns, name):
            return e["consumers"]
    return []
