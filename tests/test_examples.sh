#!/usr/bin/env bash
# The C example that links the engine library generates exactly what
# `moeq generate` gives for the same prompt (greedy).
set -euo pipefail
build=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$build/cli/moeq" gen-model --preset tiny --out "$dir/tiny" >/dev/null
got=$("$build/examples/moeq-example-generate" "$dir/tiny" 5 6 7)
want=$("$build/cli/moeq" generate --model "$dir/tiny" --tokens 5,6,7 --max-new-tokens 16 --temperature 0 |
       /usr/bin/python3 -c 'import json,sys; print(" ".join(map(str, json.load(sys.stdin)["tokens"])))')
echo "example: $got"
echo "moeq:    $want"
[ "$got" = "$want" ]
