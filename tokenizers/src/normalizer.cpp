#include "normalizer.hpp"

#include <hyflow/core/error.hpp>

#include "unicode_classes.hpp"

#include <unicode/normalizer2.h>
#include <unicode/regex.h>
#include <unicode/uniset.h>
#include <unicode/unistr.h>

namespace hyflow::tokenizers {

struct Normalizer::Step {
  enum class Kind { kUnicode, kLowercase, kStrip, kReplaceString, kReplaceRegex, kPrepend } kind;
  const icu::Normalizer2* unicode = nullptr;  // kUnicode
  bool strip_left = false, strip_right = false;
  std::string pattern, content;              // kReplaceString: pattern -> content; kPrepend: content
  std::unique_ptr<icu::RegexPattern> regex;  // kReplaceRegex
  icu::UnicodeString regex_replacement;      // content with ICU's '$' and '\\' escaped
};

namespace {

using Json = nlohmann::json;
using Step = Normalizer::Step;

// The tokenizers library normalizes with the Unicode 9.0 data of its unicode-normalization
// fork: characters assigned later are left as they are, like unassigned ones (starters without
// decompositions). ICU's FilteredNormalizer2 does the same with the set of characters that
// Unicode 9.0 had assigned (ICU's Age property); the test compares every code point.
constexpr const char* kNormalizationAge = "[:age=9.0:]";

const icu::Normalizer2* unicode_normalizer(const std::string& type, const std::string& where) {
  struct Forms {
    UErrorCode status = U_ZERO_ERROR;  // first: the filter's constructor sets it
    icu::UnicodeSet filter;
    std::unique_ptr<icu::FilteredNormalizer2> nfc, nfd, nfkc, nfkd;
    Forms() : filter(icu::UnicodeString(kNormalizationAge, -1, US_INV), status) {
      filter.freeze();
      auto make = [&](const icu::Normalizer2* n) {
        return U_SUCCESS(status) ? std::make_unique<icu::FilteredNormalizer2>(*n, filter) : nullptr;
      };
      nfc = make(icu::Normalizer2::getNFCInstance(status));
      nfd = make(icu::Normalizer2::getNFDInstance(status));
      nfkc = make(icu::Normalizer2::getNFKCInstance(status));
      nfkd = make(icu::Normalizer2::getNFKDInstance(status));
    }
  };
  static const Forms forms;
  if (U_FAILURE(forms.status)) throw Error(where + ": ICU has no " + type + " data: " + u_errorName(forms.status));
  return type == "NFC"    ? forms.nfc.get()
         : type == "NFD"  ? forms.nfd.get()
         : type == "NFKC" ? forms.nfkc.get()
                          : forms.nfkd.get();
}

std::string string_field(const Json& spec, const char* key, const std::string& where) {
  if (!spec.contains(key) || !spec[key].is_string()) throw FormatError(where + ": needs the string '" + key + "'");
  return spec[key].get<std::string>();
}

void add_steps(const Json& spec, const std::string& where, std::vector<std::shared_ptr<const Step>>& steps) {
  if (spec.is_null()) return;
  if (!spec.is_object() || !spec.contains("type") || !spec["type"].is_string()) {
    throw FormatError(where + ": a normalizer must be an object with a string 'type'");
  }
  const auto type = spec["type"].get<std::string>();
  auto step = std::make_shared<Step>();
  UErrorCode status = U_ZERO_ERROR;
  if (type == "Sequence") {
    if (!spec.contains("normalizers") || !spec["normalizers"].is_array()) {
      throw FormatError(where + ": Sequence needs the array 'normalizers'");
    }
    for (size_t i = 0; i < spec["normalizers"].size(); ++i) {
      add_steps(spec["normalizers"][i], where + ".normalizers[" + std::to_string(i) + "]", steps);
    }
    return;
  } else if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    step->kind = Step::Kind::kUnicode;
    step->unicode = unicode_normalizer(type, where);
  } else if (type == "Lowercase") {
    step->kind = Step::Kind::kLowercase;
  } else if (type == "Strip") {
    step->kind = Step::Kind::kStrip;
    step->strip_left = spec.value("strip_left", true);
    step->strip_right = spec.value("strip_right", true);
  } else if (type == "Prepend") {
    step->kind = Step::Kind::kPrepend;
    step->content = string_field(spec, "prepend", where);
  } else if (type == "Replace") {
    step->content = string_field(spec, "content", where);
    const auto& pattern = spec.contains("pattern") ? spec["pattern"] : Json();
    if (pattern.contains("String") && pattern["String"].is_string()) {
      step->kind = Step::Kind::kReplaceString;
      step->pattern = pattern["String"].get<std::string>();
    } else if (pattern.contains("Regex") && pattern["Regex"].is_string()) {
      step->kind = Step::Kind::kReplaceRegex;
      step->pattern = pattern["Regex"].get<std::string>();
      for (const auto& cp : unicode::decode_utf8(step->content)) {
        if (cp.value == '$' || cp.value == '\\') step->regex_replacement.append(static_cast<UChar32>('\\'));
        step->regex_replacement.append(static_cast<UChar32>(cp.value));
      }
      UParseError parse_error;
      step->regex.reset(
          icu::RegexPattern::compile(icu::UnicodeString::fromUTF8(step->pattern), 0, parse_error, status));
      if (U_FAILURE(status)) {
        throw FormatError(where + ": Replace regex '" + step->pattern + "' does not compile: " + u_errorName(status));
      }
    } else {
      throw FormatError(where + ": Replace needs 'pattern' {\"String\": ...} or {\"Regex\": ...}");
    }
    if (step->kind == Step::Kind::kReplaceString && step->pattern.empty()) {
      throw FormatError(where + ": Replace has an empty pattern");
    }
  } else {
    throw FormatError(where + ": normalizer '" + type +
                      "' is not supported (NFC, NFD, NFKC, NFKD, Lowercase, Strip, Replace, Prepend, Sequence)");
  }
  steps.push_back(std::move(step));
}

std::string apply(const Step& step, std::string text) {
  switch (step.kind) {
    case Step::Kind::kUnicode: {
      UErrorCode status = U_ZERO_ERROR;
      const auto in = icu::UnicodeString::fromUTF8(text);
      if (step.unicode->isNormalized(in, status) && U_SUCCESS(status)) return unicode::sanitize_utf8(text);
      status = U_ZERO_ERROR;
      const auto out = step.unicode->normalize(in, status);
      if (U_FAILURE(status)) throw Error(std::string("Unicode normalization failed: ") + u_errorName(status));
      std::string result;
      return out.toUTF8String(result);
    }
    case Step::Kind::kLowercase: {
      std::string out;
      out.reserve(text.size());
      for (const auto& cp : unicode::decode_utf8(text)) unicode::append_lowercase(out, cp.value);
      return out;
    }
    case Step::Kind::kStrip: {
      const auto cps = unicode::decode_utf8(text);
      size_t first = 0, last = cps.size();
      if (step.strip_left) {
        while (first < last && unicode::is_space(cps[first].value)) ++first;
      }
      if (step.strip_right) {
        while (last > first && unicode::is_space(cps[last - 1].value)) --last;
      }
      if (first == last) return {};
      return unicode::sanitize_utf8(
          std::string_view(text).substr(cps[first].begin, cps[last - 1].end - cps[first].begin));
    }
    case Step::Kind::kReplaceString: {
      std::string out;
      size_t at = 0;
      for (size_t hit; (hit = text.find(step.pattern, at)) != std::string::npos; at = hit + step.pattern.size()) {
        out.append(text, at, hit - at);
        out += step.content;
      }
      out.append(text, at, std::string::npos);
      return out;
    }
    case Step::Kind::kReplaceRegex: {
      UErrorCode status = U_ZERO_ERROR;
      const auto in = icu::UnicodeString::fromUTF8(text);
      std::unique_ptr<icu::RegexMatcher> matcher(step.regex->matcher(in, status));
      const auto out = U_SUCCESS(status) ? matcher->replaceAll(step.regex_replacement, status) : icu::UnicodeString();
      if (U_FAILURE(status)) throw Error("Replace regex '" + step.pattern + "' failed: " + u_errorName(status));
      std::string result;
      return out.toUTF8String(result);
    }
    case Step::Kind::kPrepend:
      return text.empty() ? text : step.content + text;
  }
  return text;
}

}  // namespace

Normalizer::Normalizer(const Json& spec, const std::string& source) {
  add_steps(spec, source + ": normalizer", steps_);
}

std::string Normalizer::normalize(std::string_view text) const {
  std::string out(text);
  for (const auto& step : steps_) out = apply(*step, std::move(out));
  return out;
}

}  // namespace hyflow::tokenizers
