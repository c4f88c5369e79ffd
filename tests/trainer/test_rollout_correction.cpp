// verl's rollout correction (algorithm.rollout_correction): IS weights old / rollout policy at
// token and sequence level with truncation, the rollout_corr/* metrics, and the trainer using
// them on stale (one-step-off) samples.
#include "ppo_test_fixture.hpp"

#include <hyflow/algos/rollout_correction.hpp>
#include <hyflow/core/error.hpp>
#include <hyflow/trainer/ppo_trainer.hpp>

#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <cmath>

using namespace hyflow;
using namespace hyflow::algos::rollout_correction;
using namespace ppo_test;

namespace {
at::Tensor logs(std::initializer_list<std::initializer_list<double>> rows) {
  std::vector<at::Tensor> out;
  for (auto r : rows) out.push_back(torch::tensor(std::vector<double>(r), torch::kDouble).log());
  return torch::stack(out).to(torch::kFloat);
}
}  // namespace

TEST_CASE("token-level IS weights: old/rollout per token, truncated at the threshold, 0 on padding") {
  // row 0: ratios 2 and 0.5; row 1: ratio 1 then padding
  const auto old_lp = logs({{0.5, 0.25}, {0.3, 0.9}});
  const auto rollout_lp = logs({{0.25, 0.5}, {0.3, 0.1}});
  const auto mask = torch::tensor({{1, 1}, {1, 0}}, torch::kLong);
  const auto r = compute_rollout_is_weights(old_lp, rollout_lp, mask, {.level = "token", .threshold = 1.5});
  CHECK(torch::allclose(r.weights, torch::tensor({{1.5f, 0.5f}, {1.0f, 0.0f}})));
  const auto& m = r.metrics;
  CHECK(m.at("rollout_corr/rollout_is_mean").get<double>() == Approx(1.0));
  CHECK(m.at("rollout_corr/rollout_is_max").get<double>() == Approx(1.5));
  CHECK(m.at("rollout_corr/rollout_is_min").get<double>() == Approx(0.5));
  CHECK(m.at("rollout_corr/rollout_is_ratio_fraction_high").get<double>() == Approx(1.0 / 3));
  // (mean w)^2 / mean w^2 = 1 / ((2.25 + 0.25 + 1) / 3)
  CHECK(m.at("rollout_corr/rollout_is_eff_sample_size").get<double>() == Approx(3.0 / 3.5));
  CHECK(m.at("rollout_corr/kl").get<double>() == Approx(0.0).margin(1e-6));  // log 0.5 + log 2 + 0
  CHECK(m.at("rollout_corr/chi2_token").get<double>() == Approx((4 + 0.25 + 1) / 3.0 - 1).epsilon(1e-5));
  CHECK(m.at("rollout_corr/k3_kl").get<double>() ==
        Approx(((2 - std::log(2.0) - 1) + (0.5 + std::log(2.0) - 1)) / 3).epsilon(1e-5));
}

TEST_CASE("sequence-level IS weights: the product of a row's ratios on all its tokens, truncated") {
  const auto old_lp = logs({{0.5, 0.25}, {0.9, 0.5}});
  const auto rollout_lp = logs({{0.25, 0.5}, {0.3, 0.5}});
  const auto mask = torch::tensor({{1, 1}, {1, 0}}, torch::kLong);
  const auto r = compute_rollout_is_weights(old_lp, rollout_lp, mask, {.level = "sequence", .threshold = 2.0});
  // row 0: 2 x 0.5 = 1; row 1: 3 (the padded token does not count) -> truncated to 2
  CHECK(torch::allclose(r.weights, torch::tensor({{1.0f, 1.0f}, {2.0f, 0.0f}})));
  CHECK(r.metrics.at("rollout_corr/rollout_is_mean").get<double>() == Approx(1.5));
  CHECK(r.metrics.at("rollout_corr/rollout_is_ratio_fraction_high").get<double>() == Approx(0.5));
}

