#!/usr/bin/env bash
# The official `openai` npm package against hyflow-serve --tiny (tests/serve/openai_client.mjs).
# The package is installed from npm into a cache folder ($HYFLOW_NPM_CACHE, default
# ~/.cache/hyflow-npm). Exit 77 (skipped, with the reason) without node/npm or when the npm
# registry is unreachable; under CI=true a missing node/npm fails, and an install failure with a
# reachable registry always fails.
# Usage: openai_npm.sh <hyflow-serve> <openai_client.mjs>
here=$(cd "$(dirname "$0")" && pwd)
source "$here/serve_common.sh"
serve_bin=$1
client=$2

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  if [ "${CI:-}" = "true" ]; then echo "FAIL: node and npm are required under CI=true" >&2; exit 1; fi
  echo "SKIPPED: node or npm is not installed"
  exit 77
fi
cache=${HYFLOW_NPM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hyflow-npm}
mkdir -p "$cache"
if [ ! -f "$cache/node_modules/openai/package.json" ]; then
  if ! timeout 120 npm install --prefix "$cache" --no-audit --no-fund --loglevel=error openai@4 >"$work/npm.log" 2>&1; then
    if ! timeout 20 npm ping >"$work/ping.log" 2>&1; then
      echo "SKIPPED: the npm registry is unreachable ($(tail -1 "$work/ping.log"))"
      exit 77
    fi
    cat "$work/npm.log" >&2
    echo "FAIL: npm install openai failed although the registry answers" >&2
    exit 1
  fi
fi
echo "openai package $(node -p "require('$cache/node_modules/openai/package.json').version")"

echo "test-key-$$" >"$work/key"
start_serve "$serve_bin" --api-key-file "$work/key" --max-positions 2048
OPENAI_MODULE_DIR="$cache/node_modules/openai" HYFLOW_BASE_URL="$base/v1" HYFLOW_API_KEY="test-key-$$" \
  timeout 120 node "$client"
