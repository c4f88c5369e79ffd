#pragma once
// The agent keys of verl's config: actor_rollout_ref.rollout.multi_turn.* and
// actor_rollout_ref.rollout.agent.*, and the loaders of verl's tool config file
// (`tools: [{class_name, config, tool_schema}]`) and interaction config file
// (`interaction: [{name, class_name, config}]`). Errors name the key, or the file and the field.

#include <hyflow/agents/interaction.hpp>
#include <hyflow/agents/tool.hpp>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace hyflow::agents {

/// How an overlong tool response is cut to max_tool_response_length characters (verl's
/// tool_response_truncate_side): keep the start, the end, or both halves.
enum class TruncateSide { left, right, middle };

/// actor_rollout_ref.rollout.multi_turn (verl's names and defaults).
struct MultiTurnConfig {
  bool enable = false;
  std::optional<int64_t> max_assistant_turns;  ///< unset: no limit but the response length
  std::optional<int64_t> max_user_turns;       ///< tool and interaction turns together, as verl
  int64_t max_parallel_calls = 1;              ///< tool calls run per assistant turn; the rest are dropped
  int64_t max_tool_response_length = 256;      ///< characters of one tool response
  TruncateSide tool_response_truncate_side = TruncateSide::middle;
  /// Shared libraries whose static initializers register tool classes (load_tool_plugins), loaded
  /// before tool_config_path is read.
  std::vector<std::string> tool_plugins;
  std::string tool_config_path;         ///< empty: no tools
  std::string interaction_config_path;  ///< empty: no interaction
  std::string format = "hermes";        ///< the tool-call format the model writes (only hermes)
};

/// actor_rollout_ref.rollout.agent.
struct AgentConfig {
  int64_t num_workers = 8;                               ///< samples run at once per worker (threads)
  std::string default_agent_loop = "single_turn_agent";  ///< when a row has no agent_name
};

/// actor_rollout_ref.rollout.agent.external_*: a black-box agent program the trainer runs at every
/// training step instead of its own rollout (docs/agents-tools.md, "Train a black-box agent").
struct ExternalAgentConfig {
  std::vector<std::string> command;  ///< external_command: the program's argv (empty: no black-box agent)
  double timeout = 600.0;            ///< external_timeout: seconds the program may run per step
  std::string reward = "agent";      ///< external_reward: agent (its reward when given) | reward_fn
  bool keep_files = false;           ///< external_keep_files: keep each step's run folder
  bool enabled() const { return !command.empty(); }
};

/// Reads the external_* keys of `rollout["agent"]`; a mistyped key or value is a ValueError
/// naming it.
ExternalAgentConfig parse_external_agent_config(const nlohmann::json& rollout);

/// How the agent loops render prompts: verl's data.apply_chat_template_kwargs, which the trainer
/// copies into the rollout section as `apply_chat_template_kwargs` (hyflow's templates are C++, so
/// the entries are the options they have).
struct ChatTemplateKwargs {
  std::optional<std::string> default_system;  ///< the system turn when a row has none (unset: the template's)
  bool list_tools = true;                     ///< the tools' schemas in the system turn (false: the model knows them)
};

/// Reads `rollout["apply_chat_template_kwargs"]` (missing or null: the defaults); a mistyped or
/// unknown entry is a hyflow::ValueError naming data.apply_chat_template_kwargs.<key>.
ChatTemplateKwargs parse_chat_template_kwargs(const nlohmann::json& rollout);

/// Reads `rollout["multi_turn"]` and `rollout["agent"]` of the actor_rollout_ref.rollout section;
/// missing keys keep the defaults, a mistyped or unknown key is a hyflow::ValueError naming
/// actor_rollout_ref.rollout.multi_turn.<key>. With multi_turn.enable the default agent loop is
/// "tool_agent" unless agent.default_agent_loop says otherwise.
MultiTurnConfig parse_multi_turn_config(const nlohmann::json& rollout);
AgentConfig parse_agent_config(const nlohmann::json& rollout);

/// verl's truncation of one tool response: unchanged when it fits, else `limit` characters kept
/// (left: the start + "...(truncated)", right: "(truncated)..." + the end, middle: both halves
/// around "\n...(truncated)...\n").
std::string truncate_tool_response(const std::string& text, int64_t limit, TruncateSide side);

/// The tools of a tool config file, keyed by their schema's function name. The built-in tools
/// are registered first. A missing file, a YAML error or a bad field is a hyflow::ValueError
/// naming the file and the field (tools[1].tool_schema.function.name);
/// an unknown class a KeyError listing the registered ones; a name used twice a ValueError.
std::map<std::string, std::shared_ptr<Tool>> load_tool_config(const std::string& path);

/// The interactions of an interaction config file, keyed by `name` (default: the class name).
std::map<std::string, std::shared_ptr<Interaction>> load_interaction_config(const std::string& path);

/// A YAML file as JSON (plain scalars typed as YAML 1.2's core schema: null, bool, int, float,
/// else string); hyflow::ValueError naming the file when it cannot be read, and the line on a
/// syntax error.
nlohmann::json read_yaml_file(const std::string& path);

}  // namespace hyflow::agents
