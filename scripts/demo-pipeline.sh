#!/usr/bin/env bash
# demo-pipeline.sh MODEL_DIR OUT_DIR — the whole pipeline on one machine:
# Kafka + Redis (scripts/services.sh), one coordinator, two workers; submits
# the sample documents of examples/demo/ with an analysis instruction, waits
# for every result, prints a summary and the results path, stops everything.
#
# Called by scripts/demo.sh (`make demo`) once `moeq worker` exists.
# MOEQ_DEMO_KAFKA / MOEQ_DEMO_REDIS (host:port) use running services instead
# of starting scripts/services.sh; MOEQ_DEMO_NAMESPACE (default moeq) names
# the topics (<ns>.jobs, .results, .dlq, .cancel), the Redis keys (<ns>:...) and the
# coordinator group, so a test run shares nothing with anything else.
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 MODEL_DIR OUT_DIR" >&2; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
model=$(cd "$1" && pwd)
mkdir -p "$2"; out=$(cd "$2" && pwd)
moeq=${MOEQ_BIN:-$root/build/cli/moeq}
[ -x "$moeq" ] || { echo "demo: $moeq not built" >&2; exit 1; }

pids=()
started_services=0
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  if [ "$started_services" = 1 ]; then "$root/scripts/services.sh" down >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT INT TERM

if [ -n "${MOEQ_DEMO_KAFKA:-}" ] && [ -n "${MOEQ_DEMO_REDIS:-}" ]; then
  kafka=$MOEQ_DEMO_KAFKA; redis=$MOEQ_DEMO_REDIS
else
  echo "demo: starting Kafka and Redis (scripts/services.sh up)"
  "$root/scripts/services.sh" up
  started_services=1
  kafka=127.0.0.1:${MOEQ_KAFKA_PORT:-9092}; redis=127.0.0.1:${MOEQ_REDIS_PORT:-6380}
fi

run=demo$(date +%s)
ns=${MOEQ_DEMO_NAMESPACE:-moeq}
jobs_topic=$ns.jobs; results_topic=$ns.results
cat >"$out/coordinator.conf" <<CONF
kafka_brokers = $kafka
redis_url = $redis
model = $model
job_topics = $jobs_topic
results_topic = $results_topic
dlq_topic = $ns.dlq
cancel_topic = $ns.cancel
redis_prefix = $ns
group_id = $ns-coordinators
max_wait_ms = 50
http_port = 0
CONF
cat >"$out/worker.conf" <<CONF
model = $model
kafka_brokers = $kafka
redis_url = $redis
results_topic = $results_topic
dlq_topic = $ns.dlq
redis_prefix = $ns
max_seqs = 8
max_step_tokens = 256
kv_cache_tokens = 16384
n_threads = 1
http_port = 0
CONF

# The topics first, as a deployment creates them (results compacted, the dead letters kept a month): a
# consumer that subscribes before its topic exists only logs UNKNOWN_TOPIC_OR_PART until a producer makes it.
echo "demo: creating the topics (moeq topics)"
"$moeq" topics --config "$out/coordinator.conf" --partitions 4 >"$out/topics.jsonl" 2>"$out/topics.log" ||
  { echo "demo: moeq topics failed:" >&2; cat "$out/topics.jsonl" "$out/topics.log" >&2; exit 1; }

echo "demo: starting a coordinator and two workers (logs in $out/)"
"$moeq" coordinator --config "$out/coordinator.conf" 2>"$out/coordinator.log" & pids+=($!)
"$moeq" worker --config "$out/worker.conf" --worker_id="$run-w1" 2>"$out/worker-1.log" & pids+=($!)
"$moeq" worker --config "$out/worker.conf" --worker_id="$run-w2" 2>"$out/worker-2.log" & pids+=($!)

# One job per document: the same analysis instruction on each (a shared prompt prefix).
instruction="Analyse the document below. Answer with its topic, its sentiment (positive, negative or neutral) and one action to take."
i=0
: >"$out/jobs.jsonl"
while IFS= read -r doc; do
  [ -n "$doc" ] || continue
  i=$((i + 1))
  prompt=$(printf '%s\n\nDocument: %s\n\nAnalysis:' "$instruction" "$doc" | sed 's/\\/\\\\/g; s/"/\\"/g' | awk 'BEGIN{ORS="\\n"} {print}')
  printf '{"v":1,"id":"%s-%02d","prompt":"%s","max_new_tokens":32,"temperature":0.7,"seed":%d,"metadata":{"doc":%d}}\n' \
    "$run" "$i" "${prompt%\\n}" "$i" "$i" >>"$out/jobs.jsonl"
done <"$root/examples/demo/documents.txt"

echo "demo: submitting $i documents"
"$moeq" submit --in "$out/jobs.jsonl" --out "$out/results.jsonl" --brokers "$kafka" \
  --topic "$jobs_topic" --results-topic "$results_topic" --dlq-topic "$ns.dlq" --timeout-s "${MOEQ_DEMO_TIMEOUT_S:-300}"

echo
MOEQ_REDIS_URL=$redis "$moeq" status --prefix "$ns" || true
echo
n_ok=$(grep -c '"status":"ok"' "$out/results.jsonl" || true)
n_all=$(wc -l <"$out/results.jsonl")
echo "demo: $n_all results ($n_ok ok) for $i documents"
if command -v python3 >/dev/null; then
  python3 - "$out/results.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
tot = sorted(r.get("timings", {}).get("total_ms", 0) for r in rows)
toks = sum(r.get("usage", {}).get("completion_tokens", 0) for r in rows)
workers = {}
for r in rows: workers[r.get("worker", "?")] = workers.get(r.get("worker", "?"), 0) + 1
if tot:
    print(f"demo: {toks} tokens generated; latency p50 {tot[len(tot)//2]} ms, max {tot[-1]} ms; jobs per worker {workers}")
    r = rows[0]
    print(f"demo: e.g. {r['id']}: {r.get('text', '')[:100]!r}")
PY
fi
echo "demo: results in $out/results.jsonl"
[ "$n_all" -eq "$i" ] || { echo "demo: missing results" >&2; exit 1; }

# MOEQ_DEMO_VERIFY=1 (the integration test): every result must equal `moeq generate`
# for that job alone with the same seed — through Kafka, coordinator, Redis and two workers.
if [ "${MOEQ_DEMO_VERIFY:-0}" = 1 ]; then
  python3 - "$moeq" "$model" "$out/jobs.jsonl" "$out/results.jsonl" <<'PY'
import json, subprocess, sys
moeq, model, jobs_path, results_path = sys.argv[1:5]
results = {}
for line in open(results_path):
    r = json.loads(line)
    results[r["id"]] = r
bad = 0
for line in open(jobs_path):
    j = json.loads(line)
    out = subprocess.run([moeq, "generate", "--model", model, "--prompt", j["prompt"], "--max-new-tokens",
                          str(j["max_new_tokens"]), "--temperature", str(j["temperature"]), "--seed", str(j["seed"]),
                          "--threads", "1"], check=True, capture_output=True, text=True).stdout
    want = json.loads(out)["tokens"]
    got = results[j["id"]].get("tokens", [])
    if got != want:
        bad += 1
        print(f"demo verify: {j['id']}: worker {got} != generate {want}", file=sys.stderr)
print(f"demo verify: {len(results) - bad}/{len(results)} results equal moeq generate for the job alone")
sys.exit(1 if bad else 0)
PY
fi
