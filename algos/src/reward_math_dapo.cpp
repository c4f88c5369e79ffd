// DAPO math scorer (verl reward_score/math_dapo.py): Minerva "Answer:" extraction and
// normalisation, or a strict boxed comparison.
#include <hyflow/algos/reward_score.hpp>
#include <hyflow/core/error.hpp>

#include "string_utils.hpp"

#include <algorithm>
#include <array>
#include <string_view>
#include <utility>
#include <vector>

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
    "square",     "ways",       "integers",  "dollars",      "mph",
    "inches",     "hours",      "km",        "units",        "\\ldots",
    "sue",        "points",     "feet",      "minutes",      "digits",
    "cents",      "degrees",    "cm",        "gm",           "pounds",
    "meters",     "meals",      "edges",     "students",     "childrentickets",
    "multiples",  "\\text{s}",  "\\text{.}", "\\text{\ns}",  "\\text{}^2",
    "\\text{}^3", "\\text{\n}", "\\text{}",  "\\mathrm{th}", "^\\circ",
    "^{\\circ}",  "\\;",        ",\\!",      "{,}",          "\"",
    "\\dots"};

using U32 = std::u32string;
constexpr size_t npos = U32::npos;

// Python's re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", "$\3$", s): '.' stops at '\n', so every line
// with two '$' becomes "$" + the text between its first two '$' + "$"; other lines stay.
U32 keep_first_math_span(const U32& s) {
  U32 out;
  for (size_t line = 0;;) {
    const size_t nl = s.find(U'\n', line);
    const size_t end = nl == npos ? s.size() : nl;
    const size_t d1 = s.find(U'$', line);
    const size_t d2 = d1 < end ? s.find(U'$', d1 + 1) : npos;
    if (d2 < end) {
      out += U'$';
      out.append(s, d1 + 1, d2 - d1 - 1);
      out += U'$';
    } else {
      out.append(s, line, end - line);
    }
    if (nl == npos) return out;
    out += U'\n';
    line = nl + 1;
  }
}

// re.sub(prefix + r"(.*?)(\})", r"\2", s) when `greedy` is false, (.*) when true: each prefix
// followed on its line by a '}' is replaced by the text up to the first (greedy: last) '}'.
U32 unwrap_braced(const U32& s, std::u32string_view prefix, bool greedy) {
  U32 out;
  size_t pos = 0;
  for (size_t hit; (hit = s.find(prefix, pos)) != npos;) {
    const size_t body = hit + prefix.size();
    const size_t line_end = std::min(s.find(U'\n', body), s.size());
    const size_t close = greedy ? s.rfind(U'}', line_end == 0 ? 0 : line_end - 1) : s.find(U'}', body);
    if (close != npos && close >= body && close < line_end) {
      out.append(s, pos, hit - pos);
      out.append(s, body, close - body);
      pos = close + 1;
    } else {  // no match here: the search resumes one character later
      out.append(s, pos, hit + 1 - pos);
      pos = hit + 1;
    }
  }
  out.append(s, pos, npos);
  return out;
}

// re.sub(r"(frac)([^{])(.)", r"frac{\2}{\3}", s) and re.sub(r"(sqrt)([^{])", r"sqrt{\2}", s):
// `word` followed by `braced` characters, the first not '{' (it may be '\n') and the second
// not '\n', gets each of them wrapped in braces.
U32 brace_shorthand(const U32& s, std::u32string_view word, size_t braced) {
  U32 out;
  size_t pos = 0;
  for (size_t hit; (hit = s.find(word, pos)) != npos;) {
    const size_t a = hit + word.size();
    const bool ok = a + braced <= s.size() && s[a] != U'{' && (braced < 2 || s[a + 1] != U'\n');
    if (!ok) {
      out.append(s, pos, hit + 1 - pos);
      pos = hit + 1;
      continue;
    }
    out.append(s, pos, a - pos);
    for (size_t k = 0; k < braced; ++k) {
      out += U'{';
      out += s[a + k];
      out += U'}';
    }
    pos = a + braced;
  }
  out.append(s, pos, npos);
  return out;
}

// A letter of (?i)"answer": ASCII either case, and 's' also matches U+017F (long s), as
// Python's case-insensitive matching does.
bool answer_letter(char32_t c, char32_t lower) {
  return c == lower || c == lower - 32 || (lower == U's' && c == 0x17F);
}

