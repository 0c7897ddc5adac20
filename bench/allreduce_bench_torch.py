"""torch.distributed Gloo peer of allreduce_bench.cc (same sizes, same medians).
Run under ddprun with /usr/bin/python3 (Debian's torch 1.13):
    PYTHON_EXEC=/usr/bin/python3 build/bin/ddprun --nproc_per_node=2 bench/allreduce_bench_torch.py allreduce|latency|resnet50
latency: 4 KiB .. 1 MiB, 300 calls back to back, p10/p50/p90.
resnet50: per tensor blocking, per tensor issued at once, and the DDP reducer
(a module holding ResNet-50's 161 parameter shapes; backward of sum(p * c)
produces the gradients; DDP's step time minus the same step under no_sync()
is its exposed communication, the full DDP step is reported too).
"""
import os
import sys
import time

import torch
import torch.distributed as dist

mode = sys.argv[1] if len(sys.argv) > 1 else "allreduce"
dist.init_process_group("gloo")
n, rank = dist.get_world_size(), dist.get_rank()


def median_s(iters, fn):
    t = []
    for _ in range(iters):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        t.append(time.perf_counter() - t0)
    t.sort()
    return t[len(t) // 2]


def resnet50_sizes():
    p = []
    conv = lambda o, i, k: p.append((o, i, k, k))
    bn = lambda c: p.extend([(c,), (c,)])
    conv(64, 3, 7); bn(64)
    cin = 64
    for layer, blocks in enumerate([3, 4, 6, 3]):
        planes = 64 << layer
        for b in range(blocks):
            conv(planes, cin, 1); bn(planes)
            conv(planes, planes, 3); bn(planes)
            conv(planes * 4, planes, 1); bn(planes * 4)
            if b == 0:
                conv(planes * 4, cin, 1); bn(planes * 4)
            cin = planes * 4
    p += [(1000, 2048), (1000,)]
    return p


if mode == "allreduce":
    buf = torch.ones((256 << 20) // 4)
    size = 4096
    while size <= 256 << 20:
        t = buf[: size // 4]
        iters = 200 if size <= 1 << 20 else 30 if size <= 16 << 20 else 7
        dist.all_reduce(t)
        m = median_s(iters, lambda: dist.all_reduce(t))
        if rank == 0:
            print("torch allreduce bytes=%d ranks=%d median_ms=%.4f busbw_GBps=%.3f"
                  % (size, n, m * 1e3, size / m * 2 * (n - 1) / n / 1e9), flush=True)
        size *= 4
elif mode == "latency":
    buf = torch.ones((1 << 20) // 4)
    size = 4096
    while size <= 1 << 20:
        t = buf[: size // 4]
        dist.all_reduce(t)
        dist.barrier()
        lat = []
        for _ in range(300):
            t0 = time.perf_counter()
            dist.all_reduce(t)
            lat.append((time.perf_counter() - t0) * 1e3)
        lat.sort()
        if rank == 0:
            print("torch latency bytes=%d ranks=%d p10_ms=%.4f p50_ms=%.4f p90_ms=%.4f"
                  % (size, n, lat[30], lat[150], lat[270]), flush=True)
        size *= 4
else:
    shapes = resnet50_sizes()
    grads = [torch.full(s, 0.5) for s in shapes]
    if rank == 0:
        print("torch resnet50 tensors=%d values=%d" % (len(grads), sum(g.numel() for g in grads)))
    iters = 9
    blocking = median_s(iters, lambda: [dist.all_reduce(g) for g in grads])

    def issued():
        w = [dist.all_reduce(g, async_op=True) for g in grads]
        for x in w:
            x.wait()
    issued_s = median_s(iters, issued)

    class Params(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ps = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(s)) for s in shapes])
            self.cs = [torch.full(s, 0.5) for s in shapes]

        def forward(self):
            return sum((p * c).sum() for p, c in zip(self.ps, self.cs))

    model = torch.nn.parallel.DistributedDataParallel(Params())

    def ddp_step():
        model.zero_grad(set_to_none=False)
        model().backward()

    def local_step():
        with model.no_sync():
            model.zero_grad(set_to_none=False)
            model().backward()
    for _ in range(2):
        ddp_step()  # the first iterations rebuild buckets
    ddp_s = median_s(iters, ddp_step)
    local_s = median_s(iters, local_step)
    if rank == 0:
        print("torch resnet50 per_tensor_blocking_ms=%.1f" % (blocking * 1e3))
        print("torch resnet50 per_tensor_issued_ms=%.1f" % (issued_s * 1e3))
        print("torch resnet50 ddp_step_ms=%.1f no_sync_step_ms=%.1f ddp_comm_ms=%.1f"
              % (ddp_s * 1e3, local_s * 1e3, (ddp_s - local_s) * 1e3))
    del model
dist.barrier()
dist.destroy_process_group()
