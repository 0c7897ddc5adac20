#!/usr/bin/env python3
"""Kill -9 of one rank to the next completed step: ddprun inplace vs job vs torchrun (issue 29).

A 4-rank PyTorch DDP script on gloo (tests/fixtures/inplace_ddp.py) whose rank 1
SIGKILLs itself before step KILL_AT of the first attempt, under each of:

  inplace    ddprun --restart_policy=inplace; the script under
             ddprun.inprocess.run, every step saved with ddprun.checkpoint
             (memory), resumed with load(); the replacement starts warm, in
             the node's standby interpreter that imported torch (the default
             --warm_modules=torch; docs/recovery.md, "Warm start")
  inplace-cold  the same with --warm_modules=none: the replacement is a
             fresh interpreter that imports torch itself
  job        ddprun --restart_policy=job (the default): the same script
  torchrun   torch 1.13's torch.distributed.run (through bench/torchrun_compat.py,
             rendezvous c10d on 127.0.0.1:0), --max_restarts=1, once per
             --torchrun-monitor-intervals value (5 s is torchrun's default):
             the same script with CKPT_FILE, so rank 0 torch.save()s the
             state to a file after every step (write, then rename) and every
             rank torch.load()s it at start

The rows alternate in one run, --reps each. From the script's own event log
(epoch seconds, one clock):

  kill -> step     the kill to the first step a survivor (rank 0, 2 or 3)
                   completes after it: what the job lost
  kill -> ready    the kill to the replacement's "ready" (its interpreter
                   started, torch imported, the group formed, the checkpoint
                   loaded)
  ready -> step    the replacement's "ready" to that step: what is left once
                   the replacement is there
  survivor pids    whether ranks 0, 2, 3 kept their processes

and ddprun's recovery budget line. The kill comes at step --kill-at (50: about
a second of training, so that the standby has imported torch, as it has in a
job that trains for longer than its start-up; whether it had is printed). Medians of --reps, the ratios of inplace's
kill -> step to each other row's, and whether every run ended with the same
final parameters (the script is deterministic).

    python3 bench/inplace_recovery.py [--reps 3] [--build build] [--python /usr/bin/python3]
        [--torchrun-monitor-intervals 5,0.1]
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SCRIPT = os.path.join(ROOT, "tests", "fixtures", "inplace_ddp.py")
TORCHRUN = os.path.join(HERE, "torchrun_compat.py")


def command(build, python, row, job, out):
    """The launcher's argv and extra environment for a row ("job", "inplace", "torchrun:<s>")."""
    if row.startswith("torchrun:"):
        return ([python, TORCHRUN, "--nproc_per_node=4", "--max_restarts=1",
                 "--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:0", "--rdzv_id=" + job,
                 "--monitor_interval=" + row.split(":", 1)[1], SCRIPT],
                {"CKPT_FILE": os.path.join(out, "ckpt.pt")})
    policy = ["--restart_policy=inplace", "--warm_modules=none"] if row == "inplace-cold" \
        else ["--restart_policy=" + row]
    return ([os.path.join(build, "bin", "ddprun"), "--nproc_per_node=4", "--rdzv_id=" + job,
             "--max_restarts=1"] + policy + [SCRIPT],
            {"PYTHON_EXEC": python, "PYTHONPATH": os.path.join(build, "python")})


