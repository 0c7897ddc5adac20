"""In-place recovery for PyTorch workers (docs/recovery.md, --restart_policy=inplace).

    import ddprun.checkpoint as ckpt
    import ddprun.inprocess

    def train():
        dist.init_process_group("gloo")       # env:// from RANK, WORLD_SIZE, MASTER_*
        model = DDP(make_model())
        resumed = ckpt.load()                 # the newest step every rank committed
        ...
        dist.destroy_process_group()

    ddprun.inprocess.run(train)

run(fn) registers this process in its in-place control block (the agent's
memfd named by DDPRUN_INPLACE_FD; layout in
rendezvous/common/include/ddprun/rendezvous/common/inplace_layout.h) and calls
fn(). When a peer fails, the agent breaks the block at once; fn's collective
fails (gloo raises RuntimeError when a peer's socket closes), or the
watchdog thread raises PeerFailure in the main thread at its next Python
instruction. run() then destroys torch's default process group, waits for
the agent to publish the next round, applies its variables to os.environ
(RANK, WORLD_SIZE, MASTER_PORT, TORCHELASTIC_RESTART_COUNT, DDPRUN_CKPT_STEPS,
...: the new TORCHELASTIC_RESTART_COUNT gives torch's env:// rendezvous a
fresh /worker/attempt_N prefix in the agent's store), acknowledges it, and
calls fn() again in the same process: torch, CUDA and whatever fn's module
imported stay loaded.

What can be interrupted: Python code of fn (between bytecodes), and a gloo
collective whose peer process died or destroyed its group (its sockets
close). What cannot: a call that blocks in C without its peer's sockets
closing (a collective waiting on a live peer that is itself stuck in C, a
long sleep in C). Such a worker does not acknowledge the new round, and the
agent restarts it as a process after its deadline (10 s), with one line.

An exception is a peer's failure only if it is a RuntimeError (or
PeerFailure) and the block was broken by the agent within
DDPRUN_INPLACE_BREAK_WAIT seconds (default 5) of it; anything else
propagates, and the process exits non-zero as without run(). Outside ddprun,
or under --restart_policy=job (no DDPRUN_INPLACE_FD), run(fn) calls fn()
once.

fn returning normally ends run() with its result, unless the agent broke the
block while fn ran (a peer failed before fn's end, e.g. after the last
collective both completed): then the job restarts every rank from its
newest checkpoint, as torchrun restarts finished ranks with the others, and
run() re-forms and calls fn() again here, returning that call's result. A
peer that fails after fn returned finds this process gone; the agent starts
it again as a process.
"""
import ctypes
import mmap
import os
import struct
import sys
import threading
import time

from ddprun._fence import fence as _fence

__all__ = ["run", "PeerFailure", "Error"]

# The layout (rendezvous/common/include/ddprun/rendezvous/common/inplace_layout.h).
_MAGIC = b"DDPINPL1"
_VERSION = 1
_BLOCK_BYTES = 64 * 1024
_GENERATION = 16   # u64, agent
_STATE = 24        # u32, agent
_FLAGS = 28        # u32, worker
_ACK = 32          # u64, worker
_PID = 40          # u32, worker
_ENV_BYTES = 44    # u32, agent
_ROUND = 48        # u64, agent
_ENV = 64
_RUNNING, _BROKEN, _READY = 0, 1, 2
_FLAG_CAN_REFORM = 1

_ENV_FD = "DDPRUN_INPLACE_FD"
_ENV_READY_TIMEOUT = "DDPRUN_INPLACE_READY_TIMEOUT"  # seconds; default below
_ENV_BREAK_WAIT = "DDPRUN_INPLACE_BREAK_WAIT"        # seconds; default below
_DEFAULT_READY_TIMEOUT = 300.0
_DEFAULT_BREAK_WAIT = 5.0
_POLL_S = 0.002       # the waits' poll of the block
_WATCHDOG_S = 0.01    # the watchdog's


class Error(RuntimeError):
    """In-place recovery could not go on; the message says why and what to do."""


