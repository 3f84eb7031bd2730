"""lecho: event channels between processes, from Python.

A binding of liblecho's public C API (core/lecho.h) with cffi: the context,
its name server, the connections and the codec are liblecho's (a private
LuaJIT state runs the same Lua layer a Lua peer runs), so a Python process
is a peer like any other.  doc/python.md is the reference.

    import lecho
    ctx = lecho.Context(nameserver="127.0.0.1:7700")
    ch = ctx.channel("ozone")
    for ev in ch.subscribe(modulator="function enqueue(ev) if ev.step % 10 == 0 then return ev end end"):
        print(ev["step"])
"""
import atexit
import collections
import gc
import os
import sys
import threading
import time
import traceback
import weakref
from threading import get_ident as _ident

from ._ffi import ffi, lib, LIBRARY
from . import _values

__all__ = ["Context", "Channel", "Producer", "Consumer", "Subscription", "Service", "Meta", "Recorder",
           "LechoError", "SyncError", "CallError", "modulator", "keygen", "CODES", "LIBRARY"]

# The shared error codes (README "Errors"; lua/lecho/errors.lua): name <-> number.
CODES = {}
for _i in range(1, 64):
    _name = ffi.string(lib.lecho_strerror(_i)).decode()
    if _name == "unknown":
        break
    CODES[_name] = _i
del _i, _name


class LechoError(Exception):
    """A failure with its code: .code is the name of the shared list
    ("timeout", "closed", "refused", "limit", "wouldblock", "invalid",
    "notfound", "io", "protocol", "nomem", "failed", "noservice", "version",
    "busy", "noconsumer": the Lua API's third value), .errno its number in
    lecho.h, .message the text."""

    def __init__(self, code, message):
        if isinstance(code, int):
            self.errno = code
            code = ffi.string(lib.lecho_strerror(code)).decode()
        else:
            self.errno = CODES.get(code, lib.LECHO_EFAILED)
        self.code = code
        self.message = message
        super().__init__("%s (%s)" % (message, code))


class SyncError(LechoError):
    """A failed submit_sync: .errors lists the failing or silent consumers,
    each a dict with context, consumer, message and code."""

    def __init__(self, code, message, errors):
        super().__init__(code, message)
        self.errors = errors


class CallError(LechoError):
    """A failed call: .value is the error value the handler raised (a
    string, or a table as a dict), or the message."""

    def __init__(self, code, message, value):
        super().__init__(code, message)
        self.value = value


Meta = collections.namedtuple("Meta", "channel producer seq")


def _s(b):
    return ffi.string(b).decode("utf-8", "replace") if b != ffi.NULL else ""


def _opt(v):
    if v is True:
        return "true"
    if v is False:
        return "false"
    if isinstance(v, (list, tuple)):  # trust files
        return ":".join(str(x) for x in v)
    return str(v)


def modulator(src_or_file):
    """The text of a modulator: the contents of a file when given a path
    that ends in .lua (as Lua's lecho.modulator), else the source itself."""
    s = str(src_or_file)
    if "\n" not in s and s.endswith(".lua"):
        try:
            with open(s) as f:
                return f.read()
        except FileNotFoundError:
            raise LechoError("notfound", "no such file: %s" % s) from None
        except OSError as e:
            raise LechoError("io", "%s: %s" % (s, e.strerror)) from None
    return s


def keygen(*names, dir=".", authority=False, sign_with=None):
    """Makes a key pair per principal name (scripts/lecho-keygen: DIR/NAME.key,
    mode 0600, and DIR/NAME.pub; never overwrites a file).  authority: make
    authority keys; sign_with: certify each new key with that authority's
    secret key file.  Returns the secret key paths.  Raises LechoError
    ("failed") with the script's message."""
    import os
    import shutil
    import subprocess
    here = os.path.dirname(os.path.abspath(__file__))
    # the checkout's script; else the installed one (make install wrote
    # its directory into _paths.py: any PREFIX, PATH or not); else PATH's
    script = os.path.join(here, "..", "..", "scripts", "lecho-keygen")
    if not os.path.exists(script):
        try:
            from . import _paths
            script = os.path.join(_paths.BINDIR, "lecho-keygen")
        except (ImportError, AttributeError):
            script = None
        if not script or not os.path.exists(script):
            script = shutil.which("lecho-keygen")
    if not script:
        raise LechoError("notfound", "lecho-keygen not found (make install puts it in PREFIX/bin)")
    argv = [script] + list(names) + ["--dir", str(dir)]
    if authority:
        argv.append("--authority")
    if sign_with:
        argv += ["--sign-with", str(sign_with)]
    r = subprocess.run(argv, capture_output=True, text=True)
    if r.returncode != 0:
        raise LechoError("failed", (r.stderr or r.stdout).strip())
    return [os.path.join(str(dir), n + ".key") for n in names]


