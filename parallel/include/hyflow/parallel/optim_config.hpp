#pragma once
// The optimizer section of verl's actor and critic configs (actor_rollout_ref.actor.optim,
// critic.optim): AdamW and its learning-rate schedule.

#include <array>
#include <cstdint>
#include <string>

namespace hyflow::parallel {

/// *.optim: AdamW with verl's defaults and the lr warmup schedule.
struct OptimConfig {
  double lr = 1e-6;
  double weight_decay = 0.01;
  std::array<double, 2> betas{0.9, 0.999};
  double eps = 1e-8;
  int64_t lr_warmup_steps = -1;        ///< < 0: lr_warmup_steps_ratio * total_training_steps
  double lr_warmup_steps_ratio = 0.0;
  std::string lr_scheduler_type = "constant";  ///< constant | cosine
  double min_lr_ratio = 0.0;
  double num_cycles = 0.5;
  int64_t total_training_steps = -1;   ///< injected by the trainer; needed by cosine and ratios
  /// Warmup steps after resolving the ratio; ValueError naming `path` when a ratio needs an
  /// unknown total.
  int64_t resolved_warmup_steps(const std::string& path) const;
};

}  // namespace hyflow::parallel
