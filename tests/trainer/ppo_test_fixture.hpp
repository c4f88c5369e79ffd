#pragma once
// Shared by the PPO trainer tests: a temporary folder, a tiny random Qwen2 model with the char
// tokenizer (written once per process) and a small GRPO/PPO config on the arithmetic task.
#include <hyflow/models/checkpoint.hpp>
#include <hyflow/models/llama.hpp>
#include <hyflow/tokenizers/char_tokenizer.hpp>
#include <hyflow/trainer/config.hpp>
#include <hyflow/trainer/dataset.hpp>

#include <torch/torch.h>

#include <filesystem>
#include <string>
#include <unistd.h>

namespace ppo_test {
namespace fs = std::filesystem;
using hyflow::trainer::Config;

struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& tag) {
    static int n = 0;
    path = fs::temp_directory_path() /
           ("hyflow_ppo_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(n++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

inline const fs::path& tiny_model() {
  static TempDir dir("model");
  static bool done = [] {
    hyflow::tokenizers::CharTokenizer tok;
    hyflow::models::ModelConfig c;
    c.architecture = "Qwen2ForCausalLM";
    c.vocab_size = tok.vocab_size();
    c.hidden_size = 32;
    c.intermediate_size = 64;
    c.num_hidden_layers = 1;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.max_position_embeddings = 64;
    c.qkv_bias = true;
    c.tie_word_embeddings = true;
    c.eos_token_ids = {tok.eos_token_id()};
    c.pad_token_id = tok.pad_token_id();
    c.initializer_range = 0.2;
    torch::manual_seed(11);
    hyflow::models::CausalLM model(c);
    hyflow::models::save_pretrained(*model, c, dir.path);
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
                     "--trainer.progress_bar=false", "--trainer.default_local_dir=" + out.string()});
  return c;
}

}  // namespace ppo_test
