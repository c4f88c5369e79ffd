#pragma once
// Small model configs and helpers shared by the models tests.

#include <hyflow/models/config.hpp>

#include <torch/torch.h>

#include <filesystem>
#include <random>
#include <string>

namespace hyflow::models::testing {

/// A 2-layer Qwen2-style model small enough for sub-second tests: GQA 4/2, QKV bias.
inline ModelConfig small_config(bool tied = true) {
  return ModelConfig{
      .architecture = "Qwen2ForCausalLM",
      .vocab_size = 37,
      .hidden_size = 32,
      .intermediate_size = 48,
      .num_hidden_layers = 2,
      .num_attention_heads = 4,
      .num_key_value_heads = 2,
      .max_position_embeddings = 128,
      .qkv_bias = true,
      .tie_word_embeddings = tied,
      .initializer_range = 0.2,  // large weights: peaked logits make greedy ties unlikely
      .eos_token_ids = {2},
      .pad_token_id = 0,
  };
}

/// A fresh directory under the system temp dir, removed on destruction.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::random_device rd;
    path = std::filesystem::temp_directory_path() / ("hyflow-models-" + std::to_string(rd()) + std::to_string(rd()));
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

}  // namespace hyflow::models::testing
