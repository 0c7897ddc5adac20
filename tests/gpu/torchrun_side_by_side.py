#!/usr/bin/env python3
"""torch 2.x's own torchrun and ddprun, side by side, on the same command lines.

    python3 tests/gpu/torchrun_side_by_side.py --ddprun .device/gpu/bin/ddprun --out DIR

Each case runs once under `python3 -m torch.distributed.run` (the interpreter's
torch) and once under ddprun, each worker being one probe (probe.py, written
here) that records its argv, interpreter, process group, the environment its
launcher added or changed, and prints one line to stdout and one to stderr.
Writes DIR/side_by_side.json (per case and launcher: exit status, wall time,
console, probe records, log-dir tree, launcher error file) and prints a short
comparison per case. Differences are for a person to read and explain in
docs/gpu.md: this script asserts nothing and exits 0 unless it could not run.
"""
import argparse
import concurrent.futures
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

PROBE = r'''
import json, os, sys, time
d = os.environ["PROBE_DIR"]
base = json.load(open(os.environ["PROBE_BASE"]))
rank = os.environ.get("RANK", "?")
attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "?")
rec = {"argv": sys.argv, "executable": sys.executable, "cwd": os.getcwd(),
       "added_or_changed": {k: v for k, v in os.environ.items() if base.get(k) != v},
       "removed": sorted(k for k in base if k not in os.environ),
       "isatty": [os.isatty(i) for i in (0, 1, 2)], "pid": os.getpid(),
       "cpus": sorted(os.sched_getaffinity(0)),
       "pgid_is_pid": os.getpgid(0) == os.getpid(), "sid_is_pid": os.getsid(0) == os.getpid()}
print(f"probe stdout rank {rank} attempt {attempt}", flush=True)
print(f"probe stderr rank {rank} attempt {attempt}", file=sys.stderr, flush=True)
if os.environ.get("PROBE_PG") == "1":
    t0 = time.time()
    try:
        import datetime, torch, torch.distributed as dist
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
        x = torch.ones(1); dist.all_reduce(x)
        rec["pg"] = {"ok": True, "sum": x.item(), "world": dist.get_world_size(), "s": round(time.time() - t0, 3)}
        dist.destroy_process_group()
    except Exception as e:  # recorded, not raised: the comparison wants to see it
        rec["pg"] = {"ok": False, "error": repr(e)[:500]}
json.dump(rec, open(os.path.join(d, f"rank{rank}_attempt{attempt}_{os.getpid()}.json"), "w"))
fail = os.environ.get("PROBE_FAIL", "")  # "RANK:CODE": that rank exits CODE in attempt 0
if fail and attempt == "0" and fail.split(":")[0] == rank:
    sys.exit(int(fail.split(":")[1]))
if os.environ.get("PROBE_RAISE") == rank:
    from torch.distributed.elastic.multiprocessing.errors import record
    @record
    def main():
        raise ValueError("probe raised on purpose")
    main()
if os.environ.get("PROBE_SLEEP"):
    open(os.path.join(d, f"sleeping_{rank}"), "w").close()
    time.sleep(float(os.environ["PROBE_SLEEP"]))
'''

