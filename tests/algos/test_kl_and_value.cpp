// KL estimators, controllers, in-reward KL penalty, value and entropy losses.
#include <hyflow/dataproto/data_proto.hpp>
#include <hyflow/core/error.hpp>
#include <hyflow/algos/core_algos.hpp>

#include "test_helpers.hpp"

#include <cmath>

using namespace hyflow::algos::core_algos;
using hyflow::test::f64;
using hyflow::test::i64;
using hyflow::test::require_close;
using hyflow::test::scalar;

TEST_CASE("kl_penalty estimators k1, abs, k2, k3 by hand") {
  auto lp = f64({0.0, -1.0});
  auto ref = f64({-0.5, -0.5});
  require_close(kl_penalty(lp, ref, "kl"), f64({0.5, -0.5}));
  require_close(kl_penalty(lp, ref, "k1"), f64({0.5, -0.5}));
  require_close(kl_penalty(lp, ref, "abs"), f64({0.5, 0.5}));
  require_close(kl_penalty(lp, ref, "mse"), f64({0.125, 0.125}));
  require_close(kl_penalty(lp, ref, "k2"), f64({0.125, 0.125}));
  // k3 with d = ref - lp = {-0.5, 0.5}: e^d - d - 1
  auto k3 = f64({std::exp(-0.5) - 0.5, std::exp(0.5) - 1.5});
  require_close(kl_penalty(lp, ref, "low_var_kl"), k3);
  require_close(kl_penalty(lp, ref, "k3"), k3);
  REQUIRE_THROWS_AS(kl_penalty(lp, ref, "full"), hyflow::ValueError);
  REQUIRE_THROWS_AS(kl_penalty(lp, ref, "k4"), hyflow::ValueError);
  REQUIRE_THROWS_AS(kl_penalty(lp, f64({1.0}), "kl"), hyflow::ShapeError);
}

TEST_CASE("k3 clamps d to ±20 and the result to ±10, with zero gradient beyond") {
  auto lp = f64({0.0, 0.0}).requires_grad_(true);
  auto ref = f64({-30.0, 30.0});
  auto k3 = kl_penalty(lp, ref, "k3");
  // d = -30 -> -20: e^-20 + 19 > 10 -> 10; d = 30 -> 20: e^20 - 21 -> 10
  require_close(k3, f64({10.0, 10.0}));
  k3.sum().backward();
  require_close(lp.grad(), f64({0.0, 0.0}));
}

TEST_CASE("'+' estimators keep their value and take the k2 gradient") {
  auto lp = f64({0.0, -1.0}).requires_grad_(true);
  auto ref = f64({-0.5, -0.5});
  auto k3p = kl_penalty(lp, ref, "k3+");
  require_close(k3p, f64({std::exp(-0.5) - 0.5, std::exp(0.5) - 1.5}));
  k3p.sum().backward();
  require_close(lp.grad(), f64({0.5, -0.5}));  // d/dlp ½(lp-ref)² = lp - ref
  require_close(kl_penalty(lp, ref, "k2+"), f64({0.125, 0.125}));
  REQUIRE_THROWS_AS(kl_penalty(lp, ref, "full+"), hyflow::ValueError);
}

TEST_CASE("compute_rewards subtracts (old - ref)·kl_ratio") {
  require_close(compute_rewards(f64({1, 2}), f64({0.5, 0}), f64({0, 0.5}), 0.1), f64({0.95, 2.05}));
}

TEST_CASE("KL controllers: fixed never moves, adaptive moves by at most ±20%·n/horizon") {
  FixedKLController fixed(0.1);
  fixed.update(100.0, 1000);
  REQUIRE(fixed.value == 0.1);
  AdaptiveKLController adaptive(0.1, 0.05, 100);
  adaptive.update(0.1, 10);  // error clipped to +0.2 -> ×1.02
  REQUIRE(adaptive.value == Approx(0.102).margin(1e-15));
  adaptive.update(0.04, 10);  // 0.04/0.05 - 1 = -0.2 -> ×0.98
  REQUIRE(adaptive.value == Approx(0.102 * 0.98).margin(1e-15));

  auto from_config = get_kl_controller({.type = "adaptive", .kl_coef = 0.2, .horizon = 10, .target_kl = 1.0});
  from_config->update(1.05, 2);  // error 0.05 -> ×1.01
  REQUIRE(from_config->value == Approx(0.202).margin(1e-15));
  REQUIRE(get_kl_controller({})->value == 0.001);
  REQUIRE_THROWS_AS(get_kl_controller({.type = "adaptive", .horizon = 0}), hyflow::ValueError);
  REQUIRE_THROWS_AS(get_kl_controller({.type = "pid"}), hyflow::ValueError);
}

