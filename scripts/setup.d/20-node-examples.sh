#!/usr/bin/env bash
# Installs the Node packages (kafkajs, @msgpack/msgpack) of the producer
# example (examples/node) and of the Node client (clients/node) from npm,
# exactly as pinned by each package-lock.json. Idempotent: a folder whose
# node_modules matches its lock file is skipped.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
for dir in "$root/examples/node" "$root/clients/node"; do
  [ -f "$dir/package-lock.json" ] || continue
  if ! command -v npm >/dev/null; then
    echo "setup: npm not found; $dir cannot be installed" >&2
    exit 1
  fi
  # npm writes node_modules/.package-lock.json on install; newer than the lock = up to date.
  if [ -f "$dir/node_modules/.package-lock.json" ] && [ "$dir/node_modules/.package-lock.json" -nt "$dir/package-lock.json" ] &&
     [ -d "$dir/node_modules/kafkajs" ] && [ -d "$dir/node_modules/@msgpack/msgpack" ]; then
    continue
  fi
  echo "setup: installing the Node packages of ${dir#$root/} (npm ci)"
  for try in 1 2 3; do
    (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error >/dev/null) && break
    [ "$try" = 3 ] && { echo "setup: npm ci in $dir failed 3 times" >&2; exit 1; }
    sleep $((try * 5))
  done
done
