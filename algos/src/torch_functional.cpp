// verl's torch_functional helpers, op for op (see torch_functional.hpp).
#include <hyflow/core/error.hpp>
#include <hyflow/algos/torch_functional.hpp>

#include <torch/torch.h>

#include <string>

namespace hyflow::algos::core_algos {
namespace {

void check_same_shape(const at::Tensor& a, const at::Tensor& b, const char* what) {
  if (a.sizes() != b.sizes()) {
    throw ShapeError(std::string(what) + ": values shape " + c10::str(a.sizes()) + " != mask shape " +
                     c10::str(b.sizes()));
  }
}

void check_logprob_shapes(const at::Tensor& logits, const at::Tensor& labels, const char* fn) {
  if (logits.dim() != labels.dim() + 1 || logits.sizes().slice(0, labels.dim()) != labels.sizes()) {
    throw ShapeError(std::string(fn) + ": logits " + c10::str(logits.sizes()) + " do not match labels " +
                     c10::str(labels.sizes()) + " (expected logits = labels shape + (V,))");
  }
}

}  // namespace

at::Tensor masked_sum(const at::Tensor& values, const at::Tensor& mask, std::optional<int64_t> axis) {
  check_same_shape(values, mask, "masked_sum");
  // Replace what lies outside the mask first: NaN·0 would still be NaN.
  auto valid = torch::where(mask.to(torch::kBool), values, torch::zeros({}, values.options()));
  auto product = valid * mask;
  return axis ? product.sum(*axis) : product.sum();
}

at::Tensor masked_mean(const at::Tensor& values, const at::Tensor& mask, std::optional<int64_t> axis) {
  auto total = masked_sum(values, mask, axis);
  auto count = axis ? mask.sum(*axis) : mask.sum();
  return total / (count + 1e-8);
}

at::Tensor masked_var(const at::Tensor& values, const at::Tensor& mask, bool unbiased) {
  auto mean = masked_mean(values, mask);
  auto centered = values - mean;
  auto variance = masked_mean(centered.pow(2), mask);
  if (unbiased) {
    auto mask_sum = mask.sum();
    double n = mask_sum.item<double>();
    if (n == 0) throw ValueError("masked_var: the mask is empty (sum 0); at least one element must be 1");
    if (n == 1) throw ValueError("masked_var: the mask sums to 1, the unbiased variance divides by zero");
    // int/int true division gives float32 for integer masks, exactly as in verl.
    auto bessel_correction = mask_sum / (mask_sum - 1);
    variance = variance * bessel_correction;
  }
  return variance;
}

at::Tensor masked_whiten(const at::Tensor& values, const at::Tensor& mask, bool shift_mean) {
  auto mean = masked_mean(values, mask);
  auto var = masked_var(values, mask);
  auto whitened = (values - mean) * torch::rsqrt(var + 1e-8);
  if (!shift_mean) whitened = whitened + mean;
  return whitened;
}

at::Tensor clip_by_value(const at::Tensor& x, const at::Tensor& tensor_min, const at::Tensor& tensor_max) {
  return torch::max(torch::min(x, tensor_max), tensor_min);
}

at::Tensor entropy_from_logits(const at::Tensor& logits) {
  auto pd = torch::softmax(logits, -1);
  return torch::logsumexp(logits, -1) - (pd * logits).sum(-1);
}

at::Tensor entropy_from_logits_with_chunking(const at::Tensor& logits, int64_t chunk_size) {
  if (logits.dim() != 2) {
    throw ShapeError("entropy_from_logits_with_chunking: logits must be 2-D (N, V), got " +
                     c10::str(logits.sizes()));
  }
  if (chunk_size <= 0) throw ValueError("entropy_from_logits_with_chunking: chunk_size must be > 0");
  const int64_t n = logits.size(0);
  auto entropy = torch::zeros({n}, logits.options().dtype(torch::kFloat));
  for (int64_t i = 0; i < n; i += chunk_size) {
    const int64_t end = std::min(n, i + chunk_size);
    auto chunk = logits.slice(0, i, end).to(torch::kFloat);
    auto pd = torch::softmax(chunk, -1);
    entropy.slice(0, i, end).copy_(torch::logsumexp(chunk, -1) - (pd * chunk).sum(-1));
  }
  return entropy;
}

at::Tensor logprobs_from_logits(const at::Tensor& logits, const at::Tensor& labels) {
  check_logprob_shapes(logits, labels, "logprobs_from_logits");
  auto index = labels.to(torch::kLong).unsqueeze(-1);
  if (logits.scalar_type() == torch::kFloat || logits.scalar_type() == torch::kDouble) {
    auto picked = logits.gather(-1, index).squeeze(-1);
    return picked - torch::logsumexp(logits, -1);
  }
  return torch::log_softmax(logits, -1).gather(-1, index).squeeze(-1);
}

at::Tensor logprobs_from_logits_naive(const at::Tensor& logits, const at::Tensor& labels) {
  check_logprob_shapes(logits, labels, "logprobs_from_logits_naive");
  return torch::log_softmax(logits, -1).gather(-1, labels.to(torch::kLong).unsqueeze(-1)).squeeze(-1);
}

at::Tensor calculate_sum_pi_squared_from_logits(const at::Tensor& logits) {
  auto probs = torch::softmax(logits, -1);
  return probs.pow(2).sum(-1);
}

at::Tensor get_response_mask(const at::Tensor& response_id, const std::vector<int64_t>& eos_token,
                             at::ScalarType dtype) {
  if (response_id.dim() != 2) {
    throw ShapeError("get_response_mask: response_id must be (bs, T), got " + c10::str(response_id.sizes()));
  }
  if (eos_token.empty()) throw ValueError("get_response_mask: eos_token list is empty");
  auto eos = torch::tensor(eos_token, torch::TensorOptions().dtype(torch::kLong).device(response_id.device()));
  auto eos_mask = torch::isin(response_id, eos).to(torch::kInt);
  return (eos_mask.cumsum(1) - eos_mask).eq(0).to(dtype);
}

}  // namespace hyflow::algos::core_algos
