#!/usr/bin/env bash
# Runs every benchmark (each executable under <build>/bench) and writes their JSON
# lines to bench/results.jsonl (one object per figure, design brief §5).
# Usage: bench/run.sh [build-dir]      (builds first if needed; default build/)
# cuda/cuda_kernels_bench measures GPU figures only in a -DHYFLOW_CUDA=ON build with a CUDA
# LibTorch and a device (docs/gpu.md); elsewhere it prints {"bench":"cuda_kernels_gpu","skipped":...}.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
[ -d "$build/bench" ] || scripts/build.sh "$build"
out=bench/results.jsonl
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
found=0
while IFS= read -r b; do
  found=1
  echo "bench/run.sh: $b" >&2
  "$b" | tee -a "$tmp"
done < <(find "$build/bench" -type f -executable -not -path '*/CMakeFiles/*' | sort)
[ "$found" = 1 ] || { echo "bench/run.sh: no benchmark executables under $build/bench" >&2; exit 1; }
{
  echo "{\"bench\": \"_meta\", \"host\": \"$(hostname)\", \"cores\": $(nproc --all), \"date\": \"$(date -u +%FT%TZ)\", \"commit\": \"$(git rev-parse --short HEAD 2>/dev/null || echo unknown)\"}"
  cat "$tmp"
} > "$out"
echo "bench/run.sh: wrote $(wc -l < "$out") lines to $out" >&2
