#!/usr/bin/env bash
# The whole suite, as `make test` and CI run it:
#   1. install what is missing (scripts/setup.sh)
#   2. build everything (CUDA kernels too when nvcc exists) and run ctest:
#      unit, integration (the `services` fixture starts a private Kafka broker
#      and redis-server on free ports), gpu (skipped with a reason without a
#      device), slow
#   3. rebuild with AddressSanitizer + UndefinedBehaviorSanitizer, run unit tests
#   4. build the libFuzzer targets with clang and run each for a fixed time
# Flags: --asan-only, --fuzz-only, --no-asan, --no-fuzz
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
jobs=$(nproc)
run_main=1 run_asan=1 run_fuzz=1
for a in "$@"; do
  case "$a" in
    --asan-only) run_main=0 run_fuzz=0 ;;
    --fuzz-only) run_main=0 run_asan=0 ;;
    --no-asan) run_asan=0 ;;
    --no-fuzz) run_fuzz=0 ;;
    *) echo "test.sh: unknown flag $a" >&2; exit 2 ;;
  esac
done
fuzz_seconds=${MOEQ_FUZZ_SECONDS:-30}

scripts/setup.sh
status=0

if [ $run_asan = 1 ]; then
  echo "== sanitizers: unit tests under ASan + UBSan"
  # Each stage runs in a subshell so that a failing stage is reported and the
  # next still runs: the main suite's summary always closes the log.
  ( set -e
    cmake -S . -B build-asan -DMOEQ_SANITIZE=ON -DMOEQ_CUDA=OFF -DMOEQ_NATIVE=OFF -DCMAKE_BUILD_TYPE=Debug >/dev/null
    cmake --build build-asan -j"$jobs"
    cd build-asan
    ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
      ctest -L unit -LE "slow|python" --output-on-failure -j"$jobs" ) || { status=1; echo "== sanitizers: FAILED"; }
fi

if [ $run_fuzz = 1 ]; then
  echo "== fuzz: each libFuzzer target for ${fuzz_seconds}s"
  ( set -e
    CC=clang CXX=clang++ cmake -S . -B build-fuzz -DMOEQ_FUZZ=ON -DMOEQ_CUDA=OFF -DMOEQ_NATIVE=OFF \
      -DCMAKE_BUILD_TYPE=Debug >/dev/null
    # Only the fuzz targets (and what they link) are built here.
    targets=$(cmake --build build-fuzz --target help | sed -n 's/^\.\.\. \(fuzz_[A-Za-z0-9_]*\).*/\1/p')
    [ -n "$targets" ]
    cmake --build build-fuzz -j"$jobs" --target $targets ) || { status=1; echo "== fuzz: build FAILED"; }
  for f in build-fuzz/tests/fuzz_*; do
    [ -x "$f" ] || continue
    name=$(basename "$f")
    corpus="build-fuzz/corpus-$name"
    mkdir -p "$corpus"
    seeds=()
    [ -d "tests/fuzz/seeds/$name" ] && seeds+=("tests/fuzz/seeds/$name")
    echo "-- $name"
    "$f" -max_total_time="$fuzz_seconds" -rss_limit_mb=1024 -print_final_stats=1 \
      "$corpus" "${seeds[@]}" 2>&1 | tail -n 12 || status=1
  done
fi

# The main suite runs last so that its ctest summary closes the log.
if [ $run_main = 1 ]; then
  echo "== build and run the whole suite"
  ( set -e
    cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
    cmake --build build -j"$jobs" ) || { status=1; echo "== build FAILED"; }
  (cd build && ctest --output-on-failure -j"$jobs" --timeout 900) || status=1
  # Skipped tests (gpu without a device, ...) print a line starting with SKIP
  # saying why; show those reasons so a skip is never silent.
  grep -h '^SKIP' build/Testing/Temporary/LastTest.log 2>/dev/null | sort -u || true
fi
exit $status
