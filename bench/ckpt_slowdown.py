#!/usr/bin/env python3
"""Training steps slowed by the agent's background checkpoint work (issue 28).

A training-like loop of fixed compute per step (single-threaded matmuls,
then a 64-byte all_reduce that keeps the workers in lockstep; no I/O) runs
under ddprun and saves its state (--size of float32 tensors)
every --every steps with ddprun.checkpoint.save. After each save the agent
works in the background; the worker does not wait for it:

  persist   one node, one worker, --ckpt_dir DIR: the agent writes the
            committed snapshot to DIR; the work ends when DIR's manifest of
            that step appears (polled by this script every 5 ms);
  replica   two nodes on 127.0.0.1 and 127.0.0.2 (a ddprund), one worker
            each, --ckpt_replicas 1: each agent sends its node's snapshot to
            the other; the work ends when both say they hold the other's
            replica of that step (DDPRUN_DEBUG=agent, read as it is written).
            save returns only once its replica is acknowledged, so the
            transfer is inside save; the job runs again with
            DDPRUN_CKPT_REPLICA_WAIT=0 (the asynchronous replica) to compare.
            Each row also gives how long save itself blocked (median).

Each step's start and duration are logged by the worker. Two warm-up saves
come first (the first save into each slot allocates its pages: the worker's
own cost), and their windows are left out. A window runs from the moment
every worker has saved that step to the end of its background work; a step
that overlaps one counts as "during", one that overlaps none and no save of
any worker as "without"; the slowdown is the ratio of the median step
times, minus one. Both kinds come from the same run and the
same processes, interleaved, so the machine's load affects both alike.

--cpu_bind VALUE is passed to every ddprun: with core, each agent binds its
worker to all cores but the last and runs its background checkpoint threads
on the CPUs left (docs/checkpoint.md, "Background priority"). The replica
jobs' two "nodes" are two agents on this one host, so both bind their worker
to the same CPUs and both agents' threads share the CPUs left. Each row gives
the CPUs the workers ran on (their own affinity), those of the agents'
background threads (from each agent's line; "all" when not confined) and the
load average when the job ended.

    python3 bench/ckpt_slowdown.py [--size 256MiB] [--saves 4] [--every 40] [--build build]
                                   [--ckpt_bandwidth 64MiB] [--cpu_bind core]
"""
import argparse
import glob
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from ckpt_bench_common import (DEFAULT_BUILD, free_port, job_env, load_average, parse_size,
                               python_exec, write_worker)

WORKER = r'''
import json, os, sys, time
import torch, torch.distributed as dist
import ddprun.checkpoint as ckpt

out, size, saves, every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rank = int(os.environ["RANK"])
cpus = sorted(os.sched_getaffinity(0))  # the worker's own affinity (--cpu_bind)
torch.set_num_threads(1)
dist.init_process_group("gloo")  # the workers step in lockstep, as in data-parallel training
chunk, state, i = 64 << 20, {}, 0
while i * chunk < size:
    state["t%03d" % i] = torch.full((min(chunk, size - i * chunk) // 4,), float(rank))
    i += 1
a = torch.randn(256, 256)
g = torch.ones(16)
def work():                      # the step: fixed compute, then a small all_reduce
    for _ in range(24):
        a.matmul(a)
    dist.all_reduce(g)
for _ in range(5):
    work()                       # warm up
# Warm-up saves 0 and 1: the first save into each slot allocates its pages
# (seconds per GiB here), the worker's own cost, not the background's; their
# background windows are left out of both kinds.
steps, saved = [], []
for step in (0, 1):
    t = time.time()
    ckpt.save(state, step)
    saved.append((step, time.time(), t, time.time() - t))
for n in range((saves + 1) * every):
    t = time.time()
    work()
    if n % every == every - 1 and len(saved) < saves + 2:
        t_save = time.time()
        ckpt.save(state, len(saved))
        saved.append((len(saved), time.time(), t, time.time() - t_save))
        steps.append((t, time.time() - t, True))   # holds a save: neither kind
    else:
        steps.append((t, time.time() - t, False))
json.dump({"steps": steps, "saved": saved, "cpus": cpus}, open(os.path.join(out, "rank%d.json" % rank), "w"))
dist.destroy_process_group()
'''


def watch_dir(folder, ends, stop):
    """ends[step] = when DIR's first manifest of step-N appeared."""
    while not stop.is_set():
        for m in glob.glob(os.path.join(folder, "step-*", "manifest-*.json")):
            step = int(os.path.basename(os.path.dirname(m))[5:])
            ends.setdefault(step, time.time())
        time.sleep(0.005)


