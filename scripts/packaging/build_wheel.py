#!/usr/bin/env python3
"""Builds dist/ddprun-<version>-py3-none-<platform>.whl from a build tree,
offline: no pip, no downloads, only the standard library and binutils/patchelf.

    build_wheel.py --build build-demo --out dist      (make wheel)

The wheel (docs/install.md) is a platlib package `ddprun`:
  ddprun/bin/{ddprun,ddprund}     the executables; console scripts exec them (ddprun/_launch.py)
  ddprun/lib/                     libddprun_grpc.so, libddprun_worker_sdk.so and every shared
                                  library they need outside the base system, RUNPATH $ORIGIN,
                                  renamed libX-<sha256[:8]>.so.N with NEEDED rewritten (what
                                  auditwheel does; elf_deps.BASE_LIBRARIES stay out)
  ddprun/python/                  ddprun_sdk.py, ddprun_metrics.py, ddprun_hook/ (the agent finds
                                  them beside bin/); on sys.path through ddprun.pth
  ddprun/*.py                     the package (worker_sdk/python/ddprun/: every module)
  ddprun/MANIFEST                 bin/ and lib/, checked before every exec
Its tag is py3-none-manylinux_<glibc>_x86_64, glibc being the newer of what
the ELFs require and the build machine's (its libstdc++ is as new as that
system's). Exit 0 and the wheel's path on stdout; else one line on stderr.
"""
import argparse
import base64
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import elf_deps  # noqa: E402

SOURCE = os.path.realpath(os.path.join(HERE, "..", ".."))
PY_SRC = os.path.join(SOURCE, "worker_sdk", "python")
EXECUTABLES = ("ddprun", "ddprund")
# Our own libraries, from the build tree's lib/: the SDK twice (a zip holds
# no symlinks), under the name ddprun_sdk.py loads and under its SONAME, which
# C++ programs linked with it need.
OWN_LIBRARIES = {"libddprun_grpc.so": "libddprun_grpc.so",
                 "libddprun_worker_sdk.so": "libddprun_worker_sdk.so",
                 "libddprun_worker_sdk.so.0": "libddprun_worker_sdk.so.0"}
SUMMARY = "Elastic torchrun-style launcher, rendezvous daemon and worker SDK for PyTorch jobs"


def fail(message):
    sys.exit("build_wheel: " + message)


def run(*cmd):
    subprocess.run(cmd, check=True)


def stage(build, pkg):
    """Copies everything into pkg (the future site-packages/ddprun)."""
    os.makedirs(os.path.join(pkg, "bin"))
    os.makedirs(os.path.join(pkg, "lib"))
    for name in sorted(os.listdir(os.path.join(PY_SRC, "ddprun"))):
        if name.endswith(".py"):
            shutil.copy(os.path.join(PY_SRC, "ddprun", name), pkg)
    pydir = os.path.join(pkg, "python")
    os.makedirs(os.path.join(pydir, "ddprun_hook"))
    for name in ("ddprun_sdk.py", "ddprun_metrics.py"):
        shutil.copy(os.path.join(PY_SRC, name), pydir)
    shutil.copy(os.path.join(PY_SRC, "ddprun_hook", "sitecustomize.py"),
                os.path.join(pydir, "ddprun_hook"))
    elves = []
    for name in EXECUTABLES:
        src = os.path.join(build, "bin", name)
        if not os.path.exists(src):
            fail("%s is missing; build it first (make product)" % src)
        shutil.copy(src, os.path.join(pkg, "bin", name))
        elves.append(os.path.join(pkg, "bin", name))
    for src_name, name in OWN_LIBRARIES.items():
        src = os.path.realpath(os.path.join(build, "lib", src_name))
        if not os.path.exists(src):
            fail("%s is missing; build it first (make product)" % src)
        shutil.copy(src, os.path.join(pkg, "lib", name))
        elves.append(os.path.join(pkg, "lib", name))
    # Every library the ELFs load (ldd: the whole closure), outside the base set.
    bundled = {}
    for elf in list(elves):
        for needed, path in elf_deps.resolved(elf).items():
            if needed in elf_deps.BASE_LIBRARIES or needed in OWN_LIBRARIES.values():
                continue
            if needed not in bundled:
                bundled[needed] = path
                dst = os.path.join(pkg, "lib", needed)
                shutil.copy(os.path.realpath(path), dst)
                os.chmod(dst, 0o755)
                elves.append(dst)
    for elf in elves:
        os.chmod(elf, 0o755)
        run("strip", "--strip-debug", elf)
    elves = hash_names(pkg, elves, bundled)
    for elf in elves:
        rpath = "$ORIGIN/../lib" if os.path.basename(os.path.dirname(elf)) == "bin" else "$ORIGIN"
        run("patchelf", "--set-rpath", rpath, elf)
    manifest = sorted(os.path.relpath(e, pkg) for e in elves)
    manifest += ["python/ddprun_sdk.py", "python/ddprun_metrics.py",
                 "python/ddprun_hook/sitecustomize.py"]
    with open(os.path.join(pkg, "MANIFEST"), "w") as f:
        f.write("\n".join(manifest) + "\n")
    return elves


