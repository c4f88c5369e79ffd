#!/bin/sh
# Runs an example against a caf-node of its own: starts CAF_NODE on a free loopback port with the
# worker plugin, passes the node's address to the example, stops the node afterwards.
# Usage: with_caf_node.sh CAF_NODE PLUGIN EXAMPLE
set -u
node=$1 plugin=$2 example=$3
out=$(mktemp)
"$node" --port=0 --bind=127.0.0.1 --plugin="$plugin" > "$out" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -f "$out"' EXIT
i=0
until grep -q "listening on" "$out"; do
  kill -0 $pid 2>/dev/null || { echo "caf-node exited before listening"; exit 1; }
  i=$((i + 1))
  [ $i -le 200 ] || { echo "caf-node did not listen within 20 s"; exit 1; }
  sleep 0.1
done
addr=$(sed -n 's/.*listening on \([0-9.]*:[0-9]*\).*/\1/p' "$out")
"$example" "$addr"
