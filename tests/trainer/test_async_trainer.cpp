// The asynchronous trainer on the tiny model: separate_async (a rollout group of its own fed
// versioned weights, published every parameter_sync_step steps) and colocate_async (the trainer's
// own actor group generating the next batches), one-step-off and deeper pipelines, the drop and
// wait strategies of max_off_policy_threshold, partial rollouts, dynamic sampling, and resuming
// without losing or repeating prompts or steps.
#include "ppo_test_fixture.hpp"

#include <hyflow/algos/reward_score.hpp>
#include <hyflow/core/error.hpp>
#include <hyflow/core/net.hpp>
#include <hyflow/tracking/tracker_registry.hpp>
#include <hyflow/trainer/async_rollout.hpp>
#include <hyflow/trainer/ppo_config.hpp>
#include <hyflow/trainer/ppo_trainer.hpp>

#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <future>

using namespace hyflow;
using namespace hyflow::trainer;
using namespace ppo_test;
namespace fs = std::filesystem;

namespace {
/// small_config with 2 trainer workers and 1 rollout worker of its own, warmup_batches ahead.
Config async_config(const fs::path& out, int64_t warmup_batches, int64_t threshold, const std::string& strategy) {
  Config c = small_config("grpo", out);
  c.set("trainer.v1.trainer_mode", "separate_async");
  c.set("trainer.v1.separate_async.num_warmup_batches", std::to_string(warmup_batches));
  c.set("trainer.v1.sampler.max_off_policy_threshold", std::to_string(threshold));
  c.set("trainer.v1.sampler.max_off_policy_strategy", strategy);
  c.set("actor_rollout_ref.rollout.n_gpus_per_node", "1");
  c.set("trainer.val_before_train", "false");
  c.set("trainer.test_freq", "-1");
  return c;
}

/// small_config in colocate_async mode: the 2 trainer workers generate warmup_batches ahead.
Config colocated_config(const fs::path& out, int64_t warmup_batches, int64_t threshold, const std::string& strategy) {
  Config c = small_config("grpo", out);
  c.set("trainer.v1.trainer_mode", "colocate_async");
  c.set("trainer.v1.colocate_async.num_warmup_batches", std::to_string(warmup_batches));
  c.set("trainer.v1.sampler.max_off_policy_threshold", std::to_string(threshold));
  c.set("trainer.v1.sampler.max_off_policy_strategy", strategy);
  c.set("trainer.val_before_train", "false");
  c.set("trainer.test_freq", "-1");
  return c;
}

std::vector<nlohmann::json> run(const Config& c) {
  PPOTrainer t(c);
  t.init_workers();
  t.fit();
  return t.history();
}

std::vector<double> series(const std::vector<nlohmann::json>& history, const std::string& key) {
  std::vector<double> out;
  for (const auto& m : history) out.push_back(m.at(key).get<double>());
  return out;
}

nlohmann::json data_state(const fs::path& dir, int64_t step) {
  std::ifstream in(dir / ("global_step_" + std::to_string(step)) / "data.json");
  return nlohmann::json::parse(in);
}

std::vector<int64_t> logged_steps(const fs::path& file) {
  std::vector<int64_t> steps;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) steps.push_back(nlohmann::json::parse(line).at("step").get<int64_t>());
  return steps;
}

/// A reward whose value varies within a prompt's group: the parity of the response's length.
const bool parity_reward_registered = [] {
  algos::reward_score::register_compute_score(
      "async_test_length_parity", [](const std::string&, const std::string& response, const nlohmann::json&,
                                     const nlohmann::json&) {
        return algos::reward_score::ScoreResult{static_cast<double>(response.size() % 2), {}};
      });
  return true;
}();

/// Metrics that depend only on which prompts a step trained on.
void require_same_prompts(const nlohmann::json& a, const nlohmann::json& b) {
  for (const char* key : {"prompt_length/mean", "prompt_length/max", "prompt_length/min", "training/epoch"}) {
    CAPTURE(key);
    CHECK(a.at(key).get<double>() == b.at(key).get<double>());
  }
}
}  // namespace

