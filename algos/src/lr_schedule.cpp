// LR multiplier schedules (verl torch_functional.py) and a LambdaLR for LibTorch optimizers.
#include <hyflow/core/error.hpp>
#include <hyflow/algos/lr_schedule.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <string>

namespace hyflow::algos::core_algos {
namespace {

void check_ratio(double value, const char* name) {
  if (!(value >= 0.0 && value <= 1.0)) {
    throw ValueError(std::string("lr schedule: ") + name + " must be in [0, 1], got " + std::to_string(value));
  }
}

}  // namespace

LrLambda get_constant_schedule_with_warmup(int64_t num_warmup_steps) {
  return [num_warmup_steps](int64_t step) {
    if (step < num_warmup_steps) {
      return static_cast<double>(step) / static_cast<double>(std::max<int64_t>(1, num_warmup_steps));
    }
    return 1.0;
  };
}

LrLambda get_cosine_schedule_with_warmup(int64_t num_warmup_steps, int64_t num_training_steps, double min_lr_ratio,
                                         double num_cycles, std::optional<double> init_lr_ratio) {
  check_ratio(min_lr_ratio, "min_lr_ratio");
  const double init = init_lr_ratio.value_or(0.0);
  check_ratio(init, "init_lr_ratio");
  const double coef = (1 - min_lr_ratio) * 0.5;
  const double intercept = (1 + min_lr_ratio) * 0.5;
  return [=](int64_t step) {
    if (step < num_warmup_steps) {
      return init + (1.0 - init) * (static_cast<double>(step) /
                                    static_cast<double>(std::max<int64_t>(1, num_warmup_steps)));
    }
    const double progress = static_cast<double>(step - num_warmup_steps) /
                            static_cast<double>(std::max<int64_t>(1, num_training_steps - num_warmup_steps));
    const double x = std::cos(M_PI * num_cycles * 2.0 * progress);
    return std::max(min_lr_ratio, x * coef + intercept);
  };
}

LrLambda get_wsd_schedule_with_warmup(int64_t num_warmup_steps, int64_t num_training_steps, double min_lr_ratio,
                                      double num_cycles, double stable_ratio) {
  const int64_t remaining = std::max<int64_t>(0, num_training_steps - num_warmup_steps);
  const auto num_stable_steps = static_cast<int64_t>(static_cast<double>(remaining) * stable_ratio);
  const int64_t num_decay_steps = remaining - num_stable_steps;
  return [=](int64_t step) {
    if (step < num_warmup_steps) {
      return static_cast<double>(step) / static_cast<double>(std::max<int64_t>(1, num_warmup_steps));
    }
    if (step < num_warmup_steps + num_stable_steps) return 1.0;
    if (step < num_training_steps) {
      const double progress = static_cast<double>(step - num_warmup_steps - num_stable_steps) /
                              static_cast<double>(std::max<int64_t>(1, num_decay_steps));
      const double value = std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * num_cycles * 2.0 * progress)));
      return (1.0 - min_lr_ratio) * value + min_lr_ratio;
    }
    return min_lr_ratio;
  };
}

LrLambda get_lr_schedule(const LrScheduleOptions& options, const std::string& key) {
  if (options.type == "constant") return get_constant_schedule_with_warmup(options.num_warmup_steps);
  if (options.type == "cosine") {
    return get_cosine_schedule_with_warmup(options.num_warmup_steps, options.num_training_steps, options.min_lr_ratio,
                                           options.num_cycles);
  }
  throw ValueError("config key '" + key + "': unknown schedule '" + options.type + "' (constant, cosine)");
}

LambdaLR::LambdaLR(torch::optim::Optimizer& optimizer, LrLambda lr_lambda)
    : optimizer_(optimizer), lr_lambda_(std::move(lr_lambda)) {
  if (!lr_lambda_) throw ValueError("LambdaLR: empty lr_lambda");
  for (auto& group : optimizer_.param_groups()) base_lrs_.push_back(group.options().get_lr());
  apply();
}

void LambdaLR::step() {
  ++last_epoch_;
  apply();
}

void LambdaLR::apply() {
  const double factor = lr_lambda_(last_epoch_);
  auto& groups = optimizer_.param_groups();
  for (size_t i = 0; i < groups.size(); ++i) groups[i].options().set_lr(base_lrs_[i] * factor);
}

std::vector<double> LambdaLR::get_last_lr() const {
  std::vector<double> lrs;
  for (const auto& group : optimizer_.param_groups()) lrs.push_back(group.options().get_lr());
  return lrs;
}

}  // namespace hyflow::algos::core_algos
