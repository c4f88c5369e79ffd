// Scorers for hyflow's built-in synthetic tasks: arithmetic ("a+b=" -> number), countdown
// (reach a target with + - * / over given numbers) and char_count (verl-recipe char_count:
// how often a letter occurs in a word, the count boxed).
#include <hyflow/core/error.hpp>
#include <hyflow/algos/reward_score.hpp>

#include "string_utils.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <regex>

namespace hyflow::algos::reward_score {

namespace arithmetic {
namespace {
constexpr size_t kAnswerClipChars = 300;
}  // namespace

std::optional<std::string> extract_answer(const std::string& solution_str) {
  static const std::regex number("-?[0-9]+(\\.[0-9]+)?");
  // The answer ends the response: the tail bounds the regex work on long outputs.
  const std::string text = detail::replace_all(detail::last_chars(solution_str, kAnswerClipChars), ",", "");
  std::optional<std::string> last;
  for (std::sregex_iterator it(text.begin(), text.end(), number), end; it != end; ++it) last = it->str();
  return last;
}

double compute_score(const std::string& solution_str, const std::string& ground_truth) {
  auto answer = extract_answer(solution_str);
  if (!answer) return 0.0;
  double expected = 0.0;
  try {
    size_t used = 0;
    expected = std::stod(detail::strip(ground_truth), &used);
  } catch (const std::exception&) {
    throw ValueError("arithmetic.compute_score: ground_truth '" + ground_truth + "' is not a number");
  }
  const double got = std::strtod(answer->c_str(), nullptr);  // overflow gives inf: no match
  return std::abs(got - expected) <= 1e-9 * std::max(1.0, std::abs(expected)) ? 1.0 : 0.0;
}

}  // namespace arithmetic

namespace countdown {
namespace {

/// Recursive-descent evaluator: expr := term (('+'|'-') term)*, term := factor (('*'|'/') factor)*,
/// factor := ('+'|'-') factor | number | '(' expr ')'.
class Evaluator {
 public:
  explicit Evaluator(const std::string& text) : s_(text) {}

  std::optional<double> run() {
    auto value = expr();
    skip_space();
    if (!value || pos_ != s_.size()) return std::nullopt;
    return value;
  }

 private:
  void skip_space() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  bool eat(char c) {
    skip_space();
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  std::optional<double> expr() {
    auto value = term();
    while (value) {
      if (eat('+')) {
        auto rhs = term();
        if (!rhs) return std::nullopt;
        *value += *rhs;
      } else if (eat('-')) {
        auto rhs = term();
        if (!rhs) return std::nullopt;
        *value -= *rhs;
      } else {
        break;
      }
    }
    return value;
  }
  std::optional<double> term() {
    auto value = factor();
    while (value) {
      skip_space();
      // "**" (Python power) is not an operator of this task.
      if (pos_ + 1 < s_.size() && s_[pos_] == '*' && s_[pos_ + 1] == '*') return std::nullopt;
      if (eat('*')) {
        auto rhs = factor();
        if (!rhs) return std::nullopt;
        *value *= *rhs;
      } else if (eat('/')) {
        auto rhs = factor();
        if (!rhs || *rhs == 0.0) return std::nullopt;
        *value /= *rhs;
      } else {
        break;
      }
    }
    return value;
  }
  std::optional<double> factor() {
    if (++depth_ > 200) return std::nullopt;  // bounded recursion on hostile input
    std::optional<double> value;
    if (eat('+')) {
      value = factor();
    } else if (eat('-')) {
      value = factor();
      if (value) *value = -*value;
    } else if (eat('(')) {
      value = expr();
      if (value && !eat(')')) value.reset();
    } else {
      value = number();
    }
    --depth_;
    return value;
  }
  std::optional<double> number() {
    skip_space();
    const size_t start = pos_;
    while (pos_ < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '.')) ++pos_;
    if (pos_ == start) return std::nullopt;
    const std::string token = s_.substr(start, pos_ - start);
    if (std::count(token.begin(), token.end(), '.') > 1 || token == ".") return std::nullopt;
    return std::strtod(token.c_str(), nullptr);  // huge literals become inf, never an exception
  }

