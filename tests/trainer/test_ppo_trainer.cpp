// The PPO-family trainer end to end on a tiny random model: 3-step GRPO and PPO runs with 2
// colocated workers, and checkpoint -> resume giving the metrics of an uninterrupted run.
#include "ppo_test_fixture.hpp"

#include <hyflow/core/error.hpp>
#include <hyflow/trainer/ppo_trainer.hpp>

#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <cmath>
#include <fstream>

using namespace hyflow;
using namespace hyflow::trainer;
using namespace ppo_test;
namespace fs = std::filesystem;

namespace {
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

namespace {
std::vector<int64_t> logged_steps(const fs::path& file) {
  std::vector<int64_t> steps;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) steps.push_back(nlohmann::json::parse(line).at("step").get<int64_t>());
  return steps;
}
}  // namespace

TEST_CASE("metrics.jsonl: a resume drops the earlier run's steps past the checkpoint, a fresh run starts a new file") {
  TempDir dir("metrics");
  const fs::path metrics = dir.path / "metrics.jsonl";
  auto config = [&](const char* resume_mode) {
    Config c = small_config("grpo", dir.path);
    c.set("trainer.val_before_train", "false");
    c.set("trainer.test_freq", "-1");
    c.set("trainer.resume_mode", resume_mode);
    return c;
  };
  {
    Config c = config("disable");
    c.set("trainer.total_training_steps", "2");
    c.set("trainer.save_freq", "2");
    PPOTrainer t(c);
    t.init_workers();
    t.fit();
  }
  // the earlier run went on to log step 3 and died before its next checkpoint
  std::ofstream(metrics, std::ios::app) << R"({"step": 3, "critic/score/mean": 0.5})" << "\n";
  REQUIRE(logged_steps(metrics) == std::vector<int64_t>{1, 2, 3});
  {
    Config c = config("auto");
    PPOTrainer t(c);
    t.init_workers();
    t.fit();
  }
  CHECK(logged_steps(metrics) == std::vector<int64_t>{1, 2, 3});  // step 3 once, from the resumed run
  CHECK(logged_steps(dir.path / "metrics.jsonl.after_step_2") == std::vector<int64_t>{3});
  {
    Config c = config("disable");
    c.set("trainer.total_training_steps", "1");
    PPOTrainer t(c);
    t.init_workers();
    t.fit();
  }
  CHECK(logged_steps(metrics) == std::vector<int64_t>{1});
  CHECK(logged_steps(dir.path / "metrics.jsonl.old") == std::vector<int64_t>{1, 2, 3});  // kept, not appended to

  SECTION("a garbage data.json in the checkpoint is a FormatError naming it") {
    std::ofstream(dir.path / "global_step_2" / "data.json", std::ios::trunc) << "{\"global_st";
    Config c = config("auto");
    PPOTrainer t(c);
    t.init_workers();
    CHECK_THROWS_WITH(t.fit(), Catch::Contains("global_step_2") && Catch::Contains("data.json"));
    std::ofstream(dir.path / "global_step_2" / "data.json", std::ios::trunc) << R"({"global_step": 7})";
    CHECK_THROWS_WITH(t.fit(), Catch::Contains("data.json") && Catch::Contains("global_step 7"));
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

TEST_CASE("validation with val_kwargs.n=2 logs verl's val-core mean/best/maj@2 and val-aux std@2") {
  TempDir out("val");
  Config c = small_config("grpo", out.path);
  c.set("actor_rollout_ref.rollout.val_kwargs.n", "2");
  c.set("actor_rollout_ref.rollout.val_kwargs.do_sample", "true");
  c.set("actor_rollout_ref.rollout.val_kwargs.temperature", "1.0");
  PPOTrainer t(c);
  t.init_workers();
  const auto m = t.validate();
  for (const char* k : {"val-core/arithmetic/reward/mean@2", "val-core/arithmetic/reward/best@2/mean",
                        "val-core/arithmetic/reward/best@2/std", "val-aux/arithmetic/reward/std@2",
                        "val-aux/arithmetic/reward/worst@2/mean"}) {
    CAPTURE(k);
    REQUIRE(m.contains(k));
    CHECK(std::isfinite(m.at(k).get<double>()));
  }
  // best of 2 is never below the mean, worst never above
  CHECK(m.at("val-core/arithmetic/reward/best@2/mean").get<double>() >=
        m.at("val-core/arithmetic/reward/mean@2").get<double>() - 1e-12);
  CHECK(m.at("val-aux/arithmetic/reward/worst@2/mean").get<double>() <=
        m.at("val-core/arithmetic/reward/mean@2").get<double>() + 1e-12);
}
