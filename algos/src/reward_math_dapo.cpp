// DAPO math scorer (verl reward_score/math_dapo.py): Minerva "Answer:" extraction and
// normalisation, or a strict boxed comparison.
#include <hyflow/core/error.hpp>
#include <hyflow/algos/reward_score.hpp>

#include "string_utils.hpp"

#include <algorithm>
#include <array>
#include <regex>
#include <utility>

namespace hyflow::algos::reward_score::math_dapo {
namespace {

using detail::replace_all;

// (before, after) in order.
constexpr std::array<std::pair<std::string_view, std::string_view>, 10> kSubstitutions{{
    {"an ", ""},
    {"a ", ""},
    {".$", "$"},
    {"\\$", ""},
    {"\\ ", ""},
    {" ", ""},
    {"mbox", "text"},
    {",\\text{and}", ","},
    {"\\text{and}", ","},
    {"\\text{m}", "\\text{}"},
}};

constexpr std::array<std::string_view, 41> kRemovedExpressions{
    "square",   "ways",     "integers",        "dollars",   "mph",         "inches",     "hours",
    "km",       "units",    "\\ldots",         "sue",       "points",      "feet",       "minutes",
    "digits",   "cents",    "degrees",         "cm",        "gm",          "pounds",     "meters",
    "meals",    "edges",    "students",        "childrentickets", "multiples", "\\text{s}", "\\text{.}",
    "\\text{\ns}", "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}", "\\mathrm{th}", "^\\circ",
    "^{\\circ}", "\\;",     ",\\!",            "{,}",       "\"",          "\\dots"};

bool is_ascii_digits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

std::optional<std::string> last_boxed_only_string(const std::string& string) {
  const size_t idx = string.rfind("\\boxed{");
  if (idx == std::string::npos) return std::nullopt;
  return detail::balanced_brace_span(string, idx);
}

std::string remove_boxed(const std::string& s) {
  const std::string left = "\\boxed{";
  if (s.compare(0, left.size(), left) != 0 || s.back() != '}') {
    throw ValueError("math_dapo.remove_boxed: '" + s + "' is not of the form \\boxed{...}");
  }
  return s.substr(left.size(), s.size() - left.size() - 1);
}

std::string normalize_final_answer(const std::string& input) {
  std::string final_answer = detail::split(input, "=").back();
  for (const auto& [before, after] : kSubstitutions) final_answer = replace_all(final_answer, before, after);
  for (auto expr : kRemovedExpressions) final_answer = replace_all(final_answer, expr, "");

  // Python's '.' never matches '\n'; spelled out so ECMAScript's '\r' rule does not differ.
  static const std::regex math_span("([^\\n]*?)(\\$)([^\\n]*?)(\\$)([^\\n]*)");
  static const std::regex text("(\\\\text\\{)([^\\n]*?)(\\})");
  static const std::regex textbf("(\\\\textbf\\{)([^\\n]*?)(\\})");
  static const std::regex overline("(\\\\overline\\{)([^\\n]*?)(\\})");
  static const std::regex boxed("(\\\\boxed\\{)([^\\n]*)(\\})");
  static const std::regex frac("(frac)([^{])([^\\n])");
  static const std::regex sqrt("(sqrt)([^{])");
  final_answer = std::regex_replace(final_answer, math_span, "$$$3$$");
  final_answer = std::regex_replace(final_answer, text, "$2");
  final_answer = std::regex_replace(final_answer, textbf, "$2");
  final_answer = std::regex_replace(final_answer, overline, "$2");
  final_answer = std::regex_replace(final_answer, boxed, "$2");
  final_answer = std::regex_replace(final_answer, frac, "frac{$2}{$3}");
  final_answer = std::regex_replace(final_answer, sqrt, "sqrt{$2}");
  final_answer = replace_all(final_answer, "$", "");

  const std::string without_commas = replace_all(final_answer, ",", "");
  if (is_ascii_digits(without_commas)) final_answer = without_commas;
  return detail::strip(final_answer);
}

std::pair<bool, std::string> is_correct_minerva(const std::string& solution_str, const std::string& gt,
                                                bool gt_need_extract) {
  static const std::regex answer_pattern("Answer\\s*:\\s*([^\\n]+)", std::regex::ECMAScript | std::regex::icase);
  std::string extracted = "[INVALID]";
  for (std::sregex_iterator it(solution_str.begin(), solution_str.end(), answer_pattern), end; it != end; ++it) {
    extracted = (*it)[1].str();
  }
  const std::string pred = normalize_final_answer(extracted);
  std::string target;
  if (gt_need_extract) {
    auto boxed = last_boxed_only_string(gt);
    if (!boxed) throw ValueError("math_dapo.is_correct_minerva: ground truth has no \\boxed{...}: '" + gt + "'");
    target = normalize_final_answer(remove_boxed(*boxed));
  } else {
    target = normalize_final_answer(gt);
  }
  return {pred == target, pred};
}

std::pair<bool, std::string> is_correct_strict_box(const std::string& pred, const std::string& gt) {
  const std::string tail = detail::last_chars(pred, 100);
  auto boxed = last_boxed_only_string(tail);
  const std::string extracted = boxed ? remove_boxed(*boxed) : "[INVALID]";
  return {extracted == gt, extracted};
}

ScoreResult compute_score(const std::string& solution_str, const std::string& ground_truth, bool strict_box_verify) {
  // The longest MATH-500 answer has 159 characters: the tail suffices.
  const std::string tail = detail::last_chars(solution_str, 300);
  auto [correct, pred] =
      strict_box_verify ? is_correct_strict_box(tail, ground_truth) : is_correct_minerva(tail, ground_truth);
  return {correct ? 1.0 : -1.0, {{"acc", correct}, {"pred", pred}}};
}

}  // namespace hyflow::algos::reward_score::math_dapo
