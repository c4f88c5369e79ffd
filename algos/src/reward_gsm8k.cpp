// GSM8K scorer (verl reward_score/gsm8k.py).
#include <hyflow/core/error.hpp>
#include <hyflow/algos/reward_score.hpp>

#include "string_utils.hpp"

#include <regex>

namespace hyflow::algos::reward_score::gsm8k {
namespace {
// Regex matching on long strings is slow: only the tail can hold the final answer.
constexpr size_t kSolutionClipChars = 300;
}  // namespace

std::optional<std::string> extract_solution(const std::string& solution_str, const std::string& method) {
  if (method != "strict" && method != "flexible") {
    throw ValueError("gsm8k.extract_solution: method must be 'strict' or 'flexible', got '" + method + "'");
  }
  const std::string tail = detail::last_chars(solution_str, kSolutionClipChars);
  if (method == "strict") {
    static const std::regex marked("#### (\\-?[0-9\\.\\,]+)");
    std::optional<std::string> last;
    for (std::sregex_iterator it(tail.begin(), tail.end(), marked), end; it != end; ++it) last = (*it)[1].str();
    if (!last) return std::nullopt;
    return detail::replace_all(detail::replace_all(*last, ",", ""), "$", "");
  }
  static const std::regex number("(\\-?[0-9\\.\\,]+)");
  std::vector<std::string> answers;
  for (std::sregex_iterator it(tail.begin(), tail.end(), number), end; it != end; ++it) answers.push_back((*it)[1]);
  if (answers.empty()) return std::nullopt;
  for (auto it = answers.rbegin(); it != answers.rend(); ++it) {
    if (*it != "" && *it != ".") return *it;
  }
  return answers.front();  // Python's loop variable keeps the last one it visited
}

double compute_score(const std::string& solution_str, const std::string& ground_truth, const std::string& method,
                     double format_score, double score) {
  auto answer = extract_solution(solution_str, method);
  if (!answer) return 0.0;
  return *answer == ground_truth ? score : format_score;
}

}  // namespace hyflow::algos::reward_score::gsm8k
