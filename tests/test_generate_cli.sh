#!/usr/bin/env bash
# test_generate_cli.sh BUILD_DIR — `moeq generate` beyond plain decoding, on a tiny checkpoint with a tokenizer:
#   - --response-format (a job's response_format, inline or @FILE): json_object, json_schema, regex and choice
#     outputs are what they say, complete within --max-new-tokens; with MTP drafts (exact mode) the same tokens as
#     without; a malformed or unknown format exits 2 with the job decoder's reason; rejection sampling is refused;
#   - --mtp K after a prompt shorter than K + 1 tokens: the verify step did not fit the engine (exit 1, "step of
#     2 tokens exceeds max_step_tokens 1"); now the same tokens as without --mtp;
#   - --set KEY=VALUE: any engine key; the CPU kernels' choices and whole rows keep the tokens; bad keys refused.
set -uo pipefail
build=$1
M="$build/cli/moeq"
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
fail() {
    echo "FAIL: $*" >&2
    exit 1
}
"$M" gen-model --preset tiny --out "$W/tiny" >/dev/null || fail "gen-model"

# text of a generate's JSON, the end-of-sequence token's text taken off
text_of() { python3 -c 'import json,sys; print(json.load(sys.stdin)["text"].replace("<｜end▁of▁sentence｜>", ""), end="")'; }
tokens_of() { python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens"])'; }

# json_object: a JSON object, for several prompts and budgets
for p in "x" "Give me JSON:" "a b c d e f g"; do
    for n in 12 40; do
        out=$("$M" generate --model "$W/tiny" --prompt "$p" --max-new-tokens $n --response-format '{"type":"json_object"}') ||
            fail "json_object ($p, $n)"
        t=$(text_of <<<"$out")
        python3 -c 'import json,sys; v=json.loads(sys.argv[1]); assert isinstance(v, dict)' "$t" ||
            fail "json_object ($p, $n tokens) gave: $t"
        # MTP drafts, exact mode: the same tokens
        out2=$("$M" generate --model "$W/tiny" --prompt "$p" --max-new-tokens $n --mtp 2 \
            --response-format '{"type":"json_object"}') || fail "json_object with --mtp 2"
        [ "$(tokens_of <<<"$out")" = "$(tokens_of <<<"$out2")" ] || fail "json_object: --mtp 2 changed the tokens"
    done
done

# json_schema from a file: the required fields, with their types
cat >"$W/rf.json" <<'EOF'
{"type": "json_schema", "json_schema": {"name": "answer", "schema": {"type": "object",
  "properties": {"n": {"type": "integer"}, "ok": {"type": "boolean"}, "tag": {"enum": ["a", "b"]}},
  "required": ["n", "ok", "tag"], "additionalProperties": false}}}
EOF
out=$("$M" generate --model "$W/tiny" --prompt "x" --max-new-tokens 48 --response-format "@$W/rf.json") ||
    fail "json_schema"
t=$(text_of <<<"$out")
python3 -c '
import json, sys
v = json.loads(sys.argv[1])
assert set(v) == {"n", "ok", "tag"}, v
assert type(v["n"]) is int and type(v["ok"]) is bool and v["tag"] in ("a", "b"), v' "$t" ||
    fail "json_schema gave: $t"

# regex and choice
t=$("$M" generate --model "$W/tiny" --prompt "x" --max-new-tokens 16 \
    --response-format '{"type":"regex","pattern":"[0-9]{3}-[a-z]{2}"}' | text_of) || fail "regex"
[[ "$t" =~ ^[0-9]{3}-[a-z]{2}$ ]] || fail "regex gave: $t"
t=$("$M" generate --model "$W/tiny" --prompt "y" --max-new-tokens 16 \
    --response-format '{"type":"choice","choices":["yes","no","maybe"]}' | text_of) || fail "choice"
[[ "$t" == yes || "$t" == no || "$t" == maybe ]] || fail "choice gave: $t"

# refused, saying why
err=$("$M" generate --model "$W/tiny" --prompt x --response-format '{"type":"bogus"}' 2>&1 >/dev/null)
[ $? -eq 2 ] && grep -q "not one of text, json_object, json_schema, regex, choice" <<<"$err" ||
    fail "an unknown type: $err"
err=$("$M" generate --model "$W/tiny" --prompt x --response-format '{"type":' 2>&1 >/dev/null)
[ $? -eq 2 ] && grep -q "response-format" <<<"$err" || fail "malformed JSON: $err"
err=$("$M" generate --model "$W/tiny" --prompt x --response-format "@$W/none.json" 2>&1 >/dev/null)
[ $? -eq 2 ] && grep -q "cannot open" <<<"$err" || fail "a missing file: $err"
err=$("$M" generate --model "$W/tiny" --prompt x --mtp 1 --mtp-rejection --temperature 0.8 \
    --response-format '{"type":"json_object"}' 2>&1 >/dev/null)
[ $? -eq 1 ] && grep -q "exact mode only" <<<"$err" || fail "rejection sampling with a format: $err"

# --mtp K after a prompt of fewer than K + 1 tokens
for k in 1 3; do
    a=$("$M" generate --model "$W/tiny" --tokens 5 --max-new-tokens 12 | tokens_of) || fail "plain, one token"
    b=$("$M" generate --model "$W/tiny" --tokens 5 --max-new-tokens 12 --mtp $k | tokens_of) ||
        fail "--mtp $k after a one-token prompt"
    [ "$a" = "$b" ] || fail "--mtp $k changed the tokens: $a vs $b"
done
# --set KEY=VALUE: any engine key. The CPU kernels' other choices and whole logits rows give the same tokens
# (none changes a bit); an unknown key and a value outside the choices are refused, naming them
a=$("$M" generate --model "$W/tiny" --prompt "a b c" --max-new-tokens 16 | tokens_of) || fail "plain"
for set in "--set cpu_prefetch=l1 --set cpu_k_blocked=on --set cpu_f8_widen=f16" \
    "--set cpu_prefetch=l2 --set cpu_k_blocked=off --set cpu_f8_widen=f32 --set head_screen=off"; do
    # shellcheck disable=SC2086 # $set is a list of flags
    b=$("$M" generate --model "$W/tiny" --prompt "a b c" --max-new-tokens 16 $set | tokens_of) || fail "$set"
    [ "$a" = "$b" ] || fail "$set changed the tokens: $a vs $b"
done
err=$("$M" generate --model "$W/tiny" --prompt x --set no_such_key=1 2>&1 >/dev/null)
[ $? -eq 2 ] && grep -q "no engine key no_such_key" <<<"$err" || fail "an unknown --set key: $err"
err=$("$M" generate --model "$W/tiny" --prompt x --set max_seqs=zero 2>&1 >/dev/null)
[ $? -eq 2 ] && grep -q "max_seqs" <<<"$err" || fail "a --set value of the wrong type: $err"
err=$("$M" generate --model "$W/tiny" --prompt x --set cpu_k_blocked=maybe 2>&1 >/dev/null)
[ $? -eq 1 ] && grep -q 'cpu_k_blocked "maybe": the choices are auto, off and on' <<<"$err" ||
    fail "a --set value outside the choices: $err"
err=$("$M" logits --model "$W/tiny" --tokens 5,6 --set cpu_prefetch 2>&1 >/dev/null)
[ $? -eq 2 ] || fail "--set without =: $err"
echo "ok"
