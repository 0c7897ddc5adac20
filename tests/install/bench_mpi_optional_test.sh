#!/usr/bin/env bash
# [install] tier: the OpenMPI benchmark is optional at configure time
# (bench/allreduce_mpi.cmake).
#   tests/install/bench_mpi_optional_test.sh SOURCE_DIR
# Configures a project that includes bench/allreduce_mpi.cmake alone, with an
# MPI C wrapper like openmpi-bin's without libopenmpi-dev (it names an include
# directory that does not exist, and no mpi.h is reachable): the configure
# succeeds, allreduce_mpi is not a target, and one line says why and what to
# install. Where this machine's mpicc compiles <mpi.h>, the same project with
# it defines allreduce_mpi.
set -euo pipefail
src=$(realpath "$1")
tmp=$(realpath "$(mktemp -d)")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "bench_mpi_optional_test: FAIL: $*" >&2; exit 1; }

mkdir "$tmp/bin" "$tmp/project"
# The wrapper answers FindMPI's questions as OpenMPI's does, with the include
# directory of the missing package; it compiles with no system headers, so no
# mpi.h is found anywhere.
cat >"$tmp/bin/mpicc" <<'WRAPPER'
#!/bin/sh
inc=/nonexistent/openmpi/include
case "$1" in
  -showme:compile) echo "-I$inc -pthread"; exit 0 ;;
  -showme:link) echo "-pthread -lmpi"; exit 0 ;;
  -showme:incdirs) echo "$inc"; exit 0 ;;
  -showme:libdirs) echo ""; exit 0 ;;
  -showme:libs) echo "mpi"; exit 0 ;;
  -showme:version) echo "mpicc: Open MPI 4.1.4"; exit 0 ;;
  -showme*) echo "cc -I$inc -pthread -lmpi"; exit 0 ;;
esac
exec cc -nostdinc -I"$inc" "$@"
WRAPPER
chmod +x "$tmp/bin/mpicc"
cat >"$tmp/project/CMakeLists.txt" <<PROJECT
cmake_minimum_required(VERSION 3.16)
project(bench_mpi_optional C)
include($src/bench/allreduce_mpi.cmake)
PROJECT

cmake -S "$tmp/project" -B "$tmp/without" -DMPI_C_COMPILER="$tmp/bin/mpicc" >"$tmp/without.log" 2>&1 ||
  { cat "$tmp/without.log" >&2; fail "configure failed with an MPI wrapper whose headers are missing"; }
want="allreduce_mpi (bench/) not built: $tmp/bin/mpicc cannot compile #include <mpi.h> (MPI's headers are missing); scripts/install-deps.sh --bench installs libopenmpi-dev"
grep -qF -- "-- $want" "$tmp/without.log" ||
  { cat "$tmp/without.log" >&2; fail "no line saying: $want"; }
[[ $(grep -c "allreduce_mpi (bench/)" "$tmp/without.log") == 1 ]] ||
  { cat "$tmp/without.log" >&2; fail "more than one line about allreduce_mpi"; }
! grep -q "allreduce_mpi" "$tmp/without/CMakeFiles/Makefile2" ||
  fail "allreduce_mpi is a target without MPI's headers"
echo "without MPI's headers: configured, one line: $want"

real=$(command -v mpicc || true)
if [[ -n "$real" ]] && echo '#include <mpi.h>' | "$real" -E -x c - >/dev/null 2>&1; then
  cmake -S "$tmp/project" -B "$tmp/with" -DMPI_C_COMPILER="$real" >"$tmp/with.log" 2>&1 ||
    { cat "$tmp/with.log" >&2; fail "configure failed with $real"; }
  grep -q "allreduce_mpi" "$tmp/with/CMakeFiles/Makefile2" ||
    { cat "$tmp/with.log" >&2; fail "allreduce_mpi is not a target with $real"; }
  ! grep -q "allreduce_mpi (bench/) not built" "$tmp/with.log" || fail "a not-built line with $real"
  echo "with $real: allreduce_mpi is a target"
else
  echo "no mpicc that compiles <mpi.h> here: the case with MPI's headers is not checked"
fi
echo "bench_mpi_optional_test: PASS"