class Context:
    """A context: lecho.Context(nameserver="127.0.0.1:7700", ...).  Options
    are those of the Lua lecho.context (README "API"): nameserver, listen,
    advertise, timeout, sync_timeout, queue_limit, policy, quiet, key (a
    secret key file), trust (a trust file or a list of them), ...; without
    nameserver the context runs a name server of its own (.address).

    A context and what is made from it belong to the thread that made it.
    Events arrive, leave and handlers run only inside the loop calls:
    run(), run_once(), iterating a Subscription, submit_sync(), call(), or
    the asyncio ticks of attach()."""

    def __init__(self, **opts):
        flat = []
        keep = []
        for k, v in opts.items():
            if v is None:
                continue
            for s in (k, _opt(v)):
                c = ffi.new("char[]", s.encode())
                keep.append(c)
                flat.append(c)
        flat.append(ffi.NULL)
        arr = ffi.new("const char *[]", flat)
        out = ffi.new("lecho_ctx **")
        err = ffi.new("char[512]")
        rc = lib.lecho_open(arr, out, err, 512)
        if rc != 0:
            raise LechoError(rc, _s(err))
        self._x = out[0]
        self._mem = _Mem(out[0])      # the context's memory: held by received arrays' pins too
        self._thread = threading.get_ident()
        self._pending = None          # a BaseException raised in a callback, re-raised after
        self._handles = []            # consumers, services: their callbacks live as long
        self._asyncio = None
        self._deferred = []           # value handles collected in another thread
        self._pins = weakref.WeakSet()  # what received arrays hold (see close)
        self.address = _s(lib.lecho_address(self._x))
        self.nameserver = _s(lib.lecho_nameserver(self._x))
        self.on_handler_error = _print_handler_error
        self._quiet = opts.get("quiet") not in (None, False, 0, "false")
        self._flag = ffi.new("int *")  # lecho_get_bool's out, for _block_pending
        self.close_error = None       # close()'s LechoError when it did not raise it
        # The program's end without close(): closed as close() does (what was
        # submitted delivered within linger).  atexit runs before CPython
        # tears the modules down; a weak reference, so that the registration
        # does not keep the context; close() unregisters it.
        ref = weakref.ref(self)

        def at_exit():
            c = ref()
            if c is not None:
                c._at_end("the program's end")
        self._at_exit = at_exit
        atexit.register(at_exit)
        try:
            self._sync_timeout = float(opts.get("sync_timeout", 10))
        except (TypeError, ValueError):
            self._sync_timeout = 10.0
        # Asked between the turns of the waits inside one C call (close's
        # linger, opening a producer or a consumer): entering Python runs a
        # pending signal's handler, whose KeyboardInterrupt the callback's
        # onerror keeps (as in a handler), and the wait ends at once.
        self._intr = _callback(self, "lecho_interrupt_fn", _interrupt_fn(self), 1)
        lib.lecho_set_interrupt(self._x, self._intr, ffi.NULL)

    # -- internals --
    def _check(self):
        """The context's handle, at a call that may touch it: LechoError
        "closed" once closed, "invalid" from another thread than the one
        that made it (liblecho is not thread-safe: a second thread used to
        crash the interpreter)."""
        if self._x is None:
            raise LechoError("closed", "context is closed")
        if _ident() != self._thread:
            self._wrong_thread()
        return self._x

    def _wrong_thread(self):
        names = {t.ident: t.name for t in threading.enumerate()}
        me = _ident()
        raise LechoError("invalid", "the context belongs to thread %d (%s), not to this thread %d (%s): "
                         "a context and everything made from it are used from the thread that made it"
                         % (self._thread, names.get(self._thread, "?"), me, names.get(me, "?")))

    def _fail(self, rc):
        raise LechoError(rc, _s(lib.lecho_errmsg(self._x)))

    def _own(self, v):
        """v (a new lecho_value) freed when the returned cdata is collected:
        at once when that happens in the context's thread while it is open,
        at the context's next call when in another thread (the garbage
        collector may run anywhere), never once it is closed (lecho_close
        freed it)."""
        if v == ffi.NULL:
            raise LechoError("nomem", "out of memory")
        return ffi.gc(v, self._free_value)

    def _free_value(self, v):
        if self._x is None:
            return
        if threading.get_ident() == self._thread:
            lib.lecho_value_free(v)
        else:
            self._deferred.append(v)

    def _value(self, pyvalue):
        """A new lecho_value (freed with the returned cdata) holding pyvalue."""
        self._drain()
        v = self._own(lib.lecho_value_new(self._check()))
        self._set(v, pyvalue)
        return v

    def _drain(self):
        while self._deferred:
            lib.lecho_value_free(self._deferred.pop())

    def _set(self, v, pyvalue):
        n = _values.Nodes(pyvalue)
        rc = lib.lecho_set_nodes(v, ffi.NULL, n.array, n.count)
        if rc == 0 and n.arrays:
            rc = _values.set_arrays(v, n.arrays)
        if rc != 0:
            self._fail(rc)

    def _read(self, v, raw=False, pin=None, pinned=False):
        """The value v holds; pinned: (value, whether pin was called: its
        arrays point into v's memory)."""
        r = _values.read(v, raw, pin=pin)
        if not isinstance(r, tuple):
            self._fail(r)
        return r if pinned else r[0]

    # -- arrays received: NumPy arrays over the context's memory --
    def _pin_owned(self, holder):
        """A pin on holder (an owned lecho_value cdata): the arrays made
        over its memory hold it, and the context's memory (see close)."""
        p = _Pin(holder, self._mem)
        self._pins.add(p)
        return p

    def _pin_copy(self, v):
        """A pin on a new handle holding what v (borrowed: a handler's
        event) holds: its arrays stay valid after the handler returned."""
        holder = self._own(lib.lecho_value_new(self._x))
        rc = lib.lecho_set_value(holder, ffi.NULL, v)
        if rc != 0:
            self._fail(rc)
        return self._pin_owned(holder)

    def _keep(self, exc):
        """An exception raised in a callback, raised by the loop call that
        ran it (_reraise): KeyboardInterrupt and SystemExit before any
        other; the first of a kind is kept."""
        old = self._pending
        if old is None or (isinstance(exc, (KeyboardInterrupt, SystemExit))
                           and not isinstance(old, (KeyboardInterrupt, SystemExit))):
            self._pending = exc

    def _reraise(self):
        exc = self._pending
        if exc is not None:
            self._pending = None
            raise exc

    def _loop_call(self, rc):
        """After a C call that ran the loop: a callback's KeyboardInterrupt
        (or SystemExit) first, then rc."""
        self._reraise()
        if rc != 0:
            self._fail(rc)

    # -- the loop --
    def run_once(self, timeout=0.0):
        """One loop turn, waiting at most timeout seconds (None: until
        something happens)."""
        x = self._check()
        self._drain()
        rc = lib.lecho_run_once(x, -1.0 if timeout is None else float(timeout))
        self._loop_call(rc)

    def run(self, seconds=None):
        """Serves the loop until stop() (or for `seconds`).  Turns of at most
        0.1 s, so that Ctrl-C (KeyboardInterrupt) stops it at once."""
        import time
        self._stopped = False
        end = None if seconds is None else time.monotonic() + seconds
        while not self._stopped:
            left = 0.1 if end is None else min(0.1, end - time.monotonic())
            if left <= 0:
                break
            self.run_once(left)

    def stop(self):
        self._stopped = True
        lib.lecho_stop(self._check())

    # -- asyncio --
    def attach(self, loop=None, interval=0.005):
        """Runs this context inside an asyncio event loop (Jupyter's, say):
        a turn of run_once(0) every `interval` seconds and soon after each
        submit.  libev does not publish its backend descriptor (ev.h has no
        ev_backend_fd), so there is no fd for loop.add_reader to watch; the
        timers of a context (heartbeats, redials, timeouts) would need a tick
        anyway.  A turn that finds nothing costs one epoll_wait(0)."""
        import asyncio
        self._check()
        if loop is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = asyncio.get_event_loop()
        self.detach()
        self._asyncio = _Ticker(self, loop, interval)
        return self

    def detach(self):
        if self._asyncio is not None:
            self._asyncio.cancel()
            self._asyncio = None

    def _kick(self):
        if self._asyncio is not None:
            self._asyncio.soon()

    # -- channels, services --
    def channel(self, name):
        """The channel `name` ("ozone", or "host:port/ozone")."""
        ch = lib.lecho_channel_get(self._check(), name.encode())
        if ch == ffi.NULL:
            raise LechoError("invalid", _s(lib.lecho_errmsg(self._x)) or "bad channel name")
        return Channel(self, ch, name)

    def recorder(self, path, policy=None, buffer_bytes=None, max_bytes=None, keep=None, append=None,
                 fsync=None):
        """A recording of this context's producers in the file at path (Lua's
        ctx:recorder, doc/recording.md "In the producer's process"): a
        producer made with `ch.producer(record=rec)` or `p.record(rec)`
        records into it.  policy: "block" (default: a submit waits for the
        writer, nothing is lost) or "drop" (counted in stats()["dropped"]);
        buffer_bytes (8 MiB); max_bytes and keep (rotation: `lecho record
        --max-bytes/--keep`); append (an existing file goes on; else one is
        refused); fsync (close fsyncs).  A Recorder; LechoError when the
        file cannot be opened or an option is wrong (code "invalid")."""
        return Recorder(self, path, dict((k, v) for k, v in (
            ("policy", policy), ("buffer_bytes", buffer_bytes), ("max_bytes", max_bytes), ("keep", keep),
            ("append", append), ("fsync", fsync)) if v is not None))

    def service(self, name, fn, **opts):
        """Serves `name`: fn(args, meta) -> result runs for each call (in the
        loop calls; it cannot wait).  opts: version, concurrency, queue,
        queue_bytes, budget.  An exception in fn fails the call (code
        "failed") with its text."""
        return Service(self, name, fn, opts)

    def call(self, name, args=None, **opts):
        """Calls a server of `name`; runs the loop until it answers.  opts:
        timeout, version, min_version, key, at, retries.  The handler's
        result (None for none; a tuple for several), or CallError.  The
        wait is turns of at most 0.1 s (lecho_call_start), so Ctrl-C
        (KeyboardInterrupt) stops it at once.  An answer that came after
        the call's timeout (a handler in this process runs to its end in
        the loop turn that called it) raises CallError code "timeout"."""
        holder, t0, timeout = self._call_start(name, args, opts)
        self._block_pending(holder)
        return self._call_result(name, self._pending_table(holder), time.monotonic() - t0, timeout)

    def _call_start(self, name, args, opts):
        """Starts a call (lecho_call_start): its pending holder, when it
        started, and its timeout in seconds."""
        x = self._check()
        a = self._value(args)
        o = self._value(opts) if opts else ffi.NULL
        out = ffi.new("lecho_value **")
        timeout = opts.get("timeout")
        timeout = self._sync_timeout if timeout is None else float(timeout)
        t0 = time.monotonic()
        rc = lib.lecho_call_start(x, name.encode(), a, o, out)
        self._loop_call(rc)
        return self._own(out[0]), t0, timeout

    async def call_async(self, name, args=None, **opts):
        """call() as an awaitable, for code inside a running asyncio loop
        (a Jupyter cell, asyncio.run): the request leaves now and the loop
        stays free while the answer comes (lecho_call_start).  The same
        results and CallError as call()."""
        holder, t0, timeout = self._call_start(name, args, opts)
        r = await self._await_pending(holder)
        return self._call_result(name, r, time.monotonic() - t0, timeout)

    @staticmethod
    def _call_result(name, r, took, timeout):
        """The results of a finished lecho_call_start table, or CallError.
        took: the seconds the caller waited, when the table has no "took"
        (the context's: from the start to the answer, not to when an
        awaiting task woke)."""
        if not r.get("ok"):
            msg = r.get("message") or ""
            raise CallError(r.get("code") or "failed", msg, r.get("value", msg))
        took = r.get("took", took)
        if took > timeout:
            msg = ("service %s: answered after %.3g s, past the call's timeout of %.3g s "
                   "(a handler in this process is not interrupted)" % (name, took, timeout))
            raise CallError("timeout", msg, msg)
        d = r.get("results") or {}
        n = d.get("n", 0) if isinstance(d, dict) else len(d)
        if n == 0:
            return None
        vals = tuple(d.get(i) for i in range(1, n + 1)) if isinstance(d, dict) else tuple(d)
        return vals[0] if n == 1 else vals

    def _block_pending(self, holder):
        """Runs the loop until the started operation in holder
        (lecho_*_start) is done, in turns of at most 0.1 s (a signal also
        ends a turn: epoll_wait returns EINTR), so that Python's signal
        handlers run between them: Ctrl-C raises KeyboardInterrupt here at
        once.  The operation is then abandoned (its wait goes on in the
        context until its timeout or the close, and nobody reads it), and
        `except KeyboardInterrupt: ctx.close()` closes (see close).  Its
        "ok" (a bool)."""
        x = self._check()
        flag = self._flag
        while True:
            rc = lib.lecho_get_bool(holder, b"done", flag)
            if rc != 0:
                self._fail(rc)
            if flag[0]:
                break
            if self._deferred:
                self._drain()
            self._loop_call(lib.lecho_run_once(x, 0.1))
        rc = lib.lecho_get_bool(holder, b"ok", flag)
        if rc != 0:
            self._fail(rc)
        return bool(flag[0])

    def _pending_table(self, holder):
        """The table of a finished lecho_*_start operation, as a dict."""
        r = _values.read(holder, pin=lambda: self._pin_owned(holder))
        if not isinstance(r, tuple):
            self._fail(r)
        return r[0]

    async def _await_pending(self, holder):
        """Waits without blocking the asyncio loop until the started
        operation in holder (lecho_*_start) is done; its table as a dict.
        Attached (ctx.attach()), the ticker's turns carry it and wake this;
        else this coroutine turns the loop itself (run_once(0) every 2 ms)."""
        import asyncio
        loop = asyncio.get_running_loop()
        flag = ffi.new("int *")
        while True:
            rc = lib.lecho_get_bool(holder, b"done", flag)
            if rc != 0:
                self._fail(rc)
            if flag[0]:
                break
            t = self._asyncio
            if t is None or t.loop is not loop:
                self.run_once(0)
                await asyncio.sleep(0.002)
            else:
                fut = loop.create_future()
                t.waiters.append(fut)
                await fut
        r = _values.read(holder, pin=lambda: self._pin_owned(holder))
        if not isinstance(r, tuple):
            self._fail(r)
        return r[0]

    def stats(self):
        """The context's counters (Lua's ctx:stats())."""
        v = lib.lecho_stats(self._check())
        if v == ffi.NULL:
            self._fail(lib.LECHO_EFAILED)
        return self._read(self._own(v))

    def stat(self, channel, counter):
        """One counter of one channel, an int (README "Statistics");
        LechoError code "notfound" when this context has no such channel
        (no producer or consumer of it here yet) or the channel no such
        counter (the message lists those it has)."""
        v = lib.lecho_stat(self._check(), channel.encode(), counter.encode())
        if v >= 0:
            return int(v) if v.is_integer() else v
        rows = self.stats().get("channels") or {}
        row = rows.get(channel) or rows.get("%s/%s" % (self.nameserver, channel))
        if row is None:
            raise LechoError("notfound", "no channel %r in this context (no producer or consumer of "
                             "it here yet)" % channel)
        raise LechoError("notfound", "no counter %r on channel %r (counters: %s)"
                         % (counter, channel, ", ".join(sorted(k for k in row if isinstance(k, str)))))

    def close(self, linger=-1.0):
        """Delivers what was submitted (at most `linger` seconds; < 0: the
        context's linger option, 2 s), closes, frees.  Always closes.
        LechoError("timeout") when something could not be delivered, but
        not while an exception is being handled (`except
        KeyboardInterrupt: ctx.close()`, a `with` block left by an
        exception): then the error is only logged (unless quiet) and kept
        in .close_error, so that the exception being handled is not
        replaced.  Subscriptions still open are closed as by their
        close(): the events they handed out count as handled.  Large received arrays (over the context's memory) still
        alive stay valid: the context's memory is freed when the last of
        them goes."""
        self._close(linger, sys.exc_info()[0] is not None)

    def _at_end(self, when):
        """close() at the program's end or when the context is collected
        open: delivers within the context's linger; what it could not
        deliver is logged by the context and, with quiet (nobody can see
        close()'s result any more), said on stderr."""
        if getattr(self, "_x", None) is None or threading.get_ident() != self._thread:
            return
        try:
            self._close(-1.0, True)
        except BaseException as e:        # never raised out of atexit or __del__
            # (a Ctrl-C during the close: the loss it kept in close_error is
            # what is said; it printed an empty line, outside attack s8 F6)
            if not isinstance(self.close_error, LechoError):
                self.close_error = e
        if self.close_error is not None and self._quiet:
            try:
                ce = self.close_error
                sys.stderr.write("lecho: close at %s (close() was not called): %s\n"
                                 % (when, ce if str(ce) else "%s, nothing said lost" % type(ce).__name__))
                sys.stderr.flush()
            except Exception:
                pass

    def _close(self, linger, handling):
        if self._x is None:
            # closed: a second close has the first one's result (its
            # LechoError raised again, or kept while an exception is handled;
            # after an interrupted close it returned as a success: outside
            # attack s8 F7)
            e = getattr(self, "_close_exc", None)
            if e is not None:
                if handling:
                    self.close_error = e
                    return
                raise e
            return
        self._check()
        atexit.unregister(getattr(self, "_at_exit", None))   # (absent when __init__ failed early)
        if len(self._pins):
            gc.collect()
        self.detach()
        self._drain()
        # open subscriptions close as sub.close() does: the events they
        # handed out (sub.get(), a loop's last) count as handled, their
        # producers' submit_sync answered before the connection goes
        for h in list(self._handles):
            if isinstance(h, Subscription):
                h.close()
        x, self._x = self._x, None
        for h in self._handles:
            h._dead()
        self._handles = []
        err = ffi.new("char[512]")
        # closed, not freed: the memory goes with the last holder of _mem
        # (this context, or a pin of a live array: see _Mem)
        rc = lib.lecho_close_keep(x, float(linger), err, 512)
        mem, self._mem = self._mem, None
        mem.closed = rc != lib.LECHO_EINVAL     # EINVAL: refused (from a handler), nothing to free yet
        mem = None
        if rc != 0 and rc != lib.LECHO_EINVAL:
            self._close_exc = LechoError(rc, _s(err))
        try:
            self._reraise()
        except BaseException:
            # a Ctrl-C in the close (or in a handler it ran) goes on; what
            # the close could not do is kept, not dropped (outside attack s8
            # F2: close_error None, a second close succeeded)
            if rc != 0 and rc != lib.LECHO_EINVAL:
                self.close_error = self._close_exc
            raise
        if rc != 0:
            e = LechoError(rc, _s(err))
            if rc != lib.LECHO_EINVAL:
                e = self._close_exc
            if handling and rc != lib.LECHO_EINVAL:
                self.close_error = e    # the context logged it (ctx:close), unless quiet
                return
            raise e

    def __enter__(self):
        return self

    def __exit__(self, etype, exc, tb):
        self._close(-1.0, etype is not None)

    def __del__(self):
        self._at_end("its collection")


