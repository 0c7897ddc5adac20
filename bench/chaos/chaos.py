#!/usr/bin/env python3
"""Chaos run (issue 29, docs/chaos.md): a deterministic training job under
ddprun, faults injected at seeded random points, then the same job without
faults; the final parameters must be the same bits.

    bench/chaos/chaos.py --seed 7 --faults 50 --duration 120
    bench/chaos/chaos.py --trainer sdk --faults 10 --kinds worker,agent
    bench/chaos/chaos.py --ha --faults 6      # also kill -9 ddprund replicas

What it starts, all on loopback: one ddprund (or, with --ha, a 3-member etcd
and 3 ddprund replicas on it), NODES agents (127.0.0.1 ..) of NPROC workers
each, with --ckpt_replicas 1. The trainer saves after
every step with ddprun's checkpoint memory and logs each start and commit in
CHAOS_OUT/rank<R>.log. (--spare 1 adds a hot spare.)

The schedule is a function of --seed alone: fault i fires after the job has
committed step S_i (seeded, increasing, at least 2 apart) plus a seeded delay
within one step, and kills a seeded choice among the candidates of its kind
at that moment (sorted by rank or address):
  worker   kill -9 of one worker process (the job restarts)
  agent    kill -9 of one agent that runs workers (its workers die with it;
           a new agent is started at once at the same address and takes the
           seat, or with --spare 1 the spare takes it; the seat is restored
           from the peer replica)
  replica  (--ha) kill -9 of one ddprund replica, started again at once

At the end it prints faults injected by kind, steps lost (steps re-done
beyond the last checkpoint every rank had committed when the job restarted:
expected 0), the recovery budget's percentiles (the agents' "recovered in"
lines), the final comparison and the wall time. It exits 0 when every
planned fault was injected, both runs succeeded, no step was lost and the
final parameters are identical, no rank ran in two processes 5 s after
the job trained again following a fault (a worker left outside the job),
(and, for the PyTorch trainer under
--restart_policy inplace without a spare, every survivor of a fault re-formed
in its own process: the "in place:" line); 1 otherwise (the first differing
tensor is named); 2 for bad usage.

Python 3 standard library only.
"""
import argparse
import ctypes
import json
import os
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(os.path.dirname(HERE))
KINDS = ("worker", "agent", "replica")
PHASES = ("stopped", "round", "started", "first step")
RECOVERED = re.compile(
    r"\[job (\S+) round (\d+)\] recovered in (\d+) ms: detected \+(\d+), stopped \+(\d+), "
    r"round \+(\d+), started \+(\d+), first step \+(\d+)")


class ChaosError(Exception):
    """A failure of the run (not of the comparison): the message says what."""


def say(msg):
    print("chaos: " + msg, flush=True)


# ---------------------------------------------------------------- processes

_LIBC = ctypes.CDLL(None, use_errno=True)


def _die_with_parent():
    # PR_SET_PDEATHSIG(SIGKILL): nothing this tool starts outlives it.
    _LIBC.prctl(1, signal.SIGKILL, 0, 0, 0)


class Proc:
    """A child process with its output in files of the work directory."""

    def __init__(self, name, argv, work, env=None):
        self.name = name
        self.out_path = os.path.join(work, name + ".out")
        self.err_path = os.path.join(work, name + ".err")
        self.argv = argv
        with open(self.out_path, "ab") as out, open(self.err_path, "ab") as err:
            try:
                self.popen = subprocess.Popen(argv, stdout=out, stderr=err,
                                              stdin=subprocess.DEVNULL, env=env,
                                              preexec_fn=_die_with_parent)
            except OSError as e:
                raise ChaosError("cannot start %s (%s): %s" % (name, argv[0], e)) from e
        self.pid = self.popen.pid
        self.started = time.monotonic()

    def alive(self):
        return self.popen.poll() is None

    def kill9(self):
        if self.alive():
            os.kill(self.pid, signal.SIGKILL)
        self.popen.wait()

    def text(self):
        parts = []
        for p in (self.out_path, self.err_path):
            try:
                with open(p, errors="replace") as f:
                    parts.append(f.read())
            except OSError:
                pass
        return "\n".join(parts)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def children_of(pid):
    """Pids whose parent is `pid` (from /proc/*/stat)."""
    kids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            kids.append(int(d))
    return sorted(kids)


