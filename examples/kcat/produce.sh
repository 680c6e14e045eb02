#!/usr/bin/env bash
# Put moeq jobs on Kafka with kcat (JSON, the accepted second encoding).
#
#   examples/kcat/produce.sh [--brokers 127.0.0.1:9092] [--topic moeq.jobs] [--count 3]
#
# Each job is one line "key<TAB>json" on kcat's stdin: -K sets the key
# delimiter, -H adds the content-type header the coordinator decodes by
# (without it, it sniffs). The job format is schemas/job.md.
set -euo pipefail
brokers=${MOEQ_KAFKA_BROKERS:-127.0.0.1:9092} topic=moeq.jobs count=3
while [ $# -gt 0 ]; do
  case "$1" in
    --brokers) brokers=$2; shift 2 ;;
    --topic) topic=$2; shift 2 ;;
    --count) count=$2; shift 2 ;;
    *) echo "usage: $0 [--brokers B] [--topic T] [--count N]" >&2; exit 2 ;;
  esac
done
run=$(head -c 4 /dev/urandom | od -An -tx1 | tr -d ' \n')

for i in $(seq 0 $((count - 1))); do
  id="kcat-$run-$i"                      # producer-chosen idempotency key, also the message key
  case $((i % 3)) in                     # the three input kinds a job may carry
    0) input="\"prompt\":\"Summarise document $i in one sentence.\"" ;;
    1) input="\"messages\":[{\"role\":\"user\",\"content\":\"What is $i squared?\"}]" ;;
    2) input="\"tokens\":[0,1,2,$((3 + i))]" ;;
  esac
  printf '%s\t{"v":1,"id":"%s","priority":%d,%s,"max_new_tokens":64,"temperature":0.7,"metadata":{"source":"examples/kcat"}}\n' \
    "$id" "$id" $((i % 4)) "$input"
done | kcat -P -b "$brokers" -t "$topic" -K $'\t' -H content-type=application/json \
         -X enable.idempotence=true -X client.id=moeq-example-kcat

echo "produce.sh: $count jobs on $topic (ids kcat-$run-*)"
