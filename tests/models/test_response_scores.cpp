// Response scores (log-probs and entropy of the response tokens) in the actor's update: one
// fused call computes both, so the kernel path keeps one contiguous copy of the logits.

#include <hyflow/cuda/log_probs.hpp>
#include <hyflow/models/response_scores.hpp>

#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <set>
#include <string>
#include <vector>

using namespace hyflow;

namespace {

at::Generator seeded(uint64_t seed) {
  return at::make_generator<at::CPUGeneratorImpl>(seed);
}

// The autograd nodes of the fused kernel reachable from `outputs` (each counted once).
std::set<const torch::autograd::Node*> fused_nodes(const std::vector<at::Tensor>& outputs) {
  std::set<const torch::autograd::Node*> seen, fused;
  std::vector<torch::autograd::Node*> stack;
  for (const auto& t : outputs) {
    if (t.grad_fn()) stack.push_back(t.grad_fn().get());
  }
  while (!stack.empty()) {
    auto* node = stack.back();
    stack.pop_back();
    if (!seen.insert(node).second) continue;
    if (node->name().find("FusedScores") != std::string::npos) fused.insert(node);
    for (const auto& edge : node->next_edges()) {
      if (edge.function) stack.push_back(edge.function.get());
    }
  }
  return fused;
}

}  // namespace

TEST_CASE("the actor's log-probs and entropy come from one fused call: one saved copy of the logits") {
  // (B, T, V) logits of an actor forward; R < T response tokens.
  auto logits = (torch::randn({3, 7, 301}, seeded(1)) * 2).requires_grad_();
  auto responses = torch::randint(301, {3, 4}, seeded(2));
  auto kernel = models::response_scores_from_logits(
      logits, responses, {.temperature = 0.7, .with_entropy = true, .impl = cuda::Impl::kernel});
  const auto nodes = fused_nodes({kernel.log_probs, kernel.entropy});
  // Two separate calls made two nodes, each saving its own contiguous (B, R, V) copy.
  CHECK(nodes.size() == 1);
  CHECK(kernel.log_probs.sizes() == responses.sizes());
  CHECK(kernel.entropy.sizes() == responses.sizes());

  // The gradient of both through the one node equals the reference's.
  auto w = torch::randn({3, 4}, seeded(3));
  (kernel.log_probs * w + kernel.entropy * 0.1).sum().backward();
  auto kernel_grad = logits.grad().clone();
  logits.mutable_grad().zero_();
  auto reference = models::response_scores_from_logits(logits, responses, {.temperature = 0.7, .with_entropy = true});
  (reference.log_probs * w + reference.entropy * 0.1).sum().backward();
  CHECK(torch::allclose(kernel.log_probs, reference.log_probs, 1e-4, 1e-5));
  CHECK(torch::allclose(kernel.entropy, reference.entropy, 1e-4, 1e-5));
  CHECK(torch::allclose(kernel_grad, logits.grad(), 1e-4, 1e-6));
}

TEST_CASE("response scores on CPU equal the separate log-prob and entropy references bit for bit") {
  // The CPU path (the main job's) must not change: the same chunked reference functions.
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    auto logits = (torch::randn({2, 9, 513}, seeded(4)) * 3).to(dtype);
    auto responses = torch::randint(513, {2, 5}, seeded(5));
    for (double temperature : {1.0, 0.6}) {
      auto got = models::response_scores_from_logits(
          logits, responses, {.temperature = temperature, .with_entropy = true, .chunk_rows = 4});
      auto z = logits.narrow(1, 9 - 5 - 1, 5);
      if (temperature != 1.0) z = z / temperature;
      CHECK(torch::equal(got.log_probs, cuda::log_probs_from_logits(z, responses, 4)));
      CHECK(torch::equal(got.entropy, cuda::entropy_from_logits_chunked(z, 4)));
    }
  }
}