def watch_log(path, ends, stop, want):
    """ends[step] = when the last of `want` agents said it holds the
    other's replica of that step."""
    seen = {}
    pos = 0
    while not stop.is_set():
        with open(path) as f:
            f.seek(pos)
            text = f.read()
            pos = f.tell()
        for m in re.finditer(r"holds the replica of step (\d+) of rank (\d+)", text):
            key = (int(m.group(1)), int(m.group(2)))
            seen.setdefault(key, time.time())
            step = key[0]
            held = [t for (s, _), t in seen.items() if s == step]
            if len(held) >= want:
                ends.setdefault(step, max(held))
        time.sleep(0.005)


def classify(results, ends):
    """A step's kind. A window runs from the moment every worker has saved a
    step to the end of that step's background work; a step overlapping the
    time from the first worker's save starting to the last one's end (a
    worker's own save, the other worker's save) or a warm-up step's window
    is neither kind."""
    first, last = {}, {}
    for r in results:
        for step, t_end, t_begin, _ in r["saved"]:
            first[step] = min(first.get(step, t_begin), t_begin)
            last[step] = max(last.get(step, t_end), t_end)
    windows = [(last[s], ends[s]) for s in last if s in ends and s >= 2]
    excluded = [(first[s], last[s]) for s in last]
    # A step the background skipped (the persister or sender took a newer
    # one: warm-up saves 0 and 1 come back to back) ends with the next step
    # it finished; not with the run, which would leave no step of either kind.
    def end_of(s):
        later = [ends[t] for t in ends if t >= s]
        return min(later) if later else last[s] + 60
    excluded += [(last[s], end_of(s)) for s in last if s < 2]
    during, without = [], []
    for r in results:
        for t, dt, has_save in r["steps"]:
            overlaps = lambda spans: any(t < e and t + dt > b for b, e in spans)
            if has_save or overlaps(excluded):
                continue
            if overlaps(windows):
                during.append(dt)
            else:
                without.append(dt)
    # How long save() itself blocked, past the warm-up saves.
    blocked = [secs for r in results for step, _, _, secs in r["saved"] if step >= 2]
    return during, without, [e - b for b, e in windows], blocked


def cpu_list(cpus):
    """[0, 1, 2, 5] -> "0-2,5"."""
    parts, cpus = [], sorted(cpus)
    i = 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        parts.append("%d-%d" % (cpus[i], cpus[j]) if j > i else "%d" % cpus[i])
        i = j + 1
    return ",".join(parts)


def placement(results, logs):
    """"workers <CPUs> / background <CPUs>": each worker's affinity as it
    saw it, each agent's background threads as its line says ("all": not
    confined; "shared": the workers hold every CPU)."""
    workers = sorted({cpu_list(r["cpus"]) for r in results})
    background = []
    for path in logs:
        text = open(path).read()
        m = re.search(r"checkpoint: the background threads \([^)]*\) run on CPU\(s\) (\S+),", text)
        background.append(m.group(1) if m else
                          "shared" if "is free of workers" in text else "all")
    return "workers %s / background %s" % (" + ".join(workers), " + ".join(sorted(set(background))))


