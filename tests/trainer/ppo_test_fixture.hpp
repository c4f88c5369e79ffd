#pragma once
// Shared by the PPO trainer tests: a temporary folder, the tiny model (common/tiny_model.hpp)
// with one layer and the char tokenizer (written once per process) and a small GRPO/PPO config on
// the arithmetic task.
#include "common/tiny_model.hpp"

#include <hyflow/tokenizers/char_tokenizer.hpp>
#include <hyflow/trainer/config.hpp>
#include <hyflow/trainer/dataset.hpp>

#include <filesystem>
#include <string>

namespace ppo_test {
namespace fs = std::filesystem;
using hyflow::testing::TempDir;
using hyflow::trainer::Config;

inline const fs::path& tiny_model() {
  static TempDir dir("ppo_model");
  static bool done = [] {
    hyflow::tokenizers::CharTokenizer tok;
    const auto c = hyflow::testing::tiny_model_config({.vocab_size = tok.vocab_size(),
                                                       .intermediate_size = 64,
                                                       .num_hidden_layers = 1,
                                                       .max_position_embeddings = 64,
                                                       .eos_token_id = tok.eos_token_id(),
                                                       .pad_token_id = tok.pad_token_id()});
    hyflow::testing::write_tiny_model(c, 11, dir.path);
    hyflow::trainer::save_char_tokenizer_config(dir.path.string());
    return true;
  }();
  (void)done;
  return dir.path;
}

inline Config small_config(const std::string& estimator, const fs::path& out) {
  Config c;
  c.apply_arguments({"--algorithm.adv_estimator=" + estimator,
                     "--actor_rollout_ref.model.path=" + tiny_model().string(),
                     "--data.max_prompt_length=8", "--data.max_response_length=4", "--data.train_batch_size=4",
                     "--data.synthetic.train_size=64", "--data.synthetic.val_size=8", "--data.synthetic.max_operand=9",
                     "--actor_rollout_ref.actor.ppo_mini_batch_size=2", "--actor_rollout_ref.actor.optim.lr=1e-2",
                     "--actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "--actor_rollout_ref.rollout.n=2",
                     "--critic.optim.lr=1e-2", "--actor_rollout_ref.actor.use_kl_loss=true",
                     "--trainer.n_gpus_per_node=2", "--trainer.total_training_steps=3", "--trainer.test_freq=3",
                     "--trainer.logger=['jsonl']", "--trainer.default_local_dir=" + out.string()});
  return c;
}

}  // namespace ppo_test
