#pragma once
// Learning-rate schedules of verl's torch_functional.py as multiplier functions of the step
// (PyTorch LambdaLR semantics), plus a LambdaLR that applies one to a LibTorch optimizer.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace torch::optim {
class Optimizer;
}

namespace hyflow::algos::core_algos {

/// step -> lr multiplier.
using LrLambda = std::function<double(int64_t)>;

/// step/max(1, warmup) during warmup, then 1.
LrLambda get_constant_schedule_with_warmup(int64_t num_warmup_steps);

/// Linear warmup from init_lr_ratio (default 0) to 1, then
/// max(min_lr_ratio, cos(π·num_cycles·2·progress)·(1-min)/2 + (1+min)/2). Not clamped after
/// num_training_steps (it rises again, as in verl). Ratios outside [0, 1]: hyflow::ValueError.
LrLambda get_cosine_schedule_with_warmup(int64_t num_warmup_steps, int64_t num_training_steps,
                                         double min_lr_ratio = 0.0, double num_cycles = 0.5,
                                         std::optional<double> init_lr_ratio = std::nullopt);

/// Warmup, then a stable phase of int(stable_ratio·(total-warmup)) steps at 1, then cosine
/// decay to min_lr_ratio, and min_lr_ratio from num_training_steps on.
LrLambda get_wsd_schedule_with_warmup(int64_t num_warmup_steps, int64_t num_training_steps,
                                      double min_lr_ratio = 0.0, double num_cycles = 0.5,
                                      double stable_ratio = 0.9);

/// A schedule as configs choose it: verl's actor and critic `optim.lr_scheduler_type`, the SFT
/// trainer's `optim.lr_scheduler`.
struct LrScheduleOptions {
  std::string type = "constant";  ///< constant | cosine
  int64_t num_warmup_steps = 0;
  int64_t num_training_steps = -1;  ///< cosine
  double min_lr_ratio = 0.0;        ///< cosine
  double num_cycles = 0.5;          ///< cosine
};

/// The schedule `options.type` names: get_constant_schedule_with_warmup(num_warmup_steps) or
/// get_cosine_schedule_with_warmup(num_warmup_steps, num_training_steps, min_lr_ratio,
/// num_cycles). Another type: hyflow::ValueError naming `key` (the config key that chose it)
/// and the known types.
LrLambda get_lr_schedule(const LrScheduleOptions& options, const std::string& key);

/// lr_group = base_lr_group · lambda(step). Construction applies step 0 (like PyTorch);
/// step() advances by one.
class LambdaLR {
 public:
  LambdaLR(torch::optim::Optimizer& optimizer, LrLambda lr_lambda);
  void step();
  int64_t last_epoch() const { return last_epoch_; }
  std::vector<double> get_last_lr() const;

 private:
  void apply();
  torch::optim::Optimizer& optimizer_;
  LrLambda lr_lambda_;
  std::vector<double> base_lrs_;
  int64_t last_epoch_ = 0;
};

}  // namespace hyflow::algos::core_algos
