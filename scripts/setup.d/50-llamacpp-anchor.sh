#!/usr/bin/env bash
# The llama.cpp anchor of the CPU benchmark (scripts/bench-cpu-anchor.sh,
# docs/BENCHMARKS.md): llama.cpp as node-llama-cpp 3.21.1 ships it (npm, the
# prebuilt Linux x64 CPU binaries only: `npm ci --omit=optional` skips the
# CUDA/Vulkan/ARM builds, ~650 MB, and the lock's direct dependency on
# @node-llama-cpp/linux-x64 keeps the one we need), and gguf-py 0.19.0 (pip,
# the library llama.cpp's converter uses; installed --no-deps with --target
# into bench/llamacpp/pylib: it runs on Debian's numpy and yaml). Both are
# git-ignored. A failure is a warning, not an error: the anchor is a benchmark,
# and its test (llamacpp_anchor_converts_tiny) skips with the reason. Skipped
# on MOEQ_LLAMACPP_ANCHOR=OFF. Idempotent: each part is skipped when present.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
dir="$root/bench/llamacpp"
gguf_pin=${MOEQ_GGUF_PY:-gguf==0.19.0}

[ "${MOEQ_LLAMACPP_ANCHOR:-ON}" = OFF ] && exit 0
warn() { echo "setup: warning: $*; scripts/bench-cpu-anchor.sh will not run" >&2; }

retry() { # retry CMD...: three tries, 5 and 10 s apart
  for try in 1 2 3; do
    "$@" && return 0
    [ "$try" = 3 ] && return 1
    sleep $((try * 5))
  done
}

if [ -f "$dir/node_modules/.package-lock.json" ] && [ "$dir/node_modules/.package-lock.json" -nt "$dir/package-lock.json" ] &&
   [ -f "$dir/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64/llama-addon.node" ]; then
  :
elif ! command -v npm >/dev/null; then
  warn "npm not found"
else
  echo "setup: installing node-llama-cpp for the llama.cpp anchor (bench/llamacpp, npm ci)"
  npm_ci() { (cd "$dir" && npm ci --omit=optional --no-audit --no-fund --loglevel=error >/dev/null); }
  retry npm_ci ||
    warn "npm ci in bench/llamacpp failed 3 times"
fi

stamp="$dir/pylib/.pin"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$gguf_pin" ] && [ -f "$dir/pylib/gguf/__init__.py" ]; then
  exit 0
fi
if ! /usr/bin/python3 -m pip --version >/dev/null 2>&1; then
  warn "/usr/bin/python3 -m pip is not available"
  exit 0
fi
echo "setup: installing $gguf_pin for the llama.cpp anchor (bench/llamacpp/pylib, pip --target)"
rm -rf "$dir/pylib.tmp"
# shellcheck disable=SC2086 # the pin is one word
if retry /usr/bin/python3 -m pip install --quiet --no-input --disable-pip-version-check --no-deps \
    --target "$dir/pylib.tmp" $gguf_pin >"$dir/pip.log" 2>&1; then
  rm -rf "$dir/pylib" && mv "$dir/pylib.tmp" "$dir/pylib" && echo "$gguf_pin" >"$stamp"
else
  rm -rf "$dir/pylib.tmp"
  warn "pip could not install $gguf_pin (bench/llamacpp/pip.log)"
fi
