#pragma once
// RolloutBackend: what a rollout worker asks of the engine that produces its tokens (verl's
// BaseRollout). The worker owns everything around it: sampling settings from the config and
// meta_info, the FSDP gather of a sharded policy before a call, rollout_log_probs scored with
// the actor's own forward, weight versions. A backend only turns prompts into tokens with the
// weights it was given. Backends are registered by name (rollout_registry.hpp) and picked by
// actor_rollout_ref.rollout.name; docs/rollout.md shows how to add one.

#include <hyflow/core/error.hpp>
#include <hyflow/dataproto/data_proto.hpp>
#include <hyflow/inference/generation.hpp>
#include <hyflow/models/checkpoint.hpp>
#include <hyflow/models/llama.hpp>

#include <c10/core/Device.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace hyflow::rollout {

/// What a backend is built with, on one rank of a worker group that has the rollout role.
struct RolloutContext {
  /// The policy this rank serves. In a hybrid worker (actor and rollout roles together) it is
  /// the actor role's own model: the trainer updates its parameters between calls.
  models::CausalLM model{nullptr};
  c10::Device device{c10::kCPU};
  /// The actor_rollout_ref.rollout section as the worker received it (backend-specific keys
  /// such as `server` or `engine_kwargs` live here).
  nlohmann::json config = nlohmann::json::object();
  int64_t rank = 0;
  int64_t world_size = 1;
};

class RolloutBackend {
 public:
  virtual ~RolloutBackend() = default;

  /// Left-padded prompts (input_ids, attention_mask, position_ids on the context's device) ->
  /// verl's rollout batch: prompts (B*n, P), responses (B*n, R), input_ids, attention_mask and
  /// position_ids (B*n, P+R), response_mask (B*n, R), with the prompts' non-tensor columns
  /// repeated and their meta_info copied (inference::generate's contract). `options` carries the
  /// sampling settings of this call (n, temperature / top-k / top-p / min-p or greedy, response
  /// length, seed, eos and pad ids). Tokens only: the worker scores rollout_log_probs itself.
  virtual DataProto generate_sequences(const DataProto& prompts, const inference::GenerationOptions& options) = 0;

  /// New weights for the served model (a rollout group of its own receiving a trainer version).
  /// `source` names them in errors ("load_weights of weight version 3"); a missing or
  /// misshapen tensor is a FormatError naming it.
  virtual void load_weights(const models::NamedTensors& weights, const std::string& source) = 0;

  /// The served model's parameters were rewritten where the backend cannot see it (an FSDP
  /// gather writing raw storage, a checkpoint load): every copy derived from them is stale.
  virtual void weights_changed() = 0;

  /// verl's free_cache_engine: releases the KV cache and the scratch the backend keeps between
  /// calls (the worker calls it after each rollout when rollout.free_cache_engine is true; stale
  /// weight copies are weights_changed's business). The next generate_sequences rebuilds them.
  virtual void free_cache_engine() = 0;

  /// Black-box agents (docs/agents-tools.md, "Train a black-box agent"): opens the backend's
  /// server to outside requests until collect_sessions and returns its base_url. The default (a
  /// backend without a server): ValueError.
  virtual std::string open_for_agents() {
    throw ValueError("this rollout backend serves no outside agents (actor_rollout_ref.rollout.name=server does)");
  }

  /// Ends what open_for_agents began (requests still running finish first) and returns the
  /// recorded sessions among `session_ids`, forgotten here, as serve::session_to_data_proto rows:
  /// one DataProto per session found, in the order of `session_ids` (unknown ids are skipped).
  /// The default: ValueError.
  virtual std::vector<DataProto> collect_sessions(const std::vector<std::string>& session_ids) {
    (void)session_ids;
    throw ValueError("this rollout backend records no agent sessions (actor_rollout_ref.rollout.name=server does)");
  }

  /// What the backend did (for tests and metrics): a JSON object, backend-specific keys.
  virtual nlohmann::json stats() const = 0;
};

}  // namespace hyflow::rollout
