#pragma once
// CriticWorker: the value model of PPO (verl's CriticWorker). Init args: {"config": <critic
// subtree>}.

#include <hyflow/actors/method_table.hpp>
#include <hyflow/actors/worker.hpp>
#include <hyflow/models/llama.hpp>
#include <hyflow/workers/config.hpp>

#include <c10/core/Device.h>

#include <memory>
#include <string>

namespace hyflow::parallel {
class FsdpModule;
class Optimizer;
class ProcessGroup;
}  // namespace hyflow::parallel

namespace hyflow::workers {
namespace detail {
struct RoleCheckpoint;
}  // namespace detail


class CriticWorker : public Worker {
 public:
  explicit CriticWorker(const Json& args);
  ~CriticWorker() override;

  /// Loads the value model from model.path (an LM checkpoint gets a fresh score head) and
  /// builds the optimizer. ONE_TO_ALL.
  void init_model();
  /// {"values"} (B, R): the value of each response position (values[:, -R-1:-1]), times
  /// response_mask. DP_COMPUTE_PROTO.
  DataProto compute_values(DataProto data);
  /// verl's clipped value-loss update over ppo_epochs, mini- and micro-batches; inputs
  /// values, returns, response_mask, input_ids, attention_mask, position_ids, responses.
  /// meta_info["metrics"]: critic/vf_loss, critic/vf_clipfrac, critic/vpred_mean,
  /// critic/grad_norm, critic/lr. DP_COMPUTE_PROTO.
  DataProto update_critic(DataProto data);
  /// As ActorRolloutRefWorker's. ONE_TO_ALL.
  void save_checkpoint(std::string dir, int64_t global_step);
  void load_checkpoint(std::string dir);

  const CriticConfig& config() const { return config_; }
  models::ValueModel model() const { return model_; }

  /// parameter_digest() of the trained model's weights on this rank (tests and sync checks). ONE_TO_ALL.
  std::string parameter_digest() const;

  static void define_methods(MethodTable<CriticWorker>& t);

 private:
  void require_initialized(const char* method) const;
  /// What save_checkpoint / load_checkpoint write and read.
  detail::RoleCheckpoint checkpoint_role();
  at::Tensor response_values(const DataProto& micro_batch);

  CriticConfig config_;
  c10::Device device_;
  std::shared_ptr<parallel::ProcessGroup> group_;
  models::ValueModel model_{nullptr};
  std::shared_ptr<parallel::FsdpModule> fsdp_;  ///< null: replicated (one rank, NO_SHARD in fp32)
  std::unique_ptr<parallel::Optimizer> optimizer_;
  int64_t mini_batch_rows_ = 0;
};

}  // namespace hyflow::workers
