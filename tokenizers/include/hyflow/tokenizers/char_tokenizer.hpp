#pragma once
// Character-level tokenizer for the built-in synthetic tasks: special tokens first
// (<pad> = 0, <bos> = 1, <eos> = 2 by default), then one id per alphabet byte.

#include <hyflow/tokenizers/tokenizer.hpp>

#include <array>

namespace hyflow::tokenizers {

struct CharTokenizerOptions {
  /// Single-byte characters, each once. Default: digits, arithmetic, letters, space, newline.
  std::string alphabet = "0123456789+-*/=()<>.,:;?! \nabcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
  std::vector<std::string> special_tokens = {"<pad>", "<bos>", "<eos>"};
  std::string pad_token = "<pad>";
  std::string eos_token = "<eos>";
};

/// The char tokenizer that chat templates encode under: printable ASCII and newline, with ChatML's
/// <|im_start|> and <|im_end|> as special tokens and <|im_end|> as the end token (Qwen2.5's template
/// and hermes tool calls). The built-in chat tasks' models and the agent tests use it.
CharTokenizerOptions chat_char_options();

class CharTokenizer final : public Tokenizer {
 public:
  explicit CharTokenizer(CharTokenizerOptions options = {});

  /// Characters outside the alphabet raise hyflow::ValueError naming the byte offset.
  std::vector<int64_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens = false) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(tokens_.size()); }
  std::optional<int64_t> token_to_id(std::string_view token) const override;
  int64_t eos_token_id() const override { return eos_id_; }
  int64_t pad_token_id() const override { return pad_id_; }

 private:
  std::vector<std::string> tokens_;  // id -> text
  std::array<int64_t, 256> char_ids_{};
  int64_t num_special_ = 0, eos_id_ = -1, pad_id_ = -1;
};

}  // namespace hyflow::tokenizers
