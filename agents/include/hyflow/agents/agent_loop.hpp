#pragma once
// Agent loops (verl's AgentLoopBase): run one sample to completion on a TokenGenerator and return
// its prompt ids, response ids, response mask (1 on the ids the model sampled, 0 on every id it
// did not produce: tool and user turns), the rollout log-probs of the sampled ids, the number of
// turns and metrics. Loops are built by name from a registry (a dataset row's `agent_name`, as
// verl); two are built in: "single_turn_agent" (one generation, today's behaviour) and
// "tool_agent" (verl's ToolAgentLoop). Loops never re-tokenize: the response is the sampled ids
// followed by the chat template's ids of each tool or user turn, exactly. Guide: docs/agents.md.

#include <hyflow/agents/agent_config.hpp>
#include <hyflow/agents/interaction.hpp>
#include <hyflow/agents/token_generator.hpp>
#include <hyflow/agents/tool.hpp>
#include <hyflow/tokenizers/chat_template.hpp>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace hyflow::tokenizers {
class Tokenizer;
}

namespace hyflow::agents {

/// One dataset row to run.
struct AgentSample {
  nlohmann::json messages = nlohmann::json::array();  ///< the row's raw_prompt: [{"role", "content"}, ...]
  std::string agent_name;                             ///< empty: the context's default loop
  /// {<tool name>: {"create_kwargs": {...}}}: what each tool's create() gets (verl's tools_kwargs).
  nlohmann::json tools_kwargs = nlohmann::json::object();
  /// {"name": <interaction name>, ...}: what the interaction's start() gets (verl's interaction_kwargs).
  nlohmann::json interaction_kwargs = nlohmann::json::object();
  std::string instance_id;  ///< unique among the samples run at once (tool and interaction instances)
  /// Set: turn t samples with seed + t (reproducible alone). Unset: the generator's own stream; on an
  /// EngineLoop such requests share the batch (requests with different seeds cannot).
  std::optional<uint64_t> seed;
};

/// What one sample produced.
struct AgentLoopOutput {
  std::vector<int64_t> prompt_ids;
  std::vector<int64_t> response_ids;
  std::vector<int64_t> response_mask;     ///< per response id: 1 sampled by the model, 0 otherwise
  std::vector<float> response_log_probs;  ///< the engine's log-prob per sampled id, 0 where the mask is 0
  int64_t num_turns = 0;                  ///< verl's: user + assistant turns + 1 (tool responses count as user turns)
  /// The trajectory's tool rewards by tool name and, with an interaction, "interaction": its score.
  nlohmann::json reward_scores = nlohmann::json::object();
  /// assistant_turns, user_turns, tool_calls, tool_calls_ok / _error / _timeout, tool_latency_s (sum),
  /// tool_latency_max_s, generate_s, cut_by_turns, cut_by_length.
  nlohmann::json metrics = nlohmann::json::object();
};

/// What the loops of one rollout share; it must outlive them.
struct AgentLoopContext {
  TokenGenerator* generator = nullptr;
  std::shared_ptr<const tokenizers::Tokenizer> tokenizer;
  /// The chat template and its options; the loop sets `tools` from `tools` (when list_tools) and
  /// add_generation_prompt.
  tokenizers::ChatTemplateOptions chat;
  /// The tools' schemas go in the prompt (false: a model that learned the calls sees none).
  bool list_tools = true;
  MultiTurnConfig multi_turn;
  std::map<std::string, std::shared_ptr<Tool>> tools;                ///< by function name
  std::map<std::string, std::shared_ptr<Interaction>> interactions;  ///< by name
  int64_t response_length = 512;                                     ///< the most response ids (all turns together)
  int64_t prompt_length = 0;  ///< the most prompt ids (the rendered template); 0: no limit
  TokenSampling sampling;
};

class AgentLoop {
 public:
  explicit AgentLoop(const AgentLoopContext& context) : context_(context) {}
  virtual ~AgentLoop() = default;
  AgentLoop(const AgentLoop&) = delete;
  AgentLoop& operator=(const AgentLoop&) = delete;

  /// Runs one sample to completion. Called from many threads at once (one per sample).
  virtual AgentLoopOutput run(const AgentSample& sample) = 0;

 protected:
  const AgentLoopContext& context() const { return context_; }
  /// The prompt ids: the sample's messages through the chat template (with the tools when
  /// context().list_tools), with
  /// the generation prompt. ValueError naming the sample when messages is not a list of
  /// {"role", "content"} objects or the ids exceed context().prompt_length.
  std::vector<int64_t> prompt_ids(const AgentSample& sample) const;

 private:
  const AgentLoopContext& context_;
};

using AgentLoopFactory = std::function<std::unique_ptr<AgentLoop>(const AgentLoopContext& context)>;

/// Registers (or replaces) the loop `name` (what a row's agent_name selects).
void register_agent_loop(const std::string& name, AgentLoopFactory factory);
bool has_agent_loop(const std::string& name);
/// Registered names, sorted ("single_turn_agent" and "tool_agent" among them).
std::vector<std::string> agent_loop_names();
/// KeyError listing the registered names when `name` is unknown.
std::unique_ptr<AgentLoop> make_agent_loop(const std::string& name, const AgentLoopContext& context);

/// The ids the chat template puts after an assistant turn that ended on the tokenizer's end
/// token, for `messages` (tool or user messages) and the next assistant header: the template's
/// text of the conversation with them minus its text up to the assistant's end token, encoded.
/// ValueError when the template does not render the end token after an assistant turn.
std::vector<int64_t> template_turn_ids(const AgentLoopContext& context,
                                       const std::vector<tokenizers::ChatMessage>& messages);

/// Runs every sample with its loop (agent_name, else `default_loop`), `num_workers` samples at
/// once, one thread each; outputs in the samples' order. The first failure is rethrown after
/// every thread ended, prefixed with the sample's index.
std::vector<AgentLoopOutput> run_agent_loops(const std::vector<AgentSample>& samples, const AgentLoopContext& context,
                                             const std::string& default_loop, int64_t num_workers);

/// Batch metrics of the outputs (verl's names where they exist): num_turns/{min,max,mean},
/// agent/tool_calls/{mean,max}, agent/tool_success_rate, agent/tool_error_rate,
/// agent/tool_timeout_rate, agent/tool_latency_s/{mean,max} (per call), agent/masked_token_fraction
/// (response ids with mask 0), agent/cut_by_turns and agent/cut_by_length (fractions of samples).
nlohmann::json agent_loop_metrics(const std::vector<AgentLoopOutput>& outputs);

}  // namespace hyflow::agents
