#!/bin/sh
# test_numerics_cli.sh BUILD_DIR SOURCE_DIR — issue 11's engine-side promises through the CLI, on a tiny
# checkpoint and copies of it with one embedding row poisoned (tests/poke_weights.py):
#   - NaN crashes the engine: `moeq generate` / `moeq logits` on a NaN in the embedding exit 1 with a
#     message naming the cause (they died with SIGSEGV); a prompt that never reads the row is unaffected;
#   - overflow gives silent garbage: BF16 weights of 3.4e38 (finite) exit 1 the same way (were `ok`);
#   - `moeq model-info --check-weights` names the tensor;
#   - no context-length check: prompt + --max-new-tokens past max_position_embeddings (or --max-model-len)
#     is refused with both numbers (ran past the table);
#   - result text is cut at the first NUL byte: the printed text is every decoded byte, 0x00 as \u0000;
#   - a flag's number that is not one ("8x", "auto") was read as 0: now refused with usage.
set -u
B=$1
S=$2
M=$B/cli/moeq
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
fail() {
    echo "FAIL: $*" >&2
    exit 1
}

"$M" gen-model --preset tiny --out "$W/good" --shards 1 >/dev/null || fail "gen-model"
good57=$("$M" generate --model "$W/good" --tokens 5,7,9 --max-new-tokens 8 --threads 1) || fail "generate, good"
cp -r "$W/good" "$W/nan" && python3 "$S/tests/poke_weights.py" "$W/nan" model.embed_tokens.weight 7 nan || fail poke
cp -r "$W/good" "$W/huge" && python3 "$S/tests/poke_weights.py" "$W/huge" model.embed_tokens.weight 7 3.4e38 0 ||
    fail poke

# exits STATUS WHAT WANT CMD...: exit status STATUS (not a signal, not 0), WANT on stderr
exits() {
    status=$1 what=$2 want=$3
    shift 3
    "$@" >"$W/out" 2>"$W/err"
    rc=$?
    [ "$rc" -eq "$status" ] || fail "$what: exit status $rc, want $status ($(cat "$W/err"))"
    grep -q "$want" "$W/err" || fail "$what: stderr lacks '$want': $(cat "$W/err")"
}
refused() { exits 1 "$@"; } # the engine refused: exit 1

# a flag's number is a whole number: "8x" or "auto" is refused with usage (exit 2), never read as 0
usage() { exits 2 "$@"; }
usage "--max-new-tokens 8x" "max-new-tokens: '8x' is not an integer" \
    "$M" generate --model "$W/good" --tokens 5,7,9 --max-new-tokens 8x --threads 1
usage "--mtp auto" "mtp_k = auto" "$M" generate --model "$W/good" --tokens 5,7,9 --mtp auto --threads 1
usage "--temperature hot" "temperature: 'hot' is not a number" \
    "$M" generate --model "$W/good" --tokens 5,7,9 --temperature hot --threads 1
usage "--seed -3" "seed: '-3' is not an unsigned integer" "$M" generate --model "$W/good" --tokens 5,7,9 --seed -3

# NaN crashes the engine
refused "generate, NaN row" "numerical: non-finite logits" "$M" generate --model "$W/nan" --tokens 5,7,9 --threads 1
refused "generate --mtp 2, NaN row" "numerical: non-finite logits" \
    "$M" generate --model "$W/nan" --tokens 5,7,9 --mtp 2 --threads 1
refused "logits, NaN row" "numerical: non-finite logits" "$M" logits --model "$W/nan" --tokens 5,7,9 --threads 1
grep -q "router of layer 1" "$W/err" || fail "logits: the first MoE layer is not named: $(cat "$W/err")"
good=$("$M" generate --model "$W/good" --tokens 5,9,11 --max-new-tokens 8 --threads 1) || fail "generate, good"
case "$good" in *',7,'* | *'[7,'* | *',7]'*) fail "the clean prompt reads row 7 after all: $good" ;; esac
other=$("$M" generate --model "$W/nan" --tokens 5,9,11 --max-new-tokens 8 --threads 1) || fail "clean prompt, NaN model"
[ "$good" = "$other" ] || fail "a prompt that never reads the NaN row changed: $good vs $other"

