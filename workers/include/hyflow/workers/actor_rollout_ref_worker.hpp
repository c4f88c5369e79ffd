#pragma once
// ActorRolloutRefWorker: the policy (actor role), its rollout and the frozen reference
// policy, alone or combined in one worker (verl's roles actor, rollout, ref, actor_rollout,
// actor_rollout_ref). Init args: {"config": <actor_rollout_ref subtree>, "role": "..."}.
// Methods and dispatch modes are verl's; see docs/workers.md.

#include <hyflow/actors/method_table.hpp>
#include <hyflow/actors/worker.hpp>
#include <hyflow/inference/generation.hpp>
#include <hyflow/models/llama.hpp>
#include <hyflow/models/lora.hpp>
#include <hyflow/workers/config.hpp>

#include <ATen/core/Generator.h>
#include <c10/core/Device.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace hyflow::rollout {
class RolloutBackend;
}  // namespace hyflow::rollout

namespace hyflow::agents {
class AgentRollout;
}  // namespace hyflow::agents

namespace hyflow::parallel {
class FsdpModule;
class Optimizer;
class ProcessGroup;
}  // namespace hyflow::parallel

namespace hyflow::workers {
namespace detail {
struct RoleCheckpoint;
}  // namespace detail

class ActorRolloutRefWorker : public Worker {
 public:
  /// Parses and checks the config (errors name the key); loads nothing yet.
  explicit ActorRolloutRefWorker(const Json& args);
  ~ActorRolloutRefWorker() override;

  /// Loads the model(s) from model.path, builds the optimizer (actor role) and seeds the
  /// rollout generator with rollout.seed + rank. ONE_TO_ALL.
  void init_model();

  /// Left-padded prompts (input_ids, attention_mask, position_ids) -> rollout batch
  /// (prompts, responses, input_ids, attention_mask, position_ids, response_mask,
  /// rollout_log_probs when rollout.calculate_log_probs). meta_info may override do_sample,
  /// validate (use val_kwargs), temperature, top_p, top_k, response_length. The tokens come from
  /// the rollout backend named by rollout.name (hyflow/rollout/rollout_registry.hpp; built in:
  /// "hf", the decode engine); rollout_log_probs from the actor's own scoring
  /// (compute_log_prob's function and micro-batching at the sampling temperature, 1 for greedy; 0 on
  /// padding), so they equal compute_log_prob's old_log_probs for the same weights. DP_COMPUTE_PROTO.
  DataProto generate_sequences(DataProto prompts);

  /// {"old_log_probs", "entropys"} (B, R) of the current policy; meta_info["temperature"]
  /// (default rollout.temperature) divides the logits. DP_COMPUTE_PROTO.
  DataProto compute_log_prob(DataProto data);

  /// {"ref_log_prob"} (B, R) of the reference policy. DP_COMPUTE_PROTO.
  DataProto compute_ref_log_prob(DataProto data);

  /// verl's PPO policy update: ppo_epochs over mini-batches, micro-batches with gradient accumulation,
  /// gradients averaged over the group (reduce-scattered into shards under FSDP), clipping with the
  /// non-finite skip, one lr-schedule step per call. Returns meta_info["metrics"] (lists). DP_COMPUTE_PROTO.
  DataProto update_actor(DataProto data);

  /// Model (rank 0, Hugging Face format, with the tokenizer files of model.path), optimizer
  /// and lr schedule step plus RNG state (one file per rank). ONE_TO_ALL.
  void save_checkpoint(std::string dir, int64_t global_step);
  /// Restores what save_checkpoint wrote (same world size). ONE_TO_ALL.
  void load_checkpoint(std::string dir);

  Role role() const { return role_; }
  const ActorRolloutRefConfig& config() const { return config_; }
  /// The policy (actor/rollout roles) once init_model ran; null otherwise.
  models::CausalLM policy() const { return policy_; }

  /// The policy's full state for the rollout group (the trainer -> rollout weight handoff): one
  /// row, every parameter as a tensor of shape (1, ...) under its parameter name, copied so that
  /// later updates do not change it; meta_info["num_parameters"]. Rank 0 returns it, the other
  /// ranks an empty DataProto (a sharded actor gathers on every rank, then rank 0 answers).
  /// Needs the actor role. ONE_TO_ALL.
  DataProto export_weights();
  /// Loads weights from export_weights into this worker's policy and records
  /// meta_info["weight_version"] (an integer >= 0); every later rollout carries that version in
  /// min_weight_version / max_weight_version (B,). A missing or misshapen parameter is a
  /// FormatError naming it. Needs the rollout role. ONE_TO_ALL.
  void load_weights(DataProto weights);
  /// The version of the last load_weights on each rank (-1: none yet). ONE_TO_ALL.
  int64_t weight_version() const;
  /// Partial rollout: continues a rollout batch (from generate_sequences, possibly already
  /// continued) by meta_info["response_length"] more tokens with this worker's current weights.
  /// Rows that ended (EOS, or a response_mask that stops early) are padded; the others keep
  /// their tokens and rollout_log_probs and go on; the new tokens' rollout_log_probs are scored
  /// with the current weights as generate_sequences scores (so each segment has the log-probs of
  /// the version that generated it). A sharded policy is gathered as for generate_sequences (same
  /// meta_info handoff figures). min/max_weight_version span the versions that produced each row.
  /// Needs the rollout role and rollout.calculate_log_probs.
  /// DP_COMPUTE_PROTO.
  DataProto continue_sequences(DataProto partial);

