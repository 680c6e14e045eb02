#!/usr/bin/env bash
# `make demo`: set up, build, and run the main job end to end: Kafka and Redis,
# a coordinator and two workers, 20 sample documents with an analysis
# instruction (scripts/demo-pipeline.sh). MOEQ_MODEL=DIR runs a real
# checkpoint (DeepSeek-V3/R1, V2-Lite, Moonlight, ... in the HF layout);
# without it the deterministic `tiny` test checkpoint is generated.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)"
moeq=build/cli/moeq
out=${MOEQ_DEMO_OUT:-demo-out}
mkdir -p "$out"

if ! $moeq --help | grep -q gen-model; then
  echo "demo: this build has no 'moeq gen-model' yet; see docs/PLAN.md" >&2
  exit 1
fi
model=${MOEQ_MODEL:-$out/model-tiny}
if [ ! -f "$model/config.json" ]; then
  echo "demo: generating the tiny test checkpoint into $model"
  $moeq gen-model --preset tiny --out "$model"
fi
if [ -z "${MOEQ_MODEL:-}" ]; then
  echo "demo: note: the generated checkpoint has random weights, so its text is noise; the pipeline,"
  echo "      batching and exactness are real. Set MOEQ_MODEL=DIR to run a real checkpoint."
fi
if $moeq --help | grep -q '^  worker'; then
  exec scripts/demo-pipeline.sh "$model" "$out"
fi
echo "demo: the pipeline (coordinator + workers) is not built yet; running the engine alone"
$moeq generate --model "$model" --prompt "Summarise the following document in one sentence:" --max-new-tokens 24
