"""ddprun worker SDK for Python, over the C API (ddp/c_api.h) with ctypes.

No PyTorch needed. Buffers may be numpy arrays (C-contiguous) or anything
with data_ptr(), numel() and dtype (torch tensors):

    import numpy as np, ddprun_sdk as ddp
    pg = ddp.init()                       # reads ddprun's environment
    a = np.ones(1000, np.float32)
    pg.allreduce(a)                       # in place, blocking
    w = pg.allreduce(a, op="avg", async_op=True); w.wait()

The library is found through $DDPRUN_SDK_LIB, next to this file, in ../lib
(the build tree) or ../.. (an install's lib/ddprun/python), then the system path.

Live metrics for ddprun's monitoring need no library (and no group), so a
plain PyTorch script can call them (pure Python, ddprun_metrics.py):

    ddp.step(samples=len(batch))     # one training step done
    ddp.scalar("loss", loss.item())  # a named value, shown and exported
"""
import ctypes
import os
import sys

__all__ = ["init", "step", "scalar", "ProcessGroup", "Reducer", "Work", "Error", "TimeoutError_", "PeerLostError", "reconfigure", "DTYPES", "OPS"]

DTYPES = {"float32": 0, "float16": 1, "bfloat16": 2, "float64": 3, "int32": 4, "int64": 5}
OPS = {"sum": 0, "avg": 1, "max": 2, "min": 3}
_CODES = {1: "invalid argument", 2: "timeout", 3: "connection", 4: "auth", 5: "state",
          6: "unsupported", 7: "internal", 8: "peer lost"}


class Error(RuntimeError):
    """A ddp error; .code is the C API status (2 timeout, 3 connection, ...)."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.kind = _CODES.get(code, "unknown")


class TimeoutError_(Error):
    pass


class PeerLostError(Error):
    """A peer of the group is gone (code 8): the collective failed at once and
    the group is aborted. Under --restart_policy=inplace, reconfigure(pg)
    gives the new round's group in this process."""


def _load():
    here = os.path.dirname(os.path.abspath(__file__))
    names = []
    if os.environ.get("DDPRUN_SDK_LIB"):
        names.append(os.environ["DDPRUN_SDK_LIB"])
    for d in (here, os.path.join(here, "..", "lib"), os.path.join(here, "..", "..")):
        names.append(os.path.join(d, "libddprun_worker_sdk.so"))
    names.append("libddprun_worker_sdk.so")
    last = None
    for n in names:
        if os.path.sep in n and not os.path.exists(n):
            continue
        try:
            return ctypes.CDLL(n)
        except OSError as e:
            last = e
    raise ImportError("ddprun_sdk: cannot find libddprun_worker_sdk.so (set DDPRUN_SDK_LIB): %s" % last)


try:
    _lib = _load()
except ImportError as _e:  # step() and scalar() work without it; init() says why not
    _lib, _load_error = None, _e
_c = ctypes
_P, _SZ, _I = _c.c_void_p, _c.c_size_t, _c.c_int
for name, args, res in [
    ("ddp_last_error", [], _c.c_char_p),
    ("ddp_init", [_P, _c.POINTER(_P)], _I),
    ("ddp_group_destroy", [_P], None),
    ("ddp_rank", [_P], _I), ("ddp_world_size", [_P], _I), ("ddp_local_rank", [_P], _I),
    ("ddp_backend", [_P], _I), ("ddp_round", [_P], _c.c_int64),
    ("ddp_abort", [_P, _c.c_char_p], _I),
    ("ddp_reconfigure", [_P, _P], _I),
    ("ddp_allreduce", [_P, _P, _SZ, _I, _I, _c.POINTER(_P)], _I),
    ("ddp_broadcast", [_P, _P, _SZ, _I, _I, _c.POINTER(_P)], _I),
    ("ddp_allgather", [_P, _P, _P, _SZ, _I, _c.POINTER(_P)], _I),
    ("ddp_reduce_scatter", [_P, _P, _P, _SZ, _I, _I, _c.POINTER(_P)], _I),
    ("ddp_barrier", [_P, _c.POINTER(_P)], _I),
    ("ddp_work_wait", [_P, _c.c_double], _I),
    ("ddp_work_free", [_P], None),
    ("ddp_work_test", [_P, _c.POINTER(_c.c_int)], _I),
    ("ddp_reducer_create", [_P, _P, _c.POINTER(_P)], _I),
    ("ddp_reducer_destroy", [_P], None),
    ("ddp_reducer_register", [_P, _P, _SZ, _I, _c.POINTER(_SZ)], _I),
    ("ddp_reducer_gradient_buffer", [_P, _SZ, _c.POINTER(_P)], _I),
    ("ddp_reducer_mark_ready", [_P, _SZ], _I),
    ("ddp_reducer_finish", [_P], _I),
    ("ddp_reducer_set_require_sync", [_P, _I], _I),
    ("ddp_reducer_num_buckets", [_P], _SZ),
    ("ddp_broadcast_parameters", [_P, _c.POINTER(_P), _c.POINTER(_SZ), _c.POINTER(_I), _SZ, _I], _I),
    ("ddp_alloc_memory", [_P, _SZ, _c.POINTER(_P)], _I),
    ("ddp_free_memory", [_P, _P], _I),
]:
    if _lib is None:
        break
    f = getattr(_lib, name)
    f.argtypes, f.restype = args, res


