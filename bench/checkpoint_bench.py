#!/usr/bin/env python3
"""Checkpoints in memory against torch.save/torch.load (issue 28), in one run.

Two ranks under ddprun (--nproc_per_node=2 --max_restarts=1), each with
--size bytes of float32 tensors (64 MiB each, the last one smaller):

1. ddprun.checkpoint.save's blocking time: the first save into each of the
   two slots (saves 0 and 1: the memory's pages are allocated then; the
   slower) and the median of --reps later saves (into slots already used);
2. rank 1 kills itself with SIGKILL (kill -9); the restarted workers' load()
   time, the newest step both ranks committed;
3. in the same workers after that, torch.save of the same state to a file in
   --dir and torch.load of it with the file in the page cache (warm) and
   after `echo 1 > /proc/sys/vm/drop_caches` (cold; said when not allowed).

Each time is the slower rank's (both ranks work at once, as in a job), per
GiB. The ratios are torch's time over ddprun's. After load, a write to
every page of the loaded state is timed too: load maps tensors of 1 MiB
and more copy-on-write, so that is where their pages are copied.

Beside each wall time: the CPU seconds (user + system, getrusage of the
worker process, all its threads) that the call took, per GiB, the slower
rank's. That figure does not grow with the machine's load as the wall time
does, so a run on a busy machine can be judged: a wall time close to the CPU
time is CPU-bound work that other processes slowed; a wall time well above it
waited (for the disk, for the agent, for a core).

    python3 bench/checkpoint_bench.py [--size 256MiB] [--reps 3] [--build build] [--dir /tmp]
    python3 bench/checkpoint_bench.py --size 1GiB          # the docs' figure
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from ckpt_bench_common import (DEFAULT_BUILD, job_env, load_average, parse_size, python_exec,
                               write_worker)

GIB = 1 << 30

WORKER = r'''
import json, os, resource, signal, statistics, sys, time
import torch
import ddprun.checkpoint as ckpt

out, size, reps, folder = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
rank, attempt = int(os.environ["RANK"]), os.environ["TORCHELASTIC_RESTART_COUNT"]
chunk = 64 << 20
state = {}
left, i = size, 0
while left > 0:
    n = min(chunk, left)
    state["t%03d" % i] = torch.full((n // 4,), float(rank + i))
    left -= n
    i += 1
res, cpu = {}, {}
def cpu_now():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
def clock(f, name=None):
    """(wall seconds, result) of f(); its CPU seconds go to cpu[name]."""
    t, c = time.perf_counter(), cpu_now()
    r = f()
    if name:
        cpu[name] = cpu_now() - c
    return time.perf_counter() - t, r

if attempt == "0":
    assert ckpt.load() is None
    res["save_first"] = max(clock(lambda s=s: ckpt.save(state, s))[0] for s in (0, 1))
    res["save"], res["save_cpu"] = [], []
    for s in range(2, reps + 2):
        res["save"].append(clock(lambda: ckpt.save(state, s), "save")[0])
        res["save_cpu"].append(cpu["save"])
    json.dump(res, open(os.path.join(out, "save%d.json" % rank), "w"))
    # Both ranks saved; then rank 1 dies (kill -9) and the job restarts.
    while not all(os.path.exists(os.path.join(out, "save%d.json" % r)) for r in (0, 1)):
        time.sleep(0.01)
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(600)  # stopped by the agent
del state
t, got = clock(ckpt.load, "load")
step, loaded = got
res["load"], res["step"] = t, step
# Which path the package took: one pass with the SDK library's CRC-32C, or
# memmove then zlib.crc32 (a package without _copy_crc32c: before it existed).
res["one_pass"] = getattr(ckpt, "_copy_crc32c", lambda: None)() is not None
assert all(float(v[0]) == rank + int(k[1:]) for k, v in loaded.items())
# load() maps large tensors copy-on-write: the first write to each page
# costs a page copy then (docs/checkpoint.md). Shown, not hidden: a write
# of every 4 KiB page of the loaded state, values unchanged.
res["first_write"], _ = clock(lambda: [v.view(-1)[::1024].add_(0) for v in loaded.values()])
path = os.path.join(folder, "torch_rank%d.pt" % rank)
res["torch_save"], _ = clock(lambda: (torch.save(loaded, path), os.sync()), "torch_save")
res["torch_load_warm"], _ = clock(lambda: torch.load(path), "torch_load_warm")
fd = os.open(path, os.O_RDONLY)
os.fsync(fd)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # this file out of the page cache
os.close(fd)
try:
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("1\n")
    res["drop_caches"] = "echo 1 > /proc/sys/vm/drop_caches"
except OSError as e:
    res["drop_caches"] = "posix_fadvise(DONTNEED) only (drop_caches: %s)" % e.strerror
res["torch_load_cold"], _ = clock(lambda: torch.load(path), "torch_load_cold")
os.unlink(path)
res["cpu"] = cpu
json.dump(res, open(os.path.join(out, "load%d.json" % rank), "w"))
'''


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="256MiB", help="state per rank (default 256MiB; 1GiB for the docs)")
    ap.add_argument("--reps", type=int, default=3, help="saves after the first (median)")
    ap.add_argument("--build", default=DEFAULT_BUILD)
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where torch.save writes")
    args = ap.parse_args()
    size = parse_size(args.size)
    build = os.path.abspath(args.build)
    with tempfile.TemporaryDirectory() as tmp:
        script = write_worker(tmp, WORKER)
        env = job_env(build, python_exec())
        limit = "%dMiB" % ((size >> 20) + 64)
        cmd = [os.path.join(build, "bin", "ddprun"), "--nproc_per_node=2", "--max_restarts=1",
               "--ckpt_shm_limit=" + limit, script, tmp, str(size), str(args.reps), args.dir]
        r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=1800)
        if r.returncode != 0:
            sys.exit("the benchmark job failed (exit %d):\n%s" % (r.returncode, r.stdout))
        saves = [json.load(open(os.path.join(tmp, "save%d.json" % k))) for k in (0, 1)]
        loads = [json.load(open(os.path.join(tmp, "load%d.json" % k))) for k in (0, 1)]
    gib = size / GIB

    def per_gib(values):
        return max(values) / gib

    def cpu_per_gib(name):
        return per_gib([l["cpu"][name] for l in loads])

    # (row, wall s/GiB, CPU s/GiB or None)
    rows = [
        ("ddprun.checkpoint.save, first of each slot (pages allocated)",
         per_gib([s["save_first"] for s in saves]), None),
        ("ddprun.checkpoint.save, median of %d later" % args.reps,
         per_gib([statistics.median(s["save"]) for s in saves]),
         per_gib([statistics.median(s["save_cpu"]) for s in saves])),
        ("ddprun.checkpoint.load after kill -9 of rank 1", per_gib([l["load"] for l in loads]),
         cpu_per_gib("load")),
        ("  then a first write to every page of what it returned",
         per_gib([l.get("first_write", 0) for l in loads]), None),
        ("torch.save to %s (+ sync)" % args.dir, per_gib([l["torch_save"] for l in loads]),
         cpu_per_gib("torch_save")),
        ("torch.load, file in the page cache", per_gib([l["torch_load_warm"] for l in loads]),
         cpu_per_gib("torch_load_warm")),
        ("torch.load, file dropped from the page cache",
         per_gib([l["torch_load_cold"] for l in loads]), cpu_per_gib("torch_load_cold")),
    ]
    print("2 ranks x %.3f GiB of float32 tensors each (%s); seconds per GiB, the slower rank"
          % (gib, args.size))
    print("loaded step %d; cache: %s" % (loads[0]["step"], loads[0]["drop_caches"]))
    print("copy and checksum: %s" % ("one pass, CRC-32C (libddprun_worker_sdk.so)"
                                     if loads[0].get("one_pass") else "memmove, then zlib.crc32"))
    print(load_average())
    print("  %-60s %8s %14s" % ("", "wall", "CPU (user+sys)"))
    for name, wall, cpu in rows:
        print("  %-60s %8.3f %8s s/GiB" % (name, wall, "-" if cpu is None else "%.3f" % cpu))
    save, load = rows[1][1], rows[2][1]
    print("ratios (torch / ddprun): save %.1fx, load warm %.1fx, load cold %.1fx"
          % (rows[4][1] / save, rows[5][1] / load, rows[6][1] / load))
    print("goals: save <= 0.25 s/GiB: %s; load <= 0.5 s/GiB: %s; >= 5x torch: %s"
          % ("met" if save <= 0.25 else "not met", "met" if load <= 0.5 else "not met",
             "met" if min(rows[4][1] / save, rows[5][1] / load, rows[6][1] / load) >= 5 else "not met"))


if __name__ == "__main__":
    main()
