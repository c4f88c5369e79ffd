// Policy losses and loss aggregation with hand-derived values.
#include <hyflow/core/error.hpp>
#include <hyflow/algos/core_algos.hpp>

#include "test_helpers.hpp"

#include <cmath>

using namespace hyflow::algos::core_algos;
using hyflow::test::col;
using hyflow::test::f64;
using hyflow::test::i64;
using hyflow::test::require_close;
using hyflow::test::scalar;

namespace {
at::Tensor log_of(std::initializer_list<std::initializer_list<double>> ratios) { return torch::log(f64(ratios)); }
}  // namespace

TEST_CASE("agg_loss modes on a batch with an all-masked row") {
  auto loss = f64({{1, 2, 3}, {4, 5, 6}, {100, 100, 100}});
  auto mask = i64({{1, 1, 0}, {1, 0, 0}, {0, 0, 0}});
  REQUIRE(scalar(agg_loss(loss, mask, "token-mean")) == Approx(7.0 / 3.0).margin(1e-12));
  REQUIRE(scalar(agg_loss(loss, mask, "token-mean", 2, 7.0)) == Approx(2.0).margin(1e-12));
  REQUIRE(scalar(agg_loss(loss, mask, "seq-mean-token-sum")) == Approx(3.5).margin(1e-12));
  REQUIRE(scalar(agg_loss(loss, mask, "seq-mean-token-sum", 4, std::nullopt, 8.0)) == Approx(3.5).margin(1e-12));
  REQUIRE(scalar(agg_loss(loss, mask, "seq-mean-token-mean")) == Approx(2.75).margin(1e-12));
  // sum-norm divides by T (3) and never multiplies by dp_size
  REQUIRE(scalar(agg_loss(loss, mask, "seq-mean-token-sum-norm", 8)) == Approx(7.0 / 3.0).margin(1e-12));
  REQUIRE(scalar(agg_loss(loss, mask, "seq-mean-token-sum-norm", 1, std::nullopt, std::nullopt, 7.0)) ==
          Approx(1.0).margin(1e-12));
  REQUIRE_THROWS_AS(agg_loss(loss, mask, "token-sum-please"), hyflow::ValueError);
  REQUIRE_THROWS_AS(agg_loss(loss, mask.slice(0, 0, 2), "token-mean"), hyflow::ShapeError);
}

TEST_CASE("agg_loss of a fully masked micro-batch is 0, not NaN") {
  auto loss = f64({{1, 2}});
  auto mask = i64({{0, 0}});
  for (const char* mode : {"token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"}) {
    INFO(mode);
    REQUIRE(scalar(agg_loss(loss, mask, mode)) == 0.0);
  }
}

