#pragma once
// Data-parallel training: the optimizer that averages gradients over a process group so that
// every rank takes the same step (weights stay identical on every rank), parameter broadcast
// and digests, and the RNG state of a worker checkpoint. Sharded (FSDP) training plugs in
// here: a sharded optimizer implements the same zero_grad / step / save / load.

#include <hyflow/algos/lr_schedule.hpp>
#include <hyflow/parallel/optim_config.hpp>
#include <hyflow/parallel/optimizer.hpp>
#include <hyflow/parallel/process_group.hpp>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace torch::optim {
class AdamW;
}

namespace hyflow::parallel {

/// The default bound on one broadcast_parameters bucket: PyTorch DDP's bucket_cap_mb, 25 MiB.
inline constexpr int64_t kBroadcastBucketBytes = int64_t{25} << 20;

/// Copies rank 0's parameters (and buffers: any dtype) to every rank, bit for bit, so that ranks
/// start identical even where loading initializes something at random (a fresh value head).
/// Tensors are grouped by dtype and device, in order, and broadcast in their own dtype, a bucket
/// of at most `bucket_bytes` at a time: a contiguous tensor that fills a bucket on its own is
/// broadcast in place, smaller ones are packed into a flat bucket and copied back (one staging
/// buffer per device, the size of the largest packed bucket, reused by every bucket). So the
/// memory it needs beyond the parameters is at most `bucket_bytes` (never a copy of the model;
/// a non-contiguous tensor larger than the cap: its own size).
/// Every rank must pass the same shapes and dtypes in the same order. No-op without a group;
/// ValueError when bucket_bytes <= 0.
void broadcast_parameters(const std::vector<at::Tensor>& parameters, ProcessGroup* group,
                          int64_t bucket_bytes = kBroadcastBucketBytes);

/// FNV-1a hash (hex) over the bytes of every parameter in order: equal on two ranks exactly
/// when their weights are bit-identical.
std::string parameter_digest(const std::vector<at::Tensor>& parameters);

/// AdamW's state of one parameter: the moments (shaped like the parameter; undefined before
/// its first step) and the step count.
struct AdamState {
  at::Tensor exp_avg;
  at::Tensor exp_avg_sq;
  int64_t step = 0;
};

/// AdamW (verl's defaults) with the warmup schedule, gradient averaging over `group` and
/// gradient clipping with the non-finite skip.
class DataParallelOptimizer : public Optimizer {
 public:
  /// `path` names the optim config in errors ("actor_rollout_ref.actor.optim").
  DataParallelOptimizer(std::vector<at::Tensor> parameters, const OptimConfig& config,
                        std::shared_ptr<ProcessGroup> group, const std::string& path);
  ~DataParallelOptimizer() override;

  void zero_grad() override;
  /// All-reduces (averages) the gradients over the group, clips their global norm to
  /// max_norm and steps; a non-finite norm skips the step and zeroes the gradients (the
  /// same on every rank: the norm is computed after averaging). Returns the norm before
  /// clipping.
  double step(double max_norm) override;
  /// The learning rate the next step uses.
  double lr() const override;
  /// Advances the lr schedule by one update call.
  void scheduler_step() override;
  int64_t scheduler_steps() const override { return scheduler_steps_; }

  /// Optimizer state and schedule position of this rank.
  void save(const std::filesystem::path& file) const override;
  /// FormatError naming the file when it is missing or does not fit these parameters.
  void load(const std::filesystem::path& file) override;

  /// The AdamW state of every parameter, in the order of the constructor's parameters (the
  /// tensors are the optimizer's own: copy before changing them). Resharding checkpoints read it.
  std::vector<AdamState> adam_state() const;
  /// Replaces the AdamW state (copied) and the schedule position. ShapeError naming `source`
  /// and the parameter index when the count or a moment's shape does not match.
  void set_adam_state(const std::vector<AdamState>& state, int64_t scheduler_steps, const std::string& source);
  /// The AdamW state tensors this rank holds (exp_avg, exp_avg_sq, max_exp_avg_sq with amsgrad),
  /// sharing their storage: what benchmarks count as optimizer memory.
  std::vector<at::Tensor> state_tensors() const;

 private:
  void reset_schedule(int64_t steps);

  std::vector<at::Tensor> parameters_;
  OptimConfig config_;
  std::shared_ptr<ProcessGroup> group_;
  std::unique_ptr<torch::optim::AdamW> optimizer_;
  algos::core_algos::LrLambda schedule_;
  std::unique_ptr<algos::core_algos::LambdaLR> scheduler_;
  int64_t scheduler_steps_ = 0;
};

/// Saves / restores the torch default CPU generator and `extra` (e.g. the rollout sampling
/// generator) with the schedule-independent bits of a worker checkpoint.
void save_rng_state(const std::filesystem::path& file, const at::Generator* extra);
void load_rng_state(const std::filesystem::path& file, at::Generator* extra);

}  // namespace hyflow::parallel
