#!/bin/sh
# test_bench_engine_tune.sh BUILD_DIR — `bench-engine --tune` (issue 18): each CPU kernel choice that can matter
# for the model is timed against its other value on whole steps, and `tune.config` lists exactly the engine keys
# whose other value won by the printed rule (geometric mean of the figures' ratios >= gain_needed, none below
# worst_allowed). On tiny BF16: cpu_prefetch measured where the lanes are AVX-512, cpu_f8_widen skipped (no F8
# weights), cpu_k_blocked skipped (no rows over 1,024 columns); on tiny FP8 `--tune f8-widen` measures that one
# alone. The keys it prints are the worker's too (`moeq worker --help`); an unknown choice is refused (exit 2),
# and --tune on another backend is an error naming why.
set -u
B=$1
M=$B/cli/moeq
E=$B/bench/bench-engine
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
fail() {
    echo "FAIL: $*" >&2
    exit 1
}
"$M" gen-model --preset tiny --out "$W/bf16" --shards 1 >/dev/null || fail "gen-model bf16"
"$M" gen-model --preset tiny --dtype f8 --out "$W/f8" --shards 1 >/dev/null || fail "gen-model f8"
quick="--threads 1 --min-seconds 0.02 --prefill-tokens 16 --batches 1,3 --contexts none --rounds 3"
check='
import json, math, statistics, sys
d = json.load(open(sys.argv[1]))
want = sys.argv[2].split(",")  # the keys expected, in order, each "key:measured" or "key:skipped"
t = d["tune"]
assert "modes" not in d and "against" not in d and t["rounds"] == 3 and t["batch_invariant"] == 1, t
assert [c["key"] + ":" + ("skipped" if "skipped" in c else "measured") for c in t["choices"]] == want, t
values = {"cpu_prefetch": ("l1", "l2"), "cpu_f8_widen": ("f16", "f32"), "cpu_k_blocked": ("off", "on")}
config = []
for c in t["choices"]:
    assert c["auto"] in values[c["key"]], c
    if "skipped" in c:
        assert c["skipped"] and "figures" not in c, c
        continue
    assert c["tried"] in values[c["key"]] and c["tried"] != c["auto"], c
    assert [f.get("prefill", f.get("batch")) for f in c["figures"]] == [16, 1, 3], c
    ratios = []
    for f in c["figures"]:
        assert len(f["rounds"]) == 3 and all(a > 0 and b > 0 for a, b in f["rounds"]), f
        r = statistics.median(b / a for a, b in f["rounds"])
        assert abs(f["ratio"] - r) <= 6e-4 + 1e-3 * r, f
        ratios.append(f["ratio"])
    gain = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    assert abs(c["geomean"] - gain) <= 2e-3 * gain and abs(c["worst"] - min(ratios)) <= 6e-4, c
    won = c["geomean"] >= t["gain_needed"] and c["worst"] >= t["worst_allowed"]
    if abs(c["geomean"] - t["gain_needed"]) < 2e-3 or abs(c["worst"] - t["worst_allowed"]) < 2e-3:
        won = c["choose"] != c["auto"]  # printed on the line: the program decided on the unrounded figures
    assert c["choose"] == (c["tried"] if won else c["auto"]), c
    if won:
        config.append(c["key"] + " = " + c["tried"])
assert t["config"] == config, t
open(sys.argv[3], "w").write("\n".join(config) + "\n" if config else "")
'
# shellcheck disable=SC2086 # $quick is a list of flags
"$E" --model "$W/bf16" --tune all $quick >"$W/out" || fail "bench-engine --tune all: $(cat "$W/out")"
if grep -q '"cpu_kernels": "avx512 ' "$W/out"; then
    want="cpu_prefetch:measured,cpu_f8_widen:skipped,cpu_k_blocked:skipped"
else
    want="cpu_prefetch:skipped,cpu_f8_widen:skipped,cpu_k_blocked:skipped"
fi
python3 -c "$check" "$W/out" "$want" "$W/config" || fail "--tune all on tiny bf16: $(cat "$W/out")"
# shellcheck disable=SC2086
"$E" --model "$W/f8" --tune f8-widen $quick >"$W/out" || fail "bench-engine --tune f8-widen: $(cat "$W/out")"
if grep -q '"cpu_kernels": "avx512 ' "$W/out"; then want="cpu_f8_widen:measured"; else want="cpu_f8_widen:skipped"; fi
python3 -c "$check" "$W/out" "$want" "$W/config8" || fail "--tune f8-widen on tiny f8: $(cat "$W/out")"
# every key it can print is one the worker takes (the engine's own check of each value: test_engine_model)
for key in cpu_prefetch cpu_f8_widen cpu_k_blocked; do
    "$M" worker --help 2>&1 | grep -q "^ *--$key=" || fail "moeq worker --help lists no --$key"
done
# a choice it does not know, an empty list: refused with the usage
for bad in fast "prefetch,fast" ""; do
    "$E" --model "$W/bf16" --tune "$bad" $quick >"$W/out" 2>"$W/err"
    rc=$?
    [ "$rc" -eq 2 ] && grep -q "usage: bench-engine" "$W/err" || fail "--tune '$bad': exit $rc, $(cat "$W/err")"
done
"$E" --model "$W/bf16" --backend cuda --tune all $quick >"$W/out" 2>"$W/err"
rc=$?
[ "$rc" -eq 1 ] && grep -q '"tune_error": "--tune measures the CPU kernels' "$W/out" ||
    fail "--tune with --backend cuda: exit $rc, $(cat "$W/out" "$W/err")"
echo "ok"