TEST_CASE("off-policy metrics: spans, staleness against the newest and the oldest version of each row") {
  DataProto d(TensorDict{{"min_weight_version", torch::tensor({3, 1, 2}, torch::kLong)},
                         {"max_weight_version", torch::tensor({3, 2, 2}, torch::kLong)}});
  const auto m = off_policy_metrics(d, 4);
  CHECK(m.at("training/off_policy/trajectory_spans/max") == 2.0);
  CHECK(m.at("training/off_policy/trajectory_spans/min") == 1.0);
  CHECK(m.at("training/off_policy/trajectory_staleness/max") == 2.0);  // 4 - 2
  CHECK(m.at("training/off_policy/trajectory_staleness/min") == 1.0);
  CHECK(m.at("training/off_policy/trajectory_staleness_worst/max") == 3.0);  // 4 - 1
  CHECK(m.at("training/off_policy/trajectory_staleness_worst/mean").get<double>() == Approx(2.0));
  CHECK_THROWS_AS(off_policy_metrics(DataProto(TensorDict{{"x", torch::zeros({2})}}), 1), KeyError);
}

TEST_CASE("serial executor: tasks run in submission order, a continuation queues behind what was submitted "
          "meanwhile, the first error is kept") {
  SerialExecutor ex;
  std::vector<int> order;
  std::promise<void> submitted, done;
  ex.submit([&] {
    order.push_back(1);
    submitted.get_future().wait();  // task 2 is queued before this continuation
    ex.submit([&] {
      order.push_back(3);
      done.set_value();
    });
  });
  ex.submit([&] { order.push_back(2); });
  submitted.set_value();
  done.get_future().wait();
  CHECK(order == std::vector<int>{1, 2, 3});
  CHECK_FALSE(ex.failure());

  std::promise<void> after;
  ex.submit([] { throw ValueError("first"); });
  ex.submit([] { throw ValueError("second"); });
  ex.submit([&] { after.set_value(); });
  after.get_future().wait();
  REQUIRE(ex.failure());
  CHECK_THROWS_WITH(std::rethrow_exception(ex.failure()), "first");
}

TEST_CASE("one-step-off (separate_async, 1 batch ahead): the rollout group trains 3 steps with staleness 0, 1, 1 "
          "and every row records its weight version") {
  TempDir out("async_one_step");
  const auto h = run(async_config(out.path, 1, 8, "drop"));
  REQUIRE(h.size() == 3);
  CHECK(series(h, "training/off_policy/trajectory_staleness/max") == std::vector<double>{0, 1, 1});
  CHECK(series(h, "training/off_policy/trajectory_staleness/min") == std::vector<double>{0, 1, 1});
  CHECK(series(h, "training/off_policy/trajectory_spans/max") == std::vector<double>{1, 1, 1});
  CHECK(series(h, "training/off_policy/dropped_trajectories") == std::vector<double>{0, 0, 0});
  // the weights each step publishes are what the next batches generate on; one batch stays ahead
  CHECK(series(h, "training/off_policy/rollout_weight_version") == std::vector<double>{1, 2, 3});
  CHECK(series(h, "training/off_policy/queued_batches") == std::vector<double>{1, 1, 1});
  for (const auto& m : h) {
    CHECK(m.contains("timing_s/update_weights"));
    // the bytes export_weights handed over: every parameter of the full-weight actor (LoRA: the adapters)
    REQUIRE(m.contains("training/weight_sync/bytes"));
    CHECK(m.at("training/weight_sync/bytes").get<double>() > 0);
    CHECK(m.contains("actor/pg_loss"));
    for (const auto& [k, v] : m.items())
      if (v.is_number()) CHECK(std::isfinite(v.get<double>()));
  }
  SECTION("the run is deterministic: the weight version of every batch follows the controller's call order") {
    TempDir again("async_one_step_again");
    const auto h2 = run(async_config(again.path, 1, 8, "drop"));
    for (const char* key : {"actor/pg_loss", "critic/score/mean", "response_length/mean", "actor/entropy"})
      CHECK(series(h2, key) == series(h, key));
  }
}

TEST_CASE("bounded staleness: 2 batches ahead trains on batches 0, 1, 2, 2 versions old") {
  TempDir out("async_k2");
  Config c = async_config(out.path, 2, 2, "drop");
  c.set("trainer.total_training_steps", "4");
  const auto h = run(c);
  REQUIRE(h.size() == 4);
  CHECK(series(h, "training/off_policy/trajectory_staleness_worst/max") == std::vector<double>{0, 1, 2, 2});
  CHECK(series(h, "training/off_policy/dropped_trajectories") == std::vector<double>{0, 0, 0, 0});
}

