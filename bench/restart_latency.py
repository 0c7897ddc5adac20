#!/usr/bin/env python3
"""Failure-recovery latencies (issue 3), medians of --reps runs, peers in the same run.

1. Worker death to every restarted worker running, one node, 2 workers,
   --max_restarts=1: ddprun vs torchrun of $PYTHON_EXEC's torch (default 5 s monitor interval and
   --monitor_interval=0.1) via bench/torchrun_compat.py.
2. Agent kill -9 to the survivor's workers restarted at the smaller size
   (ddprund + 2 agents, --nnodes=1:2). torchrun has no equivalent: its
   survivors wait for an NCCL/Gloo timeout (pytorch#111646).
3. ddprund kill -9 and restart (--state_dir) to both agents re-attached, so the
   job can re-rendezvous again.

    python3 bench/restart_latency.py [--reps 5] [--build build]
"""
import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))

# Each worker appends "<epoch seconds> <event> <restart> <local rank> <group world size>".
WORKER = r"""#!/bin/sh
log="$BENCH_LOG"
rc=${TORCHELASTIC_RESTART_COUNT:-0}
echo "$(date +%s.%N) start $rc ${LOCAL_RANK} ${GROUP_WORLD_SIZE}" >> "$log"
if [ "$BENCH_MODE" = crash ] && [ "$rc" = 0 ] && [ "$LOCAL_RANK" = 1 ]; then
  sleep 0.5
  echo "$(date +%s.%N) death $rc ${LOCAL_RANK} ${GROUP_WORLD_SIZE}" >> "$log"
  exit 1
fi
sleep "${BENCH_SLEEP:-1}"
"""


def read_events(path):
    out = []
    if not os.path.exists(path):
        return out
    with open(path) as f:
        for line in f:
            p = line.split()
            if len(p) == 5:
                out.append((float(p[0]), p[1], int(p[2]), int(p[3]), int(p[4])))
    return out


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_death(cmd_prefix, workdir, env_extra):
    log = os.path.join(workdir, "events.txt")
    if os.path.exists(log):
        os.unlink(log)
    env = dict(os.environ, BENCH_LOG=log, BENCH_MODE="crash", BENCH_SLEEP="0.5", **env_extra)
    r = subprocess.run(cmd_prefix + [os.path.join(workdir, "worker.sh")], env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=120)
    if r.returncode != 0:
        sys.exit(f"{cmd_prefix[0]} failed: {r.stderr.decode()[-800:]}")
    ev = read_events(log)
    death = min(t for t, e, rc, lr, g in ev if e == "death")
    restarted = [t for t, e, rc, lr, g in ev if e == "start" and rc == 1]
    if len(restarted) != 2:
        sys.exit(f"expected 2 restarted workers, got {ev}")
    return max(restarted) - death


