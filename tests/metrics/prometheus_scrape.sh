#!/usr/bin/env bash
# End to end with Debian's Prometheus server: two caf-nodes with --metrics-port on 127.0.0.1, a
# controller running calls on both, and `prometheus` scraping both /metrics every second; the
# query API must then return hyflow_node_calls_total of both nodes with a value. Bounded: the
# query loop gives up 50 s after the start (about 10 s when all goes well); every process it
# started is stopped on every exit path, a kill -9 of the script included.
# Usage: prometheus_scrape.sh NODE_BIN CONTROLLER_BIN
source "$(dirname "$0")/metrics_fixture.sh"
[ $# = 2 ] || fail "usage: $0 NODE_BIN CONTROLLER_BIN"
need prometheus
deadline=$((SECONDS + 50))

port_a=$(free_port)
port_b=$(free_port)
start_node "$1" node_a "$port_a"
address_a=$NODE_ADDRESS
start_node "$1" node_b "$port_b"
start_controller "$2" "$address_a" "$NODE_ADDRESS"

cat >"$TMP/prometheus.yml" <<YML
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: caf-node
    static_configs:
      - targets: ['127.0.0.1:$port_a', '127.0.0.1:$port_b']
YML
web=$(free_port)
prometheus --config.file="$TMP/prometheus.yml" --storage.tsdb.path="$TMP/tsdb" \
  --web.listen-address="127.0.0.1:$web" >"$TMP/prometheus.log" 2>&1 &
PIDS+=($!)
guard $!

query='sum by (instance) (hyflow_node_calls_total{job="caf-node",outcome="ok"})'
url="http://127.0.0.1:$web/api/v1/query?query=$(python3 -c 'import sys, urllib.parse; print(urllib.parse.quote(sys.argv[1]))' "$query")"
while [ $SECONDS -lt $deadline ]; do
  if answer=$(http_get "$url" 2>/dev/null) &&
    python3 - "$answer" <<'PY'; then
import json, sys
a = json.loads(sys.argv[1])
r = a["data"]["result"] if a.get("status") == "success" else []
sys.exit(0 if len(r) == 2 and all(float(s["value"][1]) > 0 for s in r) else 1)
PY
    echo "prometheus: $query -> $answer"
    exit 0
  fi
  sleep 0.5
done
fail "prometheus returned no hyflow_node_calls_total of both nodes in time (last answer: ${answer:-none})"
