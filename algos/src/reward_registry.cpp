// default_compute_score routing (verl reward_score/__init__.py) and the registry of named
// reward functions.
#include <hyflow/core/error.hpp>
#include <hyflow/core/named_registry.hpp>
#include <hyflow/algos/reward_score.hpp>

#include <array>

namespace hyflow::algos::reward_score {
namespace {

// hyflow's own extra_info key; verl's gsm8k routing reads none.
constexpr const char* kGsm8kMethodKey = "hyflow_gsm8k_method";

bool one_of(const std::string& s, std::initializer_list<std::string_view> names) {
  for (auto n : names) {
    if (s == n) return true;
  }
  return false;
}

bool starts_with(const std::string& s, std::string_view prefix) { return s.rfind(prefix, 0) == 0; }

/// Ground truths are strings in verl's datasets; numbers are accepted as their JSON text.
std::string text_of(const nlohmann::json& ground_truth, const std::string& data_source) {
  if (ground_truth.is_string()) return ground_truth.get<std::string>();
  if (ground_truth.is_number()) return ground_truth.dump();
  throw ValueError("default_compute_score: data_source '" + data_source +
                   "' needs a string ground_truth, got " + ground_truth.dump());
}

NamedRegistry<ComputeScoreFn>& registry() {
  static NamedRegistry<ComputeScoreFn> r("reward function", {{"default", default_compute_score}});
  return r;
}

}  // namespace

ScoreResult default_compute_score(const std::string& data_source, const std::string& solution_str,
                                  const nlohmann::json& ground_truth, const nlohmann::json& extra_info) {
  if (data_source == "openai/gsm8k") {
    std::string method = "strict";
    if (extra_info.is_object() && extra_info.contains(kGsm8kMethodKey)) {
      const auto& m = extra_info[kGsm8kMethodKey];
      if (!m.is_string())
        throw ValueError(std::string("default_compute_score: extra_info['") + kGsm8kMethodKey +
                         "'] must be a string, got " + m.dump());
      method = m.get<std::string>();
    }
    return {gsm8k::compute_score(solution_str, text_of(ground_truth, data_source), method)};
  }
  if (one_of(data_source, {"lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500"})) {
    return {math::compute_score(solution_str, text_of(ground_truth, data_source))};
  }
  if (one_of(data_source, {"math_dapo", "math", "math_dapo_reasoning"}) || starts_with(data_source, "aime")) {
    return math_dapo::compute_score(solution_str, text_of(ground_truth, data_source));
  }
  if (data_source == "arithmetic") {
    return {arithmetic::compute_score(solution_str, text_of(ground_truth, data_source))};
  }
  if (data_source == "countdown") return {countdown::compute_score(solution_str, ground_truth)};
  if (data_source == "char_count") {
    return {char_count::compute_score(solution_str, text_of(ground_truth, data_source))};
  }
  if (starts_with(data_source, "numina_") || starts_with(data_source, "searchR1_") ||
      one_of(data_source, {"codecontests", "apps", "codeforces", "taco", "hiyouga/geometry3k"})) {
    throw KeyError("default_compute_score: data_source '" + data_source +
                   "' needs a scorer hyflow does not ship (prime_math, code sandbox, geo3k, search-R1); "
                   "register a custom reward function for it");
  }
  throw KeyError("default_compute_score: no rule scorer for data_source '" + data_source +
                 "' (known: openai/gsm8k, lighteval/MATH, DigitalLearningGmbH/MATH-lighteval, "
                 "HuggingFaceH4/MATH-500, math_dapo, math, math_dapo_reasoning, aime*, arithmetic, countdown, "
                 "char_count)");
}

void register_compute_score(const std::string& name, ComputeScoreFn fn, bool overwrite) {
  registry().put(name, std::move(fn), overwrite);
}

ComputeScoreFn get_compute_score(const std::string& name) {
  return registry().get(name);
}

std::vector<std::string> registered_compute_scores() {
  return registry().names();
}

}  // namespace hyflow::algos::reward_score
