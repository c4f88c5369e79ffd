#pragma once
// The multi-turn rollout of one rollout rank (verl's AgentLoopManager with its workers): the
// rows of a generate_sequences call run through their agent loops, many at once, on one
// serve::EngineLoop over the served policy, and come back as verl's rollout batch.

#include <hyflow/agents/agent_config.hpp>
#include <hyflow/agents/interaction.hpp>
#include <hyflow/agents/tool.hpp>
#include <hyflow/dataproto/data_proto.hpp>
#include <hyflow/inference/generation.hpp>
#include <hyflow/models/llama.hpp>
#include <hyflow/tokenizers/chat_template.hpp>
#include <hyflow/tokenizers/tokenizer.hpp>

#include <nlohmann/json.hpp>

#include <map>
#include <memory>
#include <optional>
#include <string>

namespace hyflow::agents {

class AgentRollout {
 public:
  /// `rollout` is the actor_rollout_ref.rollout section (multi_turn.*, agent.*,
  /// apply_chat_template_kwargs); the tool and interaction config files are loaded here.
  /// `tokenizer` is the served model's; `chat` the chat template (its tools are set from the tool
  /// config; apply_chat_template_kwargs.default_system, when set, replaces its default_system).
  AgentRollout(const nlohmann::json& rollout, std::shared_ptr<const tokenizers::Tokenizer> tokenizer,
               tokenizers::ChatTemplateOptions chat = {});

  const MultiTurnConfig& multi_turn() const { return multi_turn_; }
  const AgentConfig& agent() const { return agent_; }

  /// Rows: input_ids (B, width) and the non-tensor column raw_prompt (a string: one user message;
  /// or a list of {"role", "content"}), optional columns agent_name, tools_kwargs and
  /// interaction_kwargs (verl's). The loops render the prompts themselves (chat template and
  /// tools), so the batch's P is the section's prompt_length (verl's rollout.prompt_length;
  /// unset: the rows' width) and R = options.max_new_tokens, sampled as `options` say, the rows'
  /// non-tensor columns and meta_info carried over. The rows' requests carry no seed of their own
  /// (the engine loop's is options.seed), so they share the engine's batch; which row draws which
  /// random stream follows their arrival, so sampled rollouts are not reproducible run to run
  /// (greedy ones are). ValueError naming the row or the missing column.
  DataProto generate(models::CausalLM model, const DataProto& prompts, const inference::GenerationOptions& options);

  /// The engine loop's figures of the last generate: runs, admitted, joined_mid_run, tokens, peak_running.
  nlohmann::json last_engine_stats() const { return last_stats_; }

 private:
  MultiTurnConfig multi_turn_;
  AgentConfig agent_;
  std::shared_ptr<const tokenizers::Tokenizer> tokenizer_;
  tokenizers::ChatTemplateOptions chat_;
  bool list_tools_ = true;
  std::optional<int64_t> prompt_length_;
  std::map<std::string, std::shared_ptr<Tool>> tools_;
  std::map<std::string, std::shared_ptr<Interaction>> interactions_;
  nlohmann::json last_stats_ = nlohmann::json::object();
};

/// Copies the columns agent loops read (raw_prompt, agent_name, tools_kwargs, interaction_kwargs:
/// what verl hands its agent loops) that `from` has into `to`, which must have as many rows.
void copy_agent_columns(const DataProto& from, DataProto& to);

/// The agent metrics of a rollout batch made by agent_outputs_to_batch (carried through
/// generate_sequences): agent_loop_metrics of its __num_turns__ and agent_metrics columns and
/// its response mask. Empty when the batch has no agent_metrics column.
nlohmann::json agent_batch_metrics(const DataProto& batch);

}  // namespace hyflow::agents
