"""deploy_metrics.py — run a real coordinator and worker, return their /metrics.

Used by deploy_check.py's `metrics` mode: a few jobs go through the pipeline
first (one of them refused with prompt_too_long), so that every histogram and
per-status series has been observed at least once.
"""
import time

from moeq_pipeline import Pipeline, Skip


def run_processes_and_scrape(moeq):
    try:
        p = Pipeline(moeq)
    except Skip as e:
        raise RuntimeError(str(e))
    with p:
        p.start()
        jobs = [{"v": 1, "id": "dm-%s-%d" % (p.run, i), "prompt": "metrics %d" % i, "max_new_tokens": 4,
                 "temperature": 0, "priority": i % 4} for i in range(4)]
        jobs.append({"v": 1, "id": "dm-%s-long" % p.run, "prompt": "x", "max_new_tokens": 1000})
        p.collect(p.produce(jobs))
        time.sleep(0.5)  # the last result's counters
        return p.metrics()
