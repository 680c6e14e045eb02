#!/usr/bin/env bash
# Installs everything moeq needs to build, test and demo, from Debian packages
# (Debian 12 bookworm or 13 trixie) plus Maven Central (Kafka jars) and npm
# (Node producer example, tokenizer reference). Idempotent: a second run does
# nothing but check. CUDA is optional: the toolkit is never installed here; where
# nvcc exists, setup.d/40-cuda-wheels.sh adds the cuBLAS and NCCL wheels.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"

pkgs=(build-essential cmake pkg-config git clang
      librdkafka-dev libhiredis-dev libcjson-dev libpcre2-dev libopenblas-dev
      libibverbs-dev libmicrohttpd-dev libcmocka-dev libucx-dev ucx-utils
      redis-server kcat maven default-jdk-headless
      python3 python3-pip python3-numpy python3-msgpack python3-confluent-kafka
      python3-jsonschema  # tests/structured_corpus.py validates structured outputs with it
      nodejs npm curl ca-certificates
      docker-compose python3-yaml prometheus)  # the last three: tests/deploy_check.py (compose config, promtool)
export DEBIAN_FRONTEND=noninteractive
# Package names that differ between releases are resolved from the apt lists,
# so a new machine's empty lists are filled first.
apt-cache show cmake >/dev/null 2>&1 || $SUDO apt-get update -qq
pick() { for p in "$@"; do apt-cache show "$p" >/dev/null 2>&1 && { echo "$p"; return 0; }; done; return 1; }
# msgpack-c's dev package was renamed between bookworm and trixie.
pkgs+=("$(pick libmsgpack-c-dev libmsgpack-dev)")
# jsonschema checks format "uri" only with rfc3987 (the corpus and the fuzz test); without it, uri goes unchecked.
if pick python3-rfc3987 >/dev/null; then pkgs+=(python3-rfc3987); fi
# libFuzzer's runtime ships apart from clang (libclang-rt-<major>-dev).
clang_major=$(apt-cache policy clang | sed -n 's/^ *Candidate: \([0-9]*:\)\{0,1\}\([0-9]*\).*/\2/p')
if rt=$(pick "libclang-rt-${clang_major}-dev" libclang-rt-dev); then pkgs+=("$rt"); fi

missing=()
for p in "${pkgs[@]}"; do
  # node/npm may come from elsewhere (nodesource, nvm): don't fight an existing install.
  case "$p" in nodejs) command -v node >/dev/null && continue ;; npm) command -v npm >/dev/null && continue ;; esac
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
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
