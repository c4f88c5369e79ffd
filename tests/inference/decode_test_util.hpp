#pragma once
// Model shapes, weights and prompts shared by the decode engine tests (both backends).

#include "common/tiny_model.hpp"

#include <hyflow/dataproto/data_proto.hpp>
#include <hyflow/models/llama.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace hyflow::testing {

// A Llama shape with odd sizes: MHA, no bias, untied, head_dim 10, hidden sizes that are not
// multiples of the 8-float vector width (the kernels' scalar tails run).
inline models::ModelConfig llama_config() {
  return models::ModelConfig{
      .architecture = "LlamaForCausalLM",
      .vocab_size = 53,
      .hidden_size = 40,
      .intermediate_size = 76,
      .num_hidden_layers = 3,
      .num_attention_heads = 4,
      .num_key_value_heads = 4,
      .max_position_embeddings = 128,
      .tie_word_embeddings = false,
      .initializer_range = 0.2,
      .eos_token_ids = {2},
      .pad_token_id = 0,
  };
}

// A Qwen2 shape: GQA 4/2, QKV bias (set non-zero below), tied embeddings.
inline models::ModelConfig qwen2_config() {
  auto c = tiny_model_config();
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_hidden_layers = 3;
  return c;
}

inline models::CausalLM make_model(const models::ModelConfig& config, uint64_t seed) {
  torch::manual_seed(seed);
  models::CausalLM model(config);
  torch::NoGradGuard g;
  for (auto& item : model->named_parameters()) {
    if (item.key().ends_with(".bias")) item.value().normal_(0.0, 0.2);  // biases that matter
  }
  return model;
}

// Left-pads token lists (with 0) into a prompt batch.
inline DataProto prompt_batch(const std::vector<std::vector<int64_t>>& rows) {
  int64_t P = 0;
  for (const auto& r : rows) P = std::max<int64_t>(P, static_cast<int64_t>(r.size()));
  const auto B = static_cast<int64_t>(rows.size());
  auto ids = torch::zeros({B, P}, torch::kLong);
  auto mask = torch::zeros({B, P}, torch::kLong);
  for (int64_t b = 0; b < B; ++b) {
    const auto len = static_cast<int64_t>(rows[static_cast<size_t>(b)].size());
    ids[b].narrow(0, P - len, len).copy_(torch::tensor(rows[static_cast<size_t>(b)], torch::kLong));
    mask[b].narrow(0, P - len, len).fill_(1);
  }
  return DataProto(TensorDict{{"input_ids", ids}, {"attention_mask", mask}});
}

inline const std::vector<std::vector<int64_t>> kPrompts = {
    {5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21}, {11, 12}, {13, 14, 15, 16, 30}, {3}};

}  // namespace hyflow::testing
