"""The chaos run's PyTorch trainer (docs/chaos.md): a DDP script on gloo whose
final parameters depend only on the step count, never on where it was
interrupted.

- Every rank builds the same model (seed 1234), resumes with
  ddprun.checkpoint.load() at start and saves model and optimizer (SGD with
  momentum) after every step.
- The batch of step s on rank r is drawn from a generator seeded with (s, r).
- Gradients are reduced by a DDP communication hook that all-gathers each
  bucket and adds the ranks' copies in rank order
  (tests/fixtures/ordered_sum.py): the sum is the same bits however DDP lays
  out its buckets (the first step after a start uses another layout than the
  rest, and a resumed run starts at any step).

Under --restart_policy=inplace (the worker has DDPRUN_INPLACE_FD) train()
runs inside ddprun.inprocess.run: when a peer fails, a survivor destroys its
group and calls train() again in its own process, which builds the model
again (seed 1234), resumes with load() and logs a new start line (same pid).
Under job (no DDPRUN_INPLACE_FD) run() calls train() once, as before.

Environment (set by bench/chaos/chaos.py):
  CHAOS_OUT      directory for rank<R>.log (start and commit lines) and,
                 at the end, final_rank<R>.json (every parameter's bytes)
  CHAOS_STEPS    steps of the job
  CHAOS_STEP_MS  sleep after each step (what makes the job last)
  CHAOS_CORRUPT_STEP  (optional) at this step every rank adds 1e-3 to the
                 first parameter's first element: the run must then differ
"""
import faulthandler
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import ddprun.checkpoint as ckpt
import ddprun.inprocess

# The hook is shared with tests/fixtures/inplace_ddp.py; this script runs from
# the repository (chaos.py starts it as bench/chaos/chaos_ddp.py).
sys.path.insert(1, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests",
                                "fixtures"))
from ordered_sum import ordered_sum_hook  # noqa: E402


def log(f, line):
    f.write(line + "\n")
    f.flush()


def final_params(model):
    out = []
    for name, p in model.state_dict().items():
        t = p.detach().contiguous().cpu()
        out.append({"name": name, "dtype": str(t.dtype).replace("torch.", ""),
                    "shape": list(t.shape), "hex": t.numpy().tobytes().hex()})
    return out


def train():
    """One attempt: the model, load(), the loop, the final parameters. Every
    value that a re-form may change (RANK, the checkpoint steps) is read here."""
    out_dir = os.environ["CHAOS_OUT"]
    steps = int(os.environ["CHAOS_STEPS"])
    step_s = int(os.environ.get("CHAOS_STEP_MS", "100")) / 1000.0
    corrupt = int(os.environ.get("CHAOS_CORRUPT_STEP", "-1"))
    rank = int(os.environ["RANK"])
    with open(os.path.join(out_dir, "rank%d.log" % rank), "a") as logf:
        torch.manual_seed(1234)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(),
                                    torch.nn.Linear(64, 8))
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        start = 0
        resumed = ckpt.load()
        if resumed is not None:
            step, state = resumed
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["opt"])
            start = step + 1
        log(logf, "start %d %d %d" % (time.monotonic_ns(), os.getpid(), start - 1))

        dist.init_process_group("gloo")
        ddp = DDP(model)
        ddp.register_comm_hook(None, ordered_sum_hook)
        for step in range(start, steps):
            g = torch.Generator().manual_seed(step * 1009 + rank)
            x = torch.randn(16, 32, generator=g)
            y = torch.randn(16, 8, generator=g)
            loss = torch.nn.functional.mse_loss(ddp(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step == corrupt:
                with torch.no_grad():
                    next(model.parameters()).view(-1)[0] += 1e-3
            ckpt.save({"model": model.state_dict(), "opt": opt.state_dict()}, step)
            log(logf, "commit %d %d" % (step, time.monotonic_ns()))
            time.sleep(step_s)

    with open(os.path.join(out_dir, "final_rank%d.json.tmp" % rank), "w") as f:
        json.dump({"step": steps - 1, "tensors": final_params(model)}, f)
    os.replace(os.path.join(out_dir, "final_rank%d.json.tmp" % rank),
               os.path.join(out_dir, "final_rank%d.json" % rank))
    # pytorch#56297: the DDP object must not hold the last reference to the
    # gloo group at exit.
    del ddp
    dist.barrier()
    dist.destroy_process_group()


def main():
    faulthandler.dump_traceback_later(int(os.environ.get("CHAOS_SCRIPT_TIMEOUT_S", "900")),
                                      exit=True)
    ddprun.inprocess.run(train)


if __name__ == "__main__":
    main()
