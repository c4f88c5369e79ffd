#!/usr/bin/env bash
# The JavaScript example agent (examples/agents/calculator_agent.mjs, the official `openai` npm
# client) run by agents::ExternalAgentRunner against an in-process server: test_agents_external's
# hidden "[npm]" case with the package installed into $HYFLOW_NPM_CACHE (as tests/serve/openai_npm.sh).
# Exit 77 (skipped, with the reason) without node/npm or when the npm registry is unreachable;
# under CI=true a missing node/npm fails, and an install failure with a reachable registry always fails.
# Usage: external_agent_npm.sh <test_agents_external>
set -euo pipefail
source "$(cd "$(dirname "$0")" && pwd)/../common/openai_npm.sh"
test_bin=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

install_openai_npm "$work"
OPENAI_MODULE_DIR="$openai_module" "$test_bin" "[npm]"
