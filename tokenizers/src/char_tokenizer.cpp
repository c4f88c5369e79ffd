#include <hyflow/tokenizers/char_tokenizer.hpp>

#include <hyflow/core/error.hpp>

namespace hyflow::tokenizers {

CharTokenizerOptions chat_char_options() {
  CharTokenizerOptions o;
  o.alphabet.clear();
  for (char c = ' '; c <= '~'; ++c) o.alphabet.push_back(c);
  o.alphabet += "\n";
  o.special_tokens = {"<pad>", "<|im_start|>", "<|im_end|>"};
  o.eos_token = "<|im_end|>";
  return o;
}

CharTokenizer::CharTokenizer(CharTokenizerOptions options) {
  char_ids_.fill(-1);
  for (const auto& s : options.special_tokens) {
    if (s.size() < 2) throw ValueError("CharTokenizer: special token '" + s + "' must be longer than one character");
    tokens_.push_back(s);
  }
  num_special_ = static_cast<int64_t>(tokens_.size());
  for (unsigned char c : options.alphabet) {
    if (c >= 0x80) throw ValueError("CharTokenizer: alphabet byte " + std::to_string(c) + " is not ASCII");
    if (char_ids_[c] >= 0)
      throw ValueError(std::string("CharTokenizer: alphabet repeats '") + static_cast<char>(c) + "'");
    char_ids_[c] = static_cast<int64_t>(tokens_.size());
    tokens_.emplace_back(1, static_cast<char>(c));
  }
  auto special = [&](const std::string& name) {
    auto id = token_to_id(name);
    if (!id || *id >= num_special_) throw ValueError("CharTokenizer: '" + name + "' must be one of the special tokens");
    return *id;
  };
  pad_id_ = special(options.pad_token);
  eos_id_ = special(options.eos_token);
}

std::vector<int64_t> CharTokenizer::encode(std::string_view text) const {
  std::vector<int64_t> ids;
  ids.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    bool matched = false;
    for (int64_t s = 0; s < num_special_ && !matched; ++s) {
      const auto& tok = tokens_[static_cast<size_t>(s)];
      if (text.compare(pos, tok.size(), tok) == 0) {
        ids.push_back(s);
        pos += tok.size();
        matched = true;
      }
    }
    if (matched) continue;
    const auto c = static_cast<unsigned char>(text[pos]);
    if (char_ids_[c] < 0) {
      throw ValueError("CharTokenizer: character code " + std::to_string(c) + " at byte " + std::to_string(pos) +
                       " is not in the alphabet");
    }
    ids.push_back(char_ids_[c]);
    ++pos;
  }
  return ids;
}

std::string CharTokenizer::decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const {
  std::string out;
  for (int64_t id : ids) {
    if (id < 0 || id >= vocab_size()) throw ValueError("CharTokenizer: unknown token id " + std::to_string(id));
    if (skip_special_tokens && id < num_special_) continue;
    out += tokens_[static_cast<size_t>(id)];
  }
  return out;
}

std::optional<int64_t> CharTokenizer::token_to_id(std::string_view token) const {
  for (size_t i = 0; i < tokens_.size(); ++i) {
    if (tokens_[i] == token) return static_cast<int64_t>(i);
  }
  return std::nullopt;
}

}  // namespace hyflow::tokenizers
