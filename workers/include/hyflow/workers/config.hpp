#pragma once
// Configs of the role workers, read from the JSON of verl's config subtrees with verl's key
// names and defaults (actor_rollout_ref, critic, reward_model). Keys verl has but hyflow does
// not use (fsdp_config, strategy, vLLM settings...) are accepted and ignored; any other key,
// and any value of the wrong type or out of range, is a hyflow::ValueError / KeyError naming
// the full key path ("actor_rollout_ref.actor.ppo_epochs").

#include <hyflow/algos/core_algos.hpp>
#include <hyflow/core/config_key.hpp>
#include <hyflow/models/lora.hpp>
#include <hyflow/parallel/optim_config.hpp>

#include <nlohmann/json.hpp>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace hyflow::workers {

using Json = nlohmann::json;

/// actor.optim / critic.optim (hyflow/parallel/optim_config.hpp).
using OptimConfig = parallel::OptimConfig;

/// Micro-batching of a forward-only pass (log-probs, values, rm scores).
struct ForwardBatching {
  std::optional<int64_t> micro_batch_size_per_gpu;  ///< unset: the whole chunk at once
  bool use_dynamic_bsz = false;
  int64_t max_token_len_per_gpu = 16384;
};

/// *.strategy and *.fsdp_config (actor, ref, critic.model): how the role's model is sharded
/// (hyflow/parallel/fsdp.hpp, docs/parallel.md).
struct FsdpSection {
  std::string strategy = "fsdp";  ///< fsdp | fsdp2: both shard per parameter along dim 0
  int64_t fsdp_size = -1;         ///< -1: shard over all ranks; 1: replicate; k: shard in groups of k
  bool param_offload = false;     ///< host shards between phases (a no-op on CPU: they are there)
  bool optimizer_offload = false;
  bool reshard_after_forward = true;  ///< false: SHARD_GRAD_OP
  int64_t min_num_params = 0;         ///< wrap_policy.min_num_params: smaller layers join the root unit
  std::string param_dtype = "fp32";   ///< mixed_precision.param_dtype (hyflow's default: the model's fp32)
  std::string reduce_dtype = "fp32";
  std::string buffer_dtype = "fp32";
};

/// *.checkpoint (actor, critic): what save_checkpoint writes and load_checkpoint restores, with
/// verl's names: "model" (a sharded model: the fsdp shards and manifest; replicated: the Hugging
/// Face folder), "optimizer" (AdamW state and lr schedule), "extra" (RNG state), "hf_model" (the
/// Hugging Face folder of the full model, written in addition to the shards). load_contents
/// defaults to save_contents, as verl's `${.save_contents}`.
struct CheckpointSection {
  std::vector<std::string> save_contents{"model", "optimizer", "extra"};
  std::vector<std::string> load_contents{"model", "optimizer", "extra"};
  bool saves(const std::string& what) const;
  bool loads(const std::string& what) const;
};

/// actor_rollout_ref.actor
struct ActorSection {
  int64_t ppo_mini_batch_size = 256;                    ///< prompts per mini-batch (before ×n, ÷world)
  std::optional<int64_t> ppo_micro_batch_size_per_gpu;  ///< unset: one micro-batch per mini-batch
  bool use_dynamic_bsz = false;
  int64_t ppo_max_token_len_per_gpu = 16384;
  int64_t ppo_epochs = 1;
  double entropy_coeff = 0.0;
  bool calculate_entropy = false;  ///< log actor/entropy even when entropy_coeff is 0
  bool use_kl_loss = false;
  double kl_loss_coef = 0.001;
  std::string kl_loss_type = "low_var_kl";
  double grad_clip = 1.0;
  algos::core_algos::ActorConfig loss;  ///< clip ratios, loss_agg_mode, policy_loss, tau_*
  OptimConfig optim;
  FsdpSection fsdp;  ///< strategy, fsdp_config
  CheckpointSection checkpoint;
};

/// actor_rollout_ref.rollout.val_kwargs
struct ValKwargs {
  int64_t n = 1;
  bool do_sample = false;
  double temperature = 0.0;
  int64_t top_k = -1;
  double top_p = 1.0;
};

