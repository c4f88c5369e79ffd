#include <hyflow/core/error.hpp>
#include <hyflow/cuda/sampling.hpp>

#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <set>

using hyflow::cuda::filter_logits;
using hyflow::cuda::sample;
using hyflow::cuda::SamplingOptions;

namespace {
at::Generator seeded(uint64_t seed) {
  return at::make_generator<at::CPUGeneratorImpl>(seed);
}
}  // namespace

TEST_CASE("greedy sampling picks the argmax of every row") {
  auto logits = torch::randn({5, 11}, seeded(1));
  auto tokens = sample(logits, SamplingOptions{.greedy = true});
  CHECK(torch::equal(tokens, logits.argmax(-1)));
}

TEST_CASE("temperature 0 equals greedy") {
  auto logits = torch::randn({7, 13}, seeded(2));
  CHECK(torch::equal(sample(logits, SamplingOptions{.temperature = 0.0}, seeded(3)), logits.argmax(-1)));
}

TEST_CASE("a very low temperature samples the argmax") {
  auto logits = torch::randn({64, 50}, seeded(4));
  auto tokens = sample(logits, SamplingOptions{.temperature = 1e-4}, seeded(5));
  CHECK(torch::equal(tokens, logits.argmax(-1)));
}

TEST_CASE("top-k never leaves the k most likely tokens") {
  auto logits = torch::randn({1, 40}, seeded(6)).expand({4000, 40}).contiguous();
  auto tokens = sample(logits, SamplingOptions{.top_k = 3}, seeded(7));
  auto top3 = std::get<1>(logits[0].topk(3));
  std::set<int64_t> allowed;
  for (int64_t i = 0; i < 3; ++i) allowed.insert(top3[i].item<int64_t>());
  std::set<int64_t> seen;
  for (int64_t i = 0; i < tokens.size(0); ++i) seen.insert(tokens[i].item<int64_t>());
  CHECK(seen == allowed);  // all three show up in 4000 draws, nothing else does
}

TEST_CASE("top-p keeps the nucleus: the smallest prefix reaching p") {
  // probabilities 0.5, 0.3, 0.15, 0.05: p = 0.7 keeps {0, 1}; p = 0.85 keeps {0, 1, 2}
  auto probs = torch::tensor({0.3, 0.05, 0.5, 0.15}, torch::kDouble);
  auto logits = probs.log().to(torch::kFloat).unsqueeze(0);
  SECTION("p = 0.7") {
    auto kept = filter_logits(logits, SamplingOptions{.top_p = 0.7}).isfinite();
    CHECK(torch::equal(kept[0], torch::tensor({true, false, true, false})));
  }
  SECTION("p = 0.85") {
    auto kept = filter_logits(logits, SamplingOptions{.top_p = 0.85}).isfinite();
    CHECK(torch::equal(kept[0], torch::tensor({true, false, true, true})));
  }
  SECTION("tiny p keeps the most likely token only") {
    auto kept = filter_logits(logits, SamplingOptions{.top_p = 1e-6}).isfinite();
    CHECK(torch::equal(kept[0], torch::tensor({false, false, true, false})));
  }
  SECTION("sampled frequencies follow the renormalized nucleus") {
    auto batch = logits.expand({20000, 4}).contiguous();
    auto tokens = sample(batch, SamplingOptions{.top_p = 0.7}, seeded(8));
    auto counts = torch::bincount(tokens, {}, 4).to(torch::kDouble) / 20000.0;
    CHECK(counts[1].item<double>() == 0.0);
    CHECK(counts[3].item<double>() == 0.0);
    CHECK(counts[2].item<double>() == Approx(0.5 / 0.8).margin(0.02));
    CHECK(counts[0].item<double>() == Approx(0.3 / 0.8).margin(0.02));
  }
}

TEST_CASE("min-p drops tokens below min_p times the top probability") {
  auto probs = torch::tensor({0.6, 0.25, 0.1, 0.05}, torch::kDouble);
  auto logits = probs.log().to(torch::kFloat).unsqueeze(0);
  auto kept = filter_logits(logits, SamplingOptions{.min_p = 0.2}).isfinite();  // threshold 0.12
  CHECK(torch::equal(kept[0], torch::tensor({true, true, false, false})));
}

TEST_CASE("sampling at temperature 1 matches the softmax frequencies") {
  auto probs = torch::tensor({0.1, 0.2, 0.7});
  auto logits = probs.log().unsqueeze(0).expand({30000, 3}).contiguous();
  auto tokens = sample(logits, SamplingOptions{}, seeded(9));
  auto freq = torch::bincount(tokens, {}, 3).to(torch::kDouble) / 30000.0;
  for (int64_t i = 0; i < 3; ++i) CHECK(freq[i].item<double>() == Approx(probs[i].item<double>()).margin(0.015));
}

TEST_CASE("sampling is deterministic for a seed") {
  auto logits = torch::randn({16, 100}, seeded(10));
  SamplingOptions o{.temperature = 0.9, .top_k = 50, .top_p = 0.95};
  CHECK(torch::equal(sample(logits, o, seeded(11)), sample(logits, o, seeded(11))));
  CHECK_FALSE(torch::equal(sample(logits, o, seeded(11)), sample(logits, o, seeded(12))));
}

TEST_CASE("out-of-range sampling settings are rejected naming the field") {
  auto logits = torch::zeros({1, 4});
  CHECK_THROWS_WITH(sample(logits, SamplingOptions{.temperature = -1}), Catch::Contains("temperature"));
  CHECK_THROWS_WITH(sample(logits, SamplingOptions{.top_p = 0}), Catch::Contains("top_p"));
  CHECK_THROWS_WITH(sample(logits, SamplingOptions{.min_p = 2}), Catch::Contains("min_p"));
  CHECK_THROWS_AS(sample(torch::zeros({4}), SamplingOptions{}), hyflow::ShapeError);
}