TEST_CASE("max_off_policy_strategy drop discards batches older than the threshold; wait holds generation back "
          "instead") {
  TempDir a("async_drop"), b("async_wait");
  Config drop = async_config(a.path, 3, 1, "drop");
  drop.set("trainer.total_training_steps", "4");
  const auto hd = run(drop);
  REQUIRE(hd.size() == 4);
  // step 3 finds the two batches generated with version 0 two versions behind: 2 x 4 prompts x 2 samples
  CHECK(series(hd, "training/off_policy/dropped_trajectories") == std::vector<double>{0, 0, 16, 0});
  for (double s : series(hd, "training/off_policy/trajectory_staleness_worst/max")) CHECK(s <= 1);

  Config wait = async_config(b.path, 3, 1, "wait");
  wait.set("trainer.total_training_steps", "4");
  const auto hw = run(wait);
  REQUIRE(hw.size() == 4);
  CHECK(series(hw, "training/off_policy/dropped_trajectories") == std::vector<double>{0, 0, 0, 0});
  CHECK(series(hw, "training/off_policy/trajectory_staleness_worst/max") == std::vector<double>{0, 1, 1, 1});
}

TEST_CASE("threshold 0 with wait: the separate rollout group trains on-policy (staleness 0 every step)") {
  TempDir out("async_k0");
  const auto h = run(async_config(out.path, 2, 0, "wait"));
  CHECK(series(h, "training/off_policy/trajectory_staleness_worst/max") == std::vector<double>{0, 0, 0});
}

TEST_CASE("partial rollouts: responses generated in 2 segments reach the full length and span at most the "
          "versions published meanwhile") {
  TempDir out("async_partial");
  Config c = async_config(out.path, 2, 8, "drop");
  c.set("async_training.partial_rollout", "true");
  c.set("async_training.partial_rollout_segments", "2");
  c.set("actor_rollout_ref.rollout.calculate_log_probs", "true");
  c.set("trainer.total_training_steps", "4");
  const auto h = run(c);
  REQUIRE(h.size() == 4);
  for (const auto& m : h) {
    CHECK(m.at("training/off_policy/trajectory_spans/min").get<double>() >= 1);
    CHECK(m.at("training/off_policy/trajectory_spans/max").get<double>() <= 3);
    CHECK(m.at("training/off_policy/trajectory_staleness/min").get<double>() >= 0);
    CHECK(m.at("response_length/max").get<double>() <= 4);
    CHECK(std::isfinite(m.at("actor/pg_loss").get<double>()));
  }
}

TEST_CASE("DAPO dynamic sampling in separate_async mode fills its batch from several generation batches") {
  REQUIRE(parity_reward_registered);
  TempDir out("async_dapo");
  Config c = async_config(out.path, 1, 8, "drop");
  c.set("custom_reward_function.name", "async_test_length_parity");
  c.set("algorithm.filter_groups.enable", "true");
  c.set("algorithm.filter_groups.metric", "seq_reward");
  c.set("algorithm.filter_groups.max_num_gen_batches", "20");
  c.set("trainer.total_training_steps", "2");
  const auto h = run(c);
  REQUIRE(h.size() == 2);
  for (const auto& m : h) CHECK(m.at("train/num_gen_batches").get<int64_t>() >= 1);
}

TEST_CASE("separate_async resume: in-flight batches are not consumed, so no prompt is lost or repeated and no step "
          "is counted twice") {
  TempDir a("async_full"), b("async_resumed");
  auto config = [](const fs::path& out, const char* steps) {
    Config c = async_config(out, 2, 8, "drop");
    c.set("trainer.total_training_steps", steps);
    c.set("trainer.save_freq", "2");
    return c;
  };
  const auto full = run(config(a.path, "4"));
  REQUIRE(full.size() == 4);
  run(config(b.path, "2"));
  // two batches were generating ahead when step 2 saved: the data position is that of 2 batches
  CHECK(data_state(b.path, 2).at("data_cursor") == 2);
  // an interrupted run's later lines (step 3 logged, no checkpoint) are not kept twice
  {
    std::ofstream(b.path / "metrics.jsonl", std::ios::app) << R"({"step": 3})" << "\n";
  }
  const auto resumed = run(config(b.path, "4"));
  REQUIRE(resumed.size() == 2);
  CHECK(resumed[0].at("training/global_step") == 3);
  require_same_prompts(resumed[0], full[2]);
  require_same_prompts(resumed[1], full[3]);
  CHECK(data_state(b.path, 4).at("data_cursor") == data_state(a.path, 4).at("data_cursor"));
  CHECK(logged_steps(b.path / "metrics.jsonl") == std::vector<int64_t>{1, 2, 3, 4});
}

