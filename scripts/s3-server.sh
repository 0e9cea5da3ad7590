#!/usr/bin/env bash
# A local S3 server for larder's S3 tests and demos: moto_server on 127.0.0.1 (or $S3_HOST), on a free port.
#
#   scripts/s3-server.sh start   # install moto[server] if missing, start it (if not running), print the env
#   scripts/s3-server.sh env     # print the env of the running server (fails if none runs)
#   scripts/s3-server.sh stop    # stop it (no error if none runs)
#   scripts/s3-server.sh status  # exit 0 if it runs and answers
#
# `start` and `env` print one line to eval:
#   export S3_ENDPOINT=http://127.0.0.1:PORT AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_DEFAULT_REGION=us-east-1
#
# S3_HOST (default 127.0.0.1) is the address the server listens on and the endpoint names: another
# address of this machine, e.g. a test network's bridge, lets processes in other network namespaces
# reach it. It must be the same for every command on one state dir.
#
# State (pid, port, log) lives in $S3_STATE_DIR (default /tmp/larder-s3): one server per state dir, so
# tests running side by side give each server a dir of its own. Every wait is bounded. moto keeps the
# objects in memory: they are gone when the server stops.
set -euo pipefail

STATE_DIR="${S3_STATE_DIR:-/tmp/larder-s3}"
PID_FILE="$STATE_DIR/pid"
PORT_FILE="$STATE_DIR/port"
LOG_FILE="$STATE_DIR/moto.log"
PYTHON="${PYTHON:-python3}"
HOST="${S3_HOST:-127.0.0.1}"
START_TIMEOUT="${S3_START_TIMEOUT:-30}"   # seconds to wait for the server to answer
STOP_TIMEOUT=10                           # seconds to wait for it to exit after SIGTERM

die() {
  echo "s3-server: $*" >&2
  exit 1
}

print_env() {
  echo "export S3_ENDPOINT=http://$HOST:$1 AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_DEFAULT_REGION=us-east-1"
}

# The pid in the pid file if that process is alive and is a moto server, else nothing.
running_pid() {
  [ -f "$PID_FILE" ] || return 0
  local pid
  pid="$(cat "$PID_FILE" 2>/dev/null || true)"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 0
  kill -0 "$pid" 2>/dev/null || return 0
  # Never signal a process that reused the pid.
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q 'moto' || return 0
  echo "$pid"
}

# Whether the server on port $1 answers an S3 request (ListBuckets) within 2 s.
answers() {
  curl -s -o /dev/null --max-time 2 -w '%{http_code}' "http://$HOST:$1/" 2>/dev/null | grep -q '^200$'
}

ensure_installed() {
  if "$PYTHON" -c 'import moto.server, flask, boto3' >/dev/null 2>&1; then
    return 0
  fi
  # One install at a time (tests start servers side by side); the others wait for it, then find it done.
  local lock=/tmp/larder-s3-pip.lock
  (
    flock -w 600 9 || die "timed out waiting for another pip install ($lock)"
    if ! "$PYTHON" -c 'import moto.server, flask, boto3' >/dev/null 2>&1; then
      echo "s3-server: installing moto[server] and boto3 with pip" >&2
      timeout 600 "$PYTHON" -m pip install --quiet --disable-pip-version-check 'moto[server]' boto3 >&2 ||
        die "pip install 'moto[server]' boto3 failed"
    fi
  ) 9>"$lock"
  "$PYTHON" -c 'import moto.server, flask, boto3' >/dev/null 2>&1 ||
    die "moto[server] or boto3 still cannot be imported after pip install"
}

free_port() {
  "$PYTHON" -c 'import socket, sys; s = socket.socket(); s.bind((sys.argv[1], 0)); print(s.getsockname()[1])' "$HOST"
}

start() {
  mkdir -p "$STATE_DIR"
  local pid port
  pid="$(running_pid)"
  if [ -n "$pid" ]; then
    port="$(cat "$PORT_FILE" 2>/dev/null || true)"
    if [ -n "$port" ] && answers "$port"; then
      print_env "$port"
      return 0
    fi
    # Alive but not answering (stopped, or stuck): replace it.
    stop
  fi
  command -v curl >/dev/null 2>&1 || die "curl is required (apt-get install curl)"
  ensure_installed
  local attempt
  for attempt in 1 2 3; do
    port="$(free_port)"
    # setsid: the server outlives this script and is not in the caller's process group (Ctrl-C, test
    # harnesses). A background job is no group leader, so setsid execs in place: $! is the server's pid.
    setsid "$PYTHON" -m moto.server -H "$HOST" -p "$port" >"$LOG_FILE" 2>&1 </dev/null &
    pid=$!
    echo "$pid" >"$PID_FILE"
    echo "$port" >"$PORT_FILE"
    local deadline=$((SECONDS + START_TIMEOUT))
    while [ $SECONDS -lt $deadline ]; do
      if ! kill -0 "$pid" 2>/dev/null; then
        break # died (e.g. the port was taken meanwhile): try another port
      fi
      if answers "$port"; then
        print_env "$port"
        return 0
      fi
      sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
      kill -9 "$pid" 2>/dev/null || true
      rm -f "$PID_FILE" "$PORT_FILE"
      die "moto_server on port $port did not answer within ${START_TIMEOUT}s (attempt $attempt); log: $(tail -5 "$LOG_FILE" 2>/dev/null)"
    fi
    echo "s3-server: moto_server on port $port exited at start (attempt $attempt): $(tail -3 "$LOG_FILE" 2>/dev/null)" >&2
  done
  rm -f "$PID_FILE" "$PORT_FILE"
  die "moto_server did not start; log $LOG_FILE"
}

stop() {
  local pid
  pid="$(running_pid)"
  if [ -n "$pid" ]; then
    kill -CONT "$pid" 2>/dev/null || true # a stopped server cannot act on SIGTERM
    kill -TERM "$pid" 2>/dev/null || true
    local deadline=$((SECONDS + STOP_TIMEOUT))
    while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $deadline ]; do
      sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
      kill -KILL "$pid" 2>/dev/null || true
      sleep 0.2
    fi
  fi
  rm -f "$PID_FILE" "$PORT_FILE"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  env)
    pid="$(running_pid)"
    [ -n "$pid" ] || die "no server runs for state dir $STATE_DIR (run: $0 start)"
    print_env "$(cat "$PORT_FILE")"
    ;;
  status)
    pid="$(running_pid)"
    if [ -z "$pid" ] || ! answers "$(cat "$PORT_FILE")"; then
      die "no answering server for state dir $STATE_DIR"
    fi
    echo "s3-server: pid $pid, http://$HOST:$(cat "$PORT_FILE")"
    ;;
  *)
    echo "usage: $0 start|stop|env|status   (state dir: \$S3_STATE_DIR, default /tmp/larder-s3)" >&2
    exit 2
    ;;
esac
