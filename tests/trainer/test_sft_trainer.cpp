// SFT trainer: the built-in tiny model learns the synthetic task's format (loss falls) and is
// saved in a form the RL trainer loads (weights + char tokenizer config).
#include <hyflow/core/error.hpp>
#include <hyflow/models/checkpoint.hpp>
#include <hyflow/trainer/dataset.hpp>
#include <hyflow/trainer/run_folder.hpp>
#include <hyflow/trainer/sft_trainer.hpp>

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <unistd.h>

using namespace hyflow;
using namespace hyflow::trainer;
namespace fs = std::filesystem;

TEST_CASE("SFT of the tiny model: loss falls, the model and tokenizer are saved and load back") {
  const fs::path out = fs::temp_directory_path() / ("hyflow_sft_" + std::to_string(::getpid()));
  fs::remove_all(out);
  Config c(ConfigSchema::sft);
  c.apply_arguments({"--data.max_length=12", "--data.train_batch_size=16", "--data.micro_batch_size_per_gpu=8",
                     "--data.synthetic.train_size=256", "--data.synthetic.val_size=16",
                     "--data.synthetic.max_operand=9", "--model.tiny.hidden_size=32",
                     "--model.tiny.intermediate_size=64", "--model.tiny.rope_theta=500", "--optim.lr=3e-3",
                     "--trainer.total_training_steps=30", "--trainer.default_local_dir=" + out.string()});
  const SFTResult r = run_sft(c);
  REQUIRE(r.history.size() == 30);
  CHECK(r.history.back().at("train/loss").get<double>() < 0.75 * r.history.front().at("train/loss").get<double>());
  CHECK(r.history.back().contains("val/loss"));
  CHECK(r.val_exact_match >= 0.0);
  auto model = models::load_causal_lm(out);
  auto tok = load_tokenizer(out.string());
  CHECK(model->config().vocab_size == tok->vocab_size());
  CHECK(model->config().rope_theta == 500.0);
  fs::remove_all(out);
}

TEST_CASE("SFT config errors name the key") {
  Config c(ConfigSchema::sft);
  c.set("data.train_batch_size", "10");
  c.set("data.micro_batch_size_per_gpu", "4");
  CHECK_THROWS_WITH(run_sft(c), Catch::Contains("data.micro_batch_size_per_gpu"));
  Config d(ConfigSchema::sft);
  d.set("optim.lr_scheduler_type", "wsd2");
  d.set("data.synthetic.train_size", "512");
  CHECK_THROWS_WITH(run_sft(d), Catch::Contains("optim.lr_scheduler"));
}

TEST_CASE("SFT logs through trainer.logger: the jsonl file holds the history, the run folder its config") {
  const fs::path out = fs::temp_directory_path() / ("hyflow_sft_logger_" + std::to_string(::getpid()));
  fs::remove_all(out);
  Config c(ConfigSchema::sft);
  c.apply_arguments({"--data.max_length=12", "--data.train_batch_size=8", "--data.micro_batch_size_per_gpu=8",
                     "--data.synthetic.train_size=32", "--data.synthetic.val_size=4", "--model.tiny.hidden_size=16",
                     "--model.tiny.intermediate_size=32", "--trainer.total_training_steps=3",
                     "--trainer.default_local_dir=" + out.string(), "--trainer.logger=file"});
  const SFTResult r = run_sft(c);
  std::ifstream in(out / "sft_metrics.jsonl");
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  CHECK(lines == r.history);
  CHECK_FALSE(fs::exists(out / "sft_metrics.config.json"));  // one place for the config: the run folder
  const auto run = nlohmann::json::parse(std::ifstream(out / "run.json"));
  REQUIRE(run["launches"].size() == 1);
  CHECK(run["launches"][0]["config_given"]["trainer.total_training_steps"] ==
        nlohmann::json({{"value", 3}, {"source", "command line"}}));
  std::ostringstream yaml;
  yaml << std::ifstream(out / "config.yaml").rdbuf();
  CHECK(yaml.str() == config_yaml(c));
  CHECK_THAT(yaml.str(), Catch::Contains("  total_training_steps: 3") && Catch::Contains("# command line\n"));
  fs::remove_all(out);

  Config d(ConfigSchema::sft);
  d.set("trainer.logger", "console,wandb");
  d.set("data.synthetic.train_size", "512");
  CHECK_THROWS_WITH(run_sft(d), Catch::Contains("unknown tracker 'wandb' in trainer.logger"));
}
