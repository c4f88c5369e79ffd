// masked statistics, entropy/log-prob helpers, response mask and LR schedules.
#include <hyflow/core/error.hpp>
#include <hyflow/algos/core_algos.hpp>

#include "test_helpers.hpp"

#include <cmath>
#include <limits>

using namespace hyflow::algos::core_algos;
using hyflow::test::f64;
using hyflow::test::i64;
using hyflow::test::require_close;
using hyflow::test::scalar;

TEST_CASE("masked_sum ignores NaN outside the mask") {
  auto values = f64({1.0, std::numeric_limits<double>::quiet_NaN(), 3.0});
  auto mask = torch::tensor({1, 0, 1}, torch::kLong);
  REQUIRE(scalar(masked_sum(values, mask)) == 4.0);
}

TEST_CASE("masked_mean with an int mask counts in float32, so 1e-8 vanishes") {
  auto values = f64({1, 2, 3, 4});
  auto int_mask = torch::tensor({1, 1, 1, 0}, torch::kLong);
  REQUIRE(scalar(masked_mean(values, int_mask)) == 2.0);
  auto double_mask = f64({1, 1, 1, 0});
  REQUIRE(scalar(masked_mean(values, double_mask)) == Approx(6.0 / (3.0 + 1e-8)).epsilon(1e-15));
}

TEST_CASE("masked_mean over an axis gives one mean per row") {
  auto values = f64({{1, 2, 3}, {4, 5, 6}});
  auto mask = i64({{1, 1, 0}, {0, 0, 1}});
  require_close(masked_mean(values, mask, -1), f64({1.5, 6.0}));
}

TEST_CASE("masked_var is unbiased and rejects masks summing to 0 or 1") {
  auto values = f64({1, 2, 3, 4});
  auto mask = torch::tensor({1, 1, 1, 0}, torch::kLong);
  // mean 2, squared deviations 1,0,1 -> 2/3, Bessel 3/2 -> 1
  REQUIRE(scalar(masked_var(values, mask)) == Approx(1.0).margin(1e-12));
  REQUIRE(scalar(masked_var(values, mask, false)) == Approx(2.0 / 3.0).margin(1e-12));
  REQUIRE_THROWS_AS(masked_var(values, torch::zeros({4}, torch::kLong)), hyflow::ValueError);
  REQUIRE_THROWS_AS(masked_var(values, torch::tensor({0, 1, 0, 0}, torch::kLong)), hyflow::ValueError);
}

TEST_CASE("masked_whiten writes whitened values to masked positions too") {
  auto values = f64({1, 2, 3, 4});
  auto mask = torch::tensor({1, 1, 1, 0}, torch::kLong);
  const double s = std::sqrt(1.0 + 1e-8);
  require_close(masked_whiten(values, mask), f64({-1 / s, 0, 1 / s, 2 / s}));
  require_close(masked_whiten(values, mask, false), f64({-1 / s + 2, 2, 1 / s + 2, 2 / s + 2}));
}

TEST_CASE("masked helpers reject mismatched shapes") {
  REQUIRE_THROWS_AS(masked_sum(f64({1, 2}), torch::ones({3}, torch::kLong)), hyflow::ShapeError);
}

TEST_CASE("entropy of uniform two-way logits is log 2; of (1/4, 3/4) by hand") {
  auto logits = f64({{0.0, 0.0}, {0.0, std::log(3.0)}});
  const double h = -(0.25 * std::log(0.25) + 0.75 * std::log(0.75));
  require_close(entropy_from_logits(logits), f64({std::log(2.0), h}));
}

TEST_CASE("chunked entropy equals the plain one in float32 for any chunk size") {
  auto logits = torch::tensor({0.0, 1.0, -2.0, 0.5, 0.0, 0.0, 3.0, 1.0, 2.0}, torch::kFloat).reshape({3, 3});
  auto chunked = entropy_from_logits_with_chunking(logits, 2);
  REQUIRE(chunked.scalar_type() == torch::kFloat);
  require_close(chunked, entropy_from_logits(logits), 1e-6);
  REQUIRE_THROWS_AS(entropy_from_logits_with_chunking(logits.reshape({9})), hyflow::ShapeError);
}

TEST_CASE("logprobs_from_logits picks log_softmax at the label") {
  auto logits = f64({{0.0, std::log(3.0)}, {0.0, std::log(3.0)}});
  auto labels = torch::tensor({1, 0}, torch::kLong);
  require_close(logprobs_from_logits(logits, labels), f64({std::log(0.75), std::log(0.25)}));
  auto half = logprobs_from_logits(logits.to(torch::kBFloat16), labels);
  require_close(half, f64({std::log(0.75), std::log(0.25)}), 2e-2);
  REQUIRE_THROWS_AS(logprobs_from_logits(logits, torch::tensor({1, 0, 1}, torch::kLong)), hyflow::ShapeError);
}

