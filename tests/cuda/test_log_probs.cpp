#include <hyflow/core/error.hpp>
#include <hyflow/cuda/log_probs.hpp>

#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <cmath>

using namespace hyflow::cuda;

namespace {
at::Generator seeded(uint64_t seed) {
  return at::make_generator<at::CPUGeneratorImpl>(seed);
}
}  // namespace

TEST_CASE("log-probs of chosen tokens equal log_softmax gathered, for any chunk size") {
  auto logits = torch::randn({3, 5, 17}, seeded(1)) * 3;
  auto labels = torch::randint(17, {3, 5}, seeded(2));
  auto expected = logits.log_softmax(-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1);
  for (int64_t chunk : {1, 4, 15, 2048}) {
    CHECK(torch::allclose(log_probs_from_logits(logits, labels, chunk), expected, 1e-5, 1e-6));
  }
}

TEST_CASE("log-probs of bf16 logits are float32 and match the float32 computation") {
  auto logits = (torch::randn({4, 9}, seeded(3)) * 2).to(torch::kBFloat16);
  auto labels = torch::randint(9, {4}, seeded(4));
  auto out = log_probs_from_logits(logits, labels);
  CHECK(out.scalar_type() == torch::kFloat);
  auto expected = logits.to(torch::kFloat).log_softmax(-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1);
  CHECK(torch::allclose(out, expected, 1e-5, 1e-6));
}

TEST_CASE("log-probs are differentiable: gradient is onehot minus softmax") {
  auto logits = torch::randn({2, 6}, seeded(5)).requires_grad_();
  auto labels = torch::tensor({1, 4});
  log_probs_from_logits(logits, labels).sum().backward();
  auto onehot = torch::one_hot(labels, 6).to(torch::kFloat);
  CHECK(torch::allclose(logits.grad(), onehot - logits.detach().softmax(-1), 1e-5, 1e-6));
}

TEST_CASE("entropy of a uniform distribution is log V and of a one-hot is 0") {
  auto uniform = torch::zeros({2, 8});
  CHECK(torch::allclose(entropy_from_logits(uniform), torch::full({2}, std::log(8.0f))));
  auto peaked = torch::tensor({{0.f, 0.f, 1000.f}});
  CHECK(entropy_from_logits(peaked).item<float>() == Approx(0.0).margin(1e-6));
}

TEST_CASE("entropy equals -sum p log p and chunked entropy equals unchunked") {
  auto logits = torch::randn({4, 7, 33}, seeded(6)) * 2;
  auto p = logits.softmax(-1);
  auto naive = -(p * p.log()).sum(-1);
  auto full = entropy_from_logits(logits);
  CHECK(torch::allclose(full, naive, 1e-5, 1e-5));
  for (int64_t chunk : {1, 3, 10, 28, 4096}) {
    CHECK(torch::allclose(entropy_from_logits_chunked(logits, chunk), full, 1e-6, 1e-6));
  }
}

TEST_CASE("bad shapes and chunk sizes are rejected with the shapes in the message") {
  auto logits = torch::zeros({2, 3, 5});
  CHECK_THROWS_WITH(log_probs_from_logits(logits, torch::zeros({2, 4}, torch::kLong)),
                    Catch::Contains("(2, 3, 5)") && Catch::Contains("(2, 4)"));
  CHECK_THROWS_AS(entropy_from_logits_chunked(logits, 0), hyflow::ValueError);
}