# name, launcher args ({P} = probe path, {T} = the case's temp dir), extra env, options
CASES = [
    ("standalone", ["--standalone", "--nproc_per_node=2", "{P}", "a", "--x=1"], {}, {}),
    ("c10d_localhost0", ["--rdzv_backend=c10d", "--rdzv_endpoint=localhost:0", "--nnodes=1",
                         "--nproc_per_node=2", "{P}"], {}, {}),
    ("llm_line", ["--nnodes=1", "--nproc_per_node=2", "--rdzv_backend", "c10d", "--rdzv_endpoint=localhost:0",
                  "--local-ranks-filter", "0", "--role", "rank", "--tee", "3", "{P}"], {}, {}),
    ("log_dir", ["--standalone", "--nproc_per_node=2", "--log-dir", "{T}/logs", "--redirects", "3", "{P}"],
     {}, {"tree": "{T}/logs"}),
    ("log_dir_devnull", ["--standalone", "--nproc_per_node=2", "--log-dir", "/dev/null", "{P}"], {}, {}),
    ("virtual_local_rank", ["--standalone", "--nproc_per_node=2", "--virtual-local-rank", "{P}"],
     {"CUDA_VISIBLE_DEVICES": None}, {}),
    ("virtual_local_rank_cvd", ["--standalone", "--nproc_per_node=2", "--virtual-local-rank", "{P}"],
     {"CUDA_VISIBLE_DEVICES": "5,7"}, {}),
    ("shutdown_timeout", ["--standalone", "--nproc_per_node=1", "--shutdown-timeout=5", "{P}"], {}, {}),
    ("max_restarts", ["--standalone", "--nproc_per_node=2", "--max-restarts=1", "{P}"],
     {"PROBE_FAIL": "1:3"}, {}),
    ("module", ["--standalone", "--nproc_per_node=2", "-m", "probe", "m1"], {}, {"cwd": "probe"}),
    ("static_master", ["--nnodes=1", "--nproc_per_node=2", "--master_addr=127.0.0.1", "--master_port={PORT}",
                       "{P}"], {}, {}),
    ("rdzv_conf_use_libuv", ["--rdzv_backend=c10d", "--rdzv_endpoint=localhost:0", "--nnodes=1",
                             "--nproc_per_node=1", "--rdzv_conf", "use_libuv=0", "{P}"], {}, {}),
    ("numa_binding", ["--standalone", "--nproc_per_node=1", "--numa-binding=node", "{P}"], {}, {}),
    ("event_log_dup_filters", ["--standalone", "--nproc_per_node=2", "--event-log-handler=null", "--tee", "3",
                               "--duplicate-stdout-filters=probe", "--log-dir", "{T}/logs", "{P}"],
     {}, {"tree": "{T}/logs"}),
    ("prefix_template_env", ["--standalone", "--nproc_per_node=2", "--tee", "3", "{P}"],
     {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "${role_name}-${rank}-${local_rank}-${pid}:"}, {}),
    ("launcher_error_file", ["--standalone", "--nproc_per_node=2", "{P}"],
     {"PROBE_RAISE": "1", "TORCHELASTIC_ERROR_FILE": "{T}/launcher_error.json"},
     {"file": "{T}/launcher_error.json"}),
    ("worker_exit_85", ["--standalone", "--nproc_per_node=1", "{P}"], {"PROBE_FAIL": "0:85"}, {}),
    ("nproc_gpu_cvd0", ["--standalone", "--nproc_per_node=gpu", "{P}"], {"CUDA_VISIBLE_DEVICES": "0"}, {}),
    ("nproc_auto", ["--standalone", "--nproc_per_node=auto", "{P}"], {"PROBE_PG": "0"}, {}),
    ("pet_env", ["--standalone", "{P}"], {"PET_NPROC_PER_NODE": "2", "PET_MAX_RESTARTS": "0"}, {}),
    ("tee_default_prefix", ["--standalone", "--nproc_per_node=2", "--tee", "3", "{P}"], {}, {}),
    ("two_nodes_same_node_rank", ["--nnodes=2", "--nproc_per_node=1", "--rdzv_backend=c10d",
                                  "--rdzv_endpoint=127.0.0.1:{PORT}", "--rdzv_id=sbs2", "--node_rank=0",
                                  "--rdzv_conf=join_timeout=20", "{P}"],
     {}, {"nodes": 2}),
    ("sigterm_launcher", ["--standalone", "--nproc_per_node=2", "{P}"], {"PROBE_SLEEP": "60"},
     {"signal": signal.SIGTERM}),
]


TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
CASE_TIMEOUT_S = 45
NO_PG = False  # --no-pg: the probes form no Gloo group (faster; the store is checked elsewhere)


def tree(path):
    out = []
    for root, _, files in os.walk(path):
        for f in files:
            p = os.path.join(root, f)
            try:
                out.append([os.path.relpath(p, path), os.path.getsize(p), open(p, errors="replace").read()[:300]])
            except OSError as e:
                out.append([os.path.relpath(p, path), -1, str(e)])
    return sorted(out)


