#!/usr/bin/env bash
# Installs the Node producer example's packages (kafkajs, @msgpack/msgpack)
# from npm, exactly as pinned by examples/node/package-lock.json. Idempotent:
# skipped when node_modules matches the lock file.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
dir="$root/examples/node"
[ -f "$dir/package-lock.json" ] || exit 0
if ! command -v npm >/dev/null; then
  echo "setup: npm not found; the Node producer example cannot be installed" >&2
  exit 1
fi
# npm writes node_modules/.package-lock.json on install; same content = up to date.
if [ -f "$dir/node_modules/.package-lock.json" ] && [ "$dir/node_modules/.package-lock.json" -nt "$dir/package-lock.json" ] &&
   [ -d "$dir/node_modules/kafkajs" ] && [ -d "$dir/node_modules/@msgpack/msgpack" ]; then
  exit 0
fi
echo "setup: installing the Node producer example's packages (npm ci)"
(cd "$dir" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
