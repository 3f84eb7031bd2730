"""lecho._values: events as Python values, through lecho.h's nodes.

A whole value crosses the C API in one call each way (lecho_nodes,
lecho_set_nodes): the C side walks the Lua value, this side walks a flat
array of nodes in pre-order.  No byte of the wire format is read or
written here: the codec stays liblecho's.

Python -> event:  None -> nil, bool -> boolean, int and float -> number (a
double: an int that a double does not hold exactly is refused, it would be
rounded: every int up to 2**53 in magnitude, a larger one such as 2**60
only when its float() converts back to it),
str -> string (UTF-8), bytes/bytearray/memoryview -> string (the bytes),
dict -> table (keys: str, bytes, int, float, bool), list and tuple -> Lua
array (1-based), a NumPy array -> a Lua array of its elements (.tolist()).

Event -> Python:  nil -> None, boolean -> bool, number -> int when it is
integral and exact (|x| <= 2**53), else float, string -> str when it is
valid UTF-8, else bytes (raw=True: always bytes), table -> list when its keys
are exactly 1..n (n >= 1), else dict (an empty table is {}).
"""
import struct
import threading

from ._ffi import ffi, lib

TNIL, TBOOLEAN, TNUMBER, TSTRING, TTABLE, TARRAY = (lib.LECHO_TNIL, lib.LECHO_TBOOLEAN, lib.LECHO_TNUMBER,
                                                    lib.LECHO_TSTRING, lib.LECHO_TTABLE, lib.LECHO_TARRAY)
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


def from_nodes(nodes, count, raw=False, pin=None):
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
        if t == TARRAY:
            return array_of(int(ffi.cast("uintptr_t", nd.str)), nd.n, nd.array, pin)
        return None

    value = walk()
    walk = None   # walk's cell held walk (a cycle), and through it pin: an array's memory
    if pos != count:
        raise ValueError("lecho: %d nodes left over" % (count - pos))
    return value


# The nodes as plain records: one struct.iter_unpack over their memory is
# much faster than reading cdata fields node by node.
_NODE_FMT = None
_NODE_SIZE = ffi.sizeof("lecho_node")
if (_NODE_SIZE == 48 and ffi.offsetof("lecho_node", "n") == 8
        and ffi.offsetof("lecho_node", "len") == 16 and ffi.offsetof("lecho_node", "num") == 24
        and ffi.offsetof("lecho_node", "str") == 32 and ffi.offsetof("lecho_node", "array") == 40
        and ffi.sizeof("size_t") == 8 and ffi.sizeof("void *") == 8):
    _NODE_FMT = struct.Struct("=i4xQQdQQ")

# lecho_nodes' out parameters, one set per thread (contexts may live in
# different threads).
_tls = threading.local()


def _outs():
    o = getattr(_tls, "outs", None)
    if o is None:
        o = _tls.outs = (ffi.new("const lecho_node **"), ffi.new("size_t *"),
                         ffi.new("const char **"), ffi.new("size_t *"))
    return o


# Arrays of at least this many bytes are NumPy arrays over lecho's memory
# (no copy: the adopted read buffers of doc/python.md); smaller ones are
# copied out into memory of their own.
HOLD_MIN = 256 * 1024


def array_of(ptr, nbytes, info, pin):
    """A read-only NumPy array of the nbytes at address ptr, of the dtype
    and shape of info (a lecho_array_info *): over that memory (no copy)
    when nbytes >= HOLD_MIN, pin() giving the object that keeps it alive,
    held as long as the array is; else a copy of them."""
    if _np is None:
        from ._ffi import _debian_python
        raise ImportError("an event holds an array: " + _debian_python("numpy", "python3-numpy"))
    info = ffi.cast("lecho_array_info *", info)
    dtype = ffi.string(info.dtype).decode()
    shape = tuple(ffi.unpack(info.shape, info.ndim))
    if nbytes == 0:
        a = _np.zeros(shape, dtype=dtype)
    elif nbytes < HOLD_MIN:
        # a small array: copied out, its memory the array's own (nothing
        # of the context held: close() is not delayed by it)
        a = _np.frombuffer(ffi.buffer(ffi.cast("char *", ptr), nbytes), dtype=dtype).reshape(shape).copy()
    else:
        holder = pin()
        # the buffer's cdata holds the pin: the array -> buffer -> cdata -> pin
        p = ffi.gc(ffi.cast("char *", ptr), lambda _c, _h=holder: None)
        # over a read-only view of that memory: NumPy then refuses
        # a.setflags(write=True) too (the memory is every consumer's)
        ro = memoryview(ffi.buffer(p, nbytes)).toreadonly()
        a = _np.frombuffer(ro, dtype=dtype).reshape(shape)
    # read-only: one decoded value goes to every consumer of the process (a
    # write into it would change what the others see); a.copy() to write
    a.flags.writeable = False
    return a


