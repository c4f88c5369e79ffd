#pragma once
// Log-probabilities of chosen tokens and entropy from logits (verl's
// logprobs_from_logits / entropy_from_logits / entropy_from_logits_with_chunking, and the fused
// kernel of `use_fused_kernels`). All results are float32 and differentiable with respect to
// the logits. CPU tensors run the ATen reference; CUDA tensors run the fused kernel when the
// build has it (hyflow/cuda/dispatch.hpp).

#include <hyflow/cuda/dispatch.hpp>

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace hyflow::cuda {

/// log softmax(logits)[label] for logits (..., V) and int64 labels (...) -> float32 (...).
/// The reference processes rows in chunks of `chunk_rows` so its float32 copy stays bounded;
/// the kernel reads each row once and needs no copy.
at::Tensor log_probs_from_logits(const at::Tensor& logits, const at::Tensor& labels, int64_t chunk_rows = 2048);

/// Entropy of softmax(logits) over the last dim: logsumexp(z) - sum softmax(z) * z, with
/// tokens of probability 0 (-inf logits) contributing 0. (..., V) -> float32 (...).
at::Tensor entropy_from_logits(const at::Tensor& logits);

/// The same entropy computed over row chunks of `chunk_rows` (verl uses 2048): peak extra
/// memory is chunk_rows * V floats instead of the whole (..., V) tensor in float32.
at::Tensor entropy_from_logits_chunked(const at::Tensor& logits, int64_t chunk_rows = 2048);

struct ScoresOptions {
  double temperature = 1.0;  ///< z = logits / temperature (> 0)
  bool with_entropy = true;  ///< also return the entropy
  Impl impl = Impl::by_device;
  int64_t chunk_rows = 2048;  ///< reference path only
};

struct TokenScores {
  at::Tensor log_probs;  ///< (...) float32: log softmax(z)[label]
  at::Tensor entropy;    ///< (...) float32, undefined unless with_entropy
};

/// Log-probs of `labels` (...) under logits (..., V) / temperature and their entropy, fused:
/// the kernel reads the logits once in the forward and once in the backward (softmax - one-hot,
/// plus the entropy term, scaled), keeping only two floats per row in between. Differentiable.
/// f32, bf16 and f16 logits go to the kernel; other dtypes use the reference. Labels outside
/// [0, V) throw hyflow::ValueError naming the first one for CPU tensors; on a CUDA device the
/// kernel gives NaN for them instead (checking would synchronize with the device).
TokenScores log_probs_and_entropy(const at::Tensor& logits, const at::Tensor& labels,
                                  const ScoresOptions& options = {});

}  // namespace hyflow::cuda
