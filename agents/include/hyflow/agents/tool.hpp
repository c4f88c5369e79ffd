#pragma once
// Tools an agent loop lets the model call (verl's BaseTool). One Tool object serves every
// trajectory of a rollout; each trajectory gets its own instance: create -> execute (any number
// of times) -> calc_reward -> release, keyed by an instance id the loop chooses. execute may be
// called concurrently for different instances, so per-instance state is the tool's to guard.
// Tools are built by class name (the `class_name` of verl's tool config file) from a registry;
// a plugin registers its own from a static initializer. Guide: docs/agents.md.

#include <nlohmann/json.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace hyflow::agents {

/// An OpenAI function tool: what the chat template renders in the system turn.
struct ToolSchema {
  std::string name;
  std::string description;
  nlohmann::json parameters = nlohmann::json::object();  ///< a JSON Schema object

  /// {"type": "function", "function": {"name", "description", "parameters"}}.
  nlohmann::json to_openai() const;
  /// The inverse of to_openai; ValueError naming the missing or mistyped field.
  static ToolSchema from_openai(const nlohmann::json& schema);
};

/// How one call ended; an error or timeout goes back to the model as text all the same.
enum class ToolStatus { ok, error, timeout };

/// The outcome of one execute: the text the model sees as the tool's message, a step reward
/// and metrics (verl's `(ToolResponse, reward, metrics)`).
struct ToolResult {
  std::string text;
  ToolStatus status = ToolStatus::ok;
  double reward = 0.0;
  nlohmann::json metrics = nlohmann::json::object();
};

class Tool {
 public:
  explicit Tool(ToolSchema schema) : schema_(std::move(schema)) {}
  virtual ~Tool() = default;
  Tool(const Tool&) = delete;
  Tool& operator=(const Tool&) = delete;

  const ToolSchema& schema() const { return schema_; }

  /// Starts the tool's state for one trajectory. `create_kwargs` is the dataset row's
  /// `tools_kwargs[<tool name>].create_kwargs` (e.g. the ground truth), an empty object when
  /// absent. Returns a text shown to the model before the first turn, usually empty.
  virtual std::string create(const std::string& instance_id, const nlohmann::json& create_kwargs) {
    (void)instance_id;
    (void)create_kwargs;
    return {};
  }
  /// Runs one call with the model's arguments (already parsed from the tool call's JSON).
  /// Bad arguments are a ToolResult with status error and a message for the model, not a throw.
  virtual ToolResult execute(const std::string& instance_id, const nlohmann::json& arguments) = 0;
  /// The trajectory's tool reward so far (verl's calc_reward); 0 unless the tool scores.
  virtual double calc_reward(const std::string& instance_id) {
    (void)instance_id;
    return 0.0;
  }
  /// Frees the instance's state; called once per created instance, also after errors.
  virtual void release(const std::string& instance_id) { (void)instance_id; }

 private:
  ToolSchema schema_;
};

/// Builds a tool from the `config` map of its tool-config entry and its schema.
using ToolFactory = std::function<std::unique_ptr<Tool>(const nlohmann::json& config, ToolSchema schema)>;

/// Registers (or replaces) the tool class `class_name`.
void register_tool(const std::string& class_name, ToolFactory factory);
bool has_tool(const std::string& class_name);
/// Registered class names, sorted.
std::vector<std::string> tool_names();
/// The tool `class_name` built from `config` and `schema`; KeyError listing the registered
/// class names (with a "did you mean") when it is unknown.
std::unique_ptr<Tool> make_tool(const std::string& class_name, const nlohmann::json& config, ToolSchema schema);

}  // namespace hyflow::agents