TEST_CASE("sum of squared probabilities of (1/4, 3/4) is 10/16") {
  auto logits = f64({{0.0, std::log(3.0)}});
  require_close(calculate_sum_pi_squared_from_logits(logits), f64({10.0 / 16.0}));
}

TEST_CASE("response mask keeps the first EOS and zeroes everything after it") {
  auto ids = i64({{5, 2, 7, 2}, {1, 1, 1, 1}, {5, 7, 2, 9}});
  auto mask = get_response_mask(ids, {2});
  REQUIRE(torch::equal(mask, i64({{1, 1, 0, 0}, {1, 1, 1, 1}, {1, 1, 1, 0}})));
  auto two_eos = get_response_mask(ids, {2, 7});
  REQUIRE(torch::equal(two_eos, i64({{1, 1, 0, 0}, {1, 1, 1, 1}, {1, 1, 0, 0}})));
  REQUIRE(get_response_mask(ids, {2}, torch::kFloat).scalar_type() == torch::kFloat);
  REQUIRE_THROWS_AS(get_response_mask(ids, {}), hyflow::ValueError);
}

TEST_CASE("constant schedule warms up linearly from 0 then stays at 1") {
  auto f = get_constant_schedule_with_warmup(4);
  REQUIRE(f(0) == 0.0);
  REQUIRE(f(2) == 0.5);
  REQUIRE(f(4) == 1.0);
  REQUIRE(f(100) == 1.0);
  REQUIRE(get_constant_schedule_with_warmup(0)(0) == 1.0);
}

TEST_CASE("cosine schedule: warmup, half-cosine to min_lr_ratio, rises again past the end") {
  auto f = get_cosine_schedule_with_warmup(2, 10, 0.1);
  REQUIRE(f(1) == Approx(0.5));
  REQUIRE(f(2) == Approx(1.0).margin(1e-15));
  REQUIRE(f(6) == Approx(0.55).margin(1e-15));  // cos(pi/2) = 0 -> (1+min)/2
  REQUIRE(f(10) == Approx(0.1).margin(1e-15));
  REQUIRE(f(14) == Approx(0.55).margin(1e-15));  // not clamped after num_training_steps
  auto with_init = get_cosine_schedule_with_warmup(2, 10, 0.0, 0.5, 0.2);
  REQUIRE(with_init(0) == Approx(0.2));
  REQUIRE(with_init(1) == Approx(0.6));
  REQUIRE_THROWS_AS(get_cosine_schedule_with_warmup(2, 10, 1.5), hyflow::ValueError);
}

TEST_CASE("WSD schedule: warmup, stable at 1, cosine decay, then min_lr_ratio") {
  auto f = get_wsd_schedule_with_warmup(2, 12, 0.1, 0.5, 0.5);  // 10 left: 5 stable, 5 decay
  REQUIRE(f(1) == Approx(0.5));
  REQUIRE(f(6) == 1.0);
  REQUIRE(f(7) == Approx(1.0));
  const double v = 0.5 * (1 + std::cos(M_PI * 0.5 * 2 * 0.4));
  REQUIRE(f(9) == Approx(0.9 * v + 0.1).margin(1e-15));
  REQUIRE(f(12) == 0.1);
  REQUIRE(f(50) == 0.1);
}

TEST_CASE("get_lr_schedule picks constant or cosine by name and names the key of an unknown one") {
  auto constant = get_lr_schedule({.type = "constant", .num_warmup_steps = 4}, "optim.lr_scheduler_type");
  auto cosine = get_lr_schedule(
      {.type = "cosine", .num_warmup_steps = 2, .num_training_steps = 10, .min_lr_ratio = 0.1, .num_cycles = 0.5},
      "optim.lr_scheduler_type");
  auto cosine_direct = get_cosine_schedule_with_warmup(2, 10, 0.1, 0.5);
  for (int64_t step = 0; step < 16; ++step) {
    REQUIRE(constant(step) == get_constant_schedule_with_warmup(4)(step));
    REQUIRE(cosine(step) == cosine_direct(step));
  }
  REQUIRE_THROWS_WITH(get_lr_schedule({.type = "linear"}, "critic.optim.lr_scheduler_type"),
                      Catch::Contains("config key 'critic.optim.lr_scheduler_type': unknown schedule 'linear'") &&
                          Catch::Contains("constant, cosine"));
}

TEST_CASE("LambdaLR scales every param group's base lr by the schedule") {
  auto w = torch::zeros({1}, torch::requires_grad());
  torch::optim::SGD sgd({w}, torch::optim::SGDOptions(0.1));
  LambdaLR sched(sgd, get_constant_schedule_with_warmup(2));
  REQUIRE(sched.get_last_lr()[0] == 0.0);
  sched.step();
  REQUIRE(sched.get_last_lr()[0] == Approx(0.05));
  sched.step();
  sched.step();
  REQUIRE(sched.get_last_lr()[0] == Approx(0.1));
  REQUIRE(sched.last_epoch() == 3);
}
