"""Runs the executables a wheel install carries: the `ddprun` and `ddprund`
console scripts and `python -m ddprun` exec ddprun/bin/<name> with the same
arguments (the process becomes the executable: its signals, its exit status).

The wheel lists what it bundles in ddprun/MANIFEST (scripts/packaging/
build_wheel.py). Before exec every listed file must be present; a partial
install is named in one line (exit 3), not by the dynamic loader.
"""
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
EXIT_BROKEN_INSTALL = 3


def _fail(name, message):
    sys.stderr.write("%s: %s\n" % (name, message))
    sys.exit(EXIT_BROKEN_INSTALL)


def missing_files(root=_HERE):
    """The MANIFEST's files absent under root; None when there is no MANIFEST."""
    try:
        with open(os.path.join(root, "MANIFEST")) as f:
            names = f.read().split()
    except OSError:
        return None
    return [n for n in names if not os.path.exists(os.path.join(root, n))]


def run(name):
    missing = missing_files()
    if missing is None:
        _fail(name, "this ddprun package has no executables (%s has no MANIFEST: a source "
              "checkout, not the wheel); build it with `make wheel` and pip install "
              "dist/ddprun-*.whl, or run build/bin/%s" % (_HERE, name))
    if missing:
        _fail(name, "broken install: %s missing from %s (%d file(s)); reinstall with "
              "`pip install --force-reinstall ddprun-*.whl`"
              % (missing[0], _HERE, len(missing)))
    exe = os.path.join(_HERE, "bin", name)
    os.execv(exe, [name] + sys.argv[1:])


def ddprun():
    run("ddprun")


def ddprund():
    run("ddprund")
