"""What the checkpoint benchmarks share (checkpoint_bench.py, ckpt_slowdown.py,
recovery_ckpt_bench.py, inplace_recovery.py): their --size parser, a free
loopback port, the environment a ddprun job of the build's Python package
needs, their worker script written to a folder and the load average line.

Imported from bench/ (the scripts run from the repository, so their own
folder is on sys.path).
"""
import os
import re
import socket

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_BUILD = os.path.join(HERE, "..", "build")


def parse_size(text):
    """Bytes of a --size such as 256MiB, 1GiB, 64M or 4096; exits naming the flag otherwise."""
    m = re.fullmatch(r"(\d+)\s*([KMG]i?B?)?", text.strip())
    if not m:
        raise SystemExit("--size: %r is not a size like 256MiB or 1GiB" % text)
    scale = 1 if not m.group(2) else {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2)[0]]
    return int(m.group(1)) * scale


def free_port():
    """A TCP port free on 127.0.0.1 now (the caller binds it soon after)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def python_exec():
    """The workers' interpreter: $PYTHON_EXEC, else /usr/bin/python3 (the one with torch)."""
    return os.environ.get("PYTHON_EXEC", "/usr/bin/python3")


def job_env(build, python, **extra):
    """The environment of a ddprun job whose workers import the build's ddprun package."""
    return dict(os.environ, PYTHON_EXEC=python, PYTHONPATH=os.path.join(build, "python"), **extra)


def write_worker(folder, text):
    """Writes the benchmark's worker program to folder/worker.py; returns its path."""
    path = os.path.join(folder, "worker.py")
    with open(path, "w") as f:
        f.write(text)
    return path


def load_average():
    """The line every benchmark prints: the 1, 5 and 15 minute load averages."""
    return "load average: %s" % open("/proc/loadavg").read().split()[:3]

