// The PPO-family trainer end to end on a tiny random model: 3-step GRPO and PPO runs with 2
// colocated workers, and checkpoint -> resume giving the metrics of an uninterrupted run.
#include <hyflow/dataproto/error.hpp>
#include <hyflow/models/char_tokenizer.hpp>
#include <hyflow/models/checkpoint.hpp>
#include <hyflow/models/llama.hpp>
#include <hyflow/trainer/dataset.hpp>
#include <hyflow/trainer/ppo_trainer.hpp>

#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <unistd.h>

using namespace hyflow;
using namespace hyflow::trainer;
namespace fs = std::filesystem;

namespace {
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& tag) {
    static int n = 0;
    path = fs::temp_directory_path() / ("hyflow_ppo_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(n++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

const fs::path& tiny_model() {
  static TempDir dir("model");
  static bool done = [] {
    models::CharTokenizer tok;
    models::ModelConfig c;
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
    models::CausalLM model(c);
    models::save_pretrained(*model, c, dir.path);
    save_char_tokenizer_config(dir.path.string());
    return true;
  }();
  (void)done;
  return dir.path;
}

Config small_config(const std::string& estimator, const fs::path& out) {
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

void require_finite_steps(const std::vector<nlohmann::json>& history, int64_t steps) {
  int64_t trained = 0;
  for (const auto& m : history) {
    for (const auto& [k, v] : m.items())
      if (v.is_number()) CHECK(std::isfinite(v.get<double>()));
    if (m.at("step").get<int64_t>() > 0) {
      ++trained;
      CHECK(m.contains("actor/pg_loss"));
      CHECK(m.contains("timing_s/gen"));
      CHECK(m.contains("perf/throughput"));
      CHECK(m.contains("response_length/mean"));
    }
  }
  CHECK(trained == steps);
  CHECK(history.back().contains("val-core/arithmetic/reward/mean@1"));
}
}  // namespace

TEST_CASE("3-step GRPO on 2 colocated workers: finite metrics with verl's names") {
  TempDir out("grpo");
  PPOTrainer t(small_config("grpo", out.path));
  t.init_workers();
  t.fit();
  REQUIRE(t.history().size() == 4);  // validation before training + 3 steps
  require_finite_steps(t.history(), 3);
  CHECK(t.history()[0].contains("val-core/arithmetic/reward/mean@1"));
  CHECK(fs::exists(out.path / "metrics.jsonl"));
}

TEST_CASE("3-step PPO (GAE + critic) on 2 colocated workers: critic metrics are finite") {
  TempDir out("ppo");
  PPOTrainer t(small_config("gae", out.path));
  t.init_workers();
  t.fit();
  require_finite_steps(t.history(), 3);
  const auto& last = t.history().back();
  CHECK(last.contains("critic/vf_loss"));
  CHECK(last.contains("critic/values/mean"));
  CHECK(last.contains("timing_s/update_critic"));
}

TEST_CASE("checkpoint then resume gives the next-step metrics of an uninterrupted run") {
  TempDir a("full"), b("resumed");
  auto strip = [](nlohmann::json m) {
    nlohmann::json out;
    for (const auto& [k, v] : m.items())
      if (k.rfind("timing", 0) != 0 && k.rfind("perf/", 0) != 0) out[k] = v;
    return out;
  };
  nlohmann::json full_step3;
  {
    Config c = small_config("grpo", a.path);
    c.set("trainer.val_before_train", "false");
    c.set("trainer.test_freq", "-1");
    PPOTrainer t(c);
    t.init_workers();
    t.fit();
    full_step3 = strip(t.history().back());
  }
  {
    Config c = small_config("grpo", b.path);
    c.set("trainer.val_before_train", "false");
    c.set("trainer.test_freq", "-1");
    c.set("trainer.total_training_steps", "2");
    c.set("trainer.save_freq", "2");
    c.set("trainer.max_actor_ckpt_to_keep", "1");
    PPOTrainer t(c);
    t.init_workers();
    t.fit();
    CHECK(fs::exists(b.path / "global_step_2" / "data.json"));
  }
  Config c = small_config("grpo", b.path);
  c.set("trainer.val_before_train", "false");
  c.set("trainer.test_freq", "-1");
  c.set("trainer.resume_mode", "auto");
  PPOTrainer t(c);
  t.init_workers();
  t.fit();
  REQUIRE(t.history().size() == 1);
  const auto resumed = strip(t.history().back());
  CHECK(resumed.at("training/global_step") == 3);
  for (const auto& [k, v] : full_step3.items()) {
    CAPTURE(k);
    REQUIRE(resumed.contains(k));
    CHECK(resumed.at(k).get<double>() == Approx(v.get<double>()).margin(1e-6));
  }
}

TEST_CASE("config errors in the trainer name the key") {
  TempDir out("err");
  Config c = small_config("grpo", out.path);
  c.set("data.train_batch_size", "1000");
  CHECK_THROWS_WITH(PPOTrainer(c), Catch::Contains("data.train_batch_size"));
  Config d = small_config("no_such_estimator", out.path);
  CHECK_THROWS_AS(PPOTrainer(d), KeyError);
}
