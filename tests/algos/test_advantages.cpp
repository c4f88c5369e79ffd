// Advantage estimators on small batches whose values are derived by hand in the comments.
#include <hyflow/core/error.hpp>
#include <hyflow/algos/core_algos.hpp>

#include "test_helpers.hpp"

#include <cmath>

using namespace hyflow::algos::core_algos;
using hyflow::test::col;
using hyflow::test::f64;
using hyflow::test::i64;
using hyflow::test::require_close;

namespace {
// float32(1) + 1e-6 as torch computes it for the singleton σ: 1 + 8 ulp.
const double kOnePlusEpsF32 = static_cast<double>(1.0f + 1e-6f);
}  // namespace

TEST_CASE("GAE with gamma=lam=0.5: raw returns, whitened advantages at every position") {
  auto rewards = f64({{1, 0, 2}});
  auto values = f64({{1, 2, 3}});
  auto mask = i64({{1, 1, 0}});
  // t=2 (masked): advantage carries 0; t=1: δ=0+0-2=-2 -> -2; t=0: δ=1+0.5·2-1=1, 1+0.25·(-2)=0.5
  auto out = compute_gae_advantage_return(rewards, values, mask, 0.5, 0.5);
  require_close(out.returns, f64({{1.5, 0, 3}}));
  // whiten over {0.5, -2}: μ=-0.75, unbiased var 3.125; the masked 0 becomes 0.75/σ
  const double s = std::sqrt(3.125 + 1e-8);
  require_close(out.advantages, f64({{1.25 / s, -1.25 / s, 0.75 / s}}));
}

TEST_CASE("GAE skips masked observation tokens inside a response") {
  auto rewards = f64({{0, 0, 1}, {0, 0, 0}});
  auto values = f64({{1, 5, 2}, {0, 0, 0}});
  auto mask = i64({{1, 0, 1}, {1, 1, 1}});
  // row 0: t=2 δ=-1; t=1 masked keeps next value 2 and advantage -1; t=0 δ=0+2-1=1, 1-1=0
  auto out = compute_gae_advantage_return(rewards, values, mask, 1.0, 1.0);
  require_close(out.returns.select(0, 0), f64({1, 4, 1}));
  REQUIRE_THROWS_AS(compute_gae_advantage_return(rewards, values.slice(1, 0, 2), mask, 1, 1), hyflow::ShapeError);
}

TEST_CASE("GRPO groups by uid value, unbiased std + 1e-6 on sigma, singleton sigma 1 in float32") {
  auto rewards = f64({{0, 1}, {2, 0}, {0, 0}, {0.5, 0}, {0, -1}});
  auto mask = i64({{1, 1}, {1, 1}, {1, 1}, {1, 1}, {1, 0}});
  std::vector<std::string> index{"a", "b", "a", "a", "c"};
  // group a scores {1, 0, 0.5}: μ 0.5, σ 0.5; b = {2}; c = {-1} (unmasked sum)
  auto out = compute_grpo_outcome_advantage(rewards, mask, index);
  const double a = 0.5 / (0.5 + 1e-6);
  require_close(out.advantages,
                f64({{a, a}, {2 / kOnePlusEpsF32, 2 / kOnePlusEpsF32}, {-a, -a}, {0, 0}, {-1 / kOnePlusEpsF32, 0}}));
  REQUIRE(out.returns.equal(out.advantages));

  SECTION("Dr.GRPO: no division by sigma") {
    auto dr = compute_grpo_outcome_advantage(rewards, mask, index, 1e-6, false);
    require_close(dr.advantages, f64({{0.5, 0.5}, {2, 2}, {-0.5, -0.5}, {0, 0}, {-1, 0}}));
  }
  SECTION("float32 inputs agree to 1e-6") {
    auto f32 = compute_grpo_outcome_advantage(rewards.to(torch::kFloat), mask, index);
    REQUIRE(f32.advantages.scalar_type() == torch::kFloat);
    require_close(f32.advantages, out.advantages, 1e-6);
  }
  SECTION("index length must match the batch") {
    REQUIRE_THROWS_AS(compute_grpo_outcome_advantage(rewards, mask, {"a"}), hyflow::ShapeError);
  }
}

