#!/usr/bin/env python3
"""docs/cli.md's torchrun 2.x compatibility table: every row answered and tested.

    check_compat_table.py SOURCE_DIR [CLI_MD]

Each row of the tables under "## torchrun 2.x compatibility" must have a
non-empty answer in every column, and its last column (test) must name at
least one test, each in backticks, that exists: a Catch2 TEST_CASE anywhere
under tests/ whose name is the text, or "torchrun 2.x row: <text>" (the
conformance tier, tests/multiproc/torchrun2x_test.cc), or that starts with the
text (or "torchrun 2.x row: <text>") followed by ':' or ' '
(`PlanGpuNumaBinding` for "PlanGpuNumaBinding: node, ..."), or, when the text ends with "...", with the text before it.
Prints one line per problem, "cli.md:<line>: <row>: <problem>", and exits 1;
exits 0 silently when every row is answered and tested.
"""
import pathlib
import re
import sys

ROW_PREFIX = "torchrun 2.x row: "
STRING = re.compile(r'"((?:[^"\\]|\\.)*)"')


def test_names(tests_dir):
    """Every TEST_CASE name under tests_dir (adjacent literals joined)."""
    names = set()
    for path in tests_dir.rglob("*.cc"):
        text = path.read_text(errors="replace")
        for m in re.finditer(r"\bTEST_CASE\s*\(", text):
            pos, parts = m.end(), []
            while True:
                ws = re.match(r"\s*", text[pos:])
                lit = STRING.match(text, pos + ws.end())
                if not lit:
                    break
                parts.append(lit.group(1).replace('\\"', '"').replace("\\\\", "\\"))
                pos = lit.end()
            if parts:
                names.add("".join(parts))
    return names


def matches(wanted, names):
    if wanted in names or ROW_PREFIX + wanted in names:
        return True
    if wanted.endswith("..."):
        stem = wanted[:-3].rstrip()
        return any(n.startswith(stem) or n.startswith(ROW_PREFIX + stem) for n in names)
    return any(n.startswith(p + wanted + sep) for n in names for p in ("", ROW_PREFIX)
               for sep in (":", " "))


def cells(line):
    """The cells of a table row; '\\|' stays inside its cell."""
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def main():
    src = pathlib.Path(sys.argv[1])
    cli_md = pathlib.Path(sys.argv[2]) if len(sys.argv) > 2 else src / "docs" / "cli.md"
    names = test_names(src / "tests")
    lines = cli_md.read_text().splitlines()
    problems, rows, inside = [], 0, False
    for number, line in enumerate(lines, 1):
        if line.startswith("## "):
            inside = line.startswith("## torchrun 2.x compatibility")
            continue
        if not inside or not line.startswith("|") or re.match(r"^\|[-| ]+\|$", line):
            continue
        row = cells(line)
        if row[-1].lower() == "test":  # a header
            continue
        rows += 1
        where = f"{cli_md.name}:{number}: {row[0]}"
        for cell in row:
            if cell in ("", "—", "-"):
                problems.append(f"{where}: a cell has no answer")
                break
        wanted = re.findall(r"`([^`]+)`", row[-1])
        if not wanted:
            problems.append(f"{where}: the test column names no test in backticks")
        for name in wanted:
            if not matches(name, names):
                problems.append(f"{where}: no test named '{name}' under tests/")
    if rows == 0:
        problems.append(f"{cli_md.name}: no torchrun 2.x compatibility table found")
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
