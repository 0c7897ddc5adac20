#!/usr/bin/env bash
# Builds the libFuzzer targets with clang in a separate build directory and
# runs each over its seed corpus for SECONDS (default 30), both at once.
# Fails on any crash, leak, sanitizer finding or broken contract check.
#
#   bash scripts/fuzz.sh                 # ~30 s per target (what `make test` runs)
#   bash scripts/fuzz.sh 3600            # a longer run
#   bash scripts/fuzz.sh 60 --build-dir /tmp/fz --only c10d_wire
#
# Without clang++ or libFuzzer it prints "SKIPPED [fuzz]: <why>" and exits 0
# (CTest shows the test as Skipped). New inputs that libFuzzer finds go to
# BUILD_DIR/corpus/<target>/, never into the seed corpora in the repository
# (tests/fuzz/corpus/<target>/); a crash leaves BUILD_DIR/artifacts/<target>-crash-*
# and this script prints the command that replays it. docs/fuzzing.md.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SECONDS_PER_TARGET=30
BUILD_DIR="$ROOT/build-fuzz"
TARGETS=(c10d_wire job_config)
while (($#)); do
  case "$1" in
    --build-dir) BUILD_DIR=$2; shift 2 ;;
    --only) TARGETS=("$2"); shift 2 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *[!0-9]*|'') echo "fuzz.sh: unknown argument '$1'; usage: fuzz.sh [SECONDS] [--build-dir DIR] [--only TARGET]" >&2; exit 2 ;;
    *) SECONDS_PER_TARGET=$1; shift ;;
  esac
done

skip() {
  echo "SKIPPED [fuzz]: $1"
  exit 0
}
command -v clang++ >/dev/null || skip "clang++ is not installed (Debian: apt-get install clang)"
command -v clang >/dev/null || skip "clang is not installed (Debian: apt-get install clang)"
PROBE=$(mktemp -d)
trap 'rm -rf "$PROBE"' EXIT
printf '%s\n' '#include <cstddef>' '#include <cstdint>' \
  'extern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }' >"$PROBE/probe.cc"
clang++ -fsanitize=fuzzer,address,undefined "$PROBE/probe.cc" -o "$PROBE/probe" 2>"$PROBE/err" ||
  skip "clang++ cannot link -fsanitize=fuzzer (libFuzzer missing): $(head -n1 "$PROBE/err")"

start=$(date +%s)
if [[ ! -f "$BUILD_DIR/CMakeCache.txt" ]]; then
  cmake -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
    -DCMAKE_BUILD_TYPE=Debug -DDDPRUN_FUZZ=ON -DDDPRUN_BUILD_TESTS=OFF -DDDPRUN_BUILD_BENCH=OFF \
    -DDDPRUN_WITH_CUDA=OFF >"$BUILD_DIR.configure.log" 2>&1 || {
    cat "$BUILD_DIR.configure.log"
    echo "fuzz: configuring $BUILD_DIR failed (log above)"
    exit 1
  }
  mv "$BUILD_DIR.configure.log" "$BUILD_DIR/configure.log"
fi
cmake --build "$BUILD_DIR" -j"$(nproc)" --target "${TARGETS[@]/#/fuzz_}" >"$BUILD_DIR/build.log" 2>&1 || {
  cat "$BUILD_DIR/build.log"
  echo "fuzz: building the fuzz targets failed (log above)"
  exit 1
}
echo "fuzz: clang build of ${TARGETS[*]/#/fuzz_} took $(($(date +%s) - start)) s"

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:symbolize=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
mkdir -p "$BUILD_DIR/artifacts"
declare -A pids
for t in "${TARGETS[@]}"; do
  seeds="$ROOT/tests/fuzz/corpus/$t"
  [[ -d "$seeds" ]] || { echo "fuzz: no seed corpus at $seeds"; exit 1; }
  mkdir -p "$BUILD_DIR/corpus/$t"
  "$BUILD_DIR/bin/fuzz_$t" -max_total_time="$SECONDS_PER_TARGET" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$BUILD_DIR/artifacts/$t-" \
    "$BUILD_DIR/corpus/$t" "$seeds" >"$BUILD_DIR/fuzz_$t.log" 2>&1 &
  pids[$t]=$!
done
failed=0
for t in "${TARGETS[@]}"; do
  if wait "${pids[$t]}"; then
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$BUILD_DIR/fuzz_$t.log" | grep -o '[0-9]*$' || true)
    cov=$(grep -o 'cov: [0-9]*' "$BUILD_DIR/fuzz_$t.log" | tail -n1 || true)
    echo "fuzz: fuzz_$t passed: ${runs:-?} inputs in ${SECONDS_PER_TARGET} s, ${cov:-cov: ?} edges"
  else
    failed=1
    tail -n 60 "$BUILD_DIR/fuzz_$t.log"
    echo "fuzz: fuzz_$t FAILED (log: $BUILD_DIR/fuzz_$t.log); replay with:"
    for a in "$BUILD_DIR/artifacts/$t-"*; do
      [[ -e "$a" ]] && echo "  $BUILD_DIR/bin/fuzz_$t $a"
    done
  fi
done
echo "fuzz: total $(($(date +%s) - start)) s"
exit $failed
