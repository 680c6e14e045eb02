#!/usr/bin/env python3
"""Writes moeq-dashboard.json (Grafana) beside this file: edit here, run, commit both.

Every metric a panel names must be exported by a running process: tests/deploy_check.py
checks the JSON against the /metrics pages of a real coordinator and worker.
"""
import json
import os
panels = []
def ts(title, exprs, unit="short", x=0, y=0, w=12, h=8):
    panels.append({"type": "timeseries", "title": title, "datasource": {"type": "prometheus", "uid": "${datasource}"},
                   "gridPos": {"x": x, "y": y, "w": w, "h": h}, "id": len(panels) + 1,
                   "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                   "targets": [{"refId": chr(65 + i), "expr": e, "legendFormat": l} for i, (e, l) in enumerate(exprs)]})
def q(p, m): return 'histogram_quantile(%s, sum by (le) (rate(%s_bucket[$__rate_interval])))' % (p, m)
row = 0
ts("Jobs in and results out (per second)", [
    ("sum(rate(moeq_coordinator_jobs_consumed_total[$__rate_interval]))", "jobs consumed"),
    ("sum by (status) (rate(moeq_worker_results_total[$__rate_interval]))", "results {{status}}")], "ops", 0, row)
ts("Dead letters (per second)", [
    ("sum by (reason) (rate(moeq_coordinator_jobs_rejected_total[$__rate_interval]))", "rejected {{reason}}"),
    ("sum(rate(moeq_worker_dead_lettered_total[$__rate_interval]))", "worker dead-lettered")], "ops", 12, row)
row += 8
ts("Requests running / waiting", [
    ("sum(moeq_worker_requests_running)", "running"), ("sum(moeq_worker_requests_waiting)", "waiting")], "short", 0, row)
ts("KV cache usage", [("moeq_worker_kv_cache_usage_ratio", "{{worker}}")], "percentunit", 12, row)
row += 8
ts("Tokens (per second)", [
    ("sum(rate(moeq_worker_prompt_tokens_total[$__rate_interval]))", "prompt"),
    ("sum(rate(moeq_worker_generation_tokens_total[$__rate_interval]))", "generation")], "short", 0, row)
ts("Time to first token", [(q("0.5", "moeq_worker_time_to_first_token_seconds"), "p50"),
                           (q("0.99", "moeq_worker_time_to_first_token_seconds"), "p99")], "s", 12, row)
row += 8
ts("Time per output token", [(q("0.5", "moeq_worker_time_per_output_token_seconds"), "p50"),
                             (q("0.99", "moeq_worker_time_per_output_token_seconds"), "p99")], "s", 0, row)
ts("Queue time and end-to-end latency", [
    (q("0.99", "moeq_worker_request_queue_time_seconds"), "queue p99"),
    (q("0.5", "moeq_worker_e2e_request_latency_seconds"), "e2e p50"),
    (q("0.99", "moeq_worker_e2e_request_latency_seconds"), "e2e p99"),
    (q("0.99", "moeq_coordinator_queue_wait_seconds"), "coordinator queue wait p99")], "s", 12, row)
row += 8
ts("Results by finish reason (per second)", [
    ("sum by (finish_reason) (rate(moeq_worker_results_total[$__rate_interval]))", "{{finish_reason}}")], "ops", 0, row)
ts("MTP acceptance and prefix cache hit rate", [
    ("moeq_worker_mtp_acceptance_rate", "MTP {{worker}}"),
    ("moeq_worker_prefix_cache_hit_rate", "prefix cache {{worker}}"),
    ("rate(moeq_worker_prefix_cache_hit_tokens_total[$__rate_interval]) / clamp_min(rate(moeq_worker_prefill_tokens_total[$__rate_interval]) + rate(moeq_worker_prefix_cache_hit_tokens_total[$__rate_interval]), 1e-9)", "prompt tokens from the cache {{worker}}")], "percentunit", 12, row)
row += 8
ts("Kafka lag and Redis backlog", [
    ("sum(moeq_coordinator_consumer_lag_assigned)", "jobs lag"),
    ("sum(moeq_coordinator_pending_batches)", "pending batches"),
    ("max(moeq_coordinator_paused)", "paused (back-pressure)")], "short", 0, row)
ts("Engine busy (seconds per second)", [
    ("rate(moeq_worker_engine_seconds_total[$__rate_interval])", "{{worker}}")], "percentunit", 12, row)
row += 8
panels.append({"type": "table", "title": "Versions", "id": len(panels) + 1,
               "datasource": {"type": "prometheus", "uid": "${datasource}"}, "gridPos": {"x": 0, "y": row, "w": 24, "h": 6},
               "targets": [{"refId": "A", "expr": "count by (version) (moeq_worker_build_info)", "format": "table", "instant": True},
                           {"refId": "B", "expr": "count by (version) (moeq_coordinator_build_info)", "format": "table", "instant": True}]})
dash = {"title": "moeq", "uid": "moeq-overview", "schemaVersion": 39, "version": 1, "editable": True,
        "tags": ["moeq"], "time": {"from": "now-6h", "to": "now"}, "refresh": "30s",
        "templating": {"list": [{"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"}]},
        "panels": panels}
json.dump(dash, open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "moeq-dashboard.json"), "w"), indent=1)
