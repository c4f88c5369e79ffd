#!/usr/bin/env bash
# hyflow-serve's router from outside, with curl: --replicas 2 serves two engine loops behind a
# router (a session stays on one replica, /health lists both), and --route puts a router of its
# own in front of that one's URL (answers pass through; a replica that is gone is a 503 naming it).
# Usage: router_cli.sh <hyflow-serve>
here=$(cd "$(dirname "$0")" && pwd)
source "$here/serve_common.sh"
serve_bin=$1
command -v curl >/dev/null || { echo "FAIL: curl is required" >&2; exit 1; }

fail() { echo "FAIL: $*" >&2; cat "$work/serve.log" >&2; exit 1; }
status() { curl -s -o "$work/body" -w '%{http_code}' --max-time 20 "$@"; }
json=(-H "Content-Type: application/json")
body='{"prompt": [40, 41, 42], "max_tokens": 6, "temperature": 0, "return_token_ids": true}'

start_serve "$serve_bin" --replicas 2
grep -q "on 2 replicas behind http://127.0.0.1:$port/v1" "$work/serve.log" || fail "no router line in the log"
[ "$(status "$base/health")" = 200 ] || fail "health: expected 200"
[ "$(grep -o '"url"' "$work/body" | wc -l)" = 2 ] || fail "health does not list 2 replicas: $(cat "$work/body")"
for _ in 1 2 3; do
  [ "$(status "${json[@]}" -H "X-Session-Id: ep-1" -d "$body" "$base/v1/completions")" = 200 ] || fail "completion"
  cp "$work/body" "$work/last"
done
grep -q '"token_ids"' "$work/last" || fail "no token ids through the router: $(cat "$work/last")"
[ "$(status "$base/v1/models")" = 200 ] || fail "models: expected 200"
grep -q '"hyflow-tiny"' "$work/body" || fail "models: $(cat "$work/body")"

# a router of its own in front of the first one, then in front of a port nobody listens on
"$serve_bin" --route "$base/v1" --port 0 --port-file "$work/route_port" >"$work/route.log" 2>&1 &
route_pid=$!
for _ in $(seq 1 100); do [ -s "$work/route_port" ] && break; sleep 0.1; done
route="http://127.0.0.1:$(cat "$work/route_port")"
[ "$(status "${json[@]}" -d "$body" "$route/v1/completions")" = 200 ] || fail "--route: expected 200"
cmp -s <(grep -o '"token_ids":\[[0-9,]*\]' "$work/body") <(grep -o '"token_ids":\[[0-9,]*\]' "$work/last") ||
  fail "--route changed the answer"
kill "$route_pid"; wait "$route_pid" 2>/dev/null || true

kill "$serve_pid"; wait "$serve_pid" 2>/dev/null || true
serve_pid=""
"$serve_bin" --route "$base/v1" --port 0 --port-file "$work/gone_port" >"$work/gone.log" 2>&1 &
serve_pid=$!
for _ in $(seq 1 100); do [ -s "$work/gone_port" ] && break; sleep 0.1; done
gone="http://127.0.0.1:$(cat "$work/gone_port")"
[ "$(status "${json[@]}" -d "$body" "$gone/v1/completions")" = 503 ] || fail "a replica down: expected 503"
grep -q "replica $base/v1 is unavailable" "$work/body" || fail "the 503 does not name the replica: $(cat "$work/body")"
echo "router_cli: ok"
