#!/usr/bin/env bash
# Starts Redis, Webdis and Envoy with the shipped configs, in the foreground. Ctrl-C stops all
# three (and only them). Run through `make run`, which installs and builds first.
set -euo pipefail
cd "$(dirname "$0")/.."

ENVOY_BIN=${ENVOY_BIN:-.venv/bin/envoy-bin}
REDIS_PORT=6379 WEBDIS_PORT=7379 LISTEN_PORT=10000 ADMIN_PORT=9901
LOGS=target/run
mkdir -p "$LOGS"

source envoy/run-lib.sh
require_free_ports "another redis-server or a previous 'make run'" \
  $REDIS_PORT $WEBDIS_PORT $LISTEN_PORT $ADMIN_PORT

redis-server envoy/redis.conf --dir "$LOGS" >"$LOGS/redis.log" 2>&1 &
pids+=($!)
wait_until "redis on :$REDIS_PORT" 10 port_busy $REDIS_PORT
echo "redis    127.0.0.1:$REDIS_PORT  (log $LOGS/redis.log)"

webdis envoy/webdis.json 2>"$LOGS/webdis.log" &
pids+=($!)
wait_until "webdis on :$WEBDIS_PORT" 10 port_busy $WEBDIS_PORT
echo "webdis   127.0.0.1:$WEBDIS_PORT  (log $LOGS/webdis.log)"

echo "envoy    127.0.0.1:$LISTEN_PORT, admin 127.0.0.1:$ADMIN_PORT"
echo "try:     curl -i -H 'x-api-key: demo' http://127.0.0.1:$LISTEN_PORT/   (10 pass, then 429)"
echo "metrics: curl -s http://127.0.0.1:$ADMIN_PORT/stats/prometheus | grep ^ratelimit   (Prometheus format)"
echo "         curl -s 'http://127.0.0.1:$ADMIN_PORT/stats?filter=ratelimit'              (Envoy's own format)"
echo "alerts:  prometheus --config.file=envoy/prometheus/prometheus.yml --storage.tsdb.path=$LOGS/prometheus"
echo "         scrapes it every 5 s with the shipped alert rules (envoy/prometheus/rules.yml); see docs/operations.md"
echo "Ctrl-C stops everything."
if command -v func-e >/dev/null; then
  ENVOY_PATH="$ENVOY_BIN" func-e run -c envoy/envoy.yaml &
else
  "$ENVOY_BIN" -c envoy/envoy.yaml &
fi
pids+=($!)
wait "${pids[-1]}"
