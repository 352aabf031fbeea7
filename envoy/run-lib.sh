# Shared by run-demo.sh (make run) and run-cluster.sh (make run-cluster): port checks, the PIDs
# they started and stop on exit, and polling. Sourced, not run; expects $LOGS.

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Exits with a message if any of the given ports is taken; $1 names what may hold them.
require_free_ports() {
  local hint=$1 port; shift
  for port in "$@"; do
    if port_busy "$port"; then
      echo "port 127.0.0.1:$port is already in use: stop what runs there ($hint?)" >&2
      exit 1
    fi
  done
}

# What this script started: stopped (only those) on Ctrl-C, on error and on exit.
pids=()
stop_all() {
  trap - INT TERM EXIT
  echo "stopping: ${pids[*]}"
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap stop_all INT TERM EXIT

# Polls until $3... (a command) succeeds, for up to $2 seconds; $1 says what for.
wait_until() {
  local what=$1 seconds=$2; shift 2
  for _ in $(seq $((seconds * 20))); do "$@" && return 0; sleep 0.05; done
  echo "gave up waiting for $what (logs in $LOGS)" >&2
  exit 1
}