def hashed_name(name, path):
    """libgrpc++.so.1.51 -> libgrpc++-1a2b3c4d.so.1.51: the first 8 hex digits of the
    file's SHA-256 before its first ".so", as auditwheel names what it bundles."""
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:8]
    stem, dot, rest = name.partition(".so")
    return "%s-%s%s%s" % (stem, digest, dot, rest)


def hash_names(pkg, elves, bundled):
    """Renames each bundled library (not ours) to its hashed name, sets that as
    its SONAME and rewrites every ELF's NEEDED entries to it. Then a worker that
    also loads another copy of, say, libprotobuf.so.32 (its own, or the system's)
    gets both, each with the code it was built with, instead of whichever the
    process loaded first. Returns the ELFs' new paths."""
    libdir = os.path.join(pkg, "lib")
    renamed = {}
    for name in sorted(bundled):
        new = hashed_name(name, os.path.join(libdir, name))
        os.rename(os.path.join(libdir, name), os.path.join(libdir, new))
        renamed[name] = new
    out = []
    for elf in elves:
        d, base = os.path.split(elf)
        if d == libdir and base in renamed:
            elf = os.path.join(libdir, renamed[base])
            run("patchelf", "--set-soname", renamed[base], elf)
        needed, _ = elf_deps.dynamic_section(elf)
        args = []
        for lib in needed:
            if lib in renamed:
                args += ["--replace-needed", lib, renamed[lib]]
        if args:
            run("patchelf", *args, elf)
        out.append(elf)
    return out


def platform_tag(elves):
    glibc = elf_deps.max_glibc_version(elves)
    libc, ver = platform.libc_ver()
    if libc == "glibc" and ver:
        glibc = max(glibc, tuple(int(x) for x in ver.split(".")[:2]))
    return "manylinux_%d_%d_%s" % (glibc[0], glibc[1], platform.machine())


def record_line(arcname, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d" % (arcname, digest, len(data))


def write_wheel(root, out, version, tag):
    dist_info = "ddprun-%s.dist-info" % version
    meta = {
        "METADATA": "Metadata-Version: 2.1\nName: ddprun\nVersion: %s\nSummary: %s\n"
                    "Requires-Python: >=3.8\nLicense: see the repository\n\n"
                    "ddprun and ddprund with every shared library they need; "
                    "`import ddprun` is the worker SDK. See docs/install.md.\n" % (version, SUMMARY),
        "WHEEL": "Wheel-Version: 1.0\nGenerator: ddprun build_wheel.py\nRoot-Is-Purelib: false\n"
                 "Tag: py3-none-%s\n" % tag,
        "entry_points.txt": "[console_scripts]\nddprun = ddprun._launch:ddprun\n"
                            "ddprund = ddprun._launch:ddprund\n",
        "top_level.txt": "ddprun\n",
    }
    with open(os.path.join(root, "ddprun.pth"), "w") as f:
        f.write("ddprun/python\n")  # relative to site-packages: ddprun_sdk importable
    os.makedirs(os.path.join(root, dist_info))
    for name, text in meta.items():
        with open(os.path.join(root, dist_info, name), "w") as f:
            f.write(text)
    path = os.path.join(out, "ddprun-%s-py3-none-%s.whl" % (version.replace("-", "_"), tag))
    records = []
    files = []
    for d, _, names in os.walk(root):
        for name in names:
            files.append(os.path.relpath(os.path.join(d, name), root))
    # dist-info last (pip reads it from anywhere; convention), RECORD at the very end.
    files.sort(key=lambda p: (p.startswith(dist_info), p))
    tmp = path + ".tmp"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for rel in files:
            full = os.path.join(root, rel)
            with open(full, "rb") as f:
                data = f.read()
            info = zipfile.ZipInfo(rel, date_time=(2020, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = ((0o755 if os.access(full, os.X_OK) else 0o644) | 0o100000) << 16
            z.writestr(info, data)
            records.append(record_line(rel, data))
        records.append("%s/RECORD,," % dist_info)
        z.writestr(zipfile.ZipInfo("%s/RECORD" % dist_info, date_time=(2020, 1, 1, 0, 0, 0)),
                   "\n".join(records) + "\n")
    os.replace(tmp, path)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", required=True, help="the CMake build tree (bin/, lib/)")
    ap.add_argument("--out", default="dist", help="where the wheel goes")
    args = ap.parse_args()
    for tool in ("patchelf", "readelf", "strip", "ldd"):
        if shutil.which(tool) is None:
            fail("%s not found; install it with scripts/install-deps.sh" % tool)
    build = os.path.realpath(args.build)
    try:
        with open(os.path.join(build, "ddprun_version.txt")) as f:
            version = f.read().strip()
    except OSError:
        fail("%s/ddprun_version.txt missing; configure the build first (make product)" % build)
    # The version is taken at configure time; a binary built before the last
    # reconfigure would carry another one than the wheel's name.
    exe = os.path.join(build, "bin", "ddprun")
    if os.path.exists(exe):
        said = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
        if said.splitlines()[:1] != ["ddprun " + version]:
            fail("%s says %r, but %s is configured as version %s; rebuild it (make product)"
                 % (exe, said.splitlines()[:1], build, version))
    os.makedirs(args.out, exist_ok=True)
    with tempfile.TemporaryDirectory() as root:
        elves = stage(build, os.path.join(root, "ddprun"))
        tag = platform_tag(elves)
        path = write_wheel(root, args.out, version, tag)
    print(path)


if __name__ == "__main__":
    main()
