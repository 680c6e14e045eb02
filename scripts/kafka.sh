#!/usr/bin/env bash
# One real Apache Kafka broker (KRaft: broker + controller in one JVM) on
# loopback, from the jars scripts/setup.d/10-kafka.sh resolved into
# .deps/kafka/libs. Used by scripts/services.sh (developer stack) and
# scripts/test-services.sh (private instances for ctest).
#
#   kafka.sh start DIR PORT [CONTROLLER_PORT]   format DIR/data (once), start, wait until it answers
#   kafka.sh stop DIR                           stop the broker started in DIR
#   kafka.sh status DIR                         exit 0 when it runs and answers
#
# DIR holds everything: server.properties, log4j.properties, data/, server.log
# (the broker's log), kafka.out (JVM stdout/stderr), kafka.pid. Only loopback,
# no auth: this is for development and tests, not production (see
# docker-compose.yml for that).
#
# Environment:
#   MOEQ_KAFKA_START_TIMEOUT  seconds to wait for the broker to answer (120)
#   MOEQ_KAFKA_PARTITIONS     partitions of auto-created topics (3)
#   KAFKA_HEAP_OPTS           JVM heap flags (-Xmx512m -Xms128m)
#   KAFKA_JVM_OPTS            other JVM flags (lean: serial GC, C1 only, so
#                             start-up is quick on a small, shared machine)
#   JAVA                      the java binary (java on PATH; Kafka 3.9 needs 11..23)
#   MOEQ_KAFKA_SASL_SSL_PORT  also listen for SASL_SSL (SCRAM-SHA-512 over TLS) on
#                             127.0.0.1:PORT, with the certificates of
#   MOEQ_KAFKA_TLS_DIR        (scripts/kafka-tls.sh: broker.pem) and one SCRAM user
#   MOEQ_KAFKA_SCRAM_USER / MOEQ_KAFKA_SCRAM_PASSWORD   (created when DIR is formatted)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
libs="$root/.deps/kafka/libs"
java=${JAVA:-java}

die() { echo "kafka.sh: $*" >&2; exit 1; }

# A Kafka cluster id: 16 random bytes, base64url without padding; not
# starting with '-' (Kafka's own generator avoids that too, for CLI parsing).
cluster_id() {
  local id
  while :; do
    id=$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')
    [ "${id#-}" = "$id" ] && break
  done
  echo "$id"
}