def agent_kill(build, workdir):
    log = os.path.join(workdir, "events.txt")
    if os.path.exists(log):
        os.unlink(log)
    port = free_port()
    daemon = subprocess.Popen([f"{build}/bin/ddprund", "--host", "127.0.0.1", "--port", str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    daemon.stdout.readline()
    env = dict(os.environ, BENCH_LOG=log, BENCH_MODE="run", BENCH_SLEEP="30")
    agents = []
    for i, addr in enumerate(["127.0.0.1", "127.0.0.2"]):
        agents.append(subprocess.Popen(
            [f"{build}/bin/ddprun", "--nnodes=1:2", "--nproc_per_node=2",
             f"--rdzv_endpoint=127.0.0.1:{port}", "--rdzv_id=bench-kill",
             "--rdzv_conf=last_call_timeout=1", f"--local_addr={addr}", "--grace_period=1",
             "--no_python", os.path.join(workdir, "worker.sh")],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        if i == 0:
            time.sleep(0.2)  # the first agent hosts group rank 0
    deadline = time.time() + 30
    while len([e for e in read_events(log) if e[1] == "start"]) < 4:
        if time.time() > deadline:
            sys.exit("the two-node job did not start")
        time.sleep(0.005)
    t_kill = time.time()
    agents[1].send_signal(signal.SIGKILL)
    while True:
        small = [t for t, e, rc, lr, g in read_events(log) if e == "start" and g == 1]
        if len(small) == 2:
            break
        if time.time() > deadline:
            sys.exit("the survivor did not restart")
        time.sleep(0.002)
    dt = max(small) - t_kill
    for p in agents + [daemon]:
        p.kill()
        p.wait()
    return dt


def daemon_restart(build, workdir):
    port = free_port()
    state = tempfile.mkdtemp(prefix="ddprund_state_", dir=workdir)
    dcmd = [f"{build}/bin/ddprund", "--host", "127.0.0.1", "--port", str(port), "--state_dir", state]
    daemon = subprocess.Popen(dcmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    daemon.stdout.readline()
    log = os.path.join(workdir, "events.txt")
    if os.path.exists(log):
        os.unlink(log)
    env = dict(os.environ, BENCH_LOG=log, BENCH_MODE="run", BENCH_SLEEP="30")
    agents, logs = [], []
    for addr in ["127.0.0.1", "127.0.0.2"]:
        lf = open(os.path.join(workdir, f"agent-{addr}.log"), "w+")
        logs.append(lf)
        agents.append(subprocess.Popen(
            [f"{build}/bin/ddprun", "--nnodes=2", "--nproc_per_node=1",
             f"--rdzv_endpoint=127.0.0.1:{port}", "--rdzv_id=bench-daemon",
             f"--local_addr={addr}", "--grace_period=1", "--no_python",
             os.path.join(workdir, "worker.sh")],
            env=env, stdout=subprocess.DEVNULL, stderr=lf))
    deadline = time.time() + 30
    while len([e for e in read_events(log) if e[1] == "start"]) < 2:
        if time.time() > deadline:
            sys.exit("the job did not start")
        time.sleep(0.005)
    t_kill = time.time()
    daemon.send_signal(signal.SIGKILL)
    daemon.wait()
    daemon = subprocess.Popen(dcmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    while True:
        done = 0
        for lf in logs:
            lf.seek(0)
            done += "re-attached" in lf.read()
        if done == 2:
            break
        if time.time() > deadline:
            sys.exit("the agents did not re-attach")
        time.sleep(0.002)
    dt = time.time() - t_kill
    for p in agents + [daemon]:
        p.kill()
        p.wait()
    shutil.rmtree(state, ignore_errors=True)
    return dt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--peer-reps", type=int, default=3)
    ap.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="ddprun_restart_bench_")
    with open(os.path.join(work, "worker.sh"), "w") as f:
        f.write(WORKER)
    os.chmod(os.path.join(work, "worker.sh"), 0o755)

    ddprun = [f"{args.build}/bin/ddprun", "--nproc_per_node=2", "--max_restarts=1",
              "--no_python"]
    rows = [("ddprun", statistics.median(worker_death(ddprun, work, {})
                                         for _ in range(args.reps)))]
    py = os.environ.get("PYTHON_EXEC", "/usr/bin/python3")
    probe = subprocess.run([py, "-c", "import torch.distributed.run, torch; print(torch.__version__)"],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    if probe.returncode == 0:
        tv = "torchrun " + probe.stdout.strip().split("+")[0]
        base = [py, os.path.join(HERE, "torchrun_compat.py"), "--standalone",
                "--nproc_per_node=2", "--max_restarts=1"]
        rows.append((f"{tv} (5 s monitor)", statistics.median(
            worker_death(base + ["--no_python"], work, {}) for _ in range(args.peer_reps))))
        rows.append((f"{tv} --monitor_interval=0.1", statistics.median(
            worker_death(base[:2] + ["--monitor_interval=0.1"] + base[2:] + ["--no_python"], work,
                         {}) for _ in range(args.peer_reps))))
    print("| Worker death to every restarted worker running (1 node, 2 workers) | median | ratio |")
    print("|---|---|---|")
    for name, v in rows:
        print(f"| {name} | {v * 1000:.0f} ms | {v / rows[0][1]:.0f}x |")
    print()
    ak = statistics.median(agent_kill(args.build, work) for _ in range(args.reps))
    dr = statistics.median(daemon_restart(args.build, work) for _ in range(args.reps))
    print("| Scenario (ddprun only; torchrun has no equivalent) | median |")
    print("|---|---|")
    print(f"| Agent kill -9 to the survivor's workers restarted at the smaller size | {ak * 1000:.0f} ms |")
    print(f"| ddprund kill -9 and restart (--state_dir) to both agents re-attached | {dr * 1000:.0f} ms |")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
