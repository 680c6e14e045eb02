#!/usr/bin/env python3
"""Submit documents and await each one's result, with the Python client (clients/python).

    python3 examples/python/submit_and_wait.py --brokers 127.0.0.1:9092 --count 3

Each job's result comes back by id (asyncio); a job whose id was already
accepted raises moeq_client.Duplicate. Needs python3-confluent-kafka and
python3-msgpack (scripts/setup.sh installs both).
"""
import argparse
import asyncio
import os
import sys
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "clients", "python"))
from moeq_client import Client  # noqa: E402


async def main(args):
    run = uuid.uuid4().hex[:8]
    async with Client(args.brokers, jobs_topic=args.topic) as moeq:
        jobs = [{"id": f"py-wait-{run}-{i}", "prompt": f"Summarise document {i} in one sentence.",
                 "max_new_tokens": 32, "temperature": 0} for i in range(args.count)]
        for result in await asyncio.gather(*(moeq.run(j, timeout=args.timeout) for j in jobs)):
            print(result["id"], result["status"], repr(result.get("text", ""))[:80])


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--brokers", default=os.environ.get("MOEQ_KAFKA_BROKERS", "127.0.0.1:9092"))
    ap.add_argument("--topic", default="moeq.jobs")
    ap.add_argument("--count", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=600)
    asyncio.run(main(ap.parse_args()))