def from_packed(recs, data, base, raw=False, pin=None):
    """The Python value of node records (type, n, len, num, str address,
    array info address) whose strings are in data (bytes), the copy of the
    packed array at address base; pin() keeps arrays' memory alive."""
    pos = 0

    def walk():
        nonlocal pos
        t, n, ln, num, ptr, arr = recs[pos]
        pos += 1
        if t == TSTRING:
            off = ptr - base
            b = data[off:off + n]
            if raw:
                return b
            try:
                return b.decode("utf-8")
            except UnicodeDecodeError:
                return b
        if t == TNUMBER:
            if num == num and -_EXACT <= num <= _EXACT and num == int(num):
                return int(num)
            return num
        if t == TTABLE:
            if n == ln and ln > 0:
                return [walk() for _ in range(ln)]
            d = {}
            for i in range(1, ln + 1):
                d[i] = walk()
            for _ in range(n - ln):
                k = walk()
                if isinstance(k, list):
                    k = tuple(k)
                elif isinstance(k, dict):
                    k = tuple(sorted(k.items(), key=repr))
                d[k] = walk()
            return d
        if t == TBOOLEAN:
            return num != 0
        if t == TARRAY:
            return array_of(ptr, n, arr, pin)
        return None

    value = walk()
    walk = None   # as in from_nodes: no cycle keeps pin (the arrays' memory) for the cyclic GC
    if pos != len(recs):
        raise ValueError("lecho: %d nodes left over" % (len(recs) - pos))
    return value


def read(v, raw=False, key=NULL, pin=None):
    """(value, pinned) of what a lecho_value handle holds, or a code.  pin():
    the object that keeps the value's arrays alive (made at the first
    array; pinned: whether it was called)."""
    _out, _count, _bytes, _nbytes = _outs()
    used = []

    def pin1():
        if not used:
            if pin is None:
                raise ValueError("lecho: an array where none was expected")
            used.append(pin())
        return used[0]
    if _NODE_FMT is None:
        rc = lib.lecho_nodes(v, key, _out, _count)
        if rc != 0:
            return rc
        return from_nodes(_out[0], _count[0], raw, pin1), bool(used)
    rc = lib.lecho_nodes_packed(v, key, _out, _count, _bytes, _nbytes)
    if rc != 0:
        return rc
    count = _count[0]
    mem = ffi.buffer(_out[0], count * _NODE_SIZE)
    nb = _nbytes[0]
    data = ffi.buffer(_bytes[0], nb)[:] if nb else b""
    base = int(ffi.cast("uintptr_t", _bytes[0]))
    if count > 64 and _np is not None:
        flat = _flat_list(mem, count, data, base, raw)
        if flat is not None:
            return flat, None
    recs = list(_NODE_FMT.iter_unpack(mem))
    return from_packed(recs, data, base, raw, pin1), bool(used)


if _np is not None:
    _NODE_DTYPE = _np.dtype([("type", "<i4"), ("pad", "<i4"), ("n", "<u8"), ("len", "<u8"),
                             ("num", "<f8"), ("str", "<u8"), ("array", "<u8")])


def _flat_list(mem, count, data, base, raw):
    """A batch that is a list of strings, or of numbers (the common case of
    a subscription's batch), converted with NumPy column operations instead
    of one record per node; None for anything else."""
    a = _np.frombuffer(mem, dtype=_NODE_DTYPE, count=count)
    head = a[0]
    if head["type"] != TTABLE or head["n"] != count - 1 or head["len"] != count - 1:
        return None
    types = a["type"][1:]
    t0 = types[0]
    if not (types == t0).all():
        return None
    if t0 == TSTRING:
        # lecho_nodes_packed lays the strings out in node order, each
        # followed by a NUL: one split gives them all (count - 1 of them
        # and the empty rest) unless one of them holds a NUL itself, about
        # 3x less per string than a slice each
        if raw:
            parts = data.split(b"\0")
            if len(parts) == count:
                parts.pop()
                return parts
        elif data.isascii():
            parts = data.decode("ascii").split("\0")
            if len(parts) == count:
                parts.pop()
                return parts
        offs = (a["str"][1:] - base).tolist()
        lens = a["n"][1:].tolist()
        if raw:
            return [data[o:o + n] for o, n in zip(offs, lens)]
        if data.isascii():
            # one decode for the batch (an ASCII byte is one character:
            # byte offsets are character offsets), then str slices: about
            # 10x less per string than a bytes slice and its decode each
            text = data.decode("ascii")
            return [text[o:o + n] for o, n in zip(offs, lens)]
        out = []
        for o, n in zip(offs, lens):
            b = data[o:o + n]
            try:
                out.append(b.decode("utf-8"))
            except UnicodeDecodeError:
                out.append(b)
        return out
    if t0 == TNUMBER:
        return [_number(x) for x in a["num"][1:].tolist()]
    return None


