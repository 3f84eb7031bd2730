"""spec/python/wire.py: a lecho peer (protocol version 3) written from
doc/protocol.md and doc/wire-format.md alone, in Python's standard library (socket, struct,
selectors): the value format, frames, the protected-mode handshake, and a
consumer's control flow (lookup, join, BIND/EVENT/ACK, PING/HEARTBEAT).
It exists so that the documents cannot drift from the code: when a test
of spec/python/protocol_peer_test.py fails, the page or the code is wrong.
Nothing here imports lecho."""
import random
import selectors
import socket
import struct
import time

# -- doc/wire-format.md "Values" --------------------------------------------
T_NIL, T_FALSE, T_TRUE, T_INT, T_DOUBLE, T_STRING, T_TABLE, T_ARRAY = range(8)
DTYPES = {"<u1": "B", "|u1": "B", "<i1": "b", "|i1": "b", "<u2": "H", "<i2": "h", "<u4": "I", "<i4": "i",
          "<u8": "Q", "<i8": "q", "<f4": "f", "<f8": "d"}


def varint(u):
    out = bytearray()
    while True:
        b = u & 0x7F
        u >>= 7
        if u:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def read_varint(buf, pos):
    u = shift = 0
    for i in range(10):
        if pos >= len(buf):
            raise ValueError("truncated input")
        b = buf[pos]
        pos += 1
        if i == 9 and b > 1:
            raise ValueError("invalid varint")
        u |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return u, pos
    raise ValueError("invalid varint")


def encode(v):
    """One value: None, bool, int/float (an integral |x| <= 2**53 as the
    integer tag), str/bytes, list (array part), dict (pairs)."""
    if v is None:
        return bytes([T_NIL])
    if v is True or v is False:
        return bytes([T_TRUE if v else T_FALSE])
    if isinstance(v, (int, float)):
        x = float(v)
        if x == int(x) and abs(x) <= 2 ** 53 and not (x == 0 and str(x).startswith("-")):
            n = int(x)
            return bytes([T_INT]) + varint(((n << 1) ^ (n >> 63)) & (2 ** 64 - 1))
        return bytes([T_DOUBLE]) + struct.pack("<d", x)
    if isinstance(v, str):
        v = v.encode()
    if isinstance(v, bytes):
        return bytes([T_STRING]) + varint(len(v)) + v
    if isinstance(v, list):
        return bytes([T_TABLE]) + varint(len(v)) + varint(0) + b"".join(encode(x) for x in v)
    if isinstance(v, dict):
        body = b"".join(encode(k) + encode(x) for k, x in v.items())
        return bytes([T_TABLE]) + varint(0) + varint(len(v)) + body
    raise TypeError(type(v))


def decode(buf):
    """The one value buf holds (strings as str when UTF-8, else bytes;
    tables as dicts, the array part under keys 1..narr)."""
    v, pos = _dec(buf, 0, 0)
    if pos != len(buf):
        raise ValueError("trailing garbage after value (%d bytes)" % (len(buf) - pos))
    return v