TEST_CASE("vanilla PPO: clip, dual clip only where A < 0, metrics") {
  ActorConfig config;
  auto old_lp = f64({{0, 0, 0, 0}});
  auto lp = log_of({{1.5, 0.5, 1.1, 4.0}});
  auto adv = f64({{1, 1, -1, -1}});
  auto mask = i64({{1, 1, 1, 1}});
  // per token: -1.2 (clipped high), -0.5, 1.1, min(3, 4) = 3 (dual clip)
  auto out = compute_policy_loss_vanilla(old_lp, lp, adv, mask, "token-mean", config);
  REQUIRE(scalar(out.pg_loss) == Approx(2.4 / 4).margin(1e-12));
  REQUIRE(out.pg_metrics.at("actor/pg_clipfrac") == Approx(0.25).margin(1e-12));
  REQUIRE(out.pg_metrics.at("actor/pg_clipfrac_lower") == Approx(0.25).margin(1e-12));
  REQUIRE(out.pg_metrics.at("actor/ppo_kl") == Approx(-std::log(1.5 * 0.5 * 1.1 * 4.0) / 4).margin(1e-12));

  SECTION("a positive advantage with a large ratio is not dual-clipped") {
    auto one = compute_policy_loss_vanilla(col({0}), log_of({{4.0}}), col({1}), i64({{1}}), "token-mean", config);
    REQUIRE(scalar(one.pg_loss) == Approx(-1.2).margin(1e-12));
    REQUIRE(one.pg_metrics.at("actor/pg_clipfrac_lower") == 0.0);
  }
  SECTION("asymmetric clip range") {
    config.clip_ratio_high = 0.28;
    auto asym = compute_policy_loss_vanilla(old_lp, lp, adv, mask, "token-mean", config);
    REQUIRE(scalar(asym.pg_loss) == Approx((-1.28 - 0.5 + 1.1 + 3) / 4).margin(1e-12));
  }
  SECTION("unset clip_ratio_low/high fall back to clip_ratio") {
    config.clip_ratio = 0.1;
    config.clip_ratio_low.reset();
    config.clip_ratio_high.reset();
    auto fallback = compute_policy_loss_vanilla(old_lp, lp, adv, mask, "token-mean", config);
    REQUIRE(scalar(fallback.pg_loss) == Approx((-1.1 - 0.5 + 1.1 + 3) / 4).margin(1e-12));
  }
  SECTION("rollout IS weights scale the token losses") {
    auto w = f64({{2, 1, 1, 1}});
    auto weighted = compute_policy_loss_vanilla(old_lp, lp, adv, mask, "token-mean", config, w);
    REQUIRE(scalar(weighted.pg_loss) == Approx(1.2 / 4).margin(1e-12));
  }
  SECTION("masked tokens do not count, whatever they hold") {
    auto lp5 = torch::cat({lp, log_of({{4.0}})}, 1);
    auto out5 = compute_policy_loss_vanilla(torch::zeros({1, 5}, torch::kDouble), lp5,
                                            torch::cat({adv, col({-100})}, 1), i64({{1, 1, 1, 1, 0}}),
                                            "token-mean", config);
    REQUIRE(scalar(out5.pg_loss) == Approx(0.6).margin(1e-12));
    REQUIRE(out5.pg_metrics.at("actor/pg_clipfrac_lower") == Approx(0.25).margin(1e-12));
  }
  SECTION("sequence aggregation modes") {
    auto lp2 = log_of({{1.5, 0.5}, {1.1, 4.0}});
    auto adv2 = f64({{1, 1}, {-1, -1}});
    auto mask2 = i64({{1, 0}, {1, 1}});
    auto old2 = torch::zeros({2, 2}, torch::kDouble);
    // row 0: -1.2 (one token); row 1: 1.1 + 3 = 4.1
    REQUIRE(scalar(compute_policy_loss_vanilla(old2, lp2, adv2, mask2, "seq-mean-token-mean", config).pg_loss) ==
            Approx((-1.2 + 2.05) / 2).margin(1e-12));
    REQUIRE(scalar(compute_policy_loss_vanilla(old2, lp2, adv2, mask2, "token-mean", config).pg_loss) ==
            Approx(2.9 / 3).margin(1e-12));
    config.loss_scale_factor = 4.0;
    REQUIRE(scalar(compute_policy_loss_vanilla(old2, lp2, adv2, mask2, "seq-mean-token-sum-norm", config).pg_loss) ==
            Approx(2.9 / 4).margin(1e-12));
  }
  SECTION("clip_ratio_c must exceed 1") {
    config.clip_ratio_c = 1.0;
    REQUIRE_THROWS_AS(compute_policy_loss_vanilla(old_lp, lp, adv, mask, "token-mean", config), hyflow::ValueError);
  }
  SECTION("gradient is zero on clipped tokens, -A·r/N on the others") {
    auto lp_var = lp.clone().requires_grad_(true);
    compute_policy_loss_vanilla(old_lp, lp_var, adv, mask, "token-mean", config).pg_loss.backward();
    require_close(lp_var.grad(), f64({{0, -0.5 / 4, 1.1 / 4, 0}}));
  }
  SECTION("mismatched shapes are rejected") {
    REQUIRE_THROWS_AS(compute_policy_loss_vanilla(old_lp, lp, adv.slice(1, 0, 2), mask, "token-mean", config),
                      hyflow::ShapeError);
  }
}

TEST_CASE("GSPO uses one ratio per sequence and always seq-mean-token-mean") {
  ActorConfig config;
  auto old_lp = f64({{0, 0}, {0, 0}});
  auto lp = f64({{std::log(2.0), 0.0}, {std::log(0.5), 5.0}});  // row 1 token 1 is masked
  auto adv = f64({{1, 1}, {1, 1}});
  auto mask = i64({{1, 1}, {1, 0}});
  // row 0: s = sqrt(2) -> clipped to 1.2 -> -1.2; row 1: s = 0.5 -> max(-0.5, -0.8) = -0.5
  auto out = compute_policy_loss_gspo(old_lp, lp, adv, mask, "token-mean", config);
  REQUIRE(scalar(out.pg_loss) == Approx((-1.2 - 0.5) / 2).margin(1e-12));
  REQUIRE(out.pg_metrics.at("actor/pg_clipfrac") == Approx(2.0 / 3.0).margin(1e-7));
  REQUIRE(out.pg_metrics.at("actor/ppo_kl") == Approx(0.0).margin(1e-12));
  REQUIRE(out.pg_metrics.at("actor/pg_clipfrac_lower") == 0.0);

  auto lp_var = lp.clone().requires_grad_(true);
  compute_policy_loss_gspo(old_lp, lp_var, adv, mask, "token-mean", config).pg_loss.backward();
  // d/dlp of -A·sg(s)·exp(lp - sg(lp)) is -A·s on unclipped tokens; row weight 1/2
  require_close(lp_var.grad(), f64({{0, 0}, {-0.5 / 2, 0}}));
}