TEST_CASE("vectorized GRPO: float32 group stats, variance floored at epsilon") {
  auto rewards = f64({{0, 1}, {2, 0}, {0, 0}, {0.5, 0}});
  auto mask = i64({{1, 1}, {1, 1}, {1, 1}, {1, 0}});
  std::vector<std::string> index{"a", "b", "a", "a"};
  auto out = compute_grpo_vectorized_outcome_advantage(rewards, mask, index);
  const double a = 0.5 / static_cast<double>(0.5f + 1e-6f);  // σ + ε summed in float32
  require_close(out.advantages, f64({{a, a}, {2 / kOnePlusEpsF32, 2 / kOnePlusEpsF32}, {-a, -a}, {0, 0}}));

  SECTION("a group with variance below 1e-6 uses sigma = sqrt(1e-6)") {
    auto near = compute_grpo_vectorized_outcome_advantage(col({1.0, 1.001}), i64({{1}, {1}}), {"g", "g"});
    // true σ = 7.07e-4 would give ±0.707; the floor gives ±0.0005/(0.001+1e-6) = ±0.4995
    require_close(near.advantages, col({-0.0005 / 0.001001, 0.0005 / 0.001001}), 1e-3);
  }
}

TEST_CASE("Pass@k GRPO: only the group's best gets r_max - r_second") {
  auto rewards = col({1, 3, 5, 2, 5});
  auto mask = i64({{1}, {1}, {1}, {1}, {1}});
  std::vector<std::string> index{"x", "x", "y", "x", "y"};
  // x = {1, 3, 2}: best row 1, 3-2 = 1, σ = 1; y ties -> 0
  auto out = compute_grpo_passk_outcome_advantage(rewards, mask, index);
  require_close(out.advantages, col({0, 1 / (1 + 1e-6), 0, 0, 0}));
  auto plain = compute_grpo_passk_outcome_advantage(rewards, mask, index, 1e-6, false);
  require_close(plain.advantages, col({0, 1, 0, 0, 0}));
  REQUIRE_THROWS_AS(compute_grpo_passk_outcome_advantage(rewards, mask, {"x", "x", "y", "x", "z"}),
                    hyflow::ValueError);
}

TEST_CASE("RLOO: leave-one-out baseline; a singleton keeps its score, vectorized gives 0") {
  auto rewards = f64({{1, 0}, {2, 0}, {7, 0}, {6, 0}});
  auto mask = i64({{1, 1}, {1, 1}, {1, 0}, {1, 1}});
  std::vector<std::string> index{"a", "a", "b", "a"};
  // a = {1, 2, 6}: 1-(2+6)/2 = -3, 2-3.5 = -1.5, 6-1.5 = 4.5
  auto out = compute_rloo_outcome_advantage(rewards, mask, index);
  require_close(out.advantages, f64({{-3, -3}, {-1.5, -1.5}, {7, 0}, {4.5, 4.5}}));
  auto vec = compute_rloo_vectorized_outcome_advantage(rewards, mask, index);
  require_close(vec.advantages, f64({{-3, -3}, {-1.5, -1.5}, {0, 0}, {4.5, 4.5}}));
}

TEST_CASE("REINFORCE++: discounted returns reset after masked tokens, whitened over the mask") {
  auto rewards = f64({{0, 0, 1}, {1, 0, 3}});
  auto mask = i64({{1, 1, 1}, {1, 0, 1}});
  auto out = compute_reinforce_plus_plus_outcome_advantage(rewards, mask, 0.5);
  require_close(out.returns, f64({{0.25, 0.5, 1}, {1, 1.5, 3}}));
  // masked returns {0.25, 0.5, 1, 1, 3}: μ 1.15, unbiased var 4.7/4 = 1.175
  const double s = std::sqrt(1.175 + 1e-8);
  require_close(out.advantages,
                f64({{-0.9 / s, -0.65 / s, -0.15 / s}, {-0.15 / s, 0, 1.85 / s}}));
}

