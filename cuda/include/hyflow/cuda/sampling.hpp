#pragma once
// Next-token sampling from logits: temperature, top-k, top-p (nucleus), min-p and greedy.
// Filters apply in that order (temperature, top-k, top-p, min-p), each on the distribution
// left by the previous one, so the result does not depend on the batch a row sits in.
// Ties: top-k keeps every token tied with the k-th largest logit (as vLLM and HF do); top-p
// keeps a token when the mass of the strictly more likely tokens is below p, so tokens tied at
// the nucleus edge are all kept or all dropped.

#include <hyflow/cuda/dispatch.hpp>

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
/// -inf, kept ones are logits * (1 / temperature) in float32 (the product the kernels use).
/// Greedy leaves the logits as they are.
at::Tensor filter_logits(const at::Tensor& logits, const SamplingOptions& options);

/// One token per row of `logits` (B, V) -> (B,) int64. Deterministic for a given generator
/// state; the CPU default generator when none is given.
at::Tensor sample(const at::Tensor& logits, const SamplingOptions& options,
                  std::optional<at::Generator> generator = std::nullopt);

/// Per-row settings for sample_seeded: each tensor is (B,) or undefined (the SamplingOptions
/// value then applies to every row). temperature 0 makes a row greedy.
struct RowSampling {
  at::Tensor temperature;  ///< float
  at::Tensor top_k;        ///< int64
  at::Tensor top_p;        ///< float
  at::Tensor min_p;        ///< float
  at::Tensor step;         ///< int64: each row's sampling step (sample_seeded's `step` for every row when undefined)
};

/// Logits (B, V) after per-row temperature and top-k/top-p/min-p (the reference, ATen):
/// removed tokens are -inf, kept ones logits * (1 / temperature) in float32; greedy rows
/// (temperature 0) keep their raw logits.
at::Tensor filter_logits_rows(const at::Tensor& logits, const SamplingOptions& options, const RowSampling& rows = {});

/// Counter-based sampling: one token per row of `logits` (B, V) -> (B,) int64, drawn from the
/// filtered softmax by an exponential race whose noise is Philox4x32-10 keyed by
/// (seed, row id, step, token) (hyflow/cuda/kernels.hpp). Same seed and step, same tokens, on
/// any batch composition: a row's token depends on its logits, its settings and its row id
/// (`row_ids` (B,) int64, default 0..B-1) only. CUDA tensors run the sampling kernel (when
/// built); CPU tensors the reference (filter_logits_rows + the same noise), or the host build
/// of the kernel with Impl::kernel. A row with a NaN logit or no finite logit throws
/// hyflow::ValueError naming the row.
at::Tensor sample_seeded(const at::Tensor& logits, const SamplingOptions& options, uint64_t seed, uint64_t step,
                         const at::Tensor& row_ids = {}, const RowSampling& rows = {}, Impl impl = Impl::by_device);

/// sample_seeded without its check of invalid rows, which reads the tokens back to the host:
/// a row with a NaN logit or no finite logit gets token -1, for the caller to check when it
/// reads the tokens anyway (the decode engine's once-per-step stop check). It does not read the
/// tokens back; but per-row temperature, top_p and min_p tensors are range-checked here, one
/// `nonzero()` each, and each of those waits for the device: a caller that validated them on the
/// host before copying them over pays one wait per given tensor and step.
at::Tensor sample_seeded_unchecked(const at::Tensor& logits, const SamplingOptions& options, uint64_t seed,
                                   uint64_t step, const at::Tensor& row_ids = {}, const RowSampling& rows = {},
                                   Impl impl = Impl::by_device);

}  // namespace hyflow::cuda
