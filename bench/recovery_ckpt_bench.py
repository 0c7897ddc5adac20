#!/usr/bin/env python3
"""The whole user-visible recovery with checkpoints (issue 28), in one run.

Two ranks (PyTorch, gloo), each holding --size bytes of float32 tensors (64
MiB each) as its training state, checkpoint every step, and rank 1 kills
itself with SIGKILL (kill -9) at the start of step --kill_at. Measured: from
that kill to the moment the slower restarted rank has finished its first
training step after resuming (the state restored into the tensors it
trains, then one step: a change to the state and an all_reduce). Both runs
use the same script; only the checkpoint differs:

  ddprun    ddprun --nproc_per_node=2 --max_restarts=1: ddprun.checkpoint.save
            every step into the agent's memory, ddprun.checkpoint.load on
            restart (from memory, nothing read from storage);
  torchrun  torch 1.13's torchrun (bench/torchrun_compat.py, c10d rendezvous
            on a free loopback port, --monitor_interval=0.1: its fastest
            failure detection; the default 5 s would add seconds): torch.save
            to a file in --dir every step, torch.load of it on restart (the
            file in the page cache, as it is right after the failure).

Each run also reports where the restarted workers spent the time (their
start to the state loaded, the load itself). The recovery includes the
restarted processes' `import torch` and init_process_group on both sides.

    python3 bench/recovery_ckpt_bench.py [--size 1GiB] [--kill_at 2] [--build build] [--dir /tmp]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

from ckpt_bench_common import (DEFAULT_BUILD, HERE, free_port, job_env, load_average, parse_size,
                               python_exec, write_worker)

WORKER = r'''
import json, os, signal, sys, time
t_start = time.time()
import torch, torch.distributed as dist

mode, out, size, kill_at, steps, folder = (sys.argv[1], sys.argv[2], int(sys.argv[3]),
                                           int(sys.argv[4]), int(sys.argv[5]), sys.argv[6])
rank, attempt = int(os.environ["RANK"]), os.environ["TORCHELASTIC_RESTART_COUNT"]
dist.init_process_group("gloo")
chunk, state, i = 64 << 20, {}, 0
while i * chunk < size:
    state["t%03d" % i] = torch.full((min(chunk, size - i * chunk) // 4,), float(rank))
    i += 1
path = os.path.join(folder, "recovery_bench_rank%d.pt" % rank)
start = 0
t0 = time.time()
if mode == "ddprun":
    import ddprun.checkpoint as ckpt
    resumed = ckpt.load()
else:
    resumed = None
    if attempt != "0":
        saved = torch.load(path)
        resumed = (saved.pop("step"), saved)
t_load = time.time() - t0
if resumed is not None:
    step, saved = resumed
    for k, v in state.items():
        v.copy_(saved[k])   # as load_state_dict does
    del saved, resumed
    start = step + 1
t_loaded = time.time()
for step in range(start, steps):
    if step == kill_at and rank == 1 and attempt == "0":
        with open(os.path.join(out, "fail"), "w") as f:
            f.write(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)
    state["t000"][:1024] += 1                  # the step: a change and an all_reduce
    x = torch.ones(1 << 16)
    dist.all_reduce(x)
    if attempt != "0" and step == start:
        with open(os.path.join(out, "first%d.json" % rank), "w") as f:
            json.dump({"t": time.time(), "start_to_loaded": t_loaded - t_start,
                       "load": t_load, "step": step}, f)
    if mode == "ddprun":
        ckpt.save(state, step)
    else:
        torch.save(dict(state, step=step), path + ".tmp")
        os.replace(path + ".tmp", path)
if mode != "ddprun":
    os.unlink(path)
dist.barrier()
dist.destroy_process_group()
'''


def run(name, cmd, env, out):
    r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=1800)
    if r.returncode != 0:
        sys.exit("the %s run failed (exit %d):\n%s" % (name, r.returncode, r.stdout[-12000:]))
    fail = float(open(os.path.join(out, "fail")).read())
    firsts = [json.load(open(os.path.join(out, "first%d.json" % k))) for k in (0, 1)]
    return {"recovery": max(f["t"] for f in firsts) - fail,
            "start_to_loaded": max(f["start_to_loaded"] for f in firsts),
            "load": max(f["load"] for f in firsts),
            "step": firsts[0]["step"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="1GiB", help="state per rank (default 1GiB)")
    ap.add_argument("--kill_at", type=int, default=2, help="the step rank 1 dies at (default 2)")
    ap.add_argument("--build", default=DEFAULT_BUILD)
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where torch.save writes")
    args = ap.parse_args()
    size = parse_size(args.size)
    build = os.path.abspath(args.build)
    python = python_exec()
    steps = args.kill_at + 2
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        script = write_worker(tmp, WORKER)
        env = job_env(build, python)
        for name in ("ddprun", "torchrun"):
            out = os.path.join(tmp, name)
            os.mkdir(out)
            worker_args = [script, name, out, str(size), str(args.kill_at), str(steps), args.dir]
            if name == "ddprun":
                cmd = [os.path.join(build, "bin", "ddprun"), "--nproc_per_node=2",
                       "--max_restarts=1", "--ckpt_shm_limit=%dMiB" % ((size >> 20) + 64)]
            else:
                cmd = [python, os.path.join(HERE, "torchrun_compat.py"), "--nnodes=1",
                       "--nproc_per_node=2", "--max_restarts=1", "--monitor_interval=0.1",
                       "--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:%d" % free_port(),
                       "--rdzv_id=recovery-bench"]
            rows[name] = run(name, cmd + worker_args, env, out)
    d, t = rows["ddprun"], rows["torchrun"]
    print("2 ranks x %s of float32 state (gloo), checkpoint every step, rank 1 kill -9 at step %d"
          % (args.size, args.kill_at))
    print(load_average())
    print("| | ddprun + ddprun.checkpoint | torchrun + torch.save/torch.load | ratio |")
    print("|---|---|---|---|")
    print("| kill -9 to the first step after it done (slower rank) | %.2f s | %.2f s | %.1fx |"
          % (d["recovery"], t["recovery"], t["recovery"] / d["recovery"]))
    print("| restarted worker: its start to the state restored | %.2f s | %.2f s | %.1fx |"
          % (d["start_to_loaded"], t["start_to_loaded"], t["start_to_loaded"] / d["start_to_loaded"]))
    print("| of which the checkpoint load | %.2f s | %.2f s | %.1fx |"
          % (d["load"], t["load"], t["load"] / max(d["load"], 1e-9)))
    print("resumed at step %d (ddprun) and %d (torchrun)" % (d["step"], t["step"]))


if __name__ == "__main__":
    main()
