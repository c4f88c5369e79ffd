# Sourced by the hyflow-serve script tests: start_serve <hyflow-serve> <args...> starts the
# server on a free loopback port in $work (a temp folder removed on exit) and sets $port and
# $base; the server is stopped on exit.
set -euo pipefail
work=$(mktemp -d)
serve_pid=""
cleanup() {
  if [ -n "$serve_pid" ]; then kill "$serve_pid" 2>/dev/null || true; wait "$serve_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

start_serve() {
  local bin=$1
  shift
  "$bin" --tiny --port 0 --port-file "$work/port" "$@" >"$work/serve.log" 2>&1 &
  serve_pid=$!
  for _ in $(seq 1 300); do
    [ -s "$work/port" ] && break
    kill -0 "$serve_pid" 2>/dev/null || { cat "$work/serve.log"; echo "hyflow-serve exited early" >&2; exit 1; }
    sleep 0.1
  done
  [ -s "$work/port" ] || { cat "$work/serve.log"; echo "hyflow-serve did not start within 30 s" >&2; exit 1; }
  port=$(cat "$work/port")
  base="http://127.0.0.1:$port"
}