TEST_CASE("identical policies give weights 1, an effective sample size of 1 and no divergence") {
  const auto lp = logs({{0.5, 0.25, 0.1}});
  const auto r = compute_rollout_is_weights(lp, lp, torch::ones({1, 3}, torch::kLong), {});
  CHECK(torch::allclose(r.weights, torch::ones({1, 3})));
  CHECK(r.metrics.at("rollout_corr/rollout_is_eff_sample_size").get<double>() == Approx(1.0));
  CHECK(r.metrics.at("rollout_corr/kl").get<double>() == Approx(0.0).margin(1e-9));
  CHECK(r.metrics.at("rollout_corr/log_ppl_diff").get<double>() == Approx(0.0).margin(1e-9));
  CHECK(r.metrics.at("rollout_corr/training_ppl").get<double>() ==
        Approx(r.metrics.at("rollout_corr/rollout_ppl").get<double>()));
}

TEST_CASE("rollout correction refuses mismatched shapes, an unknown level and a non-positive threshold") {
  const auto a = torch::zeros({2, 3});
  CHECK_THROWS_AS(compute_rollout_is_weights(a, torch::zeros({2, 2}), torch::ones({2, 3}), {}), ShapeError);
  CHECK_THROWS_WITH(compute_rollout_is_weights(a, a, torch::ones({2, 3}), {.level = "geometric"}),
                    Catch::Contains("rollout_is") && Catch::Contains("geometric"));
  CHECK_THROWS_WITH(compute_rollout_is_weights(a, a, torch::ones({2, 3}), {.threshold = 0}),
                    Catch::Contains("rollout_is_threshold"));
}

TEST_CASE("the trainer weights one-step-off samples by rollout correction: rollout_corr/* logged, stale steps "
          "show the gap between the versions") {
  TempDir out("rollout_corr");
  Config c = small_config("grpo", out.path);
  c.set("trainer.v1.trainer_mode", "separate_async");
  c.set("actor_rollout_ref.rollout.calculate_log_probs", "true");
  c.set("algorithm.rollout_correction.rollout_is", "token");
  c.set("trainer.val_before_train", "false");
  c.set("trainer.test_freq", "-1");
  trainer::PPOTrainer t(c);
  t.init_workers();
  t.fit();
  const auto& h = t.history();
  REQUIRE(h.size() == 3);
  for (const auto& m : h) {
    CHECK(m.at("rollout_corr/rollout_is_max").get<double>() <= 2.0);
    CHECK(std::isfinite(m.at("rollout_corr/kl").get<double>()));
  }
  // step 1 trains on version 0 samples with version 0 weights; step 2 on version 0 samples with version 1
  CHECK(std::abs(h[0].at("rollout_corr/kl").get<double>()) < 1e-4);
  CHECK(std::abs(h[1].at("rollout_corr/kl").get<double>()) > 1e-4);

  Config no_log_probs = small_config("grpo", out.path);
  no_log_probs.set("algorithm.rollout_correction.rollout_is", "token");
  CHECK_THROWS_WITH(trainer::PPOTrainer(no_log_probs),
                    Catch::Contains("actor_rollout_ref.rollout.calculate_log_probs"));
}