TEST_CASE("SAPO gates with tau_pos for A > 0 and tau_neg otherwise, seq-mean-token-mean") {
  ActorConfig config;
  auto old_lp = f64({{0, 0}, {0, 0}});
  auto lp = f64({{0, 0}, {std::log(2.0), 0}});
  auto adv = f64({{1, -1}, {1, 0}});
  auto mask = i64({{1, 1}, {1, 0}});
  // row 0: -σ(0)·4 = -2 and +σ(0)·4/1.05; row 1: -σ(1)·4
  const double row0 = (-2.0 + 2.0 / 1.05) / 2;
  const double row1 = -4.0 / (1.0 + std::exp(-1.0));
  auto out = compute_policy_loss_sapo(old_lp, lp, adv, mask, "token-mean", config);
  REQUIRE(scalar(out.pg_loss) == Approx((row0 + row1) / 2).margin(1e-12));
  REQUIRE(out.pg_metrics.at("actor/pg_clipfrac") == 0.0);
}

TEST_CASE("GPG loss is -log_prob·A and reports no metrics") {
  ActorConfig config;
  auto out = compute_policy_loss_gpg(f64({{0, 0}}), f64({{-1, -2}}), f64({{1, 0.5}}), i64({{1, 1}}), "token-mean",
                                     config);
  REQUIRE(scalar(out.pg_loss) == Approx(1.0).margin(1e-12));
  REQUIRE(out.pg_metrics.empty());
}

TEST_CASE("Clip-Cov detaches the token whose covariance lies in (lb, ub)") {
  ActorConfig config;
  auto lp = f64({{3, -1, -1, -1}});
  auto adv = f64({{2, -2, 0, 0}});
  auto mask = i64({{1, 1, 1, 1}});
  // ratio 1; cov = (A - 0)(lp - 0) = {6, 2, 0, 0}: only token 1 is in (1, 5)
  auto lp_var = lp.clone().requires_grad_(true);
  auto out = compute_policy_loss_clip_cov(lp, lp_var, adv, mask, "token-mean", config);
  REQUIRE(scalar(out.pg_loss) == Approx(-2.0 / 4).margin(1e-12));
  REQUIRE(out.pg_metrics.at("actor/pg_clipfrac") == Approx(0.25).margin(1e-12));
  REQUIRE(out.pg_metrics.count("actor/pg_clipfrac_lower") == 0);
  out.pg_loss.backward();
  require_close(lp_var.grad(), f64({{-2.0 / 4, 0, 0, 0}}));
  config.policy_loss.clip_cov_ratio = 0;
  REQUIRE_THROWS_AS(compute_policy_loss_clip_cov(lp, lp, adv, mask, "token-mean", config), hyflow::ValueError);
}

TEST_CASE("KL-Cov adds ppo_kl_coef·|log r| on the top-covariance token") {
  ActorConfig config;
  auto old_lp = f64({{0, 0, 0, 0, 0}});
  auto lp = f64({{0.6, -0.4, 0, -0.2, 3}});
  auto adv = f64({{1, -1, 0, 0, 100}});
  auto mask = i64({{1, 1, 1, 1, 0}});
  // valid cov = (A - 0)(lp - 0) = {0.6, 0.4, 0, 0}: token 0 gets -e^0.6 + 0.1·0.6
  auto out = compute_policy_loss_kl_cov(old_lp, lp, adv, mask, "token-mean", config);
  REQUIRE(scalar(out.pg_loss) == Approx((-std::exp(0.6) + 0.06 + std::exp(-0.4)) / 4).margin(1e-12));
  REQUIRE(out.pg_metrics.at("actor/ppo_kl") == Approx(0.3).margin(1e-12));
}