def run_job(name, cmds, env, out, watch):
    stop = threading.Event()
    ends = {}
    logs = [open(os.path.join(out, "agent%d.log" % i), "w+") for i in range(len(cmds))]
    procs = [subprocess.Popen(c, env=env, stdout=subprocess.DEVNULL, stderr=l) for c, l in zip(cmds, logs)]
    th = threading.Thread(target=watch, args=(ends, stop), daemon=True)
    th.start()
    rcs = [p.wait(timeout=1800) for p in procs]
    time.sleep(0.1)
    stop.set()
    th.join()
    if any(rcs):
        text = "".join(open(l.name).read()[-3000:] for l in logs)
        sys.exit("the %s job failed (exits %s):\n%s" % (name, rcs, text))
    results = [json.load(open(f)) for f in sorted(glob.glob(os.path.join(out, "rank*.json")))]
    load = open("/proc/loadavg").read().split()[0]
    return classify(results, ends) + (placement(results, [l.name for l in logs]), load)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="256MiB", help="state per worker (default 256MiB)")
    ap.add_argument("--saves", type=int, default=4, help="saves per job (default 4)")
    ap.add_argument("--every", type=int, default=40, help="steps between saves (default 40)")
    ap.add_argument("--build", default=DEFAULT_BUILD)
    ap.add_argument("--ckpt_bandwidth", default=None,
                    help="passed to every ddprun as --ckpt_bandwidth=VALUE (default: not "
                         "passed, ddprun's default)")
    ap.add_argument("--cpu_bind", default=None,
                    help="passed to every ddprun as --cpu_bind=VALUE (default: not passed, "
                         "ddprun's default)")
    args = ap.parse_args()
    size = parse_size(args.size)
    build = os.path.abspath(args.build)
    python = python_exec()
    ddprun = os.path.join(build, "bin", "ddprun")
    limit = "--ckpt_shm_limit=%dMiB" % ((size >> 20) + 64)
    if args.ckpt_bandwidth is not None:
        limit = [limit, "--ckpt_bandwidth=" + args.ckpt_bandwidth]
    else:
        limit = [limit]
    if args.cpu_bind is not None:
        limit.append("--cpu_bind=" + args.cpu_bind)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        script = write_worker(tmp, WORKER)
        env = job_env(build, python)
        wargs = [script, None, str(size), str(args.saves), str(args.every)]

        out = os.path.join(tmp, "persist")
        os.mkdir(out)
        folder = os.path.join(tmp, "ckpt")
        wargs[1] = out
        cmd = [ddprun, "--nproc_per_node=1"] + limit + ["--ckpt_dir=" + folder] + wargs
        rows.append(("persist (--ckpt_dir)",) + run_job(
            "persist", [cmd], env, out, lambda ends, stop: watch_dir(folder, ends, stop)))

        out = os.path.join(tmp, "replica")
        os.mkdir(out)
        wargs[1] = out
        port = free_port()
        daemon = subprocess.Popen([os.path.join(build, "bin", "ddprund"), "--host", "127.0.0.1",
                                   "--port", str(port), "--state_dir", os.path.join(tmp, "state")],
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        daemon.stdout.readline()
        try:
            cmds = [[ddprun, "--nnodes=2", "--nproc_per_node=1", "--local_addr=" + addr,
                     "--rdzv_endpoint=127.0.0.1:%d" % port, "--rdzv_id=slowdown"] + limit +
                    ["--ckpt_replicas", "1"] + wargs for addr in ("127.0.0.1", "127.0.0.2")]
            renv = dict(env, DDPRUN_DEBUG="agent")
            logs = [os.path.join(out, "agent%d.log" % i) for i in (0, 1)]

            def watch(ends, stop):
                # Either agent's log; each says when it holds the other's replica.
                threads = []
                per = [dict(), dict()]
                for i, path in enumerate(logs):
                    t = threading.Thread(target=watch_log, args=(path, per[i], stop, 1), daemon=True)
                    t.start()
                    threads.append(t)
                while not stop.is_set():
                    for step in set(per[0]) & set(per[1]):
                        ends.setdefault(step, max(per[0][step], per[1][step]))
                    time.sleep(0.005)
                for t in threads:
                    t.join()
                for step in set(per[0]) & set(per[1]):
                    ends.setdefault(step, max(per[0][step], per[1][step]))

            rows.append(("replica (--ckpt_replicas 1, 2 nodes; save waits for the previous "
                         "step's replica)",) +
                        run_job("replica", cmds, renv, out, watch))
            # The same without the wait (docs/checkpoint.md, "Replica lag"):
            # the replica is asynchronous, as before the wait existed.
            out = os.path.join(tmp, "replica_async")
            os.mkdir(out)
            wargs[1] = out
            cmds = [c[:-len(wargs)] + wargs for c in cmds]
            cmds = [[a.replace("slowdown", "slowdown2") for a in c] for c in cmds]
            logs[:] = [os.path.join(out, "agent%d.log" % i) for i in (0, 1)]
            rows.append(("replica, DDPRUN_CKPT_REPLICA_WAIT=0 (asynchronous)",) + run_job(
                "replica_async", cmds, dict(renv, DDPRUN_CKPT_REPLICA_WAIT="0"), out, watch))
        finally:
            daemon.kill()
            daemon.wait()
    print("fixed compute per step (24 single-threaded 256x256 matmuls, a small all_reduce); "
          "%s of state per worker, "
          "saved every %d steps, %d saves; --ckpt_bandwidth %s; --cpu_bind %s; %d CPUs "
          "(this host's affinity: %s)" % (
              args.size, args.every, args.saves, args.ckpt_bandwidth or "not passed",
              args.cpu_bind or "not passed", os.cpu_count(), cpu_list(os.sched_getaffinity(0))))
    print(load_average())
    print("| background work | CPUs | its duration (median) | save blocks (median) | "
          "steps during / without | median step during | median step without | slowdown | "
          "load at its end |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, during, without, windows, blocked, cpus, load in rows:
        held = "%.3f s" % statistics.median(blocked) if blocked else "-"
        if not during or not without:
            print("| %s | %s | %s | %s | %d / %d | - | - | (no steps to compare) | %s |"
                  % (name, cpus, "%.2f s" % statistics.median(windows) if windows else "-", held,
                     len(during), len(without), load))
            continue
        d, w = statistics.median(during), statistics.median(without)
        print("| %s | %s | %.2f s | %s | %d / %d | %.1f ms | %.1f ms | %+.1f %% | %s |"
              % (name, cpus, statistics.median(windows), held, len(during), len(without), d * 1e3,
                 w * 1e3, (d / w - 1) * 100, load))


if __name__ == "__main__":
    main()
