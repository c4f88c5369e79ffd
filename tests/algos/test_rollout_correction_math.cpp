// verl's rollout correction beyond the IS weights (algorithm.rollout_correction): rejection
// sampling at token, sequence and geometric-mean level, the per-token veto, and batch normalisation
// of the IS weights, against values worked out by hand.
#include <hyflow/algos/rollout_correction.hpp>
#include <hyflow/core/error.hpp>

#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <cmath>

using namespace hyflow;
using namespace hyflow::algos::rollout_correction;

namespace {
// Ratios π_old / π_rollout per token: row 0 (1.5, 0.4, 1.0); row 1 (2.5, 1.0) then padding whose
// ratio (0.01) must not count anywhere.
struct Batch {
  at::Tensor old_lp, rollout_lp, mask;
};
Batch ratios_batch() {
  const auto ratios = torch::tensor({{1.5, 0.4, 1.0}, {2.5, 1.0, 0.01}}, torch::kDouble);
  const auto rollout = torch::full({2, 3}, -1.0, torch::kDouble);
  return {(rollout + ratios.log()).to(torch::kFloat), rollout.to(torch::kFloat),
          torch::tensor({{1, 1, 1}, {1, 1, 0}}, torch::kLong)};
}
double metric(const nlohmann::json& m, const std::string& name) {
  return m.at("rollout_corr/" + name).get<double>();
}
}  // namespace

TEST_CASE("token rejection sampling drops each valid token whose ratio is outside [1/threshold, threshold]") {
  const auto b = ratios_batch();
  const auto r = compute_rollout_rejection_mask(b.old_lp, b.rollout_lp, b.mask, {.level = "token", .threshold = 2.0});
  // 0.4 < 0.5 and 2.5 > 2 leave the mask; padding stays 0; the mask keeps its dtype
  CHECK(torch::equal(r.response_mask, torch::tensor({{1, 0, 1}, {0, 1, 0}}, torch::kLong)));
  CHECK(metric(r.metrics, "rollout_rs_masked_fraction") == Approx(2.0 / 5));
  CHECK(metric(r.metrics, "rollout_rs_seq_masked_fraction") == Approx(1.0));
  CHECK(metric(r.metrics, "rollout_rs_ratio_fraction_high") == Approx(1.0 / 5));
  CHECK(metric(r.metrics, "rollout_rs_ratio_fraction_low") == Approx(1.0 / 5));
  CHECK(metric(r.metrics, "rollout_rs_mean") == Approx(6.4 / 5).epsilon(1e-5));
  CHECK(metric(r.metrics, "rollout_rs_max") == Approx(2.5).epsilon(1e-5));
  CHECK(metric(r.metrics, "rollout_rs_min") == Approx(0.4).epsilon(1e-5));
}

TEST_CASE("sequence rejection sampling judges a row by the product of its ratios and drops it whole") {
  const auto b = ratios_batch();
  const auto r =
      compute_rollout_rejection_mask(b.old_lp, b.rollout_lp, b.mask, {.level = "sequence", .threshold = 2.0});
  // row 0: 1.5 x 0.4 x 1 = 0.6 is kept; row 1: 2.5 x 1 = 2.5 > 2 is rejected
  CHECK(torch::equal(r.response_mask, torch::tensor({{1, 1, 1}, {0, 0, 0}}, torch::kLong)));
  CHECK(metric(r.metrics, "rollout_rs_masked_fraction") == Approx(2.0 / 5));
  CHECK(metric(r.metrics, "rollout_rs_seq_masked_fraction") == Approx(0.5));
  CHECK(metric(r.metrics, "rollout_rs_ratio_fraction_high") == Approx(0.5));
  CHECK(metric(r.metrics, "rollout_rs_ratio_fraction_low") == Approx(0.0));
  CHECK(metric(r.metrics, "rollout_rs_max") == Approx(2.5).epsilon(1e-5));
  CHECK(metric(r.metrics, "rollout_rs_min") == Approx(0.6).epsilon(1e-5));
  CHECK(metric(r.metrics, "rollout_rs_mean") == Approx((3 * 0.6 + 2 * 2.5) / 5).epsilon(1e-5));  // per valid token
}

