#pragma once
// AdamW on the local shards of an FsdpModule: optimizer state exists only for this rank's
// slice of every parameter (1/N of it), the gradient norm is the global one across shards.

#include <hyflow/parallel/data_parallel.hpp>
#include <hyflow/parallel/fsdp.hpp>
#include <hyflow/parallel/optim_config.hpp>
#include <hyflow/parallel/optimizer.hpp>

#include <memory>
#include <string>
#include <vector>

namespace hyflow::parallel {

/// AdamW state of one full (unsharded) parameter, by name: what a resharding checkpoint holds.
struct NamedAdamState {
  std::string name;
  AdamState state;  ///< moments shaped like the full parameter (undefined: not stepped yet)
};

class ShardedOptimizer : public Optimizer {
 public:
  /// `path` names the optim config in errors ("actor_rollout_ref.actor.optim"). Steps the shards of
  /// the module's trainable parameters only (frozen ones: no gradient, no state).
  ShardedOptimizer(std::shared_ptr<FsdpModule> module, const OptimConfig& config, const std::string& path);
  ~ShardedOptimizer() override;

  void zero_grad() override;
  /// The gradients are already reduced into the shards (FsdpModule::finish_backward). The norm
  /// is sqrt of the sum over the shard group of each rank's squared shard norms (replicas hold
  /// equal shards); clipped as torch's clip_grad_norm_ (max_norm / (norm + 1e-6) when below 1).
  /// With the module's param_offload / optimizer_offload the shards and the moments come to the
  /// device for the step and go back to host memory after it.
  double step(double max_norm) override;
  double lr() const override;
  void scheduler_step() override;
  int64_t scheduler_steps() const override;
  /// This rank's AdamW state (its shards) and the schedule position; load needs the same mesh.
  void save(const std::filesystem::path& file) const override;
  void load(const std::filesystem::path& file) override;
  /// The AdamW state tensors of this rank's shards (shared storage).
  std::vector<at::Tensor> state_tensors() const;

  /// This rank's AdamW state, one entry per module parameter (FsdpModule::shard_infos order),
  /// the moments flat like the local shards (rows_per_shard x row_numel values, padding rows 0).
  std::vector<AdamState> shard_state() const;
  /// Resharding: takes this rank's rows of full AdamW state (by parameter name; padding rows
  /// zero) and the schedule position. KeyError / ShapeError naming `source` and the parameter.
  void load_full_state(const std::vector<NamedAdamState>& full, int64_t scheduler_steps, const std::string& source);
  /// Takes this rank's AdamW state as shard_state() gives it (moments flat like the local shards,
  /// undefined: not stepped) and the schedule position; ShapeError naming `source` otherwise.
  void load_shard_state(const std::vector<AdamState>& mine, int64_t scheduler_steps, const std::string& source);

 private:
  double step_on_device(double max_norm);
  std::vector<at::Tensor> trainable_shards() const;
  // FsdpOptions::optimizer_offload: the moments to host memory after a step, back before one
  void move_state(bool to_host);

  std::shared_ptr<FsdpModule> module_;
  std::vector<bool> trainable_;  ///< per module parameter (shard_infos order): has optimizer state
  std::unique_ptr<DataParallelOptimizer> local_;  ///< over the trainable shards
  bool state_offloaded_ = false;
};

}  // namespace hyflow::parallel
