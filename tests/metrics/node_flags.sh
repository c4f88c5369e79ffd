#!/usr/bin/env bash
# caf-node's metrics flags: no endpoint by default; --metrics-bind other than loopback without
# --metrics-token-file refuses to start (exit 2); with a token file every scrape needs the token.
# A controller with the wrong secret shows in hyflow_node_auth_failures_total.
# Usage: node_flags.sh NODE_BIN CONTROLLER_BIN
source "$(dirname "$0")/metrics_fixture.sh"
[ $# = 2 ] || fail "usage: $0 NODE_BIN CONTROLLER_BIN"

set +e
"$1" --metrics-port 9 --metrics-bind 0.0.0.0 --exit-with-parent >"$TMP/refused.out" 2>"$TMP/refused.log"
rc=$?
set -e
[ $rc = 2 ] || fail "--metrics-bind 0.0.0.0 without a token: exit $rc, expected 2"
grep -q 'needs --metrics-token-file' "$TMP/refused.log" || fail "no reason given: $(cat "$TMP/refused.log")"
echo "refused: $(cat "$TMP/refused.log")"

"$1" --port 0 --exit-with-parent >"$TMP/plain.out" 2>"$TMP/plain.log" &
PIDS+=($!)
wait_for "$TMP/plain.out" 'listening on' 20 $! >/dev/null
! grep -q 'metrics on' "$TMP/plain.log" || fail "a node without --metrics-port serves metrics"

echo "token-$$" >"$TMP/token"
port=$(free_port)
"$1" --port 0 --secret-file "$SECRET_FILE" --metrics-port "$port" --metrics-token-file "$TMP/token" \
  --exit-with-parent >"$TMP/node.out" 2>"$TMP/node.log" &
PIDS+=($!)
wait_for "$TMP/node.log" 'metrics on http://127\.0\.0\.1:[0-9]+/metrics \(bearer token required\)' 20 $! >/dev/null
address=$(wait_for "$TMP/node.out" '127\.0\.0\.1:[0-9]+' 5)
echo "not the secret" >"$TMP/wrong_secret"
if "$2" "$TMP/wrong_secret" "$address" </dev/null >"$TMP/intruder.out" 2>"$TMP/intruder.log"; then
  fail "a controller with the wrong secret was served"
fi
python3 - "$port" "token-$$" <<'PY'
import sys, urllib.request, urllib.error
url = "http://127.0.0.1:%s/metrics" % sys.argv[1]
def status(headers):
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, ""
assert status({})[0] == 401, status({})
assert status({"Authorization": "Bearer wrong"})[0] == 401
code, body = status({"Authorization": "Bearer " + sys.argv[2]})
assert code == 200 and "hyflow_node_workers_alive 0\n" in body, (code, body[:300])
assert 'hyflow_node_auth_failures_total{plane="front_door"} 1\n' in body, body
print("token: 401 without or with a wrong token, 200 with it; the wrong secret counted once")
PY
