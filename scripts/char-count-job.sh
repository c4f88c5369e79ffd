#!/usr/bin/env bash
# The char_count job: warms up the built-in tiny char-level model by SFT on the built-in
# char_count task (config/sft_char_count.ini), then trains it with GRPO
# (config/grpo_char_count.ini) on 2 in-process workers, and prints the greedy accuracy on the
# 512 held-out prompts at each validation, the training reward over the first and last 25
# steps, the wall time and the load average. The build must be done (scripts/build.sh build).
# Usage: scripts/char-count-job.sh [output-dir]   (default: checkpoints/char-count-job)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-checkpoints/char-count-job}
rm -rf "$out"
mkdir -p "$out"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}   # 2 in-process workers share 2 cores
start=$(date +%s)
build/apps/hyflow-sft/hyflow-sft --config=config/sft_char_count.ini \
  --trainer.default_local_dir="$out/sft" > "$out/sft.log"
sft_end=$(date +%s)
build/apps/hyflow-grpo/hyflow-grpo --config=config/grpo_char_count.ini \
  --actor_rollout_ref.model.path="$out/sft" --trainer.default_local_dir="$out/grpo" \
  --trainer.metrics_file="$out/grpo/metrics.jsonl" > "$out/grpo.log"
end=$(date +%s)
load=$(cut -d' ' -f1-3 /proc/loadavg)
python3 - "$out/grpo/metrics.jsonl" "$((sft_end - start))" "$((end - sft_end))" "$load" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
key = "val-core/char_count/reward/mean@1"
acc = [(r["step"], r[key]) for r in rows if key in r]
score = [r["critic/score/mean"] for r in rows if "critic/score/mean" in r]
w = min(25, len(score))
print("char_count job: greedy accuracy (512 held-out) by step: " +
      ", ".join(f"{s}: {v:.3f}" for s, v in acc))
print(f"training reward {sum(score[:w]) / w:.3f} -> {sum(score[-w:]) / w:.3f} "
      f"(means over the first and last {w} steps); "
      f"SFT {int(sys.argv[2])} s, GRPO {int(sys.argv[3])} s; load average at the end {sys.argv[4]}")
PY
