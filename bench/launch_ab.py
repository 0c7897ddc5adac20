#!/usr/bin/env python3
"""Launch A/B: two (or more) ddprun binaries launched alternately, run after run,
so that a loaded machine's drift falls on both alike; medians of wall time and of
CPU time (the launcher and its reaped workers, from wait4's rusage), and the
ratio to the first binary.

    python3 bench/launch_ab.py --reps 31 --nproc 8 main=<main>/build/bin/ddprun \
        new=build/bin/ddprun

Each launch is `<binary> --nproc_per_node=N --no_python <true>`, output to
/dev/null. docs/launch.md has the figures.
"""
import argparse
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=31)
    ap.add_argument("--nproc", type=int, default=8)
    ap.add_argument("binaries", nargs="+", help="label=command (the command may carry flags)")
    args = ap.parse_args()
    specs = []
    for s in args.binaries:
        if "=" not in s:
            sys.exit(f"'{s}': give label=binary, for example main=/path/to/ddprun")
        label, cmd = s.split("=", 1)
        specs.append((label, shlex.split(cmd)))
    true_bin = shutil.which("true")
    wall = {label: [] for label, _ in specs}
    cpu = {label: [] for label, _ in specs}
    devnull = os.open(os.devnull, os.O_WRONLY)
    load0 = os.getloadavg()[0]
    for r in range(args.reps):
        for label, cmd in (specs if r % 2 == 0 else specs[::-1]):
            argv = cmd + [f"--nproc_per_node={args.nproc}", "--no_python", true_bin]
            t0 = time.perf_counter()
            p = subprocess.Popen(argv, stdout=devnull, stderr=devnull)
            _, status, ru = os.wait4(p.pid, 0)
            dt = time.perf_counter() - t0
            if status != 0:
                sys.exit(f"{' '.join(argv)} failed (wait status {status})")
            wall[label].append(dt * 1e3)
            cpu[label].append((ru.ru_utime + ru.ru_stime) * 1e3)
    print(f"N={args.nproc}, {args.reps} launches each, alternated; load average "
          f"{load0:.1f} -> {os.getloadavg()[0]:.1f}")
    first = statistics.median(wall[specs[0][0]])
    for label, _ in specs:
        w = sorted(wall[label])
        m = statistics.median(w)
        print(f"  {label:>10}: wall median {m:6.1f} ms (best {w[0]:6.1f}), cpu median "
              f"{statistics.median(cpu[label]):5.1f} ms, {first / m:.2f}x {specs[0][0]}")


if __name__ == "__main__":
    main()
