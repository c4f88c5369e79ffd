#!/usr/bin/env bash
# The JavaScript example agent (examples/agents/calculator_agent.mjs, the official `openai` npm
# client) run by agents::ExternalAgentRunner against an in-process server: test_agents_external's
# hidden "[npm]" case with the package installed into $HYFLOW_NPM_CACHE (as tests/serve/openai_npm.sh).
# Exit 77 (skipped, with the reason) without node/npm or when the npm registry is unreachable;
# under CI=true a missing node/npm fails, and an install failure with a reachable registry always fails.
# Usage: external_agent_npm.sh <test_agents_external>
set -euo pipefail
test_bin=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

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
OPENAI_MODULE_DIR="$cache/node_modules/openai" "$test_bin" "[npm]"