TEST_CASE(
    "geometric rejection sampling judges a row by the geometric mean of its ratios, with an explicit "
    "lower bound") {
  const auto b = ratios_batch();
  // geometric means: row 0 0.6^(1/3) = 0.843, row 1 2.5^(1/2) = 1.581
  const auto wide = compute_rollout_rejection_mask(b.old_lp, b.rollout_lp, b.mask, {.level = "geometric"});
  CHECK(torch::equal(wide.response_mask, b.mask));
  CHECK(metric(wide.metrics, "rollout_rs_max") == Approx(std::sqrt(2.5)).epsilon(1e-5));
  CHECK(metric(wide.metrics, "rollout_rs_min") == Approx(std::cbrt(0.6)).epsilon(1e-5));
  const auto narrow = compute_rollout_rejection_mask(b.old_lp, b.rollout_lp, b.mask,
                                                     {.level = "geometric", .threshold = 1.5, .threshold_lower = 0.8});
  CHECK(torch::equal(narrow.response_mask, torch::tensor({{1, 1, 1}, {0, 0, 0}}, torch::kLong)));
  const auto above = compute_rollout_rejection_mask(b.old_lp, b.rollout_lp, b.mask,
                                                    {.level = "geometric", .threshold = 2.0, .threshold_lower = 0.9});
  CHECK(torch::equal(above.response_mask, torch::tensor({{0, 0, 0}, {1, 1, 0}}, torch::kLong)));
  CHECK(metric(above.metrics, "rollout_rs_ratio_fraction_low") == Approx(0.5));
}

TEST_CASE("the token veto rejects every row with a valid token whose ratio is below the threshold") {
  const auto b = ratios_batch();
  const auto r = compute_token_veto_mask(b.old_lp, b.rollout_lp, b.mask, 0.45);
  // row 0 has 0.4 < 0.45; row 1's 0.01 is padding
  CHECK(torch::equal(r.response_mask, torch::tensor({{0, 0, 0}, {1, 1, 0}}, torch::kLong)));
  CHECK(metric(r.metrics, "rollout_is_veto_fraction") == Approx(0.5));
  CHECK(metric(r.metrics, "rollout_is_catastrophic_token_fraction") == Approx(1.0 / 5));
  const auto none = compute_token_veto_mask(b.old_lp, b.rollout_lp, b.mask, 1e-4);
  CHECK(torch::equal(none.response_mask, b.mask));
  CHECK(metric(none.metrics, "rollout_is_veto_fraction") == 0.0);
}

TEST_CASE("batch normalisation divides the truncated IS weights by their mean per token or per row") {
  const auto b = ratios_batch();
  // token: truncated (1.5, 0.4, 1 | 2, 1) average 5.9 / 5 = 1.18
  const auto token = compute_rollout_is_weights(b.old_lp, b.rollout_lp, b.mask,
                                                {.level = "token", .threshold = 2.0, .batch_normalize = true});
  CHECK(metric(token.metrics, "rollout_is_batch_norm_factor") == Approx(1.18).epsilon(1e-5));
  CHECK(torch::allclose(token.weights, torch::tensor({{1.5f, 0.4f, 1.0f}, {2.0f, 1.0f, 0.0f}}) / 1.18f, 1e-5, 1e-6));
  CHECK(metric(token.metrics, "rollout_is_max") == Approx(2.0).epsilon(1e-5));  // statistics before normalising
  // sequence: row weights 0.6 and min(2.5, 2) = 2, averaged over rows: 1.3
  const auto seq = compute_rollout_is_weights(b.old_lp, b.rollout_lp, b.mask,
                                              {.level = "sequence", .threshold = 2.0, .batch_normalize = true});
  CHECK(metric(seq.metrics, "rollout_is_batch_norm_factor") == Approx(1.3).epsilon(1e-5));
  CHECK(torch::allclose(seq.weights, torch::tensor({{0.6f, 0.6f, 0.6f}, {2.0f, 2.0f, 0.0f}}) / 1.3f, 1e-5, 1e-6));
  const auto plain = compute_rollout_is_weights(b.old_lp, b.rollout_lp, b.mask, {.level = "token"});
  CHECK_FALSE(plain.metrics.contains("rollout_corr/rollout_is_batch_norm_factor"));
}

TEST_CASE(
    "rejection sampling and the veto refuse an unknown level, bad bounds and mismatched shapes, naming "
    "the key") {
  const auto b = ratios_batch();
  CHECK_THROWS_WITH(compute_rollout_rejection_mask(b.old_lp, b.rollout_lp, b.mask, {.level = "median"}),
                    Catch::Contains("rollout_rs") && Catch::Contains("median"));
  CHECK_THROWS_WITH(compute_rollout_rejection_mask(b.old_lp, b.rollout_lp, b.mask, {.threshold = 0}),
                    Catch::Contains("rollout_rs_threshold"));
  CHECK_THROWS_WITH(
      compute_rollout_rejection_mask(b.old_lp, b.rollout_lp, b.mask, {.threshold = 2, .threshold_lower = 3}),
      Catch::Contains("rollout_rs_threshold_lower"));
  CHECK_THROWS_WITH(compute_token_veto_mask(b.old_lp, b.rollout_lp, b.mask, 0),
                    Catch::Contains("rollout_token_veto_threshold"));
  CHECK_THROWS_AS(compute_token_veto_mask(b.old_lp, torch::zeros({2, 2}), b.mask, 1e-4), ShapeError);
  CHECK_THROWS_AS(compute_rollout_rejection_mask(b.old_lp, b.rollout_lp, torch::ones({3, 3}), {}), ShapeError);
}
