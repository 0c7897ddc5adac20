"""The Python writer of ddprun's metrics channel (docs/monitoring-sources.md).

Pure Python (mmap + struct), no native library and no torch: used by the
start-up hook (ddprun_hook/sitecustomize.py) and by ddprun_sdk.step() and
ddprun_sdk.scalar(). The layout is rendezvous/include/ddprun/rendezvous/
metrics_channel.h, version 1; the offsets below are that header's.

Under ddprun, DDPRUN_METRICS_FILE names the channel the agent made for this
worker. Not under ddprun, or when the channel cannot be used, channel()
returns None and step()/scalar() return at once.
"""
import math
import mmap
import os
import struct
import sys
import time
from _thread import allocate_lock  # threading costs an import at start-up

__all__ = ["channel", "step", "scalar", "Channel"]

MAGIC = b"DDPRMET1"
VERSION = 1
LAYOUT_SIZE = 34176
STEP_RING = 64
MAX_SCALARS = 256
SCALAR_NAME_BYTES = 120

FLAG_PROGRESS = 1
FLAG_HOOK = 2
FLAG_COLLECTIVES = 4
FLAG_SAMPLES = 8

# Header
_OFF_OWNER = 16
_OFF_FLAGS = 24
_OFF_STACK_SIGNAL = 28
_OFF_PROGRESS_SEQ = 32
_OFF_COMM_SEQ = 40
_OFF_SCALARS_SEQ = 48
# ProgressSection at 64
_OFF_STEPS = 64
_OFF_SAMPLES = 72
_OFF_RING = 80
# CommSection at 592
_OFF_COMM_SECONDS = 608
# ScalarsSection at 1392
_OFF_SCALAR_COUNT = 1392
_OFF_SCALAR_DROPPED = 1400
_OFF_SLOTS = 1408
_SLOT = 128

_Q = struct.Struct("<Q")
_q = struct.Struct("<q")
_I = struct.Struct("<I")
_i = struct.Struct("<i")
_d = struct.Struct("<d")
_qd = struct.Struct("<qd")


def valid_name(name):
    """The channel's rule for a scalar's name: 1-119 bytes of printable ASCII, no spaces."""
    if not isinstance(name, str) or not 0 < len(name) < SCALAR_NAME_BYTES:
        return False
    return all("!" <= c <= "~" for c in name)


def _alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except OSError:
        return True


