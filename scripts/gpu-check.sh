#!/usr/bin/env bash
# The CUDA checks on a bare GPU machine, in one go, ending with one line of
# JSON (also written to $OUT/gpu-check.json when OUT is set). See docs/CUDA.md.
#
#   scripts/gpu-check.sh --prepare   on a machine with apt and a network (this repo's Debian build machines):
#                                    downloads the few build libraries a GPU image may lack into .gpu/debs
#                                    (ignored by git; 14 MiB, small enough to travel with the tree)
#   scripts/gpu-check.sh             on the GPU machine: CUDA wheel hook, configure (MOEQ_CUDA_CHECK_ONLY: common,
#                                    engine with the CUDA backend, engine/cuda, genmodel, bench-engine, an
#                                    engine-only moeq and the cuda tests), build, every test of that build (the
#                                    gpu-labelled test_kernels_gpu, test_backend_cuda_gpu and the float64
#                                    reference comparisons on --backend cuda, with the image's python3 and
#                                    numpy, among them), then
#                                    bench-engine --backend cuda on a generated preset (it runs bench-cuda-peak
#                                    beside: D2D bandwidth for the HBM roofline, cuBLAS BF16 GEMMs), where time
#                                    allows a per-kernel profile (ncu) and compute-sanitizer's memcheck, JSON summary
#                                    (run on an H100 on 2026-12-05: build 51-60 s, tests 42 s, bench 40 s)
#
# The GPU machine may be offline and lack pkg-config, cJSON, PCRE2, OpenBLAS and cmocka (the engine and the
# tests need them): where pkg-config cannot find one, the .debs in .gpu/debs are unpacked into a private
# sysroot (never into /) and pkg-config and the loader are pointed at it. cuBLAS/NCCL come from
# scripts/setup.d/40-cuda-wheels.sh when PyPI answers, else from the wheels already installed in the
# machine's python3 (the CUDA images carry nvidia-cublas and nvidia-nccl-cu13).
#
# Exit status: 0 when every test passed, every gpu test ran (not skipped) and the bench gave numbers, 1 otherwise.
# Environment: MOEQ_GPU_DEADLINE_S (seconds the whole script may take, default 450: every stage's timeout is
# cut to what is left, so the summary is printed inside the device call's timeout_s of 480),
# MOEQ_GPU_BUILD (build dir, default build-gpu), MOEQ_GPU_SYSROOT (default /tmp/moeq-sysroot),
# MOEQ_GPU_BENCH_PRESET (the gen-model preset bench-engine runs, written into the build dir: default bench, the
# issue's 1.0 B-parameter preset, 2.6 GB, a few seconds to write), MOEQ_GPU_BENCH=0 (skip the bench),
# MOEQ_GPU_MEMCHECK=0 (skip compute-sanitizer's memcheck of test_kernels_gpu, which runs only with >= 60 s left),
# MOEQ_GPU_PROFILE=auto|1|0 (Nsight Compute over a short bench-engine run, $OUT/gpu-profile.csv: auto runs it with
# >= 150 s left), MOEQ_GPU_TESTS=0 (skip the tests),
# CMAKE_CUDA_ARCHITECTURES (default 90: H100/H200), MOEQ_GPU_FORCE_SYSROOT=1 (use .gpu/debs even where the
# libraries are installed: how the sysroot path is tried on a build machine).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
debs="$root/.gpu/debs"
build=${MOEQ_GPU_BUILD:-"$root/build-gpu"}
sysroot=${MOEQ_GPU_SYSROOT:-/tmp/moeq-sysroot}
archs=${CMAKE_CUDA_ARCHITECTURES:-90}
# the libraries the CHECK_ONLY build needs, and pkg-config itself (pkgconf)
deb_pkgs=(libcjson-dev libcjson1 libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3
          libopenblas-dev libopenblas-pthread-dev libopenblas0-pthread libopenblas0 libgfortran5
          libcmocka-dev libcmocka0 pkgconf pkgconf-bin libpkgconf3)
