#pragma once
// Next-token sampling from logits: temperature, top-k, top-p (nucleus), min-p and greedy.
// Filters apply in that order (temperature, top-k, top-p, min-p), each on the distribution
// left by the previous one, so the result does not depend on the batch a row sits in.

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

namespace hyflow::cuda {

/// Sampling settings with verl's rollout defaults (temperature 1, top_k -1, top_p 1).
struct SamplingOptions {
  double temperature = 1.0;  ///< > 0; greedy when 0 (or when `greedy` is set)
  int64_t top_k = -1;        ///< keep the k most likely tokens; <= 0 keeps all
  double top_p = 1.0;        ///< keep the smallest set with mass >= top_p; 1 keeps all
  double min_p = 0.0;        ///< drop tokens with p < min_p * p_max; 0 keeps all
  bool greedy = false;       ///< argmax (ties: lowest id); ignores the other fields

  bool is_greedy() const { return greedy || temperature == 0.0; }
};

/// Throws hyflow::ValueError naming the field when a setting is out of range.
void validate(const SamplingOptions& options);

/// Logits (B, V) after temperature and the top-k/top-p/min-p filters: removed tokens are
/// -inf, kept ones are logits / temperature (float32). Greedy leaves the logits as they are.
at::Tensor filter_logits(const at::Tensor& logits, const SamplingOptions& options);

/// One token per row of `logits` (B, V) -> (B,) int64. Deterministic for a given generator
/// state; the CPU default generator when none is given.
at::Tensor sample(const at::Tensor& logits, const SamplingOptions& options,
                  std::optional<at::Generator> generator = std::nullopt);

}  // namespace hyflow::cuda