class _Mem:
    """A context's memory (its lecho_ctx): freed (lecho_close_free) when the
    context is closed and nothing holds this any more, the Context nor the
    pins of received arrays, which point into that memory."""
    __slots__ = ("x", "closed")

    def __init__(self, x):
        self.x, self.closed = x, False

    def __del__(self):
        if self.closed and self.x is not None:
            x, self.x = self.x, None
            lib.lecho_close_free(x)


class _Pin:
    """Holds a lecho_value whose arrays NumPy arrays point into, and the
    memory of its context (mem)."""
    __slots__ = ("v", "mem", "__weakref__")

    def __init__(self, v, mem):
        self.v, self.mem = v, mem


# What a callback returns to C when Python raised outside its own try (a
# signal's KeyboardInterrupt is raised as the callback enters Python, before
# any line of it ran): the event (the call) fails with this text.
_INTERRUPTED = ffi.new("char[]", b"interrupted")
_INTERRUPTED_P = ffi.cast("const char *", _INTERRUPTED)


def _interrupt_fn(ctx):
    """lecho_set_interrupt's callback: 1 (end the wait) while a
    KeyboardInterrupt or SystemExit is kept for the loop call to raise."""
    ref = weakref.ref(ctx)

    def interrupted(_ud):
        c = ref()
        return 1 if c is not None and isinstance(c._pending, (KeyboardInterrupt, SystemExit)) else 0
    return interrupted


