// Hendrycks-MATH scorer (verl reward_score/math_reward.py): last boxed answer, normalised by
// strip_string, compared for equality.
#include <hyflow/core/error.hpp>
#include <hyflow/algos/reward_score.hpp>

#include "string_utils.hpp"


namespace hyflow::algos::reward_score::math {
namespace {

using detail::contains;
using detail::replace_all;
using detail::split;

/// Python's int(a) followed by "{}".format(a) == a: a canonical decimal integer.
bool is_canonical_int(const std::string& s) {
  const std::string_view digits = s.starts_with('-') ? std::string_view(s).substr(1) : std::string_view(s);
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string_view::npos) return false;
  if (digits.size() > 1 && digits[0] == '0') return false;
  return s != "-0";
}

/// \frac12 -> \frac{1}{2}, \frac1{72} -> \frac{1}{72}.
std::string fix_fracs(const std::string& string) {
  auto substrs = split(string, "\\frac");
  std::string new_str = substrs[0];
  for (size_t k = 1; k < substrs.size(); ++k) {
    const std::string& substr = substrs[k];
    new_str += "\\frac";
    if (substr.empty()) throw ValueError("strip_string: '\\frac' without an argument in '" + string + "'");
    if (substr[0] == '{') {
      new_str += substr;
      continue;
    }
    if (detail::code_points(substr) < 2) return string;
    const std::string a = detail::first_char(substr);
    const std::string b = detail::first_char(std::string_view(substr).substr(a.size()));
    const std::string post = substr.substr(a.size() + b.size());
    if (b != "{") {
      new_str += "{" + a + "}{" + b + "}" + post;
    } else {
      new_str += "{" + a + "}" + b + post;
    }
  }
  return new_str;
}

/// "3/4" -> \frac{3}{4} when both sides are plain integers.
std::string fix_a_slash_b(const std::string& string) {
  auto parts = split(string, "/");
  if (parts.size() != 2) return string;
  if (!is_canonical_int(parts[0]) || !is_canonical_int(parts[1])) return string;
  return "\\frac{" + parts[0] + "}{" + parts[1] + "}";
}

/// "\text{ " only introduces units in the MATH data: drop from there on.
std::string remove_right_units(const std::string& string) {
  if (!contains(string, "\\text{ ")) return string;
  auto splits = split(string, "\\text{ ");
  if (splits.size() != 2) throw ValueError("strip_string: more than one '\\text{ ' unit in '" + string + "'");
  return splits[0];
}

/// \sqrt3 -> \sqrt{3}
std::string fix_sqrt(const std::string& string) {
  if (!contains(string, "\\sqrt")) return string;
  auto splits = split(string, "\\sqrt");
  std::string new_string = splits[0];
  for (size_t k = 1; k < splits.size(); ++k) {
    const std::string& part = splits[k];
    if (part.empty()) throw ValueError("strip_string: '\\sqrt' without an argument in '" + string + "'");
    if (part[0] != '{') {
      const std::string a = detail::first_char(part);
      new_string += "\\sqrt{" + a + "}" + part.substr(a.size());
    } else {
      new_string += "\\sqrt" + part;
    }
  }
  return new_string;
}

}  // namespace

std::optional<std::string> last_boxed_only_string(const std::string& string) {
  const size_t boxed_space = string.find("\\boxed ");
  if (boxed_space != std::string::npos) {
    return "\\boxed " + split(split(string, "\\boxed ").back(), "$")[0];
  }
  size_t idx = string.rfind("\\boxed");
  if (idx == std::string::npos) {
    idx = string.rfind("\\fbox");
    if (idx == std::string::npos) return std::nullopt;
  }
  return detail::balanced_brace_span(string, idx);
}

std::string remove_boxed(const std::string& s) {
  if (contains(s, "\\boxed ")) {
    const std::string left = "\\boxed ";
    if (s.compare(0, left.size(), left) != 0)
      throw ValueError("remove_boxed: '" + s + "' does not start with '\\boxed '");
    return s.substr(left.size());
  }
  const std::string left = "\\boxed{";
  if (s.compare(0, left.size(), left) != 0 || s.back() != '}') {
    throw ValueError("remove_boxed: '" + s + "' is not of the form \\boxed{...}");
  }
  return s.substr(left.size(), s.size() - left.size() - 1);
}

std::string strip_string(const std::string& input) {
  std::string string = replace_all(input, "\n", "");
  string = replace_all(string, "\\!", "");
  string = replace_all(string, "\\\\", "\\");
  string = replace_all(string, "tfrac", "frac");
  string = replace_all(string, "dfrac", "frac");
  string = replace_all(string, "\\left", "");
  string = replace_all(string, "\\right", "");
  string = replace_all(string, "^{\\circ}", "");
  string = replace_all(string, "^\\circ", "");
  string = replace_all(string, "\\$", "");
  string = remove_right_units(string);
  string = replace_all(string, "\\\\%", "");
  string = replace_all(string, "\\%", "");
  string = replace_all(string, " .", " 0.");
  string = replace_all(string, "{.", "{0.");
  if (string.empty()) return string;
  if (string[0] == '.') string = "0" + string;
  // "k = 3" -> "3" when the left side is at most two characters.
  auto sides = split(string, "=");
  if (sides.size() == 2 && detail::code_points(sides[0]) <= 2) string = sides[1];
  string = fix_sqrt(string);
  string = replace_all(string, " ", "");
  string = fix_fracs(string);
  if (string == "0.5") string = "\\frac{1}{2}";
  return fix_a_slash_b(string);
}

bool is_equiv(const std::optional<std::string>& str1, const std::optional<std::string>& str2) {
  if (!str1 && !str2) return true;
  if (!str1 || !str2) return false;
  try {
    return strip_string(*str1) == strip_string(*str2);
  } catch (const Error&) {
    return *str1 == *str2;
  }
}

double compute_score(const std::string& solution_str, const std::string& ground_truth) {
  try {
    auto boxed = last_boxed_only_string(solution_str);
    if (boxed && is_equiv(remove_boxed(*boxed), ground_truth)) return 1.0;
  } catch (const Error&) {
    // verl prints the error and scores 0 (e.g. an \fbox answer, which remove_boxed rejects).
  }
  return 0.0;
}

}  // namespace hyflow::algos::reward_score::math
