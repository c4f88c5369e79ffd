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

namespace torch::nn {
class Module;
}

namespace hyflow::models {
struct ModelConfig;
}

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

/// What a role checkpoints: its trained model (sharded or replicated), optimizer and RNG state.
struct RoleCheckpoint {
  std::string worker;  ///< the state file's "worker" ("ActorRolloutRefWorker")
  int rank = 0;
  int world_size = 1;
  torch::nn::Module* model = nullptr;  ///< the trained model; null: nothing trained (RNG only)
  const models::ModelConfig* config = nullptr;
  parallel::FsdpModule* fsdp = nullptr;      ///< null: replicated parameters
  parallel::Optimizer* optimizer = nullptr;  ///< ShardedOptimizer when fsdp is set
  at::Generator* generator = nullptr;        ///< saved with the torch CPU generator ("extra")
  parallel::ProcessGroup* group = nullptr;
  std::filesystem::path model_dir;  ///< model.path: its tokenizer files are copied along
  const CheckpointSection* contents = nullptr;
  /// LoRA: "model" / "hf_model" are the PEFT adapter folder <dir>/lora_adapter (the base model is
  /// model_dir's, unchanged); loading checks its base model and target modules.
  const models::LoraConfig* lora = nullptr;
  std::vector<std::string> modules_to_save;  ///< PEFT's modules_to_save ("score" for the critic)
  std::string task_type = "CAUSAL_LM";       ///< PEFT's task_type
};

/// Writes a worker checkpoint into `dir` (every rank calls it; ends with a barrier). With
/// `fsdp`: "model" / "optimizer" write the sharded layout of hyflow/parallel/fsdp_checkpoint.hpp
/// (parameter shards, AdamW state per parameter rows, manifest), "hf_model" additionally the
/// gathered Hugging Face folder. Replicated: "model" (or "hf_model") is rank 0's Hugging Face
/// folder and "optimizer" each rank's optim_world_size_W_rank_r.pt. "extra": each rank's RNG
/// state. Rank 0 writes hyflow_worker_state.json (worker, world size, layout, step).
void save_role_checkpoint(const RoleCheckpoint& role, const std::filesystem::path& dir, int64_t global_step);
/// Restores what load_contents names. A sharded checkpoint loads at any world size and mesh
/// (model and optimizer resharded; the RNG state only at the saved world size), into a sharded
/// or a replicated model; a replicated one needs the saved world size (ValueError otherwise).
/// FormatError naming the file for a missing or damaged one.
void load_role_checkpoint(const RoleCheckpoint& role, const std::filesystem::path& dir);

}  // namespace hyflow::workers::detail