def _check(status):
    if status != 0:
        msg = _lib.ddp_last_error().decode("utf-8", "replace")
        raise {2: TimeoutError_, 8: PeerLostError}.get(status, Error)(status, msg)


def _choice(table, key, what):
    """table[key], or an Error that lists the valid names."""
    try:
        return table[key]
    except (KeyError, TypeError):
        raise Error(1, "unknown %s %r (one of: %s)" % (what, key, ", ".join(map(str, table)))) from None


def _buffer(x, writes=True):
    """(pointer, element count, dtype code) of a numpy array or a tensor-like.
    writes=False for a buffer the call only reads (a read-only array is fine)."""
    if hasattr(x, "data_ptr"):  # torch.Tensor and friends
        if hasattr(x, "is_contiguous") and not x.is_contiguous():
            raise Error(1, "tensor is not contiguous")
        name = str(x.dtype).replace("torch.", "")
        if name not in DTYPES:
            raise Error(1, "unsupported dtype %s (supported: %s)" % (name, ", ".join(DTYPES)))
        return x.data_ptr(), int(x.numel()), DTYPES[name]
    if hasattr(x, "__array_interface__"):
        ai = x.__array_interface__
        if ai.get("strides") is not None and not x.flags["C_CONTIGUOUS"]:
            raise Error(1, "array is not C-contiguous")
        if writes and getattr(x, "flags", None) is not None and not x.flags["WRITEABLE"]:
            raise Error(1, "array is read-only")
        name = str(x.dtype)
        if name not in DTYPES:
            # numpy has no bfloat16: pass a torch.bfloat16 tensor for that
            raise Error(1, "unsupported dtype %s (supported: %s)" % (name, ", ".join(DTYPES)))
        return ai["data"][0], int(x.size), DTYPES[name]
    raise Error(1, "expected a numpy array or an object with data_ptr(), got %s" % type(x).__name__)


class Work:
    """Handle of an asynchronous collective; wait() raises Error on failure."""

    def __init__(self, handle, keep):
        self._h, self._keep = handle, keep

    def is_completed(self):
        """True once the collective is done (without blocking); raises its error."""
        if self._h is None:
            return True
        done = ctypes.c_int(0)
        _check(_lib.ddp_work_test(self._h, ctypes.byref(done)))
        return bool(done.value)

    def wait(self, timeout=0.0):
        if self._h is None:
            return
        h, self._h = self._h, None
        _check(_lib.ddp_work_wait(h, float(timeout)))

    def __del__(self):
        # A handle dropped without wait() still completes before the arrays it
        # keeps alive can be freed (the backend writes into them until then);
        # its error, if any, is the group's and the next call reports it.
        h = getattr(self, "_h", None)
        if h:
            self._h = None
            try:
                _lib.ddp_work_wait(h, 0.0)
            except Exception:  # interpreter shutdown
                pass


class _Memory:
    """One ddp_alloc_memory block, freed when the last array over it goes."""

    def __init__(self, group, p):
        self._group, self._p = group, p

    def __del__(self):
        if self._p and getattr(self._group, "_h", None):
            _lib.ddp_free_memory(self._group._h, self._p)
            self._p = None


