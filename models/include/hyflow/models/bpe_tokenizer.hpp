#pragma once
// Byte-level BPE from a Hugging Face tokenizer.json, as used by Qwen2/Qwen2.5/Qwen3 and
// Llama 3: added/special tokens are split out first, the rest is cut by the pre-tokenizer
// regex (Unicode letter/number/space classes), bytes are mapped to printable characters,
// and BPE merges are applied by rank.

#include <hyflow/models/tokenizer.hpp>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <memory>
#include <unordered_map>

namespace hyflow::models {

class BpeTokenizer final : public Tokenizer {
 public:
  /// Reads tokenizer.json (and tokenizer_config.json next to it, for eos/pad tokens, when
  /// present). Unsupported components raise FormatError naming the file and the field.
  static BpeTokenizer from_file(const std::filesystem::path& tokenizer_json);
  /// From the parsed tokenizer.json; `source` names it in errors.
  BpeTokenizer(const nlohmann::json& tokenizer_json, const std::string& source);

  std::vector<int64_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens = false) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(id_to_token_.size()); }
  std::optional<int64_t> token_to_id(std::string_view token) const override;
  int64_t eos_token_id() const override { return eos_id_; }
  int64_t pad_token_id() const override { return pad_id_; }
  /// The eos / pad tokens by content (tokenizer_config.json sets them in from_file).
  void set_eos_token(std::string_view token);
  void set_pad_token(std::string_view token);

  /// The pre-tokenizer's pieces of a text without added tokens (exposed for tests).
  std::vector<std::string> pre_tokenize(std::string_view text) const;

 private:
  struct AddedToken {
    std::string content;
    int64_t id;
    bool special;
  };
  struct Merge {
    int64_t rank;
    int64_t merged_id;
  };
  void encode_piece(std::string_view piece, std::vector<int64_t>& out) const;

  std::unordered_map<std::string, int64_t> token_to_id_;
  std::vector<std::string> id_to_token_;
  std::unordered_map<uint64_t, Merge> merges_;  // (left id << 32 | right id) -> merge
  std::vector<AddedToken> added_;               // longest content first
  std::unordered_map<int64_t, size_t> added_by_id_;
  int64_t max_digits_ = 1;  // \p{N} run length per piece: 1 (Qwen2) or 3 (Llama 3)
  bool ignore_merges_ = false;
  int64_t eos_id_ = -1, pad_id_ = -1;
};

}  // namespace hyflow::models
