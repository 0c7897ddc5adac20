#!/usr/bin/env python3
"""PyTorch (the interpreter's own, 2.x on the GPU machine) under ddprun, as users run it.

    python3 tests/gpu/torch_under_ddprun.py --ddprun .device/gpu/bin/ddprun

Cases: DDP on NCCL at world size 1 on the GPU (NCCL takes one rank per GPU) and
on Gloo at 2 and 4 ranks on the CPUs, each with env:// and tcp:// init; a
torchelastic @record error file in ddprun's failure report; a restart after a
worker failure; ddprun.checkpoint of CUDA tensors across a kill -9. NCCL and
CUDA cases report themselves skipped when torch sees no GPU.
Prints one line per case and closes with "N passed, N failed, N skipped";
exits non-zero when any case failed.
"""
import argparse
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TRAIN = os.path.join(ROOT, "examples", "ddp_train.py")
WORKER = os.path.join(HERE, "torch_worker.py")
results = {"passed": 0, "failed": 0, "skipped": 0}


def run(ddprun, args, timeout=180):
    env = dict(os.environ, PYTHON_EXEC=sys.executable)
    try:
        r = subprocess.run([ddprun] + args, env=env, capture_output=True, text=True,
                           timeout=timeout)
        return r.returncode, r.stdout, r.stderr
    except subprocess.TimeoutExpired as e:
        return -1, e.stdout or "", f"{e.stderr or ''}\n[timed out after {timeout} s]"


def report(name, ok, why, out="", err=""):
    results["passed" if ok else "failed"] += 1
    print(f"{'PASS' if ok else 'FAIL'} {name}: {why}", flush=True)
    if not ok:
        print("  stdout tail:\n" + "\n".join("    " + l for l in out.splitlines()[-15:]))
        print("  stderr tail:\n" + "\n".join("    " + l for l in err.splitlines()[-25:]))


def check_ranks(out_dir, world):
    """Every rank wrote '<digest> <world> <first> <last>': one digest, losses fell."""
    digests = set()
    for r in range(world):
        path = os.path.join(out_dir, f"rank{r}.txt")
        if not os.path.exists(path):
            return False, f"rank {r} wrote no result"
        digest, w, first, last = open(path).read().split()
        if int(w) != world or float(last) >= float(first):
            return False, f"rank {r}: world {w}, loss {first} -> {last}"
        digests.add(digest)
    if len(digests) != 1:
        return False, f"{len(digests)} different parameter digests"
    return True, f"{world} rank(s), identical parameters, loss fell"


def ddp_case(ddprun, backend, world, init):
    name = f"DDP {backend} world {world} {init}://"
    if backend == "nccl":
        import torch
        if not torch.cuda.is_available():
            results["skipped"] += 1
            print(f"SKIPPED {name}: torch sees no CUDA device", flush=True)
            return
    d = tempfile.mkdtemp(prefix="ddprun_torch2_")
    rc, out, err = run(ddprun, [f"--nproc_per_node={world}", TRAIN, "--backend", backend,
                                "--init", init, "--steps", "10", "--out", d])
    ok, why = check_ranks(d, world) if rc == 0 else (False, f"ddprun exited {rc}")
    # The environment ddprun sets must not draw torch's deprecation warnings
    # (torch 2.x warns on NCCL_ASYNC_ERROR_HANDLING, the name torch <= 2.1 read).
    deprecated = [l for l in err.splitlines() if "is deprecated; use" in l]
    if ok and deprecated:
        ok, why = False, f"torch warned: {deprecated[0].strip()}"
    report(name, ok, why, out, err)


def record_case(ddprun):
    d = tempfile.mkdtemp(prefix="ddprun_torch2_")
    rc, out, err = run(ddprun, ["--nproc_per_node=2", "--rdzv_id=record", WORKER, "record", d])
    want = "RuntimeError: boom from rank 1 of 2"
    ok = rc != 0 and want in err
    report("@record error file in the failure report", ok,
           f"ddprun exited {rc}, report {'names' if want in err else 'lacks'} '{want}'", out, err)


def restart_case(ddprun):
    d = tempfile.mkdtemp(prefix="ddprun_torch2_")
    rc, out, err = run(ddprun, ["--nproc_per_node=2", "--max_restarts=1", WORKER, "restart", d])
    files = sorted(os.listdir(d))
    ok = rc == 0 and files == ["rank0.restart1", "rank1.restart1"]
    report("restart after a worker failure", ok, f"ddprun exited {rc}, results {files}", out, err)


def checkpoint_case(ddprun, device="cuda"):
    """ddprun.checkpoint of CUDA tensors: saved, the worker killed -9, loaded
    back by the restarted worker on its device, bit for bit (torch_worker.py
    ckpt). device="cpu" runs the same checks where torch sees no GPU."""
    import torch
    name = f"ddprun.checkpoint of {device} tensors across a kill -9"
    if device == "cuda" and not torch.cuda.is_available():
        results["skipped"] += 1
        print(f"SKIP {name}: torch sees no CUDA device", flush=True)
        return
    d = tempfile.mkdtemp(prefix="ddprun_torch2_")
    env = {"DDPRUN_TEST_CKPT_DEVICE": "cpu"} if device == "cpu" else {}
    os.environ.update(env)
    try:
        rc, out, err = run(ddprun, ["--nproc_per_node=1", "--max_restarts=1", WORKER, "ckpt", d])
    finally:
        for k in env:
            os.environ.pop(k)
    path = os.path.join(d, "ckpt.1")
    said = open(path).read().strip() if os.path.exists(path) else "no result file"
    report(name, rc == 0 and said.startswith("ok"), f"ddprun exited {rc}: {said}", out, err)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddprun", default=os.path.join(ROOT, "build", "bin", "ddprun"))
    args = ap.parse_args()
    import torch
    print(f"torch {torch.__version__} ({sys.executable}), CUDA available: "
          f"{torch.cuda.is_available()}, NCCL: "
          f"{torch.cuda.nccl.version() if torch.cuda.is_available() else 'n/a'}", flush=True)
    for init in ("env", "tcp"):
        ddp_case(args.ddprun, "nccl", 1, init)
        for world in (2, 4):
            ddp_case(args.ddprun, "gloo", world, init)
    record_case(args.ddprun)
    restart_case(args.ddprun)
    checkpoint_case(args.ddprun)
    print(f"{results['passed']} passed, {results['failed']} failed, "
          f"{results['skipped']} skipped", flush=True)
    sys.exit(1 if results["failed"] else 0)


if __name__ == "__main__":
    main()
