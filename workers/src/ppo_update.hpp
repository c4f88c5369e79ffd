#pragma once
// The PPO update loop and the train-state checkpoint shared by the actor and critic roles
// (verl's dp_actor.update_policy and dp_critic.update_critic share the same skeleton).

#include <hyflow/dataproto/data_proto.hpp>
#include <hyflow/workers/config.hpp>

#include <ATen/core/Generator.h>

#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace hyflow::parallel {
class FsdpModule;
class Optimizer;
class ProcessGroup;
}  // namespace hyflow::parallel

namespace hyflow::workers::detail {

/// Metric lists in first-seen order (each update returns a list per metric).
class MetricLists {
 public:
  void add(const std::string& name, double value);
  const std::vector<std::pair<std::string, std::vector<double>>>& lists() const { return lists_; }

 private:
  std::map<std::string, size_t> index_;
  std::vector<std::pair<std::string, std::vector<double>>> lists_;
};

/// What one update call iterates over.
struct PpoUpdatePlan {
  int64_t ppo_epochs = 1;
  ForwardBatching micro_batching;
  double grad_clip = 1.0;
  std::string prefix;  ///< metric prefix: "actor" or "critic"
  /// Sharded model: only the last micro-batch of a mini-batch reduces gradients, each backward
  /// ends with finish_backward, and dynamic micro-batch counts agree over `group`.
  parallel::FsdpModule* fsdp = nullptr;
  parallel::ProcessGroup* group = nullptr;
};

/// ppo_epochs passes over the mini-batches of `mini_batches`; for each mini-batch: zero_grad,
/// `micro_step(micro_batch, scale)` on each micro-batch (it computes and backpropagates the loss
/// times `scale`: 1/grad_accum for fixed micro-batches, the rows' share with dynamic batch
/// size, as verl), then one optimizer step whose grad norm is logged as "<prefix>/grad_norm".
/// Ends with zero_grad, "<prefix>/lr" (the lr this call used) and one scheduler step.
void ppo_update(const std::vector<DataProto>& mini_batches, const PpoUpdatePlan& plan, parallel::Optimizer& optimizer,
                const std::string& method, MetricLists& metrics,
                const std::function<void(const DataProto& micro_batch, double scale)>& micro_step);

/// The trained model's side of a worker checkpoint in `dir`: rank 0 runs `save_model` (may be
/// empty) and writes the state file; every rank writes its optimizer state (when there is an
/// optimizer) and its RNG state (the torch CPU generator and `generator`); then a barrier.
void save_train_state(const std::filesystem::path& dir, const std::string& worker, int rank, int world_size,
                      int64_t global_step, const std::function<void(const std::filesystem::path&)>& save_model,
                      const parallel::Optimizer* optimizer, const at::Generator* generator,
                      parallel::ProcessGroup* group);
/// Checks the state file (worker type, world size), runs `load_model` (may be empty) and
/// restores the optimizer and RNG state saved by save_train_state.
void load_train_state(const std::filesystem::path& dir, const std::string& worker, int rank, int world_size,
                      const std::function<void(const std::filesystem::path&)>& load_model,
                      parallel::Optimizer* optimizer, at::Generator* generator);

}  // namespace hyflow::workers::detail
