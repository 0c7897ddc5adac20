"""The README's quick tour: a plain PyTorch DDP training script (Gloo, CPU).

    PYTHON_EXEC=/usr/bin/python3 build/bin/ddprun --nproc_per_node=4 --max_restarts=2 \
        examples/train.py --epochs 3

It runs the same under torchrun. Each epoch trains a small regression MLP on a
synthetic data set that a DistributedSampler shards by rank; rank 0 prints the
epoch's mean loss (averaged over the ranks with an all_reduce), and at the end
every rank checks that its parameters equal rank 0's, as DDP keeps them.
"""
import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=1, help="passes over the data (default 1)")
    parser.add_argument("--batch-size", type=int, default=32, help="per rank (default 32)")
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()

    dist.init_process_group("gloo")  # MASTER_ADDR/PORT, RANK, WORLD_SIZE from the launcher
    rank, world = dist.get_rank(), dist.get_world_size()

    gen = torch.Generator().manual_seed(0)  # the same data set on every rank
    x = torch.randn(1024, 16, generator=gen)
    y = x @ torch.linspace(-1, 1, 16).unsqueeze(1) + 0.1 * torch.randn(1024, 1, generator=gen)
    sampler = DistributedSampler(TensorDataset(x, y), num_replicas=world, rank=rank, seed=0)
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size, sampler=sampler)

    torch.manual_seed(rank)  # different initial weights: DDP broadcasts rank 0's
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    loss_fn = nn.MSELoss()

    for epoch in range(1, args.epochs + 1):
        sampler.set_epoch(epoch)
        total, batches = torch.zeros(1), 0
        for xb, yb in loader:
            opt.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()  # gradients all-reduced across the ranks here
            opt.step()
            total += loss.detach()
            batches += 1
        dist.all_reduce(total)
        if rank == 0:
            print(f"epoch {epoch}/{args.epochs}: mean loss {total.item() / (batches * world):.4f}",
                  flush=True)

    # DDP keeps the replicas identical: every rank's parameters equal rank 0's.
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    ref = flat.clone()
    dist.broadcast(ref, src=0)
    if not torch.equal(flat, ref):
        raise SystemExit(f"rank {rank}: parameters differ from rank 0's")
    if rank == 0:
        print(f"done: {args.epochs} epoch(s) on {world} rank(s), replicas identical", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
