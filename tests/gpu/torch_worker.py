"""Workers for tests/gpu/torch_under_ddprun.py (PyTorch 2.x under ddprun).

    torch_worker.py record OUT   rank 1 raises inside a torchelastic @record main
    torch_worker.py restart OUT  rank 1 exits 1 in the first round (after init);
                                 every rank of the second round all-reduces and
                                 writes OUT/rank<R>.restart<C>
"""
import os
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


if __name__ == "__main__":
    {"record": record_main, "restart": restart_main}[sys.argv[1]](sys.argv[2])
