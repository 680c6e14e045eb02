#!/usr/bin/env bash
# The developer stack: one real Apache Kafka broker (KRaft) and one
# redis-server with AOF, on loopback, data under .deps/run/.
#
#   services.sh up       start both (idempotent), wait until they answer, print addresses
#   services.sh down     stop both (data kept)
#   services.sh status   print addresses and whether each answers; exit 1 if one is down
#   services.sh clean    down, then delete .deps/run
#
# Ports do not collide with Debian's system redis (6379). Overrides:
#   MOEQ_KAFKA_PORT (9092)  MOEQ_KAFKA_CONTROLLER_PORT (9093)  MOEQ_REDIS_PORT (6380)
#   MOEQ_RUN_DIR (.deps/run)  MOEQ_REDIS_APPENDFSYNC (always)
#
# Tests never use this stack: scripts/test-services.sh starts private
# instances on free ports. The redis-start/redis-stop subcommands below are
# shared with it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
run=${MOEQ_RUN_DIR:-$root/.deps/run}
kport=${MOEQ_KAFKA_PORT:-9092}
cport=${MOEQ_KAFKA_CONTROLLER_PORT:-9093}
rport=${MOEQ_REDIS_PORT:-6380}

die() { echo "services.sh: $*" >&2; exit 1; }

redis_pid() { # dir -> pid of the redis-server started there, if it still runs
  local dir=$1 pid
  [ -f "$dir/redis.pid" ] || return 1
  pid=$(cat "$dir/redis.pid" 2>/dev/null) || return 1
  [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q '^redis-server' || return 1
  echo "$pid"
}

redis_answers() { # port
  [ "$(redis-cli -h 127.0.0.1 -p "$1" ping 2>/dev/null)" = PONG ]
}

# redis-start DIR PORT: AOF on (appendfsync always: an acknowledged write
# survives a crash of the server, which the delivery promise relies on), no
# RDB snapshots, loopback only, daemonized with its pid and log in DIR.
redis_start() {
  [ $# -ge 2 ] || die "usage: services.sh redis-start DIR PORT"
  local dir port=$2 waited=0
  mkdir -p "$1"; dir=$(cd "$1" && pwd)
  command -v redis-server >/dev/null || die "redis-server not found: run scripts/setup.sh"
  if redis_pid "$dir" >/dev/null; then die "a redis-server already runs from $dir"; fi
  redis-server --bind 127.0.0.1 --port "$port" --dir "$dir" \
    --appendonly yes --appendfsync "${MOEQ_REDIS_APPENDFSYNC:-always}" --save '' \
    --daemonize yes --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" </dev/null >/dev/null 2>&1 ||
    { tail -n 20 "$dir/redis.log" >&2 2>/dev/null || true; die "redis-server on port $port did not start"; }
  until redis_answers "$port"; do
    if [ $waited -ge 100 ]; then
      tail -n 20 "$dir/redis.log" >&2 2>/dev/null || true
      die "redis-server on 127.0.0.1:$port did not answer within 10s (log: $dir/redis.log)"
    fi
    sleep 0.1; waited=$((waited + 1))
  done
  echo "redis: 127.0.0.1:$port (pid $(cat "$dir/redis.pid"), dir $dir)"
}

redis_stop() {
  [ $# -ge 1 ] || die "usage: services.sh redis-stop DIR"
  [ -d "$1" ] || return 0
  local dir pid i
  dir=$(cd "$1" && pwd)
  if pid=$(redis_pid "$dir"); then
    kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 1 100); do
      redis_pid "$dir" >/dev/null || break
      sleep 0.1
    done
    if redis_pid "$dir" >/dev/null; then kill -KILL "$pid" 2>/dev/null || true; fi
  fi
  rm -f "$dir/redis.pid"
}

up() {
  bash "$here/setup.d/10-kafka.sh"
  mkdir -p "$run"
  if redis_pid "$run/redis" >/dev/null && redis_answers "$rport"; then
    echo "redis: 127.0.0.1:$rport (already running)"
  else
    redis_start "$run/redis" "$rport"
  fi
  if "$here/kafka.sh" status "$run/kafka" 2>/dev/null; then
    echo "kafka: 127.0.0.1:$kport (already running)"
  else
    "$here/kafka.sh" start "$run/kafka" "$kport" "$cport"
  fi
  echo "services: up (logs: $run/kafka/server.log, $run/redis/redis.log)"
  echo "  export MOEQ_KAFKA_BROKERS=127.0.0.1:$kport MOEQ_REDIS_URL=redis://127.0.0.1:$rport"
}

down() {
  "$here/kafka.sh" stop "$run/kafka"
  redis_stop "$run/redis"
  echo "services: down (data kept in $run; 'services.sh clean' deletes it)"
}

status() {
  local rc=0
  if "$here/kafka.sh" status "$run/kafka" 2>/dev/null; then echo "kafka: 127.0.0.1:$kport up"
  else echo "kafka: 127.0.0.1:$kport down"; rc=1; fi
  if redis_pid "$run/redis" >/dev/null && redis_answers "$rport"; then echo "redis: 127.0.0.1:$rport up"
  else echo "redis: 127.0.0.1:$rport down"; rc=1; fi
  return $rc
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  clean) down; rm -rf "$run"; echo "services: removed $run" ;;
  redis-start) shift; redis_start "$@" ;;
  redis-stop) shift; redis_stop "$@" ;;
  *) die "usage: services.sh up|down|status|clean" ;;
esac