# ... and mid-generation, plain and speculative: row R is the third token 5,7,9 generates on the clean model
R=$(echo "$good57" | sed 's/.*"tokens":\[\([0-9]*\),\([0-9]*\),\([0-9]*\).*/\3/')
cp -r "$W/good" "$W/late" && python3 "$S/tests/poke_weights.py" "$W/late" model.embed_tokens.weight "$R" nan || fail poke
refused "generate, NaN row $R generated" "non-finite logits (NaN or inf) after 3 generated tokens" \
    "$M" generate --model "$W/late" --tokens 5,7,9 --max-new-tokens 8 --threads 1
refused "generate --mtp 2, NaN row $R generated" "non-finite logits (NaN or inf) after [0-3] generated tokens" \
    "$M" generate --model "$W/late" --tokens 5,7,9 --max-new-tokens 8 --mtp 2 --threads 1

# overflow gives silent garbage
refused "generate, 3.4e38 row" "numerical: non-finite logits" "$M" generate --model "$W/huge" --tokens 5,7,9 --threads 1

# model-info --check-weights names the tensor
refused "check-weights, NaN" "tensor model.embed_tokens.weight: 1 non-finite" \
    "$M" model-info --model "$W/nan" --check-weights
grep -q '"bad_tensors": \[{"tensor": "model.embed_tokens.weight", "nonfinite": 1, "huge": 0, "first": 448}\]' \
    "$W/out" || fail "check-weights output: $(cat "$W/out")"
refused "check-weights, 3.4e38" "0 non-finite and 64 huge" "$M" model-info --model "$W/huge" --check-weights
"$M" model-info --model "$W/good" --check-weights >"$W/out" 2>"$W/err" || fail "check-weights, good: $(cat "$W/err")"
grep -q '"bad_tensors": \[\]' "$W/out" || fail "check-weights, good: $(cat "$W/out")"
# FP8: finite E4M3 values times a finite but huge block scale overflow once dequantised, as the engine would
"$M" gen-model --preset tiny --dtype f8 --out "$W/f8" --shards 1 >/dev/null || fail "gen-model f8"
python3 "$S/tests/poke_weights.py" "$W/f8" model.layers.0.self_attn.q_a_proj.weight_scale_inv 0 3e38 1 || fail poke
refused "check-weights, FP8 scale" "tensor model.layers.0.self_attn.q_a_proj.weight: [1-9][0-9]* non-finite" \
    "$M" model-info --model "$W/f8" --check-weights
refused "generate, FP8 scale" "numerical: non-finite logits" "$M" generate --model "$W/f8" --tokens 5,7,9 --threads 1

# no context-length check (tiny: max_position_embeddings 256)
long=$(python3 -c "print(','.join(['5'] * 250))")
refused "250 + 7 tokens" "prompt of 250 tokens + 7 new tokens exceeds the model's context of 256" \
    "$M" generate --model "$W/good" --tokens "$long" --max-new-tokens 7 --threads 1
"$M" generate --model "$W/good" --tokens "$long" --max-new-tokens 6 --threads 1 >/dev/null || fail "250 + 6 fits"
refused "--max-model-len 8" "context of 8 tokens" \
    "$M" generate --model "$W/good" --tokens 5,7,9 --max-new-tokens 6 --max-model-len 8 --threads 1
refused "--max-model-len past the model" "max_model_len 300 exceeds the model's max_position_embeddings 256" \
    "$M" generate --model "$W/good" --tokens 5,7,9 --max-model-len 300 --threads 1

# result text is cut at the first NUL byte (58,59,60 greedily gives token 3, which decodes to byte 0x00)
"$M" generate --model "$W/good" --tokens 58,59,60 --max-new-tokens 24 --threads 1 >"$W/gen" || fail "generate, NUL"
python3 - "$W/gen" "$M" "$W/good" <<'EOF' || fail "the printed text is not every decoded byte"
import json, subprocess, sys
out = json.load(open(sys.argv[1]))
assert 3 in out["tokens"], out
want = subprocess.run([sys.argv[2], "tokenize", "--model", sys.argv[3], "--decode"], check=True, capture_output=True,
                      input=json.dumps(out["tokens"]).encode()).stdout
got = out["text"].encode("utf-8", "surrogateescape")
assert b"\0" in got and got == want, (got, want)
EOF
echo "ok"
