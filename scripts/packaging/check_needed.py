#!/usr/bin/env python3
"""Checks a wheel's (or an unpacked package's) executables and libraries load
from the package alone: lists each ELF's NEEDED entries and fails on any that
is neither in the base-system set (elf_deps.BASE_LIBRARIES: glibc, libstdc++,
libgcc, zlib) nor found in the ELF's own $ORIGIN-relative RUNPATH, and on any
RUNPATH entry that points outside the package.

    check_needed.py dist/ddprun-*.whl      (or a directory)
Exit 0 when every ELF is self-contained, 1 with one line per problem.
"""
import os
import sys
import tempfile
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import elf_deps  # noqa: E402


def check_tree(root):
    problems, elves = [], 0
    for d, _, files in os.walk(root):
        for name in sorted(files):
            path = os.path.join(d, name)
            if os.path.islink(path) or not elf_deps.is_elf(path):
                continue
            elves += 1
            rel = os.path.relpath(path, root)
            needed, runpaths = elf_deps.dynamic_section(path)
            print("%s: NEEDED %s; RUNPATH %s" % (rel, " ".join(needed), ":".join(runpaths) or "-"))
            dirs = []
            for rp in runpaths:
                if not rp.startswith("$ORIGIN"):
                    problems.append("%s: RUNPATH %s is not $ORIGIN-relative" % (rel, rp))
                    continue
                real = os.path.realpath(rp.replace("$ORIGIN", os.path.dirname(path), 1))
                if os.path.relpath(real, os.path.realpath(root)).startswith(".."):
                    problems.append("%s: RUNPATH %s leaves the package" % (rel, rp))
                dirs.append(real)
            for lib in needed:
                if lib in elf_deps.BASE_LIBRARIES:
                    continue
                if not any(os.path.exists(os.path.join(x, lib)) for x in dirs):
                    problems.append("%s: needs %s, which is neither bundled beside it (RUNPATH) nor "
                                    "part of a base system" % (rel, lib))
    if elves == 0:
        problems.append("%s: no ELF files found" % root)
    return problems


def main(argv):
    if len(argv) != 2:
        print("usage: check_needed.py WHEEL_OR_DIR", file=sys.stderr)
        return 2
    target = argv[1]
    if os.path.isdir(target):
        problems = check_tree(target)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            with zipfile.ZipFile(target) as z:
                z.extractall(tmp)
            problems = check_tree(tmp)
    for p in problems:
        print("check_needed: FAIL: " + p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
