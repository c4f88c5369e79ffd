#pragma once
// Python str semantics the rule scorers rely on (replace, split, slicing by code point,
// strip, isdigit, the re module's \s).

#include "python_unicode_tables.hpp"

#include <algorithm>
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

inline bool contains(std::string_view s, std::string_view needle) {
  return s.find(needle) != std::string_view::npos;
}

/// Bytes of the UTF-8 sequence starting with `lead` (1 for stray continuation bytes).
inline size_t utf8_char_len(unsigned char lead) {
  if (lead >= 0xF0) return 4;
  if (lead >= 0xE0) return 3;
  if (lead >= 0xC0) return 2;
  return 1;
}

inline bool is_continuation(unsigned char c) {
  return (c & 0xC0) == 0x80;
}

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

/// UTF-8 -> code points. A byte that does not start a valid sequence becomes U+DC80..U+DCFF
/// (Python's surrogateescape), so encode_utf8 gives the input back byte for byte.
inline std::u32string decode_utf8(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const auto lead = static_cast<unsigned char>(s[i]);
    const size_t len = lead < 0x80 ? 1 : lead >= 0xC2 && lead <= 0xF4 ? utf8_char_len(lead) : 0;
    char32_t cp = len == 1 ? lead : len == 2 ? lead & 0x1F : len == 3 ? lead & 0x0F : lead & 0x07;
    bool ok = len > 0 && i + len <= s.size();
    for (size_t k = 1; ok && k < len; ++k) {
      const auto c = static_cast<unsigned char>(s[i + k]);
      ok = is_continuation(c);
      cp = (cp << 6) | (c & 0x3F);
    }
    // overlong 3/4-byte forms, UTF-16 surrogates and values above U+10FFFF are invalid too
    if (ok &&
        ((len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF))))
      ok = false;
    if (ok) {
      out.push_back(cp);
      i += len;
    } else {
      out.push_back(0xDC00 + lead);
      ++i;
    }
  }
  return out;
}

/// Code points -> UTF-8; U+DC80..U+DCFF go back to the raw bytes they stand for.
inline std::string encode_utf8(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t cp : s) {
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp));
    } else if (cp >= 0xDC80 && cp <= 0xDCFF) {
      out.push_back(static_cast<char>(cp - 0xDC00));
    } else if (cp < 0x800) {
      out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }
  return out;
}

template <size_t N>
bool in_ranges(const CodePointRange (&table)[N], char32_t cp) {
  const auto* it = std::upper_bound(std::begin(table), std::end(table), cp,
                                    [](char32_t c, const CodePointRange& r) { return c < r.first; });
  return it != std::begin(table) && cp <= (it - 1)->last;
}

/// str.isspace() of one code point; also what the re module's \s matches in str patterns.
inline bool is_python_space(char32_t cp) {
  return in_ranges(kPythonSpaces, cp);
}

/// str.isdigit(): non-empty and every code point a digit (Unicode digits, not only 0-9).
inline bool is_python_digits(std::u32string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char32_t cp) { return in_ranges(kPythonDigits, cp); });
}

/// str.strip(): removes leading and trailing Unicode whitespace.
inline std::u32string strip(std::u32string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && is_python_space(s[b])) ++b;
  while (e > b && is_python_space(s[e - 1])) --e;
  return std::u32string(s.substr(b, e - b));
}

inline std::string strip(std::string_view s) {
  return encode_utf8(strip(decode_utf8(s)));
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