class Nodes:
    """The nodes of a Python value, the buffers their strings point to
    (kept alive with this object), and its NumPy arrays: (path, ndarray),
    path the string keys from the top (a nil node holds each place until
    set_arrays sets it)."""
    __slots__ = ("array", "count", "keep", "arrays")

    def __init__(self, value):
        out = []
        keep = []
        self.arrays = []
        _add(value, out, keep, 0, (), self.arrays)
        self.array = ffi.new("lecho_node[]", out)
        self.count = len(out)
        self.keep = keep


_DTYPES = {"<u1", "<i1", "<u2", "<i2", "<u4", "<i4", "<u8", "<i8", "<f4", "<f8"}


def set_arrays(v, arrays):
    """Sets each (path, ndarray) of Nodes.arrays into the value v holds:
    lent (lecho_set_array without a free function): each submit copies the
    bytes into its message, so the caller may change the ndarray as soon as
    the submit returned.  0 or a code."""
    for path, a in arrays:
        dt = a.dtype.str.replace("|", "<")
        if dt not in _DTYPES:
            a = a.astype(a.dtype.newbyteorder("<")) if a.dtype.byteorder == ">" else a
            dt = a.dtype.str.replace("|", "<")
            if dt not in _DTYPES:
                raise TypeError("lecho: arrays of dtype %s cannot be sent (%s)" % (a.dtype, sorted(_DTYPES)))
        if not a.flags.c_contiguous:
            a = _np.ascontiguousarray(a)
        if a.ndim > 8:
            raise ValueError("lecho: arrays of at most 8 dimensions")
        shape = ffi.new("size_t[]", list(a.shape) or [0])
        target, fields = v, []
        for k in path[:-1]:       # the table that holds it, through lecho_field
            target = lib.lecho_field(target, k.encode(), 0)
            if target == NULL:
                return lib.LECHO_ENOMEM
            fields.append(target)
        key = path[-1].encode() if path else NULL
        rc = lib.lecho_set_array(target, key, dt.encode(), a.ndim, shape,
                                 ffi.from_buffer(a), ffi.NULL, ffi.NULL)
        for f in fields:
            lib.lecho_value_free(f)
        if rc != 0:
            return rc
    return 0


def _int_text(v):
    """An int for an error message: its digits, a long one cut (and no
    str() of one past Python's digit limit)."""
    if v.bit_length() > 3000:
        return "of %d bits" % v.bit_length()
    t = str(v)
    return t if len(t) <= 40 else "%s...%s (%d digits)" % (t[:24], t[-8:], len(t.lstrip("-")))


def _exact_float(v):
    """int v as the double that holds it exactly, or ValueError: every int
    up to 2**53 in magnitude is one, a larger one only when a double holds
    it (2**60 does, 2**53 + 1 does not: it would arrive rounded)."""
    if -_EXACT <= v <= _EXACT:
        return float(v)
    try:
        f = float(v)
    except OverflowError:
        raise ValueError("lecho: the integer %s is beyond a double's range (|x| > 1.8e308)"
                         % _int_text(v)) from None
    if int(f) != v:
        raise ValueError("lecho: the integer %s is not exactly representable as a double (it would "
                         "arrive as %s; ints up to 2**53 always are, larger ones when a double "
                         "holds them, as 2**60)" % (_int_text(v), _int_text(int(f))))
    return f


def _str(b, out, keep):
    c = ffi.from_buffer(b)
    keep.append(c)
    out.append((TSTRING, len(b), 0, 0.0, c))


def _add(v, out, keep, depth, path=None, arrays=None):
    if v is None:
        out.append((TNIL, 0, 0, 0.0, NULL))
    elif v is True or v is False:
        out.append((TBOOLEAN, 0, 0, 1.0 if v else 0.0, NULL))
    elif isinstance(v, int):
        out.append((TNUMBER, 0, 0, _exact_float(v), NULL))
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
                _add(x, out, keep, depth + 1,
                     path + (k,) if path is not None and isinstance(k, str) else None, arrays)
        elif isinstance(v, (list, tuple)):
            out.append((TTABLE, len(v), len(v), 0.0, NULL))
            for x in v:
                _add(x, out, keep, depth + 1)
        elif _np is not None and isinstance(v, _np.ndarray):
            # an array (lecho.array): set by lecho_set_array once the rest
            # is built; a nil holds its place meanwhile
            if path is None:
                raise TypeError("lecho: an array can be sent as the event or under string keys "
                                "of dicts, not inside a list or under another key")
            out.append((TNIL, 0, 0, 0.0, NULL))
            arrays.append((path, v))
        elif _np is not None and isinstance(v, _np.generic):
            _add(v.item(), out, keep, depth)
        else:
            raise TypeError("lecho: a value of type %s cannot be sent" % type(v).__name__)
