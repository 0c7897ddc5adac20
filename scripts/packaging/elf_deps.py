"""The shared-library facts the wheel needs, from binutils' readelf: an ELF's
NEEDED entries, its RUNPATH/RPATH, and the base-system set a wheel may leave
out (what auditwheel's manylinux policy allows, narrowed to Debian's base:
glibc, libstdc++, libgcc, zlib)."""
import re
import subprocess

# Provided by every Debian/Ubuntu base system: glibc's libraries and loader,
# the GCC runtime, zlib.
BASE_LIBRARIES = frozenset([
    "libc.so.6", "libm.so.6", "libpthread.so.0", "libdl.so.2", "librt.so.1", "libresolv.so.2",
    "libutil.so.1", "libanl.so.1", "ld-linux-x86-64.so.2", "libstdc++.so.6", "libgcc_s.so.1",
    "libz.so.1",
])


def is_elf(path):
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def dynamic_section(path):
    """(needed, runpaths) of one ELF: NEEDED names, RUNPATH or RPATH entries."""
    out = subprocess.run(["readelf", "-dW", path], check=True, capture_output=True,
                         text=True).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)
    runpaths = []
    for m in re.finditer(r"\((?:RUNPATH|RPATH)\)\s+Library (?:runpath|rpath): \[([^\]]*)\]", out):
        runpaths += [p for p in m.group(1).split(":") if p]
    return needed, runpaths


def resolved(path):
    """{NEEDED name: resolved path} for an ELF and everything it loads (ldd)."""
    out = subprocess.run(["ldd", path], check=True, capture_output=True, text=True).stdout
    libs = {}
    for line in out.splitlines():
        m = re.match(r"\s*(\S+) => (\S+) \(", line)
        if m:
            libs[m.group(1)] = m.group(2)
        elif "not found" in line:
            raise SystemExit("%s: %s" % (path, line.strip()))
    return libs


def max_glibc_version(paths):
    """The newest GLIBC_x.y symbol version the ELFs at paths require, as (x, y)."""
    best = (2, 17)
    for path in paths:
        out = subprocess.run(["readelf", "-VW", path], check=True, capture_output=True,
                             text=True).stdout
        for major, minor in re.findall(r"Name: GLIBC_(\d+)\.(\d+)", out):
            best = max(best, (int(major), int(minor)))
    return best
