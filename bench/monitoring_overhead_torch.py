#!/usr/bin/env python3
"""Monitoring's cost on an unmodified PyTorch DDP script (docs/benchmarks.md).

The same job (tests/fixtures/hang_ddp.py on gloo, NPROC ranks, STEPS steps
of a 10 ms sleep plus a tiny model) with the start-up hook on (the default:
steps, samples, the DDP wait timing, stacks) and off (--no_python_hook), in
interleaved pairs whose order alternates (on/off, off/on, ...) so that drift
in the machine's load falls on both sides. Each job reports the median of its
own step intervals (so a stall or the warm-up does not move it); each pair
gives a ratio on/off. Printed: every pair, then the median overhead with its
interquartile range and min..max over the pairs; the overhead is called
noise when the IQR straddles zero.

Then the hook's own cost per step, which the end-to-end figure bounds only
as well as the noise allows: one process under the hook (world size 1 on
gloo, the same tiny model without the sleep, a metrics channel in a
temporary file) switching between the hook's patches and the originals
(DistributedDataParallel.forward, torch.autograd.backward, the optimizer
hook returning at once) in interleaved blocks of 200 steps; the differences
of the median step times are the hook's microseconds per step (step
counting and samples; the DDP wait timing) and their share of a 10 ms step.

    bench/monitoring_overhead_torch.py [--build build] [--pairs 10] [--steps 400]
        [--nproc 2] [--step_s 0.01] [--micro_blocks 30]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(args, hook):
    env = dict(os.environ, STEPS=str(args.steps), STEP_S=str(args.step_s), PRINT_TIME="1")
    cmd = [os.path.join(args.build, "bin", "ddprun"), "--standalone",
           "--nproc_per_node=%d" % args.nproc, "--dashboard_port=off"]
    if not hook:
        cmd.append("--no_python_hook")
    cmd += [args.python, os.path.join(SRC, "tests", "fixtures", "hang_ddp.py")]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    m = re.search(r"median_step ([0-9.]+)", p.stdout)
    if p.returncode != 0 or m is None:
        sys.exit("ddprun failed (exit %d):\n%s%s" % (p.returncode, p.stdout, p.stderr))
    return float(m.group(1))


MICRO = r"""
import os, statistics, time, torch, torch.distributed as dist
import sitecustomize as hook  # ddprun's, first on PYTHONPATH
import torch.nn.parallel.distributed as ddp_module
dist.init_process_group("gloo", init_method="file://" + os.environ["STORE_FILE"], rank=0,
                        world_size=1)
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(8, 16)
DDP = ddp_module.DistributedDataParallel
patched = (DDP.forward, torch.autograd.backward)
plain = (DDP.forward.__wrapped__, torch.autograd.backward.__wrapped__)

def mode(name):  # "on": the whole hook; "no_wait": without the DDP wait timing; "off": none
    DDP.forward, torch.autograd.backward = plain if name == "off" else patched
    hook._Wait.off = name != "on"
    hook._State.explicit = name == "off"  # the optimizer hook returns at once

def block(n):
    marks = []
    for _ in range(n):
        marks.append(time.perf_counter())
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    gaps = sorted(b - a for a, b in zip(marks, marks[1:]))
    return gaps[len(gaps) // 2]

block(200)
names = ["on", "no_wait", "off"]
res = {n: [] for n in names}
for i in range(int(os.environ["MICRO_BLOCKS"])):
    for n in (names if i % 2 == 0 else names[::-1]):
        mode(n)
        res[n].append(block(200))
for n in names:
    print("%s %.9f" % (n, statistics.median(res[n])))
"""


def micro(args):
    """The hook's per-step cost in one process: modes interleaved in blocks."""
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        channel = os.path.join(d, "channel")
        b = bytearray(34176)
        b[0:8] = b"DDPRMET1"
        b[8:16] = (1).to_bytes(4, "little") + (34176).to_bytes(4, "little")
        with open(channel, "wb") as f:
            f.write(b)
        py = os.path.join(args.build, "python")
        env = dict(os.environ, STORE_FILE=os.path.join(d, "store"),
                   MICRO_BLOCKS=str(args.micro_blocks), DDPRUN_METRICS_FILE=channel,
                   DDPRUN_STACK_FILE=os.path.join(d, "stacks"),
                   PYTHONPATH=os.path.join(py, "ddprun_hook") + ":" + py)
        p = subprocess.run([args.python, "-c", MICRO], env=env, capture_output=True, text=True,
                           timeout=600)
        got = dict(re.findall(r"^(\w+) ([0-9.]+)$", p.stdout, re.M))
        if p.returncode != 0 or len(got) != 3:
            sys.exit("the micro run failed (exit %d):\n%s%s" % (p.returncode, p.stdout,
                                                                  p.stderr))
        return {k: float(v) for k, v in got.items()}


def quartiles(xs):
    xs = sorted(xs)
    if len(xs) < 2:
        return xs[0], xs[0]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], q[2]


def report_pairs(args, ratios, on_all, off_all):
    med = statistics.median(ratios)
    q1, q3 = quartiles(ratios)
    verdict = "within noise (the IQR straddles 0)" if q1 <= 1 <= q3 else "measurable"
    print("PyTorch DDP, %d ranks, %d steps of %.0f ms, %d interleaved pairs, load %.1f:" %
          (args.nproc, args.steps, 1e3 * args.step_s, args.pairs, os.getloadavg()[0]))
    print("  median step: on %.3f ms, off %.3f ms" %
          (1e3 * statistics.median(on_all), 1e3 * statistics.median(off_all)))
    print("  overhead (median of pair ratios) %+.2f %%, IQR %+.2f..%+.2f %%, min..max "
          "%+.2f..%+.2f %%: %s" % (100 * (med - 1), 100 * (q1 - 1), 100 * (q3 - 1),
                                   100 * (min(ratios) - 1), 100 * (max(ratios) - 1), verdict))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--pairs", type=int, default=10)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--step_s", type=float, default=0.01)
    ap.add_argument("--micro_blocks", type=int, default=30)
    ap.add_argument("--python", default=os.environ.get("PYTHON_EXEC", "/usr/bin/python3"))
    args = ap.parse_args()
    ratios, on_all, off_all = [], [], []
    for i in range(args.pairs):
        order = (True, False) if i % 2 == 0 else (False, True)
        got = {hook: run(args, hook) for hook in order}
        on_all.append(got[True])
        off_all.append(got[False])
        ratios.append(got[True] / got[False])
        print("pair %2d (%s first): on %.3f ms/step, off %.3f ms/step, on/off %.4f" %
              (i + 1, "on" if order[0] else "off", 1e3 * got[True], 1e3 * got[False],
               ratios[-1]), flush=True)
    if ratios:
        report_pairs(args, ratios, on_all, off_all)
    m = micro(args)
    print("the hook per step, in one process (world 1, no sleep, %d interleaved blocks of 200 "
          "steps, medians): off %.1f us, steps+samples %+.1f us, + DDP wait timing %+.1f us;"
          " all of it %.3f %% of a %.0f ms step" %
          (args.micro_blocks, 1e6 * m["off"], 1e6 * (m["no_wait"] - m["off"]),
           1e6 * (m["on"] - m["no_wait"]), 100 * (m["on"] - m["off"]) / args.step_s,
           1e3 * args.step_s))


if __name__ == "__main__":
    main()