TEST_CASE("GMPO: geometric-mean sequence ratio, plain mean over all rows") {
  ActorConfig config;
  auto old_lp = f64({{0, 0}, {0, 0}, {0, 0}});
  auto lp = f64({{0.1, 0.5}, {-0.5, 0.1}, {3, 3}});
  auto adv = f64({{1, 1}, {-1, -1}, {1, 1}});
  auto mask = i64({{1, 1}, {1, 1}, {0, 0}});
  // row 0: clipped log-ratios {0.1, 0.2} -> -exp(0.15); row 1 (A<0): {-0.2, 0.1} -> exp(-0.05);
  // row 2 fully masked: A_seq = 0 -> 0, but it still counts in the mean
  const double expected = (-std::exp(0.15) + std::exp(-0.05)) / 3;
  for (const char* mode : {"token-mean", "seq-mean-token-sum"}) {
    auto out = compute_policy_loss_geo_mean(old_lp, lp, adv, mask, mode, config);
    REQUIRE(scalar(out.pg_loss) == Approx(expected).margin(1e-12));
    REQUIRE(out.pg_metrics.at("actor/pg_clipfrac") == Approx(0.25).margin(1e-12));
    REQUIRE(out.pg_metrics.at("actor/pg_clipfrac_lower") == Approx(0.25).margin(1e-12));
    REQUIRE(out.pg_metrics.at("actor/ppo_kl") == Approx(-0.05).margin(1e-12));
  }
}

TEST_CASE("CISPO: stop-gradient clipped ratio times A times log_prob") {
  ActorConfig config;
  auto lp = f64({{std::log(1.5), std::log(0.9)}});
  auto adv = f64({{1, -1}});
  auto mask = i64({{1, 1}});
  auto lp_var = lp.clone().requires_grad_(true);
  auto out = compute_policy_loss_cispo(f64({{0, 0}}), lp_var, adv, mask, "token-mean", config);
  REQUIRE(scalar(out.pg_loss) == Approx((-1.2 * std::log(1.5) + 0.9 * std::log(0.9)) / 2).margin(1e-12));
  REQUIRE(out.pg_metrics.at("actor/pg_clipfrac") == Approx(0.5).margin(1e-12));
  out.pg_loss.backward();
  require_close(lp_var.grad(), f64({{-1.2 / 2, 0.9 / 2}}));
}

TEST_CASE("policy loss registry: built-ins, custom losses, unknown names") {
  ActorConfig config;
  auto names = registered_policy_losses();
  for (const char* name : {"vanilla", "gspo", "sapo", "gpg", "clip_cov", "kl_cov", "geo_mean", "cispo"}) {
    INFO(name);
    REQUIRE(std::find(names.begin(), names.end(), name) != names.end());
  }
  auto fn = get_policy_loss_fn("gpg");
  REQUIRE(scalar(fn(col({0}), col({-2}), col({1}), i64({{1}}), "token-mean", config, std::nullopt).pg_loss) ==
          2.0);
  register_policy_loss("test_zero", [](const at::Tensor&, const at::Tensor& log_prob, const at::Tensor&,
                                       const at::Tensor&, const std::string&, const ActorConfig&,
                                       const std::optional<at::Tensor>&) {
    return PolicyLossOutput{(log_prob * 0).sum(), {{"custom", 1.0}}};
  });
  REQUIRE(get_policy_loss_fn("test_zero")(col({0}), col({-2}), col({1}), i64({{1}}), "token-mean", config,
                                          std::nullopt)
              .pg_metrics.at("custom") == 1.0);
  REQUIRE_THROWS_AS(get_policy_loss_fn("ppo_but_typo"), hyflow::KeyError);
  REQUIRE_THROWS_WITH(get_policy_loss_fn("ppo_but_typo"), Catch::Contains("ppo_but_typo"));
}

TEST_CASE("float32 inputs agree with float64 to 1e-6 for every built-in loss") {
  ActorConfig config;
  auto old_lp = f64({{-1.0, -0.5, -2.0}, {-0.3, -0.7, -1.1}});
  auto lp = f64({{-0.8, -0.9, -1.5}, {-0.3, -0.2, -1.6}});
  auto adv = f64({{0.7, -1.3, 0.2}, {-0.4, 1.1, 0.0}});
  auto mask = i64({{1, 1, 0}, {1, 1, 1}});
  for (const auto& name : registered_policy_losses()) {
    if (name.rfind("test_", 0) == 0) continue;  // registered by other tests
    INFO(name);
    auto fn = get_policy_loss_fn(name);
    auto ref = fn(old_lp, lp, adv, mask, "token-mean", config, std::nullopt);
    auto f32 = fn(old_lp.to(torch::kFloat), lp.to(torch::kFloat), adv.to(torch::kFloat), mask, "token-mean", config,
                  std::nullopt);
    REQUIRE(f32.pg_loss.scalar_type() == torch::kFloat);
    REQUIRE(scalar(f32.pg_loss) == Approx(scalar(ref.pg_loss)).margin(1e-6));
  }
}
