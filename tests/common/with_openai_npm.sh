#!/usr/bin/env bash
# Runs a test's hidden "[npm]" case with the official `openai` npm package installed into
# $HYFLOW_NPM_CACHE (install_openai_npm, tests/common/openai_npm.sh) and OPENAI_MODULE_DIR set to it.
# Exit 77 (skipped, with the reason) without node/npm or when the npm registry is unreachable; under
# CI=true a missing node/npm fails, and an install failure with a reachable registry always fails.
# Usage: with_openai_npm.sh COMMAND [ARGS...]   (e.g. env VAR=VALUE ... test_binary "[npm]")
set -euo pipefail
source "$(cd "$(dirname "$0")" && pwd)/openai_npm.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

install_openai_npm "$work"
OPENAI_MODULE_DIR="$openai_module" "$@"
