#!/usr/bin/env python3
"""Fails when a Markdown file of the repository leaves a code fence open.

Usage: check_md_fences.py SOURCE_DIR [FILE...]

Without FILEs it checks every tracked *.md of SOURCE_DIR (git ls-files; every
*.md outside build*/ and hidden folders when SOURCE_DIR is not a git checkout).
A fence is a line of three or more backticks (or tildes), indented or not, as
CommonMark reads it: it opens a code block, and only a line of the same
character, at least as long and with no info string, closes it. A block still
open at the end of a file (an odd number of fences, or an opener where a closer
was meant) renders the rest of the page as code: one line per such file names
the file and the line of the fence that opened it. Exit 0 when every fence is
closed, 1 otherwise.
"""
import os
import re
import subprocess
import sys

FENCE = re.compile(r"^\s*(`{3,}|~{3,})(.*)$")


def markdown_files(source_dir):
    try:
        out = subprocess.run(["git", "-C", source_dir, "ls-files", "-z", "--", "*.md"],
                             check=True, capture_output=True, text=True).stdout
        return sorted(f for f in out.split("\0") if f)
    except (OSError, subprocess.CalledProcessError):
        found = []
        for root, dirs, files in os.walk(source_dir):
            dirs[:] = [d for d in dirs if not d.startswith((".", "build"))]
            found += [os.path.relpath(os.path.join(root, f), source_dir)
                      for f in files if f.endswith(".md")]
        return sorted(found)


def unclosed_fence(path):
    """(line number, fence) of the fence left open at the end of path, or None;
    also the number of fence lines in the file."""
    opened = None  # (line number, fence characters)
    fences = 0
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            m = FENCE.match(line.rstrip("\n"))
            if not m:
                continue
            marks, rest = m.group(1), m.group(2).strip()
            if opened is None:
                if marks[0] == "`" and "`" in rest:
                    continue  # inline code such as ```x```, not a fence
                opened = (number, marks)
                fences += 1
            elif marks[0] == opened[1][0] and len(marks) >= len(opened[1]) and not rest:
                opened = None
                fences += 1
    return opened, fences


def main(argv):
    if len(argv) < 2:
        print("usage: check_md_fences.py SOURCE_DIR [FILE...]", file=sys.stderr)
        return 2
    source_dir = argv[1]
    files = argv[2:] or markdown_files(source_dir)
    if not files:
        print(f"no Markdown files under {source_dir}: pass the repository's root", file=sys.stderr)
        return 2
    bad = 0
    for name in files:
        path = name if os.path.isabs(name) else os.path.join(source_dir, name)
        opened, fences = unclosed_fence(path)
        if opened:
            bad += 1
            line, marks = opened
            print(f"{name}:{line}: the code fence {marks} opened here is never closed "
                  f"({fences} fence lines in the file), so the rest of the page renders as "
                  f"code: close the block with a line of {marks} alone")
    if bad:
        return 1
    print(f"every code fence is closed in {len(files)} Markdown file(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