free_port() {
  /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Exit 0 when nothing listens on 127.0.0.1:PORT (so a broker that answers is ours).
port_free() {
  /usr/bin/python3 -c 'import socket,sys; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1",int(sys.argv[1])))' "$1" 2>/dev/null
}

write_config() { # dir port cport
  local dir=$1 port=$2 cport=$3 sasl_port=${MOEQ_KAFKA_SASL_SSL_PORT:-}
  cat >"$dir/server.properties" <<EOF
# Written by scripts/kafka.sh: one node, broker + controller, loopback only.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$cport
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport${sasl_port:+,SASL_SSL://127.0.0.1:$sasl_port}
advertised.listeners=PLAINTEXT://127.0.0.1:$port${sasl_port:+,SASL_SSL://127.0.0.1:$sasl_port}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL
log.dirs=$dir/data
# A single node: every replication factor is 1.
default.replication.factor=1
min.insync.replicas=1
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
# Fast for tests: few internal partitions (the default 50 makes the first
# consumer group wait), no rebalance delay, topics created on first use.
offsets.topic.num.partitions=4
transaction.state.log.num.partitions=4
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=true
delete.topic.enable=true
num.partitions=${MOEQ_KAFKA_PARTITIONS:-3}
# Few threads: the machine is small and shared.
num.network.threads=2
num.io.threads=2
background.threads=2
num.recovery.threads.per.data.dir=1
log.cleaner.threads=1
log.segment.bytes=67108864
EOF
  if [ -n "$sasl_port" ]; then
    cat >>"$dir/server.properties" <<EOF
# The secured listener: TLS (a PEM keystore: key + chain) and SCRAM-SHA-512.
# Clients authenticate; no authorizer, so an authenticated client may do all.
sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.ssl.keystore.type=PEM
listener.name.sasl_ssl.ssl.keystore.location=$MOEQ_KAFKA_TLS_DIR/broker.pem
EOF
  fi
  cat >"$dir/log4j.properties" <<EOF
log4j.rootLogger=INFO, file
log4j.appender.file=org.apache.log4j.RollingFileAppender
log4j.appender.file.File=$dir/server.log
log4j.appender.file.MaxFileSize=20MB
log4j.appender.file.MaxBackupIndex=2
log4j.appender.file.layout=org.apache.log4j.PatternLayout
log4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.org.apache.kafka=INFO
log4j.logger.kafka=INFO
log4j.logger.state.change.logger=WARN
log4j.logger.kafka.request.logger=WARN
EOF
}

# Sets JVM to the java command line, up to the main class, for a broker in DIR.
jvm_cmd() { # dir
  local dir=$1
  # shellcheck disable=SC2206
  JVM=("$java" ${KAFKA_HEAP_OPTS:--Xmx512m -Xms128m}
       ${KAFKA_JVM_OPTS:--XX:+UseSerialGC -XX:TieredStopAtLevel=1 -XX:-UsePerfData}
       -Djava.awt.headless=true -Dlog4j.configuration="file:$dir/log4j.properties"
       -Dkafka.logs.dir="$dir" -cp "$libs/*")
}

# The pid in DIR/kafka.pid, only if that process is still our broker (a
# recycled pid must never be killed).
live_pid() {
  local dir=$1 pid
  [ -f "$dir/kafka.pid" ] || return 1
  pid=$(cat "$dir/kafka.pid" 2>/dev/null) || return 1
  [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "$dir/server.properties" || return 1
  echo "$pid"
}

answers() { # port
  kcat -L -b "127.0.0.1:$1" -m 2 -J 2>/dev/null | grep -q '"brokers":\[{'
}

show_tail() {
  local dir=$1
  echo "---- $dir/server.log (last 40 lines)" >&2
  tail -n 40 "$dir/server.log" 2>/dev/null >&2 || true
  echo "---- $dir/kafka.out (last 20 lines)" >&2
  tail -n 20 "$dir/kafka.out" 2>/dev/null >&2 || true
}

cmd_start() {
  [ $# -ge 2 ] || die "usage: kafka.sh start DIR PORT [CONTROLLER_PORT]"
  local dir port=$2 cport=${3:-} timeout=${MOEQ_KAFKA_START_TIMEOUT:-120}
  mkdir -p "$1"; dir=$(cd "$1" && pwd)
  ls "$libs"/kafka_2.13-*.jar >/dev/null 2>&1 || die "no Kafka jars in $libs: run scripts/setup.sh"
  command -v "$java" >/dev/null || die "java not found (install a JDK 17, or set JAVA)"
  command -v kcat >/dev/null || die "kcat not found: run scripts/setup.sh"
  if pid=$(live_pid "$dir"); then die "a broker already runs from $dir (pid $pid); stop it first"; fi
  [ -n "$cport" ] || cport=$(free_port)
  port_free "$port" || die "127.0.0.1:$port is already in use"
  port_free "$cport" || die "127.0.0.1:$cport (controller) is already in use"
  local scram=()
  if [ -n "${MOEQ_KAFKA_SASL_SSL_PORT:-}" ]; then
    [ -f "${MOEQ_KAFKA_TLS_DIR:-}/broker.pem" ] || die "MOEQ_KAFKA_SASL_SSL_PORT needs MOEQ_KAFKA_TLS_DIR/broker.pem (scripts/kafka-tls.sh)"
    [ -n "${MOEQ_KAFKA_SCRAM_USER:-}" ] && [ -n "${MOEQ_KAFKA_SCRAM_PASSWORD:-}" ] ||
      die "MOEQ_KAFKA_SASL_SSL_PORT needs MOEQ_KAFKA_SCRAM_USER and MOEQ_KAFKA_SCRAM_PASSWORD"
    port_free "$MOEQ_KAFKA_SASL_SSL_PORT" || die "127.0.0.1:$MOEQ_KAFKA_SASL_SSL_PORT (SASL_SSL) is already in use"
    # KRaft keeps SCRAM credentials in the metadata log: they are added when formatting.
    scram=(--add-scram "SCRAM-SHA-512=[name=$MOEQ_KAFKA_SCRAM_USER,password=$MOEQ_KAFKA_SCRAM_PASSWORD]")
  fi

  # Format once; a later start on the same DIR keeps its topics (the developer
  # stack survives `services.sh down; up`). Tests pass a fresh DIR.
  rm -f "$dir/kafka.pid"
  write_config "$dir" "$port" "$cport"
  jvm_cmd "$dir"
  if [ ! -f "$dir/data/meta.properties" ]; then
    mkdir -p "$dir/data"
    if ! "${JVM[@]}" kafka.tools.StorageTool format -t "$(cluster_id)" -c "$dir/server.properties" "${scram[@]}" \
         >"$dir/format.out" 2>&1; then
      cat "$dir/format.out" >&2
      die "formatting KRaft storage in $dir/data failed"
    fi
  fi

  # setsid + every fd redirected: the broker outlives this script and holds
  # no pipe of its caller (ctest waits for its test's pipes to close).
  setsid nohup bash -c 'echo $$ >"$1/kafka.pid"; shift; exec "$@"' _ "$dir" \
    "${JVM[@]}" kafka.Kafka "$dir/server.properties" </dev/null >"$dir/kafka.out" 2>&1 &

  local waited=0
  while :; do
    if answers "$port"; then break; fi
    if [ -f "$dir/kafka.pid" ] && ! live_pid "$dir" >/dev/null; then
      show_tail "$dir"; die "the broker in $dir exited during start-up"
    fi
    if [ "$waited" -ge "$timeout" ]; then
      show_tail "$dir"; cmd_stop "$dir" || true
      die "the broker on 127.0.0.1:$port did not answer within ${timeout}s"
    fi
    sleep 1; waited=$((waited + 1))
  done
  echo "kafka: 127.0.0.1:$port (controller $cport, pid $(cat "$dir/kafka.pid"), dir $dir)"
}

cmd_stop() {
  [ $# -ge 1 ] || die "usage: kafka.sh stop DIR"
  [ -d "$1" ] || return 0
  local dir pid i
  dir=$(cd "$1" && pwd)
  if pid=$(live_pid "$dir"); then
    kill -TERM "$pid" 2>/dev/null || true
    # A clean KRaft shutdown takes a few seconds; then force it.
    for i in $(seq 1 ${MOEQ_KAFKA_STOP_TIMEOUT:-30}); do
      live_pid "$dir" >/dev/null || break
      sleep 1
    done
    if live_pid "$dir" >/dev/null; then
      echo "kafka.sh: broker pid $pid did not stop in time; killing it" >&2
      kill -KILL "$pid" 2>/dev/null || true
      sleep 0.5
    fi
  fi
  rm -f "$dir/kafka.pid"
}

cmd_status() {
  [ $# -ge 1 ] || die "usage: kafka.sh status DIR"
  local dir port
  dir=$(cd "$1" 2>/dev/null && pwd) || return 1
  live_pid "$dir" >/dev/null || return 1
  port=$(sed -n 's/^advertised.listeners=PLAINTEXT:\/\/127.0.0.1://p' "$dir/server.properties")
  answers "$port"
}

case "${1:-}" in
  start) shift; cmd_start "$@" ;;
  stop) shift; cmd_stop "$@" ;;
  status) shift; cmd_status "$@" ;;
  *) die "usage: kafka.sh start DIR PORT [CONTROLLER_PORT] | stop DIR | status DIR" ;;
esac
