#!/usr/bin/env bash
# Private Kafka + Redis for one test run, so tests never touch a developer's
# stack (scripts/services.sh) and two runs on one machine never collide.
#
#   test-services.sh start DIR [--die-with-parent]
#   test-services.sh stop DIR
#
# start picks free loopback ports, starts redis-server (DIR/redis) and a
# Kafka broker (DIR/kafka) from scratch, waits until both answer, then writes
# DIR/env (shell- and C-readable `KEY=value` lines):
#   MOEQ_TEST_KAFKA=127.0.0.1:P
#   MOEQ_TEST_REDIS=127.0.0.1:P
#   MOEQ_TEST_KAFKA_PID=...  MOEQ_TEST_REDIS_PID=...
# and the same broker's secured listener (SASL_SSL, SCRAM-SHA-512, a CA made
# for this run by scripts/kafka-tls.sh):
#   MOEQ_TEST_KAFKA_SASL_SSL=127.0.0.1:P  MOEQ_TEST_KAFKA_USER=moeq
#   MOEQ_TEST_KAFKA_PASSWORD=...  MOEQ_TEST_KAFKA_CA=DIR/tls/ca.pem
#   MOEQ_TEST_KAFKA_OTHER_CA=DIR/tls/other-ca.pem (trusted by nothing: the negative test)
# Tests find the file through MOEQ_TEST_ENV_FILE (tests/services_env.h).
#
# --die-with-parent (used by the ctest fixture): a small watchdog stops both
# services when the calling process (ctest) goes away, so an interrupted run
# leaves no java process behind.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

die() { echo "test-services.sh: $*" >&2; exit 1; }

# Four distinct free ports: all sockets are held open until all are chosen.
free_ports() {
  /usr/bin/python3 - <<'EOF'
import socket
socks = []
for _ in range(4):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
}

stop() {
  [ $# -ge 1 ] || die "usage: test-services.sh stop DIR"
  [ -d "$1" ] || return 0
  local dir pid
  dir=$(cd "$1" && pwd)
  if [ -f "$dir/watchdog.pid" ]; then
    pid=$(cat "$dir/watchdog.pid")
    # Not when the watchdog itself is the caller.
    if [ "$pid" != "${MOEQ_WATCHDOG_SELF:-}" ] && [ -r "/proc/$pid/cmdline" ] &&
       tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q "test-services.sh __watch"; then
      kill -TERM "$pid" 2>/dev/null || true
    fi
    rm -f "$dir/watchdog.pid"
  fi
  rm -f "$dir/env"
  MOEQ_KAFKA_STOP_TIMEOUT=${MOEQ_KAFKA_STOP_TIMEOUT:-10} "$here/kafka.sh" stop "$dir/kafka"
  "$here/services.sh" redis-stop "$dir/redis"
  rm -rf "$dir/kafka/data"
}

start_kafka() { # dir port cport; retries on a port lost to a race with another run
  local dir=$1 port=$2 cport=$3 try
  for try in 1 2 3; do
    if "$here/kafka.sh" start "$dir" "$port" "$cport"; then return 0; fi
    grep -qs "Address already in use\|already in use" "$dir/server.log" "$dir/kafka.out" || return 1
    echo "test-services.sh: port race, retrying with new ports" >&2
    rm -rf "$dir"
    read -r port cport _ MOEQ_KAFKA_SASL_SSL_PORT < <(free_ports)
  done
  return 1
}

start() {
  [ $# -ge 1 ] || die "usage: test-services.sh start DIR [--die-with-parent]"
  local dir kport cport rport sport password watch=0
  mkdir -p "$1"; dir=$(cd "$1" && pwd)
  [ "${2:-}" = "--die-with-parent" ] && watch=1
  bash "$here/setup.d/10-kafka.sh"
  stop "$dir"                       # leftovers of an earlier, interrupted run
  rm -rf "$dir/kafka" "$dir/redis"
  read -r kport cport rport sport < <(free_ports)
  "$here/kafka-tls.sh" "$dir/tls" || { stop "$dir"; exit 1; }
  password=$(head -c 12 /dev/urandom | base64 | tr -d '/+=')
  export MOEQ_KAFKA_SASL_SSL_PORT=$sport MOEQ_KAFKA_TLS_DIR=$dir/tls
  export MOEQ_KAFKA_SCRAM_USER=moeq MOEQ_KAFKA_SCRAM_PASSWORD=$password

  "$here/services.sh" redis-start "$dir/redis" "$rport" || { stop "$dir"; exit 1; }
  start_kafka "$dir/kafka" "$kport" "$cport" || { stop "$dir"; exit 1; }
  kport=$(sed -n 's/^advertised.listeners=PLAINTEXT:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$dir/kafka/server.properties")

  {
    echo "MOEQ_TEST_KAFKA=127.0.0.1:$kport"
    echo "MOEQ_TEST_REDIS=127.0.0.1:$rport"
    echo "MOEQ_TEST_KAFKA_PID=$(cat "$dir/kafka/kafka.pid")"
    echo "MOEQ_TEST_REDIS_PID=$(cat "$dir/redis/redis.pid")"
    echo "MOEQ_TEST_KAFKA_SASL_SSL=127.0.0.1:$MOEQ_KAFKA_SASL_SSL_PORT"
    echo "MOEQ_TEST_KAFKA_USER=$MOEQ_KAFKA_SCRAM_USER"
    echo "MOEQ_TEST_KAFKA_PASSWORD=$MOEQ_KAFKA_SCRAM_PASSWORD"
    echo "MOEQ_TEST_KAFKA_CA=$dir/tls/ca.pem"
    echo "MOEQ_TEST_KAFKA_OTHER_CA=$dir/tls/other-ca.pem"
  } >"$dir/env.tmp"
  mv "$dir/env.tmp" "$dir/env"
  if [ $watch = 1 ]; then
    setsid nohup "$here/test-services.sh" __watch "$PPID" "$dir" </dev/null >"$dir/watchdog.out" 2>&1 &
    echo $! >"$dir/watchdog.pid"
  fi
  echo "test-services: env in $dir/env"
  cat "$dir/env"
}

# The watchdog: while the run's env file exists, poll the parent; when it is
# gone without having stopped the services, stop them.
watch() { # parent dir
  local parent=$1 dir=$2
  while [ -f "$dir/env" ] && kill -0 "$parent" 2>/dev/null; do sleep 2; done
  if [ -f "$dir/env" ]; then
    echo "test-services.sh: parent $parent is gone; stopping $dir"
    MOEQ_WATCHDOG_SELF=$$ stop "$dir"
  fi
}

case "${1:-}" in
  __watch) shift; watch "$@" ;;
  start) shift; start "$@" ;;
  stop) shift; stop "$@" ;;
  *) die "usage: test-services.sh start DIR [--die-with-parent] | stop DIR" ;;
esac
