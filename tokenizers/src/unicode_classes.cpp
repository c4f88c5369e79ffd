#include "unicode_classes.hpp"

#include <algorithm>

namespace hyflow::tokenizers::unicode {
namespace {

struct CodepointRange {
  char32_t first, last;
};
struct CodepointPair {
  char32_t from, to;
};
struct CodepointExpansion {
  char32_t from;
  char32_t to[3];
};

#include "unicode_tables.inc"

template <size_t N>
bool in_ranges(const CodepointRange (&ranges)[N], char32_t cp) {
  auto it = std::upper_bound(std::begin(ranges), std::end(ranges), cp,
                             [](char32_t v, const CodepointRange& r) { return v < r.first; });
  return it != std::begin(ranges) && cp <= std::prev(it)->last;
}

template <size_t N>
const CodepointPair* find_pair(const CodepointPair (&pairs)[N], char32_t cp) {
  auto it = std::lower_bound(std::begin(pairs), std::end(pairs), cp,
                             [](const CodepointPair& p, char32_t v) { return p.from < v; });
  return it != std::end(pairs) && it->from == cp ? it : nullptr;
}

bool in(unsigned char b, unsigned char lo, unsigned char hi) {
  return b >= lo && b <= hi;
}

// The UTF-8 sequence at p: its length and value when valid; otherwise the length of the maximal
// invalid subpart (at least 1) and U+FFFD. Unicode's table 3-7 of well-formed byte sequences.
size_t decode_one(const unsigned char* p, size_t avail, char32_t* cp) {
  const unsigned char b = p[0];
  if (b < 0x80) {
    *cp = b;
    return 1;
  }
  size_t len;
  unsigned char lo = 0x80, hi = 0xBF;  // range of the second byte
  char32_t v;
  if (in(b, 0xC2, 0xDF)) {
    len = 2, v = b & 0x1F;
  } else if (in(b, 0xE0, 0xEF)) {
    len = 3, v = b & 0x0F;
    if (b == 0xE0) lo = 0xA0;
    if (b == 0xED) hi = 0x9F;
  } else if (in(b, 0xF0, 0xF4)) {
    len = 4, v = b & 0x07;
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;
  } else {
    *cp = 0xFFFD;
    return 1;
  }
  for (size_t i = 1; i < len; ++i) {
    if (i >= avail || !in(p[i], i == 1 ? lo : 0x80, i == 1 ? hi : 0xBF)) {
      *cp = 0xFFFD;
      return i;
    }
    v = (v << 6) | (p[i] & 0x3F);
  }
  *cp = v;
  return len;
}

}  // namespace

std::vector<Codepoint> decode_utf8(std::string_view text) {
  std::vector<Codepoint> out;
  out.reserve(text.size());
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  for (size_t i = 0; i < text.size();) {
    char32_t cp;
    const size_t len = decode_one(p + i, text.size() - i, &cp);
    out.push_back({cp, i, i + len});
    i += len;
  }
  return out;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string sanitize_utf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  for (size_t i = 0; i < bytes.size();) {
    char32_t cp;
    const size_t len = decode_one(p + i, bytes.size() - i, &cp);
    if (cp == 0xFFFD && !(len == 3 && p[i] == 0xEF && p[i + 1] == 0xBF && p[i + 2] == 0xBD)) {
      append_utf8(out, 0xFFFD);
    } else {
      out.append(bytes.substr(i, len));
    }
    i += len;
  }
  return out;
}

bool is_letter(char32_t cp) {
  if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
  return in_ranges(kLetterRanges, cp);
}

bool is_number(char32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  return in_ranges(kNumberRanges, cp);
}

bool is_space(char32_t cp) {
  return in_ranges(kWhitespaceRanges, cp);
}

char32_t simple_fold(char32_t cp) {
  const auto* p = find_pair(kCaseFold, cp);
  return p ? p->to : cp;
}

void append_lowercase(std::string& out, char32_t cp) {
  for (const auto& e : kLowercaseExpansions) {
    if (e.from == cp) {
      for (char32_t c : e.to) {
        if (c != 0) append_utf8(out, c);
      }
      return;
    }
  }
  const auto* p = find_pair(kLowercase, cp);
  append_utf8(out, p ? p->to : cp);
}

}  // namespace hyflow::tokenizers::unicode
