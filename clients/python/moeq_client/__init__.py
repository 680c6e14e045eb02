"""moeq_client — submit moeq jobs from Python and await their results by id.

    import asyncio
    from moeq_client import Client

    async def main():
        async with Client("127.0.0.1:9092") as moeq:
            result = await moeq.run({"id": "doc-1", "prompt": "Summarise ...", "max_new_tokens": 64})
            print(result["status"], result["text"])

    asyncio.run(main())

Jobs are schemas/job.md (the client adds "v": 1); results are
schemas/result.md. Every job ends in exactly one of: a result (status ok,
error, cancelled, ...: returned, never raised), or a dead letter `duplicate`
when its id was already accepted in the dedupe window (raised as
`Duplicate`). A result is matched to its submission by job id *and* by
`job_hash` (FNV-1a 64 of the bytes this client sent), so a result of an
earlier job with the same id is never taken for this one.

The client reads results and dead letters from just before it started
(offsets by timestamp, less `clock_skew_s`) without a consumer group, so any
number of clients may run at once and none misses a fast result. Kafka
settings (TLS, SASL, ...) go to librdkafka unchanged through `kafka=`:

    Client(brokers, kafka={"security.protocol": "SASL_SSL", "sasl.mechanisms": "SCRAM-SHA-512",
                           "sasl.username": "moeq", "sasl.password": "...", "ssl.ca.location": "ca.pem"})

Needs confluent-kafka and msgpack (Debian: python3-confluent-kafka, python3-msgpack).
"""
import asyncio
import json
import threading
import time
import uuid

import msgpack
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

__all__ = ["Client", "Duplicate", "job_hash"]
__version__ = "0.1.0"


class Duplicate(Exception):
    """The job's id was already accepted: the coordinator dead-lettered this submission unrun."""

    def __init__(self, job_id, reason):
        super().__init__("job %s was not run: %s" % (job_id, reason))
        self.job_id = job_id
        self.reason = reason


def job_hash(value: bytes) -> str:
    """FNV-1a 64 of a job message value, as results carry it (schemas/result.md job_hash)."""
    h = 0xCBF29CE484222325
    for b in value:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


def _decode(value, content_type):
    if content_type == "application/json" or (value[:1] == b"{"):
        return json.loads(value)
    return msgpack.unpackb(value, raw=False)


def _header(msg, name):
    for k, v in msg.headers() or []:
        if k == name:
            return v.decode("utf-8", "replace") if isinstance(v, bytes) else v
    return None


