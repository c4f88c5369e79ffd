#include <hyflow/core/error.hpp>
#include <hyflow/parallel/optim_config.hpp>

#include <string>

namespace hyflow::parallel {

int64_t OptimConfig::resolved_warmup_steps(const std::string& path) const {
  if (lr_warmup_steps >= 0) return lr_warmup_steps;
  if (lr_warmup_steps_ratio == 0.0) return 0;
  if (total_training_steps <= 0)
    throw ValueError("config key '" + path +
                     "' must be 0 unless total_training_steps is set (the trainer sets it), got " +
                     std::to_string(lr_warmup_steps_ratio));
  return static_cast<int64_t>(lr_warmup_steps_ratio * static_cast<double>(total_training_steps));
}

}  // namespace hyflow::parallel
