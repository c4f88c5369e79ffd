// Trainer config: verl defaults, INI sections, --key=value overrides, errors naming the key.
#include <hyflow/core/error.hpp>
#include <hyflow/trainer/config.hpp>

#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <unistd.h>

using namespace hyflow;
using hyflow::trainer::Config;

namespace {
std::string write_ini(const std::string& text) {
  static int n = 0;
  auto path = std::filesystem::temp_directory_path() /
              ("hyflow_cfg_" + std::to_string(::getpid()) + "_" + std::to_string(n++) + ".ini");
  std::ofstream(path) << text;
  return path.string();
}
}  // namespace

TEST_CASE("defaults are verl's: gae, train_batch_size 1024, actor lr 1e-6, critic lr 1e-5") {
  Config c;
  CHECK(c.get_string("algorithm.adv_estimator") == "gae");
  CHECK(c.get_int("data.train_batch_size") == 1024);
  CHECK(c.get_double("actor_rollout_ref.actor.optim.lr") == Approx(1e-6));
  CHECK(c.get_double("critic.optim.lr") == Approx(1e-5));
  CHECK(c.is_null("data.val_batch_size"));
  CHECK(c.get_bool("trainer.val_before_train"));
}

TEST_CASE("INI sections set dotted keys and command-line overrides win") {
  const auto ini = write_ini("[algorithm]\nadv_estimator = grpo\n[actor_rollout_ref.rollout]\nn = 4\n"
                             "[actor_rollout_ref.actor.optim]\nlr = 3e-4\n");
  Config c;
  const bool help =
      c.apply_arguments({"--config=" + ini, "--actor_rollout_ref.rollout.n=8", "--data.val_batch_size=null"});
  CHECK_FALSE(help);
  CHECK(c.get_string("algorithm.adv_estimator") == "grpo");
  CHECK(c.get_int("actor_rollout_ref.rollout.n") == 8);
  CHECK(c.get_double("actor_rollout_ref.actor.optim.lr") == Approx(3e-4));
  CHECK(c.is_null("data.val_batch_size"));
  std::filesystem::remove(ini);
}

TEST_CASE("subtree gives nested JSON for the workers without null keys") {
  Config c;
  c.set("actor_rollout_ref.model.path", "/m");
  auto t = c.subtree("actor_rollout_ref");
  CHECK(t["model"]["path"] == "/m");
  CHECK(t["rollout"]["val_kwargs"]["n"] == 1);
  CHECK_FALSE(t["actor"].contains("ppo_micro_batch_size_per_gpu"));
  CHECK(t["actor"]["optim"]["betas"] == nlohmann::json::array({0.9, 0.999}));
}

TEST_CASE("unknown keys in files and on the command line name the key") {
  Config c;
  const auto ini = write_ini("[trainer]\ntotal_epoch = 3\n");
  try {
    c.load_ini(ini);
    FAIL("no error");
  } catch (const KeyError& e) {
    CHECK_THAT(e.what(), Catch::Contains("trainer.total_epoch"));
  }
  try {
    c.apply_arguments({"--actor_rollout_ref.rollout.nn=3"});
    FAIL("no error");
  } catch (const KeyError& e) {
    CHECK_THAT(e.what(), Catch::Contains("actor_rollout_ref.rollout.nn"));
  }
  // a prefix of a known key is not guessed
  CHECK_THROWS_WITH(c.apply_arguments({"--trainer.total_epoch=3"}), Catch::Contains("'trainer.total_epoch'"));
  std::filesystem::remove(ini);
}

TEST_CASE("bad values name the key and the value") {
  Config c;
  try {
    c.apply_arguments({"--data.train_batch_size=12x"});
    FAIL("no error");
  } catch (const ValueError& e) {
    CHECK_THAT(e.what(), Catch::Contains("data.train_batch_size") && Catch::Contains("12x"));
  }
  CHECK_THROWS_AS(c.set("trainer.val_before_train", "maybe"), ValueError);
  CHECK_THROWS_AS(c.set("data.train_batch_size", "null"), ValueError);  // not nullable
  CHECK_THROWS_AS(c.get_int("algorithm.adv_estimator"), ValueError);
}

TEST_CASE("--help is reported and the help text lists keys with defaults") {
  Config c;
  CHECK(c.apply_arguments({"--help"}));
  const auto text = c.help_text();
  CHECK_THAT(text, Catch::Contains("--data.train_batch_size=1024"));
  CHECK_THAT(text, Catch::Contains("--algorithm.adv_estimator=gae"));
}

TEST_CASE("the SFT schema has its own keys") {
  Config c(trainer::ConfigSchema::sft);
  CHECK(c.get_int("data.micro_batch_size_per_gpu") == 4);
  CHECK_THROWS_AS(c.set("algorithm.adv_estimator", "grpo"), KeyError);
}