TEST_CASE("REINFORCE++ baseline: group mean removed, then batch whitening") {
  auto rewards = f64({{0, 2}, {0, 0}, {1, 2}});
  auto mask = i64({{1, 1}, {1, 0}, {1, 1}});
  std::vector<std::string> index{"a", "a", "b"};
  // a = {2, 0} -> {1, -1}; b singleton keeps 3; tiled·mask -> {1,1,-1,3,3}: μ 1.4, var 11.2/4 = 2.8
  auto out = compute_reinforce_plus_plus_baseline_outcome_advantage(rewards, mask, index);
  const double s = std::sqrt(2.8 + 1e-8);
  require_close(out.advantages, f64({{-0.4 / s, -0.4 / s}, {-2.4 / s, 0}, {1.6 / s, 1.6 / s}}));
}

TEST_CASE("ReMax: reverse cumulative masked rewards minus the greedy baseline") {
  auto out = compute_remax_outcome_advantage(f64({{1, 2, 3}}), f64({0.5}), i64({{1, 1, 0}}));
  require_close(out.returns, f64({{3, 2, 0}}));
  require_close(out.advantages, f64({{2.5, 1.5, 0}}));
  REQUIRE_THROWS_AS(compute_remax_outcome_advantage(f64({{1, 2, 3}}), f64({0.5, 1}), i64({{1, 1, 0}})),
                    hyflow::ShapeError);
}

TEST_CASE("OPO: length-weighted group baseline") {
  auto rewards = f64({{0, 2, 0}, {6, 0, 0}, {4, 0, 0}});
  auto mask = i64({{1, 1, 1}, {1, 0, 0}, {1, 1, 0}});
  // a: lengths 3, 1; b = (3·2 + 1·6)/4 = 3; b singleton keeps 4
  auto out = compute_opo_outcome_advantage(rewards, mask, {"a", "a", "b"});
  require_close(out.advantages, f64({{-1, -1, -1}, {3, 0, 0}, {4, 4, 0}}));
}

TEST_CASE("GPG: alpha = bs / #nonzero scores, computed in float32 like verl") {
  auto rewards = col({1, 0, 3, 1});
  auto mask = i64({{1}, {1}, {1}, {1}});
  // 3 nonzero of 4: α = float32(1/3)·4; a: 1-0.5, 0-0.5; b: 3-2, 1-2
  const double alpha = 4.0 * static_cast<double>(1.0f / 3.0f);
  auto out = compute_gpg_outcome_advantage(rewards, mask, {"a", "a", "b", "b"});
  require_close(out.advantages, col({0.5 * alpha, -0.5 * alpha, alpha, -alpha}));
}

