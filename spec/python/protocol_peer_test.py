"""doc/protocol.md against the code, from another language: a consumer
written from the page in Python's standard library (spec/python/wire.py)
does the protected-mode handshake with a Lua name server, looks a channel
up, joins it, and takes the events of a Lua producer (python/tests/peer.lua),
answering its sync events.  Also: the version-1 HELLO gets the ERROR the
page shows."""
import os
import re
import socket
import struct
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "python", "tests"))

import wire  # noqa: E402
from conftest import Procs, readline, rest  # noqa: E402,F401

NS_LINE = r"^lecho-nameserver: listening on (\S+)$"


@pytest.fixture
def procs():
    ps = Procs()
    yield ps
    ps.close()


@pytest.fixture
def nameserver(procs):
    p = procs.start(["luajit", os.path.join(ROOT, "scripts", "lecho-nameserver"),
                     "--listen", "127.0.0.1:0"])
    return readline(p, NS_LINE).group(1)


def page_examples():
    """The blocks marked `hex NAME` of doc/protocol.md: name -> bytes."""
    text = open(os.path.join(ROOT, "doc", "protocol.md")).read()
    return {m.group(1): bytes.fromhex(m.group(2))
            for m in re.finditer(r"```hex (\S+)\n(.*?)```", text, re.S)}


def test_the_pages_protected_mode_examples_parse_and_rebuild():
    ex = page_examples()
    # HELLO / HELLO_OK: rebuilt byte for byte from the fields the page names
    assert ex["hello"] == wire.frame(wire.HELLO, wire.hello_body("127.0.0.1:7701", 1234))
    assert ex["hello_ok"] == wire.frame(wire.HELLO_OK, wire.hello_body("127.0.0.1:7700", 5678))
    assert ex["hello_v1"] == wire.frame(wire.HELLO, wire.hello_body("127.0.0.1:7701", 1234, version=1))
    assert wire.parse_hello(ex["hello"][5:]) == {"version": 3, "incarnation": 1234,
                                                 "addr": "127.0.0.1:7701", "mode": 0}
    assert ex["error"] == wire.frame(wire.ERROR, b"protocol version mismatch: peer speaks 1, this side speaks 3")
    name = b"127.0.0.1:7700/temp"
    assert ex["bind"] == wire.frame(wire.BIND, wire.varint(1) + wire.varint(len(name)) + name + b"\0")
    assert ex["event"] == wire.frame(wire.EVENT, bytes([1, 1, 1, 7]) + wire.encode(21.5))
    assert ex["ack"] == wire.frame(wire.ACK, wire.varint(7) + wire.varint(1))
    errs = wire.decode(ex["ack_errors"][7:])
    assert ex["ack_errors"][5:7] == bytes([8, 1])
    assert errs == {1: {"consumer": "127.0.0.1:7701", "err": "boom"}}  # a peer of before codes
    coded = wire.decode(ex["ack_errors_code"][7:])
    assert ex["ack_errors_code"][5:7] == bytes([8, 1])
    assert coded == {1: {"consumer": "127.0.0.1:7701", "err": "boom", "code": "failed"}}
    assert ex["heartbeat"] == wire.frame(wire.HEARTBEAT) and ex["ping"] == wire.frame(wire.PING)
    lookup = {"rid": 1, "op": "lookup", "ch": "127.0.0.1:7700/temp"}
    assert ex["ctrl_lookup"] == wire.frame(wire.CTRL, wire.encode(lookup))
    assert wire.decode(ex["ctrl_lookup"][5:]) == lookup


def read_frame(c):
    while True:
        fs = c.frames()
        if fs:
            return fs[0]
        if not c.fill():
            raise ConnectionError("closed before a frame")


def test_the_array_example_of_wire_format():
    text = open(os.path.join(ROOT, "doc", "wire-format.md")).read()
    m = re.search(r"```[^\n]*\n07 03 3c 69 32.*?```", text, re.S)
    hexes = "".join(re.findall(r"^((?:[0-9a-f]{2} ?)+)", m.group(0).strip("`\n"), re.M))
    assert wire.decode(bytes.fromhex(hexes)) == ("<i2", (2, 3), [1, 2, 3, 4, 5, 6])


def test_version_1_hello_gets_the_documented_error(nameserver):
    host, port = nameserver.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=5)
    s.sendall(wire.frame(wire.HELLO, wire.hello_body("127.0.0.1:7701", 1234, version=1)))
    ftype, body = read_frame(wire.Conn(s))
    assert ftype == wire.ERROR
    assert body.decode() == "protocol version mismatch: peer speaks 1, this side speaks 3"
    s.close()


def test_a_stdlib_consumer_receives_a_lua_producers_events(nameserver, procs):
    peer = wire.Consumer(nameserver)
    try:
        full = peer.subscribe("wire.doc")
        n = 50
        lua = procs.lua("produce", nameserver, "wire.doc", n)
        end = time.monotonic() + 30
        while time.monotonic() < end and not any(
                isinstance(v, dict) and v.get("final") for _, _, _, _, v in peer.events):
            peer.poll(0.05)
        assert readline(lua, r"^sync\s+(\S+)").group(1) == "true"
        data = [(ch, pid, seq, sync, v) for ch, pid, seq, sync, v in peer.events if not v.get("ping")]
        assert [v["k"] for _, _, _, _, v in data[:-1]] == list(range(1, n + 1))
        assert all(ch == full for ch, *_ in data)
        seqs = [seq for _, _, seq, _, _ in peer.events]
        assert seqs == list(range(1, len(seqs) + 1))          # one producer, from 1, by one
        assert all(v["pad"] == "x" * 48 for *_, v in data[:-1])
        assert data[-1][3] != 0 and data[-1][4] == {"final": True}  # the sync one, ACKed by us
        assert not [m for m in peer.log if isinstance(m, tuple)], peer.log  # no ERROR came
    finally:
        peer.close()
