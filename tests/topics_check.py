#!/usr/bin/env python3
"""topics_check.py MOEQ_BIN — `moeq topics` creates what docs/SERVICES.md says.

Against the fixture's broker (MOEQ_TEST_ENV_FILE), with fresh topic names:
every topic is created with the partitions and configs asked for (read back
with the admin API's DescribeConfigs, not from moeq's own output); a second
run reports every topic as `exists` and exits 0; --dry-run creates nothing.
Exit 0 pass, 1 fail, 77 skipped with the reason.
"""
import json
import os
import subprocess
import sys
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from moeq_pipeline import Skip, services  # noqa: E402

WANT = {"jobs": {"cleanup.policy": "delete", "retention.ms": "604800000"},
        "results": {"cleanup.policy": "compact,delete", "retention.ms": "604800000", "min.compaction.lag.ms": "3600000"},
        "dlq": {"cleanup.policy": "delete", "retention.ms": "2592000000"},
        "cancel": {"cleanup.policy": "delete", "retention.ms": "86400000"}}


def topics_cmd(moeq, brokers, names, *extra):
    args = [moeq, "topics", "--kafka_brokers=" + brokers, "--partitions", "2",
            "--job_topics=" + names["jobs"], "--results_topic=" + names["results"],
            "--dlq_topic=" + names["dlq"], "--cancel_topic=" + names["cancel"]] + list(extra)
    r = subprocess.run(args, capture_output=True, text=True, timeout=60)
    return r.returncode, [json.loads(l) for l in r.stdout.splitlines() if l.strip()], r.stderr


def main():
    moeq = sys.argv[1]
    try:
        env = services()
    except Skip as e:
        print(e)
        return 77
    from confluent_kafka.admin import AdminClient, ConfigResource
    brokers = env["MOEQ_TEST_KAFKA"]
    run = uuid.uuid4().hex[:8]
    names = {k: "tc-%s.%s" % (run, k) for k in WANT}
    admin = AdminClient({"bootstrap.servers": brokers})

    rc, lines, err = topics_cmd(moeq, brokers, names, "--dry-run")
    assert rc == 0, "dry run: rc %d %s" % (rc, err)
    assert all(l["outcome"] == "valid" for l in lines), lines
    existing = admin.list_topics(timeout=10).topics
    assert not any(n in existing for n in names.values()), "--dry-run created a topic"

    rc, lines, err = topics_cmd(moeq, brokers, names)
    assert rc == 0, "rc %d %s" % (rc, err)
    assert sorted(l["topic"] for l in lines) == sorted(names.values()), lines
    assert all(l["outcome"] == "created" for l in lines), lines
    md = admin.list_topics(timeout=10).topics
    for kind, name in names.items():
        assert len(md[name].partitions) == 2, "%s has %d partitions" % (name, len(md[name].partitions))
        res = ConfigResource(ConfigResource.Type.TOPIC, name)
        got = admin.describe_configs([res])[res].result(10)
        for k, v in WANT[kind].items():
            assert got[k].value == v, "%s: %s = %s, want %s" % (name, k, got[k].value, v)

    rc, lines, err = topics_cmd(moeq, brokers, names)
    assert rc == 0 and all(l["outcome"] == "exists" for l in lines), (rc, lines, err)
    print("moeq topics: 4 topics created with their configs, then reported as existing")
    return 0


if __name__ == "__main__":
    sys.exit(main())
