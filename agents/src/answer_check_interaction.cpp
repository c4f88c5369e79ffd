#include <hyflow/agents/answer_check_interaction.hpp>
#include <hyflow/algos/reward_score.hpp>
#include <hyflow/core/error.hpp>

#include <cstdio>

namespace hyflow::agents {
namespace {

/// The text of the last assistant message (a string, or the text parts of a content array).
std::string last_assistant_text(const ChatMessages& messages) {
  if (!messages.is_array()) throw ValueError("interaction: the messages are not an array");
  for (auto it = messages.rbegin(); it != messages.rend(); ++it) {
    if (!it->is_object() || it->value("role", "") != "assistant") continue;
    const auto& content = (*it)["content"];
    if (content.is_string()) return content.get<std::string>();
    std::string text;
    if (content.is_array())
      for (const auto& part : content)
        if (part.is_object() && part.value("type", "") == "text") text += part.value("text", "");
    return text;
  }
  return {};
}

std::string format_score(double score) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", score);
  return buf;
}

}  // namespace

AnswerCheckInteraction::AnswerCheckInteraction(std::string name, const nlohmann::json& config)
    : Interaction(std::move(name)) {
  if (config.is_null()) return;
  if (!config.is_object()) throw ValueError(std::string(kAnswerCheckInteractionClass) + " config: expected a map");
  for (const auto& [key, value] : config.items()) {
    if (key == "max_turns") {
      if (!value.is_number_integer() || value.get<int64_t>() <= 0)
        throw ValueError("interaction '" + this->name() +
                         "' config key 'max_turns': expected a positive integer, got " + value.dump());
      max_turns_ = value.get<int>();
    } else if (key == "data_source") {
      if (!value.is_string())
        throw ValueError("interaction '" + this->name() + "' config key 'data_source': not a string");
      data_source_ = value.get<std::string>();
    } else {
      throw ValueError("interaction '" + this->name() + "' config key '" + key +
                       "' is unknown; known keys: max_turns, data_source");
    }
  }
}

void AnswerCheckInteraction::start(const std::string& instance_id, const nlohmann::json& kwargs) {
  if (!kwargs.is_object() || !kwargs.contains("ground_truth"))
    throw ValueError("interaction '" + name() + "': interaction_kwargs has no 'ground_truth'");
  State s{.ground_truth = kwargs["ground_truth"], .data_source = data_source_};
  if (kwargs.contains("data_source")) {
    if (!kwargs["data_source"].is_string())
      throw ValueError("interaction '" + name() + "': interaction_kwargs.data_source is not a string");
    s.data_source = kwargs["data_source"].get<std::string>();
  }
  std::lock_guard lock(mu_);
  states_[instance_id] = std::move(s);
}

AnswerCheckInteraction::State& AnswerCheckInteraction::state(const std::string& instance_id) {
  auto it = states_.find(instance_id);
  if (it == states_.end()) throw KeyError("interaction '" + name() + "': no started instance '" + instance_id + "'");
  return it->second;
}

InteractionTurn AnswerCheckInteraction::respond(const std::string& instance_id, const ChatMessages& messages) {
  const std::string answer = last_assistant_text(messages);
  nlohmann::json ground_truth;
  std::string data_source;
  {
    std::lock_guard lock(mu_);
    State& s = state(instance_id);
    ground_truth = s.ground_truth;
    data_source = s.data_source;
  }
  const double turn_score = algos::reward_score::default_compute_score(data_source, answer, ground_truth).score;
  std::lock_guard lock(mu_);
  State& s = state(instance_id);
  s.turns += 1;
  s.best = std::max(s.best, turn_score);
  InteractionTurn turn{.score = turn_score, .metrics = {{"interaction_turns", s.turns}}};
  if (turn_score >= 1.0) {
    turn.terminate = true;
    turn.text = "Your answer is correct!";
  } else if (s.turns >= max_turns_) {
    turn.terminate = true;
  } else {
    turn.text = "Your answer is wrong, try again. Score so far: " + format_score(s.best) + " (attempt " +
                std::to_string(s.turns) + " of " + std::to_string(max_turns_) + ").";
  }
  return turn;
}

double AnswerCheckInteraction::score(const std::string& instance_id) {
  std::lock_guard lock(mu_);
  return state(instance_id).best;
}

void AnswerCheckInteraction::finalize(const std::string& instance_id) {
  std::lock_guard lock(mu_);
  states_.erase(instance_id);
}

void register_builtin_interactions() {
  static std::once_flag once;
  std::call_once(once, [] {
    auto factory = [](const std::string& name, const nlohmann::json& config) {
      return std::make_unique<AnswerCheckInteraction>(name, config);
    };
    register_interaction(kAnswerCheckInteractionClass, factory);
    register_interaction(kVerlGsm8kInteractionClass, factory);
  });
}

}  // namespace hyflow::agents
