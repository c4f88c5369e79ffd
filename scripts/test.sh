#!/usr/bin/env bash
# The whole test suite from a clean clone: dependencies, Release build with assertions,
# every CTest test; then the unit tests again under address+undefined sanitizers.
# Set HYFLOW_SKIP_SANITIZE=1 to skip the sanitizer pass.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
scripts/install-deps.sh
scripts/build.sh build
ctest --test-dir build --output-on-failure --no-tests=error -j "$(nproc)"
echo "test.sh: Release suite passed after $(( $(date +%s) - start )) s"

if [ "${HYFLOW_SKIP_SANITIZE:-0}" != 1 ]; then
  # Only the unit-labelled tests: they are the ones that exercise parsers and containers.
  scripts/build.sh build-asan -DHYFLOW_SANITIZE=address,undefined \
    -DHYFLOW_BUILD_BENCH=OFF -DHYFLOW_BUILD_APPS=OFF
  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build-asan --output-on-failure --no-tests=error -L sanitize -j "$(nproc)"
  echo "test.sh: sanitizer suite passed after $(( $(date +%s) - start )) s"
fi
