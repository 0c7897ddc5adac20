#!/usr/bin/env python3
"""Launch latency: time for a launcher, with a trivial worker (`true`), to have
all N workers exit, N = 1, 2, 8. ddprun and its peers run in the same run;
medians of --reps runs; prints a Markdown table with the ratios.

    python3 bench/launch_latency.py [--reps 5] [--ddprun build/bin/ddprun]

Peers measured when present: torchrun (torch.distributed.run via
bench/torchrun_compat.py and Debian's /usr/bin/python3) with its default
monitor interval and with --monitor_interval=0.1, and mpirun. With a C
compiler, also the machine's floor: bench/spawn_floor.c, which only
posix_spawns the N workers and waits for them (the "floor" column; ddprun's
figure over it is what the launcher itself costs).

ddprun, --baseline and the floor are run in turn, launch after launch (not
one block after the other), so that the host's drift falls on all three alike:
the "ddprun over it" column and the baseline's ratio compare like with like.
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def timed(cmd, env=None):
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.decode()[-500:]}")
    return dt


def median_of(cmd, reps, env=None):
    return statistics.median(timed(cmd, env) for _ in range(reps))


def interleaved_medians(cmds, reps):
    """{name: command} run in turn, `reps` rounds; {name: median seconds}."""
    times = {name: [] for name in cmds}
    for _ in range(reps):
        for name, cmd in cmds.items():
            times[name].append(timed(cmd))
    return {name: statistics.median(t) for name, t in times.items()}


def torch_python():
    py = os.environ.get("PYTHON_EXEC", "/usr/bin/python3")
    ok = subprocess.run([py, "-c", "import torch.distributed.run"],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0
    return py if ok else None


def build_floor(tmp):
    """bench/spawn_floor.c compiled into tmp; None without a C compiler."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return None
    out = os.path.join(tmp, "spawn_floor")
    r = subprocess.run([cc, "-O2", "-o", out, os.path.join(HERE, "spawn_floor.c")],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return out if r.returncode == 0 else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--peer-reps", type=int, default=3)
    ap.add_argument("--ddprun", default=os.path.join(HERE, "..", "build", "bin", "ddprun"))
    ap.add_argument("--sizes", default="1,2,8")
    ap.add_argument("--baseline", default=None,
                    help="another ddprun binary (for example main's) measured in the same run")
    args = ap.parse_args()
    if args.reps < 1 or args.peer_reps < 1:
        sys.exit("launch_latency: --reps and --peer-reps must be at least 1")
    for flag, path in (("--ddprun", args.ddprun), ("--baseline", args.baseline)):
        if path is not None and not (os.path.isfile(path) and os.access(path, os.X_OK)):
            sys.exit(f"launch_latency: {flag} {path} is not an executable file; "
                     "build it (make) or give the path of a ddprun binary")
    try:
        sizes = [int(s) for s in args.sizes.split(",")]
    except ValueError:
        sys.exit(f"launch_latency: --sizes {args.sizes!r}: give worker counts, for example 1,8")
    true_bin = shutil.which("true")
    py = torch_python()
    mpirun = shutil.which("mpirun")
    tmp = tempfile.TemporaryDirectory(prefix="launch_latency_")  # removed at exit, however
    floor = build_floor(tmp.name)

    rows = []
    for n in sizes:
        row = {"n": n}
        cmds = {"ddprun": [args.ddprun, f"--nproc_per_node={n}", "--no_python", true_bin]}
        if args.baseline:
            cmds["baseline"] = [args.baseline, f"--nproc_per_node={n}", "--no_python", true_bin]
        if floor:
            cmds["floor"] = [floor, str(n), true_bin]
        row.update(interleaved_medians(cmds, args.reps))
        if py:
            base = [py, os.path.join(HERE, "torchrun_compat.py"), "--standalone",
                    f"--nproc_per_node={n}", "--no_python"]
            row["torchrun"] = median_of(base + [true_bin], args.peer_reps)
            row["torchrun_fast"] = median_of(
                base[:2] + ["--monitor_interval=0.1"] + base[2:] + [true_bin], args.peer_reps)
        if mpirun:
            row["mpirun"] = median_of([mpirun, "--allow-run-as-root", "--oversubscribe", "-np",
                                       str(n), true_bin], args.peer_reps)
        rows.append(row)
        print(f"n={n}: " + ", ".join(f"{k} {v:.3f}s" for k, v in row.items() if k != "n"),
              file=sys.stderr, flush=True)

    print("| N | ddprun | torchrun (5 s monitor) | ratio | torchrun --monitor_interval=0.1 | ratio |"
          " mpirun | ratio | floor (spawn_floor.c) | ddprun over it |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    def floor_cell(r):
        if "floor" not in r:
            return "n/a | n/a"
        return f"{r['floor']:.3f} s | +{(r['ddprun'] - r['floor']) * 1000:.1f} ms"

    for r in rows:
        def cell(key):
            if key not in r:
                return "n/a | n/a"
            return f"{r[key]:.3f} s | {r[key] / r['ddprun']:.0f}x"
        print(f"| {r['n']} | {r['ddprun']:.3f} s | {cell('torchrun')} | {cell('torchrun_fast')} |"
              f" {cell('mpirun')} | {floor_cell(r)} |")
    if args.baseline:
        print(f"\nbaseline {args.baseline}, same run: " + ", ".join(
            f"N={r['n']} {r['baseline']:.4f} s against {r['ddprun']:.4f} s "
            f"({r['baseline'] / r['ddprun']:.2f}x ddprun)"
            for r in rows))


if __name__ == "__main__":
    main()