TEST_CASE("a bf16 rollout reports its mismatch with the actor every step and corrects it (TIS), with a float32 "
          "actor and under bf16 mixed precision; it needs calculate_log_probs") {
  // mixed: verl's actor and reference fsdp_config.mixed_precision.param_dtype=bf16 (fp32 masters)
  const bool mixed = GENERATE(false, true);
  CAPTURE(mixed);
  TempDir out(mixed ? "rollout_bf16_mixed" : "rollout_bf16");
  Config c = small_config("grpo", out.path);
  if (mixed)
    for (const char* role : {"actor", "ref"})
      c.set(std::string("actor_rollout_ref.") + role + ".fsdp_config.mixed_precision.param_dtype", "bf16");
  c.set("actor_rollout_ref.rollout.dtype", "bfloat16");
  CHECK_THROWS_WITH(trainer::PPOTrainer(c), Catch::Contains("actor_rollout_ref.rollout.dtype") &&
                                                Catch::Contains("actor_rollout_ref.rollout.calculate_log_probs"));
  c.set("actor_rollout_ref.rollout.calculate_log_probs", "true");
  c.set("algorithm.rollout_correction.rollout_is", "token");
  c.set("trainer.val_before_train", "false");
  c.set("trainer.test_freq", "-1");
  trainer::PPOTrainer t(c);
  t.init_workers();
  t.fit();
  const auto& h = t.history();
  REQUIRE(h.size() == 3);
  for (const auto& m : h) {
    // on-policy steps: what the rollout and the actor disagree on is the bf16 forward's rounding
    CHECK(m.at("training/rollout_probs_diff_max").get<double>() > 0.0);
    CHECK(m.at("training/rollout_probs_diff_mean").get<double>() < 0.05);
    CHECK(m.contains("training/rollout_probs_diff_std"));
    CHECK(std::abs(m.at("rollout_corr/rollout_is_mean").get<double>() - 1.0) < 0.1);
    CHECK(std::isfinite(m.at("actor/pg_loss").get<double>()));
  }
}

TEST_CASE("the trainer rejects stale tokens and vetoes rows by rollout correction: response_mask shrinks on "
          "off-policy steps only") {
  TempDir out("rollout_rs");
  Config c = small_config("grpo", out.path);
  c.set("trainer.v1.trainer_mode", "separate_async");
  c.set("actor_rollout_ref.rollout.calculate_log_probs", "true");
  c.set("algorithm.rollout_correction.rollout_rs", "token");
  c.set("algorithm.rollout_correction.rollout_rs_threshold", "1.5");
  c.set("algorithm.rollout_correction.rollout_token_veto_threshold", "0.5");
  c.set("trainer.val_before_train", "false");
  c.set("trainer.test_freq", "-1");
  trainer::PPOTrainer t(c);
  t.init_workers();
  t.fit();
  const auto& h = t.history();
  REQUIRE(h.size() == 3);
  // step 1: the same version generated and trains (ratios 1 up to float rounding): nothing rejected
  CHECK(h[0].at("rollout_corr/rollout_rs_masked_fraction").get<double>() == 0.0);
  CHECK(h[0].at("rollout_corr/rollout_is_veto_fraction").get<double>() == 0.0);
  // steps 2 and 3: one version apart at lr 1e-2 the token ratios spread over about 0.06..2.2: some leave
  // [1/1.5, 1.5], some rows hold one below 0.5, not all
  for (size_t i = 1; i < 3; ++i) {
    CHECK(h[i].at("rollout_corr/rollout_rs_masked_fraction").get<double>() > 0.0);
    CHECK(h[i].at("rollout_corr/rollout_rs_masked_fraction").get<double>() < 1.0);
    CHECK(h[i].at("rollout_corr/rollout_is_veto_fraction").get<double>() > 0.0);
    CHECK(h[i].at("rollout_corr/rollout_is_veto_fraction").get<double>() < 1.0);
    CHECK(std::isfinite(h[i].at("actor/pg_loss").get<double>()));
  }
  CHECK_FALSE(h[0].contains("rollout_corr/rollout_is_mean"));  // rollout_is stays off
}

