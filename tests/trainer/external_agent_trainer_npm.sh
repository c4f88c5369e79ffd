#!/usr/bin/env bash
# GRPO on the sessions of the JavaScript example agent (examples/agents/calculator_agent.mjs, the
# official `openai` npm client): test_trainer_external_agent's hidden "[npm]" case with the package
# installed into $HYFLOW_NPM_CACHE (tests/common/openai_npm.sh). Exit 77 (skipped, with the reason)
# without node/npm or when the npm registry is unreachable; under CI=true a missing node/npm fails.
# Usage: external_agent_trainer_npm.sh <test_trainer_external_agent>
set -euo pipefail
source "$(cd "$(dirname "$0")" && pwd)/../common/openai_npm.sh"
test_bin=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

install_openai_npm "$work"
OPENAI_MODULE_DIR="$openai_module" AGENT_MAX_TURNS=2 AGENT_MAX_TOKENS=16 "$test_bin" "[npm]"
