// A reward plugin for test_trainer_data (custom_reward_function.path): built as a MODULE that
// does not link hyflow; it registers its functions in the loading program's registries.
#include <hyflow/algos/reward_score.hpp>

namespace {
const bool registered = [] {
  hyflow::algos::reward_score::register_compute_score(
      "plugin_length_score",
      [](const std::string&, const std::string& solution, const nlohmann::json& ground_truth, const nlohmann::json&) {
        // 1 when the response is exactly as long as the ground truth text, else 0
        const auto want = ground_truth.is_string() ? ground_truth.get<std::string>().size() : 0;
        return hyflow::algos::reward_score::ScoreResult{solution.size() == want ? 1.0 : 0.0,
                                                 {{"length", static_cast<double>(solution.size())}}};
      });
  return true;
}();
}  // namespace
