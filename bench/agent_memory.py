#!/usr/bin/env python3
"""The launcher's own memory while N workers run: VmRSS, and Pss (its share of
the pages it shares with other processes, from /proc/<pid>/smaps_rollup) and
threads, of the launcher process alone, not its workers. Peers in the same run: torchrun
(torch.distributed.run through bench/torchrun_compat.py, --standalone).

    python3 bench/agent_memory.py [--nproc 8] [--reps 3] [--ddprun build/bin/ddprun]

Rows: ddprun with workers that never reach the rendezvous (a PyTorch job:
they reach only the TCPStore), ddprun with SDK workers (the Python SDK next
to the ddprun measured, build/python/ddprun_sdk.py: init, an all-reduce and a
barrier on every rank, then sleep), ddprun after a client has reached the
rendezvous (rank 0 runs `ddprun status` against DDPRUN_STORE_ADDR, which
loads the gRPC module), and torchrun.
Each worker sleeps until the launcher has been measured, then exits.
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def number(pid, path, field):
    with open(f"/proc/{pid}/{path}") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def children(pid):
    out = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


def measure(cmd, nproc, ready_file, timeout=60.0):
    """Starts cmd, waits until nproc workers are running and ready_file exists
    (if given), reads the launcher's memory, then lets the workers exit."""
    stop = f"/tmp/agent_memory_stop_{os.getpid()}"
    if os.path.exists(stop):
        os.unlink(stop)
    env = dict(os.environ, AGENT_MEMORY_STOP=stop)
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + timeout
    try:
        while time.time() < deadline:
            if p.poll() is not None:
                sys.exit(f"{' '.join(cmd)} exited early ({p.returncode}): "
                         f"{p.stderr.read().decode()[-500:]}")
            # torchrun's workers are grandchildren of torchrun_compat's python.
            kids = children(p.pid)
            if len(kids) >= nproc and (ready_file is None or os.path.exists(ready_file)):
                time.sleep(0.2)  # let the launcher settle after the spawns
                rss = number(p.pid, "status", "VmRSS")
                pss = number(p.pid, "smaps_rollup", "Pss")
                threads = number(p.pid, "status", "Threads")
                return rss, pss, threads
            time.sleep(0.02)
        sys.exit(f"{' '.join(cmd)}: {nproc} workers not running within {timeout} s")
    finally:
        open(stop, "w").close()
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
        if ready_file and os.path.exists(ready_file):
            os.unlink(ready_file)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nproc", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--ddprun", default=os.path.join(HERE, "..", "build", "bin", "ddprun"))
    args = ap.parse_args()
    ddprun = os.path.abspath(args.ddprun)
    n = args.nproc
    wait = 'while [ ! -e "$AGENT_MEMORY_STOP" ]; do sleep 0.05; done'
    ready = f"/tmp/agent_memory_ready_{os.getpid()}"
    py = os.environ.get("PYTHON_EXEC", "/usr/bin/python3")
    # An SDK worker: bootstraps through the job's store, all-reduces, then
    # waits; rank 0 says when every rank has passed the barrier.
    sdk_dir = os.path.join(os.path.dirname(ddprun), "..", "python")
    sdk_worker = (
        "import os, sys, time\n"
        f"sys.path.insert(0, {os.path.abspath(sdk_dir)!r})\n"
        "import numpy as np, ddprun_sdk as ddp\n"
        "pg = ddp.init()\n"
        "x = np.ones(1024, dtype=np.float32)\n"
        "pg.allreduce(x)\n"
        "assert x[0] == pg.size, x[0]\n"
        "pg.barrier()\n"
        f"if pg.rank == 0: open({ready!r}, 'w').close()\n"
        "while not os.path.exists(os.environ['AGENT_MEMORY_STOP']): time.sleep(0.05)\n")
    cases = [
        ("ddprun, workers never reach the rendezvous",
         [ddprun, f"--nproc_per_node={n}", "--no_python", "sh", "-c", wait], None),
        ("ddprun, SDK workers (init, all-reduce, barrier)",
         [ddprun, f"--nproc_per_node={n}", "--no_python", py, "-c", sdk_worker], ready),
        ("ddprun, a client reached the rendezvous (gRPC loaded)",
         [ddprun, f"--nproc_per_node={n}", "--no_python", "sh", "-c",
          f'if [ "$RANK" = 0 ]; then {ddprun} status --rdzv_endpoint "$DDPRUN_STORE_ADDR" '
          f'>/dev/null && touch {ready}; fi; {wait}'], ready),
    ]
    if subprocess.run([py, "-c", "import torch.distributed.run"], stdout=subprocess.DEVNULL,
                      stderr=subprocess.DEVNULL).returncode == 0:
        cases.append(("torchrun --standalone (torch 1.13)",
                      [py, os.path.join(HERE, "torchrun_compat.py"), "--standalone",
                       f"--nproc_per_node={n}", "--monitor_interval=0.1", "--no_python",
                       shutil.which("sh"), "-c", wait], None))
    print(f"| launcher ({n} workers running) | VmRSS (MiB) | Pss (MiB) | threads |")
    print("|---|---|---|---|")
    for name, cmd, ready_file in cases:
        runs = [measure(cmd, n, ready_file) for _ in range(args.reps)]
        rss = statistics.median(r[0] for r in runs) / 1024
        pss = statistics.median(r[1] for r in runs) / 1024
        threads = statistics.median(r[2] for r in runs)
        print(f"| {name} | {rss:.1f} | {pss:.1f} | {threads:g} |", flush=True)


if __name__ == "__main__":
    main()
