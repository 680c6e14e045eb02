#!/bin/sh
# test_bench_engine_against.sh BUILD_DIR — `bench-engine --against` (issue 18's FP8-against-BF16 figure measured
# in one process): the BF16 and FP8 tiny checkpoints of the same weights take turns over --rounds 3, and the JSON
# holds each side's figures per round, each side's median and the median of the paired rounds' ratios within their
# range. --against-prefetch runs one checkpoint against itself with the other weight-stream prefetch level (each
# side's `cpu_kernels` says which it ran), and --against-f8-widen the FP8 one with the other F8 widening,
# --against-k-blocked the BF16 one with the other choice of K blocking for 5-32 tokens. A missing second
# checkpoint is named; a round count, prefetch level, widening or blocking out of range is refused (exit 2).
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
quick="--threads 1 --min-seconds 0.02 --prefill-tokens 16,40 --batches 1,3 --contexts none"
# shellcheck disable=SC2086 # $quick is a list of flags
"$E" --model "$W/bf16" --against "$W/f8" --rounds 3 $quick >"$W/out" || fail "bench-engine --against: $(cat "$W/out")"
python3 - "$W/out" "$W/f8" <<'PY' || fail "against figures: $(cat "$W/out")"
import json, statistics, sys
d = json.load(open(sys.argv[1]))
g = d["against"]
assert "modes" not in d and g["model"] == sys.argv[2] and g["rounds"] == 3 and g["batch_invariant"] == 1, g
assert g["stream_prefetch"][0] == g["stream_prefetch"][1] and g["stream_prefetch"][0] in ("l1", "l2"), g
assert g["f8_widen"][0] == g["f8_widen"][1] and g["f8_widen"][0] in ("f16", "f32"), g
assert g["k_blocked"][0] == g["k_blocked"][1] and g["k_blocked"][0] in ("on", "off"), g
assert [p["tokens"] for p in g["prefill"]] == [16, 40] and [p["batch"] for p in g["decode"]] == [1, 3], g
for f in g["prefill"] + g["decode"]:
    rounds = f["rounds"]
    assert len(rounds) == 3 and all(a > 0 and b > 0 for a, b in rounds), f
    ratios = [b / a for a, b in rounds]
    near = lambda printed, exact: abs(printed - exact) <= 6e-4 + 1e-3 * exact  # printed with 3 decimals
    assert near(f["ratio"], statistics.median(ratios)), f
    lo, hi = f["ratio_range"]
    assert lo <= f["ratio"] <= hi and near(lo, min(ratios)) and near(hi, max(ratios)), f
    assert abs(f["model_tokens_per_s"] - statistics.median(a for a, _ in rounds)) < 0.01, f
    assert abs(f["against_tokens_per_s"] - statistics.median(b for _, b in rounds)) < 0.01, f
PY
# --against-prefetch alone: the same checkpoint on both sides, the second with its weight streams prefetched into
# L1, the first with this CPU's choice; the choice is restored afterwards
# shellcheck disable=SC2086
"$E" --model "$W/bf16" --against-prefetch l1 --rounds 2 $quick >"$W/out" || fail "--against-prefetch: $(cat "$W/out")"
python3 - "$W/out" "$W/bf16" <<'PY' || fail "against-prefetch figures: $(cat "$W/out")"
import json, sys
d = json.load(open(sys.argv[1]))
g = d["against"]
auto = "l2" if "prefetched into L2" in d["cpu_kernels"] else "l1"
assert g["model"] == sys.argv[2] and g["stream_prefetch"] == [auto, "l1"] and g["rounds"] == 2, g
# each side's kernels as it ran them: the first this CPU's, the second without the L2 prefetch
assert g["cpu_kernels"][0] == d["cpu_kernels"] and "prefetched into L2" not in g["cpu_kernels"][1], g
assert all(len(f["rounds"]) == 2 and f["ratio"] > 0 for f in g["prefill"] + g["decode"]), g
PY
# --against-f8-widen alone: the FP8 checkpoint against itself, the second side widening through float16
# shellcheck disable=SC2086
"$E" --model "$W/f8" --against-f8-widen f16 --rounds 2 $quick >"$W/out" || fail "--against-f8-widen: $(cat "$W/out")"
python3 - "$W/out" "$W/f8" <<'PY' || fail "against-f8-widen figures: $(cat "$W/out")"
import json, sys
d = json.load(open(sys.argv[1]))
g = d["against"]
auto = "f32" if "F8 widened straight to float32" in d["cpu_kernels"] else "f16"
assert g["model"] == sys.argv[2] and g["f8_widen"] == [auto, "f16"] and g["rounds"] == 2, g
assert g["stream_prefetch"][0] == g["stream_prefetch"][1], g
assert all(len(f["rounds"]) == 2 and f["ratio"] > 0 for f in g["prefill"] + g["decode"]), g
PY
# --against-k-blocked alone: the BF16 checkpoint against itself, the second side's 5-32-token blocks K-blocked
# shellcheck disable=SC2086
"$E" --model "$W/bf16" --against-k-blocked on --rounds 2 --threads 1 --min-seconds 0.02 --prefill-tokens 16 --batches 3 \
    --contexts none >"$W/out" || fail "--against-k-blocked: $(cat "$W/out")"
python3 - "$W/out" "$W/bf16" <<'PY' || fail "against-k-blocked figures: $(cat "$W/out")"
import json, sys
d = json.load(open(sys.argv[1]))
g = d["against"]
auto = "off" if "blocks of 5-32 tokens unblocked in K" in d["cpu_kernels"] else "on"
assert g["model"] == sys.argv[2] and g["k_blocked"] == [auto, "on"] and g["rounds"] == 2, g
assert g["cpu_kernels"][0] == d["cpu_kernels"] and "unblocked in K" not in g["cpu_kernels"][1], g
assert g["stream_prefetch"][0] == g["stream_prefetch"][1] and g["f8_widen"][0] == g["f8_widen"][1], g
assert all(len(f["rounds"]) == 2 and f["ratio"] > 0 for f in g["prefill"] + g["decode"]), g
PY
# shellcheck disable=SC2086
"$E" --model "$W/bf16" --against-k-blocked yes $quick >/dev/null 2>&1
[ $? -eq 2 ] || fail "--against-k-blocked yes was not refused with exit 2"
# shellcheck disable=SC2086
"$E" --model "$W/bf16" --against-prefetch l3 $quick >/dev/null 2>&1
[ $? -eq 2 ] || fail "--against-prefetch l3 was not refused with exit 2"
# shellcheck disable=SC2086
"$E" --model "$W/f8" --against-f8-widen f8 $quick >/dev/null 2>&1
[ $? -eq 2 ] || fail "--against-f8-widen f8 was not refused with exit 2"
# shellcheck disable=SC2086
"$E" --model "$W/bf16" --against "$W/none" $quick >"$W/out" 2>"$W/err"
[ $? -eq 1 ] || fail "a missing --against directory was not an error"
grep -q "$W/none" "$W/err" || fail "the missing directory is not named: $(cat "$W/err")"
python3 -c "import json,sys; assert 'against_error' in json.load(open(sys.argv[1]))" "$W/out" ||
    fail "no against_error in $(cat "$W/out")"
for r in 0 65 x; do
    # shellcheck disable=SC2086
    "$E" --model "$W/bf16" --against "$W/f8" --rounds $r $quick >/dev/null 2>&1
    [ $? -eq 2 ] || fail "--rounds $r was not refused with exit 2"
done
echo "ok"