TEST_CASE("separate_async resume at an epoch boundary trains the next epoch") {
  auto config = [](const fs::path& out, const char* epochs) {
    Config c = async_config(out, 2, 8, "drop");
    c.set("data.synthetic.train_size", "8");
    c.set("trainer.total_training_steps", "null");
    c.set("trainer.total_epochs", epochs);
    c.set("trainer.save_freq", "2");
    return c;
  };
  TempDir a("async_epoch_full"), b("async_epoch_resumed");
  const auto full = run(config(a.path, "2"));
  REQUIRE(full.size() == 4);
  REQUIRE(run(config(b.path, "1")).size() == 2);
  const auto resumed = run(config(b.path, "2"));
  REQUIRE(resumed.size() == 2);
  for (size_t i = 0; i < 2; ++i) {
    CHECK(resumed[i].at("training/global_step") == 3 + static_cast<int64_t>(i));
    CHECK(resumed[i].at("training/epoch") == 1);
    require_same_prompts(resumed[i], full[2 + i]);
  }
}

TEST_CASE("config/grpo_arithmetic_async.ini reads: one-step-off on separate workers with rollout correction") {
  Config c;
  c.load_ini(HYFLOW_ASYNC_CONFIG);
  CHECK(c.get_string("trainer.v1.trainer_mode") == "separate_async");
  CHECK(c.get_int("trainer.v1.separate_async.num_warmup_batches") == 1);
  CHECK(c.get_int("actor_rollout_ref.rollout.n_gpus_per_node") == 1);
  CHECK(c.get_string("algorithm.rollout_correction.rollout_is") == "token");
  CHECK(c.get_bool("actor_rollout_ref.rollout.calculate_log_probs"));
}

TEST_CASE("separate_async config errors name the key") {
  TempDir out("async_errors");
  Config mode = small_config("grpo", out.path);
  mode.set("trainer.v1.trainer_mode", "fully_async");
  CHECK_THROWS_WITH(PPOTrainer(mode), Catch::Contains("trainer.v1.trainer_mode") && Catch::Contains("fully_async"));
  Config strategy = async_config(out.path, 1, 1, "evict");
  CHECK_THROWS_WITH(PPOTrainer(strategy), Catch::Contains("max_off_policy_strategy"));
  Config remax = async_config(out.path, 1, 1, "drop");
  remax.set("algorithm.adv_estimator", "remax");
  CHECK_THROWS_WITH(PPOTrainer(remax), Catch::Contains("remax"));
  Config segments = async_config(out.path, 1, 1, "drop");
  segments.set("async_training.partial_rollout", "true");
  segments.set("async_training.partial_rollout_segments", "5");
  CHECK_THROWS_WITH(PPOTrainer(segments), Catch::Contains("async_training.partial_rollout_segments"));
}

TEST_CASE("parameter_sync_step 2: the rollout group gets versions 0, 2, 4 and trains on rows 0, 1, 2, 1 versions "
          "old; the weights are published only on sync steps") {
  TempDir out("async_sync2");
  Config c = async_config(out.path, 1, 8, "drop");
  c.set("trainer.v1.separate_async.parameter_sync_step", "2");
  c.set("trainer.total_training_steps", "4");
  const auto h = run(c);
  REQUIRE(h.size() == 4);
  // step 3 trains batch 2, launched during step 2 before version 2 was published
  CHECK(series(h, "training/off_policy/trajectory_staleness_worst/max") == std::vector<double>{0, 1, 2, 1});
  CHECK(series(h, "training/off_policy/trajectory_spans/max") == std::vector<double>{1, 1, 1, 1});
  CHECK(series(h, "training/off_policy/dropped_trajectories") == std::vector<double>{0, 0, 0, 0});
  for (size_t i = 0; i < h.size(); ++i) CHECK(h[i].contains("timing_s/update_weights") == ((i + 1) % 2 == 0));
}