def run_case(launcher, ddprun, case, port):
    name, args, extra_env, opts = case
    t = tempfile.mkdtemp(prefix=f"sbs_{name}_{launcher}_")
    probe_dir = os.path.join(t, "probe")
    os.makedirs(probe_dir)
    probe = os.path.join(probe_dir, "probe.py")
    open(probe, "w").write(PROBE)
    env = dict(os.environ, PROBE_DIR=probe_dir, PROBE_PG="0" if NO_PG else "1", PYTHONUNBUFFERED="1")
    for k, v in extra_env.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v.replace("{T}", t)
    base = os.path.join(t, "base_env.json")
    json.dump(env, open(base, "w"))
    env["PROBE_BASE"] = base
    argv = [a.replace("{P}", probe).replace("{T}", t).replace("{PORT}", str(port)) for a in args]
    cmd = (TORCHRUN if launcher == "torchrun" else [ddprun]) + argv
    cwd = probe_dir if opts.get("cwd") == "probe" else t
    t0 = time.time()
    p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    second = None
    if opts.get("nodes") == 2:  # the same line on a second "node" (this host), half a second later
        time.sleep(0.5)
        second = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, start_new_session=True)
    sig_info = None
    if "signal" in opts:
        deadline = time.time() + 60
        while time.time() < deadline and not any(f.startswith("sleeping_") for f in os.listdir(probe_dir)):
            time.sleep(0.05)
        time.sleep(0.5)
        ts = time.time()
        p.send_signal(opts["signal"])
        sig_info = {"sent_after_s": round(ts - t0, 3)}
    try:
        out, err = p.communicate(timeout=CASE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        err += f"\n[side_by_side: killed after {CASE_TIMEOUT_S} s]"
    wall = time.time() - t0
    node2 = None
    if second is not None:
        try:
            o2, e2 = second.communicate(timeout=max(1, CASE_TIMEOUT_S - wall))
        except subprocess.TimeoutExpired:
            os.killpg(second.pid, signal.SIGKILL)
            o2, e2 = second.communicate()
            e2 += f"\n[side_by_side: killed after {CASE_TIMEOUT_S} s]"
        node2 = {"rc": second.returncode, "wall_s": round(time.time() - t0, 3), "stdout": o2[-4000:],
                 "stderr": e2[-4000:]}
    if sig_info:
        sig_info["stopped_after_signal_s"] = round(time.time() - t0 - sig_info["sent_after_s"], 3)
    survivors = subprocess.run(["pgrep", "-f", probe], capture_output=True, text=True).stdout.split()
    probes = {}
    for f in sorted(os.listdir(probe_dir)):
        if f.endswith(".json"):
            probes[f] = json.load(open(os.path.join(probe_dir, f)))
    rec = {"cmd": cmd, "rc": p.returncode, "wall_s": round(wall, 3), "stdout": out[-6000:],
           "stderr": err[-6000:], "probes": probes, "survivors": survivors, "signal": sig_info}
    if node2:
        rec["node2"] = node2
    if "tree" in opts:
        rec["tree"] = tree(opts["tree"].replace("{T}", t))
    if "file" in opts:
        f = opts["file"].replace("{T}", t)
        rec["file"] = open(f).read()[:3000] if os.path.exists(f) else None
    shutil.rmtree(t, ignore_errors=True)
    return name, launcher, rec


def summary(name, r):
    probes = r["probes"]
    envs = [set(p["added_or_changed"]) for p in probes.values()]
    keys = set().union(*envs) if envs else set()
    return (f"rc {r['rc']}, {r['wall_s']} s, {len(probes)} probe record(s), worker env keys {len(keys)}, "
            f"stdout {len(r['stdout'].splitlines())} lines, stderr {len(r['stderr'].splitlines())} lines")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddprun", required=True)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--only", default="")
    ap.add_argument("--jobs", type=int, default=12)
    ap.add_argument("--torchrun", default="", help="a script to run instead of -m torch.distributed.run "
                    "(here: bench/torchrun_compat.py, for Debian's torch 1.13 on Python 3.11)")
    ap.add_argument("--no-pg", action="store_true", help="probes form no Gloo group")
    a = ap.parse_args()
    global NO_PG
    NO_PG = a.no_pg
    if a.torchrun:
        TORCHRUN[:] = [sys.executable, os.path.abspath(a.torchrun)]
    a.ddprun = os.path.abspath(a.ddprun)
    import torch
    print(f"torch {torch.__version__} ({sys.executable}); ddprun {os.path.abspath(a.ddprun)}", flush=True)
    cases = [c for c in CASES if not a.only or c[0] in a.only.split(",")]
    if not cases:
        sys.exit(f"side_by_side: no case matches --only={a.only}")
    results = {}
    jobs = []
    with concurrent.futures.ThreadPoolExecutor(a.jobs) as ex:
        for i, c in enumerate(cases):
            for j, launcher in enumerate(("torchrun", "ddprun")):
                jobs.append(((c[0], launcher), ex.submit(run_case, launcher, a.ddprun, c, 29600 + 2 * i + j)))
        path = os.path.join(a.out, "side_by_side.json")
        for f in concurrent.futures.as_completed([f for _, f in jobs]):
            (name, launcher), _ = next(j for j in jobs if j[1] is f)
            try:
                _, _, rec = f.result()
            except Exception as e:  # the harness's own failure: recorded, the other cases go on
                rec = {"rc": None, "wall_s": 0, "stdout": "", "stderr": f"side_by_side: {e!r}", "probes": {}}
            results.setdefault(name, {})[launcher] = rec
            # Written after every case: a run cut off by its time limit keeps what it has.
            json.dump(results, open(path, "w"), indent=1)
    results["_meta"] = {"torch": torch.__version__, "python": sys.executable,
                        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    json.dump(results, open(path, "w"), indent=1)
    for c in cases:
        for launcher in ("torchrun", "ddprun"):
            print(f"{c[0]:24} {launcher:8} {summary(c[0], results[c[0]][launcher])}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