def _callback(ctx, cdecl, fn, failed=None):
    """A cffi callback of fn whose every exception is kept: cffi's onerror
    gets those raised where fn's own try cannot see them (SIGINT's handler
    runs as the callback enters Python, or between fn's last line and the
    return), and keeps them in ctx._pending for the loop call that ran the
    callback to raise after liblecho returned (Context._loop_call), as one
    raised inside a handler is.  Without onerror cffi prints "Exception
    ignored from cffi callback" and Ctrl-C is lost.  failed: what the
    callback returns then (for a handler, the event fails)."""
    ref = weakref.ref(ctx)

    def onerror(etype, exc, tb):
        c = ref()
        if c is not None and exc is not None:
            c._keep(exc)
        return None

    if failed is None:
        return ffi.callback(cdecl, fn, onerror=onerror)
    return ffi.callback(cdecl, fn, error=failed, onerror=onerror)


def _print_handler_error(where, exc):
    sys.stderr.write("lecho: %s failed: " % where)
    traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)


class _Ticker:
    """Context.attach's asyncio side: run_once(0) every interval."""

    def __init__(self, ctx, loop, interval):
        self.ctx, self.loop, self.interval = ctx, loop, interval
        self.handle = loop.call_soon(self.tick)
        self.pending_soon = False
        self.waiters = []     # futures of awaitables (_await_pending): set after each turn

    def tick(self):
        self.handle = None
        if self.ctx._x is None:
            return
        try:
            self.ctx.run_once(0)
            self.wake()
        finally:
            if self.ctx._x is not None:
                self.handle = self.loop.call_later(self.interval, self.tick)

    def wake(self):
        for h in self.ctx._handles:
            if isinstance(h, Subscription):
                h._wake()
        ws, self.waiters = self.waiters, []
        for f in ws:
            if not f.done():
                f.set_result(None)

    def soon(self):
        if self.pending_soon:
            return
        self.pending_soon = True

        def once():
            self.pending_soon = False
            if self.ctx._x is not None:
                self.ctx.run_once(0)
                self.wake()
        self.loop.call_soon(once)

    def cancel(self):
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None


