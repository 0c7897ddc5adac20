#!/usr/bin/env python3
"""What a checkpoint and an in-place recovery cost on this GPU with torch alone: the peers' figures.

    ddprun --nproc_per_node=1 tests/gpu/recovery_baselines.py OUT_JSON

Measured (world size 1: NCCL takes one rank per GPU and the machine has one):
- device -> pinned host and back, and device -> pageable host, GB/s (1 GiB, best of 3);
- torch.save of a state dict of CUDA tensors to /dev/shm and torch.load back onto the GPU
  (the peer of the checkpoint issue's in-memory save/load), GB/s, and that the loaded
  tensors are bit-identical;
- an NCCL process group formed on the launcher's store, aborted, and formed again in the
  same process (the in-place issue's re-form), seconds each, and an all-reduce after it;
- whether this NCCL has ncclCommShrink and whether torch exposes a shrink.
Prints one line per figure and writes OUT_JSON.
"""
import ctypes
import datetime
import glob
import json
import os
import sys
import time

import torch
import torch.distributed as dist

GiB = 1 << 30
res = {"torch": torch.__version__, "world_size": 1}


def best(f, n=3):
    ts = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        f()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return min(ts)


def copies():
    dev = torch.randn(GiB // 4, device="cuda")
    pinned = torch.empty(GiB // 4, pin_memory=True)
    pageable = torch.empty(GiB // 4)
    res["d2h_pinned_GBps"] = round(GiB / best(lambda: pinned.copy_(dev, non_blocking=True)) / 1e9, 2)
    res["h2d_pinned_GBps"] = round(GiB / best(lambda: dev.copy_(pinned, non_blocking=True)) / 1e9, 2)
    res["d2h_pageable_GBps"] = round(GiB / best(lambda: pageable.copy_(dev)) / 1e9, 2)


def save_load():
    state = {f"layer{i}.weight": torch.randn(GiB // 4 // 16, device="cuda") for i in range(16)}
    state["step"] = 7
    # Named after this process: two runs on one machine do not share the file.
    name = "recovery_baseline_%d.pt" % os.getpid()
    path = os.path.join("/dev/shm" if os.path.isdir("/dev/shm") else "/tmp", name)
    ts = best(lambda: torch.save(state, path))
    loaded = {}
    tl = best(lambda: loaded.update(torch.load(path, map_location="cuda")))
    same = all(torch.equal(state[k], loaded[k]) for k in state if k != "step") and loaded["step"] == 7
    os.unlink(path)
    res["torch_save_cuda_to_shm_GBps"] = round(GiB / ts / 1e9, 2)
    res["torch_load_shm_to_cuda_GBps"] = round(GiB / tl / 1e9, 2)
    res["torch_save_load_bit_identical"] = same


def nccl_reform():
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    store = dist.TCPStore(host, port, None, False, datetime.timedelta(seconds=30))
    x = torch.ones(1 << 20, device="cuda")
    times = {}
    for attempt in range(2):
        t0 = time.perf_counter()
        dist.init_process_group("nccl", store=dist.PrefixStore(f"reform{attempt}", store), rank=0, world_size=1,
                                timeout=datetime.timedelta(seconds=60))
        dist.all_reduce(x)  # NCCL forms its communicator lazily, at the first collective
        torch.cuda.synchronize()
        times[f"form{attempt}_s"] = round(time.perf_counter() - t0, 4)
        t0 = time.perf_counter()
        abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
        if abort is not None:
            abort()
            times[f"abort{attempt}_how"] = "distributed_c10d._abort_process_group"
        else:
            dist.destroy_process_group()
            times[f"abort{attempt}_how"] = "destroy_process_group"
        times[f"abort{attempt}_s"] = round(time.perf_counter() - t0, 4)
        if dist.is_initialized():
            dist.destroy_process_group()
    res["nccl_reform"] = times
    res["nccl_version"] = ".".join(map(str, torch.cuda.nccl.version()))
    res["torch_has_shrink_group"] = hasattr(dist, "shrink_group")
    syms = {}
    for lib in sorted(set(glob.glob(os.path.join(os.path.dirname(torch.__file__), "..", "nvidia", "nccl", "lib",
                                                 "libnccl.so*")) + glob.glob("/usr/local/cuda/lib*/libnccl.so*"))):
        try:
            syms[os.path.realpath(lib)] = hasattr(ctypes.CDLL(lib), "ncclCommShrink")
        except OSError as e:
            syms[lib] = str(e)
    res["ncclCommShrink_in"] = syms


def main():
    out = sys.argv[1]
    if not torch.cuda.is_available():
        print("SKIP recovery baselines: torch sees no GPU")
        json.dump({"skipped": "no GPU"}, open(out, "w"))
        return 0
    res["gpu"] = torch.cuda.get_device_name(0)
    for f in (copies, save_load, nccl_reform):
        try:
            f()
        except Exception as e:
            res[f.__name__ + "_error"] = repr(e)[:1000]
    for k, v in res.items():
        print(f"{k}: {v}")
    json.dump(res, open(out, "w"), indent=1)
    return 1 if any(k.endswith("_error") for k in res) else 0


if __name__ == "__main__":
    sys.exit(main())