/// actor_rollout_ref.rollout
struct RolloutSection {
  std::string name = "hf";  ///< the rollout backend (hyflow/rollout/rollout_registry.hpp)
  int64_t n = 1;
  double temperature = 1.0;
  int64_t top_k = -1;
  double top_p = 1.0;
  double min_p = 0.0;
  bool do_sample = true;
  int64_t prompt_length = 512;
  int64_t response_length = 512;
  bool calculate_log_probs = false;
  /// The decode engine's precision (verl's rollout.dtype): "float32" (the model's) or "bfloat16" (bf16
  /// weights and KV, float32 sums and logits; docs/inference.md, "bf16"); verl's spellings accepted.
  /// bfloat16 makes rollout_log_probs the engine's own (the bf16 forward's), not the actor's rescoring.
  std::string dtype = "float32";
  int64_t seed = 0;  ///< rank r samples with a generator seeded seed + r
  /// The decode engine's KV pool (docs/inference.md, "KV pool"): verl's keys, and hyflow's own
  /// byte cap that applies on every device (the CPU's budget: gpu_memory_utilization is for CUDA).
  double gpu_memory_utilization = 0.5;
  int64_t max_num_seqs = 1024;
  bool free_cache_engine = true;          ///< release the KV pool after each rollout
  std::optional<int64_t> kv_cache_bytes;  ///< null: no cap of its own
  ValKwargs val_kwargs;
  ForwardBatching log_prob;  ///< log_prob_micro_batch_size_per_gpu, log_prob_use_dynamic_bsz, ...
};

/// *.model
struct ModelSection {
  std::string path;
  bool enable_gradient_checkpointing = false;
  /// lora_rank, lora_alpha, target_modules, exclude_modules (docs/lora.md); rank 0: full weights.
  models::LoraConfig lora;
  std::string lora_adapter_path;  ///< a PEFT adapter directory to start from
};

/// actor_rollout_ref: model, actor, rollout, ref.
struct ActorRolloutRefConfig {
  ModelSection model;
  ActorSection actor;
  RolloutSection rollout;
  ForwardBatching ref;   ///< ref.log_prob_* (defaults: the actor's dynamic-bsz settings)
  FsdpSection ref_fsdp;  ///< ref.strategy, ref.fsdp_config
  /// nccl_timeout: seconds one collective of the worker's NCCL group may run before the watchdog
  /// aborts the group (verl's, 600). The group is shared by the roles colocated in a worker.
  int64_t nccl_timeout = 600;
};

/// critic
struct CriticConfig {
  ModelSection model;
  OptimConfig optim;  ///< verl's critic lr default is 1e-5
  int64_t ppo_mini_batch_size = 256;
  std::optional<int64_t> ppo_micro_batch_size_per_gpu;
  bool use_dynamic_bsz = false;
  int64_t ppo_max_token_len_per_gpu = 32768;
  ForwardBatching forward;  ///< forward_micro_batch_size_per_gpu, forward_max_token_len_per_gpu
  int64_t ppo_epochs = 1;
  double cliprange_value = 0.5;
  std::string loss_agg_mode = "token-mean";
  double grad_clip = 1.0;
  int64_t rollout_n = 1;  ///< ppo_mini_batch_size counts prompts: ×rollout_n
  FsdpSection fsdp;       ///< critic.strategy, critic.model.fsdp_config (verl's place for the critic)
  CheckpointSection checkpoint;
  int64_t nccl_timeout = 600;  ///< seconds; must equal actor_rollout_ref.nccl_timeout (one group per worker)
};

/// reward_model
struct RewardModelConfig {
  ModelSection model;
  ForwardBatching forward;  ///< micro_batch_size_per_gpu, use_dynamic_bsz, forward_max_token_len_per_gpu
  int64_t nccl_timeout = 600;  ///< seconds; set by the trainer: actor_rollout_ref.nccl_timeout (verl has no key here)
};

/// The roles an ActorRolloutRefWorker may take.
enum class Role { actor, rollout, ref, actor_rollout, actor_rollout_ref };
/// "actor" ... "actor_rollout_ref"; ValueError listing the valid names otherwise.
Role parse_role(const std::string& role);
const char* to_string(Role role);
bool has_actor(Role role);
bool has_rollout(Role role);
bool has_ref(Role role);

ActorRolloutRefConfig parse_actor_rollout_ref_config(const Json& json);
CriticConfig parse_critic_config(const Json& json);
RewardModelConfig parse_reward_model_config(const Json& json);

/// An optimizer section at `path` (the SFT trainer's `optim`) read as actor.optim is, with the
/// same checks, from `defaults` (a trainer's own defaults); total_training_steps is the trainer's
/// to set in `json`.
OptimConfig parse_optim_config(const Json& json, const std::string& path, OptimConfig defaults = {});
/// The keys parse_optim_config reads at `path`, with `defaults` as their defaults.
std::vector<ConfigKey> optim_config_keys(const std::string& path, OptimConfig defaults = {});

/// The keys the three parsers read (actor_rollout_ref.*, critic.*, reward_model.*) with their
/// types, defaults (the structs' values, or null where the trainer fills the key) and help
/// lines, declared by the read calls themselves (hyflow/core/config_section.hpp). The trainer's key
/// table, --help and parsing are built from this list, so every key a worker reads is a key
/// every app accepts. Keys the trainer sets itself (schedule length, seeds) are not listed.
std::vector<ConfigKey> worker_config_keys();

}  // namespace hyflow::workers
