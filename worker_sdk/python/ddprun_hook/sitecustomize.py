"""ddprun's start-up hook for Python workers (docs/monitoring-sources.md).

ddprun puts this directory first on the workers' PYTHONPATH, so Python runs
this file at start-up. It first runs the sitecustomize it shadows (the next
one on sys.path), then, under ddprun and unless DDPRUN_PYTHON_HOOK=0:

- registers faulthandler (all threads) on a real-time signal, writing to the
  worker's stack file (DDPRUN_STACK_FILE), so that the agent can take the
  Python stacks of a hung worker without stopping it;
- installs an import hook that never imports torch itself: when the script
  imports torch.optim, optimizer steps are counted and timed (torch 2.x:
  register_optimizer_step_post_hook; torch 1.x: the per-step profiling hook
  every optimizer calls, Optimizer._optimizer_step_code); when it imports
  torch.nn.parallel, DistributedDataParallel.forward in training mode adds
  the batch dimension of its first tensor input to the samples. Only the
  first optimizer that steps is counted (a GAN's second one is not);
- times each rank's wait for the others (docs/monitoring.md#stragglers):
  the part of backward() after the rank's own gradients are done (DDP's
  final all-reduce wait: an autograd final callback, queued from a hook on
  DDP's output when its gradient arrives, marks the end of the graph, and a
  wrapper of torch.autograd.backward the return) plus DDP's buffer
  broadcast in forward. On CUDA the two marks are CUDA events read a later
  step once complete (never a synchronisation). The wait goes to the
  channel's comm_seconds_total, which the hub subtracts from the step time.

Nothing here changes what the script computes: the wrappers call the
original and only read shapes and the clock. Any error in the hook turns the
hook off with one line on stderr; the script runs as without it.
"""
import os
import sys
import time

# The signal faulthandler dumps on: real-time, so that no library's handler
# (SIGUSR1/2: Slurm's warnings, torchelastic) is taken. The agent reads the
# number from the channel and sends nothing when it is 0.
_STACK_SIGNAL_OFFSET = 5  # SIGRTMIN + 5


def _chain():
    """Runs the sitecustomize this one shadows, as Python would have."""
    here = os.path.dirname(os.path.abspath(__file__))
    origin = None
    for d in sys.path:  # the next sitecustomize.py after ours, as the import system would find it
        if os.path.abspath(d or ".") == here:
            continue
        candidate = os.path.join(d or ".", "sitecustomize.py")
        if os.path.isfile(candidate):
            origin = candidate
            break
    if origin is None:
        return
    import types
    module = types.ModuleType("_ddprun_chained_sitecustomize")
    module.__file__ = origin
    sys.modules[module.__name__] = module
    with open(origin, "rb") as f:
        code = compile(f.read(), origin, "exec")
    exec(code, module.__dict__)


class _State:
    channel = None
    optimizer = None       # id() of the optimizer whose steps count
    pending_samples = 0
    saw_forward = False
    explicit = False       # ddprun_sdk.step() was called: the script counts


def _on_optimizer_step(optimizer, *unused):
    st = _State
    if st.explicit:
        return
    if st.optimizer is None:
        st.optimizer = id(optimizer)
    elif st.optimizer != id(optimizer):
        return
    samples = st.pending_samples if st.saw_forward else None
    st.pending_samples = 0
    st.channel.step(samples)


class _Wait:
    """The DDP wait timing's state (one backward at a time per process)."""
    off = False
    depth = 0            # nested torch.autograd.backward calls (reentrant checkpointing)
    queued = False       # the graph-done callback is queued for this backward
    graph_done = None    # perf_counter() when this backward's graph finished
    cuda = False         # DDP's output was on a CUDA device
    cuda_start = None    # the CUDA event recorded when the graph finished
    pending = []         # (start, end) CUDA event pairs not yet complete
    buffers_s = 0.0      # host time in DDP's buffer broadcast since the last backward


def _wait_failed(e):
    _Wait.off = True
    sys.stderr.write("ddprun: the Python hook stops timing DDP's all-reduce wait (%s); "
                     "steps are still counted\n" % e)