class PeerFailure(RuntimeError):
    """Raised in the main thread by run()'s watchdog: the agent broke this
    worker's group (a peer failed); fn's attempt ends and run() re-forms."""


class _Block:
    """This worker's control block, mapped once."""

    def __init__(self, text):
        try:
            fd = int(text)
            self.mm = mmap.mmap(fd, _BLOCK_BYTES, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except (ValueError, OSError) as e:
            raise Error("ddprun.inprocess: %s=%s is not the agent's in-place control block (%s); "
                        "do not set %s yourself" % (_ENV_FD, text, e, _ENV_FD)) from None
        if self.mm[:8] != _MAGIC or struct.unpack_from("<I", self.mm, 8)[0] != _VERSION:
            raise Error("ddprun.inprocess: %s=%s does not hold a control block of version %d; use "
                        "the ddprun this package came with" % (_ENV_FD, text, _VERSION))

    def _u32(self, off):
        return struct.unpack_from("<I", self.mm, off)[0]

    def _u64(self, off):
        return struct.unpack_from("<Q", self.mm, off)[0]

    def generation(self):
        return self._u64(_GENERATION)

    def state(self):
        return self._u32(_STATE)

    def ack(self):
        return self._u64(_ACK)

    def register(self):
        """inplace_layout.h, step 2: the pid first, then the flag."""
        struct.pack_into("<I", self.mm, _PID, os.getpid())
        struct.pack_into("<I", self.mm, _FLAGS, self._u32(_FLAGS) | _FLAG_CAN_REFORM)

    def set_ack(self, generation):
        struct.pack_into("<Q", self.mm, _ACK, generation)

    def broken_since(self, generation):
        """Whether the agent broke the group after `generation` was current
        (inplace_layout.h: state kBroken, or a newer generation)."""
        return self.state() == _BROKEN or self.generation() > generation

    def ready(self):
        """(generation, round, {name: value}) once a round newer than the
        last acknowledged one is published, else None (step 5: generation,
        state, the blob, then generation and state again)."""
        g = self.generation()
        if self.state() != _READY or g <= self.ack():
            return None
        n = self._u32(_ENV_BYTES)
        blob = bytes(self.mm[_ENV:_ENV + min(n, _BLOCK_BYTES - _ENV)])
        rnd = self._u64(_ROUND)
        if self.generation() != g or self.state() != _READY:
            return None
        env = {}
        for item in blob.split(b"\0"):
            if item:
                k, _, v = item.decode("utf-8", "surrogateescape").partition("=")
                env[k] = v
        return g, rnd, env


class _Watchdog:
    """Polls the block while fn runs; when the agent breaks the group it
    raises PeerFailure in the main thread (between Python instructions only:
    PyThreadState_SetAsyncExc). Armed per attempt; disarming also clears an
    exception it set but the main thread has not met yet."""

    def __init__(self, block, main_ident):
        self._block = block
        self._main = ctypes.c_ulong(main_ident)
        self._lock = threading.Lock()
        self._armed_at = None  # the generation the attempt started in
        self._thread = threading.Thread(target=self._loop, name="ddprun-inprocess", daemon=True)
        self._thread.start()

    def arm(self, generation):
        with self._lock:
            self._armed_at = generation

    def disarm(self):
        with self._lock:
            self._armed_at = None
            ctypes.pythonapi.PyThreadState_SetAsyncExc(self._main, None)

    def _loop(self):
        while True:
            time.sleep(_WATCHDOG_S)
            with self._lock:
                if self._armed_at is not None and self._block.broken_since(self._armed_at):
                    self._armed_at = None
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(
                        self._main, ctypes.py_object(PeerFailure))


def _seconds(name, default):
    text = os.environ.get(name, "")
    try:
        return float(text) if text else default
    except ValueError:
        raise Error("ddprun.inprocess: %s=%r is not a number of seconds; unset it or give e.g. 30"
                    % (name, text)) from None


def _peer_failed(block, generation, exc):
    """Whether `exc` ended fn's attempt because a peer failed: a
    RuntimeError, and the agent broke the block (now or within the wait)."""
    if not isinstance(exc, RuntimeError):
        return False
    deadline = time.monotonic() + _seconds(_ENV_BREAK_WAIT, _DEFAULT_BREAK_WAIT)
    while True:
        if block.broken_since(generation):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL_S)


