#!/usr/bin/env bash
# promtool accepts the exposition of both exporters: the trainer's "prometheus" tracker after an
# async PPO step (metrics_trainer_dump) and a caf-node serving a controller's calls, each
# scraped over HTTP. `promtool check metrics` must exit 0: no format error and no lint remark.
# Usage: promtool_check.sh NODE_BIN CONTROLLER_BIN TRAINER_DUMP_BIN
source "$(dirname "$0")/metrics_fixture.sh"
[ $# = 3 ] || fail "usage: $0 NODE_BIN CONTROLLER_BIN TRAINER_DUMP_BIN"
need promtool

check() {  # check NAME FILE SERIES-REGEX...
  local name=$1 file=$2
  shift 2
  promtool check metrics <"$file" || fail "promtool rejects the $name exposition ($file above)"
  for series in "$@"; do grep -qE "$series" "$file" || fail "the $name exposition lacks /$series/"; done
  echo "promtool: $name exposition OK ($(grep -c '^# TYPE' "$file") families, $(grep -vc '^#' "$file") series)"
}

"$3" >"$TMP/trainer.prom" 2>"$TMP/trainer.log" || fail "metrics_trainer_dump failed"
check trainer "$TMP/trainer.prom" '^hyflow_trainer_step 7$' '^hyflow_trainer_phase_seconds\{phase="gen"\} 1.5$' \
  '^hyflow_trainer_trajectory_staleness_steps\{stat="mean"\} 0.5$' '^process_resident_memory_bytes [0-9]'

port=$(free_port)
start_node "$1" node "$port"
start_controller "$2" "$NODE_ADDRESS"
http_get "http://127.0.0.1:$port/metrics" >"$TMP/node.prom" || fail "cannot scrape the node"
check node "$TMP/node.prom" '^hyflow_node_workers_alive 1$' '^hyflow_node_calls_total\{outcome="ok"\} [1-9]' \
  '^hyflow_node_peer_heartbeat_age_seconds\{peer="127\.0\.0\.1:[0-9]+"\} ' \
  '^hyflow_node_data_plane_received_bytes_total [1-9]' '^hyflow_node_data_plane_sent_bytes_total [1-9]' \
  '^hyflow_node_auth_failures_total\{plane="front_door"\} 0$' '^process_resident_memory_bytes [0-9]'
