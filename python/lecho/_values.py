"""lecho._values: events as Python values, through lecho.h's nodes.

A whole value crosses the C API in one call each way (lecho_nodes,
lecho_set_nodes): the C side walks the Lua value, this side walks a flat
array of nodes in pre-order.  No byte of the wire format is read or
written here: the codec stays liblecho's.

Python -> event:  None -> nil, bool -> boolean, int and float -> number (a
double: an int of magnitude above 2**53 is refused, it would be rounded),
str -> string (UTF-8), bytes/bytearray/memoryview -> string (the bytes),
dict -> table (keys: str, bytes, int, float, bool), list and tuple -> Lua
array (1-based), a NumPy array -> a Lua array of its elements (.tolist()).

Event -> Python:  nil -> None, boolean -> bool, number -> int when it is
integral and exact (|x| <= 2**53), else float, string -> str when it is
valid UTF-8, else bytes (raw=True: always bytes), table -> list when its keys
are exactly 1..n (n >= 1), else dict (an empty table is {}).
"""
from ._ffi import ffi, lib

TNIL, TBOOLEAN, TNUMBER, TSTRING, TTABLE = (lib.LECHO_TNIL, lib.LECHO_TBOOLEAN, lib.LECHO_TNUMBER,
                                            lib.LECHO_TSTRING, lib.LECHO_TTABLE)
_EXACT = 2.0 ** 53
_MAX_DEPTH = 200
NULL = ffi.NULL

try:  # optional: only to recognise arrays
    import numpy as _np
except ImportError:  # pragma: no cover
    _np = None


def _number(x):
    if x == x and -_EXACT <= x <= _EXACT and x == int(x):
        return int(x)
    return x


def from_nodes(nodes, count, raw=False):
    """The Python value of count nodes (a lecho_node array)."""
    pos = 0
    unpack = ffi.unpack

    def walk():
        nonlocal pos
        nd = nodes[pos]
        pos += 1
        t = nd.type
        if t == TSTRING:
            b = unpack(nd.str, nd.n)
            if raw:
                return b
            try:
                return b.decode("utf-8")
            except UnicodeDecodeError:
                return b
        if t == TNUMBER:
            return _number(nd.num)
        if t == TTABLE:
            n, ln = nd.n, nd.len
            if n == ln and ln > 0:
                return [walk() for _ in range(ln)]
            d = {}
            for i in range(1, ln + 1):
                d[i] = walk()
            for _ in range(n - ln):
                k = walk()
                if isinstance(k, list):  # a table as key: no Python equivalent
                    k = tuple(k)
                elif isinstance(k, dict):
                    k = tuple(sorted(k.items(), key=repr))
                d[k] = walk()
            return d
        if t == TBOOLEAN:
            return nd.num != 0
        return None

    value = walk()
    if pos != count:
        raise ValueError("lecho: %d nodes left over" % (count - pos))
    return value


def read(v, raw=False, key=NULL):
    """The Python value a lecho_value handle holds (raises LechoError)."""
    nodes = ffi.new("lecho_node **")
    count = ffi.new("size_t *")
    rc = lib.lecho_nodes(v, key, nodes, count)
    if rc != 0:
        return rc
    return from_nodes(nodes[0], count[0], raw), None


class Nodes:
    """The nodes of a Python value, and the buffers their strings point to
    (kept alive with this object)."""
    __slots__ = ("array", "count", "keep")

    def __init__(self, value):
        out = []
        keep = []
        _add(value, out, keep, 0)
        self.array = ffi.new("lecho_node[]", out)
        self.count = len(out)
        self.keep = keep


def _str(b, out, keep):
    c = ffi.from_buffer(b)
    keep.append(c)
    out.append((TSTRING, len(b), 0, 0.0, c))


def _add(v, out, keep, depth):
    if v is None:
        out.append((TNIL, 0, 0, 0.0, NULL))
    elif v is True or v is False:
        out.append((TBOOLEAN, 0, 0, 1.0 if v else 0.0, NULL))
    elif isinstance(v, int):
        if not -_EXACT <= v <= _EXACT:
            raise ValueError("lecho: the integer %d does not fit a double exactly (|x| > 2**53)" % v)
        out.append((TNUMBER, 0, 0, float(v), NULL))
    elif isinstance(v, float):
        out.append((TNUMBER, 0, 0, v, NULL))
    elif isinstance(v, str):
        _str(v.encode("utf-8"), out, keep)
    elif isinstance(v, (bytes, bytearray)):
        _str(bytes(v), out, keep)
    elif isinstance(v, memoryview):
        _str(v.tobytes(), out, keep)
    else:
        if depth >= _MAX_DEPTH:
            raise ValueError("lecho: values nested deeper than %d (a container that holds itself?)"
                             % _MAX_DEPTH)
        if isinstance(v, dict):
            out.append((TTABLE, len(v), 0, 0.0, NULL))
            for k, x in v.items():
                if k is None or (isinstance(k, float) and k != k):
                    raise ValueError("lecho: a None or NaN key cannot be sent")
                if not isinstance(k, (str, bytes, int, float)):
                    raise TypeError("lecho: a key of type %s cannot be sent" % type(k).__name__)
                _add(k, out, keep, depth + 1)
                _add(x, out, keep, depth + 1)
        elif isinstance(v, (list, tuple)):
            out.append((TTABLE, len(v), len(v), 0.0, NULL))
            for x in v:
                _add(x, out, keep, depth + 1)
        elif _np is not None and isinstance(v, _np.ndarray):
            # TODO(arrays): once lecho.h has the array value, an ndarray
            # crosses as one array node pointing at its buffer (no copy).
            _add(v.tolist(), out, keep, depth)
        elif _np is not None and isinstance(v, _np.generic):
            _add(v.item(), out, keep, depth)
        else:
            raise TypeError("lecho: a value of type %s cannot be sent" % type(v).__name__)
