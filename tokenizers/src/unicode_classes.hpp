#pragma once
// UTF-8 decoding (invalid input as U+FFFD per maximal invalid subpart, like Rust's
// String::from_utf8_lossy and the WHATWG decoder) and the Unicode 16 data the byte-level BPE
// tokenizer needs: the pre-tokenizer regex's classes (\p{L}, \p{N}, \s), simple case folding and
// the Lowercase normalizer's mapping. Tables: unicode_tables.inc (tokenizers/tools/gen_unicode_tables.mjs).

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace hyflow::tokenizers::unicode {

/// A decoded code point and the byte range it came from. A maximal invalid subpart decodes as
/// one U+FFFD (classified as "other") spanning its original bytes.
struct Codepoint {
  char32_t value;
  size_t begin, end;
};

std::vector<Codepoint> decode_utf8(std::string_view text);
/// Appends the UTF-8 encoding of cp.
void append_utf8(std::string& out, char32_t cp);
/// Bytes -> valid UTF-8: each maximal invalid subpart becomes one U+FFFD.
std::string sanitize_utf8(std::string_view bytes);

bool is_letter(char32_t cp);
bool is_number(char32_t cp);
/// White_Space (the regex's \s and Rust's char::is_whitespace).
bool is_space(char32_t cp);
/// Simple case folding (CaseFolding.txt statuses C and S).
char32_t simple_fold(char32_t cp);
/// Full lowercase mapping without context (Rust's char::to_lowercase), appended as UTF-8.
void append_lowercase(std::string& out, char32_t cp);

}  // namespace hyflow::tokenizers::unicode
