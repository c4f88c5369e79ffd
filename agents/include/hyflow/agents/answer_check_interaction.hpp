#pragma once
// The built-in interaction (verl's Gsm8kInteraction semantics): a simulated user that checks the
// assistant's last answer against the row's ground truth with hyflow's rule-based reward
// (algos::reward_score::default_compute_score, by data source). A right answer ends the
// conversation; a wrong one is answered "Your answer is wrong, try again." with the score so far,
// until `max_turns` answers were checked. The trajectory's score is the best answer's score.
// Row: interaction_kwargs = {"name": ..., "ground_truth": ..., "data_source"?: ...}.
// Config keys: max_turns (3), data_source ("openai/gsm8k"; a row's own data_source wins).
// Registered as kAnswerCheckInteractionClass and as verl's class name. Guide: docs/agents-tools.md.

#include <hyflow/agents/interaction.hpp>

#include <map>
#include <mutex>

namespace hyflow::agents {

inline constexpr const char* kAnswerCheckInteractionClass = "hyflow.interactions.AnswerCheckInteraction";
/// verl's class name for the same semantics (its configs load unchanged).
inline constexpr const char* kVerlGsm8kInteractionClass = "verl.interactions.gsm8k_interaction.Gsm8kInteraction";

class AnswerCheckInteraction final : public Interaction {
 public:
  /// ValueError naming an unknown config key or a bad value.
  AnswerCheckInteraction(std::string name, const nlohmann::json& config);

  void start(const std::string& instance_id, const nlohmann::json& kwargs) override;
  InteractionTurn respond(const std::string& instance_id, const ChatMessages& messages) override;
  double score(const std::string& instance_id) override;
  void finalize(const std::string& instance_id) override;

  int max_turns() const { return max_turns_; }

 private:
  struct State {
    nlohmann::json ground_truth;
    std::string data_source;
    int turns = 0;
    double best = 0.0;
  };
  State& state(const std::string& instance_id);

  int max_turns_ = 3;
  std::string data_source_ = "openai/gsm8k";
  std::mutex mu_;
  std::map<std::string, State> states_;
};

/// Registers kAnswerCheckInteractionClass and kVerlGsm8kInteractionClass (once).
void register_builtin_interactions();

}  // namespace hyflow::agents