// The group of r"(?i)Answer\s*:\s*([^\n]+)" matched at `p`, as [begin, end), if it matches.
std::optional<std::pair<size_t, size_t>> answer_at(const U32& s, size_t p) {
  constexpr std::u32string_view word = U"answer";
  if (p + word.size() > s.size()) return std::nullopt;
  for (size_t k = 0; k < word.size(); ++k)
    if (!answer_letter(s[p + k], word[k])) return std::nullopt;
  size_t i = p + word.size();
  while (i < s.size() && detail::is_python_space(s[i])) ++i;
  if (i >= s.size() || s[i] != U':') return std::nullopt;
  const size_t ws_begin = ++i;
  while (i < s.size() && detail::is_python_space(s[i])) ++i;
  // \s* gives back whitespace until [^\n]+ can take at least one character
  for (size_t k = i + 1; k-- > ws_begin;) {
    if (k < s.size() && s[k] != U'\n') return std::pair(k, std::min(s.find(U'\n', k), s.size()));
  }
  return std::nullopt;
}

// Python's s[start:] on code points.
std::string python_tail_from(const std::string& s, int64_t start) {
  const U32 u = detail::decode_utf8(s);
  const auto n = static_cast<int64_t>(u.size());
  if (start < 0) start = std::max<int64_t>(start + n, 0);
  return start >= n ? std::string() : detail::encode_utf8(std::u32string_view(u).substr(static_cast<size_t>(start)));
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
  // The needles are ASCII: replacing them in UTF-8 bytes is replacing them in code points.
  for (const auto& [before, after] : kSubstitutions) final_answer = replace_all(final_answer, before, after);
  for (auto expr : kRemovedExpressions) final_answer = replace_all(final_answer, expr, "");

  // verl's regexes, on code points so that a multi-byte character is one '.'
  U32 u = keep_first_math_span(detail::decode_utf8(final_answer));
  u = unwrap_braced(u, U"\\text{", false);
  u = unwrap_braced(u, U"\\textbf{", false);
  u = unwrap_braced(u, U"\\overline{", false);
  u = unwrap_braced(u, U"\\boxed{", true);
  u = brace_shorthand(u, U"frac", 2);
  u = brace_shorthand(u, U"sqrt", 1);
  std::erase(u, U'$');

  U32 without_commas = u;
  std::erase(without_commas, U',');
  if (detail::is_python_digits(without_commas)) u = std::move(without_commas);
  return detail::encode_utf8(detail::strip(u));
}

std::pair<bool, std::string> is_correct_minerva(const std::string& solution_str, const std::string& gt,
                                                bool gt_need_extract) {
  // re.findall's last match: matches do not overlap, the next search starts where one ends
  const U32 u = detail::decode_utf8(solution_str);
  std::optional<std::pair<size_t, size_t>> last;
  for (size_t p = 0; p < u.size();) {
    if (auto m = answer_at(u, p)) {
      last = m;
      p = m->second;
    } else {
      ++p;
    }
  }
  const std::string extracted =
      last ? detail::encode_utf8(std::u32string_view(u).substr(last->first, last->second - last->first)) : "[INVALID]";
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

std::pair<int, std::optional<std::string>> is_correct_strict_box(
    const std::string& pred, const std::string& gt, const std::optional<std::vector<int64_t>>& pause_tokens_index) {
  std::string tail;
  if (pause_tokens_index) {
    if (pause_tokens_index->size() != 4)
      throw ValueError("math_dapo.is_correct_strict_box: pause_tokens_index needs 4 indices, got " +
                       std::to_string(pause_tokens_index->size()));
    tail = python_tail_from(pred, pause_tokens_index->back() - 100);
  } else {
    tail = detail::last_chars(pred, 100);
  }
  const auto boxed = last_boxed_only_string(tail);
  std::optional<std::string> extracted;
  if (boxed) extracted = remove_boxed(*boxed);
  return {extracted == gt ? 1 : -1, extracted};
}

std::pair<bool, std::optional<std::string>> verify(const std::string& solution_str, const std::string& answer,
                                                   bool strict_box_verify,
                                                   const std::optional<std::vector<int64_t>>& pause_tokens_index) {
  if (strict_box_verify) {
    auto [score, pred] = is_correct_strict_box(solution_str, answer, pause_tokens_index);
    return {score == 1, pred};
  }
  return is_correct_minerva(solution_str, answer);
}

ScoreResult compute_score(const std::string& solution_str, const std::string& ground_truth, bool strict_box_verify,
                          const std::optional<std::vector<int64_t>>& pause_tokens_index) {
  // The longest MATH-500 answer has 159 characters: the tail suffices.
  const std::string tail = detail::last_chars(solution_str, 300);
  auto [correct, pred] = verify(tail, ground_truth, strict_box_verify, pause_tokens_index);
  return {correct ? 1.0 : -1.0, {{"acc", correct}, {"pred", pred ? nlohmann::json(*pred) : nlohmann::json()}}};
}

}  // namespace hyflow::algos::reward_score::math_dapo
