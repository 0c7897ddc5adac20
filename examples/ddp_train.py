"""An unmodified PyTorch DDP script: runs the same under torchrun and ddprun.

    PYTHON_EXEC=/usr/bin/python3 build/bin/ddprun --nproc_per_node=2 examples/ddp_train.py --steps 5
    build/bin/ddprun --nproc_per_node=1 examples/ddp_train.py --backend nccl   (one rank per GPU)
    ... examples/ddp_train.py --init tcp    (init_method="tcp://MASTER_ADDR:MASTER_PORT")

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
    parser.add_argument("--backend", choices=["gloo", "nccl"], default="gloo")
    parser.add_argument("--init", choices=["env", "tcp"], default="env",
                        help="env:// (torchrun's default) or tcp://MASTER_ADDR:MASTER_PORT")
    args = parser.parse_args()

    # A hang becomes an exit code (Gloo teardown can hang in torch 1.13, pytorch#56297).
    faulthandler.dump_traceback_later(120, exit=True)

    if args.init == "env":
        dist.init_process_group(args.backend, init_method="env://")
    else:
        addr = os.environ["MASTER_ADDR"]
        addr = f"[{addr}]" if ":" in addr else addr
        dist.init_process_group(args.backend,
                                init_method=f"tcp://{addr}:{os.environ['MASTER_PORT']}",
                                rank=int(os.environ["RANK"]),
                                world_size=int(os.environ["WORLD_SIZE"]))
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cpu")
    if args.backend == "nccl":  # one rank per GPU: LOCAL_RANK picks it
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    assert rank == int(os.environ["RANK"]) and world == int(os.environ["WORLD_SIZE"])

    torch.manual_seed(1234 + rank)  # different init per rank: DDP must broadcast rank 0's
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)).to(device)
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)

    gen = torch.Generator().manual_seed(42)
    x_all = torch.randn(64 * world, 16, generator=gen)
    y_all = x_all.sum(dim=1, keepdim=True)
    x, y = x_all[rank::world].to(device), y_all[rank::world].to(device)  # shard by rank

    first = last = None
    for _ in range(args.steps):
        opt.zero_grad()
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        first = loss.item() if first is None else first
        last = loss.item()

    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu()
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
