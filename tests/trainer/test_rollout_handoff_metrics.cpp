// The colocated loop's rollout handoff metrics: verl's timing_s/reshard (the sharding manager's
// gather before generation), the peak bytes it held (perf/reshard_peak_extra_bytes) and
// training/rollout_probs_diff_{max,mean,std} (rollout vs actor probabilities of the same tokens).
#include "ppo_test_fixture.hpp"

#include "../../trainer/src/trainer_metrics.hpp"

#include <hyflow/trainer/ppo_trainer.hpp>

#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <cmath>

using namespace hyflow;
using namespace hyflow::trainer;
using namespace ppo_test;

namespace {
int64_t tiny_model_bytes() {
  int64_t bytes = 0;
  for (const auto& p : models::load_causal_lm(tiny_model())->parameters()) bytes += p.numel() * 4;
  return bytes;
}

DataProto diff_batch(const at::Tensor& rollout_lp, const at::Tensor& actor_lp) {
  // 2 rows, prompt of 2, response of 3; row 1's last response token is padding
  auto mask = torch::tensor({{1, 1, 1, 1, 1}, {1, 1, 1, 1, 0}}, torch::kLong);
  return DataProto(TensorDict{{"responses", torch::zeros({2, 3}, torch::kLong)},
                              {"attention_mask", mask},
                              {"rollout_log_probs", rollout_lp},
                              {"old_log_probs", actor_lp}});
}
}  // namespace

TEST_CASE("rollout_probs_diff: verl's |exp(rollout) - exp(actor)| over response tokens, max / mean / unbiased std") {
  const auto rollout = torch::tensor({{0.5, 0.25, 0.125}, {0.5, 0.5, 0.9}}, torch::kFloat).log();
  const auto actor = torch::tensor({{0.4, 0.25, 0.125}, {0.5, 0.3, 0.1}}, torch::kFloat).log();
  const auto m = rollout_probs_diff_metrics(diff_batch(rollout, actor));
  // differences 0.1, 0, 0, 0, 0.2 (the padded 0.8 is left out)
  CHECK(m.at("training/rollout_probs_diff_max").get<double>() == Approx(0.2).epsilon(1e-5));
  CHECK(m.at("training/rollout_probs_diff_mean").get<double>() == Approx(0.06).epsilon(1e-5));
  const double mean = 0.06;
  const double var = (std::pow(0.1 - mean, 2) + 3 * mean * mean + std::pow(0.2 - mean, 2)) / 4;
  CHECK(m.at("training/rollout_probs_diff_std").get<double>() == Approx(std::sqrt(var)).epsilon(1e-5));

  // equal log-probs (the same weights through the same code) give exactly 0
  const auto same = rollout_probs_diff_metrics(diff_batch(actor, actor.clone()));
  CHECK(same.at("training/rollout_probs_diff_max").get<double>() == 0.0);
  CHECK(same.at("training/rollout_probs_diff_mean").get<double>() == 0.0);
  CHECK(same.at("training/rollout_probs_diff_std").get<double>() == 0.0);

  CHECK_THROWS_AS(rollout_probs_diff_metrics(diff_batch(rollout, actor.narrow(1, 0, 2))), ShapeError);

  // multi-turn: a tool turn's ids (response_mask 0) carry no rollout log-prob and stay out
  DataProto turns = diff_batch(rollout, actor);
  turns.batch.set("response_mask", torch::tensor({{1, 1, 1}, {1, 0, 0}}, torch::kLong));
  const auto t = rollout_probs_diff_metrics(turns);
  CHECK(t.at("training/rollout_probs_diff_max").get<double>() == Approx(0.1).epsilon(1e-5));
  CHECK(t.at("training/rollout_probs_diff_mean").get<double>() == Approx(0.025).epsilon(1e-5));
}

TEST_CASE("colocated GRPO steps report timing_s/reshard, the handoff's peak bytes and rollout_probs_diff exactly 0") {
  struct Case {
    const char* name;
    const char* fsdp_size;
    bool sharded;
  };
  // The rollout scores its rows with compute_log_prob's code; the trainer balances the batch
  // between generation and compute_log_prob (trainer.balance_batch, on by default), so each
  // worker scores other rows, in other micro-batches, than it generated: a row's log-probs do not
  // depend on the rows it is batched with.
  struct Batching {
    const char* name;
    std::vector<std::string> args;
  };
  const std::vector<Batching> batchings = {
      {"log-probs of a worker's rows in one pass", {}},
      {"micro-batches of 3 rows (the last one short)",
       {"--actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=3"}},
      {"dynamic micro-batches",
       {"--actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true",
        "--actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=24"}},
  };
  for (const auto& c : {Case{"FULL_SHARD over the 2 workers", "-1", true}, Case{"replicated", "1", false}}) {
    for (const auto& batching : batchings) {
      SECTION(std::string(c.name) + ", " + batching.name) {
        TempDir out("handoff");
        Config config = small_config("grpo", out.path);
        config.apply_arguments({"--actor_rollout_ref.rollout.calculate_log_probs=true",
                                std::string("--actor_rollout_ref.actor.fsdp_config.fsdp_size=") + c.fsdp_size,
                                "--trainer.total_training_steps=2", "--trainer.test_freq=-1",
                                "--trainer.val_before_train=false"});
        config.apply_arguments(batching.args);
        PPOTrainer t(config);
        t.init_workers();
        t.fit();
        REQUIRE(t.history().size() == 2);
        for (const auto& m : t.history()) {
          REQUIRE(m.contains("timing_s/reshard"));
          REQUIRE(m.contains("perf/reshard_peak_extra_bytes"));
          if (c.sharded) {
            CHECK(m.at("timing_s/reshard").get<double>() > 0);
            // generation holds the whole gathered policy on top of the shards
            CHECK(m.at("perf/reshard_peak_extra_bytes").get<int64_t>() == tiny_model_bytes());
          } else {
            CHECK(m.at("timing_s/reshard").get<double>() == 0);
            CHECK(m.at("perf/reshard_peak_extra_bytes").get<int64_t>() == 0);
          }
          for (const char* key : {"training/rollout_probs_diff_max", "training/rollout_probs_diff_mean",
                                  "training/rollout_probs_diff_std"})
            REQUIRE(m.contains(key));
          // The decode engine chooses the tokens; their log-probs are the actor's own: bit for bit.
          CHECK(m.at("training/rollout_probs_diff_max").get<double>() == 0.0);
          CHECK(m.at("training/rollout_probs_diff_mean").get<double>() == 0.0);
          CHECK(m.at("training/rollout_probs_diff_std").get<double>() == 0.0);
        }
      }
    }
  }
}

TEST_CASE("without rollout.calculate_log_probs the loop has no rollout_probs_diff (verl computes it only then)") {
  TempDir out("handoff_nolp");
  Config config = small_config("grpo", out.path);
  config.apply_arguments(
      {"--trainer.total_training_steps=1", "--trainer.test_freq=-1", "--trainer.val_before_train=false"});
  PPOTrainer t(config);
  t.init_workers();
  t.fit();
  REQUIRE(t.history().size() == 1);
  CHECK_FALSE(t.history()[0].contains("training/rollout_probs_diff_max"));
  CHECK(t.history()[0].contains("timing_s/reshard"));
}
