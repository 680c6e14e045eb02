#!/usr/bin/env bash
# cuBLAS/cuBLASLt and NCCL for the CUDA backend, from NVIDIA's pinned Python
# wheels (the CUDA 13.0 line that matches nvcc 13.0 and the GPU machines'
# driver), installed with `pip install --target` into .deps/cuda so that the
# same command works on any machine and needs no system CUDA packages. The
# wheels carry headers and versioned .so files (nvidia/cu13/{include,lib},
# nvidia/nccl/{include,lib}); CMakeLists.txt finds them there.
#
# Only when nvcc exists (/usr/local/cuda/bin/nvcc or on PATH) and MOEQ_CUDA is
# not OFF. A failure is a warning, not an error: the build then says that the
# CUDA backend is off and builds the CPU path. Idempotent: a stamp holds the
# pinned versions. Override the pins with MOEQ_CUDA_WHEELS.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
dest="$root/.deps/cuda"
wheels=${MOEQ_CUDA_WHEELS:-"nvidia-cublas==13.1.1.3 nvidia-nccl-cu13==2.30.7"}
stamp="$dest/.wheels"

[ "${MOEQ_CUDA:-AUTO}" = OFF ] && exit 0
if ! command -v nvcc >/dev/null && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  exit 0 # no CUDA toolkit: the CPU path only (the build says so)
fi
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$wheels" ] && [ -f "$dest/nvidia/cu13/include/cublas_v2.h" ] &&
   [ -f "$dest/nvidia/nccl/include/nccl.h" ]; then
  exit 0
fi
if ! python3 -m pip --version >/dev/null 2>&1; then
  echo "setup: warning: python3 -m pip is not available; cuBLAS/NCCL wheels not installed, CUDA backend off" >&2
  exit 0
fi
echo "setup: installing $wheels into .deps/cuda (pip --target)"
rm -rf "$dest.tmp"
ok=0
for attempt in 1 2 3; do
  # shellcheck disable=SC2086 # the pins are separate words
  if python3 -m pip install --quiet --no-input --disable-pip-version-check --target "$dest.tmp" $wheels \
      >"$root/.deps/cuda-pip.log" 2>&1; then
    ok=1
    break
  fi
  echo "setup: pip attempt $attempt failed (.deps/cuda-pip.log):" >&2
  tail -n 3 "$root/.deps/cuda-pip.log" >&2
  echo "setup: retrying in $((attempt * 5)) s" >&2
  sleep $((attempt * 5))
done
if [ $ok != 1 ]; then
  rm -rf "$dest.tmp"
  echo "setup: warning: could not install $wheels; the build will have no CUDA backend" >&2
  exit 0
fi
rm -rf "$dest"
mv "$dest.tmp" "$dest"
echo "$wheels" >"$stamp"
