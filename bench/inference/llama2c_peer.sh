#!/usr/bin/env bash
# The bf16 decode engine side by side with karpathy/llama2.c's run.c (issue 32): builds run.c the way
# llama2.c's Makefile builds its fast single-thread binary (gcc -Ofast, plus -march=native, no OpenMP),
# then runs decode_bench --case bf16 with it as the batch-1 peer on the same weights.
# llama2.c is not part of this repository: point at a checkout (or a folder holding its run.c).
# Usage: bench/inference/llama2c_peer.sh [llama2c-dir] [build-dir] [decode_bench options, e.g. --quick]
#        (llama2c-dir defaults to $LLAMA2C_DIR; build-dir to build/; the checkpoints, 168 MB at 42M and
#        440 MB at 110M, and the tokenizer go to $LLAMA2C_WORK, default a temporary folder removed after;
#        $LLAMA2C_CFLAGS replaces "-Ofast -march=native", e.g. "-Ofast" for the Makefile's `runfast` as is)
set -euo pipefail
cd "$(dirname "$0")/../.."
src=${1:-${LLAMA2C_DIR:-}}
build=${2:-build}
shift $(($# < 2 ? $# : 2))
if [ -z "$src" ] || [ ! -f "$src/run.c" ]; then
  echo "llama2c_peer.sh: no run.c in '$src' (give llama2.c's folder or set LLAMA2C_DIR)" >&2
  exit 2
fi
bench=$build/bench/inference/decode_bench
[ -x "$bench" ] || { echo "llama2c_peer.sh: $bench missing (ninja -C $build decode_bench)" >&2; exit 2; }
work=${LLAMA2C_WORK:-}
if [ -z "$work" ]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
fi
mkdir -p "$work"
# shellcheck disable=SC2086  # word splitting of the flags is meant
gcc ${LLAMA2C_CFLAGS:--Ofast -march=native} -o "$work/run" "$src/run.c" -lm
echo "llama2c_peer.sh: load before the run: $(uptime)" >&2
"$bench" --case bf16 --llama2c "$work/run" --llama2c-dir "$work" "$@"
echo "llama2c_peer.sh: load after the run: $(uptime)" >&2
