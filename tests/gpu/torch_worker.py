"""Workers for tests/gpu/torch_under_ddprun.py (PyTorch 2.x under ddprun).

    torch_worker.py record OUT   rank 1 raises inside a torchelastic @record main
    torch_worker.py restart OUT  rank 1 exits 1 in the first round (after init);
                                 every rank of the second round all-reduces and
                                 writes OUT/rank<R>.restart<C>
    torch_worker.py ckpt OUT     ddprun.checkpoint with CUDA tensors: the first
                                 round saves steps 1-3 and kills itself (SIGKILL);
                                 the second loads and checks step 3 bit for bit,
                                 device, dtype and shape; writes OUT/ckpt.<C>
                                 ("ok ..." or what differed)
"""
import os
import signal
import sys

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record


@record
def record_main(out):
    dist.init_process_group("gloo", init_method="env://")
    if dist.get_rank() == 1:
        raise RuntimeError(f"boom from rank 1 of {dist.get_world_size()} (torch {torch.__version__})")
    # The others wait to be stopped by the agent.
    dist.barrier()


def restart_main(out):
    restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    if restart == 0 and rank == 1:
        sys.exit(1)
    if restart == 0:
        dist.barrier()  # never returns: rank 1 is gone; the agent stops this worker
    t = torch.ones(4) * (rank + 1)
    dist.all_reduce(t)
    expect = world * (world + 1) / 2
    with open(os.path.join(out, f"rank{rank}.restart{restart}"), "w") as f:
        f.write(f"{t[0].item()} {expect}\n")
    dist.barrier()
    dist.destroy_process_group()
    sys.exit(0 if t[0].item() == expect else 3)


def ckpt_state(step, dev):
    """The state saved at `step`: CUDA tensors of several dtypes, a transposed
    (non-contiguous) one, a CPU tensor, nested containers and scalars."""
    g = torch.Generator().manual_seed(1234 + step)
    w = torch.randn(1024, 1024, generator=g)
    return {"model": {"w": w.to(dev), "half": w[:16].to(dev, torch.float16),
                      "bf16": (w[1] * 3).to(dev, torch.bfloat16),
                      "idx": torch.arange(1000, device=dev) * step, "t": w[:8].to(dev).t()},
            "cpu": w[:2].clone(), "step": step, "list": [w[3:5].to(dev), 7.5, "x"]}


def ckpt_diff(got, want, path="state"):
    """'' when `got` is `want` bit for bit (tensors: device, dtype, shape,
    values), else the first difference by key path."""
    if isinstance(want, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            return f"{path}: {type(got).__name__}, not a tensor"
        if (got.device, got.dtype, tuple(got.shape)) != (want.device, want.dtype, tuple(want.shape)):
            return (f"{path}: {got.device} {got.dtype} {tuple(got.shape)}, saved "
                    f"{want.device} {want.dtype} {tuple(want.shape)}")
        return "" if torch.equal(got.cpu(), want.cpu()) else f"{path}: values differ"
    if isinstance(want, dict):
        if sorted(got) != sorted(want):
            return f"{path}: keys {sorted(got)}, saved {sorted(want)}"
        return next((d for k in want for d in [ckpt_diff(got[k], want[k], f"{path}.{k}")] if d), "")
    if isinstance(want, (list, tuple)):
        if len(got) != len(want):
            return f"{path}: {len(got)} items, saved {len(want)}"
        return next((d for i, (a, b) in enumerate(zip(got, want))
                     for d in [ckpt_diff(a, b, f"{path}[{i}]")] if d), "")
    return "" if got == want else f"{path}: {got!r}, saved {want!r}"


def ckpt_main(out):
    import ddprun.checkpoint as ckpt
    restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    # DDPRUN_TEST_CKPT_DEVICE=cpu runs the same checks without a GPU.
    dev = torch.device(os.environ.get("DDPRUN_TEST_CKPT_DEVICE") or
                       f"cuda:{os.environ.get('LOCAL_RANK', '0')}")
    if restart == 0:
        if ckpt.load() is not None:
            raise SystemExit("a fresh job's load() did not return None")
        for step in (1, 2, 3):
            ckpt.save(ckpt_state(step, dev), step)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        os.kill(os.getpid(), signal.SIGKILL)
    loaded = ckpt.load()
    if loaded is None:
        why = "load() returned None after the restart"
    elif loaded[0] != 3:
        why = f"load() returned step {loaded[0]}, saved up to 3"
    else:
        why = ckpt_diff(loaded[1], ckpt_state(3, dev))
    with open(os.path.join(out, f"ckpt.{restart}"), "w") as f:
        f.write(f"ok step 3 on {dev}, bit-identical\n" if not why else why + "\n")
    sys.exit(3 if why else 0)


if __name__ == "__main__":
    {"record": record_main, "restart": restart_main, "ckpt": ckpt_main}[sys.argv[1]](sys.argv[2])