TEST_CASE("apply_kl_penalty writes token_level_rewards and reports β before the update") {
  hyflow::DataProto data(hyflow::TensorDict{
      {"response_mask", i64({{1, 1}, {1, 0}})},
      {"token_level_scores", f64({{0, 1}, {0, 2}})},
      {"old_log_probs", f64({{0, 0}, {-1, 5}})},
      {"ref_log_prob", f64({{-1, 0}, {0, 0}})},
  });
  AdaptiveKLController ctrl(0.1, 1.0, 4);
  auto metrics = apply_kl_penalty(data, ctrl, "kl");
  // kld·mask = {{1, 0}, {-1, 0}}; rewards = scores - 0.1·kld; row means 0.5 and -1 -> -0.25
  require_close(data.batch.at("token_level_rewards"), f64({{-0.1, 1}, {0.1, 2}}));
  REQUIRE(metrics.at("actor/reward_kl_penalty") == Approx(-0.25).margin(1e-12));
  REQUIRE(metrics.at("actor/reward_kl_penalty_coeff") == 0.1);
  REQUIRE(ctrl.value == Approx(0.1 * (1 - 0.2 * 2 / 4)).margin(1e-15));  // n_steps = batch size 2

  hyflow::DataProto missing(hyflow::TensorDict{{"response_mask", i64({{1}})}});
  REQUIRE_THROWS_AS(apply_kl_penalty(missing, ctrl), hyflow::KeyError);
}

TEST_CASE("value loss clips around the old values and counts clipped tokens") {
  auto vpreds = f64({{1.0, 0.6, 0.0}});
  auto values = f64({{0.5, 0.5, 0.5}});
  auto returns = f64({{1.5, 1.5, 1.5}});
  auto mask = i64({{1, 1, 0}});
  // token 0: clip to 0.7 -> max(0.25, 0.64); token 1 inside the range -> 0.81; token 2 masked
  auto out = compute_value_loss(vpreds, returns, values, mask, 0.2);
  REQUIRE(scalar(out.vf_loss) == Approx(0.5 * (0.64 + 0.81) / 2).margin(1e-12));
  REQUIRE(scalar(out.vf_clipfrac) == Approx(0.5).margin(1e-12));
  auto seq = compute_value_loss(vpreds, returns, values, mask, 0.2, "seq-mean-token-sum");
  REQUIRE(scalar(seq.vf_loss) == Approx(0.5 * (0.64 + 0.81)).margin(1e-12));
  REQUIRE_THROWS_AS(compute_value_loss(vpreds, returns.slice(1, 0, 2), values, mask, 0.2), hyflow::ShapeError);
}

TEST_CASE("entropy loss aggregates token entropies over the mask") {
  auto logits = torch::zeros({1, 2, 4}, torch::kDouble);  // uniform over 4: entropy log 4
  logits[0][1] = f64({0, 0, 0, std::log(3.0)});
  auto loss = compute_entropy_loss(logits, i64({{1, 0}}));
  REQUIRE(scalar(loss) == Approx(std::log(4.0)).margin(1e-12));
}

TEST_CASE("PF-PPO resampling follows the score weights, rows, columns and per-row meta_info") {
  torch::manual_seed(7);
  hyflow::DataProto data(hyflow::TensorDict{{"token_level_scores", f64({{0, 0}, {0, 0}, {1, 2}})}});
  data.non_tensor_batch["uid"] = hyflow::dataproto::Column{"a", "b", "c"};
  data.meta_info = {{"temperature", 1.0}, {"per_row", {10, 20, 30}}};
  // pow: weights {1e-8, 1e-8, 9 + 1e-8}: every draw picks row 2
  auto out = compute_pf_ppo_reweight_data(data, "pow", 2.0);
  REQUIRE(out.size() == 3);
  require_close(out.batch.at("token_level_scores"), f64({{1, 2}, {1, 2}, {1, 2}}));
  REQUIRE(out.non_tensor_batch.at("uid") == hyflow::dataproto::Column{"c", "c", "c"});
  REQUIRE(out.meta_info["per_row"] == hyflow::Json({30, 30, 30}));
  REQUIRE(out.meta_info["temperature"] == 1.0);

  // max_min: the middle score 3 has weight 1e-8 and is never drawn
  hyflow::DataProto four(hyflow::TensorDict{{"token_level_scores", hyflow::test::col({1, 5, 3, 5})}});
  for (int round = 0; round < 5; ++round) {
    auto drawn = compute_pf_ppo_reweight_data(four, "max_min").batch.at("token_level_scores");
    REQUIRE((drawn != 3).all().item<bool>());
  }
  REQUIRE(compute_pf_ppo_reweight_data(four, "max_random").size() == 4);
  REQUIRE_THROWS_AS(compute_pf_ppo_reweight_data(four, "min_max"), hyflow::ValueError);
}