class Channel:
    def __init__(self, ctx, ch, asked):
        self.ctx = ctx
        self._ch = ch
        self.name = _s(lib.lecho_channel_name(ch))

    def producer(self, policy=None, record=None):
        """A producer: returns once the channel's manager said where the
        consumers are.  policy: None (the context's), "block",
        "drop_oldest", "drop_newest", "disconnect".  record: a file name
        or a Recorder (ctx.recorder): every event it submits is recorded
        (as p.record(record); Lua's `ch:producer{ record = }`)."""
        p = Producer(self, policy)
        if record is not None:
            try:
                p.record(record)
            except BaseException:
                p.close()
                raise
        return p

    def consumer(self, fn, modulator=None, params=None, period=None, capabilities=None, raw=False,
                 on_error=None):
        """A consumer running fn(ev, meta) for each event (inside the loop
        calls).  fn's exception fails the event (a submit_sync sees its
        text).  modulator: Lua source (or a .lua file) run in every
        producing process (README "Modulators"); params: its shared
        params.  on_error(message): called (inside the loop calls) when the
        modulator failed at a producer (did not load there, was refused by
        its policy, or raised), as the Lua consumer's on_error; without it
        the context logs the message (nothing, with quiet=True)."""
        # on_error asked for in the open (which turns the loop): failures
        # reported meanwhile are held for _set_on_error, not logged.
        c = Consumer(self, fn, _mod_opts(modulator, params, period, capabilities,
                                         on_error is not None), raw)
        if on_error is not None:
            c._set_on_error(on_error)
        return c

    def subscribe(self, modulator=None, params=None, period=None, capabilities=None, raw=False,
                  maxsize=65536, meta=False, on_error=None):
        """A consumer as an iterator: `for ev in ch.subscribe(...)` (or
        `async for` once the context is attached to asyncio).  Yields
        events, or (ev, Meta) with meta=True.  on_error(message): as for
        consumer(): the modulator failed at a producer."""
        s = Subscription(self, _mod_opts(modulator, params, period, capabilities,
                                         on_error is not None), raw, maxsize, meta)
        if on_error is not None:
            s._set_on_error(on_error)
        return s


def _txt(b):
    return b.decode("utf-8", "replace") if isinstance(b, bytes) else b


def _mod_opts(mod, params, period, capabilities, on_error=False):
    o = {}
    if on_error:
        o["on_error"] = True    # held until lecho_consumer_on_error (lecho.h)
    if mod is not None:
        o["modulator"] = modulator(mod)
    if params is not None:
        o["params"] = params
    if period is not None:
        o["period"] = period
    if capabilities is not None:
        o["capabilities"] = list(capabilities)
    return o