def _dec(buf, pos, depth):
    if pos >= len(buf):
        raise ValueError("truncated input")
    tag = buf[pos]
    pos += 1
    if tag == T_NIL:
        return None, pos
    if tag in (T_FALSE, T_TRUE):
        return tag == T_TRUE, pos
    if tag == T_INT:
        u, pos = read_varint(buf, pos)
        return (u >> 1) ^ -(u & 1), pos
    if tag == T_DOUBLE:
        if pos + 8 > len(buf):
            raise ValueError("truncated input")
        return struct.unpack_from("<d", buf, pos)[0], pos + 8
    if tag == T_STRING:
        n, pos = read_varint(buf, pos)
        if pos + n > len(buf):
            raise ValueError("truncated input")
        s = bytes(buf[pos:pos + n])
        try:
            s = s.decode()
        except UnicodeDecodeError:
            pass
        return s, pos + n
    if tag == T_TABLE:
        if depth >= 100:
            raise ValueError("nesting too deep (limit 100)")
        narr, pos = read_varint(buf, pos)
        nhash, pos = read_varint(buf, pos)
        if narr + 2 * nhash > len(buf) - pos:
            raise ValueError("table count exceeds input")
        t = {}
        for i in range(1, narr + 1):
            x, pos = _dec(buf, pos, depth + 1)
            if x is not None:
                t[i] = x
        for _ in range(nhash):
            k, pos = _dec(buf, pos, depth + 1)
            x, pos = _dec(buf, pos, depth + 1)
            if k is None or k != k:
                raise ValueError("nil or NaN table key")
            if isinstance(k, dict):
                k = tuple(sorted(k.items(), key=repr))
            if x is not None:
                t[k] = x
        return t, pos
    if tag == T_ARRAY:
        # an array: (dtype, shape, flat list of elements), row-major
        n, pos = read_varint(buf, pos)
        dtype = bytes(buf[pos:pos + n]).decode()
        pos += n
        if dtype not in DTYPES:
            raise ValueError("unknown dtype %r" % dtype)
        ndim, pos = read_varint(buf, pos)
        if ndim > 8:
            raise ValueError("array of %d dims" % ndim)
        shape = []
        for _ in range(ndim):
            d, pos = read_varint(buf, pos)
            shape.append(d)
        nbytes, pos = read_varint(buf, pos)
        code = DTYPES[dtype]
        count = 1
        for d in shape:
            count *= d
        if nbytes != count * struct.calcsize(code) or pos + nbytes > len(buf):
            raise ValueError("array byte length %d for %s %r" % (nbytes, dtype, shape))
        elems = list(struct.unpack_from("<%d%s" % (count, code), buf, pos))
        return (dtype, tuple(shape), elems), pos + nbytes
    raise ValueError("unknown tag 0x%02x at byte %d" % (tag, pos - 1))


# -- doc/protocol.md section 2: frames ----------------------------------------
HELLO, HELLO_OK, ERROR, CTRL, BIND, EVENT, ACK, HEARTBEAT, PING = range(1, 10)
VERSION = 3


def frame(ftype, body=b""):
    return struct.pack("<IB", len(body) + 1, ftype) + body


def hello_body(addr, incarnation, version=VERSION, mode=0):
    a = addr.encode()
    body = b"LECH" + struct.pack(">H", version) + varint(incarnation) + varint(len(a)) + a
    return body + bytes([mode]) if version >= 2 else body


def parse_hello(body):
    if body[:4] != b"LECH":
        raise ValueError("bad magic")
    version = struct.unpack_from(">H", body, 4)[0]
    inc, pos = read_varint(body, 6)
    n, pos = read_varint(body, pos)
    addr = body[pos:pos + n].decode()
    return {"version": version, "incarnation": inc, "addr": addr, "mode": body[pos + n]}


class Conn:
    """One connection: a byte buffer cut into frames."""

    def __init__(self, sock, peer=None):
        self.sock = sock
        self.buf = bytearray()
        self.peer = peer
        self.up = False
        self.binds = {}
        self.last_write = time.monotonic()

    def send(self, ftype, body=b""):
        self.sock.sendall(frame(ftype, body))
        self.last_write = time.monotonic()

    def frames(self):
        """The complete frames read so far: (type, body) each."""
        out = []
        while len(self.buf) >= 5:
            length, ftype = struct.unpack_from("<IB", self.buf, 0)
            if length < 1:
                raise ValueError("frame length 0")
            if len(self.buf) < 4 + length:
                break
            out.append((ftype, bytes(self.buf[5:4 + length])))
            del self.buf[:4 + length]
        return out

    def fill(self):
        data = self.sock.recv(65536)
        if not data:
            return False
        self.buf += data
        return True