def _on_graph_done():
    """Autograd final callback: the backward graph (this rank's gradients) is done."""
    try:
        _Wait.graph_done = time.perf_counter()
        if _Wait.cuda:
            ev = sys.modules["torch"].cuda.Event(enable_timing=True)
            ev.record()
            _Wait.cuda_start = ev
    except Exception as e:
        _wait_failed(e)


def _on_output_grad(grad):
    """Hook on DDP's output: its gradient arrives first in backward. Queues
    _on_graph_done ahead of DDP's own final callback, which DDP queues only
    once its last bucket is ready. Returns None: the gradient is unchanged."""
    if not _Wait.queued and not _Wait.off and _Wait.depth > 0:
        _Wait.queued = True
        try:
            sys.modules["torch"].autograd.Variable._execution_engine.queue_callback(
                _on_graph_done)
        except Exception as e:
            _wait_failed(e)
    return None


def _drain_cuda(channel):
    """Adds the wait of every completed CUDA event pair; never waits."""
    keep = []
    for start, end in _Wait.pending:
        if end.query():
            channel.add_comm_seconds(start.elapsed_time(end) / 1000.0)
        else:
            keep.append((start, end))
    _Wait.pending = keep[-64:]  # bounded even if a device never completes


def _after_backward(channel):
    if _Wait.graph_done is None:
        return
    buffers_s, _Wait.buffers_s = _Wait.buffers_s, 0.0
    if _Wait.cuda:  # a broadcast on CUDA does not block the host: not counted
        if _Wait.cuda_start is not None:
            end = sys.modules["torch"].cuda.Event(enable_timing=True)
            end.record()
            _Wait.pending.append((_Wait.cuda_start, end))
        _drain_cuda(channel)
    else:
        channel.add_comm_seconds(time.perf_counter() - _Wait.graph_done + buffers_s)


def _patch_backward(autograd):
    original = autograd.backward

    def backward(*args, **kwargs):
        if _Wait.off:
            return original(*args, **kwargs)
        outer = _Wait.depth == 0
        if outer:
            _Wait.queued = False
            _Wait.graph_done = None
            _Wait.cuda_start = None
        _Wait.depth += 1
        try:
            result = original(*args, **kwargs)
        finally:
            _Wait.depth -= 1
        if outer:
            try:
                _after_backward(_State.channel)
            except Exception as e:
                _wait_failed(e)
        return result

    backward.__wrapped__ = original
    backward.__doc__ = original.__doc__
    autograd.backward = backward


def _first_grad_tensor(output):
    torch = sys.modules.get("torch")
    queue = [output]
    for depth in range(3):
        nested = []
        for x in queue:
            if isinstance(x, torch.Tensor):
                if x.requires_grad:
                    return x
            elif isinstance(x, (list, tuple)):
                nested.extend(x)
            elif isinstance(x, dict):
                nested.extend(x.values())
        queue = nested
    return None


def _first_batch_dim(args, kwargs):
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    tensor = torch.Tensor
    queue = list(args) + list(kwargs.values())
    for depth in range(3):
        nested = []
        for x in queue:
            if isinstance(x, tensor):
                return x.shape[0] if x.dim() > 0 else None
            if isinstance(x, (list, tuple)):
                nested.extend(x)
            elif isinstance(x, dict):
                nested.extend(x.values())
        queue = nested
    return None


def _patch_optimizer(module):
    hook = getattr(module, "register_optimizer_step_post_hook", None)
    if hook is not None:  # torch >= 2.0
        hook(lambda opt, args, kwargs: _on_optimizer_step(opt))
        return
    cls = getattr(module, "Optimizer", None)
    original = getattr(cls, "_optimizer_step_code", None)
    if original is None:
        raise RuntimeError("torch.optim.Optimizer has no step hook to use")

    def _optimizer_step_code(self):
        original(self)
        _on_optimizer_step(self)

    cls._optimizer_step_code = _optimizer_step_code