def _destroy_process_group():
    """torch's default group, if fn left one (its sockets close, so peers
    still blocked on this process fail fast too)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return
    try:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception as e:  # a broken group may fail its own teardown; it is dropped anyway
        sys.stderr.write("ddprun.inprocess: %s destroying the broken process group: %s\n"
                         % (_fence(), e))
    import gc
    gc.collect()  # the group's last references (a DDP module of fn's frame) go now


def _restart_step_counting():
    """ddprun's start-up hook counts the steps of the first optimizer that
    steps (ddprun_hook/sitecustomize.py); fn's next call makes a new one, so
    the hook picks again. Without it the agent would see no progress from
    this process after the re-form (no first step, and a false hang)."""
    metrics = sys.modules.get("ddprun_metrics")
    state = getattr(metrics, "_hook_state", None) if metrics is not None else None
    if state is not None:
        state.optimizer = None
        state.pending_samples = 0
        state.saw_forward = False


def _wait_ready(block):
    timeout = _seconds(_ENV_READY_TIMEOUT, _DEFAULT_READY_TIMEOUT)
    deadline = time.monotonic() + timeout
    while True:
        got = block.ready()
        if got is not None:
            return got
        if time.monotonic() >= deadline:
            raise Error("ddprun.inprocess: %s the agent published no new round within %g s of the "
                        "failure; the process exits so that the agent restarts it (raise %s to "
                        "wait longer)" % (_fence(), timeout, _ENV_READY_TIMEOUT))
        time.sleep(_POLL_S)


def run(fn, *args, **kwargs):
    """Calls fn(*args, **kwargs) and returns its result; under
    --restart_policy=inplace calls it again in this process after each
    failure of a peer, also one that broke the group while fn ran and
    returned (the module's docstring). Call it from the main thread."""
    text = os.environ.get(_ENV_FD, "")
    if not text:
        return fn(*args, **kwargs)
    block = _Block(text)
    block.register()
    watchdog = _Watchdog(block, threading.main_thread().ident)
    while True:
        generation = block.ack()
        failed_at = None
        try:
            watchdog.arm(generation)
            try:
                result = fn(*args, **kwargs)
            finally:
                watchdog.disarm()
            if not block.broken_since(generation):
                return result
            result = None  # it may hold the broken group (a DDP module)
            # fn returned, but a peer failed while it ran (its last
            # collectives completed first, or the watchdog's exception had
            # not reached it yet): the job restarts every rank from the
            # newest checkpoint, as torchrun would; this one in its process.
            failed_at = time.monotonic()
            sys.stderr.write("ddprun.inprocess: %s rank %s: fn returned while a peer had failed; "
                             "re-forming in place to run it again with the job\n"
                             % (_fence(), os.environ.get("RANK", "?")))
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:
            if not _peer_failed(block, generation, e):
                raise
            failed_at = time.monotonic()
            sys.stderr.write("ddprun.inprocess: %s rank %s: %s: %s; re-forming in place\n"
                             % (_fence(), os.environ.get("RANK", "?"), type(e).__name__,
                                str(e).splitlines()[0] if str(e) else "a peer failed"))
        # Outside the except block: the exception and its frames (fn's model,
        # which holds the group) are gone.
        _destroy_process_group()
        new_generation, rnd, env = _wait_ready(block)
        os.environ.update(env)
        _restart_step_counting()
        block.set_ack(new_generation)
        sys.stderr.write("ddprun.inprocess: %s rank %s re-formed in place into round %d in %d ms\n"
                         % (_fence(), os.environ.get("RANK", "?"), rnd,
                            (time.monotonic() - failed_at) * 1000))
        sys.stderr.flush()
