#!/usr/bin/env bash
# Installs everything moeq needs to build, test and demo, from Debian packages
# (Debian 12 bookworm or 13 trixie) plus Maven Central (Kafka jars) and npm
# (Node producer example, tokenizer reference). Idempotent: a second run does
# nothing but check. CUDA is optional and never installed here.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"

pkgs=(build-essential cmake pkg-config git clang
      librdkafka-dev libhiredis-dev libcjson-dev libpcre2-dev libopenblas-dev
      libibverbs-dev libmicrohttpd-dev libcmocka-dev
      redis-server kcat maven default-jdk-headless
      python3 python3-numpy python3-msgpack python3-confluent-kafka
      nodejs npm curl ca-certificates)
# msgpack-c's dev package was renamed between bookworm and trixie.
if apt-cache show libmsgpack-c-dev >/dev/null 2>&1; then pkgs+=(libmsgpack-c-dev)
else pkgs+=(libmsgpack-dev); fi
# libFuzzer's runtime ships separately from clang on trixie.
for p in libclang-rt-dev libclang-rt-14-dev; do
  if apt-cache show "$p" >/dev/null 2>&1; then pkgs+=("$p"); break; fi
done

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  # node/npm may come from elsewhere (nodesource); don't fight an existing install.
  if command -v node >/dev/null && command -v npm >/dev/null; then
    missing=("${missing[@]/nodejs}"); missing=("${missing[@]/npm}")
  fi
  $SUDO apt-get install -y -qq --no-install-recommends ${missing[@]} >/dev/null
fi
# The Debian redis-server package starts a system instance on 6379; moeq never
# uses it (scripts/services.sh and the tests start their own).

# Each area's extra set-up (Kafka jars from Maven Central, npm packages for the
# examples and the tokenizer reference, ...) is a hook in scripts/setup.d/, run
# in name order; each hook is idempotent itself.
for hook in "$here"/setup.d/*.sh; do
  [ -e "$hook" ] || continue
  bash "$hook"
done
echo "setup: ok"
