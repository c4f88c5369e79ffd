#!/usr/bin/env bash
# Issue 29's learned tool task end to end: 4-digit x 4-digit multiplication, which the built-in tiny
# char-level model cannot do in its head.
#   1. SFT warm-up with the tool (config/sft_calculator.ini, then a second stage from its output at a
#      lower lr): 600 training problems, 45% of them rendered through the chat template as the
#      calculator call, the tool turn and the answer, the others answered in the head; greedily the
#      warm-up answers in its head;
#   2. SFT warm-up without the tool (the same two stages, data.synthetic.task = multiplication_chat:
#      every answer at once, same problems, steps and prompt);
#   3. GRPO with the calculator (config/grpo_calculator.ini: multi_turn.enable, tool_agent) from 1;
#   4. GRPO without it (the same config, single_turn_agent: one generation, the tool never listed
#      nor called; a short response) from 2;
# then plots reward, held-out greedy accuracy and tool calls per sample (agent-job.png/.svg) and writes
# summary.json and summary.md with the three accuracies (warm-up, with the tool, without it), the wall
# time and the load. The build must be done (scripts/build.sh build; BUILD_DIR to use another).
# Usage: scripts/agent-job.sh [output-dir]   (default: checkpoints/agent-job)
# GRPO_STEPS=N overrides both GRPO runs' trainer.total_training_steps.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-checkpoints/agent-job}
build=${BUILD_DIR:-build}
rm -rf "$out"
mkdir -p "$out"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}   # 2 in-process workers share 2 cores
steps=()
[ -n "${GRPO_STEPS:-}" ] && steps=(--trainer.total_training_steps="$GRPO_STEPS")
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
t0=$(date +%s)
# The warm-up's two stages: the config's 700 steps at lr 5e-3, then 400 at 2e-3 from that model.
warm_up() {  # warm_up NAME [overrides...]
  local name=$1
  shift
  "$build/apps/hyflow-sft/hyflow-sft" --config=config/sft_calculator.ini "$@" \
    --trainer.default_local_dir="$out/$name-stage1" > "$out/$name-stage1.log"
  "$build/apps/hyflow-sft/hyflow-sft" --config=config/sft_calculator.ini "$@" \
    --model.partial_pretrain="$out/$name-stage1" --trainer.total_training_steps=400 --optim.lr=2e-3 \
    --trainer.default_local_dir="$out/$name" > "$out/$name.log"
}
warm_up sft-tool
t1=$(date +%s)
warm_up sft-notool --data.synthetic.task=multiplication_chat --data.max_length=96
t2=$(date +%s)
"$build/apps/hyflow-grpo/hyflow-grpo" --config=config/grpo_calculator.ini "${steps[@]}" \
  --actor_rollout_ref.model.path="$out/sft-tool" --trainer.default_local_dir="$out/grpo-tool" \
  --trainer.experiment_name=grpo-tool --trainer.metrics_file="$out/grpo-tool/metrics.jsonl" > "$out/grpo-tool.log"
t3=$(date +%s)
"$build/apps/hyflow-grpo/hyflow-grpo" --config=config/grpo_calculator.ini "${steps[@]}" \
  --actor_rollout_ref.rollout.agent.default_agent_loop=single_turn_agent --data.max_response_length=32 \
  --actor_rollout_ref.model.path="$out/sft-notool" --trainer.default_local_dir="$out/grpo-notool" \
  --trainer.experiment_name=grpo-notool --trainer.metrics_file="$out/grpo-notool/metrics.jsonl" \
  > "$out/grpo-notool.log"
t4=$(date +%s)
load_end=$(cut -d' ' -f1-3 /proc/loadavg)
/usr/bin/python3 scripts/agent-job-report "$out" \
  --seconds "sft_tool=$((t1 - t0)),sft_notool=$((t2 - t1)),grpo_tool=$((t3 - t2)),grpo_notool=$((t4 - t3))" \
  --load "$load_start / $load_end" --commit "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