TEST_CASE("optimal token baseline: per-step weighted baseline, zero tail for the unique longest") {
  auto rewards = f64({{0, 1}, {0, 0}});
  auto old_log_probs = f64({{0, 0}, {0, 0}});  // π = 1
  auto sum_pi_squared = f64({{1.5, 1.5}, {1.5, 1.5}});  // w = 1 - 2 + 1.5 = 0.5
  SECTION("equal lengths") {
    auto mask = i64({{1, 1}, {1, 1}});
    // W = {0.5, 1}; B_0 = 0.5/(1+1e-8), B_1 = 1/(2+1e-8)
    auto out = compute_optimal_token_baseline_advantage(rewards, mask, {"g", "g"}, old_log_probs, sum_pi_squared);
    const double b0 = 0.5 / (1 + 1e-8), b1 = 1 / (2 + 1e-8);
    require_close(out.returns, f64({{1, 1}, {0, 0}}));
    require_close(out.advantages, f64({{1 - b0, 1 - b1}, {-b0, -b1}}));
  }
  SECTION("the longer row's tail has no baseline") {
    auto mask = i64({{1, 1}, {1, 0}});
    auto out = compute_optimal_token_baseline_advantage(rewards, mask, {"g", "g"}, old_log_probs, sum_pi_squared);
    const double b0 = 0.5 / (1 + 1e-8);
    require_close(out.advantages, f64({{1 - b0, 1}, {-b0, 0}}));
    auto no_tail = compute_optimal_token_baseline_advantage(rewards, mask, {"g", "g"}, old_log_probs,
                                                            sum_pi_squared, std::nullopt, false);
    require_close(no_tail.advantages, f64({{1 - b0, 1 - 1 / (1 + 1e-8)}, {-b0, 0}}));
  }
  SECTION("a singleton group has advantage = return") {
    auto out = compute_optimal_token_baseline_advantage(rewards, i64({{1, 1}, {1, 1}}), {"g", "h"}, old_log_probs,
                                                        sum_pi_squared);
    require_close(out.advantages, f64({{1, 1}, {0, 0}}));
  }
}

TEST_CASE("estimator registry dispatches by name, accepts custom ones, names unknown ones") {
  AdvantageInputs in;
  in.token_level_rewards = col({1, 0});
  in.response_mask = i64({{1}, {1}});
  in.index = std::vector<std::string>{"a", "a"};
  auto direct = compute_grpo_outcome_advantage(in.token_level_rewards, in.response_mask, *in.index);
  require_close(get_adv_estimator_fn("grpo")(in).advantages, direct.advantages);

  register_adv_est("test_double_reward", [](const AdvantageInputs& x) {
    auto a = x.token_level_rewards * 2;
    return AdvantageOutput{a, a};
  });
  require_close(get_adv_estimator_fn("test_double_reward")(in).advantages, col({2, 0}));
  REQUIRE_THROWS_AS(register_adv_est("test_double_reward", [](const AdvantageInputs& x) {
                      return AdvantageOutput{x.token_level_rewards, x.token_level_rewards};
                    }),
                    hyflow::ValueError);
  REQUIRE_THROWS_WITH(get_adv_estimator_fn("no_such_estimator"), Catch::Contains("no_such_estimator"));
  REQUIRE_THROWS_AS(get_adv_estimator_fn("no_such_estimator"), hyflow::KeyError);

  AdvantageInputs no_index = in;
  no_index.index.reset();
  REQUIRE_THROWS_AS(get_adv_estimator_fn("rloo")(no_index), hyflow::KeyError);
  REQUIRE_THROWS_AS(get_adv_estimator_fn("gae")(in), hyflow::KeyError);  // no values
  auto names = registered_adv_estimators();
  for (const char* name : {"gae", "grpo", "grpo_vectorized", "grpo_passk", "rloo", "rloo_vectorized",
                           "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax", "opo", "gpg",
                           "optimal_token_baseline", "tir_optimal_token_baseline"}) {
    INFO(name);
    REQUIRE(std::find(names.begin(), names.end(), name) != names.end());
  }
}

