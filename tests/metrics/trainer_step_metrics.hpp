#pragma once
// The metrics of one step of the PPO trainer with the async pipeline, as ppo_trainer.cpp and
// async_pipeline.cpp log them (the keys a Prometheus tracker maps, and some it leaves alone).

#include <nlohmann/json.hpp>

namespace metrics_test {

inline nlohmann::json async_ppo_step_metrics() {
  return nlohmann::json{{"actor/pg_loss", 0.0125},
                        {"actor/entropy", 1.73},
                        {"critic/score/mean", 0.41},
                        {"perf/throughput", 1234.5},
                        {"perf/total_num_tokens", 8192},
                        {"perf/time_per_step", 3.25},
                        {"timing_s/gen", 1.5},
                        {"timing_s/old_log_prob", 0.25},
                        {"timing_s/update_actor", 1.0},
                        {"timing_s/update_weights", 0.125},
                        {"timing_s/step", 3.25},
                        {"timing_per_token_ms/gen", 0.18},
                        {"training/global_step", 7},
                        {"training/epoch", 0},
                        {"training/off_policy/trajectory_staleness/mean", 0.5},
                        {"training/off_policy/trajectory_staleness/max", 1},
                        {"training/off_policy/trajectory_staleness/min", 0},
                        {"training/off_policy/trajectory_staleness_worst/max", 1},
                        {"training/off_policy/rollout_weight_version", 6},
                        {"training/off_policy/queued_batches", 2},
                        {"val-aux/note", "not a number"}};
}

}  // namespace metrics_test
