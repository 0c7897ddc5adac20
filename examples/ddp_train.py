"""An unmodified PyTorch DDP script: runs the same under torchrun and ddprun.

    PYTHON_EXEC=/usr/bin/python3 build/bin/ddprun --nproc_per_node=2 examples/ddp_train.py --steps 5

Trains a small MLP for a few steps on data sharded by rank, then checks that
every rank ends with identical parameters. With --out DIR each rank writes its
parameter checksum to DIR/rank<RANK>.txt.
"""
import argparse
import faulthandler
import hashlib
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--out", default="")
    args = parser.parse_args()

    # A hang becomes an exit code (Gloo teardown can hang in torch 1.13, pytorch#56297).
    faulthandler.dump_traceback_later(120, exit=True)

    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert rank == int(os.environ["RANK"]) and world == int(os.environ["WORLD_SIZE"])

    torch.manual_seed(1234 + rank)  # different init per rank: DDP must broadcast rank 0's
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)

    gen = torch.Generator().manual_seed(42)
    x_all = torch.randn(64 * world, 16, generator=gen)
    y_all = x_all.sum(dim=1, keepdim=True)
    x, y = x_all[rank::world], y_all[rank::world]  # shard by rank, like DistributedSampler

    first = last = None
    for _ in range(args.steps):
        opt.zero_grad()
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        first = loss.item() if first is None else first
        last = loss.item()

    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    digest = hashlib.sha256(flat.numpy().tobytes()).hexdigest()
    gathered = [None] * world
    dist.all_gather_object(gathered, digest)
    same = all(g == digest for g in gathered)
    print(f"rank {rank}/{world}: loss {first:.4f} -> {last:.4f}, params {digest[:12]}, "
          f"identical across ranks: {same}", flush=True)
    if args.out:
        with open(os.path.join(args.out, f"rank{rank}.txt"), "w") as f:
            f.write(f"{digest} {world} {first} {last}\n")

    del ddp
    dist.barrier()
    dist.destroy_process_group()
    sys.exit(0 if same and last < first else 3)


if __name__ == "__main__":
    main()