class ProcessGroup:
    def __init__(self, backend=0, timeout=0.0):
        if _lib is None:
            raise _load_error

        class Opts(ctypes.Structure):
            _fields_ = [("backend", ctypes.c_int), ("timeout_sec", ctypes.c_double)]
        b = backend if isinstance(backend, int) else \
            _choice({"auto": 0, "gloo": 1, "nccl": 2}, backend, "backend")
        self._opts = Opts(b, float(timeout))
        self._h = _P()
        _check(_lib.ddp_init(ctypes.byref(self._opts), ctypes.byref(self._h)))

    rank = property(lambda self: _lib.ddp_rank(self._h))
    size = property(lambda self: _lib.ddp_world_size(self._h))
    local_rank = property(lambda self: _lib.ddp_local_rank(self._h))
    round = property(lambda self: _lib.ddp_round(self._h))

    def _run(self, fn, args, keep, async_op):
        w = _P()
        _check(fn(self._h, *args, ctypes.byref(w) if async_op else None))
        return Work(w, keep) if async_op else None

    def allreduce(self, x, op="sum", async_op=False):
        p, n, d = _buffer(x)
        return self._run(_lib.ddp_allreduce, (p, n, d, _choice(OPS, op, "op")), x, async_op)

    def broadcast(self, x, root=0, async_op=False):
        p, n, d = _buffer(x)
        return self._run(_lib.ddp_broadcast, (p, n, d, root), x, async_op)

    def allgather(self, inp, out, async_op=False):
        p, n, d = _buffer(inp, writes=False)
        q, m, e = _buffer(out)
        if e != d or m != n * self.size:
            raise Error(1, "allgather: out must hold world_size * len(in) elements of in's dtype")
        return self._run(_lib.ddp_allgather, (p, q, n, d), (inp, out), async_op)

    def reduce_scatter(self, inp, out, op="sum", async_op=False):
        p, n, d = _buffer(inp, writes=False)
        q, m, e = _buffer(out)
        if e != d or n != m * self.size:
            raise Error(1, "reduce_scatter: in must hold world_size * len(out) elements of out's dtype")
        return self._run(_lib.ddp_reduce_scatter, (p, q, m, d, _choice(OPS, op, "op")), (inp, out),
                         async_op)

    def barrier(self, async_op=False):
        return self._run(_lib.ddp_barrier, (), None, async_op)

    def broadcast_parameters(self, tensors, root=0):
        bufs = [_buffer(t) for t in tensors]
        n = len(bufs)
        ptrs = (_P * n)(*[b[0] for b in bufs])
        counts = (_SZ * n)(*[b[1] for b in bufs])
        dts = (_I * n)(*[b[2] for b in bufs])
        _check(_lib.ddp_broadcast_parameters(self._h, ptrs, counts, dts, n, root))

    def empty(self, shape, dtype="float32"):
        """A zero-filled numpy array in memory this group reduces fastest
        (ddp_alloc_memory: on CPU ranks of one host, shared memory that large
        all-reduces fold in place). Freed when the array is garbage
        collected; it keeps the group alive until then."""
        import numpy as np
        dt = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64)) if np.ndim(shape) else int(shape)
        nbytes = max(count * dt.itemsize, 1)
        p = _P()
        _check(_lib.ddp_alloc_memory(self._h, nbytes, ctypes.byref(p)))
        raw = (ctypes.c_char * nbytes).from_address(p.value)
        raw._owner = _Memory(self, p)  # freed with the last view of raw
        return np.frombuffer(raw, dt, count).reshape(shape)

    def abort(self, reason=""):
        _check(_lib.ddp_abort(self._h, reason.encode()))

    def __del__(self):
        if getattr(self, "_h", None):
            _lib.ddp_group_destroy(self._h)
            self._h = None


