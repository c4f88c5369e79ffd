#!/usr/bin/env bash
# The official `openai` npm package against hyflow-serve --tiny (tests/serve/openai_client.mjs).
# The package is installed from npm into a cache folder ($HYFLOW_NPM_CACHE, default
# ~/.cache/hyflow-npm). Exit 77 (skipped, with the reason) without node/npm or when the npm
# registry is unreachable; under CI=true a missing node/npm fails, and an install failure with a
# reachable registry always fails.
# Usage: openai_npm.sh <hyflow-serve> <openai_client.mjs>
here=$(cd "$(dirname "$0")" && pwd)
source "$here/serve_common.sh"
source "$here/../common/openai_npm.sh"
serve_bin=$1
client=$2

install_openai_npm "$work"

echo "test-key-$$" >"$work/key"
start_serve "$serve_bin" --api-key-file "$work/key" --max-positions 2048
OPENAI_MODULE_DIR="$openai_module" HYFLOW_BASE_URL="$base/v1" HYFLOW_API_KEY="test-key-$$" \
  timeout 120 node "$client"