TEST_CASE("parameter_sync_step 2 with threshold 1: drop discards the batch that fell 2 versions behind, wait "
          "holds generation back until the next sync") {
  TempDir a("async_sync2_drop"), b("async_sync2_wait");
  Config drop = async_config(a.path, 1, 1, "drop");
  drop.set("trainer.v1.separate_async.parameter_sync_step", "2");
  drop.set("trainer.total_training_steps", "4");
  const auto hd = run(drop);
  REQUIRE(hd.size() == 4);
  CHECK(series(hd, "training/off_policy/dropped_trajectories") == std::vector<double>{0, 0, 8, 0});
  CHECK(series(hd, "training/off_policy/trajectory_staleness_worst/max") == std::vector<double>{0, 1, 0, 1});

  Config wait = async_config(b.path, 1, 1, "wait");
  wait.set("trainer.v1.separate_async.parameter_sync_step", "2");
  wait.set("trainer.total_training_steps", "4");
  const auto hw = run(wait);
  REQUIRE(hw.size() == 4);
  CHECK(series(hw, "training/off_policy/dropped_trajectories") == std::vector<double>{0, 0, 0, 0});
  CHECK(series(hw, "training/off_policy/trajectory_staleness_worst/max") == std::vector<double>{0, 1, 0, 1});

  // wait cannot keep a bound below parameter_sync_step - 1: the weights lag that much before a sync
  Config too_rare = async_config(b.path, 1, 1, "wait");
  too_rare.set("trainer.v1.separate_async.parameter_sync_step", "3");
  CHECK_THROWS_WITH(PPOTrainer(too_rare), Catch::Contains("trainer.v1.separate_async.parameter_sync_step") &&
                                              Catch::Contains("max_off_policy_threshold"));
}

TEST_CASE("colocate_async (1 batch ahead): the trainer's own workers generate the next batch, which trains one "
          "version old, deterministically") {
  TempDir out("colocated_one_step");
  const auto h = run(colocated_config(out.path, 1, 8, "drop"));
  REQUIRE(h.size() == 3);
  CHECK(series(h, "training/off_policy/trajectory_staleness/max") == std::vector<double>{0, 1, 1});
  CHECK(series(h, "training/off_policy/trajectory_staleness_worst/min") == std::vector<double>{0, 1, 1});
  CHECK(series(h, "training/off_policy/dropped_trajectories") == std::vector<double>{0, 0, 0});
  for (const auto& m : h) {
    CHECK_FALSE(m.contains("timing_s/update_weights"));  // nothing to publish: the actor holds the weights
    for (const auto& [k, v] : m.items())
      if (v.is_number()) CHECK(std::isfinite(v.get<double>()));
  }
  TempDir again("colocated_one_step_again");
  const auto h2 = run(colocated_config(again.path, 1, 8, "drop"));
  for (const char* key : {"actor/pg_loss", "critic/score/mean", "response_length/mean", "actor/entropy"})
    CHECK(series(h2, key) == series(h, key));
}

TEST_CASE("colocate_async with 2 batches ahead: drop discards a batch 2 versions old under threshold 1, wait never "
          "lets one get there") {
  TempDir a("colocated_drop"), b("colocated_wait"), c2("colocated_k2");
  Config k2 = colocated_config(c2.path, 2, 2, "drop");
  k2.set("trainer.total_training_steps", "4");
  const auto hk = run(k2);
  CHECK(series(hk, "training/off_policy/trajectory_staleness_worst/max") == std::vector<double>{0, 1, 2, 2});

  Config drop = colocated_config(a.path, 2, 1, "drop");
  drop.set("trainer.total_training_steps", "4");
  const auto hd = run(drop);
  REQUIRE(hd.size() == 4);
  // step 3 finds batch 2 (generated on version 0 during step 1) two versions behind: 4 prompts x 2 samples
  CHECK(series(hd, "training/off_policy/dropped_trajectories") == std::vector<double>{0, 0, 8, 0});
  CHECK(series(hd, "training/off_policy/trajectory_staleness_worst/max") == std::vector<double>{0, 1, 1, 1});

  Config wait = colocated_config(b.path, 2, 1, "wait");
  wait.set("trainer.total_training_steps", "4");
  const auto hw = run(wait);
  REQUIRE(hw.size() == 4);
  CHECK(series(hw, "training/off_policy/dropped_trajectories") == std::vector<double>{0, 0, 0, 0});
  CHECK(series(hw, "training/off_policy/trajectory_staleness_worst/max") == std::vector<double>{0, 1, 1, 1});
}