class Producer:
    def __init__(self, ch, policy):
        self.ctx = ctx = ch.ctx
        self.channel = ch
        ctx._check()
        out = ffi.new("lecho_producer **")
        rc = lib.lecho_producer_open(ch._ch, policy.encode() if policy else ffi.NULL, out)
        ctx._loop_call(rc)
        self._p = out[0]
        self._ev = ctx._own(lib.lecho_value_new(ctx._x))

    def _load(self, ev):
        ctx = self.ctx
        if self._p is None or ctx._x is None:
            raise LechoError("closed", "producer is closed")
        if _ident() != ctx._thread:
            ctx._wrong_thread()
        ctx._set(self._ev, ev)

    def submit(self, ev):
        """Queues ev for every consumer; returns at once (under "block",
        first runs the loop until there is room)."""
        self._load(ev)
        rc = lib.lecho_submit(self._p, self._ev)
        self.ctx._loop_call(rc)
        self.ctx._kick()

    def submit_sync(self, ev, timeout=-1.0):
        """Submits ev and runs the loop until every consumer ran its
        handler on it (True), or raises SyncError (.errors per consumer).
        The wait is turns of at most 0.1 s (lecho_submit_sync_start), so
        Ctrl-C (KeyboardInterrupt) stops it at once; the abandoned wait
        ends with its timeout or the context's close."""
        self._load(ev)
        ctx = self.ctx
        out = ffi.new("lecho_value **")
        rc = lib.lecho_submit_sync_start(self._p, self._ev, float(timeout), out)
        ctx._loop_call(rc)
        holder = ctx._own(out[0])
        if ctx._block_pending(holder):
            return True
        return self._sync_result(ctx._pending_table(holder))

    async def submit_sync_async(self, ev, timeout=-1.0):
        """submit_sync() as an awaitable, for code inside a running asyncio
        loop (a Jupyter cell, asyncio.run): ev leaves now (lent arrays may
        change once this is called), the loop stays free while the
        consumers answer (lecho_submit_sync_start).  True, or SyncError as
        submit_sync()."""
        self._load(ev)
        ctx = self.ctx
        out = ffi.new("lecho_value **")
        rc = lib.lecho_submit_sync_start(self._p, self._ev, float(timeout), out)
        ctx._loop_call(rc)
        holder = ctx._own(out[0])
        ctx._kick()
        return self._sync_result(await ctx._await_pending(holder))

    def _sync_result(self, r):
        """True, or SyncError from a finished lecho_submit_sync_start table.
        Its errors are never empty: a failure decided here before any
        consumer was asked (noconsumer at once: the channel has no consumer
        anywhere; a closed producer or context) is one entry with this
        context's address and consumer ""."""
        if r.get("ok"):
            return True
        flat = r.get("errors") or []
        if isinstance(flat, dict):   # holes (nil fields) make a dict
            flat = [flat.get(i) for i in range(1, max([k for k in flat if isinstance(k, int)] or [0]) + 1)]
        lst = [{"context": flat[i] or "", "consumer": flat[i + 1] or "", "message": flat[i + 2] or "",
                "code": flat[i + 3] or ""} for i in range(0, len(flat) - 3, 4)]
        code, message = r.get("code") or "failed", r.get("message") or ""
        if not lst:
            lst = [{"context": self.ctx.address, "consumer": "", "message": message, "code": code}]
        raise SyncError(code, message, lst)

    def flush(self):
        self.ctx._check()
        if self._p is None:
            raise LechoError("closed", "producer is closed")
        rc = lib.lecho_flush(self._p)
        if rc != 0:
            self.ctx._fail(rc)

    def record(self, target):
        """Records every event this producer submits from now on: into the
        file at path target (a recorder of its own: doc/recording.md; a
        writer thread of the library, policy "block"; an existing file is
        refused), or into a Recorder of its context (ctx.recorder, with
        its options); None: no more (its own file closed)."""
        self.ctx._check()
        if self._p is None:
            raise LechoError("closed", "producer is closed")
        if isinstance(target, Recorder):
            if target.ctx is not self.ctx:
                raise LechoError("invalid", "p.record: a recorder of another context")
            rc = lib.lecho_producer_record_to(self._p, target._handle())
        elif target is None or isinstance(target, (str, os.PathLike)):
            rc = lib.lecho_producer_record(self._p, os.fsencode(target) if target is not None else ffi.NULL)
        else:
            raise TypeError("p.record: a file name, a Recorder (ctx.recorder) or None expected, not %s"
                            % type(target).__name__)
        if rc != 0:
            self.ctx._fail(rc)

    def close(self):
        if self._p is not None and self.ctx._x is not None:
            self.ctx._check()
            lib.lecho_producer_close(self._p)
        self._p = None


class Recorder:
    """A recording of a context's producers (ctx.recorder): flush(),
    stats(), close(); a context manager that closes.  Closed with its
    context at the latest."""

    def __init__(self, ctx, path, opts):
        self.ctx = ctx
        self.path = os.fspath(path)
        x = ctx._check()
        o = ctx._value(opts) if opts else ffi.NULL
        out = ffi.new("lecho_recorder **")
        rc = lib.lecho_recorder_open(x, os.fsencode(self.path), o, out)
        if rc != 0:
            ctx._fail(rc)
        self._r = out[0]
        self._last = None

    def _handle(self):
        self.ctx._check()
        if self._r is None:
            raise LechoError("closed", "recorder is closed")
        return self._r

    def flush(self, fsync=False):
        """Waits until every event its producers submitted is in the file
        (fsync=True: and on the disk)."""
        rc = lib.lecho_recorder_flush(self._handle(), 1 if fsync else 0)
        if rc != 0:
            self.ctx._fail(rc)

    def stats(self):
        """{events (written), submitted, queued, dropped, lost, bytes,
        rotations, blocked, buffered, open, error}; after close(), the last
        ones."""
        if self._r is None and self._last is not None:
            return dict(self._last)
        v = lib.lecho_recorder_stats(self._handle())
        if v == ffi.NULL:
            self.ctx._fail(lib.LECHO_EFAILED)
        return self.ctx._read(self.ctx._own(v))

    def close(self):
        """Writes what is left, closes the file (its producers record
        nothing more); returns its last stats()."""
        if self._r is None:
            return dict(self._last or {})
        if self.ctx._x is None:     # closed with its context
            self._r = None
            return dict(self._last or {})
        r, self._r = self._handle(), None
        v = lib.lecho_recorder_close(r)
        self._last = self.ctx._read(self.ctx._own(v)) if v != ffi.NULL else {}
        return dict(self._last)

    def __enter__(self):
        return self

    def __exit__(self, etype, exc, tb):
        self.close()


class _Handled:
    """What consumers and services share: the cffi callback kept alive with
    the handle, the error text kept alive until C copied it."""

    def _dead(self):
        self._h = None

    def set_params(self, params):
        """Changes the modulator's params at every producer (the callback
        consumer's and the subscription's alike); returns once every
        producer applied them (runs the loop meanwhile)."""
        v = self.ctx._value(params)
        if self._h is None:
            raise LechoError("closed", "consumer is closed")
        rc = lib.lecho_consumer_set_params(self._h, v)
        self.ctx._loop_call(rc)

    def _set_on_error(self, fn):
        """fn(message) for the modulator's failures at producers
        (lecho_consumer_on_error); kept alive with the handle."""
        ctx = self.ctx
        where = "on_error of consumer on %s" % self.channel.name

        def call(msg, _ud):
            try:
                fn(_s(msg))
            except Exception as exc:
                try:
                    ctx.on_handler_error(where, exc)
                except Exception:
                    pass
            except BaseException as exc:   # KeyboardInterrupt: after the C call
                ctx._keep(exc)
        self._ecb = _callback(ctx, "lecho_error_fn", call)
        rc = lib.lecho_consumer_on_error(self._h, self._ecb, ffi.NULL)
        if rc != 0:
            self.close()
            ctx._fail(rc)


