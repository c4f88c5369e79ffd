#pragma once
// The normalizer of a Hugging Face tokenizer.json: NFC, NFD, NFKC, NFKD (ICU), Lowercase,
// Strip, Replace, Prepend and Sequence of these, applied like the tokenizers library.

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace hyflow::tokenizers {

class Normalizer {
 public:
  /// From tokenizer.json's "normalizer" (null: no normalization); `source` names the file in
  /// errors. Other normalizer types raise FormatError naming the type.
  Normalizer(const nlohmann::json& spec, const std::string& source);
  /// True when there is nothing to apply.
  bool empty() const { return steps_.empty(); }
  /// The normalized text (UTF-8; invalid input bytes are read as U+FFFD).
  std::string normalize(std::string_view text) const;

  struct Step;

 private:
  std::vector<std::shared_ptr<const Step>> steps_;
};

}  // namespace hyflow::tokenizers