class Client:
    """One producer + one reader of the results and dead-letter topics. Use from one asyncio loop."""

    def __init__(self, brokers, *, jobs_topic="moeq.jobs", results_topic="moeq.results", dlq_topic="moeq.dlq",
                 kafka=None, encoding="msgpack", clock_skew_s=60, connect_timeout_s=15):
        if encoding not in ("msgpack", "json"):
            raise ValueError("encoding must be msgpack or json")
        self.jobs_topic, self.results_topic, self.dlq_topic = jobs_topic, results_topic, dlq_topic
        self.encoding = encoding
        self._conf = {"bootstrap.servers": brokers}
        self._conf.update(kafka or {})
        self._skew_ms = int(clock_skew_s * 1000)
        self._connect_timeout = connect_timeout_s
        self._waiting = {}  # job id -> (hash, future)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None
        self._loop = None
        self._producer = None
        self._consumer = None

    async def __aenter__(self):
        await self.start()
        return self

    async def __aexit__(self, *exc):
        await self.close()

    async def start(self):
        """Connect, and start reading results from now (less clock_skew_s). Raises on an unreachable broker."""
        self._loop = asyncio.get_running_loop()
        await self._loop.run_in_executor(None, self._connect)
        self._thread = threading.Thread(target=self._read, name="moeq-client-reader", daemon=True)
        self._thread.start()

    def _connect(self):
        self._producer = Producer(dict(self._conf, **{"enable.idempotence": True, "client.id": "moeq-client-py"}))
        conf = dict(self._conf, **{"group.id": "moeq-client-%s" % uuid.uuid4().hex, "enable.auto.commit": False,
                                   "client.id": "moeq-client-py"})
        self._consumer = Consumer(conf)
        start_ms = int(time.time() * 1000) - self._skew_ms
        try:
            md = self._consumer.list_topics(timeout=self._connect_timeout)
        except KafkaException as e:
            raise ConnectionError("moeq client: no broker answered at %s within %ss: %s" % (
                self._conf["bootstrap.servers"], self._connect_timeout, e)) from None
        wanted = []
        for topic in (self.results_topic, self.dlq_topic):
            if topic not in md.topics or md.topics[topic].error is not None:
                # Not there yet: create it by asking for its metadata (auto-create) — or the
                # first result would be missed. A cluster without auto-create needs `moeq topics`.
                md2 = self._consumer.list_topics(topic, timeout=self._connect_timeout)
                if topic not in md2.topics or not md2.topics[topic].partitions:
                    raise RuntimeError("moeq client: topic %s does not exist (create it: moeq topics)" % topic)
                md = md2
            wanted += [TopicPartition(topic, p, start_ms) for p in md.topics[topic].partitions]
        deadline = time.time() + self._connect_timeout
        while True:  # a topic just created has no leader for a moment
            try:
                offsets = self._consumer.offsets_for_times(wanted, timeout=self._connect_timeout)
                break
            except KafkaException as e:
                if time.time() > deadline or not e.args[0].retriable():
                    raise
                time.sleep(0.2)
        # No record since start_ms on a partition: start at its high watermark read now. (The
        # logical end, -1, is resolved only when fetching starts: a result produced in between
        # would be skipped.)
        assign = []
        for tp in offsets:
            off = tp.offset
            if off < 0:
                off = self._consumer.get_watermark_offsets(TopicPartition(tp.topic, tp.partition),
                                                           timeout=self._connect_timeout)[1]
            assign.append(TopicPartition(tp.topic, tp.partition, off))
        self._consumer.assign(assign)

    def _encode(self, job):
        job = dict(job)
        job.setdefault("v", 1)
        if "id" not in job:
            raise ValueError("a job needs an id (schemas/job.md)")
        if self.encoding == "json":
            return job["id"], json.dumps(job, separators=(",", ":"), ensure_ascii=False).encode(), "application/json"
        return job["id"], msgpack.packb(job, use_bin_type=True), "application/msgpack"

    async def submit(self, job):
        """Send one job; returns an awaitable for its result once the broker has it."""
        job_id, value, ctype = self._encode(job)
        fut = self._loop.create_future()
        h = job_hash(value)
        with self._lock:
            if job_id in self._waiting:
                raise ValueError("job %s is already waiting for its result in this client" % job_id)
            self._waiting[job_id] = (h, fut)
        delivered = self._loop.create_future()

        def on_delivery(err, msg):
            self._loop.call_soon_threadsafe(_settle, delivered, err)

        self._producer.produce(self.jobs_topic, key=job_id.encode(), value=value,
                               headers=[("content-type", ctype)], on_delivery=on_delivery)
        while not delivered.done():
            await self._loop.run_in_executor(None, self._producer.poll, 0.1)
        if delivered.result() is not None:
            with self._lock:
                self._waiting.pop(job_id, None)
            raise ConnectionError("job %s did not reach the broker: %s" % (job_id, delivered.result()))
        return fut

    async def run(self, job, timeout=None):
        """Submit one job and wait for its result (a dict); raises Duplicate, asyncio.TimeoutError."""
        fut = await self.submit(job)
        try:
            return await asyncio.wait_for(fut, timeout)
        finally:
            with self._lock:
                entry = self._waiting.get(job["id"])
                if entry and entry[1] is fut:
                    del self._waiting[job["id"]]

    def _read(self):
        while not self._stop.is_set():
            msg = self._consumer.poll(0.2)
            if msg is None or msg.error() or msg.key() is None:
                continue
            job_id = msg.key().decode("utf-8", "replace")
            with self._lock:
                entry = self._waiting.get(job_id)
            if not entry:
                continue
            h, fut = entry
            if msg.topic() == self.dlq_topic:
                if _header(msg, "moeq-reason-code") != "duplicate":
                    continue  # other dead letters come with an error result
                hh = _header(msg, "moeq-job-hash")
                if hh and hh != h:
                    continue
                exc = Duplicate(job_id, _header(msg, "moeq-reason") or "duplicate")
                self._loop.call_soon_threadsafe(_fail, fut, exc)
            else:
                result = _decode(msg.value(), _header(msg, "content-type"))
                if result.get("job_hash") and result["job_hash"] != h:
                    continue  # answers an earlier job with the same id
                self._loop.call_soon_threadsafe(_settle_value, fut, result)
            with self._lock:
                if self._waiting.get(job_id, (None, None))[1] is fut:
                    del self._waiting[job_id]

    async def close(self):
        self._stop.set()
        if self._thread:
            await self._loop.run_in_executor(None, self._thread.join)
        if self._producer:
            await self._loop.run_in_executor(None, self._producer.flush, 10)
        if self._consumer:
            self._consumer.close()


def _settle(fut, err):
    if not fut.done():
        fut.set_result(err)


def _settle_value(fut, value):
    if not fut.done():
        fut.set_result(value)


def _fail(fut, exc):
    if not fut.done():
        fut.set_exception(exc)
