#!/usr/bin/env python3
"""deploy_check.py — what ships under deploy/ and docker-compose.yml works.

  deploy_check.py static MOEQ_BIN       the files parse and agree with the code
  deploy_check.py metrics MOEQ_BIN      every metric the dashboard and the alert
                                         rules name is exported by a running
                                         coordinator / worker (integration: needs
                                         the services fixture's env file)

static checks:
  * docker-compose.yml passes `docker-compose config` (Debian's 1.29) and
    `docker compose config` (v2) where each exists; at least one must;
  * every file named in deploy/k8s/kustomization.yaml exists and each YAML
    document has apiVersion, kind and metadata.name;
  * the ConfigMap's moeq.conf and deploy/moeq.conf load in every role
    (`moeq <role> --config F --print-config`: an unknown or bad key fails);
  * every MOEQ_* variable the manifests and compose file set names a real key;
  * the KEDA triggers watch the streams and group the worker really uses;
  * promtool accepts deploy/prometheus/prometheus.yml and alerts.yml;
  * the Grafana dashboard is JSON with a panel list and datasource-bound queries.
Exit 0 = pass, 1 = fail (messages name the file), 77 = skipped with the reason.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

SKIP = 77
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL " + msg)


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def config_keys(moeq):
    """Every configuration key of every role, from `moeq config-docs`."""
    out = run([moeq, "config-docs"]).stdout
    return set(re.findall(r"^\| `([a-z0-9_.]+)`", out, re.M))


def env_key(var):
    """MOEQ_FOO_BAR -> foo_bar (the loader's mapping: '.' and '-' become '_')."""
    return var[len("MOEQ_"):].lower()


def check_compose(moeq, keys):
    path = os.path.join(ROOT, "docker-compose.yml")
    tried = 0
    for cmd in (["docker-compose"], ["docker", "compose"]):
        if not shutil.which(cmd[0]):
            continue
        if cmd[0] == "docker" and run(cmd + ["version"]).returncode != 0:
            continue
        tried += 1
        r = run(cmd + ["-f", path, "config", "-q"], cwd=ROOT)
        if r.returncode != 0:
            fail("docker-compose.yml: `%s config` rejects it: %s" % (" ".join(cmd), r.stderr.strip()))
    if tried == 0:
        fail("docker-compose.yml: neither docker-compose nor docker compose is installed (scripts/setup.sh installs docker-compose)")
    text = open(path).read()
    check_env_vars("docker-compose.yml", text, keys)
    # The build context must not carry models or build trees (a checkpoint can be hundreds of GB).
    ignore = open(os.path.join(ROOT, ".dockerignore")).read().split()
    for must in ("models/", "*.safetensors", "build*/", ".deps/", ".git/"):
        if must not in ignore:
            fail(".dockerignore does not exclude %s" % must)
    # The submit service's entrypoint is a real command line: `moeq submit --config F --help` must parse.
    m = re.search(r'entrypoint: \["moeq", "submit", "--config", "/etc/moeq/moeq.conf"\]', text)
    if not m:
        fail("docker-compose.yml: the submit service does not run `moeq submit --config /etc/moeq/moeq.conf`")
    r = run([moeq, "submit", "--config", os.path.join(ROOT, "deploy", "moeq.conf"), "--help"])
    if r.returncode != 0:
        fail("`moeq submit --config deploy/moeq.conf --help` fails: %s" % r.stderr.strip())
    for mount in re.findall(r"- \./([^:]+):", text):
        if not os.path.exists(os.path.join(ROOT, mount)) and mount != "jobs":
            fail("docker-compose.yml mounts ./%s, which the repository does not have" % mount)


# Variables read by the compose file itself or by images, not moeq keys.
NOT_KEYS = {"MOEQ_MODEL_DIR", "MOEQ_KAFKA_HOST", "MOEQ_GEN_PRESET"}


def check_env_vars(name, text, keys):
    for var in sorted(set(re.findall(r"\b(MOEQ_[A-Z0-9_]+)", text))):
        if var in NOT_KEYS:
            continue
        k = env_key(var)
        if k not in keys and not k.startswith(("kafka_", "redis_")):
            fail("%s sets %s, but no role has a key '%s'" % (name, var, k))


def load_yaml_docs(path):
    import yaml
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def check_role_config(moeq, name, conf_text):
    with tempfile.NamedTemporaryFile("w", suffix=".conf", delete=False) as f:
        f.write(conf_text)
        conf = f.name
    try:
        for role in ("coordinator", "worker"):
            r = run([moeq, role, "--config", conf, "--print-config"])
            if r.returncode != 0:
                fail("%s: `moeq %s` rejects it: %s" % (name, role, (r.stderr or r.stdout).strip()))
    finally:
        os.unlink(conf)


def check_k8s(moeq, keys):
    try:
        import yaml  # noqa: F401
    except ImportError:
        fail("python3-yaml is missing (scripts/setup.sh installs it)")
        return
    kdir = os.path.join(ROOT, "deploy", "k8s")
    kust = load_yaml_docs(os.path.join(kdir, "kustomization.yaml"))[0]
    docs = {}
    for res in kust.get("resources", []):
        path = os.path.join(kdir, res)
        if not os.path.exists(path):
            fail("deploy/k8s/kustomization.yaml names %s, which does not exist" % res)
            continue
        for d in load_yaml_docs(path):
            for field in ("apiVersion", "kind"):
                if field not in d:
                    fail("deploy/k8s/%s: a document without %s" % (res, field))
            if not d.get("metadata", {}).get("name"):
                fail("deploy/k8s/%s: a %s without metadata.name" % (res, d.get("kind")))
            docs[(d.get("kind"), d.get("metadata", {}).get("name"))] = d
        check_env_vars("deploy/k8s/" + res, open(path).read(), keys)
    cm = docs.get(("ConfigMap", "moeq-config"))
    if not cm:
        fail("deploy/k8s: no ConfigMap moeq-config")
    else:
        check_role_config(moeq, "deploy/k8s/configmap.yaml moeq.conf", cm["data"]["moeq.conf"])
    so = docs.get(("ScaledObject", "moeq-worker"))
    if not so:
        fail("deploy/k8s: no KEDA ScaledObject moeq-worker")
        return
    if so["spec"]["scaleTargetRef"]["name"] not in {n for (k, n) in docs if k == "Deployment"}:
        fail("deploy/k8s/keda-scaledobject.yaml scales %s, which is no Deployment here" % so["spec"]["scaleTargetRef"]["name"])
    wcfg = run([moeq, "worker", "--print-config"]).stdout
    group = re.search(r'^group = "([^"]*)"', wcfg, re.M).group(1)
    prefix = re.search(r'^redis_prefix = "([^"]*)"', wcfg, re.M).group(1)
    want = {"%s:batches:p%d" % (prefix, p) for p in range(4)}
    got = set()
    for t in so["spec"]["triggers"]:
        if t["type"] != "redis-streams":
            continue
        got.add(t["metadata"]["stream"])
        if t["metadata"].get("consumerGroup") != group:
            fail("KEDA trigger on %s watches group %s; workers use %s" % (t["metadata"]["stream"], t["metadata"].get("consumerGroup"), group))
    if got != want:
        fail("KEDA triggers watch %s; the worker reads %s" % (sorted(got), sorted(want)))


def check_prometheus():
    pdir = os.path.join(ROOT, "deploy", "prometheus")
    promtool = shutil.which("promtool")
    if not promtool:
        fail("promtool is missing (Debian `prometheus`; scripts/setup.sh installs it)")
        return
    r = run([promtool, "check", "rules", os.path.join(pdir, "alerts.yml")])
    if r.returncode != 0:
        fail("deploy/prometheus/alerts.yml: promtool: %s %s" % (r.stdout.strip(), r.stderr.strip()))
    # prometheus.yml names its rule file by its path in the container.
    with tempfile.TemporaryDirectory() as tmp:
        text = open(os.path.join(pdir, "prometheus.yml")).read()
        shutil.copy(os.path.join(pdir, "alerts.yml"), os.path.join(tmp, "alerts.yml"))
        with open(os.path.join(tmp, "prometheus.yml"), "w") as f:
            f.write(text.replace("/etc/prometheus/", tmp + "/"))
        r = run([promtool, "check", "config", os.path.join(tmp, "prometheus.yml")])
        if r.returncode != 0:
            fail("deploy/prometheus/prometheus.yml: promtool: %s %s" % (r.stdout.strip(), r.stderr.strip()))


def dashboard_exprs():
    path = os.path.join(ROOT, "deploy", "grafana", "moeq-dashboard.json")
    dash = json.load(open(path))
    exprs = []
    for panel in dash.get("panels", []):
        for t in panel.get("targets", []):
            exprs.append((panel.get("title", "?"), t.get("expr", "")))
    return dash, exprs


def alert_exprs():
    import yaml
    rules = yaml.safe_load(open(os.path.join(ROOT, "deploy", "prometheus", "alerts.yml")))
    return [(r.get("alert", "?"), r["expr"]) for g in rules["groups"] for r in g["rules"]]


def check_dashboard():
    try:
        dash, exprs = dashboard_exprs()
    except (OSError, ValueError) as e:
        fail("deploy/grafana/moeq-dashboard.json: %s" % e)
        return
    if not exprs:
        fail("deploy/grafana/moeq-dashboard.json: no panel queries")
    for title, expr in exprs:
        if not expr.strip():
            fail("dashboard panel '%s' has an empty query" % title)


PROMQL_WORDS = {"sum", "rate", "irate", "increase", "histogram_quantile", "by", "without", "max", "min", "avg",
                "count", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "le", "time",
                "absent", "clamp_min", "clamp_max", "vector", "bool", "offset", "topk", "delta", "deriv",
                "avg_over_time", "max_over_time", "min_over_time", "label_replace", "scalar"}


def metric_names(expr):
    """Metric names in a PromQL expression (identifiers starting moeq_)."""
    expr = re.sub(r'"[^"]*"', "", expr)  # label values
    return {m for m in re.findall(r"\b(moeq_[a-zA-Z0-9_:]+)", expr)}


def scrape(url):
    import urllib.request
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read().decode()


def exported(text):
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            name, kind = line.split()[2:4]
            names.add(name)
            if kind == "histogram":
                names |= {name + "_bucket", name + "_sum", name + "_count"}
            if kind == "summary":
                names |= {name + "_sum", name + "_count"}
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, 1)[0])
    return names


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("static", "metrics"):
        print(__doc__)
        return 2
    moeq = sys.argv[2]
    if sys.argv[1] == "static":
        keys = config_keys(moeq)
        if not keys:
            fail("`moeq config-docs` listed no keys")
        check_compose(moeq, keys)
        check_k8s(moeq, keys)
        check_role_config(moeq, "deploy/moeq.conf", open(os.path.join(ROOT, "deploy", "moeq.conf")).read())
        check_prometheus()
        check_dashboard()
    else:
        return metrics_check(moeq)
    print("deploy_check %s: %s" % (sys.argv[1], "ok" if not failures else "%d failure(s)" % len(failures)))
    return 1 if failures else 0


def metrics_check(moeq):
    from deploy_metrics import run_processes_and_scrape  # tests/deploy_metrics.py
    try:
        texts = run_processes_and_scrape(moeq)
    except RuntimeError as e:
        if str(e).startswith("SKIP"):
            print(str(e))
            return SKIP
        raise
    have = set()
    for t in texts:
        have |= exported(t)
    _, exprs = dashboard_exprs()
    for where, expr in [("dashboard panel '%s'" % t, e) for t, e in exprs] + \
                       [("alert %s" % a, e) for a, e in alert_exprs()]:
        for name in sorted(metric_names(expr)):
            if name not in have:
                fail("%s uses %s, which no running moeq process exports" % (where, name))
    print("deploy_check metrics: %d names exported, %s" % (len(have), "ok" if not failures else "%d failure(s)" % len(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
