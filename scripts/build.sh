#!/usr/bin/env bash
# Configures and builds hyflow into a build directory (default: build/, Release with
# assertions). Extra arguments go to CMake's configure step.
# Usage: scripts/build.sh [build-dir] [-DOPTION=VALUE ...]
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=build
if [ $# -gt 0 ] && [[ "$1" != -* ]]; then build_dir=$1; shift; fi
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
cmake -S . -B "$build_dir" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
# 2 cores and ~0.5-1.2 GB per torch translation unit: one job per core.
cmake --build "$build_dir" -j "$(nproc)"