class Reducer:
    """Bucketed gradient all-reduce; see ddp/reducer.h. Register gradients in
    model order, mark_ready(i) during backward, finish() after it."""

    def __init__(self, group, bucket_cap_bytes=0, first_bucket_bytes=0,
                 gradient_as_bucket_view=False, compression=None, average=True):
        class Opts(ctypes.Structure):
            _fields_ = [("bucket_cap_bytes", ctypes.c_size_t), ("first_bucket_bytes", ctypes.c_size_t),
                        ("gradient_as_bucket_view", ctypes.c_int), ("compression", ctypes.c_int),
                        ("no_average", ctypes.c_int)]
        comp = _choice({None: 0, "fp16": 1, "bf16": 2}, compression, "compression")
        self._opts = Opts(bucket_cap_bytes, first_bucket_bytes, int(gradient_as_bucket_view), comp,
                          0 if average else 1)
        self._group = group  # keeps the group alive
        self._keep = []
        self._specs = []  # (count, dtype code, shape) per gradient
        self._h = _P()
        _check(_lib.ddp_reducer_create(group._h, ctypes.byref(self._opts), ctypes.byref(self._h)))

    def register(self, grad):
        p, n, d = _buffer(grad)
        i = _SZ()
        _check(_lib.ddp_reducer_register(self._h, p, n, d, ctypes.byref(i)))
        self._keep.append(grad)
        self._specs.append((n, d, tuple(getattr(grad, "shape", (n,)))))
        return i.value

    def gradient_buffer(self, i):
        """Where gradient i must be written: with gradient_as_bucket_view, a
        numpy view into its bucket (the averaged result is there after
        finish()); without, a view of the registered buffer. Shape and dtype
        are the gradient's (bfloat16: uint16 holding the bits). The view keeps
        the Reducer alive."""
        import numpy as np
        p = _P()
        _check(_lib.ddp_reducer_gradient_buffer(self._h, i, ctypes.byref(p)))
        n, d, shape = self._specs[i]
        dtype = np.dtype({0: "float32", 1: "float16", 2: "uint16", 3: "float64", 4: "int32",
                          5: "int64"}[d])
        if n == 0 or not p.value:
            return np.zeros(shape, dtype)
        raw = (ctypes.c_char * (n * dtype.itemsize)).from_address(p.value)
        raw._owner = self  # the bucket lives as long as the Reducer
        return np.frombuffer(raw, dtype, n).reshape(shape)

    def mark_ready(self, i):
        _check(_lib.ddp_reducer_mark_ready(self._h, i))

    def finish(self):
        _check(_lib.ddp_reducer_finish(self._h))

    def no_sync(self):
        reducer = self

        class _NoSync:
            def __enter__(self):
                _check(_lib.ddp_reducer_set_require_sync(reducer._h, 0))

            def __exit__(self, *exc):
                _check(_lib.ddp_reducer_set_require_sync(reducer._h, 1))
        return _NoSync()

    @property
    def num_buckets(self):
        return _lib.ddp_reducer_num_buckets(self._h)

    def __del__(self):
        if getattr(self, "_h", None):
            _lib.ddp_reducer_destroy(self._h)
            self._h = None


def reconfigure(pg):
    """ddp_reconfigure: under --restart_policy=inplace, after a PeerLostError,
    replaces pg's broken group by the new round's in this process and returns
    pg (rank, size and round are the new round's). Reducers of the old group
    must be made again. Error (code 5) without the in-place control block."""
    if _lib is None:
        raise _load_error
    _check(_lib.ddp_reconfigure(pg._h, ctypes.byref(pg._opts)))
    return pg


def init(backend="auto", timeout=0.0):
    """ddp_init: reads ddprun's environment and bootstraps this round's communicator."""
    if _lib is None:
        raise _load_error
    return ProcessGroup(backend, timeout)


def _metrics():
    try:
        import ddprun_metrics
    except ImportError:  # next to this file, wherever that is
        import importlib.util
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ddprun_metrics.py")
        spec = importlib.util.spec_from_file_location("ddprun_metrics", path)
        ddprun_metrics = importlib.util.module_from_spec(spec)
        sys.modules["ddprun_metrics"] = ddprun_metrics
        spec.loader.exec_module(ddprun_metrics)
    return ddprun_metrics


def step(samples=None):
    """One training step done, with `samples` samples (None: unknown). Under
    ddprun, a few stores into a shared page; otherwise nothing. Once called,
    ddprun counts these steps instead of the optimizer's."""
    _metrics().step(samples)


def scalar(name, value):
    """Sets a named scalar (1-119 printable ASCII bytes, at most 256 names).
    Returns False when refused, or when not under ddprun."""
    return _metrics().scalar(name, value)
