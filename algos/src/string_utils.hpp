#pragma once
// Python str semantics the rule scorers rely on (replace, split, slicing by code point).

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace hyflow::algos::reward_score::detail {

/// str.replace(from, to): all non-overlapping occurrences, left to right.
inline std::string replace_all(std::string s, std::string_view from, std::string_view to) {
  if (from.empty()) return s;
  std::string out;
  size_t pos = 0;
  for (size_t hit; (hit = s.find(from, pos)) != std::string::npos; pos = hit + from.size()) {
    out.append(s, pos, hit - pos);
    out.append(to);
  }
  out.append(s, pos, std::string::npos);
  return out;
}

/// str.split(sep) with a non-empty separator.
inline std::vector<std::string> split(const std::string& s, std::string_view sep) {
  std::vector<std::string> parts;
  size_t pos = 0;
  for (size_t hit; (hit = s.find(sep, pos)) != std::string::npos; pos = hit + sep.size()) {
    parts.push_back(s.substr(pos, hit - pos));
  }
  parts.push_back(s.substr(pos));
  return parts;
}

inline bool contains(std::string_view s, std::string_view needle) { return s.find(needle) != std::string_view::npos; }

/// Bytes of the UTF-8 sequence starting with `lead` (1 for stray continuation bytes).
inline size_t utf8_char_len(unsigned char lead) {
  if (lead >= 0xF0) return 4;
  if (lead >= 0xE0) return 3;
  if (lead >= 0xC0) return 2;
  return 1;
}

inline bool is_continuation(unsigned char c) { return (c & 0xC0) == 0x80; }

/// len(s) in code points.
inline size_t code_points(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s) n += is_continuation(c) ? 0 : 1;
  return n;
}

/// s[-n:] in code points.
inline std::string last_chars(const std::string& s, size_t n) {
  size_t count = 0;
  size_t i = s.size();
  while (i > 0 && count < n) {
    --i;
    if (!is_continuation(static_cast<unsigned char>(s[i]))) ++count;
  }
  return s.substr(i);
}

/// The first code point of s (s must be non-empty).
inline std::string first_char(std::string_view s) {
  return std::string(s.substr(0, std::min(s.size(), utf8_char_len(static_cast<unsigned char>(s[0])))));
}

/// str.strip() for ASCII whitespace (Python's set: space, \t\n\v\f\r, \x1c-\x1f).
inline std::string strip(std::string_view s) {
  constexpr std::string_view ws = " \t\n\v\f\r\x1c\x1d\x1e\x1f";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return {};
  const size_t e = s.find_last_not_of(ws);
  return std::string(s.substr(b, e - b + 1));
}

/// The text from `start` through the brace that closes the first '{' at or after it
/// (e.g. "\\boxed{a{b}}"), or nullopt when the braces never balance.
inline std::optional<std::string> balanced_brace_span(const std::string& s, size_t start) {
  int open = 0;
  for (size_t i = start; i < s.size(); ++i) {
    if (s[i] == '{') ++open;
    if (s[i] == '}') {
      --open;
      if (open == 0) return s.substr(start, i + 1 - start);
    }
  }
  return std::nullopt;
}

}  // namespace hyflow::algos::reward_score::detail
