#pragma once
// Log-probabilities of chosen tokens and entropy from logits (verl's
// logprobs_from_logits / entropy_from_logits / entropy_from_logits_with_chunking).
// All results are float32 and differentiable with respect to the logits.

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace hyflow::cuda {

/// log softmax(logits)[label] for logits (..., V) and int64 labels (...) -> float32 (...).
/// Rows are processed in chunks of `chunk_rows` so the float32 copy stays bounded.
at::Tensor log_probs_from_logits(const at::Tensor& logits, const at::Tensor& labels, int64_t chunk_rows = 2048);

/// Entropy of softmax(logits) over the last dim: logsumexp(z) - sum softmax(z) * z.
/// (..., V) -> float32 (...), computed in one pass over the whole tensor.
at::Tensor entropy_from_logits(const at::Tensor& logits);

/// The same entropy computed over row chunks of `chunk_rows` (verl uses 2048): peak extra
/// memory is chunk_rows * V floats instead of the whole (..., V) tensor in float32.
at::Tensor entropy_from_logits_chunked(const at::Tensor& logits, int64_t chunk_rows = 2048);

}  // namespace hyflow::cuda
