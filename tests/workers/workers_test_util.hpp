#pragma once
// Shared pieces of the worker tests: the tiny model (common/tiny_model.hpp) with a 20-token
// vocabulary saved to a temporary directory, verl-style configs that point at it, and batches.

#include "common/tiny_model.hpp"

#include <hyflow/dataproto/data_proto.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace workers_test {

using hyflow::DataProto;
using hyflow::Json;
using hyflow::TensorDict;
using hyflow::testing::TempDir;

constexpr int64_t kVocab = 20;
constexpr int64_t kPad = 0;
constexpr int64_t kEos = 2;

inline hyflow::models::ModelConfig tiny_config() {
  return hyflow::testing::tiny_model_config(
      {.vocab_size = kVocab, .intermediate_size = 64, .max_position_embeddings = 64, .eos_token_id = kEos,
       .pad_token_id = kPad});
}

/// The tiny model, random weights from seed 1234, written once per process, plus a tokenizer
/// file the checkpoint must carry along.
inline const std::filesystem::path& tiny_model_dir() {
  static TempDir dir("workers_model");
  static bool written = [] {
    hyflow::testing::write_tiny_model(tiny_config(), 1234, dir.path);
    std::ofstream(dir.path / "tokenizer_config.json") << R"({"tokenizer_class": "hyflow-char"})";
    return true;
  }();
  (void)written;
  return dir.path;
}

/// actor_rollout_ref subtree with verl's names.
inline Json actor_rollout_ref_config(int64_t mini_batch = 4, Json actor_overrides = Json::object()) {
  Json actor = {{"strategy", "fsdp"},
                {"ppo_mini_batch_size", mini_batch},
                {"ppo_micro_batch_size_per_gpu", 2},
                {"ppo_epochs", 1},
                {"clip_ratio", 0.2},
                {"grad_clip", 1.0},
                {"loss_agg_mode", "token-mean"},
                {"entropy_coeff", 0.0},
                {"use_kl_loss", false},
                {"policy_loss", {{"loss_mode", "vanilla"}}},
                {"optim", {{"lr", 1e-2}, {"weight_decay", 0.01}, {"lr_warmup_steps", 0}}},
                {"fsdp_config", {{"param_offload", false}}}};
  actor.merge_patch(actor_overrides);
  return Json{{"model", {{"path", tiny_model_dir().string()}, {"use_remove_padding", true}}},
              {"actor", actor},
              {"rollout",
               {{"name", "hf"},
                {"n", 1},
                {"temperature", 1.0},
                {"response_length", 6},
                {"prompt_length", 5},
                {"log_prob_micro_batch_size_per_gpu", 2},
                {"calculate_log_probs", true},
                {"seed", 7},
                {"val_kwargs", {{"do_sample", false}, {"temperature", 0}}}}},
              {"ref", {{"log_prob_micro_batch_size_per_gpu", 3}}},
              {"hybrid_engine", true}};
}

inline Json critic_config(int64_t mini_batch = 4) {
  return Json{{"model", {{"path", tiny_model_dir().string()}}},
              {"optim", {{"lr", 1e-2}}},
              {"ppo_mini_batch_size", mini_batch},
              {"ppo_micro_batch_size_per_gpu", 2},
              {"forward_micro_batch_size_per_gpu", 3},
              {"ppo_epochs", 1},
              {"cliprange_value", 0.5},
              {"grad_clip", 1.0},
              {"rollout_n", 1}};
}

/// Left-padded prompts of lengths 2..5 with verl's position ids.
inline DataProto prompts(int64_t rows, int64_t length = 5, uint64_t seed = 3) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto ids = torch::randint(3, kVocab, {rows, length}, gen, torch::kLong);
  auto mask = torch::ones({rows, length}, torch::kLong);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t pad = r % (length - 1);
    if (pad > 0) {
      ids[r].narrow(0, 0, pad).fill_(kPad);
      mask[r].narrow(0, 0, pad).fill_(0);
    }
  }
  auto pos = (mask.cumsum(-1) - 1).clamp_min(0);
  return DataProto(TensorDict{{"input_ids", ids}, {"attention_mask", mask}, {"position_ids", pos}});
}

/// A rollout batch with made-up advantages for the update (adds "advantages" from `seed`).
inline DataProto with_advantages(DataProto rollout, uint64_t seed = 5) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const auto& mask = rollout.batch.at("response_mask");
  rollout.batch.set("advantages", torch::randn(mask.sizes(), gen) * mask);
  return rollout;
}

/// A rollout-shaped batch with returns, built without an actor (random responses). `ragged`:
/// row r's last r % 3 response tokens are masked out; otherwise every response token counts.
inline DataProto critic_batch(int64_t rows, uint64_t seed = 9, bool ragged = true) {
  auto p = prompts(rows, 5, seed);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const int64_t R = 6;
  auto responses = torch::randint(3, kVocab, {rows, R}, gen, torch::kLong);
  auto response_mask = torch::ones({rows, R}, torch::kLong);
  if (ragged)
    for (int64_t r = 0; r < rows; ++r) response_mask[r].narrow(0, R - r % 3, r % 3).fill_(0);
  auto mask = torch::cat({p.batch.at("attention_mask"), response_mask}, 1);
  auto pos = (mask.cumsum(-1) - 1).clamp_min(0);
  return DataProto(TensorDict{{"responses", responses},
                              {"input_ids", torch::cat({p.batch.at("input_ids"), responses}, 1)},
                              {"attention_mask", mask},
                              {"position_ids", pos},
                              {"response_mask", response_mask},
                              {"returns", torch::randn({rows, R}, gen) * response_mask}});
}

/// All parameters of a module flattened into one vector.
inline at::Tensor flat_parameters(const torch::nn::Module& module) {
  std::vector<at::Tensor> flat;
  for (const auto& p : module.parameters()) flat.push_back(p.detach().reshape({-1}));
  return torch::cat(flat);
}

}  // namespace workers_test