pc_modules=(libcjson libpcre2-8 openblas cmocka)

if [ "${1:-}" = --prepare ]; then
  set -e
  mkdir -p "$debs"
  (cd "$debs" && apt-get download "${deb_pkgs[@]}")
  du -sh "$debs"
  echo "gpu-check: carry .gpu in the device call (see docs/CUDA.md)"
  exit 0
fi

t_start=$(date +%s)
# every stage's timeout is cut to what is left of MOEQ_GPU_DEADLINE_S (default 450: the run's timeout_s of 480
# less room for the summary), so that the JSON line is printed even when a stage is slow, before the device
# tool kills the whole command and nothing but the log comes back
deadline=$(( t_start + ${MOEQ_GPU_DEADLINE_S:-450} ))
budget() { local l=$(( deadline - $(date +%s) - 10 )); [ "$l" -lt "$1" ] && echo $(( l > 1 ? l : 1 )) || echo "$1"; }
logdir=${OUT:-"$build"}
mkdir -p "$logdir" "$build"
log="$logdir/gpu-check.log"
: >"$log"
error=""
wheels="none"
note() { echo "gpu-check: $*" | tee -a "$log" >&2; }

# ---- the machine ------------------------------------------------------------------------------------------
gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1)
nvcc_bin=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
nvcc_ver=$("$nvcc_bin" --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p')
[ -n "$nvcc_ver" ] || error="no nvcc (looked on PATH and at /usr/local/cuda/bin/nvcc)"
note "gpu: ${gpu:-none seen by nvidia-smi}; nvcc ${nvcc_ver:-none}"

# ---- the build libraries: the machine's, else the carried .debs in a private sysroot ----------------------
missing=()
if [ -n "${MOEQ_GPU_FORCE_SYSROOT:-}" ]; then
  missing=(forced) # to try the .debs on a machine that has the libraries
elif command -v pkg-config >/dev/null; then
  for m in "${pc_modules[@]}"; do pkg-config --exists "$m" || missing+=("$m"); done
else
  missing=(pkg-config "${pc_modules[@]}")
fi
if [ -z "$error" ] && [ ${#missing[@]} -gt 0 ]; then
  if ls "$debs"/*.deb >/dev/null 2>&1; then
    note "not on this machine: ${missing[*]}; unpacking .gpu/debs into $sysroot"
    mkdir -p "$sysroot"
    for f in "$debs"/*.deb; do dpkg -x "$f" "$sysroot" || error="could not unpack $f"; done
    multi="$sysroot/usr/lib/x86_64-linux-gnu"
    # dpkg -x runs no maintainer scripts: make the links update-alternatives would have made
    for f in libopenblas.so libopenblas.so.0; do ln -sf openblas-pthread/$f "$multi/$f"; done
    ln -sf ../openblas-pthread/pkgconfig/openblas.pc "$multi/pkgconfig/openblas.pc" 2>/dev/null ||
      { mkdir -p "$multi/pkgconfig" && ln -sf ../openblas-pthread/pkgconfig/openblas.pc "$multi/pkgconfig/openblas.pc"; }
    export PATH="$sysroot/usr/bin:$PATH"
    export PKG_CONFIG_SYSROOT_DIR="$sysroot"
    export PKG_CONFIG_LIBDIR="$multi/pkgconfig:$multi/openblas-pthread/pkgconfig:$sysroot/usr/share/pkgconfig"
    export LD_LIBRARY_PATH="$multi:$multi/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export CPATH="$sysroot/usr/include:$sysroot/usr/include/x86_64-linux-gnu${CPATH:+:$CPATH}"
    command -v pkg-config >/dev/null || ln -sf pkgconf "$sysroot/usr/bin/pkg-config"
    for m in "${pc_modules[@]}"; do pkg-config --exists "$m" || error="${error:+$error; }$m not found even in .gpu/debs"; done
  else
    error="missing ${missing[*]} and no .gpu/debs (run scripts/gpu-check.sh --prepare where apt works, carry .gpu)"
  fi
fi

# ---- cuBLAS / NCCL ----------------------------------------------------------------------------------------
wheels_dir=""
if [ -z "$error" ]; then
  # the hook: at once where it ran before (its stamp), else only where PyPI answers (offline, pip would spend
  # minutes in retries)
  if [ -f "$root/.deps/cuda/.wheels" ] || timeout 5 bash -c '</dev/tcp/pypi.org/443' 2>/dev/null; then
    mkdir -p "$root/.deps" 2>/dev/null
    bash "$root/scripts/setup.d/40-cuda-wheels.sh" >>"$log" 2>&1 && [ -f "$root/.deps/cuda/.wheels" ] &&
      wheels="setup.d/40-cuda-wheels.sh" && wheels_dir="$root/.deps/cuda"
  fi
  if [ -z "$wheels_dir" ]; then
    site=$(python3 -c 'import nvidia, os; print(os.path.dirname(list(nvidia.__path__)[0]))' 2>/dev/null)
    if [ -n "$site" ] && [ -f "$site/nvidia/cu13/include/cublas_v2.h" ] && [ -f "$site/nvidia/nccl/include/nccl.h" ]; then
      wheels="python3 site-packages ($site)" && wheels_dir="$site"
    else
      note "no cuBLAS/NCCL wheels (PyPI unreachable, none in python3): test_cuda_libs is not built"
    fi
  fi
  note "cuBLAS/NCCL: $wheels"
fi

# ---- configure, build ---------------------------------------------------------------------------------------
t_build=$(date +%s)
if [ -z "$error" ]; then
  gen=()
  command -v ninja >/dev/null && gen=(-G Ninja)
  [ -f "$build/CMakeCache.txt" ] && ! grep -q "MOEQ_CUDA_CHECK_ONLY:BOOL=ON" "$build/CMakeCache.txt" && rm -rf "$build"
  timeout "$(budget 240)" cmake -S "$root" -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOEQ_CUDA=ON \
    -DMOEQ_CUDA_CHECK_ONLY=ON -DCMAKE_CUDA_ARCHITECTURES="$archs" ${wheels_dir:+-DMOEQ_CUDA_WHEELS_DIR="$wheels_dir"} \
    >>"$log" 2>&1 || error="cmake configure failed (see gpu-check.log)"
fi
# the backend needs cuBLAS as well as nvcc: without it the engine builds CPU-only and the gpu test is absent
if [ -z "$error" ] && ! grep -q 'CUDA backend ("cuda") built' "$log"; then
  error="the CUDA backend was not configured (nvcc or cuBLAS missing: cuda_libs = $wheels; see gpu-check.log)"
fi
if [ -z "$error" ]; then
  timeout "$(budget 240)" cmake --build "$build" -j "$(nproc)" >>"$log" 2>&1 ||
    error="build failed or timed out (see gpu-check.log)"
fi
build_s=$(( $(date +%s) - t_build ))

# ---- tests ----------------------------------------------------------------------------------------------------
junit="$build/gpu-check-junit.xml"
rm -f "$junit"
if [ -z "$error" ] && [ "${MOEQ_GPU_TESTS:-1}" != 0 ]; then
  # --stop-time ends a hung test (its own TIMEOUT may be longer) and still writes the junit file naming it
  # as failed; an outer timeout that killed ctest would leave no junit and so no per-test results at all
  t_tests=$(budget 240)
  stop=$(date -d "+$(( t_tests > 15 ? t_tests - 10 : t_tests )) seconds" +%H:%M:%S)
  (cd "$build" && timeout "$t_tests" ctest --timeout 120 --stop-time "$stop" --output-on-failure \
    --output-junit "$junit") >>"$log" 2>&1
fi

# ---- after a failure of test_backend_cuda_gpu: each of its tests alone, launches synchronous ---------------------
# A device fault is sticky for the whole process, so one failing test can fail every test after it; run alone, each
# says for itself, and CUDA_LAUNCH_BLOCKING=1 makes the error name the launch that faulted. At most 90 s in all.
alone="$logdir/gpu-check-alone.log"
if [ -z "$error" ] && [ -f "$junit" ] && grep -q 'name="test_backend_cuda_gpu"[^>]*status="fail' "$junit"; then
  note "test_backend_cuda_gpu failed: each of its tests alone (see gpu-check-alone.log)"
  alone_end=$(( $(date +%s) + $(budget 90) ))
  for t in $(sed -n 's/.*cmocka_unit_test(\([a-z0-9_]*\)).*/\1/p' "$root/tests/test_backend_cuda_gpu.c"); do
    left=$(( alone_end - $(date +%s) ))
    [ "$left" -lt 5 ] && { echo "== $t: not run, out of time" >>"$alone"; continue; }
    echo "== $t" >>"$alone"
    (cd "$build" && MOEQ_TEST_FILTER="$t" CUDA_LAUNCH_BLOCKING=1 timeout "$(( left > 30 ? 30 : left ))" \
      tests/test_backend_cuda_gpu) >>"$alone" 2>&1
    echo "== $t: exit $?" >>"$alone"
  done
  grep '^== .*: exit' "$alone" | tee -a "$log" >&2
fi

# ---- bench-engine --backend cuda --------------------------------------------------------------------------------
bench_json="$build/gpu-check-bench.json"
rm -f "$bench_json" "$build/gpu-profile.json"
preset=${MOEQ_GPU_BENCH_PRESET:-bench}
if [ -z "$error" ] && [ "${MOEQ_GPU_BENCH:-1}" != 0 ] && [ -x "$build/bench/bench-engine" ]; then
  note "bench-engine --backend cuda on preset $preset"
  timeout "$(budget 150)" "$build/bench/bench-engine" --model "$build/bench-$preset" --preset "$preset" --backend cuda \
    --threads "$(nproc)" --min-seconds 1 --batches 1,8,32,128,256 --contexts 1024 --cuda-graphs both --cuda-matrix both \
    >"$bench_json" \
    2>"$build/gpu-check-bench.err" || note "bench-engine failed or timed out (see gpu-check.log)"
  cat "$build/gpu-check-bench.err" >>"$log" 2>/dev/null
fi

# ---- where a step's time goes: Nsight Compute over a short bench-engine run ----------------------------------------
# Every kernel of a prefill of 512 tokens and of two decode steps at batch 1 and 32, its time and DRAM bytes read, in
# $OUT/gpu-profile.csv; scripts/gpu-profile-summary.py splits it into steps (here and later). The engine runs
# cuda_matrix = auto (the few-token kernels; MOEQ_GPU_PROFILE_MATRIX=lanes for the others). MOEQ_GPU_PROFILE=auto
# (the default) runs it when 150 s or more are left (it took ~120 s on an H100, 2026-12-05), 1 always, 0 never.
ncu_bin=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
profile=${MOEQ_GPU_PROFILE:-auto}
if [ "$profile" = auto ]; then
  left=$(( deadline - $(date +%s) - 10 ))
  if [ "$left" -ge 150 ]; then profile=1; else profile=0; note "profile: skipped, ${left} s left"; fi
fi
if [ -z "$error" ] && [ "$profile" != 0 ] && [ -x "$build/bench/bench-engine" ]; then
  if [ -z "$ncu_bin" ]; then note "profile: no ncu"
  else
    note "profile: $ncu_bin over bench-engine (prefill 512, decode batch 1 and 32)"
    prof="$logdir/gpu-profile.csv"
    timeout "$(budget 150)" "$ncu_bin" --clock-control none --csv --page raw --print-units base \
      --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size,launch__block_size --log-file "$prof" \
      "$build/bench/bench-engine" --model "$build/bench-$preset" --preset "$preset" --backend cuda --threads "$(nproc)" \
      --prefill-tokens 512 --batches 1,32 --contexts none --min-seconds 0 --modes "${MOEQ_GPU_PROFILE_MODES:-1}" \
      --cuda-matrix "${MOEQ_GPU_PROFILE_MATRIX:-auto}" \
      >/dev/null 2>>"$log" || note "profile: ncu failed or timed out (see gpu-check.log)"
    python3 "$root/scripts/gpu-profile-summary.py" "$prof" --json "$build/gpu-profile.json" 2>&1 | tee -a "$log" >&2
  fi
fi

# ---- compute-sanitizer memcheck on the kernels' gpu test, with the time that is left -----------------------------
# Out-of-bounds and misaligned device accesses that give plausible numbers show only here. test_kernels_gpu is the
# small one (memcheck runs 10-100x slower); skipped, and said so, when less than 60 s are left or the tool is absent.
memcheck="skipped: not run"
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -n 1)
if [ -z "$error" ] && [ "${MOEQ_GPU_MEMCHECK:-1}" != 0 ] && [ -x "$build/tests/test_kernels_gpu" ]; then
  left=$(( deadline - $(date +%s) - 10 ))
  if [ -z "$gpu" ]; then memcheck="skipped: no GPU seen by nvidia-smi"
  elif [ -z "$sanitizer" ]; then memcheck="skipped: no compute-sanitizer"
  elif [ "$left" -lt 60 ]; then memcheck="skipped: ${left} s left"
  else
    note "compute-sanitizer --tool memcheck test_kernels_gpu (${left} s left)"
    if timeout "$(( left > 120 ? 120 : left ))" "$sanitizer" --tool memcheck --error-exitcode 3 \
        "$build/tests/test_kernels_gpu" >>"$log" 2>&1; then memcheck="passed"
    else
      rc=$?
      if [ "$rc" = 77 ]; then memcheck="skipped: the test found no device under the sanitizer"
      else memcheck="failed (exit $rc; 3 = memory errors, 124 = out of time; see gpu-check.log)"; fi
    fi
  fi
fi

# ---- one JSON line ----------------------------------------------------------------------------------------------
summary=$(python3 - "$junit" "$error" "$gpu" "$nvcc_ver" "$wheels" "$build_s" "$(( $(date +%s) - t_start ))" \
  "$bench_json" "${MOEQ_GPU_BENCH:-1}" "$build/gpu-check-bench.err" "$memcheck" "$build/gpu-profile.json" <<'EOF'
import json, sys, xml.etree.ElementTree as ET
junit, error, gpu, nvcc, wheels, build_s, total_s, bench_path, bench_on, bench_err, memcheck, prof_path = sys.argv[1:]
try:  # the profile's steps, each with its five costliest kernels
    with open(prof_path) as f:
        profile = [{"tokens": p["tokens"], "kernel_ms": round(p["kernel_ms"], 3),
                    "top": [[k["name"], round(k["us"], 1)] for k in p["kernels"][:5]]} for p in json.load(f)]
except (OSError, ValueError, KeyError, TypeError):
    profile = None
try:
    with open(bench_err) as f:
        bench_why = ([l.strip() for l in f if l.strip()] or [""])[-1][:300]
except OSError:
    bench_why = ""
tests = []
try:
    for tc in ET.parse(junit).getroot().iter("testcase"):
        st = {"run": "passed", "fail": "failed", "notrun": "skipped", "disabled": "skipped"}.get(tc.get("status"))
        if tc.find("failure") is not None: st = "failed"
        elif st is None: st = "skipped" if tc.find("skipped") is not None else "passed"
        tests.append({"name": tc.get("name"), "status": st, "time_s": round(float(tc.get("time") or 0), 3)})
except (OSError, ET.ParseError):
    pass
count = lambda s: sum(t["status"] == s for t in tests)
gpu_tests = ("test_kernels_gpu", "test_backend_cuda_gpu", "engine_logits_on_cuda_match_the_float64_reference",
             "engine_logits_on_cuda_with_cublas_match_the_float64_reference",
             "engine_mtp_logits_on_cuda_match_the_float64_reference")
not_run = [n for n in gpu_tests if not any(t["name"] == n and t["status"] == "passed" for t in tests)]
if not error and not tests: error = "no test results (see gpu-check.log)"
if not error and not_run: error = ", ".join(not_run) + " did not pass (skipped means no device was found)"
bench = None
try:
    with open(bench_path) as f:
        b = json.load(f)
    bench = {"model": b.get("model"), "total_params": b.get("total_params"),
             "active_weight_bytes_per_token": b.get("active_weight_bytes_per_token"),
             "device_peak": b.get("device_peak"), "modes": {}}
    pick = lambda d, keys: {k: d[k] for k in keys if k in d}
    for mode, m in (b.get("modes") or {}).items():
        bench["modes"][mode] = {"backend_info": m.get("backend_info"), "prefill_tokens_per_s": m.get("prefill_tokens_per_s"),
                                "prefill": [pick(p, ("tokens", "tokens_per_s", "matmul_gflops", "cublas_bf16_gemm_tflops",
                                                     "fraction_of_cublas_bf16")) for p in m.get("prefill", [])],
                                "decode": [pick(d, ("batch", "tokens_per_s", "fraction_of_roofline")) for d in m.get("decode", [])],
                                "decode_with_cuda_graphs": [pick(d, ("batch", "tokens_per_s"))
                                                            for d in m.get("decode_with_cuda_graphs", [])],
                                "with_cuda_matrix_lanes": {
                                    "prefill": (m.get("with_cuda_matrix_lanes") or {}).get("prefill"),
                                    "decode": [pick(d, ("batch", "tokens_per_s", "fraction_of_roofline"))
                                               for d in (m.get("with_cuda_matrix_lanes") or {}).get("decode", [])]},
                                "cuda_graphs_backend_info": m.get("cuda_graphs_backend_info"),
                                "decode_at_context": m.get("decode_at_context")}
    if not bench["modes"]: bench["error"] = "no mode ran: " + (bench_why or "see gpu-check.log")
except (OSError, ValueError, KeyError, TypeError) as e:
    bench = {"error": "no bench output (%s) %s" % (type(e).__name__, bench_why)} if bench_on != "0" else None
bench_ok = bench_on == "0" or (bench is not None and not bench.get("error"))
if not error and not bench_ok: error = "bench-engine --backend cuda: " + bench.get("error", "failed")
if not error and memcheck.startswith("failed"): error = "compute-sanitizer memcheck " + memcheck
ok = not error and count("failed") == 0 and not not_run and bench_ok
print(json.dumps({"ok": ok, "gpu": gpu or None, "nvcc": nvcc or None, "cuda_libs": wheels,
                  "build_s": int(build_s), "total_s": int(total_s), "passed": count("passed"),
                  "failed": count("failed"), "skipped": count("skipped"), "tests": tests, "bench": bench,
                  "memcheck": memcheck, "profile": profile,
                  "error": error or None}))
EOF
)
echo "$summary"
if [ -n "${OUT:-}" ]; then
  echo "$summary" >"$OUT/gpu-check.json"
  cp "$bench_json" "$OUT/gpu-check-bench.json" 2>/dev/null
  cp "$junit" "$OUT/gpu-check-junit.xml" 2>/dev/null
fi
case "$summary" in *'"ok": true'*) exit 0 ;; *) exit 1 ;; esac
