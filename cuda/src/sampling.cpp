#include <hyflow/cuda/sampling.hpp>

#include <hyflow/core/error.hpp>

#include <limits>
#include <string>

namespace hyflow::cuda {
namespace {

constexpr float kMinusInf = -std::numeric_limits<float>::infinity();

void check_logits(const at::Tensor& logits) {
  if (logits.dim() != 2) {
    throw ShapeError("sampling: logits must be (B, V), got " + std::to_string(logits.dim()) + "-D");
  }
  if (!at::isFloatingType(logits.scalar_type())) {
    throw ValueError("sampling: logits must be floating point");
  }
}

// Keeps the k largest logits of each row.
at::Tensor apply_top_k(const at::Tensor& z, int64_t k) {
  if (k <= 0 || k >= z.size(-1)) return z;
  auto kth = std::get<0>(z.topk(k, -1)).select(-1, k - 1).unsqueeze(-1);  // (B, 1)
  return z.masked_fill(z < kth, kMinusInf);
}

// Keeps the smallest prefix of the sorted distribution whose mass reaches p (at least one).
at::Tensor apply_top_p(const at::Tensor& z, double p) {
  if (p >= 1.0) return z;
  auto [sorted, order] = z.sort(-1, /*descending=*/true);
  auto probs = sorted.softmax(-1);
  // mass strictly before each token; a token is kept while that mass is below p
  auto before = probs.cumsum(-1) - probs;
  auto drop_sorted = before >= p;
  drop_sorted.select(-1, 0).fill_(false);
  auto drop = at::empty_like(drop_sorted).scatter_(-1, order, drop_sorted);
  return z.masked_fill(drop, kMinusInf);
}

// Drops tokens whose probability is below min_p times the row's largest probability.
at::Tensor apply_min_p(const at::Tensor& z, double min_p) {
  if (min_p <= 0.0) return z;
  auto probs = z.softmax(-1);
  auto threshold = std::get<0>(probs.max(-1, /*keepdim=*/true)) * min_p;
  return z.masked_fill(probs < threshold, kMinusInf);
}

}  // namespace

void validate(const SamplingOptions& o) {
  if (!(o.temperature >= 0.0)) {
    throw ValueError("sampling: temperature must be >= 0, got " + std::to_string(o.temperature));
  }
  if (!(o.top_p > 0.0 && o.top_p <= 1.0)) {
    throw ValueError("sampling: top_p must be in (0, 1], got " + std::to_string(o.top_p));
  }
  if (!(o.min_p >= 0.0 && o.min_p <= 1.0)) {
    throw ValueError("sampling: min_p must be in [0, 1], got " + std::to_string(o.min_p));
  }
}

at::Tensor filter_logits(const at::Tensor& logits, const SamplingOptions& options) {
  check_logits(logits);
  validate(options);
  if (options.is_greedy()) return logits;
  // CPU reference path; it is written in ATen ops, so it also runs on CUDA tensors until a
  // fused kernel is dispatched here on logits.device().
  auto z = logits.to(at::kFloat) / options.temperature;
  z = apply_top_k(z, options.top_k);
  z = apply_top_p(z, options.top_p);
  z = apply_min_p(z, options.min_p);
  return z;
}

at::Tensor sample(const at::Tensor& logits, const SamplingOptions& options, std::optional<at::Generator> generator) {
  auto z = filter_logits(logits, options);
  if (options.is_greedy()) return z.argmax(-1);
  auto probs = z.softmax(-1);
  // c10::optional in LibTorch 1.13, std::optional in 2.x: build it explicitly for both.
  c10::optional<at::Generator> gen;
  if (generator) gen = *generator;
  return at::multinomial(probs, 1, /*replacement=*/false, gen).squeeze(-1);
}

}  // namespace hyflow::cuda