class Consumer(_Handled):
    def __init__(self, ch, fn, opts, raw=False):
        self.ctx = ctx = ch.ctx
        self.channel = ch
        self._fn = fn
        self._raw = raw
        self._err = None
        ctx._check()
        self._cb = _callback(ctx, "lecho_handler", self._trampoline, _INTERRUPTED_P)
        o = ctx._value(opts) if opts else ffi.NULL
        out = ffi.new("lecho_consumer **")
        rc = lib.lecho_consumer_open_opts(ch._ch, self._cb, ffi.NULL, o, out)
        ctx._loop_call(rc)
        self._h = out[0]
        ctx._handles.append(self)

    def _trampoline(self, ev, meta, ud):
        ctx = self.ctx
        try:
            r = _values.read(ev, self._raw, pin=lambda: ctx._pin_copy(ev))
            if not isinstance(r, tuple):
                raise LechoError(r, _s(lib.lecho_errmsg(ctx._x)))
            m = Meta(_s(meta.channel), _s(meta.producer), int(meta.seq))
            res = self._fn(r[0], m)
            if res is None or res is True:
                return ffi.NULL
            msg = str(res)
        except Exception as exc:
            msg = "%s: %s" % (type(exc).__name__, exc)
            try:
                ctx.on_handler_error("handler of consumer on %s" % self.channel.name, exc)
            except Exception:
                pass  # the event still fails with msg
        except BaseException as exc:  # KeyboardInterrupt, SystemExit: after the C call
            ctx._keep(exc)
            return _INTERRUPTED_P
        self._err = ffi.new("char[]", msg.encode("utf-8", "replace"))
        return self._err

    def close(self):
        if self._h is not None and self.ctx._x is not None:
            self.ctx._check()
            lib.lecho_consumer_close(self._h)
            self.ctx._handles.remove(self)
        self._h = None


class Subscription(_Handled):
    """A consumer as an iterator.  Its events wait in a queue inside the
    context (lecho_consumer_open_queued: no Python call per event) and are
    taken in batches.  At most maxsize wait; past it an event fails at this
    consumer (a submit_sync sees "queue full"), is counted in .dropped and
    logged once.  A producer's submit_sync returns true only once the code
    is done with the event: an event handed out counts as handled when the
    subscription is asked for the next one past its batch (the loop body
    ran), when done() is called, or when the subscription closes.

    A for loop that stops with an event out (break, return, an exception:
    Python tells its iterator none of these apart, it only closes it) fails
    that event ("not handled: the subscription's iterator stopped"), unless
    the loop runs inside `with sub:` (`async with sub:`): then the with
    block decides when it is left: by an exception, the event out fails;
    otherwise (break, return, or the loop went on and asked for more) it
    was handled.  sub.done() before a break counts it handled too.  Events
    taken and not handed out yet wait for the next loop; close() fails them
    and those still queued ("not handled: the subscription closed").
    doc/python.md "Subscriptions and callbacks"."""

    STOPPED = "not handled: the subscription's iterator stopped"

    BATCH = 4096

    def __init__(self, ch, opts, raw, maxsize, meta):
        self.ctx = ctx = ch.ctx
        self.channel = ch
        self._raw = raw
        self._meta = bool(meta)
        self._q = collections.deque()
        self._waiter = None
        self._dropped = 0
        self._dbox = None   # the value lecho_consumer_take fills when .dropped is read
        ctx._check()
        o = ctx._value(opts) if opts else ffi.NULL
        out = ffi.new("lecho_consumer **")
        rc = lib.lecho_consumer_open_queued(ch._ch, o, int(maxsize), out)
        ctx._loop_call(rc)
        self._h = out[0]
        self._box = ctx._own(lib.lecho_value_new(ctx._x))
        self._counts = ffi.new("size_t[2]")
        self._pending = False
        self._unsettled = 0   # events taken, not settled: the deque's and those handed out
        self._elsewhere = False  # a loop stopped in another thread (_stopped)
        self._with = 0           # inside `with sub:` blocks: they decide (__exit__)
        ctx._handles.append(self)

    def _settle(self, n, err=None):
        """The n oldest events handed out are done with (err None) or failed."""
        if n <= 0 or self._h is None or self.ctx._x is None:
            return
        self.ctx._check()
        rc = lib.lecho_consumer_settle(self._h, n, ffi.NULL if err is None else err.encode())
        if rc != 0:
            self.ctx._fail(rc)
        self._unsettled -= n

    def _handed(self):
        """How many events were handed out and not settled: those taken
        and no longer in the deque (however they left it)."""
        return self._unsettled - len(self._q)

    def done(self):
        """The events handed out so far are handled: their producers'
        submit_sync return now, not at the next batch (before a long wait
        in the loop body, say)."""
        n = self._handed()
        self._settle(n)

    def _stopped(self):
        """A loop over this stopped with an event out (its iterator was
        closed or collected: break, return and an exception alike).  Inside
        `with sub:` the block's exit decides; else the ones before it were
        handled and that one was not."""
        if self._with:
            return
        if threading.get_ident() != self.ctx._thread:
            self._elsewhere = True   # collected in another thread: answered
            return                   # at the next call in the context's
        self._elsewhere = False
        self._fail_last()

    def _fail_last(self):
        """The events handed out: all handled but the last, which failed."""
        n = self._handed()
        if n > 0:
            self._settle(n - 1)
            self._settle(1, self.STOPPED)

    def __enter__(self):
        self._with += 1
        return self

    def __exit__(self, etype, exc, tb):
        """Leaves `with sub:`: by an exception, the event out failed (the
        loop body raised); otherwise it was handled.  Closes the
        subscription."""
        self._with -= 1
        if self._h is not None and self.ctx._x is not None and etype is not None:
            self._fail_last()
        self.close()
        return False

    async def __aenter__(self):
        return self.__enter__()

    async def __aexit__(self, etype, exc, tb):
        return self.__exit__(etype, exc, tb)

    def _pop(self):
        return self._q.popleft()

    def _note_dropped(self, d):
        if d != self._dropped:
            if self._dropped == 0 and not self.ctx._quiet:
                sys.stderr.write("lecho: subscription on %s: queue full, events refused (.dropped)\n"
                                 % self.channel.name)
            self._dropped = d

    @property
    def dropped(self):
        """How many events the queue refused since the subscription opened
        (asked of the context at each read: current whether or not the
        loop was iterated since)."""
        if (self._h is not None and self.ctx._x is not None
                and threading.get_ident() == self.ctx._thread):
            c = ffi.new("size_t[2]")
            if self._dbox is None:
                self._dbox = self.ctx._own(lib.lecho_value_new(self.ctx._x))
            if lib.lecho_consumer_take(self._h, self._dbox, 0, 0, c, c + 1) == 0:
                self._note_dropped(c[1])
        return self._dropped

    def _fill(self):
        """Moves what the context queued into self._q; True if anything.
        Called with self._q empty: what was handed out is done with."""
        if self._h is None or self.ctx._x is None:
            return False
        self.ctx._check()
        if self._elsewhere:
            self._stopped()
        if self._unsettled:
            self.done()
        c = self._counts
        # A batch taken but not yet converted (a KeyboardInterrupt between
        # the two) stays in self._box: the next call converts it first, so
        # Ctrl-C never loses events that were taken.  The flag is set before
        # the take so that no signal can fall between the take and it.
        if not self._pending:
            self._pending = True
            c[0] = 0
            rc = lib.lecho_consumer_take(self._h, self._box, self.BATCH, self._meta, c, c + 1)
            if rc != 0:
                self._pending = False
                self.ctx._fail(rc)
        self._note_dropped(c[1])
        n = c[0]
        if n == 0:
            self._pending = False
            return False
        box = self._box
        evs, pinned = self.ctx._read(box, self._raw, pin=lambda: self.ctx._pin_owned(box), pinned=True)
        if pinned:
            # arrays of this batch point into it: the next batch gets a new box
            self._box = self.ctx._own(lib.lecho_value_new(self.ctx._x))
        if not isinstance(evs, list) or len(evs) != n:   # nil events: holes
            if isinstance(evs, list):     # the holes at its end
                evs = evs + [None] * (n - len(evs))
            else:
                evs = [evs.get(i) for i in range(1, n + 1)] if isinstance(evs, dict) else [None] * n
        if self._meta:   # { ev, producer, seq, channel } each; a nil ev makes a dict
            evs = [(e.get(1), Meta(e.get(4, ""), e.get(2, ""), e.get(3, 0))) if isinstance(e, dict)
                   else (e[0], Meta(e[3], e[1], e[2])) for e in evs]
            if self._raw:   # raw reads strings as bytes: Meta's are str, as consumer()'s
                evs = [(ev, Meta(_txt(m.channel), _txt(m.producer), m.seq)) for ev, m in evs]
        self._q.extend(evs)
        self._unsettled += len(evs)
        self._pending = False
        return True

    def get(self, timeout=None):
        """The next event, running the loop meanwhile; LechoError("timeout")
        after timeout seconds (None: waits)."""
        if _ident() != self.ctx._thread:
            self.ctx._wrong_thread()
        q = self._q
        if q or self._fill():
            return q.popleft()
        import time
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._h is None:
                raise LechoError("closed", "consumer is closed")
            left = 0.1 if end is None else min(0.1, end - time.monotonic())
            if left <= 0:
                raise LechoError("timeout", "no event within %g s" % timeout)
            # loop turns until an event is queued (at most left s: Ctrl-C
            # is seen between calls), not one Python call per turn
            ctx = self.ctx
            ctx._check()
            ctx._drain()
            ctx._loop_call(lib.lecho_consumer_wait(self._h, left))
            if self._fill():
                return self._pop()

    def __iter__(self):
        # a generator per loop: it learns (GeneratorExit at its yield) that
        # the loop stopped with an event out.  The events of a batch are
        # yielded straight from the deque: no Python call per event.
        q = self._q
        ev = None
        ctx = self.ctx
        while True:
            if _ident() != ctx._thread:   # once per batch, not per event
                ctx._wrong_thread()
            while q:
                ev = q.popleft()
                try:
                    yield ev
                except GeneratorExit:
                    self._stopped()
                    raise
            # the event handed out last is let go of before the wait: its
            # arrays' buffers can be read into again (doc/python.md)
            ev = None
            if self._h is None:
                return
            ev = self.get()
            try:
                yield ev
            except GeneratorExit:
                self._stopped()
                raise

    def __next__(self):
        if _ident() != self.ctx._thread:
            self.ctx._wrong_thread()
        if self._q:
            return self._pop()
        if self._h is None:
            raise StopIteration
        return self.get()

    def __aiter__(self):
        return _AsyncLoop(self)

    async def __anext__(self):
        import asyncio
        while not self._q and not self._fill():
            if self._h is None:
                raise StopAsyncIteration
            if self.ctx._asyncio is None:
                raise LechoError("invalid", "async iteration needs ctx.attach() (asyncio)")
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._pop()

    def _wake(self):
        """The asyncio ticker, after a loop turn: wakes an async iteration
        that waits, when events came."""
        w = self._waiter
        if w is not None and not w.done() and (self._q or self._fill()):
            w.set_result(None)

    def __len__(self):
        return len(self._q)

    def _dead(self):
        self._h = None
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def close(self):
        """Leaves.  The events handed out count as handled; those not
        handed out yet fail ("not handled: the subscription closed")."""
        if self._h is not None and self.ctx._x is not None:
            self.ctx._check()
            if self._elsewhere:
                self._stopped()
            self.done()
            lib.lecho_consumer_close(self._h)
            self.ctx._handles.remove(self)
            self._q.clear()   # answered as not handled by the close
        self._dead()