def environ_of(pid):
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            pairs = f.read().split(b"\0")
    except OSError:
        return {}
    env = {}
    for p in pairs:
        k, _, v = p.partition(b"=")
        env[k.decode(errors="replace")] = v.decode(errors="replace")
    return env


def wait_until(pred, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.01)
    raise ChaosError("%s within %.0f s" % (what, timeout_s))


# ---------------------------------------------------------------- the control plane

class ControlPlane:
    """One ddprund, or with ha a 3-member etcd and 3 ddprund replicas."""

    def __init__(self, args, work):
        self.args, self.work = args, work
        self.etcd, self.replicas, self.ports = [], [], []
        self.restarts = 0
        bin_dir = args.bin
        if not args.ha:
            port = free_port()
            self.ports = [port]
            self.replicas = [self._ddprund(0, port, [])]
            self.endpoint = "127.0.0.1:%d" % port
            wait_until(lambda: "listening" in self.replicas[0].text(), 20,
                       "ddprund did not say it is listening")
            return
        etcd = shutil.which("etcd") or "/usr/bin/etcd"
        if not os.access(etcd, os.X_OK):
            raise ChaosError("--ha needs etcd (scripts/install-deps.sh installs etcd-server)")
        cp = [free_port() for _ in range(3)]
        pp = [free_port() for _ in range(3)]
        cluster = ",".join("e%d=http://127.0.0.1:%d" % (i, pp[i]) for i in range(3))
        for i in range(3):
            self.etcd.append(Proc("etcd%d" % i, [
                etcd, "--name", "e%d" % i, "--data-dir", os.path.join(work, "etcd%d" % i),
                "--listen-client-urls", "http://127.0.0.1:%d" % cp[i],
                "--advertise-client-urls", "http://127.0.0.1:%d" % cp[i],
                "--listen-peer-urls", "http://127.0.0.1:%d" % pp[i],
                "--initial-advertise-peer-urls", "http://127.0.0.1:%d" % pp[i],
                "--initial-cluster", cluster, "--heartbeat-interval", "50",
                "--election-timeout", "500", "--logger", "zap", "--log-level", "error"], work))
        self.etcd_endpoints = ",".join("127.0.0.1:%d" % p for p in cp)
        self.ports = [free_port() for _ in range(3)]
        self.replicas = [self._ddprund(i, self.ports[i], self._ha_flags()) for i in range(3)]
        self.endpoint = ",".join("127.0.0.1:%d" % p for p in self.ports)
        wait_until(lambda: any("leads the control plane" in r.text() for r in self.replicas), 60,
                   "no ddprund replica led the control plane")

    def _ha_flags(self):
        return ["--etcd_endpoints", self.etcd_endpoints, "--etcd_lease_ttl", "1"]

    def _ddprund(self, i, port, extra):
        # Chaos kills workers on purpose: the quarantine of a host whose
        # workers fail repeatedly would shrink the job, so it is off.
        self.restarts += 1
        return Proc("ddprund%d.%d" % (i, self.restarts), [
            os.path.join(self.args.bin, "ddprund"), "--host", "127.0.0.1", "--port", str(port),
            "--dashboard_port", "off", "--quarantine_failures", "0"] + extra, self.work)

    def leader(self):
        """Index of the live replica that leads (the last to say so), or None."""
        best = None
        for i, r in enumerate(self.replicas):
            if r.alive() and "leads the control plane" in r.text():
                if best is None or r.started > self.replicas[best].started:
                    best = i
        return best

    def kill_replica(self, u):
        """kill -9 of a replica, started again at once on its port (as
        systemd's Restart=always does): the leader when u < 0.5, else the
        standby int((u - 0.5) * 2 * standbys) in port order."""
        lead = self.leader()
        standbys = [i for i in range(len(self.replicas)) if i != lead]
        if u < 0.5 and lead is not None:
            i, role = lead, "the leader"
        else:
            i, role = standbys[min(len(standbys) - 1, int((u - 0.5) * 2 * len(standbys)))], \
                "a standby"
        old = self.replicas[i]
        old.kill9()
        self.replicas[i] = self._ddprund(i, self.ports[i], self._ha_flags())
        return "ddprund replica %d, %s (127.0.0.1:%d, pid %d), started again" % (
            i, role, self.ports[i], old.pid)

    def stop(self):
        for p in self.replicas + self.etcd:
            p.kill9()


