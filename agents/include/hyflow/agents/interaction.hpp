#pragma once
// Interactions (verl's BaseInteraction, `interaction_config_path`): a simulated user that speaks
// between assistant turns, e.g. "your answer is wrong, try again" with the reward so far. The
// agent loop asks it for a user turn after each assistant turn that makes no tool call; the
// interaction may end the conversation. One object serves every trajectory, one instance per
// trajectory (start -> respond ... -> score -> finalize), keyed by an instance id.
// Guide: docs/agents.md.

#include <nlohmann/json.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace hyflow::agents {

/// One message of the conversation as the interaction sees it: {"role", "content"}.
using ChatMessages = nlohmann::json;

/// What an interaction answers after an assistant turn (verl's
/// `(should_terminate_sequence, response_content, current_turn_score, additional_data)`).
struct InteractionTurn {
  bool terminate = false;  ///< true: the conversation ends here, `text` is not sent
  std::string text;        ///< the user's next message
  double score = 0.0;      ///< this turn's score
  nlohmann::json metrics = nlohmann::json::object();
};

class Interaction {
 public:
  explicit Interaction(std::string name) : name_(std::move(name)) {}
  virtual ~Interaction() = default;
  Interaction(const Interaction&) = delete;
  Interaction& operator=(const Interaction&) = delete;

  /// The `name` of its interaction-config entry (what a dataset row's
  /// `interaction_kwargs.name` selects).
  const std::string& name() const { return name_; }

  /// Starts one trajectory's state. `kwargs` is the row's `interaction_kwargs` (e.g. the ground truth).
  virtual void start(const std::string& instance_id, const nlohmann::json& kwargs) = 0;
  /// The user's answer to the conversation so far (`messages` ends with the assistant's turn).
  virtual InteractionTurn respond(const std::string& instance_id, const ChatMessages& messages) = 0;
  /// The trajectory's interaction score (verl's calculate_score).
  virtual double score(const std::string& instance_id) = 0;
  /// Frees the instance's state; called once per started instance, also after errors.
  virtual void finalize(const std::string& instance_id) = 0;

 private:
  std::string name_;
};

/// Builds an interaction from its config entry's `name` and `config` map.
using InteractionFactory = std::function<std::unique_ptr<Interaction>(const std::string& name,
                                                                      const nlohmann::json& config)>;

/// Registers (or replaces) the interaction class `class_name`.
void register_interaction(const std::string& class_name, InteractionFactory factory);
bool has_interaction(const std::string& class_name);
/// Registered class names, sorted.
std::vector<std::string> interaction_names();
/// The interaction `class_name` named `name`; KeyError listing the registered class names.
std::unique_ptr<Interaction> make_interaction(const std::string& class_name, const std::string& name,
                                              const nlohmann::json& config);

}  // namespace hyflow::agents