TEST_CASE("colocate_async resume: the batches generating at the checkpoint are generated again, no prompt lost or "
          "repeated, no step counted twice") {
  TempDir a("colocated_full"), b("colocated_resumed");
  auto config = [](const fs::path& out, const char* steps) {
    Config c = colocated_config(out, 2, 8, "drop");
    c.set("trainer.total_training_steps", steps);
    c.set("trainer.save_freq", "2");
    return c;
  };
  const auto full = run(config(a.path, "4"));
  REQUIRE(full.size() == 4);
  run(config(b.path, "2"));
  CHECK(data_state(b.path, 2).at("data_cursor") == 2);
  const auto resumed = run(config(b.path, "4"));
  REQUIRE(resumed.size() == 2);
  CHECK(resumed[0].at("training/global_step") == 3);
  require_same_prompts(resumed[0], full[2]);
  require_same_prompts(resumed[1], full[3]);
  // the resumed run starts a new pipeline: its first batch is generated with the checkpoint's weights
  CHECK(resumed[0].at("training/off_policy/trajectory_staleness_worst/max") == 0);
  CHECK(data_state(b.path, 4).at("data_cursor") == data_state(a.path, 4).at("data_cursor"));
  CHECK(logged_steps(b.path / "metrics.jsonl") == std::vector<int64_t>{1, 2, 3, 4});
}

TEST_CASE("colocate_async config errors name the key") {
  TempDir out("colocated_errors");
  Config partial = colocated_config(out.path, 1, 8, "drop");
  partial.set("async_training.partial_rollout", "true");
  CHECK_THROWS_WITH(PPOTrainer(partial), Catch::Contains("async_training.partial_rollout") &&
                                             Catch::Contains("colocate_async"));
  Config remax = colocated_config(out.path, 1, 8, "drop");
  remax.set("algorithm.adv_estimator", "remax");
  CHECK_THROWS_WITH(PPOTrainer(remax), Catch::Contains("remax"));
}

TEST_CASE("the replay buffer (max_requeues 1) generates batches dropped as stale again on newer weights; a "
          "checkpoint keeps them, so after resume each is trained once") {
  TempDir a("replay_full"), b("replay_resumed");
  auto config = [](const fs::path& out, const char* steps) {
    Config c = async_config(out, 3, 1, "drop");
    c.set("trainer.v1.sampler.max_requeues", "1");
    c.set("trainer.total_training_steps", steps);
    c.set("trainer.save_freq", "3");
    return c;
  };
  const auto full = run(config(a.path, "4"));
  REQUIRE(full.size() == 4);
  // step 3 drops batches 2 and 3 (version 0, two behind) and requeues their 2 x 4 prompts; they generate
  // again on version 2, so step 4 trains batch 2's prompts one version old
  CHECK(series(full, "training/off_policy/dropped_trajectories") == std::vector<double>{0, 0, 16, 0});
  CHECK(series(full, "training/off_policy/requeued_groups") == std::vector<double>{0, 0, 8, 0});
  CHECK(full[2].at("training/off_policy/replay_buffer_groups") == 8);
  CHECK(full[3].at("training/off_policy/replay_buffer_groups") == 4);  // batch 3's prompts still generating
  CHECK(series(full, "training/off_policy/trajectory_staleness_worst/max") == std::vector<double>{0, 1, 1, 1});
  const auto saved = data_state(a.path, 3);
  REQUIRE(saved.at("replay_buffer").size() == 2);
  CHECK(saved.at("replay_buffer")[0].at("origin") == "b2");
  CHECK(saved.at("replay_buffer")[1].at("origin") == "b3");
  CHECK(saved.at("replay_buffer")[0].at("times") == 1);
  CHECK(saved.at("data_cursor") == 5);  // batches 0..4 taken (trained or dropped)

  run(config(b.path, "3"));
  CHECK(data_state(b.path, 3) == saved);
  const auto resumed = run(config(b.path, "4"));
  REQUIRE(resumed.size() == 1);
  require_same_prompts(resumed[0], full[3]);  // batch 2's prompts, trained once
  CHECK(data_state(b.path, 4).at("replay_buffer") == data_state(a.path, 4).at("replay_buffer"));
  CHECK(data_state(b.path, 4).at("data_cursor") == data_state(a.path, 4).at("data_cursor"));

  // without the buffer dropped groups are used up: no requeue metrics, no buffer in the checkpoint
  TempDir c("replay_off");
  Config off = config(c.path, "3");
  off.set("trainer.v1.sampler.max_requeues", "0");
  const auto h = run(off);
  CHECK_FALSE(h[2].contains("training/off_policy/requeued_groups"));
  CHECK_FALSE(data_state(c.path, 3).contains("replay_buffer"));
}

