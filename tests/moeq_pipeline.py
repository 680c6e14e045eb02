"""moeq_pipeline.py — a real coordinator + worker for the Python integration checks.

Against the ctest fixture's Kafka and Redis (MOEQ_TEST_ENV_FILE, written by
scripts/test-services.sh), with a generated tiny model and a private topic set
and Redis prefix per run, so checks never see each other's jobs.

    with Pipeline(moeq, kafka_conf={...}, redis_url=...) as p:
        ids = p.produce([job, ...])
        results = p.collect(ids)        # id -> decoded result (results or DLQ)
        p.metrics()                     # [coordinator text, worker text]
"""
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid


class Skip(Exception):
    """Raised when the services are not there: the caller exits 77 with the reason."""


def services():
    """The fixture's MOEQ_TEST_* values (environment first, then the env file)."""
    env = {}
    path = os.environ.get("MOEQ_TEST_ENV_FILE", "")
    if path and os.path.exists(path):
        for line in open(path):
            if "=" in line:
                k, v = line.strip().split("=", 1)
                env[k] = v
    for k, v in os.environ.items():
        if k.startswith("MOEQ_TEST_"):
            env[k] = v
    if not env.get("MOEQ_TEST_KAFKA") or not env.get("MOEQ_TEST_REDIS"):
        raise Skip("SKIP no test services (run under ctest's services fixture)")
    return env


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def http_get(url):
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.status, r.read().decode()


def http_status(url):
    try:
        return http_get(url)[0]
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def rdkafka_flags(conf):
    """librdkafka properties as moeq flags (--kafka.<prop>=v; docs/SERVICES.md)."""
    return ["--kafka.%s=%s" % (k, v) for k, v in conf.items()]


_model_dir = None


def tiny_model(moeq):
    global _model_dir
    if _model_dir is None:
        _model_dir = tempfile.mkdtemp(prefix="moeq-py-model-")
        subprocess.run([moeq, "gen-model", "--preset", "tiny", "--out", _model_dir + "/m"], check=True,
                       capture_output=True)
    return _model_dir + "/m"


class Pipeline:
    def __init__(self, moeq, brokers=None, kafka_conf=None, redis_url=None, start_worker=True,
                 ready_timeout=120):
        env = services()
        self.moeq = moeq
        self.brokers = brokers or env["MOEQ_TEST_KAFKA"]
        self.admin_brokers = env["MOEQ_TEST_KAFKA"]
        self.kafka_conf = dict(kafka_conf or {})
        self.redis_url = redis_url or env["MOEQ_TEST_REDIS"]
        self.start_worker = start_worker
        self.ready_timeout = ready_timeout
        run = uuid.uuid4().hex[:8]
        self.run = run
        self.topic, self.results, self.dlq = "py-%s.jobs" % run, "py-%s.results" % run, "py-%s.dlq" % run
        self.cancel = "py-%s.cancel" % run
        self.dir = tempfile.mkdtemp(prefix="moeq-py-%s-" % run)
        self.procs = {}
        self.ports = {}
        self.args = {}

    def common_flags(self):
        return (["--kafka_brokers=" + self.brokers, "--redis_url=" + self.redis_url,
                 "--redis_prefix=py-" + self.run, "--results_topic=" + self.results, "--dlq_topic=" + self.dlq]
                + rdkafka_flags(self.kafka_conf))

    def spawn(self, name, args):
        port = free_port()
        self.ports[name] = port
        self.args[name] = args
        log = open(os.path.join(self.dir, name + ".log"), "w")
        self.procs[name] = subprocess.Popen([self.moeq] + args + ["--http_port=%d" % port] + self.common_flags(),
                                            stdout=log, stderr=subprocess.STDOUT)

    def log(self, name):
        try:
            return open(os.path.join(self.dir, name + ".log")).read()
        except OSError:
            return ""

    def ready(self, name):
        return http_status("http://127.0.0.1:%d/readyz" % self.ports[name]) == 200

    def wait_ready(self, name):
        deadline = time.time() + self.ready_timeout
        respawns = 0
        while time.time() < deadline:
            proc = self.procs[name]
            if proc.poll() is not None:
                # free_port() let the port go before the process bound it; another process may have taken it
                if "http_port: cannot listen" in self.log(name) and respawns < 3:
                    respawns += 1
                    self.spawn(name, self.args[name])
                    continue
                raise AssertionError("%s exited with %d before it was ready:\n%s" % (name, proc.returncode,
                                                                                     self.log(name)[-3000:]))
            if self.ready(name):
                return
            time.sleep(0.2)
        raise AssertionError("%s was not ready within %ds:\n%s" % (name, self.ready_timeout, self.log(name)[-3000:]))

    def create_topics(self):
        """Before any process subscribes: a consumer would otherwise wait a metadata refresh for them."""
        from confluent_kafka.admin import AdminClient, NewTopic
        # Through the fixture's plaintext listener: the checks of bad credentials need their topics too.
        admin = AdminClient({"bootstrap.servers": self.admin_brokers})
        names = [self.topic, self.results, self.dlq, self.cancel]
        futures = admin.create_topics([NewTopic(t, num_partitions=3, replication_factor=1) for t in names])
        for name, f in futures.items():
            try:
                f.result(30)
            except Exception as e:  # an existing topic is fine
                if "TOPIC_ALREADY_EXISTS" not in str(e):
                    raise AssertionError("creating topic %s: %s" % (name, e))

    def __enter__(self):
        self.create_topics()
        self.spawn("coordinator", ["coordinator", "--job_topics=" + self.topic, "--group_id=py-" + self.run,
                                   "--group_instance_id=", "--run_dir=" + self.dir,
                                   "--cancel_topic=" + self.cancel])
        if self.start_worker:
            self.spawn("worker", ["worker", "--model=" + tiny_model(self.moeq)])
        return self

    def start(self):
        for name in self.procs:
            self.wait_ready(name)
        return self

    def client_conf(self):
        conf = {"bootstrap.servers": self.brokers}
        conf.update(self.kafka_conf)
        return conf

    def produce(self, jobs):
        from confluent_kafka import Producer
        p = Producer(self.client_conf())
        for job in jobs:
            p.produce(self.topic, key=job["id"], value=json.dumps(job))
        left = p.flush(30)
        if left:
            raise AssertionError("%d jobs did not reach the broker" % left)
        return [j["id"] for j in jobs]

    def collect(self, ids, timeout=120):
        from confluent_kafka import Consumer
        conf = self.client_conf()
        conf.update({"group.id": "py-reader-" + self.run, "auto.offset.reset": "earliest"})
        c = Consumer(conf)
        c.subscribe([self.results, self.dlq])
        want, got = set(ids), {}
        deadline = time.time() + timeout
        try:
            while time.time() < deadline and not want <= set(got):
                m = c.poll(0.5)
                if m is None or m.error() or not m.key():
                    continue
                key = m.key().decode()
                value = m.value()
                try:
                    doc = json.loads(value)
                except ValueError:
                    import msgpack
                    doc = msgpack.unpackb(value, raw=False)
                doc["_topic"] = m.topic()
                got.setdefault(key, []).append(doc)
        finally:
            c.close()
        missing = want - set(got)
        if missing:
            raise AssertionError("no answer for %d of %d jobs (e.g. %s); logs in %s" % (len(missing), len(want),
                                                                                         sorted(missing)[0], self.dir))
        return got

    def metrics(self):
        return [http_get("http://127.0.0.1:%d/metrics" % self.ports[n])[1] for n in self.procs]

    def __exit__(self, *exc):
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        if exc[0] is None:
            shutil.rmtree(self.dir, ignore_errors=True)
        return False