class Consumer:
    """A consuming context: listens at its advertised address (producers
    dial it), talks to the name server and the channel's manager."""

    def __init__(self, nameserver):
        self.ns = nameserver
        self.sel = selectors.DefaultSelector()
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(16)
        self.lsock.setblocking(False)
        self.addr = "127.0.0.1:%d" % self.lsock.getsockname()[1]
        self.incarnation = random.randrange(1, 2 ** 31)
        self.sel.register(self.lsock, selectors.EVENT_READ, None)
        self.conns = {}      # address dialled -> Conn
        self.rid = 0
        self.replies = {}
        self.events = []     # (channel, producer id, seq, sync id, value)
        self.log = []

    # -- dialling: HELLO, HELLO_OK --
    def dial(self, addr):
        if addr in self.conns:
            return self.conns[addr]
        host, port = addr.rsplit(":", 1)
        s = socket.create_connection((host, int(port)), timeout=5)
        c = Conn(s, addr)
        c.send(HELLO, hello_body(self.addr, self.incarnation))
        ftype, body = self._wait_frame(c)
        if ftype == ERROR:
            raise ConnectionError("refused: " + body.decode())
        assert ftype == HELLO_OK, ftype
        h = parse_hello(body)
        assert h["version"] == VERSION and h["mode"] == 0 and h["addr"] == addr, h
        c.up = True
        s.setblocking(False)
        self.sel.register(s, selectors.EVENT_READ, c)
        self.conns[addr] = c
        return c

    def _wait_frame(self, c):
        while True:
            fs = c.frames()
            if fs:
                # frames after the first stay in the buffer for the loop
                for ftype, body in reversed(fs[1:]):
                    c.buf[:0] = frame(ftype, body)
                return fs[0]
            if not c.fill():
                raise ConnectionError("closed during handshake")

    # -- control requests --
    def request(self, addr, msg, timeout=15):
        self.rid += 1
        rid = self.rid
        msg = dict(msg, rid=rid)
        self.dial(addr).send(CTRL, encode(msg))
        end = time.monotonic() + timeout
        while rid not in self.replies:
            if time.monotonic() > end:
                raise TimeoutError("no reply to %r" % msg)
            self.poll(0.1)
        return self.replies.pop(rid)

    def subscribe(self, channel):
        """lookup at the name server, join at the manager as a consumer."""
        full = "%s/%s" % (self.ns, channel)
        r = self.request(self.ns, {"op": "lookup", "ch": full})
        assert r.get("ok") is True, r
        manager = r["manager"]
        r = self.request(manager, {"op": "join", "ch": full, "role": "consumer",
                                   "subs": {"plain": True}})
        assert r.get("ok") is True, r
        return full

    # -- the loop --
    def poll(self, timeout):
        for key, _ in self.sel.select(timeout):
            if key.data is None:
                s, _ = self.lsock.accept()
                s.setblocking(True)
                c = Conn(s)
                self.sel.register(s, selectors.EVENT_READ, c)
                continue
            c = key.data
            try:
                alive = c.fill()
            except (BlockingIOError, InterruptedError):
                continue
            except ConnectionError:
                alive = False
            for ftype, body in c.frames():
                self._handle(c, ftype, body)
            if not alive:
                self.sel.unregister(c.sock)
                c.sock.close()
                self.conns = {a: x for a, x in self.conns.items() if x is not c}
        for c in list(self.conns.values()):
            if time.monotonic() - c.last_write > 2:
                c.send(HEARTBEAT)

    def _handle(self, c, ftype, body):
        if not c.up:  # an accepted connection: the dialler's HELLO first
            assert ftype == HELLO, ftype
            h = parse_hello(body)
            assert h["version"] == VERSION and h["mode"] == 0, h
            c.peer = h["addr"]
            c.send(HELLO_OK, hello_body(self.addr, self.incarnation))
            c.up = True
            return
        if ftype == CTRL:
            msg = decode(body)
            if msg.get("op") == "reply":
                self.replies[msg["rid"]] = msg
            else:
                self.log.append(msg)
        elif ftype == BIND:
            idx, pos = read_varint(body, 0)
            n, pos = read_varint(body, pos)
            c.binds[idx] = body[pos:pos + n].decode()
            assert body[pos + n] == 0  # has_ticket: protected mode
        elif ftype == EVENT:
            idx, pos = read_varint(body, 0)
            pid, pos = read_varint(body, pos)
            seq, pos = read_varint(body, pos)
            sync, pos = read_varint(body, pos)
            value = decode(body[pos:])
            self.events.append((c.binds[idx], pid, seq, sync, value))
            if sync:
                c.send(ACK, varint(sync) + varint(1))  # one handler ran, no errors
        elif ftype == PING:
            c.send(HEARTBEAT)
        elif ftype == ERROR:
            self.log.append(("ERROR", body.decode()))
        elif ftype in (HEARTBEAT, ACK):
            pass
        else:
            raise ValueError("unexpected frame type %d" % ftype)

    def close(self):
        for c in self.conns.values():
            c.sock.close()
        self.lsock.close()
        self.sel.close()