class Channel:
    """One process's writer over the shared mapping. Thread-safe."""

    def __init__(self, path):
        fd = os.open(path, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
        try:
            if os.fstat(fd).st_size < LAYOUT_SIZE:
                raise ValueError("the metrics channel %s is too small" % path)
            self._m = mmap.mmap(fd, LAYOUT_SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        m = self._m
        if m[0:8] != MAGIC or _I.unpack_from(m, 8)[0] != VERSION or \
                _I.unpack_from(m, 12)[0] != LAYOUT_SIZE:
            raise ValueError("the metrics channel %s has another layout (another ddprun version)"
                             % path)
        me = os.getpid()
        owner = _q.unpack_from(m, _OFF_OWNER)[0]
        if owner not in (0, me) and _alive(owner):
            raise PermissionError("the metrics channel belongs to process %d" % owner)
        _q.pack_into(m, _OFF_OWNER, me)
        self._lock = allocate_lock()
        self._slots = {}
        self._last_step = None
        self._alive = True
        # A forked child (a DataLoader worker) must not write: the parent owns it.
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._disown)

    def _disown(self):
        self._alive = False

    def add_flags(self, flags):
        with self._lock:
            old = _I.unpack_from(self._m, _OFF_FLAGS)[0]
            _I.pack_into(self._m, _OFF_FLAGS, old | flags)

    def set_stack_signal(self, signum):
        _i.pack_into(self._m, _OFF_STACK_SIGNAL, int(signum))

    def step(self, samples=None, seconds=None):
        """One step done; `samples` in it (None: unknown); `seconds` its
        duration (None: the time since the previous step)."""
        if not self._alive:
            return
        now = time.perf_counter()
        m = self._m
        with self._lock:
            if seconds is None:
                seconds = (now - self._last_step) if self._last_step is not None else math.nan
            self._last_step = now
            flags = _I.unpack_from(m, _OFF_FLAGS)[0]
            want = FLAG_PROGRESS | (FLAG_SAMPLES if samples is not None and samples >= 0 else 0)
            if flags & want != want:
                _I.pack_into(m, _OFF_FLAGS, flags | want)
            seq = _Q.unpack_from(m, _OFF_PROGRESS_SEQ)[0] | 1
            _Q.pack_into(m, _OFF_PROGRESS_SEQ, seq)
            steps, total = _qd.unpack_from(m, _OFF_STEPS)
            steps += 1
            if samples is not None and samples >= 0:
                total = (0.0 if total < 0 else total) + float(samples)
            _qd.pack_into(m, _OFF_STEPS, steps, total)
            _d.pack_into(m, _OFF_RING + 8 * ((steps - 1) % STEP_RING), float(seconds))
            _Q.pack_into(m, _OFF_PROGRESS_SEQ, seq + 1)

    def add_comm_seconds(self, seconds):
        """Adds `seconds` of waiting for other ranks to comm_seconds_total (the
        start-up hook's DDP all-reduce wait; the hub subtracts it from the
        step time to find stragglers). Ignores values that are not > 0."""
        if not self._alive or not seconds > 0:
            return
        m = self._m
        with self._lock:
            seq = _Q.unpack_from(m, _OFF_COMM_SEQ)[0] | 1
            _Q.pack_into(m, _OFF_COMM_SEQ, seq)
            total = _d.unpack_from(m, _OFF_COMM_SECONDS)[0]
            _d.pack_into(m, _OFF_COMM_SECONDS, total + float(seconds))
            _Q.pack_into(m, _OFF_COMM_SEQ, seq + 1)

    def scalar(self, name, value):
        """Sets a named scalar; False when the name is refused (counted as dropped)."""
        if not self._alive:
            return False
        m = self._m
        with self._lock:
            slot = self._slots.get(name)
            seq = _Q.unpack_from(m, _OFF_SCALARS_SEQ)[0] | 1
            if slot is None:
                count = _I.unpack_from(m, _OFF_SCALAR_COUNT)[0]
                if not valid_name(name) or count >= MAX_SCALARS:
                    _Q.pack_into(m, _OFF_SCALARS_SEQ, seq)
                    dropped = _q.unpack_from(m, _OFF_SCALAR_DROPPED)[0]
                    _q.pack_into(m, _OFF_SCALAR_DROPPED, dropped + 1)
                    _Q.pack_into(m, _OFF_SCALARS_SEQ, seq + 1)
                    return False
                slot = count
                self._slots[name] = slot
                _Q.pack_into(m, _OFF_SCALARS_SEQ, seq)
                off = _OFF_SLOTS + slot * _SLOT
                m[off:off + SCALAR_NAME_BYTES] = name.encode("ascii").ljust(SCALAR_NAME_BYTES,
                                                                            b"\0")
                _d.pack_into(m, off + SCALAR_NAME_BYTES, float(value))
                _I.pack_into(m, _OFF_SCALAR_COUNT, count + 1)
                _Q.pack_into(m, _OFF_SCALARS_SEQ, seq + 1)
                return True
            _Q.pack_into(m, _OFF_SCALARS_SEQ, seq)
            _d.pack_into(m, _OFF_SLOTS + slot * _SLOT + SCALAR_NAME_BYTES, float(value))
            _Q.pack_into(m, _OFF_SCALARS_SEQ, seq + 1)
            return True


_channel = None
_opened = False
_hook_state = None  # the start-up hook's state, when it counts optimizer steps
_open_lock = allocate_lock()


def channel():
    """This process's channel, opened once; None when not under ddprun or unusable."""
    global _channel, _opened
    if _opened:
        return _channel
    with _open_lock:
        if not _opened:
            path = os.environ.get("DDPRUN_METRICS_FILE")
            if path:
                try:
                    _channel = Channel(path)
                except PermissionError:
                    _channel = None  # a parent process of this worker reports
                except (OSError, ValueError) as e:
                    sys.stderr.write("ddprun: metrics off for this worker: %s\n" % e)
                    _channel = None
            _opened = True
    return _channel


def step(samples=None):
    """One training step done, with `samples` samples (None: unknown). The
    first call turns off the start-up hook's counting of optimizer steps."""
    ch = _channel if _opened else channel()
    if ch is not None:
        if _hook_state is not None:
            _hook_state.explicit = True
        ch.step(samples)


def scalar(name, value):
    """Sets a named scalar (loss, lr, tokens). False when refused or not under ddprun."""
    ch = _channel if _opened else channel()
    return ch.scalar(name, value) if ch is not None else False