TEST_CASE("the replay buffer requeues a prompt at most max_requeues times") {
  // threshold 0 with 2 batches ahead under drop: every second batch is stale when taken
  TempDir out("replay_bound");
  Config c = async_config(out.path, 2, 0, "drop");
  c.set("trainer.v1.sampler.max_requeues", "1");
  c.set("trainer.total_training_steps", "4");
  const auto h = run(c);
  REQUIRE(h.size() == 4);
  double requeued = 0, dropped_prompts = 0;
  for (const auto& m : h) {
    requeued += m.at("training/off_policy/requeued_groups").get<double>();
    dropped_prompts += m.at("training/off_policy/dropped_trajectories").get<double>() / 2;  // rollout.n = 2
    CHECK(m.at("training/off_policy/trajectory_staleness_worst/max") == 0);
  }
  CHECK(requeued > 0);
  CHECK(dropped_prompts > requeued);  // a requeued batch dropped again is not requeued a second time
}

namespace {
/// GET /metrics on 127.0.0.1:port; the whole answer ("" when nothing listens).
std::string scrape(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string out;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    const std::string req = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    (void)!::send(fd, req.data(), req.size(), MSG_NOSIGNAL);
    char buf[4096];
    for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

/// Listed after "prometheus" in trainer.logger: scrapes its endpoint right after each step.
struct ScrapeAfterLog : tracking::Tracker {
  static inline int port = 0;
  static inline std::vector<std::string> scrapes;
  explicit ScrapeAfterLog(const tracking::RunInfo&) {}
  void log_config(const nlohmann::json&) override {}
  void log(const nlohmann::json&, int64_t) override { scrapes.push_back(scrape(port)); }
  void flush() override {}
  void close() override {}
};
const bool scrape_after_log_registered =
    (tracking::register_tracker("scrape_after_log",
                                [](const tracking::RunInfo& r) { return std::make_unique<ScrapeAfterLog>(r); }),
     true);
}  // namespace

TEST_CASE("the prometheus tracker serves a real async run: step, phases, throughput, weight version, staleness, "
          "queue") {
  TempDir out("async_prometheus");
  Config c = async_config(out.path, 1, 8, "drop");
  c.set("trainer.logger", "['jsonl','prometheus','scrape_after_log']");
  CHECK_THROWS_WITH(read_ppo_config(c), Catch::Contains("'trainer.prometheus.port' is required"));
  ScrapeAfterLog::port = hyflow::pick_free_port();
  c.set("trainer.prometheus.port", std::to_string(ScrapeAfterLog::port));
  ScrapeAfterLog::scrapes.clear();
  const auto h = run(c);
  REQUIRE(h.size() == 3);
  REQUIRE(ScrapeAfterLog::scrapes.size() == 3);
  const std::string& last = ScrapeAfterLog::scrapes.back();
  CAPTURE(last);
  CHECK(last.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
  for (const char* expected : {"\nhyflow_trainer_step 3\n", "\nhyflow_trainer_rollout_weight_version 3\n",
                               "\nhyflow_trainer_trajectory_staleness_steps{stat=\"max\"} 1\n",
                               "\nhyflow_trainer_phase_seconds{phase=\"update_weights\"} ",
                               "\nhyflow_trainer_phase_seconds{phase=\"step\"} ",
                               "\nhyflow_trainer_throughput_tokens_per_second ",
                               "\nhyflow_trainer_rollout_queue_batches ", "\nhyflow_trainer_total_steps 3\n"})
    CHECK(last.find(expected) != std::string::npos);
  CHECK(ScrapeAfterLog::scrapes.front().find("\nhyflow_trainer_step 1\n") != std::string::npos);
  CHECK(scrape(ScrapeAfterLog::port).empty());  // the run closed its trackers: the endpoint is gone
}
