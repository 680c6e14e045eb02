#!/bin/sh
# test_bench_engine_against.sh BUILD_DIR — `bench-engine --against` (issue 18's FP8-against-BF16 figure measured
# in one process): the BF16 and FP8 tiny checkpoints of the same weights take turns over --rounds 3, and the JSON
# holds each side's figures per round, each side's median and the median of the paired rounds' ratios within their
# range. A missing or broken second checkpoint is named; a round count out of range is refused (exit 2).
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
assert [p["tokens"] for p in g["prefill"]] == [16, 40] and [p["batch"] for p in g["decode"]] == [1, 3], g
for f in g["prefill"] + g["decode"]:
    rounds = f["rounds"]
    assert len(rounds) == 3 and all(a > 0 and b > 0 for a, b in rounds), f
    ratios = [b / a for a, b in rounds]
    assert abs(f["ratio"] - statistics.median(ratios)) < 2e-3 * f["ratio"], f
    lo, hi = f["ratio_range"]
    assert lo <= f["ratio"] <= hi and abs(lo - min(ratios)) < 2e-3 * lo and abs(hi - max(ratios)) < 2e-3 * hi, f
    assert abs(f["model_tokens_per_s"] - statistics.median(a for a, _ in rounds)) < 0.01, f
    assert abs(f["against_tokens_per_s"] - statistics.median(b for _, b in rounds)) < 0.01, f
PY
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
