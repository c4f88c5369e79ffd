// The PPO-family trainer end to end on a tiny random model: 3-step GRPO and PPO runs with 2
// colocated workers, checkpoint -> resume giving the metrics of an uninterrupted run (also at an
// epoch boundary), and DAPO dynamic sampling (algorithm.filter_groups).
#include "ppo_test_fixture.hpp"

#include <hyflow/algos/reward_score.hpp>
#include <hyflow/actors/error.hpp>
#include <hyflow/core/error.hpp>
#include <hyflow/trainer/ppo_trainer.hpp>

#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <set>

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

TEST_CASE("checkpoint then resume gives the next-step metrics of an uninterrupted run (fp32 and bf16 mixed "
          "precision)") {
  // bf16: verl's mixed_precision for the actor and the reference (2 workers, FULL_SHARD); the checkpoint
  // holds the fp32 masters, so the resumed run continues as exactly as in fp32
  const bool mixed = GENERATE(false, true);
  CAPTURE(mixed);
  auto precision = [mixed](Config c) {
    if (mixed)
      for (const char* role : {"actor", "ref"})
        c.set(std::string("actor_rollout_ref.") + role + ".fsdp_config.mixed_precision.param_dtype", "bf16");
    return c;
  };
  TempDir a(mixed ? "full_bf16" : "full"), b(mixed ? "resumed_bf16" : "resumed");
  auto strip = [](nlohmann::json m) {
    nlohmann::json out;
    for (const auto& [k, v] : m.items())
      if (k.rfind("timing", 0) != 0 && k.rfind("perf/", 0) != 0) out[k] = v;
    return out;
  };
  nlohmann::json full_step3;
  {
    Config c = precision(small_config("grpo", a.path));
    c.set("trainer.val_before_train", "false");
    c.set("trainer.test_freq", "-1");
    PPOTrainer t(c);
    t.init_workers();
    t.fit();
    full_step3 = strip(t.history().back());
  }
  {
    Config c = precision(small_config("grpo", b.path));
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
  Config c = precision(small_config("grpo", b.path));
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
  // the run folder keeps both launches; the first launch's config (other keys) moved to .old
  const auto launches = [&](const fs::path& file) { return nlohmann::json::parse(std::ifstream(file))["launches"]; };
  REQUIRE(launches(dir.path / "run.json").size() == 2);
  CHECK(launches(dir.path / "run.json")[0]["resumed_step"] == 0);
  CHECK(launches(dir.path / "run.json")[1]["resumed_step"] == 2);
  CHECK(launches(dir.path / "run.json")[0]["config_given"]["trainer.save_freq"]["value"] == 2);
  CHECK(launches(dir.path / "run.json")[1]["config_given"]["trainer.resume_mode"]["value"] == "auto");
  CHECK(fs::exists(dir.path / "config.yaml.old"));
  {
    Config c = config("disable");
    c.set("trainer.total_training_steps", "1");
    PPOTrainer t(c);
    t.init_workers();
    t.fit();
  }
  CHECK(logged_steps(metrics) == std::vector<int64_t>{1});
  CHECK(launches(dir.path / "run.json").size() == 1);      // a fresh run: a new record,
  CHECK(launches(dir.path / "run.json.old").size() == 2);  // the earlier run's kept
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

TEST_CASE("trainer.call_timeout_s fails a worker call that outlasts it, naming the method and the late ranks") {
  TempDir dir("call_timeout");
  Config c = small_config("grpo", dir.path);
  c.set("data.max_response_length", "48");  // generation takes far longer than 1 ms
  c.set("trainer.call_timeout_s", "0.001");
  try {
    PPOTrainer t(c);
    t.init_workers();
    t.fit();
    FAIL("no call timed out");
  } catch (const CallTimeoutError& e) {
    CHECK_THAT(e.what(), Catch::Contains("exceeded its deadline") && Catch::Contains("no answer from rank"));
    CHECK_FALSE(e.method().empty());
    CHECK_FALSE(e.ranks().empty());
  }
  CHECK_THROWS_WITH(c.set("trainer.call_timeout_s", "-1"), Catch::Contains("trainer.call_timeout_s"));
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

// ---- DAPO dynamic sampling (algorithm.filter_groups) and resuming ----

namespace {
// Every (prompt index, score) the test rewards gave, in call order.
std::vector<std::pair<int64_t, double>>& reward_calls() {
  static std::vector<std::pair<int64_t, double>> calls;
  return calls;
}
// Even prompt indices always score 0 (their groups are all-equal and dropped); odd ones score
// the parity of the response's characters, which differs between samples more often than not.
const bool test_rewards_registered = [] {
  namespace rs = hyflow::algos::reward_score;
  rs::register_compute_score("dapo_test_half_flat", [](const std::string&, const std::string& response,
                                                       const nlohmann::json&, const nlohmann::json& extra) {
    const int64_t index = extra.at("index").get<int64_t>();
    int64_t sum = 0;
    for (unsigned char ch : response) sum += ch;
    const double score = index % 2 == 0 ? 0.0 : static_cast<double>(sum % 2);
    reward_calls().emplace_back(index, score);
    return rs::ScoreResult{score, {}};
  });
  rs::register_compute_score("dapo_test_flat", [](const std::string&, const std::string&, const nlohmann::json&,
                                                  const nlohmann::json&) { return rs::ScoreResult{0.0, {}}; });
  return true;
}();

Config dapo_config(const fs::path& out, const std::string& reward) {
  Config c = small_config("grpo", out);
  c.set("trainer.val_before_train", "false");
  c.set("trainer.test_freq", "-1");
  c.set("actor_rollout_ref.rollout.n", "4");
  c.set("custom_reward_function.name", reward);
  c.set("algorithm.filter_groups.enable", "true");
  c.set("algorithm.filter_groups.metric", "seq_reward");
  return c;
}

/// The train/num_gen_batches each step should log, replayed from the recorded rewards: every
/// generation batch is gen_batch_size x n calls; a prompt's group is kept when its scores differ.
std::vector<int64_t> replay_gen_batches(const std::vector<std::pair<int64_t, double>>& calls, size_t gen_rows,
                                        int64_t train_batch_size) {
  std::vector<int64_t> steps;
  int64_t kept = 0, batches = 0;
  for (size_t start = 0; start + gen_rows <= calls.size(); start += gen_rows) {
    std::map<int64_t, std::set<double>> groups;
    for (size_t i = start; i < start + gen_rows; ++i) groups[calls[i].first].insert(calls[i].second);
    ++batches;
    for (const auto& [index, scores] : groups) kept += scores.size() > 1 ? 1 : 0;
    if (kept >= train_batch_size) {
      steps.push_back(batches);
      kept = batches = 0;
    }
  }
  return steps;
}

std::vector<int64_t> logged_gen_batches(const std::vector<nlohmann::json>& history) {
  std::vector<int64_t> out;
  for (const auto& m : history) out.push_back(m.at("train/num_gen_batches").get<int64_t>());
  return out;
}
}  // namespace

TEST_CASE("DAPO dynamic sampling: all-equal groups are dropped, generation batches accumulate until "
          "train_batch_size prompts are kept, train/num_gen_batches is logged") {
  REQUIRE(test_rewards_registered);
  TempDir out("dapo");
  reward_calls().clear();
  PPOTrainer t(dapo_config(out.path, "dapo_test_half_flat"));
  t.init_workers();
  t.fit();
  REQUIRE(t.history().size() == 3);
  for (const auto& m : t.history()) {
    CHECK(m.contains("actor/pg_loss"));
    for (const auto& [k, v] : m.items())
      if (v.is_number()) CHECK(std::isfinite(v.get<double>()));
  }
  const auto logged = logged_gen_batches(t.history());
  // gen_batch_size = train_batch_size = 4 prompts x n = 4 rows per generation batch
  CHECK(logged == replay_gen_batches(reward_calls(), 16, 4));
  CHECK(reward_calls().size() == 16 * static_cast<size_t>(logged[0] + logged[1] + logged[2]));
  // half of the prompts never vary, so at least one step needed more than one generation batch
  CHECK(*std::max_element(logged.begin(), logged.end()) > 1);
  // the trained rows are the kept groups: every odd prompt's group scores 0 and 1, never all 0
  for (const auto& m : t.history()) {
    CHECK(m.at("critic/score/max").get<double>() == 1.0);
    CHECK(m.at("critic/score/min").get<double>() == 0.0);
  }
}

TEST_CASE("DAPO dynamic sampling: a larger data.gen_batch_size generates more prompts per batch") {
  TempDir out("dapo_gen");
  reward_calls().clear();
  Config c = dapo_config(out.path, "dapo_test_half_flat");
  c.set("data.gen_batch_size", "8");
  c.set("trainer.total_training_steps", "2");
  PPOTrainer t(c);
  t.init_workers();
  t.fit();
  REQUIRE(t.history().size() == 2);
  CHECK(logged_gen_batches(t.history()) == replay_gen_batches(reward_calls(), 32, 4));
}

TEST_CASE("DAPO dynamic sampling: more than max_num_gen_batches generation batches is a ValueError naming the key") {
  TempDir out("dapo_max");
  Config c = dapo_config(out.path, "dapo_test_flat");
  c.set("algorithm.filter_groups.max_num_gen_batches", "3");
  PPOTrainer t(c);
  t.init_workers();
  CHECK_THROWS_AS(t.fit(), ValueError);
  CHECK_THROWS_WITH(t.fit(), Catch::Contains("algorithm.filter_groups.max_num_gen_batches") && Catch::Contains("3"));
}

TEST_CASE("DAPO dynamic sampling config errors name the key") {
  TempDir out("dapo_err");
  Config c = dapo_config(out.path, "dapo_test_flat");
  c.set("algorithm.filter_groups.metric", "null");
  CHECK_THROWS_WITH(PPOTrainer(c), Catch::Contains("algorithm.filter_groups.metric"));
  Config d = small_config("grpo", out.path);
  d.set("data.gen_batch_size", "8");  // without filter_groups a step is one generation batch
  CHECK_THROWS_WITH(PPOTrainer(d), Catch::Contains("data.gen_batch_size"));
  Config e = dapo_config(out.path, "dapo_test_flat");
  e.set("data.gen_batch_size", "1000");
  CHECK_THROWS_WITH(PPOTrainer(e), Catch::Contains("data.gen_batch_size"));
  Config f = dapo_config(out.path, "dapo_test_flat");
  f.set("algorithm.filter_groups.metric", "seq_final_reward");
  f.set("algorithm.use_kl_in_reward", "true");
  CHECK_THROWS_WITH(PPOTrainer(f), Catch::Contains("algorithm.filter_groups.metric"));
}

namespace {
nlohmann::json without_timings(const nlohmann::json& m) {
  nlohmann::json out;
  for (const auto& [k, v] : m.items())
    if (k.rfind("timing", 0) != 0 && k.rfind("perf/", 0) != 0) out[k] = v;
  return out;
}
void require_same_metrics(const nlohmann::json& resumed, const nlohmann::json& full) {
  const nlohmann::json expected = without_timings(full);
  for (const auto& [k, v] : expected.items()) {
    CAPTURE(k);
    REQUIRE(resumed.contains(k));
    CHECK(resumed.at(k).get<double>() == Approx(v.get<double>()).margin(1e-6));
  }
}
}  // namespace

TEST_CASE("DAPO dynamic sampling resumes at its data position: the next step equals the uninterrupted run's") {
  TempDir a("dapo_full"), b("dapo_resumed");
  nlohmann::json full_step3;
  {
    PPOTrainer t(dapo_config(a.path, "dapo_test_half_flat"));
    t.init_workers();
    t.fit();
    full_step3 = t.history().back();
  }
  {
    Config c = dapo_config(b.path, "dapo_test_half_flat");
    c.set("trainer.total_training_steps", "2");
    c.set("trainer.save_freq", "2");
    PPOTrainer t(c);
    t.init_workers();
    t.fit();
  }
  // the checkpoint records the generation batches taken, more than its 2 steps when any was refilled
  std::ifstream in(b.path / "global_step_2" / "data.json");
  const auto state = nlohmann::json::parse(in);
  CHECK(state.at("data_cursor").get<int64_t>() >= 2);
  PPOTrainer t(dapo_config(b.path, "dapo_test_half_flat"));
  t.init_workers();
  t.fit();
  REQUIRE(t.history().size() == 1);
  CHECK(t.history().back().at("training/global_step") == 3);
  require_same_metrics(t.history().back(), full_step3);

  // the cursor counts generation batches of the checkpoint's size
  Config other = dapo_config(b.path, "dapo_test_half_flat");
  other.set("data.gen_batch_size", "8");
  PPOTrainer u(other);
  u.init_workers();
  CHECK_THROWS_WITH(u.fit(), Catch::Contains("data.gen_batch_size") && Catch::Contains("global_step_2"));
}

TEST_CASE("DAPO dynamic sampling stops when the data of total_epochs runs out before a batch is full") {
  TempDir out("dapo_out");
  Config c = dapo_config(out.path, "dapo_test_flat");  // every group is dropped
  c.set("data.synthetic.train_size", "8");
  c.set("trainer.total_training_steps", "null");
  c.set("trainer.total_epochs", "2");
  PPOTrainer t(c);
  t.init_workers();
  CHECK(t.total_training_steps() == 4);
  t.fit();  // 4 generation batches, nothing kept: no step, no error (as verl's loop ends with its epochs)
  CHECK(t.history().empty());
}

TEST_CASE("a run resumed from a checkpoint at an epoch boundary trains the next epoch (not nothing)") {
  // 8 prompts / 4 per step: 2 steps per epoch; the first run stops (and saves) at the end of epoch 0
  auto config = [](const fs::path& out, const char* epochs) {
    Config c = small_config("grpo", out);
    c.set("data.synthetic.train_size", "8");
    c.set("trainer.total_training_steps", "null");
    c.set("trainer.total_epochs", epochs);
    c.set("trainer.val_before_train", "false");
    c.set("trainer.test_freq", "-1");
    c.set("trainer.save_freq", "2");
    return c;
  };
  TempDir a("epoch_full"), b("epoch_resumed");
  std::vector<nlohmann::json> full;
  {
    PPOTrainer t(config(a.path, "2"));
    t.init_workers();
    t.fit();
    full = t.history();
  }
  REQUIRE(full.size() == 4);
  {
    PPOTrainer t(config(b.path, "1"));
    t.init_workers();
    t.fit();
    REQUIRE(t.history().size() == 2);
  }
  REQUIRE(fs::exists(b.path / "global_step_2" / "data.json"));
  PPOTrainer t(config(b.path, "2"));
  t.init_workers();
  t.fit();
  REQUIRE(t.history().size() == 2);
  for (size_t i = 0; i < 2; ++i) {
    const auto& m = t.history()[i];
    CHECK(m.at("training/global_step") == 3 + static_cast<int64_t>(i));
    CHECK(m.at("training/epoch") == 1);
    require_same_metrics(m, full[2 + i]);
  }
  CHECK(fs::exists(b.path / "global_step_4" / "data.json"));
}
