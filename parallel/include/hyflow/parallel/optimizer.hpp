#pragma once
// The optimizer seam of the trainable roles: what the PPO update loop and the worker
// checkpoints call, whatever the distribution of parameters (replicated: DataParallelOptimizer;
// sharded: ShardedOptimizer).

#include <cstdint>
#include <filesystem>

namespace hyflow::parallel {

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual void zero_grad() = 0;
  /// Averages (or has averaged) the gradients over the data-parallel ranks, clips their global
  /// norm to max_norm and steps; a non-finite norm skips the step and zeroes the gradients on
  /// every rank. Returns the norm before clipping.
  virtual double step(double max_norm) = 0;
  /// The learning rate the next step uses.
  virtual double lr() const = 0;
  /// Advances the lr schedule by one update call.
  virtual void scheduler_step() = 0;
  virtual int64_t scheduler_steps() const = 0;
  /// Optimizer state and schedule position of this rank.
  virtual void save(const std::filesystem::path& file) const = 0;
  /// FormatError naming the file when it is missing or does not fit these parameters.
  virtual void load(const std::filesystem::path& file) = 0;
};

}  // namespace hyflow::parallel