TEST_CASE("bypass mode takes the rollout's log-probs as old_log_probs: no recompute, the same samples and "
          "rewards as the decoupled loop") {
  TempDir a("bypass"), b("decoupled");
  auto config = [](const fs::path& out, bool bypass) {
    Config c = small_config("grpo", out);
    c.set("actor_rollout_ref.rollout.calculate_log_probs", "true");
    c.set("algorithm.rollout_correction.bypass_mode", bypass ? "true" : "false");
    c.set("trainer.total_training_steps", "1");
    c.set("trainer.val_before_train", "false");
    c.set("trainer.test_freq", "-1");
    return c;
  };
  trainer::PPOTrainer bypass(config(a.path, true)), decoupled(config(b.path, false));
  bypass.init_workers();
  decoupled.init_workers();
  bypass.fit();
  decoupled.fit();
  const auto& mb = bypass.history().at(0);
  const auto& md = decoupled.history().at(0);
  CHECK_FALSE(mb.contains("timing_s/old_log_prob"));
  CHECK_FALSE(mb.contains("actor/entropy"));
  CHECK(md.contains("timing_s/old_log_prob"));
  CHECK(mb.at("critic/score/mean") == md.at("critic/score/mean"));
  CHECK(mb.at("response_length/mean") == md.at("response_length/mean"));
  // the first mini-batch's ratio starts at 1 either way: the rollout's log-probs equal the actor's to rounding
  CHECK(mb.at("actor/pg_loss").get<double>() == Approx(md.at("actor/pg_loss").get<double>()).margin(1e-4));
}

TEST_CASE("rollout correction config errors name the key; verl keys hyflow lacks stay unknown") {
  TempDir out("rollout_corr_errors");
  Config rs = small_config("grpo", out.path);
  rs.set("actor_rollout_ref.rollout.calculate_log_probs", "true");
  rs.set("algorithm.rollout_correction.rollout_rs", "token");
  CHECK_THROWS_WITH(trainer::PPOTrainer(rs), Catch::Contains("algorithm.rollout_correction.rollout_rs_threshold"));
  rs.set("algorithm.rollout_correction.rollout_rs_threshold", "2");
  rs.set("algorithm.rollout_correction.rollout_rs", "seq_mean_k3");
  CHECK_THROWS_WITH(trainer::PPOTrainer(rs), Catch::Contains("rollout_rs") && Catch::Contains("seq_mean_k3"));
  rs.set("algorithm.rollout_correction.rollout_rs", "geometric");
  rs.set("algorithm.rollout_correction.rollout_rs_threshold_lower", "3");
  CHECK_THROWS_WITH(trainer::PPOTrainer(rs), Catch::Contains("rollout_rs_threshold_lower"));

  Config veto = small_config("grpo", out.path);
  veto.set("algorithm.rollout_correction.rollout_token_veto_threshold", "1e-4");
  CHECK_THROWS_WITH(trainer::PPOTrainer(veto), Catch::Contains("rollout_token_veto_threshold") &&
                                                   Catch::Contains("actor_rollout_ref.rollout.calculate_log_probs"));

  Config bypass = small_config("grpo", out.path);
  bypass.set("algorithm.rollout_correction.bypass_mode", "true");
  CHECK_THROWS_WITH(trainer::PPOTrainer(bypass), Catch::Contains("bypass_mode") &&
                                                     Catch::Contains("actor_rollout_ref.rollout.calculate_log_probs"));
  bypass.set("actor_rollout_ref.rollout.calculate_log_probs", "true");
  bypass.set("algorithm.rollout_correction.rollout_is", "token");
  CHECK_THROWS_WITH(trainer::PPOTrainer(bypass), Catch::Contains("bypass_mode") && Catch::Contains("rollout_is"));

  Config unknown;
  CHECK_THROWS_AS(unknown.set("algorithm.rollout_correction.loss_type", "reinforce"), KeyError);

  // a veto above every ratio rejects the whole batch: the step fails saying so instead of training on nothing
  Config everything = small_config("grpo", out.path);
  everything.set("actor_rollout_ref.rollout.calculate_log_probs", "true");
  everything.set("algorithm.rollout_correction.rollout_token_veto_threshold", "2");
  everything.set("trainer.val_before_train", "false");
  trainer::PPOTrainer t(everything);
  t.init_workers();
  CHECK_THROWS_WITH(t.fit(), Catch::Contains("rejected every response token") && Catch::Contains("loosen"));
}
