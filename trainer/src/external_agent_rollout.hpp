#pragma once
// The rollout of a training step by a black-box agent (actor_rollout_ref.rollout.agent.external_*,
// docs/agents-tools.md "Train a black-box agent"): the program runs against the trainer's router
// in front of every rollout rank's server, one session per (prompt, sample); the recorded sessions
// are collected from the ranks that served them and become the step's training rows.

#include <hyflow/actors/worker_group.hpp>
#include <hyflow/agents/agent_config.hpp>
#include <hyflow/dataproto/data_proto.hpp>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

namespace hyflow::trainer {

class ExternalAgentRollout {
 public:
  /// `api_key`: the servers' bearer token (empty: none); `local_dir`: trainer.default_local_dir
  /// (external_keep_files keeps each generation batch's folder under {local_dir}/external_agent/<uid_prefix>/);
  /// `world`: the training group's data-parallel size (the batch is cut to a multiple of it).
  ExternalAgentRollout(agents::ExternalAgentConfig config, std::string api_key, std::string local_dir,
                       int64_t pad_token_id, int64_t world);

  /// Runs the program over `prompts` (the step's prompt rows with their uid column), `n`
  /// sessions per prompt tagged `<run>-<uid_prefix>p<prompt>-<sample>`, against `base_url` (the
  /// router), with every rank of `rollout` open to it meanwhile; then collects the sessions from
  /// the ranks. Returns the rows to train on: session_to_data_proto's tensors with the prompt's
  /// non-tensor columns (uid, data_source, reward_model, extra_info, raw_prompt), session_id,
  /// row_index (prompt * n + sample), __num_turns__ (2 x the row's model turns) and
  /// agent_reward (the agent's reward, or null: left to the reward function). Missing sessions
  /// and a killed or timed-out program are counted in `m` (agent/external/*); a step without
  /// any trajectory is a hyflow::Error naming the program and the tail of its log.
  DataProto generate(WorkerGroup& rollout, const std::string& base_url, const DataProto& prompts, int64_t n,
                     const std::string& uid_prefix, nlohmann::json& m);

  /// external_reward=agent: the rows with an agent_reward get it as their only token-level score
  /// (at the last response token, where the reward managers put theirs) instead of the reward
  /// function's. Counted in m["agent/external/agent_reward_fraction"].
  void apply_agent_rewards(const DataProto& batch, at::Tensor& reward_tensor, nlohmann::json& m) const;

 private:
  agents::ExternalAgentConfig config_;
  std::string api_key_, local_dir_, run_id_;
  int64_t pad_token_id_ = 0, world_ = 1;
};

}  // namespace hyflow::trainer
