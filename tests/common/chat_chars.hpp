#pragma once
// A character tokenizer that chat templates encode under: printable ASCII and newline, with
// Qwen2.5's turn markers as special tokens and <|im_end|> as the end token. Shared by the agent
// tests (tests/agents, tests/trainer); included as "common/chat_chars.hpp".

#include <hyflow/tokenizers/char_tokenizer.hpp>

namespace hyflow::testing {

inline tokenizers::CharTokenizerOptions chat_chars() {
  tokenizers::CharTokenizerOptions o;
  o.alphabet.clear();
  for (char c = ' '; c <= '~'; ++c) o.alphabet.push_back(c);
  o.alphabet += "\n";
  o.special_tokens = {"<pad>", "<|im_start|>", "<|im_end|>"};
  o.eos_token = "<|im_end|>";
  return o;
}

}  // namespace hyflow::testing
