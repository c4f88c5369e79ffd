#pragma once
// UTF-8 decoding and the Unicode classes (\p{L}, \p{N}, \s) of the pre-tokenizer regex.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace hyflow::models::unicode {

/// A decoded code point and the byte range it came from. Invalid bytes decode one at a
/// time as U+FFFD (classified as "other") but keep their original byte.
struct Codepoint {
  char32_t value;
  size_t begin, end;
};

std::vector<Codepoint> decode_utf8(std::string_view text);
/// Appends the UTF-8 encoding of cp.
void append_utf8(std::string& out, char32_t cp);
/// Bytes -> valid UTF-8: each invalid byte becomes U+FFFD (lossy, like the reference decoders).
std::string sanitize_utf8(std::string_view bytes);

bool is_letter(char32_t cp);
bool is_number(char32_t cp);
bool is_space(char32_t cp);

}  // namespace hyflow::models::unicode
