#pragma once
// The tests' tiny-model fixture, shared by every test folder: a temporary folder, the tiny
// Qwen2 shape (each folder picks its vocabulary, depth and ids) and a random model of it written
// in Hugging Face format. Included as "common/tiny_model.hpp" (tests/ is on the include path).

#include <hyflow/models/checkpoint.hpp>
#include <hyflow/models/config.hpp>
#include <hyflow/models/llama.hpp>

#include <torch/torch.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <string>
#include <system_error>
#include <unistd.h>

namespace hyflow::testing {

/// A fresh folder under the system temp dir, hyflow_<tag>_<pid>_<n>, removed on destruction.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& tag) {
    static std::atomic<int> counter = 0;
    path = std::filesystem::temp_directory_path() /
           ("hyflow_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

/// What the test folders vary of the tiny shape; the defaults are the models and inference tests'.
struct TinyShape {
  int64_t vocab_size = 37;
  int64_t intermediate_size = 48;
  int64_t num_hidden_layers = 2;
  int64_t max_position_embeddings = 128;
  bool tie_word_embeddings = true;
  int64_t eos_token_id = 2;
  int64_t pad_token_id = 0;
};

/// Qwen2ForCausalLM with hidden size 32, 4 query heads over 2 KV heads and QKV bias, small enough
/// for sub-second tests. initializer_range 0.2: large weights give peaked logits, so greedy ties
/// are unlikely and sampling is not uniform noise.
inline models::ModelConfig tiny_model_config(const TinyShape& shape = {}) {
  return models::ModelConfig{
      .architecture = "Qwen2ForCausalLM",
      .vocab_size = shape.vocab_size,
      .hidden_size = 32,
      .intermediate_size = shape.intermediate_size,
      .num_hidden_layers = shape.num_hidden_layers,
      .num_attention_heads = 4,
      .num_key_value_heads = 2,
      .max_position_embeddings = shape.max_position_embeddings,
      .qkv_bias = true,
      .tie_word_embeddings = shape.tie_word_embeddings,
      .initializer_range = 0.2,
      .eos_token_ids = {shape.eos_token_id},
      .pad_token_id = shape.pad_token_id,
  };
}

/// A model of `config` with weights drawn after torch::manual_seed(seed), saved to `dir`
/// (config.json + model.safetensors).
inline void write_tiny_model(const models::ModelConfig& config, uint64_t seed, const std::filesystem::path& dir) {
  torch::manual_seed(seed);
  models::CausalLM model(config);
  models::save_pretrained(*model, config, dir);
}

}  // namespace hyflow::testing