TEST_CASE("multi-turn optimal token baseline aligns trajectories on their valid tokens") {
  auto rewards = f64({{0, 0, 1}, {0, 2, 0}, {5, 5, 5}});
  auto mask = i64({{1, 0, 1}, {1, 1, 0}, {0, 0, 0}});  // row 0 has a tool token in the middle
  auto old_log_probs = torch::zeros({3, 3}, torch::kDouble);
  auto sum_pi_squared = torch::full({3, 3}, 1.5, torch::kDouble);  // w = 0.5
  // compacted: row 0 W {0.5, 1}, G {1, 1}; row 1 W {0.5, 1}, G {2, 2}
  // b_0 = (0.5 + 1)/(1 + 1e-8), b_1 = (1 + 2)/(2 + 1e-8); row 2 has no valid token
  auto out = compute_multi_turn_optimal_token_baseline_advantage(rewards, mask, {"g", "g", "g"}, old_log_probs,
                                                                 sum_pi_squared);
  const double b0 = 1.5 / (1 + 1e-8), b1 = 3 / (2 + 1e-8);
  require_close(out.returns, f64({{1, 1, 1}, {2, 2, 0}, {0, 0, 0}}));
  require_close(out.advantages, f64({{1 - b0, 0, 1 - b1}, {2 - b0, 2 - b1, 0}, {0, 0, 0}}));

  SECTION("a lone trajectory keeps its returns") {
    auto lone = compute_multi_turn_optimal_token_baseline_advantage(rewards, mask, {"a", "b", "c"}, old_log_probs,
                                                                    sum_pi_squared);
    require_close(lone.advantages, f64({{1, 0, 1}, {2, 2, 0}, {0, 0, 0}}));
  }
  SECTION("registered as tir_optimal_token_baseline") {
    AdvantageInputs in{.token_level_rewards = rewards,
                       .response_mask = mask,
                       .index = std::vector<std::string>{"g", "g", "g"},
                       .old_log_probs = old_log_probs,
                       .sum_pi_squared = sum_pi_squared};
    require_close(get_adv_estimator_fn("tir_optimal_token_baseline")(in).advantages, out.advantages);
    in.sum_pi_squared.reset();
    REQUIRE_THROWS_AS(get_adv_estimator_fn("tir_optimal_token_baseline")(in), hyflow::KeyError);
  }
}

TEST_CASE("every built-in estimator gives the same advantages in float32 as in float64 (1e-6)") {
  AdvantageInputs in;
  in.token_level_rewards = f64({{0.1, -0.4, 1.3}, {0.0, 0.7, 0.2}, {-0.6, 0.0, 0.0}, {0.9, 0.3, -0.2}});
  in.response_mask = i64({{1, 1, 1}, {1, 1, 0}, {1, 0, 0}, {1, 1, 1}});
  in.values = f64({{0.2, 0.1, -0.3}, {0.5, 0.4, 0.0}, {0.3, 0.0, 0.0}, {-0.1, 0.2, 0.6}});
  in.index = std::vector<std::string>{"a", "b", "a", "b"};
  in.reward_baselines = f64({0.3, -0.2, 0.1, 0.4});
  in.old_log_probs = f64({{-0.5, -1.2, -0.1}, {-2.0, -0.3, -0.7}, {-0.9, -0.4, -1.1}, {-0.2, -0.6, -1.5}});
  in.sum_pi_squared = f64({{0.6, 0.3, 0.8}, {0.2, 0.5, 0.4}, {0.45, 0.55, 0.35}, {0.7, 0.4, 0.25}});
  in.config.gamma = 0.9;
  in.config.lam = 0.95;
  auto to_f32 = [](const std::optional<at::Tensor>& t) {
    return t ? std::optional<at::Tensor>(t->to(torch::kFloat)) : std::nullopt;
  };
  AdvantageInputs in32 = in;
  in32.token_level_rewards = in.token_level_rewards.to(torch::kFloat);
  in32.values = to_f32(in.values);
  in32.reward_baselines = to_f32(in.reward_baselines);
  in32.old_log_probs = to_f32(in.old_log_probs);
  in32.sum_pi_squared = to_f32(in.sum_pi_squared);
  for (const auto& name : registered_adv_estimators()) {
    if (name.rfind("test_", 0) == 0) continue;  // registered by other tests
    INFO(name);
    auto ref = get_adv_estimator_fn(name)(in);
    auto f32 = get_adv_estimator_fn(name)(in32);
    REQUIRE(f32.advantages.scalar_type() == torch::kFloat);
    require_close(f32.advantages, ref.advantages, 1e-6);
    require_close(f32.returns, ref.returns, 1e-6);
  }
}
