#!/usr/bin/env python3
"""clients_check.py MOEQ_BIN python|node — the clients in clients/ against a real pipeline.

A real coordinator + worker (tests/moeq_pipeline.py) on the fixture's broker
and Redis. Each client: submits jobs concurrently and awaits each result by
id (every one `ok`, answering its own job: job_hash checked); a second
submission of an id with other content ends in the client's duplicate error
(the coordinator's dead letter), not in the first job's result; an
unreachable broker fails fast with an error naming it.
Exit 0 pass, 1 fail, 77 skipped with the reason.
"""
import asyncio
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
from moeq_pipeline import Pipeline, Skip  # noqa: E402


async def python_case(p):
    from moeq_client import Client, Duplicate
    async with Client(p.brokers, jobs_topic=p.topic, results_topic=p.results, dlq_topic=p.dlq) as c:
        jobs = [{"id": "cl-py-%s-%d" % (p.run, i), "prompt": "client %d" % i, "max_new_tokens": 5,
                 "temperature": 0} for i in range(6)]
        results = await asyncio.wait_for(asyncio.gather(*(c.run(j) for j in jobs)), 120)
        for j, r in zip(jobs, results):
            assert r["id"] == j["id"] and r["status"] == "ok", r
        try:
            await c.run({"id": jobs[0]["id"], "prompt": "other content", "max_new_tokens": 5}, timeout=60)
            raise AssertionError("a reused id with other content was answered")
        except Duplicate as e:
            assert jobs[0]["id"] in str(e)
    t0 = time.time()
    try:
        async with Client("127.0.0.1:1", connect_timeout_s=3):
            pass
        raise AssertionError("an unreachable broker was accepted")
    except ConnectionError as e:
        assert "127.0.0.1:1" in str(e) and time.time() - t0 < 15, (str(e), time.time() - t0)
    print("python client: 6 concurrent jobs answered, the duplicate raised, the dead broker named")


def node_case(p):
    script = os.path.join(ROOT, "clients", "node", "test", "pipeline.test.js")
    env = dict(os.environ, MOEQ_BROKERS=p.brokers, MOEQ_JOBS_TOPIC=p.topic, MOEQ_RESULTS_TOPIC=p.results,
               MOEQ_DLQ_TOPIC=p.dlq, MOEQ_RUN=p.run)
    r = subprocess.run(["node", script], env=env, capture_output=True, text=True, timeout=180)
    sys.stdout.write(r.stdout)
    sys.stderr.write(r.stderr[-4000:])
    if r.returncode != 0:
        raise AssertionError("node client test failed (rc %d)" % r.returncode)


def main():
    moeq, which = sys.argv[1], sys.argv[2]
    if which == "node" and not os.path.isdir(os.path.join(ROOT, "clients", "node", "node_modules", "kafkajs")):
        print("SKIP clients/node/node_modules is missing (scripts/setup.sh runs npm ci there)")
        return 77
    try:
        p = Pipeline(moeq)
    except Skip as e:
        print(e)
        return 77
    with p:
        p.start()
        if which == "python":
            asyncio.run(python_case(p))
        else:
            node_case(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
