#!/usr/bin/env python3
"""Where a launch's wall time goes: `perf trace` of the scheduler's
exec/fork/exit tracepoints (low overhead: no system call is traced) over
--reps launches of `<ddprun> --nproc_per_node=N --no_python true`; medians,
in ms after ddprun's exec, of: the last thread or process started before the
first worker, the first and last worker spawned, the last worker's exec and
exit, and ddprun's exit. Needs perf with tracepoint access (root here).

    python3 bench/launch_phases.py --reps 15 --nproc 8 build/bin/ddprun [more binaries]
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

KEYS = ["before_first_spawn", "first_spawn", "last_spawn", "last_exec", "last_worker_exit",
        "ddprun_exit"]
LINE = re.compile(r"\s*([\d.]+) (\S+)/(\d+) sched:(\w+)\((.*)\)")


def one_launch(binary, nproc, true_bin, out):
    subprocess.run(["perf", "trace", "-o", out, "--no-syscalls", "-e",
                    "sched:sched_process_exec,sched:sched_process_fork,sched:sched_process_exit",
                    binary, f"--nproc_per_node={nproc}", "--no_python", true_bin],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    ev, forks, workers, main, t0 = {}, [], set(), None, 0.0
    with open(out) as f:
        for line in f:
            m = LINE.match(line)
            if not m:
                continue
            t, pid, kind, rest = float(m.group(1)), m.group(3), m.group(4), m.group(5)
            if kind == "sched_process_exec" and main is None:
                main, t0 = pid, t
            if main is None:
                continue
            t -= t0
            if kind == "sched_process_fork":
                forks.append((t, re.search(r"child_pid: (\d+)", rest).group(1)))
            elif kind == "sched_process_exec" and true_bin in rest:
                workers.add(pid)
                ev["last_exec"] = t
            elif kind == "sched_process_exit" and pid in workers:
                ev["last_worker_exit"] = t
            elif kind == "sched_process_exit" and pid == main:
                ev["ddprun_exit"] = t
    spawns = [t for t, child in forks if child in workers]
    if not spawns:
        sys.exit("no worker seen in the trace: is perf allowed to read sched tracepoints?")
    ev["first_spawn"], ev["last_spawn"] = spawns[0], spawns[-1]
    before = [t for t, _ in forks if t < spawns[0]]
    ev["before_first_spawn"] = before[-1] if before else 0.0
    return ev


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--nproc", type=int, default=8)
    ap.add_argument("binaries", nargs="+")
    args = ap.parse_args()
    if shutil.which("perf") is None:
        sys.exit("perf is not installed; install linux-perf")
    true_bin = shutil.which("true")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "trace")
        for binary in args.binaries:
            acc = {k: [] for k in KEYS}
            load0 = os.getloadavg()[0]
            for _ in range(args.reps):
                for k, v in one_launch(binary, args.nproc, true_bin, out).items():
                    acc[k].append(v)
            print(f"{binary} N={args.nproc}, {args.reps} launches, load {load0:.1f}; medians (ms): "
                  + "  ".join(f"{k} {statistics.median(v):.1f}" for k, v in acc.items() if v))


if __name__ == "__main__":
    main()
