#!/bin/bash
# The Docker engine for `make test`: installed and started when absent, stopped only if
# this script started it.
#
#   tools/docker/engine.sh start    # docker.io from apt if needed; dockerd if none answers
#   tools/docker/engine.sh stop     # stops the dockerd recorded in build/docker/dockerd.pid
#
# The daemon runs without a bridge or iptables rules (these machines have no bridge
# module; containers use --network host), logs to build/docker/dockerd.log and keeps the
# default /var/lib/docker, so images built once stay for the next run. A daemon that was
# already answering (the machine's own) is used and never stopped.
set -euo pipefail
cd "$(dirname "$0")/../.."
STATE=build/docker
PIDFILE=$STATE/dockerd.pid
LOG=$STATE/dockerd.log

answers() { timeout 10 docker info --format '{{.ServerVersion}}' >/dev/null 2>&1; }

start() {
  mkdir -p "$STATE"
  if ! command -v dockerd >/dev/null 2>&1 || ! command -v docker-compose >/dev/null 2>&1 \
      || ! command -v mmdebstrap >/dev/null 2>&1; then
    # mmdebstrap builds the contract image's base, docker-compose runs docker/compose.yaml.
    apt-get update -q && DEBIAN_FRONTEND=noninteractive \
      apt-get install -y -q docker.io docker-compose mmdebstrap
  fi
  if answers; then
    echo "docker engine: already running ($(docker info --format '{{.ServerVersion}}'))"
    return 0
  fi
  if [ -z "${DOCKER_HOST:-}" ] && [ -S /var/run/docker.sock ] && [ ! -f "$PIDFILE" ]; then
    echo "docker engine: /var/run/docker.sock exists but nothing answers on it" >&2
  fi
  # containerd: dockerd starts its own when none runs (as a child it stops with it).
  setsid dockerd --bridge=none --iptables=false --ip6tables=false \
    --pidfile=/var/run/docker.pid >>"$LOG" 2>&1 < /dev/null &
  echo $! > "$PIDFILE"
  for _ in $(seq 1 120); do
    if answers; then
      echo "docker engine: started dockerd (pid $(cat "$PIDFILE"), log $LOG)"
      return 0
    fi
    kill -0 "$(cat "$PIDFILE")" 2>/dev/null || break
    sleep 0.5
  done
  echo "docker engine: dockerd did not start; last lines of $LOG:" >&2
  tail -5 "$LOG" >&2
  stop
  return 1
}

stop() {
  [ -f "$PIDFILE" ] || { echo "docker engine: not started by us, left alone"; return 0; }
  local pid
  pid=$(cat "$PIDFILE")
  # Only the dockerd we started: the pid must still be a dockerd.
  if [ "$(cat /proc/"$pid"/comm 2>/dev/null)" = dockerd ]; then
    # Our containers go first: a container outliving the daemon would hold its mounts.
    docker ps -aq --filter label=serving-opt.run | xargs -r docker rm -f >/dev/null 2>&1 || true
    kill -TERM "$pid"
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
    echo "docker engine: stopped the dockerd we started (pid $pid)"
  fi
  rm -f "$PIDFILE"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