# ---------------------------------------------------------------- the job

class Job:
    """NODES agents (and a hot spare) running the trainer, logs in out_dir."""

    def __init__(self, args, work, plane, tag, spare, extra_env):
        self.args, self.work, self.plane, self.tag = args, work, plane, tag
        self.out_dir = os.path.join(work, tag)
        os.makedirs(self.out_dir)
        self.env = dict(os.environ)
        self.env.update({"CHAOS_OUT": self.out_dir, "CHAOS_STEPS": str(args.steps),
                         "CHAOS_STEP_MS": str(args.step_ms)})
        self.env.setdefault("PYTHON_EXEC", args.python)
        self.env.update(extra_env)
        self.agents = []  # every agent started, killed ones included
        self.seq = 0
        for i in range(args.nodes + (1 if spare else 0)):
            self.start_agent("127.0.0.%d" % (i + 1))

    def start_agent(self, addr):
        a = self.args
        argv = [os.path.join(a.bin, "ddprun"), "--nnodes=%d:%d" % (a.nodes, a.nodes),
                "--nproc_per_node=%d" % a.nproc_per_node, "--local_addr=" + addr,
                "--rdzv_endpoint=" + self.plane.endpoint, "--rdzv_id=" + self.tag,
                "--rdzv_conf=join_timeout=%d" % a.join_timeout,
                "--max_restarts=%d" % (2 * a.faults + 5),
                "--dashboard_port=off", "--ckpt_replicas", "1", "--ckpt_shm_limit", "64MiB"]
        if a.restart_policy:
            argv.append("--restart_policy=" + a.restart_policy)
        argv += a.ddprun_arg
        if a.trainer == "torch":
            argv.append(os.path.join(HERE, "chaos_ddp.py"))
        else:
            argv += ["--no_python", os.path.join(a.bin, "chaos_sdk_trainer")]
        self.seq += 1
        p = Proc("%s.agent%d.%s" % (self.tag, self.seq, addr), argv, self.work, self.env)
        p.addr = addr
        p.killed = False
        self.agents.append(p)
        return p

    def live_agents(self):
        return [p for p in self.agents if not p.killed and p.alive()]

    def workers(self):
        """(rank, pid, agent) of every running worker, by rank."""
        found = []
        for agent in self.live_agents():
            for pid in children_of(agent.pid):
                env = environ_of(pid)
                if env.get("CHAOS_OUT") == self.out_dir and "RANK" in env:
                    found.append((int(env["RANK"]), pid, agent))
        return sorted(found, key=lambda w: (w[0], w[1]))

    def duplicate_ranks(self):
        """{rank: [pids]} of the ranks that run in more than one process: a
        worker left running outside the job (a stray) beside its seat's."""
        by_rank = {}
        for rank, pid, _ in self.workers():
            by_rank.setdefault(rank, []).append(pid)
        return {r: p for r, p in by_rank.items() if len(p) > 1}

    def kill_worker(self, u):
        ws = self.workers()
        if not ws:
            return None
        rank, pid, agent = ws[int(u * len(ws))]
        os.kill(pid, signal.SIGKILL)
        return "worker rank %d (pid %d) on %s" % (rank, pid, agent.addr)

    def kill_agent(self, u):
        busy = sorted({w[2] for w in self.workers()}, key=lambda p: p.addr)
        if not busy:
            return None
        agent = busy[int(u * len(busy))]
        agent.killed = True
        agent.kill9()
        self.start_agent(agent.addr)
        return "agent on %s (pid %d); a new agent started there" % (agent.addr, agent.pid)

    def log_lines(self, rank):
        try:
            with open(os.path.join(self.out_dir, "rank%d.log" % rank)) as f:
                return f.read().splitlines()
        except OSError:
            return []

    def newest_commit(self):
        """(step, monotonic ns) of rank 0's last commit line, or None."""
        for line in reversed(self.log_lines(0)):
            f = line.split()
            if len(f) == 3 and f[0] == "commit":
                return int(f[1]), int(f[2])
        return None

    def wait_done(self, stall_s):
        """Waits for every agent not killed to exit; returns their exit codes.
        A job that commits no new step for stall_s is stuck: ChaosError."""
        last, since = None, time.monotonic()
        while True:
            if not self.live_agents():
                return {p.name: p.popen.returncode for p in self.agents if not p.killed}
            c = self.newest_commit()
            if c != last:
                last, since = c, time.monotonic()
            elif time.monotonic() - since > stall_s:
                raise ChaosError("the %s job committed no step for %.0f s and did not end "
                                 "(agents' logs in %s)" % (self.tag, stall_s, self.work))
            time.sleep(0.05)

    def stop(self):
        for p in self.agents:
            p.kill9()

    def last_words(self):
        """The last line of the first agent that exited non-zero, for an error."""
        for p in self.agents:
            if not p.killed and p.popen.poll() not in (None, 0):
                lines = [l for l in p.text().splitlines() if l.strip()]
                return "; %s (exit %d) said: %s" % (p.name, p.popen.returncode,
                                                    lines[-1] if lines else "nothing")
        return ""

    def recoveries(self):
        """[(round, {phase: ms})] of every "recovered in" line, the slowest node per round."""
        rounds = {}
        for p in self.agents:
            for m in RECOVERED.finditer(p.text()):
                if m.group(1) != self.tag:
                    continue
                phases = dict(zip(PHASES, (int(m.group(i)) for i in (5, 6, 7, 8))))
                r = rounds.setdefault(int(m.group(2)), phases)
                for k, v in phases.items():
                    r[k] = max(r[k], v)
        return sorted(rounds.items())