def run_once(build, python, row, rep, steps, kill_at):
    out = tempfile.mkdtemp(prefix="inplace-bench-")
    job = "bench-%s-%d" % (row.replace(":", "-"), rep)
    cmd, extra = command(build, python, row, job, out)
    env = dict(os.environ, OUT_DIR=out, KILL_RANK="1", KILL_AT=str(kill_at), STEPS=str(steps),
               EVENTS="1", STEP_S="0.02", **extra)
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=300)
    if p.returncode != 0:
        sys.exit("%s run %d failed (%d):\n%s" % (row, rep, p.returncode, p.stdout[-4000:]))
    kill = ready = None
    steps_after = []
    with open(os.path.join(out, "events")) as f:
        for line in f:
            t, rank, name, restart, _ = line.split()
            t, rank, restart = float(t), int(rank), int(restart)
            if name == "kill":
                kill = t
            elif name == "ready" and rank == 1 and restart == 1:
                ready = t
            elif name == "step" and restart == 1 and rank != 1:
                steps_after.append(t)
    first = min(s for s in steps_after if s > kill)
    pids = {}
    for rank in range(4):
        with open(os.path.join(out, "rank%d.attempts" % rank)) as f:
            pids[rank] = [line.split()[1] for line in f]
    kept = all(len(set(pids[r])) == 1 for r in (0, 2, 3))
    with open(os.path.join(out, "params.bin"), "rb") as f:
        params = f.read()
    shutil.rmtree(out)  # kept when the run fails (sys.exit above), for its logs
    budget = re.search(r"recovered in .*", p.stdout)
    if budget:
        budget = budget.group(0)
    elif row.startswith("torchrun:"):
        budget = "(torchrun prints no recovery budget)"
    else:
        budget = "(no recovery line)"
    warm = re.search(r"starts warm, in the standby \(pid [0-9]+, ([a-z ]+)\)", p.stdout)
    budget += "; replacement: " + ("warm, " + warm.group(1) if warm else "cold")
    return {"kill_to_step": (first - kill) * 1000, "kill_to_ready": (ready - kill) * 1000,
            "ready_to_step": (first - ready) * 1000, "kept": kept, "params": params,
            "budget": budget}


def label(row):
    if row.startswith("torchrun:"):
        return "torchrun --monitor_interval=%s" % row.split(":", 1)[1]
    if row == "inplace-cold":
        return "ddprun --restart_policy=inplace --warm_modules=none"
    return "ddprun --restart_policy=%s" % row


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--python", default="/usr/bin/python3", help="the workers' (with torch)")
    ap.add_argument("--steps", type=int, default=56)
    ap.add_argument("--kill-at", type=int, default=50)
    ap.add_argument("--torchrun-monitor-intervals", default="5,0.1",
                    help="one torchrun row per value (seconds); empty: no torchrun rows")
    a = ap.parse_args()
    rows = ["inplace", "inplace-cold", "job"] + ["torchrun:" + v for v in a.torchrun_monitor_intervals.split(",")
                                 if v]
    results = {row: [] for row in rows}
    for rep in range(a.reps):
        for row in rows:
            r = run_once(a.build, a.python, row, rep, a.steps, a.kill_at)
            results[row].append(r)
            print("%-34s rep %d: kill->step %6.0f ms, kill->ready %6.0f ms, ready->step %5.0f ms, "
                  "survivors kept: %s; %s" % (label(row), rep, r["kill_to_step"], r["kill_to_ready"],
                                             r["ready_to_step"], r["kept"], r["budget"]),
                  flush=True)
    median = {row: statistics.median(r["kill_to_step"] for r in rs) for row, rs in results.items()}
    print()
    print("| kill -9 of rank 1, 4 ranks | kill -> next step on a survivor (median) | "
          "kill -> replacement ready | replacement ready -> that step | inplace faster by | "
          "survivors kept their processes |")
    print("|---|---|---|---|---|---|")
    for row, rs in results.items():
        ratio = "-" if row == "inplace" else "%.1fx" % (median[row] / median["inplace"])
        print("| `%s` | %.0f ms | %.0f ms | %.0f ms | %s | %s |" % (
            label(row), median[row], statistics.median(r["kill_to_ready"] for r in rs),
            statistics.median(r["ready_to_step"] for r in rs), ratio,
            "yes" if all(r["kept"] for r in rs) else "no"))
    print()
    for row in rows[1:]:
        print("inplace/%s (kill -> step, medians): %.2f" % (row, median["inplace"] / median[row]))
    same = len({r["params"] for rs in results.values() for r in rs}) == 1
    print("final parameters identical in all %d runs: %s" % (len(rows) * a.reps,
                                                            "yes" if same else "NO"))


if __name__ == "__main__":
    main()
