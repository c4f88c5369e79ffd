#pragma once
// Tensor helpers of verl's verl/utils/torch_functional.py: masked statistics, entropy and
// log-probs from logits, the response mask. Each function builds the same torch ops in the
// same order as verl, so dtype promotion (int masks, float32 epsilons) matches it exactly.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace hyflow::algos::core_algos {

/// Σ values·mask over `axis` (all elements when empty). Values at masked positions are
/// replaced by 0 first, so NaN/Inf outside the mask never leak into the sum.
at::Tensor masked_sum(const at::Tensor& values, const at::Tensor& mask,
                      std::optional<int64_t> axis = std::nullopt);

/// masked_sum / (Σ mask + 1e-8). With integer masks the count (+1e-8) is float32, as in verl.
at::Tensor masked_mean(const at::Tensor& values, const at::Tensor& mask,
                       std::optional<int64_t> axis = std::nullopt);

/// Masked variance over all elements; `unbiased` applies Bessel's n/(n-1) and throws
/// hyflow::ValueError when Σ mask is 0 or 1.
at::Tensor masked_var(const at::Tensor& values, const at::Tensor& mask, bool unbiased = true);

/// (values - μ)·rsqrt(var + 1e-8) with μ, var (unbiased) over the masked elements, written to
/// ALL positions (masked ones too). `shift_mean=false` adds μ back.
at::Tensor masked_whiten(const at::Tensor& values, const at::Tensor& mask, bool shift_mean = true);

/// min(max(x, lo), hi) elementwise (verl's clip_by_value: max(min(x, hi), lo)).
at::Tensor clip_by_value(const at::Tensor& x, const at::Tensor& tensor_min, const at::Tensor& tensor_max);

/// Categorical entropy over the last dim: logsumexp(z) - Σ softmax(z)·z.
at::Tensor entropy_from_logits(const at::Tensor& logits);

/// Same on a (N, V) tensor, in chunks of `chunk_size` rows computed in float32; returns float32 (N,).
at::Tensor entropy_from_logits_with_chunking(const at::Tensor& logits, int64_t chunk_size = 2048);

/// log_softmax(logits)[label] over the last dim; logits (..., V), labels (...) int64.
/// float32/float64: gather - logsumexp; other dtypes: row-wise log_softmax in that dtype.
at::Tensor logprobs_from_logits(const at::Tensor& logits, const at::Tensor& labels);

/// verl's logprobs_from_logits_naive: log_softmax over the last dim in the logits' dtype, then
/// the labels' entries. Same shapes as logprobs_from_logits.
at::Tensor logprobs_from_logits_naive(const at::Tensor& logits, const at::Tensor& labels);

/// Σ_v softmax(logits)² over the last dim (input of the optimal token baseline).
at::Tensor calculate_sum_pi_squared_from_logits(const at::Tensor& logits);

/// 1 up to and including the first EOS of each row, 0 after it. `eos_token` may list several ids.
at::Tensor get_response_mask(const at::Tensor& response_id, const std::vector<int64_t>& eos_token,
                             at::ScalarType dtype = at::kLong);

}  // namespace hyflow::algos::core_algos
