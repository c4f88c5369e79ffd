#pragma once
// The tokenizer interface shared by the byte-level BPE tokenizer (Hugging Face
// tokenizer.json) and the character-level tokenizer of the built-in synthetic tasks, plus
// left-padded batching of prompts.

#include <hyflow/dataproto/data_proto.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace hyflow::tokenizers {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  /// Text -> ids. Special tokens written in the text are recognized; nothing is added.
  virtual std::vector<int64_t> encode(std::string_view text) const = 0;
  /// Ids -> text. Unknown ids raise hyflow::ValueError naming the id.
  virtual std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens = false) const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual std::optional<int64_t> token_to_id(std::string_view token) const = 0;
  virtual int64_t eos_token_id() const = 0;
  virtual int64_t pad_token_id() const = 0;
};

/// Encodes every text and left-pads to the longest (or to max_length, which must hold all):
/// input_ids (B, P) with pad_token_id on the left, attention_mask (B, P), and verl's
/// position_ids clip(cumsum(mask) - 1, 0). Ready for generate().
DataProto encode_prompts(const Tokenizer& tokenizer, const std::vector<std::string>& texts,
                         std::optional<int64_t> max_length = std::nullopt);

}  // namespace hyflow::tokenizers