def _patch_ddp(module):
    cls = getattr(module, "DistributedDataParallel", None)
    if cls is None:
        return
    import functools
    original = cls.forward
    autograd = sys.modules.get("torch.autograd")
    if autograd is not None and not hasattr(autograd.backward, "__wrapped__"):
        _patch_backward(autograd)
    sync_buffers = getattr(cls, "_sync_buffers", None)
    if sync_buffers is not None:
        @functools.wraps(sync_buffers)
        def _sync_buffers(self, *args, **kwargs):
            t0 = time.perf_counter()
            try:
                return sync_buffers(self, *args, **kwargs)
            finally:
                _Wait.buffers_s += time.perf_counter() - t0  # a broadcast from rank 0

        cls._sync_buffers = _sync_buffers

    @functools.wraps(original)
    def forward(self, *args, **kwargs):
        if self.training:
            try:
                n = _first_batch_dim(args, kwargs)
            except Exception:  # never let monitoring break a forward
                n = None
            if n is not None:
                _State.saw_forward = True
                _State.pending_samples += int(n)
        output = original(self, *args, **kwargs)
        if self.training and not _Wait.off:
            try:
                t = _first_grad_tensor(output)
                if t is not None:
                    _Wait.cuda = t.is_cuda
                    t.register_hook(_on_output_grad)
            except Exception as e:
                _wait_failed(e)
        return output

    cls.forward = forward


_PATCHES = {"torch.optim.optimizer": _patch_optimizer,
            "torch.nn.parallel.distributed": _patch_ddp}


class _Finder:
    """Runs a patch right after one of _PATCHES' modules is executed."""

    def find_spec(self, name, path, target=None):
        patch = _PATCHES.get(name)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        original = loader.exec_module

        def exec_module(module):
            original(module)
            try:
                patch(module)
            except Exception as e:
                sys.stderr.write("ddprun: the Python hook could not patch %s (%s); "
                                 "steps are not counted\n" % (name, e))

        loader.exec_module = exec_module
        return spec


def _register_stacks(channel):
    path = os.environ.get("DDPRUN_STACK_FILE")
    if not path:
        return
    import faulthandler
    import signal
    signum = int(signal.SIGRTMIN) + _STACK_SIGNAL_OFFSET
    # Kept open for the life of the process: faulthandler writes to its fd.
    _register_stacks.file = open(path, "a")
    faulthandler.register(signum, file=_register_stacks.file, all_threads=True, chain=False)
    channel.set_stack_signal(signum)

    def _ignore_at_exit():
        # The interpreter's finalisation drops faulthandler's handler and
        # restores SIG_DFL, which would let a late stack request (a job that
        # ends while the hub suspects a hang) kill an exiting worker. Runs
        # last of the atexit handlers (registered first).
        try:
            channel.set_stack_signal(0)
            faulthandler.unregister(signum)
            signal.signal(signum, signal.SIG_IGN)
        except Exception:
            pass

    import atexit
    atexit.register(_ignore_at_exit)


def _install():
    if os.environ.get("DDPRUN_PYTHON_HOOK", "1") == "0" or not os.environ.get("DDPRUN_METRICS_FILE"):
        return
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if here not in sys.path:
        sys.path.append(here)  # ddprun_metrics, next to this directory
    import ddprun_metrics
    channel = ddprun_metrics.channel()
    if channel is None:
        return
    _State.channel = channel
    _register_stacks(channel)
    channel.add_flags(ddprun_metrics.FLAG_HOOK)
    ddprun_metrics._hook_state = _State  # ddprun_sdk.step() takes over from the hook
    if any(name in sys.modules for name in _PATCHES):  # imported before us (unusual)
        for name, patch in _PATCHES.items():
            if name in sys.modules:
                patch(sys.modules[name])
    sys.meta_path.insert(0, _Finder())


try:
    _chain()
except Exception as e:  # the shadowed sitecustomize's own error, as Python would print it
    sys.stderr.write("Error in sitecustomize; set PYTHONVERBOSE for traceback:\n%s: %s\n"
                     % (type(e).__name__, e))
try:
    _install()
except Exception as e:
    sys.stderr.write("ddprun: the Python hook is off for this worker: %s\n" % e)
