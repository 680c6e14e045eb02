#!/usr/bin/env python3
"""Put moeq jobs on Kafka from Python (msgpack, the primary encoding).

    python3 examples/python/producer.py --brokers 127.0.0.1:9092 --topic moeq.jobs --count 3

Needs Debian's python3-confluent-kafka and python3-msgpack (scripts/setup.sh
installs both). The job format is schemas/job.md; results come back on the
topic moeq.results (or the job's reply_to), keyed by job id.
"""
import argparse
import os
import sys
import uuid

import msgpack
from confluent_kafka import Producer


def make_job(i, run):
    """Job i: cycles through the three input kinds a job may carry."""
    job = {
        "v": 1,                      # format version: always 1
        "id": f"py-{run}-{i}",       # producer-chosen idempotency key
        "priority": i % 4,           # 0 = highest .. 3
        "max_new_tokens": 64,
        "temperature": 0.7,
        "seed": 1000 + i,            # same seed + same input = same result
        "metadata": {"source": "examples/python", "n": i},  # echoed back in the result
    }
    kind = i % 3
    if kind == 0:
        job["prompt"] = f"Summarise document {i} in one sentence."
    elif kind == 1:
        job["messages"] = [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": f"What is {i} squared?"},
        ]
    else:
        job["tokens"] = [0, 1, 2, 3 + i]  # pre-tokenised input (ids of the served model)
        job["stop"] = ["\n\n"]
    return job


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--brokers", default=os.environ.get("MOEQ_KAFKA_BROKERS", "127.0.0.1:9092"))
    ap.add_argument("--topic", default="moeq.jobs")
    ap.add_argument("--count", type=int, default=3)
    args = ap.parse_args()

    # Idempotence: a retried send is never written twice or out of order.
    producer = Producer({"bootstrap.servers": args.brokers, "enable.idempotence": True,
                         "client.id": "moeq-example-python"})
    failures = []

    def on_delivery(err, msg):
        if err is not None:
            failures.append(f"{msg.key().decode()}: {err}")

    run = uuid.uuid4().hex[:8]
    for i in range(args.count):
        job = make_job(i, run)
        producer.produce(
            args.topic,
            key=job["id"].encode(),       # keyed by id: one job's retries stay in one partition
            value=msgpack.packb(job, use_bin_type=True),
            headers=[("content-type", b"application/msgpack")],
            on_delivery=on_delivery,
        )
        producer.poll(0)                  # serve delivery callbacks as we go
    left = producer.flush(30)
    if left or failures:
        print(f"producer.py: {left} undelivered, failed: {failures}", file=sys.stderr)
        return 1
    print(f"producer.py: {args.count} jobs on {args.topic} (ids py-{run}-*)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