  /// The rollout backend's stats() on this rank ({"engine": false} without the rollout role).
  /// The built-in "hf" backend: {"engine": false} before the first rollout that used the decode
  /// engine, else {"engine": true, "packed_weights" (weights packed by the last run: those that
  /// changed), "pack_s", "packed_bytes" (the packed copy held now: 0 for a sharded policy, whose
  /// packed weights are dropped after every rollout), "steps" (forward passes of the last run)}.
  /// ONE_TO_ALL.
  Json decode_stats() const;

  /// Black-box agents (rollout.name=server; docs/agents-tools.md, "Train a black-box agent"): the
  /// rollout backend's server answers outside requests until collect_agent_sessions, the policy
  /// prepared as for a rollout (a sharded policy gathered, LoRA adapters merged). Returns this
  /// rank's base_url. Needs the rollout role. ONE_TO_ALL.
  std::string open_agent_server();
  /// Ends open_agent_server (requests still running finish first; the KV pool is freed when
  /// rollout.free_cache_engine) and returns this rank's recorded sessions among `session_ids`,
  /// forgotten here, as rollout rows (serve::session_to_data_proto, padded to one width by
  /// agents::concat_sessions; empty when this rank served none of them). ONE_TO_ALL.
  DataProto collect_agent_sessions(std::vector<std::string> session_ids);

  /// parameter_digest() of the policy's weights on this rank (the ref model's for the ref role);
  /// for tests and sync checks. ONE_TO_ALL.
  std::string parameter_digest() const;

  static void define_methods(MethodTable<ActorRolloutRefWorker>& t);

 private:
  void require_initialized(const char* method) const;
  /// What save_checkpoint / load_checkpoint write and read for this worker's role.
  detail::RoleCheckpoint checkpoint_role();
  DataProto log_probs_of(models::CausalLM& model, parallel::FsdpModule* fsdp, const DataProto& data,
                         const ForwardBatching& batching, bool with_entropy, const char* method);

  ActorRolloutRefConfig config_;
  Role role_;
  c10::Device device_;
  std::shared_ptr<parallel::ProcessGroup> group_;
  models::CausalLM policy_{nullptr};
  models::CausalLM ref_{nullptr};  ///< null under LoRA: the reference is policy_ with adapters disabled
  /// LoRA: the plain model the rollout serves, adapters merged into its linear weights at each
  /// rollout (docs/lora.md); null without LoRA (the rollout serves policy_).
  std::unique_ptr<models::MergedCopy> merged_;
  std::shared_ptr<parallel::FsdpModule> policy_fsdp_;  ///< null: replicated (one rank, NO_SHARD in fp32)
  std::shared_ptr<parallel::FsdpModule> ref_fsdp_;
  std::unique_ptr<parallel::Optimizer> optimizer_;
  std::optional<at::Generator> rollout_generator_;
  int64_t mini_batch_rows_ = 0;            ///< per-rank rows of one mini-batch
  std::optional<int64_t> weight_version_;  ///< set by load_weights (separate rollout group)
  /// Adds min/max_weight_version = weight_version_ to a fresh rollout batch (when set).
  void stamp_weight_version(DataProto& rollout) const;
  inference::GenerationOptions generation_options(const DataProto& prompts, const std::string& method);

  /// The handoff figures of one rollout call (docs/parallel.md, "Rollout handoff").
  struct Handoff {
    double reshard_s = 0;    ///< gathering the sharded policy, this rank
    int64_t peak_extra = 0;  ///< full-parameter bytes held beyond the shards, gather to end of generation
  };
  /// Generates `input` (prompts on device_; `has_rows` false: this rank generates nothing) on the
  /// rollout backend, the whole policy gathered for it and freed after when sharded (a
  /// collective then: every rank calls it). Tokens only, unless engine_log_probs(options): then also
  /// the engine's rollout_log_probs.
  DataProto policy_rollout(const DataProto& input, bool has_rows, inference::GenerationOptions options,
                           Handoff& handoff);
  /// Whether the rollout's log-probs are the decode engine's own (bf16 rollout: the mismatch with the
  /// actor is the one the trainer measures and corrects) rather than rollout_log_probs' rescoring.
  static bool engine_log_probs(const inference::GenerationOptions& options) {
    return options.return_log_probs && options.decode.dtype == inference::DecodeDtype::kBFloat16;
  }
  /// rollout_log_probs of a rollout batch (on the CPU): the policy's log-probs of `responses`
  /// through log_probs_of with compute_log_prob's batching, at the temperature the tokens were
  /// sampled at (1 for greedy), 0 on padding. A collective under FSDP.
  at::Tensor rollout_log_probs(const DataProto& rollout, const inference::GenerationOptions& options,
                               const char* method);
  /// meta_info timing.reshard (mean over ranks) and reshard_peak_extra_bytes (largest rank).
  void report_handoff(DataProto& out, Handoff handoff);

  /// The rollout backend (rollout.name) serving policy_, built by init_model for the rollout
  /// role and kept across rollouts (the built-in engine keeps its KV pool, scratch and, for a
  /// replicated policy, its packed weights).
  std::unique_ptr<rollout::RolloutBackend> rollout_;
  /// Set when rollout.multi_turn.enable: the rows run through agent loops (docs/agents.md)
  /// on an engine loop over the served policy instead of the backend.
  std::unique_ptr<agents::AgentRollout> agents_;
  Json rollout_json_;  ///< the rollout section as received: the backend's context
};

}  // namespace hyflow::workers
