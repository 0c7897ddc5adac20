#!/usr/bin/env python3
"""Kill -9 of one rank to the next completed step: --restart_policy=job vs inplace (issue 29).

A 4-rank PyTorch DDP script on gloo (tests/fixtures/inplace_ddp.py: every step
saved with ddprun.checkpoint, resumed with load(); under ddprun.inprocess.run)
whose rank 1 SIGKILLs itself before step KILL_AT of the first attempt. The two
policies alternate in one run, --reps each. From the script's own event log
(epoch seconds, one clock):

  kill -> step     the kill to the first step a survivor (rank 0, 2 or 3)
                   completes after it: what the job lost
  ready -> step    the replacement's "ready" (its interpreter started, torch
                   imported, the group formed, the checkpoint loaded) to that
                   step: what is left once the replacement is there
  survivor pids    whether ranks 0, 2, 3 kept their processes

and the agent's recovery budget line. Medians of --reps.

    python3 bench/inplace_recovery.py [--reps 3] [--build build] [--python /usr/bin/python3]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SCRIPT = os.path.join(ROOT, "tests", "fixtures", "inplace_ddp.py")


def run_once(build, python, policy, rep, steps, kill_at):
    out = tempfile.mkdtemp(prefix="inplace-bench-")
    env = dict(os.environ, PYTHON_EXEC=python, PYTHONPATH=os.path.join(build, "python"),
               OUT_DIR=out, KILL_RANK="1", KILL_AT=str(kill_at), STEPS=str(steps), EVENTS="1",
               STEP_S="0.02")
    job = "bench-%s-%d" % (policy, rep)
    cmd = [os.path.join(build, "bin", "ddprun"), "--nproc_per_node=4", "--rdzv_id=" + job,
           "--restart_policy=" + policy, "--max_restarts=1", SCRIPT]
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=300)
    if p.returncode != 0:
        sys.exit("%s run %d failed (%d):\n%s" % (policy, rep, p.returncode, p.stdout[-4000:]))
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
    budget = re.search(r"recovered in .*", p.stdout)
    return {"kill_to_step": (first - kill) * 1000, "ready_to_step": (first - ready) * 1000,
            "kept": kept, "budget": budget.group(0) if budget else "(no recovery line)"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--python", default="/usr/bin/python3", help="the workers' (with torch)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--kill-at", type=int, default=4)
    a = ap.parse_args()
    results = {"job": [], "inplace": []}
    for rep in range(a.reps):
        for policy in ("job", "inplace"):
            r = run_once(a.build, a.python, policy, rep, a.steps, a.kill_at)
            results[policy].append(r)
            print("%-8s rep %d: kill->step %6.0f ms, replacement ready->step %5.0f ms, "
                  "survivors kept: %s; %s" % (policy, rep, r["kill_to_step"], r["ready_to_step"],
                                             r["kept"], r["budget"]), flush=True)
    print()
    print("| policy | kill -> next step on a survivor (median) | replacement ready -> that step | "
          "survivors kept their processes |")
    print("|---|---|---|---|")
    for policy, rs in results.items():
        print("| `%s` | %.0f ms | %.0f ms | %s |" % (
            policy, statistics.median(r["kill_to_step"] for r in rs),
            statistics.median(r["ready_to_step"] for r in rs),
            "yes" if all(r["kept"] for r in rs) else "no"))


if __name__ == "__main__":
    main()
