#pragma once
// A served tiny model for the server tests: printable-ASCII character tokenizer, the tests'
// tiny Qwen2 shape over its vocabulary, an EngineLoop and a Server on a free loopback port.

#include "common/tiny_model.hpp"

#include <hyflow/serve/server.hpp>
#include <hyflow/tokenizers/char_tokenizer.hpp>

#include <memory>

namespace hyflow::testing {

inline std::shared_ptr<tokenizers::CharTokenizer> printable_tokenizer() {
  tokenizers::CharTokenizerOptions o;
  o.alphabet.clear();
  for (char c = ' '; c <= '~'; ++c) o.alphabet.push_back(c);
  o.alphabet += "\n";
  return std::make_shared<tokenizers::CharTokenizer>(o);
}

// hidden > 32 widens the model (slower steps, for tests that race the engine).
inline models::CausalLM served_model(const tokenizers::Tokenizer& tok, int64_t hidden = 32, uint64_t seed = 5) {
  torch::manual_seed(seed);
  TinyShape shape;
  shape.vocab_size = tok.vocab_size();
  shape.max_position_embeddings = 4096;
  auto config = tiny_model_config(shape);
  config.hidden_size = hidden;
  config.intermediate_size = 3 * hidden;
  models::CausalLM model(config);
  model->eval();
  return model;
}

struct ServedTiny {
  std::shared_ptr<tokenizers::CharTokenizer> tokenizer = printable_tokenizer();
  models::CausalLM model;
  std::unique_ptr<serve::EngineLoop> loop;
  std::unique_ptr<serve::Server> server;

  explicit ServedTiny(serve::ServeOptions options = {}, serve::EngineLoopOptions loop_options = {},
                      int64_t max_batch = 16, int64_t hidden = 32)
      : model(served_model(*tokenizer, hidden)) {
    if (loop_options.eos_token_ids.empty()) loop_options.eos_token_ids = {tokenizer->eos_token_id()};
    if (options.chat_stop.empty()) options.chat_stop = {"<|im_end|>"};
    options.served_model_name = "tiny";
    loop = std::make_unique<serve::EngineLoop>(model, inference::DecodeEngineOptions{.max_batch = max_batch},
                                               loop_options);
    server = std::make_unique<serve::Server>(*loop, tokenizer, options);
  }
  ~ServedTiny() {
    server.reset();
    loop.reset();
  }
};

}  // namespace hyflow::testing
