#!/usr/bin/env bash
# Redis Cluster mode of the demo, in the foreground: six Redis nodes (masters 7000-7002, one
# replica each on 7003-7005) made into one cluster, Envoy with envoy/cluster/envoy.yaml (the
# rate-limited listener, and a redis_proxy on 127.0.0.1:6380 that routes each command to the
# master of its key's slot), and Webdis pointed at that proxy. Ctrl-C stops all of them (and
# only them). Run through `make run-cluster`, which installs and builds first.
set -euo pipefail
cd "$(dirname "$0")/.."

ENVOY_BIN=${ENVOY_BIN:-.venv/bin/envoy-bin}
MASTERS=(7000 7001 7002) REPLICAS=(7003 7004 7005)
NODES=("${MASTERS[@]}" "${REPLICAS[@]}")
PROXY_PORT=6380 WEBDIS_PORT=7379 LISTEN_PORT=10000 ADMIN_PORT=9901
# The admin user of envoy/cluster/redis-node.conf (redis-cli reads the password from the
# environment, so it is not on a command line).
export REDISCLI_AUTH=admin-demo-secret
admin_cli() { redis-cli --user admin "$@"; }
LOGS=target/run-cluster
# Each node keeps its cluster state (nodes.conf) in its own directory: start from none, so a
# new cluster is made every time.
rm -rf "$LOGS"
mkdir -p "$LOGS"

source envoy/run-lib.sh
bus_ports=()  # a node's cluster bus listens on its port + 10000
for port in "${NODES[@]}"; do bus_ports+=($((port + 10000))); done
require_free_ports "a previous 'make run-cluster' or 'make run'" \
  "${NODES[@]}" "${bus_ports[@]}" $PROXY_PORT $WEBDIS_PORT $LISTEN_PORT $ADMIN_PORT

# Under pipefail a pipe into grep -q can fail although the text matched (grep exits at the
# first match, the writer may then die of SIGPIPE): capture first, then match.
cluster_ok() {
  local info
  info=$(admin_cli -p "$1" CLUSTER INFO 2>/dev/null) || return 1
  grep -q '^cluster_state:ok' <<<"$info"
}
all_ok() {
  local port info
  for port in "${NODES[@]}"; do cluster_ok "$port" || return 1; done
  for port in "${REPLICAS[@]}"; do
    info=$(admin_cli -p "$port" INFO replication 2>/dev/null) || return 1
    grep -q '^master_link_status:up' <<<"$info" || return 1
  done
}
envoy_live() { [ "$(curl -s "http://127.0.0.1:$ADMIN_PORT/ready" 2>/dev/null)" = LIVE ]; }

started=$SECONDS
for port in "${NODES[@]}"; do
  mkdir -p "$LOGS/$port"
  redis-server envoy/cluster/redis-node.conf --port "$port" --dir "$LOGS/$port" >"$LOGS/$port/redis.log" 2>&1 &
  pids+=($!)
done
for port in "${NODES[@]}"; do wait_until "redis on :$port" 10 port_busy "$port"; done
nodes=()
for port in "${NODES[@]}"; do nodes+=("127.0.0.1:$port"); done
# The first three given become masters; each of the others a replica of one of them.
admin_cli --cluster create "${nodes[@]}" --cluster-replicas 1 --cluster-yes >"$LOGS/create.log" 2>&1 || {
  echo "redis-cli --cluster create failed:" >&2
  tail -20 "$LOGS/create.log" >&2
  exit 1
}
wait_until "cluster_state:ok on every node and every replica in sync" 30 all_ok
echo "redis    cluster on 127.0.0.1: masters ${MASTERS[*]}, replicas ${REPLICAS[*]}  (cluster ready in $((SECONDS - started)) s; logs $LOGS/<port>/redis.log)"

# Envoy first: Webdis logs in to its redis_proxy listener.
if command -v func-e >/dev/null; then
  ENVOY_PATH="$ENVOY_BIN" func-e run -c envoy/cluster/envoy.yaml >"$LOGS/envoy.log" 2>&1 &
else
  "$ENVOY_BIN" -c envoy/cluster/envoy.yaml >"$LOGS/envoy.log" 2>&1 &
fi
pids+=($!)
envoy_pid=$!
wait_until "envoy to be LIVE on admin :$ADMIN_PORT" 30 envoy_live
echo "proxy    127.0.0.1:$PROXY_PORT  (Envoy redis_proxy -> the cluster)"

webdis envoy/cluster/webdis.json 2>"$LOGS/webdis.log" &
pids+=($!)
wait_until "webdis on :$WEBDIS_PORT" 10 port_busy $WEBDIS_PORT
echo "webdis   127.0.0.1:$WEBDIS_PORT  (log $LOGS/webdis.log)"

echo "envoy    127.0.0.1:$LISTEN_PORT, admin 127.0.0.1:$ADMIN_PORT  (log $LOGS/envoy.log)"
echo "try:     curl -i -H 'x-api-key: demo' http://127.0.0.1:$LISTEN_PORT/   (10 pass, then 429)"
echo "cluster: REDISCLI_AUTH=admin-demo-secret redis-cli --user admin -p ${MASTERS[0]} CLUSTER NODES"
echo "         (kill a master's redis-server: its replica takes over in about 5 s)"
echo "metrics: curl -s http://127.0.0.1:$ADMIN_PORT/stats/prometheus | grep ^ratelimit   (Prometheus format)"
echo "         curl -s 'http://127.0.0.1:$ADMIN_PORT/stats?filter=redis'                  (the proxy and the cluster)"
echo "Ctrl-C stops everything."
wait "$envoy_pid"
