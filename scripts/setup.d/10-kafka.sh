#!/usr/bin/env bash
# Resolves the Apache Kafka broker (scripts/kafka/pom.xml, pinned) and its
# runtime jars from Maven Central into .deps/kafka/libs. Idempotent: skipped
# when the jars there were resolved from the current pom (a stamp holds the
# pom's hash), so editing the pom re-resolves.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
libs="$root/.deps/kafka/libs"
pom="$root/scripts/kafka/pom.xml"
stamp="$libs/.pom.sha256"
want=$(sha256sum "$pom" | cut -d' ' -f1)

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && ls "$libs"/kafka_2.13-*.jar >/dev/null 2>&1; then
  exit 0
fi
echo "setup: resolving Apache Kafka jars from Maven Central into .deps/kafka/libs"
rm -rf "$libs"
mkdir -p "$libs"
mvn -q -B -Dstyle.color=never -f "$pom" dependency:copy-dependencies
ls "$libs"/kafka_2.13-*.jar >/dev/null
echo "$want" >"$stamp"
