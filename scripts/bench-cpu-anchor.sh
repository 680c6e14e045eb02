#!/usr/bin/env bash
# The CPU benchmark's llama.cpp anchor (issue 18, docs/BENCHMARKS.md): moeq's
# bench-engine and llama.cpp (node-llama-cpp 3.21.1's prebuilt CPU build) on
# the same checkpoint, one run, one JSON document on stdout (progress on stderr).
#
#   scripts/bench-cpu-anchor.sh [--threads N] [--min-seconds S] [--rounds R] MODEL_DIR...
#
# A BF16 checkpoint runs against llama.cpp BF16, an FP8 one (F8_E4M3 + 128x128
# scales) against llama.cpp Q8_0 of the same weights; the GGUF is converted
# once into $BUILD/llamacpp. BUILD is ./build unless MOEQ_BUILD says otherwise.
# Needs the moeq build (bench-engine, moeq) and scripts/setup.d/50-llamacpp-anchor.sh
# (node-llama-cpp, gguf-py). Exit 2: the two sides disagree on the model.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${MOEQ_BUILD:-$root/build}
dir="$root/bench/llamacpp"

[ $# -gt 0 ] || { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 1; }
for f in "$build/bench/bench-engine" "$build/cli/moeq"; do
  [ -x "$f" ] || { echo "bench-cpu-anchor: $f missing: build moeq first (cmake --build build)" >&2; exit 1; }
done
if [ ! -f "$dir/node_modules/node-llama-cpp/package.json" ] || [ ! -f "$dir/pylib/gguf/__init__.py" ]; then
  echo "bench-cpu-anchor: node-llama-cpp or gguf-py missing; running scripts/setup.d/50-llamacpp-anchor.sh" >&2
  bash "$root/scripts/setup.d/50-llamacpp-anchor.sh" >&2
fi
command -v node >/dev/null || { echo "bench-cpu-anchor: node not found" >&2; exit 1; }
exec /usr/bin/python3 "$dir/anchor.py" --build "$build" "$@"