class _AsyncLoop:
    """The iterator of one `async for` over a Subscription.  An async
    generator would learn that the loop stopped only when asyncio closes it,
    later and from elsewhere; this object is dropped by the loop's own
    frame at once (break, return or an exception): __del__ tells the
    subscription a loop stopped (Subscription._stopped)."""

    __slots__ = ("sub",)

    def __init__(self, sub):
        self.sub = sub

    def __aiter__(self):
        return self

    def __anext__(self):
        return self.sub.__anext__()

    def __del__(self):
        try:
            self.sub._stopped()
        except Exception:
            pass   # a closed context: nothing to answer


class Service(_Handled):
    def __init__(self, ctx, name, fn, opts):
        self.ctx = ctx
        self.name = name
        self._fn = fn
        self._err = None
        ctx._check()
        self._cb = _callback(ctx, "lecho_service_fn", self._trampoline, _INTERRUPTED_P)
        o = ctx._value(opts) if opts else ffi.NULL
        out = ffi.new("lecho_service **")
        rc = lib.lecho_service_open(ctx._check(), name.encode(), self._cb, ffi.NULL, o, out)
        ctx._loop_call(rc)
        self._h = out[0]
        ctx._handles.append(self)

    def _trampoline(self, args, meta, result, ud):
        ctx = self.ctx
        try:
            a = _values.read(args, pin=lambda: ctx._pin_copy(args))
            m = _values.read(meta)
            if not isinstance(a, tuple) or not isinstance(m, tuple):
                raise LechoError("invalid", _s(lib.lecho_errmsg(ctx._x)))
            r = self._fn(a[0], m[0])
            ctx._set(result, r)
            return ffi.NULL
        except Exception as exc:
            msg = "%s: %s" % (type(exc).__name__, exc)
        except BaseException as exc:
            ctx._keep(exc)
            return _INTERRUPTED_P
        self._err = ffi.new("char[]", msg.encode("utf-8", "replace"))
        return self._err

    def close(self):
        if self._h is not None and self.ctx._x is not None:
            self.ctx._check()
            lib.lecho_service_close(self._h)
            self.ctx._handles.remove(self)
        self._h = None
