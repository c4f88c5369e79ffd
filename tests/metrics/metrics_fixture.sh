# Shared by the metrics scripts (sourced): temp folder, cleanup of every started process on any
# exit, free ports, HTTP GET, caf-nodes with metrics and the controller that keeps them busy.
# Tools that a fresh machine gets from scripts/install-deps.sh: a missing one fails under CI=true
# and skips (exit 77) elsewhere.

set -euo pipefail
TMP=$(mktemp -d "${TMPDIR:-/tmp}/hyflow-metrics.XXXXXX")
PIDS=()
CONTROLLER_FD_OPEN=0

cleanup() {
  local rc=$?
  if [ "$CONTROLLER_FD_OPEN" = 1 ]; then exec 7>&- || true; fi
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  if [ "$rc" != 0 ] && [ "$rc" != 77 ]; then
    for f in "$TMP"/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -n 30 "$f"; }; done
  fi
  rm -rf "$TMP"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

fail() { echo "FAIL: $*" >&2; exit 1; }

# guard PID: stops PID when this script ends without its cleanup (killed by a test timeout);
# the nodes have --exit-with-parent and the controller stops at the end of its stdin already.
guard() {
  (
    while kill -0 $$ 2>/dev/null; do sleep 0.5; done
    kill -KILL "$1" 2>/dev/null
  ) &
  PIDS+=($!)
}

# need TOOL: the tool's path; exit 1 (CI=true) or 77 (skipped) when it is not installed.
need() {
  if command -v "$1" >/dev/null 2>&1; then return 0; fi
  if [ "${CI:-}" = true ]; then fail "$1 is not installed (scripts/install-deps.sh installs the prometheus package)"; fi
  echo "SKIP: $1 is not installed (scripts/install-deps.sh installs the prometheus package)"
  exit 77
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# http_get URL: the body of a 200 answer on stdout; fails on another status or after 5 s.
http_get() {
  python3 - "$1" <<'PY'
import sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=5) as r:
    sys.stdout.write(r.read().decode())
PY
}

# wait_for FILE REGEX SECONDS [PID]: the first match of REGEX (grep -o) in FILE, waiting up to
# SECONDS (and failing at once when process PID, the one writing FILE, has ended).
wait_for() {
  local end=$((SECONDS + $3)) found
  while [ $SECONDS -lt $end ]; do
    found=$(grep -o -m1 -E "$2" "$1" 2>/dev/null || true)
    if [ -n "$found" ]; then echo "$found"; return 0; fi
    if [ -n "${4:-}" ] && ! kill -0 "$4" 2>/dev/null; then fail "process $4 ended before '$2' appeared in $1"; fi
    sleep 0.1
  done
  fail "no '$2' in $1 after $3 s"
}

SECRET_FILE="$TMP/secret"
echo "metrics-test-secret-$$" >"$SECRET_FILE"

# start_node NODE_BIN NAME METRICS_PORT: starts a caf-node on a free port; sets NODE_ADDRESS.
start_node() {
  "$1" --bind 127.0.0.1 --port 0 --secret-file "$SECRET_FILE" --metrics-port "$3" --exit-with-parent \
    >"$TMP/$2.out" 2>"$TMP/$2.log" &
  PIDS+=($!)
  NODE_ADDRESS=$(wait_for "$TMP/$2.out" '127\.0\.0\.1:[0-9]+' 20 $!)
  wait_for "$TMP/$2.log" 'metrics on http://' 5 $! >/dev/null
}

# start_controller CONTROLLER_BIN ADDRESS...: connects, runs its calls, holds the connections
# until the script ends (its stdin is fd 7 of this shell).
start_controller() {
  local bin=$1
  shift
  mkfifo "$TMP/controller.in"
  "$bin" "$SECRET_FILE" "$@" <"$TMP/controller.in" >"$TMP/controller.out" 2>"$TMP/controller.log" &
  PIDS+=($!)
  exec 7>"$TMP/controller.in"
  CONTROLLER_FD_OPEN=1
  wait_for "$TMP/controller.out" 'controller ready' 40 $! >/dev/null
}