  const std::string& s_;
  size_t pos_ = 0;
  int depth_ = 0;
};

nlohmann::json parse_ground_truth(const nlohmann::json& ground_truth) {
  nlohmann::json gt = ground_truth;
  if (gt.is_string()) {
    gt = nlohmann::json::parse(gt.get<std::string>(), nullptr, /*allow_exceptions=*/false);
  }
  if (!gt.is_object() || !gt.contains("target") || !gt["target"].is_number() || !gt.contains("numbers") ||
      !gt["numbers"].is_array()) {
    throw ValueError("countdown.compute_score: ground_truth must be {\"target\": number, \"numbers\": [int...]}, got " +
                     ground_truth.dump());
  }
  for (const auto& n : gt["numbers"]) {
    if (!n.is_number_integer()) {
      throw ValueError("countdown.compute_score: ground_truth numbers must be integers, got " + n.dump());
    }
  }
  return gt;
}

}  // namespace

std::optional<std::string> extract_solution(const std::string& solution_str) {
  // Same matches as the lazy regex <answer>(.*?)</answer>, without regex recursion on long text.
  constexpr std::string_view open = "<answer>", close = "</answer>";
  std::optional<std::string> last;
  size_t pos = 0;
  for (size_t start; (start = solution_str.find(open, pos)) != std::string::npos;) {
    const size_t body = start + open.size();
    const size_t end = solution_str.find(close, body);
    if (end == std::string::npos) break;
    last = detail::strip(std::string_view(solution_str).substr(body, end - body));
    pos = end + close.size();
  }
  return last;
}

bool validate_equation(const std::string& equation, const std::vector<int64_t>& numbers) {
  std::vector<int64_t> used;
  for (size_t i = 0; i < equation.size();) {
    if (!std::isdigit(static_cast<unsigned char>(equation[i]))) {
      ++i;
      continue;
    }
    const size_t start = i;
    while (i < equation.size() && std::isdigit(static_cast<unsigned char>(equation[i]))) ++i;
    if (i - start > 18) return false;  // no such number was given
    used.push_back(std::stoll(equation.substr(start, i - start)));
  }
  std::vector<int64_t> available = numbers;
  std::sort(used.begin(), used.end());
  std::sort(available.begin(), available.end());
  return used == available;
}

std::optional<double> evaluate_equation(const std::string& equation) {
  constexpr std::string_view allowed = "0123456789+-*/(). \t\n\r\v\f";
  if (equation.empty() || equation.find_first_not_of(allowed) != std::string::npos) return std::nullopt;
  return Evaluator(equation).run();
}

double compute_score(const std::string& solution_str, const nlohmann::json& ground_truth, double format_score,
                     double score) {
  const auto gt = parse_ground_truth(ground_truth);
  auto equation = extract_solution(solution_str);
  if (!equation) return 0.0;
  if (!validate_equation(*equation, gt["numbers"].get<std::vector<int64_t>>())) return format_score;
  auto result = evaluate_equation(*equation);
  if (!result) return format_score;
  return std::abs(*result - gt["target"].get<double>()) < 1e-5 ? score : format_score;
}

}  // namespace countdown

namespace char_count {

std::optional<std::string> extract_answer(const std::string& solution_str) {
  if (auto boxed = math::last_boxed_only_string(solution_str)) {
    try {
      return math::remove_boxed(*boxed);
    } catch (const ValueError&) {
      return std::nullopt;  // verl's reward catches the failed remove_boxed and scores 0
    }
  }
  constexpr std::string_view open = "<answer>", close = "</answer>";
  const size_t start = solution_str.rfind(open);
  if (start == std::string::npos) return std::nullopt;
  const size_t body = start + open.size();
  const size_t end = solution_str.find(close, body);
  if (end == std::string::npos) return std::nullopt;
  return solution_str.substr(body, end - body);
}

double compute_score(const std::string& solution_str, const std::string& ground_truth) {
  const auto answer = extract_answer(solution_str);
  return answer && *answer == ground_truth ? 1.0 : 0.0;
}

}  // namespace char_count
}  // namespace hyflow::algos::reward_score
