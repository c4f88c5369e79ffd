#pragma once
// Byte-level BPE from a Hugging Face tokenizer.json, as used by Qwen2/Qwen2.5/Qwen3 and
// Llama 3, applied like the tokenizers library: added tokens whose `normalized` is false are
// split out of the raw text first; each remaining part is normalized (NFC, NFD, NFKC, NFKD,
// Lowercase, Strip, Replace, Prepend, Sequence), added tokens whose `normalized` is true are split
// out of it, the rest is cut by the pre-tokenizer regex (Unicode 16 letter/number/space classes),
// bytes are mapped to printable characters, and BPE merges are applied by rank.

#include <hyflow/tokenizers/tokenizer.hpp>

#include <nlohmann/json.hpp>

#include <array>
#include <filesystem>
#include <memory>
#include <unordered_map>

namespace hyflow::tokenizers {

class Normalizer;

class BpeTokenizer final : public Tokenizer {
 public:
  /// Reads tokenizer.json (and tokenizer_config.json next to it, for eos/pad tokens, when
  /// present). Unsupported components raise FormatError naming the file and the field.
  static BpeTokenizer from_file(const std::filesystem::path& tokenizer_json);
  /// From the parsed tokenizer.json; `source` names it in errors.
  BpeTokenizer(const nlohmann::json& tokenizer_json, const std::string& source);

  std::vector<int64_t> encode(std::string_view text) const override;
  /// Like the tokenizers library's ByteLevel decoder: the tokens' bytes, concatenated, read as
  /// UTF-8 with one U+FFFD per maximal invalid subpart. Unknown ids raise ValueError.
  std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens = false) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(id_to_token_.size()); }
  std::optional<int64_t> token_to_id(std::string_view token) const override;
  int64_t eos_token_id() const override { return eos_id_; }
  int64_t pad_token_id() const override { return pad_id_; }
  /// The eos / pad tokens by content (tokenizer_config.json sets them in from_file).
  void set_eos_token(std::string_view token);
  void set_pad_token(std::string_view token);

  /// The pre-tokenizer's pieces of a text without added tokens, not normalized (exposed for tests).
  std::vector<std::string> pre_tokenize(std::string_view text) const;
  /// The text after tokenizer.json's normalizer (the text itself when there is none).
  std::string normalize(std::string_view text) const;

 private:
  struct AddedToken {
    std::string content;  // as written; matched on the raw text when !normalized
    std::string pattern;  // what is matched: content, or its normalized form when normalized
    int64_t id;
    bool special;
    bool normalized;
  };
  struct Merge {
    int64_t rank;
    int64_t merged_id;
  };
  struct WordCache;
  // Splits text on the added tokens with the given `normalized` flag (leftmost longest);
  // calls on_text for the text between them and on_token for each token.
  template <typename OnText, typename OnToken>
  void split_added(std::string_view text, bool normalized, OnText&& on_text, OnToken&& on_token) const;
  void encode_text(std::string_view text, std::vector<int64_t>& out) const;
  void encode_piece(std::string_view piece, std::vector<int64_t>& out) const;
  void bpe(std::string_view piece, std::vector<int64_t>& out) const;

  std::unordered_map<std::string, int64_t> token_to_id_;
  std::vector<std::string> id_to_token_;
  std::unordered_map<uint64_t, Merge> merges_;  // (left id << 32 | right id) -> merge
  std::array<int64_t, 256> byte_ids_{};         // byte -> id of its byte-level token
  std::vector<AddedToken> added_;               // longest pattern first
  std::unordered_map<int64_t, size_t> added_by_id_;
  std::shared_ptr<const Normalizer> normalizer_;
  std::shared_ptr<WordCache> cache_;
  int64_t max_digits_ = 1;  // \p{N} run length per piece: 1 (Qwen2) or 3 (Llama 3)
  bool ignore_merges_ = false;
  int64_t eos_id_ = -1, pad_id_ = -1;
};

}  // namespace hyflow::tokenizers
