#!/bin/sh
# test_model_info_cli.sh BUILD_DIR — `moeq model-info` on a tiny checkpoint: it names the CPU kernels, and
# --device-memory-gib sizes the latent cache from what the weights, the step arena and the reserve leave
# (issue 14: "model-info says how many sequences x tokens fit on a given device"): more memory holds
# more tokens, exactly by the bytes per token; a device too small for the weights is refused, exit 1,
# with the three figures named. Its number flags refuse what is not a number in range, naming the flag.
set -u
B=$1
M=$B/cli/moeq
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
fail() {
    echo "FAIL: $*" >&2
    exit 1
}
"$M" gen-model --preset tiny --out "$W/m" --shards 1 >/dev/null || fail "gen-model"
"$M" model-info --model "$W/m" >"$W/info" || fail "model-info"
grep -q '"cpu_kernels": "' "$W/info" || fail "no cpu_kernels in $(cat "$W/info")"
"$M" model-info --model "$W/m" --device-memory-gib 3 --reserve-gib 1 >"$W/a" || fail "3 GiB: $(cat "$W/a")"
"$M" model-info --model "$W/m" --device-memory-gib 4 --reserve-gib 1 >"$W/b" || fail "4 GiB"
python3 - "$W/a" "$W/b" <<'PY' || fail "device_fit figures"
import json, sys
a, b = (json.loads(open(p).read().splitlines()[-1])["device_fit"] for p in sys.argv[1:3])
per = a["kv_bytes_per_token"] + a["mtp_kv_bytes_per_token"]
assert a["fits"] and b["fits"], (a, b)
left = a["memory_bytes"] - a["weights_bytes"] - a["step_arena_bytes"] - a["reserve_bytes"]
assert 0 <= left - a["kv_cache_tokens"] * per < 16 * per, a          # whole blocks of 16 tokens
extra = (b["kv_cache_tokens"] - a["kv_cache_tokens"]) * per        # one more GiB holds 1 GiB of cache
assert abs(extra - (1 << 30)) < 32 * per, (a, b)
assert a["sequences"]["4096"] == a["kv_cache_tokens"] // 4096, a
print("ok:", a["kv_cache_tokens"], "tokens in 3 GiB,", b["kv_cache_tokens"], "in 4 GiB")
PY
if "$M" model-info --model "$W/m" --device-memory-gib 0.5 >"$W/c" 2>"$W/err"; then fail "0.5 GiB (reserve 2) fits"; fi
grep -q '"fits": false' "$W/c" || fail "no fits:false in $(cat "$W/c")"
grep -q "does not hold the weights" "$W/err" || fail "no reason: $(cat "$W/err")"
# Numbers are read whole: atoi read "8x" as 8 and "abc" as 0 (which fell through to the usage, no flag named).
refused() { # FLAG VALUE TEXT: exit 2, and stderr names the flag and says TEXT
    "$M" model-info --model "$W/m" --device-memory-gib 3 "$1" "$2" >/dev/null 2>"$W/err"
    rc=$?
    [ $rc -eq 2 ] || fail "$1 $2: exit status $rc, not 2"
    grep -q -- "$1" "$W/err" && grep -q -- "$3" "$W/err" || fail "$1 $2: $(cat "$W/err")"
}
refused --max-seqs 8x "is not an integer"
refused --max-step-tokens abc "is not an integer"
refused --max-step-tokens 0 "give 1 or more"
refused --reserve-gib -1 "give a finite number >= 0"
refused --device-memory-gib nan "is not a number"
refused --device-memory-gib inf "give a finite number > 0"
"$M" model-info --model "$W/m" --device-memory-gib 3 --max-seqs 8 --max-step-tokens 256 >"$W/d" || fail "valid flags"
grep -q '"max_step_tokens": 256' "$W/d" || fail "--max-step-tokens 256 not used: $(cat "$W/d")"
echo "model-info checks passed"
