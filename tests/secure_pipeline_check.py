#!/usr/bin/env python3
"""secure_pipeline_check.py — moeq on a secured cluster, for real.

    secure_pipeline_check.py MOEQ_BIN CASE

CASE (one ctest test each, names as sentences):
  sasl_ssl_pipeline     coordinator, worker and the producer/consumer all talk to
                        the broker's SASL_SSL listener (SCRAM-SHA-512, the run's
                        own CA) and every job gets its result; Redis is reached
                        as an ACL user that has only the commands and keys
                        docs/SECURITY.md lists, and Redis logged no denial.
  wrong_password        a coordinator with a wrong SCRAM password says so
                        ("SASL authentication error ... invalid credentials")
                        and is not ready.
  untrusted_ca          one trusting another CA says the broker's certificate
                        could not be verified, and is not ready.
Exit 0 pass, 1 fail, 77 skipped with the reason printed.
"""
import os
import re
import subprocess
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from moeq_pipeline import Pipeline, Skip, services  # noqa: E402

SKIP = 77
DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "SECURITY.md")


def sasl_conf(env, password=None, ca=None):
    return {"security.protocol": "SASL_SSL", "sasl.mechanisms": "SCRAM-SHA-512",
            "sasl.username": env["MOEQ_TEST_KAFKA_USER"],
            "sasl.password": password or env["MOEQ_TEST_KAFKA_PASSWORD"],
            "ssl.ca.location": ca or env["MOEQ_TEST_KAFKA_CA"]}


def redis_cli(env, *args):
    host, port = env["MOEQ_TEST_REDIS"].rsplit(":", 1)
    r = subprocess.run(["redis-cli", "-h", host, "-p", port] + list(args), capture_output=True, text=True)
    if r.returncode != 0 or r.stdout.startswith("ERR"):
        raise AssertionError("redis-cli %s: %s %s" % (" ".join(args), r.stdout, r.stderr))
    return r.stdout


def acl_rule_from_docs(prefix):
    """The ACL rule docs/SECURITY.md gives (between the acl-rule markers), for prefix."""
    text = open(DOCS).read()
    m = re.search(r"<!-- acl-rule -->\s*```\s*\n(.*?)\n```", text, re.S)
    if not m:
        raise AssertionError("docs/SECURITY.md has no ```-fenced ACL rule after <!-- acl-rule -->")
    rule = " ".join(m.group(1).split())
    if not rule.startswith("ACL SETUSER moeq "):
        raise AssertionError("docs/SECURITY.md's rule must start 'ACL SETUSER moeq ': %s" % rule[:60])
    return rule.replace("~moeq:*", "~%s:*" % prefix)


def case_sasl_ssl_pipeline(moeq, env):
    run = uuid.uuid4().hex[:6]
    user, password = "moeq-acl-" + run, uuid.uuid4().hex
    probe = Pipeline(moeq)  # only for its prefix
    rule = acl_rule_from_docs("py-" + probe.run).split()
    # ACL SETUSER moeq <rules...>: our user name and password instead.
    redis_cli(env, "ACL", "SETUSER", user, *rule[3:], "resetpass", ">" + password)
    redis_cli(env, "ACL", "LOG", "RESET")
    host_port = env["MOEQ_TEST_REDIS"]
    p = Pipeline(moeq, brokers=env["MOEQ_TEST_KAFKA_SASL_SSL"], kafka_conf=sasl_conf(env),
                 redis_url="redis://%s:%s@%s" % (user, password, host_port))
    p.run = probe.run
    p.topic, p.results, p.dlq = probe.topic, probe.results, probe.dlq
    try:
        with p:
            p.start()
            jobs = [{"v": 1, "id": "sec-%s-%d" % (p.run, i), "prompt": "secured %d" % i, "max_new_tokens": 6,
                     "temperature": 0} for i in range(12)]
            got = p.collect(p.produce(jobs))
            for jid, docs in got.items():
                ok = [d for d in docs if d["_topic"] == p.results and d.get("status") == "ok"]
                if len(ok) != 1 or len(docs) != 1:
                    raise AssertionError("job %s: expected one ok result, got %s" % (jid, docs))
            # CONFIG GET is left out on purpose (it can read secrets); the
            # coordinator says it could not check appendfsync instead.
            log = redis_cli(env, "ACL", "LOG").splitlines()
            # Entries are flat key/value lines, each starting at "count"; only this user's count (other tests
            # share the Redis, and one of them fails an AUTH as "moeq" on purpose).
            entries, cur = [], None
            for k, v in zip(log[0::2], log[1::2]):
                if k == "count":
                    cur = {}
                    entries.append(cur)
                if cur is not None:
                    cur[k] = v
            denied = {e.get("object") for e in entries if e.get("username") == user} - {"config|get"}
            if denied:
                raise AssertionError("Redis denied the ACL user %s (ACL LOG):\n%s" % (sorted(denied), "\n".join(log)))
            if "cannot read redis appendonly" not in p.log("coordinator"):
                raise AssertionError("the coordinator did not say that it could not check appendfsync")
    finally:
        redis_cli(env, "ACL", "DELUSER", user)
    print("12 jobs answered over SASL_SSL with a least-privilege Redis user")


def expect_clear_failure(moeq, env, kafka_conf, pattern, what):
    p = Pipeline(moeq, brokers=env["MOEQ_TEST_KAFKA_SASL_SSL"], kafka_conf=kafka_conf, start_worker=False)
    with p:
        deadline = time.time() + 30
        while time.time() < deadline:
            if re.search(pattern, p.log("coordinator")):
                break
            if p.procs["coordinator"].poll() is not None:
                break
            time.sleep(0.5)
        log = p.log("coordinator")
        if not re.search(pattern, log):
            raise AssertionError("%s: the coordinator's log never said /%s/:\n%s" % (what, pattern, log[-3000:]))
        if p.procs["coordinator"].poll() is None and p.ready("coordinator"):
            raise AssertionError("%s: the coordinator reports ready" % what)
    line = next(l for l in log.splitlines() if re.search(pattern, l))
    print("%s: %s" % (what, line.strip()[:300]))


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    moeq, case = sys.argv[1], sys.argv[2]
    try:
        env = services()
    except Skip as e:
        print(e)
        return SKIP
    if not env.get("MOEQ_TEST_KAFKA_SASL_SSL"):
        print("SKIP the test broker has no SASL_SSL listener (scripts/test-services.sh makes one)")
        return SKIP
    if case == "sasl_ssl_pipeline":
        case_sasl_ssl_pipeline(moeq, env)
    elif case == "wrong_password":
        expect_clear_failure(moeq, env, sasl_conf(env, password="not-the-password"),
                             r"SASL authentication error.*invalid credentials", "wrong password")
    elif case == "untrusted_ca":
        expect_clear_failure(moeq, env, sasl_conf(env, ca=env["MOEQ_TEST_KAFKA_OTHER_CA"]),
                             r"certificate verify failed", "untrusted CA")
    else:
        print("unknown case %s" % case)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
