#!/usr/bin/env bash
# The main job: installs dependencies, builds hyflow, warms up the built-in tiny char-level
# model by SFT on the synthetic arithmetic task (400 steps, config/sft_arithmetic.ini), then
# trains it with GRPO (hyflow-grpo, config/grpo_arithmetic.ini: 2000 steps) on 2 in-process
# workers and plots the run's metrics (scripts/hyflow-plot: main-job.png and main-job.svg).
# Goal: >= 0.8 greedy accuracy on the 512 held-out problems within 10 minutes on 2 cores once
# the build is done.
# Nothing is downloaded besides what install-deps.sh installs.
# Usage: scripts/main-job.sh [output-dir]   (default: checkpoints/main-job)
# GRPO_CONFIG=config/grpo_arithmetic_bf16.ini: the same job with a bf16 rollout and rollout correction
# (docs/inference.md, "bf16").
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-checkpoints/main-job}
start=$(date +%s)

scripts/install-deps.sh
scripts/build.sh build

rm -rf "$out"
mkdir -p "$out"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}   # 2 in-process workers share 2 cores

build/apps/hyflow-sft/hyflow-sft --config=config/sft_arithmetic.ini \
  --trainer.default_local_dir="$out/sft" | tee "$out/sft.log"
build/apps/hyflow-grpo/hyflow-grpo --config="${GRPO_CONFIG:-config/grpo_arithmetic.ini}" \
  --actor_rollout_ref.model.path="$out/sft" --trainer.default_local_dir="$out/grpo" \
  --trainer.metrics_file="$out/grpo/metrics.jsonl" | tee "$out/grpo.log"

end=$(date +%s)
# The standard panels (reward, validation, KL, entropy, response length, throughput, learning rate,
# phase times; docs/observing.md) as PNG and SVG; its summary line carries the accuracy numbers.
summary=$(/usr/bin/python3 scripts/hyflow-plot "$out/grpo/metrics.jsonl" -o "$out/main-job" \
  --title "main job: hyflow-grpo on arithmetic after the SFT warm-up")
echo "main job: $summary; $(awk "BEGIN { printf \"%.1f\", ($end - $start) / 60 }") min including install and build"
