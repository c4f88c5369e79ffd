#include "unicode_classes.hpp"

#include <algorithm>

namespace hyflow::models::unicode {
namespace {

struct CodepointRange {
  char32_t first, last;
};

#include "unicode_tables.inc"

template <size_t N>
bool in_ranges(const CodepointRange (&ranges)[N], char32_t cp) {
  auto it = std::upper_bound(std::begin(ranges), std::end(ranges), cp,
                             [](char32_t v, const CodepointRange& r) { return v < r.first; });
  return it != std::begin(ranges) && cp <= std::prev(it)->last;
}

// Length of the valid UTF-8 sequence at p (0 if invalid), value in *cp.
size_t decode_one(const unsigned char* p, size_t avail, char32_t* cp) {
  const unsigned char b = p[0];
  size_t len;
  char32_t v, min;
  if (b < 0x80) { *cp = b; return 1; }
  if ((b & 0xE0) == 0xC0) { len = 2; v = b & 0x1F; min = 0x80; }
  else if ((b & 0xF0) == 0xE0) { len = 3; v = b & 0x0F; min = 0x800; }
  else if ((b & 0xF8) == 0xF0) { len = 4; v = b & 0x07; min = 0x10000; }
  else return 0;
  if (avail < len) return 0;
  for (size_t i = 1; i < len; ++i) {
    if ((p[i] & 0xC0) != 0x80) return 0;
    v = (v << 6) | (p[i] & 0x3F);
  }
  if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
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
    size_t len = decode_one(p + i, text.size() - i, &cp);
    if (len == 0) {
      cp = 0xFFFD;
      len = 1;
    }
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
  for (const auto& cp : decode_utf8(bytes)) {
    if (cp.value == 0xFFFD && cp.end - cp.begin == 1) {
      append_utf8(out, 0xFFFD);
    } else {
      out.append(bytes.substr(cp.begin, cp.end - cp.begin));
    }
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

bool is_space(char32_t cp) { return in_ranges(kWhitespaceRanges, cp); }

}  // namespace hyflow::models::unicode