# ---------------------------------------------------------------- schedule and analysis

def make_schedule(args):
    """[(step, delay_fraction, kind, target_fraction)]: a function of the seed alone."""
    rng = random.Random(args.seed)
    first, last = 4, args.steps - 4
    span = last - first - 2 * (args.faults - 1)
    if span < args.faults:
        raise SystemExit("chaos: %d faults need at least %d steps; raise --duration or lower "
                         "--step_ms" % (args.faults, 3 * args.faults + 8))
    picks = sorted(rng.sample(range(span), args.faults))
    kinds = [args.kinds[i % len(args.kinds)] for i in range(args.faults)]
    rng.shuffle(kinds)
    return [(first + p + 2 * i, rng.random(), kinds[i], rng.random())
            for i, p in enumerate(picks)]


def steps_lost(job, world, faults, spare):
    """(lost, lag, resumes) over the starts of rank 0 after its first.

    For each start at time t: C is the newest step every rank had committed
    before t, L the step it resumed from. After a worker or replica fault
    every committed step survives (the agent owns the memory): C - L steps
    are lost. After an agent fault the lost node's newest commit may not have
    reached its peer replica yet (asynchronous, docs/checkpoint.md): one step
    re-done is that lag; more is lost. With a hot spare (`spare`) a worker
    fault is the same case: the spare takes the failed node's seat and
    restores it from the replica. `faults` is [(ns, kind)].
    """
    commits = []  # per rank: [(ns, step)]
    for r in range(world):
        c = []
        for line in job.log_lines(r):
            f = line.split()
            if len(f) == 3 and f[0] == "commit":
                c.append((int(f[2]), int(f[1])))
        commits.append(c)
    lost, lag, resumes = [], [], 0
    for line in job.log_lines(0):
        f = line.split()
        if len(f) != 4 or f[0] != "start":
            continue
        t, resumed = int(f[1]), int(f[3])
        newest = [max([s for ns, s in c if ns < t], default=-1) for c in commits]
        if max(newest) < 0:
            continue  # the first start
        resumes += 1
        common = min(newest)
        if common <= resumed:
            continue
        cause = max([f for f in faults if f[0] < t], default=(0, "none"))[1]
        if (cause == "agent" or (cause == "worker" and spare)) and common - resumed == 1:
            lag.append((common, resumed))
        else:
            lost.append((common, resumed, cause))
    return lost, lag, resumes


def in_place(job, world, faults, nproc_per_node):
    """(kept, fresh, survivors, victims): how the restarts' processes came.

    kept: starts of a rank in a process that had started that rank before
    (a survivor re-formed in place); fresh: starts in a new process, after
    each rank's first. Each fault's victims must start fresh (a worker
    fault: its worker; an agent fault: the node's nproc_per_node workers)
    and under --restart_policy inplace every other rank is a survivor that
    re-forms in place; a replica fault restarts nothing. `faults` is
    [(ns, kind)].
    """
    kept = fresh = 0
    for r in range(world):
        pids = []
        for line in job.log_lines(r):
            f = line.split()
            if len(f) == 4 and f[0] == "start":
                if pids:
                    if f[2] in pids:
                        kept += 1
                    else:
                        fresh += 1
                pids.append(f[2])
    lost = {"worker": 1, "agent": nproc_per_node, "replica": 0}
    victims = sum(lost[k] for _, k in faults)
    survivors = sum(world - lost[k] for _, k in faults if k != "replica")
    return kept, fresh, survivors, victims


def percentile(values, q):
    """Nearest-rank percentile of a non-empty list."""
    v = sorted(values)
    return v[max(0, -(-q * len(v) // 100) - 1)]


def compare(a_dir, b_dir, world):
    """None when every rank's final parameters are the same bits, else the first difference."""
    count = nbytes = 0
    for r in range(world):
        docs = []
        for d in (a_dir, b_dir):
            path = os.path.join(d, "final_rank%d.json" % r)
            try:
                with open(path) as f:
                    docs.append(json.load(f))
            except (OSError, ValueError) as e:
                return "rank %d wrote no final parameters (%s: %s)" % (r, path, e)
        ta, tb = docs[0]["tensors"], docs[1]["tensors"]
        if [t["name"] for t in ta] != [t["name"] for t in tb]:
            return "rank %d: different tensors: %s vs %s" % (
                r, [t["name"] for t in ta], [t["name"] for t in tb])
        for x, y in zip(ta, tb):
            count += 1
            nbytes += len(x["hex"]) // 2
            if x["hex"] == y["hex"] and x["shape"] == y["shape"]:
                continue
            xa, ya = bytes.fromhex(x["hex"]), bytes.fromhex(y["hex"])
            where = ""
            if x["dtype"] == "float32" and len(xa) == len(ya):
                for i in range(0, len(xa), 4):
                    if xa[i:i + 4] != ya[i:i + 4]:
                        where = " at element %d: %r (with faults) vs %r (without)" % (
                            i // 4, struct.unpack("<f", xa[i:i + 4])[0],
                            struct.unpack("<f", ya[i:i + 4])[0])
                        break
            return "rank %d tensor '%s' (%s %s) differs%s" % (r, x["name"], x["dtype"],
                                                             x["shape"], where)
    return None


def describe_final(a_dir, world):
    count = nbytes = 0
    for r in range(world):
        with open(os.path.join(a_dir, "final_rank%d.json" % r)) as f:
            for t in json.load(f)["tensors"]:
                count += 1
                nbytes += len(t["hex"]) // 2
    return "%d ranks, %d tensors, %d bytes" % (world, count, nbytes)


# ---------------------------------------------------------------- the run

def no_strays(job, after, fault_step, stall_s, work):
    """Once the job trains again after a fault (rank 0 committed two steps
    past the newest it had committed at the fault: the step in flight then
    may still complete, the next needs the re-formed group), every rank runs
    in one process: a worker of the old round left running beside its
    seat's new one (on a node that became the spare, say) fails the run. The
    stopping of the old round's workers may still be under way: 5 s to
    finish it. A job that ends first is not checked."""
    def trains_again():
        c = job.newest_commit()
        return bool(c and c[0] >= fault_step + 2) or not job.live_agents()
    wait_until(trains_again, stall_s, "after %s the job committed no step past %d (logs in %s)" % (
        after, fault_step + 1, work))
    if not job.live_agents():
        return
    deadline = time.monotonic() + 5
    while True:
        dup = job.duplicate_ranks()
        if not dup:
            return
        if time.monotonic() > deadline:
            raise ChaosError("after %s the job trains again, but rank(s) %s run in two processes "
                             "(pids %s): a worker left outside the job (logs in %s)" % (
                                 after, ",".join(str(r) for r in sorted(dup)),
                                 "; ".join("%d: %s" % (r, ",".join(str(p) for p in dup[r]))
                                           for r in sorted(dup)), work))
        time.sleep(0.1)


def run_faulted(args, work, plane, schedule, t_start):
    extra = {}
    if args.corrupt_step is not None:
        extra["CHAOS_CORRUPT_STEP"] = str(args.corrupt_step)
    job = Job(args, work, plane, "chaos-faults", args.spare == 1, extra)
    injected = {k: 0 for k in KINDS}
    job.fault_log = []  # (monotonic ns, kind)
    step_s = args.step_ms / 1000.0
    try:
        last_fault_ns = 0
        for i, (step, delay, kind, target) in enumerate(schedule):
            # Fault i fires once rank 0 committed `step` after the previous fault.
            def reached():
                c = job.newest_commit()
                if c and c[0] >= step and c[1] > last_fault_ns:
                    return True
                if not job.live_agents():
                    raise ChaosError("every agent exited before fault %d%s (logs in %s)" % (
                        i + 1, job.last_words(), work))
                return False
            wait_until(reached, args.stall_timeout,
                       "fault %d: the job committed no step >= %d (stuck after the previous "
                       "fault; logs in %s)" % (i + 1, step, work))
            if i > 0:
                no_strays(job, "fault %d" % i, last_fault_step, args.stall_timeout, work)
            time.sleep(delay * step_s)
            c = job.newest_commit()
            last_fault_step = c[0] if c else 0
            if kind == "worker":
                what = job.kill_worker(target)
            elif kind == "agent":
                what = job.kill_agent(target)
            else:
                what = plane.kill_replica(target)
            last_fault_ns = time.monotonic_ns()
            job.fault_log.append((last_fault_ns, kind))
            if what is None:
                raise ChaosError("fault %d (%s): nothing to kill" % (i + 1, kind))
            injected[kind] += 1
            say("fault %d/%d at step %d (+%.0f ms, %.1f s): kill -9 %s" % (
                i + 1, len(schedule), step, delay * args.step_ms, time.monotonic() - t_start,
                what))
        if schedule:
            no_strays(job, "fault %d" % len(schedule), last_fault_step, args.stall_timeout, work)
        codes = job.wait_done(args.stall_timeout)
        bad = {n: c for n, c in codes.items() if c != 0}
        if bad:
            raise ChaosError("the job with faults failed: exit codes %s%s (logs in %s)" % (
                bad, job.last_words(), work))
        return job, injected
    except BaseException:
        job.stop()
        raise


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trainer", choices=("torch", "sdk"), default="torch",
                    help="torch: bench/chaos/chaos_ddp.py (DDP on gloo); sdk: chaos_sdk_trainer")
    ap.add_argument("--seed", type=int, default=1, help="the schedule's seed (default 1)")
    ap.add_argument("--faults", type=int, default=10, help="faults to inject (default 10)")
    ap.add_argument("--kinds", default=None,
                    help="comma list of worker,agent,replica (default worker,agent; with --ha "
                         "also replica), spread evenly over the faults")
    ap.add_argument("--duration", type=float, default=60.0,
                    help="seconds the job trains without faults: --duration*1000/--step_ms steps "
                         "(default 60)")
    ap.add_argument("--step_ms", type=int, default=100, help="sleep after each step (default 100)")
    ap.add_argument("--nodes", type=int, default=2, help="agents running workers (default 2)")
    ap.add_argument("--nproc_per_node", type=int, default=2, help="workers per agent (default 2)")
    ap.add_argument("--spare", type=int, choices=(0, 1), default=0,
                    help="0 (default): a killed agent's replacement re-joins into its seat; "
                         "1: one more agent waits as a hot spare and takes the seat of a lost "
                         "or failed node (docs/chaos.md: an open defect)")
    ap.add_argument("--ha", action="store_true",
                    help="3 ddprund replicas on a 3-member etcd (also enables the replica kind)")
    ap.add_argument("--restart_policy", choices=("job", "inplace"), default=None,
                    help="passed to ddprun as --restart_policy=VALUE (default: not passed; "
                         "ddprun's default is job)")
    ap.add_argument("--ddprun_arg", action="append", default=[],
                    help="one more ddprun flag for every agent (repeatable)")
    ap.add_argument("--corrupt_step", type=int, default=None,
                    help="test hook: the run with faults adds 1e-3 to one parameter at this "
                         "step, so the comparison must fail")
    ap.add_argument("--no_clean_run", action="store_true",
                    help="skip the run without faults (no comparison; exits 1)")
    ap.add_argument("--stall_timeout", type=float, default=180.0,
                    help="longest wait for the job's next step (default 180 s): a job stuck "
                         "longer fails the run")
    ap.add_argument("--join_timeout", type=int, default=120, help="agents' join_timeout")
    ap.add_argument("--python", default=os.environ.get("PYTHON_EXEC") or (
        "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else "python3"),
                    help="interpreter of the torch trainer, given to ddprun as PYTHON_EXEC "
                         "(default: $PYTHON_EXEC, else /usr/bin/python3: Debian's torch)")
    ap.add_argument("--build", default=os.path.join(SOURCE, "build"),
                    help="build directory with bin/ddprun (default: the source tree's build/)")
    ap.add_argument("--work", default=None, help="work directory (default: a new one in /tmp)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args(argv)

    args.bin = os.path.join(os.path.abspath(args.build), "bin")
    args.kinds = (args.kinds.split(",") if args.kinds
                  else ["worker", "agent"] + (["replica"] if args.ha else []))
    for k in args.kinds:
        if k not in KINDS:
            ap.error("--kinds: unknown kind %r; use worker, agent or replica" % k)
    if "replica" in args.kinds and not args.ha:
        ap.error("--kinds replica needs --ha (there is one ddprund without it)")
    if args.faults < 0 or args.nodes < 1 or args.nproc_per_node < 1 or args.step_ms < 1:
        ap.error("--faults, --nodes, --nproc_per_node and --step_ms must be positive")
    if "agent" in args.kinds and args.nodes < 2:
        ap.error("--kinds agent needs --nodes >= 2 (a lost node's seat is restored from the "
                 "replica on another node)")
    need = ["ddprun", "ddprund"] + (["chaos_sdk_trainer"] if args.trainer == "sdk" else [])
    for b in need:
        if not os.access(os.path.join(args.bin, b), os.X_OK):
            ap.error("no %s in %s; build it (cmake --build %s --target %s) or pass --build" % (
                b, args.bin, args.build, b))
    args.steps = max(1, int(args.duration * 1000 / args.step_ms))
    schedule = make_schedule(args) if args.faults else []
    world = args.nodes * args.nproc_per_node

    work = args.work or tempfile.mkdtemp(prefix="ddprun-chaos-")
    os.makedirs(work, exist_ok=True)
    by_kind = {k: sum(1 for s in schedule if s[2] == k) for k in args.kinds}
    say("seed %d: %d faults planned (%s) over %d steps of %d ms; %s trainer, %d nodes x %d "
        "workers%s%s; --restart_policy %s; work dir %s" % (
            args.seed, len(schedule), ", ".join("%s %d" % kv for kv in by_kind.items()),
            args.steps, args.step_ms, args.trainer, args.nodes, args.nproc_per_node,
            " + 1 hot spare" if args.spare else "",
            ", 3 ddprund replicas on etcd" if args.ha else "",
            args.restart_policy or "job (ddprun's default, not passed)", work))
    say("schedule: " + ", ".join("%s@%d" % (s[2], s[0]) for s in schedule))

    t0 = time.monotonic()
    plane = None
    code = 1
    try:
        plane = ControlPlane(args, work)
        job, injected = run_faulted(args, work, plane, schedule, t0)
        t_faulted = time.monotonic() - t0
        lost, lag, resumes = steps_lost(job, world, job.fault_log, args.spare == 1)
        recoveries = job.recoveries()
        t1 = time.monotonic()
        clean = None
        if not args.no_clean_run:
            say("the same job without faults")
            clean = Job(args, work, plane, "chaos-clean", False, {})
            try:
                codes = clean.wait_done(args.stall_timeout)
            finally:
                clean.stop()
            bad = {n: c for n, c in codes.items() if c != 0}
            if bad:
                raise ChaosError("the job without faults failed: exit codes %s%s (logs in %s)" % (
                    bad, clean.last_words(), work))
        t_clean = time.monotonic() - t1

        print("faults injected: %d (%s)" % (sum(injected.values()), ", ".join(
            "%s %d" % (k, injected[k]) for k in KINDS)))
        print("restarts resumed from a checkpoint: %d" % resumes)
        print("steps lost: %d%s" % (sum(c - r for c, r, _ in lost), "".join(
            " (after a %s fault: resumed from step %d while every rank had committed step %d)"
            % (k, r, c) for c, r, k in lost)))
        print("replica lag: %d of %d restores from a peer replica re-did one step (the replica "
              "was one save behind the lost seat)" % (len(lag), injected["agent"] + (
                  injected["worker"] if args.spare else 0)))
        if recoveries:
            print("recovery budget (ms from the failure; %d restarts, slowest node each): "
                  "p50 / p90 / max" % len(recoveries))
            for ph in PHASES:
                vals = [r[ph] for _, r in recoveries]
                print("  %-10s %7d %7d %7d" % (ph, percentile(vals, 50), percentile(vals, 90),
                                                max(vals)))
        else:
            print("recovery budget: no \"recovered in\" line")
        ok = sum(injected.values()) == len(schedule) and not lost
        if args.restart_policy == "inplace":
            kept, fresh, survivors, victims = in_place(job, world, job.fault_log,
                                                       args.nproc_per_node)
            # The PyTorch trainer re-forms in place (ddprun.inprocess.run); a
            # survivor restarted as a process is a failure of the policy. With
            # a spare the seats move (the failed node becomes the spare).
            failed = args.trainer == "torch" and not args.spare and (kept < survivors or
                                                                     fresh > victims)
            print("in place: %d of %d survivors re-formed in their processes; %d processes "
                  "started anew (%d killed)%s" % (
                      kept, survivors, fresh, victims,
                      " (the SDK trainer does not call ddp::Reconfigure: its survivors exit "
                      "and are restarted as processes)" if args.trainer == "sdk" else
                      ": FAILED, every survivor should have kept its process (the agents' "
                      "\"in place:\" lines say why not)" if failed else ""))
            if failed:
                ok = False
        if clean is not None:
            diff = compare(job.out_dir, clean.out_dir, world)
            if diff is None:
                print("final parameters: identical (%s)" % describe_final(job.out_dir, world))
            else:
                print("final parameters: DIFFER: " + diff)
                ok = False
        else:
            print("final parameters: not compared (--no_clean_run)")
            ok = False
        print("wall time: %.1f s (with faults %.1f s, without %.1f s)" % (
            time.monotonic() - t0, t_faulted, t_clean))
        code = 0 if ok else 1
    except ChaosError as e:
        print("chaos: FAILED: %s" % e, flush=True)
        code = 1
    finally:
        if plane is not None:
            plane.stop()
        if code == 0 and not args.keep and not args.work:
            shutil.rmtree(work, ignore_errors=True)
        elif code != 0:
            print("chaos: logs kept in %s" % work)
    return code


if __name__ == "__main__":
    sys.exit(main())
